//! The WebSocket echo behind `GET /ws`, and rooms behind `GET /ws?room=R`.

use axum::extract::ws::{close_code, CloseFrame, Message, WebSocket};
use tower_window::events::Position;

use super::rooms::{Outgoing, RoomHub};

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

/// A socket in a room: the session's frames (welcome, history, live
/// events) out, every text message in as an event of the room.
pub(super) async fn room(
    mut socket: WebSocket,
    hub: RoomHub,
    room: String,
    user: String,
    resume: Option<Position>,
) {
    let mut session = match hub.join(&room, resume).await {
        Ok(session) => session,
        Err(error) => {
            tracing::warn!(%error, "joining a room failed");
            close(socket, close_code::ERROR, "store unavailable").await;
            return;
        }
    };
    loop {
        tokio::select! {
            frame = session.next() => match frame {
                Ok(Some(Outgoing::Text(text))) => {
                    if socket.send(Message::Text(text)).await.is_err() {
                        return;
                    }
                }
                Ok(Some(Outgoing::Overflow(text))) => {
                    // Too slow for the room: tell it to resync, and go.
                    let _ = socket.send(Message::Text(text)).await;
                    close(socket, close_code::AGAIN, "too slow").await;
                    return;
                }
                Ok(None) => return,
                Err(error) => {
                    tracing::warn!(%error, "reading a room failed");
                    close(socket, close_code::ERROR, "store unavailable").await;
                    return;
                }
            },
            message = socket.recv() => match message {
                Some(Ok(Message::Text(text))) => {
                    if let Err(error) = session.publish(&user, text.as_str(), None).await {
                        tracing::warn!(%error, "publishing to a room failed");
                        let notice = serde_json::json!({
                            "type": "error",
                            "room": session.room(),
                            "reason": "unavailable",
                        });
                        if socket.send(Message::Text(notice.to_string().into())).await.is_err() {
                            return;
                        }
                    }
                }
                Some(Ok(Message::Binary(_))) => {
                    close(socket, close_code::UNSUPPORTED, "rooms take text messages").await;
                    return;
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return,
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
            },
        }
    }
}

async fn close(mut socket: WebSocket, code: u16, reason: &'static str) {
    let frame = CloseFrame {
        code,
        reason: reason.into(),
    };
    let _ = socket.send(Message::Close(Some(frame))).await;
}
