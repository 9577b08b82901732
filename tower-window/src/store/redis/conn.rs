//! [`ConnectionStore`] for [`RedisStore`]: one sorted set of lease ids per
//! subject, scored by expiry on Redis `TIME`.
//!
//! Keys (user bytes escaped as for windows, see `keys.rs`):
//!
//! * subject form: `<prefix>{<tenant>:<subject>}:#conn` (the lease set)
//!   and `…:#conn:f` (the fencing counter), in the slot of the subject's
//!   windows;
//! * tenant form (a per-tenant cap): `<prefix>{@<tenant>}:#conn:<subject>`,
//!   `…:#conn:<subject>:f` and the tenant's set `<prefix>{@<tenant>}:#conn`,
//!   all in the tenant's slot, so one script admits against both caps.
//!
//! `#conn` cannot be spelled by an escaped component (a leading `#` is
//! only ever followed by 64 upper-case hex digits), so these keys never
//! meet a window's or a dedup id's. Every script reads `TIME` itself (or
//! the explicit test clock), gives every key it writes a TTL longer than
//! the lease TTL, and touches keys of one slot. A TTL is only ever extended,
//! never shortened: nodes with different lease TTLs (a rolling change of
//! the setting) write the same keys, and a key must outlive the longest
//! lease in it, whichever node wrote last. A heartbeat renews all of a
//! node's leases of one slot in one `EVALSHA` (`conn_renew.lua`).

use std::sync::LazyLock;
use std::time::Duration;

use futures_util::future::BoxFuture;

use super::call::{subject_slot, subject_tag, Call};
use super::keys::{encode_component, write_prefix, Crc16, Sink, CLUSTER_SLOTS};
use super::script::{LuaScript, ScriptCall};
use super::{RedisStore, EXPLICIT_CLOCK_MIN_TTL_MS};
use crate::conn::{CapScope, ConnectionStore, GrantReply, GrantRequest, LeaseRef};
use crate::store::{StoreError, StoreErrorKind};
use crate::WindowKey;

static GRANT: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(concat!(
        include_str!("scripts/conn_now.lua"),
        include_str!("scripts/conn_grant.lua")
    ))
});
static RENEW: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(concat!(
        include_str!("scripts/conn_now.lua"),
        include_str!("scripts/conn_renew.lua")
    ))
});
static RELEASE: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(include_str!("scripts/conn_release.lua")));
static PRESENCE: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(concat!(
        include_str!("scripts/conn_now.lua"),
        include_str!("scripts/conn_presence.lua")
    ))
});

/// Extra life of lease keys beyond the lease TTL (ms): a key outlives the
/// latest lease in it (the scripts only ever extend a key's TTL), so expiry
/// of the key never cuts a live lease.
const KEY_TTL_MARGIN_MS: u64 = 1_000;

/// The keys of one lease's sets: the subject's set, its fencing counter,
/// and in the tenant form the tenant's set.
pub(crate) struct LeaseKeys {
    pub(crate) subject: Vec<u8>,
    pub(crate) fence: Vec<u8>,
    pub(crate) tenant: Option<Vec<u8>>,
}

/// The keys of `key`'s leases under `prefix`.
pub(crate) fn lease_keys(prefix: &str, key: &WindowKey, tenant_form: bool) -> LeaseKeys {
    if tenant_form {
        let mut tenant = Vec::with_capacity(prefix.len() + 48);
        write_prefix(&mut tenant, prefix);
        tenant.extend_from_slice(b"{@");
        encode_component(&mut tenant, key.tenant());
        tenant.extend_from_slice(b"}:#conn");
        let mut subject = tenant.clone();
        subject.push(b':');
        encode_component(&mut subject, key.subject());
        let mut fence = subject.clone();
        fence.extend_from_slice(b":f");
        LeaseKeys {
            subject,
            fence,
            tenant: Some(tenant),
        }
    } else {
        let mut subject = Vec::with_capacity(prefix.len() + 64);
        subject_tag(&mut subject, prefix, key);
        subject.extend_from_slice(b":#conn");
        let mut fence = subject.clone();
        fence.extend_from_slice(b":f");
        LeaseKeys {
            subject,
            fence,
            tenant: None,
        }
    }
}

/// The hash slot of `key`'s lease keys.
fn lease_slot(key: &WindowKey, tenant_form: bool) -> u16 {
    if tenant_form {
        let mut crc = Crc16::default();
        crc.put(b"@");
        encode_component(&mut crc, key.tenant());
        crc.value() % CLUSTER_SLOTS
    } else {
        subject_slot(key)
    }
}

/// The highest floor sent to the grant script: floor + 1 must stay an
/// exact integer in Lua's doubles (the store's clock reaches 2^52 µs in
/// 2112; a larger floor could only come from a misbehaving store).
const MAX_FENCE_FLOOR: u64 = (1 << 53) - 2;

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

fn protocol(message: &str) -> StoreError {
    StoreError::new(StoreErrorKind::Protocol, message.to_owned())
}

impl RedisStore {
    /// `ARGV[1]` of the lease scripts and the key TTL for `ttl`.
    fn lease_clock(&self, ttl: Duration) -> Result<(String, u64), StoreError> {
        let ttl_ms = micros(ttl)
            .div_ceil(1_000)
            .saturating_add(KEY_TTL_MARGIN_MS);
        Ok(match self.explicit_now()? {
            Some(now) => (now.to_string(), ttl_ms.max(EXPLICIT_CLOCK_MIN_TTL_MS)),
            None => (String::new(), ttl_ms),
        })
    }

    async fn lease_grant(&self, request: GrantRequest<'_>) -> Result<GrantReply, StoreError> {
        if request.ttl.is_zero() {
            return Err(StoreError::new(
                StoreErrorKind::InvalidRequest,
                "a lease TTL must be positive",
            ));
        }
        let lease = request.lease;
        let keys = lease_keys(&self.prefix, lease.key, lease.tenant_form);
        let (now, key_ttl) = self.lease_clock(request.ttl)?;
        let mut invocation: ScriptCall = GRANT.key(keys.subject);
        invocation.key(keys.fence);
        if let Some(tenant) = keys.tenant {
            invocation.key(tenant);
        }
        invocation
            .arg(now)
            .arg(micros(request.ttl))
            .arg(request.max_per_subject)
            .arg(request.max_per_tenant)
            .arg(lease.id)
            .arg(key_ttl)
            .arg(request.fence_floor.min(MAX_FENCE_FLOOR));
        let reply: Vec<i64> = self.call(Call::Script(&invocation)).await?;
        let [granted, second, count, wait] = reply[..] else {
            return Err(protocol("lease grant reply is not 4 integers"));
        };
        let count = u32::try_from(count).unwrap_or(u32::MAX);
        Ok(if granted == 1 {
            GrantReply::Granted {
                fence: u64::try_from(second).map_err(|_| protocol("negative fence"))?,
                count,
            }
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
    }

    async fn lease_renew(
        &self,
        leases: &[LeaseRef<'_>],
        ttl: Duration,
    ) -> Result<Vec<bool>, StoreError> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let (now, key_ttl) = self.lease_clock(ttl)?;
        let mut invocation = RENEW.prepare_invoke();
        invocation.arg(now).arg(micros(ttl)).arg(key_ttl);
        // Per lease one entry per set it is in: the subject's, then the tenant's.
        let mut entries = Vec::with_capacity(leases.len());
        for lease in leases {
            let keys = lease_keys(&self.prefix, lease.key, lease.tenant_form);
            invocation.key(keys.subject).arg(lease.id);
            let mut n = 1;
            if let Some(tenant) = keys.tenant {
                invocation.key(tenant).arg(lease.id);
                n = 2;
            }
            entries.push(n);
        }
        let reply: Vec<i64> = self.call(Call::Script(&invocation)).await?;
        let mut alive = Vec::with_capacity(leases.len());
        let mut at = 0;
        for n in entries {
            let slice = reply
                .get(at..at + n)
                .ok_or_else(|| protocol("lease renew reply too short"))?;
            alive.push(slice.iter().all(|&v| v == 1));
            at += n;
        }
        Ok(alive)
    }

    async fn lease_release(&self, lease: LeaseRef<'_>) -> Result<bool, StoreError> {
        let keys = lease_keys(&self.prefix, lease.key, lease.tenant_form);
        let mut invocation = RELEASE.key(keys.subject);
        if let Some(tenant) = keys.tenant {
            invocation.key(tenant);
        }
        invocation.arg(lease.id);
        let removed: i64 = self.call(Call::Script(&invocation)).await?;
        Ok(removed == 1)
    }

    async fn lease_presence(&self, key: &WindowKey, tenant_form: bool) -> Result<u32, StoreError> {
        let keys = lease_keys(&self.prefix, key, tenant_form);
        let (now, _) = self.lease_clock(Duration::from_secs(1))?;
        let mut invocation = PRESENCE.key(keys.subject);
        invocation.arg(now);
        let count: i64 = self.call(Call::Script(&invocation)).await?;
        Ok(u32::try_from(count).unwrap_or(0))
    }
}

impl ConnectionStore for RedisStore {
    fn grant<'a>(
        &'a self,
        request: GrantRequest<'a>,
    ) -> BoxFuture<'a, Result<GrantReply, StoreError>> {
        Box::pin(self.lease_grant(request))
    }

    fn renew<'a>(
        &'a self,
        leases: &'a [LeaseRef<'a>],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Vec<bool>, StoreError>> {
        Box::pin(self.lease_renew(leases, ttl))
    }

    fn release<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(self.lease_release(lease))
    }

    fn presence<'a>(
        &'a self,
        key: &'a WindowKey,
        tenant_form: bool,
    ) -> BoxFuture<'a, Result<u32, StoreError>> {
        Box::pin(self.lease_presence(key, tenant_form))
    }

    /// On a cluster, the hash slot of the lease's keys; one partition on a
    /// single node.
    fn lease_partition(&self, key: &WindowKey, tenant_form: bool) -> u16 {
        if self.connection.is_cluster() {
            lease_slot(key, tenant_form)
        } else {
            0
        }
    }

    fn partition_failure_domain(&self, partition: u16) -> Option<u16> {
        self.slot_domain(partition)
    }

    /// 1,000 leases per script call (about 30 ms of Redis time on a busy
    /// 2-core machine, so one call never blocks Redis for long): 10,000
    /// leases of one node on one Redis renew in 10 calls.
    fn max_renew_batch(&self) -> usize {
        1_000
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn lease_keys_share_a_slot_and_are_escaped() {
        let key = WindowKey::new("acme", "u:{1}");
        let subject = lease_keys("tw:", &key, false);
        assert_eq!(subject.subject, b"tw:{acme:u%3A%7B1%7D}:#conn".to_vec());
        assert_eq!(subject.fence, b"tw:{acme:u%3A%7B1%7D}:#conn:f".to_vec());
        assert!(subject.tenant.is_none());
        let tenant = lease_keys("tw:", &key, true);
        assert_eq!(tenant.subject, b"tw:{@acme}:#conn:u%3A%7B1%7D".to_vec());
        assert_eq!(tenant.fence, b"tw:{@acme}:#conn:u%3A%7B1%7D:f".to_vec());
        assert_eq!(tenant.tenant.unwrap(), b"tw:{@acme}:#conn".to_vec());
    }
}
