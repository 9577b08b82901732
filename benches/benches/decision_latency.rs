//! Decision latency of one `Limiter::check`, by where the decision comes from,
//! all in one run:
//!
//! - `redis_round_trip`: a resilient limiter (`Limiter::builder`) on a
//!   store on a `RedisStore` (`Store::builder`, the Redis budget) against a
//!   spawned `redis-server`; every check admits, so every check is one
//!   `EVALSHA` round trip.
//! - `local_cache_hit`: the same kind of limiter, a key Redis already denied:
//!   the local tier answers without Redis.
//! - `breaker_open_fail_open` / `breaker_open_local_window`: Redis killed,
//!   the breaker opened first (cooldown one hour, so it stays open): the
//!   fallback answers without touching a socket.
//! - `memory_store`: a bare limiter on the embedded `MemoryStore`.
//!
//! ```text
//! cargo bench -p tower-window-benches --bench decision_latency
//! ```
//!
//! Criterion reports mean and median per case; afterwards the bench runs its
//! own bounded loop (`SAMPLES` timed decisions per case, at most
//! `SAMPLE_BUDGET` of wall time) and prints p50/p99/p99.9/max and which
//! sources decided, as a Markdown table. One caller, a current-thread tokio
//! runtime. No timing is asserted.
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::Criterion;
use tokio::runtime::Runtime;
use tower_window::fallback::{FailOpen, LocalWindow};
use tower_window::{
    BreakerConfig, BreakerState, Decision, DecisionSource, Limiter, MemoryStore, Quota, RedisStore,
    Store, StoreBuilder, WindowKey,
};
use tower_window_tests::redis_server::RedisServer;

/// Timed decisions per case in the percentile loop.
const SAMPLES: usize = 20_000;
/// Wall-time cap of one case's percentile loop.
const SAMPLE_BUDGET: Duration = Duration::from_secs(20);
/// Distinct keys the admitting cases rotate over.
const KEYS: usize = 1024;
/// Admits every check at these rates (GCRA: one key per decision).
const ADMIT_ALL: &str = "1000000/1s gcra";
/// The per-decision budget for the Redis cases: generous, so that a busy
/// machine measures round trips rather than fallbacks.
const REDIS_BUDGET: Duration = Duration::from_secs(1);

struct Case {
    name: &'static str,
    limiter: Limiter,
    keys: Vec<WindowKey>,
}

fn keys(prefix: &str, n: usize) -> Vec<WindowKey> {
    (0..n)
        .map(|i| WindowKey::for_subject(format!("{prefix}{i}")))
        .collect()
}

fn quota(dsl: &str) -> Quota {
    dsl.parse().expect("valid quota")
}

fn redis_limiter(server: &RedisServer, dsl: &str) -> tower_window::LimiterBuilder {
    redis_limiter_with(server, dsl, |store| store)
}

/// A limiter on a store of its own on `server` (its own pool and
/// breakers), with the Redis budget and what `store` adds.
fn redis_limiter_with(
    server: &RedisServer,
    dsl: &str,
    store: impl FnOnce(StoreBuilder) -> StoreBuilder,
) -> tower_window::LimiterBuilder {
    let redis = RedisStore::from_url(&server.url()).expect("redis url");
    let store = store(Store::builder(redis).timeout(REDIS_BUDGET)).build();
    Limiter::builder(store, quota(dsl))
}

async fn check(limiter: &Limiter, key: &WindowKey) -> Decision {
    limiter.check(key, 1).await.expect("a decision")
}

/// The cases measured while Redis is up, and the limiters that will see it
/// die (already connected and warm; measured after [`open_breakers`]).
fn cases(rt: &Runtime, server: &RedisServer) -> (Vec<Case>, Vec<Case>) {
    rt.block_on(async {
        let round_trip = redis_limiter(server, ADMIT_ALL).build();

        // One key, denied by Redis once, then answered by the local tier.
        let cached = redis_limiter(server, "1/1h").build();
        let hot = WindowKey::for_subject("hot");
        let first = check(&cached, &hot).await;
        let second = check(&cached, &hot).await;
        assert!(
            first.allowed() && !second.allowed(),
            "setup: admit then deny"
        );
        assert_eq!(
            check(&cached, &hot).await.source(),
            DecisionSource::LocalCache
        );

        // Limiters that are talking to Redis when it dies; the breaker stays
        // open for an hour once it opens.
        let open_breaker = || {
            redis_limiter_with(server, ADMIT_ALL, |store| {
                store.breaker(BreakerConfig::default().cooldown(Duration::from_secs(3600)))
            })
        };
        let fail_open = open_breaker().fallback(FailOpen).build();
        let local_window = open_breaker()
            .fallback(LocalWindow::new(0.5).expect("valid share"))
            .build();
        for limiter in [&fail_open, &local_window] {
            let warm = WindowKey::for_subject("warm");
            assert_eq!(check(limiter, &warm).await.source(), DecisionSource::Store);
        }

        let memory = Limiter::new(MemoryStore::new(), quota(ADMIT_ALL));
        let up = vec![
            Case {
                name: "redis_round_trip",
                limiter: round_trip,
                keys: keys("rt", KEYS),
            },
            Case {
                name: "local_cache_hit",
                limiter: cached,
                keys: vec![hot],
            },
            Case {
                name: "memory_store",
                limiter: memory,
                keys: keys("mem", KEYS),
            },
        ];
        let down = vec![
            Case {
                name: "breaker_open_fail_open",
                limiter: fail_open,
                keys: keys("fo", KEYS),
            },
            Case {
                name: "breaker_open_local_window",
                limiter: local_window,
                keys: keys("lw", KEYS),
            },
        ];
        (up, down)
    })
}

/// With Redis down: fails checks until each limiter's breaker is open.
fn open_breakers(rt: &Runtime, cases: &[Case]) {
    rt.block_on(async {
        for case in cases {
            let warm = WindowKey::for_subject("warm");
            for _ in 0..1_000 {
                if case.limiter.breaker_state() == Some(BreakerState::Open) {
                    break;
                }
                let _ = check(&case.limiter, &warm).await;
            }
            assert_eq!(
                case.limiter.breaker_state(),
                Some(BreakerState::Open),
                "{}: breaker open",
                case.name
            );
        }
    });
}

struct Percentiles {
    samples: usize,
    mean: Duration,
    p50: Duration,
    p99: Duration,
    p999: Duration,
    max: Duration,
    sources: Vec<(String, usize)>,
}

/// Times up to `samples` decisions one by one.
fn sample(rt: &Runtime, case: &Case, samples: usize) -> Percentiles {
    rt.block_on(async {
        let mut times = Vec::with_capacity(samples);
        let mut sources: Vec<(String, usize)> = Vec::new();
        let started = Instant::now();
        for i in 0..samples {
            if started.elapsed() > SAMPLE_BUDGET {
                break;
            }
            let key = &case.keys[i % case.keys.len()];
            let t0 = Instant::now();
            let decision = check(&case.limiter, key).await;
            times.push(t0.elapsed());
            let source = decision.source().to_string();
            match sources.iter_mut().find(|(s, _)| *s == source) {
                Some((_, n)) => *n += 1,
                None => sources.push((source, 1)),
            }
        }
        times.sort_unstable();
        let at = |q: f64| {
            // Nearest rank.
            let rank = ((q * times.len() as f64).ceil() as usize).clamp(1, times.len());
            times[rank - 1]
        };
        let total: Duration = times.iter().sum();
        Percentiles {
            samples: times.len(),
            mean: total / u32::try_from(times.len()).unwrap_or(u32::MAX).max(1),
            p50: at(0.50),
            p99: at(0.99),
            p999: at(0.999),
            max: *times.last().unwrap_or(&Duration::ZERO),
            sources,
        }
    })
}

fn micros(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e6)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let list_only = args.iter().any(|a| a == "--list");
    let test_mode = args.iter().any(|a| a == "--test");
    let mut criterion = Criterion::default()
        .sample_size(50)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    if list_only {
        for name in [
            "redis_round_trip",
            "local_cache_hit",
            "memory_store",
            "breaker_open_fail_open",
            "breaker_open_local_window",
        ] {
            println!("decision_latency/{name}: benchmark");
        }
        return;
    }

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let mut server = RedisServer::start();
    let (up, down) = cases(&rt, &server);
    let samples = if test_mode { 100 } else { SAMPLES };

    let mut rows = Vec::new();
    let mut group = criterion.benchmark_group("decision_latency");
    let mut measure = |case: &Case| {
        let mut i = 0usize;
        group.bench_function(case.name, |b| {
            b.to_async(&rt).iter(|| {
                i = i.wrapping_add(1);
                let key = &case.keys[i % case.keys.len()];
                let limiter = &case.limiter;
                async move { black_box(check(limiter, key).await) }
            });
        });
        rows.push((case.name, sample(&rt, case, samples)));
    };
    for case in &up {
        measure(case);
    }
    // Redis goes down (SIGKILL); the breakers open.
    server.stop();
    open_breakers(&rt, &down);
    for case in &down {
        measure(case);
    }
    group.finish();
    drop(server);

    println!();
    println!("Decision latency, one caller, up to {samples} timed decisions per case (µs):");
    println!();
    println!("| case | samples | mean | p50 | p99 | p99.9 | max | sources |");
    println!("|---|---:|---:|---:|---:|---:|---:|---|");
    for (name, p) in &rows {
        let sources = p
            .sources
            .iter()
            .map(|(s, n)| format!("{s}: {n}"))
            .collect::<Vec<_>>()
            .join(", ");
        println!(
            "| {name} | {} | {} | {} | {} | {} | {} | {sources} |",
            p.samples,
            micros(p.mean),
            micros(p.p50),
            micros(p.p99),
            micros(p.p999),
            micros(p.max),
        );
    }
    criterion.final_summary();
}
