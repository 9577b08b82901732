//! Failover in a Redis Cluster with one replica per primary
//! ([`RedisCluster::start_with_replicas`]).
//!
//! - A planned `CLUSTER FAILOVER`: the replica, whose script cache was
//!   flushed, becomes the primary; decisions for its keys reach Redis again
//!   within a bounded number of attempts, the `NOSCRIPT` it answers first is
//!   invisible (no decision errors, none falls back with `Error`), and every
//!   admission the store reported is in the store exactly once.
//! - A primary killed with `kill -9`: its replica is promoted after
//!   `cluster-node-timeout`; in the gap its keys are decided by the
//!   fallback (or by Redis), never by an error; afterwards by Redis again;
//!   no admission is doubled, and none acknowledged by the new primary is
//!   lost (writes the dead primary acknowledged but had not replicated yet
//!   may be: replication is asynchronous).
//! - Leased hot keys through a planned failover, their leases expiring
//!   every round so that each refill carries refunds: no key admits more
//!   than its limit, and the new primary takes refills (and their refunds)
//!   again.
//! - Tenant lifecycle writes while the primary holding the registry is
//!   killed: each write ends within the store's budget with `Ok` or a typed
//!   store error; once the replica is promoted, writes succeed again, and
//!   every node (one started afterwards included) agrees on every write the
//!   new primary acknowledged.
//! - `READONLY` (a write sent to a replica) and `MOVED` (a key sent to a
//!   node that does not serve its slot) map to `StoreErrorKind::Unavailable`
//!   and are marked not applied, so the limiter may retry them.
//!
//! Loops are bounded by counts; healthy paths are not timed.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tower_window::fallback::FailClosed;
use tower_window::limit::Backend as _;
use tower_window::store::redis::redis_key;
use tower_window::store::Guard;
use tower_window::tenant::{TenantError, TenantRegistry, TenantSpec, TenantsConfig};
use tower_window::{
    CheckRequest, Cost, DecisionSource, FallbackReason, LeaseConfig, LimitError, Limiter,
    ManualClock, Policy, Quota, RedisStore, Store, StoreErrorKind, WindowKey,
};
use tower_window_tests::redis_cluster::{key_slot, RedisCluster};
use tower_window_tests::redis_server::RedisServer;

const T0: u64 = 1_700_000_000_000_000;
/// The time budget per decision: far above a healthy loopback call.
const BUDGET: Duration = Duration::from_millis(500);
/// The default breaker cooldown; the limiter's clock is advanced past it
/// so that a probe may close an open breaker.
const COOLDOWN: Duration = Duration::from_secs(5);
/// Keys on the primary that fails over.
const KEYS: usize = 40;
/// Rounds (every key once) to wait for recovery after a promotion.
const RECOVERY_ROUNDS: usize = 100;
/// A big quota over a long window: no key is ever denied by Redis, and no
/// admission expires during a test.
const QUOTA: &str = "100000/1h";

fn query<T: redis::FromRedisValue>(node: &RedisServer, args: &[&str]) -> T {
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query(&mut node.connection()).unwrap()
}

/// `master` or `slave`, from `ROLE`.
fn role(node: &RedisServer) -> String {
    let reply: Vec<redis::Value> = query(node, &["ROLE"]);
    redis::FromRedisValue::from_redis_value(reply[0].clone()).unwrap()
}

/// (primary, replica) node indices, from each replica's `INFO replication`.
fn pairs(cluster: &RedisCluster) -> Vec<(usize, usize)> {
    let nodes = cluster.nodes();
    let mut pairs = Vec::new();
    for (replica, node) in nodes.iter().enumerate() {
        let info: String = query(node, &["INFO", "replication"]);
        if !info.contains("role:slave") {
            continue;
        }
        let port: u16 = info
            .lines()
            .find_map(|l| l.strip_prefix("master_port:"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let primary = nodes.iter().position(|n| n.port() == port).unwrap();
        pairs.push((primary, replica));
    }
    pairs.sort_unstable();
    assert_eq!(pairs.len(), 3, "one replica per primary: {pairs:?}");
    pairs
}

/// `KEYS` keys whose slots `primary` serves.
fn keys_on(
    cluster: &RedisCluster,
    primary: usize,
    prefix: &str,
    policy: &Policy,
    quota: &Quota,
) -> Vec<WindowKey> {
    let node = &cluster.nodes()[primary];
    let mut keys = Vec::new();
    for i in 0..100_000 {
        let key = WindowKey::for_subject(format!("user-{i}"));
        let slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(redis_key(prefix, &key, policy, quota))
            .query(&mut node.connection())
            .unwrap();
        if owns(node, slot) {
            keys.push(key);
            if keys.len() == KEYS {
                return keys;
            }
        }
    }
    panic!("not {KEYS} keys on node {primary}");
}

/// Whether `node` is the primary serving `slot` (from its `CLUSTER SLOTS`).
fn owns(node: &RedisServer, slot: u16) -> bool {
    let slots: Vec<(u16, u16, (String, u16))> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query(&mut node.connection())
        .map(|v: Vec<Vec<redis::Value>>| {
            v.into_iter()
                .map(|r| {
                    let start: u16 = redis::FromRedisValue::from_redis_value(r[0].clone()).unwrap();
                    let end: u16 = redis::FromRedisValue::from_redis_value(r[1].clone()).unwrap();
                    let master: Vec<redis::Value> =
                        redis::FromRedisValue::from_redis_value(r[2].clone()).unwrap();
                    let host: String =
                        redis::FromRedisValue::from_redis_value(master[0].clone()).unwrap();
                    let port: u16 =
                        redis::FromRedisValue::from_redis_value(master[1].clone()).unwrap();
                    (start, end, (host, port))
                })
                .collect()
        })
        .unwrap();
    slots
        .iter()
        .any(|(start, end, (_, port))| (*start..=*end).contains(&slot) && *port == node.port())
}

/// What the limiter decided, per key and per source.
#[derive(Default)]
struct Tally {
    /// Admissions decided by Redis, per key.
    admitted: BTreeMap<WindowKey, u64>,
    /// Fallback decisions after the time budget ran out, per key: the
    /// call may still have run in Redis.
    timed_out: BTreeMap<WindowKey, u64>,
    store: u64,
    fallback: BTreeMap<String, u64>,
}

impl std::fmt::Debug for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tally")
            .field("keys", &self.admitted.len())
            .field("admitted", &self.admitted.values().sum::<u64>())
            .field("store", &self.store)
            .field("fallback", &self.fallback)
            .finish()
    }
}

impl Tally {
    /// One decision for `key` through `limiter`: never an error, never the
    /// local cache; a fail-closed fallback admits nothing. True if Redis
    /// decided.
    async fn decide(&mut self, limiter: &Limiter, key: &WindowKey) -> bool {
        let d = limiter
            .check(key, 1)
            .await
            .unwrap_or_else(|e| panic!("a decision errored: {e:?}"));
        match d.source() {
            DecisionSource::Store => {
                assert!(d.allowed(), "the quota is never exhausted: {d:?}");
                *self.admitted.entry(key.clone()).or_default() += 1;
                self.store += 1;
                true
            }
            DecisionSource::Fallback(reason) => {
                assert!(!d.allowed(), "fail-closed admits nothing: {d:?}");
                *self.fallback.entry(format!("{reason:?}")).or_default() += 1;
                if reason == FallbackReason::Timeout {
                    *self.timed_out.entry(key.clone()).or_default() += 1;
                }
                false
            }
            other => panic!("decided by {other}: {d:?}"),
        }
    }

    /// Every key once; true if Redis decided all of them.
    async fn round(&mut self, limiter: &Limiter, keys: &[WindowKey]) -> bool {
        let mut all = true;
        for key in keys {
            all &= self.decide(limiter, key).await;
        }
        all
    }

    fn timed_out(&self, key: &WindowKey) -> u64 {
        self.timed_out.get(key).copied().unwrap_or(0)
    }

    fn fallbacks(&self, reason: FallbackReason) -> u64 {
        self.fallback
            .get(&format!("{reason:?}"))
            .copied()
            .unwrap_or(0)
    }
}

/// Rounds over `keys`, advancing the limiter's clock past the breaker
/// cooldown each time, until one round is decided entirely by Redis.
async fn recover(tally: &mut Tally, limiter: &Limiter, clock: &ManualClock, keys: &[WindowKey]) {
    for round in 0..RECOVERY_ROUNDS {
        clock.advance(COOLDOWN + Duration::from_secs(1));
        if tally.round(limiter, keys).await {
            eprintln!("recovered after {round} rounds");
            // And stays there.
            assert!(tally.round(limiter, keys).await, "{tally:?}");
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("not back on Redis after {RECOVERY_ROUNDS} rounds: {tally:?}");
}

/// What Redis holds for each key: one more admission through the store
/// itself (no limiter, no fallback) reports `remaining`, so the key had
/// been charged `limit - 1 - remaining`.
async fn charged(
    store: &RedisStore,
    policy: &Policy,
    keys: &[WindowKey],
) -> BTreeMap<WindowKey, u64> {
    let limit = u64::from(policy.quotas()[0].limit());
    let mut charged = BTreeMap::new();
    for key in keys {
        let mut last = None;
        for _ in 0..50 {
            match store
                .check(
                    &mut Guard::bare(),
                    CheckRequest::new(key, policy, Cost::ONE),
                )
                .await
            {
                Ok(d) => {
                    assert!(d.allowed());
                    last = Some(limit - 1 - u64::from(d.remaining()));
                    break;
                }
                Err(e) => {
                    eprintln!("direct check: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        charged.insert(key.clone(), last.expect("a direct check succeeds"));
    }
    charged
}

fn setup(cluster: &RedisCluster) -> (Quota, Policy) {
    for node in cluster.nodes() {
        let _: () = query(
            node,
            &["CONFIG", "SET", "cluster-require-full-coverage", "no"],
        );
    }
    let quota: Quota = QUOTA.parse().unwrap();
    let policy = Policy::from(quota.clone());
    (quota, policy)
}

async fn resilient(
    cluster: &RedisCluster,
    prefix: &str,
    quota: Quota,
) -> (Arc<RedisStore>, Limiter, ManualClock) {
    // By EVALSHA: these tests follow a script cache through a failover
    // (a replica, its cache flushed, answers NOSCRIPT once promoted).
    // Functions through a failover: redis_functions.rs.
    let store = Arc::new(
        RedisStore::builder()
            .cluster(cluster.urls())
            .prefix(prefix)
            .connect_timeout(BUDGET)
            .functions(false)
            .build()
            .unwrap(),
    );
    store.connect().await.unwrap();
    let clock = ManualClock::new(T0);
    // The store's clock (its breakers', the fallback's) is the manual one;
    // Redis decides on its own TIME.
    let handle =
        Store::builder(tower_window::store::Backend::from(Arc::clone(&store)).clock(clock.clone()))
            .timeout(BUDGET)
            .build();
    let limiter = Limiter::builder(handle, quota)
        .fallback(FailClosed::new())
        .build();
    (store, limiter, clock)
}

fn script_cached(node: &RedisServer) -> bool {
    let exists: Vec<i64> = query(node, &["SCRIPT", "EXISTS", RedisStore::script_sha()]);
    exists == [1]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planned_failover_is_invisible_and_exact() {
    let cluster = RedisCluster::start_with_replicas();
    let (quota, policy) = setup(&cluster);
    let prefix = "failover-planned:";
    let (primary, replica) = pairs(&cluster)[0];
    let keys = keys_on(&cluster, primary, prefix, &policy, &quota);
    let (store, limiter, clock) = resilient(&cluster, prefix, quota).await;

    let mut tally = Tally::default();
    for _ in 0..3 {
        assert!(tally.round(&limiter, &keys).await, "healthy: {tally:?}");
    }
    assert!(script_cached(&cluster.nodes()[primary]));
    // The replica must load the script itself once it is the primary.
    let _: () = query(&cluster.nodes()[replica], &["SCRIPT", "FLUSH"]);
    assert!(!script_cached(&cluster.nodes()[replica]));

    let _: () = query(&cluster.nodes()[replica], &["CLUSTER", "FAILOVER"]);
    let mut promoted = false;
    for _ in 0..300 {
        tally.round(&limiter, &keys).await;
        if role(&cluster.nodes()[replica]) == "master" && role(&cluster.nodes()[primary]) == "slave"
        {
            promoted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(promoted, "the replica never became the primary");
    recover(&mut tally, &limiter, &clock, &keys).await;
    assert!(
        script_cached(&cluster.nodes()[replica]),
        "the new primary ran the script: it answered NOSCRIPT first"
    );
    eprintln!("planned failover: {tally:?}");
    assert_eq!(
        tally.fallbacks(FallbackReason::Error),
        0,
        "NOSCRIPT (or anything) surfaced as an error: {tally:?}"
    );

    // Exact: a fallback decision that timed out may have run in Redis;
    // nothing else may be missing or doubled.
    let ambiguous = tally.fallbacks(FallbackReason::Timeout);
    let held = charged(&store, &policy, &keys).await;
    let (admitted, charged): (u64, u64) = keys.iter().fold((0, 0), |(a, c), k| {
        (a + tally.admitted.get(k).copied().unwrap_or(0), c + held[k])
    });
    eprintln!("admitted by the store {admitted}, held by Redis {charged}, ambiguous {ambiguous}");
    for key in &keys {
        let a = tally.admitted.get(key).copied().unwrap_or(0);
        assert!(
            a <= held[key] && held[key] <= a + tally.timed_out(key),
            "{key:?}: admitted {a}, held {}",
            held[key]
        );
    }
    assert!(admitted <= charged && charged <= admitted + ambiguous);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_is_replaced_by_its_replica() {
    let cluster = RedisCluster::start_with_replicas();
    let (quota, policy) = setup(&cluster);
    let prefix = "failover-killed:";
    let (primary, replica) = pairs(&cluster)[1];
    let keys = keys_on(&cluster, primary, prefix, &policy, &quota);
    let (store, limiter, clock) = resilient(&cluster, prefix, quota).await;

    let mut tally = Tally::default();
    for _ in 0..3 {
        assert!(tally.round(&limiter, &keys).await, "healthy: {tally:?}");
    }
    let _: () = query(&cluster.nodes()[replica], &["SCRIPT", "FLUSH"]);

    let info: String = query(&cluster.nodes()[primary], &["INFO", "server"]);
    let pid = info
        .lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .unwrap()
        .trim()
        .to_owned();
    assert!(Command::new("kill")
        .args(["-9", &pid])
        .status()
        .unwrap()
        .success());
    // Admissions before this point were acknowledged by the dead primary.
    let before: BTreeMap<WindowKey, u64> = tally.admitted.clone();

    // The gap: fallback (or Redis), never an error; bounded wait for the
    // promotion (cluster-node-timeout is 2 s).
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut promoted = false;
    while Instant::now() < deadline {
        tally.round(&limiter, &keys).await;
        if role(&cluster.nodes()[replica]) == "master" {
            promoted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(promoted, "the replica was not promoted within 30 s");
    recover(&mut tally, &limiter, &clock, &keys).await;
    assert!(script_cached(&cluster.nodes()[replica]));
    eprintln!("killed primary: {tally:?}");
    assert_eq!(tally.fallbacks(FallbackReason::Error), 0, "{tally:?}");

    // Never doubled: Redis holds at most what the store admitted plus the
    // decisions that timed out (they may have run). Not exact from below:
    // writes the dead primary acknowledged but had not yet replicated are
    // lost with it (replication is asynchronous), which can only give quota
    // back. What the new primary acknowledged is never lost. (In practice,
    // with a loopback replica, nothing is lost: the count is printed, not
    // asserted, since a test cannot make the replication race go one way.)
    let ambiguous = tally.fallbacks(FallbackReason::Timeout);
    let held = charged(&store, &policy, &keys).await;
    let mut lost = 0;
    for key in &keys {
        let a = tally.admitted.get(key).copied().unwrap_or(0);
        let after_kill = a - before.get(key).copied().unwrap_or(0);
        assert!(
            held[key] <= a + tally.timed_out(key),
            "{key:?} doubled: admitted {a}, held {}",
            held[key]
        );
        assert!(
            held[key] >= after_kill,
            "{key:?}: admitted {after_kill} since the promotion, held {}",
            held[key]
        );
        lost += a.saturating_sub(held[key]);
    }
    let admitted: u64 = tally.admitted.values().sum();
    let charged: u64 = held.values().sum();
    eprintln!(
        "admitted by the store {admitted}, held by Redis {charged}, \
         lost with the dead primary (unreplicated) {lost}, ambiguous {ambiguous}"
    );
    assert!(charged <= admitted + ambiguous);
}

/// Leases on hot keys of the primary that fails over, with a lease TTL of
/// one second and the store's (manual) clock moved two seconds each round:
/// every lease expires between rounds, so each refill refunds what the last
/// lease left, in the reservation's own call. Two nodes check each key until
/// the store denies everything; a planned failover happens on the way. A
/// refund applied twice, or a reservation retried after it ran, would admit
/// past the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refunds_riding_on_reservations_survive_a_planned_failover() {
    const LIMIT: u64 = 120;
    const CHECKS: usize = 4;
    let cluster = RedisCluster::start_with_replicas();
    let quota: Quota = format!("{LIMIT}/1h").parse().unwrap();
    let policy = Policy::from(quota.clone());
    let prefix = "failover-refunds:";
    let (primary, replica) = pairs(&cluster)[2];
    let keys: Vec<WindowKey> = keys_on(&cluster, primary, prefix, &policy, &quota)
        .into_iter()
        .take(4)
        .collect();
    let clock = ManualClock::new(T0);
    let mut nodes = Vec::new();
    for _ in 0..2 {
        let store = RedisStore::builder()
            .cluster(cluster.urls())
            .prefix(prefix)
            .connect_timeout(BUDGET)
            .clock(clock.clone())
            .build()
            .unwrap();
        store.connect().await.unwrap();
        let leases = LeaseConfig::new(8).ttl(Duration::from_secs(1)).hot_after(1);
        let store = Store::builder(store).timeout(BUDGET).build();
        nodes.push(
            Limiter::builder(store, quota.clone())
                .leases(leases)
                .build(),
        );
    }
    let stats = |nodes: &[Limiter]| {
        nodes.iter().fold((0, 0), |(reservations, returned), node| {
            let s = node.lease_stats().unwrap();
            (reservations + s.reservations, returned + s.returned)
        })
    };

    let mut admitted: BTreeMap<WindowKey, u64> = BTreeMap::new();
    let mut errors = 0;
    let mut at_promotion = None;
    for round in 0..400 {
        if round == 3 {
            let _: () = query(&cluster.nodes()[replica], &["CLUSTER", "FAILOVER"]);
        }
        // The two nodes check at once, each key CHECKS times.
        let check_all = |node: &Limiter| {
            let keys = &keys;
            let node = node.clone();
            async move {
                let mut outcomes = Vec::new();
                for key in keys {
                    for _ in 0..CHECKS {
                        outcomes.push((key.clone(), node.check(key, 1).await));
                    }
                }
                outcomes
            }
        };
        let (a, b) = tokio::join!(check_all(&nodes[0]), check_all(&nodes[1]));
        let mut denied_everywhere = true;
        for (key, outcome) in a.into_iter().chain(b) {
            match outcome {
                Ok(d) if d.allowed() => {
                    *admitted.entry(key).or_default() += 1;
                    denied_everywhere = false;
                }
                Ok(_) => {}
                Err(LimitError::Store(_)) => {
                    errors += 1;
                    denied_everywhere = false;
                }
                Err(other) => panic!("{other}"),
            }
        }
        if at_promotion.is_none() && role(&cluster.nodes()[replica]) == "master" {
            at_promotion = Some((round, stats(&nodes)));
        }
        if denied_everywhere && at_promotion.is_some() {
            break;
        }
        clock.advance(Duration::from_secs(2));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (round, before) = at_promotion.expect("the replica was promoted");
    let after = stats(&nodes);
    eprintln!(
        "promoted in round {round}; admitted per key {:?}; {errors} store errors; \
         reservations {} before the promotion, {} after; units refunded {}",
        admitted.values().collect::<Vec<_>>(),
        before.0,
        after.0 - before.0,
        after.1
    );
    assert!(after.0 > before.0, "the new primary took no reservation");
    assert!(after.1 > 0, "no refund rode on a reservation");
    for key in &keys {
        let a = admitted.get(key).copied().unwrap_or(0);
        assert!(a <= LIMIT, "{key:?}: {a} admitted, limit {LIMIT}");
    }
}

/// A tenant registry on the cluster, its writes bounded by [`BUDGET`].
async fn tenant_node(cluster: &RedisCluster, prefix: &str) -> TenantRegistry {
    let store = RedisStore::builder()
        .cluster(cluster.urls())
        .prefix(prefix)
        .connect_timeout(BUDGET)
        .build()
        .unwrap();
    let store = Store::builder(store).timeout(BUDGET).build();
    let config = TenantsConfig::new().with_tenant("acme", burst(2)).unwrap();
    let registry = TenantRegistry::on_store(config, &store);
    tokio::time::timeout(Duration::from_secs(20), registry.loaded())
        .await
        .expect("the registry loads its state");
    registry
}

fn burst(limit: u32) -> TenantSpec {
    TenantSpec::builder()
        .quota("burst", &format!("{limit}/1m"))
        .unwrap()
        .build()
        .unwrap()
}

/// Whether `primary`'s replica has every write it made (`INFO replication`:
/// the replica's acknowledged offset is the primary's own).
fn replicated(primary: &RedisServer) -> bool {
    let info: String = query(primary, &["INFO", "replication"]);
    let field = |line: &str, name: &str| {
        line.split(',')
            .find_map(|part| part.strip_prefix(name))
            .map(str::to_owned)
    };
    let own = info
        .lines()
        .find_map(|l| l.strip_prefix("master_repl_offset:"))
        .map(|offset| offset.trim().to_owned());
    let replica = info
        .lines()
        .find(|l| l.starts_with("slave0:"))
        .and_then(|l| field(l, "offset="));
    own.is_some() && own == replica
}

/// Polls `done` every 10 ms, at most 3000 times.
async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..3000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("never: {what}");
}

/// The registry's keys share the `{tw-tenants}` hash tag: kill the primary
/// serving it while one node keeps writing. Writes end within the budget,
/// `Ok` or a store error (never a hang, a panic or another error); after the
/// promotion they succeed again; and the node that wrote, a node that only
/// followed, and a node started afterwards all hold the same tenants and
/// generations: every write the new primary acknowledged, none doubled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_writes_survive_a_killed_primary() {
    let mut cluster = RedisCluster::start_with_replicas();
    let prefix = "failover-tenants:";
    let slot = key_slot(b"{tw-tenants}");
    let (primary, replica) = cluster
        .pairs()
        .into_iter()
        .find(|(primary, _)| cluster.owner(*primary, slot) == *primary)
        .expect("a primary serves the registry's slot");
    let writer = tenant_node(&cluster, prefix).await;
    let follower = tenant_node(&cluster, prefix).await;
    assert!(writer.reset("acme").await.unwrap());
    // Replicated before the kill, so it cannot be lost with the primary
    // (`WAIT` would count only its own connection's writes).
    assert!(
        (0..500).any(|_| {
            std::thread::sleep(Duration::from_millis(10));
            replicated(&cluster.nodes()[primary])
        }),
        "the replica never caught up"
    );
    // SIGKILL, as `kill -9`.
    cluster.nodes_mut()[primary].stop();

    // Write until the new primary has acknowledged a few rounds: each round
    // a reset of acme and the init of a new tenant.
    let mut resets = (1u64, 1u64); // (acknowledged, attempted), the first included
    let mut created = Vec::new();
    let mut failed = 0;
    let mut after_promotion = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    for round in 0.. {
        assert!(
            Instant::now() < deadline,
            "writes did not recover within 60 s"
        );
        let bounded = BUDGET * 4;
        let reset = tokio::time::timeout(bounded, writer.reset("acme"))
            .await
            .expect("a reset ends within the store's budget");
        let name = format!("t{round}");
        let init = tokio::time::timeout(bounded, writer.init(&name, burst(3)))
            .await
            .expect("an init ends within the store's budget");
        resets.1 += 1;
        for error in [reset.as_ref().err(), init.as_ref().err()]
            .into_iter()
            .flatten()
        {
            assert!(matches!(error, TenantError::Store(_)), "{error}");
            failed += 1;
        }
        if let Ok(true) = reset {
            resets.0 += 1;
        }
        if init.is_ok() {
            created.push(name);
        }
        if role(&cluster.nodes()[replica]) == "master" && reset.is_ok() && init.is_ok() {
            after_promotion += 1;
            if after_promotion == 3 {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "tenant writes: {} resets acknowledged of {} attempted, {} inits acknowledged, {failed} failed",
        resets.0,
        resets.1,
        created.len()
    );
    assert!(
        failed > 0,
        "the kill went unnoticed: the test did not test a failover"
    );

    let late = tenant_node(&cluster, prefix).await;
    for (who, node) in [
        ("writer", &writer),
        ("follower", &follower),
        ("late", &late),
    ] {
        eventually(&format!("{who} holds every acknowledged init"), || {
            created.iter().all(|name| node.tenant(name).is_some())
        })
        .await;
    }
    let generation = |node: &TenantRegistry| node.effective("acme").map(|t| t.generation);
    eventually("the three nodes agree on acme's generation", || {
        let g = generation(&late);
        g == generation(&writer) && g == generation(&follower)
    })
    .await;
    let held = generation(&late).unwrap();
    eprintln!("acme's generation: {held}");
    // A reset that timed out may have run; none runs twice.
    assert!(
        (resets.0..=resets.1).contains(&held),
        "acme reset {held} times, acknowledged {}, attempted {}",
        resets.0,
        resets.1
    );
}

/// A write on a replica answers READONLY; a key on a node that does not
/// serve its slot answers MOVED: both Unavailable, both not applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readonly_and_moved_are_unavailable_and_not_applied() {
    let primary = RedisServer::start();
    let replica = RedisServer::start();
    let _: () = query(
        &replica,
        &["REPLICAOF", "127.0.0.1", &primary.port().to_string()],
    );
    let mut linked = false;
    for _ in 0..200 {
        let info: String = query(&replica, &["INFO", "replication"]);
        if info.contains("master_link_status:up") {
            linked = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(linked, "the replica never linked");

    let quota: Quota = "10/1m".parse().unwrap();
    let policy = Policy::from(quota);
    let key = WindowKey::for_subject("replica");
    let store = RedisStore::from_url(&replica.url()).unwrap();
    let error = store
        .check(
            &mut Guard::bare(),
            CheckRequest::new(&key, &policy, Cost::ONE),
        )
        .await
        .unwrap_err();
    eprintln!("replica: {error}");
    // redis-rs renders the code as `ReadOnly`.
    assert!(
        error.to_string().to_lowercase().contains("readonly"),
        "{error}"
    );
    assert_eq!(error.kind(), StoreErrorKind::Unavailable, "{error}");
    assert!(error.is_not_applied(), "{error}");

    // MOVED: a single-node store at a cluster node, for a key of another.
    let cluster = RedisCluster::start();
    let prefix = "moved:";
    let quota: Quota = "10/1m".parse().unwrap();
    let policy = Policy::from(quota.clone());
    let key = (0..1000)
        .map(|i| WindowKey::for_subject(format!("k{i}")))
        .find(|k| {
            !owns(&cluster.nodes()[0], {
                let slot: u16 = redis::cmd("CLUSTER")
                    .arg("KEYSLOT")
                    .arg(redis_key(prefix, k, &policy, &quota))
                    .query(&mut cluster.nodes()[0].connection())
                    .unwrap();
                slot
            })
        })
        .unwrap();
    let store = RedisStore::builder()
        .url(cluster.nodes()[0].url())
        .prefix(prefix)
        .build()
        .unwrap();
    let error = store
        .check(
            &mut Guard::bare(),
            CheckRequest::new(&key, &policy, Cost::ONE),
        )
        .await
        .unwrap_err();
    eprintln!("wrong node: {error}");
    assert!(
        error.to_string().to_lowercase().contains("moved"),
        "{error}"
    );
    assert_eq!(error.kind(), StoreErrorKind::Unavailable, "{error}");
    assert!(error.is_not_applied(), "{error}");
}
