//! WebSocket guards: limits after the upgrade, and a refusal before it.
//!
//! * [`GuardedSocket`]: every inbound text or binary message is charged to
//!   [`MessageLimits`] (a unit of the message quota, its bytes of the byte
//!   quota), shared by all of a subject's sockets on all nodes; an
//!   exceeding message is handled per [`ExceedAction`]. The guard's closes
//!   ([`CloseCause`]) reach a client that keeps sending.
//! * [`ConnectionRefused`]: the `429` instead of the `101` for an upgrade
//!   refused by a connection cap: extract `WebSocketUpgrade`, acquire the
//!   seat, then upgrade.
//! * A `/ws` route behind the rate-limit [`layer`](crate::layer) is keyed
//!   before the upgrade: no key, or one too long, is a `400`.
//! * [`rooms`]: rooms on event windows, resumable on any node.
//!
//! A complete `/ws` route, with the node's heartbeat (it renews the node's
//! seats; without it a seat expires while its socket lives on):
//!
//! ```no_run
//! use axum::extract::ws::WebSocketUpgrade;
//! use axum::extract::State;
//! use axum::http::{HeaderMap, StatusCode};
//! use axum::response::{IntoResponse, Response};
//! use axum::routing::get;
//! use axum::Router;
//! use axum_window_ext::ws::{ConnectionRefused, GuardedSocket, MessageLimits};
//! use tower_window::conn::{Acquire, ConnectionLimiter};
//! use tower_window::{Limiter, MemoryStore, Quota, Store, WindowKey};
//!
//! /// What every socket of this node shares.
//! #[derive(Clone)]
//! struct Sockets {
//!     connections: ConnectionLimiter,
//!     limits: MessageLimits,
//! }
//!
//! async fn ws(State(sockets): State<Sockets>, headers: HeaderMap, upgrade: WebSocketUpgrade) -> Response {
//!     // Who: a header here; authenticate it for real.
//!     let Some(user) = headers.get("x-user-id").map(|v| v.as_bytes().to_vec()) else {
//!         return StatusCode::BAD_REQUEST.into_response();
//!     };
//!     let key = WindowKey::for_subject(user);
//!     let seat = match sockets.connections.acquire(&key).await {
//!         Ok(Acquire::Granted(seat)) => seat,
//!         Ok(Acquire::Denied(denied)) => return ConnectionRefused::new(denied).into_response(),
//!         Err(_) => return StatusCode::SERVICE_UNAVAILABLE.into_response(),
//!     };
//!     let limits = sockets.limits.clone();
//!     limits.configure(upgrade).on_upgrade(move |socket| async move {
//!         let mut socket = GuardedSocket::new(socket, sockets.limits, key).with_seat(&seat);
//!         while let Some(message) = socket.recv().await {
//!             if socket.send(message).await.is_err() {
//!                 break;
//!             }
//!         }
//!         drop(socket); // the closing handshake finishes in the background
//!         let _ = seat.release().await;
//!     })
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     // One store for the limiter and the connection caps (`Store::from(RedisStore)`
//!     // for a cluster of nodes).
//!     let store = Store::from(MemoryStore::new());
//!     let limiter = Limiter::new(store.clone(), "100/1m".parse::<Quota>()?);
//!     let connections = ConnectionLimiter::builder(store)
//!         .max_per_subject(3)
//!         .build()?;
//!     // One heartbeat per node; it runs until every clone of the limiter is gone.
//!     let _heartbeat = connections.start_heartbeat();
//!     let limits = MessageLimits::builder(limiter)
//!         .messages("20/10s".parse::<Quota>()?)
//!         .bytes("65536/10s".parse::<Quota>()?)
//!         .build();
//!     let app = Router::new()
//!         .route("/ws", get(ws))
//!         .with_state(Sockets { connections, limits });
//!     let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//!     axum::serve(listener, app).await?;
//!     Ok(())
//! }
//! ```

mod guard;
mod limits;
mod refused;
pub mod rooms;

pub use guard::{CloseCause, GuardedSocket};
pub use limits::{ExceedAction, MessageLimits, MessageLimitsBuilder};
pub use refused::ConnectionRefused;

/// Close code 1002: protocol error (a frame RFC 6455 forbids).
pub const CLOSE_PROTOCOL_ERROR: u16 = 1002;
/// Close code 1007: invalid frame payload data (invalid UTF-8 text).
pub const CLOSE_INVALID_PAYLOAD: u16 = 1007;
/// Close code 1008: policy violation (rate limit, lost seat).
pub const CLOSE_POLICY: u16 = 1008;
/// Close code 1009: message too big.
pub const CLOSE_TOO_BIG: u16 = 1009;
