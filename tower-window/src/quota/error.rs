//! [`QuotaError`]: why a quota is invalid.

use std::time::Duration;

#[cfg(doc)]
use super::{MAX_BUCKETS, MAX_WINDOW};

/// Why a quota is invalid.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QuotaError {
    /// The text is not of the form `<limit>/<window>[ <algorithm>]`.
    #[error("invalid quota {input:?}: {reason}")]
    Syntax {
        /// The text that was parsed.
        input: String,
        /// What was expected.
        reason: String,
    },
    /// The limit is not a whole number that fits in 32 bits.
    #[error("invalid quota limit {0:?}: expected a whole number from 1 to 4294967295")]
    InvalidLimit(String),
    /// The limit is zero.
    #[error("quota limit must be at least 1")]
    ZeroLimit,
    /// No limit was given to the builder.
    #[error("quota limit is missing")]
    MissingLimit,
    /// No window was given to the builder.
    #[error("quota window is missing")]
    MissingWindow,
    /// The window is zero.
    #[error("quota window must be longer than zero")]
    ZeroWindow,
    /// The window (or granularity) is not a whole number of milliseconds.
    #[error("quota durations must be whole milliseconds, got {0:?}")]
    Precision(Duration),
    /// A duration's unit is not one of `ms`, `s`, `m`, `h`, `d`.
    #[error("unknown duration unit {0:?}: expected ms, s, m, h or d")]
    UnknownUnit(String),
    /// The window is longer than [`MAX_WINDOW`] or its number overflows.
    #[error("quota window is too long: the most is 366d")]
    WindowTooLong,
    /// The algorithm name is not known.
    #[error("unknown algorithm {0:?}: expected sliding-log, sliding-counter(<granularity>), fixed-window or gcra[(burst=<n>)]")]
    UnknownAlgorithm(String),
    /// The sliding counter's granularity is zero.
    #[error("sliding-counter granularity must be longer than zero")]
    ZeroGranularity,
    /// The sliding counter's granularity does not divide the window.
    #[error("sliding-counter granularity {granularity:?} does not divide the window {window:?}")]
    GranularityDoesNotDivide {
        /// The bucket width.
        granularity: Duration,
        /// The window.
        window: Duration,
    },
    /// The sliding counter would keep more than [`MAX_BUCKETS`] buckets.
    #[error("sliding-counter would keep {buckets} buckets per key; the most is {max}")]
    TooManyBuckets {
        /// window / granularity.
        buckets: u64,
        /// The allowed maximum.
        max: u64,
    },
    /// A burst was given for an algorithm other than GCRA.
    #[error("a burst is only meaningful for the gcra algorithm, not {0}")]
    BurstWithoutGcra(&'static str),
    /// The burst is zero or not a number.
    #[error("gcra burst must be a whole number from 1 to 4294967295, got {0:?}")]
    InvalidBurst(String),
    /// GCRA's burst times its emission interval is longer than [`MAX_WINDOW`].
    #[error("gcra burst is too large: burst x (window / limit) must not exceed 366d")]
    BurstTooLarge,
    /// A scope other than `subject` or `tenant`.
    #[error("unknown quota scope {0:?}: expected subject or tenant")]
    UnknownScope(String),
    /// The quota name is not 1 to 64 characters of `[A-Za-z0-9_.-]`.
    #[error("invalid quota name {0:?}: use 1 to 64 characters of A-Z, a-z, 0-9, '_', '.', '-'")]
    InvalidName(String),
}

crate::error_debug::debug_as_display!(QuotaError {
    Syntax,
    InvalidLimit,
    ZeroLimit,
    MissingLimit,
    MissingWindow,
    ZeroWindow,
    Precision,
    UnknownUnit,
    WindowTooLong,
    UnknownAlgorithm,
    ZeroGranularity,
    GranularityDoesNotDivide,
    TooManyBuckets,
    BurstWithoutGcra,
    InvalidBurst,
    BurstTooLarge,
    UnknownScope,
    InvalidName,
});
