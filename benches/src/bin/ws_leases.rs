//! Connection leases on real Redis: connections admitted per second, and
//! what one heartbeat tick costs for 10,000 live connections on one node.
//!
//! ```text
//! cargo run --release -p tower-window-benches --bin ws_leases [-- --connections N] [--ticks N] [--concurrency N] [--cluster]
//! ```
//!
//! Spawns its own `redis-server` (or, with `--cluster`, a 3-primary Redis
//! Cluster) on loopback. Grants `--connections` leases (default 10,000) of
//! distinct users through `ConnectionLimiter::acquire` (cap 3 per user),
//! `--concurrency` at a time (default 64), and reports grants per second.
//! Then, holding them all, runs `--ticks` heartbeat ticks (default 10) and
//! counts the Redis commands they caused from `INFO commandstats` on every
//! server (after `CONFIG RESETSTAT`): calls per tick, and Redis's own
//! `usec` per tick. On the cluster, every heartbeat pipeline (one per
//! primary and batch of 1,000 seats) opens with one `SCRIPT LOAD`, so its
//! count is the pipelines per tick. A last run holds the same number of leases for one
//! tenant with a per-tenant cap (the tenant form: one hash slot). No timing
//! is asserted; the numbers are printed as a Markdown table.
#![allow(clippy::print_stdout)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use tower_window::conn::{Acquire, ConnectionLimiter, ConnectionSeat};
use tower_window::{RedisStore, Store, WindowKey};
use tower_window_tests::redis_cluster::RedisCluster;
use tower_window_tests::redis_server::RedisServer;

struct Args {
    connections: usize,
    ticks: usize,
    concurrency: usize,
    cluster: bool,
}

fn args() -> Args {
    let mut args = Args {
        connections: 10_000,
        ticks: 10,
        concurrency: 64,
        cluster: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .and_then(|v| v.parse::<usize>().ok())
                .unwrap_or_else(|| panic!("{flag} needs a number"))
        };
        match flag.as_str() {
            "--connections" => args.connections = value(),
            "--ticks" => args.ticks = value().max(1),
            "--concurrency" => args.concurrency = value().max(1),
            "--cluster" => args.cluster = true,
            "--bench" => {}
            other => panic!("unknown flag {other}"),
        }
    }
    args
}

/// Sum over `conns` since the last reset of (EVALSHA calls, commands run
/// inside scripts and outside, usec of all of them, `SCRIPT LOAD` calls:
/// one per pipeline of a cluster heartbeat).
fn command_stats(conns: &mut [redis::Connection]) -> (u64, u64, u64, u64) {
    let mut total = (0, 0, 0, 0);
    for conn in conns {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(conn)
            .expect("INFO commandstats");
        for line in info.lines().filter(|l| l.starts_with("cmdstat_")) {
            // INFO itself is not the heartbeat's.
            if line.starts_with("cmdstat_info:") || line.starts_with("cmdstat_config|resetstat:") {
                continue;
            }
            let field = |name: &str| -> u64 {
                line.split([':', ','])
                    .find_map(|f| f.strip_prefix(name))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0)
            };
            if line.starts_with("cmdstat_evalsha:") {
                total.0 += field("calls=");
            } else if line.starts_with("cmdstat_script|load:") {
                total.3 += field("calls=");
            } else {
                total.1 += field("calls=");
            }
            total.2 += field("usec=");
        }
    }
    total
}

fn reset(conns: &mut [redis::Connection]) {
    for conn in conns {
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query(conn)
            .expect("CONFIG RESETSTAT");
    }
}

struct Row {
    setup: String,
    grants_per_sec: f64,
    evalsha_per_tick: f64,
    inner_per_tick: f64,
    store_calls_per_tick: f64,
    pipelines_per_tick: f64,
    resent_per_tick: f64,
    redis_usec_per_tick: f64,
    tick_ms: f64,
}

async fn run(
    label: &str,
    store: Arc<RedisStore>,
    conns: &mut [redis::Connection],
    args: &Args,
    tenant_capped: bool,
) -> Row {
    let handle = Store::builder(Arc::clone(&store))
        .timeout(Duration::from_secs(5))
        .build();
    let mut builder = ConnectionLimiter::builder(handle)
        .max_per_subject(3)
        .ttl(Duration::from_secs(60));
    if tenant_capped {
        builder = builder.max_per_tenant(u32::MAX);
    }
    let connections = builder.build().expect("valid ttl");
    store.connect().await.expect("redis reachable");
    let run = std::process::id();
    let started = Instant::now();
    let mut held: Vec<ConnectionSeat> = Vec::with_capacity(args.connections);
    let per_worker = args.connections.div_ceil(args.concurrency);
    let total = args.connections;
    let tasks: Vec<_> = (0..args.concurrency)
        .map(|w| {
            let connections = connections.clone();
            let label = label.to_owned();
            tokio::spawn(async move {
                let mut leases = Vec::new();
                for i in w * per_worker..((w + 1) * per_worker).min(total) {
                    let key = WindowKey::new(format!("{label}-{run}"), format!("user-{i}"));
                    match connections.acquire(&key).await.expect("store answers") {
                        Acquire::Granted(lease) => leases.push(lease),
                        Acquire::Denied(denied) => panic!("denied: {denied:?}"),
                    }
                }
                leases
            })
        })
        .collect();
    for task in tasks {
        held.extend(task.await.expect("task"));
    }
    let grants_per_sec = held.len() as f64 / started.elapsed().as_secs_f64();
    assert!(
        held.iter().all(|l| !l.is_degraded()),
        "every grant from Redis"
    );

    reset(conns);
    let (mut store_calls, mut resent) = (0, 0);
    let started = Instant::now();
    for _ in 0..args.ticks {
        let report = connections.heartbeat().await;
        assert_eq!(report.renewed, connections.live_seats(), "{report:?}");
        store_calls += report.calls;
        resent += report.resent;
    }
    let tick_ms = started.elapsed().as_secs_f64() * 1e3 / args.ticks as f64;
    let (evalsha, inner, usec, pipelines) = command_stats(conns);
    for lease in held {
        lease.release().await.expect("released");
    }
    Row {
        setup: label.to_owned(),
        grants_per_sec,
        evalsha_per_tick: evalsha as f64 / args.ticks as f64,
        inner_per_tick: inner as f64 / args.ticks as f64,
        store_calls_per_tick: store_calls as f64 / args.ticks as f64,
        pipelines_per_tick: pipelines as f64 / args.ticks as f64,
        resent_per_tick: resent as f64 / args.ticks as f64,
        redis_usec_per_tick: usec as f64 / args.ticks as f64,
        tick_ms,
    }
}

fn main() {
    let args = args();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut rows = Vec::new();
    {
        let server = RedisServer::start();
        let mut conns = vec![server.connection()];
        let store = Arc::new(RedisStore::from_url(&server.url()).expect("url"));
        rows.push(runtime.block_on(run("single", Arc::clone(&store), &mut conns, &args, false)));
        rows.push(runtime.block_on(run("single-tenant-form", store, &mut conns, &args, true)));
    }
    if args.cluster {
        let cluster = RedisCluster::start();
        let mut conns: Vec<_> = cluster
            .nodes()
            .iter()
            .map(RedisServer::connection)
            .collect();
        let store = Arc::new(RedisStore::cluster(cluster.urls()).expect("urls"));
        rows.push(runtime.block_on(run("cluster", Arc::clone(&store), &mut conns, &args, false)));
        rows.push(runtime.block_on(run("cluster-tenant-form", store, &mut conns, &args, true)));
    }
    println!(
        "| setup | leases | grants/s | EVALSHA per tick | commands inside scripts per tick | store calls (round trips) per tick (report) | pipelines per tick (SCRIPT LOAD) | seats re-sent by slot per tick | Redis usec per tick | tick wall ms |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for row in rows {
        println!(
            "| {} | {} | {:.0} | {:.1} | {:.0} | {:.1} | {:.1} | {:.1} | {:.0} | {:.1} |",
            row.setup,
            args.connections,
            row.grants_per_sec,
            row.evalsha_per_tick,
            row.inner_per_tick,
            row.store_calls_per_tick,
            row.pipelines_per_tick,
            row.resent_per_tick,
            row.redis_usec_per_tick,
            row.tick_ms
        );
    }
}
