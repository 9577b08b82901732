//! Invariant 1 (global bound) on real Redis and a real Redis Cluster.
//!
//! Four independent "nodes" (each its own `RedisStore`, so its own
//! connection, and its own `Limiter`) run 16 tasks each, hammering one key
//! far above its rate for several windows. Every admission's server
//! timestamp (`Decision::timestamp_micros`, Redis `TIME`) is collected, and
//! the bound is checked on those, per algorithm, and so is every denial:
//! Redis denied only when the quota was exactly full. Runs last a span of
//! server time; loops are bounded by count (and by a hang guard).
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use tower_window::{Algorithm, DecisionSource, Limiter, Quota, RedisStore, Store, WindowKey};
use tower_window_tests::redis_cluster::{key_slot, primary_of, RedisCluster};
use tower_window_tests::redis_server::RedisServer;

const NODES: usize = 4;
const TASKS: usize = 16;
/// How long each algorithm is hammered, in server time: several windows.
/// Tasks stop once Redis `TIME` (a decision's timestamp) passes it, so a
/// stalled machine makes the run slower, not shorter.
const RUN_MICROS: u64 = 1_300_000;
/// A bound on attempts per task, whatever the speed of the machine.
const MAX_ATTEMPTS_PER_TASK: usize = 20_000;
/// A bound on wall-clock time, only so that a hang fails instead of blocking.
const HANG: Duration = Duration::from_secs(120);

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
    /// Server timestamps of denials Redis decided (not the local tier's
    /// remembered ones), sorted.
    denied: Vec<u64>,
    errors: usize,
}

/// Redis `TIME` on `url`, in µs.
fn server_time(url: &str) -> u64 {
    let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut conn).unwrap();
    secs * 1_000_000 + micros
}

/// Hammers `key` from NODES × TASKS tasks until the server's clock passes
/// `start + RUN_MICROS`; returns the decisions.
async fn hammer(nodes: &[Limiter], key: &WindowKey, start: u64) -> Run {
    let wall = Instant::now();
    let mut handles = Vec::new();
    for node in nodes {
        for _ in 0..TASKS {
            let limiter = node.clone();
            let key = key.clone();
            handles.push(tokio::spawn(async move {
                let (mut admitted, mut denied, mut errors) = (Vec::new(), Vec::new(), 0);
                for _ in 0..MAX_ATTEMPTS_PER_TASK {
                    assert!(wall.elapsed() < HANG, "the run hung");
                    match limiter.check(&key, 1).await {
                        Ok(d) => {
                            if d.allowed() {
                                admitted.push(d.timestamp_micros());
                            } else if d.source() == DecisionSource::Store {
                                denied.push(d.timestamp_micros());
                            }
                            if d.source() == DecisionSource::Store
                                && d.timestamp_micros() >= start + RUN_MICROS
                            {
                                break;
                            }
                        }
                        Err(_) => errors += 1,
                    }
                }
                (admitted, denied, errors)
            }));
        }
    }
    let mut run = Run {
        admitted: Vec::new(),
        denied: Vec::new(),
        errors: 0,
    };
    for handle in handles {
        let (admitted, denied, errors) = handle.await.unwrap();
        run.admitted.extend(admitted);
        run.denied.extend(denied);
        run.errors += errors;
    }
    run.admitted.sort_unstable();
    run.denied.sort_unstable();
    run
}

/// Admissions in `ts` (sorted) at times in `[from, to]`.
fn count_in(ts: &[u64], from: u64, to: u64) -> usize {
    ts.partition_point(|&t| t <= to) - ts.partition_point(|&t| t < from)
}

/// Checks the algorithm's bound on the admission timestamps, and that every
/// denial Redis made was forced (the quota was exactly full at that moment,
/// by the algorithm's definition: no under-admission, whatever the timing);
/// returns a summary line.
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
    // The run covered several windows of server time, and demand exceeded
    // the limit in at least three of them.
    assert!(span >= 2 * w, "{quota}: admissions span only {span} µs");
    let mut denied_windows: Vec<u64> = run.denied.iter().map(|t| t / w).collect();
    denied_windows.dedup();
    assert!(
        denied_windows.len() >= 3,
        "{quota}: denials in only {} windows",
        denied_windows.len()
    );
    // Utilisation: at every denial (cost 1) the quota was full, i.e. the
    // admissions that still counted at that server time number exactly L.
    for &t in &run.denied {
        let counted = match quota.algorithm() {
            // Entries newer than t - W count.
            Algorithm::SlidingLog => count_in(ts, t.saturating_sub(w) + 1, t) as u64,
            // Buckets j >= floor(t / G) - W / G count.
            Algorithm::SlidingCounter { granularity } => {
                let g = granularity.as_micros() as u64;
                let from = (t / g).saturating_sub(w / g) * g;
                count_in(ts, from, t) as u64
            }
            // The aligned window of t.
            Algorithm::FixedWindow => count_in(ts, t / w * w, t) as u64,
            // Admitting one more would put the theoretical arrival time
            // more than burst × T ahead of t.
            Algorithm::Gcra => {
                let period = quota.emission_interval_micros();
                let before = &ts[..ts.partition_point(|&a| a <= t)];
                let tat = before.iter().fold(0, |tat: u64, &a| tat.max(a) + period);
                let ahead = tat.max(t) + period - t;
                let full = ahead > u64::from(quota.capacity()) * period;
                assert!(
                    full,
                    "{quota}: denied at {t} with tat {} µs ahead",
                    tat.saturating_sub(t)
                );
                l
            }
            _ => unreachable!(),
        };
        assert_eq!(
            counted, l,
            "{quota}: denied at {t} with {counted} of {l} counted"
        );
    }
    format!(
        "{quota}: {} admitted, {} denied by Redis over {:.1} windows; every denial forced",
        ts.len(),
        run.denied.len(),
        span as f64 / w as f64,
    )
}

fn nodes(make: impl Fn() -> RedisStore, quota: &Quota) -> Vec<Limiter> {
    (0..NODES)
        // Bare (no time budget): every decision is the store's, however
        // slow the machine.
        .map(|_| Limiter::new(Store::bare(make()), quota.clone()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_bound_on_single_redis() {
    let server = RedisServer::start();
    for (i, quota) in quotas().into_iter().enumerate() {
        let nodes = nodes(
            || {
                RedisStore::builder()
                    .url(server.url())
                    .prefix("bound:")
                    .build()
                    .unwrap()
            },
            &quota,
        );
        let key = WindowKey::new("bound", format!("key-{i}"));
        let run = hammer(&nodes, &key, server_time(&server.url())).await;
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
                RedisStore::builder()
                    .cluster(cluster.urls())
                    .prefix("bound:")
                    .build()
                    .unwrap()
            },
            &quota,
        );
        let nodes = Arc::new(nodes);
        let start = server_time(&cluster.urls()[0]);
        let runs = futures_util::future::join_all(keys.iter().map(|key| {
            let nodes = Arc::clone(&nodes);
            let key = key.clone();
            async move { hammer(&nodes, &key, start).await }
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
