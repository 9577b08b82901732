//! The [`Store`] handle every capability is made from, its resilience
//! stack ([`guard`]), its backends ([`MemoryStore`], [`RedisStore`]) and
//! what a backend operation returns ([`Op`]). Each capability defines the
//! backend trait it needs (e.g. [`limit::Backend`](crate::limit::Backend));
//! both backends implement every one.

use std::error::Error as StdError;
use std::fmt;

use crate::{Policy, WindowKey};

pub mod guard;
mod handle;
pub(crate) mod memory;
mod op;
mod parts;
#[cfg(feature = "redis")]
pub mod redis;

#[cfg(feature = "redis")]
pub use self::redis::{redis_key, RedisConfigError, RedisStore, RedisStoreBuilder};
pub use guard::Guard;
pub(crate) use handle::{plugged, Native};
pub use handle::{Backend, Store, StoreBuilder};
pub use memory::{MemoryStore, MemoryStoreBuilder};
pub use op::Op;
pub(crate) use parts::Parts;

/// One check to run against a store: a cost against every quota of a
/// policy, read per quota with [`cost_of`](Self::cost_of).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct CheckRequest<'a> {
    /// Whose window.
    pub key: &'a WindowKey,
    /// Which quotas, decided together.
    pub policy: &'a Policy,
    /// Units consumed in every quota if admitted; with
    /// [`quota_costs`](Self::quota_costs), the largest of them.
    pub cost: crate::Cost,
    /// The units of each quota, in policy order, when they differ.
    pub quota_costs: Option<&'a [crate::Cost]>,
}

impl<'a> CheckRequest<'a> {
    /// A check of `cost` units of every quota of `policy` for `key`.
    pub fn new(key: &'a WindowKey, policy: &'a Policy, cost: crate::Cost) -> Self {
        Self {
            key,
            policy,
            cost,
            quota_costs: None,
        }
    }

    /// The same check with `costs[i]` units for quota `i` of the policy
    /// ([`cost`](Self::cost) becomes the largest; a missing one reads as
    /// it).
    pub fn with_quota_costs(mut self, costs: &'a [crate::Cost]) -> Self {
        if let Some(largest) = costs.iter().max() {
            self.cost = *largest;
        }
        self.quota_costs = Some(costs);
        self
    }

    /// The units quota `index` of the policy consumes.
    ///
    /// ```
    /// use tower_window::{CheckRequest, Cost, Policy, Quota, WindowKey};
    ///
    /// let policy = Policy::new("api", vec![
    ///     "10/1s".parse::<Quota>()?.named("burst")?,
    ///     "100/1m".parse::<Quota>()?.named("steady")?,
    /// ])?;
    /// let key = WindowKey::for_subject("alice");
    /// let costs = [Cost::ONE, Cost::new(5).expect("not zero")];
    /// let request = CheckRequest::new(&key, &policy, Cost::ONE).with_quota_costs(&costs);
    /// assert_eq!((request.cost_of(0).get(), request.cost_of(1).get()), (1, 5));
    /// assert_eq!(request.cost.get(), 5);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cost_of(&self, index: usize) -> crate::Cost {
        self.quota_costs
            .and_then(|costs| costs.get(index).copied())
            .unwrap_or(self.cost)
    }
}

/// A [`CheckRequest`] that owns what it names, for a future that outlives
/// the call.
///
/// ```
/// use tower_window::store::OwnedCheckRequest;
/// use tower_window::{CheckRequest, Cost, Policy, Quota, WindowKey};
///
/// let owned = {
///     let key = WindowKey::for_subject("alice");
///     let policy = Policy::from("10/1s".parse::<Quota>()?);
///     OwnedCheckRequest::from(CheckRequest::new(&key, &policy, Cost::ONE))
/// };
/// assert_eq!(owned.as_request().key.subject(), b"alice");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct OwnedCheckRequest {
    key: WindowKey,
    policy: Policy,
    cost: crate::Cost,
    quota_costs: Option<Box<[crate::Cost]>>,
}

impl OwnedCheckRequest {
    /// The request, borrowed from this one.
    pub fn as_request(&self) -> CheckRequest<'_> {
        let request = CheckRequest::new(&self.key, &self.policy, self.cost);
        match &self.quota_costs {
            Some(costs) => request.with_quota_costs(costs),
            None => request,
        }
    }
}

impl From<CheckRequest<'_>> for OwnedCheckRequest {
    fn from(request: CheckRequest<'_>) -> Self {
        Self {
            key: request.key.clone(),
            policy: request.policy.clone(),
            cost: request.cost,
            quota_costs: request.quota_costs.map(Box::from),
        }
    }
}

type Source = Box<dyn StdError + Send + Sync + 'static>;

/// What kind of failure a [`StoreError`] is.
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
    /// The store was not called: its failure domain's breaker is open.
    CircuitOpen,
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
            Self::CircuitOpen => "circuit_open",
        }
    }
}

impl fmt::Display for StoreErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A store could not decide.
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

    /// An [`InvalidRequest`](StoreErrorKind::InvalidRequest) error: the
    /// store refuses what it was asked.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StoreErrorKind::InvalidRequest, message)
    }

    /// A [`Protocol`](StoreErrorKind::Protocol) error: the store answered
    /// what it should not have.
    pub fn protocol(message: impl Into<String>) -> Self {
        Self::new(StoreErrorKind::Protocol, message)
    }

    /// A [`CircuitOpen`](StoreErrorKind::CircuitOpen) error.
    pub fn circuit_open() -> Self {
        Self::new(StoreErrorKind::CircuitOpen, "circuit breaker open")
    }

    /// The store does not implement `operation`.
    pub fn unsupported(operation: &str) -> Self {
        Self::new(
            StoreErrorKind::Unsupported,
            format!("this store does not support {operation}"),
        )
    }

    /// Marks that the store certainly did not apply the operation (a
    /// refused connection, `TRYAGAIN`, ...): only such errors are retried,
    /// so a retry never charges a request twice.
    pub fn not_applied(mut self) -> Self {
        self.not_applied = true;
        self
    }

    /// Whether the error is [`not_applied`](Self::not_applied).
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

    /// Whether the error is [`Unavailable`](StoreErrorKind::Unavailable)
    /// and [`not_applied`](Self::not_applied): worth retrying.
    pub fn is_retryable(&self) -> bool {
        self.not_applied && matches!(self.kind, StoreErrorKind::Unavailable)
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "store {}: {}", self.kind, self.message)
    }
}

/// What `?` in `main` prints: the `Display` text and the cause.
impl fmt::Debug for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")?;
        match &self.source {
            Some(source) => write!(f, " (caused by: {source})"),
            None => Ok(()),
        }
    }
}

impl StdError for StoreError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn StdError + 'static))
    }
}
