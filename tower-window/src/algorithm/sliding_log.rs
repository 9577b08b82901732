//! Sliding log: the exact algorithm.
//!
//! At most `L` units are admitted in every window `(t - W, t]`, with at
//! most `L` entries per key.
//!
//! # Semantics (the contract shared with the Redis scripts)
//!
//! The rules of [`super::timeline`], with one slot per admission
//! timestamp `ts`, counting until `ts + W`. So waiting exactly
//! `retry_after` and asking again with the same cost is admitted (if
//! nothing else was admitted in between), and one microsecond less is not.

use super::outcome::Evaluation;
use super::timeline::{self, Timeline};
use crate::Quota;

/// The log of one key: admissions `(timestamp, cost)`, oldest first; those
/// of one microsecond share an entry (they expire together).
pub(crate) type State = Timeline;

/// Evaluates `cost` units of `quota` at `now` against `state`, recording
/// nothing. Never panics.
pub(crate) fn evaluate(state: &mut State, quota: &Quota, now: u64, cost: u32) -> Evaluation {
    let window = quota.window_micros();
    // An entry written at `ts` counts while `ts > now - W`, i.e. until
    // `ts + W` (an entry so late that this overflows never expires).
    timeline::evaluate(state, now, now, cost, u64::from(quota.limit()), |ts| {
        ts.checked_add(window)
    })
}

/// Records `cost` units at `now` (after [`evaluate`] admitted them).
pub(crate) fn commit(state: &mut State, _quota: &Quota, now: u64, cost: u32) {
    state.add(now, u64::from(cost));
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    use crate::algorithm::outcome::Outcome;
    use crate::algorithm::test_support::{allow, check_with, quota, S, T0};

    fn check(state: &mut State, quota: &Quota, now: u64, cost: u32) -> Outcome {
        check_with(state, quota, now, cost, evaluate, commit)
    }

    #[test]
    fn admits_up_to_the_limit_then_waits_for_the_oldest_entry() {
        let q = quota("3/1m");
        let mut s = State::default();
        assert_eq!(check(&mut s, &q, T0, 1), allow(2, 60 * S));
        assert_eq!(check(&mut s, &q, T0 + 10 * S, 1), allow(1, 60 * S));
        assert_eq!(check(&mut s, &q, T0 + 20 * S, 1), allow(0, 60 * S));
        assert_eq!(
            check(&mut s, &q, T0 + 20 * S, 1),
            Outcome::deny(0, 60 * S, Some(40 * S))
        );
        // One microsecond before the oldest entry leaves the window.
        assert_eq!(
            check(&mut s, &q, T0 + 60 * S - 1, 1),
            Outcome::deny(0, 20 * S + 1, Some(1))
        );
        // Exactly W after it: ts <= t - W, so it no longer counts.
        assert_eq!(check(&mut s, &q, T0 + 60 * S, 1), allow(0, 60 * S));
        assert_eq!(
            check(&mut s, &q, T0 + 60 * S, 1),
            Outcome::deny(0, 60 * S, Some(10 * S))
        );
    }

    #[test]
    fn retry_walks_past_as_many_entries_as_the_cost_needs() {
        let q = quota("10/1m");
        let mut s = State::default();
        assert_eq!(check(&mut s, &q, T0, 4), allow(6, 60 * S));
        assert_eq!(check(&mut s, &q, T0 + 5 * S, 5), allow(1, 60 * S));
        let t = T0 + 10 * S;
        assert_eq!(
            check(&mut s, &q, t, 3),
            Outcome::deny(1, 55 * S, Some(50 * S))
        );
        assert_eq!(
            check(&mut s, &q, t, 7),
            Outcome::deny(1, 55 * S, Some(55 * S))
        );
        assert_eq!(check(&mut s, &q, t, 1), allow(0, 60 * S));
        assert_eq!(check(&mut s, &q, t, 11), Outcome::deny(0, 60 * S, None));
    }

    #[test]
    fn idle_state_is_empty() {
        let q = quota("2/1m");
        let mut s = State::default();
        check(&mut s, &q, T0, 2);
        assert_eq!(check(&mut s, &q, T0 + 3600 * S, 2), allow(0, 60 * S));
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn same_microsecond_admissions_share_one_entry() {
        let q = quota("1000/1m");
        let mut s = State::default();
        for _ in 0..1000 {
            assert!(check(&mut s, &q, T0, 1).allowed);
        }
        assert_eq!(s.len(), 1);
        assert_eq!(
            check(&mut s, &q, T0, 1),
            Outcome::deny(0, 60 * S, Some(60 * S))
        );
    }

    #[test]
    fn extreme_inputs_do_not_panic() {
        let q = quota("4294967295/366d");
        let mut s = State::default();
        assert_eq!(check(&mut s, &q, u64::MAX, u32::MAX), Outcome::allow(0, 0));
        assert!(!check(&mut s, &q, u64::MAX, 1).allowed);
        assert!(!check(&mut s, &q, 0, u32::MAX).allowed);
        let mut s = State::default();
        assert!(check(&mut s, &q, 0, u32::MAX).allowed);
        assert_eq!(check(&mut s, &q, 0, 1).retry_after, Some(q.window_micros()));
    }

    #[test]
    fn clock_stepping_back_keeps_future_entries_counting() {
        let q = quota("2/1m");
        let mut s = State::default();
        assert!(check(&mut s, &q, T0 + 10 * S, 1).allowed);
        // Earlier than the newest entry: inserted in order, both count.
        assert_eq!(check(&mut s, &q, T0, 1), allow(0, 70 * S));
        assert_eq!(
            check(&mut s, &q, T0, 1),
            Outcome::deny(0, 70 * S, Some(60 * S))
        );
    }

    #[test]
    fn decision_carries_micros_as_durations() {
        use std::time::Duration;

        let q = quota("1/1m");
        let d = Outcome::deny(0, 1, Some(2)).into_decision(&q, 7);
        assert!(!d.allowed);
        assert_eq!(d.reset_after, Duration::from_micros(1));
        assert_eq!(d.retry_after, Some(Duration::from_micros(2)));
        assert_eq!(d.timestamp_micros, 7);
        let d = allow(3, 4).into_decision(&q, 8);
        assert_eq!(d.retry_after, Some(Duration::ZERO));
        assert_eq!(d.remaining, 3);
    }
}
