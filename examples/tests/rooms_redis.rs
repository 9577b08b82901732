//! Rooms across two gateway nodes on one real `redis-server`, with
//! tokio-tungstenite clients: ordered cross-node delivery, resume on the
//! other node with exactly the gap (paged) then live events, `resync`
//! with `too_old` past the history and `epoch_changed` after the stream
//! was lost, and 400s for bad rooms and positions.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;
use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use tower_window::store::redis::redis::AsyncCommands;
use tower_window_examples::gateway::{build_app, Args};
use tower_window_tests::redis_server::RedisServer;

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Every wait is bounded: a lost message fails the test, never hangs it.
const WAIT: Duration = Duration::from_secs(20);

/// A gateway node on `redis_url`, serving on a loopback port.
async fn node(redis_url: &str, extra: &[&str]) -> SocketAddr {
    let mut argv = vec![
        "gateway",
        "--limit",
        "100000/1m",
        "--redis-url",
        redis_url,
        // Shared windows and events, not the time budget, are under test.
        "--redis-timeout-ms",
        "5000",
    ];
    argv.extend_from_slice(extra);
    let app = build_app(Args::try_parse_from(argv).unwrap().into_config().unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    address
}

async fn connect(address: SocketAddr, user: &str, query: &str) -> Ws {
    let mut request = format!("ws://{address}/ws?{query}")
        .into_client_request()
        .unwrap();
    request
        .headers_mut()
        .insert("x-user-id", user.parse().unwrap());
    let (ws, _) = tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(request))
        .await
        .expect("connect in time")
        .unwrap();
    ws
}

async fn status_of(address: SocketAddr, query: &str) -> u16 {
    let mut request = format!("ws://{address}/ws?{query}")
        .into_client_request()
        .unwrap();
    request
        .headers_mut()
        .insert("x-user-id", "x".parse().unwrap());
    match tokio_tungstenite::connect_async(request).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => response.status().as_u16(),
        Ok(_) => 101,
        Err(other) => panic!("{other}"),
    }
}

async fn recv(ws: &mut Ws) -> Value {
    loop {
        let message = tokio::time::timeout(WAIT, ws.next())
            .await
            .expect("a message in time")
            .expect("the socket is open")
            .unwrap();
        if let Message::Text(text) = message {
            return serde_json::from_str(&text).unwrap();
        }
    }
}

async fn send(ws: &mut Ws, text: &str) {
    ws.send(Message::text(text)).await.unwrap();
}

fn s(value: &Value, field: &str) -> String {
    value[field].as_str().unwrap_or_default().to_owned()
}

/// Reads `n` events, asserting they are events of `room`.
async fn events(ws: &mut Ws, room: &str, n: usize) -> Vec<Value> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let message = recv(ws).await;
        assert_eq!(s(&message, "type"), "event", "{message}");
        assert_eq!(s(&message, "room"), room);
        out.push(message);
    }
    out
}

fn data(events: &[Value]) -> Vec<String> {
    events.iter().map(|e| s(e, "data")).collect()
}

fn numbered(range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("m{i}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_resumes_on_the_other_node_with_the_gap_then_live() {
    let redis = RedisServer::start();
    let a = node(&redis.url(), &[]).await;
    let b = node(&redis.url(), &[]).await;

    let mut client = connect(a, "carol", "room=lobby").await;
    let welcome = recv(&mut client).await;
    assert_eq!(s(&welcome, "type"), "joined");
    assert_eq!(s(&welcome, "room"), "lobby");
    assert_eq!(s(&welcome, "last_event_id"), "");
    let epoch = s(&welcome, "epoch");
    assert!(!epoch.is_empty());

    let mut sender = connect(b, "sam", "room=lobby").await;
    assert_eq!(s(&recv(&mut sender).await, "type"), "joined");
    for i in 0..5 {
        send(&mut sender, &format!("m{i}")).await;
    }
    // Delivered across nodes, in order, to the sender too.
    let first = events(&mut client, "lobby", 5).await;
    assert_eq!(data(&first), numbered(0..5));
    assert!(first
        .iter()
        .all(|e| s(e, "from") == "sam" && s(e, "epoch") == epoch));
    assert_eq!(data(&events(&mut sender, "lobby", 5).await), numbered(0..5));
    let last = s(&first[4], "id");
    client.close(None).await.unwrap();
    drop(client);

    // The room goes on without the client: more than two history pages.
    for i in 5..455 {
        send(&mut sender, &format!("m{i}")).await;
    }
    assert_eq!(
        data(&events(&mut sender, "lobby", 450).await),
        numbered(5..455)
    );

    // Reconnect to the other node; the room keeps talking meanwhile.
    let query = format!("room=lobby&last_event_id={last}&epoch={epoch}");
    let mut client = connect(b, "carol", &query).await;
    for i in 455..465 {
        send(&mut sender, &format!("m{i}")).await;
    }
    let welcome = recv(&mut client).await;
    assert_eq!(s(&welcome, "type"), "joined");
    assert_eq!(s(&welcome, "epoch"), epoch);
    let mut got = Vec::new();
    let mut recovered = None;
    let mut ids = Vec::new();
    while got.len() < 460 || recovered.is_none() {
        let message = recv(&mut client).await;
        match s(&message, "type").as_str() {
            "event" => {
                ids.push(s(&message, "id"));
                got.push(s(&message, "data"));
            }
            "recovered" => {
                assert!(recovered.is_none(), "one recovered");
                recovered = Some((message["count"].as_u64().unwrap(), got.len()));
            }
            other => panic!("unexpected {other}: {message}"),
        }
    }
    // Exactly the gap and then the live ones: in order, nothing twice,
    // nothing missing; `recovered` counts the history sent before it.
    assert_eq!(got, numbered(5..465));
    let (count, at) = recovered.expect("a recovered message");
    assert_eq!(count as usize, at);
    assert!(count >= 450, "the whole gap came as history ({count})");
    let mut sorted = ids.clone();
    sorted.dedup();
    assert_eq!(sorted.len(), ids.len());
    // And live afterwards.
    send(&mut sender, "after").await;
    let live = events(&mut client, "lobby", 1).await;
    assert_eq!(data(&live), ["after"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_position_older_than_the_history_resyncs_too_old() {
    let redis = RedisServer::start();
    let a = node(&redis.url(), &["--history-max", "5"]).await;
    let b = node(&redis.url(), &["--history-max", "5"]).await;
    let mut client = connect(a, "carol", "room=small").await;
    let epoch = s(&recv(&mut client).await, "epoch");
    let mut sender = connect(b, "sam", "room=small").await;
    recv(&mut sender).await;
    send(&mut sender, "m0").await;
    let first = s(&events(&mut client, "small", 1).await[0], "id");
    drop(client);
    let mut sent = events(&mut sender, "small", 1).await;
    // One message at a time: a burst of more than the five the room
    // keeps could outrun node b's reader, which then (rightly) drops
    // the sender with a resync instead of skipping events silently.
    for i in 1..30 {
        send(&mut sender, &format!("m{i}")).await;
        sent.extend(events(&mut sender, "small", 1).await);
    }
    assert_eq!(data(&sent), numbered(0..30));
    let query = format!("room=small&last_event_id={first}&epoch={epoch}");
    let mut client = connect(b, "carol", &query).await;
    assert_eq!(s(&recv(&mut client).await, "type"), "joined");
    let resync = recv(&mut client).await;
    assert_eq!(
        (s(&resync, "type"), s(&resync, "room"), s(&resync, "reason")),
        ("resync".into(), "small".into(), "too_old".into())
    );
    send(&mut sender, "live").await;
    assert_eq!(data(&events(&mut client, "small", 1).await), ["live"]);
    assert_eq!(data(&events(&mut sender, "small", 1).await), ["live"]);
    // A position among the newest five still recovers: m27, m28, m29, live.
    let m26 = s(&sent[26], "id");
    let query = format!("room=small&last_event_id={m26}&epoch={epoch}");
    let mut other = connect(a, "dora", &query).await;
    assert_eq!(s(&recv(&mut other).await, "type"), "joined");
    let gap = events(&mut other, "small", 4).await;
    assert_eq!(data(&gap), ["m27", "m28", "m29", "live"]);
    let recovered = recv(&mut other).await;
    assert_eq!(
        (s(&recovered, "type"), recovered["count"].as_u64()),
        ("recovered".into(), Some(4))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_stream_makes_the_next_resume_epoch_changed() {
    let redis = RedisServer::start();
    let a = node(&redis.url(), &[]).await;
    let b = node(&redis.url(), &[]).await;
    let mut client = connect(a, "carol", "room=fragile").await;
    let epoch = s(&recv(&mut client).await, "epoch");
    let mut sender = connect(b, "sam", "room=fragile").await;
    recv(&mut sender).await;
    for i in 0..3 {
        send(&mut sender, &format!("m{i}")).await;
    }
    let seen = events(&mut client, "fragile", 3).await;
    let last = s(&seen[2], "id");
    drop(client);
    assert_eq!(
        data(&events(&mut sender, "fragile", 3).await),
        numbered(0..3)
    );

    // The stream is lost, as in a failover that lost data; the room goes on.
    let mut conn = redis.async_connection().await;
    let deleted: i64 = conn.del("tw:ev:{room%3Afragile}:s").await.unwrap();
    assert_eq!(deleted, 1);
    send(&mut sender, "m3").await;
    let m3 = events(&mut sender, "fragile", 1).await;
    assert_ne!(s(&m3[0], "epoch"), epoch, "a new epoch after the loss");

    let query = format!("room=fragile&last_event_id={last}&epoch={epoch}");
    let mut client = connect(b, "carol", &query).await;
    let welcome = recv(&mut client).await;
    assert_eq!(s(&welcome, "type"), "joined");
    assert_ne!(s(&welcome, "epoch"), epoch);
    let resync = recv(&mut client).await;
    assert_eq!(s(&resync, "type"), "resync", "never recovered: {resync}");
    assert_eq!(s(&resync, "reason"), "epoch_changed");
    send(&mut sender, "m4").await;
    let live = events(&mut client, "fragile", 1).await;
    assert_eq!(data(&live), ["m4"]);
    assert_eq!(s(&live[0], "epoch"), s(&welcome, "epoch"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_rooms_and_positions_are_400_before_the_upgrade() {
    let redis = RedisServer::start();
    let a = node(&redis.url(), &[]).await;
    let long = "r".repeat(65);
    for query in [
        "room=",
        "room=a%20b",
        "room=a/b",
        "room=%C3%A9",
        &format!("room={long}"),
        "room=ok&last_event_id=1-0",
        "room=ok&last_event_id=x&epoch=e",
        "room=ok&epoch=bad:epoch",
    ] {
        assert_eq!(status_of(a, query).await, 400, "{query}");
    }
    let edge = format!("room={}", "A-z_0.9".repeat(10).get(..64).unwrap());
    assert_eq!(status_of(a, &edge).await, 101);
    assert_eq!(status_of(a, "room=ok&epoch=e").await, 101);
}

/// With `--inbound-stream`, room messages from every node also go to one
/// inbound stream, which `inbound-worker` consumes: each counted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn room_messages_reach_the_inbound_worker() {
    let redis = RedisServer::start();
    let flags = ["--inbound-stream", "tw:inbound"];
    let a = node(&redis.url(), &flags).await;
    let b = node(&redis.url(), &flags).await;
    let mut on_a = connect(a, "ann", "room=counted").await;
    let mut on_b = connect(b, "bob", "room=counted").await;
    recv(&mut on_a).await;
    recv(&mut on_b).await;
    for i in 0..4 {
        send(&mut on_b, &format!("b{i}")).await;
    }
    for i in 0..2 {
        send(&mut on_a, &format!("a{i}")).await;
    }
    assert_eq!(events(&mut on_a, "counted", 6).await.len(), 6);
    // A node forwards a message to the inbound stream after publishing it
    // to the room, so the room's last event may reach `ann` before its
    // inbound copy is appended: wait until six are there (at most 5 s); a
    // seventh would be a message forwarded twice.
    let mut conn = redis.async_connection().await;
    let mut queued = 0u64;
    for _ in 0..500 {
        queued = tower_window::store::redis::redis::cmd("XLEN")
            .arg("tw:inbound")
            .query_async(&mut conn)
            .await
            .unwrap();
        if queued >= 6 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(queued, 6);
    let status = tokio::process::Command::new(env!("CARGO_BIN_EXE_inbound-worker"))
        .args([
            "--redis-url",
            &redis.url(),
            "--consumer",
            "w1",
            "--exit-when-idle",
        ])
        .stderr(std::process::Stdio::null())
        .status();
    let status = tokio::time::timeout(WAIT, status).await.unwrap().unwrap();
    assert!(status.success());
    let count: u64 = conn.get("tw:room-count:{counted}:count").await.unwrap();
    assert_eq!(count, 6);
}

/// Room messages pass the `/ws` message limits and dedup first: a repeated
/// JSON `id` is answered `duplicate` and published once; a message over
/// `--message-limit` is dropped with `rate_limited` and not published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn room_messages_pass_the_limits_and_dedup_first() {
    let redis = RedisServer::start();
    let flags = ["--message-limit", "3/1h"];
    let a = node(&redis.url(), &flags).await;
    let b = node(&redis.url(), &flags).await;
    let mut reader = connect(a, "rita", "room=guarded").await;
    recv(&mut reader).await;
    let mut writer = connect(b, "will", "room=guarded").await;
    recv(&mut writer).await;
    send(&mut writer, r#"{"id":"x1","text":"once"}"#).await;
    send(&mut writer, r#"{"id":"x1","text":"once"}"#).await; // a client retry
    send(&mut writer, "plain").await;
    send(&mut writer, "over the limit").await; // the 4th message of 3/1h
    let mut types = Vec::new();
    let mut published = Vec::new();
    while types.len() < 4 {
        let message = recv(&mut writer).await;
        let kind = s(&message, "type");
        if kind == "event" {
            published.push(s(&message, "data"));
        }
        types.push(kind);
    }
    types.sort();
    assert_eq!(types, ["duplicate", "event", "event", "rate_limited"]);
    assert_eq!(published, [r#"{"id":"x1","text":"once"}"#, "plain"]);
    // The other node saw exactly the two published events.
    let seen = events(&mut reader, "guarded", 2).await;
    assert_eq!(data(&seen), published);
    send(&mut writer, "still over").await;
    assert_eq!(s(&recv(&mut writer).await, "type"), "rate_limited");
}

/// A room socket reads its messages while live events keep arriving for
/// it: with every message charged to Redis (`--message-limit`), reading is
/// interrupted by outgoing frames all the time, and no message may be lost
/// or doubled by that (the guard's `recv` is cancel-safe).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_room_socket_loses_no_inbound_message() {
    let redis = RedisServer::start();
    let a = node(&redis.url(), &["--message-limit", "1000000/1h"]).await;
    let mut writer = connect(a, "will", "room=busy").await;
    recv(&mut writer).await;
    let expected = numbered(0..300);
    let (mut sink, mut stream) = writer.split();
    let sending = tokio::spawn(async move {
        for text in numbered(0..300) {
            sink.send(Message::text(text)).await.unwrap();
        }
        sink
    });
    let mut got = Vec::new();
    while got.len() < 300 {
        let message = tokio::time::timeout(WAIT, stream.next())
            .await
            .expect("every message comes back as an event")
            .unwrap()
            .unwrap();
        if let Message::Text(text) = message {
            let value: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(s(&value, "type"), "event", "{value}");
            got.push(s(&value, "data"));
        }
    }
    assert_eq!(got, expected);
    drop(sending.await.unwrap());
}

/// Messages larger than the socket's read buffer (4 KiB) arrive whole:
/// the buffer grows to the frame. Sizes around the buffer's and up to
/// `--max-message-bytes` (64 KiB), sent back to back so several share one
/// read, each delivered whole and in order on both nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_larger_than_the_read_buffer_arrive_whole() {
    let redis = RedisServer::start();
    let a = node(&redis.url(), &[]).await;
    let b = node(&redis.url(), &[]).await;
    let mut reader = connect(a, "rita", "room=large").await;
    assert_eq!(s(&recv(&mut reader).await, "type"), "joined");
    let mut writer = connect(b, "walt", "room=large").await;
    assert_eq!(s(&recv(&mut writer).await, "type"), "joined");
    let sizes = [4095, 4096, 4097, 8192 + 3, 30_000, 65_536];
    let texts: Vec<String> = sizes
        .iter()
        .enumerate()
        .map(|(i, &size)| {
            let head = format!("{i}:");
            let fill = char::from(b'a' + i as u8).to_string();
            format!("{head}{}", fill.repeat(size - head.len()))
        })
        .collect();
    for text in &texts {
        writer.feed(Message::text(text.clone())).await.unwrap();
    }
    writer.flush().await.unwrap();
    for ws in [&mut writer, &mut reader] {
        let got = data(&events(ws, "large", texts.len()).await);
        assert_eq!(got.len(), texts.len());
        for (got, sent) in got.iter().zip(&texts) {
            assert_eq!(got.len(), sent.len());
            assert!(got == sent, "a message of {} bytes changed", sent.len());
        }
    }
}

/// A burst from one socket (written back to back, so the node reads many
/// at once and publishes them in batches) arrives at every socket in the
/// room, on both nodes and the sender's own, complete and in order, with
/// growing ids; repeats of a message id inside the burst are answered
/// `duplicate` to the sender and published once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_from_one_socket_arrives_everywhere_in_order() {
    burst_arrives_everywhere_in_order(&[]).await;
}

/// The same with `--rooms-read tail`: each node reads its rooms with one
/// blocking `XREAD`, whose reply holds the events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_arrives_everywhere_in_order_through_the_xread_tail() {
    burst_arrives_everywhere_in_order(&["--rooms-read", "tail"]).await;
}

/// `--rooms-read tail` needs a single Redis: refused on a cluster and on
/// the embedded store, with the flag named.
#[test]
fn the_xread_tail_needs_a_single_redis() {
    for store in [
        vec!["--redis-cluster", "redis://127.0.0.1:7000"],
        Vec::new(),
    ] {
        let mut argv = vec!["gateway", "--rooms-read", "tail"];
        argv.extend(store.iter().copied());
        let error = Args::try_parse_from(argv)
            .unwrap()
            .into_config()
            .map(|_| ())
            .unwrap_err();
        assert!(error.to_string().contains("--rooms-read"), "{error}");
    }
}

/// Four readers on two nodes and a writer that sends 600 messages at once
/// (with a retry of every 50th): every event everywhere, in order.
async fn burst_arrives_everywhere_in_order(extra: &[&str]) {
    let redis = RedisServer::start();
    let a = node(&redis.url(), extra).await;
    let b = node(&redis.url(), extra).await;
    let mut sockets = Vec::new();
    for (i, address) in [a, b, a, b].into_iter().enumerate() {
        let mut ws = connect(address, &format!("u{i}"), "room=burst").await;
        assert_eq!(s(&recv(&mut ws).await, "type"), "joined");
        sockets.push(ws);
    }
    let mut writer = connect(b, "walt", "room=burst").await;
    assert_eq!(s(&recv(&mut writer).await, "type"), "joined");
    const N: usize = 600;
    let text = |i: usize| {
        if i.is_multiple_of(50) {
            format!(r#"{{"id":"k{i}","n":{i}}}"#)
        } else {
            format!("m{i}")
        }
    };
    let expected: Vec<String> = (0..N).map(text).collect();
    for i in 0..N {
        writer.feed(Message::text(text(i))).await.unwrap();
        if i.is_multiple_of(50) {
            writer.feed(Message::text(text(i))).await.unwrap(); // a retry
        }
    }
    writer.flush().await.unwrap();
    // The sender: every event in order, and one duplicate per retry.
    let mut got = Vec::new();
    let mut duplicates = 0;
    while got.len() < N || duplicates < N / 50 {
        let message = recv(&mut writer).await;
        match s(&message, "type").as_str() {
            "event" => got.push(message),
            "duplicate" => duplicates += 1,
            other => panic!("unexpected {other}: {message}"),
        }
    }
    assert_eq!(duplicates, N / 50);
    assert_eq!(data(&got), expected);
    let ids: Vec<String> = got.iter().map(|e| s(e, "id")).collect();
    let parsed: Vec<tower_window::events::EventId> =
        ids.iter().map(|id| id.parse().unwrap()).collect();
    assert!(parsed.windows(2).all(|w| w[0] < w[1]), "ids grow");
    for ws in &mut sockets {
        let seen = events(ws, "burst", N).await;
        assert_eq!(data(&seen), expected);
        assert_eq!(seen.iter().map(|e| s(e, "id")).collect::<Vec<_>>(), ids);
    }
}

/// A socket that publishes faster than it reads (5,000 messages written at
/// once, more than its queue of 1,024 live events) is held back by its own
/// connection, not dropped: after each publish its node writes out what is
/// ready (its own events among it) before it reads more. It gets every
/// event in order, as does a reader on the other node; no `resync`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_faster_than_its_reads_gets_every_event() {
    const N: usize = 5_000;
    let redis = RedisServer::start();
    let history = ["--history-max", "10000"];
    let a = node(&redis.url(), &history).await;
    let b = node(&redis.url(), &history).await;
    let mut reader = connect(a, "rita", "room=flood").await;
    assert_eq!(s(&recv(&mut reader).await, "type"), "joined");
    let mut writer = connect(b, "walt", "room=flood").await;
    assert_eq!(s(&recv(&mut writer).await, "type"), "joined");
    let (mut sink, mut echoes) = writer.split();
    let writing = tokio::spawn(async move {
        for i in 0..N {
            sink.feed(Message::text(format!("m{i}"))).await.unwrap();
        }
        sink.flush().await.unwrap();
        sink
    });
    let mut own = Vec::with_capacity(N);
    while own.len() < N {
        let message = tokio::time::timeout(WAIT, echoes.next())
            .await
            .expect("events keep coming")
            .expect("the socket is open")
            .unwrap();
        if let Message::Text(text) = message {
            let value: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(s(&value, "type"), "event", "{value}");
            own.push(value);
        }
    }
    let _sink = writing.await.unwrap();
    assert_eq!(data(&own), numbered(0..N));
    assert_eq!(data(&events(&mut reader, "flood", N).await), numbered(0..N));
}
