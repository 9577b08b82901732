//! Spending: a check of a leased key takes its units from the live lease
//! under the slot's short lock, or learns what it must do instead.

use std::sync::atomic::{AtomicU64, Ordering};

use super::slot::Spend;
use super::{LeaseTier, Leased};
use crate::key::state_key::StateKeyRef;
use crate::{Policy, WindowKey};

impl crate::Limiter {
    /// The lease tier's answer without waiting: a spend from a live lease
    /// (a spend that leaves the lease at its low watermark also starts the
    /// next reservation), or what the check must do; `ttl` is the policy's
    /// [`lease_ttl`](LeaseTier::lease_ttl).
    pub(in crate::limit) fn spend_leased(
        &self,
        tier: &LeaseTier,
        ttl: u64,
        key: &WindowKey,
        policy: &Policy,
        units: u32,
    ) -> Leased {
        let inner = &*self.inner;
        let state_key = StateKeyRef::for_policy(key, policy);
        let now = inner.clock.now_micros();
        let observed = tier
            .hotness
            .count(&state_key, now, ttl, tier.config.hot_checks);
        let hot = observed.checks >= tier.config.hot_checks;
        if !hot && !observed.slotted {
            // Cold, with nothing to give back: skip the slot cache.
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
                let carried = refill.then(|| self.start_refill(tier, slot, key, policy));
                return Leased::Spent(decision, carried.flatten());
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
        self.inner.stats.lease.fetch_add(1, Ordering::Relaxed);
        self.count_lease_units(&tier.counters.spent, policy, "spent", units);
    }

    /// Adds `units` to `counter` and to the lease units metric of `event`.
    pub(super) fn count_lease_units(
        &self,
        counter: &AtomicU64,
        policy: &Policy,
        event: &'static str,
        units: u32,
    ) {
        counter.fetch_add(u64::from(units), Ordering::Relaxed);
        self.inner
            .metrics
            .lease_units(policy.first(), event, u64::from(units));
    }
}
