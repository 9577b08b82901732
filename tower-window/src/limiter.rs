//! [`Limiter`]: the engine behind the layer, usable on its own.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use tracing::field::Empty;
use tracing::Instrument;

use crate::breaker::{Breaker, BreakerConfig, BreakerState, Breakers, Ticket};
use crate::fallback::{FallbackPolicy, FallbackRequest};
use crate::local::{LocalTier, Lookup, DEFAULT_LOCAL_CAPACITY};
use crate::metrics::{LimiterMetrics, MetricParts, StoreTimer};
use crate::resilience::{Resilience, RetryConfig, DEFAULT_MAX_IN_FLIGHT, DEFAULT_TIMEOUT};
use crate::store::{CheckRequest, Store, StoreError, StoreErrorKind};
use crate::{Clock, Decision, DecisionSource, FallbackReason, Quota, SystemClock, WindowKey};
use tokio::sync::Semaphore;

/// Checks keys against a quota in a store.
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
    quota: Quota,
    clock: Arc<dyn Clock>,
    local: Option<LocalTier>,
    fallback: Option<Box<dyn FallbackPolicy>>,
    breaker: Option<Breakers>,
    resilience: Resilience,
    stats: Counters,
    metrics: Arc<LimiterMetrics>,
}

impl Limiter {
    /// A bare limiter enforcing `quota` in `store`: no local tier, no
    /// timeout, retries, breaker or fallback. Works on any executor.
    pub fn new(store: impl Store, quota: Quota) -> Self {
        Self::from_shared_store(Arc::new(store), quota)
    }

    /// A bare limiter over a store shared with other limiters.
    pub fn from_shared_store(store: Arc<dyn Store>, quota: Quota) -> Self {
        let metrics = Arc::new(LimiterMetrics::new(&quota, false, MetricParts::default()));
        Self {
            inner: Arc::new(Inner {
                metrics,
                store,
                quota,
                clock: Arc::new(SystemClock),
                local: None,
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
    /// use tower_window::{BreakerConfig, Limiter, MemoryStore};
    ///
    /// let limiter = Limiter::builder(MemoryStore::new(), "100/1m".parse()?)
    ///     .local_capacity(10_000)
    ///     .fallback(LocalWindow::new(0.25).expect("a share in (0, 1]"))
    ///     .timeout(Duration::from_millis(20))
    ///     .breaker(BreakerConfig::default().cooldown(Duration::from_secs(1)))
    ///     .max_in_flight(256)
    ///     .build();
    /// # let _ = limiter;
    /// # Ok::<(), tower_window::QuotaError>(())
    /// ```
    pub fn builder(store: impl Store, quota: Quota) -> LimiterBuilder {
        LimiterBuilder::new(Arc::new(store), quota)
    }

    /// The quota this limiter enforces.
    pub fn quota(&self) -> &Quota {
        &self.inner.quota
    }

    /// Checks `cost` units for `key` against the limiter's quota, and records
    /// them if admitted. A denial consumes nothing.
    ///
    /// With a fallback policy, a store failure yields `Ok` with a degraded
    /// decision (`source = Fallback(reason)`); without one, an error.
    pub async fn check(&self, key: &WindowKey, cost: u32) -> Result<Decision, LimitError> {
        self.check_quota(key, &self.inner.quota, cost).await
    }

    /// Like [`check`](Self::check), against another quota in the same store.
    ///
    /// Each check runs in a `tower_window.check` span at debug level with
    /// the quota's name and the cost, and records `outcome`, `source`,
    /// `remaining` and `duration_us` when it ends (never the key), and is
    /// counted in the [metrics](crate::metrics).
    pub async fn check_quota(
        &self,
        key: &WindowKey,
        quota: &Quota,
        cost: u32,
    ) -> Result<Decision, LimitError> {
        if cost == 0 {
            return Err(LimitError::ZeroCost);
        }
        let span = tracing::debug_span!(
            "tower_window.check",
            quota = quota.name(),
            cost,
            outcome = Empty,
            source = Empty,
            remaining = Empty,
            duration_us = Empty,
        );
        let started = (!span.is_disabled()).then(std::time::Instant::now);
        // Without a subscriber for the span, skip entering it on every poll.
        let result = if started.is_some() {
            self.decide(key, quota, cost).instrument(span.clone()).await
        } else {
            self.decide(key, quota, cost).await
        };
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

    /// The decision itself: local tier, store, fallback.
    async fn decide(
        &self,
        key: &WindowKey,
        quota: &Quota,
        cost: u32,
    ) -> Result<Decision, LimitError> {
        let inner = &*self.inner;
        let mut stale = false;
        if let Some(local) = &inner.local {
            match local.lookup(key, quota, cost) {
                Lookup::Hit(decision) => {
                    inner.stats.local_cache.fetch_add(1, Ordering::Relaxed);
                    return Ok(decision);
                }
                Lookup::Miss { stale: s } => stale = s,
            }
        }
        match self.call_store(key, quota, cost).await {
            Ok(decision) => {
                inner.stats.store.fetch_add(1, Ordering::Relaxed);
                if let Some(local) = &inner.local {
                    if !decision.allowed {
                        local.remember(key, cost, &decision);
                    } else if stale {
                        local.forget(key, quota);
                    }
                }
                Ok(decision)
            }
            Err(failure) => self.fall_back(key, quota, cost, failure).await,
        }
    }

    /// One store call under the breaker, the in-flight bound, the time
    /// budget and the retry policy.
    async fn call_store(
        &self,
        key: &WindowKey,
        quota: &Quota,
        cost: u32,
    ) -> Result<Decision, Failure> {
        let inner = &*self.inner;
        let request = CheckRequest::new(key, quota, cost);
        // One breaker per failure domain of the store (e.g. cluster slot).
        let breaker = inner
            .breaker
            .as_ref()
            .map(|breakers| breakers.get(inner.store.shard(&request)));
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
        let timer = StoreTimer::start();
        let result = match inner.store.check_sync(request) {
            // Decided in-process: there is nothing to time out, retry or bound.
            Some(result) => result,
            None => {
                // Dropping the guard on this early return frees a half-open
                // probe slot without counting an outcome: the store was not
                // called.
                let _permit = inner.resilience.try_reserve().map_err(|error| Failure {
                    reason: FallbackReason::Overloaded,
                    error: Some(error),
                })?;
                inner
                    .resilience
                    .call(&*inner.store, request, &inner.metrics)
                    .await
            }
        };
        inner
            .metrics
            .store_call(quota, timer, result.as_ref().err());
        match result {
            Ok(decision) => {
                guard.success();
                Ok(decision)
            }
            Err(error) => {
                // The error's text names no key; the quota name is not secret.
                tracing::warn!(
                    kind = error.kind().as_str(),
                    quota = quota.name(),
                    %error,
                    "rate-limit store call failed"
                );
                if error.kind() == StoreErrorKind::InvalidRequest {
                    // The caller's fault, not the store's health.
                    guard.release();
                } else {
                    guard.failure();
                }
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
        quota: &Quota,
        cost: u32,
        failure: Failure,
    ) -> Result<Decision, LimitError> {
        let inner = &*self.inner;
        let Some(policy) = &inner.fallback else {
            inner.stats.errors.fetch_add(1, Ordering::Relaxed);
            return Err(LimitError::Store(failure.into_error()));
        };
        let now = inner.clock.now_micros();
        let request = FallbackRequest {
            key,
            quota,
            cost,
            reason: failure.reason,
            error: failure.error.as_ref(),
            now_micros: now,
        };
        let mut decision = policy.decide(request).await;
        // No silent success: whatever the policy said, this is degraded.
        decision.source = DecisionSource::Fallback(failure.reason);
        if decision.timestamp_micros == 0 {
            decision.timestamp_micros = now;
        }
        inner.stats.fallback[reason_index(failure.reason)].fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            reason = failure.reason.as_str(),
            allowed = decision.allowed,
            "rate-limit decision from the fallback policy"
        );
        Ok(decision)
    }

    /// The circuit breaker's state, if the limiter has one.
    ///
    /// Over a sharded store ([`Store::shard`], e.g. a Redis Cluster, one
    /// breaker per hash slot) this is the worst state over the breakers:
    /// `Open` if any is open, else `HalfOpen` if any is, else `Closed`. See
    /// [`breaker_state_for`](Self::breaker_state_for) and
    /// [`open_breakers`](Self::open_breakers).
    pub fn breaker_state(&self) -> Option<BreakerState> {
        self.inner.breaker.as_ref().map(Breakers::worst)
    }

    /// The state of the breaker guarding `key` under the limiter's quota
    /// (its shard's breaker over a sharded store), if the limiter has a
    /// breaker. A shard no check has reached yet is `Closed`.
    pub fn breaker_state_for(&self, key: &WindowKey) -> Option<BreakerState> {
        let breakers = self.inner.breaker.as_ref()?;
        let request = CheckRequest::new(key, &self.inner.quota, 1);
        Some(breakers.state_of(self.inner.store.shard(&request)))
    }

    /// How many of the limiter's circuit breakers are open (not counting
    /// half-open ones): over a sharded store, the shards whose checks go
    /// straight to the fallback; otherwise 0 or 1. 0 without a breaker.
    pub fn open_breakers(&self) -> usize {
        self.inner.breaker.as_ref().map_or(0, Breakers::open)
    }

    /// The HTTP status a layer should answer a degraded denial
    /// (`source = Fallback(_)`, `allowed = false`) with: the fallback
    /// policy's [`denial_status`](FallbackPolicy::denial_status), for
    /// example `503` for [`FailClosed`](crate::fallback::FailClosed) by
    /// default; `429` without a policy.
    pub fn fallback_status(&self) -> StatusCode {
        self.inner
            .fallback
            .as_ref()
            .map_or(StatusCode::TOO_MANY_REQUESTS, |p| p.denial_status())
    }

    /// Keys currently held by the local tier (0 without one). Runs the
    /// cache's pending maintenance first, so the count is current.
    pub fn local_cache_len(&self) -> u64 {
        self.inner.local.as_ref().map_or(0, LocalTier::len)
    }

    /// Counts of decisions by source since the limiter was built.
    pub fn stats(&self) -> LimiterStats {
        let s = &self.inner.stats;
        LimiterStats {
            store: s.store.load(Ordering::Relaxed),
            local_cache: s.local_cache.load(Ordering::Relaxed),
            fallback: REASONS.map(|r| s.fallback[reason_index(r)].load(Ordering::Relaxed)),
            errors: s.errors.load(Ordering::Relaxed),
        }
    }
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = &*self.inner;
        f.debug_struct("Limiter")
            .field("quota", &inner.quota)
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
struct Failure {
    reason: FallbackReason,
    error: Option<StoreError>,
}

impl Failure {
    fn into_error(self) -> StoreError {
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
    fn success(&mut self) {
        if let (Some(b), Some(t)) = (self.breaker, self.ticket.take()) {
            b.success(t);
        }
    }

    fn failure(&mut self) {
        if let (Some(b), Some(t)) = (self.breaker, self.ticket.take()) {
            b.failure(t);
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

/// Builds a [`Limiter`] with resilience; see [`Limiter::builder`].
///
/// Defaults: a local tier of 100 000 keys, a 50 ms budget per decision,
/// [`RetryConfig::default`], [`BreakerConfig::default`], at most 1024 store
/// calls in flight, the [`SystemClock`], and no fallback policy (a store
/// failure is returned as an error). The time budget and retries use tokio's
/// timer, so checks must run inside a tokio runtime with time enabled.
#[must_use]
pub struct LimiterBuilder {
    store: Arc<dyn Store>,
    quota: Quota,
    clock: Arc<dyn Clock>,
    local_capacity: u64,
    fallback: Option<Box<dyn FallbackPolicy>>,
    timeout: Option<Duration>,
    retry: RetryConfig,
    breaker: Option<BreakerConfig>,
    max_in_flight: Option<usize>,
    metrics_tenant_label: bool,
}

impl LimiterBuilder {
    /// The default time budget of one decision: 50 ms.
    pub const DEFAULT_TIMEOUT: Duration = DEFAULT_TIMEOUT;
    /// The default capacity of the local tier: 100 000 keys.
    pub const DEFAULT_LOCAL_CAPACITY: u64 = DEFAULT_LOCAL_CAPACITY;
    /// The default bound on store calls in flight: 1024.
    pub const DEFAULT_MAX_IN_FLIGHT: usize = DEFAULT_MAX_IN_FLIGHT;

    fn new(store: Arc<dyn Store>, quota: Quota) -> Self {
        Self {
            store,
            quota,
            clock: Arc::new(SystemClock),
            local_capacity: DEFAULT_LOCAL_CAPACITY,
            fallback: None,
            timeout: Some(DEFAULT_TIMEOUT),
            retry: RetryConfig::default(),
            breaker: Some(BreakerConfig::default()),
            max_in_flight: Some(DEFAULT_MAX_IN_FLIGHT),
            metrics_tenant_label: false,
        }
    }

    /// The clock of the local tier, the breaker and the fallback policy
    /// (default [`SystemClock`]). The store keeps its own time.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// How many keys the local tier of recent denials holds (default
    /// 100 000); `0` turns the local tier off.
    pub fn local_capacity(mut self, capacity: u64) -> Self {
        self.local_capacity = capacity;
        self
    }

    /// What to answer when the store cannot (default: return the error).
    pub fn fallback(mut self, policy: impl FallbackPolicy) -> Self {
        self.fallback = Some(Box::new(policy));
        self
    }

    /// The time budget of one decision's store call, retries included
    /// (default 50 ms).
    pub fn timeout(mut self, budget: Duration) -> Self {
        self.timeout = Some(budget);
        self
    }

    /// No time budget: a check waits for the store as long as it takes.
    pub fn without_timeout(mut self) -> Self {
        self.timeout = None;
        self
    }

    /// How failed store calls are retried (default [`RetryConfig::default`]).
    pub fn retry(mut self, retry: RetryConfig) -> Self {
        self.retry = retry;
        self
    }

    /// The circuit breaker's configuration (default [`BreakerConfig::default`]).
    ///
    /// Over a sharded store ([`Store::shard`], e.g. a Redis Cluster) the
    /// limiter keeps one breaker with this configuration per shard, made on
    /// the shard's first check, so one failing shard (a dead primary's
    /// slots) does not send the healthy shards' keys to the fallback.
    pub fn breaker(mut self, config: BreakerConfig) -> Self {
        self.breaker = Some(config);
        self
    }

    /// No circuit breaker.
    pub fn without_breaker(mut self) -> Self {
        self.breaker = None;
        self
    }

    /// At most `n` store calls in flight on this limiter (default 1024, at
    /// least 1); beyond it a check takes the `Overloaded` path at once.
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = Some(n.clamp(1, Semaphore::MAX_PERMITS));
        self
    }

    /// No bound on store calls in flight.
    pub fn unbounded_in_flight(mut self) -> Self {
        self.max_in_flight = None;
        self
    }

    /// Adds a `tenant` label (the key's tenant) to the decision metrics
    /// (default off: one series per tenant can be many series). The subject
    /// is never a label. With the label on, each record looks its series up
    /// in the recorder, which allocates. Without the `metrics` feature this
    /// does nothing.
    pub fn metrics_tenant_label(mut self, enabled: bool) -> Self {
        self.metrics_tenant_label = enabled;
        self
    }

    /// Builds the limiter.
    pub fn build(self) -> Limiter {
        let clock = self.clock;
        let fallback = self.fallback.map(|mut policy| {
            policy.attach_clock(clock.clone());
            policy
        });
        let parts = MetricParts {
            fallback: fallback.is_some(),
            breaker: self.breaker.is_some(),
            local: self.local_capacity > 0,
        };
        let metrics = Arc::new(LimiterMetrics::new(
            &self.quota,
            self.metrics_tenant_label,
            parts,
        ));
        let local = (self.local_capacity > 0).then(|| {
            LocalTier::new(self.local_capacity, clock.clone()).with_metrics(metrics.clone())
        });
        let breaker = self
            .breaker
            .map(|config| Breakers::new(config, clock.clone(), Some(metrics.clone())));
        Limiter {
            inner: Arc::new(Inner {
                metrics,
                store: self.store,
                quota: self.quota,
                clock,
                local,
                fallback,
                breaker,
                resilience: Resilience {
                    timeout: self.timeout,
                    retry: self.retry,
                    in_flight: self.max_in_flight.map(Semaphore::new),
                },
                stats: Counters::default(),
            }),
        }
    }
}

impl fmt::Debug for LimiterBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimiterBuilder")
            .field("quota", &self.quota)
            .field("local_capacity", &self.local_capacity)
            .field("fallback", &self.fallback.is_some())
            .field("timeout", &self.timeout)
            .field("retry", &self.retry)
            .field("breaker", &self.breaker)
            .field("max_in_flight", &self.max_in_flight)
            .field("metrics_tenant_label", &self.metrics_tenant_label)
            .finish_non_exhaustive()
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
