//! The lease tier's counters, read as [`LeaseStats`].

use std::sync::atomic::{AtomicU64, Ordering};

use super::LeaseTier;

#[derive(Default)]
pub(crate) struct LeaseCounters {
    pub(crate) granted: AtomicU64,
    pub(crate) spent: AtomicU64,
    pub(crate) refunded: AtomicU64,
    pub(crate) expired: AtomicU64,
    pub(crate) returned: AtomicU64,
    pub(crate) reservations: AtomicU64,
    pub(crate) waits: AtomicU64,
}

/// Counts of a limiter's lease units since it was built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct LeaseStats {
    /// Units the store granted in leases.
    pub granted: u64,
    /// Leased units admitted (with the reservation or locally).
    pub spent: u64,
    /// Units given back before their lease's deadline (on shutdown, say).
    pub refunded: u64,
    /// Units left unspent when their lease's deadline passed.
    pub expired_unspent: u64,
    /// Units the store took back from refunds of either kind.
    pub returned: u64,
    /// Reservations sent to the store (on demand or ahead of need).
    pub reservations: u64,
    /// Checks that waited for a reservation another check had in flight.
    pub waits: u64,
}

impl LeaseTier {
    fn stats(&self) -> LeaseStats {
        let c = &self.counters;
        LeaseStats {
            granted: c.granted.load(Ordering::Relaxed),
            spent: c.spent.load(Ordering::Relaxed),
            refunded: c.refunded.load(Ordering::Relaxed),
            expired_unspent: c.expired.load(Ordering::Relaxed),
            returned: c.returned.load(Ordering::Relaxed),
            reservations: c.reservations.load(Ordering::Relaxed),
            waits: c.waits.load(Ordering::Relaxed),
        }
    }
}

impl crate::Limiter {
    /// Counts of leased units since the limiter was built (`None` without
    /// leases).
    pub fn lease_stats(&self) -> Option<LeaseStats> {
        self.inner.leases.as_ref().map(LeaseTier::stats)
    }
}
