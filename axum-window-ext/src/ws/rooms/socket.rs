//! [`RoomSocket`]: the sockets a room session serves on.

use axum::extract::ws::{Message, WebSocket};

use crate::ws::guard::{discard_until_close, send_close};
use crate::ws::{GuardedSocket, MessageLimits};

mod sealed {
    pub trait Sealed {}
    impl Sealed for axum::extract::ws::WebSocket {}
    impl Sealed for crate::ws::GuardedSocket {}
}

/// A socket [`RoomSession::serve`](super::RoomSession::serve) serves a
/// room on: a plain axum `WebSocket` (no limits), or a [`GuardedSocket`].
/// Sealed.
pub trait RoomSocket: sealed::Sealed + Send {
    /// The next message; `None` once the socket ended.
    #[doc(hidden)]
    fn next_message(&mut self) -> impl std::future::Future<Output = Option<Message>> + Send;

    /// The socket frames are written to.
    #[doc(hidden)]
    fn frames(&mut self) -> &mut WebSocket;

    /// After the peer's close: lets the reply go out.
    #[doc(hidden)]
    fn closed_by_peer(&mut self) -> impl std::future::Future<Output = ()> + Send;

    /// Closes with `code` and `reason`, the close reaching the peer.
    #[doc(hidden)]
    fn close(&mut self, code: u16, reason: &str) -> impl std::future::Future<Output = ()> + Send;
}

impl RoomSocket for WebSocket {
    async fn next_message(&mut self) -> Option<Message> {
        self.recv().await?.ok()
    }

    fn frames(&mut self) -> &mut WebSocket {
        self
    }

    async fn closed_by_peer(&mut self) {
        discard_until_close(self, MessageLimits::DEFAULT_CLOSE_TIMEOUT).await;
    }

    async fn close(&mut self, code: u16, reason: &str) {
        if send_close(self, code, reason).await {
            discard_until_close(self, MessageLimits::DEFAULT_CLOSE_TIMEOUT).await;
        }
    }
}

impl RoomSocket for GuardedSocket {
    async fn next_message(&mut self) -> Option<Message> {
        self.recv().await
    }

    fn frames(&mut self) -> &mut WebSocket {
        self.get_mut()
    }

    /// The guard answers the peer's close itself (`recv` yields no close).
    async fn closed_by_peer(&mut self) {}

    async fn close(&mut self, code: u16, reason: &str) {
        self.close_with(code, reason).await;
    }
}
