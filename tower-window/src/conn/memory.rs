//! The connection-cap [`Backend`](conn::Backend) of [`MemoryStore`]: seat sets in one map.
//!
//! The same semantics as the Redis scripts (`store/redis/conn.rs`), on the
//! store's clock: per subject (and, in the tenant form, per tenant) a map
//! of seat id to expiry; a grant purges expired seats and admits below
//! the caps; the fencing token is `max(previous + 1, now, floor + 1)`. Like a Redis
//! key, a set lives until a second past the latest expiry any grant or
//! renewal gave a seat in it (so its token survives releases, and a node
//! with a shorter TTL never shortens it); a sweep every 64 grants drops sets past that
//! (a token then restarts from the clock, which has moved past every
//! earlier token), so memory follows the number of live seats.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;

use crate::clock::duration_micros;
use crate::conn::{self, CapScope, GrantReply, GrantRequest, SeatRef};
use crate::store::MemoryStore;
use crate::store::{Guard, Op};
use crate::sync::lock;
use crate::WindowKey;

/// Which set: a subject's (in one form) or a tenant's.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum SetKey {
    Subject {
        tenant: Bytes,
        subject: Bytes,
        tenant_capped: bool,
    },
    Tenant(Bytes),
}

#[derive(Debug, Default)]
struct SeatSet {
    seats: HashMap<Vec<u8>, u64>,
    fence: u64,
    /// When the set (and its token) is forgotten, like a Redis key's TTL.
    key_expiry: u64,
}

/// How long a set outlives its newest seat (µs), as the Redis keys do.
const KEY_TTL_MARGIN: u64 = 1_000_000;

/// Grants between two sweeps of forgotten sets.
const SWEEP_EVERY: u64 = 64;

impl SeatSet {
    fn purge(&mut self, now: u64) {
        self.seats.retain(|_, expiry| *expiry > now);
    }

    fn count(&self) -> u32 {
        u32::try_from(self.seats.len()).unwrap_or(u32::MAX)
    }

    /// Keeps the set until at least `key_expiry`, never shorter than it
    /// was: nodes with different seat TTLs (a rolling change) write one
    /// set, which must outlive its longest seat, not the last writer's.
    fn extend(&mut self, key_expiry: u64) {
        self.key_expiry = self.key_expiry.max(key_expiry);
    }

    /// The wait until the oldest seat expires.
    fn retry_after(&self, now: u64) -> Duration {
        let oldest = self.seats.values().min().copied().unwrap_or(now);
        Duration::from_micros(oldest.saturating_sub(now))
    }
}

/// The seats a memory store keeps.
impl MemoryStore {
    fn conn_seats(&self) -> Arc<ConnSeats> {
        self.part(|_| Arc::default())
    }
}

#[derive(Debug, Default)]
pub(crate) struct ConnSeats {
    sets: Mutex<HashMap<SetKey, SeatSet>>,
    grants: std::sync::atomic::AtomicU64,
}

fn subject_set(key: &WindowKey, tenant_capped: bool) -> SetKey {
    let (tenant, subject) = key.shared_parts();
    SetKey::Subject {
        tenant,
        subject,
        tenant_capped,
    }
}

fn tenant_set(key: &WindowKey) -> SetKey {
    SetKey::Tenant(key.shared_parts().0)
}

impl ConnSeats {
    pub(crate) fn len(&self) -> usize {
        lock(&self.sets).values().map(|set| set.seats.len()).sum()
    }

    fn grant(&self, request: &GrantRequest<'_>, now: u64) -> GrantReply {
        let seat = request.seat;
        let mut sets = lock(&self.sets);
        let grants = self
            .grants
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if grants.is_multiple_of(SWEEP_EVERY) {
            sets.retain(|_, set| set.key_expiry > now);
        }
        let until = now.saturating_add(duration_micros(request.ttl));
        let key_expiry = until.saturating_add(KEY_TTL_MARGIN);
        let subject_key = subject_set(seat.key, seat.tenant_capped);
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
        if seat.tenant_capped {
            let tenant = sets.entry(tenant_set(seat.key)).or_default();
            tenant.purge(now);
            let tenant_count = tenant.count();
            if request.max_per_tenant > 0 && tenant_count >= request.max_per_tenant {
                let retry_after = tenant.retry_after(now);
                if sets
                    .get(&subject_key)
                    .is_some_and(|set| set.seats.is_empty() && set.key_expiry <= now)
                {
                    sets.remove(&subject_key);
                }
                return GrantReply::Denied {
                    scope: CapScope::Tenant,
                    count: tenant_count,
                    retry_after,
                };
            }
            tenant.seats.insert(seat.id.to_vec(), until);
            tenant.extend(key_expiry);
        }
        let subject = sets.entry(subject_key).or_default();
        let fence = subject
            .fence
            .saturating_add(1)
            .max(now)
            .max(request.fence_floor.saturating_add(1));
        subject.fence = fence;
        subject.seats.insert(seat.id.to_vec(), until);
        subject.extend(key_expiry);
        GrantReply::Granted {
            fence,
            count: subject.count(),
        }
    }

    fn renew(&self, seats: &[SeatRef<'_>], ttl: Duration, now: u64) -> Vec<bool> {
        let mut sets = lock(&self.sets);
        let until = now.saturating_add(duration_micros(ttl));
        let mut renew_in = |set_key: SetKey, id: &[u8]| -> bool {
            let Some(set) = sets.get_mut(&set_key) else {
                return false;
            };
            let alive = match set.seats.get_mut(id) {
                Some(expiry) if *expiry > now => {
                    *expiry = until;
                    set.extend(until.saturating_add(KEY_TTL_MARGIN));
                    true
                }
                Some(_) => {
                    set.seats.remove(id);
                    false
                }
                None => false,
            };
            alive
        };
        seats
            .iter()
            .map(|seat| {
                let subject = renew_in(subject_set(seat.key, seat.tenant_capped), seat.id);
                let tenant = !seat.tenant_capped || renew_in(tenant_set(seat.key), seat.id);
                subject && tenant
            })
            .collect()
    }

    fn release(&self, seat: &SeatRef<'_>) -> bool {
        let mut sets = lock(&self.sets);
        let mut remove_from = |set_key: SetKey| -> bool {
            let Some(set) = sets.get_mut(&set_key) else {
                return false;
            };
            set.seats.remove(seat.id).is_some()
        };
        let removed = remove_from(subject_set(seat.key, seat.tenant_capped));
        if seat.tenant_capped {
            remove_from(tenant_set(seat.key));
        }
        removed
    }

    fn presence(&self, key: &WindowKey, tenant_capped: bool, now: u64) -> u32 {
        let sets = lock(&self.sets);
        sets.get(&subject_set(key, tenant_capped)).map_or(0, |set| {
            let live = set.seats.values().filter(|expiry| **expiry > now).count();
            u32::try_from(live).unwrap_or(u32::MAX)
        })
    }
}

impl MemoryStore {
    /// The number of connection seat entries held (subject and tenant
    /// sets), expired ones not yet purged included.
    pub fn connection_seat_entries(&self) -> usize {
        self.conn_seats().len()
    }
}

impl conn::Backend for MemoryStore {
    fn grant<'a>(&'a self, _: &mut Guard<'a>, request: GrantRequest<'a>) -> Op<'a, GrantReply> {
        Op::ready(Ok(self
            .conn_seats()
            .grant(&request, self.clock.now_micros())))
    }

    fn renew<'a>(
        &'a self,
        _: &mut Guard<'a>,
        seats: &'a [SeatRef<'a>],
        ttl: Duration,
    ) -> Op<'a, Vec<bool>> {
        Op::ready(Ok(self.conn_seats().renew(
            seats,
            ttl,
            self.clock.now_micros(),
        )))
    }

    fn release<'a>(&'a self, _: &mut Guard<'a>, seat: SeatRef<'a>) -> Op<'a, bool> {
        Op::ready(Ok(self.conn_seats().release(&seat)))
    }

    fn presence<'a>(
        &'a self,
        _: &mut Guard<'a>,
        key: &'a WindowKey,
        tenant_capped: bool,
    ) -> Op<'a, u32> {
        Op::ready(Ok(self.conn_seats().presence(
            key,
            tenant_capped,
            self.clock.now_micros(),
        )))
    }

    fn max_renew_batch(&self) -> usize {
        usize::MAX
    }
}
