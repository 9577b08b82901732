//! [`Breakers`]: a store handle's breakers, one per failure domain.

use std::sync::{Arc, OnceLock};

use super::machine::Breaker;
use super::shared::Shared;
use super::{BreakerConfig, BreakerState};
use crate::metrics::LimiterMetrics;
use crate::Clock;

/// The most failure domains a store handle keeps breakers for (as many as a
/// Redis Cluster has hash slots, so at least one per possible primary). A
/// larger domain id shares the breaker of its value modulo this.
pub(crate) const MAX_SHARDS: usize = 16_384;

/// The breakers of one store handle: a store-wide one for requests without a
/// failure domain, and one per failure domain (e.g. a Redis Cluster
/// primary), made on first use.
pub(crate) struct Breakers {
    shared: Arc<Shared>,
    store_wide: Breaker,
    /// Allocated when the first request with a failure domain arrives:
    /// `MAX_SHARDS` pointer-sized cells, each filled on its domain's first
    /// request.
    shards: OnceLock<Box<[OnceLock<Box<Breaker>>]>>,
}

impl Breakers {
    pub(crate) fn new(config: BreakerConfig, clock: Arc<dyn Clock>) -> Self {
        let shared = Shared::new(config, clock);
        Self {
            store_wide: Breaker::with_shared(shared.clone()),
            shared,
            shards: OnceLock::new(),
        }
    }

    /// The breaker guarding failure domain `shard` (`None`: the store-wide
    /// one), made now if it did not exist.
    pub(crate) fn get(&self, shard: Option<u16>) -> &Breaker {
        let Some(shard) = shard else {
            return &self.store_wide;
        };
        let cells = self.shards.get_or_init(|| {
            std::iter::repeat_with(OnceLock::new)
                .take(MAX_SHARDS)
                .collect()
        });
        cells[usize::from(shard) % MAX_SHARDS]
            .get_or_init(|| Box::new(Breaker::with_shared(self.shared.clone())))
    }

    /// The state of the breaker guarding failure domain `shard`, without
    /// making it (a breaker not made yet is closed).
    pub(crate) fn state_of(&self, shard: Option<u16>) -> BreakerState {
        match shard {
            None => self.store_wide.state(),
            Some(shard) => self
                .shards
                .get()
                .and_then(|cells| cells[usize::from(shard) % MAX_SHARDS].get())
                .map_or(BreakerState::Closed, |b| b.state()),
        }
    }

    /// The worst state over every breaker: open if any is open, else
    /// half-open if any is, else closed.
    pub(crate) fn worst(&self) -> BreakerState {
        self.shared.lock_tally().worst()
    }

    /// How many breakers are open (half-open ones not counted).
    pub(crate) fn open(&self) -> usize {
        self.shared.lock_tally().open
    }

    /// Exports the breakers' state in `metrics` (a capability made from
    /// the store handle) from now on, starting with the current state.
    pub(crate) fn observe(&self, metrics: &Arc<LimiterMetrics>) {
        self.shared.observe(metrics);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use super::*;
    use crate::ManualClock;

    const FAST: Duration = Duration::from_millis(1);

    #[test]
    fn one_breaker_per_shard_and_the_worst_state() {
        let clock = ManualClock::new(1_000_000_000);
        let config = BreakerConfig::default()
            .consecutive_failures(1)
            .cooldown(Duration::from_secs(1));
        let b = Breakers::new(config, Arc::new(clock.clone()));
        assert_eq!(b.worst(), BreakerState::Closed);
        assert!(
            b.shards.get().is_none(),
            "no shard table before a sharded call"
        );
        let s7 = b.get(Some(7));
        s7.failure(s7.acquire().unwrap());
        assert_eq!(b.state_of(Some(7)), BreakerState::Open);
        // Another shard and the store-wide breaker are untouched.
        assert!(b.get(Some(8)).acquire().is_some());
        assert!(b.get(None).acquire().is_some());
        assert_eq!(b.state_of(Some(9)), BreakerState::Closed);
        assert!(
            b.shards.get().unwrap()[9].get().is_none(),
            "not made by a read"
        );
        // Shards past the table share a cell modulo its size.
        assert!(std::ptr::eq(
            b.get(Some(7)),
            b.get(Some(7 + MAX_SHARDS as u16))
        ));
        let wide = b.get(None);
        wide.failure(wide.acquire().unwrap());
        assert_eq!((b.worst(), b.open()), (BreakerState::Open, 2));
        clock.advance(Duration::from_secs(1));
        let probe = s7.acquire().unwrap();
        let wide_probe = wide.acquire().unwrap();
        assert_eq!((b.worst(), b.open()), (BreakerState::HalfOpen, 0));
        s7.success(probe, FAST);
        assert_eq!(b.worst(), BreakerState::HalfOpen);
        wide.success(wide_probe, FAST);
        assert_eq!((b.worst(), b.open()), (BreakerState::Closed, 0));
    }
}
