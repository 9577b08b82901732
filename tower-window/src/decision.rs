//! The answer to one rate-limit check.

use std::fmt;
use std::time::Duration;

use crate::Quota;

/// Where a [`Decision`] came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DecisionSource {
    /// The store (Redis or the embedded store) decided.
    Store,
    /// The node's local tier answered from a remembered denial.
    LocalCache,
    /// The node spent quota it had leased from the store.
    Lease,
    /// The store could not decide; the fallback policy did.
    Fallback(FallbackReason),
}

impl DecisionSource {
    /// A short, stable name for headers, logs and metric labels.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Store => "store",
            Self::LocalCache => "local_cache",
            Self::Lease => "lease",
            Self::Fallback(_) => "fallback",
        }
    }
}

impl fmt::Display for DecisionSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Fallback(reason) => write!(f, "fallback({reason})"),
            other => f.write_str(other.as_str()),
        }
    }
}

/// Why the fallback policy answered instead of the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FallbackReason {
    /// The store could not be reached.
    Unavailable,
    /// The store did not answer within the time budget.
    Timeout,
    /// Too many store calls were already in flight on this node.
    Overloaded,
    /// The circuit breaker is open.
    CircuitOpen,
    /// The store answered with an error.
    Error,
}

impl FallbackReason {
    /// Every reason, in declaration order.
    pub const ALL: [FallbackReason; 5] = [
        Self::Unavailable,
        Self::Timeout,
        Self::Overloaded,
        Self::CircuitOpen,
        Self::Error,
    ];

    /// A short, stable name for headers, logs and metric labels.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Unavailable => "unavailable",
            Self::Timeout => "timeout",
            Self::Overloaded => "overloaded",
            Self::CircuitOpen => "circuit_open",
            Self::Error => "error",
        }
    }
}

impl fmt::Display for FallbackReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The outcome of checking one request against one [`Quota`].
///
/// Fields are public to read; build one with [`Decision::allow`] or
/// [`Decision::deny`] (custom stores and fallback closures do).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Decision {
    /// Whether the request may proceed.
    pub allowed: bool,
    /// The quota this decision was made against.
    pub quota: Quota,
    /// Units left in the current window after this decision.
    pub remaining: u32,
    /// Time until the window is full again (all consumed units have expired).
    pub reset_after: Duration,
    /// For a denial: how long until the same cost could be admitted, or
    /// `None` when it never can (cost larger than the limit). For an
    /// admission: `Some(Duration::ZERO)`.
    pub retry_after: Option<Duration>,
    /// Who decided.
    pub source: DecisionSource,
    /// The deciding clock's reading, in microseconds since the Unix epoch
    /// (the Redis server's `TIME` for `RedisStore`).
    pub timestamp_micros: u64,
}

impl Decision {
    /// An admission.
    pub fn allow(quota: Quota, remaining: u32, reset_after: Duration) -> Self {
        Self {
            allowed: true,
            quota,
            remaining,
            reset_after,
            retry_after: Some(Duration::ZERO),
            source: DecisionSource::Store,
            timestamp_micros: 0,
        }
    }

    /// A denial; `retry_after = None` means the cost can never fit.
    pub fn deny(
        quota: Quota,
        remaining: u32,
        reset_after: Duration,
        retry_after: Option<Duration>,
    ) -> Self {
        Self {
            allowed: false,
            quota,
            remaining,
            reset_after,
            retry_after,
            source: DecisionSource::Store,
            timestamp_micros: 0,
        }
    }

    /// Sets who decided.
    pub fn with_source(mut self, source: DecisionSource) -> Self {
        self.source = source;
        self
    }

    /// Sets the deciding clock's reading (microseconds since the epoch).
    pub fn with_timestamp_micros(mut self, micros: u64) -> Self {
        self.timestamp_micros = micros;
        self
    }

    /// The limit of the quota (the burst for GCRA).
    pub fn limit(&self) -> u32 {
        self.quota.capacity()
    }

    /// Whether the decision was made without the store (fallback).
    pub fn is_degraded(&self) -> bool {
        matches!(self.source, DecisionSource::Fallback(_))
    }
}
