//! Quota leases on the embedded store: [`lease::Backend`](crate::lease::Backend)
//! (reserve and refund) for [`MemoryStore`].
//!
//! A reservation locks every quota's slot of the policy (in the same global
//! order as a check), takes units from all of them or none (a shadow quota
//! what it has room for), and keeps a record of the lease in each slot
//! until its units stop counting; a refund applies to those records once.
//! Every call drops a bounded batch of dead records, as the Redis script
//! does. See [`crate::lease`] for why the bound stays exact and
//! what a lease means for a shadow quota.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};
use std::time::Duration;

use smallvec::SmallVec;

use crate::algorithm::lease as algo;
use crate::lease::{Lease, RefundRequest, Reservation, ReserveRequest};
use crate::store::memory::{lock, Slot, SlotInner, MAX_EVICTED_RETRIES};
use crate::store::MemoryStore;
use crate::store::{Guard, Op, StoreError, StoreErrorKind};
use crate::{Decision, Policy, QuotaDecision, WindowKey};

/// The most records of leases whose units stopped counting that one call
/// drops (as `MAX_DEAD` in `lease.lua`): the work of a call stays bounded
/// whatever the history; the rest go with later calls (a dead record is
/// never used: a refund of it finds its units stopped counting).
const MAX_DEAD: usize = 128;

/// One lease as one slot knows it.
#[derive(Debug, Clone, Copy)]
struct Record {
    /// Where the units count (window index, bucket, log timestamp, or the
    /// arrival time the grant left).
    anchor: u64,
    /// GCRA: the arrival time before the grant.
    prior: u64,
    /// Units the lease granted.
    granted: u32,
    /// Units of it this slot's quota holds (fewer than `granted` for a
    /// shadow quota).
    units: u32,
    /// When the last of the lease's units (in any quota of its policy)
    /// stops counting: the record is dropped then.
    expires: u64,
}

/// The quota leases one slot keeps records of: by id, and by when they
/// stop counting, so that dropping dead ones is cheap and bounded. Empty,
/// and never allocated, unless leases are used.
#[derive(Debug, Default)]
pub(crate) struct Records {
    by_id: BTreeMap<u64, Record>,
    by_expiry: BTreeSet<(u64, u64)>,
    /// The latest deadline of a lease recorded here (as the Redis store's
    /// `ld`: refunds do not lower it).
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

    /// The latest deadline of the leases recorded here, if later than now.
    fn held_until(&self, now: u64) -> Option<u64> {
        (self.latest_deadline > now).then_some(self.latest_deadline)
    }
}

/// The policy's slots, locked in one global order.
struct Locked<'a> {
    guards: SmallVec<[MutexGuard<'a, SlotInner>; 4]>,
}

impl MemoryStore {
    /// Locks every slot of `policy` for `key`, in address order (as checks
    /// do), looking them up again if one was evicted meanwhile.
    fn with_locked<T>(
        &self,
        key: &WindowKey,
        policy: &Policy,
        f: impl FnOnce(&mut Locked<'_>) -> T,
    ) -> T {
        let mut attempt = 0;
        loop {
            let slots: SmallVec<[Arc<Slot>; 4]> = policy
                .quotas()
                .iter()
                .map(|quota| self.slot(key, quota))
                .collect();
            let mut order: SmallVec<[usize; 4]> = (0..slots.len()).collect();
            order.sort_unstable_by_key(|&i| Arc::as_ptr(&slots[i]) as usize);
            let mut guards: SmallVec<[Option<MutexGuard<'_, SlotInner>>; 4]> =
                slots.iter().map(|_| None).collect();
            for &i in &order {
                guards[i] = Some(lock(&slots[i].inner));
            }
            let evicted = guards.iter().flatten().any(|inner| inner.evicted);
            if evicted && attempt < MAX_EVICTED_RETRIES {
                drop(guards);
                attempt += 1;
                continue;
            }
            let mut locked = Locked {
                guards: guards.into_iter().flatten().collect(),
            };
            return f(&mut locked);
        }
    }

    pub(crate) fn reserve_now(
        &self,
        request: ReserveRequest<'_>,
    ) -> Result<Reservation, StoreError> {
        let policy = request.policy;
        if request.at_least == 0 || request.want < request.at_least {
            return Err(StoreError::new(
                StoreErrorKind::InvalidRequest,
                "a lease must want at least 1 unit, and at least what it needs",
            ));
        }
        let ttl = duration_micros(request.ttl);
        if ttl == 0 {
            return Err(StoreError::new(
                StoreErrorKind::InvalidRequest,
                "a lease needs a TTL of at least 1 microsecond",
            ));
        }
        algo::check_ttl(policy, ttl)?;
        if policy.len() == 0 {
            return Err(StoreError::new(
                StoreErrorKind::InvalidRequest,
                "a policy without quotas",
            ));
        }
        self.with_locked(request.key, policy, |locked| {
            let now = self.clock.now_micros();
            let deadline = policy
                .quotas()
                .iter()
                .filter_map(|quota| algo::deadline_cap(quota, now))
                .fold(now.saturating_add(ttl), u64::min);
            let mut rooms: SmallVec<[(u64, u64); 4]> = SmallVec::new();
            for (quota, inner) in policy.quotas().iter().zip(locked.guards.iter_mut()) {
                inner.last_check = inner.last_check.max(now);
                inner.leases.drop_dead(now);
                rooms.push(algo::room(&mut inner.state, quota, now, deadline));
            }
            // Only the enforced quotas size the grant; with none, nothing
            // bounds it.
            let room = policy
                .quotas()
                .iter()
                .zip(&rooms)
                .filter(|(quota, _)| !quota.is_shadow())
                .map(|(_, (room, _))| *room)
                .min();
            let mut granted = match room {
                Some(room) => grant(room, request.want, request.at_least, share_of(policy)),
                None => request.want,
            };
            // A GCRA policy's lease that may start later (see the module
            // docs of `crate::lease`): the tokens the buckets free until
            // then, when that is more than the room now grants.
            let mut deadline = deadline;
            let mut not_before = now;
            let max_wait = duration_micros(request.max_wait);
            if granted < request.want && max_wait > 0 {
                let tats: SmallVec<[u64; 4]> = locked
                    .guards
                    .iter()
                    .filter_map(|inner| algo::gcra_tat(&inner.state))
                    .collect();
                if let Some((units, start)) =
                    algo::later_grant(policy, &tats, now, ttl, max_wait, request.want)
                {
                    if units > granted && units >= request.at_least {
                        granted = units;
                        not_before = start;
                        deadline = start.saturating_add(ttl);
                    }
                }
            }
            // The latest deadline of the leases recorded beside the
            // policy's first quota (where the Redis store keeps them).
            let held_until = |locked: &Locked<'_>| {
                locked
                    .guards
                    .first()
                    .and_then(|inner| inner.leases.held_until(now))
            };
            if granted == 0 {
                return Ok(Reservation {
                    lease: None,
                    now_micros: now,
                    held_until_micros: held_until(locked),
                    decision: None,
                });
            }
            let id = self.next_lease.fetch_add(1, Ordering::Relaxed);
            let shadows = policy.quotas().iter().any(crate::Quota::is_shadow);
            let mut holds = Vec::with_capacity(if shadows { policy.len() } else { 0 });
            let mut states: SmallVec<[QuotaDecision; 4]> = SmallVec::new();
            let mut records: SmallVec<[Record; 4]> = SmallVec::new();
            for ((quota, inner), (room, reset)) in policy
                .quotas()
                .iter()
                .zip(locked.guards.iter_mut())
                .zip(rooms.iter())
            {
                let units = algo::held(quota, *room, granted);
                let (anchor, expires, prior, reset_after) = if units == 0 {
                    // A full shadow quota holds nothing: as it stands.
                    (0, deadline, 0, *reset)
                } else {
                    let (anchor, expires, prior) =
                        algo::commit(&mut inner.state, quota, now, deadline, units);
                    (anchor, expires, prior, expires.saturating_sub(now))
                };
                // Idle expiry counts from here: a sliding log's leased units
                // are dated at the deadline and count W after it.
                inner.last_check = inner.last_check.max(deadline);
                records.push(Record {
                    anchor,
                    prior,
                    granted,
                    units,
                    expires,
                });
                states.push(if not_before > now {
                    algo::later_decision(quota, reset_after, not_before - now)
                } else {
                    algo::quota_decision(
                        quota,
                        room.saturating_sub(u64::from(units)),
                        reset_after,
                        units,
                        request.at_least,
                    )
                });
                if shadows {
                    holds.push(units);
                }
            }
            // The lease matters until the last of its units stops counting,
            // in every slot alike (as the Redis store's one record).
            let last = records.iter().map(|r| r.expires).fold(deadline, u64::max);
            for (inner, mut record) in locked.guards.iter_mut().zip(records) {
                record.expires = last;
                inner.leases.insert(id, record, deadline);
            }
            let decision = Decision::from_quotas(states).map(|d| d.with_timestamp_micros(now));
            Ok(Reservation {
                lease: Some(
                    Lease::new(id, granted, now, deadline)
                        .with_held(holds)
                        .starting_at(not_before),
                ),
                now_micros: now,
                held_until_micros: held_until(locked),
                decision,
            })
        })
    }

    pub(crate) fn refund_now(&self, request: RefundRequest<'_>) -> Result<u32, StoreError> {
        let lease = request.lease;
        if !request.returns_anything() {
            return Ok(0);
        }
        Ok(self.with_locked(request.key, request.policy, |locked| {
            let now = self.clock.now_micros();
            for inner in locked.guards.iter_mut() {
                inner.leases.drop_dead(now);
            }
            // A refund applies once: the records go whatever it returns.
            let found: SmallVec<[Option<Record>; 4]> = locked
                .guards
                .iter_mut()
                .map(|inner| inner.leases.remove(lease.id))
                .collect();
            // Nothing to give back once every unit of the lease stopped
            // counting (every record of it says when).
            let alive = found.iter().flatten().any(|record| record.expires > now);
            if !alive {
                return 0;
            }
            let mut returned: Option<u32> = None;
            let mut granted = 0;
            for (index, ((quota, inner), record)) in request
                .policy
                .quotas()
                .iter()
                .zip(locked.guards.iter_mut())
                .zip(&found)
                .enumerate()
            {
                let taken = match record {
                    Some(record) => {
                        granted = record.granted;
                        let units = request.unused_of(
                            index,
                            quota.is_shadow(),
                            record.granted,
                            record.units,
                        );
                        if units == 0 {
                            0
                        } else {
                            algo::refund(
                                &mut inner.state,
                                quota,
                                record.anchor,
                                record.prior,
                                record.units,
                                units,
                            )
                        }
                    }
                    None => 0,
                };
                if !quota.is_shadow() {
                    returned = Some(returned.map_or(taken, |r| r.min(taken)));
                }
            }
            // With shadow quotas only, nothing enforced held the units: all
            // of those named come back.
            returned.unwrap_or(request.unused.min(granted))
        }))
    }
}

/// How much of the room one lease may take (see `crate::lease`, "How much
/// one lease takes").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Share {
    /// Half of it, rounded up.
    Half,
    /// All of it: the enforced quotas are all sliding logs.
    Whole,
}

/// The share of the room a lease of `policy` may take.
pub(crate) fn share_of(policy: &Policy) -> Share {
    let all_logs = policy
        .quotas()
        .iter()
        .filter(|quota| !quota.is_shadow())
        .all(|quota| quota.algorithm() == crate::Algorithm::SlidingLog);
    if all_logs {
        Share::Whole
    } else {
        Share::Half
    }
}

/// Units to grant: up to `want`, at most the `share` of the room (half,
/// rounded up, or all of it) unless that is below `at_least`, and none if
/// `at_least` does not fit. The half is the share of the remaining budget
/// one lease may take, so one node cannot take a whole window while others
/// wait.
pub(crate) fn grant(room: u64, want: u32, at_least: u32, share: Share) -> u32 {
    let share = match share {
        Share::Half => room.div_ceil(2),
        Share::Whole => room,
    }
    .max(u64::from(at_least));
    let granted = room.min(share).min(u64::from(want));
    if granted < u64::from(at_least) {
        0
    } else {
        u32::try_from(granted).unwrap_or(u32::MAX)
    }
}

fn duration_micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
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
        Op::ready(self.refund_now(request))
    }
}
