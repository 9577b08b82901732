//! [`StateKey`]: a window's identity (tenant, subject, quota id) as a cache
//! key that can be looked up without cloning the request's key.
//!
//! moka's `get` and `invalidate` accept any `Q` the cache's keys
//! [`Borrow`] as. Hashing and comparing owned keys and borrowed ones alike
//! through `dyn StateKeyParts` lets a lookup borrow a [`WindowKey`] and a
//! [`Quota`]: a hit on the hot path copies nothing and bumps no reference
//! count (cloning a `WindowKey` built from a header value would allocate
//! to share its buffer).

use std::borrow::Borrow;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use bytes::Bytes;

use crate::quota::Scope;
use crate::{Policy, Quota, WindowKey};

/// A window's identity, owned: what a cache stores.
pub(crate) struct StateKey {
    tenant: Bytes,
    subject: Bytes,
    quota: Arc<str>,
}

impl StateKey {
    /// The owned key of `key`'s state under `quota` (refcount bumps, no
    /// copies): by the quota's [state id](Quota::state_id), so a changed
    /// limit finds the same state, and without the subject for a
    /// tenant-scoped quota (whose state id says so).
    pub(crate) fn new(key: &WindowKey, quota: &Quota) -> Self {
        let (tenant, subject) = key.shared_parts();
        Self {
            tenant: tenant.clone(),
            subject: match quota.scope() {
                Scope::Subject => subject.clone(),
                Scope::Tenant => Bytes::new(),
            },
            quota: quota.shared_state_id(),
        }
    }

    /// The owned key of `key` under a whole policy (the local tier's).
    pub(crate) fn for_policy(key: &WindowKey, policy: &Policy) -> Self {
        let (tenant, subject) = key.shared_parts();
        Self {
            tenant: tenant.clone(),
            subject: subject.clone(),
            quota: policy.shared_id(),
        }
    }
}

/// The same identity, borrowed from a check: what a lookup uses.
pub(crate) struct StateKeyRef<'a> {
    tenant: &'a [u8],
    subject: &'a [u8],
    quota: &'a str,
}

impl<'a> StateKeyRef<'a> {
    /// The borrowed key of `key`'s state under `quota` (see [`StateKey::new`]).
    pub(crate) fn new(key: &'a WindowKey, quota: &'a Quota) -> Self {
        Self {
            tenant: key.tenant(),
            subject: match quota.scope() {
                Scope::Subject => key.subject(),
                Scope::Tenant => &[],
            },
            quota: quota.state_id(),
        }
    }

    /// The borrowed key of `key` under a whole policy.
    pub(crate) fn for_policy(key: &'a WindowKey, policy: &'a Policy) -> Self {
        Self {
            tenant: key.tenant(),
            subject: key.subject(),
            quota: policy.id(),
        }
    }

    /// The form a cache of [`StateKey`]s looks up by.
    pub(crate) fn as_lookup(&self) -> &(dyn StateKeyParts + 'a) {
        self
    }
}

/// A key as its three parts, owned or borrowed.
pub(crate) trait StateKeyParts {
    /// Tenant, subject and quota id.
    fn parts(&self) -> (&[u8], &[u8], &str);
}

impl StateKeyParts for StateKey {
    fn parts(&self) -> (&[u8], &[u8], &str) {
        (&self.tenant, &self.subject, &self.quota)
    }
}

impl StateKeyParts for StateKeyRef<'_> {
    fn parts(&self) -> (&[u8], &[u8], &str) {
        (self.tenant, self.subject, self.quota)
    }
}

impl<'a> Borrow<dyn StateKeyParts + 'a> for StateKey {
    fn borrow(&self) -> &(dyn StateKeyParts + 'a) {
        self
    }
}

// `StateKey` and `dyn StateKeyParts` hash and compare alike, as `Borrow`
// requires: both through `parts`.
impl Hash for dyn StateKeyParts + '_ {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.parts().hash(state);
    }
}

impl PartialEq for dyn StateKeyParts + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.parts() == other.parts()
    }
}

impl Eq for dyn StateKeyParts + '_ {}

impl Hash for StateKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.parts().hash(state);
    }
}

impl PartialEq for StateKey {
    fn eq(&self, other: &Self) -> bool {
        self.parts() == other.parts()
    }
}

impl Eq for StateKey {}

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
        let owned_view: &dyn StateKeyParts = owned.borrow();
        assert!(owned_view == borrowed.as_lookup());
        assert_eq!(
            hasher.hash_one(&owned),
            hasher.hash_one(borrowed.as_lookup())
        );
        for (k, q) in [
            (WindowKey::new("acme", "bob"), &quota),
            (WindowKey::new("acmealice", ""), &quota),
            (key.clone(), &other_quota),
        ] {
            let different = StateKeyRef::new(&k, q);
            assert!(owned_view != different.as_lookup());
        }
    }

    #[test]
    fn a_cache_finds_owned_keys_by_borrowed_ones() {
        let cache: moka::sync::Cache<StateKey, u32> = moka::sync::Cache::new(10);
        let quota: Quota = "10/s".parse().unwrap();
        let key = WindowKey::new("acme", "alice");
        cache.insert(StateKey::new(&key, &quota), 7);
        assert_eq!(
            cache.get(StateKeyRef::new(&key, &quota).as_lookup()),
            Some(7)
        );
        let bob = WindowKey::new("acme", "bob");
        assert_eq!(cache.get(StateKeyRef::new(&bob, &quota).as_lookup()), None);
        cache.invalidate(StateKeyRef::new(&key, &quota).as_lookup());
        assert_eq!(cache.get(StateKeyRef::new(&key, &quota).as_lookup()), None);
    }
}
