//! Rooms: WebSockets that share a room's events, delivered in order on
//! every node sharing the store, resumable after a reconnect to any node.
//!
//! A room is the [event window](tower_window::events) `room:<name>`, so its
//! history and epoch live in the store, not on a node.
//!
//! * [`RoomHub`], one per node: which of the node's sockets are in which
//!   room, and one reader task for all its rooms (see [`RoomHubBuilder`]).
//!   Each live event is serialised once and queued to every socket in its
//!   room; a socket whose bounded queue is full is dropped from its room
//!   and told to resync, so one slow socket never blocks the others.
//! * [`RoomSession`] ([`RoomHub::join`]), one per socket: the welcome, the
//!   history after the client's position, `recovered` or `resync`, then
//!   live events, with no gap and no duplicate.
//! * [`RoomHub::serve`] / [`RoomSession::serve`]: a ready-made socket loop.
//! * [`Resume`]: the client's position from the upgrade's query.
//!
//! # Rooms in your router
//!
//! A room per path, with a message quota per user (every guest is one user
//! here: key by your authenticated user):
//!
//! ```
//! use std::time::Duration;
//!
//! use axum::extract::{ws::WebSocketUpgrade, Path, State};
//! use axum::{response::Response, routing::get, Router};
//! use axum_window_ext::ws::rooms::{Resume, RoomHub, RoomName};
//! use axum_window_ext::ws::{GuardedSocket, MessageLimits};
//! use tower_window::events::{EventWindow, Retention};
//! use tower_window::{Limiter, MemoryStore, Quota, Store, WindowKey};
//!
//! #[derive(Clone)]
//! struct Rooms { hub: RoomHub, limits: MessageLimits }
//!
//! /// `GET /rooms/{room}?epoch=E&last_event_id=ID`: a WebSocket in that room (resuming after ID).
//! async fn room(State(rooms): State<Rooms>, Path(room): Path<RoomName>, Resume(resume): Resume, ws: WebSocketUpgrade) -> Response {
//!     rooms.limits.configure(ws).on_upgrade(move |socket| async move {
//!         let socket = GuardedSocket::new(socket, rooms.limits, WindowKey::for_subject("guest"));
//!         rooms.hub.serve(socket, &room, resume, "guest").await
//!     })
//! }
//!
//! fn app() -> Result<Router, Box<dyn std::error::Error>> {
//!     let store = Store::from(MemoryStore::new()); // or a RedisStore shared by every node
//!     let hub = RoomHub::new(EventWindow::new(store.clone(), Retention::new(Duration::from_secs(600), 1000)?));
//!     let limits = MessageLimits::builder(Limiter::new(store, "100/1m".parse::<Quota>()?))
//!         .messages("2/1m".parse::<Quota>()?)
//!         .build();
//!     Ok(Router::new().route("/rooms/{room}", get(room)).with_state(Rooms { hub, limits }))
//! }
//!
//! async fn serve(listener: tokio::net::TcpListener) -> Result<(), Box<dyn std::error::Error>> {
//!     Ok(axum::serve(listener, app()?).await?)
//! }
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
//! A client resumes from its last position ([`Resume`]); whatever position
//! a client sends is answered to it alone. Metrics: see [`metrics`].

mod frame;
mod hub;
pub mod metrics;
mod name;
mod reader;
mod resume;
mod serve;
mod session;
mod socket;

use std::time::Duration;

pub use hub::{RoomHub, RoomHubBuilder};
pub use name::{InvalidRoomName, RoomName};
pub use resume::{InvalidResume, Resume};
pub use serve::FRAMES_PER_FLUSH;
pub use session::{Outgoing, RoomSession};
pub use socket::RoomSocket;

/// How long one blocking `XREAD` of the Redis tail waits (a room joined
/// meanwhile is read from the next one on), and how long the pushed reader
/// waits before it looks whether its hub is gone.
pub const READ_BLOCK: Duration = Duration::from_millis(100);
/// How often the polling reader looks when nothing woke it.
pub const POLL_EVERY: Duration = Duration::from_millis(100);
/// Events per history page.
pub const HISTORY_PAGE: u32 = 200;
/// The default bound of a socket's queue of live events.
pub const DEFAULT_QUEUE: usize = 1024;

/// Close code 1003 (unsupported data): a binary message in a room.
pub const CLOSE_UNSUPPORTED: u16 = 1003;
/// Close code 1011 (internal error): the store failed.
pub const CLOSE_STORE_ERROR: u16 = 1011;
/// Close code 1013 (try again later): after an overflow's `resync`.
pub const CLOSE_OVERFLOW: u16 = 1013;

#[cfg(test)]
mod tests;
