//! The connection-lease conformance suite on the memory store, a real
//! `redis-server` and a real Redis Cluster (explicit clock), plus the
//! production path (Redis `TIME`, key TTLs) on real Redis.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tower_window::conn::{Acquire, ConnectionLimiter};
use tower_window::{ManualClock, RedisStore, Store, WindowKey};
use tower_window_tests::conformance::StoreFactory;
use tower_window_tests::redis_cluster::RedisCluster;
use tower_window_tests::redis_server::RedisServer;

struct SingleRedis(Arc<RedisServer>);

impl StoreFactory for SingleRedis {
    type Store = RedisStore;

    fn make(&self, clock: ManualClock) -> impl Future<Output = RedisStore> + Send {
        let store = RedisStore::builder()
            .url(self.0.url())
            .prefix("conn-conf:")
            .clock(clock)
            .build()
            .expect("valid url");
        std::future::ready(store)
    }
}

struct ClusterRedis(Arc<RedisCluster>);

impl StoreFactory for ClusterRedis {
    type Store = RedisStore;

    fn make(&self, clock: ManualClock) -> impl Future<Output = RedisStore> + Send {
        let store = RedisStore::builder()
            .cluster(self.0.urls())
            .prefix("conn-conf:")
            .clock(clock)
            .build()
            .expect("valid urls");
        std::future::ready(store)
    }
}

mod memory {
    tower_window_tests::conn_conformance_tests!(
        tower_window_tests::conformance::MemoryStoreFactory
    );
}

mod single {
    tower_window_tests::conn_conformance_tests!(super::SingleRedis(
        tower_window_tests::redis_server::RedisServer::shared()
    ));
}

mod cluster {
    tower_window_tests::conn_conformance_tests!(super::ClusterRedis(
        tower_window_tests::redis_cluster::RedisCluster::shared()
    ));
}

/// On Redis's own clock: every lease key carries a TTL just above the
/// lease TTL, leases expire there without any node's help, and a
/// heartbeat then reports them lost.
#[tokio::test]
async fn server_clock_leases_carry_ttls_and_expire() {
    let server = RedisServer::shared();
    let store = Arc::new(
        RedisStore::builder()
            .url(server.url())
            .prefix("conn-live:")
            .build()
            .expect("valid url"),
    );
    let connections = ConnectionLimiter::builder(Store::bare(store))
        .max_per_subject(1)
        .ttl(Duration::from_millis(300))
        .build()
        .expect("valid ttl");
    let key = WindowKey::new(
        "t",
        format!("live-{}", tower_window_tests::redis_server::reserve_port()),
    );
    let Acquire::Granted(lease) = connections.acquire(&key).await.expect("answer") else {
        panic!("first connection refused");
    };
    let mut conn = server.connection();
    let keys: Vec<Vec<u8>> = redis::cmd("KEYS")
        .arg("conn-live:*")
        .query(&mut conn)
        .expect("KEYS");
    assert!(keys.len() >= 2, "the lease set and the fence: {keys:?}");
    for k in &keys {
        let pttl: i64 = redis::cmd("PTTL").arg(k).query(&mut conn).expect("PTTL");
        assert!(pttl > 0 && pttl <= 1_300, "every key has a TTL: {pttl}");
    }
    // No heartbeat: the lease expires on Redis's clock (polled, bounded).
    let mut offline = false;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if !connections.presence(&key).await.expect("answer").online {
            offline = true;
            break;
        }
    }
    assert!(offline, "the lease expired within 5 s");
    let report = connections.heartbeat().await;
    assert_eq!(report.lost, 1);
    assert!(lease.is_lost());
    drop(lease);
}

/// Redis unreachable: each `OnFailure` answers as configured within
/// the limiter's budget; a degraded lease is not renewed, never lost, and
/// its release is a no-op; presence is an error, not a guess.
#[tokio::test]
async fn outage_grants_by_the_fallback() {
    use tower_window::conn::{ConnectionError, OnFailure, SeatSource};
    let url = format!(
        "redis://127.0.0.1:{}",
        tower_window_tests::redis_server::closed_port()
    );
    for fallback in [OnFailure::FailOpen, OnFailure::FailClosed, OnFailure::Error] {
        let store = Arc::new(
            RedisStore::builder()
                .url(&url)
                .connect_timeout(Duration::from_millis(200))
                .build()
                .expect("valid url"),
        );
        let store = Store::builder(store)
            .timeout(Duration::from_millis(300))
            .build();
        let connections = ConnectionLimiter::builder(store)
            .max_per_subject(1)
            .on_store_failure(fallback)
            .build()
            .expect("valid ttl");
        let key = WindowKey::for_subject("u");
        let answer = connections.acquire(&key).await;
        match fallback {
            OnFailure::FailOpen => {
                let Ok(Acquire::Granted(lease)) = answer else {
                    panic!("not admitted: {answer:?}");
                };
                assert!(lease.is_degraded());
                assert!(matches!(lease.source(), SeatSource::Fallback(_)));
                assert_eq!(lease.fence(), 0);
                assert_eq!(connections.live_seats(), 0, "not renewed");
                let report = connections.heartbeat().await;
                assert_eq!((report.calls, report.lost), (0, 0));
                assert!(!lease.is_lost());
                lease.release().await.expect("nothing to release");
            }
            OnFailure::FailClosed => {
                let Ok(Acquire::Denied(denied)) = answer else {
                    panic!("not denied: {answer:?}");
                };
                assert!(denied.fallback.is_some());
            }
            _ => assert!(matches!(answer, Err(ConnectionError::Store(_)))),
        }
        assert!(connections.presence(&key).await.is_err());
    }
}
