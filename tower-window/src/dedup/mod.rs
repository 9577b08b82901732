//! [`DedupWindow`]: "have we seen this message id lately?", across a cluster.
//!
//! For clients that retry (a reconnecting WebSocket, an at-least-once
//! queue): [`first_seen`](DedupWindow::first_seen) is `true` the first time
//! a `(tenant, subject, id)` is asked about and `false` for a repeat within
//! the window. The store's dedup [`Backend`] answers (Redis `SET key 1 NX PX
//! window`, expiring on Redis's clock, or the embedded
//! [`MemoryStore`](crate::MemoryStore)) through the [`Store`]'s resilience
//! stack, with an explicit [`OnFailure`]; store calls are recorded as
//! `dedup`. Memory is bounded: long ids are refused
//! ([`max_id_len`](DedupWindowBuilder::max_id_len)) and the memory store
//! keeps at most [`max_dedup_ids`](crate::store::MemoryStoreBuilder::max_dedup_ids).
//!
//! ```
//! use std::time::Duration;
//! use tower_window::dedup::DedupWindow;
//! use tower_window::{Store, WindowKey};
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let store = Store::memory();
//! let dedup = DedupWindow::builder(store)
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

use crate::metrics::{Calls, LimiterMetrics};
/// What a dedup answer is while the store cannot.
pub use crate::store::guard::OnFailure;
use crate::store::{Guard, Op, Store, StoreError};

mod memory;
#[cfg(feature = "redis")]
mod redis;
use crate::{FallbackReason, WindowKey};

/// One dedup question for a dedup [`Backend`].
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct DedupRequest<'a> {
    /// Whose ids (tenant and subject).
    pub key: &'a WindowKey,
    /// The message id.
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
        let micros = crate::clock::duration_micros(self.window);
        micros.div_ceil(1_000).max(1)
    }
}

/// What a backend does for dedup windows, implemented by
/// [`MemoryStore`](crate::MemoryStore) and (feature `redis`)
/// [`RedisStore`](crate::RedisStore): answer atomically — of concurrent
/// callers asking about one `(key, id)`, only the first gets `true` until
/// the window has passed on the backend's clock.
pub trait Backend: Send + Sync + 'static {
    /// Records `request.id` for `request.key` if it is not already recorded
    /// within its window; `true` when it was not (first seen).
    fn first_seen<'a>(&'a self, guard: &mut Guard<'a>, request: DedupRequest<'a>) -> Op<'a, bool>;

    /// The failure domain of `key`'s dedup keys (see
    /// [`limit::Backend::failure_domain`](crate::limit::Backend::failure_domain)).
    fn failure_domain(&self, key: &WindowKey) -> Option<u16> {
        let _ = key;
        None
    }
}

/// Where a [`DedupDecision`] came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DedupSource {
    /// The store answered.
    Store,
    /// The [`OnFailure`] answered, for this reason.
    Fallback(FallbackReason),
}

/// The answer of [`DedupWindow::check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct DedupDecision {
    /// Whether the id is new within the window.
    pub first_seen: bool,
    /// Who answered.
    pub source: DedupSource,
}

/// Why a [`DedupWindow`] could not answer, or could not be built.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum DedupError {
    /// The id is empty.
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
    /// The store failed and the fallback is [`OnFailure::Error`].
    #[error(transparent)]
    Store(#[from] StoreError),
}

crate::error_debug::debug_as_display!(DedupError {
    EmptyId,
    IdTooLong,
    InvalidWindow,
    Store,
});

/// Remembers message ids for a window (see the [module docs](self)). Cheap to clone.
#[derive(Clone)]
pub struct DedupWindow {
    inner: Arc<Inner>,
}

/// What a [`DedupWindowBuilder`] sets.
#[derive(Debug, Clone, Copy)]
struct Settings {
    window: Duration,
    max_id_len: usize,
    fallback: OnFailure,
}

struct Inner {
    store: Store,
    /// `None`: the store has no dedup backend.
    backend: Option<Arc<dyn Backend>>,
    metrics: Arc<LimiterMetrics>,
    settings: Settings,
}

impl DedupWindow {
    /// The default window (2 minutes).
    pub const DEFAULT_WINDOW: Duration = Duration::from_secs(120);
    /// The default longest id accepted, in bytes.
    pub const DEFAULT_MAX_ID_LEN: usize = 256;
    /// The longest window accepted (7 days).
    pub const MAX_WINDOW: Duration = Duration::from_secs(7 * 24 * 3600);

    /// A builder for a window on `store`.
    pub fn builder(store: impl Into<Store>) -> DedupWindowBuilder {
        DedupWindowBuilder {
            store: store.into(),
            settings: Settings {
                window: Self::DEFAULT_WINDOW,
                max_id_len: Self::DEFAULT_MAX_ID_LEN,
                fallback: OnFailure::default(),
            },
        }
    }

    /// How long a seen id is remembered.
    pub fn window(&self) -> Duration {
        self.inner.settings.window
    }

    /// The longest id accepted, in bytes.
    pub fn max_id_len(&self) -> usize {
        self.inner.settings.max_id_len
    }

    /// Whether `id` is new for `key` within the window (and records it).
    pub async fn first_seen(&self, key: &WindowKey, id: &[u8]) -> Result<bool, DedupError> {
        Ok(self.check(key, id).await?.first_seen)
    }

    /// Like [`first_seen`](Self::first_seen), saying who answered.
    pub async fn check(&self, key: &WindowKey, id: &[u8]) -> Result<DedupDecision, DedupError> {
        let inner = &*self.inner;
        let settings = inner.settings;
        if id.is_empty() {
            return Err(DedupError::EmptyId);
        }
        if id.len() > settings.max_id_len {
            return Err(DedupError::IdTooLong {
                len: id.len(),
                max: settings.max_id_len,
            });
        }
        let request = DedupRequest::new(key, id, settings.window);
        let result = inner
            .store
            .call(
                inner.backend.as_deref(),
                "dedup windows",
                |backend| backend.failure_domain(key),
                Calls::to(&inner.metrics, None),
                |backend, guard| backend.first_seen(guard, request),
            )
            .await;
        let (first_seen, source) = match result {
            Ok(first_seen) => (first_seen, DedupSource::Store),
            Err(error) if settings.fallback == OnFailure::Error => {
                record("error");
                return Err(DedupError::Store(error));
            }
            Err(error) => {
                let reason = FallbackReason::for_error(&error);
                let first_seen = settings.fallback == OnFailure::FailOpen;
                (first_seen, DedupSource::Fallback(reason))
            }
        };
        record(match (source, first_seen) {
            (DedupSource::Store, true) => "first_seen",
            (DedupSource::Store, false) => "duplicate",
            (_, true) => "fallback_first_seen",
            (_, false) => "fallback_duplicate",
        });
        Ok(DedupDecision { first_seen, source })
    }
}

/// Counts one answer in `tower_window_dedup_checks_total`.
fn record(outcome: &'static str) {
    if crate::metrics::ENABLED {
        ::metrics::counter!(crate::metrics::DEDUP_CHECKS_TOTAL, "outcome" => outcome).increment(1);
    }
}

impl fmt::Debug for DedupWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DedupWindow")
            .field("settings", &self.inner.settings)
            .finish_non_exhaustive()
    }
}

/// Builds a [`DedupWindow`]; see [`DedupWindow::builder`].
#[derive(Debug)]
#[must_use]
pub struct DedupWindowBuilder {
    store: Store,
    settings: Settings,
}

impl DedupWindowBuilder {
    /// How long a seen id is remembered (default [`DedupWindow::DEFAULT_WINDOW`];
    /// 1 ms to [`DedupWindow::MAX_WINDOW`], rounded up to whole milliseconds).
    pub fn window(mut self, window: Duration) -> Self {
        self.settings.window = window;
        self
    }

    /// The longest id accepted, in bytes (default [`DedupWindow::DEFAULT_MAX_ID_LEN`]; at least 1).
    pub fn max_id_len(mut self, max: usize) -> Self {
        self.settings.max_id_len = max.max(1);
        self
    }

    /// What an unknown answer means (default [`OnFailure::FailOpen`]).
    pub fn on_store_failure(mut self, fallback: OnFailure) -> Self {
        self.settings.fallback = fallback;
        self
    }

    /// Checks the window and builds.
    pub fn build(self) -> Result<DedupWindow, DedupError> {
        let window = self.settings.window;
        if window < Duration::from_millis(1) || window > DedupWindow::MAX_WINDOW {
            return Err(DedupError::InvalidWindow);
        }
        Ok(DedupWindow {
            inner: Arc::new(Inner {
                backend: crate::store::plugged!(self.store, dyn Backend),
                store: self.store,
                metrics: LimiterMetrics::named("dedup"),
                settings: self.settings,
            }),
        })
    }
}

impl crate::store::Backend {
    /// With dedup windows.
    pub fn with_dedup(self, dedup: impl Backend) -> Self {
        self.with_part::<dyn Backend>(Arc::new(dedup))
    }
}
