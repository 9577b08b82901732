//! [`RoomHub`]: who is in which room on this node, and the reader that
//! feeds them.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use axum::extract::ws::Utf8Bytes;
use tokio::sync::{mpsc, Notify};
#[cfg(feature = "redis")]
use tower_window::events::EventTail;
use tower_window::events::{Epoch, Event, EventId, EventWakeups, EventWindow, Position};
use tower_window::StoreError;

use super::name::RoomName;
use super::session::{Phase, RoomSession};
use super::socket::RoomSocket;
use super::{frame, metrics, reader, DEFAULT_QUEUE};

/// One node's rooms on an [`EventWindow`]; see the [module docs](super).
///
/// Cheap to clone (every clone is the same hub): build one per node. Its
/// reader task starts on the first [`join`](Self::join) and ends when the
/// last clone is dropped.
#[derive(Clone)]
pub struct RoomHub {
    pub(super) inner: Arc<Inner>,
}

/// How the reader learns of new events.
#[derive(Debug)]
pub(super) enum Live {
    /// One blocking `XREAD` for all rooms (single-node Redis).
    #[cfg(feature = "redis")]
    Tail(Box<tokio::sync::Mutex<EventTail>>),
    /// The events backend's wake-ups.
    Push(Box<EventWakeups>),
    /// Polling, woken at once by local appends.
    Poll,
}

pub(super) struct Inner {
    pub(super) events: EventWindow,
    pub(super) live: Live,
    pub(super) rooms: Mutex<HashMap<RoomName, Room>>,
    /// Wakes the reader after a local append or a new room.
    pub(super) wake: Notify,
    started: AtomicBool,
    next_socket: AtomicU64,
    queue_capacity: usize,
}

#[derive(Default)]
pub(super) struct Room {
    /// The last event the reader delivered; `None` until the first join
    /// read where the room stands.
    pub(super) cursor: Option<(Epoch, EventId)>,
    /// To be read from the cursor (pushed wake-ups only).
    pub(super) dirty: bool,
    sockets: HashMap<u64, Socket>,
}

struct Socket {
    queue: mpsc::Sender<LiveEvent>,
    overflowed: Arc<AtomicBool>,
}

impl Socket {
    /// Marks the socket, being dropped from its room, for its session's
    /// resync.
    fn overflow(&self) {
        self.overflowed.store(true, Ordering::Release);
        metrics::overflowed();
        metrics::sockets(-1.0);
    }
}

/// A live event, serialised once for every socket.
#[derive(Debug, Clone)]
pub(super) struct LiveEvent {
    pub(super) epoch: Epoch,
    pub(super) id: EventId,
    pub(super) text: Utf8Bytes,
}

pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The event-window key of `room`.
pub(super) fn window_key(room: &RoomName) -> String {
    format!("room:{room}")
}

/// Whether event `id` of `epoch` is at or before `cursor`.
pub(super) fn reached(cursor: &Option<(Epoch, EventId)>, epoch: &Epoch, id: EventId) -> bool {
    matches!(cursor, Some((at, last)) if at == epoch && id <= *last)
}

/// The room of the window `key`, if it is one.
fn room_of(key: &[u8]) -> Option<RoomName> {
    let name = std::str::from_utf8(key.strip_prefix(b"room:")?).ok()?;
    RoomName::new(name).ok()
}

/// Builds a [`RoomHub`]: [`RoomHub::builder`].
#[derive(Debug)]
pub struct RoomHubBuilder {
    events: EventWindow,
    live: Option<Live>,
    queue_capacity: usize,
}

impl RoomHubBuilder {
    /// The bound of every socket's queue of live events (at least 1;
    /// default [`DEFAULT_QUEUE`]); see
    /// [`Outgoing::Overflow`](super::Outgoing::Overflow).
    pub fn queue_capacity(mut self, capacity: usize) -> Self {
        self.queue_capacity = capacity.max(1);
        self
    }

    /// Reads live events with one blocking `XREAD` over every room of the
    /// node, on `tail`'s own connection
    /// ([`RedisStore::event_tail`](tower_window::RedisStore::event_tail),
    /// of the store `events` lives in). Single-node Redis only.
    #[cfg(feature = "redis")]
    pub fn tail(mut self, tail: EventTail) -> Self {
        self.live = Some(Live::Tail(Box::new(tokio::sync::Mutex::new(tail))));
        self
    }

    /// Reads a room only when a wake-up for it comes
    /// ([`EventWindow::wakeups`], of the store `events` lives in): no
    /// command for idle rooms, and after every (re)subscription the room is
    /// read again from the hub's last id, so nothing is missed. The default
    /// for a store that has wake-ups.
    pub fn wakeups(mut self, wakeups: EventWakeups) -> Self {
        self.live = Some(Live::Push(Box::new(wakeups)));
        self
    }

    /// Polls every room every [`POLL_EVERY`](super::POLL_EVERY) (and at
    /// once after a local append): the default for a store without
    /// wake-ups.
    pub fn polling(mut self) -> Self {
        self.live = Some(Live::Poll);
        self
    }

    /// The hub; registers the [room metrics](super::metrics).
    pub fn build(self) -> RoomHub {
        metrics::register();
        let live = self.live.unwrap_or_else(|| match self.events.wakeups() {
            Ok(wakeups) => Live::Push(Box::new(wakeups)),
            Err(_) => Live::Poll,
        });
        RoomHub {
            inner: Arc::new(Inner {
                events: self.events,
                live,
                rooms: Mutex::new(HashMap::new()),
                wake: Notify::new(),
                started: AtomicBool::new(false),
                next_socket: AtomicU64::new(0),
                queue_capacity: self.queue_capacity,
            }),
        }
    }
}

impl Live {
    fn name(&self) -> &'static str {
        match self {
            #[cfg(feature = "redis")]
            Live::Tail(_) => "tail",
            Live::Push(_) => "push",
            Live::Poll => "poll",
        }
    }
}

impl fmt::Debug for RoomHub {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RoomHub")
            .field("rooms", &lock(&self.inner.rooms).len())
            .field("live", &self.inner.live.name())
            .field("queue_capacity", &self.inner.queue_capacity)
            .finish_non_exhaustive()
    }
}

impl RoomHub {
    /// `RoomHub::builder(events).build()`.
    pub fn new(events: EventWindow) -> Self {
        Self::builder(events).build()
    }

    /// A builder of rooms on `events`.
    pub fn builder(events: EventWindow) -> RoomHubBuilder {
        RoomHubBuilder {
            events,
            live: None,
            queue_capacity: DEFAULT_QUEUE,
        }
    }

    /// The event window rooms live in.
    pub fn events(&self) -> &EventWindow {
        &self.inner.events
    }

    /// How many sockets of this node are in `room`.
    pub fn sockets_in(&self, room: &RoomName) -> usize {
        lock(&self.inner.rooms)
            .get(room)
            .map_or(0, |r| r.sockets.len())
    }

    /// Joins `room` from the client's position `resume`, if any: subscribes
    /// to its live events first, then reads where the room stands. The
    /// session leaves the room when dropped.
    pub async fn join(
        &self,
        room: &RoomName,
        resume: Option<Position>,
    ) -> Result<RoomSession, StoreError> {
        self.start_reader();
        let inner = &self.inner;
        let id = inner.next_socket.fetch_add(1, Ordering::Relaxed);
        let (queue, receiver) = mpsc::channel(inner.queue_capacity);
        let overflowed = Arc::new(AtomicBool::new(false));
        {
            let mut rooms = lock(&inner.rooms);
            if !rooms.contains_key(room) {
                // Before the room's position is read, so every append after
                // that read wakes the reader; under the lock, so a follow and
                // an unfollow of the room keep their order.
                self.follow(room, true);
            }
            rooms.entry(room.clone()).or_default().sockets.insert(
                id,
                Socket {
                    queue,
                    overflowed: Arc::clone(&overflowed),
                },
            );
        }
        metrics::sockets(1.0);
        let mut session = RoomSession {
            hub: self.clone(),
            room: room.clone(),
            socket: id,
            receiver,
            overflowed,
            head: None,
            phase: Phase::Live,
            pending: VecDeque::new(),
            last_sent: None,
        };
        // Subscribed first: every event after this point reaches the queue.
        let head = inner.events.position(window_key(room)).await?;
        let mut rooms = lock(&inner.rooms);
        if let Some(state) = rooms.get_mut(room).filter(|state| state.cursor.is_none()) {
            state.cursor = Some((head.epoch.clone(), head.after()));
            // An append before the subscription took hold woke nobody.
            state.dirty = true;
            inner.wake.notify_one();
        }
        drop(rooms);
        session.opened(head, resume);
        Ok(session)
    }

    /// [`join`](Self::join), then [`RoomSession::serve`]; a failed join
    /// closes the socket with [`CLOSE_STORE_ERROR`](super::CLOSE_STORE_ERROR).
    pub async fn serve(
        &self,
        mut socket: impl RoomSocket,
        room: &RoomName,
        resume: Option<Position>,
        from: &str,
    ) {
        match self.join(room, resume).await {
            Ok(session) => session.serve(socket, from).await,
            Err(error) => {
                tracing::warn!(%error, "joining a room failed");
                socket
                    .close(super::CLOSE_STORE_ERROR, "store unavailable")
                    .await;
            }
        }
    }

    pub(super) fn leave(&self, room: &RoomName, socket: u64) {
        let mut rooms = lock(&self.inner.rooms);
        if let Some(state) = rooms.get_mut(room) {
            if state.sockets.remove(&socket).is_some() {
                metrics::sockets(-1.0);
            }
            if state.sockets.is_empty() {
                rooms.remove(room);
                self.follow(room, false);
            }
        }
    }

    /// Appends a message `data` from `from` to `room`: every socket in the
    /// room on every node gets it, the sender's included.
    pub async fn publish(
        &self,
        room: &RoomName,
        from: &str,
        data: &str,
    ) -> Result<EventId, StoreError> {
        let fields = frame::fields(from, data);
        let appended = self.inner.events.append(window_key(room), &fields).await?;
        self.published(1).await;
        Ok(appended.id)
    }

    /// [`publish`](Self::publish) for 1 to
    /// [`MAX_BATCH`](tower_window::events::MAX_BATCH) messages, in order, in
    /// one store call
    /// ([`EventWindow::append_many`](tower_window::events::EventWindow::append_many)).
    pub async fn publish_many(
        &self,
        room: &RoomName,
        from: &str,
        data: &[&str],
    ) -> Result<Vec<EventId>, StoreError> {
        let fields: Vec<[(&str, &[u8]); 2]> =
            data.iter().map(|data| frame::fields(from, data)).collect();
        let events: Vec<&[(&str, &[u8])]> = fields.iter().map(|f| f.as_slice()).collect();
        let appended = self
            .inner
            .events
            .append_many(window_key(room), &events)
            .await?;
        self.published(appended.len()).await;
        Ok(appended.into_iter().map(|appended| appended.id).collect())
    }

    async fn published(&self, count: usize) {
        metrics::published(count as u64);
        self.inner.wake.notify_one();
        // An in-process append never yields, so a loop of publishes would
        // starve the reader just woken on this worker until the loop ends;
        // spending the cooperative budget makes such a loop yield.
        tokio::task::consume_budget().await;
    }

    /// Subscribes to `room`'s wake-ups, or stops (pushed mode only).
    fn follow(&self, room: &RoomName, follow: bool) {
        if let Live::Push(wakeups) = &self.inner.live {
            if follow {
                wakeups.follow(window_key(room));
            } else {
                wakeups.unfollow(window_key(room));
            }
        }
    }

    /// Marks the room of the window `key` to be read (a wake-up).
    pub(super) fn woken(&self, key: &[u8]) {
        let Some(name) = room_of(key) else { return };
        if let Some(room) = lock(&self.inner.rooms).get_mut(&name) {
            room.dirty = true;
        }
    }

    fn start_reader(&self) {
        if self.inner.started.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak = Arc::downgrade(&self.inner);
        tokio::spawn(reader::run(weak));
    }

    /// Queues `events` of `room` to its sockets, never waiting: a full
    /// queue drops that socket.
    pub(super) fn deliver(&self, room: &RoomName, events: Vec<(Epoch, Event)>) {
        let mut rooms = lock(&self.inner.rooms);
        let Some(state) = rooms.get_mut(room) else {
            return;
        };
        for (epoch, event) in events {
            if reached(&state.cursor, &epoch, event.id) {
                continue; // already delivered
            }
            let live = LiveEvent {
                text: frame::event(room, &epoch, &event),
                id: event.id,
                epoch: epoch.clone(),
            };
            state
                .sockets
                .retain(|_, socket| match socket.queue.try_send(live.clone()) {
                    Ok(()) => {
                        metrics::delivered(1);
                        true
                    }
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        socket.overflow();
                        false
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => {
                        metrics::sockets(-1.0);
                        false
                    }
                });
            state.cursor = Some((epoch, event.id));
        }
    }

    /// Moves `room`'s cursor into `to`'s epoch when it is at `to`'s id in
    /// another one.
    pub(super) fn move_cursor(&self, room: &RoomName, to: &Position) {
        let mut rooms = lock(&self.inner.rooms);
        if let Some((epoch, id)) = rooms.get_mut(room).and_then(|r| r.cursor.as_mut()) {
            if *epoch != to.epoch && *id == to.after() {
                *epoch = to.epoch.clone();
            }
        }
    }

    /// Moves `room`'s cursor to `head` after the reader lost events, and
    /// drops every socket of the room with an overflow, so none stays on
    /// silently missing them.
    pub(super) fn restart_at(&self, room: &RoomName, head: &Position) {
        let mut rooms = lock(&self.inner.rooms);
        let Some(state) = rooms.get_mut(room) else {
            return;
        };
        state.cursor = Some((head.epoch.clone(), head.after()));
        for (_, socket) in state.sockets.drain() {
            socket.overflow();
        }
    }

    /// Moves `room`'s cursor to `last` (past entries that were not events).
    #[cfg(feature = "redis")]
    pub(super) fn skip_to(&self, room: &RoomName, last: EventId) {
        let mut rooms = lock(&self.inner.rooms);
        if let Some((_, cursor)) = rooms.get_mut(room).and_then(|r| r.cursor.as_mut()) {
            *cursor = last.max(*cursor);
        }
    }
}
