//! What the rooms tests share: a user's own router with rooms (as the
//! `ws::rooms` docs show, plus a resume position from the query), served on
//! a loopback port, and tokio-tungstenite clients.
#![allow(clippy::unwrap_used, dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use axum_window_ext::ws::rooms::{RoomHub, RoomHubBuilder, RoomName};
use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use serde_json::Value;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;
use tower_window::events::{EventWindow, Position, Retention};
use tower_window::Store;

pub type Ws = WebSocketStream<TcpStream>;

/// Every wait is bounded: a lost frame fails the test, never hangs it.
pub const WAIT: Duration = Duration::from_secs(20);

/// The one place these tests make an event window: rooms in `store`,
/// keeping 10 minutes / 10,000 events.
pub fn hub(store: impl Into<Store>) -> RoomHubBuilder {
    let retention = Retention::new(Duration::from_secs(600), 10_000).unwrap();
    RoomHub::builder(EventWindow::new(store, retention))
}

#[derive(Debug, Deserialize)]
struct Join {
    user: Option<String>,
    epoch: Option<String>,
    last_event_id: Option<String>,
}

/// `GET /rooms/{room}?user=U[&epoch=E[&last_event_id=ID]]`: a socket in
/// the room, resuming from the position if given (a malformed one is 400).
async fn join(
    State(hub): State<RoomHub>,
    Path(room): Path<RoomName>,
    Query(join): Query<Join>,
    upgrade: WebSocketUpgrade,
) -> Response {
    let resume = match &join.epoch {
        Some(epoch) => match Position::parse(epoch, join.last_event_id.as_deref().unwrap_or("")) {
            Ok(position) => Some(position),
            Err(_) => return StatusCode::BAD_REQUEST.into_response(),
        },
        None => None,
    };
    let user = join.user.unwrap_or_else(|| "guest".to_owned());
    upgrade.on_upgrade(move |socket| async move { hub.serve(socket, &room, resume, &user).await })
}

/// Serves `hub` on a loopback port; with `send_buffer`, every accepted
/// socket's kernel send buffer is that small (it inherits the listener's),
/// so a client that stops reading stalls the server's writes at once.
pub async fn serve(hub: RoomHub, send_buffer: Option<u32>) -> SocketAddr {
    let socket = TcpSocket::new_v4().unwrap();
    if let Some(size) = send_buffer {
        socket.set_send_buffer_size(size).unwrap();
    }
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener: TcpListener = socket.listen(64).unwrap();
    let address = listener.local_addr().unwrap();
    let app = Router::new()
        .route("/rooms/{room}", get(join))
        .with_state(hub);
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    address
}

async fn tcp(address: SocketAddr, recv_buffer: Option<u32>) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    if let Some(size) = recv_buffer {
        socket.set_recv_buffer_size(size).unwrap();
    }
    tokio::time::timeout(WAIT, socket.connect(address))
        .await
        .expect("connect in time")
        .unwrap()
}

/// A client of `path` (`/rooms/R?...`); with `recv_buffer`, a small kernel
/// receive buffer.
pub async fn connect(address: SocketAddr, path: &str, recv_buffer: Option<u32>) -> Ws {
    let request = format!("ws://{address}{path}")
        .into_client_request()
        .unwrap();
    let stream = tcp(address, recv_buffer).await;
    let (ws, _) = tokio::time::timeout(WAIT, tokio_tungstenite::client_async(request, stream))
        .await
        .expect("handshake in time")
        .unwrap();
    ws
}

/// The HTTP status the upgrade of `path` is answered with (101 if it
/// upgraded).
pub async fn status_of(address: SocketAddr, path: &str) -> u16 {
    let request = format!("ws://{address}{path}")
        .into_client_request()
        .unwrap();
    let stream = tcp(address, None).await;
    match tokio::time::timeout(WAIT, tokio_tungstenite::client_async(request, stream))
        .await
        .expect("an answer in time")
    {
        Ok(_) => 101,
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => response.status().as_u16(),
        Err(other) => panic!("{other}"),
    }
}

/// The next frame: `Ok(json)` for a text frame, `Err(close)` for a close.
pub async fn frame(ws: &mut Ws) -> Result<Value, Option<CloseFrame>> {
    loop {
        let message = tokio::time::timeout(WAIT, ws.next())
            .await
            .expect("a frame in time")
            .expect("the socket is open")
            .unwrap();
        match message {
            Message::Text(text) => return Ok(serde_json::from_str(&text).unwrap()),
            Message::Close(close) => return Err(close),
            _ => {}
        }
    }
}

/// The next frame, which must be a text frame.
pub async fn recv(ws: &mut Ws) -> Value {
    frame(ws).await.expect("a text frame, not a close")
}

pub async fn send(ws: &mut Ws, text: &str) {
    ws.send(Message::text(text)).await.unwrap();
}

pub fn s(value: &Value, field: &str) -> String {
    value[field].as_str().unwrap_or_default().to_owned()
}

pub fn numbered(range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("m{i}")).collect()
}

/// Reads `n` frames that must all be events of `room`; their `data`.
pub async fn events(ws: &mut Ws, room: &str, n: usize) -> Vec<Value> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let message = recv(ws).await;
        assert_eq!(s(&message, "type"), "event", "{message}");
        assert_eq!(s(&message, "room"), room);
        out.push(message);
    }
    out
}

pub fn data(events: &[Value]) -> Vec<String> {
    events.iter().map(|e| s(e, "data")).collect()
}

/// Reads a resumed session's frames until the event `last` and a
/// `recovered` arrived (at most `bound` frames): the events' `data` in
/// order, and where each `recovered` came (its index among the events)
/// with its count.
pub async fn resumed_until(
    ws: &mut Ws,
    room: &str,
    last: &str,
    bound: usize,
) -> (Vec<String>, Vec<(usize, u64)>) {
    let (mut data, mut recovered) = (Vec::new(), Vec::new());
    for _ in 0..bound {
        let message = recv(ws).await;
        assert_eq!(s(&message, "room"), room, "{message}");
        match s(&message, "type").as_str() {
            "event" => data.push(s(&message, "data")),
            "recovered" => recovered.push((data.len(), message["count"].as_u64().unwrap())),
            _ => panic!("unexpected {message}"),
        }
        if !recovered.is_empty() && data.last().is_some_and(|d| d == last) {
            return (data, recovered);
        }
    }
    panic!("{last} not within {bound} frames; got {data:?}");
}
