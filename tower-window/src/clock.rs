//! Injectable time source.
//!
//! Every window is computed from a [`Clock`] reading in whole microseconds
//! since the Unix epoch. Production uses [`SystemClock`] (or, for Redis, the
//! server's own `TIME`); tests use [`ManualClock`] and never sleep.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of wall-clock time in whole microseconds since the Unix epoch.
///
/// Integer microseconds keep all window arithmetic exact (no floats) and fit
/// a `u64` for the next half million years.
pub trait Clock: Send + Sync + 'static {
    /// Microseconds since the Unix epoch.
    fn now_micros(&self) -> u64;
}

/// The operating system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_micros(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
            // A clock set before 1970 is treated as the epoch itself.
            .unwrap_or(0)
    }
}

/// A clock that moves only when told to; all clones share one time.
///
/// ```
/// use std::time::Duration;
/// use tower_window::{Clock, ManualClock};
///
/// let clock = ManualClock::new(1_000_000);
/// let other = clock.clone();
/// clock.advance(Duration::from_millis(5));
/// assert_eq!(other.now_micros(), 1_005_000);
/// ```
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    micros: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock that reads `micros` microseconds since the epoch.
    pub fn new(micros: u64) -> Self {
        Self {
            micros: Arc::new(AtomicU64::new(micros)),
        }
    }

    /// Moves the clock forward by `by` (saturating).
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_micros()).unwrap_or(u64::MAX);
        let _ = self
            .micros
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |t| {
                Some(t.saturating_add(by))
            });
    }

    /// Sets the clock to `micros` microseconds since the epoch.
    pub fn set(&self, micros: u64) {
        self.micros.store(micros, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_micros(&self) -> u64 {
        self.micros.load(Ordering::SeqCst)
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now_micros(&self) -> u64 {
        (**self).now_micros()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_clock_is_after_2020() {
        assert!(SystemClock.now_micros() > 1_577_836_800_000_000);
    }

    #[test]
    fn manual_clock_saturates() {
        let clock = ManualClock::new(u64::MAX - 1);
        clock.advance(Duration::from_secs(1));
        assert_eq!(clock.now_micros(), u64::MAX);
    }
}
