//! The four window algorithms.
//!
//! [`Algorithm`] names one; the submodules hold each one's integer-only
//! state transition in two steps, shared by [`MemoryStore`](crate::MemoryStore)
//! and mirrored by the Redis Lua scripts: `evaluate` decides without
//! recording (it may drop state that no longer counts), `commit` records an
//! admission. A policy of several quotas evaluates every quota first and
//! commits only when all of them admit, so a denial consumes nothing in any.

use std::fmt;
use std::time::Duration;

use crate::Quota;
use outcome::Evaluation;

pub(crate) mod fixed_window;
pub(crate) mod gcra;
pub(crate) mod lease;
pub(crate) mod outcome;
#[cfg(feature = "redis")]
pub(crate) mod redis;
pub(crate) mod settle;
pub(crate) mod sliding_counter;
pub(crate) mod sliding_log;
mod timeline;
/// For the Redis scripts' test that they walk as far.
#[cfg(all(test, feature = "redis"))]
pub(crate) use timeline::MAX_RETRY_WALK;

/// The state of one quota's window, for any algorithm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum State {
    SlidingLog(sliding_log::State),
    SlidingCounter(sliding_counter::State),
    FixedWindow(fixed_window::State),
    Gcra(gcra::State),
}

impl State {
    /// An empty state for `algorithm`.
    pub(crate) fn empty(algorithm: Algorithm) -> Self {
        match algorithm {
            Algorithm::SlidingLog => Self::SlidingLog(Default::default()),
            Algorithm::SlidingCounter { .. } => Self::SlidingCounter(Default::default()),
            Algorithm::FixedWindow => Self::FixedWindow(Default::default()),
            Algorithm::Gcra => Self::Gcra(Default::default()),
        }
    }

    /// Evaluates `cost` of `quota` at `now`, recording nothing.
    pub(crate) fn evaluate(&mut self, quota: &Quota, now: u64, cost: u32) -> Evaluation {
        match (&mut *self, quota.algorithm()) {
            (Self::SlidingLog(s), Algorithm::SlidingLog) => {
                sliding_log::evaluate(s, quota, now, cost)
            }
            (Self::SlidingCounter(s), Algorithm::SlidingCounter { .. }) => {
                sliding_counter::evaluate(s, quota, now, cost)
            }
            (Self::FixedWindow(s), Algorithm::FixedWindow) => {
                fixed_window::evaluate(s, quota, now, cost)
            }
            (Self::Gcra(s), Algorithm::Gcra) => gcra::evaluate(s, quota, now, cost),
            // State ids name the algorithm, so the state always matches;
            // start afresh rather than panic if not.
            (state, algorithm) => {
                *state = Self::empty(algorithm);
                state.evaluate(quota, now, cost)
            }
        }
    }

    /// Records `cost` of `quota` at `now`, after [`evaluate`](Self::evaluate)
    /// admitted it (on this state and at this time).
    pub(crate) fn commit(&mut self, quota: &Quota, now: u64, cost: u32) {
        match self {
            Self::SlidingLog(s) => sliding_log::commit(s, quota, now, cost),
            Self::SlidingCounter(s) => sliding_counter::commit(s, quota, now, cost),
            Self::FixedWindow(s) => fixed_window::commit(s, quota, now, cost),
            Self::Gcra(s) => gcra::commit(s, quota, now, cost),
        }
    }
}

/// Shared fixtures of the algorithms' unit tests.
#[cfg(test)]
pub(crate) mod test_support {
    #![allow(clippy::unwrap_used)]

    use super::outcome::{Evaluation, Outcome};
    use crate::{Decision, Quota};

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

    /// Evaluates, and commits when the cost fits: one quota decided alone.
    pub(crate) fn check_with<S>(
        state: &mut S,
        quota: &Quota,
        now: u64,
        cost: u32,
        evaluate: fn(&mut S, &Quota, u64, u32) -> Evaluation,
        commit: fn(&mut S, &Quota, u64, u32),
    ) -> Outcome {
        let evaluation = evaluate(state, quota, now, cost);
        if evaluation.fits() {
            commit(state, quota, now, cost);
        }
        evaluation.outcome
    }

    /// [`check_with`] through [`State`](super::State)'s dispatch, as the
    /// stores decide.
    pub(crate) fn check(state: &mut super::State, quota: &Quota, now: u64, cost: u32) -> Outcome {
        check_with(
            state,
            quota,
            now,
            cost,
            super::State::evaluate,
            super::State::commit,
        )
    }

    impl super::State {
        /// Whether the state is held inline, without a buffer of its own.
        pub(crate) fn is_inline(&self) -> bool {
            match self {
                Self::SlidingLog(s) | Self::SlidingCounter(s) => s.is_inline(),
                Self::FixedWindow(_) | Self::Gcra(_) => true,
            }
        }
    }

    impl Outcome {
        /// The public [`Decision`] for `quota`, decided at `now` (µs since epoch).
        pub(crate) fn into_decision(self, quota: &Quota, now: u64) -> Decision {
            let reset_after = std::time::Duration::from_micros(self.reset_after);
            let decision = if self.allowed {
                Decision::allow(quota.clone(), self.remaining, reset_after)
            } else {
                Decision::deny(
                    quota.clone(),
                    self.remaining,
                    reset_after,
                    self.retry_after.map(std::time::Duration::from_micros),
                )
            };
            decision.with_timestamp_micros(now)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::outcome::Outcome;
    use super::test_support::{check, quota, S, T0};
    use super::State;

    /// A denial records nothing, in any algorithm: a cost above the limit
    /// on an empty state (which can never fit), or any cost on a full one.
    #[test]
    fn a_denial_records_nothing() {
        for (text, reset) in [
            ("3/1m fixed-window", 40 * S),
            ("3/1m sliding-counter(10s)", 0),
            ("5/1m", 0),
            ("3/1m gcra", 0),
        ] {
            let q = quota(text);
            let limit = q.limit();
            let mut s = State::empty(q.algorithm());
            for cost in [limit + 1, u32::MAX] {
                let never = Outcome::deny(limit, reset, None);
                assert_eq!(check(&mut s, &q, T0, cost), never, "{text}");
            }
            assert_eq!(s, State::empty(q.algorithm()), "{text}");
            assert_eq!(check(&mut s, &q, T0, limit).remaining, 0, "{text}");
            let full = s.clone();
            for cost in [1, limit, limit + 1, u32::MAX] {
                assert!(!check(&mut s, &q, T0 + S, cost).allowed, "{text}");
            }
            assert_eq!(s, full, "{text}");
        }
    }
}

/// How a [`Quota`] counts admissions over its window `W`.
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
        f.write_str(self.name())?;
        if let Self::SlidingCounter { granularity } = self {
            write!(f, "({})", crate::quota::FormatDuration(*granularity))?;
        }
        Ok(())
    }
}
