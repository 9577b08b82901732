//! The [`Limiter`]: policies checked in a store, with a local tier of
//! recent denials, a lease tier and a fallback.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::fallback::{FallbackPolicy, FallbackRequest};
use crate::limit::local::LocalTier;
use crate::metrics::{Calls, LimiterMetrics};
use crate::store::{CheckRequest, Op, Store, StoreError};
use crate::{
    BreakerState, Clock, Cost, Decision, DecisionSource, FallbackReason, Policy, QuotaCosts,
    WindowKey,
};

mod backend;
mod builder;
mod check;
pub mod fallback;
pub(crate) mod lease_tier;
pub(crate) mod local;
pub(crate) mod memory;
mod peek;
#[cfg(feature = "redis")]
pub(crate) mod redis;
mod settle;
mod settlement;

pub use backend::Backend;
pub use builder::LimiterBuilder;
pub use check::Check;
pub use lease_tier::{LeaseConfig, LeaseStats};
pub use settle::{Reserved, SettleRequest};
pub use settlement::Settlement;

/// Checks keys against a [`Policy`] (one or more quotas) in a [`Store`].
///
/// Cheap to clone; clones share one configuration, and limiters on the same
/// store share its resilience stack (budget, retries, in-flight bound,
/// breakers). [`Limiter::builder`] adds a local tier, a [`FallbackPolicy`]
/// and quota leases.
///
/// ```
/// use tower_window::{Limiter, MemoryStore, Quota, WindowKey};
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let limiter = Limiter::new(MemoryStore::new(), "2/1m".parse::<Quota>()?);
/// let key = WindowKey::for_subject("alice");
/// assert!(limiter.check(&key, 1).await?.allowed());
/// assert!(limiter.check(&key, 1).await?.allowed());
/// let third = limiter.check(&key, 1).await?;
/// assert!(!third.allowed());
/// assert!(third.retry_after().is_some());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Clone)]
pub struct Limiter {
    inner: Arc<Inner>,
}

struct Inner {
    store: Store,
    windows: Option<Arc<dyn Backend>>,
    /// Looked up only when leases are on.
    lease_backend: Option<Arc<dyn crate::lease::Backend>>,
    policy: Policy,
    clock: Arc<dyn Clock>,
    local: Option<LocalTier>,
    leases: Option<lease_tier::LeaseTier>,
    fallback: Option<Box<dyn FallbackPolicy>>,
    audit: Option<crate::AuditLog>,
    stats: Counters,
    settles: settlement::Settles,
    metrics: Arc<LimiterMetrics>,
}

impl Limiter {
    /// A limiter enforcing `policy` (or one [`Quota`](crate::Quota)) in
    /// `store`, with no local tier, fallback or leases: a store failure is
    /// returned as an error.
    pub fn new(store: impl Into<Store>, policy: impl Into<Policy>) -> Self {
        LimiterBuilder::new(store.into(), policy.into())
            .local_capacity(0)
            .build()
    }

    /// A builder for a limiter on `store`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_window::fallback::LocalWindow;
    /// use tower_window::{BreakerConfig, Limiter, MemoryStore, Quota, Store};
    ///
    /// let store = Store::builder(MemoryStore::new())
    ///     .timeout(Duration::from_millis(20))
    ///     .breaker(BreakerConfig::default().cooldown(Duration::from_secs(1)))
    ///     .max_in_flight(256)
    ///     .build();
    /// let limiter = Limiter::builder(store, "100/1m".parse::<Quota>()?)
    ///     .local_capacity(10_000)
    ///     .fallback(LocalWindow::new(0.25).expect("a share in (0, 1]"))
    ///     .build();
    /// # let _ = limiter;
    /// # Ok::<(), tower_window::QuotaError>(())
    /// ```
    pub fn builder(store: impl Into<Store>, policy: impl Into<Policy>) -> LimiterBuilder {
        LimiterBuilder::new(store.into(), policy.into())
    }

    /// The policy this limiter enforces.
    pub fn policy(&self) -> &Policy {
        &self.inner.policy
    }

    /// The audit log every decision is handed to, if any
    /// ([`LimiterBuilder::audit`]).
    pub fn audit(&self) -> Option<&crate::AuditLog> {
        self.inner.audit.as_ref()
    }

    /// The store every check goes to.
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// Checks `cost` units for `key` against every quota of the limiter's
    /// policy, and records them in every quota if all admit (a denial
    /// consumes nothing).
    ///
    /// With a fallback policy, a store failure yields a degraded decision
    /// (`source = Fallback(reason)`); without one, an error. A cost of 0 is
    /// [`LimitError::ZeroCost`].
    pub fn check<'a>(&'a self, key: &'a WindowKey, cost: impl crate::IntoCost) -> Check<'a> {
        self.check_policy(key, &self.inner.policy, cost)
    }

    /// Like [`check`](Self::check), against another policy in the same
    /// store (a tenant's own, say).
    ///
    /// Each check records a `tower_window.check` span at debug level with
    /// the policy's name and the cost, `quota` (the deciding one),
    /// `outcome`, `source`, `remaining` and `duration_us` (never the key),
    /// and is counted in the [metrics](crate::metrics).
    pub fn check_policy<'a>(
        &'a self,
        key: &'a WindowKey,
        policy: &'a Policy,
        cost: impl crate::IntoCost,
    ) -> Check<'a> {
        let cost = cost.into_cost().map_err(|zero| Box::new(zero.into()));
        Check::new(self, key, policy, cost, None, false)
    }

    /// Like [`check_policy`](Self::check_policy), with a cost per quota:
    /// `costs[i]` units in quota `i` of `policy`, admitted in every quota or
    /// counted in none (an Envoy request's descriptors, say).
    ///
    /// `costs` must have one cost per quota, else [`LimitError::QuotaCosts`].
    /// Equal costs are one cost. Different costs skip quota leases (a lease
    /// holds the same units in every quota) and go to the store, which
    /// counts what leases hold, so the bound stays exact.
    ///
    /// ```
    /// use tower_window::{Cost, Limiter, MemoryStore, Policy, Quota, QuotaCosts, WindowKey};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let policy = Policy::new("rls", vec![
    ///     "10/1m".parse::<Quota>()?.named("requests")?,
    ///     "100/1m".parse::<Quota>()?.named("bytes")?,
    /// ])?;
    /// let limiter = Limiter::new(MemoryStore::new(), policy.clone());
    /// let key = WindowKey::for_subject("alice");
    /// let costs = QuotaCosts::from([Cost::ONE, Cost::new(60).expect("not zero")]);
    /// let first = limiter.check_policy_per_quota(&key, &policy, &costs).await?;
    /// assert!(first.allowed());
    /// assert_eq!((first.quotas()[0].remaining(), first.quotas()[1].remaining()), (9, 40));
    /// // 60 more bytes do not fit: nothing is counted, not even the request.
    /// let second = limiter.check_policy_per_quota(&key, &policy, &costs).await?;
    /// assert!(!second.allowed());
    /// assert_eq!(limiter.peek_policy(&key, &policy, 1).await?.quotas()[0].remaining(), 9);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub fn check_policy_per_quota<'a>(
        &'a self,
        key: &'a WindowKey,
        policy: &'a Policy,
        costs: &'a QuotaCosts,
    ) -> Check<'a> {
        let largest = costs.iter().copied().max().unwrap_or(Cost::ONE);
        let cost = one_per_quota(policy, costs.len()).map(|()| largest);
        // Equal costs are one cost.
        let differ = costs.iter().any(|cost| *cost != largest);
        Check::new(
            self,
            key,
            policy,
            cost.map_err(Box::new),
            differ.then_some(costs),
            false,
        )
    }

    fn check_store<'a>(&'a self, request: CheckRequest<'a>) -> Op<'static, Decision> {
        self.call_windows(request.key, request.policy, |windows, guard| {
            windows.check(guard, request)
        })
    }

    /// One operation on `key`'s windows under `policy`, through the store's
    /// resilience stack.
    fn call_windows<'a, 'o, T: Send + 'o>(
        &'a self,
        key: &'a WindowKey,
        policy: &'a Policy,
        operation: impl FnOnce(&'a dyn Backend, &mut crate::store::Guard<'a>) -> Op<'o, T>,
    ) -> Op<'o, T> {
        let inner = &*self.inner;
        inner.store.call(
            inner.windows.as_deref(),
            "rate-limit windows",
            |windows| windows.failure_domain(key, policy),
            self.calls(policy),
            operation,
        )
    }

    fn calls<'a>(&'a self, policy: &'a Policy) -> Calls<'a> {
        Calls::to(&self.inner.metrics, Some(policy.first())).for_policy(policy)
    }

    /// Counts a store decision and updates the local tier (remembers a
    /// denial; drops a stale one after an admission).
    fn note_stored(&self, request: CheckRequest<'_>, stale: bool, decision: &Decision) {
        let inner = &*self.inner;
        inner.stats.store.fetch_add(1, Ordering::Relaxed);
        if let Some(local) = &inner.local {
            if !decision.allowed {
                local.remember(request, decision);
            } else if stale {
                local.forget(request.key, request.policy);
            }
        }
    }

    /// The fallback policy's decision for `error`, marked degraded whatever
    /// the policy said (the error itself without a fallback).
    fn fall_back(
        &self,
        request: CheckRequest<'_>,
        error: StoreError,
    ) -> Result<Decision, LimitError> {
        let inner = &*self.inner;
        let reason = FallbackReason::for_error(&error);
        let Some(fallback) = &inner.fallback else {
            inner.stats.errors.fetch_add(1, Ordering::Relaxed);
            return Err(LimitError::Store(error));
        };
        let now = inner.clock.now_micros();
        let request = FallbackRequest::new(request.key, request.policy, request.cost, reason, now)
            .with_quota_costs(request.quota_costs)
            .with_error(Some(&error));
        let mut decision = fallback.decide(request);
        decision.source = DecisionSource::Fallback(reason);
        if decision.timestamp_micros == 0 {
            decision.timestamp_micros = inner.clock.now_micros();
        }
        inner.stats.fallback[reason as usize].fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            reason = reason.as_str(),
            allowed = decision.allowed,
            "rate-limit decision from the fallback policy"
        );
        Ok(decision)
    }
}

impl Limiter {
    /// See [`Store::breaker_state`].
    pub fn breaker_state(&self) -> Option<BreakerState> {
        self.inner.store.breaker_state()
    }

    /// The state of the breaker of `key`'s failure domain under the
    /// limiter's policy, if the store has breakers (`Closed` for a domain
    /// no check has reached yet).
    pub fn breaker_state_for(&self, key: &WindowKey) -> Option<BreakerState> {
        let inner = &*self.inner;
        let windows = inner.windows.as_deref()?;
        inner
            .store
            .breaker_state_of(windows.failure_domain(key, &inner.policy))
    }

    /// See [`Store::open_breakers`].
    pub fn open_breakers(&self) -> usize {
        self.inner.store.open_breakers()
    }

    /// Keys held by the local tier (0 without one), expired denials not yet
    /// overwritten included.
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
            fallback: s.fallback.each_ref().map(|n| n.load(Ordering::Relaxed)),
            errors: s.errors.load(Ordering::Relaxed),
            settled: s.settled.load(Ordering::Relaxed),
            settle_errors: s.settle_errors.load(Ordering::Relaxed),
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
            .field("store", &inner.store)
            .field("fallback", &inner.fallback.is_some())
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Counters {
    store: AtomicU64,
    local_cache: AtomicU64,
    lease: AtomicU64,
    /// Indexed by `FallbackReason as usize` (declaration order).
    fallback: [AtomicU64; FallbackReason::ALL.len()],
    errors: AtomicU64,
    settled: AtomicU64,
    settle_errors: AtomicU64,
}

/// Counts of a [`Limiter`]'s outcomes since it was built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct LimiterStats {
    /// Decisions made by the store.
    pub store: u64,
    /// Denials answered on this node without a store call
    /// ([`DecisionSource::LocalCache`]).
    pub local_cache: u64,
    /// Admissions spent from a quota lease this node held.
    pub lease: u64,
    fallback: [u64; FallbackReason::ALL.len()],
    /// Checks that returned a store error (no fallback configured).
    pub errors: u64,
    /// Usage settled in the store ([`Limiter::settle`], [`Settlement`]).
    pub settled: u64,
    /// Settles the store failed, or that were lost outside a runtime.
    pub settle_errors: u64,
}

impl LimiterStats {
    /// Decisions made by the fallback policy for `reason`.
    pub fn fallback(&self, reason: FallbackReason) -> u64 {
        self.fallback[reason as usize]
    }

    /// Decisions made by the fallback policy, for any reason.
    pub fn fallback_total(&self) -> u64 {
        self.fallback.iter().sum()
    }
}

/// Why a [`Limiter`] could not decide.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum LimitError {
    /// A request must cost at least one unit.
    #[error("a request must cost at least 1 unit")]
    ZeroCost,
    /// A check with a cost per quota was not given one per quota.
    #[error("{costs} costs for a policy of {quotas} quotas: give one per quota")]
    QuotaCosts {
        /// Quotas in the policy.
        quotas: usize,
        /// Costs given.
        costs: usize,
    },
    /// A reservation against a GCRA quota, which cannot take back part of
    /// one exactly (see [`Limiter::reserve`]).
    #[error("gcra quota `{quota}` cannot give back part of a reservation exactly: record the usage instead")]
    CannotReserve {
        /// The quota's name.
        quota: String,
    },
    /// The store failed (or was not called: breaker open, too many calls in
    /// flight) and no fallback policy is configured.
    #[error(transparent)]
    Store(#[from] StoreError),
}

crate::error_debug::debug_as_display!(LimitError {
    ZeroCost,
    QuotaCosts,
    CannotReserve,
    Store,
});

/// [`LimitError::QuotaCosts`] unless `costs` is one per quota of `policy`.
fn one_per_quota(policy: &Policy, costs: usize) -> Result<(), LimitError> {
    if costs != policy.len() {
        return Err(LimitError::QuotaCosts {
            quotas: policy.len(),
            costs,
        });
    }
    Ok(())
}

impl From<crate::ZeroCost> for LimitError {
    fn from(_: crate::ZeroCost) -> Self {
        LimitError::ZeroCost
    }
}
