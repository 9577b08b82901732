//! `Limiter::check_sync`: the future-free path for in-process stores decides
//! exactly as `check`, shares its windows, and answers `None` (having charged
//! nothing) whenever the decision would have to wait.
#![allow(clippy::unwrap_used)]

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::future::BoxFuture;
use tower_window::fallback::{FailOpen, FallbackPolicy, FallbackRequest};
use tower_window::{
    CheckRequest, Decision, DecisionSource, FallbackReason, LimitError, Limiter, MemoryStore,
    Quota, Store, StoreError, StoreErrorKind, WindowKey,
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
        .check_sync(key, cost)
        .expect("an in-process store decides at once")
        .unwrap()
}

#[tokio::test]
async fn check_sync_and_check_share_one_window() {
    let limiter = Limiter::new(MemoryStore::new(), quota("3/1m"));
    let key = alice();
    let first = sync(&limiter, &key, 1);
    assert!(first.allowed);
    assert_eq!(first.remaining, 2);
    assert_eq!(first.source, DecisionSource::Store);
    let second = limiter.check(&key, 1).await.unwrap();
    assert!(second.allowed);
    assert_eq!(second.remaining, 1);
    let third = sync(&limiter, &key, 1);
    assert!(third.allowed);
    assert_eq!(third.remaining, 0);
    let fourth = limiter.check(&key, 1).await.unwrap();
    assert!(!fourth.allowed);
    let fifth = sync(&limiter, &key, 1);
    assert!(!fifth.allowed);
    assert!(fifth.retry_after.is_some_and(|wait| wait > Duration::ZERO));
    // Another key has its own window.
    assert!(sync(&limiter, &WindowKey::for_subject("bob"), 1).allowed);
    assert_eq!(limiter.stats().store, 6);
}

#[test]
fn check_sync_needs_no_runtime_and_rejects_zero_cost() {
    let limiter = Limiter::new(MemoryStore::new(), quota("1/1m"));
    assert!(matches!(
        limiter.check_sync(&alice(), 0),
        Some(Err(LimitError::ZeroCost))
    ));
    assert!(sync(&limiter, &alice(), 1).allowed);
    assert!(!sync(&limiter, &alice(), 1).allowed);
}

/// The embedded store behind what the limiter must treat as a network:
/// it never decides synchronously.
struct Networked {
    inner: MemoryStore,
    calls: AtomicUsize,
}

impl Store for Networked {
    fn check<'a>(
        &'a self,
        request: CheckRequest<'a>,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.check(request)
    }
}

#[tokio::test]
async fn a_networked_store_gets_none_and_is_not_charged() {
    let store = Arc::new(Networked {
        inner: MemoryStore::new(),
        calls: AtomicUsize::new(0),
    });
    let limiter = Limiter::builder(Arc::clone(&store), quota("2/1m"))
        .local_capacity(100)
        .build();
    let key = alice();
    for _ in 0..5 {
        assert!(limiter.check_sync(&key, 1).is_none());
    }
    assert_eq!(store.calls.load(Ordering::SeqCst), 0);
    assert_eq!(limiter.stats().store, 0);
    // Nothing was charged: the whole limit is still there.
    assert!(limiter.check(&key, 1).await.unwrap().allowed);
    assert!(limiter.check(&key, 1).await.unwrap().allowed);
    assert!(!limiter.check(&key, 1).await.unwrap().allowed);
    assert_eq!(store.calls.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn remembered_denials_answer_from_the_local_tier() {
    let limiter = Limiter::builder(MemoryStore::new(), quota("1/1m"))
        .local_capacity(100)
        .build();
    let key = alice();
    assert!(sync(&limiter, &key, 1).allowed);
    let denied = sync(&limiter, &key, 1);
    assert!(!denied.allowed);
    assert_eq!(denied.source, DecisionSource::Store);
    let again = sync(&limiter, &key, 1);
    assert!(!again.allowed);
    assert_eq!(again.source, DecisionSource::LocalCache);
    let stats = limiter.stats();
    assert_eq!((stats.store, stats.local_cache), (2, 1));
}

/// An in-process store that fails every call, at once.
struct Broken;

impl Store for Broken {
    fn check<'a>(
        &'a self,
        _request: CheckRequest<'a>,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        Box::pin(async { Err(broken()) })
    }

    fn check_sync(&self, _request: CheckRequest<'_>) -> Option<Result<Decision, StoreError>> {
        Some(Err(broken()))
    }

    fn decides_in_process(&self) -> bool {
        true
    }
}

fn broken() -> StoreError {
    StoreError::new(StoreErrorKind::Unavailable, "broken on purpose").not_applied()
}

#[test]
fn an_in_process_failure_is_answered_by_the_fallback_at_once() {
    let limiter = Limiter::builder(Broken, quota("1/1m"))
        .fallback(FailOpen)
        .build();
    let decision = sync(&limiter, &alice(), 1);
    assert!(decision.allowed);
    assert_eq!(
        decision.source,
        DecisionSource::Fallback(FallbackReason::Unavailable)
    );
    assert_eq!(limiter.stats().fallback(FallbackReason::Unavailable), 1);

    // Without a fallback the error comes back, decided at once too.
    let bare = Limiter::new(Broken, quota("1/1m"));
    assert!(matches!(
        bare.check_sync(&alice(), 1),
        Some(Err(LimitError::Store(error))) if error.kind() == StoreErrorKind::Unavailable
    ));
    assert_eq!(bare.stats().errors, 1);
}

/// A fallback whose answer is not ready at the first poll.
struct Slow {
    decisions: AtomicUsize,
}

/// Pending at the first poll, ready at the second.
struct PendingOnce {
    decision: Option<Decision>,
    polled: bool,
}

impl Future for PendingOnce {
    type Output = Decision;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Decision> {
        let this = self.get_mut();
        if !this.polled {
            this.polled = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        match this.decision.take() {
            Some(decision) => Poll::Ready(decision),
            None => Poll::Pending,
        }
    }
}

impl FallbackPolicy for Slow {
    fn decide<'a>(&'a self, request: FallbackRequest<'a>) -> BoxFuture<'a, Decision> {
        self.decisions.fetch_add(1, Ordering::SeqCst);
        let decision = Decision::allow(request.policy.first().clone(), 0, Duration::from_secs(1));
        Box::pin(PendingOnce {
            decision: Some(decision),
            polled: false,
        })
    }
}

#[tokio::test]
async fn a_fallback_that_must_wait_leaves_the_check_to_check() {
    let limiter = Limiter::builder(Broken, quota("1/1m"))
        .fallback(Slow {
            decisions: AtomicUsize::new(0),
        })
        .build();
    // The fallback was asked, but its answer would have to wait: nothing
    // is counted and `check` decides from the start.
    assert!(limiter.check_sync(&alice(), 1).is_none());
    assert_eq!(limiter.stats().fallback_total(), 0);
    let decision = limiter.check(&alice(), 1).await.unwrap();
    assert!(decision.allowed);
    assert_eq!(
        decision.source,
        DecisionSource::Fallback(FallbackReason::Unavailable)
    );
    assert_eq!(limiter.stats().fallback_total(), 1);
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
        Poll::Ready(Ok(decision)) => assert!(decision.allowed),
        other => panic!("the embedded store decides at the first poll: {other:?}"),
    }
    let mut denied = limiter.check(&key, 1);
    assert!(matches!(poll_once(&mut denied), Poll::Ready(Ok(d)) if !d.allowed));
    assert_eq!(limiter.stats().store, 2);
}

#[tokio::test]
async fn a_check_that_must_wait_is_pending_then_decides_once() {
    let limiter = Limiter::builder(Broken, quota("1/1m"))
        .fallback(Slow {
            decisions: AtomicUsize::new(0),
        })
        .build();
    let key = alice();
    let mut check = limiter.check(&key, 1);
    // The fallback's answer is not ready at the first poll ...
    assert!(poll_once(&mut check).is_pending());
    assert_eq!(limiter.stats().fallback_total(), 0);
    // ... and the same future finishes the check: one decision, counted once.
    let decision = check.await.unwrap();
    assert!(decision.allowed);
    assert_eq!(limiter.stats().fallback_total(), 1);
}
