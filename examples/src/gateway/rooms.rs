//! Rooms: `GET /ws?room=R` on event windows (Redis Streams), delivered
//! across nodes in order, resumable after a reconnect to any node.
//!
//! [`RoomHub`] is one per node. It runs one reader task (started on the
//! first join) that fetches new events of every room the node serves:
//! with a single Redis (`--redis-url`) one blocking `XREAD` over all of
//! them on a connection of its own ([`EventTail`]), re-issued every
//! [`READ_BLOCK`] so rooms joined meanwhile are read without restarting the
//! reader; otherwise (embedded store, Redis Cluster) by polling the event
//! window, woken at once by local appends. Each socket has a bounded queue
//! ([`RoomHub::queue_capacity`]); when it is full the socket is dropped from
//! its room, sent `resync` (reason `overflow`) and closed: one slow socket
//! never blocks the others.
//!
//! A session ([`RoomHub::join`]) subscribes to the live events first, then
//! sends the welcome, then the history after the client's position page by
//! page, then `recovered` (or `resync`), then live events, skipping live
//! events it already sent from history (ids only grow): no gap, no
//! duplicate.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use axum::extract::ws::Utf8Bytes;
use serde_json::json;
use tokio::sync::{mpsc, Notify};
use tower_window::events::{Epoch, Event, EventId, EventTail, EventWindow, Position, Resume};
use tower_window::store::redis::redis;
use tower_window::StoreError;

use super::room_metrics;

/// How long one blocking `XREAD` waits: a room joined meanwhile is read
/// from the next one on.
pub const READ_BLOCK: Duration = Duration::from_millis(100);
/// How often the polling reader looks when nothing woke it.
pub const POLL_EVERY: Duration = Duration::from_millis(100);
/// Events per history page (sent as separate frames; any number of pages).
pub const HISTORY_PAGE: u32 = 200;
/// Events per room per read of the reader.
const READ_COUNT: usize = 1000;
/// The default bound of a socket's queue of live events.
pub const DEFAULT_QUEUE: usize = 1024;

/// Whether `name` is a valid room name: 1 to 64 characters of
/// `[A-Za-z0-9_.-]`.
pub fn valid_room(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// The window key of room `name` (rooms have a namespace of their own).
fn window_key(room: &str) -> String {
    format!("room:{room}")
}

/// How the reader learns of new events.
enum Live {
    /// One blocking `XREAD` for all rooms (single Redis).
    Tail(Box<tokio::sync::Mutex<EventTail>>),
    /// Polling the event window (embedded store, Redis Cluster).
    Poll,
}

/// One node's rooms.
#[derive(Clone)]
pub struct RoomHub {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RoomHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoomHub")
            .field("rooms", &lock(&self.inner.rooms).len())
            .field("tail", &matches!(self.inner.live, Live::Tail(_)))
            .finish_non_exhaustive()
    }
}

struct Inner {
    events: EventWindow,
    /// Where published messages also go, for the inbound worker.
    inbound: Option<Inbound>,
    live: Live,
    rooms: Mutex<HashMap<String, Room>>,
    /// Wakes the reader: after a local append (polling) or a new room.
    wake: Notify,
    started: AtomicBool,
    next_socket: AtomicU64,
    queue_capacity: usize,
}

struct Room {
    /// The last event the reader delivered (its epoch and id); `None`
    /// until the first join told where the room stands.
    cursor: Option<(Epoch, EventId)>,
    sockets: HashMap<u64, Socket>,
}

struct Socket {
    queue: mpsc::Sender<LiveEvent>,
    overflowed: Arc<AtomicBool>,
}

/// The inbound stream of published messages.
struct Inbound {
    client: redis::Client,
    stream: String,
    conn: tokio::sync::OnceCell<redis::aio::MultiplexedConnection>,
}

impl Inbound {
    async fn send(&self, id: &str, room: &str, user: &str, data: &str) -> redis::RedisResult<()> {
        let conn = self
            .conn
            .get_or_try_init(|| self.client.get_multiplexed_async_connection())
            .await?;
        let mut conn = conn.clone();
        let _: String = redis::cmd("XADD")
            .arg(&self.stream)
            .arg("MAXLEN")
            .arg("~")
            .arg(1_000_000)
            .arg("*")
            .arg("id")
            .arg(id)
            .arg("room")
            .arg(room)
            .arg("from")
            .arg(user)
            .arg("data")
            .arg(data)
            .query_async(&mut conn)
            .await?;
        Ok(())
    }
}

/// A live event, serialised once for every socket.
#[derive(Debug, Clone)]
struct LiveEvent {
    epoch: Epoch,
    id: EventId,
    text: Utf8Bytes,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `{"type":"event",...}` for `event` of `room` in `epoch`.
fn event_text(room: &str, epoch: &Epoch, event: &Event) -> Utf8Bytes {
    let text = |name: &str| {
        event
            .field(name)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .unwrap_or_default()
    };
    json!({
        "type": "event",
        "room": room,
        "id": event.id.to_string(),
        "epoch": epoch.as_str(),
        "from": text("from"),
        "data": text("data"),
    })
    .to_string()
    .into()
}

fn resync_text(room: &str, reason: &str) -> Utf8Bytes {
    json!({"type": "resync", "room": room, "reason": reason})
        .to_string()
        .into()
}

impl RoomHub {
    /// Rooms on `events`, read live by polling (embedded store, cluster).
    pub fn polling(events: EventWindow) -> Self {
        Self::new(events, Live::Poll)
    }

    /// Rooms on `events`, read live with one blocking `XREAD` on `tail`'s
    /// own connection.
    pub fn tailing(events: EventWindow, tail: EventTail) -> Self {
        Self::new(events, Live::Tail(Box::new(tokio::sync::Mutex::new(tail))))
    }

    fn new(events: EventWindow, live: Live) -> Self {
        room_metrics::register();
        Self {
            inner: Arc::new(Inner {
                events,
                live,
                rooms: Mutex::new(HashMap::new()),
                wake: Notify::new(),
                inbound: None,
                started: AtomicBool::new(false),
                next_socket: AtomicU64::new(0),
                queue_capacity: DEFAULT_QUEUE,
            }),
        }
    }

    /// Also appends every published message to the Redis stream `stream`
    /// (fields `id`, `room`, `from`, `data`) for the inbound worker.
    pub fn inbound(mut self, client: redis::Client, stream: String) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.inbound = Some(Inbound {
                client,
                stream,
                conn: tokio::sync::OnceCell::new(),
            });
        }
        self
    }

    /// Sets the bound of every socket's live queue (at least 1).
    pub fn queue_capacity(mut self, capacity: usize) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.queue_capacity = capacity.max(1);
        }
        self
    }

    /// The event window rooms live in.
    pub fn events(&self) -> &EventWindow {
        &self.inner.events
    }

    /// How many sockets of this node are in `room`.
    pub fn sockets_in(&self, room: &str) -> usize {
        lock(&self.inner.rooms)
            .get(room)
            .map_or(0, |r| r.sockets.len())
    }

    /// Joins `room` (a [valid](valid_room) name): subscribes to its live
    /// events, then reads where the room stands. `resume` is the client's
    /// position, if it had one. The session's [`RoomSession::next`] yields
    /// the welcome, the history and then live events.
    pub async fn join(
        &self,
        room: &str,
        resume: Option<Position>,
    ) -> Result<RoomSession, StoreError> {
        self.start_reader();
        let inner = &self.inner;
        let id = inner.next_socket.fetch_add(1, Ordering::Relaxed);
        let (queue, receiver) = mpsc::channel(inner.queue_capacity);
        let overflowed = Arc::new(AtomicBool::new(false));
        lock(&inner.rooms)
            .entry(room.to_owned())
            .or_insert_with(|| Room {
                cursor: None,
                sockets: HashMap::new(),
            })
            .sockets
            .insert(
                id,
                Socket {
                    queue,
                    overflowed: Arc::clone(&overflowed),
                },
            );
        room_metrics::sockets(1.0);
        let mut session = RoomSession {
            hub: self.clone(),
            room: room.to_owned(),
            socket: id,
            receiver,
            overflowed,
            head: None,
            phase: Phase::Live,
            pending: std::collections::VecDeque::new(),
            last_sent: None,
        };
        // Subscribed first: every event after this point reaches the queue.
        let head = inner.events.position(window_key(room)).await?;
        let new_room = {
            let mut rooms = lock(&inner.rooms);
            match rooms.get_mut(room) {
                Some(state) if state.cursor.is_none() => {
                    state.cursor = Some((head.epoch.clone(), head.after()));
                    true
                }
                _ => false,
            }
        };
        if new_room {
            // A reader waiting with no room starts at once; one blocked in
            // XREAD picks the room up within READ_BLOCK.
            inner.wake.notify_one();
        }
        session.opened(head, resume);
        Ok(session)
    }

    fn leave(&self, room: &str, socket: u64) {
        let mut rooms = lock(&self.inner.rooms);
        if let Some(state) = rooms.get_mut(room) {
            if state.sockets.remove(&socket).is_some() {
                room_metrics::sockets(-1.0);
            }
            if state.sockets.is_empty() {
                rooms.remove(room);
            }
        }
    }

    /// Appends a message from `user` to `room` and wakes the reader; every
    /// socket in the room on every node gets it (the sender included).
    /// With an inbound stream, the message also goes there, under
    /// `message_id` (the client's id) or else the event's id.
    pub async fn publish(
        &self,
        room: &str,
        user: &str,
        data: &str,
        message_id: Option<&str>,
    ) -> Result<EventId, StoreError> {
        let appended = self
            .inner
            .events
            .append(
                window_key(room),
                &[("from", user.as_bytes()), ("data", data.as_bytes())],
            )
            .await?;
        room_metrics::published();
        self.inner.wake.notify_one();
        if let Some(inbound) = &self.inner.inbound {
            let id = message_id.map_or_else(|| appended.id.to_string(), str::to_owned);
            if let Err(error) = inbound.send(&id, room, user, data).await {
                tracing::warn!(%error, "appending to the inbound stream failed");
            }
        }
        Ok(appended.id)
    }

    fn start_reader(&self) {
        if self.inner.started.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak = Arc::downgrade(&self.inner);
        tokio::spawn(reader(weak));
    }

    /// Delivers `events` of `room` (in `epoch` order) to its sockets, never
    /// waiting: a full queue drops that socket (it is told to resync).
    fn deliver(&self, room: &str, events: Vec<(Epoch, Event)>) {
        let mut rooms = lock(&self.inner.rooms);
        let Some(state) = rooms.get_mut(room) else {
            return;
        };
        for (epoch, event) in events {
            if let Some((cursor_epoch, cursor)) = &state.cursor {
                if *cursor_epoch == epoch && event.id <= *cursor {
                    continue; // already delivered
                }
            }
            let live = LiveEvent {
                text: event_text(room, &epoch, &event),
                id: event.id,
                epoch: epoch.clone(),
            };
            state
                .sockets
                .retain(|_, socket| match socket.queue.try_send(live.clone()) {
                    Ok(()) => {
                        room_metrics::delivered(1);
                        true
                    }
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        socket.overflowed.store(true, Ordering::Release);
                        room_metrics::overflowed();
                        room_metrics::sockets(-1.0);
                        false
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => {
                        room_metrics::sockets(-1.0);
                        false
                    }
                });
            state.cursor = Some((epoch, event.id));
        }
    }
}

impl RoomHub {
    /// Moves `room`'s cursor to `last` (past entries that were not events).
    fn skip_to(&self, room: &str, last: EventId) {
        if let Some(state) = lock(&self.inner.rooms).get_mut(room) {
            if let Some((_, cursor)) = &mut state.cursor {
                if *cursor < last {
                    *cursor = last;
                }
            }
        }
    }
}

/// The node's one reader: fetches new events of every room with sockets
/// and delivers them, until the hub is dropped.
async fn reader(hub: Weak<Inner>) {
    let mut failures: u32 = 0;
    loop {
        let Some(inner) = hub.upgrade() else { return };
        let hub_ref = RoomHub { inner };
        let rooms: Vec<(String, Epoch, EventId)> = lock(&hub_ref.inner.rooms)
            .iter()
            .filter_map(|(name, room)| {
                room.cursor
                    .as_ref()
                    .map(|(epoch, id)| (name.clone(), epoch.clone(), *id))
            })
            .collect();
        let result = if rooms.is_empty() {
            // Nothing to read: wait for a join (or look again soon).
            let inner = Arc::clone(&hub_ref.inner);
            drop(hub_ref);
            tokio::select! {
                () = inner.wake.notified() => {}
                () = tokio::time::sleep(READ_BLOCK) => {}
            }
            continue;
        } else {
            match &hub_ref.inner.live {
                Live::Tail(tail) => read_tail(&hub_ref, tail, &rooms).await,
                Live::Poll => read_poll(&hub_ref, &rooms).await,
            }
        };
        match result {
            Ok(()) => failures = 0,
            Err(error) => {
                failures = failures.saturating_add(1);
                tracing::warn!(%error, "room reader failed; retrying");
                let backoff = Duration::from_millis(50u64 << failures.min(5));
                drop(hub_ref);
                tokio::time::sleep(backoff).await;
            }
        }
    }
}

async fn read_tail(
    hub: &RoomHub,
    tail: &tokio::sync::Mutex<EventTail>,
    rooms: &[(String, Epoch, EventId)],
) -> Result<(), StoreError> {
    let keys: Vec<String> = rooms.iter().map(|(name, _, _)| window_key(name)).collect();
    let windows: Vec<(&[u8], EventId)> = keys
        .iter()
        .zip(rooms)
        .map(|(key, (_, _, id))| (key.as_bytes(), *id))
        .collect();
    let batches = tail
        .lock()
        .await
        .read(&windows, READ_BLOCK, READ_COUNT)
        .await?;
    for batch in batches {
        if let Some((name, _, _)) = rooms.get(batch.index) {
            hub.deliver(name, batch.events);
            if let Some(last) = batch.last_id {
                hub.skip_to(name, last);
            }
        }
    }
    Ok(())
}

async fn read_poll(hub: &RoomHub, rooms: &[(String, Epoch, EventId)]) -> Result<(), StoreError> {
    for (name, epoch, id) in rooms {
        let from = Position::new(epoch.clone(), (*id != EventId::ZERO).then_some(*id));
        match hub
            .inner
            .events
            .since(window_key(name), &from, 1000)
            .await?
        {
            Resume::Recovered(events) => {
                let events = events.into_iter().map(|e| (epoch.clone(), e)).collect();
                hub.deliver(name, events);
            }
            Resume::Resync(_) => {
                // History moved on (a new epoch): follow the room from now.
                let head = hub.inner.events.position(window_key(name)).await?;
                if let Some(room) = lock(&hub.inner.rooms).get_mut(name) {
                    room.cursor = Some((head.epoch.clone(), head.after()));
                }
            }
        }
    }
    tokio::select! {
        () = hub.inner.wake.notified() => {}
        () = tokio::time::sleep(POLL_EVERY) => {}
    }
    Ok(())
}

/// What a session sends next.
#[derive(Debug)]
pub enum Outgoing {
    /// A text frame.
    Text(Utf8Bytes),
    /// The queue overflowed: send this `resync` and close the socket.
    Overflow(Utf8Bytes),
}

/// Where a session is in its opening sequence.
enum Phase {
    /// Reading history after this position (resumes only).
    History { from: Position, count: u64 },
    /// Live events.
    Live,
}

/// One socket in one room; leaves the room when dropped.
///
/// [`next`](Self::next) yields, in order: the welcome, the history pages
/// and `recovered` or `resync` (when resuming), then live events. It is
/// cancel-safe, so a socket loop can `select!` it with reading the socket.
pub struct RoomSession {
    hub: RoomHub,
    room: String,
    socket: u64,
    receiver: mpsc::Receiver<LiveEvent>,
    overflowed: Arc<AtomicBool>,
    /// Where the room stood at the join (the welcome's position).
    head: Option<Position>,
    phase: Phase,
    /// Frames ready to send before anything else.
    pending: std::collections::VecDeque<Utf8Bytes>,
    /// The last event sent (epoch, id): live events up to it are skipped.
    last_sent: Option<(Epoch, EventId)>,
}

impl Drop for RoomSession {
    fn drop(&mut self) {
        self.hub.leave(&self.room, self.socket);
    }
}

impl RoomSession {
    /// The room.
    pub fn room(&self) -> &str {
        &self.room
    }

    /// The position the welcome announced.
    pub fn head(&self) -> Option<&Position> {
        self.head.as_ref()
    }

    fn opened(&mut self, head: Position, resume: Option<Position>) {
        let welcome = json!({
            "type": "joined",
            "room": self.room,
            "epoch": head.epoch.as_str(),
            "last_event_id": head.last_id.map(|id| id.to_string()).unwrap_or_default(),
        });
        self.pending.push_back(welcome.to_string().into());
        self.last_sent = Some((head.epoch.clone(), head.after()));
        self.head = Some(head);
        match resume {
            Some(from) => self.phase = Phase::History { from, count: 0 },
            None => room_metrics::joined("live"),
        }
    }

    /// The next frame to send. `Ok(None)` when the hub is gone.
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
                    room_metrics::joined(reason.as_str());
                    self.pending
                        .push_back(resync_text(&self.room, reason.as_str()));
                    self.phase = Phase::Live;
                }
                Resume::Recovered(events) => {
                    let full = events.len() >= HISTORY_PAGE as usize;
                    for event in &events {
                        self.pending
                            .push_back(event_text(&self.room, &from.epoch, event));
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
                        room_metrics::joined("recovered");
                        let recovered =
                            json!({"type": "recovered", "room": self.room, "count": count});
                        self.pending.push_back(recovered.to_string().into());
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
                    .load(Ordering::Acquire)
                    .then(|| Outgoing::Overflow(resync_text(&self.room, "overflow")));
            };
            if let Some((epoch, last)) = &self.last_sent {
                if *epoch == event.epoch && event.id <= *last {
                    continue;
                }
            }
            self.last_sent = Some((event.epoch.clone(), event.id));
            return Some(Outgoing::Text(event.text));
        }
    }

    /// Publishes `data` from `user` to the room (`message_id`: the
    /// client's id of the message, if it gave one).
    pub async fn publish(
        &self,
        user: &str,
        data: &str,
        message_id: Option<&str>,
    ) -> Result<EventId, StoreError> {
        self.hub.publish(&self.room, user, data, message_id).await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use tower_window::events::Retention;
    use tower_window::{Limiter, MemoryStore, Quota};

    use super::*;

    fn hub(capacity: usize) -> RoomHub {
        let store = MemoryStore::new();
        let limiter = Limiter::new(store.clone(), "1000/1s".parse::<Quota>().unwrap());
        let retention = Retention::new(Duration::from_secs(600), 1000).unwrap();
        RoomHub::polling(EventWindow::new(limiter, store, retention)).queue_capacity(capacity)
    }

    async fn next(session: &mut RoomSession) -> Outgoing {
        tokio::time::timeout(Duration::from_secs(10), session.next())
            .await
            .expect("a frame in time")
            .unwrap()
            .expect("the hub is alive")
    }

    fn json(frame: Outgoing) -> serde_json::Value {
        match frame {
            Outgoing::Text(text) => serde_json::from_str(text.as_str()).unwrap(),
            Outgoing::Overflow(text) => panic!("overflow: {}", text.as_str()),
        }
    }

    /// A socket that does not read fills its queue and is dropped from the
    /// room with a resync; the socket that reads gets every event, and the
    /// publisher never waits.
    #[tokio::test]
    async fn a_full_queue_drops_only_that_socket() {
        let hub = hub(2);
        let mut slow = hub.join("r", None).await.unwrap();
        let mut fast = hub.join("r", None).await.unwrap();
        assert_eq!(json(next(&mut fast).await)["type"], "joined");
        assert_eq!(json(next(&mut slow).await)["type"], "joined");
        for i in 0..10 {
            hub.publish("r", "u", &i.to_string(), None).await.unwrap();
            let event = json(next(&mut fast).await);
            assert_eq!(
                (event["type"].as_str(), event["data"].as_str()),
                (Some("event"), Some(&*i.to_string()))
            );
        }
        assert_eq!(hub.sockets_in("r"), 1, "the slow socket left the room");
        assert_eq!(json(next(&mut slow).await)["data"], "0");
        assert_eq!(json(next(&mut slow).await)["data"], "1");
        match next(&mut slow).await {
            Outgoing::Overflow(text) => {
                let resync: serde_json::Value = serde_json::from_str(text.as_str()).unwrap();
                assert_eq!(resync["type"], "resync");
                assert_eq!(resync["reason"], "overflow");
            }
            Outgoing::Text(text) => panic!("expected the overflow, got {}", text.as_str()),
        }
        drop(fast);
        assert_eq!(hub.sockets_in("r"), 0);
    }

    /// A position ahead of the room (issue 22, defect 3) is answered
    /// `resync` `ahead` to that socket alone, on the polling reader too:
    /// the room keeps its epoch and an honest resume recovers its gap.
    #[tokio::test]
    async fn a_position_ahead_is_answered_to_that_socket_alone() {
        let hub = hub(16);
        let mut alice = hub.join("r", None).await.unwrap();
        let joined = json(next(&mut alice).await);
        let epoch: Epoch = joined["epoch"].as_str().unwrap().parse().unwrap();
        let first = hub.publish("r", "u", "m0", None).await.unwrap();
        assert_eq!(json(next(&mut alice).await)["data"], "m0");
        drop(alice);
        let ahead = EventId::new(tower_window::events::MAX_ID_PART, 0).unwrap();
        for i in 0..3 {
            let position = Position::new(epoch.clone(), Some(ahead));
            let mut mallory = hub.join("r", Some(position)).await.unwrap();
            assert_eq!(json(next(&mut mallory).await)["epoch"], epoch.as_str());
            let resync = json(next(&mut mallory).await);
            assert_eq!(
                (resync["type"].as_str(), resync["reason"].as_str()),
                (Some("resync"), Some("ahead"))
            );
            hub.publish("r", "u", &format!("m{}", i + 1), None)
                .await
                .unwrap();
        }
        let mut alice = hub
            .join("r", Some(Position::new(epoch.clone(), Some(first))))
            .await
            .unwrap();
        assert_eq!(json(next(&mut alice).await)["epoch"], epoch.as_str());
        for data in ["m1", "m2", "m3"] {
            assert_eq!(json(next(&mut alice).await)["data"], data);
        }
        let recovered = json(next(&mut alice).await);
        assert_eq!(
            (recovered["type"].as_str(), recovered["count"].as_u64()),
            (Some("recovered"), Some(3))
        );
    }

    #[test]
    fn room_names() {
        for good in ["a", "A-z_0.9", &"x".repeat(64)] {
            assert!(valid_room(good), "{good}");
        }
        for bad in ["", "a b", "a/b", "é", "a:b", &"x".repeat(65)] {
            assert!(!valid_room(bad), "{bad}");
        }
    }
}
