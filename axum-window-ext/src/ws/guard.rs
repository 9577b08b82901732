//! [`GuardedSocket`]: an axum `WebSocket` whose inbound messages are charged.

use std::fmt;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket};
use serde_json::json;
use tower_window::conn::{ConnectionSeat, SeatLost};
use tower_window::{Policy, WindowKey};

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
    /// The socket can no longer be read: it ended, or a read failed
    /// (after an error axum's socket yields nothing more).
    unreadable: bool,
    /// What the connection needs after a close, before it is dropped.
    closing: Option<Closing>,
}

/// The outcome of charging one message.
enum Charge {
    Admitted,
    Exceeded {
        quota: String,
        retry_after: Option<Duration>,
    },
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
            unreadable: false,
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
        if self.closed.is_some() {
            return None;
        }
        loop {
            if let Some(len) = self.held.as_ref().map(message_len) {
                match self.admit(len).await {
                    Some(admitted) => return admitted,
                    None => continue,
                }
            }
            let next = tokio::select! {
                biased;
                () = lost(&mut self.lost) => {
                    self.close(CloseCause::SeatLost, CLOSE_POLICY, "connection seat lost").await;
                    return None;
                }
                next = present(&mut self.socket).recv() => next,
            };
            let message = match next {
                None => {
                    self.closed = Some(CloseCause::Peer);
                    self.unreadable = true;
                    return None;
                }
                Some(Err(error)) => {
                    self.unreadable = true;
                    match classify(&error) {
                        Some(CloseCause::InvalidUtf8) => {
                            self.close(
                                CloseCause::InvalidUtf8,
                                CLOSE_INVALID_PAYLOAD,
                                "invalid utf-8",
                            )
                            .await;
                        }
                        Some(CloseCause::TooBig) => {
                            self.close(CloseCause::TooBig, CLOSE_TOO_BIG, "message too big")
                                .await;
                        }
                        Some(CloseCause::ProtocolError) => {
                            self.close(
                                CloseCause::ProtocolError,
                                CLOSE_PROTOCOL_ERROR,
                                "protocol error",
                            )
                            .await;
                        }
                        _ => self.closed = Some(CloseCause::Error),
                    }
                    return None;
                }
                Some(Ok(message)) => message,
            };
            let len = match &message {
                Message::Text(text) => text.len(),
                Message::Binary(bytes) => bytes.len(),
                Message::Close(_) => {
                    self.closed = Some(CloseCause::Peer);
                    self.unreadable = true;
                    // The reply (RFC 6455 5.5.1: a close is answered with a
                    // close) is queued, not sent: reading once more writes
                    // it and ends the stream (when the socket is dropped).
                    self.closing = Some(Closing::Discard);
                    return None;
                }
                Message::Ping(_) | Message::Pong(_) => continue,
            };
            if len > self.limits.inner.max_message_bytes {
                self.close(CloseCause::TooBig, CLOSE_TOO_BIG, "message too big")
                    .await;
                return None;
            }
            // Held until admitted or dropped: cancel-safe from here on.
            self.held = Some(message);
            if let Some(admitted) = self.admit(len).await {
                return admitted;
            }
        }
    }

    /// Charges the held message of `len` bytes: `Some(Some(message))` when
    /// admitted, `Some(None)` when the socket closed, `None` when it was
    /// dropped (read the next one).
    async fn admit(&mut self, len: usize) -> Option<Option<Message>> {
        loop {
            match charge(&self.limits, &self.key, len).await {
                Charge::Admitted => {
                    self.drops = 0;
                    return Some(self.held.take());
                }
                Charge::Exceeded {
                    retry_after: None, ..
                } => {
                    // More bytes than the byte quota can ever admit.
                    self.close(
                        CloseCause::TooBig,
                        CLOSE_TOO_BIG,
                        "message exceeds the quota",
                    )
                    .await;
                    self.held = None;
                    return Some(None);
                }
                Charge::Exceeded {
                    quota,
                    retry_after: Some(wait),
                } => match self.limits.inner.on_exceed {
                    ExceedAction::Close => {
                        self.close(CloseCause::RateLimited, CLOSE_POLICY, "rate limit exceeded")
                            .await;
                        self.held = None;
                        return Some(None);
                    }
                    ExceedAction::Pause => {
                        // Not reading is the backpressure; the message is kept.
                        tokio::select! {
                            biased;
                            () = lost(&mut self.lost) => {
                                self.close(CloseCause::SeatLost, CLOSE_POLICY, "connection seat lost").await;
                                self.held = None;
                                return Some(None);
                            }
                            () = tokio::time::sleep(wait) => {}
                        }
                    }
                    ExceedAction::Drop => {
                        self.drops = self.drops.saturating_add(1);
                        let ladder = self.limits.inner.close_after_drops;
                        if ladder > 0 && self.drops >= ladder {
                            self.close(
                                CloseCause::DropLadder,
                                CLOSE_POLICY,
                                "rate limit exceeded repeatedly",
                            )
                            .await;
                            self.held = None;
                            return Some(None);
                        }
                        let notice = json!({
                            "type": "rate_limited",
                            "quota": quota,
                            "retry_after_ms": ceil_millis(wait),
                        });
                        if present(&mut self.socket)
                            .send(Message::Text(notice.to_string().into()))
                            .await
                            .is_err()
                        {
                            self.closed = Some(CloseCause::Error);
                            self.held = None;
                            return Some(None);
                        }
                        self.held = None;
                        return None;
                    }
                },
            }
        }
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
        if self.closed.is_some() || self.unreadable {
            return;
        }
        self.close(CloseCause::Peer, code, reason).await;
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

    /// Sends the close; the connection is then finished when the guard is
    /// dropped (see [`Closing`]).
    async fn close(&mut self, cause: CloseCause, code: u16, reason: &str) {
        self.closed = Some(cause);
        self.held = None;
        let frame = CloseFrame {
            code,
            reason: reason.into(),
        };
        if let Err(error) = present(&mut self.socket)
            .send(Message::Close(Some(frame)))
            .await
        {
            tracing::debug!(%error, "websocket close failed");
            return;
        }
        self.closing = Some(if self.unreadable {
            Closing::Hold
        } else {
            Closing::Discard
        });
        self.unreadable = true;
    }
}

impl Drop for GuardedSocket {
    fn drop(&mut self) {
        let (Some(closing), Some(socket)) = (self.closing.take(), self.socket.take()) else {
            return;
        };
        // Without a runtime (never under axum) the connection just drops.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(finish_close(
                socket,
                closing,
                self.limits.inner.close_timeout,
            ));
        }
    }
}

/// Finishes a closed connection (see [`Closing`]), for at most `wait`.
async fn finish_close(mut socket: WebSocket, closing: Closing, wait: Duration) {
    match closing {
        Closing::Hold => tokio::time::sleep(wait).await,
        Closing::Discard => {
            let discard = async {
                for _ in 0..MAX_DISCARDED {
                    match socket.recv().await {
                        // The peer's close: the handshake is complete.
                        Some(Ok(Message::Close(_)) | Err(_)) | None => return,
                        Some(Ok(_)) => {}
                    }
                }
            };
            let _ = tokio::time::timeout(wait, discard).await;
        }
    }
}

/// The socket of a guard that has not been consumed.
fn present(socket: &mut Option<WebSocket>) -> &mut WebSocket {
    match socket {
        Some(socket) => socket,
        None => unreachable!("the socket is present until the guard is consumed"),
    }
}

/// Charges one message of `len` bytes (borrows no socket: the future stays `Send`).
async fn charge(limits: &MessageLimits, key: &WindowKey, len: usize) -> Charge {
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
            Ok(decision) => {
                return Charge::Exceeded {
                    quota: decision.quota().name().to_owned(),
                    retry_after: decision.retry_after(),
                }
            }
            // No fallback configured and the store failed: a store
            // outage never stalls or closes a socket.
            Err(error) => tracing::debug!(%error, "message limit check failed; admitted"),
        }
    }
    Charge::Admitted
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

/// Resolves when the seat is lost; pending without a seat.
async fn lost(lost: &mut Option<SeatLost>) {
    match lost {
        Some(lost) => lost.wait().await,
        None => std::future::pending().await,
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

/// Which read errors the guard answers with a close code.
fn classify(error: &axum::Error) -> Option<CloseCause> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(current) = source {
        if let Some(error) = current.downcast_ref::<tungstenite::Error>() {
            return match error {
                tungstenite::Error::Utf8(_) => Some(CloseCause::InvalidUtf8),
                tungstenite::Error::Capacity(_) => Some(CloseCause::TooBig),
                tungstenite::Error::Protocol(_) => Some(CloseCause::ProtocolError),
                _ => None,
            };
        }
        source = current.source();
    }
    None
}
