//! Quota leases on Redis: [`Backend`](super::Backend) for [`RedisStore`]
//! (see [`crate::lease`]).
//!
//! Each call is one `EVALSHA` of `lease.lua` after the shared prelude,
//! algorithm and take-back fragments, so a lease reads and writes the very
//! state a check does, on Redis's own `TIME`. Besides the quotas' keys it uses two keys
//! beside the policy's first quota key, in the same hash slot: `<key>:lr`
//! (a hash of the outstanding leases, the lease counter and the latest
//! deadline) and `<key>:lx` (the leases by when their units stop counting,
//! so that every call drops at most `MAX_DEAD` dead records). Both expire
//! when the last recorded lease stops mattering.
//!
//! A lease is named by the store time of its reservation and a counter
//! (`<t>:<seq>`), so a refund that arrives after its record was dropped
//! (or twice) finds nothing and changes nothing.

use std::sync::LazyLock;

use crate::algorithm::lease::quota_decision;
use crate::algorithm::redis::{count, decision, Parts};
use crate::lease::{Lease, RefundRequest, Reservation, ReserveRequest};
use crate::store::redis::call::Call;
use crate::store::redis::keys::redis_key;
use crate::store::redis::script::{LuaScript, ScriptCall};
use crate::store::redis::RedisStore;
use crate::store::{Guard, Op, StoreError};
use crate::{Policy, WindowKey};

const DEFINITIONS: &str = crate::algorithm::redis::with_algorithms!("../algorithm/take_back.lua");
const BODY: &str = include_str!("lease.lua");

static SCRIPT: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new(DEFINITIONS, BODY));

/// A lease's name in the store: reservation time and counter.
fn field(lease: &Lease) -> String {
    format!("{}:{}", lease.reserved_at_micros, lease.id)
}

impl RedisStore {
    /// The SHA1 of the lease script (reserve and refund), as `EVALSHA`
    /// names it; its function is `tw_<this SHA1>`.
    pub fn lease_script_sha() -> &'static str {
        SCRIPT.sha()
    }

    fn lease_call(
        &self,
        key: &WindowKey,
        policy: &Policy,
        units: u32,
    ) -> Result<ScriptCall, StoreError> {
        let Some(first) = policy.quotas().first() else {
            return Err(StoreError::invalid("a policy without quotas"));
        };
        let mut call = self.prepare_script(&SCRIPT, key, policy, units)?;
        let base = redis_key(&self.prefix, key, policy, first);
        for suffix in [b":lr", b":lx"] {
            Parts::key(&mut call, [&base[..], suffix].concat());
        }
        Ok(call)
    }
}

/// Turns the reserve reply (see `lease.lua`) into a [`Reservation`].
fn reservation(policy: &Policy, at_least: u32, reply: &[i64]) -> Result<Reservation, StoreError> {
    let wrong_length = || {
        StoreError::protocol(format!(
            "redis lease reserve replied {} values",
            reply.len()
        ))
    };
    let Some((&[granted, now, deadline, seq, held, refunded], rest)) =
        reply.split_first_chunk::<6>()
    else {
        return Err(wrong_length());
    };
    let positive = |v: i64| u64::try_from(v).unwrap_or(0);
    let now = positive(now);
    let empty =
        Reservation::empty(now, (held > 0).then(|| positive(held))).with_refunded(count(refunded));
    if granted <= 0 {
        return Ok(if rest.is_empty() {
            empty
        } else {
            empty.with_decision(decision(policy, rest)?)
        });
    }
    let Some((&not_before, per_quota)) = rest
        .split_last()
        .filter(|(_, per_quota)| per_quota.len() == 3 * policy.len())
    else {
        return Err(wrong_length());
    };
    let not_before = positive(not_before).max(now);
    let granted = count(granted);
    let held = |v: i64| count(v).min(granted);
    let wait = not_before - now;
    let states = policy.quotas().iter().zip(per_quota.chunks_exact(3));
    let states = states.map(|(quota, v)| {
        let (remaining, reset) = (positive(v[0]), positive(v[1]));
        quota_decision(quota, remaining, reset, held(v[2]), at_least, wait)
    });
    let lease = Lease::new(positive(seq), granted, now, positive(deadline)).starting_at(not_before);
    let holds = per_quota.chunks_exact(3).map(|v| held(v[2]));
    Ok(empty.granting(policy, lease, holds, states))
}

impl super::Backend for RedisStore {
    fn reserve<'a>(
        &'a self,
        guard: &mut Guard<'a>,
        request: ReserveRequest<'a>,
    ) -> Op<'a, Reservation> {
        guard.run(move || async move {
            let ttl = request.validate()?;
            // Beyond 2^40 µs (12 days) a lease is no lease; keeps Lua exact.
            if ttl > 1 << 40 {
                return Err(StoreError::invalid(
                    "a lease needs a TTL between 1 microsecond and 2^40 microseconds",
                ));
            }
            let mut call = self.lease_call(request.key, request.policy, request.want)?;
            let max_wait = crate::clock::duration_micros(request.max_wait).min(1 << 40);
            let refunds = request.refunds.iter().filter(|r| r.returns_anything());
            call.arg("reserve")
                .arg(ttl)
                .arg(request.at_least)
                .arg(max_wait)
                .arg(u8::from(request.decides))
                .arg(refunds.clone().count());
            for refund in refunds {
                call.arg(field(refund.lease))
                    .arg(refund.unused.min(refund.lease.granted));
                // One value per quota; '' leaves a shadow quota's to the script.
                for i in 0..request.policy.len() {
                    match refund.shadow_unused.and_then(|units| units.get(i)) {
                        Some(units) => call.arg(*units),
                        None => call.arg(""),
                    };
                }
            }
            let reply: Vec<i64> = self.call(Call::Script(&call)).await?;
            reservation(request.policy, request.at_least, &reply)
        })
    }

    fn refund<'a>(&'a self, guard: &mut Guard<'a>, request: RefundRequest<'a>) -> Op<'a, u32> {
        guard.run(move || async move {
            if !request.returns_anything() {
                return Ok(0);
            }
            let unused = request.unused.min(request.lease.granted);
            let mut call = self.lease_call(request.key, request.policy, unused)?;
            call.arg("refund").arg(field(request.lease));
            if let Some(units) = request.shadow_unused {
                // One value per quota; the script reads them for shadow quotas.
                for i in 0..request.policy.len() {
                    call.arg(units.get(i).copied().unwrap_or(0));
                }
            }
            let reply: Vec<i64> = self.call(Call::Script(&call)).await?;
            let [returned] = reply[..] else {
                let message = format!(
                    "redis lease refund replied {} values, expected 1",
                    reply.len()
                );
                return Err(StoreError::protocol(message));
            };
            Ok(count(returned))
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use super::*;

    #[test]
    fn the_lease_script_reuses_the_check_fragments() {
        assert!(DEFINITIONS.starts_with(include_str!("../algorithm/prelude.lua")));
        assert!(DEFINITIONS.ends_with(include_str!("../algorithm/take_back.lua")));
        assert_ne!(RedisStore::lease_script_sha(), RedisStore::script_sha());
    }

    #[test]
    fn replies_become_reservations() {
        let policy = Policy::from("10/1s".parse::<crate::Quota>().unwrap());
        let r = reservation(&policy, 1, &[3, 100, 200, 7, 200, 2, 5, 1_000_000, 3, 100]).unwrap();
        assert_eq!(r.refunded, 2);
        let lease = r.lease.unwrap();
        assert_eq!(
            (lease.granted, lease.id, lease.deadline_micros),
            (3, 7, 200)
        );
        assert!(lease.held.is_empty(), "no shadow quota");
        assert_eq!(r.decision.unwrap().remaining, 5);
        let none = reservation(&policy, 1, &[0, 100, 0, 0, 150, 0]).unwrap();
        assert!(none.lease.is_none() && none.decision.is_none());
        assert_eq!(none.held_for(), Duration::from_micros(50));
        // Nothing granted, and the check decided: the check script's reply.
        let denied =
            reservation(&policy, 1, &[0, 100, 0, 0, 150, 1, 0, 100, 0, 0, 900, 40]).unwrap();
        assert!(denied.lease.is_none());
        assert_eq!(denied.refunded, 1);
        let decision = denied.decision.unwrap();
        assert!(!decision.allowed);
        assert_eq!(decision.retry_after, Some(Duration::from_micros(40)));
        assert!(reservation(&policy, 1, &[0, 100, 0, 0, 150, 0, 1]).is_err());
        assert!(reservation(&policy, 1, &[3, 100, 200, 7, 200, 0, 5, 1_000_000, 3]).is_err());
        assert!(reservation(&policy, 1, &[3, 100, 200, 7, 200, 0]).is_err());
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
        let reply = [3, 100, 200, 7, 200, 0, 2, 1_000_000, 3, 0, 900, 1, 100];
        let r = reservation(&policy, 2, &reply).unwrap();
        assert_eq!(r.lease.as_ref().unwrap().held, [3, 1]);
        let decision = r.decision.unwrap();
        assert!(decision.allowed);
        assert_eq!(decision.shadow_denials().count(), 1, "it holds 1 < 2");
        let r = reservation(&policy, 1, &reply).unwrap();
        assert_eq!(r.decision.unwrap().shadow_denials().count(), 0);
    }
}
