//! [`Outcome`]: what one algorithm step decided, shared by all four.

use std::time::Duration;

use crate::{Decision, Quota};

/// What one check decided, in integer microseconds (all four algorithms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Outcome {
    /// Whether the cost was admitted (and recorded).
    pub(crate) allowed: bool,
    /// Units left after this decision.
    pub(crate) remaining: u32,
    /// Microseconds until everything counted now has stopped counting.
    pub(crate) reset_after: u64,
    /// `Some(0)` for an admission; for a denial the wait until the same cost
    /// fits, or `None` when it never can.
    pub(crate) retry_after: Option<u64>,
}

impl Outcome {
    /// An admission. Its state matters for `reset_after` microseconds, which
    /// is also the TTL a store gives it (see [`Quota::max_state_lifetime`]
    /// for the bound stores use without reading it).
    pub(crate) fn allow(remaining: u32, reset_after: u64) -> Self {
        Self {
            allowed: true,
            remaining,
            reset_after,
            retry_after: Some(0),
        }
    }

    /// A denial; it never writes state.
    pub(crate) fn deny(remaining: u32, reset_after: u64, retry_after: Option<u64>) -> Self {
        Self {
            allowed: false,
            remaining,
            reset_after,
            retry_after,
        }
    }

    /// The public [`Decision`] for `quota`, decided at `now` (µs since epoch).
    pub(crate) fn into_decision(self, quota: &Quota, now: u64) -> Decision {
        let reset_after = Duration::from_micros(self.reset_after);
        let decision = if self.allowed {
            Decision::allow(quota.clone(), self.remaining, reset_after)
        } else {
            Decision::deny(
                quota.clone(),
                self.remaining,
                reset_after,
                self.retry_after.map(Duration::from_micros),
            )
        };
        decision.with_timestamp_micros(now)
    }
}

/// `x` as a `u32`, clamped (remaining counts never exceed the limit, but a
/// clamp is cheaper to trust than a proof).
pub(crate) fn saturate_u32(x: u64) -> u32 {
    u32::try_from(x).unwrap_or(u32::MAX)
}
