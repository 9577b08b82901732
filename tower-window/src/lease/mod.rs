//! Quota leases: the [`Backend`] trait and its types.
//!
//! A lease is a block of units a node takes from every quota of a policy in
//! one store call and then spends locally. The bound stays exact: in every
//! window of every quota, the units admitted across all nodes, directly or
//! from leases, never exceed the limit. A leased unit counts in the store
//! from its reservation until an admission made at the lease's deadline
//! would stop counting, or until it is refunded (store clock, `t` the
//! reservation, `d` the deadline):
//!
//! * **Fixed window**, **sliding counter**: the units count in the window
//!   (bucket) of `t`, and `d` is at most its end, so every unit is spent
//!   inside the window (bucket) that counts it.
//! * **Sliding log**: the units are recorded at `d` (the log counts entries
//!   dated in the future), so they count from `t` until `d + W`.
//! * **GCRA**: the tokens are taken at `t` but dated at `d`: the arrival
//!   time moves from `max(tat, d)`, and the grant must fit as seen at `t`.
//!   The GCRA bound (admissions in `[a, b]` push `tat` from at least `a` to
//!   at most `b + B T`) then holds, since a lease spent in `[a, b]` has
//!   `d >= a`. The price is `(d - t) / T` tokens of room per lease, so a TTL
//!   above `(B - 1) T` is refused ([`StoreErrorKind::InvalidRequest`](crate::StoreErrorKind::InvalidRequest)).
//!
//! A check with a cost per quota
//! ([`Limiter::check_policy_per_quota`](crate::Limiter::check_policy_per_quota))
//! never spends from a lease, which holds the same units in every quota.
//!
//! # Refunds, and nodes that die holding a lease
//!
//! An unrefunded lease counts as above, as if spent at the latest moment it
//! could have been (its node may have spent it all just before dying);
//! meanwhile a denial's `retry_after` is no later than
//! [`Reservation::held_until_micros`].
//!
//! A refund removes only units its lease reserved and never spent, so it is
//! safe at any time. The store keeps a record of each lease (its units and
//! where they count) until its units stop counting, and applies a refund to
//! it once, only where the units still count (for GCRA only while no later
//! grant moved the arrival time, which may have been computed from it). A
//! second or late refund is a no-op. Each call drops at most a fixed batch
//! of dead records, so its work stays bounded whatever the key's history.
//!
//! # How much one lease takes
//!
//! Up to `want`, but at most **half of the room** the enforced quotas have
//! left (rounded up, never less than `at_least`), so one node cannot take
//! what is left of a window while others wait. When every enforced quota
//! is a sliding log, a lease may take the **whole room**: a log's room
//! comes back in the pieces earlier leases took, and halving each piece
//! every window would leave a saturated hot key reserving once per unit.
//!
//! # Shadow quotas
//!
//! A [shadow](crate::Quota::shadowed) quota is counted, never enforced
//! (`g` the units granted):
//!
//! * Only the enforced quotas size `g` (with none, `g` is the units
//!   wanted); a shadow quota holds `h = min(g, room)` ([`Lease::held`]).
//! * A spend is the shadow's would-be admission while its hold still has
//!   the units (which it then loses), else its would-be denial (counted in
//!   `tower_window_shadow_denials_total`). The reservation spends its
//!   `at_least` units first: its [decision](Reservation::decision) reports
//!   a would-be denial when `h < at_least`.
//! * A refund gives a shadow quota back [`RefundRequest::shadow_unused`],
//!   or else `h - min(h, g - unused)`; it answers the enforced quotas'
//!   count (with shadow quotas only, `unused` while the lease is known).
//! * Otherwise a shadow quota is treated as enforced (it bounds the
//!   deadline and the GCRA TTL), so it counts exactly what it would have
//!   admitted.
//!
//! # GCRA leases that start later
//!
//! Near empty, a GCRA bucket frees one token per interval `T`, so a hot key
//! would reserve about once per token. With [`ReserveRequest::max_wait`]
//! (`M`), a policy of enforced GCRA quotas whose room grants fewer than
//! `want` units may get `g` tokens spendable from a later `s`
//! ([`Lease::not_before_micros`]) until `d = s + ttl`: the most (up to
//! `want`) that fit as seen at `s`, with `s - t <= M` and
//! `s = max(t, tat + g T - B T)` per quota (the latest). Dated as any
//! lease's, they keep the bound with `s` in the place of `t`. The half
//! share does not apply, and the [decision](Reservation::decision) is a
//! denial until `s`.

use std::time::Duration;

use crate::clock::duration_micros;
use crate::store::{Guard, Op, StoreError};
use crate::{Decision, Policy, QuotaDecision, WindowKey};

pub(crate) mod memory;
#[cfg(feature = "redis")]
mod redis;

/// Quota leases ([`LimiterBuilder::leases`](crate::LimiterBuilder::leases)),
/// on the same windows and failure domains as the store's
/// [`limit::Backend`](crate::limit::Backend). Implemented by
/// [`MemoryStore`](crate::MemoryStore) and (feature `redis`)
/// [`RedisStore`](crate::RedisStore).
pub trait Backend: Send + Sync + 'static {
    /// In one atomic store call (one round trip per refill): applies
    /// `request.refunds` (each as [`refund`](Self::refund) would), then
    /// takes up to `request.want` units (at least `request.at_least`, else
    /// none) from every quota of the policy as a [`Lease`]. A reservation
    /// that grants nothing and [`decides`](ReserveRequest::decides) decides
    /// a check of `at_least` units instead, as
    /// [`limit::Backend::check`](crate::limit::Backend::check) would.
    fn reserve<'a>(
        &'a self,
        guard: &mut Guard<'a>,
        request: ReserveRequest<'a>,
    ) -> Op<'a, Reservation>;

    /// Returns `request.unused` units of a lease that were never spent
    /// (capped at what it granted), where they still count; answers the
    /// units returned. A second refund of the same lease, or one after its
    /// units stopped counting, returns 0 and changes nothing.
    fn refund<'a>(&'a self, guard: &mut Guard<'a>, request: RefundRequest<'a>) -> Op<'a, u32>;
}

/// One reservation: up to `want` units of every quota of a policy, for at
/// most `ttl`.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct ReserveRequest<'a> {
    /// Whose window.
    pub key: &'a WindowKey,
    /// Which quotas, reserved together.
    pub policy: &'a Policy,
    /// The most units to take (at least `at_least`).
    pub want: u32,
    /// The fewest units worth taking (the cost of the request that asks,
    /// at least 1): the store grants 0 rather than fewer.
    pub at_least: u32,
    /// How long the lease may be spent, at most; the store shortens it to
    /// the end of the current window or bucket where the algorithm needs it.
    pub ttl: Duration,
    /// How long after the reservation the lease may start (zero: at once).
    /// Read only for a policy of enforced GCRA quotas whose room now grants
    /// fewer than `want` units (see the [module](self), "GCRA leases that
    /// start later").
    pub max_wait: Duration,
    /// Leases of the same key and policy to refund first, in the same call.
    pub refunds: &'a [RefundRequest<'a>],
    /// Whether a reservation that grants nothing decides the check of
    /// `at_least` units that asked for it, in the same call.
    pub decides: bool,
}

impl<'a> ReserveRequest<'a> {
    /// A reservation of up to `want` units (at least `at_least`, else none)
    /// of every quota of `policy` for `key`, to be spent within `ttl`. A
    /// `want` of 0 only refunds and, if it [`decides`](Self::deciding),
    /// decides the check of `at_least` units.
    pub fn new(
        key: &'a WindowKey,
        policy: &'a Policy,
        want: u32,
        at_least: u32,
        ttl: Duration,
    ) -> Self {
        Self {
            key,
            policy,
            want,
            at_least,
            ttl,
            max_wait: Duration::ZERO,
            refunds: &[],
            decides: false,
        }
    }

    /// The same reservation, refunding `refunds` first.
    #[must_use]
    pub fn refunding(mut self, refunds: &'a [RefundRequest<'a>]) -> Self {
        self.refunds = refunds;
        self
    }

    /// The same reservation, deciding the check of `at_least` units when
    /// it grants nothing.
    #[must_use]
    pub fn deciding(mut self) -> Self {
        self.decides = true;
        self
    }

    /// The same reservation, which may start up to `max_wait` later (see
    /// [`max_wait`](Self::max_wait)).
    #[must_use]
    pub fn waiting_up_to(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }

    /// Refuses what no store can serve; answers the TTL in microseconds.
    pub(crate) fn validate(&self) -> Result<u64, StoreError> {
        let invalid = |message| Err(StoreError::invalid(message));
        if self.at_least == 0 || (self.want != 0 && self.want < self.at_least) {
            return invalid("a lease must want at least 1 unit, and at least what it needs");
        }
        let foreign = |r: &RefundRequest<'_>| r.key != self.key || r.policy != self.policy;
        if self.refunds.iter().any(foreign) {
            return invalid("a reservation refunds only leases of its own key and policy");
        }
        let ttl = duration_micros(self.ttl);
        if ttl == 0 {
            return invalid("a lease needs a TTL of at least 1 microsecond");
        }
        crate::algorithm::lease::check_ttl(self.policy, ttl)?;
        if self.policy.len() == 0 {
            return invalid("a policy without quotas");
        }
        Ok(ttl)
    }
}

/// Units a store granted: spend them locally before
/// [`deadline_micros`](Self::deadline_micros), then [refund](Backend::refund)
/// what is left.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Lease {
    /// The store's id of the lease (what a refund names).
    pub id: u64,
    /// Units granted in every quota of the policy.
    pub granted: u32,
    /// The store's clock (µs) when the units were taken.
    pub reserved_at_micros: u64,
    /// The store's clock (µs) from which no unit of the lease may be spent.
    pub deadline_micros: u64,
    /// The store's clock (µs) before which no unit of the lease may be
    /// spent: the reservation's time, or later for a GCRA lease granted
    /// with [`ReserveRequest::max_wait`].
    pub not_before_micros: u64,
    /// Per quota of the policy, in policy order, the units of the lease it
    /// holds: `granted`, or fewer for a [shadow](crate::Quota::shadowed)
    /// quota. Empty when every quota holds `granted`: read it with
    /// [`held_by`](Self::held_by).
    pub held: Vec<u32>,
}

impl Lease {
    /// A lease of `granted` units taken at `reserved_at_micros`, spendable
    /// until `deadline_micros`, named `id` by its store (for stores outside
    /// this crate); every quota holds `granted`.
    pub fn new(id: u64, granted: u32, reserved_at_micros: u64, deadline_micros: u64) -> Self {
        Self {
            id,
            granted,
            reserved_at_micros,
            deadline_micros,
            not_before_micros: reserved_at_micros,
            held: Vec::new(),
        }
    }

    /// The same lease, spendable only from `not_before_micros`.
    #[must_use]
    pub fn starting_at(mut self, not_before_micros: u64) -> Self {
        self.not_before_micros = not_before_micros;
        self
    }

    /// The same lease with the units each quota holds (see [`held`](Self::held)).
    #[must_use]
    pub fn with_held(mut self, held: Vec<u32>) -> Self {
        self.held = held;
        self
    }

    /// The units of the lease that the policy's quota at `index` holds.
    ///
    /// ```
    /// use tower_window::lease::Lease;
    ///
    /// let lease = Lease::new(1, 5, 0, 1_000).with_held(vec![5, 2]);
    /// assert_eq!((lease.held_by(0), lease.held_by(1)), (5, 2));
    /// assert_eq!(Lease::new(1, 5, 0, 1_000).held_by(1), 5);
    /// ```
    pub fn held_by(&self, index: usize) -> u32 {
        self.held.get(index).copied().unwrap_or(self.granted)
    }

    /// How long after the reservation the lease may be spent.
    pub fn ttl(&self) -> Duration {
        Duration::from_micros(self.deadline_micros.saturating_sub(self.reserved_at_micros))
    }
}

/// What a [`reserve`](Backend::reserve) answered.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Reservation {
    /// The lease, when at least `at_least` units were granted.
    pub lease: Option<Lease>,
    /// The store's clock (µs) at the reservation.
    pub now_micros: u64,
    /// The latest deadline, if later than now, of the leases of this key
    /// and policy the store still records (refunded ones included: an early
    /// hint, never a late one), by which the units they hold come back.
    pub held_until_micros: Option<u64>,
    /// With a lease: the policy's state once it was taken, as an admission
    /// of the `at_least` units (a shadow quota holding fewer reports its
    /// would-be denial), or a denial until a later
    /// [start](Lease::not_before_micros). Without a lease, for a request
    /// that [`decides`](ReserveRequest::decides): the check decided.
    pub decision: Option<Decision>,
    /// Units the request's [refunds](ReserveRequest::refunds) returned.
    pub refunded: u32,
}

impl Reservation {
    /// A reservation that granted `lease`, with `decision` the policy's
    /// state once it was taken (for stores outside this crate).
    pub fn with_lease(
        lease: Lease,
        decision: Decision,
        now_micros: u64,
        held_until_micros: Option<u64>,
    ) -> Self {
        Self {
            lease: Some(lease),
            ..Self::empty(now_micros, held_until_micros).with_decision(decision)
        }
    }

    /// A reservation that granted nothing.
    pub fn empty(now_micros: u64, held_until_micros: Option<u64>) -> Self {
        Self {
            lease: None,
            now_micros,
            held_until_micros,
            decision: None,
            refunded: 0,
        }
    }

    /// The same reservation, granting `lease` of which the policy's quotas
    /// hold `held` and stand at `states` once it was taken (both in policy
    /// order): what both stores answer.
    pub(crate) fn granting(
        self,
        policy: &Policy,
        lease: Lease,
        held: impl Iterator<Item = u32>,
        states: impl IntoIterator<Item = QuotaDecision>,
    ) -> Self {
        // `Lease::held` stays empty when every quota holds `granted`.
        let shadowed = policy.quotas().iter().any(crate::Quota::is_shadow);
        let held = if shadowed { held.collect() } else { Vec::new() };
        let decision = Decision::from_quotas(states);
        Self {
            lease: Some(lease.with_held(held)),
            decision: decision.map(|d| d.with_timestamp_micros(self.now_micros)),
            ..self
        }
    }

    /// The same reservation, with the decision of the check it decided
    /// (see [`decision`](Self::decision)).
    #[must_use]
    pub fn with_decision(mut self, decision: Decision) -> Self {
        self.decision = Some(decision);
        self
    }

    /// The same reservation, whose refunds returned `units`.
    #[must_use]
    pub fn with_refunded(mut self, units: u32) -> Self {
        self.refunded = units;
        self
    }

    /// Units granted (0 without a lease).
    pub fn granted(&self) -> u32 {
        self.lease.as_ref().map_or(0, |lease| lease.granted)
    }

    /// How long from the reservation until the outstanding leases end
    /// (zero if none is outstanding).
    pub fn held_for(&self) -> Duration {
        let until = self.held_until_micros.unwrap_or(0);
        Duration::from_micros(until.saturating_sub(self.now_micros))
    }
}

/// A refund of `unused` units of `lease`, taken under `policy` for `key`.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct RefundRequest<'a> {
    /// Whose window.
    pub key: &'a WindowKey,
    /// The policy the lease was reserved under.
    pub policy: &'a Policy,
    /// The lease.
    pub lease: &'a Lease,
    /// Units of the lease never spent (capped at what it granted). Spends
    /// are local: the store cannot tell a spent unit from an unused one
    /// and takes this count on trust, so a refund naming spent units would
    /// let them be admitted again (the limiter's lease tier names only
    /// what it did not spend).
    pub unused: u32,
    /// Per quota of the policy, in policy order, the units a
    /// [shadow](crate::Quota::shadowed) quota still holds unspent (capped
    /// at what it held; enforced quotas' entries are ignored). `None`: what
    /// it held beyond the `granted - unused` units spent.
    pub shadow_unused: Option<&'a [u32]>,
}

impl<'a> RefundRequest<'a> {
    /// A refund of `unused` units of `lease`.
    pub fn new(key: &'a WindowKey, policy: &'a Policy, lease: &'a Lease, unused: u32) -> Self {
        Self {
            key,
            policy,
            lease,
            unused,
            shadow_unused: None,
        }
    }

    /// The same refund, naming what each shadow quota still holds unspent
    /// (see [`shadow_unused`](Self::shadow_unused)).
    #[must_use]
    pub fn with_shadow_unused(mut self, units: &'a [u32]) -> Self {
        self.shadow_unused = Some(units);
        self
    }

    /// Units to give back to the policy's quota at `index`, which holds
    /// `held` of a lease of `granted`.
    pub(crate) fn unused_of(&self, index: usize, shadow: bool, granted: u32, held: u32) -> u32 {
        let unused = self.unused.min(granted);
        if !shadow {
            return unused.min(held);
        }
        match self.shadow_unused.and_then(|units| units.get(index)) {
            Some(units) => (*units).min(held),
            None => held.saturating_sub(granted - unused),
        }
    }

    /// Whether the refund gives anything back to any quota.
    pub(crate) fn returns_anything(&self) -> bool {
        let shadow = |(units, quota): (&u32, &crate::Quota)| quota.is_shadow() && *units > 0;
        let units = self.shadow_unused.unwrap_or_default();
        self.unused.min(self.lease.granted) > 0
            || units.iter().zip(self.policy.quotas()).any(shadow)
    }
}

impl crate::store::Backend {
    /// With quota leases.
    pub fn with_leases(self, leases: impl Backend) -> Self {
        self.with_part::<dyn Backend>(std::sync::Arc::new(leases))
    }
}
