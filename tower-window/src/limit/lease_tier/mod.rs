//! The lease tier: per-key quota leases a node holds and spends locally.
//!
//! With leases on ([`LimiterBuilder::leases`](crate::LimiterBuilder::leases)),
//! a check of a hot key first spends from the key's live lease, with no
//! store call ([`DecisionSource::Lease`](crate::DecisionSource::Lease)).
//! When the lease is empty or past its deadline, the check reserves a new
//! one in one store call ([`lease::Backend::reserve`](crate::lease::Backend::reserve)) that
//! also admits the check itself; what an expired lease left unspent is
//! refunded in that same call, and a reservation that grants nothing
//! decides the check there too (admitted or denied, as a direct check):
//! one round trip per refill, whatever it finds. The store decides how many
//! units a lease gets (at most half of what is left, so one node cannot
//! take a window while others wait; see [`crate::lease`], "How much one
//! lease takes"), and guarantees the global bound.
//!
//! # Spending at memory speed
//!
//! A key's leases sit behind a short synchronous lock that is never held
//! across an `await`: a spend takes it, takes the units and lets go, so a
//! check that finds units in a live lease completes in its first poll,
//! whatever reservation of that key is in flight. Reservations are
//! single-flight per key: at most one is in flight, and a check that finds
//! the lease truly empty waits for that one (or, if none is in flight,
//! sends it) instead of sending its own. With
//! [`refill_ahead`](LeaseConfig::refill_ahead) (the default) the check whose
//! spend leaves half of the lease size or less starts the next reservation
//! and answers at once (the reservation runs on the current Tokio runtime,
//! or within the check on an in-process store), while every check keeps
//! spending what is left: a hot key waits for the store only when its lease
//! runs dry before the reservation comes back. A lease reserved ahead of
//! need is spent after the one before it.
//!
//! # Which keys lease
//!
//! Only keys hot enough to pay for a lease: a key checked at least
//! [`hot_after`](LeaseConfig::hot_after) times (default 8) within one lease
//! TTL, counted per key and policy over the current TTL-long period and the
//! one before it. The checks of other keys go to the store directly, as
//! without leases (one store call each, no reservation to refund), and cost
//! the tier one look at a fixed table of recent counts (`hotness.rs`): a
//! key gets a lease slot only once it is hot. A leased key that cools below
//! the rule gives back what its leases left at its next check, in that
//! check's store call, and is decided directly again.
//!
//! # Size, deadline, bound
//!
//! Lease size adapts per key: it starts at one unit, doubles each time a
//! lease is used up (or reaches the low watermark) before its deadline, halves
//! when one expires with units left, and never exceeds
//! [`LeaseConfig::max_units`].
//!
//! The local deadline is the limiter's clock reading when the reservation
//! was sent plus the lease's length on the store's clock, so it is never
//! later than the store's deadline (the reply comes after the store read
//! its clock), whatever the skew between the clocks.
//!
//! The tier is bounded like the local tier: a bounded cache of keys, one
//! small entry per key; a key evicted with a live lease loses its unspent
//! units until the store's records expire (under-admission, never over).
//!
//! A [shadow](crate::Quota::shadowed) quota of a leased policy is counted,
//! never enforced (see [`crate::lease`]): it holds part of each
//! lease (what it had room for), and a spend is its would-be admission
//! while that hold has the spend's units, its would-be denial otherwise —
//! reported in the admission's [`Decision::quotas`] and
//! [`Decision::shadow_denials`], so in `tower_window_shadow_denials_total`
//! and the `RateLimit-Policy` header as for a check that reached the store.
//! What a shadow quota still holds goes back with the lease's refund.
//!
//! [`Limiter::discard_leases`](crate::Limiter::discard_leases) (a tenant's
//! reset) drops every lease held, and a reservation in flight at that
//! moment is dropped when it comes back: no unit reserved before a reset
//! is spent after it.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use quick_cache::sync::{Cache, DefaultLifecycle};
use quick_cache::{DefaultHashBuilder, UnitWeighter};

use crate::key::state_key::{bounded_options, StateKey, StateKeyRef};
use crate::{Decision, Policy, WindowKey};

mod config;
mod counters;
mod direct;
mod give_back;
mod hotness;
mod refill;
mod reserve;
mod slot;
mod spend;

pub use config::LeaseConfig;
use counters::LeaseCounters;
pub use counters::LeaseStats;
use hotness::Hotness;
use slot::Slot;

type SlotCache = Cache<
    StateKey,
    Arc<Slot>,
    UnitWeighter,
    DefaultHashBuilder,
    DefaultLifecycle<StateKey, Arc<Slot>>,
>;

/// The leases of one limiter, by key and policy.
pub(crate) struct LeaseTier {
    slots: SlotCache,
    /// Recent checks per key: only a key found hot, or one with a slot,
    /// looks at `slots`.
    hotness: Hotness,
    pub(crate) config: LeaseConfig,
    pub(crate) counters: LeaseCounters,
    /// Set once the store answered that it does not support leases:
    /// checks then go to the store directly, without asking again.
    unsupported: AtomicBool,
    /// Moved by every discard: a reservation sent before it is not kept.
    epoch: AtomicU64,
}

/// What the lease tier answered a check without waiting.
pub(crate) enum Leased {
    /// Spent from a live lease (or denied until the key's next lease
    /// starts); with `Some(slot)` this check also carries the key's
    /// reservation ahead of need, and answers once it is back (only where
    /// it can run nowhere else: see `refill.rs`).
    Spent(Decision, Option<Arc<Slot>>),
    /// A key too cold to lease: decide in the store directly.
    Direct,
    /// The lease is empty: wait for the reservation in flight, or send it
    /// (whether the key is hot: a cold one decides directly instead).
    Empty(Arc<Slot>, bool),
}

impl LeaseTier {
    pub(crate) fn new(config: LeaseConfig, capacity: u64) -> Self {
        Self {
            slots: Cache::with_options(
                bounded_options(capacity.max(1)),
                UnitWeighter,
                DefaultHashBuilder::default(),
                DefaultLifecycle::default(),
            ),
            hotness: Hotness::new(),
            config,
            counters: LeaseCounters::default(),
            unsupported: AtomicBool::new(false),
            epoch: AtomicU64::new(0),
        }
    }

    /// The lease TTL of `policy` in µs, if its checks lease: the store
    /// supports leases and the TTL leaves room in every quota (else checks
    /// decide directly).
    pub(crate) fn lease_ttl(&self, policy: &Policy) -> Option<u64> {
        if self.unsupported.load(Ordering::Relaxed) {
            return None;
        }
        let ttl = self.config.ttl_micros_for(policy);
        policy
            .quotas()
            .iter()
            .all(|quota| crate::algorithm::lease::ttl_fits(quota, ttl))
            .then_some(ttl)
    }

    /// The lease slot of `key` under `policy`, made on first use.
    fn slot(&self, key: &WindowKey, policy: &Policy) -> Arc<Slot> {
        if let Some(slot) = self.slots.get(&StateKeyRef::for_policy(key, policy)) {
            return slot;
        }
        let owned = StateKey::for_policy(key, policy);
        match self.slots.get_or_insert_with(&owned, || {
            Ok::<_, std::convert::Infallible>(Arc::new(Slot::new()))
        }) {
            Ok(slot) => slot,
            Err(never) => match never {},
        }
    }

    /// Every slot (for refunds on shutdown, and discards).
    fn all(&self) -> Vec<Arc<Slot>> {
        self.slots.iter().map(|(_, slot)| slot).collect()
    }
}

impl fmt::Debug for LeaseTier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseTier")
            .field("config", &self.config)
            .field("keys", &self.slots.len())
            .finish()
    }
}
