//! Quota leases on the embedded store: [`Store::reserve`](crate::Store::reserve)
//! and [`Store::refund`](crate::Store::refund) for [`MemoryStore`].
//!
//! A reservation locks every quota's slot of the policy (in the same global
//! order as a check), takes the same number of units from all of them or
//! none, and keeps a record of the lease in each slot until its units stop
//! counting; a refund applies to those records once. See
//! [`crate::store::lease`] for why the bound stays exact.

use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};
use std::time::Duration;

use smallvec::SmallVec;

use super::{lock, MemoryStore, Slot, SlotInner, MAX_EVICTED_RETRIES};
use crate::algorithm::lease as algo;
use crate::store::{Lease, RefundRequest, Reservation, ReserveRequest, StoreError, StoreErrorKind};
use crate::{Decision, Policy, QuotaDecision, WindowKey};

/// One lease as one slot knows it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Record {
    id: u64,
    /// Where the units count (window index, bucket, log timestamp, or the
    /// arrival time the grant left).
    anchor: u64,
    /// GCRA: the arrival time before the grant.
    prior: u64,
    /// Units that a refund may still return.
    units: u32,
    /// The lease's deadline (store clock, µs).
    deadline: u64,
    /// When the units stop counting anyway: the record is dropped then.
    expires: u64,
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

    pub(super) fn reserve_now(
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
            let mut rooms: SmallVec<[u64; 4]> = SmallVec::new();
            for (quota, inner) in policy.quotas().iter().zip(locked.guards.iter_mut()) {
                inner.last_check = inner.last_check.max(now);
                inner.leases.retain(|record| record.expires > now);
                rooms.push(algo::room(&mut inner.state, quota, now, deadline));
            }
            let room = rooms.iter().copied().min().unwrap_or(0);
            let granted = grant(room, request.want, request.at_least);
            let held = |locked: &Locked<'_>| {
                locked
                    .guards
                    .iter()
                    .flat_map(|inner| inner.leases.iter())
                    .map(|record| record.deadline)
                    .filter(|deadline| *deadline > now)
                    .max()
            };
            if granted == 0 {
                return Ok(Reservation {
                    lease: None,
                    now_micros: now,
                    held_until_micros: held(locked),
                    decision: None,
                });
            }
            let id = self.next_lease.fetch_add(1, Ordering::Relaxed);
            let mut states: SmallVec<[QuotaDecision; 4]> = SmallVec::new();
            for ((quota, inner), room) in policy
                .quotas()
                .iter()
                .zip(locked.guards.iter_mut())
                .zip(rooms.iter())
            {
                let (anchor, expires, prior) =
                    algo::commit(&mut inner.state, quota, now, deadline, granted);
                // Idle expiry counts from here: a sliding log's leased units
                // are dated at the deadline and count W after it.
                inner.last_check = inner.last_check.max(deadline);
                inner.leases.push(Record {
                    id,
                    anchor,
                    prior,
                    units: granted,
                    deadline,
                    expires,
                });
                let remaining = u32::try_from(room - u64::from(granted)).unwrap_or(u32::MAX);
                states.push(QuotaDecision::allow(
                    quota.clone(),
                    remaining,
                    Duration::from_micros(expires.saturating_sub(now)),
                ));
            }
            let decision = Decision::from_quotas(states).map(|d| d.with_timestamp_micros(now));
            Ok(Reservation {
                lease: Some(Lease {
                    id,
                    granted,
                    reserved_at_micros: now,
                    deadline_micros: deadline,
                }),
                now_micros: now,
                held_until_micros: held(locked),
                decision,
            })
        })
    }

    pub(super) fn refund_now(&self, request: RefundRequest<'_>) -> Result<u32, StoreError> {
        let lease = request.lease;
        let unused = request.unused.min(lease.granted);
        if unused == 0 {
            return Ok(0);
        }
        Ok(self.with_locked(request.key, request.policy, |locked| {
            let mut returned: Option<u32> = None;
            for (quota, inner) in request.policy.quotas().iter().zip(locked.guards.iter_mut()) {
                let Some(i) = inner.leases.iter().position(|r| r.id == lease.id) else {
                    returned = Some(0);
                    continue;
                };
                let record = inner.leases.swap_remove(i);
                let taken = algo::refund(
                    &mut inner.state,
                    quota,
                    record.anchor,
                    record.prior,
                    record.units,
                    unused.min(record.units),
                );
                returned = Some(returned.map_or(taken, |r| r.min(taken)));
            }
            returned.unwrap_or(0)
        }))
    }
}

/// Units to grant: up to `want`, at most half the room (rounded up) unless
/// that is below `at_least`, and none if `at_least` does not fit. The half
/// is the share of the remaining budget one lease may take, so one node
/// cannot take a whole window while others wait.
pub(crate) fn grant(room: u64, want: u32, at_least: u32) -> u32 {
    let share = room.div_ceil(2).max(u64::from(at_least));
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
