//! Rooms: WebSockets that share a room's events, delivered in order on
//! every node sharing the store, resumable after a reconnect to any node.
//!
//! A room is an [event window](tower_window::events) (`room:<name>`; a
//! Redis Stream on a [`RedisStore`](tower_window::RedisStore), or in
//! memory), so its history and epoch live in the store, not on a node.
//!
//! * [`RoomHub`], one per node: which of the node's sockets are in which
//!   room, and **one reader task** (started on the first join) that fetches
//!   new events of every room the node serves. A room is read only when
//!   the store's events backend wakes the hub for it
//!   ([`EventWindow::wakeups`](tower_window::events::EventWindow::wakeups)):
//!   on Redis (a single server or a Redis Cluster, Redis 7, a store built
//!   from a URL or cluster seeds; `redis` feature) every append publishes
//!   one on the room's shard channel in the same script, on the embedded
//!   store every append sends one in process. The hub subscribes a room on
//!   its first socket and unsubscribes it with its last, and after every
//!   (re)subscription (a failover, a resharding, a lost connection) it
//!   reads the room again from its last id, so no event is missed and idle
//!   rooms cost no command. The stream stays the only source of events.
//!   On a store without wake-ups (a pool-built store, your own backend, or
//!   [`RoomHubBuilder::polling`]) each room is polled every
//!   [`POLL_EVERY`] and at once after a local append;
//!   [`RoomHubBuilder::tail`] selects one blocking `XREAD` over every room
//!   on a single Redis instead (re-issued every [`READ_BLOCK`]). A room
//!   whose epoch changed (a failover) is read on from the hub's last id in
//!   the new epoch when nothing was lost in between. Each live event is
//!   serialised once and queued to every socket in its room. Each socket's
//!   queue is bounded ([`RoomHubBuilder::queue_capacity`], default
//!   [`DEFAULT_QUEUE`]); a socket whose queue is full is dropped from its
//!   room and told to resync: one slow socket never blocks the others or
//!   the reader.
//! * [`RoomSession`] ([`RoomHub::join`]), one per socket: subscribes to the
//!   live events first, then sends the welcome, then the history after the
//!   client's position page by page ([`HISTORY_PAGE`] events per read), then
//!   `recovered` (or `resync`), then live events, skipping live events it
//!   already sent from history (ids only grow): no gap, no duplicate.
//! * [`RoomHub::serve`] / [`RoomSession::serve`]: a ready-made socket loop
//!   on a plain axum `WebSocket`. With message limits, a connection cap or
//!   deduplication, loop over a [`GuardedSocket`](super::GuardedSocket)
//!   with [`RoomSession::next`] (cancel-safe) and
//!   [`RoomSession::publish`] instead.
//!
//! # Rooms in your router
//!
//! ```
//! use std::time::Duration;
//!
//! use axum::extract::{ws::WebSocketUpgrade, Path, State};
//! use axum::{response::Response, routing::get, Router};
//! use axum_window_ext::ws::rooms::{RoomHub, RoomName};
//! use tower_window::events::{EventWindow, Retention};
//! use tower_window::MemoryStore;
//!
//! /// `GET /rooms/{room}`: a WebSocket in that room; text messages go to everyone in it.
//! async fn room(
//!     State(hub): State<RoomHub>,
//!     Path(room): Path<RoomName>,
//!     ws: WebSocketUpgrade,
//! ) -> Response {
//!     ws.on_upgrade(move |socket| async move { hub.serve(socket, &room, None, "guest").await })
//! }
//!
//! fn app() -> Result<Router, Box<dyn std::error::Error>> {
//!     let store = MemoryStore::new(); // or a RedisStore shared by every node
//!     let retention = Retention::new(Duration::from_secs(600), 1000)?;
//!     let hub = RoomHub::new(EventWindow::new(store, retention));
//!     Ok(Router::new().route("/rooms/{room}", get(room)).with_state(hub))
//! }
//!
//! async fn serve(listener: tokio::net::TcpListener) -> Result<(), Box<dyn std::error::Error>> {
//!     Ok(axum::serve(listener, app()?).await?)
//! }
//! # type Ws = tokio_tungstenite::WebSocketStream<
//! #     tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
//! # >;
//! # async fn frame(ws: &mut Ws) -> serde_json::Value {
//! #     use futures_util::StreamExt;
//! #     let next = tokio::time::timeout(Duration::from_secs(10), ws.next());
//! #     match next.await.expect("a frame in time").expect("open").expect("a frame") {
//! #         tokio_tungstenite::tungstenite::Message::Text(text) => {
//! #             serde_json::from_str(&text).expect("json")
//! #         }
//! #         other => panic!("{other:?}"),
//! #     }
//! # }
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # use futures_util::SinkExt;
//! # use tokio_tungstenite::tungstenite::Message;
//! # let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
//! # runtime.block_on(async {
//! #     let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! #     let url = format!("ws://{}/rooms/lobby", listener.local_addr()?);
//! #     let clients = async {
//! #         let (mut alice, _) = tokio_tungstenite::connect_async(url.as_str()).await?;
//! #         let (mut bob, _) = tokio_tungstenite::connect_async(url.as_str()).await?;
//! #         assert_eq!(frame(&mut alice).await["type"], "joined");
//! #         assert_eq!(frame(&mut bob).await["type"], "joined");
//! #         alice.send(Message::text("hello")).await?;
//! #         for ws in [&mut alice, &mut bob] {
//! #             let event = frame(ws).await;
//! #             assert_eq!(event["type"], "event");
//! #             assert_eq!(event["data"], "hello");
//! #         }
//! #         Ok::<(), Box<dyn std::error::Error>>(())
//! #     };
//! #     tokio::select! {
//! #         served = serve(listener) => panic!("the server stopped: {served:?}"),
//! #         checked = clients => checked,
//! #     }
//! # })
//! # }
//! ```
//!
//! # The protocol
//!
//! Every frame the server sends is a JSON text frame with a `type`:
//!
//! | Frame | When |
//! |---|---|
//! | `{"type":"joined","room":R,"epoch":E,"last_event_id":ID}` | first, always: where the room stands (`ID` empty when it has no event yet); a client that never received an event can resume from it |
//! | `{"type":"event","room":R,"id":ID,"epoch":E,"from":F,"data":D}` | history (when resuming), then live events; `from` is the publisher's name, `data` the message text; (`epoch`, `id`) is the client's position |
//! | `{"type":"recovered","room":R,"count":N}` | after a resume's history: `N` events were sent and nothing between the position and the live events was lost |
//! | `{"type":"resync","room":R,"reason":"too_old"\|"epoch_changed"\|"ahead"}` | instead of `recovered`: the gap cannot be recovered ([`ResyncReason`](tower_window::events::ResyncReason)); told to this client alone; live events follow |
//! | `{"type":"resync","room":R,"reason":"overflow"}` | the socket's queue filled, or the node's reader fell behind what the room keeps ([`Outgoing::Overflow`]): then the close [`CLOSE_OVERFLOW`] (1013); reconnect with the last position |
//! | `{"type":"error","room":R,"reason":"unavailable"}` | a message could not be appended ([`RoomSession::unavailable`]); the socket stays open |
//!
//! A client resumes by passing its last position
//! ([`Position`](tower_window::events::Position), e.g. parsed with
//! `Position::parse(epoch, last_event_id)` from the query) to
//! [`RoomHub::join`]. Positions are the client's word: whatever a client
//! sends is answered to it alone and never changes the room for anyone
//! else.
//!
//! # Metrics
//!
//! Recorded through the `metrics` facade and registered at zero when a hub
//! is built (install the recorder first): see [`metrics`].

mod frame;
mod hub;
pub mod metrics;
mod name;
mod reader;
mod serve;
mod session;

use std::time::Duration;

pub use hub::{RoomHub, RoomHubBuilder};
pub use name::{InvalidRoomName, RoomName};
pub use serve::FRAMES_PER_FLUSH;
pub use session::{Outgoing, RoomSession};

/// How long one blocking `XREAD` of the Redis tail waits: a room joined
/// meanwhile is read from the next one on. Also how long the pushed
/// reader waits for a wake-up before it looks whether its hub is gone (a
/// local timer, no command).
pub const READ_BLOCK: Duration = Duration::from_millis(100);
/// How often the polling reader looks when nothing woke it.
pub const POLL_EVERY: Duration = Duration::from_millis(100);
/// Events per history page (sent as separate frames; any number of pages).
pub const HISTORY_PAGE: u32 = 200;
/// The default bound of a socket's queue of live events.
pub const DEFAULT_QUEUE: usize = 1024;

/// Close code 1003 (unsupported data): a binary message in a room.
pub const CLOSE_UNSUPPORTED: u16 = 1003;
/// Close code 1011 (internal error): the store failed while joining or
/// reading the room.
pub const CLOSE_STORE_ERROR: u16 = 1011;
/// Close code 1013 (try again later): the socket read too slowly and its
/// queue overflowed, or the node's reader fell behind what the room keeps;
/// reconnect with the last position.
pub const CLOSE_OVERFLOW: u16 = 1013;

#[cfg(test)]
mod tests;
