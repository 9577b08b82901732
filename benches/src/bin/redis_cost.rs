//! Where a decision's time goes inside Redis (issue 36): each step of the
//! library's Lua under `redis-benchmark -c 8`, priced by Redis's own
//! `usec_per_call` (`INFO commandstats`) against a script that only reads
//! `TIME`, and by the server's CPU time per call (`INFO cpu`).
//!
//! ```text
//! cargo run --release -p tower-window-benches --bin redis_cost [-- --requests N] [--rounds N] [--url URL]
//! ```
//!
//! The scripts are assembled from the library's own fragment files in the
//! library's order (the policy and lease scripts are checked against
//! [`RedisStore::script_sha`] and [`RedisStore::lease_script_sha`]) and
//! loaded with `SCRIPT LOAD`; every step is one `EVALSHA` that
//! `redis-benchmark` repeats N times between `CONFIG RESETSTAT` and `INFO
//! commandstats`. `__rand_int__` in a key spreads it over 10,000 keys
//! (each occurrence draws its own number). Without `--url` it spawns its
//! own `redis-server` on a free loopback port and kills it on exit. Rounds
//! interleave the steps; the table gives each column's range over rounds.
#![allow(clippy::print_stdout)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use redis::{ConnectionAddr, IntoConnectionInfo};
use tower_window::{Algorithm, Quota, RedisStore};
use tower_window_benches::redis_stats::{admin, all_command_stats, cpu_seconds, reset_stats};
use tower_window_tests::redis_server::RedisServer;

/// A Lua file of the library, by its path under `tower-window/src`.
macro_rules! lua {
    ($path:literal) => {
        include_str!(concat!("../../../tower-window/src/", $path))
    };
}

/// What every deciding script starts with, in `with_algorithms!`'s order.
const ALGORITHMS: [&str; 5] = [
    lua!("algorithm/prelude.lua"),
    lua!("algorithm/sliding_log.lua"),
    lua!("algorithm/sliding_counter.lua"),
    lua!("algorithm/fixed_window.lua"),
    lua!("algorithm/gcra.lua"),
];

/// Keys a `__rand_int__` spreads over (`redis-benchmark -r`).
const SPREAD: u32 = 10_000;

/// A seat's TTL (µs) and its set's key TTL (ms) in the renewal steps:
/// longer than a round, so every renewal finds its seat live.
const SEAT_TTL_US: u64 = 600_000_000;
const SEAT_KEY_TTL_MS: u64 = 1_200_000;
/// The expiry (µs) a seat is set up with: far beyond any renewal's.
const SEAT_UNTIL: u64 = 4_000_000_000_000_000;

#[derive(Parser)]
#[command(about = "usec_per_call of each step of the library's Lua, against a TIME-only script")]
struct Args {
    /// Calls per step and round (`redis-benchmark -n`).
    #[arg(long, default_value_t = 50_000)]
    requests: u64,
    /// Rounds, each running every step once.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// A running server to measure (its stats are reset) instead of a spawned one.
    #[arg(long)]
    url: Option<String>,
    /// Longest one step may run before it is killed (seconds).
    #[arg(long, default_value_t = 120)]
    timeout: u64,
}

/// One `EVALSHA` that `redis-benchmark` repeats.
struct Step {
    name: String,
    sha: String,
    keys: Vec<String>,
    args: Vec<String>,
}

/// The keys and ARGV of a check of `cost` against a policy of `quotas`
/// (DSL) on `key`, laid out as `lay_out` in `algorithm/redis.rs` does.
fn policy(quotas: &[&str], key: &str, cost: u32) -> (Vec<String>, Vec<String>) {
    let mut keys = Vec::new();
    let mut args = vec![
        String::new(),
        cost.to_string(),
        "0".into(),
        quotas.len().to_string(),
    ];
    for (i, dsl) in quotas.iter().enumerate() {
        let q: Quota = dsl.parse().expect("a quota");
        keys.push(format!("{key}:{i}"));
        let (window, limit) = (q.window_micros(), u64::from(q.limit()));
        let slots = match q.algorithm() {
            Algorithm::SlidingLog => {
                keys.push(format!("{key}:{i}:m"));
                [1, window, limit, 0]
            }
            Algorithm::SlidingCounter { .. } => {
                [2, window, limit, q.granularity_micros().unwrap_or(window)]
            }
            Algorithm::FixedWindow => [3, window, limit, 0],
            Algorithm::Gcra => [4, q.emission_interval_micros(), u64::from(q.capacity()), 0],
            other => panic!("no Lua code for {other:?}"),
        };
        args.extend(slots.map(|v| v.to_string()));
    }
    (keys, args)
}

fn load(conn: &mut redis::Connection, source: &str) -> String {
    redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(source)
        .query(conn)
        .expect("SCRIPT LOAD")
}

/// Every step, its script loaded.
fn steps(conn: &mut redis::Connection) -> Vec<Step> {
    let with = |tail: &[&str]| ALGORITHMS.iter().chain(tail).copied().collect::<String>();
    let time = load(conn, "return redis.call('TIME')\n");
    let top = load(conn, &with(&["return 0\n"]));
    let decide = load(conn, &with(&[lua!("limit/policy.lua")]));
    assert_eq!(decide, RedisStore::script_sha(), "policy script");
    let peek = load(conn, &with(&[lua!("limit/peek.lua")]));
    let take_back = lua!("algorithm/take_back.lua");
    let settle = load(conn, &with(&[take_back, lua!("limit/settle.lua")]));
    let lease = load(conn, &with(&[take_back, lua!("lease/lease.lua")]));
    assert_eq!(lease, RedisStore::lease_script_sha(), "lease script");
    let renew = load(
        conn,
        &[lua!("conn/conn_now.lua"), lua!("conn/conn_renew.lua")].concat(),
    );

    let step = |name: String, sha: &str, (keys, args): (Vec<String>, Vec<String>)| Step {
        name,
        sha: sha.to_owned(),
        keys,
        args,
    };
    let strings = |args: &[&str]| args.iter().map(|a| a.to_string()).collect::<Vec<_>>();
    let no_keys = |args: &[&str]| (Vec::new(), strings(args));
    let with_args = |(keys, mut args): (Vec<String>, Vec<String>), extra: &[&str]| {
        args.extend(strings(extra));
        (keys, args)
    };
    let fixed = ["100/1s fixed-window"];
    let three = [
        "100/1s fixed-window",
        "100/1s gcra",
        "100/1s sliding-counter(100ms)",
    ];
    let mut steps = vec![
        step("`TIME` only".into(), &time, no_keys(&[])),
        step(
            "top level: prelude + 4 algorithms, `return 0`".into(),
            &top,
            no_keys(&["", "1", "0", "0"]),
        ),
    ];
    let one_quota = [
        ("fixed window", "fw", three[0]),
        ("GCRA", "gcra", three[1]),
        ("sliding counter (10 buckets)", "sc", three[2]),
        ("sliding log", "sl", "100/1s sliding-log"),
    ];
    let spread = [("hot key", ""), ("10,000 keys", ":__rand_int__")];
    for (keys, suffix) in spread {
        for (name, tag, quota) in one_quota {
            let key = format!("{tag}{suffix}");
            steps.push(step(
                format!("{name}, {keys}"),
                &decide,
                policy(&[quota], &key, 1),
            ));
        }
    }
    for (keys, suffix) in spread {
        steps.push(step(
            format!("three quotas (the first three above), {keys}"),
            &decide,
            policy(&three, &format!("three{suffix}"), 1),
        ));
    }
    let spread_key = |tag: &str| format!("{tag}:__rand_int__");
    steps.push(step(
        "peek, fixed window, 10,000 keys".into(),
        &peek,
        policy(&fixed, &spread_key("peek"), 1),
    ));
    // Reserved::NONE, 1 unit used: `Limiter::record`.
    steps.push(step(
        "settle (record 1 unit), fixed window, 10,000 keys".into(),
        &settle,
        with_args(policy(&fixed, &spread_key("settle"), 1), &["0", "0", "0"]),
    ));
    // 10 units, at least 1, a 1 s lease, deciding, no refunds; then LR, LX.
    let (mut keys, args) = policy(&fixed, &spread_key("lease"), 10);
    keys.extend([spread_key("lease:lr"), spread_key("lease:lx")]);
    steps.push(step(
        "lease reservation (10 units), fixed window, 10,000 keys".into(),
        &lease,
        with_args((keys, args), &["reserve", "1000000", "1", "0", "1", "0"]),
    ));
    // KEYS = one seat set, ARGV = now (''), seat TTL, key TTL, the seat.
    let renewal = [
        "",
        &SEAT_TTL_US.to_string(),
        &SEAT_KEY_TTL_MS.to_string(),
        "s",
    ];
    for (keys, suffix) in spread {
        let seat = vec![format!("seat{suffix}")];
        steps.push(step(
            format!("seat renewal, {keys}"),
            &renew,
            (seat, strings(&renewal)),
        ));
    }
    steps
}

/// Seats for the renewal steps to find live: `seat` and the 10,000 keys
/// `__rand_int__` names (12 digits, zero-padded).
fn seat_up(conn: &mut redis::Connection) {
    let mut pipe = redis::pipe();
    for key in
        std::iter::once("seat".to_owned()).chain((0..SPREAD).map(|i| format!("seat:{i:012}")))
    {
        pipe.cmd("ZADD").arg(key).arg(SEAT_UNTIL).arg("s").ignore();
    }
    let _: () = pipe.query(conn).expect("seats");
}

/// `redis-benchmark` on `step`, killed past `--timeout`.
fn bench((host, port): (&str, u16), step: &Step, args: &Args) {
    let (requests, timeout) = (args.requests, Duration::from_secs(args.timeout));
    let mut child = Command::new("redis-benchmark")
        .args(["-h", host, "-p", &port.to_string(), "-c", "8"])
        .args(["-n", &requests.to_string(), "-r", &SPREAD.to_string()])
        .args(["EVALSHA", &step.sha, &step.keys.len().to_string()])
        .args(&step.keys)
        .args(&step.args)
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-benchmark on PATH");
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().expect("redis-benchmark") {
            assert!(status.success(), "{}: redis-benchmark {status}", step.name);
            return;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{}: still running after {timeout:?}", step.name);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn main() {
    let args = Args::parse();
    let server = args.url.is_none().then(RedisServer::start);
    let url = args
        .url
        .clone()
        .unwrap_or_else(|| server.as_ref().map(RedisServer::url).expect("a server"));
    let info = url.as_str().into_connection_info().expect("a redis url");
    let ConnectionAddr::Tcp(host, port) = info.addr().clone() else {
        panic!("--url must name a TCP server");
    };
    let mut conn = admin(&url);
    let steps = steps(&mut conn);
    // [round][step] = [usec_per_call, its excess over TIME's, the commands
    // inside per call, Redis CPU per call] (µs)
    let mut rounds = Vec::new();
    for _ in 0..args.rounds {
        seat_up(&mut conn);
        let mut round = Vec::new();
        for step in &steps {
            reset_stats(&mut conn);
            let cpu = cpu_seconds(&mut conn);
            bench((&host, port), step, &args);
            let cpu = cpu_seconds(&mut conn) - cpu;
            let all = all_command_stats(&mut conn);
            let (_, stats) = all
                .iter()
                .find(|(name, _)| name == "evalsha")
                .expect("evalsha");
            // What the scripts' own commands took (the admin's and
            // redis-benchmark's CONFIG and INFO aside).
            let inside: f64 = all
                .iter()
                .filter(|(name, _)| {
                    !["evalsha", "config", "info"]
                        .contains(&name.split('|').next().unwrap_or_default())
                })
                .map(|(_, c)| c.calls as f64 * c.usec_per_call)
                .sum();
            assert_eq!(
                (stats.calls, stats.failed_calls),
                (args.requests, 0),
                "{}",
                step.name
            );
            let per_call = |total: f64| total / args.requests as f64;
            round.push([
                stats.usec_per_call,
                0.0,
                per_call(inside),
                per_call(cpu * 1e6),
            ]);
        }
        let time = round[0][0];
        round.iter_mut().for_each(|step| step[1] = step[0] - time);
        // The hot seat was renewed (its expiry moved to now + TTL), not found gone.
        let until: f64 = redis::cmd("ZSCORE")
            .arg("seat")
            .arg("s")
            .query(&mut conn)
            .expect("the hot seat");
        assert!(until < SEAT_UNTIL as f64, "the hot seat was never renewed");
        rounds.push(round);
    }
    let range = |i: usize, j: usize| {
        let (lo, hi) = rounds
            .iter()
            .map(|round: &Vec<[f64; 4]>| round[i][j])
            .fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
        if hi - lo < 0.005 {
            format!("{lo:.2}")
        } else {
            format!("{lo:.2}–{hi:.2}")
        }
    };
    println!(
        "redis-benchmark -c 8 -n {} per step, {} rounds interleaved; min–max over rounds",
        args.requests, args.rounds
    );
    println!();
    println!("| step | `usec_per_call` µs | − `TIME` µs | its commands µs | Redis CPU µs / call |");
    println!("|---|---:|---:|---:|---:|");
    for (i, step) in steps.iter().enumerate() {
        let [usec, excess, inside, cpu] = [0, 1, 2, 3].map(|j| range(i, j));
        println!("| {} | {usec} | {excess} | {inside} | {cpu} |", step.name);
    }
}
