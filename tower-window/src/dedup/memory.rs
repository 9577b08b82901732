//! [`dedup::Backend`] for [`MemoryStore`]: a bounded cache of id hashes.
//!
//! Each `(tenant, subject, id)` is hashed to 128 bits (two SipHash runs
//! keyed at random per store, so no input can aim at a collision) and kept
//! with the end of its window. A compare-and-swap on that deadline makes
//! exactly one concurrent caller the first. An evicted id reads as first
//! seen again: the bound errs towards delivering.

use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use quick_cache::sync::Cache;

use crate::dedup::{self, DedupRequest};
use crate::key::state_key::bounded_options;
use crate::store::{Guard, Op};
use crate::store::{MemoryStore, MemoryStoreBuilder};

/// The ids a memory store remembers.
pub(crate) struct DedupIds {
    ids: Cache<u128, Arc<AtomicU64>>,
    hasher: [std::collections::hash_map::RandomState; 2],
}

impl DedupIds {
    pub(crate) fn new(max_ids: u64) -> Self {
        Self {
            ids: Cache::with_options(
                bounded_options(max_ids.max(1)),
                quick_cache::UnitWeighter,
                quick_cache::DefaultHashBuilder::default(),
                quick_cache::sync::DefaultLifecycle::default(),
            ),
            hasher: Default::default(),
        }
    }

    pub(crate) fn len(&self) -> u64 {
        self.ids.len() as u64
    }

    fn hash(&self, request: &DedupRequest<'_>) -> u128 {
        let [a, b] = self.hasher.each_ref().map(|state| {
            let mut h = state.build_hasher();
            // Length-prefixed parts: no two triples hash the same input.
            request.key.tenant().hash(&mut h);
            request.key.subject().hash(&mut h);
            request.id.hash(&mut h);
            h.finish()
        });
        (u128::from(a) << 64) | u128::from(b)
    }

    fn first_seen(&self, request: &DedupRequest<'_>, now: u64) -> bool {
        let window = crate::clock::duration_micros(request.window);
        let until = now.saturating_add(window.max(1));
        let hash = self.hash(request);
        let new = || Ok::<_, std::convert::Infallible>(Arc::new(AtomicU64::new(0)));
        let Ok(deadline) = self.ids.get_or_insert_with(&hash, new);
        deadline
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |seen| {
                (seen <= now).then_some(until)
            })
            .is_ok()
    }
}

impl MemoryStore {
    /// The default of [`MemoryStoreBuilder::max_dedup_ids`].
    pub const DEFAULT_MAX_DEDUP_IDS: u64 = 100_000;

    /// The number of dedup ids held (expired ones included until evicted).
    pub fn dedup_len(&self) -> u64 {
        self.dedup_ids().len()
    }

    fn dedup_ids(&self) -> Arc<DedupIds> {
        self.part(|_| Arc::new(DedupIds::new(Self::DEFAULT_MAX_DEDUP_IDS)))
    }
}

impl MemoryStoreBuilder {
    /// The most message ids kept for
    /// [`DedupWindow`](crate::dedup::DedupWindow)s (default
    /// [`MemoryStore::DEFAULT_MAX_DEDUP_IDS`]; at least 1); beyond it ids
    /// are forgotten and read as first seen again.
    pub fn max_dedup_ids(mut self, max: u64) -> Self {
        self.parts.insert(Arc::new(DedupIds::new(max)));
        self
    }
}

impl dedup::Backend for MemoryStore {
    fn first_seen<'a>(&'a self, _: &mut Guard<'a>, request: DedupRequest<'a>) -> Op<'a, bool> {
        Op::ready(Ok(self
            .dedup_ids()
            .first_seen(&request, self.clock.now_micros())))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::WindowKey;

    #[test]
    fn the_id_cache_is_bounded() {
        let ids = DedupIds::new(256);
        let key = WindowKey::new("t", "u");
        for i in 0..10_000u32 {
            let id = i.to_be_bytes();
            assert!(ids.first_seen(&DedupRequest::new(&key, &id, Duration::from_secs(60)), 1));
        }
        assert!(ids.len() <= 512, "{} ids kept", ids.len());
        // The most recent id is still remembered.
        let last = 9_999u32.to_be_bytes();
        assert!(!ids.first_seen(&DedupRequest::new(&key, &last, Duration::from_secs(60)), 2));
    }
}
