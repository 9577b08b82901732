//! [`GuardedSocket`]: an axum `WebSocket` whose inbound messages are charged.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket};
use serde_json::json;
use tower_window::conn::{ConnectionSeat, SeatLost};
use tower_window::{Decision, Policy, WindowKey};

use super::limits::MessageLimits;
use super::{
    ExceedAction, CLOSE_INVALID_PAYLOAD, CLOSE_POLICY, CLOSE_PROTOCOL_ERROR, CLOSE_TOO_BIG,
};

/// The most frames discarded while waiting for the peer's close.
const MAX_DISCARDED: usize = 10_000;

/// What the connection still needs once a close was sent, before it may be
/// dropped (done by a task spawned when the [`GuardedSocket`] is dropped,
/// so neither a cancelled [`recv`](GuardedSocket::recv) nor the caller's
/// own cleanup cuts it short).
///
/// A connection dropped while the peer's frames sit unread in it is reset
/// (TCP RST), and a peer that is still writing then sees the reset instead
/// of the close; RFC 6455 7.1.1 has the server close the TCP connection
/// after the closing handshake instead. Bounded by
/// [`close_timeout`](super::MessageLimitsBuilder::close_timeout).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Closing {
    /// Read and discard until the peer's close (or the end): after the
    /// guard's close, and after the peer's (reading once more writes the
    /// queued reply).
    Discard,
    /// Hold the connection without reading: after a read error axum's
    /// socket yields nothing more, so the peer's frames cannot be
    /// discarded; holding it lets the close be transmitted and read before
    /// the reset.
    Hold,
}

/// Why a [`GuardedSocket`] stopped yielding messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CloseCause {
    /// The peer closed, or the connection ended.
    Peer,
    /// Reading failed (I/O or protocol error other than the ones below).
    Error,
    /// Invalid UTF-8 text: closed with 1007.
    InvalidUtf8,
    /// A WebSocket protocol violation (an unmasked or reserved-bit frame,
    /// an unknown opcode, a stray continuation, an oversized control
    /// frame, a malformed close): closed with 1002.
    ProtocolError,
    /// A message over the size limit (or one the byte quota can never
    /// admit): closed with 1009.
    TooBig,
    /// A quota was exceeded with [`ExceedAction::Close`]: closed with 1008.
    RateLimited,
    /// Too many consecutive drops: closed with 1008.
    DropLadder,
    /// The connection seat was reported lost: closed with 1008.
    SeatLost,
}

/// A WebSocket whose inbound text and binary messages are charged to
/// [`MessageLimits`] before [`recv`](Self::recv) yields them; see the
/// [module docs](super).
pub struct GuardedSocket {
    /// Present until [`into_inner`](Self::into_inner) or the drop.
    socket: Option<WebSocket>,
    limits: MessageLimits,
    key: WindowKey,
    lost: Option<SeatLost>,
    drops: u32,
    closed: Option<CloseCause>,
    /// A message read but not yet admitted: kept across a cancelled
    /// [`recv`](GuardedSocket::recv), so the next call charges it again
    /// instead of losing it.
    held: Option<Message>,
    /// What the connection needs after a close, before it is dropped.
    closing: Option<Closing>,
}

impl GuardedSocket {
    /// Guards `socket` of the subject `key` with `limits`.
    pub fn new(socket: WebSocket, limits: MessageLimits, key: WindowKey) -> Self {
        Self {
            socket: Some(socket),
            limits,
            key,
            lost: None,
            drops: 0,
            closed: None,
            held: None,
            closing: None,
        }
    }

    /// Closes the socket with 1008 when `seat` is reported lost.
    pub fn with_seat(mut self, seat: &ConnectionSeat) -> Self {
        self.lost = Some(seat.lost());
        self
    }

    /// Why the socket stopped, once [`recv`](Self::recv) returned `None`.
    pub fn close_cause(&self) -> Option<CloseCause> {
        self.closed
    }

    /// The next admitted text or binary message; `None` once the socket is
    /// closed (by the peer, or by the guard: see [`close_cause`](Self::close_cause)).
    /// Pings are answered by axum; dropped messages are answered with the
    /// notice and never yielded.
    ///
    /// Cancel-safe: a message read but not yet admitted is kept and
    /// charged again by the next call (so it may be counted twice), never
    /// lost; `select!` it with other work freely.
    pub async fn recv(&mut self) -> Option<Message> {
        while self.closed.is_none() {
            let Some(held) = &self.held else {
                // Held until admitted or dropped: cancel-safe from here on.
                self.held = self.read().await;
                continue;
            };
            let len = message_len(held);
            let Err(denied) = charge(&self.limits, &self.key, len).await else {
                self.drops = 0;
                return self.held.take();
            };
            let Some(wait) = denied.retry_after() else {
                // More bytes than the byte quota can ever admit.
                self.close(CloseCause::TooBig, "message exceeds the quota")
                    .await;
                continue;
            };
            match self.limits.inner.on_exceed {
                ExceedAction::Close => {
                    self.close(CloseCause::RateLimited, "rate limit exceeded")
                        .await;
                }
                // Not reading is the backpressure; the message is kept.
                ExceedAction::Pause => {
                    let paused = tokio::time::sleep(wait);
                    if until_lost(&mut self.lost, paused).await.is_none() {
                        self.close(CloseCause::SeatLost, "connection seat lost")
                            .await;
                    }
                }
                ExceedAction::Drop => self.drop_held(denied.quota().name(), wait).await,
            }
        }
        None
    }

    /// Reads the next message worth charging: `None` for a ping or a pong,
    /// and once the socket closed (then [`closed`](Self::close_cause) is set).
    async fn read(&mut self) -> Option<Message> {
        let next = until_lost(&mut self.lost, present(&mut self.socket).recv()).await;
        match next {
            None => {
                self.close(CloseCause::SeatLost, "connection seat lost")
                    .await;
            }
            Some(None) => self.closed = Some(CloseCause::Peer),
            Some(Some(Err(error))) => match classify(&error) {
                Some((cause, reason)) => {
                    self.close(cause, reason).await;
                    self.closing = self.closing.and(Some(Closing::Hold));
                }
                None => self.closed = Some(CloseCause::Error),
            },
            Some(Some(Ok(Message::Close(_)))) => {
                self.closed = Some(CloseCause::Peer);
                // The reply (RFC 6455 5.5.1: a close is answered with a
                // close) is queued, not sent: reading once more writes
                // it and ends the stream (when the socket is dropped).
                self.closing = Some(Closing::Discard);
            }
            Some(Some(Ok(Message::Ping(_) | Message::Pong(_)))) => {}
            Some(Some(Ok(message)))
                if message_len(&message) > self.limits.inner.max_message_bytes =>
            {
                self.close(CloseCause::TooBig, "message too big").await;
            }
            Some(Some(Ok(message))) => return Some(message),
        }
        None
    }

    /// Drops the held message that exceeded `quota` with the notice, or
    /// closes the socket after too many drops in a row.
    async fn drop_held(&mut self, quota: &str, wait: Duration) {
        self.drops = self.drops.saturating_add(1);
        let ladder = self.limits.inner.close_after_drops;
        if ladder > 0 && self.drops >= ladder {
            return self
                .close(CloseCause::DropLadder, "rate limit exceeded repeatedly")
                .await;
        }
        let notice = json!({
            "type": "rate_limited",
            "quota": quota,
            "retry_after_ms": ceil_millis(wait),
        });
        let text = Message::Text(notice.to_string().into());
        if present(&mut self.socket).send(text).await.is_err() {
            self.closed = Some(CloseCause::Error);
        }
        self.held = None;
    }

    /// Sends a message (unlimited: limits apply to inbound messages).
    pub async fn send(&mut self, message: Message) -> Result<(), axum::Error> {
        present(&mut self.socket).send(message).await
    }

    /// Closes with `code` and `reason` and stops yielding messages, the way
    /// the guard's own closes do (see [`close_timeout`]): the close is
    /// sent, and once the `GuardedSocket` is dropped, what the peer still
    /// sends is read and discarded until its close arrives, so the close
    /// reaches a peer that keeps writing instead of a TCP reset. A no-op
    /// once the socket is closed.
    ///
    /// [`close_timeout`]: super::MessageLimitsBuilder::close_timeout
    pub async fn close_with(&mut self, code: u16, reason: &str) {
        if self.closed.is_some() {
            return;
        }
        self.send_close(CloseCause::Peer, code, reason).await;
    }

    /// The socket itself.
    pub fn get_mut(&mut self) -> &mut WebSocket {
        present(&mut self.socket)
    }

    /// Unwraps the socket. The guard's closing handshake (see
    /// [`close_with`](Self::close_with)) is then the caller's: a closed
    /// socket should be read until the peer's close before it is dropped.
    pub fn into_inner(mut self) -> WebSocket {
        self.closing = None;
        match self.socket.take() {
            Some(socket) => socket,
            None => unreachable!("the socket is present until the guard is consumed"),
        }
    }

    /// Closes for `cause` with its code and `reason`.
    async fn close(&mut self, cause: CloseCause, reason: &str) {
        let code = match cause {
            CloseCause::InvalidUtf8 => CLOSE_INVALID_PAYLOAD,
            CloseCause::ProtocolError => CLOSE_PROTOCOL_ERROR,
            CloseCause::TooBig => CLOSE_TOO_BIG,
            _ => CLOSE_POLICY,
        };
        self.send_close(cause, code, reason).await;
    }

    /// Sends the close; the connection is then finished when the guard is
    /// dropped (see [`Closing`]).
    async fn send_close(&mut self, cause: CloseCause, code: u16, reason: &str) {
        self.closed = Some(cause);
        self.held = None;
        if !send_close(present(&mut self.socket), code, reason).await {
            return;
        }
        self.closing = Some(Closing::Discard);
    }
}

impl Drop for GuardedSocket {
    fn drop(&mut self) {
        let (Some(closing), Some(mut socket)) = (self.closing.take(), self.socket.take()) else {
            return;
        };
        let wait = self.limits.inner.close_timeout;
        // Without a runtime (never under axum) the connection just drops.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                match closing {
                    Closing::Hold => tokio::time::sleep(wait).await,
                    Closing::Discard => discard_until_close(&mut socket, wait).await,
                }
            });
        }
    }
}

/// Sends a close with `code` and `reason`: whether it went out (a failure
/// is logged).
pub(super) async fn send_close(socket: &mut WebSocket, code: u16, reason: &str) -> bool {
    let frame = CloseFrame {
        code,
        reason: reason.into(),
    };
    let sent = socket.send(Message::Close(Some(frame))).await;
    if let Err(error) = &sent {
        tracing::debug!(%error, "websocket close failed");
    }
    sent.is_ok()
}

/// Reads and discards what the peer sends until its close or the end of
/// the connection (reading also writes a queued reply to its close), for
/// at most `wait`: a peer that never answers does not hold the socket.
pub(super) async fn discard_until_close(socket: &mut WebSocket, wait: Duration) {
    let discard = async {
        for _ in 0..MAX_DISCARDED {
            match socket.recv().await {
                Some(Ok(Message::Close(_)) | Err(_)) | None => return,
                Some(Ok(_)) => {}
            }
        }
    };
    let _ = tokio::time::timeout(wait, discard).await;
}

/// The socket of a guard that has not been consumed.
fn present(socket: &mut Option<WebSocket>) -> &mut WebSocket {
    match socket {
        Some(socket) => socket,
        None => unreachable!("the socket is present until the guard is consumed"),
    }
}

/// Charges one message of `len` bytes: the denial, if a quota refused it
/// (borrows no socket: the future stays `Send`).
async fn charge(limits: &MessageLimits, key: &WindowKey, len: usize) -> Result<(), Decision> {
    let inner = &*limits.inner;
    let bytes = u32::try_from(len).unwrap_or(u32::MAX);
    let charges: [(Option<&Policy>, u32); 2] =
        [(inner.messages.as_ref(), 1), (inner.bytes.as_ref(), bytes)];
    for (policy, cost) in charges {
        let Some(policy) = policy else { continue };
        if cost == 0 {
            continue; // an empty message costs no bytes
        }
        match inner.limiter.check_policy(key, policy, cost).await {
            Ok(decision) if decision.allowed() => {}
            Ok(denied) => return Err(denied),
            // No fallback configured and the store failed: a store
            // outage never stalls or closes a socket.
            Err(error) => tracing::debug!(%error, "message limit check failed; admitted"),
        }
    }
    Ok(())
}

impl fmt::Debug for GuardedSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GuardedSocket")
            .field("limits", &self.limits)
            .field("drops", &self.drops)
            .field("closed", &self.closed)
            .finish_non_exhaustive()
    }
}

/// `future`'s output, or `None` if the seat is lost first (never without a
/// seat).
async fn until_lost<T>(lost: &mut Option<SeatLost>, future: impl Future<Output = T>) -> Option<T> {
    let lost = async {
        match lost {
            Some(lost) => lost.wait().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        biased;
        () = lost => None,
        output = future => Some(output),
    }
}

fn ceil_millis(wait: Duration) -> u64 {
    let micros = u64::try_from(wait.as_micros()).unwrap_or(u64::MAX);
    micros.div_ceil(1_000)
}

/// The payload length of a text or binary message (0 otherwise).
fn message_len(message: &Message) -> usize {
    match message {
        Message::Text(text) => text.len(),
        Message::Binary(bytes) => bytes.len(),
        _ => 0,
    }
}

/// Which read errors the guard answers with a close, and its reason.
fn classify(error: &axum::Error) -> Option<(CloseCause, &'static str)> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(current) = source {
        if let Some(error) = current.downcast_ref::<tungstenite::Error>() {
            return match error {
                tungstenite::Error::Utf8(_) => Some((CloseCause::InvalidUtf8, "invalid utf-8")),
                tungstenite::Error::Capacity(_) => Some((CloseCause::TooBig, "message too big")),
                tungstenite::Error::Protocol(_) => {
                    Some((CloseCause::ProtocolError, "protocol error"))
                }
                _ => None,
            };
        }
        source = current.source();
    }
    None
}
