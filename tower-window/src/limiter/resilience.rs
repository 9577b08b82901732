//! Bounding one store call: a time budget, retries with backoff, and a cap
//! on the store calls in flight on this node.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder, Retryable};
use futures_util::future::BoxFuture;
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

use crate::store::{StoreError, StoreErrorKind};

/// Default time budget of one decision's store call, retries included.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);

/// Default bound on store calls in flight per limiter.
pub(crate) const DEFAULT_MAX_IN_FLIGHT: usize = 1024;

/// How a failed store call is retried.
///
/// Only errors the store marks retryable ([`StoreError::is_retryable`]:
/// unavailable, and certainly not applied — connection refused, cluster
/// down or resharding; never a reset after the command was sent, so a retry
/// never charges a request twice) are retried,
/// with exponential backoff and full jitter (each wait is uniformly random
/// between zero and the exponential delay). A retry whose wait would end
/// past the time budget is not made.
///
/// Default: up to 2 retries, delays from 2 ms doubling up to 20 ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct RetryConfig {
    max_retries: usize,
    min_delay: Duration,
    max_delay: Duration,
}

impl Default for RetryConfig {
    fn default() -> Self {
        Self {
            max_retries: 2,
            min_delay: Duration::from_millis(2),
            max_delay: Duration::from_millis(20),
        }
    }
}

impl RetryConfig {
    /// Never retry.
    pub fn none() -> Self {
        Self {
            max_retries: 0,
            ..Self::default()
        }
    }

    /// Retry at most `n` times after the first attempt.
    pub fn max_retries(mut self, n: usize) -> Self {
        self.max_retries = n;
        self
    }

    /// The exponential delay starts at `min` and doubles up to `max`
    /// (before jitter).
    pub fn delays(mut self, min: Duration, max: Duration) -> Self {
        self.min_delay = min;
        self.max_delay = max.max(min);
        self
    }

    /// The configured number of retries.
    pub fn retries(&self) -> usize {
        self.max_retries
    }
}

/// The bounds put on each store call.
pub(crate) struct Resilience {
    pub(crate) timeout: Option<Duration>,
    pub(crate) retry: RetryConfig,
    pub(crate) in_flight: Option<Semaphore>,
}

impl Resilience {
    /// No timeout, no retries, no in-flight bound: a bare store call.
    pub(crate) fn bare() -> Self {
        Self {
            timeout: None,
            retry: RetryConfig::none(),
            in_flight: None,
        }
    }

    /// Reserves a slot for one store call, or `None` when the node already
    /// has as many in flight as allowed.
    pub(crate) fn try_reserve(&self) -> Result<Option<SemaphorePermit<'_>>, StoreError> {
        match &self.in_flight {
            None => Ok(None),
            Some(semaphore) => semaphore.try_acquire().map(Some).map_err(|_| {
                StoreError::new(
                    StoreErrorKind::Overloaded,
                    "too many store calls in flight on this node",
                )
            }),
        }
    }

    /// Runs one store operation with retries, all within the time budget;
    /// `on_retry` is called before each retry (for metrics). Generic over
    /// the operation: a policy check, and whatever else a limiter asks of
    /// its store, take the same budget and retry rules.
    ///
    /// Boxed: this path's state (timer, backoff) is large, and only stores
    /// behind a network take it. Keeping it out of line keeps the limiter's
    /// own future small for in-process stores, which it moves on every check.
    pub(crate) fn call<'a, T, Op>(
        &'a self,
        operation: Op,
        on_retry: impl Fn() + Send + Sync + 'a,
    ) -> BoxFuture<'a, Result<T, StoreError>>
    where
        T: Send + 'a,
        Op: Fn() -> BoxFuture<'a, Result<T, StoreError>> + Send + Sync + 'a,
    {
        Box::pin(async move {
            // A budget too large to represent is no budget.
            let deadline = self
                .timeout
                .and_then(|budget| Instant::now().checked_add(budget));
            let attempts = self.with_retries(&operation, deadline, &on_retry);
            match (self.timeout, deadline) {
                (Some(budget), Some(deadline)) => tokio::time::timeout_at(deadline, attempts)
                    .await
                    .unwrap_or_else(|_| {
                        Err(StoreError::new(
                            StoreErrorKind::Timeout,
                            format!("no store decision within {budget:?}"),
                        ))
                    }),
                _ => attempts.await,
            }
        })
    }

    async fn with_retries<'a, T>(
        &self,
        operation: &(dyn Fn() -> BoxFuture<'a, Result<T, StoreError>> + Send + Sync + 'a),
        deadline: Option<Instant>,
        on_retry: &(dyn Fn() + Send + Sync + 'a),
    ) -> Result<T, StoreError> {
        if self.retry.max_retries == 0 {
            return operation().await;
        }
        let backoff = ExponentialBuilder::new()
            .with_min_delay(self.retry.min_delay)
            .with_max_delay(self.retry.max_delay)
            .with_max_times(self.retry.max_retries)
            .with_factor(2.0);
        operation
            .retry(FullJitter(backoff))
            .sleep(tokio::time::sleep)
            // Only errors where the store certainly did not apply the
            // operation: a retry never charges a request twice.
            .when(StoreError::is_retryable)
            .notify(|error, _| {
                on_retry();
                tracing::debug!(kind = error.kind().as_str(), "retrying the store call");
            })
            .adjust(move |_, delay| {
                let delay = delay?;
                // Never start a wait that would end past the budget.
                match (deadline, Instant::now().checked_add(delay)) {
                    (_, None) => None,
                    (Some(deadline), Some(end)) if end >= deadline => None,
                    _ => Some(delay),
                }
            })
            .await
    }
}

/// Full jitter over an exponential backoff: each delay is uniformly random
/// in `[0, delay]` (backon's own jitter adds to the delay instead).
#[derive(Debug, Clone, Copy)]
struct FullJitter(ExponentialBuilder);

impl BackoffBuilder for FullJitter {
    type Backoff = FullJitterBackoff;

    fn build(self) -> Self::Backoff {
        FullJitterBackoff {
            inner: self.0.build(),
            rng: fastrand::Rng::new(),
        }
    }
}

struct FullJitterBackoff {
    inner: <ExponentialBuilder as BackoffBuilder>::Backoff,
    rng: fastrand::Rng,
}

impl Iterator for FullJitterBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let delay = self.inner.next()?;
        let micros = u64::try_from(delay.as_micros()).unwrap_or(u64::MAX);
        Some(Duration::from_micros(self.rng.u64(0..=micros)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_jitter_stays_within_the_exponential_delay() {
        let builder = ExponentialBuilder::new()
            .with_min_delay(Duration::from_millis(2))
            .with_max_delay(Duration::from_millis(20))
            .with_max_times(6);
        let limits = [2, 4, 8, 16, 20, 20];
        for _ in 0..100 {
            let delays: Vec<_> = FullJitter(builder).build().collect();
            assert_eq!(delays.len(), 6);
            for (delay, limit) in delays.iter().zip(limits) {
                assert!(*delay <= Duration::from_millis(limit));
            }
        }
    }
}
