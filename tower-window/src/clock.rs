//! Injectable time source.
//!
//! Every window is computed from a [`Clock`] reading in whole microseconds
//! since the Unix epoch. Production uses [`MonotonicClock`] (the embedded
//! store's default), [`SystemClock`], or, for Redis, the server's own `TIME`;
//! tests use [`ManualClock`] and never sleep.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `d` in whole microseconds, saturating at `u64::MAX` (about 584,000
/// years): every duration the crate turns into clock arithmetic.
pub(crate) fn duration_micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

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
            .map(duration_micros)
            // A clock set before 1970 is treated as the epoch itself.
            .unwrap_or(0)
    }
}

/// The wall clock read once per process, then advanced by the CPU's
/// monotonic counter: the default of [`MemoryStore`](crate::MemoryStore).
///
/// A reading is the Unix time of the process's first reading plus the time
/// elapsed since on [quanta]'s calibrated time-stamp counter (`CLOCK_MONOTONIC`
/// where the CPU has no invariant counter). That costs about 12 ns, where
/// [`SystemClock`]'s `clock_gettime` plus conversion costs about 42 ns (a
/// quarter of an in-memory check; `benches/README.md`). It never steps
/// backwards, and it does not follow later adjustments of the wall clock:
/// it drifts from it by the counter's calibration error (1.3 parts per
/// million measured here, about 0.1 s a day). Windows keep their length either
/// way; use [`SystemClock`] where readings must match other machines' clocks
/// to the millisecond over days.
///
/// ```
/// use tower_window::{Clock, MonotonicClock, SystemClock};
///
/// let a = MonotonicClock.now_micros();
/// let b = MonotonicClock.now_micros();
/// assert!(b >= a);
/// // Anchored to the wall clock: the two agree to well within a second.
/// assert!(SystemClock.now_micros().abs_diff(a) < 1_000_000);
/// ```
///
/// [quanta]: https://docs.rs/quanta
#[derive(Debug, Clone, Copy, Default)]
pub struct MonotonicClock;

/// The wall-clock reading [`MonotonicClock`] counts from.
struct Anchor {
    unix_micros: u64,
    counter: quanta::Clock,
    raw: u64,
}

fn anchor() -> &'static Anchor {
    static ANCHOR: OnceLock<Anchor> = OnceLock::new();
    ANCHOR.get_or_init(|| {
        // Calibrates the counter against CLOCK_MONOTONIC, once (~0.6 ms here).
        let counter = quanta::Clock::new();
        let raw = counter.raw();
        Anchor {
            unix_micros: SystemClock.now_micros(),
            counter,
            raw,
        }
    })
}

impl Clock for MonotonicClock {
    fn now_micros(&self) -> u64 {
        let anchor = anchor();
        let elapsed_nanos = anchor
            .counter
            .delta_as_nanos(anchor.raw, anchor.counter.raw());
        anchor.unix_micros.saturating_add(elapsed_nanos / 1_000)
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
        let by = duration_micros(by);
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

    /// Moves the clock forward to `micros`, if it reads less.
    pub(crate) fn advance_to(&self, micros: u64) {
        self.micros.fetch_max(micros, Ordering::SeqCst);
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
    fn monotonic_clock_follows_the_system_clock() {
        let system_before = SystemClock.now_micros();
        let mut last = MonotonicClock.now_micros();
        for _ in 0..1_000 {
            let now = MonotonicClock.now_micros();
            assert!(now >= last, "stepped back from {last} to {now}");
            last = now;
        }
        std::thread::sleep(Duration::from_millis(20));
        let now = MonotonicClock.now_micros();
        let system_after = SystemClock.now_micros();
        // It moved with real time (a sleep of at least 20 ms; the bound
        // leaves room for any calibration error), anchored to the wall
        // clock (a bound far above the drift, far below a wrong epoch).
        assert!(now >= last + 15_000, "{now} is not 20 ms after {last}");
        assert!(
            now.abs_diff(system_after) < 1_000_000,
            "{now} vs {system_after}"
        );
        assert!(now > system_before);
    }

    #[test]
    fn manual_clock_saturates() {
        let clock = ManualClock::new(u64::MAX - 1);
        clock.advance(Duration::from_secs(1));
        assert_eq!(clock.now_micros(), u64::MAX);
    }
}
