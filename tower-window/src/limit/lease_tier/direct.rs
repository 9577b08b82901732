//! Direct decisions of a leased key: the store decides a check as without
//! leases, when a reservation granted nothing, the key cooled down, or the
//! store could not lease.

use std::time::Duration;

use super::LeaseTier;
use crate::lease::{RefundRequest, Reservation, ReserveRequest};
use crate::store::CheckRequest;
use crate::{Decision, Policy, WindowKey};

impl crate::Limiter {
    /// A check of a key that cooled down, decided by the store in the call
    /// that gives back what its leases left.
    pub(super) async fn decide_cooled(
        &self,
        tier: &LeaseTier,
        key: &WindowKey,
        policy: &Policy,
        cost: crate::Cost,
        refunds: &[RefundRequest<'_>],
    ) -> Result<Decision, crate::LimitError> {
        if refunds.is_empty() {
            return self.decide_direct(key, policy, cost, None).await;
        }
        // A reservation of nothing that decides the check.
        let request = ReserveRequest::new(key, policy, 0, cost.get(), tier.config.ttl_for(policy))
            .refunding(refunds)
            .deciding();
        match self.call_leases(tier, request).await {
            Ok(Reservation {
                decision: Some(decision),
                ..
            }) => Ok(self.decided_directly(key, policy, cost, decision, None)),
            Ok(_) => self.decide_direct(key, policy, cost, None).await,
            Err(error) => self.fall_back(CheckRequest::new(key, policy, cost), error),
        }
    }

    /// The store decides this check as without leases, then as
    /// [`decided_directly`](Self::decided_directly).
    pub(super) async fn decide_direct(
        &self,
        key: &WindowKey,
        policy: &Policy,
        cost: crate::Cost,
        held_until: Option<u64>,
    ) -> Result<Decision, crate::LimitError> {
        let request = CheckRequest::new(key, policy, cost);
        match self.check_store(request).await {
            Ok(decision) => Ok(self.decided_directly(key, policy, cost, decision, held_until)),
            Err(error) => self.fall_back(request, error),
        }
    }

    /// A check the store decided directly, counted, its denial remembered
    /// by the local tier and waiting no longer than `held_until` (store
    /// clock), the latest deadline of the leases outstanding.
    pub(super) fn decided_directly(
        &self,
        key: &WindowKey,
        policy: &Policy,
        cost: crate::Cost,
        mut decision: Decision,
        held_until: Option<u64>,
    ) -> Decision {
        if let (false, Some(held_until), Some(retry)) =
            (decision.allowed, held_until, decision.retry_after)
        {
            let left = held_until.saturating_sub(decision.timestamp_micros);
            if left > 0 {
                decision.retry_after = Some(retry.min(Duration::from_micros(left)));
            }
        }
        self.note_stored(CheckRequest::new(key, policy, cost), false, &decision);
        decision
    }
}
