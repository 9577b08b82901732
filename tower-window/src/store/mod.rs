//! Where windows live: the [`Store`] trait and its implementations.

use std::error::Error as StdError;
use std::fmt;

use futures_util::future::BoxFuture;

use crate::{Decision, Policy, WindowKey};

pub mod lease;
mod memory;
#[cfg(feature = "redis")]
pub mod redis;

#[cfg(feature = "redis")]
pub use self::redis::{redis_key, RedisConfigError, RedisStore, RedisStoreBuilder};
pub use lease::{Lease, RefundRequest, Reservation, ReserveRequest};
pub use memory::{MemoryStore, MemoryStoreBuilder};

/// One check to run against a store: a cost against every quota of a policy.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct CheckRequest<'a> {
    /// Whose window.
    pub key: &'a WindowKey,
    /// Which quotas, decided together.
    pub policy: &'a Policy,
    /// Units this request consumes in every quota if admitted (at least 1).
    pub cost: u32,
}

impl<'a> CheckRequest<'a> {
    /// A check of `cost` units of every quota of `policy` for `key`.
    pub fn new(key: &'a WindowKey, policy: &'a Policy, cost: u32) -> Self {
        Self { key, policy, cost }
    }
}

/// An atomic, shared home for rate-limit windows.
///
/// One call decides one request against a whole [`Policy`]: it reads every
/// quota's window, admits only if every quota admits, and then records the
/// cost in every quota, all atomically. A denied request changes nothing in
/// any quota (beyond dropping expired state). Every implementation must give
/// the same decisions for the same inputs and times; the conformance suite
/// in the `tower-window-tests` package checks that.
pub trait Store: Send + Sync + 'static {
    /// Checks `request` and records it if admitted.
    fn check<'a>(
        &'a self,
        request: CheckRequest<'a>,
    ) -> BoxFuture<'a, Result<Decision, StoreError>>;

    /// Checks `request` at once, without awaiting, if this store decides
    /// in-process (no I/O); `None` (the default) means "await
    /// [`check`](Self::check)".
    ///
    /// A [`Limiter`](crate::Limiter) tries this first: an in-process
    /// decision skips the time budget, retries and in-flight bound, which
    /// exist for stores behind a network. A store that returns `Some` must
    /// decide exactly as `check` would.
    fn check_sync(&self, request: CheckRequest<'_>) -> Option<Result<Decision, StoreError>> {
        let _ = request;
        None
    }

    /// Whether this store decides in-process, so that
    /// [`check_sync`](Self::check_sync) always answers `Some` (the default
    /// is `false`: a store behind a network).
    ///
    /// [`Limiter::check_sync`](crate::Limiter::check_sync) asks this before
    /// anything else, so a limiter over a networked store skips the
    /// synchronous attempt at no cost.
    fn decides_in_process(&self) -> bool {
        false
    }

    /// Evaluates `request` against every quota of its policy and records
    /// nothing: each quota's state as it stands (`remaining` before the
    /// cost, `reset_after` now), `allowed` whether the cost would fit. For
    /// usage reports ([`Limiter::peek_policy`](crate::Limiter::peek_policy)).
    ///
    /// The default answers [`StoreErrorKind::InvalidRequest`]: a store that
    /// cannot peek says so.
    fn peek<'a>(
        &'a self,
        request: CheckRequest<'a>,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        let _ = request;
        Box::pin(async {
            Err(StoreError::new(
                StoreErrorKind::InvalidRequest,
                "this store cannot peek",
            ))
        })
    }

    /// Which independent failure domain the keys of `key` under `policy` live
    /// in (for example the Redis Cluster primary serving their hash slot),
    /// or `None` when the store is one failure domain (the default) or the
    /// domain is not known yet.
    ///
    /// A [`Limiter`](crate::Limiter) keeps one circuit breaker per domain,
    /// so failures in one domain send only that domain's keys to the
    /// fallback. Values should be below 16384; larger ones share the breaker
    /// of their value modulo 16384. Called once per store call that has a
    /// breaker: keep it cheap and free of I/O.
    fn failure_domain(&self, key: &WindowKey, policy: &Policy) -> Option<u16> {
        let _ = (key, policy);
        None
    }

    /// Atomically takes up to `request.want` units (at least
    /// `request.at_least`, else none) from every quota of the policy, as a
    /// [`Lease`] to spend locally until its deadline; see the
    /// [lease module](lease) for why the global bound stays exact.
    ///
    /// The default refuses with [`StoreErrorKind::Unsupported`].
    fn reserve<'a>(
        &'a self,
        request: ReserveRequest<'a>,
    ) -> BoxFuture<'a, Result<Reservation, StoreError>> {
        let _ = request;
        Box::pin(async { Err(StoreError::unsupported("quota leases")) })
    }

    /// Returns `request.unused` units of a lease that were never spent
    /// (capped at what it granted), where they still count; answers the
    /// units returned. A second refund of the same lease, or one after its
    /// units stopped counting, returns 0 and changes nothing.
    ///
    /// The default refuses with [`StoreErrorKind::Unsupported`].
    fn refund<'a>(&'a self, request: RefundRequest<'a>) -> BoxFuture<'a, Result<u32, StoreError>> {
        let _ = request;
        Box::pin(async { Err(StoreError::unsupported("quota leases")) })
    }
}

impl<S: Store + ?Sized> Store for std::sync::Arc<S> {
    fn check<'a>(
        &'a self,
        request: CheckRequest<'a>,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        (**self).check(request)
    }

    fn check_sync(&self, request: CheckRequest<'_>) -> Option<Result<Decision, StoreError>> {
        (**self).check_sync(request)
    }

    fn decides_in_process(&self) -> bool {
        (**self).decides_in_process()
    }

    fn peek<'a>(
        &'a self,
        request: CheckRequest<'a>,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        (**self).peek(request)
    }

    fn failure_domain(&self, key: &WindowKey, policy: &Policy) -> Option<u16> {
        (**self).failure_domain(key, policy)
    }

    fn reserve<'a>(
        &'a self,
        request: ReserveRequest<'a>,
    ) -> BoxFuture<'a, Result<Reservation, StoreError>> {
        (**self).reserve(request)
    }

    fn refund<'a>(&'a self, request: RefundRequest<'a>) -> BoxFuture<'a, Result<u32, StoreError>> {
        (**self).refund(request)
    }
}

type Source = Box<dyn StdError + Send + Sync + 'static>;

/// What kind of failure a [`StoreError`] is, for fallback and retry decisions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The store could not be reached (refused, reset, closed, cluster down).
    Unavailable,
    /// The store did not answer in time.
    Timeout,
    /// Too many calls in flight or the store refused for lack of resources.
    Overloaded,
    /// The store answered something unexpected (script or protocol error).
    Protocol,
    /// The request itself is invalid for this store.
    InvalidRequest,
    /// The store does not implement this operation.
    Unsupported,
}

impl StoreErrorKind {
    /// A short, stable name for logs and metric labels.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Unavailable => "unavailable",
            Self::Timeout => "timeout",
            Self::Overloaded => "overloaded",
            Self::Protocol => "protocol",
            Self::InvalidRequest => "invalid_request",
            Self::Unsupported => "unsupported",
        }
    }
}

impl fmt::Display for StoreErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A store could not decide.
#[derive(Debug)]
pub struct StoreError {
    kind: StoreErrorKind,
    message: String,
    source: Option<Source>,
    not_applied: bool,
}

impl StoreError {
    /// An error of `kind` with a message.
    pub fn new(kind: StoreErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            source: None,
            not_applied: false,
        }
    }

    /// The store does not implement `operation`.
    pub fn unsupported(operation: &str) -> Self {
        Self::new(
            StoreErrorKind::Unsupported,
            format!("this store does not support {operation}"),
        )
    }

    /// Marks the error as one where the store certainly did not apply the
    /// operation (the connection was refused, the cluster said `TRYAGAIN`
    /// or `MOVED`, ...): only such errors are retried, so a retry never
    /// charges a request twice.
    pub fn not_applied(mut self) -> Self {
        self.not_applied = true;
        self
    }

    /// Whether the store certainly did not apply the operation (see
    /// [`not_applied`](Self::not_applied)).
    pub fn is_not_applied(&self) -> bool {
        self.not_applied
    }

    /// The same error, caused by `source`.
    pub fn with_source(mut self, source: impl Into<Source>) -> Self {
        self.source = Some(source.into());
        self
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }

    /// The message, without the `store <kind>:` prefix that `Display` adds.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Whether trying again soon may succeed without charging twice: the
    /// store is unavailable and certainly did not apply the operation.
    pub fn is_retryable(&self) -> bool {
        self.not_applied && matches!(self.kind, StoreErrorKind::Unavailable)
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "store {}: {}", self.kind, self.message)
    }
}

impl StdError for StoreError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn StdError + 'static))
    }
}
