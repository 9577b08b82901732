//! Settles through the store's faults: a settle the store refused before
//! recording anything (a Redis down, then restarted) is tried again until
//! it lands, once.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use tower_window::limit::{Reserved, Settlement};
use tower_window::store::Store;
use tower_window::{Limiter, Quota, RedisStore, WindowKey};
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
