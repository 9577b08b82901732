//! One breaker's state machine.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::shards::Shared;
use super::window::{Outcome, Window};
use crate::clock::duration_micros;
use crate::sync::lock;

/// The state of a circuit breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BreakerState {
    /// Checks reach the store.
    Closed,
    /// Checks go to the fallback without a store call. The state stays
    /// `Open` after the cooldown until a check arrives and becomes a probe.
    Open,
    /// A few probe checks reach the store; the rest go to the fallback.
    HalfOpen,
}

impl BreakerState {
    /// A short, stable name for logs and metric labels.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::Open => "open",
            Self::HalfOpen => "half_open",
        }
    }
}

impl fmt::Display for BreakerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, Copy)]
enum Mode {
    Closed,
    Open { until_micros: u64 },
    HalfOpen { probes: u32 },
}

impl Mode {
    fn state(self) -> BreakerState {
        match self {
            Self::Closed => BreakerState::Closed,
            Self::Open { .. } => BreakerState::Open,
            Self::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }
}

#[derive(Debug)]
struct State {
    mode: Mode,
    /// Bumped on every transition; outcomes of calls admitted under an
    /// older generation are ignored.
    generation: u64,
    consecutive: u32,
    window: Window,
}

/// Permission for one store call.
#[derive(Debug)]
pub(crate) struct Ticket {
    generation: u64,
    probe: bool,
}

pub(crate) struct Breaker {
    shared: Arc<Shared>,
    state: Mutex<State>,
}

impl Breaker {
    pub(super) fn with_shared(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            state: Mutex::new(State {
                mode: Mode::Closed,
                generation: 0,
                consecutive: 0,
                window: Window::default(),
            }),
        }
    }

    pub(crate) fn state(&self) -> BreakerState {
        lock(&self.state).mode.state()
    }

    /// Asks to call the store; `None` means go to the fallback.
    pub(crate) fn acquire(&self) -> Option<Ticket> {
        let now = self.shared.clock.now_micros();
        let mut state = lock(&self.state);
        let (generation, probe) = match state.mode {
            Mode::Closed => (state.generation, false),
            Mode::Open { until_micros } if now >= until_micros => {
                (self.transition(state, Mode::HalfOpen { probes: 1 }), true)
            }
            Mode::HalfOpen { probes } if probes < self.shared.config.half_open_probes => {
                state.mode = Mode::HalfOpen { probes: probes + 1 };
                (state.generation, true)
            }
            Mode::Open { .. } | Mode::HalfOpen { .. } => return None,
        };
        Some(Ticket { generation, probe })
    }

    /// The store answered, after `latency`.
    pub(crate) fn success(&self, ticket: Ticket, latency: Duration) {
        let slow = self
            .shared
            .config
            .slow
            .is_some_and(|slow| duration_micros(latency) > slow.threshold_micros);
        self.settle(ticket, Outcome::Ok { slow });
    }

    pub(crate) fn failure(&self, ticket: Ticket) {
        self.settle(ticket, Outcome::Failed);
    }

    /// Counts a call's `outcome`, unless it was admitted under an older
    /// generation; a slow or failed half-open probe opens the breaker again.
    fn settle(&self, ticket: Ticket, outcome: Outcome) {
        let now = self.shared.clock.now_micros();
        let mut state = lock(&self.state);
        if ticket.generation != state.generation {
            return;
        }
        match (state.mode, outcome) {
            (Mode::Closed, _) => {
                let failed = matches!(outcome, Outcome::Failed);
                state.consecutive = if failed {
                    state.consecutive.saturating_add(1)
                } else {
                    0
                };
                let n = self.shared.config.consecutive_failures;
                let in_a_row = failed && n > 0 && state.consecutive >= n;
                if self.count_trips(&mut state, now, outcome) || in_a_row {
                    self.open(state, now);
                }
            }
            (Mode::HalfOpen { .. }, Outcome::Ok { slow: false }) if ticket.probe => {
                self.transition(state, Mode::Closed);
            }
            (Mode::HalfOpen { .. }, _) if ticket.probe => self.open(state, now),
            _ => {}
        }
    }

    /// The call ended without an outcome (cancelled, or not the store's
    /// fault): nothing is counted, and a probe's slot is freed.
    pub(crate) fn release(&self, ticket: Ticket) {
        if !ticket.probe {
            return;
        }
        let mut state = lock(&self.state);
        if ticket.generation != state.generation {
            return;
        }
        if let Mode::HalfOpen { probes } = state.mode {
            state.mode = Mode::HalfOpen {
                probes: probes.saturating_sub(1),
            };
        }
    }

    /// Moves to `mode`, resetting the counters, then lets the lock go and
    /// calls the hook; returns the new generation.
    fn transition(&self, mut state: MutexGuard<'_, State>, mode: Mode) -> u64 {
        let (from, to) = (state.mode.state(), mode.state());
        // Under the lock, so the tally follows the transitions in order.
        self.shared.transition(from, to);
        tracing::debug!(
            from = from.as_str(),
            to = to.as_str(),
            "circuit breaker transition"
        );
        state.mode = mode;
        state.generation = state.generation.wrapping_add(1);
        state.consecutive = 0;
        state.window = Window::default();
        let generation = state.generation;
        drop(state);
        if let Some(hook) = &self.shared.config.hook {
            hook(from, to);
        }
        generation
    }

    fn open(&self, state: MutexGuard<'_, State>, now: u64) {
        let cooldown = duration_micros(self.shared.config.cooldown);
        let until_micros = now.saturating_add(cooldown);
        self.transition(state, Mode::Open { until_micros });
    }

    /// Counts `outcome` in the rolling window, if a trigger uses it, and
    /// tells whether a trigger trips: the failure ratio after a failure,
    /// the slow-call share after any outcome (any may complete
    /// `min_calls`).
    fn count_trips(&self, state: &mut State, now: u64, outcome: Outcome) -> bool {
        let config = &self.shared.config;
        let Some(width) = config.bucket_width() else {
            return false;
        };
        state.window.count(width, now, outcome);
        let sum = state.window.sum(width, now);
        let total = sum.ok + sum.failed;
        let failed = matches!(outcome, Outcome::Failed);
        (failed
            && config
                .ratio
                .is_some_and(|ratio| ratio.reached(sum.failed, total)))
            || config
                .slow
                .is_some_and(|slow| slow.share.reached(sum.slow, total))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::store::guard::breaker::BreakerConfig;
    use crate::{Clock, ManualClock};

    impl Breaker {
        fn new(config: BreakerConfig, clock: Arc<dyn Clock>) -> Self {
            Self::with_shared(Shared::new(config, clock))
        }
    }

    const FAST: Duration = Duration::from_millis(1);
    const SLOW: Duration = Duration::from_millis(30);

    fn breaker(config: BreakerConfig) -> (Breaker, ManualClock) {
        let clock = ManualClock::new(1_000_000_000);
        (Breaker::new(config, Arc::new(clock.clone())), clock)
    }

    #[test]
    fn opens_after_consecutive_failures_and_recovers() {
        let changes = Arc::new(AtomicUsize::new(0));
        let seen = changes.clone();
        let config = BreakerConfig::default()
            .consecutive_failures(3)
            .without_failure_ratio()
            .cooldown(Duration::from_secs(1))
            .on_state_change(move |_, _| {
                seen.fetch_add(1, Ordering::SeqCst);
            });
        let (b, clock) = breaker(config);
        for _ in 0..2 {
            b.failure(b.acquire().unwrap());
        }
        b.success(b.acquire().unwrap(), FAST);
        for _ in 0..2 {
            b.failure(b.acquire().unwrap());
        }
        assert_eq!(b.state(), BreakerState::Closed);
        b.failure(b.acquire().unwrap());
        assert_eq!(b.state(), BreakerState::Open);
        assert!(b.acquire().is_none());
        clock.advance(Duration::from_millis(999));
        assert!(b.acquire().is_none());
        clock.advance(Duration::from_millis(1));
        let probe = b.acquire().unwrap();
        assert_eq!(b.state(), BreakerState::HalfOpen);
        assert!(b.acquire().is_none(), "one probe at a time");
        b.failure(probe);
        assert_eq!(b.state(), BreakerState::Open);
        clock.advance(Duration::from_secs(1));
        let probe = b.acquire().unwrap();
        b.success(probe, FAST);
        assert_eq!(b.state(), BreakerState::Closed);
        // closed->open, open->half, half->open, open->half, half->closed
        assert_eq!(changes.load(Ordering::SeqCst), 5);
    }

    #[test]
    fn opens_on_failure_ratio_with_minimum_calls() {
        let config = BreakerConfig::default()
            .consecutive_failures(0)
            .failure_ratio(0.5, Duration::from_secs(10), 10);
        let (b, clock) = breaker(config);
        // 4 failures, 5 successes: 9 calls, below the minimum.
        for i in 0..9 {
            let t = b.acquire().unwrap();
            if i % 2 == 0 {
                b.success(t, FAST);
            } else {
                b.failure(t);
            }
        }
        assert_eq!(b.state(), BreakerState::Closed);
        // Old calls leave the window.
        clock.advance(Duration::from_secs(11));
        for _ in 0..9 {
            b.success(b.acquire().unwrap(), FAST);
        }
        b.failure(b.acquire().unwrap());
        assert_eq!(b.state(), BreakerState::Closed, "1 of 10 failed");
        for _ in 0..8 {
            b.failure(b.acquire().unwrap());
        }
        assert_eq!(b.state(), BreakerState::Open, "9 of 18 failed");
    }

    #[test]
    fn stale_outcomes_and_released_probes() {
        let config = BreakerConfig::default()
            .consecutive_failures(1)
            .cooldown(Duration::from_secs(1))
            .half_open_probes(1);
        let (b, clock) = breaker(config);
        let late = b.acquire().unwrap();
        b.failure(b.acquire().unwrap());
        assert_eq!(b.state(), BreakerState::Open);
        // A success from a call that started while closed does not close it.
        b.success(late, FAST);
        assert_eq!(b.state(), BreakerState::Open);
        clock.advance(Duration::from_secs(1));
        let probe = b.acquire().unwrap();
        b.release(probe);
        let probe = b.acquire().unwrap();
        b.success(probe, FAST);
        assert_eq!(b.state(), BreakerState::Closed);
    }

    fn slow_only(min_calls: u32) -> BreakerConfig {
        BreakerConfig::default()
            .consecutive_failures(0)
            .without_failure_ratio()
            .slow_calls(Duration::from_millis(25), 0.5, min_calls)
            .cooldown(Duration::from_secs(1))
    }

    #[test]
    fn slow_calls_are_on_by_default() {
        let (b, _clock) = breaker(BreakerConfig::default());
        // Exactly the threshold is not slower than it.
        for _ in 0..20 {
            b.success(b.acquire().unwrap(), Duration::from_millis(25));
        }
        assert_eq!(b.state(), BreakerState::Closed, "25 ms is not slow");
        for _ in 0..19 {
            b.success(b.acquire().unwrap(), SLOW);
        }
        assert_eq!(b.state(), BreakerState::Closed, "19 slow of 39");
        b.success(b.acquire().unwrap(), SLOW);
        assert_eq!(b.state(), BreakerState::Open, "20 slow of 40");
    }

    #[test]
    fn opens_on_the_share_of_slow_calls() {
        let (b, _clock) = breaker(slow_only(10));
        // 5 fast, 4 slow: below the minimum and below half.
        for _ in 0..5 {
            b.success(b.acquire().unwrap(), FAST);
        }
        for _ in 0..4 {
            b.success(b.acquire().unwrap(), SLOW);
        }
        assert_eq!(b.state(), BreakerState::Closed);
        // Failures count as calls, not as slow calls.
        for _ in 0..2 {
            b.failure(b.acquire().unwrap());
        }
        b.success(b.acquire().unwrap(), SLOW);
        assert_eq!(b.state(), BreakerState::Closed, "5 slow of 12");
        b.success(b.acquire().unwrap(), SLOW);
        assert_eq!(b.state(), BreakerState::Closed, "6 slow of 13");
        b.success(b.acquire().unwrap(), SLOW);
        assert_eq!(b.state(), BreakerState::Open, "7 slow of 14");
        assert!(b.acquire().is_none());
    }

    #[test]
    fn slow_calls_below_the_minimum_do_not_open() {
        let (b, clock) = breaker(slow_only(10));
        for _ in 0..9 {
            b.success(b.acquire().unwrap(), SLOW);
        }
        assert_eq!(b.state(), BreakerState::Closed, "9 calls, all slow");
        // A fast call completing the minimum opens it: 9 slow of 10.
        let (fast_tenth, _c) = breaker(slow_only(10));
        for _ in 0..9 {
            fast_tenth.success(fast_tenth.acquire().unwrap(), SLOW);
        }
        fast_tenth.success(fast_tenth.acquire().unwrap(), FAST);
        assert_eq!(fast_tenth.state(), BreakerState::Open);
        // They leave the window before the tenth call arrives.
        clock.advance(Duration::from_secs(11));
        b.success(b.acquire().unwrap(), SLOW);
        assert_eq!(b.state(), BreakerState::Closed, "1 call in the window");
    }

    #[test]
    fn fast_calls_keep_it_closed() {
        let (b, _clock) = breaker(slow_only(10));
        for i in 0..1_000 {
            // Just under half of the calls are slow.
            let latency = if i % 2 == 0 { FAST } else { SLOW };
            b.success(b.acquire().unwrap(), latency);
            if i == 0 {
                b.success(b.acquire().unwrap(), FAST);
            }
        }
        assert_eq!(b.state(), BreakerState::Closed);
        let (b, _clock) = breaker(slow_only(10));
        for _ in 0..1_000 {
            b.success(b.acquire().unwrap(), FAST);
        }
        assert_eq!(b.state(), BreakerState::Closed);
        // Off: any latency is a success.
        let (b, _clock) = breaker(BreakerConfig::default().without_slow_calls());
        for _ in 0..1_000 {
            b.success(b.acquire().unwrap(), Duration::from_secs(60));
        }
        assert_eq!(b.state(), BreakerState::Closed);
    }

    #[test]
    fn a_slow_half_open_probe_reopens() {
        let (b, clock) = breaker(slow_only(2));
        b.success(b.acquire().unwrap(), SLOW);
        b.success(b.acquire().unwrap(), SLOW);
        assert_eq!(b.state(), BreakerState::Open);
        clock.advance(Duration::from_secs(1));
        let probe = b.acquire().unwrap();
        assert_eq!(b.state(), BreakerState::HalfOpen);
        b.success(probe, SLOW);
        assert_eq!(b.state(), BreakerState::Open, "a slow probe failed");
        assert!(b.acquire().is_none(), "a new cooldown started");
        clock.advance(Duration::from_secs(1));
        let probe = b.acquire().unwrap();
        b.success(probe, FAST);
        assert_eq!(b.state(), BreakerState::Closed);
        // The window starts empty after closing.
        b.success(b.acquire().unwrap(), SLOW);
        assert_eq!(b.state(), BreakerState::Closed, "1 call, below 2");
    }

    #[test]
    fn releases_never_count_toward_opening() {
        let config = BreakerConfig::default()
            .consecutive_failures(1)
            .failure_ratio(0.01, Duration::from_secs(10), 1)
            .slow_calls(Duration::ZERO, 0.01, 1)
            .cooldown(Duration::from_secs(1));
        let (b, clock) = breaker(config);
        for _ in 0..1_000 {
            b.release(b.acquire().unwrap());
        }
        assert_eq!(b.state(), BreakerState::Closed);
        // Nor do they in half-open: the probe slot is freed every time.
        b.failure(b.acquire().unwrap());
        clock.advance(Duration::from_secs(1));
        for _ in 0..1_000 {
            b.release(b.acquire().unwrap());
            assert_eq!(b.state(), BreakerState::HalfOpen);
        }
        b.success(b.acquire().unwrap(), Duration::ZERO);
        assert_eq!(b.state(), BreakerState::Closed);
    }
}
