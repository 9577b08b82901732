//! Quota leases: the types of [`Store::reserve`](super::Store::reserve) and
//! [`Store::refund`](super::Store::refund).
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
//!   ([`StoreErrorKind::InvalidRequest`](super::StoreErrorKind::InvalidRequest)):
//!   no lease could ever be granted.
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
//! may have been computed from it). A second or late refund is a no-op.

use std::time::Duration;

use crate::{Decision, Policy, WindowKey};

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
}

impl<'a> ReserveRequest<'a> {
    /// A reservation of up to `want` units (at least `at_least`, else none)
    /// of every quota of `policy` for `key`, to be spent within `ttl`.
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
        }
    }
}

/// Units a store granted: spend them locally before [`deadline_micros`](Self::deadline_micros)
/// (store clock), then [refund](super::Store::refund) what is left.
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
}

impl Lease {
    /// A lease of `granted` units taken at `reserved_at_micros`, spendable
    /// until `deadline_micros` (store clock), named `id` by its store (for
    /// stores outside this crate).
    pub fn new(id: u64, granted: u32, reserved_at_micros: u64, deadline_micros: u64) -> Self {
        Self {
            id,
            granted,
            reserved_at_micros,
            deadline_micros,
        }
    }

    /// How long after the reservation the lease may be spent.
    pub fn ttl(&self) -> Duration {
        Duration::from_micros(self.deadline_micros.saturating_sub(self.reserved_at_micros))
    }
}

/// What a [`reserve`](super::Store::reserve) answered.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Reservation {
    /// The lease, when at least `at_least` units were granted.
    pub lease: Option<Lease>,
    /// The store's clock (µs) at the reservation.
    pub now_micros: u64,
    /// The latest deadline of the leases of this key and policy still
    /// outstanding in the store (this one included), if any is later than
    /// now: the units they hold may come back by then.
    pub held_until_micros: Option<u64>,
    /// With a lease: the policy's state once it was taken, as an admission
    /// of the `at_least` units (every quota's remaining and reset).
    pub decision: Option<Decision>,
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
        }
    }

    /// A reservation that granted nothing.
    pub fn empty(now_micros: u64, held_until_micros: Option<u64>) -> Self {
        Self {
            lease: None,
            now_micros,
            held_until_micros,
            decision: None,
        }
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
}

impl<'a> RefundRequest<'a> {
    /// A refund of `unused` units of `lease`.
    pub fn new(key: &'a WindowKey, policy: &'a Policy, lease: &'a Lease, unused: u32) -> Self {
        Self {
            key,
            policy,
            lease,
            unused,
        }
    }
}
