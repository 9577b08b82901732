//! [`MemoryStore`]: the embedded, single-process store.
//!
//! State lives in a bounded, sharded [quick_cache] cache keyed by (tenant,
//! subject, quota state id), one entry per quota window, each behind its own
//! lock. A check of a policy locks every quota's entry in one global order,
//! evaluates all of them and records the cost in all only if all admit:
//! atomic per policy, with no deadlock between overlapping policies.
//! Decisions use the algorithms in [`crate::algorithm`] with time from an
//! injectable [`Clock`].
//!
//! Memory is bounded by the number of keys ([`MemoryStoreBuilder::max_keys`],
//! default [`MemoryStore::DEFAULT_MAX_KEYS`]); a new key is always stored,
//! and beyond the bound the cache evicts by S3-FIFO (keys checked only once
//! go before keys checked repeatedly, so a flood of one-off keys does not
//! push out the windows of active ones).
//!
//! Expiry is inside the values: a key whose window has passed reads as empty
//! (the algorithms treat state older than its
//! [longest lifetime](Quota::max_state_lifetime) as empty, on the store's
//! clock) and is overwritten by its next admission, so entries need no
//! timers; [`MemoryStore::run_pending_tasks`] drops such idle entries on
//! demand.
//!
//! # What a bounded store forgets
//!
//! Eviction by capacity forgets a key's window: the units that key was
//! charged in its current window. The next check of the key starts a new,
//! empty window, so within one window the key can be admitted up to its limit
//! again on top of what was forgotten — never more. A check already in
//! flight on the evicted entry when it is evicted (holding its lock) sees
//! that the entry was evicted and decides on the key's new entry instead, so
//! it is counted once, in the new window. Size `max_keys` for the number of
//! keys active within one window and eviction forgets only idle keys.
//!
//! [quick_cache]: https://docs.rs/quick_cache

use std::convert::Infallible;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError};
use std::time::Duration;

use futures_util::future::BoxFuture;
use quick_cache::sync::Cache;
use quick_cache::{DefaultHashBuilder, Lifecycle, UnitWeighter};

use smallvec::SmallVec;

mod lease;

use super::{CheckRequest, Store, StoreError, StoreErrorKind};
use crate::algorithm::outcome::{policy_admits, policy_decision, Evaluation};
use crate::algorithm::State;
use crate::key::state_key::{bounded_options, StateKey, StateKeyRef};
use crate::{Clock, Decision, MonotonicClock, Policy, Quota, WindowKey};

mod conn;
mod dedup;
mod events;
mod peek;

type SlotCache = Cache<StateKey, Arc<Slot>, UnitWeighter, DefaultHashBuilder, MarkEvicted>;

/// How often a check retries on a key's new entry after finding the one it
/// locked evicted. Each retry follows an eviction of that very entry, which
/// needs an insert of another key in between; past this, a check decides on
/// the entry it holds (its admission is then part of what the eviction forgot).
const MAX_EVICTED_RETRIES: usize = 8;

/// The embedded store: bounded, in-process, atomic per key.
///
/// Cheap to clone; clones share one cache. Use it for a single process, or
/// in tests with a [`ManualClock`](crate::ManualClock):
///
/// ```
/// use std::time::Duration;
/// use tower_window::{Limiter, ManualClock, MemoryStore, WindowKey, Quota};
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let clock = ManualClock::new(1_700_000_000_000_000);
/// let store = MemoryStore::builder().clock(clock.clone()).max_keys(10_000).build();
/// let limiter = Limiter::new(store, "1/1m".parse::<Quota>()?);
/// let key = WindowKey::for_subject("alice");
/// assert!(limiter.check(&key, 1).await?.allowed);
/// assert!(!limiter.check(&key, 1).await?.allowed);
/// clock.advance(Duration::from_secs(60));
/// assert!(limiter.check(&key, 1).await?.allowed);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Clone)]
pub struct MemoryStore {
    cache: Arc<SlotCache>,
    clock: Arc<dyn Clock>,
    max_keys: u64,
    grace_micros: u64,
    /// The id of the next lease.
    next_lease: Arc<std::sync::atomic::AtomicU64>,
    /// Event windows (see `events.rs`).
    events: Arc<events::EventLogs>,
    /// Message ids of [`DedupWindow`](crate::dedup::DedupWindow)s (`dedup.rs`).
    dedup: Arc<dedup::DedupIds>,
    /// Connection leases (`conn.rs`).
    conns: Arc<conn::ConnLeases>,
}

impl MemoryStore {
    /// The default bound on the number of keys kept.
    pub const DEFAULT_MAX_KEYS: u64 = 100_000;

    /// The default [`expiry_grace`](MemoryStoreBuilder::expiry_grace).
    pub const DEFAULT_EXPIRY_GRACE: Duration = Duration::from_secs(1);

    /// The default bound on dedup ids kept ([`MemoryStoreBuilder::max_dedup_ids`]).
    pub const DEFAULT_MAX_DEDUP_IDS: u64 = 100_000;

    /// A store with default settings: the [`MonotonicClock`] and at most
    /// [`DEFAULT_MAX_KEYS`](Self::DEFAULT_MAX_KEYS) keys.
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// A builder to set the clock and bounds.
    pub fn builder() -> MemoryStoreBuilder {
        MemoryStoreBuilder::default()
    }

    /// The most keys this store keeps.
    pub fn max_keys(&self) -> u64 {
        self.max_keys
    }

    /// The number of keys held, at most [`max_keys`](Self::max_keys). It
    /// includes keys whose windows have passed (they read as empty) until
    /// capacity pressure or [`run_pending_tasks`](Self::run_pending_tasks)
    /// drops them.
    pub fn entry_count(&self) -> u64 {
        self.cache.len() as u64
    }

    /// Drops every entry idle for longer than its quota's
    /// [longest state lifetime](Quota::max_state_lifetime) plus the
    /// [grace](MemoryStoreBuilder::expiry_grace), on the store's clock, so
    /// that [`entry_count`](Self::entry_count) counts live keys only.
    ///
    /// Never needed for correctness or for the memory bound (evictions by
    /// size happen inline, and an idle entry reads as empty); it walks the
    /// whole cache, so it is for tests and diagnostics, not the hot path.
    /// Entries being checked at that moment are kept.
    pub fn run_pending_tasks(&self) {
        let now = self.clock.now_micros();
        let grace = self.grace_micros;
        self.cache.retain(|_, slot| {
            let mut inner = match slot.inner.try_lock() {
                Ok(inner) => inner,
                Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
                Err(TryLockError::WouldBlock) => return true,
            };
            let idle_until = inner
                .last_check
                .saturating_add(slot.lifetime_micros)
                .saturating_add(grace);
            if now < idle_until {
                return true;
            }
            // A check waiting for this lock decides on the key's next entry.
            inner.evicted = true;
            false
        });
    }

    /// Checks and records one request synchronously; [`Store::check`] and
    /// [`Store::check_sync`] wrap it (so does `LocalWindow`).
    pub(crate) fn check_now(&self, request: CheckRequest<'_>) -> Result<Decision, StoreError> {
        if request.cost == 0 {
            return Err(StoreError::new(
                StoreErrorKind::InvalidRequest,
                "a request must cost at least 1 unit",
            ));
        }
        let policy = request.policy;
        let cost = request.cost;
        if let [quota] = policy.quotas() {
            // One quota: one slot, one lock.
            let slot = self.slot(request.key, quota);
            return self.check_one(request, quota, slot);
        }
        let mut attempt = 0;
        loop {
            let slots: SmallVec<[Arc<Slot>; 4]> = policy
                .quotas()
                .iter()
                .map(|quota| self.slot(request.key, quota))
                .collect();
            // Lock every slot of the policy in one global order (by address), so
            // two checks of overlapping policies can never wait on each other in
            // a cycle, and no check sees a half-recorded policy.
            let mut order: SmallVec<[usize; 4]> = (0..slots.len()).collect();
            order.sort_unstable_by_key(|&i| Arc::as_ptr(&slots[i]) as usize);
            let mut guards: SmallVec<[Option<MutexGuard<'_, SlotInner>>; 4]> =
                slots.iter().map(|_| None).collect();
            for &i in &order {
                guards[i] = Some(lock(&slots[i].inner));
            }
            let evicted = guards.iter().flatten().any(|inner| inner.evicted);
            if evicted && attempt < MAX_EVICTED_RETRIES {
                // Unlocks everything before looking the slots up again: a
                // check never holds a slot's lock while it waits for the cache.
                drop(guards);
                attempt += 1;
                continue;
            }
            let now = self.clock.now_micros();
            let mut evaluations: SmallVec<[Evaluation; 4]> = SmallVec::new();
            for (quota, guard) in policy.quotas().iter().zip(guards.iter_mut()) {
                if let Some(inner) = guard {
                    inner.last_check = inner.last_check.max(now);
                    evaluations.push(inner.state.evaluate(quota, now, cost));
                }
            }
            if policy_admits(policy, &evaluations) {
                for ((quota, guard), evaluation) in policy
                    .quotas()
                    .iter()
                    .zip(guards.iter_mut())
                    .zip(&evaluations)
                {
                    // A shadow quota the cost does not fit records nothing.
                    if let (Some(inner), true) = (guard, evaluation.fits()) {
                        inner.state.commit(quota, now, cost);
                    }
                }
            }
            return decided(policy, &evaluations, now);
        }
    }

    /// Decides a one-quota policy on `slot`, the entry a lookup of the key
    /// found; if the cache evicted it before this check got its lock, on
    /// the key's new entry instead.
    fn check_one(
        &self,
        request: CheckRequest<'_>,
        quota: &Quota,
        mut slot: Arc<Slot>,
    ) -> Result<Decision, StoreError> {
        let cost = request.cost;
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

    /// The slot of `key`'s state under `quota`: one lookup by borrowed parts
    /// (a hit clones nothing but the `Arc`), or an insert for a new key that
    /// gives every concurrent check of that key the same slot.
    fn slot(&self, key: &WindowKey, quota: &Quota) -> Arc<Slot> {
        if let Some(slot) = self.cache.get(&StateKeyRef::new(key, quota)) {
            return slot;
        }
        let owned = StateKey::new(key, quota);
        match self
            .cache
            .get_or_insert_with(&owned, || Ok::<_, Infallible>(Arc::new(Slot::new(quota))))
        {
            Ok(slot) => slot,
            Err(never) => match never {},
        }
    }
}

fn lock<T>(state: &Mutex<T>) -> MutexGuard<'_, T> {
    // A check never leaves the state half-written: a panic elsewhere cannot break it.
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

fn decided(policy: &Policy, evaluations: &[Evaluation], now: u64) -> Result<Decision, StoreError> {
    policy_decision(policy, evaluations, now)
        .ok_or_else(|| StoreError::new(StoreErrorKind::InvalidRequest, "a policy without quotas"))
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("entry_count", &self.entry_count())
            .field("max_keys", &self.max_keys)
            .finish_non_exhaustive()
    }
}

impl Store for MemoryStore {
    fn check<'a>(
        &'a self,
        request: CheckRequest<'a>,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        // The work is a short critical section with no I/O: do it when
        // polled, without yielding.
        Box::pin(async move { self.check_now(request) })
    }

    fn check_sync(&self, request: CheckRequest<'_>) -> Option<Result<Decision, StoreError>> {
        Some(self.check_now(request))
    }

    fn decides_in_process(&self) -> bool {
        true
    }

    fn peek<'a>(
        &'a self,
        request: CheckRequest<'a>,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        Box::pin(async move { self.peek_now(request) })
    }

    fn reserve<'a>(
        &'a self,
        request: super::ReserveRequest<'a>,
    ) -> BoxFuture<'a, Result<super::Reservation, StoreError>> {
        Box::pin(async move { self.reserve_now(request) })
    }

    fn refund<'a>(
        &'a self,
        request: super::RefundRequest<'a>,
    ) -> BoxFuture<'a, Result<u32, StoreError>> {
        Box::pin(async move { self.refund_now(request) })
    }
}

/// Builds a [`MemoryStore`].
///
/// ```
/// use tower_window::{ManualClock, MemoryStore};
///
/// let store = MemoryStore::builder()
///     .clock(ManualClock::new(0))
///     .max_keys(1_000)
///     .build();
/// assert_eq!(store.max_keys(), 1_000);
/// ```
#[must_use]
pub struct MemoryStoreBuilder {
    clock: Arc<dyn Clock>,
    max_keys: u64,
    expiry_grace: Duration,
    max_dedup_ids: u64,
}

impl Default for MemoryStoreBuilder {
    fn default() -> Self {
        Self {
            clock: Arc::new(MonotonicClock),
            max_keys: MemoryStore::DEFAULT_MAX_KEYS,
            expiry_grace: MemoryStore::DEFAULT_EXPIRY_GRACE,
            max_dedup_ids: MemoryStore::DEFAULT_MAX_DEDUP_IDS,
        }
    }
}

impl fmt::Debug for MemoryStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStoreBuilder")
            .field("max_keys", &self.max_keys)
            .field("expiry_grace", &self.expiry_grace)
            .finish_non_exhaustive()
    }
}

impl MemoryStoreBuilder {
    /// The time source for all decisions (default [`MonotonicClock`]; give
    /// [`SystemClock`](crate::SystemClock) to follow wall-clock adjustments).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The most keys kept (default [`MemoryStore::DEFAULT_MAX_KEYS`]; at
    /// least 1). A key is one (tenant, subject, quota) triple.
    ///
    /// The cache is split in shards by key hash, each bounded to its share,
    /// so under capacity pressure a key may be evicted while the store as a
    /// whole holds somewhat fewer than `max_keys`.
    pub fn max_keys(mut self, max_keys: u64) -> Self {
        self.max_keys = max_keys.max(1);
        self
    }

    /// How long past its quota's longest state lifetime, on the store's
    /// clock, an idle key's entry is kept by
    /// [`MemoryStore::run_pending_tasks`] (default
    /// [`MemoryStore::DEFAULT_EXPIRY_GRACE`]). Decisions never depend on it:
    /// an idle entry reads as empty either way.
    pub fn expiry_grace(mut self, grace: Duration) -> Self {
        self.expiry_grace = grace;
        self
    }

    /// The most message ids kept for
    /// [`DedupWindow`](crate::dedup::DedupWindow)s (default
    /// [`MemoryStore::DEFAULT_MAX_DEDUP_IDS`]; at least 1). Beyond it the
    /// oldest-used ids are forgotten and read as first seen again.
    pub fn max_dedup_ids(mut self, max: u64) -> Self {
        self.max_dedup_ids = max.max(1);
        self
    }

    /// Builds the store.
    pub fn build(self) -> MemoryStore {
        let cache = Cache::with_options(
            bounded_options(self.max_keys),
            UnitWeighter,
            DefaultHashBuilder::default(),
            MarkEvicted,
        );
        MemoryStore {
            cache: Arc::new(cache),
            clock: self.clock,
            max_keys: self.max_keys,
            grace_micros: u64::try_from(self.expiry_grace.as_micros()).unwrap_or(u64::MAX),
            next_lease: Arc::new(std::sync::atomic::AtomicU64::new(1)),
            events: Arc::new(events::EventLogs::new(self.max_keys)),
            dedup: Arc::new(dedup::DedupIds::new(self.max_dedup_ids)),
            conns: Arc::default(),
        }
    }
}

/// One key's state.
struct Slot {
    /// Locked for the duration of one check: that is what makes a check
    /// atomic per key.
    inner: Mutex<SlotInner>,
    /// [`Quota::max_state_lifetime`] in µs: how long the state may matter
    /// after the last check.
    lifetime_micros: u64,
}

struct SlotInner {
    state: State,
    /// The clock reading of the last check (µs).
    last_check: u64,
    /// Set, under this lock, once the cache has dropped the slot: a check
    /// that then gets the lock looks the key up again.
    evicted: bool,
    /// Quota leases whose units still count here (empty, and never
    /// allocated, unless leases are used).
    leases: lease::Records,
}

impl Slot {
    fn new(quota: &Quota) -> Self {
        Self {
            inner: Mutex::new(SlotInner {
                state: State::empty(quota.algorithm()),
                last_check: 0,
                evicted: false,
                leases: lease::Records::default(),
            }),
            lifetime_micros: u64::try_from(quota.max_state_lifetime().as_micros())
                .unwrap_or(u64::MAX),
        }
    }
}

/// Marks slots the cache evicts, once the cache's shard lock is released
/// (a check holding a slot's lock never waits for a shard, and an eviction
/// never waits for a slot under a shard's lock).
#[derive(Clone, Copy, Default)]
struct MarkEvicted;

impl Lifecycle<StateKey, Arc<Slot>> for MarkEvicted {
    type RequestState = SmallVec<[Arc<Slot>; 2]>;

    fn begin_request(&self) -> Self::RequestState {
        SmallVec::new()
    }

    fn on_evict(&self, evicted: &mut Self::RequestState, _key: StateKey, slot: Arc<Slot>) {
        evicted.push(slot);
    }

    fn end_request(&self, evicted: Self::RequestState) {
        for slot in evicted {
            lock(&slot.inner).evicted = true;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;
    use crate::{ManualClock, WindowKey};

    const T0: u64 = 1_700_000_000_000_000;

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    fn check(store: &MemoryStore, key: &WindowKey, quota: &Quota, cost: u32) -> Decision {
        let policy = Policy::from(quota.clone());
        block_on(store.check(CheckRequest::new(key, &policy, cost))).unwrap()
    }

    #[test]
    fn check_sync_and_check_decide_on_one_state() {
        let store = Arc::new(MemoryStore::builder().clock(ManualClock::new(T0)).build());
        let quota: Quota = "3/1m".parse().unwrap();
        let policy = Policy::from(quota.clone());
        let key = WindowKey::for_subject("zoe");
        let request = CheckRequest::new(&key, &policy, 1);
        let first = store.check_sync(request).unwrap().unwrap();
        assert_eq!((first.allowed, first.remaining), (true, 2));
        assert_eq!(check(&store, &key, &quota, 1).remaining, 1);
        let third = store.check_sync(request).unwrap().unwrap();
        assert_eq!((third.allowed, third.remaining), (true, 0));
        assert!(!store.check_sync(request).unwrap().unwrap().allowed);
        let free = CheckRequest::new(&key, &policy, 0);
        assert_eq!(
            store.check_sync(free).unwrap().unwrap_err().kind(),
            StoreErrorKind::InvalidRequest
        );
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
    fn zero_cost_is_an_invalid_request() {
        let store = MemoryStore::new();
        let policy = Policy::from("1/1m".parse::<Quota>().unwrap());
        let err =
            block_on(store.check(CheckRequest::new(&WindowKey::global(), &policy, 0))).unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::InvalidRequest);
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
                .check_now(CheckRequest::new(&key, &policy, 1))
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
        let request = CheckRequest::new(&key, &policy, 1);
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

    /// The issue's bound: a key evicted for capacity and re-created while
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
        let request = CheckRequest::new(&key, &policy, 1);
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
                    .check_now(CheckRequest::new(&other, &policy, 1))
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
                            .check_now(CheckRequest::new(&key, &policy, 1))
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
                            .check_now(CheckRequest::new(&other, &policy, 1))
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
                            .check_now(CheckRequest::new(&WindowKey::global(), &policy, 1))
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
