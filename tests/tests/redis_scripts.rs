//! The Lua script's own state on a real `redis-server`: the sliding log
//! survives losing its companion key, the sliding counter touches only the
//! buckets that expired, and every key it writes keeps a TTL. Scripts go as
//! Redis Functions where the server has them, else by `EVALSHA`.
#![allow(clippy::unwrap_used)]

use tower_window::limit::Backend as _;
use tower_window::store::Guard;
use tower_window::{CheckRequest, Cost, ManualClock, MemoryStore, Policy, Quota, RedisStore};
use tower_window::{Decision, WindowKey};
use tower_window_tests::redis_server::{RedisServer, WITHOUT_FUNCTIONS};

const START: u64 = 1_700_000_000_000_000;
const S: u64 = 1_000_000;

fn stores(server: &RedisServer, prefix: &str) -> (ManualClock, RedisStore, MemoryStore) {
    let clock = ManualClock::new(START);
    let redis = RedisStore::builder()
        .url(server.url())
        .prefix(prefix)
        .clock(clock.clone())
        .build()
        .unwrap();
    let memory = MemoryStore::builder().clock(clock.clone()).build();
    (clock, redis, memory)
}

async fn both(
    redis: &RedisStore,
    memory: &MemoryStore,
    key: &WindowKey,
    policy: &Policy,
    cost: u32,
) -> (Decision, Decision) {
    let request = CheckRequest::new(key, policy, Cost::new(cost).unwrap());
    let from_redis = redis.check(&mut Guard::bare(), request).await.unwrap();
    let from_memory = memory.check(&mut Guard::bare(), request).await.unwrap();
    (from_redis, from_memory)
}

fn key_of(prefix: &str, key: &WindowKey, policy: &Policy) -> Vec<u8> {
    tower_window::store::redis_key(prefix, key, policy, policy.first())
}

/// Losing the sliding log's companion (running sum) mid-run changes no
/// decision: the log is recounted, members stay unique (they are named by
/// their timestamp, not by a sequence kept in the companion), and the
/// recreated companion has a TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sliding_log_survives_losing_its_companion() {
    let server = RedisServer::start();
    let (clock, redis, memory) = stores(&server, "companion:");
    let policy = Policy::from("20/10s".parse::<Quota>().unwrap());
    let key = WindowKey::new("t", "log");
    let log = key_of("companion:", &key, &policy);
    let mut meta = log.clone();
    meta.extend_from_slice(b":m");
    let mut conn = server.connection();
    let mut admitted = 0;
    for step in 0..400u64 {
        // Several checks per microsecond now and then (merged entries).
        if step % 3 != 0 {
            clock.set(START + step * 97_000);
        }
        if step % 7 == 3 {
            let _: () = redis::cmd("DEL").arg(&meta).query(&mut conn).unwrap();
        }
        let cost = 1 + (step % 3) as u32;
        let (got, want) = both(&redis, &memory, &key, &policy, cost).await;
        assert_eq!(got, want, "step {step}, cost {cost}");
        admitted += u32::from(got.allowed());
        let ttl: i64 = redis::cmd("PTTL").arg(&meta).query(&mut conn).unwrap();
        assert!(ttl > 0 || ttl == -2, "step {step}: companion TTL {ttl}");
        let ttl: i64 = redis::cmd("PTTL").arg(&log).query(&mut conn).unwrap();
        assert!(ttl > 0 || ttl == -2, "step {step}: log TTL {ttl}");
    }
    assert!(admitted > 30, "only {admitted} admitted");
}

fn commandstats(conn: &mut redis::Connection) -> String {
    redis::cmd("INFO").arg("commandstats").query(conn).unwrap()
}

/// The sliding counter's hash holds the live buckets and three fields, no
/// more; a call deletes only what expired since the last one and never
/// reads the whole hash; decisions match the memory store throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sliding_counter_touches_only_expired_buckets() {
    let server = RedisServer::start();
    let (clock, redis, memory) = stores(&server, "counter:");
    let policy = Policy::from("120/1m sliding-counter(1s)".parse::<Quota>().unwrap());
    let key = WindowKey::new("t", "counter");
    let hash = key_of("counter:", &key, &policy);
    let mut conn = server.connection();
    redis.connect().await.unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut conn)
        .unwrap();
    let mut admitted = 0;
    for step in 0..600u64 {
        // 2 to 3 checks per second over 4 minutes: buckets expire all along.
        clock.set(START + step * 400_000);
        let (got, want) = both(&redis, &memory, &key, &policy, 1 + (step % 2) as u32).await;
        assert_eq!(got, want, "step {step}");
        admitted += u32::from(got.allowed());
        let len: usize = redis::cmd("HLEN").arg(&hash).query(&mut conn).unwrap();
        assert!(len <= 61 + 3, "step {step}: {len} fields");
        let ttl: i64 = redis::cmd("PTTL").arg(&hash).query(&mut conn).unwrap();
        assert!(ttl > 0, "step {step}: TTL {ttl}");
    }
    assert!(admitted > 100, "only {admitted} admitted");
    let stats = commandstats(&mut conn);
    assert!(!stats.contains("cmdstat_hgetall"), "{stats}");
    // Idle for longer than the window: the whole key goes at once.
    clock.set(START + 600 * 400_000 + 120 * S);
    let (got, want) = both(&redis, &memory, &key, &policy, 1).await;
    assert_eq!(got, want);
    let len: usize = redis::cmd("HLEN").arg(&hash).query(&mut conn).unwrap();
    assert_eq!(len, 4, "one bucket and s, l, h");
}

/// A sliding-counter hash written before the running fields existed (only
/// buckets) is rebuilt once, so it keeps counting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_sliding_counter_hash_keeps_counting() {
    let server = RedisServer::start();
    let (_clock, redis, _memory) = stores(&server, "legacy:");
    let policy = Policy::from("5/1m sliding-counter(10s)".parse::<Quota>().unwrap());
    let key = WindowKey::new("t", "legacy");
    let hash = key_of("legacy:", &key, &policy);
    let bucket = START / (10 * S);
    let _: () = redis::cmd("HSET")
        .arg(&hash)
        .arg(bucket - 1)
        .arg(2)
        .arg(bucket)
        .arg(1)
        .query(&mut server.connection())
        .unwrap();
    let d = redis
        .check(
            &mut Guard::bare(),
            CheckRequest::new(&key, &policy, Cost::ONE),
        )
        .await
        .unwrap();
    assert!(d.allowed());
    assert_eq!(d.remaining(), 1);
}

/// How many calls of `command` (`fcall`, `evalsha`, `function|load`)
/// `INFO commandstats` counts, 0 when none.
fn calls_of(stats: &str, command: &str) -> u64 {
    let prefix = format!("cmdstat_{command}:calls=");
    stats
        .lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |calls| calls.parse().unwrap())
}

/// Four checks of a 3/1s quota: three admitted, the fourth denied.
async fn four_checks(store: &RedisStore) -> Vec<bool> {
    let policy = Policy::from("3/1s fixed-window".parse::<Quota>().unwrap());
    let key = WindowKey::new("t", "u");
    let mut admitted = Vec::new();
    for _ in 0..4 {
        let request = CheckRequest::new(&key, &policy, Cost::new(1).unwrap());
        let decision = store.check(&mut Guard::bare(), request).await.unwrap();
        admitted.push(decision.allowed());
    }
    admitted
}

/// The policy script is one function library (`tw_<its EVALSHA SHA1>`),
/// loaded once on a node without it and then called by `FCALL` alone. With
/// `functions(false)`, and on a server without `FCALL` and `FUNCTION` (renamed away, as
/// before Redis 7), the same decisions go by `EVALSHA`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_go_as_functions_where_the_server_has_them() {
    let expected = vec![true, true, true, false];

    let server = RedisServer::start();
    let store = RedisStore::builder().url(server.url()).build().unwrap();
    assert_eq!(four_checks(&store).await, expected);
    // connect() loads the library on a node that has it: no error.
    store.connect().await.unwrap();
    let mut conn = server.connection();
    let stats = commandstats(&mut conn);
    assert_eq!(calls_of(&stats, "evalsha"), 0, "{stats}");
    assert_eq!(calls_of(&stats, "function|load"), 2, "{stats}");
    // The first FCALL found no function; then four ran.
    assert_eq!(calls_of(&stats, "fcall"), 5, "{stats}");
    let libraries: Vec<redis::Value> = redis::cmd("FUNCTION").arg("LIST").query(&mut conn).unwrap();
    assert_eq!(libraries.len(), 1);
    let listed = format!("{libraries:?}");
    assert!(
        listed.contains(&format!("tw_{}", RedisStore::script_sha())),
        "{listed}"
    );

    let server = RedisServer::start();
    let store = RedisStore::builder()
        .url(server.url())
        .functions(false)
        .build()
        .unwrap();
    assert_eq!(four_checks(&store).await, expected);
    let stats = commandstats(&mut server.connection());
    assert_eq!(calls_of(&stats, "fcall"), 0, "{stats}");
    assert_eq!(calls_of(&stats, "function|load"), 0, "{stats}");
    assert_eq!(calls_of(&stats, "evalsha"), 4, "{stats}");

    let server = RedisServer::start_with_args(WITHOUT_FUNCTIONS);
    let store = RedisStore::builder().url(server.url()).build().unwrap();
    assert_eq!(four_checks(&store).await, expected);
    store.connect().await.unwrap();
    let stats = commandstats(&mut server.connection());
    assert_eq!(calls_of(&stats, "function|load"), 0, "{stats}");
    assert_eq!(calls_of(&stats, "evalsha"), 4, "{stats}");
    assert_eq!(calls_of(&stats, "script|load"), 1, "{stats}");
}
