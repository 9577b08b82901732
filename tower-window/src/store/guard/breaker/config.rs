//! [`BreakerConfig`]: when a breaker opens and how it recovers.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::window::BUCKETS;
use super::BreakerState;
use crate::clock::duration_micros;

type Hook = Arc<dyn Fn(BreakerState, BreakerState) + Send + Sync>;

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
    pub(super) consecutive_failures: u32,
    /// The rolling window both ratio triggers count in.
    pub(super) window: Duration,
    pub(super) ratio: Option<RatioConfig>,
    pub(super) slow: Option<SlowConfig>,
    pub(super) cooldown: Duration,
    pub(super) half_open_probes: u32,
    pub(super) hook: Option<Hook>,
}

/// A share of the window's calls that trips the breaker, once the window
/// holds at least `min_calls` calls.
#[derive(Debug, Clone, Copy)]
pub(super) struct RatioConfig {
    ratio_ppm: u64,
    min_calls: u64,
}

impl RatioConfig {
    /// `ratio` in `[0, 1]` (clamped; NaN is 1) of at least `min_calls` (at least 1).
    fn new(ratio: f64, min_calls: u32) -> Self {
        let ratio = if ratio.is_nan() {
            1.0
        } else {
            ratio.clamp(0.0, 1.0)
        };
        // In [0, RATIO_SCALE] by the clamp.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let ratio_ppm = (ratio * RATIO_SCALE as f64).round() as u64;
        Self {
            ratio_ppm,
            min_calls: u64::from(min_calls.max(1)),
        }
    }

    /// Whether `part` of `total` calls reaches the share.
    pub(super) fn reached(self, part: u64, total: u64) -> bool {
        total >= self.min_calls
            && u128::from(part) * u128::from(RATIO_SCALE)
                >= u128::from(self.ratio_ppm) * u128::from(total)
    }
}

#[derive(Debug, Clone, Copy)]
pub(super) struct SlowConfig {
    /// A success that took longer than this many microseconds is slow.
    pub(super) threshold_micros: u64,
    pub(super) share: RatioConfig,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            consecutive_failures: 5,
            window: Duration::from_secs(10),
            ratio: Some(RatioConfig::new(0.5, 20)),
            slow: Some(SlowConfig {
                threshold_micros: 25_000,
                share: RatioConfig::new(0.5, 20),
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
        self.ratio = Some(RatioConfig::new(ratio, min_calls));
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
            share: RatioConfig::new(ratio, min_calls),
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

impl BreakerConfig {
    /// The width of one bucket of the rolling window, or `None` when no
    /// trigger uses the window.
    pub(super) fn bucket_width(&self) -> Option<u64> {
        if self.ratio.is_none() && self.slow.is_none() {
            return None;
        }
        Some((duration_micros(self.window) / BUCKETS).max(1))
    }
}
