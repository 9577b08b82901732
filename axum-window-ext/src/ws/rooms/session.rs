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
/// Exhaustive on purpose: each variant asks the socket loop for its own
/// action, so a new one is a breaking change a loop must handle, not a
/// wildcard arm that would guess.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outgoing {
    /// A text frame to send (`joined`, `event`, `recovered`, `resync`).
    Text(Utf8Bytes),
    /// The socket's queue overflowed, or the node's reader fell behind
    /// what the room keeps (events it can no longer send live), and the
    /// socket has left the room: send this
    /// `resync` (reason `overflow`), then close the socket with
    /// [`CLOSE_OVERFLOW`](super::CLOSE_OVERFLOW). The session yields
    /// nothing after it.
    Overflow(Utf8Bytes),
}

/// Where a session is in its opening sequence.
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
/// [`next`](Self::next) yields, in order: the welcome (`joined`), then,
/// when resuming, the history pages and `recovered` or `resync`, then
/// live events — with no gap and no duplicate between history and live.
/// It is cancel-safe, so a socket loop can `select!` it with reading the
/// socket; [`serve`](Self::serve) is such a loop.
#[derive(Debug)]
pub struct RoomSession {
    pub(super) hub: RoomHub,
    pub(super) room: RoomName,
    pub(super) socket: u64,
    pub(super) receiver: mpsc::Receiver<LiveEvent>,
    pub(super) overflowed: Arc<AtomicBool>,
    /// Where the room stood at the join (the welcome's position).
    pub(super) head: Option<Position>,
    pub(super) phase: Phase,
    /// Frames ready to send before anything else.
    pub(super) pending: VecDeque<Utf8Bytes>,
    /// The last event sent (epoch, id): live events up to it are skipped.
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

    /// The position the welcome announced: where the room stood at the
    /// join.
    pub fn head(&self) -> Option<&Position> {
        self.head.as_ref()
    }

    /// The hub this session is of.
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

    /// The next frame to send. `Ok(None)` when the session can yield
    /// nothing more (it was dropped from the room without an overflow).
    /// An error is the store's, while reading history.
    ///
    /// Cancel-safe: a cancelled call loses nothing.
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
                        // History may run past the welcome's position:
                        // live events up to what it sent are skipped.
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
    /// overlap at the switch); then it counts as sent.
    fn unsent(&mut self, event: LiveEvent) -> Option<Utf8Bytes> {
        if reached(&self.last_sent, &event.epoch, event.id) {
            return None;
        }
        self.last_sent = Some((event.epoch.clone(), event.id));
        Some(event.text)
    }

    /// A text frame that is ready now, without waiting and without a store
    /// call: a queued frame, or a live event already received. `None` when
    /// [`next`](Self::next) would have to wait, read history, or end the
    /// session (an overflow, a session dropped from its room): `next` still
    /// yields those.
    ///
    /// For a socket loop that writes every ready frame and then flushes
    /// once, so a burst of events costs one write instead of one per frame
    /// (as the example gateway does).
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

    /// Publishes several messages `data` from `from` to the room, in
    /// order, in one store call (see [`RoomHub::publish_many`]).
    pub async fn publish_many(
        &self,
        from: &str,
        data: &[&str],
    ) -> Result<Vec<EventId>, StoreError> {
        self.hub.publish_many(&self.room, from, data).await
    }

    /// The frame to send when a message could not be published (the
    /// store failed): `{"type":"error","room":R,"reason":"unavailable"}`.
    pub fn unavailable(&self) -> Utf8Bytes {
        frame::unavailable(&self.room)
    }
}
