//! RedisStore invariants on real Redis and Redis Cluster: TTL on every key,
//! hash slots of hostile keys, NOSCRIPT recovery, and one command per
//! decision. (Server clock under skew: `redis_clock_skew.rs`.)
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes_like::subject;
use tower_window::store::redis_key;
use tower_window::{Decision, Limiter, Quota, RedisStore, Store, WindowKey};
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
    // One bare handle (no budget or retries) for every limiter.
    let store = Store::bare(store);
    for quota in quotas.iter().map(|q| q.parse::<Quota>().unwrap()) {
        let limiter = Limiter::new(store.clone(), quota);
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
    let store = RedisStore::builder()
        .url(server.url())
        .prefix("ttl:")
        .build()
        .unwrap();
    let store = Arc::new(store);
    let decisions = workload(store).await;
    assert!(decisions.iter().any(|d| d.allowed()));
    assert!(decisions.iter().any(|d| !d.allowed()));
    let keys = assert_all_keys_expire(&mut server.connection(), "ttl:");
    assert!(keys >= 4 * 8, "only {keys} keys");
}

/// Server time (µs) and the PTTL (ms) of `keys`, read atomically.
fn time_and_pttls(conn: &mut redis::Connection, keys: &[Vec<u8>]) -> (u64, Vec<i64>) {
    let mut pipe = redis::pipe();
    pipe.atomic().cmd("TIME");
    for key in keys {
        pipe.cmd("PTTL").arg(key);
    }
    let mut replies: Vec<redis::Value> = pipe.query(conn).unwrap();
    let pttls = replies
        .split_off(1)
        .into_iter()
        .map(|v| redis::from_redis_value(v).unwrap())
        .collect();
    let (secs, micros): (u64, u64) = redis::from_redis_value(replies.remove(0)).unwrap();
    (secs * 1_000_000 + micros, pttls)
}

/// When the state a run of admissions (at server times `admitted`) wrote
/// stops being needed, in server µs, per the algorithm's definition.
fn needed_until(quota: &Quota, admitted: &[u64]) -> u64 {
    let w = quota.window_micros();
    let last = *admitted.last().unwrap();
    match quota.algorithm() {
        // The newest entry counts until it leaves the window.
        tower_window::Algorithm::SlidingLog => last + w,
        // The newest bucket counts until W after it ends.
        tower_window::Algorithm::SlidingCounter { granularity } => {
            let g = granularity.as_micros() as u64;
            (last / g + 1) * g + w
        }
        // The window's count matters until the aligned window ends.
        tower_window::Algorithm::FixedWindow => (last / w + 1) * w,
        // The theoretical arrival time, after which the key means "now".
        tower_window::Algorithm::Gcra => {
            let t = quota.emission_interval_micros();
            admitted.iter().fold(0, |tat, &at| tat.max(at) + t)
        }
        other => unreachable!("{other:?}"),
    }
}

/// Invariant 4, exactly, on Redis `TIME` (no explicit clock, so no minimum
/// TTL): after admissions, each key (and the sliding log's companion)
/// expires no earlier than the moment its state stops being needed and at
/// most a small slack later. Sliding log: newest entry + W; sliding
/// counter: newest bucket's end + W; fixed window: the window's end; GCRA:
/// the theoretical arrival time. A TTL of a year, or one a bucket short,
/// fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttls_end_when_the_state_stops_mattering() {
    /// PEXPIRE is in whole ms, rounded up, from the script's start.
    const ROUNDING_US: u64 = 2_000;
    /// How much later than needed a key may expire.
    const SLACK_US: u64 = 5_000;
    let server = RedisServer::shared();
    let mut conn = server.connection();
    let quotas = [
        "10/7s",
        "10/7s sliding-counter(350ms)",
        "10/7s fixed-window",
        "10/7s gcra(burst=10)",
    ];
    for (i, text) in quotas.into_iter().enumerate() {
        let quota: Quota = text.parse().unwrap();
        let prefix = format!("exact-ttl-{}-{i}:", std::process::id());
        let limiter = Limiter::new(
            Store::bare(
                RedisStore::builder()
                    .url(server.url())
                    .prefix(&prefix)
                    .build()
                    .unwrap(),
            ),
            quota.clone(),
        );
        let key = WindowKey::for_subject("ttl");
        let mut encoded = redis_key(&prefix, &key, &quota.clone().into(), &quota);
        let mut keys = vec![encoded.clone()];
        if quota.algorithm() == tower_window::Algorithm::SlidingLog {
            encoded.extend_from_slice(b":m");
            keys.push(encoded);
        }
        let mut admitted = Vec::new();
        for round in 0..3 {
            // Admissions a little apart, so the state moves on between them.
            for _ in 0..2 {
                let d = limiter.check(&key, 1).await.unwrap();
                assert!(d.allowed(), "{quota}: {d:?}");
                admitted.push(d.timestamp_micros());
            }
            let needed = needed_until(&quota, &admitted);
            let (now, pttls) = time_and_pttls(&mut conn, &keys);
            for (key, pttl) in keys.iter().zip(pttls) {
                let name = String::from_utf8_lossy(key);
                assert!(pttl > 0, "{quota}: {name} has no TTL ({pttl})");
                let expires = now + pttl as u64 * 1_000;
                assert!(
                    expires + ROUNDING_US >= needed,
                    "{quota} round {round}: {name} expires {} µs before its state stops mattering",
                    needed - expires
                );
                assert!(
                    expires <= needed + ROUNDING_US + SLACK_US,
                    "{quota} round {round}: {name} expires {} µs after its state stops mattering",
                    expires - needed
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _: () = redis::cmd("DEL").arg(&keys).query(&mut conn).unwrap();
    }
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
    let store = RedisStore::builder()
        .cluster(cluster.urls())
        .prefix("slots:")
        .build()
        .unwrap();
    store.connect().await.unwrap();
    let store = Arc::new(store);
    let decisions = workload(store).await; // unwraps: no CROSSSLOT or any other error
    assert!(decisions.iter().any(|d| d.allowed()));
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
    // Waits (bounded) until 200 more decisions than `last` were made.
    let wait_for = |last: usize, phase: usize| {
        let decided = decided.clone();
        async move {
            for _ in 0..30_000 {
                if decided.load(Ordering::Relaxed) >= last + 200 {
                    return decided.load(Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            panic!(
                "phase {phase}: only {} decisions after {last}",
                decided.load(Ordering::Relaxed)
            );
        }
    };
    let mut last = 0;
    for phase in 0..5 {
        // Let some decisions through, then flush the scripts under them.
        wait_for(last, phase).await;
        flush();
        last = decided.load(Ordering::Relaxed);
    }
    wait_for(last, 5).await;
    stop.store(true, Ordering::Relaxed);
    let errors = run.await.unwrap();
    assert!(
        errors.is_empty(),
        "failed decisions: {:?}",
        &errors[..errors.len().min(5)]
    );
}

/// Invariant: FUNCTION FLUSH (or, without functions, SCRIPT FLUSH) mid-run
/// causes no failed decision (missing function or NOSCRIPT → load → retry,
/// invisibly). Single server and cluster, every algorithm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_mid_run_fails_nothing() {
    for (functions, flush, refusal) in [
        (true, "FUNCTION", "errorstat_ERR:count="),
        (false, "SCRIPT", "errorstat_NOSCRIPT:count="),
    ] {
        let server = RedisServer::start();
        for quota in all_quotas() {
            // Bare (no time budget): a reload is never cut short.
            let store = RedisStore::builder()
                .url(server.url())
                .functions(functions)
                .build()
                .unwrap();
            flush_mid_run(Limiter::new(Store::bare(store), quota), || {
                let _: () = redis::cmd(flush)
                    .arg("FLUSH")
                    .query(&mut server.connection())
                    .unwrap();
            })
            .await;
        }
        // The flushes really made the server refuse calls, which the store
        // absorbed.
        let errors: String = redis::cmd("INFO")
            .arg("errorstats")
            .query(&mut server.connection())
            .unwrap();
        assert!(errors.contains(refusal), "{errors}");
        let cluster = RedisCluster::shared();
        for quota in all_quotas() {
            let store = RedisStore::builder()
                .cluster(cluster.urls())
                .functions(functions)
                .build()
                .unwrap();
            flush_mid_run(Limiter::new(Store::bare(store), quota), || {
                for node in cluster.nodes() {
                    let _: () = redis::cmd(flush)
                        .arg("FLUSH")
                        .query(&mut node.connection())
                        .unwrap();
                }
            })
            .await;
        }
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
    "pttl",
    "hgetall",
    "hdel",
    "hmget",
    "get",
    "set",
];

/// Runs sequential and concurrent decisions of every algorithm on subjects
/// tagged `tag` (each decided twice, below every limit, so none is served by
/// the local tier); returns how many.
async fn decide_many(store: Arc<RedisStore>, tag: &str) -> u64 {
    let mut decisions = 0u64;
    // One bare handle (no budget or retries) for every limiter.
    let store = Store::bare(store);
    for quota in all_quotas() {
        let limiter = Limiter::new(store.clone(), quota);
        for i in 0..50 {
            let d = limiter
                .check(&WindowKey::for_subject(format!("{tag}-{i}")), 1)
                .await
                .unwrap();
            assert!(d.allowed(), "{d:?}");
            decisions += 1;
        }
        let concurrent = futures_util::future::join_all((0..64).map(|i| {
            let limiter = limiter.clone();
            let key = WindowKey::for_subject(format!("{tag}-{i}"));
            async move { limiter.check(&key, 1).await }
        }))
        .await;
        assert!(concurrent
            .iter()
            .all(|d| d.as_ref().is_ok_and(|d| d.allowed())));
        decisions += 64;
    }
    decisions
}

/// Commands that MONITOR does not show (administrative ones) are caught
/// here: every command any client ran since `CONFIG RESETSTAT` is FCALL,
/// a command the script runs, the test's own inspection, or one of at most
/// `slot_map_reads` `CLUSTER SLOTS` (a cluster store reloads its slot map
/// at most once a second while used, not per call).
fn no_hidden_commands(name: &str, stats: &HashMap<String, u64>, slot_map_reads: u64) {
    for (command, calls) in stats {
        let expected = command == "fcall"
            || (command == "cluster|slots" && *calls <= slot_map_reads)
            || SCRIPT_COMMANDS.contains(&command.as_str())
            || ["config|resetstat", "info", "echo", "monitor"].contains(&command.as_str());
        assert!(
            expected,
            "{name}: unexpected command {command} ({calls} calls)"
        );
    }
}

/// A `MONITOR` session on one server: every command any client runs, as
/// `<time> [<db> <client address>|lua] "<command>" "<arg>"…`.
struct Monitor {
    reader: std::io::BufReader<std::net::TcpStream>,
}

impl Monitor {
    fn start(addr: &str) -> Self {
        use std::io::{BufRead, Write};
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        // A bound on every read: a missing line fails instead of hanging.
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        stream.write_all(b"MONITOR\r\n").unwrap();
        let mut reader = std::io::BufReader::new(stream);
        let mut ok = String::new();
        reader.read_line(&mut ok).unwrap();
        assert_eq!(ok, "+OK\r\n");
        Self { reader }
    }

    /// Sends `ECHO <marker>` from `admin` and returns every top-level
    /// command (not run by a script) that other clients ran before it, as
    /// (client address, lower-case command name).
    fn top_level_until_marker(mut self, admin: &mut redis::Connection) -> Vec<(String, String)> {
        use std::io::BufRead;
        let marker = format!("end-of-run-{}", std::process::id());
        let _: String = redis::cmd("ECHO").arg(&marker).query(admin).unwrap();
        let mut commands = Vec::new();
        loop {
            let mut line = String::new();
            let read = self.reader.read_line(&mut line).unwrap();
            assert!(read > 0, "MONITOR closed before the marker");
            if line.contains(&marker) {
                return commands;
            }
            let Some(rest) = line.split_once(" [").map(|(_, rest)| rest) else {
                panic!("unexpected MONITOR line {line:?}");
            };
            let (client, command) = rest.split_once("] ").unwrap();
            // `[0 lua]`: run by a script, inside its FCALL.
            let client = client.split_once(' ').unwrap().1;
            if client == "lua" {
                continue;
            }
            let name = command.split('"').nth(1).unwrap().to_ascii_lowercase();
            commands.push((client.to_owned(), name));
        }
    }
}

/// Asserts the clients (the store's connections: nothing else talks to the
/// server while monitored) sent exactly `decisions` top-level commands, all
/// FCALL.
fn one_fcall_each(name: &str, commands: &[(String, String)], decisions: u64) {
    let mut per_client: HashMap<&str, HashMap<&str, u64>> = HashMap::new();
    for (client, command) in commands {
        *per_client
            .entry(client)
            .or_default()
            .entry(command)
            .or_default() += 1;
    }
    let others: Vec<_> = commands.iter().filter(|(_, c)| c != "fcall").collect();
    assert!(
        others.is_empty(),
        "{name}: top-level commands besides FCALL: {:?} (per client: {per_client:?})",
        &others[..others.len().min(5)]
    );
    assert_eq!(
        commands.len() as u64,
        decisions,
        "{name}: FCALLs for {decisions} decisions (per client: {per_client:?})"
    );
}

/// Invariant 6: exactly one top-level command (FCALL) per decision
/// reaches Redis: no PING, no FUNCTION LOAD, no EVAL, no client-side
/// read — for a URL store and a pool store.
///
/// Counted from `MONITOR`, which prints each command a client sends with the
/// client's address and each command a script runs as `[0 lua]`: a store
/// that sent one extra `GET` per decision would show `"get"` lines from its
/// own address (failing the "besides FCALL" assertion) and 2N commands for
/// N decisions, whereas counting `INFO commandstats` (which adds the
/// scripts' own GETs) could not tell. Administrative commands, which MONITOR
/// hides, are checked on `INFO commandstats`. The warm-up (connect, one full
/// run: functions loaded, pool filled) is not counted.
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
        let store = Arc::new(store);
        decide_many(store.clone(), &format!("{name}-warm")).await;
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query(&mut admin)
            .unwrap();
        let monitor = Monitor::start(&server.addr());
        let decisions = decide_many(store, &format!("{name}-run")).await;
        let commands = monitor.top_level_until_marker(&mut admin);
        one_fcall_each(name, &commands, decisions);
        no_hidden_commands(name, &commandstats(&mut admin), 0);
    }
}

/// The same on the cluster, per primary: one FCALL per decision and
/// nothing else (no per-call topology or PING traffic), and every primary
/// decided some.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_command_per_decision_on_the_cluster() {
    let cluster = RedisCluster::start();
    let store = RedisStore::cluster(cluster.urls()).unwrap();
    store.connect().await.unwrap();
    let store = Arc::new(store);
    decide_many(store.clone(), "cluster-warm").await;
    let mut admins: Vec<redis::Connection> = cluster
        .nodes()
        .iter()
        .map(RedisServer::connection)
        .collect();
    for admin in &mut admins {
        let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query(admin).unwrap();
    }
    let monitors: Vec<Monitor> = cluster
        .nodes()
        .iter()
        .map(|node| Monitor::start(&node.addr()))
        .collect();
    let started = Instant::now();
    let decisions = decide_many(store, "cluster-run").await;
    let slot_map_reads = started.elapsed().as_secs() + 1;
    let mut commands = Vec::new();
    for (i, (monitor, admin)) in monitors.into_iter().zip(&mut admins).enumerate() {
        let on_node = monitor.top_level_until_marker(admin);
        assert!(!on_node.is_empty(), "node {i} decided nothing");
        no_hidden_commands(&format!("node {i}"), &commandstats(admin), slot_map_reads);
        commands.extend(on_node);
    }
    one_fcall_each("cluster", &commands, decisions);
}
