//! The answer to one rate-limit check.

use std::fmt;
use std::time::Duration;

use smallvec::SmallVec;

use crate::Quota;

/// Where a [`Decision`] came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DecisionSource {
    /// The store (Redis or the embedded store) decided.
    Store,
    /// The node's local tier answered from a remembered denial.
    LocalCache,
    /// The node admitted from a quota lease it holds, without a store call.
    Lease,
    /// The store could not decide; the fallback policy did.
    Fallback(FallbackReason),
}

impl DecisionSource {
    /// A short, stable name for headers, logs and metric labels.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Store => "store",
            Self::LocalCache => "local_cache",
            Self::Lease => "lease",
            Self::Fallback(_) => "fallback",
        }
    }
}

impl fmt::Display for DecisionSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Fallback(reason) => write!(f, "fallback({reason})"),
            other => f.write_str(other.as_str()),
        }
    }
}

/// Why the fallback policy answered instead of the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FallbackReason {
    /// The store could not be reached.
    Unavailable,
    /// The store did not answer within the time budget.
    Timeout,
    /// Too many store calls were already in flight on this node.
    Overloaded,
    /// The circuit breaker is open.
    CircuitOpen,
    /// The store answered with an error.
    Error,
}

impl FallbackReason {
    /// Every reason, in declaration order.
    pub const ALL: [FallbackReason; 5] = [
        Self::Unavailable,
        Self::Timeout,
        Self::Overloaded,
        Self::CircuitOpen,
        Self::Error,
    ];

    /// The reason for a store operation that failed with `error`.
    pub fn for_error(error: &crate::StoreError) -> Self {
        use crate::StoreErrorKind as Kind;
        match error.kind() {
            Kind::Unavailable => Self::Unavailable,
            Kind::Timeout => Self::Timeout,
            Kind::Overloaded => Self::Overloaded,
            Kind::CircuitOpen => Self::CircuitOpen,
            _ => Self::Error,
        }
    }

    /// A short, stable name for headers, logs and metric labels.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Unavailable => "unavailable",
            Self::Timeout => "timeout",
            Self::Overloaded => "overloaded",
            Self::CircuitOpen => "circuit_open",
            Self::Error => "error",
        }
    }
}

impl fmt::Display for FallbackReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What one quota of a policy said about a request.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct QuotaDecision {
    pub(crate) quota: Quota,
    pub(crate) allowed: bool,
    pub(crate) remaining: u32,
    pub(crate) reset_after: Duration,
    pub(crate) retry_after: Option<Duration>,
}

impl QuotaDecision {
    /// The quota.
    pub fn quota(&self) -> &Quota {
        &self.quota
    }

    /// Whether this quota admits the request's cost.
    pub fn allowed(&self) -> bool {
        self.allowed
    }

    /// Units left in this quota's window (after the cost if the request
    /// was admitted).
    pub fn remaining(&self) -> u32 {
        self.remaining
    }

    /// Time until everything this quota counts has stopped counting.
    pub fn reset_after(&self) -> Duration {
        self.reset_after
    }

    /// `Some(ZERO)` if this quota admits the cost; otherwise how long until
    /// it would, or `None` when it never can.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// One quota's admission of the cost.
    pub fn allow(quota: Quota, remaining: u32, reset_after: Duration) -> Self {
        Self {
            quota,
            allowed: true,
            remaining,
            reset_after,
            retry_after: Some(Duration::ZERO),
        }
    }

    /// One quota's denial; `retry_after = None` means the cost can never fit.
    pub fn deny(
        quota: Quota,
        remaining: u32,
        reset_after: Duration,
        retry_after: Option<Duration>,
    ) -> Self {
        Self {
            quota,
            allowed: false,
            remaining,
            reset_after,
            retry_after,
        }
    }

    /// Whether this is a [shadow](Quota::shadowed) quota's would-be denial.
    pub fn is_shadow_denial(&self) -> bool {
        self.quota.is_shadow() && !self.allowed
    }

    /// Whether `self` binds tighter than `other`: an enforced quota over a
    /// [shadow](Quota::shadowed) one; a denial over an admission; between
    /// denials the longer wait (never fitting is the longest); between
    /// admissions the smaller share of the capacity left.
    fn is_tighter_than(&self, other: &Self) -> bool {
        let rank = |q: &Self| (!q.quota.is_shadow(), !q.allowed);
        if rank(self) != rank(other) {
            return rank(self) > rank(other);
        }
        if !self.allowed {
            // Never fitting (`None`) is the longest wait: it sorts first
            // on `is_none`, and the waits compare after.
            let wait = |q: &Self| (q.retry_after.is_none(), q.retry_after);
            return wait(self) > wait(other);
        }
        // remaining / capacity, compared without division.
        let mine = u64::from(self.remaining) * u64::from(other.quota.capacity());
        let theirs = u64::from(other.remaining) * u64::from(self.quota.capacity());
        mine < theirs
    }
}

/// Every quota's state, in policy order; one inline for a one-quota policy.
type QuotaStates = SmallVec<[QuotaDecision; 1]>;

/// The outcome of checking one request against a [`Policy`](crate::Policy).
///
/// The accessors answer for the *deciding* quota, the tightest one (a
/// denying quota with the longest wait, else the least share of capacity
/// left); [`quotas`](Self::quotas) has every quota's state. Custom stores
/// and fallbacks build one with [`allow`](Self::allow), [`deny`](Self::deny)
/// or [`from_quotas`](Self::from_quotas).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Decision {
    pub(crate) allowed: bool,
    pub(crate) remaining: u32,
    pub(crate) reset_after: Duration,
    pub(crate) retry_after: Option<Duration>,
    pub(crate) source: DecisionSource,
    pub(crate) timestamp_micros: u64,
    quotas: QuotaStates,
    /// The deciding quota's index in `quotas` (below `MAX_QUOTAS`).
    decider: u8,
    /// The policy of a denial (see [`policy_name`](Self::policy_name)); not
    /// kept for admissions, which then pay no reference count.
    policy: Option<crate::Policy>,
}

impl Decision {
    /// An admission by a one-quota policy.
    pub fn allow(quota: Quota, remaining: u32, reset_after: Duration) -> Self {
        Self::single_at(QuotaDecision::allow(quota, remaining, reset_after), 0)
    }

    /// A denial by a one-quota policy; `retry_after = None` means the cost
    /// can never fit.
    pub fn deny(
        quota: Quota,
        remaining: u32,
        reset_after: Duration,
        retry_after: Option<Duration>,
    ) -> Self {
        let state = QuotaDecision::deny(quota, remaining, reset_after, retry_after);
        Self::single_at(state, 0)
    }

    /// The decision of a one-quota policy, decided at `timestamp_micros`.
    #[inline]
    pub(crate) fn single_at(state: QuotaDecision, timestamp_micros: u64) -> Self {
        Self::from_states(QuotaStates::from_buf([state]), 0, timestamp_micros)
    }

    /// The decision of a policy from every quota's state, in policy order;
    /// `None` for no quotas.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_window::{Decision, Quota, QuotaDecision};
    ///
    /// let burst: Quota = "5/1s".parse::<Quota>()?.named("burst")?;
    /// let hourly: Quota = "100/1h".parse::<Quota>()?.named("hourly")?;
    /// let decision = Decision::from_quotas([
    ///     QuotaDecision::allow(burst, 4, Duration::from_secs(1)),
    ///     QuotaDecision::deny(hourly, 0, Duration::from_secs(3600), Some(Duration::from_secs(60))),
    /// ])
    /// .unwrap();
    /// assert!(!decision.allowed());
    /// assert_eq!(decision.quota().name(), "hourly");
    /// assert_eq!(decision.retry_after(), Some(Duration::from_secs(60)));
    /// assert_eq!(decision.quotas().len(), 2);
    /// # Ok::<(), tower_window::QuotaError>(())
    /// ```
    pub fn from_quotas(quotas: impl IntoIterator<Item = QuotaDecision>) -> Option<Self> {
        let quotas: QuotaStates = quotas.into_iter().collect();
        let mut decider = 0;
        for (i, state) in quotas.iter().enumerate().skip(1) {
            if state.is_tighter_than(&quotas[decider]) {
                decider = i;
            }
        }
        (!quotas.is_empty()).then(|| Self::from_states(quotas, decider, 0))
    }

    #[inline]
    fn from_states(quotas: QuotaStates, decider: usize, timestamp_micros: u64) -> Self {
        // Shadow quotas never deny.
        let allowed = quotas.iter().all(|q| q.allowed || q.quota.is_shadow());
        let d = &quotas[decider];
        Self {
            allowed,
            remaining: d.remaining,
            reset_after: d.reset_after,
            // An admission has nothing to wait for.
            retry_after: allowed.then_some(Duration::ZERO).or(d.retry_after),
            source: DecisionSource::Store,
            timestamp_micros,
            quotas,
            // A policy holds at most `MAX_QUOTAS` (16) quotas.
            decider: u8::try_from(decider).unwrap_or(u8::MAX),
            policy: None,
        }
    }

    /// Whether the request may proceed: every quota admitted it
    /// ([shadow](Quota::shadowed) quotas never deny).
    pub fn allowed(&self) -> bool {
        self.allowed
    }

    /// Units left in the deciding quota's window after this decision.
    pub fn remaining(&self) -> u32 {
        self.remaining
    }

    /// Time until the deciding quota's window is full again.
    pub fn reset_after(&self) -> Duration {
        self.reset_after
    }

    /// For a denial, how long until the cost could be admitted, or `None`
    /// when it never can; `Some(ZERO)` for an admission.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// Who decided.
    pub fn source(&self) -> DecisionSource {
        self.source
    }

    /// The deciding clock's reading, in microseconds since the Unix epoch.
    pub fn timestamp_micros(&self) -> u64 {
        self.timestamp_micros
    }

    /// The deciding quota (see the type's docs).
    pub fn quota(&self) -> &Quota {
        let decider = &self.quotas[usize::from(self.decider).min(self.quotas.len() - 1)];
        &decider.quota
    }

    /// Every quota's state, in policy order.
    pub fn quotas(&self) -> &[QuotaDecision] {
        &self.quotas
    }

    /// The [shadow](Quota::shadowed) quotas that would have denied this
    /// request had they been enforced.
    pub fn shadow_denials(&self) -> impl Iterator<Item = &QuotaDecision> {
        self.quotas.iter().filter(|q| q.is_shadow_denial())
    }

    /// The name of the policy that denied the request: set on every denial
    /// a [`Limiter`](crate::Limiter) returns, or by
    /// [`with_policy`](Self::with_policy); else `None`.
    ///
    /// ```
    /// use tower_window::{Limiter, MemoryStore, Policy, WindowKey};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let policy = Policy::builder("api").quota("burst", "1/1s")?.quota("daily", "100/1d")?.build()?;
    /// let limiter = Limiter::new(MemoryStore::new(), policy);
    /// let key = WindowKey::for_subject("alice");
    /// assert_eq!(limiter.check(&key, 1).await?.policy_name(), None);
    /// let denied = limiter.check(&key, 1).await?;
    /// assert_eq!((denied.policy_name(), denied.quota().name()), (Some("api"), "burst"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub fn policy_name(&self) -> Option<&str> {
        self.policy.as_ref().map(crate::Policy::name)
    }

    /// Sets the [`policy_name`](Self::policy_name).
    pub fn with_policy(mut self, policy: &crate::Policy) -> Self {
        self.policy = Some(policy.clone());
        self
    }

    /// [`with_policy`](Self::with_policy) for a denial, in place (the hot
    /// path never moves a decision just to look at it).
    #[inline]
    pub(crate) fn record_denial_policy(&mut self, policy: &crate::Policy) {
        if !self.allowed {
            self.policy = Some(policy.clone());
        }
    }

    /// Sets who decided.
    pub fn with_source(mut self, source: DecisionSource) -> Self {
        self.source = source;
        self
    }

    /// Sets the [`timestamp_micros`](Self::timestamp_micros).
    pub fn with_timestamp_micros(mut self, micros: u64) -> Self {
        self.timestamp_micros = micros;
        self
    }

    /// The limit of the deciding quota (the burst for GCRA).
    pub fn limit(&self) -> u32 {
        self.quota().capacity()
    }

    /// Whether the decision was made without the store (fallback).
    pub fn is_degraded(&self) -> bool {
        matches!(self.source, DecisionSource::Fallback(_))
    }

    /// The same decision reported against `policy`'s quotas (a fallback
    /// decides on scaled copies of them).
    pub(crate) fn reported_as(mut self, policy: &crate::Policy) -> Self {
        for (state, quota) in self.quotas.iter_mut().zip(policy.quotas()) {
            state.quota = quota.clone();
        }
        self
    }

    /// Every duration as seen `elapsed` later (a remembered denial
    /// answered again).
    pub(crate) fn aged(mut self, elapsed: Duration, retry_after: Duration) -> Self {
        for q in &mut self.quotas {
            q.reset_after = q.reset_after.saturating_sub(elapsed);
            q.retry_after = q.retry_after.map(|r| r.saturating_sub(elapsed));
        }
        self.reset_after = self.reset_after.saturating_sub(elapsed).max(retry_after);
        self.retry_after = Some(retry_after);
        self
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn q(text: &str, name: &str) -> Quota {
        text.parse::<Quota>().unwrap().named(name).unwrap()
    }

    #[test]
    fn the_tightest_quota_decides() {
        let s = Duration::from_secs;
        // Both admit: the smaller share left decides (2/10 < 30/100).
        let d = Decision::from_quotas([
            QuotaDecision::allow(q("100/1h", "a"), 30, s(9)),
            QuotaDecision::allow(q("10/1s", "b"), 2, s(1)),
        ])
        .unwrap();
        assert!(d.allowed);
        assert_eq!(
            (d.quota().name(), d.remaining, d.retry_after),
            ("b", 2, Some(s(0)))
        );
        // The longer wait decides; never fitting is longest; ties keep order.
        let d = Decision::from_quotas([
            QuotaDecision::allow(q("1/s", "a"), 0, s(1)),
            QuotaDecision::deny(q("1/s", "b"), 0, s(1), Some(s(1))),
            QuotaDecision::deny(q("1/m", "c"), 0, s(60), Some(s(50))),
            QuotaDecision::deny(q("1/m", "d"), 0, s(60), Some(s(50))),
        ])
        .unwrap();
        assert!(!d.allowed);
        assert_eq!((d.quota().name(), d.retry_after), ("c", Some(s(50))));
        let d = Decision::from_quotas([
            QuotaDecision::deny(q("1/m", "c"), 0, s(60), Some(s(50))),
            QuotaDecision::deny(q("1/s", "e"), 1, s(0), None),
        ])
        .unwrap();
        assert_eq!((d.quota().name(), d.retry_after), ("e", None));
        assert_eq!(d.quotas().len(), 2);
        assert!(Decision::from_quotas([]).is_none());
    }

    #[test]
    fn shadow_quotas_never_deny_nor_decide() {
        let s = Duration::from_secs;
        let shadow = q("1/m", "trial").shadowed(true);
        let d = Decision::from_quotas([
            QuotaDecision::allow(q("10/1s", "burst"), 9, s(1)),
            QuotaDecision::deny(shadow.clone(), 0, s(60), Some(s(30))),
        ])
        .unwrap();
        assert!(d.allowed);
        assert_eq!(d.quota().name(), "burst");
        assert_eq!(d.retry_after, Some(s(0)));
        assert_eq!(d.shadow_denials().count(), 1);
        let d = Decision::from_quotas([
            QuotaDecision::deny(shadow.clone(), 0, s(60), Some(s(30))),
            QuotaDecision::deny(q("10/1s", "burst"), 0, s(1), Some(s(1))),
        ])
        .unwrap();
        assert!(!d.allowed);
        assert_eq!((d.quota().name(), d.retry_after), ("burst", Some(s(1))));
        let only = Decision::from_quotas([QuotaDecision::deny(shadow, 0, s(60), None)]).unwrap();
        assert!(only.allowed);
        assert_eq!(only.retry_after, Some(s(0)));
    }
}
