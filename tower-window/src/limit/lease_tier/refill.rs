//! Refill ahead of need: the check whose spend leaves its key's lease at the
//! low watermark starts the next reservation and answers at once.

use std::sync::Arc;

use futures_util::FutureExt;

use super::reserve::{Ask, Flight};
use super::slot::Slot;
use super::LeaseTier;
use crate::{Decision, Policy, WindowKey};

impl crate::Limiter {
    /// Starts the reservation ahead of need of `slot` (whose `refilling`
    /// the caller set): at once on an in-process store, else on the current
    /// Tokio runtime. With neither, answers the slot for the check to carry
    /// ([`refill_ahead`](Self::refill_ahead)).
    pub(super) fn start_refill(
        &self,
        tier: &LeaseTier,
        slot: Arc<Slot>,
        key: &WindowKey,
        policy: &Policy,
    ) -> Option<Arc<Slot>> {
        if self.inner.store.is_in_process() {
            // Ready at once; were it not, dropping it ends the flight.
            let _ = self.refill(tier, Flight(slot), key, policy).now_or_never();
            return None;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Some(slot);
        };
        let (limiter, flight) = (self.clone(), Flight(slot));
        let (key, policy) = (key.clone(), policy.clone());
        drop(runtime.spawn(async move {
            if let Some(tier) = &limiter.inner.leases {
                limiter.refill(tier, flight, &key, &policy).await;
            }
        }));
        None
    }

    /// A check admitted with `decision` that carries the reservation ahead
    /// of need (outside a Tokio runtime), answering once it is back.
    pub(in crate::limit) async fn refill_ahead(
        &self,
        slot: Arc<Slot>,
        key: &WindowKey,
        policy: &Policy,
        decision: Decision,
    ) -> Result<Decision, crate::LimitError> {
        if let Some(tier) = &self.inner.leases {
            self.refill(tier, Flight(slot), key, policy).await;
        }
        Ok(decision)
    }

    /// Reserves the next lease of `flight`'s slot ahead of need, giving
    /// back what its retired leases left. A failure changes nothing: the
    /// check that finds the lease empty decides.
    async fn refill(&self, tier: &LeaseTier, flight: Flight, key: &WindowKey, policy: &Policy) {
        let inner = &*self.inner;
        let slot = &flight.0;
        let (now, old, want, epoch) = {
            let mut state = slot.lock();
            let now = inner.clock.now_micros();
            let old = std::mem::take(&mut state.retired);
            let want = state.next_want(now, tier.config.max_units, &old);
            let epoch = tier.epoch.load(std::sync::atomic::Ordering::Acquire);
            (now, old, want, epoch)
        };
        let refunds = self.refunds_of(tier, &old, now);
        let ask = Ask {
            want,
            spend: 0,
            epoch,
            refunds: &refunds,
        };
        if let Err(error) = self.reserve_lease(tier, slot, key, policy, ask).await {
            tracing::debug!(
                kind = error.kind().as_str(),
                "quota lease reservation ahead of need failed; the key's next empty lease decides"
            );
        }
        drop(flight);
    }
}
