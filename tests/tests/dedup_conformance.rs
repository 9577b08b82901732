//! The dedup conformance suite on the memory store, a real `redis-server`
//! and a real Redis Cluster (explicit clock), plus the production path
//! (`SET NX PX` on Redis's own clock) and outage fallbacks on real Redis.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tower_window::dedup::{DedupError, DedupSource, DedupWindow, OnFailure};
use tower_window::{ManualClock, RedisStore, Store, WindowKey};
use tower_window_tests::conformance::StoreFactory;
use tower_window_tests::redis_cluster::RedisCluster;
use tower_window_tests::redis_server::{closed_port, RedisServer};

struct SingleRedis(Arc<RedisServer>);

impl StoreFactory for SingleRedis {
    type Store = RedisStore;

    fn make(&self, clock: ManualClock) -> impl Future<Output = RedisStore> + Send {
        let store = RedisStore::builder()
            .url(self.0.url())
            .prefix("dedup-conf:")
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
            .prefix("dedup-conf:")
            .clock(clock)
            .build()
            .expect("valid urls");
        std::future::ready(store)
    }
}

mod memory {
    tower_window_tests::dedup_conformance_tests!(
        tower_window_tests::conformance::MemoryStoreFactory
    );
}

mod single {
    tower_window_tests::dedup_conformance_tests!(super::SingleRedis(
        tower_window_tests::redis_server::RedisServer::shared()
    ));
}

mod cluster {
    tower_window_tests::dedup_conformance_tests!(super::ClusterRedis(
        tower_window_tests::redis_cluster::RedisCluster::shared()
    ));
}

/// The production path: `SET NX PX` on Redis's clock. A repeat is refused,
/// the key carries the window as its TTL, and the id is new again once
/// Redis expired it (polled, bounded: no wall-clock assertion).
async fn server_clock_path(store: RedisStore, raw: impl Fn(&[u8]) -> i64) {
    let dedup = DedupWindow::builder(Store::bare(store))
        .window(Duration::from_millis(300))
        .build()
        .expect("valid window");
    let key = WindowKey::new(
        "t",
        format!(
            "server-clock-{}",
            tower_window_tests::redis_server::reserve_port()
        ),
    );
    assert!(dedup.first_seen(&key, b"id").await.expect("answer"));
    assert!(!dedup.first_seen(&key, b"id").await.expect("answer"));
    let pttl = raw(b"tw:{t:");
    assert!(
        pttl > 0 && pttl <= 300,
        "the id's key has the window as TTL: {pttl}"
    );
    let mut new_again = false;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if dedup.first_seen(&key, b"id").await.expect("answer") {
            new_again = true;
            break;
        }
    }
    assert!(new_again, "Redis expired the id within 5 s");
}

#[tokio::test]
async fn server_clock_single() {
    let server = RedisServer::shared();
    let store = RedisStore::from_url(&server.url()).expect("valid url");
    let check = server.clone();
    server_clock_path(store, move |prefix| {
        max_pttl(&mut check.connection(), prefix)
    })
    .await;
}

#[tokio::test]
async fn server_clock_cluster() {
    let cluster = RedisCluster::shared();
    let store = RedisStore::cluster(cluster.urls()).expect("valid urls");
    let check = cluster.clone();
    server_clock_path(store, move |prefix| {
        check
            .nodes()
            .iter()
            .map(|node| max_pttl(&mut node.connection(), prefix))
            .max()
            .unwrap_or(-3)
    })
    .await;
}

/// The largest PTTL among the dedup keys under `prefix` (-3 if none).
fn max_pttl(conn: &mut redis::Connection, prefix: &[u8]) -> i64 {
    let mut pattern = prefix.to_vec();
    pattern.extend_from_slice(b"server-clock-*#dedup*");
    let keys: Vec<Vec<u8>> = redis::cmd("KEYS").arg(pattern).query(conn).expect("KEYS");
    keys.iter()
        .map(|key| {
            redis::cmd("PTTL")
                .arg(key)
                .query::<i64>(conn)
                .expect("PTTL")
        })
        .max()
        .unwrap_or(-3)
}

/// A store that cannot be reached: each fallback answers as configured,
/// marked as a fallback, within the limiter's budget.
#[tokio::test]
async fn outage_answers_by_the_fallback() {
    let url = format!("redis://127.0.0.1:{}", closed_port());
    for (fallback, expect) in [
        (OnFailure::FailOpen, Some(true)),
        (OnFailure::FailClosed, Some(false)),
        (OnFailure::Error, None),
    ] {
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
        let dedup = DedupWindow::builder(store)
            .on_store_failure(fallback)
            .build()
            .expect("valid window");
        let answer = dedup.check(&WindowKey::for_subject("u"), b"id").await;
        match expect {
            Some(first_seen) => {
                let decision = answer.expect("a fallback answer");
                assert_eq!(decision.first_seen, first_seen);
                assert!(matches!(decision.source, DedupSource::Fallback(_)));
            }
            None => assert!(matches!(answer, Err(DedupError::Store(_)))),
        }
    }
}
