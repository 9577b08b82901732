//! [`MemoryStore`]: the embedded, single-process store.
//!
//! State lives in a bounded [moka] cache keyed by (tenant, subject, quota
//! state id), one entry per quota window, each behind its own lock. A check
//! of a policy locks every quota's entry in one global order, evaluates all
//! of them and records the cost in all only if all admit: atomic per
//! policy, with no deadlock between overlapping policies. Decisions use the algorithms in
//! [`crate::algorithm`] with time from an injectable [`Clock`].
//!
//! Two things bound memory:
//! - the number of keys ([`MemoryStoreBuilder::max_keys`], default
//!   [`MemoryStore::DEFAULT_MAX_KEYS`]): beyond it the cache evicts the
//!   least recently used key (LRU, so a new key is always stored);
//! - expiry: an entry idle (unchecked) for its quota's
//!   [longest state lifetime](Quota::max_state_lifetime) plus a small
//!   [grace](MemoryStoreBuilder::expiry_grace), in real time, is dropped
//!   within as long again (the expiry moves once per such period, not on
//!   every check).
//!
//! Eviction by time does not change decisions: by then the algorithms treat
//! the state as empty by themselves, using the injected clock, so the cache
//! only drops what is already logically gone (as long as the store's clock
//! does not fall behind real time by more than the grace). Eviction
//! by capacity forgets a key's window, which can admit that key again early;
//! size `max_keys` for the number of keys active within one window.
//!
//! [moka]: https://docs.rs/moka

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use moka::policy::EvictionPolicy;
use moka::sync::Cache;
use moka::Expiry;

use smallvec::SmallVec;

use super::{CheckRequest, Store, StoreError, StoreErrorKind};
use crate::algorithm::outcome::{policy_decision, Evaluation};
use crate::algorithm::State;
use crate::key::state_key::{StateKey, StateKeyRef};
use crate::{Clock, Decision, Policy, Quota, SystemClock, WindowKey};

/// The embedded store: bounded, in-process, atomic per key.
///
/// Cheap to clone; clones share one cache. Use it for a single process, or
/// in tests with a [`ManualClock`](crate::ManualClock):
///
/// ```
/// use std::time::Duration;
/// use tower_window::{Limiter, ManualClock, MemoryStore, WindowKey};
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let clock = ManualClock::new(1_700_000_000_000_000);
/// let store = MemoryStore::builder().clock(clock.clone()).max_keys(10_000).build();
/// let limiter = Limiter::new(store, "1/1m".parse()?);
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
    cache: Cache<StateKey, Arc<Slot>>,
    clock: Arc<dyn Clock>,
    max_keys: u64,
}

impl MemoryStore {
    /// The default bound on the number of keys kept.
    pub const DEFAULT_MAX_KEYS: u64 = 100_000;

    /// The default [`expiry_grace`](MemoryStoreBuilder::expiry_grace).
    pub const DEFAULT_EXPIRY_GRACE: Duration = Duration::from_secs(1);

    /// A store with default settings: the system clock and at most
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

    /// The number of keys held. Approximate while evictions are pending; see
    /// [`run_pending_tasks`](Self::run_pending_tasks).
    pub fn entry_count(&self) -> u64 {
        self.cache.entry_count()
    }

    /// Runs the cache's pending maintenance (evictions by size and time) now
    /// instead of on later calls. For tests and diagnostics.
    pub fn run_pending_tasks(&self) {
        self.cache.run_pending_tasks();
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
            let mut state = lock(&slot.state);
            let now = self.clock.now_micros();
            let evaluation = state.evaluate(quota, now, cost);
            if evaluation.fits() {
                state.commit(quota, now, cost);
            }
            return decided(policy, &[evaluation], now);
        }
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
        let mut guards: SmallVec<[Option<MutexGuard<'_, State>>; 4]> =
            slots.iter().map(|_| None).collect();
        for &i in &order {
            guards[i] = Some(lock(&slots[i].state));
        }
        let now = self.clock.now_micros();
        let mut evaluations: SmallVec<[Evaluation; 4]> = SmallVec::new();
        for (quota, guard) in policy.quotas().iter().zip(guards.iter_mut()) {
            if let Some(state) = guard {
                evaluations.push(state.evaluate(quota, now, cost));
            }
        }
        if evaluations.iter().all(Evaluation::fits) {
            for (quota, guard) in policy.quotas().iter().zip(guards.iter_mut()) {
                if let Some(state) = guard {
                    state.commit(quota, now, cost);
                }
            }
        }
        decided(policy, &evaluations, now)
    }

    /// The slot of `key`'s state under `quota`: one lookup by borrowed parts
    /// (a hit clones nothing), or an insert for a new key.
    fn slot(&self, key: &WindowKey, quota: &Quota) -> Arc<Slot> {
        match self.cache.get(StateKeyRef::new(key, quota).as_lookup()) {
            Some(slot) => slot,
            None => self
                .cache
                .get_with(StateKey::new(key, quota), || Arc::new(Slot::new(quota))),
        }
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
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
            .field("entry_count", &self.cache.entry_count())
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
pub struct MemoryStoreBuilder {
    clock: Arc<dyn Clock>,
    max_keys: u64,
    expiry_grace: Duration,
}

impl Default for MemoryStoreBuilder {
    fn default() -> Self {
        Self {
            clock: Arc::new(SystemClock),
            max_keys: MemoryStore::DEFAULT_MAX_KEYS,
            expiry_grace: MemoryStore::DEFAULT_EXPIRY_GRACE,
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
    /// The time source for all decisions (default [`SystemClock`]).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The most keys kept (default [`MemoryStore::DEFAULT_MAX_KEYS`]; at
    /// least 1). A key is one (tenant, subject, quota) triple.
    pub fn max_keys(mut self, max_keys: u64) -> Self {
        self.max_keys = max_keys.max(1);
        self
    }

    /// How long past its TTL, in real time, a key's entry is kept (default
    /// [`MemoryStore::DEFAULT_EXPIRY_GRACE`]).
    ///
    /// Expiry runs on real time while decisions run on the store's clock.
    /// The grace covers a wall clock that steps back a little; raise it when
    /// the clock may run slower than real time (a [`ManualClock`] in a test
    /// that sleeps or takes long between checks with very short windows).
    ///
    /// [`ManualClock`]: crate::ManualClock
    pub fn expiry_grace(mut self, grace: Duration) -> Self {
        self.expiry_grace = grace;
        self
    }

    /// Builds the store.
    pub fn build(self) -> MemoryStore {
        let cache = Cache::builder()
            .max_capacity(self.max_keys)
            // LRU rather than moka's default TinyLFU admission: TinyLFU may
            // refuse to store a brand-new key while the cache is full, and a
            // window that is never stored never limits anything.
            .eviction_policy(EvictionPolicy::lru())
            .expire_after(SlotExpiry {
                grace: self.expiry_grace,
            })
            .build();
        MemoryStore {
            cache,
            clock: self.clock,
            max_keys: self.max_keys,
        }
    }
}

/// One key's state and how long it may matter after its last write.
struct Slot {
    /// Locked for the duration of one check: that is what makes a check
    /// atomic per key.
    state: Mutex<State>,
    /// [`Quota::max_state_lifetime`]: the entry's idle expiry.
    lifetime: Duration,
}

impl Slot {
    fn new(quota: &Quota) -> Self {
        Self {
            state: Mutex::new(State::empty(quota.algorithm())),
            lifetime: quota.max_state_lifetime(),
        }
    }
}

/// Expires each entry once it has been idle for its quota's longest state
/// lifetime (plus grace), and at most twice that. Every check reads its
/// entry, and the last write is never later than the last read, so by then
/// the state is logically empty: expiry never changes a decision, and needs
/// no re-insert per admission.
///
/// A read moves the expiry only when less than one idle period is left, and
/// then to two: the timer wheel is touched once per idle period per key
/// instead of on every check, and every read still leaves at least one idle
/// period.
struct SlotExpiry {
    grace: Duration,
}

impl SlotExpiry {
    fn idle(&self, slot: &Slot) -> Duration {
        slot.lifetime.saturating_add(self.grace)
    }

    fn extended(&self, slot: &Slot) -> Option<Duration> {
        Some(self.idle(slot).saturating_mul(2))
    }
}

impl Expiry<StateKey, Arc<Slot>> for SlotExpiry {
    fn expire_after_create(
        &self,
        _key: &StateKey,
        slot: &Arc<Slot>,
        _created_at: Instant,
    ) -> Option<Duration> {
        self.extended(slot)
    }

    fn expire_after_read(
        &self,
        _key: &StateKey,
        slot: &Arc<Slot>,
        _read_at: Instant,
        duration_until_expiry: Option<Duration>,
        _last_modified_at: Instant,
    ) -> Option<Duration> {
        match duration_until_expiry {
            // Returning the current value leaves the timer wheel alone.
            Some(left) if left >= self.idle(slot) => Some(left),
            _ => self.extended(slot),
        }
    }

    fn expire_after_update(
        &self,
        _key: &StateKey,
        slot: &Arc<Slot>,
        _updated_at: Instant,
        _duration_until_expiry: Option<Duration>,
    ) -> Option<Duration> {
        self.extended(slot)
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
    fn idle_entries_expire() {
        // A 1 ms fixed window: with no grace the entry is gone once it has
        // been idle for 1 to 2 ms of real time.
        let store = MemoryStore::builder()
            .clock(ManualClock::new(T0 + 999))
            .expiry_grace(Duration::ZERO)
            .build();
        let quota: Quota = "1/1ms fixed-window".parse().unwrap();
        let key = WindowKey::global();
        assert!(check(&store, &key, &quota, 1).allowed);
        let cache_key = StateKeyRef::new(&key, &quota);
        let cache_key = cache_key.as_lookup();
        // Not a timing assertion: waits (microseconds in practice) until it happens.
        let deadline = Instant::now() + Duration::from_secs(30);
        while store.cache.contains_key(cache_key) && Instant::now() < deadline {
            std::thread::yield_now();
        }
        assert!(!store.cache.contains_key(cache_key));
    }

    #[test]
    fn reads_move_the_expiry_once_per_idle_period() {
        let expiry = SlotExpiry {
            grace: Duration::from_secs(1),
        };
        let quota: Quota = "5/1m".parse().unwrap();
        let slot = Arc::new(Slot::new(&quota));
        let key = StateKey::new(&WindowKey::global(), &quota);
        let idle = Duration::from_secs(61);
        let now = Instant::now();
        assert_eq!(expiry.expire_after_create(&key, &slot, now), Some(2 * idle));
        // At least one idle period left: unchanged (no timer-wheel update).
        for left in [2 * idle, idle + Duration::from_millis(1), idle] {
            assert_eq!(
                expiry.expire_after_read(&key, &slot, now, Some(left), now),
                Some(left)
            );
        }
        // Less than that: moved to two, so every read leaves at least one.
        for left in [idle - Duration::from_millis(1), Duration::ZERO] {
            assert_eq!(
                expiry.expire_after_read(&key, &slot, now, Some(left), now),
                Some(2 * idle)
            );
        }
        assert_eq!(
            expiry.expire_after_read(&key, &slot, now, None, now),
            Some(2 * idle)
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
