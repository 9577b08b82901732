//! WebSocket guards: limits after the upgrade, and a refusal before it.
//!
//! * [`MessageLimits`] + [`GuardedSocket`]: every inbound text or binary
//!   message is charged to a [`Limiter`](tower_window::Limiter) — one unit
//!   of the message quota, its payload bytes of the byte quota — shared by
//!   all of a subject's sockets on all nodes. On exceed, as configured
//!   ([`ExceedAction`]): `Drop` discards it and sends the notice
//!   `{"type":"rate_limited","quota":"<name>","retry_after_ms":<n>}`
//!   (optionally closing after N consecutive drops), `Close` closes with
//!   1008, `Pause` stops reading until the retry-after (TCP backpressure
//!   reaches the client; nothing is lost). A message over the size limit
//!   closes with 1009 before being charged; invalid UTF-8 text closes with
//!   1007; a protocol violation (unmasked or reserved-bit frames, unknown
//!   opcodes, a malformed close) closes with 1002; a lost
//!   [connection lease](tower_window::conn) closes with 1008.
//! * [`ConnectionRefused`]: the answer to an upgrade request refused by a
//!   connection cap — `429` with `Retry-After` and `RateLimit` headers,
//!   sent instead of the `101`, so no upgrade happens. Extract axum's
//!   `WebSocketUpgrade` first (it recognises HTTP/1.1 `GET` upgrades and
//!   HTTP/2 extended `CONNECT`, and refuses anything else), then acquire
//!   the lease, then upgrade.
//! * [`rooms`]: rooms on event windows — one reader per node, bounded
//!   per-socket queues, history then live with no gap, resume on any node
//!   ([`rooms::RoomHub`]).
//!
//! ```no_run
//! use axum::extract::ws::WebSocketUpgrade;
//! use axum::response::{IntoResponse, Response};
//! use axum_window_ext::ws::{ConnectionRefused, GuardedSocket, MessageLimits};
//! use tower_window::conn::{Acquire, ConnectionLimiter};
//! use tower_window::WindowKey;
//!
//! async fn ws(
//!     upgrade: WebSocketUpgrade,
//!     connections: ConnectionLimiter,
//!     limits: MessageLimits,
//!     key: WindowKey,
//! ) -> Response {
//!     let lease = match connections.acquire(&key).await {
//!         Ok(Acquire::Granted(lease)) => lease,
//!         Ok(Acquire::Denied(denied)) => return ConnectionRefused::new(denied).into_response(),
//!         Err(_) => return http::StatusCode::SERVICE_UNAVAILABLE.into_response(),
//!     };
//!     limits
//!         .configure(upgrade)
//!         .on_upgrade(move |socket| async move {
//!             let mut socket = GuardedSocket::new(socket, limits, key).with_lease(&lease);
//!             while let Some(message) = socket.recv().await {
//!                 if socket.send(message).await.is_err() {
//!                     break;
//!                 }
//!             }
//!             let _ = lease.release().await;
//!         })
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
/// Close code 1008: policy violation (rate limit, lost lease).
pub const CLOSE_POLICY: u16 = 1008;
/// Close code 1009: message too big.
pub const CLOSE_TOO_BIG: u16 = 1009;
