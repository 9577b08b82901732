//! Usage known after the fact: a reservation settled, or usage recorded
//! whether or not it fits ("debt"), on each algorithm's state. The Redis
//! script `limit/settle.lua` mirrors it.
//!
//! A reservation of `r` units recorded at `a` (the store's clock) that used
//! `u` units:
//!
//! * `u < r`: the `r - u` units are taken back where the reservation put
//!   them, while they still count: the window of `a` (fixed window), the
//!   bucket of `a` (sliding counter), the log entry at `a` (sliding log).
//!   Once they stopped counting there is nothing to take back. GCRA keeps
//!   one arrival time, which later admissions were computed from, so it
//!   cannot take back part of a reservation exactly: a reservation against
//!   a GCRA quota is refused ([`refuses_reservation`]).
//! * `u > r`: the `u - r` units are recorded now in every quota, past the
//!   limit if need be. Later checks see the quota exhausted until that
//!   debt stops counting: its window ends (fixed window), its entry or
//!   bucket slides out (sliding log, sliding counter), or the arrival time
//!   is less than a burst ahead again (GCRA).

use super::outcome::Evaluation;
use super::{lease, State};
use crate::{Algorithm, Quota};

/// Settles `usage` units of a reservation of `reserved` units recorded at
/// `reserved_at` in one quota's `state`, at `now`; answers the quota's
/// state as it then stands, as a check of one unit would see it
/// (recording nothing).
pub(crate) fn settle(
    state: &mut State,
    quota: &Quota,
    now: u64,
    reserved_at: u64,
    reserved: u32,
    usage: u32,
) -> Evaluation {
    if usage < reserved {
        let anchor = lease::anchor(quota, reserved_at);
        lease::refund(state, quota, anchor, 0, reserved, reserved - usage);
    } else if usage > reserved {
        // Evaluating first drops what expired; the commit records whether
        // or not the units fit.
        let debt = usage - reserved;
        let _ = state.evaluate(quota, now, debt);
        state.commit(quota, now, debt);
    }
    standing(state.evaluate(quota, now, 1))
}

/// `evaluation` reported as the state stands, before its cost: `remaining`
/// what is left, and for a denial the wait until the cost fits.
pub(crate) fn standing(mut evaluation: Evaluation) -> Evaluation {
    // The verdict and the wait stay; the counts are those before the cost.
    (evaluation.outcome.remaining, evaluation.outcome.reset_after) = evaluation.unchanged;
    evaluation
}

/// Whether a reservation against `quota` is refused: GCRA cannot take back
/// part of one exactly (see the [module](self)).
pub(crate) fn refuses_reservation(quota: &Quota) -> bool {
    quota.algorithm() == Algorithm::Gcra
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::algorithm::test_support::{quota, S, T0};

    /// Reserves `cost` at `now` (a check), answering whether it fit.
    fn reserve(state: &mut State, q: &Quota, now: u64, cost: u32) -> bool {
        let evaluation = state.evaluate(q, now, cost);
        if evaluation.fits() {
            state.commit(q, now, cost);
        }
        evaluation.fits()
    }

    fn remaining(state: &mut State, q: &Quota, now: u64) -> u32 {
        standing(state.evaluate(q, now, 1)).outcome.remaining
    }

    #[test]
    fn a_refund_gives_back_what_the_reservation_did_not_use_on_every_window() {
        for text in [
            "100/1m",
            "100/1m sliding-counter(10s)",
            "100/1m fixed-window",
        ] {
            let q = quota(text);
            let mut s = State::empty(q.algorithm());
            assert!(reserve(&mut s, &q, T0, 60), "{text}");
            assert!(reserve(&mut s, &q, T0 + S, 30), "{text}");
            let settled = settle(&mut s, &q, T0 + 2 * S, T0, 60, 25);
            assert!(settled.fits(), "{text}");
            // 25 of the first and 30 of the second count.
            assert_eq!(settled.outcome.remaining, 45, "{text}");
            assert_eq!(remaining(&mut s, &q, T0 + 3 * S), 45, "{text}");
        }
    }

    #[test]
    fn usage_past_the_reservation_is_debt_until_it_slides_out() {
        let q = quota("100/1m");
        let mut s = State::empty(q.algorithm());
        assert!(reserve(&mut s, &q, T0, 50));
        let settled = settle(&mut s, &q, T0 + 10 * S, T0, 50, 170);
        // 170 recorded against a limit of 100: exhausted, and one unit
        // fits only once the 120 recorded at T0 + 10 s slid out, 60 s later.
        assert!(!settled.fits());
        assert_eq!(settled.outcome.remaining, 0);
        assert_eq!(settled.outcome.retry_after, Some(60 * S));
        assert!(!reserve(&mut s, &q, T0 + 60 * S, 1));
        assert!(reserve(&mut s, &q, T0 + 70 * S, 100));
    }

    #[test]
    fn gcra_debt_moves_the_arrival_time_past_the_burst() {
        // T = 10 ms, B = 100.
        let q = quota("100/1s gcra");
        let mut s = State::empty(q.algorithm());
        let settled = settle(&mut s, &q, T0, T0, 0, 250);
        assert!(!settled.fits());
        // 250 tokens dated at T0: one fits again once 151 have drained.
        assert_eq!(settled.outcome.retry_after, Some(1_510_000));
        assert!(refuses_reservation(&q));
        assert!(!refuses_reservation(&quota("100/1s")));
    }

    #[test]
    fn a_refund_after_the_units_stopped_counting_changes_nothing() {
        for text in ["10/1m", "10/1m sliding-counter(10s)", "10/1m fixed-window"] {
            let q = quota(text);
            let mut s = State::empty(q.algorithm());
            assert!(reserve(&mut s, &q, T0, 10), "{text}");
            // Two windows later the reservation stopped counting, and a
            // new admission must keep every unit it recorded.
            let later = T0 + 130 * S;
            assert!(reserve(&mut s, &q, later, 4), "{text}");
            let settled = settle(&mut s, &q, later, T0, 10, 0);
            assert_eq!(settled.outcome.remaining, 6, "{text}");
        }
    }
}
