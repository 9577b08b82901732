//! Sliding log: the exact algorithm.
//!
//! # Guarantee
//!
//! At most `L` units are admitted in every half-open window `(t - W, t]`, for
//! every `t`. Nothing is approximated; memory is O(number of admissions in
//! the last `W`), at most `L` entries per key.
//!
//! # Semantics (the contract shared with the Redis scripts)
//!
//! All values are integer microseconds; `t` is now, `W` the window, `L` the
//! limit, `c` the cost. The state is a log of admissions `(ts, cost)`.
//!
//! 1. Entries with `ts <= t - W` no longer count and are dropped.
//!    `used = Σ cost` of the rest.
//! 2. `c > L`: deny, `retry_after = None`, `remaining = L - used`,
//!    `reset_after = newest_ts + W - t` (0 with no entries). Nothing recorded.
//! 3. `used + c <= L`: admit and record `(t, c)`; `remaining = L - used - c`,
//!    `reset_after = W`; the state must live `W` (its TTL).
//! 4. Otherwise deny: `remaining = L - used`; walk the entries oldest first,
//!    accumulating `freed`; the first entry `i` with
//!    `used - freed + c <= L` gives `retry_after = ts_i + W - t`;
//!    `reset_after = newest_ts + W - t`.
//!
//! A denial records nothing, so waiting exactly `retry_after` and asking
//! again with the same cost is admitted (if nothing else was admitted in
//! between), and waiting one microsecond less is not.
//!
//! Robustness beyond the contract (never reached with a monotonic clock):
//! if the clock steps back, entries newer than `t` keep counting and
//! admissions are kept in timestamp order, and `reset_after`/TTL on an
//! admission is `newest_ts + W - t`, which equals `W` whenever the newest
//! entry is now.
//!
//! [`Outcome`] and [`saturate_u32`] live here but serve all four algorithms.

use std::collections::VecDeque;
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
    /// `Some(ttl)` when the state was written: keep it at least `ttl`
    /// microseconds from now. `None` when nothing was written.
    pub(crate) ttl: Option<u64>,
}

impl Outcome {
    /// An admission that wrote state which must live `ttl` microseconds.
    pub(crate) fn allow(remaining: u32, reset_after: u64, ttl: u64) -> Self {
        Self {
            allowed: true,
            remaining,
            reset_after,
            retry_after: Some(0),
            ttl: Some(ttl),
        }
    }

    /// A denial; it never writes state.
    pub(crate) fn deny(remaining: u32, reset_after: u64, retry_after: Option<u64>) -> Self {
        Self {
            allowed: false,
            remaining,
            reset_after,
            retry_after,
            ttl: None,
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

/// The log of one key: admissions `(timestamp, cost)`, oldest first.
///
/// Admissions at the same microsecond are merged into one entry, which
/// changes no decision (they expire together) and keeps bursts small.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct State {
    entries: VecDeque<(u64, u64)>,
    /// `Σ cost` of `entries`, kept with them so that a check touches only
    /// the ends of the log. Never above the limit (admissions keep it
    /// there), so it never saturates.
    used: u64,
}

impl State {
    /// Number of log entries kept (for tests of memory use).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

/// Whether an entry written at `ts` has left the window at `now`:
/// `ts <= now - W`, written without underflow (`ts + W` overflowing means it
/// has certainly not expired).
fn expired(ts: u64, window: u64, now: u64) -> bool {
    ts.checked_add(window).is_some_and(|end| end <= now)
}

/// Checks `cost` units of `quota` at `now` against `state`; records them if
/// admitted. Never panics.
pub(crate) fn check(state: &mut State, quota: &Quota, now: u64, cost: u32) -> Outcome {
    let limit = u64::from(quota.limit());
    let window = quota.window_micros();
    let cost = u64::from(cost);

    // Entries are in timestamp order, so the expired ones are a prefix.
    while let Some(&(ts, c)) = state.entries.front() {
        if !expired(ts, window, now) {
            break;
        }
        state.entries.pop_front();
        state.used = state.used.saturating_sub(c);
    }
    let used = state.used;
    let reset_after = |entries: &VecDeque<(u64, u64)>| {
        entries.back().map_or(0, |&(newest, _)| {
            newest.saturating_add(window).saturating_sub(now)
        })
    };

    if cost > limit {
        // Can never fit: say so (None) rather than promise a wait.
        return Outcome::deny(
            saturate_u32(limit.saturating_sub(used)),
            reset_after(&state.entries),
            None,
        );
    }

    if used.saturating_add(cost) <= limit {
        record(&mut state.entries, now, cost);
        state.used = used.saturating_add(cost);
        let reset = reset_after(&state.entries);
        return Outcome::allow(saturate_u32(limit - used - cost), reset, reset);
    }

    // Denied: the wait is until enough of the oldest entries have expired
    // for `cost` to fit. Freeing everything always suffices (cost <= limit),
    // so the walk always finds an entry; the fallback is unreachable.
    let mut freed = 0u64;
    let mut retry = reset_after(&state.entries);
    for &(ts, c) in &state.entries {
        freed = freed.saturating_add(c);
        if used.saturating_sub(freed).saturating_add(cost) <= limit {
            retry = ts.saturating_add(window).saturating_sub(now);
            break;
        }
    }
    Outcome::deny(
        saturate_u32(limit.saturating_sub(used)),
        reset_after(&state.entries),
        Some(retry),
    )
}

/// Records `(now, cost)` keeping the log in timestamp order.
fn record(entries: &mut VecDeque<(u64, u64)>, now: u64, cost: u64) {
    match entries.back_mut() {
        Some((ts, c)) if *ts == now => *c = c.saturating_add(cost),
        Some((ts, _)) if *ts > now => {
            // The clock stepped back: insert in order (or merge).
            let at = entries.partition_point(|&(ts, _)| ts < now);
            match entries.get_mut(at) {
                Some((ts, c)) if *ts == now => *c = c.saturating_add(cost),
                _ => entries.insert(at, (now, cost)),
            }
        }
        _ => entries.push_back((now, cost)),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const S: u64 = 1_000_000;
    const T0: u64 = 1_700_000_000_000_000;

    fn quota(text: &str) -> Quota {
        text.parse().unwrap()
    }

    fn allow(remaining: u32, reset: u64) -> Outcome {
        Outcome::allow(remaining, reset, reset)
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
    fn cost_above_limit_never_fits_and_records_nothing() {
        let q = quota("5/1m");
        let mut s = State::default();
        assert_eq!(check(&mut s, &q, T0, 6), Outcome::deny(5, 0, None));
        assert_eq!(check(&mut s, &q, T0, u32::MAX), Outcome::deny(5, 0, None));
        assert_eq!(s, State::default());
        assert_eq!(check(&mut s, &q, T0, 5), allow(0, 60 * S));
    }

    #[test]
    fn denial_leaves_state_untouched() {
        let q = quota("2/1m");
        let mut s = State::default();
        check(&mut s, &q, T0, 2);
        let before = s.clone();
        for cost in [1, 2, 3, u32::MAX] {
            assert!(!check(&mut s, &q, T0 + S, cost).allowed);
        }
        assert_eq!(s, before);
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
        assert_eq!(
            check(&mut s, &q, u64::MAX, u32::MAX),
            Outcome::allow(0, 0, 0)
        );
        assert!(!check(&mut s, &q, u64::MAX, 1).allowed);
        assert!(!check(&mut s, &q, 0, u32::MAX).allowed);
        let mut s = State::default();
        assert!(check(&mut s, &q, 0, u32::MAX).allowed);
        assert_eq!(check(&mut s, &q, 0, 1).retry_after, Some(q.window_micros()));
    }

    #[test]
    fn the_running_total_is_the_sum_of_the_log() {
        let q = quota("10/1s");
        let mut state = State::default();
        let mut now = T0;
        // Steps forward and (sometimes) back, costs 1..=4.
        for i in 0..2_000u64 {
            now = if i % 7 == 3 {
                now - 50_000
            } else {
                now + 37_000 * (i % 5)
            };
            let cost = u32::try_from(i % 4 + 1).unwrap();
            check(&mut state, &q, now, cost);
            let sum: u64 = state.entries.iter().map(|&(_, c)| c).sum();
            assert_eq!(state.used, sum, "after step {i}");
            assert!(state.used <= 10);
        }
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
