//! [`Settlement`]: a reservation settled exactly once, whatever ends the
//! request, without waiting for the store where the request ends.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use tokio::sync::Notify;

use super::{Reserved, SettleRequest};
use crate::store::{CheckRequest, StoreError, StoreErrorKind};
use crate::{Cost, Decision, Limiter, Policy, WindowKey};

/// The settle of one reservation, owed until [`settle`](Self::settle)
/// runs or the value is dropped, which settles a usage of 0 (a request that
/// ended before anything was used: the inner service failed, or the
/// response was abandoned). Either way it settles exactly once.
///
/// The store call runs at once on an in-process store; otherwise in a task
/// on the current Tokio runtime, which [`Limiter::settled`] waits for (call
/// it on shutdown). A settle the store refused before recording anything
/// (unreachable during a failover or a restart, breaker open) is tried
/// again with backoff for up to 10 s. Outside a runtime the settle is lost and counted in
/// [`LimiterStats::settle_errors`](crate::LimiterStats::settle_errors).
///
/// ```
/// use tower_window::limit::{Reserved, Settlement};
/// use tower_window::{Limiter, MemoryStore, Quota, WindowKey};
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let limiter = Limiter::new(MemoryStore::new(), "1000/1m".parse::<Quota>()?);
/// let key = WindowKey::for_subject("alice");
/// let decision = limiter.reserve(&key, limiter.policy(), 400).await?;
/// let owed = Settlement::new(&limiter, &key, limiter.policy(), Reserved::of(&decision, 400));
/// owed.settle(250);
/// limiter.settled().await;
/// assert_eq!(limiter.peek_policy(&key, limiter.policy(), 1).await?.remaining(), 750);
/// assert_eq!(limiter.stats().settled, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Debug)]
#[must_use = "dropping a settlement settles a usage of 0"]
pub struct Settlement {
    owed: Option<Owed>,
}

#[derive(Debug)]
struct Owed {
    limiter: Limiter,
    key: WindowKey,
    policy: Policy,
    reserved: Reserved,
}

impl Settlement {
    /// The settle owed for `reserved` units of `key` under `policy`.
    pub fn new(limiter: &Limiter, key: &WindowKey, policy: &Policy, reserved: Reserved) -> Self {
        Self {
            owed: Some(Owed {
                limiter: limiter.clone(),
                key: key.clone(),
                policy: policy.clone(),
                reserved,
            }),
        }
    }

    /// What the reservation recorded.
    pub fn reserved(&self) -> Reserved {
        self.owed
            .as_ref()
            .map_or(Reserved::NONE, |owed| owed.reserved)
    }

    /// Settles `usage` units (see [`Limiter::settle`]).
    pub fn settle(mut self, usage: u32) {
        self.finish(usage);
    }

    fn finish(&mut self, usage: u32) {
        if let Some(owed) = self.owed.take() {
            owed.settle(usage);
        }
    }
}

impl Drop for Settlement {
    fn drop(&mut self) {
        self.finish(0);
    }
}

impl Owed {
    fn settle(self, usage: u32) {
        let Self {
            limiter,
            key,
            policy,
            reserved,
        } = self;
        let request = SettleRequest::new(&key, &policy, reserved, usage);
        let op = limiter.settle_op(request);
        let op = match op.into_ready() {
            Ok(result) => return limiter.note_settled(&key, &policy, &result),
            Err(op) => op,
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(usage, "usage settled outside a Tokio runtime is lost");
            let stats = &limiter.inner.stats;
            stats.settle_errors.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let settles = &limiter.inner.settles;
        settles.in_flight.fetch_add(1, Ordering::AcqRel);
        runtime.spawn(async move {
            let result = match op.await {
                Err(error) if never_applied(&error) => {
                    let attempt =
                        || limiter.settle_op(SettleRequest::new(&key, &policy, reserved, usage));
                    attempt.retry(SETTLE_RETRIES).when(never_applied).await
                }
                result => result,
            };
            limiter.note_settled(&key, &policy, &result);
            let settles = &limiter.inner.settles;
            if settles.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
                settles.idle.notify_waiters();
            }
        });
    }
}

/// How a settle that never reached the store is tried again: a failover
/// or a restart of the store takes seconds, and usage that happened is
/// owed whenever the store is back (the debt then counts from the time it
/// lands). Only errors that certainly recorded nothing are retried, so a
/// retry never counts usage twice.
const SETTLE_RETRIES: ExponentialBuilder = ExponentialBuilder::new()
    .with_min_delay(Duration::from_millis(20))
    .with_max_delay(Duration::from_secs(1))
    .with_total_delay(Some(Duration::from_secs(10)))
    .with_max_times(usize::MAX)
    .with_jitter();

/// Whether `error` certainly left the store unchanged: refused before it
/// was sent (connection refused, breaker open, in-flight bound full).
fn never_applied(error: &StoreError) -> bool {
    error.is_not_applied()
        || matches!(
            error.kind(),
            StoreErrorKind::CircuitOpen | StoreErrorKind::Overloaded
        )
}

/// The settles a limiter's [`Settlement`]s are waiting for.
#[derive(Debug, Default)]
pub(crate) struct Settles {
    in_flight: AtomicU64,
    idle: Notify,
}

impl Limiter {
    /// Waits until every settle a [`Settlement`] handed to a task has
    /// reached the store (or failed): call it on shutdown, after the
    /// server stopped serving, so that no usage is lost with the runtime.
    pub async fn settled(&self) {
        let settles = &self.inner.settles;
        loop {
            let idle = settles.idle.notified();
            if settles.in_flight.load(Ordering::Acquire) == 0 {
                return;
            }
            idle.await;
        }
    }

    /// Counts a settle's answer; a quota left exhausted is remembered by
    /// the local tier.
    pub(super) fn note_settled(
        &self,
        key: &WindowKey,
        policy: &Policy,
        result: &Result<Decision, StoreError>,
    ) {
        let stats = &self.inner.stats;
        match result {
            Ok(decision) => {
                stats.settled.fetch_add(1, Ordering::Relaxed);
                if let (false, Some(local)) = (decision.allowed, &self.inner.local) {
                    local.remember(CheckRequest::new(key, policy, Cost::ONE), decision);
                }
            }
            Err(error) => {
                stats.settle_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%error, policy = policy.name(), "usage could not be settled");
            }
        }
    }
}
