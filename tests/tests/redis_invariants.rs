//! RedisStore invariants on real Redis and Redis Cluster: TTL on every key,
//! hash slots of hostile keys, NOSCRIPT recovery, and one command per
//! decision. (Server clock under skew: `redis_clock_skew.rs`.)
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes_like::subject;
use tower_window::store::redis_key;
use tower_window::{Decision, Limiter, Quota, RedisStore, WindowKey};
use tower_window_tests::redis_cluster::{key_slot, RedisCluster};
use tower_window_tests::redis_server::RedisServer;

mod bytes_like {
    /// Hostile subjects: separators, braces, CR/LF, NUL, non-UTF-8, 1 MiB.
    pub(super) fn subject(i: usize) -> Vec<u8> {
        match i % 8 {
            0 => b"{evil}".to_vec(),
            1 => b"a}:{b".to_vec(),
            2 => b"line\r\nbreak\0nul".to_vec(),
            3 => vec![0xff, 0xfe, b'{', 0x80, b'}'],
            4 => b"%7B%7D%3A".to_vec(),
            5 => vec![b'}'; 1 << 20],
            6 => b"".to_vec(),
            _ => format!("plain-{i}").into_bytes(),
        }
    }
}

fn all_quotas() -> Vec<Quota> {
    [
        "5/1s",
        "5/1s sliding-counter(100ms)",
        "5/1s fixed-window",
        "5/1s gcra(burst=3)",
    ]
    .iter()
    .map(|q| q.parse().unwrap())
    .collect()
}

/// Runs every algorithm on many hostile keys through `store`.
async fn workload(store: Arc<RedisStore>) -> Vec<Decision> {
    let mut decisions = Vec::new();
    let quotas = [
        "5/1m",
        "5/1m sliding-counter(1s)",
        "5/1m fixed-window",
        "5/1m gcra(burst=3)",
    ];
    for quota in quotas.iter().map(|q| q.parse::<Quota>().unwrap()) {
        let limiter = Limiter::from_shared_store(store.clone(), quota);
        for i in 0..16 {
            let key = WindowKey::new(subject(i + 3), subject(i));
            for cost in [1, 2, 1, 9] {
                decisions.push(limiter.check(&key, cost).await.unwrap());
            }
        }
    }
    decisions
}

/// Every key under `prefix` on `conn` has a TTL; returns how many there are.
fn assert_all_keys_expire(conn: &mut redis::Connection, prefix: &str) -> usize {
    let keys: Vec<Vec<u8>> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query(conn)
        .unwrap();
    // SCAN, as the issue asks (KEYS above only sizes the expectation).
    let mut cursor = 0u64;
    let mut scanned = 0;
    loop {
        let (next, batch): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query(conn)
            .unwrap();
        for key in batch {
            let ttl: i64 = redis::cmd("PTTL").arg(&key).query(conn).unwrap();
            assert!(
                ttl > 0,
                "key {:?} has no TTL ({ttl})",
                String::from_utf8_lossy(&key)
            );
            scanned += 1;
        }
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    assert_eq!(scanned, keys.len());
    scanned
}

/// Invariant 4 on one server: after a run, no key lacks a TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_has_a_ttl() {
    let server = RedisServer::shared();
    let store = RedisStore::from_url(&server.url()).unwrap().prefix("ttl:");
    let store = Arc::new(store);
    let decisions = workload(store).await;
    assert!(decisions.iter().any(|d| d.allowed));
    assert!(decisions.iter().any(|d| !d.allowed));
    let keys = assert_all_keys_expire(&mut server.connection(), "ttl:");
    assert!(keys >= 4 * 8, "only {keys} keys");
}

/// Invariant 4/5 on the cluster: hostile subjects land in the slot the
/// encoder's hash tag names (CLUSTER KEYSLOT agrees), every quota of a
/// subject shares it, no CROSSSLOT error, and every key has a TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_slots_and_ttls() {
    let cluster = RedisCluster::shared();
    let mut node = cluster.nodes()[0].connection();
    for i in 0..16 {
        let key = WindowKey::new(subject(i + 3), subject(i));
        let quotas = all_quotas();
        let policy = tower_window::Policy::new(
            "all",
            quotas
                .iter()
                .enumerate()
                .map(|(i, q)| q.clone().named(&format!("q{i}")).unwrap()),
        )
        .unwrap();
        let slots: Vec<u16> = policy
            .quotas()
            .iter()
            .map(|quota| {
                let encoded = redis_key("slots:", &key, &policy, quota);
                let server_slot: u16 = redis::cmd("CLUSTER")
                    .arg("KEYSLOT")
                    .arg(&encoded)
                    .query(&mut node)
                    .unwrap();
                assert_eq!(server_slot, key_slot(&encoded));
                // The sliding log's companion key shares the slot.
                let mut meta = encoded.clone();
                meta.extend_from_slice(b":m");
                assert_eq!(key_slot(&meta), server_slot);
                server_slot
            })
            .collect();
        assert!(slots.windows(2).all(|w| w[0] == w[1]), "{slots:?}");
    }
    let store = RedisStore::cluster(cluster.urls())
        .unwrap()
        .prefix("slots:");
    store.connect().await.unwrap();
    let store = Arc::new(store);
    let decisions = workload(store).await; // unwraps: no CROSSSLOT or any other error
    assert!(decisions.iter().any(|d| d.allowed));
    let mut total = 0;
    for node in cluster.nodes() {
        total += assert_all_keys_expire(&mut node.connection(), "slots:");
    }
    assert!(total >= 4 * 8, "only {total} keys");
}

/// Hammers `limiter` from 8 tasks until told to stop; counts decisions and errors.
async fn run_until(
    limiter: Limiter,
    stop: Arc<std::sync::atomic::AtomicBool>,
    decided: Arc<AtomicUsize>,
) -> Vec<String> {
    let mut handles = Vec::new();
    for task in 0..8 {
        let limiter = limiter.clone();
        let stop = stop.clone();
        let decided = decided.clone();
        handles.push(tokio::spawn(async move {
            let mut errors = Vec::new();
            let mut i = 0usize;
            while !stop.load(Ordering::Relaxed) && i < 100_000 {
                let key = WindowKey::for_subject(format!("noscript-{task}-{}", i % 7));
                match limiter.check(&key, 1).await {
                    Ok(_) => {
                        decided.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => errors.push(e.to_string()),
                }
                i += 1;
            }
            errors
        }));
    }
    let mut errors = Vec::new();
    for handle in handles {
        errors.extend(handle.await.unwrap());
    }
    errors
}

async fn flush_mid_run(limiter: Limiter, flush: impl Fn()) {
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let decided = Arc::new(AtomicUsize::new(0));
    let run = tokio::spawn(run_until(limiter, stop.clone(), decided.clone()));
    let mut last = 0;
    for _ in 0..5 {
        // Let some decisions through, then flush the scripts under them.
        while decided.load(Ordering::Relaxed) < last + 200 {
            tokio::task::yield_now().await;
        }
        flush();
        last = decided.load(Ordering::Relaxed);
    }
    while decided.load(Ordering::Relaxed) < last + 200 {
        tokio::task::yield_now().await;
    }
    stop.store(true, Ordering::Relaxed);
    let errors = run.await.unwrap();
    assert!(
        errors.is_empty(),
        "failed decisions: {:?}",
        &errors[..errors.len().min(5)]
    );
}

/// Invariant: SCRIPT FLUSH mid-run causes no failed decision (NOSCRIPT →
/// load → retry, invisibly). Single server and cluster, every algorithm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_mid_run_fails_nothing() {
    let server = RedisServer::start();
    for quota in all_quotas() {
        let store = RedisStore::from_url(&server.url()).unwrap();
        flush_mid_run(Limiter::new(store, quota), || {
            let _: () = redis::cmd("SCRIPT")
                .arg("FLUSH")
                .query(&mut server.connection())
                .unwrap();
        })
        .await;
    }
    // The flushes really produced NOSCRIPT replies, which the store absorbed.
    let errors: String = redis::cmd("INFO")
        .arg("errorstats")
        .query(&mut server.connection())
        .unwrap();
    assert!(errors.contains("errorstat_NOSCRIPT:count="), "{errors}");
    let cluster = RedisCluster::shared();
    for quota in all_quotas() {
        let store = RedisStore::cluster(cluster.urls()).unwrap();
        flush_mid_run(Limiter::new(store, quota), || {
            for node in cluster.nodes() {
                let _: () = redis::cmd("SCRIPT")
                    .arg("FLUSH")
                    .query(&mut node.connection())
                    .unwrap();
            }
        })
        .await;
    }
}

fn commandstats(conn: &mut redis::Connection) -> HashMap<String, u64> {
    let info: String = redis::cmd("INFO").arg("commandstats").query(conn).unwrap();
    info.lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest.split(',').find_map(|f| f.strip_prefix("calls="))?;
            Some((name.to_owned(), calls.parse().ok()?))
        })
        .collect()
}

/// Commands the scripts themselves run (Redis counts those too).
const SCRIPT_COMMANDS: &[&str] = &[
    "time",
    "zrangebyscore",
    "zremrangebyscore",
    "zrange",
    "zadd",
    "hget",
    "hset",
    "hincrby",
    "exists",
    "del",
    "pexpire",
    "hgetall",
    "hdel",
    "hmget",
    "get",
    "set",
];

/// Runs sequential and concurrent decisions of every algorithm; returns how many.
async fn decide_many(store: Arc<RedisStore>) -> u64 {
    let mut decisions = 0u64;
    for quota in all_quotas() {
        let limiter = Limiter::from_shared_store(store.clone(), quota);
        for i in 0..50 {
            limiter
                .check(&WindowKey::for_subject(format!("cmd-{i}")), 1)
                .await
                .unwrap();
            decisions += 1;
        }
        let concurrent = futures_util::future::join_all((0..64).map(|i| {
            let limiter = limiter.clone();
            async move {
                limiter
                    .check(&WindowKey::for_subject(format!("cmd-{i}")), 1)
                    .await
            }
        }))
        .await;
        assert!(concurrent.iter().all(Result::is_ok));
        decisions += 64;
    }
    decisions
}

/// Asserts the only commands clients sent were EVALSHAs (plus our own
/// CONFIG RESETSTAT / INFO); returns the EVALSHA count.
fn evalsha_only(name: &str, stats: &HashMap<String, u64>) -> u64 {
    for (command, calls) in stats {
        let expected = command == "evalsha"
            || command.starts_with("config")
            || command == "info"
            || SCRIPT_COMMANDS.contains(&command.as_str());
        assert!(
            expected,
            "{name}: unexpected command {command} ({calls} calls)"
        );
    }
    stats.get("evalsha").copied().unwrap_or(0)
}

/// Invariant 6: exactly one command (EVALSHA) per decision reaches Redis:
/// no PING, no SCRIPT EXISTS/LOAD, no EVAL — for a URL store and a pool store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_command_per_decision() {
    let server = RedisServer::start();
    let pool = deadpool_redis::Config::from_url(server.url())
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .unwrap();
    let stores = [
        ("url", RedisStore::from_url(&server.url()).unwrap()),
        ("pool", RedisStore::from_pool(pool)),
    ];
    let mut admin = server.connection();
    for (name, store) in stores {
        store.connect().await.unwrap();
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query(&mut admin)
            .unwrap();
        let decisions = decide_many(Arc::new(store)).await;
        assert_eq!(evalsha_only(name, &commandstats(&mut admin)), decisions);
    }
}

/// The same on the cluster: summed over the primaries, one EVALSHA per
/// decision and nothing else (no per-call topology or PING traffic).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_command_per_decision_on_the_cluster() {
    let cluster = RedisCluster::start();
    let store = RedisStore::cluster(cluster.urls()).unwrap();
    store.connect().await.unwrap();
    let mut admins: Vec<redis::Connection> = cluster
        .nodes()
        .iter()
        .map(RedisServer::connection)
        .collect();
    for admin in &mut admins {
        let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query(admin).unwrap();
    }
    let decisions = decide_many(Arc::new(store)).await;
    let mut evalsha = 0;
    for (i, admin) in admins.iter_mut().enumerate() {
        let on_node = evalsha_only(&format!("node {i}"), &commandstats(admin));
        assert!(on_node > 0, "node {i} decided nothing");
        evalsha += on_node;
    }
    assert_eq!(evalsha, decisions);
}
