//! [`events::Backend`](crate::events::Backend): where event windows live.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::id::{Epoch, EventId, Position};
use crate::store::{Guard, Op, StoreError};

/// How much history an event window keeps: the last `window`, at most about `max_len` events.
///
/// ```
/// use std::time::Duration;
/// use tower_window::events::Retention;
///
/// let retention = Retention::new(Duration::from_secs(600), 10_000)?;
/// assert_eq!(retention.window_millis(), 600_000);
/// assert!(Retention::new(Duration::ZERO, 10).is_err());
/// assert!(Retention::new(Duration::from_secs(1), 0).is_err());
/// # Ok::<(), tower_window::events::InvalidRetention>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    window_millis: u64,
    max_len: u64,
}

impl Retention {
    /// The longest window: 30 days.
    pub const MAX_WINDOW: Duration = Duration::from_secs(30 * 24 * 3600);
    /// The largest `max_len`.
    pub const MAX_LEN: u64 = 10_000_000;
    /// How long an idle window's keys outlive its window.
    pub const IDLE_GRACE: Duration = Duration::from_secs(60);

    /// Events of the last `window` (1 ms to [`MAX_WINDOW`](Self::MAX_WINDOW)),
    /// at most `max_len` (1 to [`MAX_LEN`](Self::MAX_LEN)) of them.
    pub fn new(window: Duration, max_len: u64) -> Result<Self, InvalidRetention> {
        let window_millis = u64::try_from(window.as_millis()).unwrap_or(u64::MAX);
        if window_millis == 0 || window > Self::MAX_WINDOW {
            return Err(InvalidRetention::Window);
        }
        if max_len == 0 || max_len > Self::MAX_LEN {
            return Err(InvalidRetention::MaxLen);
        }
        Ok(Self {
            window_millis,
            max_len,
        })
    }

    /// The window in milliseconds.
    pub fn window_millis(&self) -> u64 {
        self.window_millis
    }

    /// The most events kept (the newest ones).
    pub fn max_len(&self) -> u64 {
        self.max_len
    }

    /// The TTL every write sets: the window plus [`IDLE_GRACE`](Self::IDLE_GRACE).
    pub fn ttl_millis(&self) -> u64 {
        self.window_millis + Self::IDLE_GRACE.as_millis() as u64
    }
}

/// A [`Retention`] out of bounds.
#[derive(Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidRetention {
    /// The window is zero or longer than [`Retention::MAX_WINDOW`].
    #[error("an event window is between 1 ms and 30 days")]
    Window,
    /// `max_len` is zero or above [`Retention::MAX_LEN`].
    #[error("an event window keeps between 1 and 10000000 events")]
    MaxLen,
}

crate::error_debug::debug_as_display!(InvalidRetention { Window, MaxLen });

/// One event: its id and its fields, in the order they were appended.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Event {
    /// Its id.
    pub id: EventId,
    /// Its fields (name, value).
    pub fields: Vec<(String, Bytes)>,
}

impl Event {
    /// An event of `id` with `fields`.
    pub fn new(id: EventId, fields: Vec<(String, Bytes)>) -> Self {
        Self { id, fields }
    }

    /// The value of the first field named `name`.
    pub fn field(&self, name: &str) -> Option<&Bytes> {
        self.fields.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }
}

/// Where an appended event went.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Appended {
    /// The window's epoch when the event was appended.
    pub epoch: Epoch,
    /// The event's id.
    pub id: EventId,
}

impl Appended {
    /// `id` in `epoch`.
    pub fn new(epoch: Epoch, id: EventId) -> Self {
        Self { epoch, id }
    }
}

/// Why a resume cannot be recovered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ResyncReason {
    /// An event after the position is no longer kept (trimmed, or lost in
    /// a restore), or the position was never an event.
    TooOld,
    /// The position is of another epoch.
    EpochChanged,
    /// The position is after the window's last event.
    Ahead,
}

impl ResyncReason {
    /// `too_old`, `epoch_changed` or `ahead`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::TooOld => "too_old",
            Self::EpochChanged => "epoch_changed",
            Self::Ahead => "ahead",
        }
    }
}

impl fmt::Display for ResyncReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The answer to "what came after this position?".
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum Resume {
    /// The events after the position (or a page of them), in order.
    Recovered(Vec<Event>),
    /// Events may be lost: start again from the window's current position.
    Resync(ResyncReason),
}

/// One operation's target window.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct EventRequest<'a> {
    /// The window's key (any bytes; the store escapes them).
    pub key: &'a [u8],
    /// What the window keeps.
    pub retention: Retention,
    /// Random bits to make a new [`Epoch`] unique, should one be made.
    pub nonce: u64,
}

impl<'a> EventRequest<'a> {
    /// An operation on the window `key`.
    pub fn new(key: &'a [u8], retention: Retention, nonce: u64) -> Self {
        Self {
            key,
            retention,
            nonce,
        }
    }
}

/// The storage of [`EventWindow`](super::EventWindow)s: implemented by
/// [`MemoryStore`](crate::MemoryStore) and (feature `redis`)
/// [`RedisStore`](crate::RedisStore). The contract (checked by the
/// conformance suite in `tower-window-tests`):
///
/// * ids of one window grow; fields come back as appended;
/// * finding the window gone or moved to another primary starts a new [`Epoch`];
/// * [`read`](Self::read) answers as the [module](super) says and never changes the window;
/// * requests out of [`EventWindow`](super::EventWindow)'s bounds are
///   [`StoreErrorKind::InvalidRequest`](crate::StoreErrorKind::InvalidRequest);
/// * every write refreshes the window's expiry ([`Retention::ttl_millis`]).
pub trait Backend: Send + Sync + 'static {
    /// Appends one event, trimming what the retention no longer keeps.
    fn append<'a>(
        &'a self,
        guard: &mut Guard<'a>,
        request: EventRequest<'a>,
        fields: &'a [(&'a str, &'a [u8])],
    ) -> Op<'a, Appended>;

    /// Appends `events` in one operation, as
    /// [`EventWindow::append_many`](super::EventWindow::append_many) says. The
    /// default answers [`Unsupported`](crate::StoreErrorKind::Unsupported).
    fn append_many<'a>(
        &'a self,
        guard: &mut Guard<'a>,
        request: EventRequest<'a>,
        events: &'a [&'a [(&'a str, &'a [u8])]],
    ) -> Op<'a, Vec<Appended>> {
        let _ = (guard, request, events);
        Op::ready(Err(StoreError::unsupported("batched event appends")))
    }

    /// The window's current position (a new epoch if needed), refreshing its expiry.
    fn head<'a>(&'a self, guard: &mut Guard<'a>, request: EventRequest<'a>) -> Op<'a, Position>;

    /// At most `limit` events after `from`, or why they cannot be given.
    fn read<'a>(
        &'a self,
        guard: &mut Guard<'a>,
        request: EventRequest<'a>,
        from: &'a Position,
        limit: u32,
    ) -> Op<'a, Resume>;

    /// How many events the window holds (a lazily trimming backend may count a few more).
    fn len<'a>(&'a self, guard: &mut Guard<'a>, request: EventRequest<'a>) -> Op<'a, u64>;

    /// The failure domain of the window `key` (see
    /// [`limit::Backend::failure_domain`](crate::limit::Backend::failure_domain)).
    fn failure_domain(&self, key: &[u8]) -> Option<u16> {
        let _ = key;
        None
    }

    /// Live wake-ups of this backend's windows. The default answers
    /// [`Unsupported`](crate::StoreErrorKind::Unsupported) (readers poll).
    fn wakeups(self: Arc<Self>) -> Result<super::EventWakeups, StoreError> {
        Err(StoreError::unsupported("event wake-ups"))
    }
}
