//! [`StateKey`]: a window's identity (tenant, subject, quota id) as a cache
//! key. [`StateKeyRef`] borrows the same parts and hashes and compares
//! alike, so a cache hit copies nothing; only an insert builds the owned key.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use quick_cache::{Equivalent, Options, OptionsBuilder};

use super::InlineBytes;
use crate::quota::Scope;
use crate::{Policy, Quota, WindowKey};

/// A window's identity, owned: what a cache stores.
///
/// The tenant's and subject's bytes are copied in, inline when they fit
/// [`INLINE_KEY_BYTES`]: a lookup then reads only the cache's entry, and a
/// stored key never keeps a request's buffer alive.
#[derive(Clone)]
pub(crate) struct StateKey {
    quota: Arc<str>,
    /// `quota`'s hash, computed once per quota (see [`id_hash`]).
    quota_hash: u64,
    /// The tenant's bytes followed by the subject's.
    bytes: InlineBytes<INLINE_KEY_BYTES>,
    /// Where the tenant's bytes end in `bytes`.
    tenant_len: u32,
}

/// The most bytes of tenant and subject a [`StateKey`] holds inline.
pub(crate) const INLINE_KEY_BYTES: usize = 38;

impl StateKey {
    /// See [`StateKeyRef::new`].
    pub(crate) fn new(key: &WindowKey, quota: &Quota) -> Self {
        StateKeyRef::new(key, quota).owned()
    }

    /// See [`StateKeyRef::for_policy`].
    pub(crate) fn for_policy(key: &WindowKey, policy: &Policy) -> Self {
        StateKeyRef::for_policy(key, policy).owned()
    }

    fn borrowed(&self) -> StateKeyRef<'_> {
        let bytes = self.bytes.as_slice();
        let (tenant, subject) = bytes.split_at(bytes.len().min(self.tenant_len as usize));
        StateKeyRef {
            tenant,
            subject,
            quota: &self.quota,
            quota_hash: self.quota_hash,
        }
    }
}

/// The same identity, borrowed: what a lookup uses.
#[derive(Clone, Copy)]
pub(crate) struct StateKeyRef<'a> {
    tenant: &'a [u8],
    subject: &'a [u8],
    quota: &'a Arc<str>,
    quota_hash: u64,
}

impl<'a> StateKeyRef<'a> {
    /// The key of `key`'s state under `quota`'s [state id](Quota::state_id)
    /// (without the subject for a tenant-scoped quota).
    pub(crate) fn new(key: &'a WindowKey, quota: &'a Quota) -> Self {
        Self {
            tenant: key.tenant(),
            subject: match quota.scope() {
                Scope::Subject => key.subject(),
                Scope::Tenant => &[],
            },
            quota: quota.shared_state_id(),
            quota_hash: quota.state_id_hash(),
        }
    }

    /// The key of `key` under a whole policy.
    pub(crate) fn for_policy(key: &'a WindowKey, policy: &'a Policy) -> Self {
        Self {
            tenant: key.tenant(),
            subject: key.subject(),
            quota: policy.shared_id(),
            quota_hash: policy.id_hash(),
        }
    }

    fn owned(self) -> StateKey {
        StateKey {
            quota: Arc::clone(self.quota),
            quota_hash: self.quota_hash,
            bytes: InlineBytes::copy_of(&[self.tenant, self.subject]),
            // A tenant is at most a WindowKey part: far below 4 GiB.
            tenant_len: u32::try_from(self.tenant.len()).unwrap_or(u32::MAX),
        }
    }
}

impl Hash for StateKeyRef<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // The id's precomputed hash, not its text; the cache's seeded
        // hasher still mixes everything.
        state.write_u64(self.quota_hash);
        self.tenant.hash(state);
        self.subject.hash(state);
    }
}

/// A quota's or policy's id hashed with a fixed hasher, once when built.
pub(crate) fn id_hash(id: &str) -> u64 {
    use std::hash::BuildHasher;
    std::hash::BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default()
        .hash_one(id)
}

// `StateKey` hashes and compares as its `StateKeyRef`, as `Equivalent`
// requires.
impl Hash for StateKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.borrowed().hash(state);
    }
}

impl PartialEq for StateKey {
    fn eq(&self, other: &Self) -> bool {
        self.borrowed().equivalent(other)
    }
}

impl Eq for StateKey {}

impl Equivalent<StateKey> for StateKeyRef<'_> {
    // Ordered to reject a different key soonest (lengths before bytes), and
    // the shared id's pointer before its text: this runs on every lookup.
    fn equivalent(&self, key: &StateKey) -> bool {
        let bytes = key.bytes.as_slice();
        let tenant = self.tenant.len();
        self.quota_hash == key.quota_hash
            && key.tenant_len as usize == tenant
            && bytes.len() == tenant + self.subject.len()
            && bytes.get(tenant..) == Some(self.subject)
            && bytes.get(..tenant) == Some(self.tenant)
            && (Arc::ptr_eq(self.quota, &key.quota) || *self.quota == key.quota)
    }
}

/// Cache options for at most `max` entries, in shards of at least 32
/// (quick_cache rounds each shard's capacity up).
pub(crate) fn bounded_options(max: u64) -> Options {
    let max = max.max(1);
    let parallelism = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut shards = (parallelism * 4).next_power_of_two() as u64;
    while shards > 1 && max / shards < 32 {
        shards /= 2;
    }
    let capacity = (max / shards).max(1) * shards;
    let mut options = OptionsBuilder::new();
    options
        .shards(usize::try_from(shards).unwrap_or(1))
        .estimated_items_capacity(usize::try_from(capacity).unwrap_or(usize::MAX))
        .weight_capacity(capacity);
    // Every field is set and in range: building cannot fail.
    options.build().unwrap_or_else(|_| unreachable!())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::hash::BuildHasher;

    use super::*;

    #[test]
    fn owned_and_borrowed_keys_hash_and_compare_alike() {
        let hasher = std::collections::hash_map::RandomState::new();
        let quota: Quota = "10/s".parse().unwrap();
        let other_quota: Quota = "10/s".parse::<Quota>().unwrap().named("other").unwrap();
        let key = WindowKey::new("acme", "alice");
        let owned = StateKey::new(&key, &quota);
        let borrowed = StateKeyRef::new(&key, &quota);
        assert!(borrowed.equivalent(&owned));
        assert_eq!(hasher.hash_one(&owned), hasher.hash_one(borrowed));
        let long = WindowKey::new("acme", "a-subject-longer-than-what-fits-inline");
        let long_owned = StateKey::new(&long, &quota);
        assert!(matches!(long_owned.bytes, InlineBytes::Shared(_)));
        assert!(matches!(owned.bytes, InlineBytes::Inline { .. }));
        assert!(StateKeyRef::new(&long, &quota).equivalent(&long_owned));
        assert_eq!(
            hasher.hash_one(&long_owned),
            hasher.hash_one(StateKeyRef::new(&long, &quota))
        );
        for (k, q) in [
            (WindowKey::new("acme", "bob"), &quota),
            (WindowKey::new("acm", "ealice"), &quota),
            (WindowKey::new("acmealice", ""), &quota),
            (key.clone(), &other_quota),
        ] {
            assert!(!StateKeyRef::new(&k, q).equivalent(&owned));
        }
    }

    #[test]
    fn a_cache_finds_owned_keys_by_borrowed_ones() {
        let cache: quick_cache::sync::Cache<StateKey, u32> = quick_cache::sync::Cache::new(10);
        let quota: Quota = "10/s".parse().unwrap();
        let key = WindowKey::new("acme", "alice");
        cache.insert(StateKey::new(&key, &quota), 7);
        assert_eq!(cache.get(&StateKeyRef::new(&key, &quota)), Some(7));
        let bob = WindowKey::new("acme", "bob");
        assert_eq!(cache.get(&StateKeyRef::new(&bob, &quota)), None);
        cache.remove(&StateKeyRef::new(&key, &quota));
        assert_eq!(cache.get(&StateKeyRef::new(&key, &quota)), None);
    }
}
