//! [`RoomSession::serve`]: a ready-made room socket loop.

use axum::extract::ws::{Message, Utf8Bytes, WebSocket};
use futures_util::SinkExt;

use super::session::{Outgoing, RoomSession};
use super::socket::RoomSocket;
use super::{CLOSE_OVERFLOW, CLOSE_STORE_ERROR, CLOSE_UNSUPPORTED};

/// The most frames [`RoomSession::send_ready`] writes before it flushes.
pub const FRAMES_PER_FLUSH: usize = 64;

impl RoomSession {
    /// Serves this session on `socket` until either side closes: the
    /// session's frames out; every text message in, published as sent by
    /// `from` (a failed append is answered with
    /// [`unavailable`](Self::unavailable)). A binary message closes with
    /// [`CLOSE_UNSUPPORTED`], a store failure with [`CLOSE_STORE_ERROR`],
    /// an overflow with [`CLOSE_OVERFLOW`]; the peer's answer is awaited
    /// for a bounded time. On a [`GuardedSocket`](crate::ws::GuardedSocket)
    /// inbound messages are charged first.
    ///
    /// For deduplication or batching, write the loop yourself; this one is
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
    /// and flushes once if it wrote any. Call it with `None` after each
    /// publish too: the socket's own events then go out before it reads
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

/// Close code 1001 (going away).
const CLOSE_GOING_AWAY: u16 = 1001;
