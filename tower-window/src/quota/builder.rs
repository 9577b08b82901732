//! [`QuotaBuilder`]: a quota from values, every one checked.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use super::id::validate_name;
use super::{Quota, QuotaData, QuotaError, Scope, DEFAULT_NAME, MAX_BUCKETS, MAX_WINDOW};
use crate::clock::duration_micros;
use crate::Algorithm;

/// Builds a [`Quota`], checking every value.
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct QuotaBuilder {
    name: Option<String>,
    limit: Option<u32>,
    /// Read by the DSL parser, for a sliding counter's default granularity.
    pub(super) window: Option<Duration>,
    algorithm: Algorithm,
    granularity: Option<Duration>,
    burst: Option<u32>,
    scope: Scope,
}

impl QuotaBuilder {
    /// Per subject (default) or per tenant; see [`Quota::scoped`].
    pub fn scope(mut self, scope: Scope) -> Self {
        self.scope = scope;
        self
    }

    /// Units admitted per window (at least 1).
    pub fn limit(mut self, limit: u32) -> Self {
        self.limit = Some(limit);
        self
    }

    /// The window length (whole milliseconds, at most [`MAX_WINDOW`]).
    pub fn window(mut self, window: Duration) -> Self {
        self.window = Some(window);
        self
    }

    /// The counting algorithm (default [`Algorithm::SlidingLog`]).
    pub fn algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = algorithm;
        self
    }

    /// Use [`Algorithm::SlidingCounter`] with this bucket width.
    pub fn granularity(mut self, granularity: Duration) -> Self {
        self.granularity = Some(granularity);
        self.algorithm = Algorithm::SlidingCounter { granularity };
        self
    }

    /// The GCRA burst (default: the limit). Only valid with [`Algorithm::Gcra`].
    pub fn burst(mut self, burst: u32) -> Self {
        self.burst = Some(burst);
        self
    }

    /// The quota's name (default `"default"`).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Checks every value and builds the quota.
    pub fn build(self) -> Result<Quota, QuotaError> {
        let limit = self.limit.ok_or(QuotaError::MissingLimit)?;
        let limit = NonZeroU32::new(limit).ok_or(QuotaError::ZeroLimit)?;
        let window = self.window.ok_or(QuotaError::MissingWindow)?;
        let window_micros = checked_millis_as_micros(window, QuotaError::ZeroWindow)?;
        let algorithm = match self.algorithm {
            Algorithm::SlidingCounter { granularity } => {
                let granularity = self.granularity.unwrap_or(granularity);
                let g = checked_millis_as_micros(granularity, QuotaError::ZeroGranularity)?;
                if !window_micros.is_multiple_of(g) {
                    return Err(QuotaError::GranularityDoesNotDivide {
                        granularity,
                        window,
                    });
                }
                let buckets = window_micros / g;
                if buckets > MAX_BUCKETS {
                    return Err(QuotaError::TooManyBuckets {
                        buckets,
                        max: MAX_BUCKETS,
                    });
                }
                Algorithm::SlidingCounter { granularity }
            }
            other => other,
        };
        let burst = match self.burst {
            None => None,
            Some(_) if algorithm != Algorithm::Gcra => {
                return Err(QuotaError::BurstWithoutGcra(algorithm.name()))
            }
            Some(b) => Some(NonZeroU32::new(b).ok_or(QuotaError::InvalidBurst(b.to_string()))?),
        };
        if algorithm == Algorithm::Gcra {
            // How far ahead GCRA's theoretical arrival time may run: bounded,
            // every sum stays below 2^53 µs, exact in Lua's doubles too.
            let capacity = u64::from(burst.unwrap_or(limit).get());
            let span = capacity.saturating_mul(window_micros.div_ceil(u64::from(limit.get())));
            if span > duration_micros(MAX_WINDOW) {
                return Err(QuotaError::BurstTooLarge);
            }
        }
        let name = self.name.as_deref().unwrap_or(DEFAULT_NAME);
        validate_name(name)?;
        let mut quota = Quota(Arc::new(QuotaData {
            id: Arc::from(""),
            name_len: 0,
            state_id_hash: 0,
            state_id: Arc::from(""),
            limit,
            window_micros,
            algorithm,
            burst,
            scope: self.scope,
            shadow: false,
            generation: 0,
            instance: None,
        }));
        quota.set_ids(name);
        Ok(quota)
    }
}

/// The smallest sliding-counter bucket dividing `window` into at most 60
/// whole-millisecond buckets.
pub fn default_granularity(window: Duration) -> Duration {
    let millis = u64::try_from(window.as_millis()).unwrap_or(u64::MAX).max(1);
    let buckets = (1..=60u64)
        .rev()
        .find(|n| millis.is_multiple_of(*n))
        .unwrap_or(1);
    Duration::from_millis(millis / buckets)
}

fn checked_millis_as_micros(d: Duration, zero: QuotaError) -> Result<u64, QuotaError> {
    if d.is_zero() {
        return Err(zero);
    }
    if d > MAX_WINDOW {
        return Err(QuotaError::WindowTooLong);
    }
    if !d.subsec_nanos().is_multiple_of(1_000_000) {
        return Err(QuotaError::Precision(d));
    }
    Ok(duration_micros(d))
}
