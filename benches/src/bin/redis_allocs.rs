//! Heap allocations per decision on Redis, counted by a global allocator
//! (dhat), through `Limiter::check` and through the layer (issue "One
//! engine": allocations and boxed futures per Redis decision).
//!
//! ```text
//! cargo run --release -p tower-window-benches --bin redis_allocs
//! ```
//!
//! Spawns its own `redis-server` on a random loopback port (never the
//! system one). Each case warms its key up, then counts the allocations of
//! `ROUNDS` allowed decisions, one at a time, on a current-thread runtime,
//! and prints them per decision as a Markdown table. Everything is counted:
//! the limiter's futures, redis-rs's command encoding and reply parsing,
//! and Tokio's I/O. A row for a bare `PING` by redis-rs is the floor. No number is asserted: this is a measurement.
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::future::Future;

use http::{Request, Response};
use tower::{Layer, ServiceExt};
use tower_window::{Limiter, Quota, RedisStore, SlidingWindowLayer, Store, WindowKey};
use tower_window_tests::redis_server::RedisServer;

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

fn allocations() -> u64 {
    dhat::HeapStats::get().total_blocks
}

const ROUNDS: u64 = 2_000;
const ADMIT_ALL: &str = "1000000000/1s";

/// Allocations per call of `f`, after a warm-up of 100 calls.
async fn per_decision<F, Fut>(mut f: F) -> f64
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    for _ in 0..100 {
        f().await;
    }
    let before = allocations();
    for _ in 0..ROUNDS {
        f().await;
    }
    (allocations() - before) as f64 / ROUNDS as f64
}

fn main() {
    let _profiler = dhat::Profiler::builder().testing().build();
    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(measure(&server.url()));
}

/// A store of its own for each case (one connection each), connected.
async fn connected(url: &str) -> RedisStore {
    let redis = RedisStore::from_url(url).unwrap();
    redis.connect().await.unwrap();
    redis
}

async fn measure(url: &str) {
    let quota: Quota = ADMIT_ALL.parse().unwrap();
    let key = WindowKey::new("bench", "alice");
    let mut rows: Vec<(&str, f64)> = Vec::new();

    // The floor: redis-rs alone, one round trip of the smallest command.
    let client = redis::Client::open(url).unwrap();
    let conn = client.get_multiplexed_async_connection().await.unwrap();
    rows.push((
        "redis-rs alone: `PING` on a multiplexed connection (floor)",
        per_decision(|| {
            let mut conn = conn.clone();
            async move {
                let pong: String = redis::cmd("PING").query_async(&mut conn).await.unwrap();
                assert_eq!(pong, "PONG");
            }
        })
        .await,
    ));

    let bare = Limiter::new(Store::bare(connected(url).await), quota.clone());
    rows.push((
        "`Limiter::check`, `Store::bare(RedisStore)` (no budget, no breaker)",
        per_decision(|| async { assert!(bare.check(&key, 1).await.unwrap().allowed()) }).await,
    ));
    let guarded = Limiter::new(Store::from(connected(url).await), quota.clone());
    rows.push((
        "`Limiter::check`, `Store::from(RedisStore)` (50 ms budget, retries, breaker, in-flight bound)",
        per_decision(|| async { assert!(guarded.check(&key, 1).await.unwrap().allowed()) })
            .await,
    ));
    let built = Limiter::builder(Store::from(connected(url).await), quota.clone()).build();
    rows.push((
        "`Limiter::check`, `Limiter::builder` (local tier too)",
        per_decision(|| async { assert!(built.check(&key, 1).await.unwrap().allowed()) }).await,
    ));

    let fixed = key.clone();
    let typed = SlidingWindowLayer::new(
        Limiter::new(Store::from(connected(url).await), quota.clone()),
        move |_: &u64| Some(fixed.clone()),
    )
    .typed_errors()
    .layer(tower::service_fn(
        |n: u64| async move { Ok::<_, Infallible>(n) },
    ));
    rows.push((
        "layer, `Typed` mode, key cloned",
        per_decision(|| async { assert_eq!(typed.clone().oneshot(7).await.unwrap(), 7) }).await,
    ));
    let fixed = key.clone();
    let http = SlidingWindowLayer::new(
        Limiter::new(Store::from(connected(url).await), quota),
        move |_: &Request<()>| Some(fixed.clone()),
    )
    .layer(tower::service_fn(|_: Request<()>| async {
        Ok::<_, Infallible>(Response::new(()))
    }));
    rows.push((
        "layer, HTTP mode (headers + `Decision` extension), key cloned",
        per_decision(|| async {
            let response = http.clone().oneshot(Request::new(())).await.unwrap();
            assert!(response.status().is_success());
        })
        .await,
    ));

    println!("| path ({ROUNDS} allowed decisions on Redis) | allocations per decision |");
    println!("|---|---:|");
    for (name, n) in rows {
        println!("| {name} | {n:.2} |");
    }
}
