//! [`MemoryStore`] peeks: a policy's windows read without recording.

use std::time::Duration;

use smallvec::SmallVec;

use super::{lock, MemoryStore};
use crate::algorithm::outcome::Evaluation;
use crate::algorithm::State;
use crate::key::state_key::StateKeyRef;
use crate::store::{CheckRequest, StoreError, StoreErrorKind};
use crate::{Decision, QuotaDecision};

impl MemoryStore {
    /// Evaluates every quota of the request's policy on its state (a key
    /// never checked reads as empty, and is not created): nothing is
    /// recorded and no entry is added. Like the Redis peek script, the
    /// evaluation drops state that has expired (it no longer counts either
    /// way), so both stores hold the same state after a peek even when the
    /// clock later steps back to before that expiry.
    pub(crate) fn peek_now(&self, request: CheckRequest<'_>) -> Result<Decision, StoreError> {
        if request.cost == 0 {
            return Err(StoreError::new(
                StoreErrorKind::InvalidRequest,
                "a request must cost at least 1 unit",
            ));
        }
        let now = self.clock.now_micros();
        let mut evaluations: SmallVec<[Evaluation; 4]> = SmallVec::new();
        for quota in request.policy.quotas() {
            let evaluation = match self.cache.get(&StateKeyRef::new(request.key, quota)) {
                Some(slot) => lock(&slot.inner).state.evaluate(quota, now, request.cost),
                None => State::empty(quota.algorithm()).evaluate(quota, now, request.cost),
            };
            evaluations.push(evaluation);
        }
        peek_decision(request, &evaluations, now)
    }
}

/// The decision a peek reports: each quota's state as it stands, admitted
/// where the cost would fit.
fn peek_decision(
    request: CheckRequest<'_>,
    evaluations: &[Evaluation],
    now: u64,
) -> Result<Decision, StoreError> {
    let micros = Duration::from_micros;
    let states = request
        .policy
        .quotas()
        .iter()
        .zip(evaluations)
        .map(|(quota, e)| {
            let (remaining, reset) = e.unchanged;
            if e.fits() {
                QuotaDecision::allow(quota.clone(), remaining, micros(reset))
            } else {
                QuotaDecision::deny(
                    quota.clone(),
                    remaining,
                    micros(reset),
                    e.outcome.retry_after.map(micros),
                )
            }
        });
    Decision::from_quotas(states)
        .map(|d| d.with_timestamp_micros(now))
        .ok_or_else(|| StoreError::new(StoreErrorKind::InvalidRequest, "a policy without quotas"))
}
