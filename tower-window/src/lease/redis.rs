//! Quota leases on Redis: [`lease::Backend`](crate::lease::Backend)
//! (reserve and refund) for [`RedisStore`].
//!
//! Each is one `EVALSHA` of one script (`scripts/lease.lua` after the
//! shared prelude and the algorithm fragments, so the lease reads and
//! writes the very state a check does), on Redis's own `TIME`. Besides the
//! quotas' keys it touches two keys of its own beside the policy's first
//! quota key, in the same hash slot: `<key>:lr` (a hash of the outstanding
//! leases, the lease counter and the latest deadline) and `<key>:lx` (the
//! leases by the time their units stop counting, so that every call drops
//! dead records in bounded batches: at most `MAX_DEAD` (128) per call, so
//! that no amount of history makes a call fail or take long; each
//! reservation adds one record, so the dead ones never pile up faster than
//! they go). Both carry a TTL: the time the last recorded lease stops
//! mattering.
//!
//! Shadow quotas are read from the algorithm code as the check script
//! reads them (`quota_code` in the prelude); each record keeps the units
//! each quota holds, so a refund gives a shadow quota back only what it
//! held (see [`crate::lease`]).
//!
//! A lease is named by the store time of its reservation and a counter
//! (`<t>:<seq>`), so a refund that arrives after its record was dropped
//! (or twice) finds nothing and changes nothing. See
//! [`crate::lease`] for why the bound stays exact per algorithm.

use std::sync::LazyLock;

use crate::lease::{Lease, RefundRequest, Reservation, ReserveRequest};
use crate::limit::redis::{lay_out, Parts};
use crate::store::redis::call::Call;
use crate::store::redis::keys::redis_key;
use crate::store::redis::script::{LuaScript, ScriptCall};
use crate::store::redis::RedisStore;
use crate::store::{Guard, Op, StoreError, StoreErrorKind};
use crate::{Decision, Policy, WindowKey};

/// The lease script: the check script's prelude and algorithms, then
/// `lease.lua`.
const SOURCE: &str = concat!(
    include_str!("../algorithm/prelude.lua"),
    include_str!("../algorithm/sliding_log.lua"),
    include_str!("../algorithm/sliding_counter.lua"),
    include_str!("../algorithm/fixed_window.lua"),
    include_str!("../algorithm/gcra.lua"),
    include_str!("lease.lua"),
);

static SCRIPT: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new(SOURCE));

/// Suffixes of the lease keys, after the policy's first quota key.
const RECORDS_SUFFIX: &[u8] = b":lr";
const EXPIRY_SUFFIX: &[u8] = b":lx";

/// A lease's name in the store: reservation time and counter.
fn field(lease: &Lease) -> String {
    format!("{}:{}", lease.reserved_at_micros, lease.id)
}

impl RedisStore {
    /// The SHA1 of the lease script (reserve and refund), as `EVALSHA`
    /// names it.
    pub fn lease_script_sha() -> &'static str {
        SCRIPT.sha()
    }

    fn lease_call(
        &self,
        key: &WindowKey,
        policy: &Policy,
        units: u32,
        now: Option<u64>,
    ) -> Result<ScriptCall, StoreError> {
        let Some(first) = policy.quotas().first() else {
            return Err(StoreError::new(
                StoreErrorKind::InvalidRequest,
                "a policy without quotas",
            ));
        };
        let min_ttl_ms = if now.is_some() {
            crate::store::redis::EXPLICIT_CLOCK_MIN_TTL_MS
        } else {
            0
        };
        let mut call = SCRIPT.prepare_invoke();
        lay_out(&mut call, &self.prefix, key, policy, units, now, min_ttl_ms);
        let base = redis_key(&self.prefix, key, policy, first);
        for suffix in [RECORDS_SUFFIX, EXPIRY_SUFFIX] {
            let mut lease_key = Vec::with_capacity(base.len() + suffix.len());
            lease_key.extend_from_slice(&base);
            lease_key.extend_from_slice(suffix);
            Parts::key(&mut call, lease_key);
        }
        Ok(call)
    }

    /// Runs one lease script call on the store's connection (as a check
    /// runs: one `EVALSHA`, reloading the script on `NOSCRIPT`).
    async fn run_lease(&self, call: ScriptCall) -> Result<Vec<i64>, StoreError> {
        self.call(Call::Script(&call)).await
    }

    pub(super) async fn reserve_lease(
        &self,
        request: ReserveRequest<'_>,
    ) -> Result<Reservation, StoreError> {
        if request.at_least == 0 || request.want < request.at_least {
            return Err(StoreError::new(
                StoreErrorKind::InvalidRequest,
                "a lease must want at least 1 unit, and at least what it needs",
            ));
        }
        let ttl = u64::try_from(request.ttl.as_micros()).unwrap_or(u64::MAX);
        // Beyond 2^40 µs (12 days) a lease is no lease; keeps Lua exact.
        if ttl == 0 || ttl > 1 << 40 {
            return Err(StoreError::new(
                StoreErrorKind::InvalidRequest,
                "a lease needs a TTL between 1 microsecond and 2^40 microseconds",
            ));
        }
        crate::algorithm::lease::check_ttl(request.policy, ttl)?;
        let now = self.explicit_now()?;
        let mut call = self.lease_call(request.key, request.policy, request.want, now)?;
        let max_wait = u64::try_from(request.max_wait.as_micros())
            .unwrap_or(u64::MAX)
            .min(1 << 40);
        call.arg("reserve")
            .arg(ttl)
            .arg(request.at_least)
            .arg(max_wait);
        let reply = self.run_lease(call).await?;
        reservation(request.policy, request.at_least, &reply)
    }

    pub(super) async fn refund_lease(&self, request: RefundRequest<'_>) -> Result<u32, StoreError> {
        if !request.returns_anything() {
            return Ok(0);
        }
        let unused = request.unused.min(request.lease.granted);
        let now = self.explicit_now()?;
        let mut call = self.lease_call(request.key, request.policy, unused, now)?;
        call.arg("refund").arg(field(request.lease));
        if let Some(units) = request.shadow_unused {
            // One value per quota; the script reads them for shadow quotas.
            for i in 0..request.policy.len() {
                call.arg(units.get(i).copied().unwrap_or(0));
            }
        }
        let reply = self.run_lease(call).await?;
        match reply.as_slice() {
            [returned] => Ok(u32::try_from((*returned).max(0)).unwrap_or(u32::MAX)),
            other => Err(StoreError::new(
                StoreErrorKind::Protocol,
                format!(
                    "redis lease refund replied {} values, expected 1",
                    other.len()
                ),
            )),
        }
    }
}

/// Turns the reserve reply `{granted, now, deadline, seq, latest deadline,
/// then per quota remaining, reset_after, units held, then the time the
/// lease may be spent from}` into a
/// [`Reservation`] (the decision an admission of `at_least` units).
fn reservation(policy: &Policy, at_least: u32, reply: &[i64]) -> Result<Reservation, StoreError> {
    let Some((&[granted, now, deadline, seq, held], per_quota)) = reply.split_first_chunk::<5>()
    else {
        return Err(StoreError::new(
            StoreErrorKind::Protocol,
            format!("redis lease reserve replied {} values", reply.len()),
        ));
    };
    let positive = |v: i64| u64::try_from(v).unwrap_or(0);
    let now = positive(now);
    let held_until_micros = (held > 0).then(|| positive(held));
    if granted <= 0 {
        return Ok(Reservation::empty(now, held_until_micros));
    }
    // Then the time the lease may be spent from (a script before it said
    // nothing: at once).
    let (per_quota, not_before) = match per_quota.len().checked_sub(3 * policy.len()) {
        Some(0) => (per_quota, now),
        Some(1) => (
            &per_quota[..3 * policy.len()],
            positive(per_quota[3 * policy.len()]).max(now),
        ),
        _ => {
            return Err(StoreError::new(
                StoreErrorKind::Protocol,
                format!("redis lease reserve replied {} values", reply.len()),
            ))
        }
    };
    let granted = u32::try_from(granted).unwrap_or(u32::MAX);
    let units = |v: i64| u32::try_from(v.max(0)).unwrap_or(u32::MAX).min(granted);
    let states = policy
        .quotas()
        .iter()
        .zip(per_quota.chunks_exact(3))
        .map(|(quota, values)| {
            if not_before > now {
                crate::algorithm::lease::later_decision(
                    quota,
                    positive(values[1]),
                    not_before - now,
                )
            } else {
                crate::algorithm::lease::quota_decision(
                    quota,
                    positive(values[0]),
                    positive(values[1]),
                    units(values[2]),
                    at_least,
                )
            }
        });
    let decision = Decision::from_quotas(states).map(|d| d.with_timestamp_micros(now));
    let holds = if policy.quotas().iter().any(crate::Quota::is_shadow) {
        per_quota.chunks_exact(3).map(|v| units(v[2])).collect()
    } else {
        Vec::new()
    };
    let lease = Lease::new(positive(seq), granted, now, positive(deadline))
        .with_held(holds)
        .starting_at(not_before);
    Ok(Reservation {
        lease: Some(lease),
        now_micros: now,
        held_until_micros,
        decision,
    })
}

impl super::Backend for RedisStore {
    fn reserve<'a>(
        &'a self,
        guard: &mut Guard<'a>,
        request: ReserveRequest<'a>,
    ) -> Op<'a, Reservation> {
        guard.run(move || self.reserve_lease(request))
    }

    fn refund<'a>(&'a self, guard: &mut Guard<'a>, request: RefundRequest<'a>) -> Op<'a, u32> {
        guard.run(move || self.refund_lease(request))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use super::*;

    #[test]
    fn the_lease_script_reuses_the_check_fragments() {
        assert!(SOURCE.starts_with(include_str!("../algorithm/prelude.lua")));
        assert!(SOURCE.ends_with(include_str!("lease.lua")));
        assert_ne!(RedisStore::lease_script_sha(), RedisStore::script_sha());
    }

    #[test]
    fn replies_become_reservations() {
        let policy = Policy::from("10/1s".parse::<crate::Quota>().unwrap());
        let r = reservation(&policy, 1, &[3, 100, 200, 7, 200, 5, 1_000_000, 3]).unwrap();
        let lease = r.lease.unwrap();
        assert_eq!(
            (lease.granted, lease.id, lease.deadline_micros),
            (3, 7, 200)
        );
        assert!(lease.held.is_empty(), "no shadow quota");
        assert_eq!(r.decision.unwrap().remaining, 5);
        let none = reservation(&policy, 1, &[0, 100, 0, 0, 150]).unwrap();
        assert!(none.lease.is_none());
        assert_eq!(none.held_for(), Duration::from_micros(50));
        assert!(reservation(&policy, 1, &[3, 100, 200, 7, 200, 5, 1_000_000]).is_err());
        assert!(reservation(&policy, 1, &[3, 100, 200, 7, 200]).is_err());
        assert!(reservation(&policy, 1, &[]).is_err());
    }

    #[test]
    fn a_shadow_quota_reports_what_it_holds() {
        let enforced = "10/1s".parse::<crate::Quota>().unwrap().named("e").unwrap();
        let shadow = "2/1s"
            .parse::<crate::Quota>()
            .unwrap()
            .named("s")
            .unwrap()
            .shadowed(true);
        let policy = Policy::new("es", [enforced, shadow]).unwrap();
        let reply = [3, 100, 200, 7, 200, 2, 1_000_000, 3, 0, 900, 1];
        let r = reservation(&policy, 2, &reply).unwrap();
        assert_eq!(r.lease.as_ref().unwrap().held, [3, 1]);
        let decision = r.decision.unwrap();
        assert!(decision.allowed);
        assert_eq!(decision.shadow_denials().count(), 1, "it holds 1 < 2");
        let r = reservation(&policy, 1, &reply).unwrap();
        assert_eq!(r.decision.unwrap().shadow_denials().count(), 0);
    }
}
