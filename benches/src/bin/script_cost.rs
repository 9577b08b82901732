//! Server-side cost of the decision script per algorithm: Redis's own
//! `usec_per_call` for `EVALSHA` (`INFO commandstats`), with each
//! algorithm's window at steady state, for the admit path and the deny path
//! separately, and the ratio to GCRA's.
//!
//! ```text
//! cargo run --release -p tower-window-benches --bin script_cost [-- --checks N] [--rounds N] [--redis-url URL]
//! ```
//!
//! Without `--redis-url` it spawns its own `redis-server` on a random
//! loopback port (never the system one). With one, it runs `CONFIG
//! RESETSTAT` on that server. The store runs on an explicit clock, so
//! "steady state" is exact: the sliding counter holds 61 live buckets
//! (`600/1m sliding-counter(1s)`, ~10 units each), the sliding log 1,000
//! live entries (`1000/1m`), and each admitted check expires as much as it
//! adds. `--rounds` (default 5) repeats the whole run; each path reports
//! its median round. No timing is asserted; the numbers are printed as a
//! Markdown table.
#![allow(clippy::print_stdout)]

use tower_window::store::Guard;
use tower_window::{limit, CheckRequest, ManualClock, Policy, Quota, RedisStore, WindowKey};
use tower_window_benches::redis_stats::{admin, command_stats, reset_stats};
use tower_window_tests::redis_server::RedisServer;

/// 2023-11-14T22:13:20Z, a whole minute plus 20 s.
const START: u64 = 1_700_000_000_000_000;

/// (name, quota, clock step between admit-path checks in µs: the
/// steady-state rate, limit per window plus one bucket for the counter).
const CASES: [(&str, &str, u64); 4] = [
    ("gcra", "600/1m gcra", 100_000),
    ("fixed window", "600/1m fixed-window", 100_000),
    (
        "sliding counter (61 buckets)",
        "600/1m sliding-counter(1s)",
        101_667,
    ),
    ("sliding log (1,000 entries)", "1000/1m", 60_000),
];

struct Args {
    checks: u64,
    rounds: usize,
    redis_url: Option<String>,
}

fn args() -> Args {
    let mut args = Args {
        checks: 20_000,
        rounds: 5,
        redis_url: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--checks" => {
                args.checks = it
                    .next()
                    .and_then(|n| n.parse().ok())
                    .expect("--checks takes a number");
            }
            "--rounds" => {
                args.rounds = it
                    .next()
                    .and_then(|n| n.parse().ok())
                    .filter(|&n| n > 0)
                    .expect("--rounds takes a positive number");
            }
            "--redis-url" => args.redis_url = Some(it.next().expect("--redis-url takes a url")),
            other => panic!("unknown argument {other:?} (--checks N, --rounds N, --redis-url URL)"),
        }
    }
    args
}

struct Cost {
    admit: f64,
    admitted: u64,
    deny: f64,
    denied: u64,
}

async fn measure(url: &str, name: &str, dsl: &str, step: u64, checks: u64, round: usize) -> Cost {
    let clock = ManualClock::new(START);
    let store = RedisStore::builder()
        .url(url)
        .prefix("script-cost:")
        .clock(clock.clone())
        .build()
        .expect("redis url");
    store.connect().await.expect("connect and load the script");
    let policy = Policy::from(dsl.parse::<Quota>().expect("quota"));
    let key = WindowKey::new(
        format!("bench-{}-{round}", std::process::id()),
        name.to_owned(),
    );
    let check = |cost: u32| {
        let store = &store;
        let policy = &policy;
        let key = &key;
        async move {
            // The backend itself, no store handle around it: one script call.
            let cost = tower_window::Cost::new(cost).expect("a cost of at least 1");
            limit::Backend::check(
                store,
                &mut Guard::bare(),
                CheckRequest::new(key, policy, cost),
            )
            .await
            .expect("a decision")
            .allowed()
        }
    };
    let mut now = START;
    // Two windows at the steady rate: the state is what it will stay.
    for _ in 0..(2 * 61_000_000 / step) {
        now += step;
        clock.set(now);
        check(1).await;
    }
    let mut conn = admin(url);
    reset_stats(&mut conn);
    let mut admitted = 0;
    for _ in 0..checks {
        now += step;
        clock.set(now);
        admitted += u64::from(check(1).await);
    }
    let admit = command_stats(&mut conn, "evalsha");
    assert_eq!(admit.calls, checks);
    // Fill the window at one instant, then deny at that instant.
    while check(1).await {}
    reset_stats(&mut conn);
    let mut denied = 0;
    for _ in 0..checks {
        denied += u64::from(!check(1).await);
    }
    let deny = command_stats(&mut conn, "evalsha").usec_per_call;
    Cost {
        admit: admit.usec_per_call,
        admitted,
        deny,
        denied,
    }
}

fn main() {
    let args = args();
    let server = args.redis_url.is_none().then(RedisServer::start);
    let url = args
        .redis_url
        .clone()
        .or_else(|| server.as_ref().map(RedisServer::url))
        .expect("a server");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    // Rounds interleave the algorithms, and each path reports its median
    // round, so a burst of load elsewhere on the machine skews one round of
    // every algorithm rather than one algorithm.
    let rounds: Vec<Vec<Cost>> = runtime.block_on(async {
        let mut rounds = Vec::new();
        for round in 0..args.rounds {
            let mut costs = Vec::new();
            for (name, dsl, step) in CASES {
                costs.push(measure(&url, name, dsl, step, args.checks, round).await);
            }
            rounds.push(costs);
        }
        rounds
    });
    let median = |values: &mut Vec<f64>| {
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    let costs: Vec<(&str, &str, Cost)> = CASES
        .iter()
        .enumerate()
        .map(|(i, (name, dsl, _))| {
            let mut admit: Vec<f64> = rounds.iter().map(|r| r[i].admit).collect();
            let mut deny: Vec<f64> = rounds.iter().map(|r| r[i].deny).collect();
            let cost = Cost {
                admit: median(&mut admit),
                admitted: rounds.iter().map(|r| r[i].admitted).min().unwrap_or(0),
                deny: median(&mut deny),
                denied: rounds.iter().map(|r| r[i].denied).min().unwrap_or(0),
            };
            (*name, *dsl, cost)
        })
        .collect();
    let (gcra_admit, gcra_deny) = (costs[0].2.admit, costs[0].2.deny);
    println!(
        "EVALSHA usec_per_call (Redis INFO commandstats), {} checks per path, median of {} rounds",
        args.checks, args.rounds
    );
    println!();
    println!(
        "| algorithm | quota | admit µs | admitted (min) | deny µs | denied (min) | admit / GCRA | deny / GCRA |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for (name, dsl, c) in &costs {
        println!(
            "| {name} | `{dsl}` | {:.2} | {} | {:.2} | {} | {:.2}x | {:.2}x |",
            c.admit,
            c.admitted,
            c.deny,
            c.denied,
            c.admit / gcra_admit,
            c.deny / gcra_deny
        );
    }
}
