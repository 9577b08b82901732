//! Quota leases on the embedded store: [`Backend`](super::Backend) for
//! [`MemoryStore`], locking the policy's slots as a check does and keeping a
//! record of each lease in each slot, as `lease.lua` does.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use smallvec::SmallVec;

use crate::algorithm::lease as algo;
use crate::algorithm::outcome::saturate_u32;
use crate::clock::duration_micros;
use crate::lease::{Lease, RefundRequest, Reservation, ReserveRequest};
use crate::store::memory::{Locked, SlotInner};
use crate::store::MemoryStore;
use crate::store::{Guard, Op, StoreError};
use crate::QuotaDecision;

/// The most dead records one call drops (`MAX_DEAD` in `lease.lua`), so
/// that its work stays bounded whatever the history.
const MAX_DEAD: usize = 128;

/// One lease as one slot knows it.
#[derive(Debug, Clone, Copy)]
struct Record {
    /// Where the units count (window index, bucket, log timestamp, or the
    /// arrival time the grant left).
    anchor: u64,
    /// GCRA: the arrival time before the grant.
    prior: u64,
    granted: u32,
    /// Units of it this slot's (maybe shadow) quota holds.
    units: u32,
    /// When the last of the lease's units, in any quota, stops counting.
    expires: u64,
}

/// A slot's lease records, kept beside its state and allocated on first
/// use: a slot of a store without leases keeps only a null pointer.
fn lease_records(inner: &mut SlotInner) -> &mut Records {
    let extra = inner.extra.get_or_insert_with(|| Box::<Records>::default());
    if !extra.is::<Records>() {
        *extra = Box::<Records>::default();
    }
    extra
        .downcast_mut()
        .expect("a slot's extra state is its lease records")
}

/// The leases one slot keeps records of: by id, and by when they stop
/// counting, so that dropping dead ones is cheap.
#[derive(Debug, Default)]
pub(crate) struct Records {
    by_id: BTreeMap<u64, Record>,
    by_expiry: BTreeSet<(u64, u64)>,
    /// The latest deadline of a lease recorded here (as `ld` in
    /// `lease.lua`: refunds do not lower it).
    latest_deadline: u64,
}

impl Records {
    /// Drops at most [`MAX_DEAD`] records whose units stopped counting.
    fn drop_dead(&mut self, now: u64) {
        for _ in 0..MAX_DEAD {
            match self.by_expiry.first() {
                Some(&(expires, id)) if expires <= now => {
                    self.by_expiry.pop_first();
                    self.by_id.remove(&id);
                }
                _ => break,
            }
        }
    }

    fn insert(&mut self, id: u64, record: Record, deadline: u64) {
        self.by_expiry.insert((record.expires, id));
        self.by_id.insert(id, record);
        self.latest_deadline = self.latest_deadline.max(deadline);
    }

    fn remove(&mut self, id: u64) -> Option<Record> {
        let record = self.by_id.remove(&id)?;
        self.by_expiry.remove(&(record.expires, id));
        Some(record)
    }
}

impl MemoryStore {
    /// A lease id no lease of this store had.
    fn next_lease_id(&self) -> u64 {
        let next = self.part(|_| Arc::new(AtomicU64::new(1)));
        next.fetch_add(1, Ordering::Relaxed)
    }

    fn reserve_now(&self, request: ReserveRequest<'_>) -> Result<Reservation, StoreError> {
        let ttl = request.validate()?;
        let (policy, at_least) = (request.policy, request.at_least);
        let quotas = policy.quotas();
        self.with_policy_locked(request.key, policy, |locked| {
            let now = self.clock.now_micros();
            let caps = quotas.iter().filter_map(|q| algo::deadline_cap(q, now));
            let mut deadline = caps.fold(now.saturating_add(ttl), u64::min);
            for inner in locked.guards.iter_mut() {
                inner.last_check = inner.last_check.max(now);
                lease_records(inner).drop_dead(now);
            }
            // The refunds first: the reservation sees the room they free.
            let refunded = request.refunds.iter().fold(0u32, |sum, refund| {
                sum.saturating_add(refund_locked(locked, refund, now))
            });
            let slots = quotas.iter().zip(locked.guards.iter_mut());
            let rooms: SmallVec<[(u64, u64); 4]> = slots
                .map(|(quota, inner)| algo::room(&mut inner.state, quota, now, deadline))
                .collect();
            // Only the enforced quotas size the grant; with none, nothing
            // bounds it.
            let enforced = quotas.iter().zip(&rooms).filter(|(q, _)| !q.is_shadow());
            let room = enforced.map(|(_, (room, _))| *room).min();
            let mut granted = room.map_or(request.want, |room| grant(room, &request));
            let mut not_before = now;
            let max_wait = duration_micros(request.max_wait);
            if granted < request.want && max_wait > 0 {
                let slot_states = locked.guards.iter().map(|inner| &inner.state);
                let tats: SmallVec<[u64; 4]> = slot_states.filter_map(algo::gcra_tat).collect();
                let later = algo::later_grant(policy, &tats, now, ttl, max_wait, request.want)
                    .filter(|&(units, _)| units > granted && units >= at_least);
                if let Some((units, start)) = later {
                    (granted, not_before, deadline) = (units, start, start.saturating_add(ttl));
                }
            }
            // Where the Redis store keeps the latest deadline: beside the
            // policy's first quota.
            let held_until = |locked: &mut Locked<'_>| {
                let latest = lease_records(locked.guards.first_mut()?).latest_deadline;
                (latest > now).then_some(latest)
            };
            if granted == 0 {
                let mut reservation =
                    Reservation::empty(now, held_until(locked)).with_refunded(refunded);
                if request.decides {
                    reservation.decision = Some(locked.decide(policy, now, |_| at_least)?);
                }
                return Ok(reservation);
            }
            let wait = not_before - now;
            let slots = quotas.iter().zip(locked.guards.iter_mut()).zip(rooms);
            let taken = slots.map(|((quota, inner), (room, reset))| {
                // A shadow quota holds what it has room for.
                let units = if quota.is_shadow() {
                    saturate_u32(room).min(granted)
                } else {
                    granted
                };
                let (anchor, expires, prior, reset_after) = if units == 0 {
                    // A full shadow quota holds nothing: as it stands.
                    (0, deadline, 0, reset)
                } else {
                    let (anchor, expires, prior) =
                        algo::commit(&mut inner.state, quota, now, deadline, units);
                    (anchor, expires, prior, expires.saturating_sub(now))
                };
                // Idle expiry counts from here: a sliding log's leased
                // units are dated at the deadline and count W after it.
                inner.last_check = inner.last_check.max(deadline);
                let record = Record {
                    anchor,
                    prior,
                    granted,
                    units,
                    expires,
                };
                let left = room.saturating_sub(u64::from(units));
                let state = algo::quota_decision(quota, left, reset_after, units, at_least, wait);
                (record, state)
            });
            let (mut records, states): (SmallVec<[Record; 4]>, SmallVec<[QuotaDecision; 4]>) =
                taken.unzip();
            // The lease matters until the last of its units stops counting,
            // in every slot alike (as the Redis store's one record).
            let id = self.next_lease_id();
            let last = records.iter().map(|r| r.expires).fold(deadline, u64::max);
            for (inner, record) in locked.guards.iter_mut().zip(&mut records) {
                record.expires = last;
                lease_records(inner).insert(id, *record, deadline);
            }
            let lease = Lease::new(id, granted, now, deadline).starting_at(not_before);
            let reservation = Reservation::empty(now, held_until(locked)).with_refunded(refunded);
            let held = records.iter().map(|record| record.units);
            Ok(reservation.granting(policy, lease, held, states))
        })
    }
}

/// Applies `request` to the policy's locked slots; answers the units
/// returned.
fn refund_locked(locked: &mut Locked<'_>, request: &RefundRequest<'_>, now: u64) -> u32 {
    if !request.returns_anything() {
        return 0;
    }
    // A refund applies once: the records go whatever it returns.
    let id = request.lease.id;
    let guards = locked.guards.iter_mut();
    let found: SmallVec<[Option<Record>; 4]> =
        guards.map(|g| lease_records(g).remove(id)).collect();
    if !found.iter().flatten().any(|record| record.expires > now) {
        return 0;
    }
    let mut returned: Option<u32> = None;
    let mut granted = 0;
    let slots = request.policy.quotas().iter().zip(locked.guards.iter_mut());
    for (index, ((quota, inner), record)) in slots.zip(&found).enumerate() {
        let taken = record.map_or(0, |record| {
            granted = record.granted;
            let units = request.unused_of(index, quota.is_shadow(), record.granted, record.units);
            let (anchor, prior, held) = (record.anchor, record.prior, record.units);
            algo::refund(&mut inner.state, quota, anchor, prior, held, units)
        });
        if !quota.is_shadow() {
            returned = Some(returned.map_or(taken, |r| r.min(taken)));
        }
    }
    // With shadow quotas only, nothing enforced held the units: all of
    // those named come back.
    returned.unwrap_or(request.unused.min(granted))
}

/// Units to grant from `room`: up to `want`, at most half the room (rounded
/// up), or all of it when every enforced quota is a sliding log (see
/// [`crate::lease`], "How much one lease takes"), unless that is below
/// `at_least`; none if `at_least` does not fit.
fn grant(room: u64, request: &ReserveRequest<'_>) -> u32 {
    let mut enforced = request.policy.quotas().iter().filter(|q| !q.is_shadow());
    let all_logs = enforced.all(|quota| quota.algorithm() == crate::Algorithm::SlidingLog);
    let share = if all_logs { room } else { room.div_ceil(2) };
    let at_least = u64::from(request.at_least);
    let granted = room.min(share.max(at_least)).min(u64::from(request.want));
    if granted < at_least {
        0
    } else {
        u32::try_from(granted).unwrap_or(u32::MAX)
    }
}

impl super::Backend for MemoryStore {
    fn reserve<'a>(
        &'a self,
        _: &mut Guard<'a>,
        request: ReserveRequest<'a>,
    ) -> Op<'a, Reservation> {
        Op::ready(self.reserve_now(request))
    }

    fn refund<'a>(&'a self, _: &mut Guard<'a>, request: RefundRequest<'a>) -> Op<'a, u32> {
        if !request.returns_anything() {
            return Op::ready(Ok(0));
        }
        let returned = self.with_policy_locked(request.key, request.policy, |locked| {
            let now = self.clock.now_micros();
            for inner in locked.guards.iter_mut() {
                lease_records(inner).drop_dead(now);
            }
            refund_locked(locked, &request, now)
        });
        Op::ready(Ok(returned))
    }
}
