//! [`Limiter`]: the engine behind the layer, usable on its own.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use futures_util::future::BoxFuture;
use tracing::field::Empty;
use tracing::Instrument;

use crate::fallback::{FallbackPolicy, FallbackRequest};
use crate::limiter::breaker::{Breaker, BreakerState, Breakers, Ticket};
use crate::limiter::local::{LocalTier, Lookup};
use crate::limiter::resilience::Resilience;
use crate::metrics::{LimiterMetrics, MetricParts, StoreTimer};
use crate::store::{CheckRequest, Store, StoreError, StoreErrorKind};
use crate::{Clock, Decision, DecisionSource, FallbackReason, Policy, SystemClock, WindowKey};

pub(crate) mod breaker;
mod builder;
mod check;
pub(crate) mod lease;
pub(crate) mod local;
mod peek;
pub(crate) mod resilience;

pub use builder::LimiterBuilder;
pub use check::Check;
pub use lease::{LeaseConfig, LeaseStats};

/// Checks keys against a [`Policy`] (one or more quotas) in a store.
///
/// Cheap to clone; all clones share one store and one configuration, so every
/// clone of a layer or service limits together.
///
/// [`Limiter::new`] makes a bare limiter: every check is one store call and a
/// store error is returned as an error. [`Limiter::builder`] adds the
/// resilience a cluster needs: a local tier of recent denials, a time budget
/// with retries, a circuit breaker, a bound on calls in flight, and a
/// [`FallbackPolicy`] that answers when the store cannot.
///
/// ```
/// use tower_window::{Limiter, MemoryStore, Quota, WindowKey};
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let limiter = Limiter::new(MemoryStore::new(), "2/1m".parse::<Quota>()?);
/// let key = WindowKey::for_subject("alice");
/// assert!(limiter.check(&key, 1).await?.allowed);
/// assert!(limiter.check(&key, 1).await?.allowed);
/// let third = limiter.check(&key, 1).await?;
/// assert!(!third.allowed);
/// assert!(third.retry_after.is_some());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Clone)]
pub struct Limiter {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn Store>,
    policy: Policy,
    clock: Arc<dyn Clock>,
    local: Option<LocalTier>,
    /// Quota leases per key (`None`: off, and checks never look for one).
    leases: Option<lease::LeaseTier>,
    fallback: Option<Box<dyn FallbackPolicy>>,
    breaker: Option<Breakers>,
    resilience: Resilience,
    stats: Counters,
    metrics: Arc<LimiterMetrics>,
}

impl Limiter {
    /// A bare limiter enforcing `policy` (or one [`Quota`](crate::Quota))
    /// in `store`: no local tier, no timeout, retries, breaker or fallback.
    /// Works on any executor.
    pub fn new(store: impl Store, policy: impl Into<Policy>) -> Self {
        Self::from_shared_store(Arc::new(store), policy)
    }

    /// A bare limiter over a store shared with other limiters.
    pub fn from_shared_store(store: Arc<dyn Store>, policy: impl Into<Policy>) -> Self {
        let policy = policy.into();
        let metrics = Arc::new(LimiterMetrics::new(
            policy.first(),
            false,
            MetricParts::default(),
        ));
        Self {
            inner: Arc::new(Inner {
                metrics,
                store,
                policy,
                clock: Arc::new(SystemClock),
                local: None,
                leases: None,
                fallback: None,
                breaker: None,
                resilience: Resilience::bare(),
                stats: Counters::default(),
            }),
        }
    }

    /// A builder for a limiter with a local tier, a time budget, retries, a
    /// circuit breaker, an in-flight bound and (optionally) a fallback.
    ///
    /// A store shared with other limiters can be passed as an
    /// `Arc<dyn Store>` (which is a [`Store`] too).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_window::fallback::LocalWindow;
    /// use tower_window::{BreakerConfig, Limiter, MemoryStore, Quota};
    ///
    /// let limiter = Limiter::builder(MemoryStore::new(), "100/1m".parse::<Quota>()?)
    ///     .local_capacity(10_000)
    ///     .fallback(LocalWindow::new(0.25).expect("a share in (0, 1]"))
    ///     .timeout(Duration::from_millis(20))
    ///     .breaker(BreakerConfig::default().cooldown(Duration::from_secs(1)))
    ///     .max_in_flight(256)
    ///     .build();
    /// # let _ = limiter;
    /// # Ok::<(), tower_window::QuotaError>(())
    /// ```
    pub fn builder(store: impl Store, policy: impl Into<Policy>) -> LimiterBuilder {
        LimiterBuilder::new(Arc::new(store), policy.into())
    }

    /// The policy this limiter enforces.
    pub fn policy(&self) -> &Policy {
        &self.inner.policy
    }

    /// The store every check goes to.
    pub(crate) fn store(&self) -> &dyn Store {
        &*self.inner.store
    }

    /// Whether the limiter keeps circuit breakers.
    pub(crate) fn has_breaker(&self) -> bool {
        self.inner.breaker.is_some()
    }

    /// Checks `cost` units for `key` against every quota of the limiter's
    /// policy, and records them in every quota if all admit. A denial
    /// consumes nothing in any quota.
    ///
    /// With a fallback policy, a store failure yields `Ok` with a degraded
    /// decision (`source = Fallback(reason)`); without one, an error.
    pub fn check<'a>(&'a self, key: &'a WindowKey, cost: u32) -> Check<'a> {
        Check::new(self, key, &self.inner.policy, cost)
    }

    /// Like [`check`](Self::check), against another policy in the same
    /// store (a tenant's own, say), with the same local tier, breakers and
    /// fallback.
    ///
    /// Each check runs in a `tower_window.check` span at debug level with
    /// the policy's name and the cost, and records `quota` (the deciding
    /// one), `outcome`, `source`, `remaining` and `duration_us` when it ends
    /// (never the key), and is counted in the [metrics](crate::metrics).
    pub fn check_policy<'a>(
        &'a self,
        key: &'a WindowKey,
        policy: &'a Policy,
        cost: u32,
    ) -> Check<'a> {
        Check::new(self, key, policy, cost)
    }

    /// What [`Check`] awaits when [`check_policy_sync`](Self::check_policy_sync)
    /// cannot decide at once.
    async fn check_policy_async(
        &self,
        key: &WindowKey,
        policy: &Policy,
        cost: u32,
    ) -> Result<Decision, LimitError> {
        if cost == 0 {
            return Err(LimitError::ZeroCost);
        }
        let span = tracing::debug_span!(
            "tower_window.check",
            policy = policy.name(),
            quota = Empty,
            cost,
            outcome = Empty,
            source = Empty,
            remaining = Empty,
            duration_us = Empty,
        );
        let started = (!span.is_disabled()).then(std::time::Instant::now);
        // Without a subscriber for the span, skip entering it on every poll.
        let result = if started.is_some() {
            self.decide(key, policy, cost)
                .instrument(span.clone())
                .await
        } else {
            self.decide(key, policy, cost).await
        };
        // A denial names its policy (problem bodies say which one denied).
        let result = result.map(|decision| decision.record_denial_policy(policy));
        if let Ok(decision) = &result {
            self.inner.metrics.decision(key, decision);
        }
        if let Some(started) = started {
            match &result {
                Ok(decision) => {
                    span.record(
                        "outcome",
                        if decision.allowed {
                            "allowed"
                        } else {
                            "denied"
                        },
                    );
                    span.record("source", decision.source.as_str());
                    span.record("quota", decision.quota().name());
                    span.record("remaining", decision.remaining);
                }
                Err(_) => {
                    span.record("outcome", "error");
                }
            }
            let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
            span.record("duration_us", micros);
        }
        result
    }

    /// Decides at once, without a future, when no I/O is needed: the
    /// store decides in-process ([`Store::decides_in_process`], e.g.
    /// [`MemoryStore`](crate::MemoryStore)). Returns `None` otherwise, and
    /// then nothing has been checked or charged: call
    /// [`check`](Self::check).
    ///
    /// This is the per-message path of a WebSocket loop or the layer on the
    /// embedded store: it decides exactly as `check` would (local tier,
    /// store, fallback; metrics recorded) but skips the future. It also
    /// answers `None` while a subscriber wants the `tower_window.check`
    /// span, which `check` records.
    ///
    /// ```
    /// use tower_window::{Limiter, MemoryStore, Quota, WindowKey};
    ///
    /// let limiter = Limiter::new(MemoryStore::new(), "1/1m".parse::<Quota>()?);
    /// let key = WindowKey::for_subject("alice");
    /// let first = limiter.check_sync(&key, 1).expect("in-process").expect("decided");
    /// assert!(first.allowed);
    /// let second = limiter.check_sync(&key, 1).expect("in-process").expect("decided");
    /// assert!(!second.allowed);
    /// # Ok::<(), tower_window::QuotaError>(())
    /// ```
    pub fn check_sync(&self, key: &WindowKey, cost: u32) -> Option<Result<Decision, LimitError>> {
        self.check_policy_sync(key, &self.inner.policy, cost)
    }

    /// Like [`check_sync`](Self::check_sync), against another policy in the
    /// same store (see [`check_policy`](Self::check_policy)).
    pub fn check_policy_sync(
        &self,
        key: &WindowKey,
        policy: &Policy,
        cost: u32,
    ) -> Option<Result<Decision, LimitError>> {
        match self.poll_in_process(key, policy, cost) {
            Poll::Ready(result) => Some(result),
            Poll::Pending => None,
        }
    }

    /// [`check_policy_sync`](Self::check_policy_sync) as [`Check`]'s first
    /// poll wants it: `Pending` (before anything is charged) where that
    /// answers `None`. Returning the poll itself saves `Check` moving the
    /// 112-byte decision out of an `Option`.
    pub(crate) fn poll_in_process(
        &self,
        key: &WindowKey,
        policy: &Policy,
        cost: u32,
    ) -> Poll<Result<Decision, LimitError>> {
        if !self.inner.store.decides_in_process() {
            return Poll::Pending;
        }
        if cost == 0 {
            return Poll::Ready(Err(LimitError::ZeroCost));
        }
        if tracing::enabled!(target: "tower_window::limiter", tracing::Level::DEBUG) {
            // The span belongs to `check`.
            return Poll::Pending;
        }
        if let Some(leases) = &self.inner.leases {
            // Leases are reserved and refunded through the time budget,
            // which needs the async path.
            if leases.applies(policy) {
                return Poll::Pending;
            }
        }
        let result = self
            .decide_in_process(key, policy, cost)
            .map(|result| result.map(|decision| decision.record_denial_policy(policy)));
        if let Poll::Ready(Ok(decision)) = &result {
            self.inner.metrics.decision(key, decision);
        }
        result
    }

    /// [`decide`](Self::decide) without a future, for an in-process store:
    /// `Pending` (before anything is charged) if some step would have to
    /// wait.
    fn decide_in_process(
        &self,
        key: &WindowKey,
        policy: &Policy,
        cost: u32,
    ) -> Poll<Result<Decision, LimitError>> {
        let inner = &*self.inner;
        let mut stale = false;
        if let Some(local) = &inner.local {
            match local.lookup(key, policy, cost) {
                Lookup::Hit(decision) => {
                    inner.stats.local_cache.fetch_add(1, Ordering::Relaxed);
                    return Poll::Ready(Ok(decision));
                }
                Lookup::Miss { stale: s } => stale = s,
            }
        }
        let breaker = inner
            .breaker
            .as_ref()
            .map(|breakers| breakers.get(inner.store.failure_domain(key, policy)));
        let mut guard = TicketGuard {
            breaker,
            ticket: None,
        };
        if let Some(breaker) = breaker {
            // An open breaker sends the check to the fallback, which may
            // wait: leave that to `check`.
            let Some(ticket) = breaker.acquire() else {
                return Poll::Pending;
            };
            guard.ticket = Some(ticket);
        }
        let quota = policy.first();
        let timer = StoreTimer::start(false);
        // Matched in place, not moved through helpers: a `Decision` is
        // 112 bytes, and each copy of one just written costs a
        // store-forwarding stall.
        let Some(result) = inner.store.check_sync(CheckRequest::new(key, policy, cost)) else {
            return Poll::Pending;
        };
        match result {
            Ok(decision) => {
                inner.metrics.store_call(quota, timer, None);
                // An in-process call has no latency worth a slow-call trip.
                guard.success(Duration::ZERO);
                self.note_stored(key, policy, cost, stale, &decision);
                Poll::Ready(Ok(decision))
            }
            Err(error) => {
                inner.metrics.store_call(quota, timer, Some(&error));
                let failure = Failure {
                    reason: reason_for(&error),
                    error: Some(error),
                };
                let Some(fallback) = &inner.fallback else {
                    guard.failure_for(failure.error.as_ref());
                    inner.stats.errors.fetch_add(1, Ordering::Relaxed);
                    return Poll::Ready(Err(LimitError::Store(failure.into_error())));
                };
                let now = inner.clock.now_micros();
                let request = FallbackRequest::new(key, policy, cost, failure.reason, now)
                    .with_error(failure.error.as_ref());
                let mut future = fallback.decide(request);
                let mut cx = Context::from_waker(Waker::noop());
                // A fallback that must wait: the guard releases the ticket
                // unreported and `check` tries again from the start.
                let Poll::Ready(decision) = future.as_mut().poll(&mut cx) else {
                    return Poll::Pending;
                };
                guard.failure_for(failure.error.as_ref());
                Poll::Ready(Ok(self.degraded(decision, failure.reason, now)))
            }
        }
    }

    /// Bookkeeping after the store decided: counts it and updates the local
    /// tier (remembers a denial; drops a stale one after an admission).
    fn note_stored(
        &self,
        key: &WindowKey,
        policy: &Policy,
        cost: u32,
        stale: bool,
        decision: &Decision,
    ) {
        let inner = &*self.inner;
        inner.stats.store.fetch_add(1, Ordering::Relaxed);
        if let Some(local) = &inner.local {
            if !decision.allowed {
                local.remember(key, policy, cost, decision);
            } else if stale {
                local.forget(key, policy);
            }
        }
    }

    /// A fallback policy's decision, marked degraded and counted.
    fn degraded(&self, mut decision: Decision, reason: FallbackReason, now: u64) -> Decision {
        // No silent success: whatever the policy said, this is degraded.
        decision.source = DecisionSource::Fallback(reason);
        if decision.timestamp_micros == 0 {
            decision.timestamp_micros = now;
        }
        self.inner.stats.fallback[reason_index(reason)].fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            reason = reason.as_str(),
            allowed = decision.allowed,
            "rate-limit decision from the fallback policy"
        );
        decision
    }

    /// The decision itself: local tier, store, fallback.
    async fn decide(
        &self,
        key: &WindowKey,
        policy: &Policy,
        cost: u32,
    ) -> Result<Decision, LimitError> {
        let inner = &*self.inner;
        if let Some(tier) = inner.leases.as_ref().filter(|tier| tier.applies(policy)) {
            return self.decide_leased(tier, key, policy, cost).await;
        }
        let mut stale = false;
        if let Some(local) = &inner.local {
            match local.lookup(key, policy, cost) {
                Lookup::Hit(decision) => {
                    inner.stats.local_cache.fetch_add(1, Ordering::Relaxed);
                    return Ok(decision);
                }
                Lookup::Miss { stale: s } => stale = s,
            }
        }
        match self.check_store(key, policy, cost).await {
            Ok(decision) => {
                self.note_stored(key, policy, cost, stale, &decision);
                Ok(decision)
            }
            Err(failure) => self.fall_back(key, policy, cost, failure).await,
        }
    }

    /// The policy check as one store operation: decided in-process when the
    /// store can (no budget, retries or bound needed), else through the
    /// resilience stack.
    async fn check_store(
        &self,
        key: &WindowKey,
        policy: &Policy,
        cost: u32,
    ) -> Result<Decision, Failure> {
        let inner = &*self.inner;
        let request = CheckRequest::new(key, policy, cost);
        let domain = inner
            .breaker
            .as_ref()
            .and_then(|_| inner.store.failure_domain(key, policy));
        let store = &*inner.store;
        self.run(
            domain,
            policy,
            || store.check_sync(request),
            move || store.check(request),
        )
        .await
    }

    /// Runs one store operation through the limiter's one resilience stack:
    /// the failure domain's circuit breaker, the in-flight bound, the time
    /// budget and the retry policy (retrying only errors where the store
    /// certainly did not apply the operation). `sync` is tried first: an
    /// in-process store answers there and skips budget, retries and bound.
    ///
    /// Every store operation of the engine goes through here, so one set of
    /// breakers and one budget describe the store's health. Our own
    /// overload (the in-flight bound) and invalid requests never count as a
    /// store failure.
    pub(crate) async fn run<'a, T, SyncOp, Op>(
        &'a self,
        domain: Option<u16>,
        policy: &'a Policy,
        sync: SyncOp,
        operation: Op,
    ) -> Result<T, Failure>
    where
        T: Send + 'a,
        SyncOp: FnOnce() -> Option<Result<T, StoreError>>,
        Op: Fn() -> BoxFuture<'a, Result<T, StoreError>> + Send + Sync + 'a,
    {
        let inner = &*self.inner;
        let breaker = inner.breaker.as_ref().map(|breakers| breakers.get(domain));
        let mut guard = TicketGuard {
            breaker,
            ticket: None,
        };
        if let Some(breaker) = breaker {
            match breaker.acquire() {
                Some(ticket) => guard.ticket = Some(ticket),
                None => {
                    return Err(Failure {
                        reason: FallbackReason::CircuitOpen,
                        error: None,
                    })
                }
            }
        }
        let quota = policy.first();
        let timer = StoreTimer::start(!inner.store.decides_in_process());
        let started = inner.clock.now_micros();
        let result = match sync() {
            // Decided in-process: there is nothing to time out, retry or bound.
            Some(result) => result,
            None => {
                // Dropping the guard on this early return frees a half-open
                // probe slot without counting an outcome: the store was not
                // called, and our own overload is not the store's failure.
                let _permit = inner.resilience.try_reserve().map_err(|error| Failure {
                    reason: FallbackReason::Overloaded,
                    error: Some(error),
                })?;
                let metrics = &inner.metrics;
                inner
                    .resilience
                    .call(operation, move || metrics.store_retry(quota))
                    .await
            }
        };
        inner
            .metrics
            .store_call(quota, timer, result.as_ref().err());
        match result {
            Ok(value) => {
                let latency = inner.clock.now_micros().saturating_sub(started);
                guard.success(Duration::from_micros(latency));
                Ok(value)
            }
            Err(error) => {
                // The error's text names no key; the policy name is not secret.
                tracing::warn!(
                    kind = error.kind().as_str(),
                    policy = policy.name(),
                    %error,
                    "rate-limit store call failed"
                );
                guard.failure_for(Some(&error));
                Err(Failure {
                    reason: reason_for(&error),
                    error: Some(error),
                })
            }
        }
    }

    async fn fall_back(
        &self,
        key: &WindowKey,
        policy: &Policy,
        cost: u32,
        failure: Failure,
    ) -> Result<Decision, LimitError> {
        let inner = &*self.inner;
        let Some(fallback) = &inner.fallback else {
            inner.stats.errors.fetch_add(1, Ordering::Relaxed);
            return Err(LimitError::Store(failure.into_error()));
        };
        let now = inner.clock.now_micros();
        let request = FallbackRequest::new(key, policy, cost, failure.reason, now)
            .with_error(failure.error.as_ref());
        let decision = fallback.decide(request).await;
        Ok(self.degraded(decision, failure.reason, now))
    }

    /// The circuit breaker's state, if the limiter has one.
    ///
    /// Over a store of several failure domains ([`Store::failure_domain`],
    /// e.g. a Redis Cluster, one breaker per primary) this is the worst
    /// state over the breakers:
    /// `Open` if any is open, else `HalfOpen` if any is, else `Closed`. See
    /// [`breaker_state_for`](Self::breaker_state_for) and
    /// [`open_breakers`](Self::open_breakers).
    pub fn breaker_state(&self) -> Option<BreakerState> {
        self.inner.breaker.as_ref().map(Breakers::worst)
    }

    /// The state of the breaker guarding `key` under the limiter's policy
    /// (its failure domain's breaker), if the limiter has a breaker. A
    /// domain no check has reached yet is `Closed`.
    pub fn breaker_state_for(&self, key: &WindowKey) -> Option<BreakerState> {
        let breakers = self.inner.breaker.as_ref()?;
        let domain = self.inner.store.failure_domain(key, &self.inner.policy);
        Some(breakers.state_of(domain))
    }

    /// How many of the limiter's circuit breakers are open (not counting
    /// half-open ones): over a store of several failure domains, the
    /// domains whose checks go straight to the fallback; otherwise 0 or 1.
    /// 0 without a breaker.
    pub fn open_breakers(&self) -> usize {
        self.inner.breaker.as_ref().map_or(0, Breakers::open)
    }

    /// Keys currently held by the local tier (0 without one), denials whose
    /// time is over but that nothing has overwritten yet included.
    pub fn local_cache_len(&self) -> u64 {
        self.inner.local.as_ref().map_or(0, LocalTier::len)
    }

    /// Counts of decisions by source since the limiter was built.
    pub fn stats(&self) -> LimiterStats {
        let s = &self.inner.stats;
        LimiterStats {
            store: s.store.load(Ordering::Relaxed),
            local_cache: s.local_cache.load(Ordering::Relaxed),
            lease: s.lease.load(Ordering::Relaxed),
            fallback: REASONS.map(|r| s.fallback[reason_index(r)].load(Ordering::Relaxed)),
            errors: s.errors.load(Ordering::Relaxed),
        }
    }
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = &*self.inner;
        f.debug_struct("Limiter")
            .field("policy", &inner.policy)
            .field(
                "local_capacity",
                &inner.local.as_ref().map(LocalTier::capacity),
            )
            .field("timeout", &inner.resilience.timeout)
            .field("breaker", &self.breaker_state())
            .field("fallback", &inner.fallback.is_some())
            .finish_non_exhaustive()
    }
}

/// Why the store did not decide.
pub(crate) struct Failure {
    pub(crate) reason: FallbackReason,
    pub(crate) error: Option<StoreError>,
}

impl Failure {
    pub(crate) fn into_error(self) -> StoreError {
        self.error.unwrap_or_else(|| match self.reason {
            FallbackReason::CircuitOpen => {
                StoreError::new(StoreErrorKind::Unavailable, "circuit breaker open")
            }
            other => StoreError::new(StoreErrorKind::Unavailable, other.as_str()),
        })
    }
}

fn reason_for(error: &StoreError) -> FallbackReason {
    match error.kind() {
        StoreErrorKind::Unavailable => FallbackReason::Unavailable,
        StoreErrorKind::Timeout => FallbackReason::Timeout,
        StoreErrorKind::Overloaded => FallbackReason::Overloaded,
        _ => FallbackReason::Error,
    }
}

/// Reports a store call's outcome to the breaker exactly once; a call that
/// is dropped (cancelled) reports nothing and frees its probe slot.
struct TicketGuard<'a> {
    breaker: Option<&'a Breaker>,
    ticket: Option<Ticket>,
}

impl TicketGuard<'_> {
    fn success(&mut self, latency: Duration) {
        if let (Some(b), Some(t)) = (self.breaker, self.ticket.take()) {
            b.success(t, latency);
        }
    }

    fn failure(&mut self) {
        if let (Some(b), Some(t)) = (self.breaker, self.ticket.take()) {
            b.failure(t);
        }
    }

    /// Reports a failed call: a store failure, unless `error` is the
    /// caller's fault or our own overload (a pool wait), which say nothing
    /// of the store's health.
    fn failure_for(&mut self, error: Option<&StoreError>) {
        match error.map(StoreError::kind) {
            Some(
                StoreErrorKind::InvalidRequest
                | StoreErrorKind::Unsupported
                | StoreErrorKind::Overloaded,
            ) => self.release(),
            _ => self.failure(),
        }
    }

    fn release(&mut self) {
        if let (Some(b), Some(t)) = (self.breaker, self.ticket.take()) {
            b.release(t);
        }
    }
}

impl Drop for TicketGuard<'_> {
    fn drop(&mut self) {
        self.release();
    }
}

const REASONS: [FallbackReason; 5] = FallbackReason::ALL;

fn reason_index(reason: FallbackReason) -> usize {
    REASONS.iter().position(|r| *r == reason).unwrap_or(4)
}

#[derive(Default)]
struct Counters {
    store: AtomicU64,
    local_cache: AtomicU64,
    lease: AtomicU64,
    fallback: [AtomicU64; 5],
    errors: AtomicU64,
}

/// Counts of a [`Limiter`]'s outcomes since it was built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct LimiterStats {
    /// Decisions made by the store.
    pub store: u64,
    /// Denials answered by the local tier.
    pub local_cache: u64,
    /// Admissions spent from a quota lease this node held (no store call).
    pub lease: u64,
    fallback: [u64; 5],
    /// Checks that returned a store error (no fallback configured).
    pub errors: u64,
}

impl LimiterStats {
    /// Decisions made by the fallback policy for `reason`.
    pub fn fallback(&self, reason: FallbackReason) -> u64 {
        self.fallback[reason_index(reason)]
    }

    /// Decisions made by the fallback policy, for any reason.
    pub fn fallback_total(&self) -> u64 {
        self.fallback.iter().sum()
    }
}

/// Why a [`Limiter`] could not decide.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LimitError {
    /// A request must cost at least one unit.
    #[error("a request must cost at least 1 unit")]
    ZeroCost,
    /// The store failed (or was not called: breaker open, too many calls in
    /// flight) and no fallback policy is configured.
    #[error(transparent)]
    Store(#[from] StoreError),
}
