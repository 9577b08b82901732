//! Reserving: a check that finds its key's lease empty waits for the
//! reservation in flight or sends it, and every reservation is one store
//! call that also gives back what the key's old leases left and, when it
//! grants nothing, decides the check that sent it.

use std::pin::pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::slot::{shadow_holds, Held, Slot, Spend};
use super::LeaseTier;
use crate::lease::{RefundRequest, Reservation, ReserveRequest};
use crate::store::CheckRequest;
use crate::{Decision, Policy, WindowKey};

/// The one reservation a slot has in flight: when it ends, however it ends
/// (answered, failed, or its check or task dropped), the slot may reserve
/// again and the checks waiting for it look at the slot again.
pub(super) struct Flight(pub(super) Arc<Slot>);

impl Drop for Flight {
    fn drop(&mut self) {
        self.0.lock().refilling = false;
        self.0.refilled.notify_waiters();
    }
}

/// What a check with an empty lease does next.
enum Step {
    /// Spent from a lease that came back meanwhile.
    Spent(Decision),
    /// Answered by a remembered denial, or denied until the key's next
    /// lease starts.
    Remembered(Decision),
    /// Waits for the reservation in flight.
    Wait,
    /// The reservation it waited for failed: the fallback decides.
    Failed(crate::StoreErrorKind),
    /// Reserves: the clock, the leases to give back, the units wanted, the
    /// discard epoch.
    Reserve(u64, Vec<Held>, u32, u64),
}

/// What one reservation asks the store for.
pub(super) struct Ask<'h> {
    /// Units wanted.
    pub(super) want: u32,
    /// Units the reserving check spends at once (0 for a reservation ahead
    /// of need): that check is decided by the same call.
    pub(super) spend: u32,
    /// The discard epoch when it was sent.
    pub(super) epoch: u64,
    /// What the key's old leases left, given back first.
    pub(super) refunds: &'h [RefundRequest<'h>],
}

/// What a reservation leaves to do once it is back.
pub(super) enum Reserved {
    /// A lease, kept in the slot; the reservation's decision.
    Lease(Decision),
    /// Nothing granted, and the store decided the check (exactly as a
    /// direct check); the latest deadline of the leases outstanding.
    Decided(Decision, Option<u64>),
    /// Nothing granted and nothing decided (a store without leases, or one
    /// that does not decide): the latest deadline of the leases
    /// outstanding.
    Nothing(Option<u64>),
}

impl crate::Limiter {
    /// A check whose key's lease is empty: waits for the reservation in
    /// flight and spends from it, else answers a remembered denial, else
    /// sends the reservation itself (giving back what the old leases left,
    /// in the same call), or for a key too cold to lease decides in the
    /// store directly (giving them back in that call).
    pub(in crate::limit) async fn decide_leased(
        &self,
        slot: Arc<Slot>,
        hot: bool,
        key: &WindowKey,
        policy: &Policy,
        cost: crate::Cost,
    ) -> Result<Decision, crate::LimitError> {
        let inner = &*self.inner;
        let Some(tier) = &inner.leases else {
            return self.decide_direct(key, policy, cost, None).await;
        };
        let units = cost.get();
        let mut waited = false;
        let (now, old, want, epoch) = loop {
            // Registered before the look, so the end of a flight cannot
            // slip between the look and the wait.
            let mut notified = pin!(slot.refilled.notified());
            notified.as_mut().enable();
            let step = {
                let mut state = slot.lock();
                let now = inner.clock.now_micros();
                let spend = state.spend(now, units);
                if let Spend::Spent(decision) = spend {
                    Step::Spent(decision)
                } else if let Spend::Later(decision) = spend {
                    Step::Remembered(decision)
                } else if state.refilling {
                    Step::Wait
                } else if let Some(kind) = state.failed.filter(|_| waited) {
                    Step::Failed(kind)
                } else if let Some(decision) = inner.local.as_ref().and_then(|local| {
                    match local.lookup(key, policy, units, None) {
                        super::super::Lookup::Hit(decision) => Some(decision),
                        super::super::Lookup::Miss { .. } => None,
                    }
                }) {
                    Step::Remembered(decision)
                } else {
                    // This check reserves. The leases held cannot pay for it
                    // (empty, too small or over): give back what they left
                    // (a shadow quota's leftover too).
                    state.refilling = true;
                    let old = state.take_all();
                    let leftover_expired = old
                        .iter()
                        .any(|held| held.left > 0 && now >= held.local_deadline);
                    let max_units = tier.config.max_units.max(1);
                    let want = state.next_want(now, max_units, leftover_expired).max(units);
                    Step::Reserve(now, old, want, tier.epoch.load(Ordering::Acquire))
                }
            };
            match step {
                Step::Spent(decision) => {
                    self.count_spent(tier, policy, units);
                    return Ok(decision);
                }
                Step::Remembered(decision) => {
                    inner.stats.local_cache.fetch_add(1, Ordering::Relaxed);
                    return Ok(decision);
                }
                Step::Failed(kind) => {
                    let error = crate::StoreError::new(
                        kind,
                        "the quota lease reservation this check waited for failed",
                    );
                    return self.fall_back(CheckRequest::new(key, policy, cost), error);
                }
                Step::Wait => {
                    if !waited {
                        waited = true;
                        tier.counters.waits.fetch_add(1, Ordering::Relaxed);
                    }
                    notified.await;
                }
                Step::Reserve(now, old, want, epoch) => break (now, old, want, epoch),
            }
        };
        let flight = Flight(Arc::clone(&slot));
        let refunds = self.refunds_of(tier, &old, now);
        if !hot {
            // Cooled down: this check and the next ones go to the store.
            let decided = self.decide_cooled(tier, key, policy, cost, &refunds).await;
            drop(flight);
            return decided;
        }
        let ask = Ask {
            want,
            spend: units,
            epoch,
            refunds: &refunds,
        };
        let reserved = self.reserve(tier, &slot, key, policy, ask).await;
        drop(flight);
        match reserved {
            Ok(Reserved::Lease(decision)) => {
                inner.stats.store.fetch_add(1, Ordering::Relaxed);
                Ok(decision)
            }
            // Nothing to lease: the store decided this check exactly in the
            // same call, and a denial waits no longer than the leases other
            // nodes hold.
            Ok(Reserved::Decided(decision, held_until)) => {
                Ok(self.decided_directly(key, policy, cost, decision, held_until))
            }
            // A store that did not decide it: one more call.
            Ok(Reserved::Nothing(held_until)) => {
                self.decide_direct(key, policy, cost, held_until).await
            }
            Err(error) => self.fall_back(CheckRequest::new(key, policy, cost), error),
        }
    }

    /// Reserves up to `ask.want` units for `key` (at least `ask.spend`,
    /// which the reserving check spends at once, or 1 when none does),
    /// giving back `ask.refunds` first, and keeps the lease in `slot`,
    /// unless the leases were discarded since `ask.epoch`.
    pub(super) async fn reserve(
        &self,
        tier: &LeaseTier,
        slot: &Slot,
        key: &WindowKey,
        policy: &Policy,
        ask: Ask<'_>,
    ) -> Result<Reserved, crate::StoreError> {
        let inner = &*self.inner;
        let ttl = tier.config.ttl_for(policy);
        let spend = ask.spend;
        let at_least = spend.max(1);
        // A GCRA lease may start up to one TTL later, so that a near-empty
        // bucket gives a lease of the tokens it frees meanwhile rather than
        // of one token (a check that reserves it is denied until it starts:
        // the bucket had less room than the lease wanted, so the key is at
        // its limit).
        let mut request = ReserveRequest::new(key, policy, ask.want.max(at_least), at_least, ttl)
            .waiting_up_to(ttl)
            .refunding(ask.refunds);
        if spend > 0 {
            request = request.deciding();
        }
        let sent = inner.clock.now_micros();
        tier.counters.reservations.fetch_add(1, Ordering::Relaxed);
        let reserved = self.call_leases(request).await;
        self.count_returned(tier, ask.refunds, &reserved);
        let reservation = match reserved {
            Ok(reservation) => reservation,
            Err(error) => {
                let kind = error.kind();
                if kind == crate::StoreErrorKind::Unsupported {
                    tracing::warn!(
                        "the store does not support quota leases: checks go to it directly"
                    );
                    tier.unsupported.store(true, Ordering::Relaxed);
                }
                if !matches!(
                    kind,
                    crate::StoreErrorKind::Unsupported | crate::StoreErrorKind::InvalidRequest
                ) {
                    slot.lock().failed = Some(kind);
                    return Err(error);
                }
                // No lease for this store or policy (a GCRA quota too
                // small for the TTL, say): decide directly.
                Reservation::empty(0, None)
            }
        };
        slot.lock().failed = None;
        let held_until = reservation.held_until_micros;
        let Some(lease) = reservation.lease else {
            // The window is full: no more reservations ahead of need until
            // one grants again (the check that finds the lease empty asks).
            slot.lock().last_granted = 0;
            return Ok(match reservation.decision {
                Some(decision) if spend > 0 => Reserved::Decided(decision, held_until),
                _ => Reserved::Nothing(held_until),
            });
        };
        let Some(decision) = reservation.decision else {
            slot.lock().last_granted = 0;
            return Ok(Reserved::Nothing(held_until));
        };
        let granted = lease.granted;
        tier.counters
            .granted
            .fetch_add(u64::from(granted), Ordering::Relaxed);
        inner
            .metrics
            .lease_units(policy.first(), "granted", u64::from(granted));
        // Never earlier than the store's start: the reply came after the
        // store read its clock.
        let wait = lease
            .not_before_micros
            .saturating_sub(reservation.now_micros);
        let local_not_before = if wait == 0 {
            // Spendable at once (a check that read the clock just before
            // this reply must not find it "later").
            0
        } else {
            inner.clock.now_micros().saturating_add(wait)
        };
        let later = wait > 0;
        // A lease that starts later admits nobody now (it is only reserved
        // ahead of need, where nobody spends with the reservation).
        let spend = if later { 0 } else { spend };
        if spend > 0 {
            tier.counters
                .spent
                .fetch_add(u64::from(spend), Ordering::Relaxed);
            inner
                .metrics
                .lease_units(policy.first(), "spent", u64::from(spend));
        }
        let length = lease.deadline_micros.saturating_sub(reservation.now_micros);
        let local_deadline = sent.saturating_add(length);
        let left = granted.saturating_sub(spend);
        let shadow_left = shadow_holds(policy, &lease, spend);
        // What a spend of it reports: an admission (a lease that starts
        // later came with a denial until then, for the reserving check).
        let template = if later {
            let states = decision.quotas().iter().map(|state| {
                crate::QuotaDecision::allow(state.quota.clone(), 0, state.reset_after)
            });
            crate::Decision::from_quotas(states)
                .map(|d| d.with_timestamp_micros(decision.timestamp_micros))
                .unwrap_or_else(|| decision.clone())
        } else {
            decision.clone()
        };
        let held = Held {
            lease,
            left,
            shadow_left,
            local_deadline,
            local_not_before,
            sent,
            decision: template,
            key: key.clone(),
            policy: policy.clone(),
        };
        {
            let mut state = slot.lock();
            // A discard since the reservation was sent: its units belong to
            // the windows before the reset and are never spent (the store's
            // records expire).
            if tier.epoch.load(Ordering::Acquire) == ask.epoch {
                state.last_deadline = local_deadline;
                state.last_granted = granted;
                // Kept while it holds anything: a shadow quota's leftover
                // goes back with the refund even when nothing else is left.
                if held.holds_anything() {
                    state.held.push(held);
                }
            }
        }
        if let Some(local) = &inner.local {
            local.forget(key, policy);
        }
        Ok(Reserved::Lease(decision))
    }

    /// The one way the lease tier reaches its store: `request` (refunds, a
    /// reservation, the decision of a check that granted nothing) in one
    /// call, through the store's resilience stack.
    pub(super) async fn call_leases(
        &self,
        request: ReserveRequest<'_>,
    ) -> Result<Reservation, crate::StoreError> {
        let inner = &*self.inner;
        let windows = inner.windows.as_deref();
        inner
            .store
            .call(
                inner.lease_backend.as_deref(),
                "quota leases",
                |_| windows.and_then(|windows| windows.failure_domain(request.key, request.policy)),
                self.calls(request.policy),
                |leases, guard| leases.reserve(guard, request),
            )
            .await
    }
}
