//! The connection-cap [`Backend`](conn::Backend) of [`MemoryStore`], with
//! the semantics of the Redis scripts (`conn/redis.rs`) on the store's
//! clock. Like a Redis key, a set lives until a second past its latest
//! seat expiry; a sweep every 64 grants drops older sets, so memory follows
//! the number of live seats.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;

use crate::clock::duration_micros;
use crate::conn::{self, CapScope, GrantReply, GrantRequest, SeatRef};
use crate::store::MemoryStore;
use crate::store::{Guard, Op};
use crate::sync::lock;
use crate::WindowKey;

/// A subject's seat set, `(tenant, Some(subject), tenant_capped)`, or a
/// tenant's, `(tenant, None, true)`.
type SetKey = (Bytes, Option<Bytes>, bool);

/// The sets a seat of `key` is in.
fn set_keys(key: &WindowKey, tenant_capped: bool) -> (SetKey, Option<SetKey>) {
    let (tenant, subject) = key.shared_parts();
    let tenant_set = tenant_capped.then(|| (tenant.clone(), None, true));
    ((tenant, Some(subject), tenant_capped), tenant_set)
}

#[derive(Debug, Default)]
struct SeatSet {
    seats: HashMap<Vec<u8>, u64>,
    fence: u64,
    /// When the set (and its token) is forgotten.
    key_expiry: u64,
}

/// How long a set outlives its latest seat (µs).
const KEY_TTL_MARGIN: u64 = 1_000_000;

const SWEEP_EVERY: u64 = 64;

impl SeatSet {
    fn count(&self) -> u32 {
        u32::try_from(self.seats.len()).unwrap_or(u32::MAX)
    }

    /// Purges expired seats; the refusal if `cap` (0: none) is reached.
    fn refuse(&mut self, now: u64, cap: u32, scope: CapScope) -> Option<GrantReply> {
        self.seats.retain(|_, expiry| *expiry > now);
        let count = self.count();
        (cap > 0 && count >= cap).then(|| {
            let oldest = self.seats.values().min().copied().unwrap_or(now);
            GrantReply::Denied {
                scope,
                count,
                retry_after: Duration::from_micros(oldest.saturating_sub(now)),
            }
        })
    }

    /// Keeps the set until at least a second past `until`, never shorter:
    /// it must outlive its longest seat, whichever node's TTL that was.
    fn extend(&mut self, until: u64) {
        let key_expiry = until.saturating_add(KEY_TTL_MARGIN);
        self.key_expiry = self.key_expiry.max(key_expiry);
    }

    fn add(&mut self, id: &[u8], until: u64) {
        self.seats.insert(id.to_vec(), until);
        self.extend(until);
    }
}

impl MemoryStore {
    fn conn_seats(&self) -> Arc<ConnSeats> {
        self.part(|_| Arc::default())
    }

    /// The number of connection seat entries held (subject and tenant
    /// sets), expired ones not yet purged included.
    pub fn connection_seat_entries(&self) -> usize {
        let seats = self.conn_seats();
        let sets = lock(&seats.sets);
        sets.values().map(|set| set.seats.len()).sum()
    }
}

#[derive(Debug, Default)]
struct ConnSeats {
    sets: Mutex<HashMap<SetKey, SeatSet>>,
    grants: AtomicU64,
}

impl conn::Backend for MemoryStore {
    fn grant<'a>(&'a self, _: &mut Guard<'a>, request: GrantRequest<'a>) -> Op<'a, GrantReply> {
        let now = self.clock.now_micros();
        let seats = self.conn_seats();
        let mut sets = lock(&seats.sets);
        let grants = seats.grants.fetch_add(1, Ordering::Relaxed);
        if grants.is_multiple_of(SWEEP_EVERY) {
            sets.retain(|_, set| set.key_expiry > now);
        }
        let seat = request.seat;
        let until = now.saturating_add(duration_micros(request.ttl));
        let (subject_key, tenant_key) = set_keys(seat.key, seat.tenant_capped);
        let subject = sets.entry(subject_key.clone()).or_default();
        if let Some(denied) = subject.refuse(now, request.max_per_subject, CapScope::Subject) {
            return Op::ready(Ok(denied));
        }
        if let Some(tenant_key) = tenant_key {
            let tenant = sets.entry(tenant_key).or_default();
            if let Some(denied) = tenant.refuse(now, request.max_per_tenant, CapScope::Tenant) {
                return Op::ready(Ok(denied));
            }
            tenant.add(seat.id, until);
        }
        let subject = sets.entry(subject_key).or_default();
        let floor = request.fence_floor.saturating_add(1);
        subject.fence = subject.fence.saturating_add(1).max(now).max(floor);
        subject.add(seat.id, until);
        Op::ready(Ok(GrantReply::Granted {
            fence: subject.fence,
            count: subject.count(),
        }))
    }

    fn renew<'a>(
        &'a self,
        _: &mut Guard<'a>,
        seats: &'a [SeatRef<'a>],
        ttl: Duration,
    ) -> Op<'a, Vec<bool>> {
        let now = self.clock.now_micros();
        let until = now.saturating_add(duration_micros(ttl));
        let conn_seats = self.conn_seats();
        let mut sets = lock(&conn_seats.sets);
        let mut renew_in = |set_key: SetKey, id: &[u8]| {
            let Some(set) = sets.get_mut(&set_key) else {
                return false;
            };
            match set.seats.get_mut(id) {
                Some(expiry) if *expiry > now => {
                    *expiry = until;
                    set.extend(until);
                    true
                }
                Some(_) => {
                    set.seats.remove(id);
                    false
                }
                None => false,
            }
        };
        let renew = |seat: &SeatRef<'_>| {
            let (subject, tenant) = set_keys(seat.key, seat.tenant_capped);
            let alive = renew_in(subject, seat.id);
            tenant.is_none_or(|tenant| renew_in(tenant, seat.id)) && alive
        };
        Op::ready(Ok(seats.iter().map(renew).collect()))
    }

    fn release<'a>(&'a self, _: &mut Guard<'a>, seat: SeatRef<'a>) -> Op<'a, bool> {
        let seats = self.conn_seats();
        let mut sets = lock(&seats.sets);
        let (subject, tenant) = set_keys(seat.key, seat.tenant_capped);
        let mut remove_from = |set_key: SetKey| {
            let set = sets.get_mut(&set_key);
            set.is_some_and(|set| set.seats.remove(seat.id).is_some())
        };
        let removed = remove_from(subject);
        if let Some(tenant) = tenant {
            remove_from(tenant);
        }
        Op::ready(Ok(removed))
    }

    fn presence<'a>(
        &'a self,
        _: &mut Guard<'a>,
        key: &'a WindowKey,
        tenant_capped: bool,
    ) -> Op<'a, u32> {
        let now = self.clock.now_micros();
        let seats = self.conn_seats();
        let sets = lock(&seats.sets);
        let live = sets.get(&set_keys(key, tenant_capped).0).map_or(0, |set| {
            let live = set.seats.values().filter(|expiry| **expiry > now).count();
            u32::try_from(live).unwrap_or(u32::MAX)
        });
        Op::ready(Ok(live))
    }

    fn max_renew_batch(&self) -> usize {
        usize::MAX
    }
}
