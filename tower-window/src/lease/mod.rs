//! Quota leases: the [`Backend`] trait and its types.
//!
//! A lease is a block of units a node takes from every quota of a policy in
//! one store call and then spends locally, without a store call per request.
//! The invariant stays exact: in every window of every quota, the units
//! admitted across all nodes never exceed the limit, whether admitted
//! directly or from leases. A leased unit counts in the store from its
//! reservation until the algorithm lets an admission made at the lease's
//! deadline go, or until it is refunded. Per algorithm (all on the store's
//! clock, `t` the reservation, `d` the deadline):
//!
//! * **Fixed window**: the units are counted in the window of `t`, and `d`
//!   is at most that window's end, so every leased unit is spent inside the
//!   window that counts it.
//! * **Sliding counter**: the units are counted in the bucket of `t`, and
//!   `d` is at most that bucket's end, so every leased unit is spent inside
//!   the bucket that counts it; the counter's argument (two admissions less
//!   than `W` apart are both counted at the later one) then holds as if each
//!   unit had been admitted directly when spent.
//! * **Sliding log**: the units are recorded at `d` (the log counts entries
//!   dated in the future), so they count at every moment from `t` until
//!   `d + W`, which covers `[s, s + W)` for every spending time `s` in
//!   `[t, d)`.
//! * **GCRA**: the tokens are taken at reservation, but dated at the
//!   deadline: the bucket's theoretical arrival time moves from
//!   `max(tat, d)` (not `max(tat, t)`), and the grant must fit as seen at
//!   `t`. Dating them at `t` would not be exact: a lease taken at `t` and
//!   spent at `d` plus the tokens that drip in between could exceed the
//!   burst within a short interval. With the deadline, the proof of the
//!   bound (admissions in `[a, b]` push `tat` from at least `a` by `N T`, to
//!   at most `b + B T`) holds unchanged, since a lease spent in `[a, b]` has
//!   `d >= a`. The price is `(d - t) / T` tokens of room per lease, so a
//!   lease TTL above `(B - 1) T` is refused
//!   ([`StoreErrorKind::InvalidRequest`]):
//!   no lease could ever be granted.
//!
//! A lease holds the same units in every quota, so a check with a cost per
//! quota ([`Limiter::check_policy_per_quota`](crate::Limiter::check_policy_per_quota))
//! never spends from one: it goes to the store, which counts the units
//! leases hold, and the bound stays exact.
//!
//! # One round trip per refill
//!
//! A [reservation](Backend::reserve) carries the refunds of the key's old
//! leases ([`ReserveRequest::refunds`]) and applies them first, in the same
//! atomic call, so that it sees the room they free; and one that grants
//! nothing decides the check that asked ([`ReserveRequest::decides`]),
//! exactly as a direct check would. A limiter therefore makes one store call
//! per reservation, whatever it gives back or finds, and none per spend.
//!
//! # A node that dies holding a lease
//!
//! Its refund never comes, so the store keeps counting the lease's units as
//! above: as spent at the latest moment the node could have spent them.
//! Nothing earlier is possible without over-admitting (the node may have
//! spent them all just before it died). So the others can use them again
//! when an admission made at the deadline would free them: for the fixed
//! window at the window's end, which is the deadline itself when the lease
//! TTL reaches it; for the sliding log and counter one window after the
//! deadline (or its bucket); for GCRA as the bucket drains. Meanwhile a
//! denial reports a `retry_after` no later than the deadline of the leases
//! still outstanding ([`Reservation::held_until_micros`]), when live nodes
//! refund theirs.
//!
//! A refund returns units that were reserved and never spent; removing them
//! from the count can only make the store's count closer to what was
//! admitted, so a refund is safe at any time, late ones included, as long
//! as it removes units of that very lease and no more than it reserved. The
//! store therefore records every lease (an id, its units and where they were
//! counted: the window, bucket, log entry or arrival time) until its units
//! stop counting; a refund applies to that record once and only where the
//! units are still counted (the same window, bucket or log entry; for GCRA
//! only while no later grant moved the arrival time, because a later grant
//! may have been computed from it). A second or late refund is a no-op,
//! and so is a refund of a lease whose units all stopped counting (its
//! record may still be waiting to be dropped: see below).
//!
//! # How much one lease takes
//!
//! A reservation gets up to the units it wants, but at most **half of the
//! room** the enforced quotas have left (rounded up, and never less than
//! its `at_least`), so one node cannot take what is left of a window while
//! others wait. When every enforced quota is a **sliding log**, a lease may
//! take the **whole room** (still up to what it wants): a log's room comes
//! back in the pieces earlier leases took (one entry each, freed together
//! `W` after its deadline), and halving each freed piece would split the
//! pieces again every window, until a saturated hot key reserved once per
//! unit. A whole piece goes to the node that asks first.
//!
//! # Shadow quotas
//!
//! A [shadow](crate::Quota::shadowed) quota is counted, never enforced,
//! leased or not. In a lease that means, exactly (`g` the units granted):
//!
//! * **The grant is sized by the enforced quotas only**: the least room of
//!   the enforced quotas decides `g` (at most half of it, or all of it for
//!   sliding logs: see above). A
//!   policy of shadow quotas only has nothing to bound it: its leases get
//!   the units wanted.
//! * **A shadow quota holds what it has room for**: `h = min(g, room)`
//!   units, recorded like an enforced quota's (the same window, bucket,
//!   log entry or arrival time), `h = 0` when it is full. The shadow's
//!   hold is reported per quota in [`Lease::held`].
//! * **A spend is a shadow quota's would-be admission when its hold still
//!   has the spend's units**, which the hold then loses; otherwise it is
//!   the shadow's would-be denial (reported in the decision, counted in
//!   `tower_window_shadow_denials_total`) and the hold keeps them: as a
//!   direct check, a shadow quota records only what fits. The reservation
//!   itself spends its `at_least` units first, and its
//!   [decision](Reservation::decision) reports the shadow's would-be
//!   denial when `h < at_least`.
//! * **A refund gives each shadow quota back what it still holds**: the
//!   units the caller names in [`RefundRequest::shadow_unused`] (the
//!   limiter tracks them), or, when it names none, what the shadow held
//!   beyond the `g - unused` units spent (as if it had admitted the first
//!   units spent): `h - min(h, g - unused)`. What a refund returns is the
//!   enforced quotas' count; with shadow quotas only, `unused` when the
//!   lease was still known.
//! * Everything else is as for an enforced quota: a shadow quota bounds the
//!   deadline (fixed window, sliding counter) and a GCRA shadow quota
//!   refuses a TTL that leaves it no room, so that it counts exactly what
//!   it would have admitted had it been enforced.
//!
//! So a shadow quota's would-be admissions obey its own bound, exactly as
//! the enforced quotas' admissions obey theirs, and a shadow quota never
//! changes what a lease grants or what the enforced quotas admit.
//!
//! # GCRA leases that start later
//!
//! A GCRA bucket near empty frees one token per emission interval `T`, so
//! leases of what it has room for now hold a token or two and a hot key
//! reserves about once per token. A reservation may therefore say how long
//! it can wait ([`ReserveRequest::max_wait`], `M`): for a policy of GCRA
//! quotas (no shadow quota) whose room now grants fewer than `want` units,
//! the store grants `g` tokens that may be spent only from a later time
//! `s` ([`Lease::not_before_micros`]) until the deadline `d = s + ttl`:
//! `g` is the most (up to `want`) that fit as seen at `s`, with `s - t <=
//! M`, and `s = max(t, tat + g T - B T)` per quota (the latest). They are
//! taken and dated as any lease's (from `max(tat, d)`), so the grant fits
//! `tat' <= s + B T`, and the proof above holds with `s` in the place of
//! `t`: every unit of the lease is spent at or after `s`, so a lease spent
//! in `[a, b]` still pushes `tat` from at least `a` to at most `b + B T`.
//! Such a grant takes the bucket's room now and the tokens it frees until
//! `s`, in order of request (a GCRA bucket is one timeline), so the
//! half-of-the-room share does not apply; `want` and `M` bound it. Its
//! [decision](Reservation::decision) is a denial until `s` when `s` is
//! later than the reservation.
//!
//! # Bounded work
//!
//! Every lease call does work bounded by constants, whatever the history of
//! the key: a reservation or refund drops at most a fixed batch of records
//! whose units stopped counting (the rest go with later calls or with the
//! keys' TTL), and a refund reads at most a fixed number of log entries at
//! the lease's timestamp. Records still needed are never dropped.

use std::time::Duration;

use crate::store::{Guard, Op, StoreError, StoreErrorKind};

pub(crate) mod memory;
#[cfg(feature = "redis")]
mod redis;
use crate::{Decision, Policy, WindowKey};

/// What a backend does for quota leases ([`Limiter`](crate::Limiter)s with
/// [`LimiterBuilder::leases`](crate::LimiterBuilder::leases)), on the same
/// windows as its [`limit::Backend`](crate::limit::Backend) and in the same
/// failure domains.
///
/// Implemented by [`MemoryStore`](crate::MemoryStore) and (feature `redis`)
/// [`RedisStore`](crate::RedisStore).
pub trait Backend: Send + Sync + 'static {
    /// In one atomic store call: first applies `request.refunds` (each as
    /// [`refund`](Self::refund) would), then takes up to `request.want`
    /// units (at least `request.at_least`, else none) from every quota of
    /// the policy, as a [`Lease`] to spend locally until its deadline; see
    /// the [module docs](self) for why the global bound stays exact. A
    /// reservation that grants nothing and [`decides`](ReserveRequest::decides)
    /// decides a check of `at_least` units instead, exactly as
    /// [`limit::Backend::check`](crate::limit::Backend::check) would, and
    /// answers it in [`Reservation::decision`].
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

/// One reservation to run against a store: up to `want` units of every
/// quota of a policy, for at most `ttl`.
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
    /// How long after the reservation the lease may start (zero: it starts
    /// at once). Read only for a policy of GCRA quotas without shadow
    /// quotas whose room now grants fewer than `want` units: the store may
    /// then grant up to `want` of the tokens the bucket will have within
    /// `max_wait`, spendable from [`Lease::not_before_micros`] (see the
    /// [module](self), "GCRA leases that start later").
    pub max_wait: Duration,
    /// Leases of the same key and policy to refund before the reservation,
    /// in the same call (what [`Reservation::refunded`] answers for).
    pub refunds: &'a [RefundRequest<'a>],
    /// Whether a reservation that grants nothing decides the check of
    /// `at_least` units that asked for it (admitted or denied, all quotas
    /// or none, a denial consuming nothing), in the same call.
    pub decides: bool,
}

impl<'a> ReserveRequest<'a> {
    /// A reservation of up to `want` units (at least `at_least`, else none)
    /// of every quota of `policy` for `key`, to be spent within `ttl`. A
    /// `want` of 0 reserves nothing: the call only refunds (see
    /// [`refunding`](Self::refunding)) and, if it [`decides`](Self::deciding),
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

    /// The same reservation, refunding `refunds` first in the same call
    /// (leases of the same key and policy).
    #[must_use]
    pub fn refunding(mut self, refunds: &'a [RefundRequest<'a>]) -> Self {
        self.refunds = refunds;
        self
    }

    /// The same reservation, deciding the check of `at_least` units when
    /// it grants nothing (see [`decides`](Self::decides)).
    #[must_use]
    pub fn deciding(mut self) -> Self {
        self.decides = true;
        self
    }

    /// Refuses what no store can serve: `at_least` of 0, a `want` below
    /// `at_least` (other than 0), a refund of another key or policy.
    pub(crate) fn validate(&self) -> Result<(), StoreError> {
        if self.at_least == 0 || (self.want != 0 && self.want < self.at_least) {
            return Err(StoreError::new(
                StoreErrorKind::InvalidRequest,
                "a lease must want at least 1 unit, and at least what it needs",
            ));
        }
        let foreign = self
            .refunds
            .iter()
            .any(|refund| refund.key != self.key || refund.policy != self.policy);
        if foreign {
            return Err(StoreError::new(
                StoreErrorKind::InvalidRequest,
                "a reservation refunds only leases of its own key and policy",
            ));
        }
        Ok(())
    }

    /// The same reservation, which may start up to `max_wait` later (see
    /// [`max_wait`](Self::max_wait)).
    #[must_use]
    pub fn waiting_up_to(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }
}

/// Units a store granted: spend them locally before [`deadline_micros`](Self::deadline_micros)
/// (store clock), then [refund](Backend::refund) what is left.
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
    /// Per quota of the policy, in policy order, the units of the lease
    /// that quota holds: `granted` for an enforced quota, at most that for
    /// a [shadow](crate::Quota::shadowed) one (see the [module](self)).
    /// Empty when every quota holds `granted` (a policy without shadow
    /// quotas): read it with [`held_by`](Self::held_by).
    pub held: Vec<u32>,
}

impl Lease {
    /// A lease of `granted` units taken at `reserved_at_micros`, spendable
    /// until `deadline_micros` (store clock), named `id` by its store (for
    /// stores outside this crate); every quota holds `granted`.
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

    /// The same lease, spendable only from `not_before_micros` (store
    /// clock; see [`ReserveRequest::max_wait`]).
    #[must_use]
    pub fn starting_at(mut self, not_before_micros: u64) -> Self {
        self.not_before_micros = not_before_micros;
        self
    }

    /// The same lease with the units each quota holds, in policy order
    /// (see [`held`](Self::held)).
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
    /// The latest deadline of the leases of this key and policy still
    /// outstanding in the store (this one included), if any is later than
    /// now: the units they hold may come back by then. Precisely, on both
    /// stores of this crate: the latest deadline of the leases recorded
    /// beside the policy's first quota while their records live (a
    /// refunded lease's included: an early hint, never a late one).
    pub held_until_micros: Option<u64>,
    /// With a lease: the policy's state once it was taken, as an admission
    /// of the `at_least` units (every quota's remaining and reset; a shadow
    /// quota that holds fewer than `at_least` units reports its would-be
    /// denial); for a lease that starts later
    /// ([`Lease::not_before_micros`]), a denial until it starts. Without a
    /// lease, for a request that [`decides`](ReserveRequest::decides): the
    /// check of `at_least` units, decided as a direct check.
    pub decision: Option<Decision>,
    /// Units the request's [refunds](ReserveRequest::refunds) returned, in
    /// all (each as [`Backend::refund`] answers).
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
            now_micros,
            held_until_micros,
            decision: Some(decision),
            refunded: 0,
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
        Duration::from_micros(
            self.held_until_micros
                .unwrap_or(0)
                .saturating_sub(self.now_micros),
        )
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
    /// Units of the lease never spent (capped at what it granted).
    pub unused: u32,
    /// Per quota of the policy, in policy order, the units a
    /// [shadow](crate::Quota::shadowed) quota still holds unspent (capped
    /// at what it held; entries of enforced quotas are ignored: they get
    /// `unused`). `None`: each shadow quota gets back what it held beyond
    /// the `granted - unused` units spent (see the [module](self)).
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
    /// (one entry per quota of the policy, in policy order).
    #[must_use]
    pub fn with_shadow_unused(mut self, units: &'a [u32]) -> Self {
        self.shadow_unused = Some(units);
        self
    }

    /// Units to give back to the policy's quota at `index`, of the `held`
    /// it holds, for a lease of `granted`: `unused` for an enforced quota;
    /// for a shadow quota what the request names, else what it held
    /// beyond the units spent.
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
        self.unused.min(self.lease.granted) > 0
            || self.shadow_unused.is_some_and(|units| {
                units
                    .iter()
                    .zip(self.policy.quotas())
                    .any(|(units, quota)| quota.is_shadow() && *units > 0)
            })
    }
}

impl crate::store::Backend {
    /// With quota leases.
    pub fn with_leases(self, leases: impl Backend) -> Self {
        self.with_part::<dyn Backend>(std::sync::Arc::new(leases))
    }
}
