//! GCRA, the generic cell rate algorithm: a token bucket in one timestamp.
//!
//! # Guarantee
//!
//! One unit per emission interval `T = ceil(W / L)` with bursts of up to
//! `B` units (the quota's capacity): in any closed interval `[a, b]`, the
//! admitted units `N` satisfy `N T <= B T + (b - a)`.
//!
//! # Semantics (the contract shared with the Redis scripts)
//!
//! Integer microseconds; `t` now, `c` cost. The state is the theoretical
//! arrival time `tat` (absent means `t`): the time at which the bucket would
//! be empty again.
//!
//! 1. `tat0 = max(tat, t)`.
//! 2. `c > B`: deny, `retry_after = None`,
//!    `remaining = (B T - (tat0 - t)) / T`, `reset_after = tat0 - t`.
//! 3. `new_tat = tat0 + c T`. If `new_tat - t <= B T`: admit, store
//!    `tat = new_tat`; `remaining = (B T - (new_tat - t)) / T` (integer
//!    division), `reset_after = new_tat - t`, which is also the TTL.
//! 4. Otherwise deny: `retry_after = new_tat - t - B T`,
//!    `remaining = (B T - (tat0 - t)) / T`, `reset_after = tat0 - t`.
//!
//! Why the bound holds: each admission moves `tat` forward by exactly `c T`
//! from at least its own arrival time, and only to at most `B T` ahead of
//! it, so admissions in `[a, b]` push `tat` from at least `a` by `N T`, to
//! at most `b + B T`. The arithmetic saturates; it is exact while
//! `t + 2 B T < 2^64`.

use super::outcome::{saturate_u32, Evaluation, Outcome};
use crate::Quota;

/// The theoretical arrival time of one key (0 = none; `max(0, t) = t`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct State {
    pub(super) tat: u64,
}

/// A quota's emission interval `T` and tolerance `B T` (µs): how far ahead
/// of now `tat` may run, the whole bucket.
pub(crate) fn span(quota: &Quota) -> (u64, u64) {
    let interval = quota.emission_interval_micros().max(1);
    (interval, interval.saturating_mul(quota.capacity().into()))
}

/// Evaluates `cost` units of `quota` at `now` against `state`, recording
/// nothing. Never panics.
pub(crate) fn evaluate(state: &mut State, quota: &Quota, now: u64, cost: u32) -> Evaluation {
    let (interval, tolerance) = span(quota);
    let tat0 = state.tat.max(now);
    let backlog = tat0 - now;
    let remaining_before = saturate_u32(tolerance.saturating_sub(backlog) / interval);

    if cost > quota.capacity() {
        return Evaluation::denied(Outcome::deny(remaining_before, backlog, None));
    }
    // cost <= burst, so cost * interval <= B T: it saturates only if B T does.
    let new_tat = tat0.saturating_add(u64::from(cost).saturating_mul(interval));
    let ahead = new_tat - now;
    if ahead <= tolerance {
        let remaining = saturate_u32((tolerance - ahead) / interval);
        return Evaluation::admitted(remaining, ahead, (remaining_before, backlog));
    }
    let retry = Some(ahead - tolerance);
    Evaluation::denied(Outcome::deny(remaining_before, backlog, retry))
}

/// Moves the theoretical arrival time by `cost` intervals (after
/// [`evaluate`] admitted them), from `now` at the earliest.
pub(crate) fn commit(state: &mut State, quota: &Quota, now: u64, cost: u32) {
    let (interval, _) = span(quota);
    let spent = u64::from(cost).saturating_mul(interval);
    state.tat = state.tat.max(now).saturating_add(spent);
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
    fn steady_rate_after_the_burst() {
        // T = 12 s, B = 5, B T = 60 s.
        let q = quota("5/1m gcra");
        let mut s = State::default();
        assert_eq!(check(&mut s, &q, T0, 1), allow(4, 12 * S));
        assert_eq!(check(&mut s, &q, T0, 4), allow(0, 60 * S));
        assert_eq!(
            check(&mut s, &q, T0, 1),
            Outcome::deny(0, 60 * S, Some(12 * S))
        );
        assert_eq!(
            check(&mut s, &q, T0 + 12 * S - 1, 1),
            Outcome::deny(0, 48 * S + 1, Some(1))
        );
        // tat0 - t + T = 60 s exactly: admitted.
        assert_eq!(check(&mut s, &q, T0 + 12 * S, 1), allow(0, 60 * S));
        // tat = T0 + 72 s; at T0 + 30 s the backlog is 42 s.
        let t = T0 + 30 * S;
        assert_eq!(
            check(&mut s, &q, t, 2),
            Outcome::deny(1, 42 * S, Some(6 * S))
        );
        assert_eq!(check(&mut s, &q, t, 1), allow(0, 54 * S));
        assert_eq!(check(&mut s, &q, t, 6), Outcome::deny(0, 54 * S, None));
        assert_eq!(check(&mut s, &q, T0 + 3600 * S, 5), allow(0, 60 * S));
    }

    #[test]
    fn burst_larger_than_limit() {
        // L = 2, W = 60 s: T = 30 s, B = 6, B T = 180 s.
        let q = quota("2/1m gcra(burst=6)");
        let mut s = State::default();
        assert_eq!(check(&mut s, &q, T0, 7), Outcome::deny(6, 0, None));
        assert_eq!(check(&mut s, &q, T0, 6), allow(0, 180 * S));
        assert_eq!(
            check(&mut s, &q, T0, 1),
            Outcome::deny(0, 180 * S, Some(30 * S))
        );
        assert_eq!(check(&mut s, &q, T0 + 60 * S, 2), allow(0, 180 * S));
        let t = T0 + 132 * S;
        assert_eq!(
            check(&mut s, &q, t, 3),
            Outcome::deny(2, 108 * S, Some(18 * S))
        );
        assert_eq!(check(&mut s, &q, t, 2), allow(0, 168 * S));
        assert_eq!(check(&mut s, &q, t, 7), Outcome::deny(0, 168 * S, None));
    }

    #[test]
    fn emission_interval_rounds_up() {
        // T = ceil(60 s / 7) = 8_571_429 µs; B T = 60_000_003 µs.
        let q = quota("7/1m gcra");
        let mut s = State::default();
        assert_eq!(check(&mut s, &q, T0, 7), allow(0, 60_000_003));
        assert_eq!(
            check(&mut s, &q, T0, 1),
            Outcome::deny(0, 60_000_003, Some(8_571_429))
        );
    }

    #[test]
    fn extreme_inputs_do_not_panic() {
        // T = 1, B T = 2^32 - 1.
        let q = quota("4294967295/1m gcra");
        let mut s = State::default();
        assert_eq!(
            check(&mut s, &q, T0, u32::MAX),
            allow(0, u64::from(u32::MAX))
        );
        assert_eq!(
            check(&mut s, &q, T0, 1),
            Outcome::deny(0, u64::from(u32::MAX), Some(1))
        );
        // The largest span a quota allows (B T = 366 d) at the edges of time.
        assert!("1/366d gcra(burst=4294967295)".parse::<Quota>().is_err());
        let q = quota("1/366d gcra");
        let mut s = State::default();
        let _ = check(&mut s, &q, u64::MAX, u32::MAX);
        let _ = check(&mut s, &q, u64::MAX, 1);
        let _ = check(&mut s, &q, 0, u32::MAX);
        let _ = check(&mut State::default(), &q, 0, u32::MAX);
    }
}
