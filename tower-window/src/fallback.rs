//! What a [`Limiter`](crate::Limiter) answers when the store cannot.
//!
//! A [`FallbackPolicy`] decides when the store errors, times out, is
//! overloaded, or the circuit breaker is open. Every decision it makes is
//! marked `source = Fallback(reason)` by the limiter, whatever the policy
//! returned, so a degraded answer is never mistaken for a store decision.
//!
//! Built-ins: [`FailOpen`] (admit), [`FailClosed`] (deny, answered with
//! `503` or `429`), [`LocalWindow`] (a per-node window with a share of the
//! limit). Any `Fn(&FallbackRequest<'_>) -> Decision` closure is a policy too.
//!
//! ```
//! use tower_window::fallback::{FailClosed, FallbackRequest};
//! use tower_window::{Decision, Limiter, MemoryStore};
//!
//! let quota = "100/1m".parse()?;
//! // Deny with 429 instead of 503 while the store is down.
//! let limiter = Limiter::builder(MemoryStore::new(), quota)
//!     .fallback(FailClosed::too_many_requests())
//!     .build();
//! assert_eq!(limiter.fallback_status(), http::StatusCode::TOO_MANY_REQUESTS);
//!
//! // A closure: admit only the cheap requests.
//! let cheap_only = |r: &FallbackRequest<'_>| {
//!     if r.cost == 1 {
//!         Decision::allow(r.quota.clone(), 0, r.quota.window())
//!     } else {
//!         Decision::deny(r.quota.clone(), 0, r.quota.window(), Some(r.quota.window()))
//!     }
//! };
//! let limiter = Limiter::builder(MemoryStore::new(), "100/1m".parse()?)
//!     .fallback(cheap_only)
//!     .build();
//! # let _ = limiter;
//! # Ok::<(), tower_window::QuotaError>(())
//! ```

use std::fmt;
use std::num::NonZeroU32;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures_util::future::{self, BoxFuture};
use http::StatusCode;

use crate::store::{CheckRequest, StoreError};
use crate::{Algorithm, Clock, Decision, FallbackReason, MemoryStore, Quota, WindowKey};

/// The check the store could not answer, handed to a [`FallbackPolicy`].
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct FallbackRequest<'a> {
    /// Whose window.
    pub key: &'a WindowKey,
    /// Which quota.
    pub quota: &'a Quota,
    /// Units requested (at least 1).
    pub cost: u32,
    /// Why the store did not decide.
    pub reason: FallbackReason,
    /// The store's error, when there was one (none for an open breaker or a
    /// full in-flight bound).
    pub error: Option<&'a StoreError>,
    /// The limiter's clock reading, in microseconds since the Unix epoch.
    pub now_micros: u64,
}

/// Decides a check when the store cannot.
///
/// Implemented by the built-ins in this module and by every
/// `Fn(&FallbackRequest<'_>) -> Decision + Send + Sync + 'static` closure.
pub trait FallbackPolicy: Send + Sync + 'static {
    /// Decides `request`. The limiter sets the decision's `source` to
    /// `Fallback(request.reason)` and, if it is zero, its timestamp.
    fn decide<'a>(&'a self, request: FallbackRequest<'a>) -> BoxFuture<'a, Decision>;

    /// The HTTP status a layer should answer a denial by this policy with
    /// (default `429 Too Many Requests`).
    fn denial_status(&self) -> StatusCode {
        StatusCode::TOO_MANY_REQUESTS
    }

    /// Called once by [`LimiterBuilder::build`](crate::LimiterBuilder::build)
    /// with the limiter's clock, so a policy that keeps time (such as
    /// [`LocalWindow`]) uses the same time as the rest of the limiter.
    /// The default does nothing.
    fn attach_clock(&mut self, clock: Arc<dyn Clock>) {
        let _ = clock;
    }
}

impl<F> FallbackPolicy for F
where
    F: Fn(&FallbackRequest<'_>) -> Decision + Send + Sync + 'static,
{
    fn decide<'a>(&'a self, request: FallbackRequest<'a>) -> BoxFuture<'a, Decision> {
        Box::pin(future::ready(self(&request)))
    }
}

/// Admit every request while the store is unavailable.
///
/// The decision reports `remaining = capacity − cost` and
/// `reset_after = window`: the node cannot know the real window.
#[derive(Debug, Clone, Copy, Default)]
pub struct FailOpen;

impl FailOpen {
    /// The fail-open policy.
    pub fn new() -> Self {
        Self
    }
}

impl FallbackPolicy for FailOpen {
    fn decide<'a>(&'a self, request: FallbackRequest<'a>) -> BoxFuture<'a, Decision> {
        let quota = request.quota;
        let remaining = quota.capacity().saturating_sub(request.cost);
        Box::pin(future::ready(Decision::allow(
            quota.clone(),
            remaining,
            quota.window(),
        )))
    }
}

/// Deny every request while the store is unavailable.
///
/// The denial says `retry_after` (default one second) and carries the reason
/// in its source; [`denial_status`](FallbackPolicy::denial_status) is the
/// configured status, `503 Service Unavailable` by default or
/// `429 Too Many Requests`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailClosed {
    status: StatusCode,
    retry_after: Duration,
}

impl Default for FailClosed {
    fn default() -> Self {
        Self::service_unavailable()
    }
}

impl FailClosed {
    /// Deny, answered with `503 Service Unavailable`.
    pub fn service_unavailable() -> Self {
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            retry_after: Duration::from_secs(1),
        }
    }

    /// Deny, answered with `429 Too Many Requests`.
    pub fn too_many_requests() -> Self {
        Self {
            status: StatusCode::TOO_MANY_REQUESTS,
            ..Self::service_unavailable()
        }
    }

    /// Deny, answered with `status`.
    pub fn with_status(status: StatusCode) -> Self {
        Self {
            status,
            ..Self::service_unavailable()
        }
    }

    /// The `retry_after` of each denial (default one second).
    pub fn retry_after(mut self, retry_after: Duration) -> Self {
        self.retry_after = retry_after;
        self
    }

    /// The HTTP status of a denial.
    pub fn status(&self) -> StatusCode {
        self.status
    }
}

impl FallbackPolicy for FailClosed {
    fn decide<'a>(&'a self, request: FallbackRequest<'a>) -> BoxFuture<'a, Decision> {
        Box::pin(future::ready(Decision::deny(
            request.quota.clone(),
            0,
            self.retry_after,
            Some(self.retry_after),
        )))
    }

    fn denial_status(&self) -> StatusCode {
        self.status
    }
}

/// A window kept on this node alone with a share of the limit.
///
/// During an outage each node admits at most `ceil(share × limit)` units
/// (at least 1) per window of each key, using the quota's own algorithm in
/// an embedded [`MemoryStore`]; with `share = 1 / nodes`, the cluster as a
/// whole stays near the global limit. GCRA bursts are scaled the same way.
///
/// ```
/// use tower_window::fallback::LocalWindow;
///
/// let quarter = LocalWindow::new(0.25)?;
/// let same = LocalWindow::per_node(std::num::NonZeroU32::new(4).unwrap());
/// assert_eq!(quarter.scaled_limit(100), 25);
/// assert_eq!(same.scaled_limit(10), 3);
/// # Ok::<(), tower_window::fallback::InvalidShare>(())
/// ```
pub struct LocalWindow {
    /// The share as the fraction `numerator / denominator`.
    numerator: u64,
    denominator: u64,
    max_keys: u64,
    store: MemoryStore,
    /// The first quota scaled, and its scaled form: a limiter checks its
    /// own quota far more than any other, so this answers without a lookup.
    first: OnceLock<(Quota, Option<Quota>)>,
    /// Scaled quotas by original quota; a limiter checks few distinct quotas.
    scaled: moka::sync::Cache<Quota, Option<Quota>>,
}

/// A [`LocalWindow`] share outside `(0, 1]`.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[error("a local window share must be a number in (0, 1], got {0}")]
pub struct InvalidShare(pub f64);

/// Parts per million: shares are kept as exact integers.
const SHARE_SCALE: u64 = 1_000_000;

impl LocalWindow {
    /// A local window with `share` of each limit, in `(0, 1]`, to a
    /// millionth.
    pub fn new(share: f64) -> Result<Self, InvalidShare> {
        if !(share > 0.0 && share <= 1.0) {
            return Err(InvalidShare(share));
        }
        // In range by the check above; a positive share below a millionth
        // counts as one millionth.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let ppm = ((share * SHARE_SCALE as f64).round() as u64).clamp(1, SHARE_SCALE);
        Ok(Self::from_fraction(ppm, SHARE_SCALE))
    }

    /// A local window with `1 / nodes` of each limit.
    pub fn per_node(nodes: NonZeroU32) -> Self {
        Self::from_fraction(1, u64::from(nodes.get()))
    }

    fn from_fraction(numerator: u64, denominator: u64) -> Self {
        Self {
            numerator,
            denominator,
            max_keys: MemoryStore::DEFAULT_MAX_KEYS,
            store: MemoryStore::new(),
            first: OnceLock::new(),
            scaled: moka::sync::Cache::new(64),
        }
    }

    /// The most keys the node's own window keeps (default
    /// [`MemoryStore::DEFAULT_MAX_KEYS`]); beyond it the least useful keys
    /// are forgotten.
    pub fn max_keys(mut self, max_keys: u64) -> Self {
        self.max_keys = max_keys;
        self.store = MemoryStore::builder().max_keys(max_keys).build();
        self
    }

    /// `ceil(share × limit)`, at least 1 and at most `limit`.
    pub fn scaled_limit(&self, limit: u32) -> u32 {
        let scaled = (u64::from(limit) * self.numerator).div_ceil(self.denominator);
        u32::try_from(scaled)
            .unwrap_or(limit)
            .clamp(1, limit.max(1))
    }

    /// The quota this node enforces on its own in place of `quota`.
    pub fn scaled_quota(&self, quota: &Quota) -> Option<Quota> {
        let (first, scaled) = self
            .first
            .get_or_init(|| (quota.clone(), self.build_scaled(quota)));
        if first == quota {
            return scaled.clone();
        }
        self.scaled
            .get_with_by_ref(quota, || self.build_scaled(quota))
    }

    fn build_scaled(&self, quota: &Quota) -> Option<Quota> {
        let mut builder = Quota::builder()
            .name(quota.name())
            .limit(self.scaled_limit(quota.limit()))
            .window(quota.window())
            .algorithm(quota.algorithm());
        if let (Algorithm::Gcra, Some(burst)) = (quota.algorithm(), quota.burst()) {
            builder = builder.burst(self.scaled_limit(burst));
        }
        builder.build().ok()
    }
}

impl fmt::Debug for LocalWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalWindow")
            .field(
                "share",
                &format_args!("{}/{}", self.numerator, self.denominator),
            )
            .finish_non_exhaustive()
    }
}

impl FallbackPolicy for LocalWindow {
    fn decide<'a>(&'a self, request: FallbackRequest<'a>) -> BoxFuture<'a, Decision> {
        let quota = request.quota;
        let denied = || {
            let window = quota.window();
            Decision::deny(quota.clone(), 0, window, Some(window))
        };
        // The embedded store decides in-process: no need to await it.
        let decision = match self.scaled_quota(quota).map(|scaled| {
            self.store
                .check_now(CheckRequest::new(request.key, &scaled, request.cost))
        }) {
            // Report against the quota the caller asked about.
            Some(Ok(mut decision)) => {
                decision.quota = quota.clone();
                decision
            }
            // The embedded store does not fail; if it ever does, deny.
            Some(Err(_)) | None => denied(),
        };
        Box::pin(future::ready(decision))
    }

    fn attach_clock(&mut self, clock: Arc<dyn Clock>) {
        self.store = MemoryStore::builder()
            .clock(clock)
            .max_keys(self.max_keys)
            .build();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn shares_are_exact() {
        let w = LocalWindow::new(0.07).unwrap();
        assert_eq!(w.scaled_limit(100), 7);
        assert_eq!(w.scaled_limit(1), 1);
        assert_eq!(w.scaled_limit(15), 2);
        let w = LocalWindow::new(1.0).unwrap();
        assert_eq!(w.scaled_limit(u32::MAX), u32::MAX);
        let w = LocalWindow::new(1e-9).unwrap();
        assert_eq!(w.scaled_limit(10), 1);
        for bad in [0.0, -0.5, 1.5, f64::NAN, f64::INFINITY] {
            assert!(LocalWindow::new(bad).is_err());
        }
        let w = LocalWindow::per_node(NonZeroU32::new(3).unwrap());
        assert_eq!(w.scaled_limit(10), 4);
        assert_eq!(w.scaled_limit(9), 3);
    }

    #[test]
    fn scaled_quota_keeps_name_window_and_algorithm() {
        let w = LocalWindow::new(0.5).unwrap();
        let q: Quota = "10/1s gcra(burst=5)"
            .parse::<Quota>()
            .unwrap()
            .named("api")
            .unwrap();
        let s = w.scaled_quota(&q).unwrap();
        assert_eq!(s.name(), "api");
        assert_eq!(s.limit(), 5);
        assert_eq!(s.burst(), Some(3));
        assert_eq!(s.window(), q.window());
        assert_eq!(s.algorithm(), Algorithm::Gcra);
        let q2: Quota = "9/1m sliding-counter(10s)".parse().unwrap();
        let s2 = w.scaled_quota(&q2).unwrap();
        assert_eq!(s2.limit(), 5);
        assert_eq!(s2.algorithm(), q2.algorithm());
        // The first quota (kept aside) and later ones both keep answering.
        for _ in 0..2 {
            assert_eq!(w.scaled_quota(&q), Some(s.clone()));
            assert_eq!(w.scaled_quota(&q2), Some(s2.clone()));
        }
    }

    #[test]
    fn fail_closed_statuses() {
        assert_eq!(
            FailClosed::default().status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(
            FailClosed::too_many_requests().denial_status(),
            StatusCode::TOO_MANY_REQUESTS
        );
        assert_eq!(FailOpen.denial_status(), StatusCode::TOO_MANY_REQUESTS);
    }
}
