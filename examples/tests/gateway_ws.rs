//! The gateway's `/ws` protocol on real Redis with a real client
//! (tokio-tungstenite), two gateway nodes on two loopback ports per test:
//! connection caps, lease loss, message limits and their exceed actions,
//! dedup, and bad input.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use clap::Parser;
use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
use tokio_tungstenite::tungstenite::protocol::frame::Frame;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use tower_window::store::redis::redis;
use tower_window_examples::gateway::ws::WsHandles;
use tower_window_examples::gateway::{build_gateway, Args};
use tower_window_tests::redis_server::{reserve_port, RedisServer};

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Everything a read may wait (a bound, never asserted as a speed).
const PATIENCE: Duration = Duration::from_secs(10);

/// A gateway node on `redis` with the given extra flags, served on a
/// loopback port.
struct Node {
    addr: SocketAddr,
    ws: WsHandles,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Node {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn node(redis: &RedisServer, extra: &[&str]) -> Node {
    let url = redis.url();
    let mut argv = vec![
        "gateway",
        "--limit",
        "100000/1m",
        "--redis-url",
        &url,
        // Generous: the tests are about limits, not the time budget.
        "--redis-timeout-ms",
        "5000",
    ];
    argv.extend_from_slice(extra);
    let config = Args::try_parse_from(argv).unwrap().into_config().unwrap();
    let gateway = build_gateway(config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = gateway.router;
    let server = tokio::spawn(async move {
        axum::serve(listener, router).await.unwrap();
    });
    Node {
        addr,
        ws: gateway.ws,
        server,
    }
}

/// A user name unique to this run.
fn user(name: &str) -> String {
    format!("{name}-{}", reserve_port())
}

async fn connect(addr: SocketAddr, user: &str) -> Result<Ws, WsError> {
    let mut request = format!("ws://{addr}/ws").into_client_request().unwrap();
    request
        .headers_mut()
        .insert("x-user-id", user.parse().unwrap());
    tokio_tungstenite::connect_async(request)
        .await
        .map(|(ws, _)| ws)
}

async fn connected(addr: SocketAddr, user: &str) -> Ws {
    connect(addr, user).await.unwrap()
}

/// Asserts that an upgrade is refused with 429 before any upgrade.
fn assert_refused(result: Result<Ws, WsError>) {
    match result {
        Err(WsError::Http(response)) => {
            assert_eq!(response.status(), 429);
            let retry: u64 = response.headers()["retry-after"]
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            assert!((1..=1).contains(&retry), "Retry-After {retry}");
            assert!(response.headers()["ratelimit-policy"]
                .to_str()
                .unwrap()
                .contains("\"connections\";q="));
            assert!(response.headers().contains_key("ratelimit"));
        }
        Err(other) => panic!("refused otherwise: {other}"),
        Ok(_) => panic!("upgraded past the cap"),
    }
}

/// The next text, binary or close message (pings skipped), or `None`
/// when the stream ends.
async fn next(ws: &mut Ws) -> Option<Message> {
    loop {
        let message = tokio::time::timeout(PATIENCE, ws.next())
            .await
            .expect("a message within the bound")?;
        match message {
            Ok(Message::Ping(_) | Message::Pong(_)) => continue,
            Ok(message) => return Some(message),
            Err(_) => return None,
        }
    }
}

async fn next_text(ws: &mut Ws) -> String {
    match next(ws).await {
        Some(Message::Text(text)) => text.to_string(),
        other => panic!("expected text, got {other:?}"),
    }
}

async fn close_code(ws: &mut Ws) -> u16 {
    loop {
        match next(ws).await {
            Some(Message::Close(Some(frame))) => return u16::from(frame.code),
            Some(Message::Close(None)) | None => panic!("closed without a code"),
            Some(_) => continue,
        }
    }
}

async fn presence(addr: SocketAddr, user: &str) -> (bool, u64) {
    try_presence(addr, user)
        .await
        .expect("presence answered 200")
}

/// `GET /presence`, or `None` on a 503 (the store's breaker is open: on a
/// loaded machine, slow calls during a load loop may open it for a while).
async fn try_presence(addr: SocketAddr, user: &str) -> Option<(bool, u64)> {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let request = format!(
        "GET /presence?tenant=public&user={user} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    if response.starts_with("HTTP/1.1 503") {
        return None;
    }
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    let body = response.split("\r\n\r\n").nth(1).unwrap();
    let value: Value = serde_json::from_str(body.trim()).unwrap();
    Some((
        value["online"].as_bool().unwrap(),
        value["connections"].as_u64().unwrap(),
    ))
}

/// Polls `presence` until it reports `connections` (bounded).
async fn await_presence(addr: SocketAddr, user: &str, connections: u64) {
    for _ in 0..600 {
        if try_presence(addr, user).await.map(|p| p.1) == Some(connections) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "presence never reached {connections}: {:?}",
        try_presence(addr, user).await
    );
}

// 1. A cap of 3 across two nodes: the 4th connection is refused on either
// node before any upgrade; after one closes, a new one succeeds within 1 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_cap_spans_nodes() {
    let redis = RedisServer::shared();
    let flags = [
        "--max-connections-per-user",
        "3",
        "--connection-lease-ttl",
        "3s",
    ];
    let (a, b) = (node(&redis, &flags).await, node(&redis, &flags).await);
    let u = user("cap");
    let mut first = connected(a.addr, &u).await;
    let _second = connected(b.addr, &u).await;
    let _third = connected(a.addr, &u).await;
    assert_eq!(presence(a.addr, &u).await, (true, 3));
    assert_eq!(presence(b.addr, &u).await, (true, 3));
    assert_refused(connect(a.addr, &u).await);
    assert_refused(connect(b.addr, &u).await);
    // Another user is not affected.
    let _other = connected(b.addr, &user("cap-other")).await;
    first.close(None).await.unwrap();
    let started = Instant::now();
    let mut admitted = None;
    for _ in 0..20 {
        match connect(b.addr, &u).await {
            Ok(ws) => {
                admitted = Some(ws);
                break;
            }
            Err(WsError::Http(response)) if response.status() == 429 => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(other) => panic!("{other}"),
        }
    }
    assert!(admitted.is_some(), "no place freed after a close");
    assert!(
        started.elapsed() <= Duration::from_secs(1),
        "the close freed its place within 1 s (the lease TTL is 3 s): {:?}",
        started.elapsed()
    );
    assert_eq!(presence(a.addr, &u).await, (true, 3));
}

// 2a. A node whose heartbeat stops (sockets left open) loses its leases
// after the TTL; presence then reports the user offline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_heartbeat_frees_leases_after_ttl() {
    let redis = RedisServer::shared();
    let flags = ["--connection-lease-ttl", "600ms"];
    let (a, b) = (node(&redis, &flags).await, node(&redis, &flags).await);
    let u = user("stopped");
    let _s1 = connected(a.addr, &u).await;
    let _s2 = connected(a.addr, &u).await;
    assert_eq!(presence(b.addr, &u).await, (true, 2));
    // Several TTLs with the heartbeat running: still online.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(presence(b.addr, &u).await, (true, 2));
    a.ws.heartbeat.as_ref().unwrap().abort();
    await_presence(b.addr, &u, 0).await;
    assert_eq!(presence(b.addr, &u).await, (false, 0));
}

// 2b. A lease reset in the store: the node's next heartbeat finds it gone
// and closes that socket with 1008 (never re-acquires it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_lease_closes_the_socket_with_1008() {
    let redis = RedisServer::shared();
    let a = node(&redis, &["--connection-lease-ttl", "600ms"]).await;
    let u = user("reset");
    let mut ws = connected(a.addr, &u).await;
    ws.send(Message::text("before")).await.unwrap();
    assert_eq!(next_text(&mut ws).await, "before");
    assert_eq!(a.ws.connections.live_seats(), 1);
    let mut conn = redis.connection();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("*{u}*#conn"))
        .query(&mut conn)
        .unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    let _: i64 = redis::cmd("DEL").arg(&keys).query(&mut conn).unwrap();
    assert_eq!(close_code(&mut ws).await, 1008);
    assert_eq!(a.ws.connections.live_seats(), 0);
    assert_eq!(presence(a.addr, &u).await, (false, 0), "not re-acquired");
}

/// Sends `n` texts and sorts the answers into echoes and notices.
async fn exchange(ws: &mut Ws, tag: &str, n: usize) -> (Vec<String>, Vec<Value>) {
    for i in 0..n {
        ws.send(Message::text(format!("{tag}-{i}"))).await.unwrap();
    }
    let (mut echoes, mut notices) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let text = next_text(ws).await;
        if text.starts_with('{') {
            notices.push(serde_json::from_str::<Value>(&text).unwrap());
        } else {
            echoes.push(text);
        }
    }
    (echoes, notices)
}

// 3. Message limits hold across nodes; each exceed action as configured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_quota_is_shared_across_nodes_and_drop_sends_the_notice() {
    let redis = RedisServer::shared();
    let flags = ["--message-limit", "5/1m"];
    let (a, b) = (node(&redis, &flags).await, node(&redis, &flags).await);
    let u = user("drop");
    let (mut on_a, mut on_b) = (connected(a.addr, &u).await, connected(b.addr, &u).await);
    let (echo_a, notice_a) = exchange(&mut on_a, "a", 4).await;
    let (echo_b, notice_b) = exchange(&mut on_b, "b", 4).await;
    assert_eq!(echo_a.len() + echo_b.len(), 5, "{echo_a:?} {echo_b:?}");
    assert_eq!(notice_a.len() + notice_b.len(), 3);
    for notice in notice_a.iter().chain(&notice_b) {
        assert_eq!(notice["type"], "rate_limited");
        assert_eq!(notice["quota"], "messages");
        assert!(notice["retry_after_ms"].as_u64().unwrap() > 0);
    }
    // The socket stays open after drops.
    on_a.send(Message::Ping(vec![1].into())).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn byte_quota_charges_payload_bytes() {
    let redis = RedisServer::shared();
    let a = node(&redis, &["--byte-limit", "10/1m"]).await;
    let u = user("bytes");
    let mut ws = connected(a.addr, &u).await;
    ws.send(Message::text("12345678")).await.unwrap();
    assert_eq!(next_text(&mut ws).await, "12345678");
    ws.send(Message::binary(vec![0u8; 4])).await.unwrap();
    let notice: Value = serde_json::from_str(&next_text(&mut ws).await).unwrap();
    assert_eq!(notice["quota"], "bytes");
    ws.send(Message::text("12")).await.unwrap();
    assert_eq!(next_text(&mut ws).await, "12", "a denial consumed nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_action_closes_with_1008() {
    let redis = RedisServer::shared();
    let a = node(
        &redis,
        &["--message-limit", "2/1m", "--on-message-limit", "close"],
    )
    .await;
    let u = user("close");
    let mut ws = connected(a.addr, &u).await;
    for i in 0..3 {
        ws.send(Message::text(format!("m{i}"))).await.unwrap();
    }
    assert_eq!(next_text(&mut ws).await, "m0");
    assert_eq!(next_text(&mut ws).await, "m1");
    assert_eq!(close_code(&mut ws).await, 1008);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_delays_reads_and_loses_nothing() {
    let redis = RedisServer::shared();
    let a = node(
        &redis,
        &["--message-limit", "2/1s", "--on-message-limit", "pause"],
    )
    .await;
    let u = user("pause");
    let mut ws = connected(a.addr, &u).await;
    let started = Instant::now();
    for i in 0..5 {
        ws.send(Message::text(format!("p{i}"))).await.unwrap();
    }
    for i in 0..5 {
        assert_eq!(
            next_text(&mut ws).await,
            format!("p{i}"),
            "in order, none lost"
        );
    }
    // 5 messages at 2 per second cannot all be read in under 2 windows.
    assert!(
        started.elapsed() >= Duration::from_millis(1_900),
        "reading paused: {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_ladder_closes_after_consecutive_drops() {
    let redis = RedisServer::shared();
    let a = node(
        &redis,
        &["--message-limit", "1/1m", "--close-after-drops", "3"],
    )
    .await;
    let u = user("ladder");
    let mut ws = connected(a.addr, &u).await;
    for i in 0..5 {
        ws.send(Message::text(format!("l{i}"))).await.unwrap();
    }
    assert_eq!(next_text(&mut ws).await, "l0");
    for _ in 0..2 {
        let notice: Value = serde_json::from_str(&next_text(&mut ws).await).unwrap();
        assert_eq!(notice["type"], "rate_limited");
    }
    assert_eq!(close_code(&mut ws).await, 1008);
}

// 4. The same id sent to both nodes is echoed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dedup_spans_nodes() {
    let redis = RedisServer::shared();
    let (a, b) = (node(&redis, &[]).await, node(&redis, &[]).await);
    let u = user("dedup");
    let (mut on_a, mut on_b) = (connected(a.addr, &u).await, connected(b.addr, &u).await);
    let message = r#"{"id":"m-1","body":"hi"}"#;
    on_a.send(Message::text(message)).await.unwrap();
    assert_eq!(next_text(&mut on_a).await, message);
    on_b.send(Message::text(message)).await.unwrap();
    let duplicate: Value = serde_json::from_str(&next_text(&mut on_b).await).unwrap();
    assert_eq!(
        duplicate,
        serde_json::json!({"type": "duplicate", "id": "m-1"})
    );
    on_a.send(Message::text(message)).await.unwrap();
    let again: Value = serde_json::from_str(&next_text(&mut on_a).await).unwrap();
    assert_eq!(again["type"], "duplicate");
    // Another id, another user, and messages without an id are echoed.
    let other = r#"{"id":"m-2"}"#;
    on_b.send(Message::text(other)).await.unwrap();
    assert_eq!(next_text(&mut on_b).await, other);
    let mut stranger = connected(b.addr, &user("dedup-other")).await;
    stranger.send(Message::text(message)).await.unwrap();
    assert_eq!(next_text(&mut stranger).await, message);
    for _ in 0..2 {
        on_a.send(Message::text("no id")).await.unwrap();
        assert_eq!(next_text(&mut on_a).await, "no id");
    }
}

// 5. Bad input: oversized frames, invalid UTF-8, upgrade floods without
// upgrade headers, many connects and disconnects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_messages_close_with_1009() {
    let redis = RedisServer::shared();
    let a = node(
        &redis,
        &["--max-message-bytes", "1024", "--message-limit", "100/1m"],
    )
    .await;
    let u = user("big");
    let mut ws = connected(a.addr, &u).await;
    ws.send(Message::binary(vec![7u8; 1024])).await.unwrap();
    assert!(matches!(next(&mut ws).await, Some(Message::Binary(b)) if b.len() == 1024));
    ws.send(Message::binary(vec![7u8; 1025])).await.unwrap();
    assert_eq!(close_code(&mut ws).await, 1009);
    let mut ws = connected(a.addr, &u).await;
    ws.send(Message::text("x".repeat(100_000))).await.unwrap();
    assert_eq!(close_code(&mut ws).await, 1009);
    await_presence(a.addr, &u, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_utf8_closes_with_1007() {
    let redis = RedisServer::shared();
    let a = node(&redis, &[]).await;
    let u = user("utf8");
    let mut ws = connected(a.addr, &u).await;
    let frame = Frame::message(vec![b'o', b'k', 0xff, 0xfe], OpCode::Data(Data::Text), true);
    ws.send(Message::Frame(frame)).await.unwrap();
    assert_eq!(close_code(&mut ws).await, 1007);
    await_presence(a.addr, &u, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrade_floods_and_connection_churn_leak_nothing() {
    let redis = RedisServer::shared();
    let flags = [
        "--max-connections-per-user",
        "64",
        "--connection-lease-ttl",
        "5s",
    ];
    let (a, b) = (node(&redis, &flags).await, node(&redis, &flags).await);
    let u = user("churn");
    // Upgrade requests without upgrade headers: refused with a 4xx before
    // any lease is taken.
    for i in 0..500 {
        let addr = if i % 2 == 0 { a.addr } else { b.addr };
        let mut stream = TcpStream::connect(addr).await.unwrap();
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let request =
            format!("GET /ws HTTP/1.1\r\nhost: x\r\nx-user-id: {u}\r\nconnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        let status: u16 = response[9..12].parse().unwrap();
        assert!((400..500).contains(&status) && status != 429, "{status}");
    }
    assert_eq!(
        a.ws.connections.live_seats() + b.ws.connections.live_seats(),
        0
    );
    // 10,000 connects and disconnects, 32 at a time, over both nodes.
    let total = 10_000;
    let workers = 32;
    let tasks: Vec<_> = (0..workers)
        .map(|w| {
            let addrs = [a.addr, b.addr];
            let u = u.clone();
            tokio::spawn(async move {
                let mut refused = 0;
                for i in (w..total).step_by(workers) {
                    match connect(addrs[i % 2], &u).await {
                        Ok(mut ws) => {
                            if i % 3 == 0 {
                                ws.close(None).await.unwrap();
                            }
                            // Otherwise just dropped: the TCP connection ends.
                        }
                        Err(WsError::Http(response)) if response.status() == 429 => refused += 1,
                        Err(other) => panic!("{other}"),
                    }
                }
                refused
            })
        })
        .collect();
    let mut refused = 0;
    for task in tasks {
        refused += task.await.unwrap();
    }
    // At most 32 are open at once, under the cap of 64, but a dropped
    // socket's release races the next connect: few refusals, if any.
    assert!(refused < total / 10, "{refused} refusals");
    await_presence(a.addr, &u, 0).await;
    for _ in 0..200 {
        if a.ws.connections.live_seats() + b.ws.connections.live_seats() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        a.ws.connections.live_seats() + b.ws.connections.live_seats(),
        0
    );
    // Every key of the user carries a TTL, and only a bounded few remain.
    let mut conn = redis.connection();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("*{u}*"))
        .query(&mut conn)
        .unwrap();
    assert!(keys.len() <= 4, "{keys:?}");
    for key in &keys {
        let pttl: i64 = redis::cmd("PTTL").arg(key).query(&mut conn).unwrap();
        assert!(pttl > 0, "{key} has no TTL ({pttl})");
    }
}
