//! The WebSocket echo behind `GET /ws`.

use axum::extract::ws::{Message, WebSocket};

/// Sends every text and binary message back until the client closes.
pub(super) async fn echo(mut socket: WebSocket) {
    while let Some(message) = socket.recv().await {
        let message = match message {
            Ok(message) => message,
            Err(error) => {
                tracing::debug!(%error, "websocket receive failed");
                return;
            }
        };
        match message {
            Message::Text(_) | Message::Binary(_) => {
                if let Err(error) = socket.send(message).await {
                    tracing::debug!(%error, "websocket send failed");
                    return;
                }
            }
            Message::Close(_) => return,
            // axum answers pings itself.
            Message::Ping(_) | Message::Pong(_) => {}
        }
    }
}
