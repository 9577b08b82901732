//! [`GuardedSocket`]: an axum `WebSocket` whose inbound messages are charged.

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

/// What a closed connection needs before it is dropped (by a task the
/// guard's drop spawns): dropped with the peer's frames unread, it is
/// reset, and a peer still writing would see the reset, not the close.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Closing {
    /// Read and discard until the peer's close; after the peer's own close
    /// this also writes the queued reply.
    Discard,
    /// Wait without reading: after a read error axum's socket yields
    /// nothing more, but the close can still reach the peer.
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
    /// A WebSocket protocol violation: closed with 1002.
    ProtocolError,
    /// A message over the size limit or the byte quota: closed with 1009.
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
#[derive(Debug)]
pub struct GuardedSocket {
    /// Present until [`into_inner`](Self::into_inner) or the drop.
    socket: Option<WebSocket>,
    limits: MessageLimits,
    key: WindowKey,
    lost: Option<SeatLost>,
    drops: u32,
    closed: Option<CloseCause>,
    /// Read but not yet admitted: kept across a cancelled `recv`.
    held: Option<Message>,
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
    /// closed (see [`close_cause`](Self::close_cause)). Dropped messages
    /// are answered with the notice and never yielded.
    ///
    /// Cancel-safe: a message read but not yet admitted is charged again
    /// by the next call (so it may be counted twice), never lost.
    pub async fn recv(&mut self) -> Option<Message> {
        while self.closed.is_none() {
            let Some(held) = &self.held else {
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

    /// The next message worth charging; `None` for a ping or a pong, and
    /// once the socket closed (then `closed` is set).
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
                // The reply to the close is queued, not sent: reading once
                // more (when the guard is dropped) writes it.
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

    /// Drops the held message with the notice, or closes after too many
    /// drops in a row.
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

    /// Closes with `code` and `reason` as the guard's own closes do: once
    /// the guard is dropped, what the peer still sends is discarded until
    /// its close (see
    /// [`close_timeout`](super::MessageLimitsBuilder::close_timeout)). A
    /// no-op once the socket is closed.
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

    /// Unwraps the socket; finishing a closing handshake (see
    /// [`close_with`](Self::close_with)) is then the caller's job.
    pub fn into_inner(mut self) -> WebSocket {
        self.closing = None;
        self.socket.take().expect(PRESENT)
    }

    async fn close(&mut self, cause: CloseCause, reason: &str) {
        let code = match cause {
            CloseCause::InvalidUtf8 => CLOSE_INVALID_PAYLOAD,
            CloseCause::ProtocolError => CLOSE_PROTOCOL_ERROR,
            CloseCause::TooBig => CLOSE_TOO_BIG,
            _ => CLOSE_POLICY,
        };
        self.send_close(cause, code, reason).await;
    }

    async fn send_close(&mut self, cause: CloseCause, code: u16, reason: &str) {
        self.closed = Some(cause);
        self.held = None;
        if send_close(present(&mut self.socket), code, reason).await {
            self.closing = Some(Closing::Discard);
        }
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

/// Whether the close went out (a failure is logged).
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

/// Reads and discards until the peer's close or the end, for at most
/// `wait` (reading also writes a queued reply to the peer's close).
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

fn present(socket: &mut Option<WebSocket>) -> &mut WebSocket {
    socket.as_mut().expect(PRESENT)
}

const PRESENT: &str = "the socket is present until the guard is consumed";

/// Charges one message of `len` bytes; `Err` is the denial. Borrows no
/// socket, so the future stays `Send`.
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
            // A store outage (without a fallback) never stalls or closes a
            // socket.
            Err(error) => tracing::debug!(%error, "message limit check failed; admitted"),
        }
    }
    Ok(())
}

/// `future`'s output, or `None` if the seat is lost first.
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

/// The close, if any, the guard answers a read error with.
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
