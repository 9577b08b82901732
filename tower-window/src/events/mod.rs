//! Event windows: append-only, time-bounded logs per key (rooms, feeds)
//! with epochs, so that a reader who reconnects — to this node or another
//! — gets exactly the events it missed, in order, or is told to resync.
//!
//! [`EventWindow`] appends and reads through the [`Store`](crate::Store)'s
//! resilience stack; the events [`Backend`] holds the windows
//! ([`MemoryStore`](crate::MemoryStore), or [`RedisStore`](crate::RedisStore)
//! on Redis Streams, one Lua script per operation on Redis's clock);
//! [`EventWakeups`] tells a live reader which windows to read again (see
//! [`wake`]).
//!
//! # Positions and epochs
//!
//! A [`Position`] is an [`Epoch`] and the last [`EventId`] received. The
//! epoch changes whenever history may have been lost: the window's keys
//! vanished and were made again, or another Redis primary holds them (the
//! epoch records the primary's replication id). A resume is
//! [`Resume::Recovered`] only when no event can have been lost: same
//! epoch, and the first kept event after the position is the one that
//! followed it (each event records its predecessor's id, so a gap made by
//! trimming or by a restore that kept the epoch is seen exactly; a
//! position older than everything a restore took away gets the history
//! that is kept). Otherwise it is [`Resume::Resync`], with a
//! [`ResyncReason`]. Positions come from clients and are not trusted: a
//! read never changes the window, so no reader can make another resync.
//!
//! # Retention
//!
//! [`Retention`] bounds each window by time and count. Redis trims with `~`
//! (whole stream nodes), so a stream may briefly hold a few events more,
//! which are never returned. Every write sets [`Retention::ttl_millis`], so
//! idle windows vanish.

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
#[cfg(feature = "redis")]
pub use tail::{EventTail, TailBatch};
pub use wakeups::{EventWakeups, WakeReason, Wakeup};
pub(crate) use window::{check_batch, check_limit};
pub use window::{EventWindow, MAX_BATCH, MAX_FIELDS, MAX_FIELD_NAME, MAX_PAGE};
