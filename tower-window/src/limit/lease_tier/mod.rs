//! The lease tier: per-key quota leases a node holds and spends locally.
//!
//! With leases on ([`LimiterBuilder::leases`](crate::LimiterBuilder::leases)),
//! a check of a hot key spends from the key's live lease with no store call.
//! An empty or expired lease is replaced by one reservation
//! ([`lease::Backend::reserve`](crate::lease::Backend::reserve)) that also
//! admits the check, refunds what the old lease left, and decides the check
//! directly when it grants nothing: one round trip per refill. The store
//! sizes leases and keeps the global bound (see [`crate::lease`]).
//!
//! A key's leases sit behind a short synchronous lock never held across an
//! `await`, so a spend completes in the check's first poll. Reservations
//! are single-flight per key: a check that finds the lease empty waits for
//! the one in flight or sends it. With
//! [`refill_ahead`](LeaseConfig::refill_ahead) the spend that leaves half
//! of the lease or less starts the next reservation and answers at once.
//!
//! Only keys checked [`hot_after`](LeaseConfig::hot_after) times within one
//! lease TTL lease (counted in `hotness.rs` without a slot per key); others
//! go to the store directly. A leased key that cools gives back what its
//! leases left in its next check's store call.
//!
//! Lease size starts at one unit, doubles when a lease is used up (or
//! reaches the low watermark) before its deadline, halves when one expires
//! with units left, and never exceeds [`LeaseConfig::max_units`]. The local
//! deadline is the limiter's clock when the reservation was sent plus the
//! lease's length on the store's clock, so it is never later than the
//! store's deadline whatever the clock skew. A key evicted from the bounded
//! slot cache loses its unspent units (under-admission, never over).
//!
//! A [shadow](crate::Quota::shadowed) quota of a leased policy holds part of
//! each lease; a spend is its would-be admission while that hold has the
//! units, its would-be denial otherwise (reported as for a store check).
//!
//! [`Limiter::discard_leases`](crate::Limiter::discard_leases) drops every
//! lease, and a reservation in flight then is dropped when it comes back:
//! no unit reserved before a reset is spent after it.

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

/// The leases of one limiter, by key and policy.
pub(crate) struct LeaseTier {
    slots: Cache<StateKey, Arc<Slot>>,
    /// Only a key found hot, or one with a slot, looks at `slots`.
    hotness: Hotness,
    pub(crate) config: LeaseConfig,
    pub(crate) counters: LeaseCounters,
    /// The store answered that it does not support leases: checks go to
    /// it directly.
    unsupported: AtomicBool,
    /// Moved by every discard: a reservation sent before it is not kept.
    epoch: AtomicU64,
}

/// What the lease tier answered a check without waiting.
pub(crate) enum Leased {
    /// Spent from a live lease (or denied until the key's next lease
    /// starts); with `Some(slot)` the check carries the key's reservation
    /// ahead of need (see `refill.rs`).
    Spent(Decision, Option<Arc<Slot>>),
    /// A key too cold to lease: decide in the store directly.
    Direct,
    /// The lease is empty: wait for the reservation in flight, or send it;
    /// whether the key is hot (a cold one decides directly).
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

    /// The lease TTL of `policy` in µs, if its checks lease (the store
    /// supports leases and the TTL fits every quota).
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

    /// Every slot (for refunds on shutdown and discards).
    fn all(&self) -> Vec<Arc<Slot>> {
        self.slots.iter().map(|(_, slot)| slot).collect()
    }
}
