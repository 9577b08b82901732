//! What every breaker of one store handle shares, and how their
//! transitions reach the metrics of each capability made from the handle.

use std::sync::{Arc, Mutex, MutexGuard, Weak};

use crate::sync::lock;

use super::{BreakerConfig, BreakerState};
use crate::metrics::LimiterMetrics;
use crate::Clock;

/// What every breaker of one store handle shares: configuration, clock,
/// the metrics of every capability made from the handle,
/// and the count of breakers per state.
pub(super) struct Shared {
    pub(super) config: BreakerConfig,
    pub(super) clock: Arc<dyn Clock>,
    /// Capabilities made from the store handle: each exports the
    /// breakers' state under its own name.
    observers: Mutex<Vec<Weak<LimiterMetrics>>>,
    tally: Mutex<Tally>,
}

/// Breakers of one store handle that are open or half-open (the rest are closed).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Tally {
    pub(super) open: usize,
    half_open: usize,
}

impl Tally {
    pub(super) fn worst(self) -> BreakerState {
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

    pub(super) fn lock_tally(&self) -> MutexGuard<'_, Tally> {
        lock(&self.tally)
    }

    /// Counts one breaker's transition and reports it. Called under that
    /// breaker's lock (lock order: breaker, then tally), so each breaker's
    /// transitions are counted in order, and the gauges follow the tally.
    pub(super) fn transition(&self, from: BreakerState, to: BreakerState) {
        let mut tally = self.lock_tally();
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

    /// Reports every transition to `metrics` from now on, starting with
    /// the current state.
    pub(super) fn observe(&self, metrics: &Arc<LimiterMetrics>) {
        let tally = self.lock_tally();
        metrics.breaker_state(tally.worst(), tally.open);
        lock(&self.observers).push(Arc::downgrade(metrics));
    }
}
