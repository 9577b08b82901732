//! Event windows: append-only, time-bounded logs per key (rooms, feeds)
//! with epochs, so that a reader who reconnects — to this node or another
//! — gets exactly the events it missed, in order, or is told to resync.
//!
//! * [`EventWindow`] appends ([`append`](EventWindow::append), or several
//!   events in order in one call: [`append_many`](EventWindow::append_many)), reads pages
//!   after a position ([`since`](EventWindow::since),
//!   [`resume`](EventWindow::resume)) and tells the current position
//!   ([`position`](EventWindow::position)); every call passes the
//!   [`Store`](crate::Store)'s resilience stack.
//! * the events [`Backend`] is where windows live: [`MemoryStore`](crate::MemoryStore)
//!   in one process, [`RedisStore`](crate::RedisStore) on Redis Streams
//!   (`XADD` with `MINID ~` at the store's now minus the window and a
//!   `MAXLEN ~` cap, `XRANGE` with an exclusive start), in one Lua script
//!   per operation on Redis's own clock.
//!
//! * [`EventWakeups`] ([`EventWindow::wakeups`]) tells a live reader which
//!   windows to read again: every append wakes the readers following its
//!   window (on Redis by `SPUBLISH` in the append's own script, so idle
//!   windows cost a reader no command at all: see [`wake`]).
//!
//! # Positions and epochs
//!
//! A [`Position`] is an [`Epoch`] and the last [`EventId`] received. The
//! epoch changes whenever the store can tell that history may have been
//! lost: the window's keys vanished (expired, deleted, flushed, evicted)
//! and were made again, or another Redis primary now holds them (a
//! failover or restart changes the primary's replication id, which the
//! epoch records). A resume answers [`Resume::Recovered`] only when no
//! event can have been lost between the position and now: same epoch, and
//! the first kept event after the position is the one that followed it
//! (each event records the id of the one before it, so a gap made by
//! trimming, or a reader's own event lost by a restore or rollback that
//! kept the epoch, is seen exactly; a reader whose position is older than
//! everything such a restore took away is given the history that is
//! kept, which has no trace of the events it never saw). Otherwise
//! [`Resume::Resync`] says why:
//!
//! | reason | [`as_str`](ResyncReason::as_str) | when |
//! |---|---|---|
//! | [`TooOld`](ResyncReason::TooOld) | `too_old` | an event after the position is no longer kept (trimmed, or lost) |
//! | [`EpochChanged`](ResyncReason::EpochChanged) | `epoch_changed` | the position is of another epoch |
//! | [`Ahead`](ResyncReason::Ahead) | `ahead` | the position is after the window's last event |
//!
//! Positions come from clients and are not to be trusted. Whatever a
//! reader sends (an id at `2^53 - 1`, `0-0`, an id between two events, the
//! epoch of another window), the answer is for that reader alone: a read
//! never changes the window's epoch or events, so no reader can make
//! another one resync.
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
pub(crate) mod memory;
#[cfg(feature = "redis")]
mod redis;
mod store;
#[cfg(feature = "redis")]
mod tail;
#[cfg(feature = "redis")]
pub mod wake;
mod wakeups;
mod window;

pub use id::{Epoch, EventId, InvalidPosition, Position, MAX_ID_PART};
pub use store::{
    Appended, Backend, Event, EventRequest, InvalidRetention, Resume, ResyncReason, Retention,
};
/// Live reads of many windows with one blocking `XREAD` (Redis only).
#[cfg(feature = "redis")]
pub use tail::{EventTail, TailBatch};
pub use wakeups::{EventWakeups, WakeReason, Wakeup};
pub(crate) use window::{check_batch, check_limit};
pub use window::{EventWindow, MAX_BATCH, MAX_FIELDS, MAX_FIELD_NAME, MAX_PAGE};
