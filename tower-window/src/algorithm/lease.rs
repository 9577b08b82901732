//! Leases on each algorithm's state, for the embedded store; `lease.lua`
//! mirrors it, and [`crate::lease`] says why the global bound stays exact.

use std::time::Duration;

use super::outcome::saturate_u32;
use super::sliding_counter::{bucket_end, buckets};
use super::{gcra, State};
use crate::{Algorithm, Policy, Quota, QuotaDecision, StoreError};

/// The width of the slots `quota` counts units in: its window (fixed
/// window) or bucket (sliding counter); `None` where units are dated one
/// by one (sliding log, GCRA).
fn slot_width(quota: &Quota) -> Option<u64> {
    match quota.algorithm() {
        Algorithm::FixedWindow => Some(quota.window_micros().max(1)),
        Algorithm::SlidingCounter { .. } => Some(buckets(quota).0),
        Algorithm::SlidingLog | Algorithm::Gcra => None,
    }
}

/// Where `quota` counts units recorded at `at`: the index of their window
/// or bucket, else `at` itself (what a refund names).
pub(crate) fn anchor(quota: &Quota, at: u64) -> u64 {
    slot_width(quota).map_or(at, |width| at / width)
}

/// The latest deadline a lease reserved at `now` may have for `quota`:
/// the end of the window (fixed window) or bucket (sliding counter) that
/// counts its units; `None` where the algorithm needs no bound.
pub(crate) fn deadline_cap(quota: &Quota, now: u64) -> Option<u64> {
    let width = slot_width(quota)?;
    (now / width).checked_add(1)?.checked_mul(width)
}

/// Whether a lease of `ttl_micros` can ever be granted under `quota`: a
/// GCRA lease dates its tokens at the deadline, so its TTL must be at most
/// `(B - 1) T` to leave room for one token.
pub(crate) fn ttl_fits(quota: &Quota, ttl_micros: u64) -> bool {
    let (interval, tolerance) = gcra::span(quota);
    quota.algorithm() != Algorithm::Gcra || ttl_micros.saturating_add(interval) <= tolerance
}

/// Refuses a lease TTL that a GCRA quota of `policy` could never grant.
pub(crate) fn check_ttl(policy: &Policy, ttl_micros: u64) -> Result<(), StoreError> {
    let Some(quota) = policy.quotas().iter().find(|q| !ttl_fits(q, ttl_micros)) else {
        return Ok(());
    };
    let name = quota.name();
    Err(StoreError::invalid(format!("a lease TTL this long leaves no room in gcra quota `{name}`: it must be at most (burst - 1) x the emission interval"),
    ))
}

/// Units of `quota` a lease reserved at `now` with deadline `deadline` may
/// take, and the quota's `reset_after` (µs) as it stands.
pub(crate) fn room(state: &mut State, quota: &Quota, now: u64, deadline: u64) -> (u64, u64) {
    // Evaluating one unit resets a state of another algorithm and drops
    // what expired; `unchanged.0` is the limit minus what counts at `now`
    // (entries dated in the future included).
    let (remaining, reset) = state.evaluate(quota, now, 1).unchanged;
    let room = match state {
        State::Gcra(s) => {
            let (interval, tolerance) = gcra::span(quota);
            let from = s.tat.max(deadline);
            now.saturating_add(tolerance).saturating_sub(from) / interval
        }
        _ => u64::from(remaining),
    };
    (room, reset)
}

/// One quota's state in a reservation's decision: an admission of the
/// `at_least` units that reserved, `remaining` once it holds `held` units.
/// A shadow quota that holds fewer than `at_least` reports its would-be
/// denial, with its reset as the wait (what it counts has stopped counting
/// by then). A lease that starts `wait` µs later is a denial until then.
pub(crate) fn quota_decision(
    quota: &Quota,
    remaining: u64,
    reset_after: u64,
    held: u32,
    at_least: u32,
    wait: u64,
) -> QuotaDecision {
    let remaining = saturate_u32(remaining);
    let micros = Duration::from_micros;
    let reset_after = micros(reset_after);
    if wait > 0 {
        QuotaDecision::deny(quota.clone(), 0, reset_after, Some(micros(wait)))
    } else if quota.is_shadow() && held < at_least {
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
            let end = deadline_cap(quota, now).unwrap_or(u64::MAX);
            (anchor(quota, now), end, 0)
        }
        State::SlidingCounter(_) => {
            state.commit(quota, now, units);
            let b = anchor(quota, now);
            (b, bucket_end(buckets(quota), b).unwrap_or(u64::MAX), 0)
        }
        State::SlidingLog(s) => {
            s.add(deadline, u64::from(units));
            (deadline, deadline.saturating_add(quota.window_micros()), 0)
        }
        State::Gcra(s) => {
            let prior = s.tat;
            gcra::commit(s, quota, deadline, units);
            (s.tat, s.tat, prior)
        }
    }
}

/// Takes back up to `units` of the `held` a quota holds of a lease counted
/// at `anchor`, where they still count; answers how many. `prior` is what
/// [`commit`] answered third.
pub(crate) fn refund(
    state: &mut State,
    quota: &Quota,
    anchor: u64,
    prior: u64,
    held: u32,
    units: u32,
) -> u32 {
    if units == 0 {
        return 0;
    }
    let units = u64::from(units);
    let taken = match state {
        State::FixedWindow(s) if s.window_index == anchor => {
            let taken = units.min(s.count);
            s.count -= taken;
            taken
        }
        State::SlidingCounter(s) | State::SlidingLog(s) => s.take_back(anchor, units),
        // Only while no later grant was computed from this arrival time.
        State::Gcra(s) if s.tat == anchor => {
            // Every unit back: as if the lease never was. Fewer: the grant
            // of the rest, still dated at the deadline.
            let (interval, _) = gcra::span(quota);
            s.tat = if units >= u64::from(held) {
                prior
            } else {
                s.tat.saturating_sub(units.saturating_mul(interval))
            };
            units
        }
        State::FixedWindow(_) | State::Gcra(_) => 0,
    };
    saturate_u32(taken)
}

/// A GCRA grant that starts later (see [`crate::lease`], "GCRA leases that
/// start later"): the most tokens, up to `want`, that every quota's bucket
/// (arrival times `tats`) can give a lease of `ttl` starting at most
/// `max_wait` after `now`, and that start. `None` unless every quota is an
/// enforced GCRA quota and one token fits.
pub(crate) fn later_grant(
    policy: &Policy,
    tats: &[u64],
    now: u64,
    ttl: u64,
    max_wait: u64,
    want: u32,
) -> Option<(u32, u64)> {
    let quotas = policy.quotas();
    let enforced_gcra = |q: &Quota| !q.is_shadow() && q.algorithm() == Algorithm::Gcra;
    if quotas.len() != tats.len() || !quotas.iter().all(enforced_gcra) {
        return None;
    }
    let mut units = u64::from(want);
    for (quota, &tat) in quotas.iter().zip(tats) {
        let (interval, tolerance) = gcra::span(quota);
        // Spent until `s + ttl`, dated there: `ttl + g T <= B T`.
        units = units.min(tolerance.saturating_sub(ttl) / interval);
        // Fits as seen at `s <= now + max_wait`: `tat + g T <= s + B T`.
        let horizon = now.saturating_add(max_wait).saturating_add(tolerance);
        units = units.min(horizon.saturating_sub(tat) / interval);
    }
    let units = u32::try_from(units).ok().filter(|u| *u > 0)?;
    let start = quotas.iter().zip(tats).fold(now, |start, (quota, &tat)| {
        let (interval, tolerance) = gcra::span(quota);
        let spent = u64::from(units).saturating_mul(interval);
        start.max(tat.saturating_add(spent).saturating_sub(tolerance))
    });
    Some((units, start))
}

/// A GCRA state's theoretical arrival time (`None` for another algorithm).
pub(crate) fn gcra_tat(state: &State) -> Option<u64> {
    match state {
        State::Gcra(s) => Some(s.tat),
        _ => None,
    }
}
