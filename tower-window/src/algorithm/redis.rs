//! How a policy meets the algorithms' Lua: the shared fragments a script
//! starts with ([`with_algorithms`]) and the KEYS/ARGV layout of a policy
//! ([`lay_out`]), used by every script that decides or holds quota (the
//! policy check, the peek, quota leases). `limit/policy.lua` documents the
//! layout and the reply.

use redis::ToRedisArgs;

use crate::store::redis::keys::{redis_key, META_SUFFIX};
use std::time::Duration;

use crate::store::redis::script::ScriptCall;
use crate::store::StoreError;
use crate::{Algorithm, Decision, Policy, QuotaDecision, WindowKey};

/// One of the algorithms' Lua fragments.
macro_rules! fragment {
    ($name:literal) => {
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/src/algorithm/",
            $name
        ))
    };
}
pub(crate) use fragment;

/// The definitions of a script that decides with the algorithms: the
/// prelude and every algorithm's fragment, then the `$more` files in order
/// (paths relative to the file naming them). The script's body follows
/// (see [`LuaScript::new`](crate::store::redis::script::LuaScript::new)).
macro_rules! with_algorithms {
    ($($more:literal),*) => {
        concat!(
            $crate::algorithm::redis::fragment!("prelude.lua"),
            $crate::algorithm::redis::fragment!("sliding_log.lua"),
            $crate::algorithm::redis::fragment!("sliding_counter.lua"),
            $crate::algorithm::redis::fragment!("fixed_window.lua"),
            $crate::algorithm::redis::fragment!("gcra.lua"),
            $(include_str!($more),)*
        )
    };
}
pub(crate) use with_algorithms;

/// The algorithm's code in `ALGORITHMS` (see the fragments).
fn code(algorithm: Algorithm) -> u8 {
    match algorithm {
        Algorithm::SlidingLog => 1,
        Algorithm::SlidingCounter { .. } => 2,
        Algorithm::FixedWindow => 3,
        Algorithm::Gcra => 4,
    }
}

/// Added to a shadow quota's algorithm code (`SHADOW_FLAG` in the prelude).
const SHADOW_FLAG: u8 = 16;

/// Where an invocation's keys and arguments go (the script call, or a
/// test's record of them).
pub(crate) trait Parts {
    fn key(&mut self, key: Vec<u8>);
    fn arg(&mut self, arg: impl ToRedisArgs);
}

impl Parts for ScriptCall {
    fn key(&mut self, key: Vec<u8>) {
        ScriptCall::key(self, key);
    }

    fn arg(&mut self, arg: impl ToRedisArgs) {
        ScriptCall::arg(self, arg);
    }
}

pub(crate) fn lay_out(
    call: &mut impl Parts,
    prefix: &str,
    key: &WindowKey,
    policy: &Policy,
    cost: u32,
    now_micros: Option<u64>,
    min_ttl_ms: u64,
) {
    match now_micros {
        Some(now) => call.arg(now),
        None => call.arg(""),
    }
    call.arg(cost);
    call.arg(min_ttl_ms);
    call.arg(policy.len());
    for quota in policy.quotas() {
        let algorithm = quota.algorithm();
        let window_key = redis_key(prefix, key, policy, quota);
        let meta =
            (algorithm == Algorithm::SlidingLog).then(|| [&window_key, META_SUFFIX].concat());
        call.key(window_key);
        if let Some(meta) = meta {
            call.key(meta);
        }
        let shadow = if quota.is_shadow() { SHADOW_FLAG } else { 0 };
        call.arg(code(algorithm) + shadow);
        // The sliding counter's granularity is the third (0 for the others).
        let (p1, p2) = match algorithm {
            Algorithm::Gcra => (quota.emission_interval_micros(), quota.capacity()),
            _ => (quota.window_micros(), quota.limit()),
        };
        call.arg(p1);
        call.arg(p2);
        call.arg(quota.granularity_micros().unwrap_or(0));
    }
}

pub(crate) fn micros(value: i64) -> Duration {
    Duration::from_micros(u64::try_from(value).unwrap_or(0))
}

/// A count in a script's reply, clamped to `u32`.
pub(crate) fn count(value: i64) -> u32 {
    u32::try_from(value.max(0)).unwrap_or(u32::MAX)
}

/// Turns the script's reply `{allowed, now, then per quota allowed,
/// remaining, reset_after, retry_after}` into the decision of `policy`.
pub(crate) fn decision(policy: &Policy, reply: &[i64]) -> Result<Decision, StoreError> {
    let (got, expected) = (reply.len(), 2 + 4 * policy.len());
    if got != expected {
        return Err(StoreError::protocol(format!(
            "redis script replied {got} values, expected {expected}"
        )));
    }
    let states = policy
        .quotas()
        .iter()
        .zip(reply[2..].chunks_exact(4))
        .map(|(quota, v)| {
            let remaining = count(v[1]);
            if v[0] == 1 {
                QuotaDecision::allow(quota.clone(), remaining, micros(v[2]))
            } else {
                let retry_after = (v[3] >= 0).then(|| micros(v[3]));
                QuotaDecision::deny(quota.clone(), remaining, micros(v[2]), retry_after)
            }
        });
    let decision = Decision::from_quotas(states)
        .ok_or_else(|| StoreError::invalid("a policy without quotas"))?;
    if decision.allowed != (reply[0] == 1) {
        return Err(StoreError::protocol(
            "the redis script's verdict disagrees with its quotas",
        ));
    }
    Ok(decision.with_timestamp_micros(u64::try_from(reply[1]).unwrap_or(0)))
}
