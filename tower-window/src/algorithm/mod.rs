//! The four window algorithms.
//!
//! [`Algorithm`] names one; the submodules hold each one's pure, integer-only
//! state transition, shared by [`MemoryStore`](crate::MemoryStore) and
//! mirrored line by line by the Redis Lua scripts.

use std::fmt;
use std::time::Duration;

pub(crate) mod fixed_window;
pub(crate) mod gcra;
pub(crate) mod outcome;
pub(crate) mod sliding_counter;
pub(crate) mod sliding_log;
mod timeline;

/// Shared fixtures of the algorithms' unit tests.
#[cfg(test)]
pub(crate) mod test_support {
    #![allow(clippy::unwrap_used)]

    use super::outcome::Outcome;
    use crate::Quota;

    /// One second in microseconds.
    pub(crate) const S: u64 = 1_000_000;
    /// 1_700_000_000 s: a multiple of 10 s (a bucket boundary for G = 10 s)
    /// and 20 s into a minute.
    pub(crate) const T0: u64 = 1_700_000_000_000_000;

    pub(crate) fn quota(text: &str) -> Quota {
        text.parse().unwrap()
    }

    /// An admission.
    pub(crate) fn allow(remaining: u32, reset: u64) -> Outcome {
        Outcome::allow(remaining, reset)
    }
}

/// How a [`Quota`](crate::Quota) counts admissions over its window `W`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Algorithm {
    /// Exact: at most `limit` units admitted in any window of length `W`.
    /// Memory O(limit) per key.
    #[default]
    SlidingLog,
    /// Buckets of `granularity`; never admits more than `limit` in any window
    /// of length `W` (it counts every bucket that overlaps the window, so it
    /// may admit slightly less). Memory O(W / granularity) per key.
    SlidingCounter {
        /// Bucket width; divides the window.
        granularity: Duration,
    },
    /// At most `limit` units in each window aligned to multiples of `W`
    /// since the Unix epoch. O(1) memory; allows up to `2 × limit` across a
    /// window boundary.
    FixedWindow,
    /// Generic cell rate algorithm (a token bucket): a steady rate of
    /// `limit / W` with bursts of up to `burst` (default `limit`). O(1) memory.
    Gcra,
}

impl Algorithm {
    /// The algorithm's name as written in the quota DSL and on the command line.
    pub fn name(&self) -> &'static str {
        match self {
            Self::SlidingLog => "sliding-log",
            Self::SlidingCounter { .. } => "sliding-counter",
            Self::FixedWindow => "fixed-window",
            Self::Gcra => "gcra",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::SlidingCounter { granularity } => {
                write!(
                    f,
                    "sliding-counter({})",
                    crate::quota::FormatDuration(*granularity)
                )
            }
            other => f.write_str(other.name()),
        }
    }
}
