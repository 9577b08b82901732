//! Leases on each algorithm's state, for the embedded store (the Redis
//! script `lease.lua` mirrors it). Why the global bound stays exact is
//! written down in [`crate::lease`].

use std::time::Duration;

use super::State;
use crate::{Quota, QuotaDecision};

/// The latest deadline a lease reserved at `now` may have for `quota`:
/// the end of the window (fixed window) or bucket (sliding counter) that
/// counts its units; `None` where the algorithm needs no bound.
pub(crate) fn deadline_cap(quota: &Quota, now: u64) -> Option<u64> {
    let width = match quota.algorithm() {
        crate::Algorithm::FixedWindow => quota.window_micros(),
        crate::Algorithm::SlidingCounter { .. } => quota
            .granularity_micros()
            .filter(|g| *g > 0)
            .unwrap_or(quota.window_micros()),
        _ => return None,
    }
    .max(1);
    (now / width).checked_add(1)?.checked_mul(width)
}

/// Whether a lease of `ttl_micros` can ever be granted under `quota`: a
/// GCRA lease dates its tokens at the deadline, so its TTL must be at most
/// `(B - 1) T` to leave room for one token.
pub(crate) fn ttl_fits(quota: &Quota, ttl_micros: u64) -> bool {
    if quota.algorithm() != crate::Algorithm::Gcra {
        return true;
    }
    let interval = quota.emission_interval_micros().max(1);
    let tolerance = u64::from(quota.capacity()).saturating_mul(interval);
    ttl_micros.saturating_add(interval) <= tolerance
}

/// Refuses a lease TTL that no GCRA quota of `policy` could ever grant
/// (see [`ttl_fits`]), with a typed error naming the quota.
pub(crate) fn check_ttl(policy: &crate::Policy, ttl_micros: u64) -> Result<(), crate::StoreError> {
    match policy.quotas().iter().find(|q| !ttl_fits(q, ttl_micros)) {
        None => Ok(()),
        Some(quota) => Err(crate::StoreError::new(
            crate::StoreErrorKind::InvalidRequest,
            format!(
                "a lease TTL this long leaves no room in gcra quota `{}`: it must be at most (burst - 1) x the emission interval",
                quota.name()
            ),
        )),
    }
}

/// Units of `quota` a lease reserved at `now` with deadline `deadline` may
/// take (dropping state that no longer counts), and the quota's
/// `reset_after` (µs) as it stands, which a quota that holds nothing of the
/// lease reports.
pub(crate) fn room(state: &mut State, quota: &Quota, now: u64, deadline: u64) -> (u64, u64) {
    // Evaluating one unit resets a state of another algorithm and drops
    // what expired; `unchanged.0` is the limit minus what counts at `now`
    // (entries dated in the future included).
    let evaluation = state.evaluate(quota, now, 1);
    let reset = evaluation.unchanged.1;
    match state {
        State::Gcra(s) => {
            let interval = quota.emission_interval_micros().max(1);
            let tolerance = u64::from(quota.capacity()).saturating_mul(interval);
            let from = s.tat.max(deadline);
            (
                now.saturating_add(tolerance).saturating_sub(from) / interval,
                reset,
            )
        }
        _ => (u64::from(evaluation.unchanged.0), reset),
    }
}

/// The units of a lease of `granted` that `quota` holds, with `room` for
/// it: all of them for an enforced quota (the grant fits its room), what
/// it has room for for a shadow quota (see [`crate::lease`]).
pub(crate) fn held(quota: &Quota, room: u64, granted: u32) -> u32 {
    if quota.is_shadow() {
        u32::try_from(room.min(u64::from(granted))).unwrap_or(granted)
    } else {
        granted
    }
}

/// One quota's state in a reservation's decision (an admission of the
/// `at_least` units that reserved): `remaining` once it holds `held` units,
/// `reset_after` (µs). A shadow quota that holds fewer than `at_least`
/// reports its would-be denial, with its reset as the wait (a bound: what
/// it counts has stopped counting by then).
pub(crate) fn quota_decision(
    quota: &Quota,
    remaining: u64,
    reset_after: u64,
    held: u32,
    at_least: u32,
) -> QuotaDecision {
    let remaining = u32::try_from(remaining).unwrap_or(u32::MAX);
    let reset_after = Duration::from_micros(reset_after);
    if quota.is_shadow() && held < at_least {
        QuotaDecision::deny(quota.clone(), remaining, reset_after, Some(reset_after))
    } else {
        QuotaDecision::allow(quota.clone(), remaining, reset_after)
    }
}

/// Records `units` of a lease reserved at `now` with deadline `deadline`
/// (after [`room`] allowed them); answers where they were counted (the
/// anchor a refund names), when they stop counting, and (GCRA) the arrival
/// time before the grant, which a refund of every unit restores.
pub(crate) fn commit(
    state: &mut State,
    quota: &Quota,
    now: u64,
    deadline: u64,
    units: u32,
) -> (u64, u64, u64) {
    match state {
        State::FixedWindow(_) => {
            state.commit(quota, now, units);
            let window = quota.window_micros().max(1);
            let k = now / window;
            (k, deadline_cap(quota, now).unwrap_or(u64::MAX), 0)
        }
        State::SlidingCounter(_) => {
            state.commit(quota, now, units);
            let window = quota.window_micros().max(1);
            let g = quota
                .granularity_micros()
                .filter(|g| *g > 0)
                .unwrap_or(window);
            let b = now / g;
            let end = b
                .checked_add(window / g)
                .and_then(|j| j.checked_add(1))
                .and_then(|j| j.checked_mul(g))
                .unwrap_or(u64::MAX);
            (b, end, 0)
        }
        State::SlidingLog(s) => {
            s.add(deadline, u64::from(units));
            (deadline, deadline.saturating_add(quota.window_micros()), 0)
        }
        State::Gcra(s) => {
            let interval = quota.emission_interval_micros().max(1);
            let prior = s.tat;
            s.tat = s
                .tat
                .max(deadline)
                .saturating_add(u64::from(units).saturating_mul(interval));
            (s.tat, s.tat, prior)
        }
    }
}

/// Takes back up to `units` of a lease of `granted` counted at `anchor`,
/// where they still count; answers how many. `prior` is what [`commit`]
/// answered third.
pub(crate) fn refund(
    state: &mut State,
    quota: &Quota,
    anchor: u64,
    prior: u64,
    granted: u32,
    units: u32,
) -> u32 {
    let units = u64::from(units);
    let taken = match state {
        State::FixedWindow(s) => {
            if s.window_index == anchor {
                let taken = units.min(s.count);
                s.count -= taken;
                taken
            } else {
                0
            }
        }
        State::SlidingCounter(s) | State::SlidingLog(s) => s.take_back(anchor, units),
        State::Gcra(s) => {
            // Only while no later grant was computed from this arrival time.
            if s.tat == anchor {
                // Every unit back: as if the lease never was. Fewer: the
                // grant of the rest, still dated at the deadline.
                let interval = quota.emission_interval_micros().max(1);
                s.tat = if units >= u64::from(granted) {
                    prior
                } else {
                    s.tat.saturating_sub(units.saturating_mul(interval))
                };
                units
            } else {
                0
            }
        }
    };
    u32::try_from(taken).unwrap_or(u32::MAX)
}

/// A GCRA grant that starts later (see [`crate::lease`], "GCRA leases that
/// start later"): the most tokens, up to `want`, that every quota's bucket
/// (arrival times `tats`, in policy order) can give a lease of `ttl`
/// starting at most `max_wait` after `now`, and that start (the latest of
/// the quotas'). `None` unless every quota is an enforced GCRA quota, or
/// if not one token fits.
pub(crate) fn later_grant(
    policy: &crate::Policy,
    tats: &[u64],
    now: u64,
    ttl: u64,
    max_wait: u64,
    want: u32,
) -> Option<(u32, u64)> {
    let quotas = policy.quotas();
    if quotas.len() != tats.len()
        || quotas
            .iter()
            .any(|q| q.is_shadow() || q.algorithm() != crate::Algorithm::Gcra)
    {
        return None;
    }
    let mut units = u64::from(want);
    for (quota, &tat) in quotas.iter().zip(tats) {
        let interval = quota.emission_interval_micros().max(1);
        let tolerance = u64::from(quota.capacity()).saturating_mul(interval);
        // Spent until `s + ttl`, dated there: `ttl + g T <= B T`.
        units = units.min(tolerance.saturating_sub(ttl) / interval);
        // Fits as seen at `s <= now + max_wait`: `tat + g T <= s + B T`.
        let horizon = now.saturating_add(max_wait).saturating_add(tolerance);
        units = units.min(horizon.saturating_sub(tat) / interval);
    }
    let units = u32::try_from(units).ok().filter(|u| *u > 0)?;
    let start = quotas.iter().zip(tats).fold(now, |start, (quota, &tat)| {
        let interval = quota.emission_interval_micros().max(1);
        let tolerance = u64::from(quota.capacity()).saturating_mul(interval);
        let fits_from = tat
            .saturating_add(u64::from(units).saturating_mul(interval))
            .saturating_sub(tolerance);
        start.max(fits_from)
    });
    Some((units, start))
}

/// One quota's state in the decision of a reservation whose lease starts
/// `wait` µs later: a denial until then.
pub(crate) fn later_decision(quota: &Quota, reset_after: u64, wait: u64) -> QuotaDecision {
    QuotaDecision::deny(
        quota.clone(),
        0,
        Duration::from_micros(reset_after),
        Some(Duration::from_micros(wait)),
    )
}

/// A GCRA state's theoretical arrival time (`None` for another algorithm).
pub(crate) fn gcra_tat(state: &State) -> Option<u64> {
    match state {
        State::Gcra(s) => Some(s.tat),
        _ => None,
    }
}
