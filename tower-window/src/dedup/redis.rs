//! [`dedup::Backend`] for [`RedisStore`]: `SET <key> 1 NX PX <window>`.
//!
//! One id is one key, `<prefix>{<tenant>:<subject>}:#dedup:<id>`: the
//! subject's hash tag, a segment no escaped component can spell (none
//! starts with `#` but the hashed form), then the id encoded. With an
//! explicit clock (tests) `dedup.lua` compares a stored deadline instead.

use std::sync::LazyLock;

use crate::dedup::{self, DedupRequest};
use crate::store::redis::call::Call;
use crate::store::redis::keys::{encode_component, tag_slot, write_tagged};
use crate::store::redis::script::LuaScript;
use crate::store::redis::{RedisStore, EXPLICIT_CLOCK_MIN_TTL_MS};
use crate::store::{Guard, Op};
use crate::WindowKey;

static EXPLICIT: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new("", include_str!("dedup.lua")));

pub(crate) fn dedup_key(prefix: &str, key: &WindowKey, id: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(prefix.len() + 64 + id.len());
    write_tagged(&mut out, prefix, key, false);
    out.extend_from_slice(b":#dedup:");
    encode_component(&mut out, id);
    out
}

impl dedup::Backend for RedisStore {
    fn first_seen<'a>(&'a self, guard: &mut Guard<'a>, request: DedupRequest<'a>) -> Op<'a, bool> {
        guard.run(move || async move {
            let key = dedup_key(&self.prefix, request.key, request.id);
            let window_ms = request.window_millis();
            match self.explicit_now()? {
                None => {
                    let mut cmd = redis::cmd("SET");
                    cmd.arg(key).arg(1).arg("NX").arg("PX").arg(window_ms);
                    let reply: redis::Value = self.call(Call::Cmd(&cmd)).await?;
                    Ok(!matches!(reply, redis::Value::Nil))
                }
                Some(now) => {
                    let mut invocation = EXPLICIT.key(key);
                    invocation
                        .arg(now)
                        .arg(window_ms.saturating_mul(1_000))
                        .arg(window_ms.max(EXPLICIT_CLOCK_MIN_TTL_MS));
                    let first: i64 = self.call(Call::Script(&invocation)).await?;
                    Ok(first == 1)
                }
            }
        })
    }

    fn failure_domain(&self, key: &WindowKey) -> Option<u16> {
        self.slot_domain(tag_slot(key, false))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn keys_are_escaped_and_tagged_by_subject() {
        let key = WindowKey::new("acme", "u:{1}");
        assert_eq!(
            dedup_key("tw:", &key, b"m:1}"),
            b"tw:{acme:u%3A%7B1%7D}:#dedup:m%3A1%7D".to_vec()
        );
        let long = dedup_key("tw:", &key, &[b'x'; 300]);
        assert!(long.len() < 120, "long ids are hashed");
        assert!(long.windows(9).any(|w| w == b":#dedup:#"), "hashed form");
    }
}
