//! Giving leases back: refunds ride on the key's next store call, or go all
//! at once on shutdown; a reset drops them instead.

use std::sync::atomic::Ordering;

use super::slot::Held;
use super::LeaseTier;
use crate::lease::{RefundRequest, ReserveRequest};

impl crate::Limiter {
    /// The refunds of what the leases `old` left, counted as refunded (or
    /// as expired unspent, past their deadline at `now`).
    pub(super) fn refunds_of<'h>(
        &self,
        tier: &LeaseTier,
        old: &'h [Held],
        now: u64,
    ) -> Vec<RefundRequest<'h>> {
        old.iter()
            .filter(|held| held.holds_anything())
            .map(|held| {
                let expired = now >= held.local_deadline;
                let (counter, event) = if expired {
                    (&tier.counters.expired, "expired")
                } else {
                    (&tier.counters.refunded, "refunded")
                };
                self.count_lease_units(counter, &held.policy, event, held.left);
                let shadow_unused = (!held.shadow_left.is_empty()).then_some(&held.shadow_left[..]);
                RefundRequest {
                    shadow_unused,
                    ..RefundRequest::new(&held.key, &held.policy, &held.lease, held.left)
                }
            })
            .collect()
    }

    /// Gives back the unspent units of every lease this limiter holds, and
    /// answers how many units the store took back (0 without leases). Call
    /// it on graceful shutdown so that other nodes can use them at once; a
    /// reservation in flight is waited for and given back too, leases taken
    /// afterwards are not.
    pub async fn refund_leases(&self) -> u64 {
        let Some(tier) = &self.inner.leases else {
            return 0;
        };
        let before = tier.counters.returned.load(Ordering::Relaxed);
        for slot in tier.all() {
            slot.landed().await;
            let held = slot.lock().take_all();
            let now = self.inner.clock.now_micros();
            let refunds = self.refunds_of(tier, &held, now);
            let Some(first) = refunds.first() else {
                continue;
            };
            // One call per key: a reservation of nothing, carrying them.
            let ttl = tier.config.ttl_for(first.policy);
            let request =
                ReserveRequest::new(first.key, first.policy, 0, 1, ttl).refunding(&refunds);
            // What it gives back is counted in `returned`.
            let _ = self.call_leases(tier, request).await;
        }
        tier.counters
            .returned
            .load(Ordering::Relaxed)
            .saturating_sub(before)
    }

    /// Drops every lease this limiter holds without refunding it, and
    /// answers how many units were dropped: for a reset of the windows,
    /// after which held units must not be spent. A reservation in flight is
    /// dropped when it comes back. The store's records of those leases are
    /// left to expire (a reset that deletes the windows' keys should delete
    /// the policy's `:lr`/`:lx` lease keys too).
    pub async fn discard_leases(&self) -> u64 {
        let Some(tier) = &self.inner.leases else {
            return 0;
        };
        tier.epoch.fetch_add(1, Ordering::AcqRel);
        let mut dropped = 0;
        for slot in tier.all() {
            for held in slot.lock().take_all() {
                dropped += u64::from(held.left);
            }
        }
        dropped
    }
}
