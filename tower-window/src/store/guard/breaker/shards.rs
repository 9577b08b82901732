//! [`Breakers`]: a store's breakers, one per failure domain, and what
//! they share.

use std::sync::{Arc, Mutex, OnceLock, Weak};

use super::machine::Breaker;
use super::{BreakerConfig, BreakerState};
use crate::metrics::LimiterMetrics;
use crate::sync::lock;
use crate::Clock;

/// The most failure domains a store keeps breakers for (a Redis Cluster's
/// hash slots); a larger id shares the breaker of its value modulo this.
pub(crate) const MAX_SHARDS: usize = 16_384;

/// A store's breakers: one for requests without a failure domain, and one
/// per failure domain, made on first use.
pub(crate) struct Breakers {
    shared: Arc<Shared>,
    store_wide: Breaker,
    /// `MAX_SHARDS` cells, allocated on the first request with a domain.
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

    /// The breaker of failure domain `shard`, made now if needed.
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

    /// The state of failure domain `shard`'s breaker, without making it.
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

    /// The worst state over every breaker.
    pub(crate) fn worst(&self) -> BreakerState {
        lock(&self.shared.tally).worst()
    }

    /// How many breakers are open.
    pub(crate) fn open(&self) -> usize {
        lock(&self.shared.tally).open
    }

    /// Reports the breakers' state to a capability's `metrics`, now and on
    /// every transition.
    pub(crate) fn observe(&self, metrics: &Arc<LimiterMetrics>) {
        let tally = lock(&self.shared.tally);
        metrics.breaker_state(tally.worst(), tally.open);
        lock(&self.shared.observers).push(Arc::downgrade(metrics));
    }
}

/// What every breaker of one store shares.
pub(super) struct Shared {
    pub(super) config: BreakerConfig,
    pub(super) clock: Arc<dyn Clock>,
    /// The metrics of each capability made from the store.
    observers: Mutex<Vec<Weak<LimiterMetrics>>>,
    tally: Mutex<Tally>,
}

/// How many breakers are open and half-open.
#[derive(Debug, Clone, Copy, Default)]
struct Tally {
    open: usize,
    half_open: usize,
}

impl Tally {
    fn worst(self) -> BreakerState {
        if self.open > 0 {
            BreakerState::Open
        } else if self.half_open > 0 {
            BreakerState::HalfOpen
        } else {
            BreakerState::Closed
        }
    }

    fn slot(&mut self, state: BreakerState) -> Option<&mut usize> {
        match state {
            BreakerState::Open => Some(&mut self.open),
            BreakerState::HalfOpen => Some(&mut self.half_open),
            BreakerState::Closed => None,
        }
    }
}

impl Shared {
    pub(super) fn new(config: BreakerConfig, clock: Arc<dyn Clock>) -> Arc<Self> {
        Arc::new(Self {
            config,
            clock,
            observers: Mutex::new(Vec::new()),
            tally: Mutex::new(Tally::default()),
        })
    }

    /// Counts one breaker's transition and reports it. Called under that
    /// breaker's lock (then the tally's), so transitions count in order.
    pub(super) fn transition(&self, from: BreakerState, to: BreakerState) {
        let mut tally = lock(&self.tally);
        if let Some(n) = tally.slot(from) {
            *n = n.saturating_sub(1);
        }
        if let Some(n) = tally.slot(to) {
            *n += 1;
        }
        let mut observers = lock(&self.observers);
        observers.retain(|observer| match observer.upgrade() {
            Some(metrics) => {
                metrics.breaker_transition(to, tally.worst(), tally.open);
                true
            }
            None => false,
        });
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
