//! Retries of a store call.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder, Retryable};
use tokio::time::Instant;

use crate::store::StoreError;

/// How a failed store call is retried: only
/// [retryable](StoreError::is_retryable) errors, so a retry never charges
/// a request twice, with exponential backoff and full jitter (each wait
/// uniform between zero and the delay), and never past the time budget.
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

/// Runs `operation` with `retry`'s retries, never starting a wait that
/// would end past `deadline`; `on_retry` is called before each.
pub(crate) async fn with_retries<T, F, Fut>(
    retry: RetryConfig,
    operation: F,
    deadline: Option<Instant>,
    on_retry: impl Fn(),
) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let backoff = ExponentialBuilder::new()
        .with_min_delay(retry.min_delay)
        .with_max_delay(retry.max_delay)
        .with_max_times(retry.max_retries)
        .with_factor(2.0);
    operation
        .retry(full_jitter(backoff))
        .sleep(tokio::time::sleep)
        .when(StoreError::is_retryable)
        .notify(|error, _| {
            on_retry();
            tracing::debug!(kind = error.kind().as_str(), "retrying the store call");
        })
        .adjust(move |_, delay| {
            let delay = delay?;
            let end = Instant::now().checked_add(delay)?;
            deadline
                .is_none_or(|deadline| end < deadline)
                .then_some(delay)
        })
        .await
}

/// Each delay uniform in `[0, delay]` (backon's jitter adds to it instead).
fn full_jitter(
    backoff: ExponentialBuilder,
) -> impl Iterator<Item = Duration> + Send + Sync + Unpin {
    let mut rng = fastrand::Rng::new();
    backoff.build().map(move |delay| {
        let micros = crate::clock::duration_micros(delay);
        Duration::from_micros(rng.u64(0..=micros))
    })
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
            let delays: Vec<_> = full_jitter(builder).collect();
            assert_eq!(delays.len(), 6);
            for (delay, limit) in delays.iter().zip(limits) {
                assert!(*delay <= Duration::from_millis(limit));
            }
        }
    }
}
