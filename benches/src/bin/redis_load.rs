//! Load benchmark: decisions per second through `Limiter::check` on a
//! `RedisStore`, next to `redis-benchmark` running the same Lua script
//! (`EVALSHA`, same arguments and key space) on the same server in the same run.
//!
//! ```text
//! cargo run --release -p tower-window-benches --bin redis_load [-- <seconds per level>]
//! ```
//!
//! It spawns its own `redis-server` on a random loopback port (never the
//! system one), so `redis-server` and `redis-benchmark` must be on `PATH`.
//! No timing is asserted; the numbers are printed as a Markdown table.
#![allow(clippy::print_stdout)]

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tower_window::store::redis_key;
use tower_window::{Limiter, Policy, Quota, RedisStore, WindowKey};
use tower_window_tests::redis_server::RedisServer;

/// Distinct subjects (redis-benchmark `-r`).
const KEYSPACE: u64 = 10_000;
/// The quota: GCRA (one key per decision), high enough that most checks admit and write.
const QUOTA: &str = "1000000/1s gcra";

fn subject(n: u64) -> String {
    // redis-benchmark replaces `__rand_int__` with a 12-digit zero-padded number.
    format!("k{n:012}")
}

/// Runs `callers` tasks calling `limiter.check` for `duration`; returns decisions/s and errors.
async fn limiter_rate(limiter: &Limiter, callers: usize, duration: Duration) -> (f64, u64) {
    let decided = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..callers)
        .map(|task| {
            let limiter = limiter.clone();
            let decided = decided.clone();
            let errors = errors.clone();
            tokio::spawn(async move {
                let mut n = task as u64 * 7919;
                while start.elapsed() < duration {
                    n = (n * 6_364_136_223_846_793_005 + 1_442_695_040_888_963_407) % (1 << 62);
                    let key = WindowKey::for_subject(subject(n % KEYSPACE));
                    match limiter.check(&key, 1).await {
                        Ok(_) => decided.fetch_add(1, Ordering::Relaxed),
                        Err(_) => errors.fetch_add(1, Ordering::Relaxed),
                    };
                }
            })
        })
        .collect();
    for task in tasks {
        let _ = task.await;
    }
    let elapsed = start.elapsed().as_secs_f64();
    (
        decided.load(Ordering::Relaxed) as f64 / elapsed,
        errors.load(Ordering::Relaxed),
    )
}

/// `redis-benchmark -c 64 -P 16` running the same EVALSHA; returns (requests/s, command line).
fn redis_benchmark(server: &RedisServer, quota: &Quota, requests: u64) -> (f64, String) {
    let key_template = redis_key(
        tower_window::store::redis::DEFAULT_PREFIX,
        &WindowKey::for_subject("k__rand_int__"),
        &Policy::from(quota.clone()),
        quota,
    );
    let key_template = String::from_utf8(key_template).expect("ASCII key");
    let sha = RedisStore::script_sha();
    // The store's own arguments: now ("" = Redis TIME), cost, min TTL, one
    // quota: code 4 (GCRA), T, B, 0.
    let args = [
        "-h".to_owned(),
        "127.0.0.1".to_owned(),
        "-p".to_owned(),
        server.port().to_string(),
        "-c".to_owned(),
        "64".to_owned(),
        "-P".to_owned(),
        "16".to_owned(),
        "-n".to_owned(),
        requests.to_string(),
        "-r".to_owned(),
        KEYSPACE.to_string(),
        "--csv".to_owned(),
        "EVALSHA".to_owned(),
        sha.to_owned(),
        "1".to_owned(),
        key_template,
        String::new(),
        "1".to_owned(),
        "0".to_owned(),
        "1".to_owned(),
        "4".to_owned(),
        quota.emission_interval_micros().to_string(),
        quota.capacity().to_string(),
        "0".to_owned(),
    ];
    let output = Command::new("redis-benchmark")
        .args(&args)
        .output()
        .expect("run redis-benchmark (apt-get install -y redis-tools)");
    let stdout = String::from_utf8_lossy(&output.stdout);
    // CSV: a header line, then "EVALSHA ...","<rps>",...
    let rps = stdout
        .lines()
        .nth(1)
        .and_then(|line| line.split("\",\"").nth(1))
        .and_then(|field| field.trim_matches('"').parse::<f64>().ok())
        .unwrap_or_else(|| {
            panic!(
                "unexpected redis-benchmark output: {stdout}{}",
                String::from_utf8_lossy(&output.stderr)
            )
        });
    let shown: Vec<String> = args
        .iter()
        .map(|a| {
            if a.is_empty() {
                "\"\"".to_owned()
            } else if a.contains(['|', ' ', '{', '}']) {
                format!("'{a}'")
            } else {
                a.clone()
            }
        })
        .collect();
    (rps, format!("redis-benchmark {}", shown.join(" ")))
}

fn main() {
    let seconds: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let duration = Duration::from_secs(seconds);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let server = RedisServer::start();
    let quota: Quota = QUOTA.parse().expect("quota");

    runtime.block_on(async {
        let store = RedisStore::from_url(&server.url()).expect("url");
        store.connect().await.expect("connect and load the script");
        let limiter = Limiter::new(store, quota.clone());
        // Warm up connections, allocator and the script cache.
        let _ = limiter_rate(&limiter, 16, Duration::from_millis(300)).await;

        println!("| callers | decisions/s through Limiter::check | errors |");
        println!("|---:|---:|---:|");
        let mut at_64 = 0.0;
        for callers in [1, 16, 64] {
            let (rate, errors) = limiter_rate(&limiter, callers, duration).await;
            println!("| {callers} | {rate:.0} | {errors} |");
            if callers == 64 {
                at_64 = rate;
            }
        }
        let requests = ((at_64 * seconds as f64) as u64).max(100_000);
        let mut admin = server.connection();
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query(&mut admin)
            .expect("CONFIG RESETSTAT");
        let (bench, command) = redis_benchmark(&server, &quota, requests);
        // The comparison is only fair if redis-benchmark's EVALSHAs really ran the script.
        let stats: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut admin)
            .expect("INFO commandstats");
        let evalsha = stats
            .lines()
            .find(|line| line.starts_with("cmdstat_evalsha:"))
            .unwrap_or("cmdstat_evalsha: none");
        assert!(
            evalsha.contains("failed_calls=0"),
            "redis-benchmark's EVALSHA calls failed: {evalsha}"
        );
        println!();
        println!("redis-benchmark, same script, same server: {bench:.0} requests/s");
        println!("  server side: {evalsha}");
        println!("  {command}");
        println!(
            "ratio Limiter::check at 64 callers / redis-benchmark -c 64 -P 16: {:.2}",
            at_64 / bench
        );
    });
}
