//! Issue 26, bug 4, through the gateway: every close `/ws` decides reaches
//! a client that keeps sending, with its code and reason, and the
//! connection then ends with a FIN after the closing handshake, not a
//! reset. The case first: `--max-message-bytes 10` and four frames
//! sent back to back.
//!
//! The client writes raw frames over TCP (a client library stops writing
//! once it has read a close; this one's writer is ahead of its reader).
//! Every read is bounded by [`PATIENCE`]; nothing is timed.
#![allow(clippy::unwrap_used)]

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tower_window::store::redis::redis;
use tower_window_examples::gateway::{build_gateway, Args};
use tower_window_tests::redis_server::{reserve_port, RedisServer};

/// Every read waits at most this long (a bound, never asserted as a speed).
const PATIENCE: Duration = Duration::from_secs(10);

/// A gateway node with `flags` on a loopback port (the embedded store
/// unless the flags name Redis).
async fn node(flags: &[&str]) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let mut argv = vec!["gateway", "--limit", "100000/1m"];
    argv.extend_from_slice(flags);
    let gateway = build_gateway(Args::try_parse_from(argv).unwrap().into_config().unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = gateway.router;
    let server = tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    (addr, server)
}

/// A user name unique to this run.
fn user(name: &str) -> String {
    format!("{name}-{}", reserve_port())
}

/// A client frame: FIN, `opcode`, masked `payload` (under 64 KiB).
fn frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![0x80 | opcode];
    match payload.len() {
        n @ 0..=125 => out.push(0x80 | u8::try_from(n).unwrap()),
        n => {
            out.push(0x80 | 126);
            out.extend_from_slice(&u16::try_from(n).unwrap().to_be_bytes());
        }
    }
    let mask = [0x5a, 0x13, 0xc4, 0x7e];
    out.extend_from_slice(&mask);
    out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    out
}

fn text(payload: &[u8]) -> Vec<u8> {
    frame(0x1, payload)
}

/// A WebSocket client over raw TCP.
struct Raw(TcpStream);

impl Raw {
    async fn connect(addr: SocketAddr, user: &str, query: &str) -> Self {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let request = format!(
            "GET /ws{query} HTTP/1.1\r\nhost: 127.0.0.1\r\nx-user-id: {user}\r\n\
             upgrade: websocket\r\nconnection: upgrade\r\n\
             sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await.unwrap();
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

    /// The server's close frame (skipping text, binary and control
    /// frames): its code and reason.
    async fn close_frame(&mut self) -> (u16, String) {
        for _ in 0..1_000 {
            let (opcode, payload) = self.frame().await.expect("the close frame, not a reset");
            if opcode == 0x8 {
                assert!(payload.len() >= 2, "a close with a code: {payload:?}");
                let code = u16::from_be_bytes([payload[0], payload[1]]);
                return (code, String::from_utf8(payload[2..].to_vec()).unwrap());
            }
        }
        panic!("no close within 1000 frames");
    }
}

/// After `trigger` was written: 20 more frames without reading, the close
/// (`code`, `reason`), 5 more frames, the client's close, then a clean end.
async fn close_reaches_a_sending_client(raw: &mut Raw, code: u16, reason: &str) {
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
    raw.write(&frame(0x8, b"\x03\xe8bye"))
        .await
        .expect("the client's close is written");
    let mut rest = Vec::new();
    let end = tokio::time::timeout(PATIENCE, raw.0.read_to_end(&mut rest))
        .await
        .expect("the connection ended within the bound");
    assert!(
        matches!(end, Ok(0)),
        "the connection ends with a FIN after the handshake, got {end:?} ({} bytes)",
        rest.len()
    );
}

/// The case: `--max-message-bytes 10`, four 20-byte frames back to
/// back (and more), then the 1009.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_big_close_reaches_a_client_sending_back_to_back() {
    let (addr, _server) = node(&["--max-message-bytes", "10"]).await;
    let mut raw = Raw::connect(addr, &user("big"), "").await;
    for i in 0..4 {
        raw.write(&text(format!("frame-{i}-over-ten-bytes").as_bytes()))
            .await
            .unwrap_or_else(|e| panic!("frame {i}: {e}"));
    }
    close_reaches_a_sending_client(&mut raw, 1009, "message too big").await;
}

/// The message limits' closes (1008 by `--on-message-limit close` and by
/// the drop ladder, 1009 past what `--byte-limit` can ever admit) and the
/// room's 1003 for a binary message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_embedded_store_close_reaches_a_client_that_keeps_sending() {
    /// Name, flags, query, what the client sends, the close it must get.
    type Case = (
        &'static str,
        &'static [&'static str],
        &'static str,
        Vec<Vec<u8>>,
        u16,
        &'static str,
    );
    let cases: [Case; 4] = [
        (
            "--on-message-limit close",
            &["--message-limit", "1/1m", "--on-message-limit", "close"],
            "",
            vec![text(b"m0"), text(b"m1")],
            1008,
            "rate limit exceeded",
        ),
        (
            "--close-after-drops",
            &["--message-limit", "1/1m", "--close-after-drops", "2"],
            "",
            vec![text(b"l0"), text(b"l1"), text(b"l2")],
            1008,
            "rate limit exceeded repeatedly",
        ),
        (
            "--byte-limit",
            &["--byte-limit", "16/1m"],
            "",
            vec![text(&[b'x'; 20])],
            1009,
            "message exceeds the quota",
        ),
        (
            "binary in a room",
            &[],
            "?room=close-test",
            vec![frame(0x2, b"\x00\x01")],
            1003,
            "rooms take text messages",
        ),
    ];
    for (name, flags, query, trigger, code, reason) in cases {
        let (addr, _server) = node(flags).await;
        let mut raw = Raw::connect(addr, &user("close"), query).await;
        for bytes in &trigger {
            raw.write(bytes)
                .await
                .unwrap_or_else(|e| panic!("{name}: trigger: {e}"));
        }
        close_reaches_a_sending_client(&mut raw, code, reason).await;
    }
}

/// A lost connection seat (its key deleted in Redis; the next heartbeat
/// finds it gone) closes with 1008, and the close reaches a client that
/// keeps sending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_lost_close_reaches_a_client_that_keeps_sending() {
    let redis = RedisServer::shared();
    let url = redis.url();
    let (addr, _server) = node(&[
        "--redis-url",
        &url,
        "--redis-timeout-ms",
        "5000",
        "--connection-lease-ttl",
        "600ms",
    ])
    .await;
    let u = user("lease");
    let mut raw = Raw::connect(addr, &u, "").await;
    raw.write(&text(b"hello")).await.unwrap();
    assert_eq!(raw.frame().await.unwrap(), (0x1, b"hello".to_vec()));
    let mut conn = redis.connection();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("*{u}*#conn"))
        .query(&mut conn)
        .unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    let _: i64 = redis::cmd("DEL").arg(&keys).query(&mut conn).unwrap();
    close_reaches_a_sending_client(&mut raw, 1008, "connection seat lost").await;
}
