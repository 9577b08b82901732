//! RedisStore basics on a real server and a real cluster, all four algorithms.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use tower_window::{
    Limiter, ManualClock, Quota, RedisStore, RedisStoreBuilder, Store, StoreErrorKind, WindowKey,
};
use tower_window_tests::redis_cluster::RedisCluster;
use tower_window_tests::redis_server::RedisServer;

const T0: u64 = 1_700_000_000_000_000;

async fn exercise(store: RedisStoreBuilder) {
    let clock = ManualClock::new(T0);
    let store = store.clock(clock.clone()).build().unwrap();
    store.connect().await.unwrap();
    // One bare handle (no time budget) shared by every limiter.
    let store = Store::bare(store);
    for (text, admitted) in [
        ("3/1m", 3),
        ("3/1m sliding-counter(10s)", 3),
        ("3/1m fixed-window", 3),
        ("3/1m gcra", 3),
    ] {
        let quota: Quota = text.parse().unwrap();
        let limiter = Limiter::new(store.clone(), quota);
        let key = WindowKey::for_subject(format!("smoke-{text}"));
        let mut allowed = 0;
        for _ in 0..5 {
            let d = limiter.check(&key, 1).await.unwrap();
            assert_eq!(d.timestamp_micros(), T0);
            allowed += u32::from(d.allowed());
        }
        assert_eq!(allowed, admitted, "{text}");
        let d = limiter.check(&key, 1).await.unwrap();
        assert!(!d.allowed());
        assert!(d.retry_after().unwrap() > Duration::ZERO, "{text}: {d:?}");
        let never = limiter.check(&key, 4).await.unwrap();
        assert_eq!(never.retry_after(), None, "{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_server_all_algorithms() {
    let server = RedisServer::shared();
    exercise(RedisStore::builder().url(server.url()).prefix("smoke:")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_time_is_used_without_a_clock() {
    let server = RedisServer::shared();
    let store = RedisStore::builder()
        .url(server.url())
        .prefix("smoke-time:")
        .build()
        .unwrap();
    // Bare: the first call connects, which no time budget should decide.
    let limiter = Limiter::new(Store::bare(store), "2/1m".parse::<Quota>().unwrap());
    let d = limiter
        .check(&WindowKey::for_subject("x"), 1)
        .await
        .unwrap();
    let local = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    assert!(d.timestamp_micros().abs_diff(local) < 5_000_000, "{d:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_server_is_unavailable() {
    let port = tower_window_tests::redis_server::RedisServer::start().port();
    // The server is gone once dropped: nothing listens on `port` any more.
    let store = RedisStore::from_url(&format!("redis://127.0.0.1:{port}/")).unwrap();
    let limiter = Limiter::new(store, "2/1m".parse::<Quota>().unwrap());
    let err = limiter
        .check(&WindowKey::for_subject("x"), 1)
        .await
        .unwrap_err();
    match err {
        tower_window::LimitError::Store(e) => assert!(
            matches!(
                e.kind(),
                StoreErrorKind::Unavailable | StoreErrorKind::Timeout
            ),
            "{e}"
        ),
        other => panic!("{other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_all_algorithms() {
    let cluster = RedisCluster::shared();
    exercise(
        RedisStore::builder()
            .cluster(cluster.urls())
            .prefix("smoke:"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_single_and_cluster() {
    let server = RedisServer::shared();
    let pool = deadpool_redis::Config::from_url(server.url())
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .unwrap();
    exercise(RedisStore::builder().pool(pool).prefix("smoke-pool:")).await;
    let cluster = RedisCluster::shared();
    let pool = deadpool_redis::cluster::Config::from_urls(cluster.urls())
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .unwrap();
    exercise(
        RedisStore::builder()
            .cluster_pool(pool)
            .prefix("smoke-pool:"),
    )
    .await;
}
