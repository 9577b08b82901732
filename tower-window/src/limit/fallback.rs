//! What a [`Limiter`](crate::Limiter) answers when the store cannot.
//!
//! A [`FallbackPolicy`] decides when the store errors, times out, is
//! overloaded, or its breaker is open. The limiter marks every such decision
//! `source = Fallback(reason)`, so it is never mistaken for a store's.
//! Built-ins: [`FailOpen`], [`FailClosed`], [`LocalWindow`]; any
//! `Fn(&FallbackRequest<'_>) -> Decision` closure is a policy too.
//!
//! ```
//! use tower_window::fallback::{FailClosed, FallbackPolicy, FallbackRequest};
//! use tower_window::{Cost, Decision, FallbackReason, Limiter, MemoryStore, Policy, Quota, WindowKey};
//!
//! let limiter = Limiter::builder(MemoryStore::new(), "100/1m".parse::<Quota>()?)
//!     .fallback(FailClosed::new())
//!     .build();
//! # let _ = limiter;
//!
//! // A closure: admit only the cheap requests.
//! let cheap_only = |r: &FallbackRequest<'_>| {
//!     let quota = r.policy.first().clone();
//!     let window = quota.window();
//!     if r.cost == Cost::ONE {
//!         Decision::allow(quota, 0, window)
//!     } else {
//!         Decision::deny(quota, 0, window, Some(window))
//!     }
//! };
//!
//! // Policies can be unit-tested with a hand-made request.
//! let policy: Policy = "100/1m".parse::<Quota>()?.into();
//! let key = WindowKey::for_subject("alice");
//! let two = Cost::new(2).expect("not zero");
//! let request = FallbackRequest::new(&key, &policy, two, FallbackReason::Timeout, 0);
//! assert!(!cheap_only(&request).allowed());
//!
//! let limiter = Limiter::builder(MemoryStore::new(), policy)
//!     .fallback(cheap_only)
//!     .build();
//! # let _ = limiter;
//! # Ok::<(), tower_window::QuotaError>(())
//! ```

use std::convert::Infallible;
use std::fmt;
use std::num::NonZeroU32;
use std::time::Duration;

pub use crate::store::guard::OnFailure;
use crate::store::{CheckRequest, StoreError};
use crate::{
    Algorithm, Cost, Decision, FallbackReason, ManualClock, MemoryStore, Policy, Quota,
    QuotaDecision, WindowKey,
};

/// The check the store could not answer, handed to a [`FallbackPolicy`].
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct FallbackRequest<'a> {
    /// Whose window.
    pub key: &'a WindowKey,
    /// Which quotas.
    pub policy: &'a Policy,
    /// Units requested; with [`quota_costs`](Self::quota_costs), the most
    /// any quota is asked for.
    pub cost: Cost,
    /// The units each quota was asked for, in policy order, when they
    /// differ ([`Limiter::check_policy_per_quota`](crate::Limiter::check_policy_per_quota)).
    /// Read one with [`cost_of`](Self::cost_of).
    pub quota_costs: Option<&'a [Cost]>,
    /// Why the store did not decide.
    pub reason: FallbackReason,
    /// The store's error, if it was called.
    pub error: Option<&'a StoreError>,
    /// The limiter's clock reading, in microseconds since the Unix epoch.
    pub now_micros: u64,
}

impl<'a> FallbackRequest<'a> {
    /// A request the store could not decide for `reason`, at `now_micros`
    /// (for unit tests of policies, too).
    pub fn new(
        key: &'a WindowKey,
        policy: &'a Policy,
        cost: Cost,
        reason: FallbackReason,
        now_micros: u64,
    ) -> Self {
        Self {
            key,
            policy,
            cost,
            quota_costs: None,
            reason,
            error: None,
            now_micros,
        }
    }

    /// The same request with a cost per quota (`None`: one for all).
    pub fn with_quota_costs(mut self, costs: Option<&'a [Cost]>) -> Self {
        self.quota_costs = costs;
        self
    }

    /// The units quota `index` of the policy was asked for.
    pub fn cost_of(&self, index: usize) -> Cost {
        self.quota_costs
            .and_then(|costs| costs.get(index).copied())
            .unwrap_or(self.cost)
    }

    /// The same request with the store's error.
    pub fn with_error(mut self, error: Option<&'a StoreError>) -> Self {
        self.error = error;
        self
    }
}

/// Decides a check when the store cannot (see the [module](self)).
pub trait FallbackPolicy: Send + Sync + 'static {
    /// Decides `request` at once (a fallback must not wait for what just
    /// failed). The limiter sets the decision's `source` and, if it is
    /// zero, its timestamp.
    fn decide(&self, request: FallbackRequest<'_>) -> Decision;
}

impl<F> FallbackPolicy for F
where
    F: Fn(&FallbackRequest<'_>) -> Decision + Send + Sync + 'static,
{
    fn decide(&self, request: FallbackRequest<'_>) -> Decision {
        self(&request)
    }
}

/// Admit every request while the store is unavailable, reporting
/// `remaining = capacity − cost` and `reset_after = window` for every quota.
#[derive(Debug, Clone, Copy, Default)]
pub struct FailOpen;

impl FailOpen {
    /// The fail-open policy.
    pub fn new() -> Self {
        Self
    }
}

impl FallbackPolicy for FailOpen {
    fn decide(&self, request: FallbackRequest<'_>) -> Decision {
        let states = request
            .policy
            .quotas()
            .iter()
            .enumerate()
            .map(|(i, quota)| {
                let remaining = quota.capacity().saturating_sub(request.cost_of(i).get());
                QuotaDecision::allow(quota.clone(), remaining, quota.window())
            });
        for_policy(request.policy, states)
    }
}

/// Deny every request while the store is unavailable, with a `retry_after`
/// (default one second) for every quota. Over HTTP the layer answers it
/// with its [degraded status](crate::layer::SlidingWindowLayer::degraded_status).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct FailClosed {
    retry_after: Duration,
}

impl Default for FailClosed {
    fn default() -> Self {
        Self::new()
    }
}

impl FailClosed {
    /// Deny, with a `retry_after` of one second.
    pub fn new() -> Self {
        Self {
            retry_after: Duration::from_secs(1),
        }
    }

    /// The `retry_after` of each denial.
    pub fn retry_after(mut self, retry_after: Duration) -> Self {
        self.retry_after = retry_after;
        self
    }
}

impl FallbackPolicy for FailClosed {
    fn decide(&self, request: FallbackRequest<'_>) -> Decision {
        deny_all(request.policy, |_| self.retry_after)
    }
}

/// The decision of `policy` from its quotas' states (a policy always has a
/// quota: the denial of its first is unreachable).
fn for_policy(policy: &Policy, states: impl Iterator<Item = QuotaDecision>) -> Decision {
    Decision::from_quotas(states).unwrap_or_else(|| {
        let quota = policy.first().clone();
        let window = quota.window();
        Decision::deny(quota, 0, window, Some(window))
    })
}

/// A denial in every quota of `policy`, each for `wait(quota)`.
fn deny_all(policy: &Policy, wait: impl Fn(&Quota) -> Duration) -> Decision {
    let states = policy.quotas().iter().map(|quota| {
        let wait = wait(quota);
        QuotaDecision::deny(quota.clone(), 0, wait, Some(wait))
    });
    for_policy(policy, states)
}

/// A window kept on this node alone with a share of the limit.
///
/// During an outage each node admits at most `ceil(share × limit)` units
/// (at least 1) per window of each key in an embedded [`MemoryStore`]; with
/// `share = 1 / nodes` the cluster stays near the global limit. GCRA bursts
/// are scaled the same way.
///
/// ```
/// use tower_window::fallback::LocalWindow;
///
/// let quarter = LocalWindow::new(0.25)?;
/// let same = LocalWindow::per_node(std::num::NonZeroU32::new(4).unwrap());
/// assert_eq!(quarter.scaled_limit(100), 25);
/// assert_eq!(same.scaled_limit(10), 3);
/// # Ok::<(), tower_window::fallback::InvalidShare>(())
/// ```
#[must_use]
pub struct LocalWindow {
    /// The share as the fraction `numerator / denominator`.
    numerator: u64,
    denominator: u64,
    store: MemoryStore,
    /// The embedded store's clock: the latest reading handed in by a
    /// request, so the window runs on the limiter's (the store's) time.
    now: ManualClock,
    /// Scaled policies by original policy; a limiter checks few distinct ones.
    scaled: quick_cache::sync::Cache<Policy, Option<Policy>>,
}

/// A [`LocalWindow`] share outside `(0, 1]`.
#[derive(Clone, Copy, PartialEq, thiserror::Error)]
#[error("a local window share must be a number in (0, 1], got {0}")]
pub struct InvalidShare(pub f64);

crate::error_debug::debug_as_display!(InvalidShare);

/// Parts per million: shares are kept as exact integers.
const SHARE_SCALE: u64 = 1_000_000;

impl LocalWindow {
    /// A local window with `share` of each limit, in `(0, 1]`, to a
    /// millionth.
    pub fn new(share: f64) -> Result<Self, InvalidShare> {
        if !(share > 0.0 && share <= 1.0) {
            return Err(InvalidShare(share));
        }
        // A positive share below a millionth counts as one millionth.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let ppm = ((share * SHARE_SCALE as f64).round() as u64).clamp(1, SHARE_SCALE);
        Ok(Self::from_fraction(ppm, SHARE_SCALE))
    }

    /// A local window with `1 / nodes` of each limit.
    pub fn per_node(nodes: NonZeroU32) -> Self {
        Self::from_fraction(1, u64::from(nodes.get()))
    }

    fn from_fraction(numerator: u64, denominator: u64) -> Self {
        let now = ManualClock::new(0);
        Self {
            numerator,
            denominator,
            store: Self::store(&now, MemoryStore::DEFAULT_MAX_KEYS),
            now,
            scaled: quick_cache::sync::Cache::new(64),
        }
    }

    /// The most keys the node's own window keeps (default
    /// [`MemoryStore::DEFAULT_MAX_KEYS`]).
    pub fn max_keys(mut self, max_keys: u64) -> Self {
        self.store = Self::store(&self.now, max_keys);
        self
    }

    fn store(now: &ManualClock, max_keys: u64) -> MemoryStore {
        MemoryStore::builder()
            .clock(now.clone())
            .max_keys(max_keys)
            .build()
    }

    /// `ceil(share × limit)`, at least 1 and at most `limit`.
    pub fn scaled_limit(&self, limit: u32) -> u32 {
        let scaled = (u64::from(limit) * self.numerator).div_ceil(self.denominator);
        u32::try_from(scaled)
            .unwrap_or(limit)
            .clamp(1, limit.max(1))
    }

    /// The policy this node enforces on its own in place of `policy`: each
    /// quota scaled by [`scaled_quota`](Self::scaled_quota).
    pub fn scaled_policy(&self, policy: &Policy) -> Option<Policy> {
        let scaled = || Ok::<_, Infallible>(policy.map_quotas(|quota| self.scaled_quota(quota)));
        match self.scaled.get_or_insert_with(policy, scaled) {
            Ok(scaled) => scaled,
            Err(never) => match never {},
        }
    }

    /// `quota` with the scaled limit (and burst).
    pub fn scaled_quota(&self, quota: &Quota) -> Option<Quota> {
        let mut builder = Quota::builder()
            .name(quota.name())
            .scope(quota.scope())
            .limit(self.scaled_limit(quota.limit()))
            .window(quota.window())
            .algorithm(quota.algorithm());
        if let (Algorithm::Gcra, Some(burst)) = (quota.algorithm(), quota.burst()) {
            builder = builder.burst(self.scaled_limit(burst));
        }
        builder.build().ok()
    }
}

impl fmt::Debug for LocalWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalWindow")
            .field(
                "share",
                &format_args!("{}/{}", self.numerator, self.denominator),
            )
            .finish_non_exhaustive()
    }
}

impl FallbackPolicy for LocalWindow {
    fn decide(&self, request: FallbackRequest<'_>) -> Decision {
        let policy = request.policy;
        // Concurrent requests may hand in readings out of order: the window's
        // time never steps back.
        self.now.advance_to(request.now_micros);
        let decided = self.scaled_policy(policy).and_then(|scaled| {
            let check = CheckRequest {
                quota_costs: request.quota_costs,
                ..CheckRequest::new(request.key, &scaled, request.cost)
            };
            self.store.check_now(check).ok()
        });
        match decided {
            // Reported against the quotas the caller asked about.
            Some(decision) => decision.reported_as(policy),
            // The embedded store does not fail; if it ever does, deny.
            None => deny_all(policy, Quota::window),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn shares_are_exact() {
        let w = LocalWindow::new(0.07).unwrap();
        assert_eq!(w.scaled_limit(100), 7);
        assert_eq!(w.scaled_limit(1), 1);
        assert_eq!(w.scaled_limit(15), 2);
        let w = LocalWindow::new(1.0).unwrap();
        assert_eq!(w.scaled_limit(u32::MAX), u32::MAX);
        let w = LocalWindow::new(1e-9).unwrap();
        assert_eq!(w.scaled_limit(10), 1);
        for bad in [0.0, -0.5, 1.5, f64::NAN, f64::INFINITY] {
            assert!(LocalWindow::new(bad).is_err());
        }
        let w = LocalWindow::per_node(NonZeroU32::new(3).unwrap());
        assert_eq!(w.scaled_limit(10), 4);
        assert_eq!(w.scaled_limit(9), 3);
    }

    #[test]
    fn scaled_quota_keeps_name_window_and_algorithm() {
        let w = LocalWindow::new(0.5).unwrap();
        let q: Quota = "10/1s gcra(burst=5)"
            .parse::<Quota>()
            .unwrap()
            .named("api")
            .unwrap();
        let s = w.scaled_quota(&q).unwrap();
        assert_eq!(s.name(), "api");
        assert_eq!(s.limit(), 5);
        assert_eq!(s.burst(), Some(3));
        assert_eq!(s.window(), q.window());
        assert_eq!(s.algorithm(), Algorithm::Gcra);
        let q2: Quota = "9/1m sliding-counter(10s)".parse().unwrap();
        let s2 = w.scaled_quota(&q2).unwrap();
        assert_eq!(s2.limit(), 5);
        assert_eq!(s2.algorithm(), q2.algorithm());
        // The first quota (kept aside) and later ones both keep answering.
        for _ in 0..2 {
            assert_eq!(w.scaled_quota(&q), Some(s.clone()));
            assert_eq!(w.scaled_quota(&q2), Some(s2.clone()));
        }
    }

    #[test]
    fn fail_open_and_closed_answer_for_every_quota() {
        let policy = Policy::builder("p")
            .quota("a", "10/1s")
            .unwrap()
            .quota("b", "100/1m")
            .unwrap()
            .build()
            .unwrap();
        let key = WindowKey::global();
        let cost = Cost::new(3).unwrap();
        let request = FallbackRequest::new(&key, &policy, cost, FallbackReason::Timeout, 0);
        let open = FailOpen.decide(request);
        assert!(open.allowed);
        let remaining: Vec<u32> = open.quotas().iter().map(|q| q.remaining).collect();
        assert_eq!(remaining, [7, 97]);
        let closed = FailClosed::new().decide(request);
        assert!(!closed.allowed);
        assert_eq!(closed.quotas().len(), 2);
        assert_eq!(closed.retry_after, Some(Duration::from_secs(1)));
    }
}
