//! The windows [`Backend`] of [`MemoryStore`].

use std::sync::Arc;

use smallvec::SmallVec;

use super::{Backend, SettleRequest};
use crate::algorithm::outcome::Evaluation;
use crate::algorithm::settle::{settle, standing};
use crate::algorithm::State;
use crate::key::state_key::StateKeyRef;
use crate::store::memory::{decided, Slot, MAX_EVICTED_RETRIES};
use crate::store::{CheckRequest, Guard, MemoryStore, Op, StoreError};
use crate::sync::lock;
use crate::{Decision, Quota};

impl MemoryStore {
    /// Checks and records one request.
    pub(crate) fn check_now(&self, request: CheckRequest<'_>) -> Result<Decision, StoreError> {
        let policy = request.policy;
        if let [quota] = policy.quotas() {
            // One quota: one slot, one lock.
            let slot = self.slot(request.key, quota);
            return self.check_one(request, quota, slot);
        }
        self.with_policy_locked(request.key, policy, |locked| {
            let now = self.clock.now_micros();
            locked.decide(policy, now, |i| request.cost_of(i).get())
        })
    }

    /// Decides a one-quota policy on `slot`, the entry a lookup of the key
    /// found; if the cache evicted it before this check got its lock, on
    /// the key's new entry instead.
    pub(crate) fn check_one(
        &self,
        request: CheckRequest<'_>,
        quota: &Quota,
        mut slot: Arc<Slot>,
    ) -> Result<Decision, StoreError> {
        let cost = request.cost_of(0).get();
        let mut attempt = 0;
        loop {
            let mut inner = lock(&slot.inner);
            if inner.evicted && attempt < MAX_EVICTED_RETRIES {
                drop(inner);
                slot = self.slot(request.key, quota);
                attempt += 1;
                continue;
            }
            let now = self.clock.now_micros();
            inner.last_check = inner.last_check.max(now);
            let evaluation = inner.state.evaluate(quota, now, cost);
            // A lone shadow quota admits anyway, but records only what fits.
            if evaluation.fits() {
                inner.state.commit(quota, now, cost);
            }
            return decided(request.policy, &[evaluation], now);
        }
    }

    /// Settles one request's usage on every quota of its policy at once.
    fn settle_now(&self, request: SettleRequest<'_>) -> Result<Decision, StoreError> {
        request.validate()?;
        let (policy, reserved) = (request.policy, request.reserved);
        self.with_policy_locked(request.key, policy, |locked| {
            let now = self.clock.now_micros();
            let evaluations: SmallVec<[Evaluation; 4]> = policy
                .quotas()
                .iter()
                .zip(locked.guards.iter_mut())
                .enumerate()
                .map(|(i, (quota, inner))| {
                    inner.last_check = inner.last_check.max(now);
                    let (at, units) = (reserved.at_micros, reserved.units_in(i));
                    settle(&mut inner.state, quota, now, at, units, request.usage_of(i))
                })
                .collect();
            decided(policy, &evaluations, now)
        })
    }

    /// Evaluates every quota of the request's policy on its state (a key
    /// never checked reads as empty, and is not created), recording
    /// nothing. Like the Redis peek script, it drops state that has expired,
    /// so both stores hold the same state after a peek.
    pub(crate) fn peek_now(&self, request: CheckRequest<'_>) -> Result<Decision, StoreError> {
        let now = self.clock.now_micros();
        let mut evaluations: SmallVec<[Evaluation; 4]> = SmallVec::new();
        for (i, quota) in request.policy.quotas().iter().enumerate() {
            let cost = request.cost_of(i).get();
            let evaluation = match self.cache.get(&StateKeyRef::new(request.key, quota)) {
                Some(slot) => lock(&slot.inner).state.evaluate(quota, now, cost),
                None => State::empty(quota.algorithm()).evaluate(quota, now, cost),
            };
            // Reported as it stands: `remaining` before the cost.
            evaluations.push(standing(evaluation));
        }
        decided(request.policy, &evaluations, now)
    }
}

impl Backend for MemoryStore {
    // Short critical sections with no I/O: every answer is ready at once.
    fn check<'a>(&'a self, _: &mut Guard<'a>, request: CheckRequest<'a>) -> Op<'static, Decision> {
        Op::ready(self.check_now(request))
    }

    fn peek<'a>(&'a self, _: &mut Guard<'a>, request: CheckRequest<'a>) -> Op<'static, Decision> {
        Op::ready(self.peek_now(request))
    }

    fn settle<'a>(
        &'a self,
        _: &mut Guard<'a>,
        request: SettleRequest<'a>,
    ) -> Op<'static, Decision> {
        Op::ready(self.settle_now(request))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    use super::*;
    use crate::{ManualClock, Policy, WindowKey};

    const T0: u64 = 1_700_000_000_000_000;

    fn cost(units: u32) -> crate::Cost {
        crate::Cost::new(units).unwrap()
    }

    /// One check through the windows backend, as a store handle makes it.
    fn check(store: &MemoryStore, key: &WindowKey, quota: &Quota, units: u32) -> Decision {
        let policy = Policy::from(quota.clone());
        let op = Backend::check(
            store,
            &mut Guard::bare(),
            CheckRequest::new(key, &policy, cost(units)),
        );
        op.into_ready().expect("in-process").unwrap()
    }

    #[test]
    fn clones_share_state_and_keys_are_independent() {
        let clock = ManualClock::new(T0);
        let store = MemoryStore::builder().clock(clock).build();
        let other = store.clone();
        let quota: Quota = "1/1m".parse().unwrap();
        let alice = WindowKey::for_subject("alice");
        assert!(check(&store, &alice, &quota, 1).allowed);
        assert!(!check(&other, &alice, &quota, 1).allowed);
        assert!(check(&other, &WindowKey::for_subject("bob"), &quota, 1).allowed);
        let named = quota.clone().named("other").unwrap();
        assert!(check(&other, &alice, &named, 1).allowed);
        let d = check(&store, &alice, &quota, 1);
        assert_eq!(d.timestamp_micros, T0);
        assert_eq!(d.retry_after, Some(Duration::from_secs(60)));
    }

    #[test]
    fn zero_cost_never_reaches_the_store() {
        let store = MemoryStore::new();
        let limiter = crate::Limiter::new(store.clone(), "1/1m".parse::<Quota>().unwrap());
        let key = WindowKey::global();
        let zero = limiter.check(&key, 0).into_ready();
        assert!(matches!(zero, Ok(Err(crate::LimitError::ZeroCost))));
        assert_eq!(store.entry_count(), 0);
    }

    #[test]
    fn denial_on_an_empty_key_consumes_nothing() {
        let store = MemoryStore::builder().clock(ManualClock::new(T0)).build();
        let quota: Quota = "1/1m".parse().unwrap();
        let d = check(&store, &WindowKey::global(), &quota, 2);
        assert!(!d.allowed);
        assert_eq!(d.remaining, 1);
        let d = check(&store, &WindowKey::global(), &quota, 1);
        assert!(d.allowed);
        assert_eq!(d.remaining, 0);
        store.run_pending_tasks();
        assert_eq!(store.entry_count(), 1);
    }

    #[test]
    fn a_flood_of_keys_stays_within_max_keys() {
        let store = MemoryStore::builder()
            .clock(ManualClock::new(T0))
            .max_keys(1_000)
            .build();
        let policy = Policy::from("10/1h".parse::<Quota>().unwrap());
        for i in 0..100_000u32 {
            let key = WindowKey::for_subject(i.to_be_bytes().to_vec());
            let decision = store
                .check_now(CheckRequest::new(&key, &policy, cost(1)))
                .unwrap();
            assert!(decision.allowed);
        }
        store.run_pending_tasks();
        assert!(store.entry_count() <= 1_000, "{}", store.entry_count());
        assert!(store.entry_count() > 0);
    }

    #[test]
    fn idle_entries_read_as_empty_and_can_be_dropped() {
        let clock = ManualClock::new(T0);
        let store = MemoryStore::builder()
            .clock(clock.clone())
            .expiry_grace(Duration::from_millis(1))
            .build();
        let quota: Quota = "1/1ms fixed-window".parse().unwrap();
        let key = WindowKey::global();
        assert!(check(&store, &key, &quota, 1).allowed);
        assert!(!check(&store, &key, &quota, 1).allowed);
        // The window passed: the entry reads as empty and is overwritten.
        clock.advance(Duration::from_millis(1));
        assert!(check(&store, &key, &quota, 1).allowed);
        assert!(!check(&store, &key, &quota, 1).allowed);
        assert_eq!(store.entry_count(), 1);
        // Idle for less than lifetime + grace: kept.
        store.run_pending_tasks();
        assert_eq!(store.entry_count(), 1);
        clock.advance(quota.max_state_lifetime() + Duration::from_millis(1));
        store.run_pending_tasks();
        assert_eq!(store.entry_count(), 0);
        assert!(check(&store, &key, &quota, 1).allowed);
        assert_eq!(store.entry_count(), 1);
    }

    #[test]
    fn a_slot_dropped_while_a_check_waits_for_it_is_not_decided_on() {
        let clock = ManualClock::new(T0);
        let store = MemoryStore::builder()
            .clock(clock.clone())
            .expiry_grace(Duration::ZERO)
            .build();
        let quota: Quota = "2/1ms".parse().unwrap();
        let policy = Policy::from(quota.clone());
        let key = WindowKey::global();
        let request = CheckRequest::new(&key, &policy, cost(1));
        assert!(store.check_now(request).unwrap().allowed);
        let in_flight = store.slot(&key, &quota);
        clock.advance(Duration::from_secs(1));
        store.run_pending_tasks();
        assert_eq!(store.entry_count(), 0);
        assert!(
            store
                .check_one(request, &quota, in_flight.clone())
                .unwrap()
                .allowed
        );
        // Decided on the key's new entry, not on the dropped one.
        assert_eq!(store.entry_count(), 1);
        assert!(!Arc::ptr_eq(&in_flight, &store.slot(&key, &quota)));
        assert_eq!(lock(&in_flight.inner).last_check, T0);
    }

    /// The bound: a key evicted for capacity and re-created while
    /// another check of it is in flight never admits more than its limit in
    /// one window beyond what the eviction forgot.
    #[test]
    fn eviction_under_a_check_in_flight_admits_at_most_the_limit_beyond_what_it_forgot() {
        const LIMIT: u64 = 10;
        let store = MemoryStore::builder()
            .clock(ManualClock::new(T0))
            .max_keys(64)
            .build();
        let quota: Quota = "10/1h".parse().unwrap();
        let policy = Policy::from(quota.clone());
        let key = WindowKey::for_subject("victim");
        let request = CheckRequest::new(&key, &policy, cost(1));
        let admit = |request| u64::from(store.check_now(request).unwrap().allowed);
        let mut admitted: u64 = (0..6).map(|_| admit(request)).sum();
        assert_eq!(admitted, 6);
        // A check of the key looked it up and is about to lock its entry…
        let in_flight = store.slot(&key, &quota);
        // …when a flood of other keys evicts the entry (6 units forgotten).
        // Each is checked twice: S3-FIFO lets keys seen only once go first,
        // so one-off keys alone would never push out an active one.
        let lookup = StateKeyRef::new(&key, &quota);
        for i in 0..100_000u32 {
            if store.cache.peek(&lookup).is_none() {
                break;
            }
            let other = WindowKey::for_subject(i.to_be_bytes().to_vec());
            for _ in 0..2 {
                store
                    .check_now(CheckRequest::new(&other, &policy, cost(1)))
                    .unwrap();
            }
        }
        assert!(store.cache.peek(&lookup).is_none(), "never evicted");
        assert!(lock(&in_flight.inner).evicted);
        let forgotten = 6;
        // The key is re-created and checked again, then the in-flight check
        // finishes: together at most LIMIT more in this window.
        admitted += (0..20).map(|_| admit(request)).sum::<u64>();
        admitted += u64::from(
            store
                .check_one(request, &quota, in_flight.clone())
                .unwrap()
                .allowed,
        );
        assert_eq!(admitted, LIMIT + forgotten);
        // Nothing was recorded in the evicted entry after it was evicted.
        let mut old = lock(&in_flight.inner);
        let left = old.state.evaluate(&quota, T0, 1);
        drop(old);
        let fresh = Slot::new(&quota);
        let mut fresh = lock(&fresh.inner);
        for _ in 0..forgotten {
            fresh.state.commit(&quota, T0, 1);
        }
        assert_eq!(
            format!("{left:?}"),
            format!("{:?}", fresh.state.evaluate(&quota, T0, 1))
        );
    }

    #[test]
    fn concurrent_checks_while_the_key_is_evicted_stay_within_limit_per_window_kept() {
        // Four threads check one key while a fifth floods a small store with
        // other keys, evicting it now and then. Each of the key's entries
        // (windows) admits at most LIMIT; a new entry's first admission is
        // the one that leaves LIMIT - 1, so admissions never exceed LIMIT
        // per such admission.
        const LIMIT: u64 = 5;
        let store = MemoryStore::builder()
            .clock(ManualClock::new(T0))
            .max_keys(64)
            .build();
        let policy = Policy::from("5/1h".parse::<Quota>().unwrap());
        let key = WindowKey::for_subject("victim");
        let admitted = AtomicU64::new(0);
        let windows = AtomicU64::new(0);
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..2_000 {
                        let d = store
                            .check_now(CheckRequest::new(&key, &policy, cost(1)))
                            .unwrap();
                        if d.allowed {
                            admitted.fetch_add(1, Ordering::Relaxed);
                            if u64::from(d.remaining) == LIMIT - 1 {
                                windows.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                });
            }
            scope.spawn(|| {
                for i in 0..20_000u32 {
                    let other = WindowKey::for_subject(i.to_be_bytes().to_vec());
                    for _ in 0..2 {
                        store
                            .check_now(CheckRequest::new(&other, &policy, cost(1)))
                            .unwrap();
                    }
                }
            });
        });
        let admitted = admitted.load(Ordering::Relaxed);
        let windows = windows.load(Ordering::Relaxed);
        assert!(windows >= 1);
        assert!(
            admitted <= LIMIT * windows,
            "{admitted} admitted over {windows} windows"
        );
    }

    #[test]
    fn concurrent_checks_on_one_key_never_over_admit() {
        let store = MemoryStore::builder().clock(ManualClock::new(T0)).build();
        let policy = Policy::from("100/1m".parse::<Quota>().unwrap());
        let admitted = AtomicU64::new(0);
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..100 {
                        let d = store
                            .check_now(CheckRequest::new(&WindowKey::global(), &policy, cost(1)))
                            .unwrap();
                        if d.allowed {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(admitted.load(Ordering::Relaxed), 100);
    }

    #[test]
    fn debug_shows_no_keys() {
        let store = MemoryStore::new();
        let quota: Quota = "1/1m".parse().unwrap();
        check(&store, &WindowKey::for_subject("secret-api-key"), &quota, 1);
        let text = format!("{store:?} {:?}", MemoryStore::builder());
        assert!(!text.contains("secret"), "{text}");
    }
}
