//! Event windows: append-only, time-bounded logs per key (rooms, feeds)
//! with epochs, so that a reader who reconnects — to this node or another
//! — gets exactly the events it missed, in order, or is told to resync.
//!
//! * [`EventWindow`] appends ([`append`](EventWindow::append)), reads pages
//!   after a position ([`since`](EventWindow::since),
//!   [`resume`](EventWindow::resume)) and tells the current position
//!   ([`position`](EventWindow::position)); every call passes the
//!   [`Limiter`](crate::Limiter)'s resilience stack.
//! * [`EventStore`] is where windows live: [`MemoryStore`](crate::MemoryStore)
//!   in one process, [`RedisStore`](crate::RedisStore) on Redis Streams
//!   (`XADD` with `MINID ~` at the store's now minus the window and a
//!   `MAXLEN ~` cap, `XRANGE` with an exclusive start), in one Lua script
//!   per operation on Redis's own clock.
//!
//! # Positions and epochs
//!
//! A [`Position`] is an [`Epoch`] and the last [`EventId`] received. The
//! epoch changes whenever history may have been lost: the window's keys
//! vanished (expired, deleted, flushed, evicted) and were made again, or
//! another Redis primary now holds them (a failover or restart changes the
//! primary's replication id, which the epoch records). A resume answers
//! [`Resume::Recovered`] only when no event can have been lost between the
//! position and now: same epoch, and the next event after the position
//! still kept (each event records the id of the one before it, so a gap
//! made by trimming is seen exactly). Otherwise [`Resume::Resync`] says
//! why: [`TooOld`](ResyncReason::TooOld) or
//! [`EpochChanged`](ResyncReason::EpochChanged).
//!
//! # Retention
//!
//! [`Retention`] bounds each window by time (events older than the window
//! on the store's clock are never returned) and by count (the newest
//! `max_len`). Redis trims with `~` (whole stream nodes), so a stream may
//! hold a little more than the retention keeps until its next append; those
//! events are never returned either. Every write sets a TTL of the window
//! plus [`Retention::IDLE_GRACE`] on the stream and its epoch, so idle
//! windows vanish.

mod id;
mod store;
mod window;

/// Live reads of many windows with one blocking `XREAD` (Redis only).
#[cfg(feature = "redis")]
pub use crate::store::redis::{EventTail, TailBatch};
pub use id::{Epoch, EventId, InvalidPosition, Position, MAX_ID_PART};
pub use store::{
    Appended, Event, EventRequest, EventStore, InvalidRetention, Resume, ResyncReason, Retention,
};
pub use window::{EventWindow, MAX_FIELDS, MAX_FIELD_NAME, MAX_PAGE};
