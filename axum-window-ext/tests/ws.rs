//! `ws::GuardedSocket` behind a real axum server on loopback: the notice a
//! dropped message gets, and every close the guard (or the application)
//! decides, each reaching a client that keeps sending.
//!
//! The close tests speak raw frames over TCP: a client library stops
//! writing once it has read a close, and what is tested is a client whose
//! writer is ahead of its reader (issue 26, bug 4: with four frames sent
//! back to back, the client saw a TCP reset instead of the 1009). Every
//! read is bounded by [`PATIENCE`]; nothing is timed.
#![allow(clippy::unwrap_used)]

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::ws::WebSocketUpgrade;
use axum::extract::State;
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use axum_window_ext::ws::{
    CloseCause, ExceedAction, GuardedSocket, MessageLimits, MessageLimitsBuilder,
};
use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use tower_window::conn::{Acquire, ConnectionLimiter};
use tower_window::{Limiter, ManualClock, MemoryStore, Quota, Store, WindowKey};

/// Every read waits at most this long (a bound, never asserted as a speed).
const PATIENCE: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------- server

#[derive(Clone)]
struct App {
    limits: MessageLimits,
    /// Each socket holds a lease of this limiter (and closes when it is lost).
    connections: Option<ConnectionLimiter>,
    /// The application closes with this after the first admitted message,
    /// as the gateway's rooms do (1003 binary, 1011 store, 1013 too slow).
    close_after_first: Option<(u16, &'static str)>,
    /// Why each socket stopped.
    causes: mpsc::UnboundedSender<Option<CloseCause>>,
}

async fn ws(State(app): State<App>, upgrade: WebSocketUpgrade) -> Response {
    let key = WindowKey::for_subject("ann");
    let lease = match &app.connections {
        Some(connections) => match connections.acquire(&key).await.unwrap() {
            Acquire::Granted(lease) => Some(lease),
            Acquire::Denied(denied) => panic!("no cap in these tests: {denied:?}"),
        },
        None => None,
    };
    let limits = app.limits.clone();
    limits
        .configure(upgrade)
        .on_upgrade(move |socket| async move {
            let mut socket = GuardedSocket::new(socket, app.limits.clone(), key);
            if let Some(lease) = &lease {
                socket = socket.with_seat(lease);
            }
            while let Some(message) = socket.recv().await {
                if let Some((code, reason)) = app.close_after_first {
                    socket.close_with(code, reason).await;
                    break;
                }
                if socket.send(message).await.is_err() {
                    break;
                }
            }
            let _ = app.causes.send(socket.close_cause());
            drop(lease);
        })
}

struct Server {
    addr: SocketAddr,
    causes: mpsc::UnboundedReceiver<Option<CloseCause>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Server {
    async fn start(
        limits: MessageLimits,
        connections: Option<ConnectionLimiter>,
        close_after_first: Option<(u16, &'static str)>,
    ) -> Self {
        let (tx, causes) = mpsc::unbounded_channel();
        let app = App {
            limits,
            connections,
            close_after_first,
            causes: tx,
        };
        let router = Router::new().route("/ws", get(ws)).with_state(app);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, router).await.unwrap();
        });
        Self { addr, causes, task }
    }

    /// Why the next socket stopped.
    async fn cause(&mut self) -> Option<CloseCause> {
        tokio::time::timeout(PATIENCE, self.causes.recv())
            .await
            .expect("the socket stopped within the bound")
            .expect("the server runs")
    }
}

/// Limits on a fresh memory store (no quota unless `build` adds one). A
/// closing socket waits for the client as long as the test does.
fn limits(build: impl FnOnce(MessageLimitsBuilder) -> MessageLimitsBuilder) -> MessageLimits {
    let limiter = Limiter::new(MemoryStore::new(), "1000000/1m".parse::<Quota>().unwrap());
    build(MessageLimits::builder(limiter).close_timeout(PATIENCE)).build()
}

// ---------------------------------------------------------------- raw client

/// A WebSocket client over raw TCP: it writes what it is told, when it is
/// told, whatever it has read.
struct Raw(TcpStream);

/// A client frame: FIN, `opcode`, masked (or not) `payload`.
fn frame(opcode: u8, payload: &[u8], masked: bool) -> Vec<u8> {
    let mut out = vec![0x80 | opcode];
    let mask_bit = if masked { 0x80 } else { 0 };
    match payload.len() {
        n @ 0..=125 => out.push(mask_bit | u8::try_from(n).unwrap()),
        n @ 126..=65_535 => {
            out.push(mask_bit | 126);
            out.extend_from_slice(&u16::try_from(n).unwrap().to_be_bytes());
        }
        n => {
            out.push(mask_bit | 127);
            out.extend_from_slice(&u64::try_from(n).unwrap().to_be_bytes());
        }
    }
    if masked {
        let mask = [0x37, 0xfa, 0x21, 0x3d];
        out.extend_from_slice(&mask);
        out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    } else {
        out.extend_from_slice(payload);
    }
    out
}

fn text(payload: &[u8]) -> Vec<u8> {
    frame(0x1, payload, true)
}

fn close(code: u16, reason: &str) -> Vec<u8> {
    let mut payload = code.to_be_bytes().to_vec();
    payload.extend_from_slice(reason.as_bytes());
    frame(0x8, &payload, true)
}

impl Raw {
    async fn connect(addr: SocketAddr) -> Self {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(
                b"GET /ws HTTP/1.1\r\nhost: 127.0.0.1\r\nupgrade: websocket\r\n\
                  connection: upgrade\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
                  sec-websocket-version: 13\r\n\r\n",
            )
            .await
            .unwrap();
        // The response head, byte by byte: nothing after it is consumed.
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            assert!(head.len() < 4096, "an endless response head");
            let byte = tokio::time::timeout(PATIENCE, stream.read_u8())
                .await
                .expect("the upgrade answered within the bound")
                .unwrap();
            head.push(byte);
        }
        let head = String::from_utf8_lossy(&head);
        assert!(head.starts_with("HTTP/1.1 101"), "{head}");
        Self(stream)
    }

    async fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.0.write_all(bytes).await?;
        self.0.flush().await
    }

    /// The next server frame: its opcode and payload.
    async fn frame(&mut self) -> io::Result<(u8, Vec<u8>)> {
        let read = async {
            let mut head = [0u8; 2];
            self.0.read_exact(&mut head).await?;
            assert_eq!(head[1] & 0x80, 0, "server frames are not masked");
            let len = match head[1] & 0x7f {
                126 => u64::from(self.0.read_u16().await?),
                127 => self.0.read_u64().await?,
                n => u64::from(n),
            };
            let mut payload = vec![0; usize::try_from(len).unwrap()];
            self.0.read_exact(&mut payload).await?;
            Ok((head[0] & 0x0f, payload))
        };
        tokio::time::timeout(PATIENCE, read)
            .await
            .expect("a frame within the bound")
    }

    /// The server's close frame (skipping its text and binary frames):
    /// its code and reason.
    async fn close_frame(&mut self) -> (u16, String) {
        for _ in 0..1_000 {
            let (opcode, payload) = self.frame().await.expect("the close frame, not a reset");
            match opcode {
                0x8 => {
                    assert!(payload.len() >= 2, "a close with a code: {payload:?}");
                    let code = u16::from_be_bytes([payload[0], payload[1]]);
                    return (code, String::from_utf8(payload[2..].to_vec()).unwrap());
                }
                0x1 | 0x2 | 0x9 | 0xa => continue,
                other => panic!("unexpected opcode {other}"),
            }
        }
        panic!("no close within 1000 frames");
    }

    /// What is left once the server ends the connection: `Ok(0)` for a
    /// clean end (FIN), an error for a reset.
    async fn end(&mut self) -> io::Result<usize> {
        let mut rest = Vec::new();
        tokio::time::timeout(PATIENCE, self.0.read_to_end(&mut rest))
            .await
            .expect("the connection ended within the bound")?;
        Ok(rest.len())
    }
}

/// Sends `trigger`, then keeps sending without reading: 20 frames before
/// the close is read, 5 after it, then the client's own close. Every write
/// must succeed, the close must carry `code` and `reason`, and with
/// `clean_end` the connection must end with a FIN after the handshake (not
/// a reset).
async fn close_reaches_a_sending_client(
    addr: SocketAddr,
    trigger: &[Vec<u8>],
    code: u16,
    reason: &str,
    clean_end: bool,
) {
    let mut raw = Raw::connect(addr).await;
    for bytes in trigger {
        raw.write(bytes).await.expect("the trigger is written");
    }
    after_trigger(&mut raw, code, reason, clean_end).await;
}

async fn after_trigger(raw: &mut Raw, code: u16, reason: &str, clean_end: bool) {
    for i in 0..20 {
        raw.write(&text(format!("ahead-{i}").as_bytes()))
            .await
            .unwrap_or_else(|e| panic!("write {i} before reading the close: {e}"));
    }
    assert_eq!(raw.close_frame().await, (code, reason.to_owned()));
    for i in 0..5 {
        raw.write(&text(format!("behind-{i}").as_bytes()))
            .await
            .unwrap_or_else(|e| panic!("write {i} after the close was read: {e}"));
    }
    raw.write(&close(1000, "bye"))
        .await
        .expect("the client's close is written");
    if clean_end {
        let end = raw.end().await;
        assert!(
            matches!(end, Ok(0)),
            "the connection ends with a FIN after the handshake, got {end:?}"
        );
    }
}

// ---------------------------------------------------------------- tests

/// Issue 26: the notice of a dropped message names the quota `messages`
/// (or `bytes`) for quotas built without a name, as the gateway does;
/// before, it said `"quota":"default"`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notices_name_unnamed_quotas_messages_and_bytes() {
    for (name, limits, sends) in [
        (
            "messages",
            limits(|b| b.messages("1/1m".parse::<Quota>().unwrap())),
            ["one", "two"],
        ),
        (
            "bytes",
            limits(|b| b.bytes("8/1m".parse::<Quota>().unwrap())),
            ["12345", "67890"],
        ),
    ] {
        let server = Server::start(limits, None, None).await;
        let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{}/ws", server.addr))
            .await
            .unwrap();
        for text in sends {
            ws.send(Message::text(text)).await.unwrap();
        }
        let mut texts = Vec::new();
        while texts.len() < 2 {
            match tokio::time::timeout(PATIENCE, ws.next()).await.unwrap() {
                Some(Ok(Message::Text(text))) => texts.push(text.to_string()),
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                other => panic!("{name}: expected text, got {other:?}"),
            }
        }
        assert_eq!(texts[0], sends[0], "{name}: the first is echoed");
        let notice: Value = serde_json::from_str(&texts[1]).unwrap();
        assert_eq!(notice["type"], "rate_limited", "{name}: {notice}");
        assert_eq!(notice["quota"], name, "{name}: {notice}");
    }
}

/// Issue 26, bug 4: every close the guard decides on a readable socket
/// (1009 too big, 1009 past what the byte quota can ever admit, 1008 with
/// `ExceedAction::Close`, 1008 by the drop ladder) reaches a client that
/// keeps sending, with its code and reason, and the connection then ends
/// with a FIN, not a reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_closes_reach_a_client_that_keeps_sending() {
    /// What is configured, what the client sends, what it must get.
    type Case = (
        &'static str,
        MessageLimits,
        Vec<Vec<u8>>,
        u16,
        &'static str,
        CloseCause,
    );
    let cases: [Case; 4] = [
        (
            "over --max-message-bytes",
            limits(|b| b.max_message_bytes(10)),
            vec![text(&[b'x'; 20])],
            1009,
            "message too big",
            CloseCause::TooBig,
        ),
        (
            "more bytes than the byte quota admits",
            limits(|b| b.bytes("16/1m".parse::<Quota>().unwrap())),
            vec![text(&[b'x'; 20])],
            1009,
            "message exceeds the quota",
            CloseCause::TooBig,
        ),
        (
            "ExceedAction::Close",
            limits(|b| {
                b.messages("1/1m".parse::<Quota>().unwrap())
                    .on_exceed(ExceedAction::Close)
            }),
            vec![text(b"m0"), text(b"m1")],
            1008,
            "rate limit exceeded",
            CloseCause::RateLimited,
        ),
        (
            "the drop ladder",
            limits(|b| {
                b.messages("1/1m".parse::<Quota>().unwrap())
                    .close_after_drops(2)
            }),
            vec![text(b"l0"), text(b"l1"), text(b"l2")],
            1008,
            "rate limit exceeded repeatedly",
            CloseCause::DropLadder,
        ),
    ];
    for (name, limits, trigger, code, reason, cause) in cases {
        let mut server = Server::start(limits, None, None).await;
        close_reaches_a_sending_client(server.addr, &trigger, code, reason, true).await;
        assert_eq!(server.cause().await, Some(cause), "{name}");
    }
}

/// The application's own close (`close_with`, as the gateway's rooms close
/// with 1003, 1011 and 1013) reaches a client that keeps sending too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn application_closes_reach_a_client_that_keeps_sending() {
    for (code, reason) in [
        (1013, "too slow"),
        (1003, "rooms take text messages"),
        (1011, "store unavailable"),
    ] {
        let mut server = Server::start(limits(|b| b), None, Some((code, reason))).await;
        close_reaches_a_sending_client(server.addr, &[text(b"first")], code, reason, true).await;
        assert_eq!(server.cause().await, Some(CloseCause::Peer), "{code}");
    }
}

/// A lost connection seat closes with 1008, and that close reaches a
/// client that keeps sending as well. The lease is lost for real: the
/// store's clock passes its TTL and the next heartbeat finds it gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lease_close_reaches_a_client_that_keeps_sending() {
    let clock = ManualClock::new(1_700_000_000_000_000);
    let store = Store::from(MemoryStore::builder().clock(clock.clone()).build());
    let limiter = Limiter::new(store.clone(), "1000000/1m".parse::<Quota>().unwrap());
    let connections = ConnectionLimiter::builder(store)
        .ttl(Duration::from_secs(15))
        .build()
        .unwrap();
    let mut server = Server::start(
        MessageLimits::builder(limiter)
            .close_timeout(PATIENCE)
            .build(),
        Some(connections.clone()),
        None,
    )
    .await;
    let mut raw = Raw::connect(server.addr).await;
    raw.write(&text(b"hello")).await.unwrap();
    assert_eq!(raw.frame().await.unwrap(), (0x1, b"hello".to_vec()));
    clock.advance(Duration::from_secs(60));
    let report = connections.heartbeat().await;
    assert_eq!(report.lost, 1, "{report:?}");
    after_trigger(&mut raw, 1008, "connection seat lost", true).await;
    assert_eq!(server.cause().await, Some(CloseCause::SeatLost));
}

/// After a read error (a protocol violation, invalid UTF-8, a frame past
/// `MessageLimits::read_limit`) axum's socket yields nothing more, so the
/// client's frames cannot be read and discarded; the close still reaches a
/// client that keeps sending, which can write while the connection is held
/// (the end is a reset once it is dropped with those frames unread).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closes_after_read_errors_reach_a_client_that_keeps_sending() {
    let cases: [(&str, Vec<u8>, u16, &str, CloseCause); 3] = [
        (
            "unmasked frame",
            frame(0x1, b"hi", false),
            1002,
            "protocol error",
            CloseCause::ProtocolError,
        ),
        (
            "invalid UTF-8",
            text(b"ok\xff\xfe"),
            1007,
            "invalid utf-8",
            CloseCause::InvalidUtf8,
        ),
        (
            "a frame past the read limit",
            text(&vec![b'x'; 10 + 64 * 1024 + 1]),
            1009,
            "message too big",
            CloseCause::TooBig,
        ),
    ];
    for (name, trigger, code, reason, cause) in cases {
        let limits = limits(|b| b.max_message_bytes(10));
        assert_eq!(limits.read_limit(), 10 + 64 * 1024, "{name}");
        let mut server = Server::start(limits, None, None).await;
        close_reaches_a_sending_client(server.addr, &[trigger], code, reason, false).await;
        assert_eq!(server.cause().await, Some(cause), "{name}");
    }
}
