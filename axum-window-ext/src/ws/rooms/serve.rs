//! [`RoomSession::serve`]: a ready-made room socket loop, over a plain
//! axum `WebSocket` or a [`GuardedSocket`](crate::ws::GuardedSocket).

use axum::extract::ws::{Message, Utf8Bytes, WebSocket};
use futures_util::SinkExt;

use super::session::{Outgoing, RoomSession};
use super::socket::RoomSocket;
use super::{CLOSE_OVERFLOW, CLOSE_STORE_ERROR, CLOSE_UNSUPPORTED};

/// How many frames one write may carry (see [`RoomSession::send_ready`]).
pub const FRAMES_PER_FLUSH: usize = 64;

impl RoomSession {
    /// Serves this session on `socket` until either side closes: the
    /// session's frames out; every text message in, published to the room
    /// as sent by `from` (a failed append is answered with
    /// [`unavailable`](Self::unavailable) and the socket stays open).
    ///
    /// Closes as the room protocol says: a binary message with
    /// [`CLOSE_UNSUPPORTED`] (1003), a store failure while reading with
    /// [`CLOSE_STORE_ERROR`] (1011), an overflow (after its `resync`) with
    /// [`CLOSE_OVERFLOW`] (1013); each close is sent, then the peer's
    /// answer awaited for a bounded time.
    ///
    /// On a plain `WebSocket` no limits apply to inbound messages. On a
    /// [`GuardedSocket`](crate::ws::GuardedSocket) each is charged to its
    /// message and byte quotas first, and the guard's closes (1008, 1009,
    /// ...) end the loop. For deduplication or batching, write the loop
    /// yourself with [`next`](Self::next), [`send_ready`](Self::send_ready)
    /// and [`publish`](Self::publish): this one is
    ///
    /// ```
    /// use axum::extract::ws::Message;
    /// use axum_window_ext::ws::rooms::{Outgoing, RoomSession, CLOSE_OVERFLOW, CLOSE_STORE_ERROR, CLOSE_UNSUPPORTED};
    /// use axum_window_ext::ws::GuardedSocket;
    ///
    /// async fn serve(mut session: RoomSession, mut socket: GuardedSocket, from: &str) {
    ///     loop {
    ///         tokio::select! { // both arms are cancel-safe
    ///             frame = session.next() => match frame {
    ///                 Ok(Some(Outgoing::Text(text))) => {
    ///                     if session.send_ready(socket.get_mut(), Some(text)).await.is_err() { return }
    ///                 }
    ///                 Ok(Some(Outgoing::Overflow(text))) => { // too slow: told to resync, closed
    ///                     let _ = socket.send(Message::Text(text)).await;
    ///                     return socket.close_with(CLOSE_OVERFLOW, "too slow").await;
    ///                 }
    ///                 Ok(None) => return,
    ///                 Err(_) => return socket.close_with(CLOSE_STORE_ERROR, "store unavailable").await,
    ///             },
    ///             message = socket.recv() => match message { // admitted by the limits
    ///                 Some(Message::Text(text)) => {
    ///                     if session.publish(from, text.as_str()).await.is_err() {
    ///                         let _ = socket.send(Message::Text(session.unavailable())).await;
    ///                     }
    ///                     let _ = session.send_ready(socket.get_mut(), None).await; // out before in
    ///                 }
    ///                 Some(Message::Binary(_)) => {
    ///                     return socket.close_with(CLOSE_UNSUPPORTED, "rooms take text messages").await;
    ///                 }
    ///                 Some(_) => {}
    ///                 None => return, // closed by the peer or by the guard
    ///             },
    ///         }
    ///     }
    /// }
    /// ```
    pub async fn serve(mut self, mut socket: impl RoomSocket, from: &str) {
        let (code, reason) = loop {
            // Both arms are cancel-safe: a frame or message not taken now
            // is taken by the next turn.
            tokio::select! {
                frame = self.next() => match frame {
                    Ok(Some(Outgoing::Text(text))) => {
                        if self.send_ready(socket.frames(), Some(text)).await.is_err() {
                            return;
                        }
                    }
                    Ok(Some(Outgoing::Overflow(text))) => {
                        if socket.frames().send(Message::Text(text)).await.is_err() {
                            return;
                        }
                        break (CLOSE_OVERFLOW, "too slow");
                    }
                    Ok(None) => break (CLOSE_GOING_AWAY, "left the room"),
                    Err(error) => {
                        tracing::warn!(%error, "reading a room failed");
                        break (CLOSE_STORE_ERROR, "store unavailable");
                    }
                },
                message = socket.next_message() => match message {
                    Some(Message::Text(text)) => {
                        if let Err(error) = self.publish(from, text.as_str()).await {
                            tracing::warn!(%error, "publishing to a room failed");
                            if socket.frames().send(Message::Text(self.unavailable())).await.is_err() {
                                return;
                            }
                        }
                        // Out before in (see `send_ready`).
                        if self.send_ready(socket.frames(), None).await.is_err() {
                            return;
                        }
                    }
                    Some(Message::Binary(_)) => {
                        break (CLOSE_UNSUPPORTED, "rooms take text messages");
                    }
                    Some(Message::Close(_)) => {
                        socket.closed_by_peer().await;
                        return;
                    }
                    // Pings are answered by axum.
                    Some(Message::Ping(_) | Message::Pong(_)) => {}
                    None => return,
                },
            }
        };
        // Out of the room before the (bounded) close handshake.
        drop(self);
        socket.close(code, reason).await;
    }

    /// Writes `first` (a frame [`next`](Self::next) gave), then every frame
    /// [`ready_now`](Self::ready_now), at most [`FRAMES_PER_FLUSH`] in all,
    /// and flushes once if it wrote any: a burst of events costs one write
    /// instead of one per frame, and each frame still leaves as soon as it
    /// is ready. (With `TCP_NODELAY` on the socket, as a latency-minded
    /// server sets it, a flush per frame would also be a TCP segment per
    /// frame.) A loop that publishes calls it with `None` after each
    /// publish too, so the socket's own events go out before it reads
    /// more, and a fast publisher is held back by its own connection
    /// rather than dropped for a full queue.
    pub async fn send_ready(
        &mut self,
        socket: &mut WebSocket,
        first: Option<Utf8Bytes>,
    ) -> Result<(), axum::Error> {
        let mut written = 0;
        if let Some(first) = first {
            socket.feed(Message::Text(first)).await?;
            written += 1;
        }
        while written < FRAMES_PER_FLUSH {
            let Some(text) = self.ready_now() else {
                break;
            };
            socket.feed(Message::Text(text)).await?;
            written += 1;
        }
        if written == 0 {
            return Ok(());
        }
        socket.flush().await
    }
}

/// Close code 1001 (going away): the session ended without a reason of
/// the protocol's own.
const CLOSE_GOING_AWAY: u16 = 1001;
