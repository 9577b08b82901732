//! [`DedupWindow`]: "have we seen this message id lately?", across a cluster.
//!
//! Clients that retry (a reconnecting WebSocket, an at-least-once queue)
//! send the same message twice. A [`DedupWindow`] remembers every
//! `(tenant, subject, id)` it was asked about for a fixed window on the
//! store's clock and answers [`first_seen`](DedupWindow::first_seen): `true`
//! the first time, `false` for a repeat inside the window, `true` again once
//! the window has passed.
//!
//! The answer comes from a [`DedupStore`]: Redis (`SET key 1 NX PX window`,
//! one round trip, expiry on Redis's own clock, so every node agrees) or the
//! embedded [`MemoryStore`](crate::MemoryStore). Both pass one conformance
//! suite. Every call goes through the [`Limiter`]'s resilience stack (its
//! breakers, in-flight bound, time budget and retries), so a store outage is
//! seen once, by one set of breakers, and never stalls a caller beyond the
//! limiter's time budget; what an unknown answer means is
//! [explicit](DedupFallback).
//!
//! Memory is bounded: ids longer than [`max_id_len`](DedupWindowBuilder::max_id_len)
//! are refused (a typed error), Redis keys hash long ids (SHA-256) and every
//! key carries the window as its TTL; the memory store keeps a bounded
//! number of 128-bit id hashes
//! ([`max_dedup_ids`](crate::store::MemoryStoreBuilder::max_dedup_ids)).
//!
//! ```
//! use std::time::Duration;
//! use tower_window::dedup::DedupWindow;
//! use tower_window::{Limiter, MemoryStore, Quota, WindowKey};
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let store = MemoryStore::new();
//! let limiter = Limiter::new(store.clone(), "100/1m".parse::<Quota>()?);
//! let dedup = DedupWindow::builder(limiter, store)
//!     .window(Duration::from_secs(120))
//!     .build()?;
//! let alice = WindowKey::new("acme", "alice");
//! assert!(dedup.first_seen(&alice, b"msg-1").await?);
//! assert!(!dedup.first_seen(&alice, b"msg-1").await?); // a repeat
//! assert!(dedup.first_seen(&WindowKey::new("acme", "bob"), b"msg-1").await?);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;

use crate::store::StoreError;
use crate::{FallbackReason, Limiter, WindowKey};

/// One dedup question for a [`DedupStore`].
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct DedupRequest<'a> {
    /// Whose ids (tenant and subject).
    pub key: &'a WindowKey,
    /// The message id (already checked for length by [`DedupWindow`]).
    pub id: &'a [u8],
    /// How long a seen id is remembered (at least 1 ms).
    pub window: Duration,
}

impl<'a> DedupRequest<'a> {
    /// Asks whether `id` of `key` is new within `window`.
    pub fn new(key: &'a WindowKey, id: &'a [u8], window: Duration) -> Self {
        Self { key, id, window }
    }

    /// The window in whole milliseconds, rounded up, at least 1.
    pub fn window_millis(&self) -> u64 {
        let micros = u64::try_from(self.window.as_micros()).unwrap_or(u64::MAX);
        micros.div_ceil(1_000).max(1)
    }
}

/// A store that can answer dedup questions atomically: the first of any
/// number of concurrent callers asking about one `(key, id)` gets `true`,
/// all others `false`, until the window has passed on the store's clock.
///
/// Implemented by [`MemoryStore`](crate::MemoryStore) and (feature `redis`)
/// [`RedisStore`](crate::RedisStore); a capability beside [`Store`](crate::Store)
/// rather than part of it, so stores that cannot dedup need not pretend.
pub trait DedupStore: Send + Sync + 'static {
    /// Records `request.id` for `request.key` if it is not already recorded
    /// within its window; `true` when it was not (first seen).
    fn first_seen<'a>(
        &'a self,
        request: DedupRequest<'a>,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// Answers at once, without awaiting, if this store decides in-process
    /// (see [`Store::check_sync`](crate::Store::check_sync)); `None` (the
    /// default) means "await [`first_seen`](Self::first_seen)".
    fn first_seen_sync(&self, request: DedupRequest<'_>) -> Option<Result<bool, StoreError>> {
        let _ = request;
        None
    }

    /// The failure domain (see [`Store::failure_domain`](crate::Store::failure_domain))
    /// of `key`'s dedup keys, for the limiter's per-domain breakers.
    fn dedup_failure_domain(&self, key: &WindowKey) -> Option<u16> {
        let _ = key;
        None
    }
}

impl<S: DedupStore + ?Sized> DedupStore for Arc<S> {
    fn first_seen<'a>(
        &'a self,
        request: DedupRequest<'a>,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        (**self).first_seen(request)
    }

    fn first_seen_sync(&self, request: DedupRequest<'_>) -> Option<Result<bool, StoreError>> {
        (**self).first_seen_sync(request)
    }

    fn dedup_failure_domain(&self, key: &WindowKey) -> Option<u16> {
        (**self).dedup_failure_domain(key)
    }
}

/// What an unknown answer (store down, breaker open, over budget) means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum DedupFallback {
    /// Treat the id as first seen: deliver it (at-least-once; a duplicate
    /// may get through during an outage). The default.
    #[default]
    FirstSeen,
    /// Treat the id as a duplicate: drop it (at-most-once; a new message
    /// may be lost during an outage).
    Duplicate,
    /// Return the error ([`DedupError::Store`]) and let the caller decide.
    Error,
}

/// Where a [`DedupDecision`] came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DedupSource {
    /// The store answered.
    Store,
    /// The store could not answer; the [`DedupFallback`] did.
    Fallback(FallbackReason),
}

/// The answer of [`DedupWindow::check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct DedupDecision {
    /// Whether the id is new within the window (deliver it).
    pub first_seen: bool,
    /// Who answered.
    pub source: DedupSource,
}

/// Why a [`DedupWindow`] could not answer, or could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DedupError {
    /// An empty id cannot name a message.
    #[error("an empty message id")]
    EmptyId,
    /// The id is longer than the window accepts.
    #[error("message id of {len} bytes is longer than {max}")]
    IdTooLong {
        /// The id's length.
        len: usize,
        /// The most the window accepts.
        max: usize,
    },
    /// The window must be between 1 ms and [`DedupWindow::MAX_WINDOW`].
    #[error("a dedup window must be between 1ms and 7 days")]
    InvalidWindow,
    /// The store failed and the fallback is [`DedupFallback::Error`].
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Remembers message ids for a window, cluster-wide; see the
/// [module docs](self).
///
/// Cheap to clone; clones share one configuration.
#[derive(Clone)]
pub struct DedupWindow {
    inner: Arc<Inner>,
}

struct Inner {
    limiter: Limiter,
    store: Arc<dyn DedupStore>,
    window: Duration,
    max_id_len: usize,
    fallback: DedupFallback,
}

impl DedupWindow {
    /// The default window (2 minutes).
    pub const DEFAULT_WINDOW: Duration = Duration::from_secs(120);
    /// The default longest id accepted, in bytes.
    pub const DEFAULT_MAX_ID_LEN: usize = 256;
    /// The longest window accepted (7 days).
    pub const MAX_WINDOW: Duration = Duration::from_secs(7 * 24 * 3600);

    /// A builder for a window answered by `store`, whose calls run through
    /// `limiter`'s resilience stack (pass the limiter that uses the same
    /// store, so one set of breakers describes that store).
    pub fn builder(limiter: Limiter, store: impl DedupStore) -> DedupWindowBuilder {
        DedupWindowBuilder {
            limiter,
            store: Arc::new(store),
            window: Self::DEFAULT_WINDOW,
            max_id_len: Self::DEFAULT_MAX_ID_LEN,
            fallback: DedupFallback::default(),
        }
    }

    /// How long a seen id is remembered.
    pub fn window(&self) -> Duration {
        self.inner.window
    }

    /// The longest id accepted, in bytes.
    pub fn max_id_len(&self) -> usize {
        self.inner.max_id_len
    }

    /// Whether `id` is new for `key` within the window (and records it).
    /// A store failure answers per the [`DedupFallback`].
    pub async fn first_seen(&self, key: &WindowKey, id: &[u8]) -> Result<bool, DedupError> {
        Ok(self.check(key, id).await?.first_seen)
    }

    /// Like [`first_seen`](Self::first_seen), saying who answered.
    pub async fn check(&self, key: &WindowKey, id: &[u8]) -> Result<DedupDecision, DedupError> {
        let inner = &*self.inner;
        if id.is_empty() {
            return Err(DedupError::EmptyId);
        }
        if id.len() > inner.max_id_len {
            return Err(DedupError::IdTooLong {
                len: id.len(),
                max: inner.max_id_len,
            });
        }
        let request = DedupRequest::new(key, id, inner.window);
        let store = &*inner.store;
        let domain = store.dedup_failure_domain(key);
        let result = inner
            .limiter
            .run(
                domain,
                inner.limiter.policy(),
                || store.first_seen_sync(request),
                move || store.first_seen(request),
            )
            .await;
        match result {
            Ok(first_seen) => {
                crate::metrics::dedup_outcome(if first_seen {
                    "first_seen"
                } else {
                    "duplicate"
                });
                Ok(DedupDecision {
                    first_seen,
                    source: DedupSource::Store,
                })
            }
            Err(failure) => {
                let reason = failure.reason;
                let first_seen = match inner.fallback {
                    DedupFallback::FirstSeen => true,
                    DedupFallback::Duplicate => false,
                    DedupFallback::Error => {
                        crate::metrics::dedup_outcome("error");
                        return Err(DedupError::Store(failure.into_error()));
                    }
                };
                crate::metrics::dedup_outcome(if first_seen {
                    "fallback_first_seen"
                } else {
                    "fallback_duplicate"
                });
                Ok(DedupDecision {
                    first_seen,
                    source: DedupSource::Fallback(reason),
                })
            }
        }
    }
}

impl fmt::Debug for DedupWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DedupWindow")
            .field("window", &self.inner.window)
            .field("max_id_len", &self.inner.max_id_len)
            .field("fallback", &self.inner.fallback)
            .finish_non_exhaustive()
    }
}

/// Builds a [`DedupWindow`]; see [`DedupWindow::builder`].
#[must_use]
pub struct DedupWindowBuilder {
    limiter: Limiter,
    store: Arc<dyn DedupStore>,
    window: Duration,
    max_id_len: usize,
    fallback: DedupFallback,
}

impl fmt::Debug for DedupWindowBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DedupWindowBuilder")
            .field("window", &self.window)
            .field("max_id_len", &self.max_id_len)
            .field("fallback", &self.fallback)
            .finish_non_exhaustive()
    }
}

impl DedupWindowBuilder {
    /// How long a seen id is remembered (default
    /// [`DedupWindow::DEFAULT_WINDOW`], 2 minutes; 1 ms to 7 days, in whole
    /// milliseconds rounded up).
    pub fn window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// The longest id accepted, in bytes (default
    /// [`DedupWindow::DEFAULT_MAX_ID_LEN`]; at least 1). Longer ids are a
    /// [`DedupError::IdTooLong`].
    pub fn max_id_len(mut self, max: usize) -> Self {
        self.max_id_len = max.max(1);
        self
    }

    /// What an unknown answer means (default [`DedupFallback::FirstSeen`]).
    pub fn on_store_failure(mut self, fallback: DedupFallback) -> Self {
        self.fallback = fallback;
        self
    }

    /// Checks the window and builds.
    pub fn build(self) -> Result<DedupWindow, DedupError> {
        if self.window < Duration::from_millis(1) || self.window > DedupWindow::MAX_WINDOW {
            return Err(DedupError::InvalidWindow);
        }
        Ok(DedupWindow {
            inner: Arc::new(Inner {
                limiter: self.limiter,
                store: self.store,
                window: self.window,
                max_id_len: self.max_id_len,
                fallback: self.fallback,
            }),
        })
    }
}
