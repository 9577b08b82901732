//! `Check::into_ready`: the answer of a check that decides at once (an
//! in-process store, the local tier) without awaiting, decided exactly as
//! by `.await` and on the same windows; a check that has to wait comes back
//! started, to be awaited for its one decision.
//!
//! (These were the tests of `Limiter::check_sync`, which `into_ready`
//! replaces: where `check_sync` answered `None` and charged nothing,
//! `into_ready` hands back the started check.)
#![allow(clippy::unwrap_used)]

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tower_window::fallback::{FailOpen, FallbackPolicy, FallbackRequest};
use tower_window::store::{Backend, Guard, Op, OwnedCheckRequest};
use tower_window::{
    limit, CheckRequest, Decision, DecisionSource, FallbackReason, LimitError, Limiter,
    MemoryStore, Quota, Store, StoreError, StoreErrorKind, WindowKey,
};

fn quota(dsl: &str) -> Quota {
    dsl.parse().unwrap()
}

fn alice() -> WindowKey {
    WindowKey::for_subject("alice")
}

/// Decided at once, or a test failure.
fn sync(limiter: &Limiter, key: &WindowKey, cost: u32) -> Decision {
    limiter
        .check(key, cost)
        .into_ready()
        .expect("an in-process store decides at once")
        .unwrap()
}

#[tokio::test]
async fn into_ready_and_check_share_one_window() {
    let limiter = Limiter::new(MemoryStore::new(), quota("3/1m"));
    let key = alice();
    let first = sync(&limiter, &key, 1);
    assert!(first.allowed());
    assert_eq!(first.remaining(), 2);
    assert_eq!(first.source(), DecisionSource::Store);
    let second = limiter.check(&key, 1).await.unwrap();
    assert!(second.allowed());
    assert_eq!(second.remaining(), 1);
    let third = sync(&limiter, &key, 1);
    assert!(third.allowed());
    assert_eq!(third.remaining(), 0);
    let fourth = limiter.check(&key, 1).await.unwrap();
    assert!(!fourth.allowed());
    let fifth = sync(&limiter, &key, 1);
    assert!(!fifth.allowed());
    assert!(fifth
        .retry_after()
        .is_some_and(|wait| wait > Duration::ZERO));
    // Another key has its own window.
    assert!(sync(&limiter, &WindowKey::for_subject("bob"), 1).allowed());
    assert_eq!(limiter.stats().store, 6);
}

#[test]
fn into_ready_needs_no_runtime_and_rejects_zero_cost() {
    let limiter = Limiter::new(MemoryStore::new(), quota("1/1m"));
    let key = alice();
    assert!(matches!(
        limiter.check(&key, 0).into_ready(),
        Ok(Err(LimitError::ZeroCost))
    ));
    assert!(sync(&limiter, &key, 1).allowed());
    assert!(!sync(&limiter, &key, 1).allowed());
}

/// The embedded store behind what the limiter must treat as a network:
/// every call yields once before it reaches the store, so no check decides
/// at its first poll. Counts the calls that reached the store.
struct Networked {
    inner: MemoryStore,
    calls: AtomicUsize,
}

/// `Networked` as a shared backend, so the test can read its counter.
struct Shared(Arc<Networked>);

impl limit::Backend for Shared {
    fn check<'a>(
        &'a self,
        guard: &mut Guard<'a>,
        request: CheckRequest<'a>,
    ) -> Op<'static, Decision> {
        let (store, request) = (Arc::clone(&self.0), OwnedCheckRequest::from(request));
        guard.run(move || {
            let (store, request) = (Arc::clone(&store), request.clone());
            async move {
                tokio::task::yield_now().await;
                store.calls.fetch_add(1, Ordering::SeqCst);
                limit::Backend::check(&store.inner, &mut Guard::bare(), request.as_request()).await
            }
        })
    }
}

#[tokio::test]
async fn a_networked_store_hands_back_the_started_check_and_charges_nothing_until_awaited() {
    let store = Arc::new(Networked {
        inner: MemoryStore::new(),
        calls: AtomicUsize::new(0),
    });
    let limiter = Limiter::builder(
        Store::from(Backend::windows(Shared(Arc::clone(&store)))),
        quota("2/1m"),
    )
    .local_capacity(100)
    .build();
    let key = alice();
    // Started and dropped before the store answered.
    for _ in 0..5 {
        assert!(limiter.check(&key, 1).into_ready().is_err());
    }
    assert_eq!(store.calls.load(Ordering::SeqCst), 0);
    assert_eq!(limiter.stats().store, 0);
    // Nothing was charged: the whole limit is still there.
    assert!(limiter.check(&key, 1).await.unwrap().allowed());
    assert!(limiter.check(&key, 1).await.unwrap().allowed());
    assert!(!limiter.check(&key, 1).await.unwrap().allowed());
    assert_eq!(store.calls.load(Ordering::SeqCst), 3);
    // The check `into_ready` hands back finishes when awaited: one call,
    // one decision.
    let bob = WindowKey::for_subject("bob");
    let started = limiter
        .check(&bob, 1)
        .into_ready()
        .expect_err("a networked store answers later");
    assert!(started.await.unwrap().allowed());
    assert_eq!(store.calls.load(Ordering::SeqCst), 4);
    assert_eq!(limiter.stats().store, 4);
}

#[tokio::test]
async fn remembered_denials_answer_from_the_local_tier() {
    let limiter = Limiter::builder(MemoryStore::new(), quota("1/1m"))
        .local_capacity(100)
        .build();
    let key = alice();
    assert!(sync(&limiter, &key, 1).allowed());
    let denied = sync(&limiter, &key, 1);
    assert!(!denied.allowed());
    assert_eq!(denied.source(), DecisionSource::Store);
    let again = sync(&limiter, &key, 1);
    assert!(!again.allowed());
    assert_eq!(again.source(), DecisionSource::LocalCache);
    let stats = limiter.stats();
    assert_eq!((stats.store, stats.local_cache), (2, 1));
}

/// An in-process backend that fails every call, at once.
struct Broken;

impl limit::Backend for Broken {
    fn check<'a>(&'a self, _: &mut Guard<'a>, _: CheckRequest<'a>) -> Op<'static, Decision> {
        Op::ready(Err(broken()))
    }
}

fn broken() -> StoreError {
    StoreError::new(StoreErrorKind::Unavailable, "broken on purpose").not_applied()
}

fn broken_store() -> Store {
    Store::from(Backend::windows(Broken).in_process(true))
}

#[test]
fn an_in_process_failure_is_answered_by_the_fallback_at_once() {
    let limiter = Limiter::builder(broken_store(), quota("1/1m"))
        .fallback(FailOpen)
        .build();
    let decision = sync(&limiter, &alice(), 1);
    assert!(decision.allowed());
    assert_eq!(
        decision.source(),
        DecisionSource::Fallback(FallbackReason::Unavailable)
    );
    assert_eq!(limiter.stats().fallback(FallbackReason::Unavailable), 1);

    // Without a fallback the error comes back, decided at once too.
    let bare = Limiter::new(broken_store(), quota("1/1m"));
    let key = alice();
    assert!(matches!(
        bare.check(&key, 1).into_ready(),
        Ok(Err(LimitError::Store(error))) if error.kind() == StoreErrorKind::Unavailable
    ));
    assert_eq!(bare.stats().errors, 1);
}

/// A backend behind a network that fails every call after yielding once:
/// a check on it is pending at its first poll.
struct BrokenLater;

impl limit::Backend for BrokenLater {
    fn check<'a>(&'a self, guard: &mut Guard<'a>, _: CheckRequest<'a>) -> Op<'static, Decision> {
        guard.run(|| async {
            tokio::task::yield_now().await;
            Err(broken())
        })
    }
}

/// A fallback that counts how often it is asked. (A fallback decides at
/// once: `FallbackPolicy::decide` is synchronous, so only the store can
/// make a check wait.)
struct Counted {
    decisions: Arc<AtomicUsize>,
}

impl FallbackPolicy for Counted {
    fn decide(&self, request: FallbackRequest<'_>) -> Decision {
        self.decisions.fetch_add(1, Ordering::SeqCst);
        Decision::allow(request.policy.first().clone(), 0, Duration::from_secs(1))
    }
}

#[tokio::test]
async fn a_check_that_must_wait_is_handed_back_and_decided_by_the_fallback_once() {
    let decisions = Arc::new(AtomicUsize::new(0));
    let limiter = Limiter::builder(Store::from(Backend::windows(BrokenLater)), quota("1/1m"))
        .fallback(Counted {
            decisions: Arc::clone(&decisions),
        })
        .build();
    // The store's answer would have to wait: nothing is counted and the
    // started check comes back.
    let key = alice();
    let started = limiter.check(&key, 1).into_ready().unwrap_err();
    assert_eq!(limiter.stats().fallback_total(), 0);
    assert_eq!(decisions.load(Ordering::SeqCst), 0);
    let decision = started.await.unwrap();
    assert!(decision.allowed());
    assert_eq!(
        decision.source(),
        DecisionSource::Fallback(FallbackReason::Unavailable)
    );
    assert_eq!(limiter.stats().fallback_total(), 1);
    assert_eq!(decisions.load(Ordering::SeqCst), 1);
}

/// A future polled with a waker that does nothing.
fn poll_once<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
    Pin::new(future).poll(&mut Context::from_waker(std::task::Waker::noop()))
}

#[test]
fn a_check_does_nothing_until_polled_and_decides_at_its_first_poll() {
    let limiter = Limiter::new(MemoryStore::new(), quota("1/1m"));
    let key = alice();
    // Built and dropped unpolled: nothing charged.
    for _ in 0..3 {
        drop(limiter.check(&key, 1));
    }
    assert_eq!(limiter.stats().store, 0);
    // On the embedded store the first poll decides; a named future a few
    // words wide, whatever the slow path holds.
    let mut check = limiter.check(&key, 1);
    assert!(std::mem::size_of_val(&check) <= 64);
    // A decision moves in a few registers' worth, not through `memcpy`.
    assert!(std::mem::size_of::<Decision>() <= 128);
    match poll_once(&mut check) {
        Poll::Ready(Ok(decision)) => assert!(decision.allowed()),
        other => panic!("the embedded store decides at the first poll: {other:?}"),
    }
    let mut denied = limiter.check(&key, 1);
    assert!(matches!(poll_once(&mut denied), Poll::Ready(Ok(d)) if !d.allowed()));
    assert_eq!(limiter.stats().store, 2);
}

#[tokio::test]
async fn a_check_that_must_wait_is_pending_then_decides_once() {
    let decisions = Arc::new(AtomicUsize::new(0));
    let limiter = Limiter::builder(Store::from(Backend::windows(BrokenLater)), quota("1/1m"))
        .fallback(Counted {
            decisions: Arc::clone(&decisions),
        })
        .build();
    let key = alice();
    let mut check = limiter.check(&key, 1);
    // The store's answer is not ready at the first poll ...
    assert!(poll_once(&mut check).is_pending());
    assert_eq!(limiter.stats().fallback_total(), 0);
    // ... and the same future finishes the check: one decision, counted once.
    let decision = check.await.unwrap();
    assert!(decision.allowed());
    assert_eq!(limiter.stats().fallback_total(), 1);
    assert_eq!(decisions.load(Ordering::SeqCst), 1);
}
