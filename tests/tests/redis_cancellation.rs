//! A check whose future is dropped while its Redis call is in flight, on a
//! real redis-server held still with `CLIENT PAUSE ... WRITE` (issued from an
//! inspection connection, so the pause is in force before the check is
//! sent and ends exactly when the test says `CLIENT UNPAUSE`):
//!
//! - the cancelled decision is counted once or not at all, never twice
//!   (read back through `remaining` of later checks);
//! - nothing leaks: the in-flight bound of `Store::builder` is released
//!   by every dropped future, and the limiter's connections keep answering
//!   the right calls (each later check's `remaining` goes down by one).
//!
//! Each test has its own server (a pause stops every client of a server).
//! No assertion depends on timing: the pause is lifted by command, not by
//! expiry (its 30 s expiry only bounds a failing test), and the loops are
//! bounded.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use futures_util::FutureExt;
use tower_window::{
    Decision, DecisionSource, LimitError, Limiter, Quota, RedisStore, RetryConfig, Store,
    StoreErrorKind, WindowKey,
};
use tower_window_tests::redis_server::RedisServer;

const LIMIT: u32 = 1000;
const MAX_IN_FLIGHT: usize = 4;

fn limiter(server: &RedisServer, algorithm: &str) -> Limiter {
    let store = RedisStore::builder()
        .url(server.url())
        .prefix("cancel:")
        .build()
        .unwrap();
    // A day: GCRA refills one unit per 86 s, so `remaining` only goes down
    // during the test.
    let quota: Quota = format!("{LIMIT}/1d {algorithm}").trim().parse().unwrap();
    let store = Store::builder(store)
        .without_timeout()
        .retry(RetryConfig::none())
        .without_breaker()
        .max_in_flight(MAX_IN_FLIGHT)
        .build();
    Limiter::builder(store, quota).local_capacity(0).build()
}

async fn pause(admin: &mut redis::aio::MultiplexedConnection) {
    let () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(30_000)
        .arg("WRITE")
        .query_async(admin)
        .await
        .unwrap();
}

async fn unpause(admin: &mut redis::aio::MultiplexedConnection) {
    let () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query_async(admin)
        .await
        .unwrap();
}

async fn store_check(limiter: &Limiter, key: &WindowKey) -> Decision {
    let decision = limiter.check(key, 1).await.unwrap();
    assert!(decision.allowed(), "{decision:?}");
    assert_eq!(decision.source(), DecisionSource::Store);
    decision
}

/// One cancelled check at a time, dropped after one poll
/// (`now_or_never`) or after a few milliseconds of polling (a
/// `tokio::time::timeout`): over the whole run, the cancelled checks
/// together cost between 0 and one unit each, and every completed check
/// costs exactly one more than the cancelled ones that reached Redis.
async fn cancelled_checks_count_at_most_once(algorithm: &str) {
    let server = RedisServer::start();
    let mut admin = server.async_connection().await;
    let limiter = limiter(&server, algorithm);
    let key = WindowKey::for_subject("cancel-me");
    // Warm up: scripts loaded, connection made.
    let mut last = store_check(&limiter, &key).await.remaining();
    assert_eq!(last, LIMIT - 1);

    const ROUNDS: u32 = 12;
    let mut cancelled = 0;
    for round in 0..ROUNDS {
        pause(&mut admin).await;
        if round % 2 == 0 {
            assert!(limiter.check(&key, 1).now_or_never().is_none());
        } else {
            let timed_out = tokio::time::timeout(Duration::from_millis(5), limiter.check(&key, 1))
                .await
                .is_err();
            assert!(timed_out, "a check completed while Redis was paused");
        }
        cancelled += 1;
        unpause(&mut admin).await;
        let now = store_check(&limiter, &key).await.remaining();
        // This check took one unit; the cancelled ones at most one each.
        let used = last - now;
        assert!(
            (1..=1 + cancelled).contains(&used),
            "round {round}: {used} units used by 1 check and {cancelled} cancelled ones"
        );
        cancelled -= used - 1;
        last = now;
    }
    // Two more completed checks, to let any late cancelled call land
    // before the final reading; each costs one unit.
    for _ in 0..2 {
        let now = store_check(&limiter, &key).await.remaining();
        assert!(last - now >= 1);
        last = now;
    }
    let used_by_cancelled = (LIMIT - 1 - last) - (ROUNDS + 2);
    assert!(
        used_by_cancelled <= ROUNDS,
        "{ROUNDS} cancelled checks used {used_by_cancelled} units"
    );
    eprintln!(
        "{algorithm:?}: {ROUNDS} cancelled checks were counted {used_by_cancelled} times in total"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_log_cancelled_check_counts_at_most_once() {
    cancelled_checks_count_at_most_once("").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_window_cancelled_check_counts_at_most_once() {
    cancelled_checks_count_at_most_once("fixed-window").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gcra_cancelled_check_counts_at_most_once() {
    cancelled_checks_count_at_most_once("gcra").await;
}

/// With `max_in_flight(4)`: four checks pending on a paused Redis hold the
/// four permits (a fifth is `Overloaded` at once, so the bound is real),
/// and dropping them gives the permits back. Repeated for many rounds
/// (far more cancellations than permits); each round ends with a check
/// that reaches the store and counts exactly once more than before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_checks_release_the_in_flight_bound() {
    let server = RedisServer::start();
    let mut admin = server.async_connection().await;
    let limiter = limiter(&server, "");
    let key = WindowKey::for_subject("bound");
    let mut last = store_check(&limiter, &key).await.remaining();

    const ROUNDS: usize = 10;
    let mut cancelled = 0_u32;
    for round in 0..ROUNDS {
        pause(&mut admin).await;
        {
            let mut pending: Vec<_> = (0..MAX_IN_FLIGHT)
                .map(|_| Box::pin(limiter.check(&key, 1)))
                .collect();
            for check in &mut pending {
                assert!(check.as_mut().now_or_never().is_none(), "round {round}");
            }
            match limiter.check(&key, 1).now_or_never() {
                Some(Err(LimitError::Store(error))) => {
                    assert_eq!(error.kind(), StoreErrorKind::Overloaded, "{error}");
                }
                other => panic!("round {round}: expected Overloaded, got {other:?}"),
            }
            // `pending` is dropped here, with its calls still in flight.
        }
        cancelled += u32::try_from(MAX_IN_FLIGHT).unwrap();
        // Permits are back before Redis answers anything: a check is
        // admitted past the bound while Redis is still paused.
        let mut past_bound = Box::pin(limiter.check(&key, 1));
        assert!(
            past_bound.as_mut().now_or_never().is_none(),
            "round {round}"
        );
        drop(past_bound);
        cancelled += 1;
        unpause(&mut admin).await;
        let now = store_check(&limiter, &key).await.remaining();
        let used = last - now;
        assert!(
            (1..=1 + cancelled).contains(&used),
            "round {round}: {used} units for 1 check and {cancelled} cancelled ones"
        );
        cancelled -= used - 1;
        last = now;
    }
    assert_eq!(limiter.stats().errors, u64::try_from(ROUNDS).unwrap());
}
