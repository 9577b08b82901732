//! A Redis Cluster primary killed under load: one breaker per primary.
//!
//! The breakers of a limiter over a cluster are per failure domain, the
//! primary that serves a key's slot (from the cluster's own slot map), not
//! per hash slot. So when a primary dies, the first few requests for its
//! keys pay the time budget, its one breaker opens, and every later request
//! for any of its thousands of slots goes straight to the fallback, while
//! keys of the live primaries stay on Redis. When it returns, a probe closes
//! the breaker again. (Before, with a breaker per slot, every key of the dead
//! primary that hit a fresh slot paid the whole budget: 668 of 2,000
//! requests over 2,000 users.)

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use tower_window::fallback::FailClosed;
use tower_window::store::redis::redis_key;
use tower_window::{
    BreakerState, DecisionSource, FallbackReason, Limiter, ManualClock, Policy, Quota, RedisStore,
    Store, WindowKey,
};
use tower_window_tests::redis_cluster::RedisCluster;

const T0: u64 = 1_700_000_000_000_000;
/// The budget: `--redis-timeout-ms 50`.
const BUDGET: Duration = Duration::from_millis(50);
const USERS: usize = 2_000;
const COOLDOWN: Duration = Duration::from_secs(5);
/// Requests for the dead primary's keys that may pay the budget before its
/// breaker opens: the default breaker opens after 5 consecutive failures.
const HANDFUL: usize = 8;

fn cluster_cmd(cluster: &RedisCluster, node: usize, args: &[&str]) -> redis::Value {
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query(&mut cluster.nodes()[node].connection()).unwrap()
}

/// Slot ranges per primary port, from `CLUSTER NODES`.
fn owners(cluster: &RedisCluster) -> Vec<(u16, u16, u16)> {
    let text: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query(&mut cluster.nodes()[0].connection())
        .unwrap();
    let mut ranges = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let port: u16 = fields[1].split(['@', ':']).nth(1).unwrap().parse().unwrap();
        for slots in fields.iter().skip(8) {
            let (start, end) = slots.split_once('-').unwrap_or((slots, slots));
            ranges.push((start.parse().unwrap(), end.parse().unwrap(), port));
        }
    }
    ranges
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_opens_one_breaker_and_recovers() {
    let mut cluster = RedisCluster::start();
    // Live primaries keep serving their slots while one is down.
    for node in 0..3 {
        cluster_cmd(
            &cluster,
            node,
            &["CONFIG", "SET", "cluster-require-full-coverage", "no"],
        );
    }
    let ranges = owners(&cluster);
    let owner = |slot: u16| {
        ranges
            .iter()
            .find(|(start, end, _)| (*start..=*end).contains(&slot))
            .map(|r| r.2)
            .unwrap()
    };
    let quota: Quota = "1000/1m".parse().unwrap();
    let policy = Policy::from(quota.clone());
    let prefix = "primary-loss:";
    let victim = cluster.nodes()[2].port();

    // 2,000 users, each on its own slot more or less: about a third on the victim.
    let users: Vec<WindowKey> = (0..USERS)
        .map(|i| WindowKey::for_subject(format!("user-{i}")))
        .collect();
    let mut port_of = BTreeMap::new();
    for key in &users {
        let slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(redis_key(prefix, key, &policy, &quota))
            .query(&mut cluster.nodes()[0].connection())
            .unwrap();
        port_of.insert(key.clone(), owner(slot));
    }
    let dead: Vec<&WindowKey> = users.iter().filter(|k| port_of[*k] == victim).collect();
    assert!(dead.len() > USERS / 5, "{} keys on the victim", dead.len());

    let store = Arc::new(
        RedisStore::builder()
            .cluster(cluster.urls())
            .prefix(prefix)
            .connect_timeout(Duration::from_millis(500))
            .build()
            .unwrap(),
    );
    // Connecting loads the cluster's slot map: a key's failure domain is
    // its primary, the same for every slot that primary serves.
    store.connect().await.unwrap();
    let mut domain_ports: BTreeMap<u16, BTreeSet<u16>> = BTreeMap::new();
    for key in &users {
        let domain = tower_window::limit::Backend::failure_domain(&*store, key, &policy)
            .expect("a known primary");
        domain_ports.entry(domain).or_default().insert(port_of[key]);
    }
    assert_eq!(domain_ports.len(), 3, "one failure domain per primary");
    assert!(domain_ports.values().all(|ports| ports.len() == 1));

    let clock = ManualClock::new(T0);
    // The store's clock (its breakers', the fallback's) is the manual one;
    // Redis decides on its own TIME.
    let store = Store::builder(tower_window::store::Backend::from(store).clock(clock.clone()))
        .timeout(BUDGET)
        .build();
    let limiter = Limiter::builder(store, quota)
        .fallback(FailClosed::new())
        .build();
    for key in users.iter().take(30) {
        let d = limiter.check(key, 1).await.unwrap();
        assert_eq!(d.source(), DecisionSource::Store);
    }

    // kill -9 the victim (its pid from INFO server).
    let info = cluster_cmd(&cluster, 2, &["INFO", "server"]);
    let info: String = redis::FromRedisValue::from_redis_value(info).unwrap();
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

    // Every user once, in order: the victim's keys are spread over all of them.
    let (mut paid, mut shed, mut live_on_redis) = (0, 0, 0);
    for key in &users {
        let d = limiter.check(key, 1).await.unwrap();
        if port_of[key] == victim {
            assert!(!d.allowed(), "fail-closed: {d:?}");
            match d.source() {
                DecisionSource::Fallback(FallbackReason::CircuitOpen) => shed += 1,
                DecisionSource::Fallback(_) => paid += 1,
                other => panic!("a dead primary's key decided by {other}"),
            }
        } else {
            assert_eq!(d.source(), DecisionSource::Store, "a live primary's key");
            assert!(d.allowed());
            live_on_redis += 1;
        }
    }
    eprintln!("dead primary: {paid} paid the budget, {shed} shed by its open breaker");
    assert!(
        paid <= HANDFUL,
        "{paid} requests for the dead primary paid the budget before its breaker opened"
    );
    assert_eq!(paid + shed, dead.len());
    assert_eq!(live_on_redis, USERS - dead.len());
    assert_eq!(
        limiter.open_breakers(),
        1,
        "one breaker: the dead primary's"
    );
    assert_eq!(limiter.breaker_state_for(dead[0]), Some(BreakerState::Open));

    // The primary returns: after the cooldown a probe reaches it and the
    // breaker closes. Bounded: each round waits for the cluster, then
    // advances the limiter's clock past the cooldown and probes once.
    cluster.nodes_mut()[2].restart();
    cluster.wait_until_ok();
    let mut recovered = false;
    for _ in 0..50 {
        clock.advance(COOLDOWN + Duration::from_secs(1));
        let d = limiter.check(dead[0], 1).await.unwrap();
        if d.source() == DecisionSource::Store {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        recovered,
        "the returned primary's keys never reached Redis again"
    );
    assert_eq!(
        limiter.breaker_state_for(dead[0]),
        Some(BreakerState::Closed)
    );
    assert_eq!(limiter.open_breakers(), 0);
    for key in dead.iter().take(20) {
        assert_eq!(
            limiter.check(key, 1).await.unwrap().source(),
            DecisionSource::Store
        );
    }
}
