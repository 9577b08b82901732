//! Sliding counter: the window as `n = W / G` buckets of width `G`.
//!
//! # Guarantee
//!
//! Never more than `L` units admitted in any window of length `W`: it
//! counts the `n + 1` buckets that overlap `(t - W, t]`, so an admission
//! counts up to `G` longer than in the exact [sliding log](super::sliding_log).
//!
//! # Semantics (the contract shared with the Redis scripts)
//!
//! The rules of [`super::timeline`], with one slot per bucket: time `x`
//! falls in bucket `floor(x / G)`, and bucket `j` stops counting at
//! `(j + n + 1) G`, so at `t` the buckets `[b - n, b]` count
//! (`b = floor(t / G)`).
//!
//! Why the bound holds: two admissions at `s < u` with `u - s < W` are both
//! counted at `u`, because `floor(s/G) >= floor((u - W)/G) = floor(u/G) - n`.

use super::outcome::Evaluation;
use super::timeline::{self, Timeline};
use crate::Quota;

/// The buckets of one key: `(bucket index, units)`, ascending by index.
pub(crate) type State = Timeline;

/// The bucket width and count of `quota`: (G, n = W / G).
pub(crate) fn buckets(quota: &Quota) -> (u64, u64) {
    let window = quota.window_micros().max(1);
    // Quota validation guarantees a granularity dividing the window; a
    // mismatched quota degrades to one bucket per window rather than panic.
    let granularity = quota
        .granularity_micros()
        .filter(|g| *g > 0 && window.is_multiple_of(*g))
        .unwrap_or(window);
    (granularity, window / granularity)
}

/// When bucket `j` of `(G, n)` stops counting, `(j + n + 1) G`: only then
/// has every window of length W that overlaps it moved past it (`None`:
/// never, past the end of time).
pub(crate) fn bucket_end((granularity, n): (u64, u64), j: u64) -> Option<u64> {
    j.checked_add(n)?.checked_add(1)?.checked_mul(granularity)
}

/// Evaluates `cost` units of `quota` at `now` against `state`, recording
/// nothing. Never panics.
pub(crate) fn evaluate(state: &mut State, quota: &Quota, now: u64, cost: u32) -> Evaluation {
    let b = buckets(quota);
    let limit = u64::from(quota.limit());
    timeline::evaluate(state, now, now / b.0, cost, limit, |j| bucket_end(b, j))
}

/// Records `cost` units in the bucket of `now` (after [`evaluate`]).
pub(crate) fn commit(state: &mut State, quota: &Quota, now: u64, cost: u32) {
    let (granularity, _) = buckets(quota);
    state.add(now / granularity, u64::from(cost));
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

    // 1_700_000_000 s: a multiple of 10 s, so a bucket boundary for G = 10 s.

    #[test]
    fn counts_n_plus_one_buckets_and_frees_them_at_bucket_end_plus_window() {
        // L = 4, W = 60 s, G = 10 s, n = 6.
        let q = quota("4/1m sliding-counter(10s)");
        let mut s = State::default();
        // b = B (T0 / G); its bucket stops counting at (B + 7) G = T0 + 70 s.
        assert_eq!(check(&mut s, &q, T0 + 3 * S, 1), allow(3, 67 * S));
        // b = B + 1, stops counting at T0 + 80 s.
        assert_eq!(check(&mut s, &q, T0 + 15 * S, 2), allow(1, 65 * S));
        assert_eq!(
            check(&mut s, &q, T0 + 15 * S, 2),
            Outcome::deny(1, 65 * S, Some(55 * S))
        );
        assert_eq!(
            check(&mut s, &q, T0 + 70 * S - 1, 2),
            Outcome::deny(1, 10 * S + 1, Some(1))
        );
        // On the boundary bucket B leaves: b = B + 7, counted [B + 1, B + 7].
        assert_eq!(check(&mut s, &q, T0 + 70 * S, 2), allow(0, 70 * S));
        assert_eq!(
            check(&mut s, &q, T0 + 70 * S, 1),
            Outcome::deny(0, 70 * S, Some(10 * S))
        );
        assert_eq!(
            check(&mut s, &q, T0 + 70 * S, 5),
            Outcome::deny(0, 70 * S, None)
        );
        assert_eq!(s.len(), 2);
    }

    #[test]
    fn one_bucket_per_window_counts_the_previous_window_too() {
        let q = quota("2/10s sliding-counter(10s)");
        let mut s = State::default();
        assert_eq!(check(&mut s, &q, T0, 2), allow(0, 20 * S));
        assert_eq!(
            check(&mut s, &q, T0 + 10 * S, 1),
            Outcome::deny(0, 10 * S, Some(10 * S))
        );
        assert_eq!(check(&mut s, &q, T0 + 20 * S, 2), allow(0, 20 * S));
    }

    #[test]
    fn idle_state_is_empty() {
        let q = quota("2/1m sliding-counter(1s)");
        let mut s = State::default();
        check(&mut s, &q, T0, 2);
        assert_eq!(check(&mut s, &q, T0 + 7200 * S, 2), allow(0, 61 * S));
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn extreme_inputs_do_not_panic() {
        let q = quota("4294967295/366d sliding-counter(1d)");
        let mut s = State::default();
        assert!(check(&mut s, &q, u64::MAX, u32::MAX).allowed);
        assert_eq!(check(&mut s, &q, u64::MAX, 1), Outcome::deny(0, 0, Some(0)));
        assert!(!check(&mut s, &q, 0, 1).allowed);
        let mut s = State::default();
        assert!(check(&mut s, &q, 0, u32::MAX).allowed);
        assert_eq!(check(&mut s, &q, 0, 1).retry_after, Some(367 * 86_400 * S));
    }

    #[test]
    fn clock_stepping_back_keeps_newer_buckets_counting() {
        let q = quota("2/1m sliding-counter(10s)");
        let mut s = State::default();
        assert!(check(&mut s, &q, T0 + 20 * S, 1).allowed);
        assert_eq!(check(&mut s, &q, T0, 1), allow(0, 90 * S));
        assert_eq!(
            check(&mut s, &q, T0, 1),
            Outcome::deny(0, 90 * S, Some(70 * S))
        );
    }
}
