//! Issue 22's headline, black-box: the built `gateway` on a Redis Cluster
//! with replicas (`--redis-cluster`, `--fallback fail-closed`,
//! `--debug-headers`), 8 clients sending requests for 40 users, and one
//! primary killed with SIGKILL. Its replica is promoted; from then on the
//! gateway must decide every user by the store again within 2 s of the
//! cluster being whole, and stay so (before the fix it answered
//! `fallback(circuit_open)` for every user for as long as it ran).
//!
//! Red on `f7d5ac2` (main before issue 22's fixes; run with
//! `TW_GATEWAY_BIN=<that build's gateway>`): with the cluster whole at
//! 5.1 s, about two thirds of the answers were still
//! `fallback(circuit_open)` at 7 and 8 s, and the last ones came at 9 s.
//! Green after: every user is back on the store within a second of the
//! cluster being whole.
//!
//! The library-level scenarios (manual failover, the old primary back as a
//! replica, resharding, a single Redis restarted, the global bound) are in
//! `tests/tests/redis_fault_recovery.rs`; this one runs the gateway process
//! as users deploy it. Every wait and every load loop is bounded.
#![allow(clippy::unwrap_used)]

mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{sleep, JoinHandle};
use std::time::{Duration, Instant};

use support::{get_as, GatewayProcess};
use tower_window_tests::redis_cluster::RedisCluster;

/// Concurrent clients.
const CLIENTS: usize = 8;
/// Users, spread over every primary by their keys' slots.
const USERS: usize = 40;
/// Every user is decided by the store again this soon after the cluster is
/// whole.
const RECOVERY: Duration = Duration::from_secs(2);
/// How long the load goes on after the recovery window.
const OBSERVE: Duration = Duration::from_secs(3);
/// Load before the kill.
const WARMUP: Duration = Duration::from_millis(1500);
/// The longest the load may run, whatever happens.
const LOAD_LIMIT: Duration = Duration::from_secs(90);
/// A pause between one client's requests: steady load, not saturation.
const PAUSE: Duration = Duration::from_millis(5);
/// A request may time out on a busy two-core machine running six servers
/// and the load: at most one in this many after the recovery window, and
/// only as `fallback(timeout)`.
const NOISE: usize = 200;

/// One answer of the gateway.
#[derive(Debug, Clone)]
struct Sample {
    /// When the request was sent, since the load started.
    at: Duration,
    user: usize,
    status: u16,
    /// `x-ratelimit-source`: `store`, `local_cache` or `fallback(<reason>)`.
    source: String,
}

/// `CLIENTS` threads sending `GET /api/hello` for the users in turn.
struct ClientLoad {
    started: Instant,
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<Sample>>>,
    clients: Vec<JoinHandle<()>>,
}

impl ClientLoad {
    fn start(port: u16) -> Self {
        let started = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let clients = (0..CLIENTS)
            .map(|client| {
                let (stop, samples) = (Arc::clone(&stop), Arc::clone(&samples));
                std::thread::spawn(move || {
                    let mut user = client;
                    while !stop.load(Ordering::Relaxed) && started.elapsed() < LOAD_LIMIT {
                        let at = started.elapsed();
                        let answer = get_as(port, "/api/hello", "public", &format!("user-{user}"));
                        samples.lock().unwrap().push(Sample {
                            at,
                            user,
                            status: answer.status,
                            source: answer.header("x-ratelimit-source").to_owned(),
                        });
                        user = (user + CLIENTS) % USERS;
                        sleep(PAUSE);
                    }
                })
            })
            .collect();
        Self {
            started,
            stop,
            samples,
            clients,
        }
    }

    fn now(&self) -> Duration {
        self.started.elapsed()
    }

    fn stop(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        for client in self.clients {
            client.join().unwrap();
        }
        let samples = self.samples.lock().unwrap();
        samples.clone()
    }
}

/// Sources per second of the run, for a failure's message.
fn timeline(samples: &[Sample]) -> String {
    let mut seconds: BTreeMap<u64, BTreeMap<&str, usize>> = BTreeMap::new();
    for sample in samples {
        *seconds
            .entry(sample.at.as_secs())
            .or_default()
            .entry(sample.source.as_str())
            .or_default() += 1;
    }
    seconds
        .iter()
        .map(|(second, sources)| format!("  {second:>3} s: {sources:?}\n"))
        .collect()
}

#[test]
fn the_gateway_decides_by_the_store_again_after_a_primary_is_killed() {
    // Redis's defaults, as the cluster: full coverage required, so
    // every key leaves the store while the dead primary's slots have none.
    let mut cluster = RedisCluster::start_with_replicas();
    let seeds = cluster.urls().join(",");
    let gateway = GatewayProcess::start(&[
        "--redis-cluster",
        &seeds,
        "--fallback",
        "fail-closed",
        "--debug-headers",
        "--limit",
        "1000000/1h",
    ]);
    let (victim, heir) = cluster.pairs()[0];
    let load = ClientLoad::start(gateway.port());
    sleep(WARMUP);
    let killed = load.now();
    cluster.nodes_mut()[victim].stop();
    let live: Vec<usize> = (0..cluster.nodes().len())
        .filter(|&i| i != victim)
        .collect();
    cluster.wait_until_whole("the replica takes over", &live, || true);
    let whole = load.now();
    sleep(RECOVERY + OBSERVE);
    let samples = load.stop();
    let timeline = timeline(&samples);
    eprintln!(
        "{} answers; primary {victim} killed at {killed:?}, replica {heir} serving, cluster whole at {whole:?}\n{timeline}",
        samples.len()
    );

    // The load reached the store before the kill.
    let before: Vec<&Sample> = samples.iter().filter(|s| s.at < killed).collect();
    assert!(
        before.iter().any(|s| s.source == "store"),
        "no answer came from the store before the kill:\n{timeline}\n{}",
        gateway.log()
    );
    // From RECOVERY after the cluster was whole: every user is decided by
    // the store, and nothing falls back but the odd time-out.
    let after: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.at >= whole + RECOVERY)
        .collect();
    for user in 0..USERS {
        assert!(
            after
                .iter()
                .any(|s| s.user == user && s.source == "store" && s.status == 200),
            "user-{user} was not decided by the store from {:?} on:\n{timeline}",
            whole + RECOVERY
        );
    }
    let fallbacks: Vec<&&Sample> = after
        .iter()
        .filter(|s| s.source.starts_with("fallback"))
        .collect();
    assert!(
        fallbacks.iter().all(|s| s.source == "fallback(timeout)"),
        "fallbacks other than time-outs after the recovery window, first {:?}:\n{timeline}",
        fallbacks.iter().find(|s| s.source != "fallback(timeout)")
    );
    assert!(
        fallbacks.len() * NOISE <= after.len(),
        "{} of {} answers after the recovery window fell back:\n{timeline}",
        fallbacks.len(),
        after.len()
    );
    // Fail-closed: a fallback is a 503, never an admission.
    assert!(
        samples
            .iter()
            .filter(|s| s.source.starts_with("fallback"))
            .all(|s| s.status == 503),
        "a fallback answer that was not 503:\n{timeline}"
    );
}
