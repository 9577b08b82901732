//! Usage known only after a request ran (tokens of a streamed answer):
//! reserve an estimate, then settle the actual usage, or record usage
//! whether or not it fits.

use crate::algorithm::settle::refuses_reservation;
use crate::store::{Op, StoreError};
use crate::{Check, Decision, DecisionSource, LimitError, Limiter, Policy, Quota, WindowKey};

/// One settle: `usage` units of a request whose reservation recorded
/// `reserved` units at `reserved_at_micros` (none: `reserved` 0), for
/// [`Backend::settle`](crate::limit::Backend::settle).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct SettleRequest<'a> {
    /// Whose window.
    pub key: &'a WindowKey,
    /// The policy reserved under, settled together.
    pub policy: &'a Policy,
    /// What was reserved, and where.
    pub reserved: Reserved,
    /// Units used, in every quota unless [`quota_usage`](Self::quota_usage)
    /// names each quota's.
    pub usage: u32,
    /// The units each quota used, in policy order, when they differ.
    pub quota_usage: Option<&'a [u32]>,
}

impl<'a> SettleRequest<'a> {
    /// A settle of `usage` units after `reserved`.
    pub fn new(key: &'a WindowKey, policy: &'a Policy, reserved: Reserved, usage: u32) -> Self {
        Self {
            key,
            policy,
            reserved,
            usage,
            quota_usage: None,
        }
    }

    /// The same settle with `usage[i]` units for quota `i` of the policy.
    #[must_use]
    pub fn with_quota_usage(mut self, usage: &'a [u32]) -> Self {
        self.quota_usage = Some(usage);
        self
    }

    /// The units quota `index` of the policy used.
    pub fn usage_of(&self, index: usize) -> u32 {
        self.quota_usage
            .and_then(|usage| usage.get(index).copied())
            .unwrap_or(self.usage)
    }

    /// Refuses what no store can settle exactly.
    pub(crate) fn validate(&self) -> Result<(), StoreError> {
        let invalid = |message: String| Err(StoreError::invalid(message));
        if self.policy.len() == 0 {
            return invalid("a policy without quotas".into());
        }
        if let Some(usage) = self.quota_usage.filter(|u| u.len() != self.policy.len()) {
            return invalid(format!(
                "{} usages for a policy of {} quotas",
                usage.len(),
                self.policy.len()
            ));
        }
        let refunds = |(i, quota): &(usize, &Quota)| {
            self.usage_of(*i) < self.reserved.units_in(*i) && refuses_reservation(quota)
        };
        if let Some((_, quota)) = self.policy.quotas().iter().enumerate().find(refunds) {
            return invalid(format!(
                "gcra quota `{}` cannot give back part of a reservation exactly",
                quota.name()
            ));
        }
        Ok(())
    }
}

/// What a reservation recorded in its store: the units, and the store's
/// clock then (where a settle takes back what was not used).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Reserved {
    /// Units recorded in every quota of the policy but the
    /// [`unrecorded`](Self::unrecorded) ones.
    pub units: u32,
    /// The store's clock (µs) when they were.
    pub at_micros: u64,
    /// The quotas the reservation recorded nothing in, bit `i` for quota
    /// `i` of the policy: shadow quotas it did not fit (a shadow quota
    /// that would deny records nothing, and never denies).
    pub unrecorded: u16,
}

impl Reserved {
    /// Nothing reserved: a settle records all of its usage.
    pub const NONE: Self = Self {
        units: 0,
        at_micros: 0,
        unrecorded: 0,
    };

    /// The units quota `index` of the policy holds of the reservation.
    pub fn units_in(&self, index: usize) -> u32 {
        let unrecorded = u32::from(self.unrecorded)
            .checked_shr(u32::try_from(index).unwrap_or(u32::MAX))
            .unwrap_or(0);
        if unrecorded & 1 == 1 {
            0
        } else {
            self.units
        }
    }

    /// What the reservation `decision` of `estimate` units recorded: all
    /// of them if the store admitted it (but in the shadow quotas it did
    /// not fit); nothing after a denial, or an admission by the fallback
    /// policy (which records nothing in the store).
    ///
    /// ```
    /// use tower_window::limit::Reserved;
    /// use tower_window::{Limiter, MemoryStore, Quota, WindowKey};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let limiter = Limiter::new(MemoryStore::new(), "1000/1m".parse::<Quota>()?);
    /// let key = WindowKey::for_subject("alice");
    /// let decision = limiter.reserve(&key, limiter.policy(), 300).await?;
    /// let reserved = Reserved::of(&decision, 300);
    /// assert_eq!((reserved.units, reserved.at_micros), (300, decision.timestamp_micros()));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub fn of(decision: &Decision, estimate: u32) -> Self {
        if decision.allowed && decision.source == DecisionSource::Store {
            let unrecorded = (decision.quotas().iter().enumerate())
                .filter(|(_, quota)| !quota.allowed)
                .fold(0, |bits, (i, _)| {
                    bits | 1u16.checked_shl(i as u32).unwrap_or(0)
                });
            Self {
                units: estimate,
                at_micros: decision.timestamp_micros,
                unrecorded,
            }
        } else {
            Self::NONE
        }
    }
}

impl Limiter {
    /// Reserves `estimate` units for a request whose usage is known only
    /// after it ran: a [check](Self::check_policy) of `estimate` units
    /// that always reaches the store (never a quota lease, which could not
    /// take units back), to be [settled](Self::settle) once the usage is
    /// known. A remembered denial is still answered by the local tier, and
    /// a store failure by the fallback policy.
    ///
    /// A policy with a GCRA quota is refused
    /// ([`LimitError::CannotReserve`]): GCRA keeps one arrival time, from
    /// which later admissions were computed, so it cannot take back part of
    /// a reservation exactly. [`record`](Self::record) works on every
    /// algorithm.
    pub fn reserve<'a>(
        &'a self,
        key: &'a WindowKey,
        policy: &'a Policy,
        estimate: impl crate::IntoCost,
    ) -> Check<'a> {
        let cost = match policy.quotas().iter().find(|q| refuses_reservation(q)) {
            Some(quota) => Err(Box::new(LimitError::CannotReserve {
                quota: quota.name().to_owned(),
            })),
            None => estimate.into_cost().map_err(|zero| Box::new(zero.into())),
        };
        Check::new(self, key, policy, cost, None, true)
    }

    /// Settles a request that [reserved](Self::reserve) `reserved` units
    /// and used `usage`, in one store call: the units it did not use are
    /// taken back where the reservation put them (while they still count),
    /// and usage past the reservation is recorded whether or not it fits.
    /// Usage past the limit is debt: later checks see the quota exhausted
    /// until it stops counting.
    ///
    /// Answers each quota's state once settled, as a check of one unit
    /// would see it (recording nothing): `allowed` is whether one more
    /// unit fits. A quota left exhausted is remembered by the local tier.
    /// A store failure is an error: there is no fallback for usage that
    /// happened. The settle lands in the windows of `policy`, which should
    /// be the policy reserved under: after a tenant reset those are the
    /// discarded generation's, so the reset forgives usage in flight too.
    ///
    /// ```
    /// use tower_window::limit::Reserved;
    /// use tower_window::{Limiter, MemoryStore, Quota, WindowKey};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let limiter = Limiter::new(MemoryStore::new(), "1000/1m".parse::<Quota>()?);
    /// let (key, policy) = (WindowKey::for_subject("alice"), limiter.policy());
    /// let decision = limiter.reserve(&key, policy, 300).await?;
    /// assert_eq!(decision.remaining(), 700);
    /// // The answer streamed 120 tokens: 180 come back.
    /// let settled = limiter.settle(&key, policy, Reserved::of(&decision, 300), 120).await?;
    /// assert_eq!(settled.remaining(), 880);
    /// // A second answer overran its estimate: 1,100 tokens, 220 past the limit.
    /// let decision = limiter.reserve(&key, policy, 300).await?;
    /// let settled = limiter.settle(&key, policy, Reserved::of(&decision, 300), 1_100).await?;
    /// assert!(!settled.allowed());
    /// assert!(!limiter.reserve(&key, policy, 1).await?.allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub async fn settle(
        &self,
        key: &WindowKey,
        policy: &Policy,
        reserved: Reserved,
        usage: u32,
    ) -> Result<Decision, LimitError> {
        self.settle_request(SettleRequest::new(key, policy, reserved, usage))
            .await
    }

    /// Records `usage` units in every quota of `policy` for `key`, whether
    /// or not they fit: a [settle](Self::settle) of nothing reserved (an
    /// Envoy end-of-stream report, say).
    pub async fn record(
        &self,
        key: &WindowKey,
        policy: &Policy,
        usage: u32,
    ) -> Result<Decision, LimitError> {
        self.settle(key, policy, Reserved::NONE, usage).await
    }

    /// Like [`settle`](Self::settle), with the usage of each quota
    /// (`usage[i]` for quota `i` of `policy`); `usage` must have one value
    /// per quota, else [`LimitError::QuotaCosts`].
    pub async fn settle_per_quota(
        &self,
        key: &WindowKey,
        policy: &Policy,
        reserved: Reserved,
        usage: &[u32],
    ) -> Result<Decision, LimitError> {
        super::one_per_quota(policy, usage.len())?;
        let largest = usage.iter().copied().max().unwrap_or(0);
        let request = SettleRequest::new(key, policy, reserved, largest).with_quota_usage(usage);
        self.settle_request(request).await
    }

    async fn settle_request(&self, request: SettleRequest<'_>) -> Result<Decision, LimitError> {
        let result = self.settle_op(request).await;
        self.note_settled(request.key, request.policy, &result);
        result.map_err(LimitError::Store)
    }

    /// The store call of `request`.
    pub(super) fn settle_op(&self, request: SettleRequest<'_>) -> Op<'static, Decision> {
        self.call_windows(request.key, request.policy, |windows, guard| {
            windows.settle(guard, request)
        })
    }
}
