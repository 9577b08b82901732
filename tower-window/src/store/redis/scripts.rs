//! The Lua scripts, one per algorithm, and how to call them.
//!
//! Each script is the shared `prelude.lua` followed by the algorithm's file,
//! mirroring `crate::algorithm` line by line. Scripts run with `EVALSHA`; a
//! `NOSCRIPT` reply makes redis-rs load the script and retry once.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{Script, ScriptInvocation};

use super::keys::META_SUFFIX;
use crate::store::{StoreError, StoreErrorKind};
use crate::{Algorithm, Decision, Quota};

macro_rules! script {
    ($file:literal) => {
        LazyLock::new(|| {
            Script::new(concat!(
                include_str!("scripts/prelude.lua"),
                include_str!(concat!("scripts/", $file))
            ))
        })
    };
}

static SLIDING_LOG: LazyLock<Script> = script!("sliding_log.lua");
static SLIDING_COUNTER: LazyLock<Script> = script!("sliding_counter.lua");
static FIXED_WINDOW: LazyLock<Script> = script!("fixed_window.lua");
static GCRA: LazyLock<Script> = script!("gcra.lua");

/// The largest explicit timestamp the scripts accept: Lua numbers are
/// doubles, exact for integers up to 2^53.
pub(crate) const MAX_EXPLICIT_MICROS: u64 = 1 << 52;

/// The script deciding `algorithm`.
pub(crate) fn script_for(algorithm: Algorithm) -> &'static Script {
    match algorithm {
        Algorithm::SlidingLog => &SLIDING_LOG,
        Algorithm::SlidingCounter { .. } => &SLIDING_COUNTER,
        Algorithm::FixedWindow => &FIXED_WINDOW,
        Algorithm::Gcra => &GCRA,
    }
}

/// Every script, for preloading.
pub(crate) fn all() -> [&'static Script; 4] {
    [&SLIDING_LOG, &SLIDING_COUNTER, &FIXED_WINDOW, &GCRA]
}

/// The SHA1 of the script deciding `algorithm` (what `EVALSHA` names).
pub(crate) fn sha_for(algorithm: Algorithm) -> &'static str {
    script_for(algorithm).get_hash()
}

/// Builds the `EVALSHA` call for one check.
///
/// `now_micros` is `None` to let the script read Redis `TIME`.
pub(crate) fn invocation(
    key: Vec<u8>,
    quota: &Quota,
    cost: u32,
    now_micros: Option<u64>,
    min_ttl_ms: u64,
) -> ScriptInvocation<'static> {
    let algorithm = quota.algorithm();
    let mut call = script_for(algorithm).prepare_invoke();
    if algorithm == Algorithm::SlidingLog {
        let mut meta = key.clone();
        meta.extend_from_slice(META_SUFFIX);
        call.key(key).key(meta);
    } else {
        call.key(key);
    }
    match now_micros {
        Some(now) => call.arg(now),
        None => call.arg(""),
    };
    call.arg(cost).arg(min_ttl_ms);
    match algorithm {
        Algorithm::SlidingLog | Algorithm::FixedWindow => {
            call.arg(quota.window_micros()).arg(quota.limit());
        }
        Algorithm::SlidingCounter { .. } => {
            call.arg(quota.window_micros())
                .arg(quota.limit())
                .arg(quota.granularity_micros().unwrap_or(quota.window_micros()));
        }
        Algorithm::Gcra => {
            call.arg(quota.emission_interval_micros())
                .arg(quota.capacity());
        }
    }
    call
}

fn micros(value: i64) -> Duration {
    Duration::from_micros(u64::try_from(value).unwrap_or(0))
}

/// Turns a script's reply `{allowed, remaining, reset_after, retry_after, now}` into a decision.
pub(crate) fn decision(quota: &Quota, reply: &[i64]) -> Result<Decision, StoreError> {
    let &[allowed, remaining, reset_after, retry_after, now] = reply else {
        return Err(StoreError::new(
            StoreErrorKind::Protocol,
            format!("redis script replied {} values, expected 5", reply.len()),
        ));
    };
    let remaining = u32::try_from(remaining.max(0)).unwrap_or(u32::MAX);
    let decision = if allowed == 1 {
        Decision::allow(quota.clone(), remaining, micros(reset_after))
    } else {
        let retry_after = (retry_after >= 0).then(|| micros(retry_after));
        Decision::deny(quota.clone(), remaining, micros(reset_after), retry_after)
    };
    Ok(decision.with_timestamp_micros(u64::try_from(now).unwrap_or(0)))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn scripts_are_distinct_and_sane() {
        let hashes: std::collections::HashSet<_> = all().iter().map(|s| s.get_hash()).collect();
        assert_eq!(hashes.len(), 4);
        for algorithm in [
            Algorithm::SlidingLog,
            Algorithm::FixedWindow,
            Algorithm::Gcra,
        ] {
            assert_eq!(sha_for(algorithm).len(), 40);
        }
    }

    #[test]
    fn replies_become_decisions() {
        let quota: Quota = "10/1s".parse().unwrap();
        let allowed = decision(&quota, &[1, 9, 1_000_000, 0, 42]).unwrap();
        assert!(allowed.allowed);
        assert_eq!(allowed.remaining, 9);
        assert_eq!(allowed.retry_after, Some(Duration::ZERO));
        assert_eq!(allowed.timestamp_micros, 42);
        let never = decision(&quota, &[0, 3, 5, -1, 42]).unwrap();
        assert!(!never.allowed);
        assert_eq!(never.retry_after, None);
        let later = decision(&quota, &[0, 0, 5, 7, 42]).unwrap();
        assert_eq!(later.retry_after, Some(Duration::from_micros(7)));
        assert!(decision(&quota, &[1, 2]).is_err());
    }
}
