//! Settles through the store's faults: a settle the store refused before
//! recording anything (a Redis down, then restarted; a cluster primary
//! killed, its replica promoted) is tried again until it lands, once.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use tower_window::limit::{Reserved, Settlement};
use tower_window::store::redis::redis_key;
use tower_window::store::Store;
use tower_window::{Limiter, Policy, Quota, RedisStore, WindowKey};
use tower_window_tests::redis_cluster::{key_slot, query, RedisCluster};
use tower_window_tests::redis_server::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_refused_during_a_restart_lands_once_the_store_is_back() {
    let mut server = RedisServer::start();
    let redis = RedisStore::builder().url(server.url()).build().unwrap();
    // The gateway's budget and the default breaker and retries.
    let store = Store::builder(redis)
        .timeout(Duration::from_millis(50))
        .build();
    let limiter = Limiter::new(store, "1000/1h".parse::<Quota>().unwrap());
    let (key, policy) = (WindowKey::for_subject("stream"), limiter.policy().clone());
    let decision = limiter.reserve(&key, &policy, 100).await.unwrap();
    assert!(decision.allowed());
    let owed = Settlement::new(&limiter, &key, &policy, Reserved::of(&decision, 100));
    // Redis goes down. The first call on the connection it broke cannot
    // tell whether Redis ran it (a settle there is lost, and counted); a
    // stream that ends while Redis is down is refused, kept, and tried
    // again.
    server.stop();
    assert!(limiter.peek_policy(&key, &policy, 1).await.is_err());
    owed.settle(250);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(limiter.stats().settled, 0, "{:?}", limiter.stats());
    server.restart();
    tokio::time::timeout(Duration::from_secs(15), limiter.settled())
        .await
        .expect("the settle landed or gave up within its retry window");
    let stats = limiter.stats();
    assert_eq!((stats.settled, stats.settle_errors), (1, 0), "{stats:?}");
    // The server kept nothing (no persistence): the 100 reserved went with
    // it, and the 150 past the reservation landed once.
    let state = limiter.peek_policy(&key, &policy, 1).await.unwrap();
    assert_eq!(state.remaining(), 850);
}

const PREFIX: &str = "settle:";

/// A key whose window lives on the primary `node` of `cluster`.
fn key_on(cluster: &RedisCluster, node: usize, policy: &Policy) -> WindowKey {
    (0..100_000)
        .map(|i| WindowKey::for_subject(format!("stream-{i}")))
        .find(|key| {
            let slot = key_slot(&redis_key(PREFIX, key, policy, policy.first()));
            cluster.owner(node, slot) == node
        })
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_refused_during_a_cluster_failover_lands_on_the_promoted_replica() {
    let mut cluster = RedisCluster::start_with_replicas();
    let (victim, heir) = cluster.pairs()[0];
    let redis = RedisStore::builder()
        .cluster(cluster.urls())
        .prefix(PREFIX)
        .build()
        .unwrap();
    let store = Store::builder(redis)
        .timeout(Duration::from_millis(50))
        .build();
    let limiter = Limiter::new(store, "1000/1h".parse::<Quota>().unwrap());
    let policy = limiter.policy().clone();
    let key = key_on(&cluster, victim, &policy);
    let decision = limiter.reserve(&key, &policy, 100).await.unwrap();
    assert!(decision.allowed());
    // Replicated before the primary dies: WAIT answers how many replicas
    // acknowledged, 0 while the replica is still syncing after start.
    let acknowledged = (0..20)
        .any(|_| query::<i64>(&cluster.nodes()[victim], &["WAIT", "1", "1000"]).unwrap() >= 1);
    assert!(acknowledged, "the replica acknowledged the reservation");
    let owed = Settlement::new(&limiter, &key, &policy, Reserved::of(&decision, 100));
    cluster.nodes_mut()[victim].stop();
    // As in the restart test: a call on the broken connection first.
    assert!(limiter.peek_policy(&key, &policy, 1).await.is_err());
    owed.settle(250);
    let live: Vec<usize> = (0..6).filter(|&i| i != victim).collect();
    tokio::task::block_in_place(|| {
        cluster.wait_until_whole("the replica takes over", &live, || true);
    });
    tokio::time::timeout(Duration::from_secs(15), limiter.settled())
        .await
        .expect("the settle landed or gave up within its retry window");
    let stats = limiter.stats();
    assert_eq!((stats.settled, stats.settle_errors), (1, 0), "{stats:?}");
    // The reservation survived on the replica; 150 more landed once.
    let slot = key_slot(&redis_key(PREFIX, &key, &policy, policy.first()));
    assert_eq!(cluster.owner(heir, slot), heir, "the replica took the slot");
    let state = limiter.peek_policy(&key, &policy, 1).await.unwrap();
    assert_eq!(state.remaining(), 750);
}
