//! [`ConnectionStore`] for [`MemoryStore`]: lease sets in one map.
//!
//! The same semantics as the Redis scripts (`store/redis/conn.rs`), on the
//! store's clock: per subject (and, in the tenant form, per tenant) a map
//! of lease id to expiry; a grant purges expired leases and admits below
//! the caps; the fencing token is `max(previous + 1, now, floor + 1)`. Like a Redis
//! key, a set lives until a second past the latest expiry any grant or
//! renewal gave a lease in it (so its token survives releases, and a node
//! with a shorter TTL never shortens it); a sweep every 64 grants drops sets past that
//! (a token then restarts from the clock, which has moved past every
//! earlier token), so memory follows the number of live leases.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;

use super::{lock, MemoryStore};
use crate::conn::{CapScope, ConnectionStore, GrantReply, GrantRequest, LeaseRef};
use crate::store::StoreError;
use crate::WindowKey;

/// Which set: a subject's (in one form) or a tenant's.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum SetKey {
    Subject {
        tenant: Bytes,
        subject: Bytes,
        tenant_form: bool,
    },
    Tenant(Bytes),
}

#[derive(Debug, Default)]
struct LeaseSet {
    leases: HashMap<Vec<u8>, u64>,
    fence: u64,
    /// When the set (and its token) is forgotten, like a Redis key's TTL.
    key_expiry: u64,
}

/// How long a set outlives its newest lease (µs), as the Redis keys do.
const KEY_TTL_MARGIN: u64 = 1_000_000;

/// Grants between two sweeps of forgotten sets.
const SWEEP_EVERY: u64 = 64;

impl LeaseSet {
    fn purge(&mut self, now: u64) {
        self.leases.retain(|_, expiry| *expiry > now);
    }

    fn count(&self) -> u32 {
        u32::try_from(self.leases.len()).unwrap_or(u32::MAX)
    }

    /// Keeps the set until at least `key_expiry`, never shorter than it
    /// was: nodes with different lease TTLs (a rolling change) write one
    /// set, which must outlive its longest lease, not the last writer's.
    fn extend(&mut self, key_expiry: u64) {
        self.key_expiry = self.key_expiry.max(key_expiry);
    }

    /// The wait until the oldest lease expires.
    fn retry_after(&self, now: u64) -> Duration {
        let oldest = self.leases.values().min().copied().unwrap_or(now);
        Duration::from_micros(oldest.saturating_sub(now))
    }
}

/// The leases a memory store keeps.
#[derive(Debug, Default)]
pub(crate) struct ConnLeases {
    sets: Mutex<HashMap<SetKey, LeaseSet>>,
    grants: std::sync::atomic::AtomicU64,
}

fn subject_set(key: &WindowKey, tenant_form: bool) -> SetKey {
    let (tenant, subject) = key.shared_parts();
    SetKey::Subject {
        tenant: tenant.clone(),
        subject: subject.clone(),
        tenant_form,
    }
}

fn tenant_set(key: &WindowKey) -> SetKey {
    SetKey::Tenant(key.shared_parts().0.clone())
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

impl ConnLeases {
    pub(crate) fn len(&self) -> usize {
        lock(&self.sets).values().map(|set| set.leases.len()).sum()
    }

    fn grant(&self, request: &GrantRequest<'_>, now: u64) -> GrantReply {
        let lease = request.lease;
        let mut sets = lock(&self.sets);
        let grants = self
            .grants
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if grants.is_multiple_of(SWEEP_EVERY) {
            sets.retain(|_, set| set.key_expiry > now);
        }
        let until = now.saturating_add(micros(request.ttl));
        let key_expiry = until.saturating_add(KEY_TTL_MARGIN);
        let subject_key = subject_set(lease.key, lease.tenant_form);
        let subject = sets.entry(subject_key.clone()).or_default();
        subject.purge(now);
        let count = subject.count();
        if request.max_per_subject > 0 && count >= request.max_per_subject {
            let retry_after = subject.retry_after(now);
            return GrantReply::Denied {
                scope: CapScope::Subject,
                count,
                retry_after,
            };
        }
        if lease.tenant_form {
            let tenant = sets.entry(tenant_set(lease.key)).or_default();
            tenant.purge(now);
            let tenant_count = tenant.count();
            if request.max_per_tenant > 0 && tenant_count >= request.max_per_tenant {
                let retry_after = tenant.retry_after(now);
                if sets
                    .get(&subject_key)
                    .is_some_and(|set| set.leases.is_empty() && set.key_expiry <= now)
                {
                    sets.remove(&subject_key);
                }
                return GrantReply::Denied {
                    scope: CapScope::Tenant,
                    count: tenant_count,
                    retry_after,
                };
            }
            tenant.leases.insert(lease.id.to_vec(), until);
            tenant.extend(key_expiry);
        }
        let subject = sets.entry(subject_key).or_default();
        let fence = subject
            .fence
            .saturating_add(1)
            .max(now)
            .max(request.fence_floor.saturating_add(1));
        subject.fence = fence;
        subject.leases.insert(lease.id.to_vec(), until);
        subject.extend(key_expiry);
        GrantReply::Granted {
            fence,
            count: subject.count(),
        }
    }

    fn renew(&self, leases: &[LeaseRef<'_>], ttl: Duration, now: u64) -> Vec<bool> {
        let mut sets = lock(&self.sets);
        let until = now.saturating_add(micros(ttl));
        let mut renew_in = |set_key: SetKey, id: &[u8]| -> bool {
            let Some(set) = sets.get_mut(&set_key) else {
                return false;
            };
            let alive = match set.leases.get_mut(id) {
                Some(expiry) if *expiry > now => {
                    *expiry = until;
                    set.extend(until.saturating_add(KEY_TTL_MARGIN));
                    true
                }
                Some(_) => {
                    set.leases.remove(id);
                    false
                }
                None => false,
            };
            alive
        };
        leases
            .iter()
            .map(|lease| {
                let subject = renew_in(subject_set(lease.key, lease.tenant_form), lease.id);
                let tenant = !lease.tenant_form || renew_in(tenant_set(lease.key), lease.id);
                subject && tenant
            })
            .collect()
    }

    fn release(&self, lease: &LeaseRef<'_>) -> bool {
        let mut sets = lock(&self.sets);
        let mut remove_from = |set_key: SetKey| -> bool {
            let Some(set) = sets.get_mut(&set_key) else {
                return false;
            };
            set.leases.remove(lease.id).is_some()
        };
        let removed = remove_from(subject_set(lease.key, lease.tenant_form));
        if lease.tenant_form {
            remove_from(tenant_set(lease.key));
        }
        removed
    }

    fn presence(&self, key: &WindowKey, tenant_form: bool, now: u64) -> u32 {
        let sets = lock(&self.sets);
        sets.get(&subject_set(key, tenant_form)).map_or(0, |set| {
            let live = set.leases.values().filter(|expiry| **expiry > now).count();
            u32::try_from(live).unwrap_or(u32::MAX)
        })
    }
}

impl MemoryStore {
    /// The number of connection lease entries held (subject and tenant
    /// sets), expired ones not yet purged included.
    pub fn connection_lease_entries(&self) -> usize {
        self.conns.len()
    }
}

impl ConnectionStore for MemoryStore {
    fn grant<'a>(
        &'a self,
        request: GrantRequest<'a>,
    ) -> BoxFuture<'a, Result<GrantReply, StoreError>> {
        Box::pin(async move { Ok(self.conns.grant(&request, self.clock.now_micros())) })
    }

    fn renew<'a>(
        &'a self,
        leases: &'a [LeaseRef<'a>],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Vec<bool>, StoreError>> {
        Box::pin(async move { Ok(self.conns.renew(leases, ttl, self.clock.now_micros())) })
    }

    fn release<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move { Ok(self.conns.release(&lease)) })
    }

    fn presence<'a>(
        &'a self,
        key: &'a WindowKey,
        tenant_form: bool,
    ) -> BoxFuture<'a, Result<u32, StoreError>> {
        Box::pin(async move {
            Ok(self
                .conns
                .presence(key, tenant_form, self.clock.now_micros()))
        })
    }

    fn grant_sync(&self, request: GrantRequest<'_>) -> Option<Result<GrantReply, StoreError>> {
        Some(Ok(self.conns.grant(&request, self.clock.now_micros())))
    }

    fn renew_sync(
        &self,
        leases: &[LeaseRef<'_>],
        ttl: Duration,
    ) -> Option<Result<Vec<bool>, StoreError>> {
        Some(Ok(self.conns.renew(leases, ttl, self.clock.now_micros())))
    }

    fn release_sync(&self, lease: LeaseRef<'_>) -> Option<Result<bool, StoreError>> {
        Some(Ok(self.conns.release(&lease)))
    }

    fn presence_sync(&self, key: &WindowKey, tenant_form: bool) -> Option<Result<u32, StoreError>> {
        Some(Ok(self.conns.presence(
            key,
            tenant_form,
            self.clock.now_micros(),
        )))
    }

    fn max_renew_batch(&self) -> usize {
        usize::MAX
    }
}
