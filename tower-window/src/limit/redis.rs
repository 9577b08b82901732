//! The windows [`Backend`] of [`RedisStore`].
//!
//! One script decides any policy: `prelude.lua`, one fragment per algorithm
//! (mirroring `crate::algorithm`), and `policy.lua`, which commits only if
//! every quota fits and documents the KEYS/ARGV layout. `peek.lua` takes
//! its place to read without committing, and `settle.lua` (with the
//! take-back fragment) to settle usage known after the request.

use std::sync::LazyLock;

use super::Backend;
use crate::algorithm::redis::{decision, lay_out};
use crate::store::redis::call::Call;
use crate::store::redis::keys::policy_slot;
use crate::store::redis::script::{LuaScript, ScriptCall};
use crate::store::redis::{RedisStore, EXPLICIT_CLOCK_MIN_TTL_MS};
use crate::store::{CheckRequest, Guard, Op, OwnedCheckRequest, StoreError};
use crate::{Decision, Policy, WindowKey};

use super::settle::{Reserved, SettleRequest};

/// The script deciding every policy.
static SCRIPT: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new(ALGORITHMS, POLICY));

const ALGORITHMS: &str = crate::algorithm::redis::with_algorithms!();
const POLICY: &str = include_str!("policy.lua");

/// `peek.lua` in place of `policy.lua`: the same KEYS and ARGV, no commit.
static PEEK: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(ALGORITHMS, include_str!("peek.lua")));

/// `settle.lua` in place of `policy.lua`: the same KEYS and ARGV, then
/// the reservation's units and time, then each quota's usage.
static SETTLE: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        crate::algorithm::redis::with_algorithms!("../algorithm/take_back.lua"),
        include_str!("settle.lua"),
    )
});

/// What a settle needs, owned by its operation.
struct OwnedSettle {
    key: WindowKey,
    policy: Policy,
    reserved: Reserved,
    usage: u32,
    quota_usage: Option<Box<[u32]>>,
}

impl OwnedSettle {
    fn as_request(&self) -> SettleRequest<'_> {
        SettleRequest {
            quota_usage: self.quota_usage.as_deref(),
            ..SettleRequest::new(&self.key, &self.policy, self.reserved, self.usage)
        }
    }
}

impl RedisStore {
    /// Connects now and loads the script that decides every policy,
    /// instead of on the first check.
    pub async fn connect(&self) -> Result<(), StoreError> {
        self.connect_loading(&SCRIPT).await
    }

    /// The SHA1 of the one script every decision runs, as used by
    /// `EVALSHA` (for load tests and operators); as a Redis Function, its
    /// library and function are both `tw_<this SHA1>`.
    pub fn script_sha() -> &'static str {
        SCRIPT.sha()
    }

    /// `script` laid out for `key`'s windows under `policy` with `units`
    /// per quota, on the explicit clock when the store has one.
    pub(crate) fn prepare_script(
        &self,
        script: &'static LuaScript,
        key: &WindowKey,
        policy: &Policy,
        units: u32,
    ) -> Result<ScriptCall, StoreError> {
        let now = self.explicit_now()?;
        let min_ttl_ms = now.map_or(0, |_| EXPLICIT_CLOCK_MIN_TTL_MS);
        let mut call = script.prepare_invoke();
        lay_out(&mut call, &self.prefix, key, policy, units, now, min_ttl_ms);
        Ok(call)
    }

    /// Runs `script` (the check or the peek script) for `request`: one
    /// `EVALSHA`.
    async fn policy_script(
        &self,
        script: &'static LuaScript,
        request: CheckRequest<'_>,
    ) -> Result<Vec<i64>, StoreError> {
        let (key, policy) = (request.key, request.policy);
        let mut call = self.prepare_script(script, key, policy, request.cost.get())?;
        if request.quota_costs.is_some() {
            // After the quota slots: one cost per quota (see policy.lua).
            for i in 0..policy.len() {
                call.arg(request.cost_of(i).get());
            }
        }
        self.call(Call::Script(&call)).await
    }

    /// Runs `settle.lua` for `request`: one `EVALSHA`.
    async fn settle_script(&self, request: SettleRequest<'_>) -> Result<Vec<i64>, StoreError> {
        let (key, policy) = (request.key, request.policy);
        let mut call = self.prepare_script(&SETTLE, key, policy, request.usage)?;
        call.arg(request.reserved.units);
        call.arg(request.reserved.at_micros);
        let recorded = (0..policy.len()).map(|i| match request.reserved.units_in(i) {
            0 => '0',
            _ => '1',
        });
        call.arg(recorded.collect::<String>());
        if request.quota_usage.is_some() {
            for i in 0..policy.len() {
                call.arg(request.usage_of(i));
            }
        }
        self.call(Call::Script(&call)).await
    }

    /// `script` for `request` as a guarded operation owning clones of the
    /// store and the request.
    fn policy_op(
        &self,
        guard: &mut Guard<'_>,
        script: &'static LuaScript,
        request: CheckRequest<'_>,
    ) -> Op<'static, Decision> {
        let (store, request) = (self.clone(), OwnedCheckRequest::from(request));
        guard.run(move || {
            let (store, request) = (store.clone(), request.clone());
            async move {
                let request = request.as_request();
                let reply = store.policy_script(script, request).await?;
                decision(request.policy, &reply)
            }
        })
    }
}

impl Backend for RedisStore {
    fn check<'a>(
        &'a self,
        guard: &mut Guard<'a>,
        request: CheckRequest<'a>,
    ) -> Op<'static, Decision> {
        self.policy_op(guard, &SCRIPT, request)
    }

    fn peek<'a>(
        &'a self,
        guard: &mut Guard<'a>,
        request: CheckRequest<'a>,
    ) -> Op<'static, Decision> {
        self.policy_op(guard, &PEEK, request)
    }

    fn settle<'a>(
        &'a self,
        guard: &mut Guard<'a>,
        request: SettleRequest<'a>,
    ) -> Op<'static, Decision> {
        if let Err(error) = request.validate() {
            return Op::ready(Err(error));
        }
        let store = self.clone();
        let owned = std::sync::Arc::new(OwnedSettle {
            key: request.key.clone(),
            policy: request.policy.clone(),
            reserved: request.reserved,
            usage: request.usage,
            quota_usage: request.quota_usage.map(Box::from),
        });
        guard.run(move || {
            let (store, owned) = (store.clone(), std::sync::Arc::clone(&owned));
            async move {
                let request = owned.as_request();
                let reply = store.settle_script(request).await?;
                decision(request.policy, &reply)
            }
        })
    }

    /// On a cluster store, the primary serving the hash slot of `key`'s
    /// keys under `policy`, from the cluster's slot map: one breaker per
    /// primary. `None` on a single node, and until the slot map has loaded.
    fn failure_domain(&self, key: &WindowKey, policy: &Policy) -> Option<u16> {
        self.slot_domain(policy_slot(key, policy))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::algorithm::redis::Parts;
    use crate::{Quota, Scope};
    use redis::ToRedisArgs;
    use std::time::Duration;

    /// The script EVALSHA names is the concatenation of the fragments, in
    /// order, each ending its last line (else two fragments' lines would
    /// fuse into one, and the script would not parse): the SHA the store
    /// sends is the hash of exactly that text, so a stale or edited copy
    /// names another script.
    #[test]
    fn the_sha_names_the_fragments_in_order() {
        let fragments = [
            include_str!("../algorithm/prelude.lua"),
            include_str!("../algorithm/sliding_log.lua"),
            include_str!("../algorithm/sliding_counter.lua"),
            include_str!("../algorithm/fixed_window.lua"),
            include_str!("../algorithm/gcra.lua"),
            include_str!("policy.lua"),
        ];
        for (i, fragment) in fragments.iter().enumerate() {
            assert!(fragment.ends_with('\n'), "fragment {i} ends mid-line");
        }
        assert_eq!(format!("{ALGORITHMS}{POLICY}"), fragments.concat());
        assert_eq!(
            RedisStore::script_sha(),
            redis::Script::new(&fragments.concat()).get_hash()
        );
        assert_eq!(SCRIPT.sha(), RedisStore::script_sha());
        // A one-byte change names another script.
        assert_ne!(
            RedisStore::script_sha(),
            redis::Script::new(&format!("{ALGORITHMS}{POLICY} ")).get_hash()
        );
    }

    #[test]
    fn the_retry_walk_bound_matches_the_rust_one() {
        let line = format!(
            "local MAX_RETRY_WALK = {}\n",
            crate::algorithm::MAX_RETRY_WALK
        );
        assert!(ALGORITHMS.contains(&line), "{line}");
    }

    fn q(text: &str, name: &str) -> Quota {
        text.parse::<Quota>().unwrap().named(name).unwrap()
    }

    #[test]
    fn replies_become_decisions() {
        let policy = Policy::from(q("10/1s", "a"));
        let allowed = decision(&policy, &[1, 42, 1, 9, 1_000_000, 0]).unwrap();
        assert!(allowed.allowed);
        assert_eq!(allowed.remaining, 9);
        assert_eq!(allowed.retry_after, Some(Duration::ZERO));
        assert_eq!(allowed.timestamp_micros, 42);
        let never = decision(&policy, &[0, 42, 0, 3, 5, -1]).unwrap();
        assert!(!never.allowed);
        assert_eq!(never.retry_after, None);
        let later = decision(&policy, &[0, 42, 0, -2, 5, 7]).unwrap();
        assert_eq!(later.retry_after, Some(Duration::from_micros(7)));
        assert_eq!(later.remaining, 0);
        assert!(decision(&policy, &[1, 2]).is_err());
        assert!(decision(&policy, &[]).is_err());
        assert!(decision(&policy, &[0, 42, 1, 9, 1_000_000, 0]).is_err());
    }

    #[test]
    fn several_quotas_in_policy_order() {
        let policy = Policy::new("p", [q("5/1s", "burst"), q("100/1h gcra", "hourly")]).unwrap();
        let d = decision(&policy, &[0, 7, 1, 4, 1_000_000, 0, 0, 0, 36, 12]).unwrap();
        assert!(!d.allowed);
        assert_eq!(d.quota().name(), "hourly");
        assert_eq!(d.retry_after, Some(Duration::from_micros(12)));
        assert_eq!(d.quotas()[0].remaining, 4);
        assert!(decision(&policy, &[0, 7, 1, 4, 1_000_000, 0]).is_err());
    }

    #[test]
    fn invocation_lays_out_keys_and_arguments() {
        let org = q("50/1m fixed-window", "org").scoped(Scope::Tenant);
        let policy = Policy::new("p", [q("5/1s", "log"), org]).unwrap();
        let key = WindowKey::new("t", "s");
        #[derive(Default)]
        struct Record(Vec<Vec<u8>>, Vec<String>);
        impl Parts for Record {
            fn key(&mut self, key: Vec<u8>) {
                self.0.push(key);
            }
            fn arg(&mut self, arg: impl ToRedisArgs) {
                for a in arg.to_redis_args() {
                    self.1.push(String::from_utf8(a).unwrap());
                }
            }
        }
        let mut call = Record::default();
        lay_out(&mut call, "x:", &key, &policy, 2, Some(9), 60_000);
        assert_eq!(
            call.0,
            [
                b"x:{@t}:s:log|1s|sliding-log".to_vec(),
                b"x:{@t}:s:log|1s|sliding-log:m".to_vec(),
                b"x:{@t}:org|1m|fixed-window|tenant".to_vec(),
            ]
        );
        assert_eq!(
            call.1,
            ["9", "2", "60000", "2", "1", "1000000", "5", "0", "3", "60000000", "50", "0"]
        );
    }
}
