//! The embedded store (placeholder until the memory store lands).

use futures_util::future::BoxFuture;

use super::{CheckRequest, Store, StoreError, StoreErrorKind};
use crate::Decision;

/// Embedded single-process store.
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {}

/// Builds a [`MemoryStore`].
#[derive(Debug, Default)]
pub struct MemoryStoreBuilder {}

impl MemoryStore {
    /// A store with default settings.
    pub fn new() -> Self {
        Self {}
    }
}

impl Store for MemoryStore {
    fn check<'a>(
        &'a self,
        _request: CheckRequest<'a>,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        Box::pin(async { Err(StoreError::new(StoreErrorKind::Protocol, "placeholder")) })
    }
}
