//! [`EventWindow`]: event windows on a store, through its resilience stack.

use std::fmt;
use std::sync::Arc;

use super::id::Position;
use super::store::{Appended, Backend, Event, EventRequest, Resume, Retention};
use crate::metrics::{Calls, LimiterMetrics};
use crate::store::{Guard, Op, Store, StoreError};

/// The most fields one event may have.
pub const MAX_FIELDS: usize = 32;
/// The longest field name, in bytes.
pub const MAX_FIELD_NAME: usize = 64;
/// The largest page [`EventWindow::since`] reads at once.
pub const MAX_PAGE: u32 = 10_000;
/// The most events one [`EventWindow::append_many`] appends.
pub const MAX_BATCH: usize = 64;

/// An append-only, time-bounded log of events per key, with epochs (see
/// the [module](super)). Every operation is one store call through the
/// [`Store`]'s resilience stack, recorded under the name `events`. Cheap
/// to clone.
///
/// ```
/// use std::time::Duration;
/// use tower_window::events::{EventWindow, Resume, Retention};
/// use tower_window::Store;
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let events = EventWindow::new(Store::memory(), Retention::new(Duration::from_secs(600), 1000)?);
///
/// let start = events.position("room-1").await?; // a reader joins
/// let first = events.append("room-1", &[("data", b"hello".as_slice())]).await?;
/// events.append("room-1", &[("data", b"world".as_slice())]).await?;
/// match events.resume("room-1", &start, 100).await? {
///     Resume::Recovered(missed) => {
///         assert_eq!(missed.len(), 2);
///         assert_eq!(missed[0].id, first.id);
///         assert_eq!(missed[1].field("data").map(|v| &v[..]), Some(&b"world"[..]));
///     }
///     Resume::Resync(reason) => unreachable!("{reason}"),
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Clone)]
pub struct EventWindow {
    inner: Arc<Inner>,
}

struct Inner {
    store: Store,
    /// `None`: the store has no events backend.
    backend: Option<Arc<dyn Backend>>,
    retention: Retention,
    metrics: Arc<LimiterMetrics>,
}

impl EventWindow {
    /// Event windows in `store`, keeping what `retention` says.
    pub fn new(store: impl Into<Store>, retention: Retention) -> Self {
        let store = store.into();
        let inner = Inner {
            backend: crate::store::plugged!(store, dyn Backend),
            store,
            retention,
            metrics: LimiterMetrics::named("events"),
        };
        Self {
            inner: Arc::new(inner),
        }
    }

    /// Live [`EventWakeups`](crate::events::EventWakeups) of these windows.
    pub fn wakeups(&self) -> Result<crate::events::EventWakeups, StoreError> {
        let backend = self.inner.backend.clone();
        backend
            .ok_or_else(|| StoreError::unsupported("event wake-ups"))?
            .wakeups()
    }

    /// Live reads of these windows: an [`EventTail`](crate::events::EventTail).
    #[cfg(feature = "redis")]
    pub fn tail(&self) -> Result<crate::events::EventTail, StoreError> {
        let redis = self.inner.store.backend(|native| match native {
            crate::store::Native::Redis(redis) => Some(Arc::clone(redis)),
            _ => None,
        });
        redis
            .ok_or_else(|| StoreError::unsupported("tailed event reads"))?
            .event_tail()
    }

    /// The store the windows live in.
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// What the windows keep.
    pub fn retention(&self) -> Retention {
        self.inner.retention
    }

    /// Appends an event with `fields` (1 to [`MAX_FIELDS`], names of 1 to
    /// [`MAX_FIELD_NAME`] bytes) to the window `key`.
    pub async fn append(
        &self,
        key: impl AsRef<[u8]>,
        fields: &[(&str, &[u8])],
    ) -> Result<Appended, StoreError> {
        check_fields(fields)?;
        self.run(key.as_ref(), |backend, guard, request| {
            backend.append(guard, request, fields)
        })
        .await
    }

    /// Appends `events` (1 to [`MAX_BATCH`], each as [`append`](Self::append)
    /// takes it) to the window `key` in order, in one store call; a bad
    /// batch is [`StoreErrorKind::InvalidRequest`](crate::StoreErrorKind::InvalidRequest) and appends nothing.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_window::events::{EventWindow, Retention};
    /// use tower_window::Store;
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let events = EventWindow::new(Store::memory(), Retention::new(Duration::from_secs(600), 1000)?);
    /// let batch: [&[(&str, &[u8])]; 2] = [&[("data", b"a")], &[("data", b"b")]];
    /// let appended = events.append_many("room-1", &batch).await?;
    /// assert_eq!(appended.len(), 2);
    /// assert!(appended[0].id < appended[1].id);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub async fn append_many(
        &self,
        key: impl AsRef<[u8]>,
        events: &[&[(&str, &[u8])]],
    ) -> Result<Vec<Appended>, StoreError> {
        check_batch(events)?;
        self.run(key.as_ref(), |backend, guard, request| {
            backend.append_many(guard, request, events)
        })
        .await
    }

    /// The window's current position (a new epoch if it was gone), refreshing its expiry.
    pub async fn position(&self, key: impl AsRef<[u8]>) -> Result<Position, StoreError> {
        self.run(key.as_ref(), |backend, guard, request| {
            backend.head(guard, request)
        })
        .await
    }

    /// One page: at most `limit` (1 to [`MAX_PAGE`]) events after `from`,
    /// or why they cannot be given. A full page may have more after it.
    pub async fn since(
        &self,
        key: impl AsRef<[u8]>,
        from: &Position,
        limit: u32,
    ) -> Result<Resume, StoreError> {
        check_limit(limit)?;
        self.run(key.as_ref(), |backend, guard, request| {
            backend.read(guard, request, from, limit)
        })
        .await
    }

    /// Every event after `from`, read in pages of `page` like [`since`](Self::since).
    pub async fn resume(
        &self,
        key: impl AsRef<[u8]>,
        from: &Position,
        page: u32,
    ) -> Result<Resume, StoreError> {
        let key = key.as_ref();
        let mut all: Vec<Event> = Vec::new();
        let mut at = from.clone();
        loop {
            let events = match self.since(key, &at, page).await? {
                Resume::Recovered(events) => events,
                resync => return Ok(resync),
            };
            let full = events.len() >= page as usize;
            at.last_id = events.last().map(|last| last.id).or(at.last_id);
            all.extend(events);
            if !full {
                return Ok(Resume::Recovered(all));
            }
        }
    }

    /// How many events the window `key` holds (see [`Backend::len`]).
    pub async fn len(&self, key: impl AsRef<[u8]>) -> Result<u64, StoreError> {
        self.run(key.as_ref(), |backend, guard, request| {
            backend.len(guard, request)
        })
        .await
    }

    fn run<'a, T: Send + 'a>(
        &'a self,
        key: &'a [u8],
        operation: impl FnOnce(&'a dyn Backend, &mut Guard<'a>, EventRequest<'a>) -> Op<'a, T>,
    ) -> Op<'a, T> {
        let inner = &*self.inner;
        let request = EventRequest::new(key, inner.retention, fastrand::u64(..));
        inner.store.call(
            inner.backend.as_deref(),
            "event windows",
            |backend| backend.failure_domain(key),
            Calls::to(&inner.metrics, None),
            |backend, guard| operation(backend, guard, request),
        )
    }
}

/// Checked by the window (no store call for a bad request) and again by
/// every store (for direct [`Backend`] callers).
pub(crate) fn check_fields(fields: &[(&str, &[u8])]) -> Result<(), StoreError> {
    if fields.is_empty() || fields.len() > MAX_FIELDS {
        return Err(StoreError::invalid("an event has 1 to 32 fields"));
    }
    let bad_name = |(name, _): &(&str, &[u8])| name.is_empty() || name.len() > MAX_FIELD_NAME;
    if fields.iter().any(bad_name) {
        return Err(StoreError::invalid("a field name has 1 to 64 bytes"));
    }
    Ok(())
}

/// Checked like [`check_fields`].
pub(crate) fn check_batch(events: &[&[(&str, &[u8])]]) -> Result<(), StoreError> {
    if events.is_empty() || events.len() > MAX_BATCH {
        return Err(StoreError::invalid("a batch has 1 to 64 events"));
    }
    events.iter().try_for_each(|fields| check_fields(fields))
}

/// Checked like [`check_fields`].
pub(crate) fn check_limit(limit: u32) -> Result<(), StoreError> {
    if limit == 0 || limit > MAX_PAGE {
        return Err(StoreError::invalid("a page holds 1 to 10000 events"));
    }
    Ok(())
}

impl fmt::Debug for EventWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventWindow")
            .field("retention", &self.inner.retention)
            .field("store", &self.inner.store)
            .finish_non_exhaustive()
    }
}

impl crate::store::Backend {
    /// With event windows.
    pub fn with_events(self, events: impl Backend) -> Self {
        self.with_part::<dyn Backend>(Arc::new(events))
    }
}
