//! Limiter-side resilience against a store that fails, hangs or answers on
//! command: fallback policies, the time budget, retries, the circuit breaker,
//! the in-flight bound and the local tier. Tokio time is paused and the
//! limiter's clock is a `ManualClock`; nothing here sleeps for real.
#![allow(clippy::unwrap_used)]

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tower_window::fallback::{FailClosed, FailOpen, FallbackPolicy, FallbackRequest, LocalWindow};
use tower_window::store::{Backend, Guard, Op, StoreBuilder};
use tower_window::{
    limit, BreakerConfig, BreakerState, CheckRequest, Clock, Decision, DecisionSource,
    FallbackReason, LimitError, Limiter, LimiterBuilder, ManualClock, Policy, Quota, RetryConfig,
    Store, StoreError, StoreErrorKind, WindowKey,
};

/// What the test store does with the next calls.
#[derive(Debug, Clone, Copy)]
enum Mode {
    Allow,
    Deny(Duration),
    Fail(StoreErrorKind),
    /// Fails after the store may have applied the call (no `not_applied`).
    FailApplied(StoreErrorKind),
    /// Takes this long (on the test clock), then admits.
    Slow(Duration),
    Hang,
}

/// A store that does what the test says, and counts its calls.
#[derive(Clone)]
struct TestStore {
    mode: Arc<Mutex<Mode>>,
    calls: Arc<AtomicUsize>,
    clock: ManualClock,
}

impl TestStore {
    fn new(clock: &ManualClock) -> Self {
        Self {
            mode: Arc::new(Mutex::new(Mode::Allow)),
            calls: Arc::new(AtomicUsize::new(0)),
            clock: clock.clone(),
        }
    }

    fn set(&self, mode: Mode) {
        *self.mode.lock().unwrap() = mode;
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

/// A backend behind a network: each attempt (a retry too) is one call,
/// made within the store handle's budget, in-flight bound and breaker.
impl limit::Backend for TestStore {
    fn check<'a>(
        &'a self,
        guard: &mut Guard<'a>,
        request: CheckRequest<'a>,
    ) -> Op<'static, Decision> {
        let (this, quota) = (self.clone(), request.policy.first().clone());
        guard.run(move || this.call(quota.clone()))
    }
}

impl TestStore {
    fn call(
        &self,
        quota: Quota,
    ) -> impl std::future::Future<Output = Result<Decision, StoreError>> + Send + 'static {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let mode = *self.mode.lock().unwrap();
        if let Mode::Slow(took) = mode {
            self.clock.advance(took);
        }
        let now = self.clock.now_micros();
        async move {
            match mode {
                Mode::Allow => Ok(
                    Decision::allow(quota, 1, Duration::from_secs(1)).with_timestamp_micros(now)
                ),
                Mode::Deny(wait) => {
                    Ok(Decision::deny(quota, 0, wait, Some(wait)).with_timestamp_micros(now))
                }
                // Injected failures happen before the store applies anything.
                Mode::Fail(kind) => Err(StoreError::new(kind, "injected").not_applied()),
                Mode::FailApplied(kind) => Err(StoreError::new(kind, "reset after sending")),
                Mode::Slow(_) => Ok(
                    Decision::allow(quota, 1, Duration::from_secs(1)).with_timestamp_micros(now)
                ),
                Mode::Hang => std::future::pending().await,
            }
        }
    }
}

const T0: u64 = 1_700_000_000_000_000;

/// Yields until `done` holds, boundedly: a regression fails with `what`
/// instead of hanging the suite.
async fn until(what: &str, done: impl Fn() -> bool) {
    for _ in 0..10_000 {
        if done() {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("gave up waiting: {what}");
}
const BUDGET: Duration = Duration::from_millis(50);

fn quota() -> Quota {
    "10/1s".parse().unwrap()
}

fn key() -> WindowKey {
    WindowKey::for_subject("alice")
}

/// The store's builder (budget, retries, breaker, in-flight bound) and the
/// limiter's settings (local tier, fallback) side by side, so a test sets
/// both in one chain; `build` makes the store, then the limiter on it.
struct Setup {
    store: StoreBuilder,
    limiter: Vec<Box<dyn FnOnce(LimiterBuilder) -> LimiterBuilder>>,
}

impl Setup {
    fn timeout(mut self, budget: Duration) -> Self {
        self.store = self.store.timeout(budget);
        self
    }

    fn retry(mut self, retry: RetryConfig) -> Self {
        self.store = self.store.retry(retry);
        self
    }

    fn breaker(mut self, config: BreakerConfig) -> Self {
        self.store = self.store.breaker(config);
        self
    }

    fn max_in_flight(mut self, n: usize) -> Self {
        self.store = self.store.max_in_flight(n);
        self
    }

    fn local_capacity(mut self, capacity: u64) -> Self {
        self.limiter
            .push(Box::new(move |b| b.local_capacity(capacity)));
        self
    }

    fn fallback(mut self, policy: impl FallbackPolicy) -> Self {
        self.limiter.push(Box::new(move |b| b.fallback(policy)));
        self
    }

    fn build(self) -> Limiter {
        let builder = Limiter::builder(self.store.build(), quota());
        self.limiter
            .into_iter()
            .fold(builder, |builder, set| set(builder))
            .build()
    }
}

/// A store on `backend` behind a network, on `clock`.
fn networked(backend: impl limit::Backend, clock: &ManualClock) -> StoreBuilder {
    Store::builder(Backend::windows(backend).clock(clock.clone()))
}

/// A store with no breaker and no retries, and a limiter with no local
/// tier, so each test turns on only what it looks at.
fn setup() -> (TestStore, ManualClock, Setup) {
    let clock = ManualClock::new(T0);
    let store = TestStore::new(&clock);
    let builder = Setup {
        store: networked(store.clone(), &clock)
            .without_breaker()
            .retry(RetryConfig::none())
            .timeout(BUDGET),
        limiter: Vec::new(),
    }
    .local_capacity(0);
    (store, clock, builder)
}

fn fallback(reason: FallbackReason) -> DecisionSource {
    DecisionSource::Fallback(reason)
}

#[tokio::test(start_paused = true)]
async fn without_a_fallback_errors_are_returned() {
    let (store, _clock, builder) = setup();
    let limiter = builder.build();
    assert_eq!(
        limiter.check(&key(), 1).await.unwrap().source(),
        DecisionSource::Store
    );
    store.set(Mode::Fail(StoreErrorKind::Unavailable));
    match limiter.check(&key(), 1).await {
        Err(LimitError::Store(e)) => assert_eq!(e.kind(), StoreErrorKind::Unavailable),
        other => panic!("expected a store error, got {other:?}"),
    }
    store.set(Mode::Hang);
    match limiter.check(&key(), 1).await {
        Err(LimitError::Store(e)) => assert_eq!(e.kind(), StoreErrorKind::Timeout),
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(matches!(
        limiter.check(&key(), 0).await,
        Err(LimitError::ZeroCost)
    ));
    let stats = limiter.stats();
    assert_eq!(
        (stats.store, stats.errors, stats.fallback_total()),
        (1, 2, 0)
    );
}

#[tokio::test(start_paused = true)]
async fn fail_open_admits_and_says_why() {
    let (store, clock, builder) = setup();
    let limiter = builder.fallback(FailOpen).build();
    for (kind, reason) in [
        (StoreErrorKind::Unavailable, FallbackReason::Unavailable),
        (StoreErrorKind::Timeout, FallbackReason::Timeout),
        (StoreErrorKind::Overloaded, FallbackReason::Overloaded),
        (StoreErrorKind::Protocol, FallbackReason::Error),
    ] {
        store.set(Mode::Fail(kind));
        let d = limiter.check(&key(), 3).await.unwrap();
        assert!(d.allowed());
        assert_eq!(d.source(), fallback(reason));
        assert!(d.is_degraded());
        assert_eq!(d.remaining(), 7);
        assert_eq!(d.timestamp_micros(), clock.now_micros());
    }
    store.set(Mode::Hang);
    let d = limiter.check(&key(), 1).await.unwrap();
    assert!(d.allowed());
    assert_eq!(d.source(), fallback(FallbackReason::Timeout));
    let stats = limiter.stats();
    assert_eq!(stats.fallback(FallbackReason::Timeout), 2);
    assert_eq!(stats.fallback_total(), 5);
}

#[tokio::test(start_paused = true)]
async fn fail_closed_denies_with_its_status() {
    let (store, _clock, builder) = setup();
    let limiter = builder.fallback(FailClosed::default()).build();
    store.set(Mode::Fail(StoreErrorKind::Unavailable));
    let d = limiter.check(&key(), 1).await.unwrap();
    assert!(!d.allowed());
    assert_eq!(d.source(), fallback(FallbackReason::Unavailable));
    assert_eq!(d.retry_after(), Some(Duration::from_secs(1)));
    assert_eq!(d.remaining(), 0);

    let (store, _clock, builder) = setup();
    let limiter = builder
        .fallback(FailClosed::new().retry_after(Duration::from_millis(250)))
        .build();
    store.set(Mode::Fail(StoreErrorKind::Overloaded));
    let d = limiter.check(&key(), 1).await.unwrap();
    assert!(!d.allowed());
    assert_eq!(d.source(), fallback(FallbackReason::Overloaded));
    assert_eq!(d.retry_after(), Some(Duration::from_millis(250)));
}

#[tokio::test(start_paused = true)]
async fn closure_policies_are_marked_degraded() {
    let (store, _clock, builder) = setup();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let limiter = builder
        .fallback(move |r: &FallbackRequest<'_>| {
            log.lock()
                .unwrap()
                .push((r.reason, r.cost.get(), r.error.map(StoreError::kind)));
            // Claims to be a store decision; the limiter corrects that.
            Decision::allow(r.policy.first().clone(), 0, r.policy.first().window())
        })
        .build();
    store.set(Mode::Fail(StoreErrorKind::Unavailable));
    let d = limiter.check(&key(), 2).await.unwrap();
    assert!(d.allowed());
    assert_eq!(d.source(), fallback(FallbackReason::Unavailable));
    assert_eq!(d.timestamp_micros(), T0);
    assert_eq!(
        *seen.lock().unwrap(),
        vec![(
            FallbackReason::Unavailable,
            2,
            Some(StoreErrorKind::Unavailable)
        )]
    );
}

#[tokio::test(start_paused = true)]
async fn a_hanging_store_returns_by_the_budget() {
    let (store, _clock, builder) = setup();
    store.set(Mode::Hang);
    // Retries do not stretch the budget either.
    let limiter = builder
        .retry(RetryConfig::default().max_retries(10))
        .fallback(FailOpen)
        .build();
    for _ in 0..3 {
        let start = Instant::now();
        let d = limiter.check(&key(), 1).await.unwrap();
        let elapsed = start.elapsed();
        assert_eq!(d.source(), fallback(FallbackReason::Timeout));
        // Paused time: the timeout fires at the budget exactly.
        assert_eq!(elapsed, BUDGET, "waited {elapsed:?}");
    }
    assert_eq!(store.calls(), 3);
}

#[tokio::test(start_paused = true)]
async fn retries_only_retryable_errors() {
    let (store, _clock, builder) = setup();
    let limiter = builder
        .timeout(Duration::from_secs(10))
        .retry(RetryConfig::default().max_retries(3))
        .fallback(FailOpen)
        .build();
    store.set(Mode::Fail(StoreErrorKind::Unavailable));
    let d = limiter.check(&key(), 1).await.unwrap();
    assert_eq!(d.source(), fallback(FallbackReason::Unavailable));
    assert_eq!(store.calls(), 4, "1 attempt + 3 retries");
    for kind in [
        StoreErrorKind::Protocol,
        StoreErrorKind::Timeout,
        StoreErrorKind::Overloaded,
        StoreErrorKind::InvalidRequest,
    ] {
        let before = store.calls();
        store.set(Mode::Fail(kind));
        limiter.check(&key(), 1).await.unwrap();
        assert_eq!(store.calls() - before, 1, "{kind} is not retried");
    }
}

/// A failure after the store may have applied the call (a connection reset
/// after sending) is never retried: a retry must not charge twice.
#[tokio::test(start_paused = true)]
async fn a_retry_never_repeats_a_call_that_may_have_applied() {
    let (store, _clock, builder) = setup();
    let limiter = builder
        .timeout(Duration::from_secs(10))
        .retry(RetryConfig::default().max_retries(3))
        .fallback(FailOpen)
        .build();
    store.set(Mode::FailApplied(StoreErrorKind::Unavailable));
    let d = limiter.check(&key(), 1).await.unwrap();
    assert_eq!(d.source(), fallback(FallbackReason::Unavailable));
    assert_eq!(store.calls(), 1, "may have applied: not retried");
    store.set(Mode::Fail(StoreErrorKind::Unavailable));
    limiter.check(&key(), 1).await.unwrap();
    assert_eq!(store.calls(), 1 + 4, "certainly not applied: retried");
}

/// Our own overload (a pool wait, the in-flight bound) is not the store's
/// health: it never opens a breaker, however often it happens.
#[tokio::test(start_paused = true)]
async fn our_own_overload_never_opens_a_breaker() {
    let (store, _clock, builder) = setup();
    let limiter = builder
        .breaker(
            BreakerConfig::default()
                .consecutive_failures(2)
                .without_failure_ratio(),
        )
        .max_in_flight(1)
        .fallback(FailClosed::new())
        .build();
    store.set(Mode::Fail(StoreErrorKind::Overloaded));
    for _ in 0..100 {
        let d = limiter.check(&key(), 1).await.unwrap();
        assert_eq!(d.source(), fallback(FallbackReason::Overloaded));
    }
    assert_eq!(limiter.breaker_state(), Some(BreakerState::Closed));
    assert_eq!(store.calls(), 100, "every call reached the store");

    // The in-flight bound: one call hangs, the rest are turned away here.
    store.set(Mode::Hang);
    let hung = {
        let limiter = limiter.clone();
        tokio::spawn(async move { limiter.check(&key(), 1).await.unwrap() })
    };
    until("the hung call reaches the store", || store.calls() >= 101).await;
    assert_eq!(store.calls(), 101, "the hung call reached the store");
    for _ in 0..100 {
        let d = limiter.check(&key(), 1).await.unwrap();
        assert_eq!(d.source(), fallback(FallbackReason::Overloaded));
    }
    assert_eq!(limiter.breaker_state(), Some(BreakerState::Closed));
    assert_eq!(
        hung.await.unwrap().source(),
        fallback(FallbackReason::Timeout)
    );

    // A real store failure still counts: two in a row open it.
    store.set(Mode::Fail(StoreErrorKind::Unavailable));
    for _ in 0..2 {
        limiter.check(&key(), 1).await.unwrap();
    }
    assert_eq!(limiter.breaker_state(), Some(BreakerState::Open));
}

/// A store that still answers, but slowly, is shed by the slow-call trigger
/// before it eats every request's budget; a fast one is not.
#[tokio::test(start_paused = true)]
async fn slow_calls_open_the_breaker() {
    let breaker = || {
        BreakerConfig::default()
            .consecutive_failures(0)
            .without_failure_ratio()
            .slow_calls(Duration::from_millis(10), 0.5, 4)
    };
    let (store, _clock, builder) = setup();
    let limiter = builder
        .breaker(breaker())
        .fallback(FailClosed::new())
        .build();
    store.set(Mode::Slow(Duration::from_millis(9)));
    for _ in 0..10 {
        assert_eq!(
            limiter.check(&key(), 1).await.unwrap().source(),
            DecisionSource::Store
        );
    }
    assert_eq!(limiter.breaker_state(), Some(BreakerState::Closed));

    let (store, _clock, builder) = setup();
    let limiter = builder
        .breaker(breaker())
        .fallback(FailClosed::new())
        .build();
    store.set(Mode::Slow(Duration::from_millis(20)));
    for _ in 0..4 {
        let d = limiter.check(&key(), 1).await.unwrap();
        assert_eq!(d.source(), DecisionSource::Store, "slow, but answered");
        assert!(d.allowed());
    }
    assert_eq!(limiter.breaker_state(), Some(BreakerState::Open));
    let d = limiter.check(&key(), 1).await.unwrap();
    assert_eq!(d.source(), fallback(FallbackReason::CircuitOpen));
    assert_eq!(store.calls(), 4);
}

#[tokio::test(start_paused = true)]
async fn a_retry_recovers_within_the_budget() {
    let (store, _clock, builder) = setup();
    let limiter = builder
        .timeout(Duration::from_secs(10))
        .retry(RetryConfig::default().max_retries(50))
        .fallback(FailClosed::default())
        .build();
    store.set(Mode::Fail(StoreErrorKind::Unavailable));
    let flip = {
        let store = store.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            store.set(Mode::Allow);
        })
    };
    // Delays before jitter: 2, 4, 8, 16, then 20 ms each (full jitter: each
    // wait in [0, delay]). The store recovers at 5 ms; the first retry after
    // that succeeds, at most one 20 ms delay later.
    let start = Instant::now();
    let d = limiter.check(&key(), 1).await.unwrap();
    let elapsed = start.elapsed();
    flip.await.unwrap();
    assert!(d.allowed());
    assert_eq!(d.source(), DecisionSource::Store);
    assert!(
        (Duration::from_millis(5)..=Duration::from_millis(25)).contains(&elapsed),
        "recovered after {elapsed:?}"
    );
    assert!((2..=51).contains(&store.calls()), "{} calls", store.calls());
}

#[tokio::test(start_paused = true)]
async fn retries_never_run_past_the_budget() {
    let (store, _clock, builder) = setup();
    let limiter = builder
        .retry(
            RetryConfig::default()
                .max_retries(1_000)
                .delays(Duration::from_millis(10), Duration::from_millis(10)),
        )
        .fallback(FailOpen)
        .build();
    store.set(Mode::Fail(StoreErrorKind::Unavailable));
    for _ in 0..20 {
        let before = store.calls();
        let start = Instant::now();
        let d = limiter.check(&key(), 1).await.unwrap();
        // Never past the budget; and retries go on until less than one
        // delay (10 ms) of it is left.
        let elapsed = start.elapsed();
        assert!(
            (BUDGET - Duration::from_millis(10)..=BUDGET).contains(&elapsed),
            "gave up after {elapsed:?}"
        );
        assert!(d.is_degraded());
        // Every wait is at most 10 ms, so calls start at or before 0, 10, 20,
        // 30 and 40 ms: at least 5. Waits are uniform in [0, 10 ms]: 40 calls
        // within 50 ms would need 39 waits averaging under 1.3 ms (odds below
        // 1e-15), so the retries are paced, not a busy loop.
        let calls = store.calls() - before;
        assert!((5..=40).contains(&calls), "{calls} calls in one budget");
    }
}

#[tokio::test(start_paused = true)]
async fn the_breaker_opens_skips_the_store_and_recovers() {
    let (store, clock, builder) = setup();
    let transitions = Arc::new(Mutex::new(Vec::new()));
    let log = transitions.clone();
    let limiter = builder
        .breaker(
            BreakerConfig::default()
                .consecutive_failures(3)
                .without_failure_ratio()
                .cooldown(Duration::from_secs(2))
                .on_state_change(move |from, to| log.lock().unwrap().push((from, to))),
        )
        .fallback(FailOpen)
        .build();
    assert_eq!(limiter.breaker_state(), Some(BreakerState::Closed));
    store.set(Mode::Fail(StoreErrorKind::Unavailable));
    for _ in 0..3 {
        let d = limiter.check(&key(), 1).await.unwrap();
        assert_eq!(d.source(), fallback(FallbackReason::Unavailable));
    }
    assert_eq!(limiter.breaker_state(), Some(BreakerState::Open));
    assert_eq!(store.calls(), 3);

    // Open: straight to the fallback, no store call, no waiting.
    store.set(Mode::Hang);
    for _ in 0..100 {
        let start = Instant::now();
        let d = limiter.check(&key(), 1).await.unwrap();
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert_eq!(d.source(), fallback(FallbackReason::CircuitOpen));
    }
    assert_eq!(store.calls(), 3);
    clock.advance(Duration::from_millis(1_999));
    limiter.check(&key(), 1).await.unwrap();
    assert_eq!(store.calls(), 3);

    // Half-open: one probe; it fails, the breaker opens again.
    clock.advance(Duration::from_millis(1));
    store.set(Mode::Fail(StoreErrorKind::Unavailable));
    let d = limiter.check(&key(), 1).await.unwrap();
    assert_eq!(d.source(), fallback(FallbackReason::Unavailable));
    assert_eq!(store.calls(), 4);
    assert_eq!(limiter.breaker_state(), Some(BreakerState::Open));
    limiter.check(&key(), 1).await.unwrap();
    assert_eq!(store.calls(), 4);

    // After another cooldown a successful probe closes it.
    clock.advance(Duration::from_secs(2));
    store.set(Mode::Allow);
    let d = limiter.check(&key(), 1).await.unwrap();
    assert_eq!(d.source(), DecisionSource::Store);
    assert_eq!(limiter.breaker_state(), Some(BreakerState::Closed));
    for _ in 0..5 {
        limiter.check(&key(), 1).await.unwrap();
    }
    assert_eq!(store.calls(), 10);

    use BreakerState::{Closed, HalfOpen, Open};
    assert_eq!(
        *transitions.lock().unwrap(),
        vec![
            (Closed, Open),
            (Open, HalfOpen),
            (HalfOpen, Open),
            (Open, HalfOpen),
            (HalfOpen, Closed)
        ]
    );
    // 100 while open, one at 1.999 s, one after the failed probe.
    assert_eq!(limiter.stats().fallback(FallbackReason::CircuitOpen), 102);
}

#[tokio::test(start_paused = true)]
async fn the_breaker_opens_on_timeouts_and_on_a_failure_ratio() {
    let (store, _clock, builder) = setup();
    let limiter = builder
        .breaker(
            BreakerConfig::default()
                .consecutive_failures(0)
                .failure_ratio(0.5, Duration::from_secs(10), 10),
        )
        .fallback(FailOpen)
        .build();
    // Alternate success and timeout: 50 % failures once 10 calls are in.
    for i in 0..10 {
        store.set(if i % 2 == 0 { Mode::Allow } else { Mode::Hang });
        limiter.check(&key(), 1).await.unwrap();
    }
    assert_eq!(limiter.breaker_state(), Some(BreakerState::Open));
    let d = limiter.check(&key(), 1).await.unwrap();
    assert_eq!(d.source(), fallback(FallbackReason::CircuitOpen));
    assert_eq!(store.calls(), 10);
}

#[tokio::test(start_paused = true)]
async fn half_open_lets_only_a_few_probes_through() {
    let (store, clock, builder) = setup();
    let limiter = builder
        .timeout(Duration::from_secs(1))
        .breaker(
            BreakerConfig::default()
                .consecutive_failures(1)
                .cooldown(Duration::from_secs(1))
                .half_open_probes(2),
        )
        .fallback(FailOpen)
        .build();
    store.set(Mode::Fail(StoreErrorKind::Unavailable));
    limiter.check(&key(), 1).await.unwrap();
    assert_eq!(limiter.breaker_state(), Some(BreakerState::Open));
    clock.advance(Duration::from_secs(1));
    // Two probes hang in the store; a third check must not reach it.
    store.set(Mode::Hang);
    let probes: Vec<_> = (0..2)
        .map(|_| {
            let limiter = limiter.clone();
            tokio::spawn(async move { limiter.check(&key(), 1).await.unwrap() })
        })
        .collect();
    until("both probes reach the store", || store.calls() >= 3).await;
    let d = limiter.check(&key(), 1).await.unwrap();
    assert_eq!(d.source(), fallback(FallbackReason::CircuitOpen));
    assert_eq!(store.calls(), 3);
    for probe in probes {
        let d = probe.await.unwrap();
        assert_eq!(d.source(), fallback(FallbackReason::Timeout));
    }
    assert_eq!(limiter.breaker_state(), Some(BreakerState::Open));
}

/// A store of two shards (subjects `a-*` on shard 0, the rest on shard 1)
/// whose shard 0 can be made to fail; counts the calls per shard.
#[derive(Clone, Default)]
struct TwoShards {
    shard0_down: Arc<std::sync::atomic::AtomicBool>,
    calls: Arc<[AtomicUsize; 2]>,
}

impl TwoShards {
    fn shard_of(key: &WindowKey) -> u16 {
        u16::from(!key.subject().starts_with(b"a-"))
    }

    fn calls(&self, shard: usize) -> usize {
        self.calls[shard].load(Ordering::SeqCst)
    }
}

impl limit::Backend for TwoShards {
    fn check<'a>(
        &'a self,
        guard: &mut Guard<'a>,
        request: CheckRequest<'a>,
    ) -> Op<'static, Decision> {
        let (this, key, quota) = (
            self.clone(),
            request.key.clone(),
            request.policy.first().clone(),
        );
        guard.run(move || {
            let shard = Self::shard_of(&key);
            this.calls[usize::from(shard)].fetch_add(1, Ordering::SeqCst);
            let down = shard == 0 && this.shard0_down.load(Ordering::SeqCst);
            let quota = quota.clone();
            async move {
                if down {
                    Err(StoreError::new(StoreErrorKind::Unavailable, "shard down"))
                } else {
                    Ok(Decision::allow(quota, 1, Duration::from_secs(1)))
                }
            }
        })
    }

    fn failure_domain(&self, key: &WindowKey, _policy: &Policy) -> Option<u16> {
        Some(Self::shard_of(key))
    }
}

#[tokio::test(start_paused = true)]
async fn one_failing_shard_opens_only_its_own_breaker() {
    let clock = ManualClock::new(T0);
    let store = TwoShards::default();
    // The default breaker: 5 consecutive failures, or 50 % of 20 calls.
    let shards = networked(store.clone(), &clock)
        .retry(RetryConfig::none())
        .build();
    let limiter = Limiter::builder(shards, "1000/1s".parse::<Quota>().unwrap())
        .local_capacity(0)
        .fallback(FailClosed::default())
        .build();
    let down = |i: usize| WindowKey::for_subject(format!("a-{i}"));
    let up = |i: usize| WindowKey::for_subject(format!("b-{i}"));
    for i in 0..4 {
        assert_eq!(
            limiter.check(&down(i), 1).await.unwrap().source(),
            DecisionSource::Store
        );
    }
    assert_eq!(limiter.open_breakers(), 0);

    // Two thirds of the traffic on the failing shard: one store-wide
    // breaker would open on the failure ratio and take shard 1 down too.
    store.shard0_down.store(true, Ordering::SeqCst);
    let before = store.calls(0);
    for i in 0..40 {
        for j in 0..2 {
            let d = limiter.check(&down(i * 2 + j), 1).await.unwrap();
            assert!(d.is_degraded() && !d.allowed(), "{d:?}");
        }
        let d = limiter.check(&up(i), 1).await.unwrap();
        assert_eq!(
            d.source(),
            DecisionSource::Store,
            "healthy shard, round {i}"
        );
        assert!(d.allowed());
    }
    // Shard 0's breaker opened after its 5th failure in a row and the
    // store never saw shard 0 again.
    assert_eq!(store.calls(0) - before, 5);
    assert_eq!(store.calls(1), 40);
    assert_eq!(limiter.open_breakers(), 1);
    assert_eq!(limiter.breaker_state(), Some(BreakerState::Open), "worst");
    assert_eq!(
        limiter.breaker_state_for(&down(0)),
        Some(BreakerState::Open)
    );
    assert_eq!(
        limiter.breaker_state_for(&up(0)),
        Some(BreakerState::Closed)
    );
    assert_eq!(
        limiter.check(&down(0), 1).await.unwrap().source(),
        fallback(FallbackReason::CircuitOpen)
    );
    assert_eq!(store.calls(0) - before, 5);

    // Shard 0 heals: after the default cooldown (1 s), not before, one
    // probe closes it.
    store.shard0_down.store(false, Ordering::SeqCst);
    clock.advance(Duration::from_millis(999));
    assert_eq!(
        limiter.check(&down(0), 1).await.unwrap().source(),
        fallback(FallbackReason::CircuitOpen)
    );
    assert_eq!(store.calls(0) - before, 5, "no probe before the cooldown");
    clock.advance(Duration::from_millis(1));
    assert_eq!(
        limiter.check(&down(0), 1).await.unwrap().source(),
        DecisionSource::Store
    );
    assert_eq!(limiter.open_breakers(), 0);
    assert_eq!(limiter.breaker_state(), Some(BreakerState::Closed));
}

#[tokio::test(start_paused = true)]
async fn an_unsharded_store_has_one_breaker() {
    let (store, _clock, builder) = setup();
    let limiter = builder
        .breaker(BreakerConfig::default().consecutive_failures(2))
        .fallback(FailOpen)
        .build();
    store.set(Mode::Fail(StoreErrorKind::Unavailable));
    for i in 0..2 {
        limiter
            .check(&WindowKey::for_subject(format!("k{i}")), 1)
            .await
            .unwrap();
    }
    assert_eq!(limiter.open_breakers(), 1);
    // Every key shares it.
    let other = WindowKey::for_subject("never-checked");
    assert_eq!(limiter.breaker_state_for(&other), Some(BreakerState::Open));
    assert_eq!(
        limiter.check(&other, 1).await.unwrap().source(),
        fallback(FallbackReason::CircuitOpen)
    );
    assert_eq!(store.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_in_flight_bound_takes_the_overloaded_path() {
    let (store, _clock, builder) = setup();
    store.set(Mode::Hang);
    let limiter = builder
        .max_in_flight(2)
        .fallback(FailClosed::default())
        .build();
    let hung: Vec<_> = (0..2)
        .map(|_| {
            let limiter = limiter.clone();
            tokio::spawn(async move { limiter.check(&key(), 1).await.unwrap() })
        })
        .collect();
    until("two calls reach the store", || store.calls() >= 2).await;
    let start = Instant::now();
    let d = limiter.check(&key(), 1).await.unwrap();
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert!(!d.allowed());
    assert_eq!(d.source(), fallback(FallbackReason::Overloaded));
    assert_eq!(store.calls(), 2, "no store call beyond the bound");
    for task in hung {
        assert_eq!(
            task.await.unwrap().source(),
            fallback(FallbackReason::Timeout)
        );
    }
    // The slots are free again.
    store.set(Mode::Allow);
    assert_eq!(
        limiter.check(&key(), 1).await.unwrap().source(),
        DecisionSource::Store
    );

    // Without a fallback, the caller sees an Overloaded error.
    let (store, _clock, builder) = setup();
    store.set(Mode::Hang);
    let limiter = builder.max_in_flight(1).build();
    let hung = {
        let limiter = limiter.clone();
        tokio::spawn(async move { limiter.check(&key(), 1).await })
    };
    until("the hung call reaches the store", || store.calls() >= 1).await;
    match limiter.check(&key(), 1).await {
        Err(LimitError::Store(e)) => assert_eq!(e.kind(), StoreErrorKind::Overloaded),
        other => panic!("expected Overloaded, got {other:?}"),
    }
    assert!(hung.await.unwrap().is_err());
}

#[tokio::test(start_paused = true)]
async fn the_local_tier_answers_a_denied_key_until_retry_after() {
    let (store, clock, builder) = setup();
    let limiter = builder.local_capacity(1_000).build();
    // Long enough that the cache's own real-time expiry (which only frees
    // memory) cannot interfere on a slow machine.
    store.set(Mode::Deny(Duration::from_secs(30)));
    let d = limiter.check(&key(), 1).await.unwrap();
    assert!(!d.allowed());
    assert_eq!(d.source(), DecisionSource::Store);
    assert_eq!(store.calls(), 1);

    for i in 0..100u64 {
        clock.set(T0 + i * 2_000);
        let d = limiter.check(&key(), 1).await.unwrap();
        assert!(!d.allowed());
        assert_eq!(d.source(), DecisionSource::LocalCache);
        assert_eq!(
            d.retry_after(),
            Some(Duration::from_micros(30_000_000 - i * 2_000))
        );
        assert_eq!(d.timestamp_micros(), T0 + i * 2_000);
    }
    assert_eq!(store.calls(), 1, "the store saw one call");
    // A larger cost is denied locally too; other keys go to the store.
    assert_eq!(
        limiter.check(&key(), 5).await.unwrap().source(),
        DecisionSource::LocalCache
    );
    limiter
        .check(&WindowKey::for_subject("bob"), 1)
        .await
        .unwrap();
    assert_eq!(store.calls(), 2);

    clock.set(T0 + 29_999_999);
    limiter.check(&key(), 1).await.unwrap();
    assert_eq!(store.calls(), 2);
    clock.set(T0 + 30_000_000);
    store.set(Mode::Allow);
    let d = limiter.check(&key(), 1).await.unwrap();
    assert!(d.allowed());
    assert_eq!(d.source(), DecisionSource::Store);
    assert_eq!(store.calls(), 3);
    let d = limiter.check(&key(), 1).await.unwrap();
    assert_eq!(d.source(), DecisionSource::Store);
    let stats = limiter.stats();
    assert_eq!((stats.store, stats.local_cache), (4, 102));
}

#[tokio::test(start_paused = true)]
async fn the_local_tier_is_bypassed_for_cheaper_requests_and_never_admits() {
    let (store, _clock, builder) = setup();
    let limiter = builder.local_capacity(1_000).build();
    store.set(Mode::Deny(Duration::from_secs(60)));
    limiter.check(&key(), 4).await.unwrap();
    store.set(Mode::Allow);
    // Cost 1 might fit already: the store decides.
    let d = limiter.check(&key(), 1).await.unwrap();
    assert_eq!(d.source(), DecisionSource::Store);
    assert!(d.allowed());
    // Cost 4 is still remembered as denied, even though the store would now
    // admit it: the tier only repeats a denial for its retry_after.
    let d = limiter.check(&key(), 4).await.unwrap();
    assert!(!d.allowed());
    assert_eq!(d.source(), DecisionSource::LocalCache);
    assert_eq!(store.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_local_tier_stays_within_its_capacity() {
    let (store, _clock, builder) = setup();
    let limiter = builder.local_capacity(1_000).build();
    store.set(Mode::Deny(Duration::from_secs(60)));
    // The flood: a million distinct denied keys.
    for i in 0..1_000_000u32 {
        let key = WindowKey::for_subject(i.to_string());
        let d = limiter.check(&key, 1).await.unwrap();
        assert!(!d.allowed());
    }
    assert_eq!(store.calls(), 1_000_000);
    let len = limiter.local_cache_len();
    // At capacity, not over it, and not thrown away wholesale.
    assert!((900..=1_000).contains(&len), "{len} entries");
}

#[tokio::test(start_paused = true)]
async fn local_window_admits_a_share_per_window() {
    let (store, clock, builder) = setup();
    // 10 per second, 30 % on this node: ceil(3.0) = 3 per second.
    let limiter = builder.fallback(LocalWindow::new(0.3).unwrap()).build();
    store.set(Mode::Fail(StoreErrorKind::Unavailable));
    for second in 0..3u64 {
        clock.set(T0 + second * 1_000_000);
        let mut admitted = 0;
        for _ in 0..10 {
            let d = limiter.check(&key(), 1).await.unwrap();
            assert_eq!(d.source(), fallback(FallbackReason::Unavailable));
            assert_eq!(*d.quota(), quota(), "reported against the caller's quota");
            admitted += u32::from(d.allowed());
        }
        assert_eq!(admitted, 3, "second {second}");
    }
    // Keys are separate.
    assert!(limiter
        .check(&WindowKey::for_subject("bob"), 1)
        .await
        .unwrap()
        .allowed());
}

#[tokio::test(start_paused = true)]
async fn local_window_per_node_rounds_up_and_keeps_the_algorithm() {
    let (store, clock, builder) = setup();
    let gcra: Policy = "7/1s gcra".parse::<Quota>().unwrap().into();
    let limiter = builder
        .fallback(LocalWindow::per_node(NonZeroU32::new(3).unwrap()))
        .breaker(BreakerConfig::default().consecutive_failures(1))
        .build();
    store.set(Mode::Fail(StoreErrorKind::Unavailable));
    // ceil(7 / 3) = 3 at once, then one per ceil(1 s / 3).
    let mut admitted = 0;
    for _ in 0..10 {
        let d = limiter.check_policy(&key(), &gcra, 1).await.unwrap();
        admitted += u32::from(d.allowed());
    }
    assert_eq!(admitted, 3);
    clock.advance(Duration::from_micros(333_334));
    assert!(limiter
        .check_policy(&key(), &gcra, 1)
        .await
        .unwrap()
        .allowed());
    assert!(!limiter
        .check_policy(&key(), &gcra, 1)
        .await
        .unwrap()
        .allowed());
    // The breaker opened after the first failure; the rest never hit the store.
    assert_eq!(store.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn builder_defaults_work_end_to_end() {
    let clock = ManualClock::new(T0);
    let store = TestStore::new(&clock);
    let limiter = Limiter::builder(networked(store.clone(), &clock).build(), quota())
        .fallback(FailOpen)
        .build();
    assert_eq!(limiter.breaker_state(), Some(BreakerState::Closed));
    assert_eq!(
        limiter.check(&key(), 1).await.unwrap().source(),
        DecisionSource::Store
    );
    store.set(Mode::Hang);
    let start = Instant::now();
    let d = limiter.check(&key(), 1).await.unwrap();
    assert_eq!(d.source(), fallback(FallbackReason::Timeout));
    assert_eq!(start.elapsed(), StoreBuilder::DEFAULT_TIMEOUT);
    // Five consecutive failures open the default breaker.
    for _ in 0..4 {
        limiter.check(&key(), 1).await.unwrap();
    }
    assert_eq!(limiter.breaker_state(), Some(BreakerState::Open));
    assert_eq!(store.calls(), 6);
    let d = limiter.check(&key(), 1).await.unwrap();
    assert_eq!(d.source(), fallback(FallbackReason::CircuitOpen));
    assert_eq!(store.calls(), 6);
}

#[tokio::test]
async fn limiter_futures_are_send_and_the_limiter_is_shareable() {
    fn assert_send<T: Send>(_: &T) {}
    fn assert_sync<T: Send + Sync + Clone + 'static>() {}
    assert_sync::<Limiter>();
    let (_store, _clock, builder) = setup();
    let limiter = builder.build();
    let key = key();
    let fut = limiter.check(&key, 1);
    assert_send(&fut);
    fut.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn cancelled_and_timed_out_checks_leave_nothing_behind() {
    let (store, clock, builder) = setup();
    store.set(Mode::Hang);
    let limiter = builder
        .max_in_flight(1)
        .breaker(
            BreakerConfig::default()
                .consecutive_failures(1)
                .cooldown(Duration::from_secs(1)),
        )
        .fallback(FailOpen)
        .build();
    // Timed-out store calls are dropped, not left running.
    for _ in 0..10 {
        limiter.check(&key(), 1).await.unwrap();
        clock.advance(Duration::from_secs(1));
    }
    assert_eq!(
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks(),
        0
    );

    // A caller that gives up mid-call (here: a half-open probe) frees its
    // in-flight slot and its probe slot.
    assert_eq!(limiter.breaker_state(), Some(BreakerState::Open));
    clock.advance(Duration::from_secs(1));
    let calls = store.calls();
    let probe = {
        let limiter = limiter.clone();
        tokio::spawn(async move { limiter.check(&key(), 1).await })
    };
    until("the probe reaches the store", || store.calls() != calls).await;
    assert_eq!(limiter.breaker_state(), Some(BreakerState::HalfOpen));
    probe.abort();
    assert!(probe.await.unwrap_err().is_cancelled());
    store.set(Mode::Allow);
    let d = limiter.check(&key(), 1).await.unwrap();
    assert_eq!(d.source(), DecisionSource::Store, "slots were released");
    assert_eq!(limiter.breaker_state(), Some(BreakerState::Closed));
}

#[tokio::test(start_paused = true)]
async fn extreme_settings_do_not_panic() {
    let (store, _clock, builder) = setup();
    let limiter = builder
        .timeout(Duration::MAX)
        .retry(
            RetryConfig::default()
                .max_retries(3)
                .delays(Duration::MAX, Duration::MAX),
        )
        .breaker(
            BreakerConfig::default()
                .consecutive_failures(1)
                .cooldown(Duration::MAX),
        )
        .local_capacity(1)
        .fallback(FailOpen)
        .build();
    store.set(Mode::Deny(Duration::MAX));
    assert!(!limiter.check(&key(), u32::MAX).await.unwrap().allowed());
    assert!(!limiter.check(&key(), u32::MAX).await.unwrap().allowed());
    store.set(Mode::Fail(StoreErrorKind::Unavailable));
    let d = limiter
        .check(&WindowKey::for_subject("x"), 1)
        .await
        .unwrap();
    assert_eq!(d.source(), fallback(FallbackReason::Unavailable));
    let d = limiter
        .check(&WindowKey::for_subject("x"), 1)
        .await
        .unwrap();
    assert_eq!(d.source(), fallback(FallbackReason::CircuitOpen));
}
