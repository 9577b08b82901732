//! Reserving: a check that finds its key's lease empty waits for the
//! reservation in flight or sends it. A reservation is one store call that
//! also gives back what the key's old leases left and, when it grants
//! nothing, decides the check that sent it.

use std::pin::pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::slot::{shadow_holds, Held, Slot, Spend};
use super::LeaseTier;
use crate::lease::{RefundRequest, Reservation, ReserveRequest};
use crate::limit::local::Lookup;
use crate::store::CheckRequest;
use crate::{Decision, Policy, WindowKey};

/// The one reservation a slot has in flight: when it ends, however it ends
/// (answered, failed, or dropped), the slot may reserve again and the
/// checks waiting for it look again.
pub(super) struct Flight(pub(super) Arc<Slot>);

impl Drop for Flight {
    fn drop(&mut self) {
        self.0.lock().refilling = false;
        self.0.refilled.notify_waiters();
    }
}

/// What a check with an empty lease does next, once the slot's lock is let
/// go.
enum Step {
    /// Spent from a lease that came back meanwhile.
    Spent(Decision),
    /// A remembered denial, or a denial until the key's next lease starts.
    Remembered(Decision),
    /// Waits for the reservation in flight.
    Wait,
    /// The reservation it waited for failed: the fallback decides.
    Failed(crate::StoreErrorKind),
}

/// What one reservation asks the store for.
pub(super) struct Ask<'h> {
    pub(super) want: u32,
    /// Units the reserving check spends at once, decided by the same call
    /// (0 for a reservation ahead of need).
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
    /// Nothing granted, and the store decided the check as a direct check
    /// would; the latest deadline of the leases outstanding.
    Decided(Decision, Option<u64>),
    /// Nothing granted and nothing decided; the latest deadline of the
    /// leases outstanding.
    Nothing(Option<u64>),
}

impl crate::Limiter {
    /// A check whose key's lease is empty: spends from the reservation in
    /// flight once it is back, else answers a remembered denial, else sends
    /// the reservation itself (or, for a key that cooled, decides directly),
    /// giving back what the old leases left in the same call.
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
                } else if let Some(Lookup::Hit(decision)) = inner
                    .local
                    .as_ref()
                    .map(|local| local.lookup(CheckRequest::new(key, policy, cost)))
                {
                    Step::Remembered(decision)
                } else {
                    // This check reserves, giving back what the leases held
                    // left (a shadow quota's leftover too).
                    state.refilling = true;
                    let old = state.take_all();
                    let want = state.next_want(now, tier.config.max_units, &old).max(units);
                    break (now, old, want, tier.epoch.load(Ordering::Acquire));
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
            }
        };
        let flight = Flight(Arc::clone(&slot));
        let refunds = self.refunds_of(tier, &old, now);
        if !hot {
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
        let reserved = self.reserve_lease(tier, &slot, key, policy, ask).await;
        drop(flight);
        match reserved {
            Ok(Reserved::Lease(decision)) => {
                inner.stats.store.fetch_add(1, Ordering::Relaxed);
                Ok(decision)
            }
            // A denial waits no longer than the leases other nodes hold.
            Ok(Reserved::Decided(decision, held_until)) => {
                Ok(self.decided_directly(key, policy, cost, decision, held_until))
            }
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
    pub(super) async fn reserve_lease(
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
        // bucket leases the tokens it frees meanwhile rather than one.
        let mut request = ReserveRequest::new(key, policy, ask.want.max(at_least), at_least, ttl)
            .waiting_up_to(ttl)
            .refunding(ask.refunds);
        request.decides = spend > 0;
        let sent = inner.clock.now_micros();
        tier.counters.reservations.fetch_add(1, Ordering::Relaxed);
        let reserved = self.call_leases(tier, request).await;
        let reservation = match reserved {
            Ok(reservation) => reservation,
            Err(error) => match error.kind() {
                crate::StoreErrorKind::Unsupported => {
                    tracing::warn!(
                        "the store does not support quota leases: checks go to it directly"
                    );
                    tier.unsupported.store(true, Ordering::Relaxed);
                    Reservation::empty(0, None)
                }
                // No lease for this policy (a GCRA quota too small for the
                // TTL, say): decide directly.
                crate::StoreErrorKind::InvalidRequest => Reservation::empty(0, None),
                kind => {
                    slot.lock().failed = Some(kind);
                    return Err(error);
                }
            },
        };
        slot.lock().failed = None;
        let held_until = reservation.held_until_micros;
        let (lease, decision) = match (reservation.lease, reservation.decision) {
            (Some(lease), Some(decision)) => (lease, decision),
            (_, decision) => {
                // The window is full: no reservation ahead of need until one
                // grants again.
                slot.lock().last_granted = 0;
                return Ok(match decision {
                    Some(decision) if spend > 0 => Reserved::Decided(decision, held_until),
                    _ => Reserved::Nothing(held_until),
                });
            }
        };
        let granted = lease.granted;
        self.count_lease_units(&tier.counters.granted, policy, "granted", granted);
        let wait = lease
            .not_before_micros
            .saturating_sub(reservation.now_micros);
        let later = wait > 0;
        // Spendable at once (0), even by a check that read the clock just
        // before this reply; a lease that starts later admits nobody now.
        let (local_not_before, spend) = if later {
            (inner.clock.now_micros().saturating_add(wait), 0)
        } else {
            (0, spend)
        };
        if spend > 0 {
            self.count_lease_units(&tier.counters.spent, policy, "spent", spend);
        }
        let length = lease.deadline_micros.saturating_sub(reservation.now_micros);
        let local_deadline = sent.saturating_add(length);
        let left = granted.saturating_sub(spend);
        let shadow_left = shadow_holds(policy, &lease, spend);
        // What a spend of it reports: an admission (the reserving check of a
        // lease that starts later got a denial until then).
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
            // After a discard, units reserved before it are never spent.
            if tier.epoch.load(Ordering::Acquire) == ask.epoch {
                state.last_deadline = local_deadline;
                state.last_granted = granted;
                // A shadow quota's leftover alone keeps it, for the refund.
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

    /// The one way the lease tier reaches its store: `request` in one call
    /// through the store's resilience stack. Counts what its refunds got
    /// back; a failed call leaves their units counted until the store's
    /// records expire.
    pub(super) async fn call_leases(
        &self,
        tier: &LeaseTier,
        request: ReserveRequest<'_>,
    ) -> Result<Reservation, crate::StoreError> {
        let inner = &*self.inner;
        let windows = inner.windows.as_deref();
        let result = inner
            .store
            .call(
                inner.lease_backend.as_deref(),
                "quota leases",
                |_| windows.and_then(|windows| windows.failure_domain(request.key, request.policy)),
                self.calls(request.policy),
                |leases, guard| leases.reserve(guard, request),
            )
            .await;
        match &result {
            _ if request.refunds.is_empty() => {}
            Ok(reservation) => {
                let returned = u64::from(reservation.refunded);
                tier.counters
                    .returned
                    .fetch_add(returned, Ordering::Relaxed);
            }
            Err(error) => tracing::debug!(
                kind = error.kind().as_str(),
                "quota lease refund failed; its units count until the lease's records expire"
            ),
        }
        result
    }
}
