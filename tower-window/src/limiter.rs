//! [`Limiter`]: the engine behind the layer, usable on its own.

use std::fmt;
use std::sync::Arc;

use crate::store::{CheckRequest, Store, StoreError};
use crate::{Decision, Quota, WindowKey};

/// Checks keys against a quota in a store.
///
/// Cheap to clone; all clones share one store and one configuration, so every
/// clone of a layer or service limits together.
///
/// ```
/// use tower_window::{Limiter, MemoryStore, Quota, WindowKey};
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let limiter = Limiter::new(MemoryStore::new(), "2/1m".parse::<Quota>()?);
/// let key = WindowKey::for_subject("alice");
/// assert!(limiter.check(&key, 1).await?.allowed);
/// assert!(limiter.check(&key, 1).await?.allowed);
/// let third = limiter.check(&key, 1).await?;
/// assert!(!third.allowed);
/// assert!(third.retry_after.is_some());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Clone)]
pub struct Limiter {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn Store>,
    quota: Quota,
}

impl Limiter {
    /// A limiter enforcing `quota` in `store`.
    pub fn new(store: impl Store, quota: Quota) -> Self {
        Self::from_shared_store(Arc::new(store), quota)
    }

    /// A limiter over a store shared with other limiters.
    pub fn from_shared_store(store: Arc<dyn Store>, quota: Quota) -> Self {
        Self {
            inner: Arc::new(Inner { store, quota }),
        }
    }

    /// The quota this limiter enforces.
    pub fn quota(&self) -> &Quota {
        &self.inner.quota
    }

    /// Checks `cost` units for `key` against the limiter's quota, and records
    /// them if admitted. A denial consumes nothing.
    pub async fn check(&self, key: &WindowKey, cost: u32) -> Result<Decision, LimitError> {
        self.check_quota(key, &self.inner.quota, cost).await
    }

    /// Like [`check`](Self::check), against another quota in the same store.
    pub async fn check_quota(
        &self,
        key: &WindowKey,
        quota: &Quota,
        cost: u32,
    ) -> Result<Decision, LimitError> {
        if cost == 0 {
            return Err(LimitError::ZeroCost);
        }
        let request = CheckRequest::new(key, quota, cost);
        Ok(self.inner.store.check(request).await?)
    }
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("quota", &self.inner.quota)
            .finish_non_exhaustive()
    }
}

/// Why a [`Limiter`] could not decide.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LimitError {
    /// A request must cost at least one unit.
    #[error("a request must cost at least 1 unit")]
    ZeroCost,
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}
