//! [`BreakerConfig`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::window::BUCKETS;
use super::BreakerState;
use crate::clock::duration_micros;

type Hook = Arc<dyn Fn(BreakerState, BreakerState) + Send + Sync>;

/// Ratios are in parts per million.
const RATIO_SCALE: u64 = 1_000_000;

/// When a circuit breaker opens and how it recovers.
///
/// Defaults: open after 5 consecutive failures, when at least 50 % of at
/// least 20 calls in the last 10 s failed, or when at least 50 % of at least
/// 20 calls in the last 10 s were successes slower than 25 ms; cool down
/// 1 s; 1 probe at a time while half-open. The cooldown is short because
/// an open breaker saves the store only one probe per cooldown, while each
/// second of it is a second of degraded decisions after the store is back.
///
/// A [`Store`](crate::Store) keeps one breaker per failure domain
/// ([`limit::Backend::failure_domain`](crate::limit::Backend::failure_domain),
/// e.g. a Redis Cluster primary), with its own counts, cooldown and probes.
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

/// A share of at least `min_calls` calls in the window.
#[derive(Debug, Clone, Copy)]
pub(super) struct RatioConfig {
    ratio_ppm: u64,
    min_calls: u64,
}

impl RatioConfig {
    /// `ratio` clamped to `[0, 1]` (NaN is 1); `min_calls` at least 1.
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

    /// Open when at least `ratio` (clamped to `[0, 1]`) of at least
    /// `min_calls` calls of the last `window` failed. The slow-call trigger
    /// counts in the same `window`.
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

    /// Open when at least `ratio` (clamped to `[0, 1]`) of at least
    /// `min_calls` calls (failed ones included) in the
    /// [`failure_ratio`](Self::failure_ratio) window were successes slower
    /// than `threshold`. A slow half-open probe opens the breaker again.
    pub fn slow_calls(mut self, threshold: Duration, ratio: f64, min_calls: u32) -> Self {
        self.slow = Some(SlowConfig {
            threshold_micros: duration_micros(threshold),
            share: RatioConfig::new(ratio, min_calls),
        });
        self
    }

    /// Turn the slow-call trigger off.
    pub fn without_slow_calls(mut self) -> Self {
        self.slow = None;
        self
    }

    /// How long the breaker stays open before probing.
    pub fn cooldown(mut self, cooldown: Duration) -> Self {
        self.cooldown = cooldown;
        self
    }

    /// How many probes may be in flight while half-open (at least 1).
    pub fn half_open_probes(mut self, n: u32) -> Self {
        self.half_open_probes = n.max(1);
        self
    }

    /// Calls `hook(from, to)` on every state change of every failure
    /// domain's breaker. It runs on the calling task, outside the breaker's
    /// lock: keep it short.
    pub fn on_state_change<F>(mut self, hook: F) -> Self
    where
        F: Fn(BreakerState, BreakerState) + Send + Sync + 'static,
    {
        self.hook = Some(Arc::new(hook));
        self
    }

    /// The width of one bucket of the rolling window, if a trigger uses it.
    pub(super) fn bucket_width(&self) -> Option<u64> {
        if self.ratio.is_none() && self.slow.is_none() {
            return None;
        }
        Some((duration_micros(self.window) / BUCKETS).max(1))
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
