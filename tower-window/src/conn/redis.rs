//! The connection-cap [`Backend`](conn::Backend) of [`RedisStore`]: one
//! sorted set of seat ids per subject, scored by expiry on Redis `TIME`.
//!
//! Keys: `<prefix>{<tenant>:<subject>}:#conn` (the slot of the subject's
//! windows) or, with a tenant cap, `<prefix>{@<tenant>}:#conn:<subject>`
//! beside the tenant's set `<prefix>{@<tenant>}:#conn` (one slot, so one
//! script checks both caps); the fencing counter at `…:f`. An escaped
//! component never spells `#conn`, so these keys never meet a window's.

use std::collections::BTreeMap;
use std::sync::LazyLock;
use std::time::Duration;

use crate::clock::duration_micros;
use crate::conn::{self, CapScope, GrantReply, GrantRequest, SeatRef};
use crate::store::redis::call::Call;
use crate::store::redis::keys::{encode_component, tag_slot, write_prefix, write_tag};
use crate::store::redis::script::{LuaScript, ScriptCall};
use crate::store::redis::{RedisStore, EXPLICIT_CLOCK_MIN_TTL_MS};
use crate::store::StoreError;
use crate::store::{Guard, Op};
use crate::WindowKey;
use redis::FromRedisValue;

/// A seat script after `conn_now.lua` (the clock and helpers).
macro_rules! with_clock {
    ($file:literal) => {
        LazyLock::new(|| {
            LuaScript::new(
                "",
                concat!(include_str!("conn_now.lua"), include_str!($file)),
            )
        })
    };
}

static GRANT: LazyLock<LuaScript> = with_clock!("conn_grant.lua");
static RENEW: LazyLock<LuaScript> = with_clock!("conn_renew.lua");
static PRESENCE: LazyLock<LuaScript> = with_clock!("conn_presence.lua");
static RELEASE: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new("", include_str!("conn_release.lua")));

/// How long a seat key outlives the latest seat in it (ms).
const KEY_TTL_MARGIN_MS: u64 = 1_000;

/// One seat's keys (the tenant's set only in the tenant form).
pub(crate) struct SeatKeys {
    pub(crate) subject: Vec<u8>,
    pub(crate) fence: Vec<u8>,
    pub(crate) tenant: Option<Vec<u8>>,
}

/// The keys of `key`'s seats under `prefix`.
pub(crate) fn seat_keys(prefix: &str, key: &WindowKey, tenant_capped: bool) -> SeatKeys {
    let mut subject = Vec::with_capacity(prefix.len() + 64);
    write_prefix(&mut subject, prefix);
    subject.push(b'{');
    write_tag(&mut subject, key, tenant_capped);
    subject.extend_from_slice(b"}:#conn");
    let tenant = tenant_capped.then(|| subject.clone());
    if tenant_capped {
        subject.push(b':');
        encode_component(&mut subject, key.subject());
    }
    let fence = [&subject[..], b":f"].concat();
    SeatKeys {
        subject,
        fence,
        tenant,
    }
}

/// The highest floor sent to the grant script: floor + 1 must stay an
/// exact integer in Lua's doubles.
const MAX_FENCE_FLOOR: u64 = (1 << 53) - 2;

/// Per seat whether it was live, from a `conn_renew.lua` reply of one
/// entry per set the seat is in: its subject's, then (`tenant_capped`)
/// its tenant's.
fn renew_reply<'s>(
    reply: &[i64],
    seats: impl Iterator<Item = &'s SeatRef<'s>>,
) -> Result<Vec<bool>, StoreError> {
    let mut at = 0;
    let alive = |seat: &SeatRef<'_>| {
        let n = 1 + usize::from(seat.tenant_capped);
        let entries = reply.get(at..at + n);
        at += n;
        let entries = entries.ok_or_else(|| StoreError::protocol("seat renew reply too short"))?;
        Ok(entries.iter().all(|&v| v == 1))
    };
    seats.map(alive).collect()
}

impl RedisStore {
    /// `ARGV[1]` of the seat scripts and the key TTL for `ttl`.
    fn seat_clock(&self, ttl: Duration) -> Result<(String, u64), StoreError> {
        let ttl_ms = duration_micros(ttl)
            .div_ceil(1_000)
            .saturating_add(KEY_TTL_MARGIN_MS);
        Ok(match self.explicit_now()? {
            Some(now) => (now.to_string(), ttl_ms.max(EXPLICIT_CLOCK_MIN_TTL_MS)),
            None => (String::new(), ttl_ms),
        })
    }

    /// One `conn_renew.lua` call for `seats` (of one hash slot).
    fn renew_call<'s>(
        &self,
        seats: impl Iterator<Item = &'s SeatRef<'s>>,
        now: &str,
        ttl: Duration,
        key_ttl: u64,
    ) -> ScriptCall {
        let mut invocation = RENEW.prepare_invoke();
        invocation.arg(now).arg(duration_micros(ttl)).arg(key_ttl);
        for seat in seats {
            let keys = seat_keys(&self.prefix, seat.key, seat.tenant_capped);
            invocation.key(keys.subject).arg(seat.id);
            if let Some(tenant) = keys.tenant {
                invocation.key(tenant).arg(seat.id);
            }
        }
        invocation
    }

    async fn seat_renew(
        &self,
        seats: &[SeatRef<'_>],
        ttl: Duration,
    ) -> Result<Vec<bool>, StoreError> {
        if seats.is_empty() {
            return Ok(Vec::new());
        }
        let (now, key_ttl) = self.seat_clock(ttl)?;
        let invocation = self.renew_call(seats.iter(), &now, ttl, key_ttl);
        let reply: Vec<i64> = self.call(Call::Script(&invocation)).await?;
        renew_reply(&reply, seats.iter())
    }
}

impl conn::Backend for RedisStore {
    fn grant<'a>(&'a self, guard: &mut Guard<'a>, request: GrantRequest<'a>) -> Op<'a, GrantReply> {
        guard.run(move || async move {
            if request.ttl.is_zero() {
                return Err(StoreError::invalid("a seat TTL must be positive"));
            }
            let seat = request.seat;
            let keys = seat_keys(&self.prefix, seat.key, seat.tenant_capped);
            let (now, key_ttl) = self.seat_clock(request.ttl)?;
            let mut invocation = GRANT.key(keys.subject);
            invocation
                .key(keys.fence)
                .key(keys.tenant)
                .arg(now)
                .arg(duration_micros(request.ttl))
                .arg(request.max_per_subject)
                .arg(request.max_per_tenant)
                .arg(seat.id)
                .arg(key_ttl)
                .arg(request.fence_floor.min(MAX_FENCE_FLOOR));
            let reply: Vec<i64> = self.call(Call::Script(&invocation)).await?;
            let [granted, second, count, wait] = reply[..] else {
                return Err(StoreError::protocol("seat grant reply is not 4 integers"));
            };
            let count = u32::try_from(count).unwrap_or(u32::MAX);
            Ok(if granted == 1 {
                let fence =
                    u64::try_from(second).map_err(|_| StoreError::protocol("negative fence"))?;
                GrantReply::Granted { fence, count }
            } else {
                GrantReply::Denied {
                    scope: if second == 2 {
                        CapScope::Tenant
                    } else {
                        CapScope::Subject
                    },
                    count,
                    retry_after: Duration::from_micros(u64::try_from(wait).unwrap_or(0)),
                }
            })
        })
    }

    fn renew<'a>(
        &'a self,
        guard: &mut Guard<'a>,
        seats: &'a [SeatRef<'a>],
        ttl: Duration,
    ) -> Op<'a, Vec<bool>> {
        guard.run(move || self.seat_renew(seats, ttl))
    }

    fn renew_route(&self, partition: u16) -> Option<u16> {
        self.slot_domain(partition)
    }

    /// Renews seats of several hash slots of one primary: one script per
    /// slot and batch, in one pipeline. Seats whose slot moved answer
    /// `None`. Seats of one slot take [`renew`](conn::Backend::renew),
    /// which follows redirects.
    fn renew_routed<'a>(
        &'a self,
        guard: &mut Guard<'a>,
        seats: &'a [SeatRef<'a>],
        ttl: Duration,
    ) -> Op<'a, Vec<Option<bool>>> {
        guard.run(move || async move {
            let mut slots: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
            for (i, seat) in seats.iter().enumerate() {
                let slot = tag_slot(seat.key, seat.tenant_capped);
                slots.entry(slot).or_default().push(i);
            }
            let Some(&first) = slots.keys().next() else {
                return Ok(Vec::new());
            };
            if slots.len() == 1 || !self.connection.is_cluster() {
                let alive = self.seat_renew(seats, ttl).await?;
                return Ok(alive.into_iter().map(Some).collect());
            }
            let (now, key_ttl) = self.seat_clock(ttl)?;
            let batch = conn::Backend::max_renew_batch(self).max(1);
            let chunks: Vec<&[usize]> = slots.values().flat_map(|i| i.chunks(batch)).collect();
            let calls: Vec<ScriptCall> = chunks
                .iter()
                .map(|chunk| self.renew_call(chunk.iter().map(|&i| &seats[i]), &now, ttl, key_ttl))
                .collect();
            let mut alive = vec![None; seats.len()];
            let Some(replies) = self.call_routed(first, &RENEW, &calls).await? else {
                return Ok(alive);
            };
            for (chunk, reply) in chunks.into_iter().zip(replies) {
                // An error reply (MOVED: the slot is served elsewhere now)
                // leaves the call's seats unanswered.
                let Ok(reply) = Vec::<i64>::from_redis_value(reply) else {
                    continue;
                };
                let live = renew_reply(&reply, chunk.iter().map(|&i| &seats[i]))?;
                for (&i, live) in chunk.iter().zip(live) {
                    alive[i] = Some(live);
                }
            }
            Ok(alive)
        })
    }

    fn release<'a>(&'a self, guard: &mut Guard<'a>, seat: SeatRef<'a>) -> Op<'a, bool> {
        guard.run(move || async move {
            let keys = seat_keys(&self.prefix, seat.key, seat.tenant_capped);
            let mut invocation = RELEASE.key(keys.subject);
            invocation.key(keys.tenant).arg(seat.id);
            let removed: i64 = self.call(Call::Script(&invocation)).await?;
            Ok(removed == 1)
        })
    }

    fn presence<'a>(
        &'a self,
        guard: &mut Guard<'a>,
        key: &'a WindowKey,
        tenant_capped: bool,
    ) -> Op<'a, u32> {
        guard.run(move || async move {
            let keys = seat_keys(&self.prefix, key, tenant_capped);
            let (now, _) = self.seat_clock(Duration::from_secs(1))?;
            let mut invocation = PRESENCE.key(keys.subject);
            invocation.arg(now);
            let count: i64 = self.call(Call::Script(&invocation)).await?;
            Ok(u32::try_from(count).unwrap_or(0))
        })
    }

    fn seat_partition(&self, key: &WindowKey, tenant_capped: bool) -> u16 {
        if self.connection.is_cluster() {
            tag_slot(key, tenant_capped)
        } else {
            0
        }
    }

    fn partition_failure_domain(&self, partition: u16) -> Option<u16> {
        self.slot_domain(partition)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn seat_keys_share_a_slot_and_are_escaped() {
        let key = WindowKey::new("acme", "u:{1}");
        let subject = seat_keys("tw:", &key, false);
        assert_eq!(subject.subject, b"tw:{acme:u%3A%7B1%7D}:#conn".to_vec());
        assert_eq!(subject.fence, b"tw:{acme:u%3A%7B1%7D}:#conn:f".to_vec());
        assert!(subject.tenant.is_none());
        let tenant = seat_keys("tw:", &key, true);
        assert_eq!(tenant.subject, b"tw:{@acme}:#conn:u%3A%7B1%7D".to_vec());
        assert_eq!(tenant.fence, b"tw:{@acme}:#conn:u%3A%7B1%7D:f".to_vec());
        assert_eq!(tenant.tenant.unwrap(), b"tw:{@acme}:#conn".to_vec());
    }
}
