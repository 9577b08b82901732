//! A policy's slots locked together, and a policy decided on them.

use std::sync::{Arc, MutexGuard};

use smallvec::SmallVec;

use super::{MemoryStore, Slot, SlotInner, MAX_EVICTED_RETRIES};
use crate::algorithm::outcome::{policy_admits, policy_decision, Evaluation};
use crate::store::StoreError;
use crate::sync::lock;
use crate::{Decision, Policy, WindowKey};

/// The slots of every quota of a policy for one key, locked, in policy order.
pub(crate) struct Locked<'a> {
    pub(crate) guards: SmallVec<[MutexGuard<'a, SlotInner>; 4]>,
}

impl MemoryStore {
    /// Runs `f` with every slot of `policy` for `key` locked, in one global
    /// order (by address) so overlapping policies never deadlock. A slot
    /// found evicted is looked up again, with every lock let go meanwhile.
    pub(crate) fn with_policy_locked<T>(
        &self,
        key: &WindowKey,
        policy: &Policy,
        f: impl FnOnce(&mut Locked<'_>) -> T,
    ) -> T {
        let mut attempt = 0;
        loop {
            let slots: SmallVec<[Arc<Slot>; 4]> = policy
                .quotas()
                .iter()
                .map(|quota| self.slot(key, quota))
                .collect();
            let mut order: SmallVec<[usize; 4]> = (0..slots.len()).collect();
            order.sort_unstable_by_key(|&i| Arc::as_ptr(&slots[i]) as usize);
            let mut guards: SmallVec<[Option<MutexGuard<'_, SlotInner>>; 4]> =
                slots.iter().map(|_| None).collect();
            for &i in &order {
                guards[i] = Some(lock(&slots[i].inner));
            }
            let evicted = guards.iter().flatten().any(|inner| inner.evicted);
            if evicted && attempt < MAX_EVICTED_RETRIES {
                drop(guards);
                attempt += 1;
                continue;
            }
            let mut locked = Locked {
                guards: guards.into_iter().flatten().collect(),
            };
            return f(&mut locked);
        }
    }
}

impl Locked<'_> {
    /// Decides one request against `policy` at `now`: the cost (`cost_of`
    /// each quota's index) is committed only if every enforced quota fits,
    /// and then to every quota it fits.
    pub(crate) fn decide(
        &mut self,
        policy: &Policy,
        now: u64,
        cost_of: impl Fn(usize) -> u32,
    ) -> Result<Decision, StoreError> {
        let mut evaluations: SmallVec<[Evaluation; 4]> = SmallVec::new();
        for (i, (quota, inner)) in policy
            .quotas()
            .iter()
            .zip(self.guards.iter_mut())
            .enumerate()
        {
            inner.last_check = inner.last_check.max(now);
            evaluations.push(inner.state.evaluate(quota, now, cost_of(i)));
        }
        if policy_admits(policy, &evaluations) {
            for (i, ((quota, inner), evaluation)) in policy
                .quotas()
                .iter()
                .zip(self.guards.iter_mut())
                .zip(&evaluations)
                .enumerate()
            {
                if evaluation.fits() {
                    inner.state.commit(quota, now, cost_of(i));
                }
            }
        }
        decided(policy, &evaluations, now)
    }
}

/// The decision of `policy` from its quotas' evaluations.
pub(crate) fn decided(
    policy: &Policy,
    evaluations: &[Evaluation],
    now: u64,
) -> Result<Decision, StoreError> {
    policy_decision(policy, evaluations, now)
        .ok_or_else(|| StoreError::invalid("a policy without quotas"))
}
