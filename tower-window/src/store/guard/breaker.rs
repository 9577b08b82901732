//! A circuit breaker in front of the store.
//!
//! Closed, every check reaches the store and its outcome is counted. After
//! [`consecutive_failures`](BreakerConfig::consecutive_failures) failures in a
//! row, a [`failure_ratio`](BreakerConfig::failure_ratio) over a rolling
//! window with enough calls, or a share of [slow calls](BreakerConfig::slow_calls)
//! over the same window, the breaker opens: checks go straight to the
//! fallback without touching the store. After the
//! [`cooldown`](BreakerConfig::cooldown) it is half-open: a few probe checks
//! reach the store; one fast success closes it, a failure or a slow success
//! opens it again.
//!
//! Time comes from the store handle's [`Clock`]; a call's latency is measured by
//! the caller and passed to [`Breaker::success`].
//!
//! # One breaker per failure domain
//!
//! A store may name independent failure domains for its requests
//! ([`limit::Backend::failure_domain`](crate::limit::Backend::failure_domain): for a Redis Cluster, the primary
//! that serves the key). The store handle then keeps one breaker per failure
//! domain, each with the same [`BreakerConfig`], created on the first check
//! that reaches that domain (at most [`MAX_SHARDS`] of them, plus one
//! store-wide breaker for requests without a domain). A dead cluster primary
//! opens its own breaker only; keys served by healthy primaries keep reaching
//! the store.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::time::Duration;

use crate::metrics::LimiterMetrics;
use crate::Clock;

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

type Hook = Arc<dyn Fn(BreakerState, BreakerState) + Send + Sync>;

/// Number of buckets of the rolling window (failure ratio and slow calls).
const BUCKETS: u64 = 10;
/// Ratios are kept in parts per million.
const RATIO_SCALE: u64 = 1_000_000;

/// When a circuit breaker opens and how it recovers.
///
/// Defaults: open after 5 consecutive failures, when at least 50 % of at
/// least 20 calls in the last 10 s failed, or when at least 50 % of at least
/// 20 calls in the last 10 s were successes slower than 25 ms; cool down
/// 1 s; 1 probe at a time while half-open.
///
/// The cooldown is short because an open breaker only saves the store one
/// probe per cooldown, while every second of it is a second of degraded
/// decisions after the store is back (a restarted Redis, a promoted
/// replica): with 1 s, keys are decided by the store again within about a
/// second of its recovery.
///
/// A [`Store`](crate::Store) whose backend names failure domains
/// ([`limit::Backend::failure_domain`](crate::limit::Backend::failure_domain);
/// a Redis Cluster's primaries) keeps one breaker with this configuration per failure domain: the counts,
/// the cooldown and the probes are per domain, so a dead primary opens only
/// its own breaker.
///
/// ```
/// use std::time::Duration;
/// use tower_window::BreakerConfig;
///
/// let config = BreakerConfig::default()
///     .consecutive_failures(3)
///     .failure_ratio(0.25, Duration::from_secs(30), 100)
///     .slow_calls(Duration::from_millis(50), 0.8, 100)
///     .cooldown(Duration::from_secs(2))
///     .half_open_probes(2)
///     .on_state_change(|from, to| eprintln!("breaker {from} -> {to}"));
/// # let _ = config;
/// ```
#[derive(Clone)]
#[must_use]
pub struct BreakerConfig {
    consecutive_failures: u32,
    /// The rolling window both ratio triggers count in.
    window: Duration,
    ratio: Option<RatioConfig>,
    slow: Option<SlowConfig>,
    cooldown: Duration,
    half_open_probes: u32,
    hook: Option<Hook>,
}

#[derive(Debug, Clone, Copy)]
struct RatioConfig {
    ratio_ppm: u64,
    min_calls: u64,
}

#[derive(Debug, Clone, Copy)]
struct SlowConfig {
    /// A success that took longer than this many microseconds is slow.
    threshold_micros: u64,
    ratio_ppm: u64,
    min_calls: u64,
}

/// A ratio in `[0, 1]` (clamped; NaN is 1) in parts per million.
fn ratio_ppm(ratio: f64) -> u64 {
    let ratio = if ratio.is_nan() {
        1.0
    } else {
        ratio.clamp(0.0, 1.0)
    };
    // In [0, RATIO_SCALE] by the clamp.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let ppm = (ratio * RATIO_SCALE as f64).round() as u64;
    ppm
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            consecutive_failures: 5,
            window: Duration::from_secs(10),
            ratio: Some(RatioConfig {
                ratio_ppm: RATIO_SCALE / 2,
                min_calls: 20,
            }),
            slow: Some(SlowConfig {
                threshold_micros: 25_000,
                ratio_ppm: RATIO_SCALE / 2,
                min_calls: 20,
            }),
            cooldown: Duration::from_secs(1),
            half_open_probes: 1,
            hook: None,
        }
    }
}

impl BreakerConfig {
    /// Open after `n` failures in a row; `0` turns this trigger off.
    pub fn consecutive_failures(mut self, n: u32) -> Self {
        self.consecutive_failures = n;
        self
    }

    /// Open when at least `ratio` (in `[0, 1]`, clamped) of the calls of the
    /// last `window` failed, once there were at least `min_calls` of them.
    ///
    /// The slow-call trigger ([`slow_calls`](Self::slow_calls)) counts in
    /// the same `window` (default 10 s).
    pub fn failure_ratio(mut self, ratio: f64, window: Duration, min_calls: u32) -> Self {
        self.window = window;
        self.ratio = Some(RatioConfig {
            ratio_ppm: ratio_ppm(ratio),
            min_calls: u64::from(min_calls.max(1)),
        });
        self
    }

    /// Turn the failure-ratio trigger off.
    pub fn without_failure_ratio(mut self) -> Self {
        self.ratio = None;
        self
    }

    /// Open when at least `ratio` (in `[0, 1]`, clamped) of the calls of the
    /// rolling window were successes that took longer than `threshold`, once
    /// there were at least `min_calls` calls (failed ones included) in it.
    ///
    /// The window is the failure ratio's (see
    /// [`failure_ratio`](Self::failure_ratio); default 10 s). A slow success
    /// of a half-open probe counts as a failed probe: the breaker opens
    /// again. Default: on, 50 % of at least 20 calls slower than 25 ms.
    pub fn slow_calls(mut self, threshold: Duration, ratio: f64, min_calls: u32) -> Self {
        self.slow = Some(SlowConfig {
            threshold_micros: duration_micros(threshold),
            ratio_ppm: ratio_ppm(ratio),
            min_calls: u64::from(min_calls.max(1)),
        });
        self
    }

    /// Turn the slow-call trigger off: a success is a success however long
    /// it took.
    pub fn without_slow_calls(mut self) -> Self {
        self.slow = None;
        self
    }

    /// How long the breaker stays open before probing (default 1 s).
    pub fn cooldown(mut self, cooldown: Duration) -> Self {
        self.cooldown = cooldown;
        self
    }

    /// How many probes may be in flight while half-open (default 1, at least 1).
    pub fn half_open_probes(mut self, n: u32) -> Self {
        self.half_open_probes = n.max(1);
        self
    }

    /// Calls `hook(from, to)` on every state change (for metrics and logs).
    /// It runs on the checking task, outside the breaker's lock: keep it short.
    ///
    /// With one breaker per failure domain (a sharded store such as a Redis
    /// Cluster) the hook sees every domain's transitions;
    /// [`Limiter::breaker_state`](crate::Limiter::breaker_state) gives the
    /// worst state over them.
    pub fn on_state_change<F>(mut self, hook: F) -> Self
    where
        F: Fn(BreakerState, BreakerState) + Send + Sync + 'static,
    {
        self.hook = Some(Arc::new(hook));
        self
    }
}

impl fmt::Debug for BreakerConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BreakerConfig")
            .field("consecutive_failures", &self.consecutive_failures)
            .field("window", &self.window)
            .field("ratio", &self.ratio)
            .field("slow", &self.slow)
            .field("cooldown", &self.cooldown)
            .field("half_open_probes", &self.half_open_probes)
            .field("hook", &self.hook.is_some())
            .finish()
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

#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    index: u64,
    ok: u64,
    failed: u64,
    /// Successes slower than the slow-call threshold (also counted in `ok`).
    slow: u64,
}

#[derive(Debug)]
struct State {
    mode: Mode,
    /// Bumped on every transition; outcomes of calls admitted under an
    /// older generation are ignored.
    generation: u64,
    consecutive: u32,
    buckets: [Bucket; BUCKETS as usize],
}

/// Permission for one store call.
#[derive(Debug)]
pub(crate) struct Ticket {
    generation: u64,
    probe: bool,
}

/// The most failure domains a store handle keeps breakers for (as many as a
/// Redis Cluster has hash slots, so at least one per possible primary). A
/// larger domain id shares the breaker of its value modulo this.
pub(crate) const MAX_SHARDS: usize = 16_384;

/// What every breaker of one store handle shares: configuration, clock,
/// the metrics of every capability made from the handle,
/// and the count of breakers per state.
struct Shared {
    config: BreakerConfig,
    clock: Arc<dyn Clock>,
    /// Capabilities made from the store handle: each exports the
    /// breakers' state under its own name.
    observers: Mutex<Vec<Weak<LimiterMetrics>>>,
    tally: Mutex<Tally>,
}

/// Breakers of one store handle that are open or half-open (the rest are closed).
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
    fn lock_tally(&self) -> MutexGuard<'_, Tally> {
        self.tally.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts one breaker's transition and reports it. Called under that
    /// breaker's lock (lock order: breaker, then tally), so each breaker's
    /// transitions are counted in order, and the gauges follow the tally.
    fn transition(&self, from: BreakerState, to: BreakerState) {
        let mut tally = self.lock_tally();
        if let Some(n) = tally.slot(from) {
            *n = n.saturating_sub(1);
        }
        if let Some(n) = tally.slot(to) {
            *n += 1;
        }
        let mut observers = self
            .observers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        observers.retain(|observer| match observer.upgrade() {
            Some(metrics) => {
                metrics.breaker_transition(to, tally.worst(), tally.open);
                true
            }
            None => false,
        });
    }
}

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
        let shared = Arc::new(Shared {
            config,
            clock,
            observers: Mutex::new(Vec::new()),
            tally: Mutex::new(Tally::default()),
        });
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
        let tally = self.shared.lock_tally();
        metrics.breaker_state(tally.worst(), tally.open);
        self.shared
            .observers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Arc::downgrade(metrics));
    }
}

/// A circuit breaker.
pub(crate) struct Breaker {
    shared: Arc<Shared>,
    state: Mutex<State>,
}

impl Breaker {
    #[cfg(test)]
    pub(crate) fn new(config: BreakerConfig, clock: Arc<dyn Clock>) -> Self {
        Self::with_shared(Arc::new(Shared {
            config,
            clock,
            observers: Mutex::new(Vec::new()),
            tally: Mutex::new(Tally::default()),
        }))
    }

    fn with_shared(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            state: Mutex::new(State {
                mode: Mode::Closed,
                generation: 0,
                consecutive: 0,
                buckets: [Bucket::default(); BUCKETS as usize],
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is consistent after every statement; a panic elsewhere
        // while holding the lock cannot corrupt it.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn state(&self) -> BreakerState {
        self.lock().mode.state()
    }

    /// Asks to call the store; `None` means go to the fallback.
    pub(crate) fn acquire(&self) -> Option<Ticket> {
        let now = self.shared.clock.now_micros();
        let mut state = self.lock();
        match state.mode {
            Mode::Closed => Some(Ticket {
                generation: state.generation,
                probe: false,
            }),
            Mode::Open { until_micros } if now >= until_micros => {
                let ticket = self.transition(&mut state, Mode::HalfOpen { probes: 1 });
                drop(state);
                self.notify(BreakerState::Open, BreakerState::HalfOpen);
                Some(Ticket {
                    generation: ticket,
                    probe: true,
                })
            }
            Mode::Open { .. } => None,
            Mode::HalfOpen { probes } if probes < self.shared.config.half_open_probes => {
                state.mode = Mode::HalfOpen { probes: probes + 1 };
                Some(Ticket {
                    generation: state.generation,
                    probe: true,
                })
            }
            Mode::HalfOpen { .. } => None,
        }
    }

    /// The store answered, after `latency` (measured by the caller, from
    /// sending the call to its answer).
    ///
    /// A success slower than the slow-call threshold counts toward the
    /// slow-call trigger; as a half-open probe it opens the breaker again.
    pub(crate) fn success(&self, ticket: Ticket, latency: Duration) {
        let now = self.shared.clock.now_micros();
        let slow = self
            .shared
            .config
            .slow
            .is_some_and(|slow| duration_micros(latency) > slow.threshold_micros);
        let mut state = self.lock();
        if ticket.generation != state.generation {
            return;
        }
        match state.mode {
            Mode::Closed => {
                state.consecutive = 0;
                self.count(&mut state, now, Outcome::Ok { slow });
                if self.slow_share_reached(&state, now) {
                    let open = self.open_mode(now);
                    self.transition(&mut state, open);
                    drop(state);
                    self.notify(BreakerState::Closed, BreakerState::Open);
                }
            }
            Mode::HalfOpen { .. } if ticket.probe && slow => {
                let open = self.open_mode(now);
                self.transition(&mut state, open);
                drop(state);
                self.notify(BreakerState::HalfOpen, BreakerState::Open);
            }
            Mode::HalfOpen { .. } if ticket.probe => {
                self.transition(&mut state, Mode::Closed);
                drop(state);
                self.notify(BreakerState::HalfOpen, BreakerState::Closed);
            }
            _ => {}
        }
    }

    /// The store failed.
    pub(crate) fn failure(&self, ticket: Ticket) {
        let now = self.shared.clock.now_micros();
        let mut state = self.lock();
        if ticket.generation != state.generation {
            return;
        }
        let from = state.mode.state();
        let open = self.open_mode(now);
        match state.mode {
            Mode::Closed => {
                state.consecutive = state.consecutive.saturating_add(1);
                self.count(&mut state, now, Outcome::Failed);
                if self.should_open(&state, now) || self.slow_share_reached(&state, now) {
                    self.transition(&mut state, open);
                    drop(state);
                    self.notify(from, BreakerState::Open);
                }
            }
            Mode::HalfOpen { .. } if ticket.probe => {
                self.transition(&mut state, open);
                drop(state);
                self.notify(from, BreakerState::Open);
            }
            _ => {}
        }
    }

    /// The call ended without an outcome: cancelled, or not a store fault
    /// (our own overload: the in-flight bound was full, the pool wait ran
    /// out). Never counts toward opening; a probe's slot is freed.
    pub(crate) fn release(&self, ticket: Ticket) {
        if !ticket.probe {
            return;
        }
        let mut state = self.lock();
        if ticket.generation != state.generation {
            return;
        }
        if let Mode::HalfOpen { probes } = state.mode {
            state.mode = Mode::HalfOpen {
                probes: probes.saturating_sub(1),
            };
        }
    }

    /// Moves to `mode`, resetting the counters; returns the new generation.
    fn transition(&self, state: &mut State, mode: Mode) -> u64 {
        // Under the lock, so the tally follows the transitions in order.
        self.shared.transition(state.mode.state(), mode.state());
        tracing::debug!(
            from = state.mode.state().as_str(),
            to = mode.state().as_str(),
            "circuit breaker transition"
        );
        state.mode = mode;
        state.generation = state.generation.wrapping_add(1);
        state.consecutive = 0;
        state.buckets = [Bucket::default(); BUCKETS as usize];
        state.generation
    }

    fn notify(&self, from: BreakerState, to: BreakerState) {
        if let Some(hook) = &self.shared.config.hook {
            hook(from, to);
        }
    }

    fn open_mode(&self, now: u64) -> Mode {
        Mode::Open {
            until_micros: now.saturating_add(duration_micros(self.shared.config.cooldown)),
        }
    }

    /// The width of one bucket, or `None` when no trigger uses the window.
    fn bucket_width(&self) -> Option<u64> {
        let config = &self.shared.config;
        if config.ratio.is_none() && config.slow.is_none() {
            return None;
        }
        Some((duration_micros(config.window) / BUCKETS).max(1))
    }

    fn count(&self, state: &mut State, now: u64, outcome: Outcome) {
        let Some(width) = self.bucket_width() else {
            return;
        };
        let index = now / width;
        let bucket = &mut state.buckets[(index % BUCKETS) as usize];
        if bucket.index != index {
            *bucket = Bucket {
                index,
                ..Bucket::default()
            };
        }
        match outcome {
            Outcome::Failed => bucket.failed += 1,
            Outcome::Ok { slow } => {
                bucket.ok += 1;
                bucket.slow += u64::from(slow);
            }
        }
    }

    /// The buckets' sum over the window ending at `now`.
    fn window_sum(&self, state: &State, now: u64) -> Option<Bucket> {
        let width = self.bucket_width()?;
        let index = now / width;
        let mut sum = Bucket::default();
        for bucket in &state.buckets {
            if bucket.index <= index && index - bucket.index < BUCKETS {
                sum.ok += bucket.ok;
                sum.failed += bucket.failed;
                sum.slow += bucket.slow;
            }
        }
        Some(sum)
    }

    /// Whether the failure triggers fire.
    fn should_open(&self, state: &State, now: u64) -> bool {
        let n = self.shared.config.consecutive_failures;
        if n > 0 && state.consecutive >= n {
            return true;
        }
        let (Some(ratio), Some(sum)) = (self.shared.config.ratio, self.window_sum(state, now))
        else {
            return false;
        };
        reached(
            sum.failed,
            sum.ok + sum.failed,
            ratio.ratio_ppm,
            ratio.min_calls,
        )
    }

    /// Whether the slow-call trigger fires (checked after every counted
    /// outcome, as a fast call or a failure may complete `min_calls`).
    fn slow_share_reached(&self, state: &State, now: u64) -> bool {
        let (Some(slow), Some(sum)) = (self.shared.config.slow, self.window_sum(state, now)) else {
            return false;
        };
        reached(
            sum.slow,
            sum.ok + sum.failed,
            slow.ratio_ppm,
            slow.min_calls,
        )
    }
}

/// How a counted call ended.
#[derive(Debug, Clone, Copy)]
enum Outcome {
    Ok { slow: bool },
    Failed,
}

/// Whether `part` of `total` calls is at least `ratio_ppm`, once there are
/// at least `min_calls` calls.
fn reached(part: u64, total: u64, ratio_ppm: u64, min_calls: u64) -> bool {
    total >= min_calls
        && u128::from(part) * u128::from(RATIO_SCALE) >= u128::from(ratio_ppm) * u128::from(total)
}

fn duration_micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::ManualClock;

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
