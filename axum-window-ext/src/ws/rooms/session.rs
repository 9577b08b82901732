//! [`RoomSession`]: one socket in one room, and what it sends next.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::ws::Utf8Bytes;
use tokio::sync::mpsc;
use tower_window::events::{Epoch, EventId, Position, Resume};
use tower_window::StoreError;

use super::hub::{reached, window_key, LiveEvent, RoomHub};
use super::name::RoomName;
use super::{frame, metrics, HISTORY_PAGE};

/// What a session sends next: a text frame of the room protocol.
///
/// Exhaustive on purpose: a new variant needs its own action in every
/// socket loop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outgoing {
    /// A text frame to send (`joined`, `event`, `recovered`, `resync`).
    Text(Utf8Bytes),
    /// The socket's queue overflowed, or the node's reader fell behind
    /// what the room keeps, and the socket has left the room: send this
    /// `resync` (reason `overflow`), then close with
    /// [`CLOSE_OVERFLOW`](super::CLOSE_OVERFLOW). Nothing follows it.
    Overflow(Utf8Bytes),
}

#[derive(Debug)]
pub(super) enum Phase {
    /// Reading history after this position (resumes only).
    History { from: Position, count: u64 },
    /// Live events.
    Live,
}

/// One socket in one room, from [`RoomHub::join`]; leaves the room when
/// dropped.
///
/// [`next`](Self::next) yields the welcome (`joined`), then, when resuming,
/// the history and `recovered` or `resync`, then live events, with no gap
/// and no duplicate.
#[derive(Debug)]
pub struct RoomSession {
    pub(super) hub: RoomHub,
    pub(super) room: RoomName,
    pub(super) socket: u64,
    pub(super) receiver: mpsc::Receiver<LiveEvent>,
    pub(super) overflowed: Arc<AtomicBool>,
    pub(super) head: Option<Position>,
    pub(super) phase: Phase,
    pub(super) pending: VecDeque<Utf8Bytes>,
    /// Live events up to the last one sent are skipped.
    pub(super) last_sent: Option<(Epoch, EventId)>,
}

impl Drop for RoomSession {
    fn drop(&mut self) {
        self.hub.leave(&self.room, self.socket);
    }
}

impl RoomSession {
    /// The room.
    pub fn room(&self) -> &RoomName {
        &self.room
    }

    /// The welcome's position: where the room stood at the join.
    pub fn head(&self) -> Option<&Position> {
        self.head.as_ref()
    }

    /// The session's hub.
    pub fn hub(&self) -> &RoomHub {
        &self.hub
    }

    pub(super) fn opened(&mut self, head: Position, resume: Option<Position>) {
        self.pending.push_back(frame::joined(&self.room, &head));
        self.last_sent = Some((head.epoch.clone(), head.after()));
        self.head = Some(head);
        match resume {
            Some(from) => self.phase = Phase::History { from, count: 0 },
            None => metrics::joined("live"),
        }
    }

    /// The next frame to send; `Ok(None)` once the session can yield
    /// nothing more. Errors are the store's, reading history. Cancel-safe.
    pub async fn next(&mut self) -> Result<Option<Outgoing>, StoreError> {
        loop {
            if let Some(frame) = self.pending.pop_front() {
                return Ok(Some(Outgoing::Text(frame)));
            }
            let Phase::History { from, count } = &self.phase else {
                return Ok(self.next_live().await);
            };
            let (mut from, mut count) = (from.clone(), *count);
            // Cancel-safe: nothing changes until the page is here.
            let page = self
                .hub
                .inner
                .events
                .since(window_key(&self.room), &from, HISTORY_PAGE)
                .await?;
            match page {
                Resume::Resync(reason) => {
                    metrics::joined(reason.as_str());
                    self.pending
                        .push_back(frame::resync(&self.room, reason.as_str()));
                    self.phase = Phase::Live;
                }
                Resume::Recovered(events) => {
                    let full = events.len() >= HISTORY_PAGE as usize;
                    for event in &events {
                        self.pending
                            .push_back(frame::event(&self.room, &from.epoch, event));
                        from.last_id = Some(event.id);
                        count += 1;
                    }
                    if full {
                        self.phase = Phase::History { from, count };
                    } else {
                        // History may run past the welcome's position.
                        if let Some((epoch, last)) = &self.last_sent {
                            if *epoch == from.epoch && from.after() > *last {
                                self.last_sent = Some((epoch.clone(), from.after()));
                            }
                        }
                        metrics::joined("recovered");
                        self.pending.push_back(frame::recovered(&self.room, count));
                        self.phase = Phase::Live;
                    }
                }
            }
        }
    }

    async fn next_live(&mut self) -> Option<Outgoing> {
        loop {
            let Some(event) = self.receiver.recv().await else {
                return self
                    .overflowed
                    .swap(false, Ordering::AcqRel)
                    .then(|| Outgoing::Overflow(frame::resync(&self.room, "overflow")));
            };
            if let Some(text) = self.unsent(event) {
                return Some(Outgoing::Text(text));
            }
        }
    }

    /// `event`'s frame, unless it was sent already (history and live
    /// overlap); it then counts as sent.
    fn unsent(&mut self, event: LiveEvent) -> Option<Utf8Bytes> {
        if reached(&self.last_sent, &event.epoch, event.id) {
            return None;
        }
        self.last_sent = Some((event.epoch.clone(), event.id));
        Some(event.text)
    }

    /// A text frame that is ready without waiting or a store call, for a
    /// socket loop that writes every ready frame and then flushes once.
    /// `None` when [`next`](Self::next) would have to wait, read history,
    /// or end the session: `next` still yields those.
    pub fn ready_now(&mut self) -> Option<Utf8Bytes> {
        if let Some(frame) = self.pending.pop_front() {
            return Some(frame);
        }
        if !matches!(self.phase, Phase::Live) {
            return None;
        }
        while let Ok(event) = self.receiver.try_recv() {
            if let Some(text) = self.unsent(event) {
                return Some(text);
            }
        }
        None
    }

    /// Publishes `data` from `from` to the room (see [`RoomHub::publish`]).
    pub async fn publish(&self, from: &str, data: &str) -> Result<EventId, StoreError> {
        self.hub.publish(&self.room, from, data).await
    }

    /// See [`RoomHub::publish_many`].
    pub async fn publish_many(
        &self,
        from: &str,
        data: &[&str],
    ) -> Result<Vec<EventId>, StoreError> {
        self.hub.publish_many(&self.room, from, data).await
    }

    /// The frame to send when a message could not be published:
    /// `{"type":"error","room":R,"reason":"unavailable"}`.
    pub fn unavailable(&self) -> Utf8Bytes {
        frame::unavailable(&self.room)
    }
}
