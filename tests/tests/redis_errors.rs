//! RedisStore failure modes: every error is typed, bounded by the deadline,
//! and the store recovers when Redis comes back.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use tower_window::{LimitError, Limiter, StoreErrorKind, WindowKey};
use tower_window::{Quota, RedisStore, Store};
use tower_window_tests::redis_server::RedisServer;

fn kind(result: Result<tower_window::Decision, LimitError>) -> StoreErrorKind {
    match result {
        Err(LimitError::Store(e)) => e.kind(),
        other => panic!("expected a store error, got {other:?}"),
    }
}

fn quota() -> Quota {
    "10/1m".parse().unwrap()
}

/// A server that does not answer: the call fails as Timeout at the
/// store handle's deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_server_times_out_at_the_deadline() {
    let server = RedisServer::start();
    let store = RedisStore::from_url(&server.url()).unwrap();
    store.connect().await.unwrap();
    // The store handle's time budget is the only deadline; no retries, so
    // the one call meets it.
    let store = Store::builder(store)
        .timeout(Duration::from_millis(100))
        .retry(tower_window::RetryConfig::none())
        .build();
    let limiter = Limiter::new(store, quota());
    let key = WindowKey::for_subject("slow");
    assert!(limiter.check(&key, 1).await.unwrap().allowed());
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(1500)
        .arg("ALL")
        .query(&mut server.connection())
        .unwrap();
    // The server would answer after the 1.5 s pause; Timeout means the
    // 100 ms deadline ended the call first.
    assert_eq!(kind(limiter.check(&key, 1).await), StoreErrorKind::Timeout);
}

/// `maxmemory` exhausted: Redis refuses writing scripts with OOM →
/// Unavailable: the store's own health (it counts against the breaker),
/// not our overload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_memory_is_unavailable() {
    let server = RedisServer::start();
    // Bare (no budget, retries or breaker): the store's own answer.
    let store = Store::bare(RedisStore::from_url(&server.url()).unwrap());
    let limiter = Limiter::new(store, quota());
    let mut admin = server.connection();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("noeviction")
        .query(&mut admin)
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(1)
        .query(&mut admin)
        .unwrap();
    let result = limiter.check(&WindowKey::for_subject("oom"), 1).await;
    assert_eq!(kind(result), StoreErrorKind::Unavailable);
}

/// A key of the wrong type (someone else wrote there): Protocol, never a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_error_is_protocol() {
    let server = RedisServer::start();
    let quota: Quota = "10/1m gcra".parse().unwrap();
    let key = WindowKey::for_subject("clobbered");
    let encoded = tower_window::store::redis_key("tw:", &key, &quota.clone().into(), &quota);
    let _: () = redis::cmd("LPUSH")
        .arg(&encoded)
        .arg("x")
        .query(&mut server.connection())
        .unwrap();
    let store = Store::bare(RedisStore::from_url(&server.url()).unwrap());
    let limiter = Limiter::new(store, quota);
    assert_eq!(kind(limiter.check(&key, 1).await), StoreErrorKind::Protocol);
}

/// Redis goes away (Unavailable, fast) and comes back empty (new process,
/// no scripts): the store reconnects and reloads by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn survives_a_redis_restart() {
    let mut server = RedisServer::start();
    let store = RedisStore::builder()
        .url(server.url())
        .connect_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let store = Store::builder(store)
        .timeout(Duration::from_secs(2))
        .build();
    let limiter = Limiter::new(store, quota());
    let key = WindowKey::for_subject("restart");
    assert!(limiter.check(&key, 1).await.unwrap().allowed());

    server.stop();
    let down = kind(limiter.check(&key, 1).await);
    assert!(
        matches!(down, StoreErrorKind::Unavailable | StoreErrorKind::Timeout),
        "{down:?}"
    );

    server.restart();
    // The first call after the restart may still meet the old connection's
    // failure; within a few calls the store is back.
    let mut back = None;
    for _ in 0..20 {
        if let Ok(d) = limiter.check(&key, 1).await {
            back = Some(d);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let decision = back.expect("the store reconnects after a restart");
    // The restarted server has no state (no persistence): a fresh window.
    assert!(decision.allowed());
    assert_eq!(decision.remaining(), 9);
}

/// The backend has no deadline or in-flight bound of its own: the store
/// handle's resilience stack is the only one, and a backend call (with a
/// bare guard) runs as long as Redis takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_itself_waits_for_redis() {
    use tower_window::limit::Backend as _;
    use tower_window::store::Guard;
    use tower_window::{CheckRequest, Cost, Policy};

    let server = RedisServer::start();
    let store = RedisStore::from_url(&server.url()).unwrap();
    store.connect().await.unwrap();
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(300)
        .arg("ALL")
        .query(&mut server.connection())
        .unwrap();
    let policy = Policy::from(quota());
    let key = WindowKey::for_subject("patient");
    let (a, b) = tokio::join!(
        store.check(
            &mut Guard::bare(),
            CheckRequest::new(&key, &policy, Cost::ONE)
        ),
        store.check(
            &mut Guard::bare(),
            CheckRequest::new(&key, &policy, Cost::ONE)
        ),
    );
    assert_eq!(a.unwrap().remaining() + b.unwrap().remaining(), 9 + 8);
}

/// Configuration errors are typed, apart from store errors.
#[test]
fn configuration_errors_are_typed() {
    use tower_window::RedisConfigError;

    assert!(matches!(
        RedisStore::builder().build(),
        Err(RedisConfigError::MissingServer)
    ));
    assert!(matches!(
        RedisStore::from_url("not a url"),
        Err(RedisConfigError::InvalidUrl(_))
    ));
    assert!(matches!(
        RedisStore::cluster(Vec::<String>::new()),
        Err(RedisConfigError::NoClusterNodes)
    ));
    let store = RedisStore::builder()
        .url("redis://127.0.0.1:1")
        .prefix("p:")
        .connect_timeout(Duration::from_millis(10))
        .build()
        .unwrap();
    assert_eq!(store.key_prefix(), "p:");
}

/// A store outlives the runtime that connected it (e.g. one store shared by
/// tests with their own runtimes): the next runtime gets a working store.
#[test]
fn survives_the_connecting_runtime_shutting_down() {
    let server = RedisServer::start();
    // Bare: the store recovers by itself, no breaker in between.
    let store = Store::bare(RedisStore::from_url(&server.url()).unwrap());
    let limiter = Limiter::new(store, quota());
    let key = WindowKey::for_subject("runtimes");
    for round in 0..3 {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let allowed = runtime.block_on(async {
            for _ in 0..20 {
                if let Ok(d) = limiter.check(&key, 1).await {
                    return d.allowed();
                }
                tokio::task::yield_now().await;
            }
            panic!("round {round}: the store did not recover");
        });
        assert!(allowed);
    }
}
