//! Spending: a check of a leased key takes its units from the live lease
//! under the slot's short lock, with no store call, or learns what it must
//! do instead (reserve, wait, or go to the store directly).

use std::sync::atomic::Ordering;

use super::hotness::Looked;
use super::slot::Spend;
use super::{LeaseTier, Leased};
use crate::key::state_key::StateKeyRef;
use crate::{Policy, WindowKey};

impl crate::Limiter {
    /// How hot `key` is now (not counted yet), with its state key and the
    /// clock reading the look used.
    fn look_hot<'a>(
        &self,
        tier: &'a LeaseTier,
        ttl: u64,
        key: &'a WindowKey,
        policy: &'a Policy,
    ) -> (StateKeyRef<'a>, u64, Looked<'a>) {
        let state_key = StateKeyRef::for_policy(key, policy);
        let now = self.inner.clock.now_micros();
        let looked = tier
            .hotness
            .look_at(&state_key, now, ttl, tier.config.hot_checks);
        (state_key, now, looked)
    }

    /// The lease tier's answer without waiting: a spend from a live lease
    /// (the whole check, in its first poll; a spend that leaves the lease
    /// at its low watermark also starts the next reservation), or what the
    /// check must do; `ttl` is the policy's [`lease_ttl`](LeaseTier::lease_ttl).
    pub(in crate::limit) fn spend_leased(
        &self,
        tier: &LeaseTier,
        ttl: u64,
        key: &WindowKey,
        policy: &Policy,
        units: u32,
    ) -> Leased {
        let inner = &*self.inner;
        let (state_key, now, looked) = self.look_hot(tier, ttl, key, policy);
        let observed = looked.observed;
        looked.count();
        let hot = observed.checks >= tier.config.hot_checks;
        if !hot && !observed.slotted {
            // Cold, with no slot to give back from: as without leases, and
            // without touching the slot cache.
            return Leased::Direct;
        }
        let slot = tier.slot(key, policy);
        if !observed.slotted {
            tier.hotness.mark(&state_key, true);
        }
        let mut state = slot.lock();
        let now = state.dated(now, &*inner.clock);
        match state.spend(now, units) {
            Spend::Spent(decision) => {
                let refill = tier.config.refill_ahead && hot && !state.refilling && state.low();
                if refill {
                    state.refilling = true;
                }
                drop(state);
                self.count_spent(tier, policy, units);
                let carried = if refill {
                    self.start_refill(tier, slot, key, policy)
                } else {
                    None
                };
                return Leased::Spent(decision, carried);
            }
            Spend::Later(decision) => {
                drop(state);
                inner.stats.local_cache.fetch_add(1, Ordering::Relaxed);
                return Leased::Spent(decision, None);
            }
            Spend::Empty => {}
        }
        if !hot && !state.refilling && state.held.is_empty() && state.retired.is_empty() {
            drop(state);
            // Nothing left to give back: while cold, skip the slot.
            tier.hotness.mark(&state_key, false);
            return Leased::Direct;
        }
        drop(state);
        Leased::Empty(slot, hot)
    }

    /// Counts `units` spent from a lease by a check.
    pub(super) fn count_spent(&self, tier: &LeaseTier, policy: &Policy, units: u32) {
        let inner = &*self.inner;
        tier.counters
            .spent
            .fetch_add(u64::from(units), Ordering::Relaxed);
        inner.stats.lease.fetch_add(1, Ordering::Relaxed);
        inner
            .metrics
            .lease_units(policy.first(), "spent", u64::from(units));
    }
}
