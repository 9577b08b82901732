//! One key's leases, spent under a short synchronous lock.

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use smallvec::SmallVec;
use tokio::sync::Notify;

use crate::lease::Lease;
use crate::{Decision, DecisionSource, Policy, QuotaDecision, WindowKey};

/// A lease this node holds.
pub(crate) struct Held {
    pub(crate) lease: Lease,
    /// Units not spent yet.
    pub(crate) left: u32,
    /// Per quota, the units a shadow quota still holds (0 for enforced
    /// quotas); empty for a policy without shadow quotas.
    pub(crate) shadow_left: SmallVec<[u32; 4]>,
    /// On the limiter's clock (µs): spendable from `local_not_before` (a
    /// GCRA lease may start later) until `local_deadline`; reserved at
    /// `sent`.
    pub(crate) local_deadline: u64,
    pub(crate) local_not_before: u64,
    pub(crate) sent: u64,
    /// The reservation's decision, reported (aged) by local admissions.
    pub(crate) decision: Decision,
    /// Whose lease, for refunds that do not come from a check.
    pub(crate) key: WindowKey,
    pub(crate) policy: Policy,
}

impl Held {
    /// Spends `cost` of every shadow quota's hold that has it (its
    /// would-be admission); a shadow quota whose hold has less reports its
    /// would-be denial. The decision is rebuilt only when an answer changes.
    fn spend_shadows(&mut self, cost: u32) {
        let mut fits: SmallVec<[bool; 4]> = SmallVec::new();
        let mut changed = false;
        for (state, left) in self.decision.quotas().iter().zip(&mut self.shadow_left) {
            let fit = if state.quota.is_shadow() && *left >= cost {
                *left -= cost;
                true
            } else {
                !state.quota.is_shadow()
            };
            changed |= fit != state.allowed;
            fits.push(fit);
        }
        if !changed {
            return;
        }
        let states = self.decision.quotas().iter().zip(fits).map(|(state, fit)| {
            let mut state = state.clone();
            state.allowed = fit;
            state.retry_after = Some(if fit {
                Duration::ZERO
            } else {
                state.reset_after
            });
            state
        });
        if let Some(decision) = Decision::from_quotas(states) {
            self.decision = decision;
        }
    }

    /// Whether a refund would give anything back.
    pub(crate) fn holds_anything(&self) -> bool {
        self.left > 0 || self.shadow_left.iter().any(|units| *units > 0)
    }

    /// The denial of a check at `now`, before this lease starts.
    fn denial(&self, now: u64) -> Decision {
        let elapsed = Duration::from_micros(now.saturating_sub(self.sent));
        let wait = Duration::from_micros(self.local_not_before.saturating_sub(now));
        let states = self.decision.quotas().iter().map(|state| {
            let reset = state.reset_after.saturating_sub(elapsed).max(wait);
            QuotaDecision::deny(state.quota.clone(), 0, reset, Some(wait))
        });
        match Decision::from_quotas(states) {
            Some(decision) => decision
                .with_source(DecisionSource::LocalCache)
                .with_timestamp_micros(now),
            // Unreachable: a policy has quotas.
            None => self.decision.clone(),
        }
    }

    /// Spends `cost` units at `now` of a live lease that has them.
    fn spend(&mut self, now: u64, cost: u32) -> Decision {
        self.left -= cost;
        if !self.shadow_left.is_empty() {
            self.spend_shadows(cost);
        }
        let elapsed = Duration::from_micros(now.saturating_sub(self.sent));
        let mut decision = self
            .decision
            .clone()
            .aged(elapsed, Duration::ZERO)
            .with_source(DecisionSource::Lease)
            .with_timestamp_micros(now);
        decision.retry_after = Some(Duration::ZERO);
        decision
    }
}

/// What a spend found.
pub(crate) enum Spend {
    /// Units of a live lease: the admission.
    Spent(Decision),
    /// Only a lease that starts later: a denial until it starts.
    Later(Decision),
    /// Nothing to spend.
    Empty,
}

/// What each shadow quota of `policy` holds once the reserving check spent
/// `cost` of `lease` (empty without shadow quotas).
pub(crate) fn shadow_holds(policy: &Policy, lease: &Lease, cost: u32) -> SmallVec<[u32; 4]> {
    if !policy.quotas().iter().any(crate::Quota::is_shadow) {
        return SmallVec::new();
    }
    policy
        .quotas()
        .iter()
        .enumerate()
        .map(|(i, quota)| {
            let held = lease.held_by(i);
            match (quota.is_shadow(), held >= cost) {
                (true, true) => held - cost,
                (true, false) => held,
                (false, _) => 0,
            }
        })
        .collect()
}

/// One key's lease state, behind a lock never held across an `await`.
pub(crate) struct Slot {
    state: Mutex<SlotState>,
    /// Wakes the checks that wait for the reservation in flight.
    pub(crate) refilled: Notify,
}

impl Slot {
    pub(crate) fn new() -> Self {
        Self {
            state: Mutex::new(SlotState {
                want: 1,
                ..SlotState::default()
            }),
            refilled: Notify::new(),
        }
    }

    /// Once no reservation of this slot is in flight.
    pub(crate) async fn landed(&self) {
        loop {
            // Registered before the look, so the end of a flight cannot
            // slip between the look and the wait.
            let mut notified = std::pin::pin!(self.refilled.notified());
            notified.as_mut().enable();
            if !self.lock().refilling {
                return;
            }
            notified.await;
        }
    }

    /// The state (a poisoned lock is taken as it is).
    pub(crate) fn lock(&self) -> MutexGuard<'_, SlotState> {
        crate::sync::lock(&self.state)
    }
}

#[derive(Default)]
pub(crate) struct SlotState {
    /// Live leases, oldest first: the one being spent and the one reserved
    /// ahead of need (rarely more).
    pub(crate) held: Vec<Held>,
    /// Leases over that still hold units, given back by the key's next
    /// reservation or [`refund_leases`](crate::Limiter::refund_leases).
    pub(crate) retired: Vec<Held>,
    /// Units the next reservation asks for.
    pub(crate) want: u32,
    /// Units the last reservation got (less than `want` near a full
    /// window).
    pub(crate) last_granted: u32,
    /// The local deadline of the last lease (0: none yet).
    pub(crate) last_deadline: u64,
    /// A reservation of this key is in flight.
    pub(crate) refilling: bool,
    /// How the last reservation failed: the checks that waited for it
    /// fall back rather than wait for the store again.
    pub(crate) failed: Option<crate::StoreErrorKind>,
}

impl SlotState {
    /// Spends `cost` units at `now` from the oldest live lease that has
    /// them, after retiring leases that are over; with only one that
    /// starts later, a denial until it starts.
    pub(crate) fn spend(&mut self, now: u64, cost: u32) -> Spend {
        let over = self
            .held
            .extract_if(.., |held| now >= held.local_deadline || held.left == 0);
        self.retired.extend(over.filter(Held::holds_anything));
        if let Some(held) = self
            .held
            .iter_mut()
            .find(|held| held.left >= cost && now >= held.local_not_before)
        {
            return Spend::Spent(held.spend(now, cost));
        }
        match self.held.iter().find(|held| held.left >= cost) {
            Some(later) => Spend::Later(later.denial(now)),
            None => Spend::Empty,
        }
    }

    /// `now`, or a fresh reading of `clock` if a lease held was reserved
    /// after `now`: a spend is never dated before its lease.
    pub(crate) fn dated(&self, now: u64, clock: &dyn crate::Clock) -> u64 {
        if self.held.iter().any(|held| held.sent > now) {
            clock.now_micros()
        } else {
            now
        }
    }

    /// Units left in the live leases.
    pub(crate) fn left(&self) -> u64 {
        self.held.iter().map(|held| u64::from(held.left)).sum()
    }

    /// Whether what is left is at most half of the last lease (not of
    /// `want`: near a full window the store grants less).
    pub(crate) fn low(&self) -> bool {
        self.left() * 2 <= u64::from(self.last_granted.min(self.want))
    }

    /// The size of the next lease: halved if one of the leases `old` given
    /// back expired with units left, else doubled if the last one was used
    /// up (or reached the low watermark) before its deadline.
    pub(crate) fn next_want(&mut self, now: u64, max_units: u32, old: &[Held]) -> u32 {
        if old
            .iter()
            .any(|held| held.left > 0 && now >= held.local_deadline)
        {
            self.want = (self.want / 2).max(1);
        } else if self.last_deadline != 0 && now < self.last_deadline {
            self.want = self.want.saturating_mul(2).min(max_units.max(1));
        }
        self.want
    }

    /// Every lease held or retired, taken out.
    pub(crate) fn take_all(&mut self) -> Vec<Held> {
        let mut all = std::mem::take(&mut self.retired);
        all.append(&mut self.held);
        all
    }
}
