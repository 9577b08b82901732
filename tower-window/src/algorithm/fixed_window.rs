//! Fixed window: one counter per window aligned to multiples of `W` since
//! the Unix epoch (see [`Algorithm::FixedWindow`](super::Algorithm::FixedWindow)).
//!
//! # Semantics (the contract shared with the Redis scripts)
//!
//! Integer microseconds; `t` now, `W` window, `L` limit, `c` cost.
//! `k = floor(t / W)`; the state is `(k0, count)`, and `count` is taken as
//! 0 when `k0 != k` (the stored window is over). Let `reset = (k + 1) W - t`.
//!
//! 1. `c > L`: deny, `retry_after = None`, `remaining = L - count`,
//!    `reset_after = reset`. Nothing recorded.
//! 2. `count + c <= L`: admit, `count += c` (stored with `k`);
//!    `remaining = L - count`, `reset_after = reset`, which is also the TTL.
//! 3. Otherwise deny: `remaining = L - count`,
//!    `retry_after = reset_after = reset`.
//!
//! `reset_after` is the end of the current window even when the window
//! holds nothing (case 1 on an empty state).

use super::outcome::{saturate_u32, Evaluation, Outcome};
use crate::Quota;

/// The counter of one key: which window, and how many units it admitted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct State {
    pub(super) window_index: u64,
    pub(super) count: u64,
}

impl State {
    /// The count of window `k`: one from another window is over.
    fn count_in(&self, k: u64) -> u64 {
        if self.window_index == k {
            self.count
        } else {
            0
        }
    }
}

/// Evaluates `cost` units of `quota` at `now` against `state`, recording
/// nothing. Never panics.
pub(crate) fn evaluate(state: &mut State, quota: &Quota, now: u64, cost: u32) -> Evaluation {
    let limit = u64::from(quota.limit());
    let window = quota.window_micros().max(1);
    let cost = u64::from(cost);
    let k = now / window;
    let end = k.saturating_add(1).saturating_mul(window);
    let reset = end.saturating_sub(now);
    let count = state.count_in(k);
    let remaining = saturate_u32(limit.saturating_sub(count));

    if cost > limit {
        return Evaluation::denied(Outcome::deny(remaining, reset, None));
    }
    if count.saturating_add(cost) <= limit {
        let left = saturate_u32(limit - count - cost);
        return Evaluation::admitted(left, reset, (remaining, reset));
    }
    // Only the next window can admit it: it starts with count 0 and the cost fits.
    Evaluation::denied(Outcome::deny(remaining, reset, Some(reset)))
}

/// Records `cost` units in the window of `now` (after [`evaluate`]).
pub(crate) fn commit(state: &mut State, quota: &Quota, now: u64, cost: u32) {
    let k = now / quota.window_micros().max(1);
    *state = State {
        window_index: k,
        count: state.count_in(k).saturating_add(u64::from(cost)),
    };
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

    // 1_700_000_000 s is 20 s into a minute: the window ends at T0 + 40 s.
    const END: u64 = T0 + 40 * S;

    #[test]
    fn counts_per_aligned_window() {
        let q = quota("3/1m fixed-window");
        let mut s = State::default();
        assert_eq!(check(&mut s, &q, T0, 2), allow(1, 40 * S));
        assert_eq!(
            check(&mut s, &q, T0 + 10 * S, 2),
            Outcome::deny(1, 30 * S, Some(30 * S))
        );
        assert_eq!(check(&mut s, &q, T0 + 10 * S, 1), allow(0, 30 * S));
        assert_eq!(check(&mut s, &q, END - 1, 1), Outcome::deny(0, 1, Some(1)));
        assert_eq!(check(&mut s, &q, END, 3), allow(0, 60 * S));
        assert_eq!(
            check(&mut s, &q, END, 1),
            Outcome::deny(0, 60 * S, Some(60 * S))
        );
        assert_eq!(check(&mut s, &q, END, 4), Outcome::deny(0, 60 * S, None));
    }

    #[test]
    fn idle_state_is_empty() {
        let q = quota("3/1m fixed-window");
        let mut s = State::default();
        check(&mut s, &q, T0, 3);
        assert_eq!(check(&mut s, &q, END + 3617 * S, 3), allow(0, 43 * S));
    }

    #[test]
    fn extreme_inputs_do_not_panic() {
        let q = quota("4294967295/366d fixed-window");
        let mut s = State::default();
        assert!(check(&mut s, &q, u64::MAX, u32::MAX).allowed);
        assert!(!check(&mut s, &q, u64::MAX, 1).allowed);
        assert!(check(&mut s, &q, 0, u32::MAX).allowed);
        assert_eq!(
            check(&mut s, &q, 0, 1),
            Outcome::deny(0, q.window_micros(), Some(q.window_micros()))
        );
    }
}
