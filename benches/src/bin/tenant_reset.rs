//! `cargo run --release -p tower-window-benches --bin tenant_reset`
//!
//! Reset propagation: how long from `reset(tenant)` on node A until node B
//! (another registry with its own connections) resolves the tenant's new
//! generation, over 50 runs, on a single Redis server and on a Redis
//! Cluster (each spawned by the test harness on loopback). Prints p50, p99
//! and max. A measurement, not a test: nothing is asserted.
#![allow(clippy::print_stdout, clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use tower_window::tenant::{TenantRegistry, TenantSpec, TenantsConfig};
use tower_window::RedisStore;
use tower_window_tests::redis_cluster::RedisCluster;
use tower_window_tests::redis_server::RedisServer;

const RUNS: usize = 50;

fn config() -> TenantsConfig {
    let spec = TenantSpec::builder()
        .quota("burst", "10/1s")
        .unwrap()
        .build()
        .unwrap();
    TenantsConfig::new().with_tenant("acme", spec).unwrap()
}

async fn measure(label: &str, store: impl Fn() -> RedisStore) {
    let a = TenantRegistry::redis(config(), Arc::new(store()));
    let b = TenantRegistry::redis(config(), Arc::new(store()));
    a.loaded().await;
    b.loaded().await;
    let mut samples = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let mut changes = b.subscribe();
        let before = b.tenant("acme").unwrap().generation;
        let started = Instant::now();
        a.reset("acme").await.unwrap();
        loop {
            if b.tenant("acme").unwrap().generation > before {
                break;
            }
            tokio::time::timeout(Duration::from_secs(5), changes.changed())
                .await
                .expect("B sees the reset within 5 s")
                .unwrap();
        }
        samples.push(started.elapsed());
        // Let the reader settle back into its blocking read.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    samples.sort();
    let pick = |p: usize| samples[(samples.len() * p / 100).min(samples.len() - 1)];
    println!(
        "{label:>8}: reset propagation over {RUNS} runs: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        pick(50).as_secs_f64() * 1e3,
        pick(99).as_secs_f64() * 1e3,
        samples[samples.len() - 1].as_secs_f64() * 1e3,
    );
}

#[tokio::main]
async fn main() {
    let server = RedisServer::start();
    let url = server.url();
    measure("single", || {
        RedisStore::builder()
            .url(&url)
            .prefix("bench:")
            .build()
            .unwrap()
    })
    .await;
    let cluster = RedisCluster::start();
    let urls = cluster.urls();
    measure("cluster", || {
        RedisStore::builder()
            .cluster(&urls)
            .prefix("bench:")
            .build()
            .unwrap()
    })
    .await;
}
