//! [`MemoryStore`]: the embedded, single-process store.
//!
//! One entry per (key, quota) window in a bounded, sharded [quick_cache]
//! cache, each behind its own lock. A policy's check locks every quota's
//! entry in one global order (`locked`), so it is atomic per policy and
//! overlapping policies cannot deadlock. Expiry is inside the values: a
//! window that has passed reads as empty, so entries need no timers.
//!
//! [quick_cache]: https://docs.rs/quick_cache

mod locked;

pub(crate) use locked::{decided, Locked};

use std::convert::Infallible;
use std::fmt;
use std::sync::{Arc, Mutex, TryLockError};
use std::time::Duration;

use quick_cache::sync::Cache;
use quick_cache::{DefaultHashBuilder, Lifecycle, UnitWeighter};

use smallvec::SmallVec;

use crate::algorithm::State;
use crate::key::state_key::{bounded_options, StateKey, StateKeyRef};
use crate::store::Parts;
use crate::sync::lock;
use crate::{Clock, MonotonicClock, Quota, WindowKey};

pub(crate) type SlotCache =
    Cache<StateKey, Arc<Slot>, UnitWeighter, DefaultHashBuilder, MarkEvicted>;

/// How often a check looks a key up again after finding the entry it
/// locked evicted; past this it decides on the entry it holds (its
/// admission is then part of what the eviction forgot).
pub(crate) const MAX_EVICTED_RETRIES: usize = 8;

/// The embedded store: bounded, in-process, atomic per policy.
///
/// At most [`max_keys`](MemoryStoreBuilder::max_keys) keys are kept; past
/// that the cache evicts by S3-FIFO (keys seen once go before keys seen
/// repeatedly). Eviction forgets a key's window, so the key may be admitted
/// up to its limit again within that window, never more: size `max_keys`
/// for the keys active within one window and only idle keys are forgotten.
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
/// assert!(limiter.check(&key, 1).await?.allowed());
/// assert!(!limiter.check(&key, 1).await?.allowed());
/// clock.advance(Duration::from_secs(60));
/// assert!(limiter.check(&key, 1).await?.allowed());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Clone)]
pub struct MemoryStore {
    pub(crate) cache: Arc<SlotCache>,
    pub(crate) clock: Arc<dyn Clock>,
    max_keys: u64,
    grace_micros: u64,
    /// Each capability's embedded state, made on first use.
    parts: Arc<Parts>,
}

impl MemoryStore {
    /// The default bound on the number of keys kept.
    pub const DEFAULT_MAX_KEYS: u64 = 100_000;

    /// The default [`expiry_grace`](MemoryStoreBuilder::expiry_grace).
    pub const DEFAULT_EXPIRY_GRACE: Duration = Duration::from_secs(1);

    /// A store with default settings.
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

    /// The number of keys held, idle ones included until capacity pressure
    /// or [`run_pending_tasks`](Self::run_pending_tasks) drops them.
    pub fn entry_count(&self) -> u64 {
        self.cache.len() as u64
    }

    /// Drops every entry idle for longer than its quota's
    /// [longest state lifetime](Quota::max_state_lifetime) plus the
    /// [grace](MemoryStoreBuilder::expiry_grace), except those being
    /// checked. Never needed for correctness or the memory bound; it walks
    /// the whole cache, so it is for tests and diagnostics.
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

    /// A capability's embedded state of type `T`, made on first use.
    pub(crate) fn part<T: Clone + Send + Sync + 'static>(
        &self,
        make: impl FnOnce(&Self) -> T,
    ) -> T {
        self.parts.get_or_insert_with(|| make(self))
    }

    /// The slot of `key`'s state under `quota` (looked up by borrowed
    /// parts; a new key's concurrent checks all get the same slot).
    pub(crate) fn slot(&self, key: &WindowKey, quota: &Quota) -> Arc<Slot> {
        if let Some(slot) = self.cache.get(&StateKeyRef::new(key, quota)) {
            return slot;
        }
        let owned = StateKey::new(key, quota);
        self.cache
            .get_or_insert_with(&owned, || Ok::<_, Infallible>(Arc::new(Slot::new(quota))))
            .unwrap_or_else(|never| match never {})
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
    /// Capabilities' state set up by their builder methods.
    pub(crate) parts: Parts,
}

impl Default for MemoryStoreBuilder {
    fn default() -> Self {
        Self {
            clock: Arc::new(MonotonicClock),
            max_keys: MemoryStore::DEFAULT_MAX_KEYS,
            expiry_grace: MemoryStore::DEFAULT_EXPIRY_GRACE,
            parts: Parts::default(),
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
    /// The time source of all decisions (default [`MonotonicClock`];
    /// [`SystemClock`](crate::SystemClock) follows wall-clock adjustments).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The most (tenant, subject, quota) keys kept (default
    /// [`MemoryStore::DEFAULT_MAX_KEYS`]; at least 1). Each shard of the
    /// cache is bounded to its share, so a key may be evicted while the
    /// store holds somewhat fewer.
    pub fn max_keys(mut self, max_keys: u64) -> Self {
        self.max_keys = max_keys.max(1);
        self
    }

    /// How long past its quota's longest state lifetime an idle entry is
    /// kept by [`MemoryStore::run_pending_tasks`] (default
    /// [`MemoryStore::DEFAULT_EXPIRY_GRACE`]). Decisions never depend on it.
    pub fn expiry_grace(mut self, grace: Duration) -> Self {
        self.expiry_grace = grace;
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
            grace_micros: crate::clock::duration_micros(self.expiry_grace),
            parts: Arc::new(self.parts),
        }
    }
}

/// One key's state.
pub(crate) struct Slot {
    /// Locked for the duration of one check.
    pub(crate) inner: Mutex<SlotInner>,
    /// [`Quota::max_state_lifetime`] in µs.
    pub(crate) lifetime_micros: u64,
}

pub(crate) struct SlotInner {
    pub(crate) state: State,
    pub(crate) last_check: u64,
    /// Set once the cache dropped the slot: a check that then gets the
    /// lock looks the key up again.
    pub(crate) evicted: bool,
    /// What a capability keeps beside the window (quota leases).
    pub(crate) extra: Option<Box<dyn std::any::Any + Send>>,
}

impl Slot {
    pub(crate) fn new(quota: &Quota) -> Self {
        Self {
            inner: Mutex::new(SlotInner {
                state: State::empty(quota.algorithm()),
                last_check: 0,
                evicted: false,
                extra: None,
            }),
            lifetime_micros: crate::clock::duration_micros(quota.max_state_lifetime()),
        }
    }
}

/// Marks slots the cache evicts once its shard lock is released, so no
/// one waits for a slot's lock under a shard's.
#[derive(Clone, Copy, Default)]
pub(crate) struct MarkEvicted;

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
    use super::*;

    /// One key of a store of many costs two cache lines of its own: the
    /// cache's entry (key inline) and the slot (lock, state inline), so a
    /// check of a key not checked lately waits for two misses, not four.
    #[test]
    fn a_key_and_its_state_fit_in_two_cache_lines() {
        // The slot behind its `Arc` (two reference counts).
        let slot = std::mem::size_of::<Slot>() + 16;
        let key = std::mem::size_of::<StateKey>();
        assert!(slot <= 128, "slot: {slot} bytes");
        assert!(key <= 72, "key: {key} bytes");
        // Small states of every algorithm are inline in the slot.
        for dsl in [
            "3/1m",
            "3/1m sliding-counter(20s)",
            "3/1m fixed-window",
            "3/1m gcra",
        ] {
            let quota: Quota = dsl.parse().unwrap_or_else(|_| unreachable!());
            let slot = Slot::new(&quota);
            let mut inner = lock(&slot.inner);
            for at in [0, 30_000_000] {
                let now = 1_700_000_000_000_000 + at;
                assert!(inner.state.evaluate(&quota, now, 1).fits());
                inner.state.commit(&quota, now, 1);
            }
            assert!(inner.state.is_inline(), "{dsl}");
        }
    }
}
