//! Invariant 1 (global bound) on real Redis and a real Redis Cluster.
//!
//! Four independent "nodes" (each its own `RedisStore`, so its own
//! connection, and its own `Limiter`) run 16 tasks each, hammering one key
//! far above its rate for several windows. Every admission's server
//! timestamp (`Decision::timestamp_micros`, Redis `TIME`) is collected, and
//! the bound is checked on those, per algorithm. Loops are bounded by count
//! and by time.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use tower_window::{Algorithm, Limiter, Quota, RedisStore, WindowKey};
use tower_window_tests::redis_cluster::{key_slot, primary_of, RedisCluster};
use tower_window_tests::redis_server::RedisServer;

const NODES: usize = 4;
const TASKS: usize = 16;
/// How long each algorithm is hammered: several windows.
const RUN: Duration = Duration::from_millis(1_300);
/// A bound on attempts per task, whatever the speed of the machine.
const MAX_ATTEMPTS_PER_TASK: usize = 20_000;

fn quotas() -> Vec<Quota> {
    [
        "40/400ms",
        "40/400ms sliding-counter(4ms)",
        "40/400ms fixed-window",
        "40/400ms gcra",
    ]
    .iter()
    .map(|q| q.parse().unwrap())
    .collect()
}

struct Run {
    /// Server timestamps of admissions, sorted.
    admitted: Vec<u64>,
    attempts: usize,
    errors: usize,
}

/// Hammers `key` from NODES × TASKS tasks; returns the admissions.
async fn hammer(nodes: &[Limiter], key: &WindowKey) -> Run {
    let start = Instant::now();
    let mut handles = Vec::new();
    for node in nodes {
        for _ in 0..TASKS {
            let limiter = node.clone();
            let key = key.clone();
            handles.push(tokio::spawn(async move {
                let (mut admitted, mut attempts, mut errors) = (Vec::new(), 0, 0);
                while start.elapsed() < RUN && attempts < MAX_ATTEMPTS_PER_TASK {
                    attempts += 1;
                    match limiter.check(&key, 1).await {
                        Ok(d) if d.allowed => admitted.push(d.timestamp_micros),
                        Ok(_) => {}
                        Err(_) => errors += 1,
                    }
                }
                (admitted, attempts, errors)
            }));
        }
    }
    let mut run = Run {
        admitted: Vec::new(),
        attempts: 0,
        errors: 0,
    };
    for handle in handles {
        let (admitted, attempts, errors) = handle.await.unwrap();
        run.admitted.extend(admitted);
        run.attempts += attempts;
        run.errors += errors;
    }
    run.admitted.sort_unstable();
    run
}

/// Checks the algorithm's bound on the admission timestamps and that the
/// limit was (nearly) reached; returns a summary line.
fn check_bound(quota: &Quota, run: &Run) -> String {
    let w = quota.window_micros();
    let l = u64::from(quota.limit());
    let ts = &run.admitted;
    assert_eq!(run.errors, 0, "{quota}: store errors");
    assert!(ts.len() as u64 > l, "{quota}: only {} admitted", ts.len());
    let span = ts[ts.len() - 1] - ts[0];
    match quota.algorithm() {
        Algorithm::SlidingLog | Algorithm::SlidingCounter { .. } => {
            // Never more than L in any window (t - W, t]: any L + 1 admissions span at least W.
            for i in 0..ts.len() - l as usize {
                assert!(
                    ts[i + l as usize] - ts[i] >= w,
                    "{quota}: {} admissions within {} µs",
                    l + 1,
                    ts[i + l as usize] - ts[i]
                );
            }
        }
        Algorithm::FixedWindow => {
            let mut i = 0;
            while i < ts.len() {
                let k = ts[i] / w;
                let n = ts[i..].iter().take_while(|&&t| t / w == k).count();
                assert!(
                    n as u64 <= l,
                    "{quota}: {n} admissions in aligned window {k}"
                );
                i += n;
            }
        }
        Algorithm::Gcra => {
            // In any interval [a, b]: at most burst + (b - a) / T admissions.
            let t = quota.emission_interval_micros();
            let burst = u64::from(quota.capacity());
            for i in 0..ts.len() {
                for j in i..ts.len() {
                    let n = (j - i + 1) as u64;
                    assert!(
                        n <= burst + (ts[j] - ts[i]) / t,
                        "{quota}: {n} admissions within {} µs",
                        ts[j] - ts[i]
                    );
                }
            }
        }
        _ => unreachable!(),
    }
    // Demand was at least 5× the allowed rate.
    let windows = span as f64 / w as f64;
    let allowed_rate_total = l as f64 * (windows + 1.0);
    assert!(
        run.attempts as f64 >= 5.0 * allowed_rate_total,
        "{quota}: only {} attempts for {allowed_rate_total} allowed",
        run.attempts
    );
    // Utilisation while demand exceeds the limit.
    let reached = match quota.algorithm() {
        Algorithm::FixedWindow => {
            // The aligned windows strictly between the first and the last.
            let (first, last) = (ts[0] / w, ts[ts.len() - 1] / w);
            let full = last.saturating_sub(first + 1);
            let n = ts
                .iter()
                .filter(|&&t| t / w > first && t / w < last)
                .count();
            assert!(full >= 1, "{quota}: no full window");
            n as f64 / (full * l) as f64
        }
        Algorithm::Gcra => {
            // After the first burst, one admission per emission interval.
            let t = quota.emission_interval_micros();
            let burst = u64::from(quota.capacity());
            let steady = (ts.len() as u64).saturating_sub(burst);
            steady as f64 / (span / t) as f64
        }
        _ => {
            // The windows [t0 + kW, t0 + (k+1)W) fully inside the run.
            let full = span / w;
            assert!(full >= 2, "{quota}: fewer than two full windows");
            let n = ts.iter().filter(|&&t| t < ts[0] + full * w).count();
            n as f64 / (full * l) as f64
        }
    };
    assert!(
        reached >= 0.95,
        "{quota}: reached only {:.1}% of the limit",
        reached * 100.0
    );
    format!(
        "{quota}: {} admitted of {} attempts over {:.1} windows, {:.1}% of the limit reached",
        ts.len(),
        run.attempts,
        windows,
        reached * 100.0
    )
}

fn nodes(make: impl Fn() -> RedisStore, quota: &Quota) -> Vec<Limiter> {
    (0..NODES)
        .map(|_| Limiter::new(make(), quota.clone()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_bound_on_single_redis() {
    let server = RedisServer::start();
    for (i, quota) in quotas().into_iter().enumerate() {
        let nodes = nodes(
            || {
                RedisStore::from_url(&server.url())
                    .unwrap()
                    .prefix("bound:")
            },
            &quota,
        );
        let key = WindowKey::new("bound", format!("key-{i}"));
        let run = hammer(&nodes, &key).await;
        eprintln!("single: {}", check_bound(&quota, &run));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_bound_on_cluster_with_keys_on_every_primary() {
    let cluster = RedisCluster::start();
    // One key per primary.
    let mut keys: Vec<Option<WindowKey>> = vec![None, None, None];
    for i in 0.. {
        let key = WindowKey::new("bound", format!("user-{i}"));
        let slot = key_slot(&tower_window::store::redis_key(
            "bound:",
            &key,
            &quotas()[0].clone().into(),
            &quotas()[0],
        ));
        keys[primary_of(slot)].get_or_insert(key);
        if keys.iter().all(Option::is_some) {
            break;
        }
    }
    let keys: Vec<WindowKey> = keys.into_iter().map(Option::unwrap).collect();
    for quota in quotas() {
        let nodes = nodes(
            || {
                RedisStore::cluster(cluster.urls())
                    .unwrap()
                    .prefix("bound:")
            },
            &quota,
        );
        let nodes = Arc::new(nodes);
        let runs = futures_util::future::join_all(keys.iter().map(|key| {
            let nodes = Arc::clone(&nodes);
            let key = key.clone();
            async move { hammer(&nodes, &key).await }
        }))
        .await;
        for run in &runs {
            eprintln!("cluster: {}", check_bound(&quota, run));
        }
    }
    // Every primary holds state.
    for node in cluster.nodes() {
        let size: u64 = redis::cmd("DBSIZE").query(&mut node.connection()).unwrap();
        assert!(size > 0, "a primary holds no key");
    }
}
