//! [`MemoryStore`]: the embedded, single-process store.
//!
//! State lives in a fixed number of shards, each a hash map behind one
//! mutex, keyed by (tenant, subject, quota). A check hashes its key once,
//! locks its shard, and decides and records under that lock, so one check is
//! atomic per key and checks of keys in different shards run in parallel.
//! Decisions use the algorithms in [`crate::algorithm`] with time from an
//! injectable [`Clock`].
//!
//! Two things bound memory:
//! - the number of keys ([`MemoryStoreBuilder::max_keys`], default
//!   [`MemoryStore::DEFAULT_MAX_KEYS`]): a shard that grows past its share
//!   first drops expired entries, then the least recently used eighth of
//!   its entries (approximate LRU per shard), so a key in active use (the
//!   ones near their limits) stays and one-off keys go first;
//! - expiry: an entry is dead once its state's TTL (plus a small
//!   [grace](MemoryStoreBuilder::expiry_grace)) has passed in real time
//!   since its last write; a dead entry is never read again (the next check
//!   starts afresh) and is dropped by the next sweep of its shard (on
//!   eviction, every few thousand checks of that shard, and in
//!   [`MemoryStore::run_pending_tasks`]).
//!
//! Eviction by time does not change decisions: the algorithms treat state
//! past its TTL as empty by themselves, using the injected clock, so expiry
//! only drops what is already logically gone (as long as the store's clock
//! does not fall behind real time by more than the grace). Eviction by
//! capacity forgets a key's window, which can admit that key again early;
//! size `max_keys` for the number of keys active within one window.
use std::borrow::Borrow;
use std::collections::hash_map::{HashMap, RandomState};
use std::fmt;
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;

use super::{CheckRequest, Store, StoreError, StoreErrorKind};
use crate::algorithm::{fixed_window, gcra, sliding_counter, sliding_log};
use crate::{Algorithm, Clock, Decision, Quota, SystemClock, WindowKey};

/// The embedded store: bounded, in-process, atomic per key.
///
/// Cheap to clone; clones share one state. Use it for a single process, or
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
    shards: Arc<Shards>,
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

    /// The number of keys held. Counts expired entries not yet swept; see
    /// [`run_pending_tasks`](Self::run_pending_tasks).
    pub fn entry_count(&self) -> u64 {
        self.shards
            .shards
            .iter()
            .map(|shard| lock(shard).map.len() as u64)
            .sum()
    }

    /// Drops every expired entry now instead of on later calls. For tests
    /// and diagnostics.
    pub fn run_pending_tasks(&self) {
        let now = Instant::now();
        for shard in &*self.shards.shards {
            lock(shard).drop_expired(now);
        }
    }

    /// Checks and records one request synchronously; [`Store::check`] wraps it.
    fn check_now(&self, request: CheckRequest<'_>) -> Result<Decision, StoreError> {
        if request.cost == 0 {
            return Err(StoreError::new(
                StoreErrorKind::InvalidRequest,
                "a request must cost at least 1 unit",
            ));
        }
        let quota = request.quota;
        let hash = self.shards.hash(request.key, quota);
        let mut shard = lock(self.shards.shard(hash));
        // Under the shard's lock, so each key sees a non-decreasing time and
        // the read-decide-write below is atomic per key.
        let now = self.clock.now_micros();
        let real_now = Instant::now();
        let grace = self.shards.grace;
        let tick = shard.tick();
        let lookup = KeyRef {
            hash,
            key: request.key,
            quota,
        };
        // Looked up by reference: no key is built unless a new one is stored.
        let (outcome, inserted) = if let Some(entry) = shard.map.get_mut(&lookup as &dyn AsKeyRef) {
            if entry.is_expired(real_now) {
                entry.state = State::empty(quota.algorithm());
            }
            entry.last_used = tick;
            let outcome = entry.state.check(quota, now, request.cost);
            if let Some(ttl) = outcome.ttl {
                entry.expires_at = expiry(real_now, ttl, grace);
            }
            // A denial writes nothing and keeps the old expiry.
            (outcome, false)
        } else {
            let mut state = State::empty(quota.algorithm());
            let outcome = state.check(quota, now, request.cost);
            // A denial on an empty key stores nothing.
            let inserted = outcome.ttl.is_some();
            if let Some(ttl) = outcome.ttl {
                let key = SlotKey {
                    hash,
                    key: request.key.clone(),
                    quota: quota.clone(),
                };
                let entry = Entry {
                    state,
                    expires_at: expiry(real_now, ttl, grace),
                    last_used: tick,
                };
                shard.map.insert(key, entry);
            }
            (outcome, inserted)
        };
        if inserted && shard.map.len() > shard.capacity {
            shard.evict(real_now);
        } else if tick.is_multiple_of(SWEEP_EVERY) {
            shard.drop_expired(real_now);
        }
        drop(shard);
        Ok(outcome.into_decision(quota, now))
    }
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
        MemoryStore {
            shards: Arc::new(Shards::new(self.max_keys, self.expiry_grace)),
            clock: self.clock,
            max_keys: self.max_keys,
        }
    }
}

/// Checks of one shard between two sweeps of its expired entries.
const SWEEP_EVERY: u64 = 4096;

/// The most shards a store has.
const MAX_SHARDS: usize = 64;

/// The store's state: shards selected by a hash of the key.
struct Shards {
    hasher: RandomState,
    shards: Box<[Mutex<Shard>]>,
    grace: Duration,
}

impl Shards {
    fn new(max_keys: u64, grace: Duration) -> Self {
        // A few shards per core (a power of two), never more than keys.
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let max_keys_usize = usize::try_from(max_keys).unwrap_or(usize::MAX);
        let mut count = (cores * 4).next_power_of_two().min(MAX_SHARDS);
        while count > 1 && count > max_keys_usize {
            count /= 2;
        }
        // Shares summing to `max_keys`.
        let base = max_keys_usize / count;
        let extra = max_keys_usize % count;
        let shards = (0..count)
            .map(|i| {
                Mutex::new(Shard {
                    map: HashMap::default(),
                    capacity: base + usize::from(i < extra),
                    ticks: 0,
                })
            })
            .collect();
        Self {
            hasher: RandomState::new(),
            shards,
            grace,
        }
    }

    /// The hash of a key, computed once for the shard and its map.
    fn hash(&self, key: &WindowKey, quota: &Quota) -> u64 {
        self.hasher.hash_one((key, quota))
    }

    fn shard(&self, hash: u64) -> &Mutex<Shard> {
        // Bits the shard's map uses least (it takes the lowest for the
        // bucket and the highest seven for its tags).
        let index = (hash >> 32) as usize & (self.shards.len() - 1);
        &self.shards[index]
    }
}

fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    // The algorithms never panic, so the lock is never poisoned; if it were,
    // the state is still consistent (every write is a single step).
    shard.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One shard: its keys and its share of `max_keys`.
struct Shard {
    map: HashMap<SlotKey, Entry, BuildHasherDefault<PassThrough>>,
    capacity: usize,
    /// Counts checks; an entry's `last_used` is the count at its last check.
    ticks: u64,
}

impl Shard {
    fn tick(&mut self) -> u64 {
        self.ticks += 1;
        self.ticks
    }

    fn drop_expired(&mut self, now: Instant) {
        self.map.retain(|_, entry| !entry.is_expired(now));
    }

    /// Back within capacity: expired entries first, then the least recently
    /// used eighth (at least one entry), never the most recent one.
    fn evict(&mut self, now: Instant) {
        self.drop_expired(now);
        if self.map.len() <= self.capacity {
            return;
        }
        let keep = (self.capacity - self.capacity / 8).max(1);
        let drop = self.map.len() - keep;
        let mut ticks: Vec<u64> = self.map.values().map(|e| e.last_used).collect();
        // Ticks are distinct, so exactly `drop` entries are at or below it.
        let (_, threshold, _) = ticks.select_nth_unstable(drop - 1);
        let threshold = *threshold;
        self.map.retain(|_, entry| entry.last_used > threshold);
    }
}

/// One window's identity: (tenant, subject) and quota, with its hash.
struct SlotKey {
    hash: u64,
    key: WindowKey,
    quota: Quota,
}

/// A [`SlotKey`] by reference, to look one up without cloning.
struct KeyRef<'a> {
    hash: u64,
    key: &'a WindowKey,
    quota: &'a Quota,
}

/// What a stored key and a looked-up one have in common; the maps compare
/// and hash keys through it (`Borrow<dyn AsKeyRef>`).
trait AsKeyRef {
    fn key_ref(&self) -> KeyRef<'_>;
}

impl AsKeyRef for SlotKey {
    fn key_ref(&self) -> KeyRef<'_> {
        KeyRef {
            hash: self.hash,
            key: &self.key,
            quota: &self.quota,
        }
    }
}

impl AsKeyRef for KeyRef<'_> {
    fn key_ref(&self) -> KeyRef<'_> {
        KeyRef {
            hash: self.hash,
            key: self.key,
            quota: self.quota,
        }
    }
}

impl<'a> Borrow<dyn AsKeyRef + 'a> for SlotKey {
    fn borrow(&self) -> &(dyn AsKeyRef + 'a) {
        self
    }
}

impl PartialEq for dyn AsKeyRef + '_ {
    fn eq(&self, other: &Self) -> bool {
        let (a, b) = (self.key_ref(), other.key_ref());
        a.hash == b.hash && a.key == b.key && a.quota == b.quota
    }
}

impl Eq for dyn AsKeyRef + '_ {}

impl Hash for dyn AsKeyRef + '_ {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.key_ref().hash);
    }
}

// The same equality and hash as through `dyn AsKeyRef`, as `Borrow` requires.
impl PartialEq for SlotKey {
    fn eq(&self, other: &Self) -> bool {
        (self as &dyn AsKeyRef) == (other as &dyn AsKeyRef)
    }
}

impl Eq for SlotKey {}

impl Hash for SlotKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

/// The shards' maps hash a [`SlotKey`] by its precomputed hash.
#[derive(Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used; stay correct for anything else.
        for &byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(byte);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// One key's state and when it expires in real time.
struct Entry {
    state: State,
    /// `None`: a TTL too long for an `Instant`, i.e. never.
    expires_at: Option<Instant>,
    last_used: u64,
}

impl Entry {
    fn is_expired(&self, now: Instant) -> bool {
        self.expires_at.is_some_and(|at| at <= now)
    }
}

/// Real-time expiry of a state written at `now` with `ttl_micros`.
fn expiry(now: Instant, ttl_micros: u64, grace: Duration) -> Option<Instant> {
    now.checked_add(Duration::from_micros(ttl_micros).saturating_add(grace))
}

/// Per-algorithm state of one key.
enum State {
    SlidingLog(sliding_log::State),
    SlidingCounter(sliding_counter::State),
    FixedWindow(fixed_window::State),
    Gcra(gcra::State),
}

impl State {
    fn empty(algorithm: Algorithm) -> Self {
        match algorithm {
            Algorithm::SlidingLog => Self::SlidingLog(Default::default()),
            Algorithm::SlidingCounter { .. } => Self::SlidingCounter(Default::default()),
            Algorithm::FixedWindow => Self::FixedWindow(Default::default()),
            Algorithm::Gcra => Self::Gcra(Default::default()),
        }
    }

    fn check(&mut self, quota: &Quota, now: u64, cost: u32) -> sliding_log::Outcome {
        // The key includes the quota (and so its algorithm), so
        // the state always matches; start afresh rather than panic if not.
        let matches = matches!(
            (&*self, quota.algorithm()),
            (Self::SlidingLog(_), Algorithm::SlidingLog)
                | (Self::SlidingCounter(_), Algorithm::SlidingCounter { .. })
                | (Self::FixedWindow(_), Algorithm::FixedWindow)
                | (Self::Gcra(_), Algorithm::Gcra)
        );
        if !matches {
            *self = Self::empty(quota.algorithm());
        }
        match self {
            Self::SlidingLog(s) => sliding_log::check(s, quota, now, cost),
            Self::SlidingCounter(s) => sliding_counter::check(s, quota, now, cost),
            Self::FixedWindow(s) => fixed_window::check(s, quota, now, cost),
            Self::Gcra(s) => gcra::check(s, quota, now, cost),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::ManualClock;
    use std::sync::atomic::{AtomicU64, Ordering};

    const T0: u64 = 1_700_000_000_000_000;

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    fn check(store: &MemoryStore, key: &WindowKey, quota: &Quota, cost: u32) -> Decision {
        block_on(store.check(CheckRequest::new(key, quota, cost))).unwrap()
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
        let quota: Quota = "1/1m".parse().unwrap();
        let err =
            block_on(store.check(CheckRequest::new(&WindowKey::global(), &quota, 0))).unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::InvalidRequest);
        assert_eq!(store.entry_count(), 0);
    }

    #[test]
    fn denial_on_an_empty_key_stores_nothing() {
        let store = MemoryStore::builder().clock(ManualClock::new(T0)).build();
        let quota: Quota = "1/1m".parse().unwrap();
        assert!(!check(&store, &WindowKey::global(), &quota, 2).allowed);
        store.run_pending_tasks();
        assert_eq!(store.entry_count(), 0);
        assert!(check(&store, &WindowKey::global(), &quota, 1).allowed);
        store.run_pending_tasks();
        assert_eq!(store.entry_count(), 1);
    }

    #[test]
    fn a_flood_of_keys_stays_within_max_keys() {
        let store = MemoryStore::builder()
            .clock(ManualClock::new(T0))
            .max_keys(1_000)
            .build();
        let quota: Quota = "10/1h".parse().unwrap();
        for i in 0..100_000u32 {
            let key = WindowKey::for_subject(i.to_be_bytes().to_vec());
            let decision = store.check_now(CheckRequest::new(&key, &quota, 1)).unwrap();
            assert!(decision.allowed);
        }
        store.run_pending_tasks();
        assert!(store.entry_count() <= 1_000, "{}", store.entry_count());
        assert!(store.entry_count() > 0);
    }

    #[test]
    fn a_key_in_use_survives_a_flood_of_other_keys() {
        let store = MemoryStore::builder()
            .clock(ManualClock::new(T0))
            .max_keys(64)
            .build();
        let quota: Quota = "1000/1h".parse().unwrap();
        let hot = WindowKey::for_subject("hot");
        for i in 0..10_000u32 {
            let key = WindowKey::for_subject(i.to_be_bytes().to_vec());
            assert!(
                store
                    .check_now(CheckRequest::new(&key, &quota, 1))
                    .unwrap()
                    .allowed
            );
            if i % 8 == 0 {
                store.check_now(CheckRequest::new(&hot, &quota, 1)).unwrap();
            }
        }
        assert!(store.entry_count() <= 64, "{}", store.entry_count());
        // Every check of the hot key was remembered: 1250 checks, 1000 admitted.
        let d = store.check_now(CheckRequest::new(&hot, &quota, 1)).unwrap();
        assert!(!d.allowed);
        assert_eq!(d.remaining, 0);
    }

    #[test]
    fn entries_expire_after_their_ttl() {
        // A 1 ms fixed window written at its last microsecond: TTL 1 µs, so
        // with no grace the entry is gone as soon as real time moves at all.
        let store = MemoryStore::builder()
            .clock(ManualClock::new(T0 + 999))
            .expiry_grace(Duration::ZERO)
            .build();
        let quota: Quota = "1/1ms fixed-window".parse().unwrap();
        let key = WindowKey::global();
        assert!(check(&store, &key, &quota, 1).allowed);
        // Not a timing assertion: waits (microseconds in practice) until it happens.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            store.run_pending_tasks();
            if store.entry_count() == 0 || Instant::now() >= deadline {
                break;
            }
            std::thread::yield_now();
        }
        assert_eq!(store.entry_count(), 0);
    }

    #[test]
    fn concurrent_checks_on_one_key_never_over_admit() {
        let store = MemoryStore::builder().clock(ManualClock::new(T0)).build();
        let quota: Quota = "100/1m".parse().unwrap();
        let admitted = AtomicU64::new(0);
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..100 {
                        let d = store
                            .check_now(CheckRequest::new(&WindowKey::global(), &quota, 1))
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
