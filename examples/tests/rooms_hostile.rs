//! Rooms under hostile positions, black-box: two built `gateway`
//! processes on one throwaway `redis-server`, tokio-tungstenite clients.
//!
//! Issue 22, defect 3: a client could make a room take a new epoch by
//! resuming from a position ahead of the room's head, so every other
//! client's next resume was `resync` instead of `recovered`. Here attackers
//! send every kind of hostile position, many times, while the room goes on;
//! each gets an answer of its own (`resync` `ahead`/`epoch_changed`, or
//! `400` before the upgrade), and the honest client still resumes with
//! exactly its gap, in order, then `recovered`.
//!
//! Defect 4 through the gateway: a restore of the room's keys that keeps
//! the epoch takes away events a client received; once the room goes on,
//! that client's resume is `resync`, never `recovered` with the events
//! after the restore point.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use tower_window::events::EventId;
use tower_window_tests::redis_server::RedisServer;

use support::GatewayProcess;

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Every wait is bounded: a lost message fails the test, never hangs it.
const WAIT: Duration = Duration::from_secs(20);

fn gateway(redis: &RedisServer) -> GatewayProcess {
    GatewayProcess::start(&[
        "--limit",
        "100000/1m",
        "--redis-url",
        &redis.url(),
        // The rooms, not the time budget, are under test.
        "--redis-timeout-ms",
        "5000",
    ])
}

fn ws_url(node: &GatewayProcess, query: &str) -> String {
    format!("{}/ws?{query}", node.url().replacen("http", "ws", 1))
}

async fn connect(node: &GatewayProcess, user: &str, query: &str) -> Ws {
    let mut request = ws_url(node, query).into_client_request().unwrap();
    request
        .headers_mut()
        .insert("x-user-id", user.parse().unwrap());
    let (ws, _) = tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(request))
        .await
        .expect("connect in time")
        .unwrap_or_else(|e| panic!("{query}: {e}"));
    ws
}

/// The HTTP status of an upgrade request (`101` if it upgraded).
async fn status_of(node: &GatewayProcess, query: &str) -> u16 {
    let mut request = ws_url(node, query).into_client_request().unwrap();
    request
        .headers_mut()
        .insert("x-user-id", "mallory".parse().unwrap());
    let result = tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(request))
        .await
        .expect("an answer in time");
    match result {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => response.status().as_u16(),
        Ok(_) => 101,
        Err(other) => panic!("{query}: {other}"),
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

/// Reads until `data` arrives as an event of `room` (the sender's own
/// copy: the message was appended); its id.
async fn until_event(ws: &mut Ws, room: &str, data: &str) -> String {
    loop {
        let message = recv(ws).await;
        assert_eq!(s(&message, "type"), "event", "{message}");
        assert_eq!(s(&message, "room"), room);
        if s(&message, "data") == data {
            return s(&message, "id");
        }
    }
}

/// A resume's answer after `joined`: the history events' data, and the
/// frame that ended the history (`recovered` or `resync`).
async fn resume_answer(ws: &mut Ws, room: &str, epoch: &str) -> (Vec<String>, Value) {
    let welcome = recv(ws).await;
    assert_eq!(s(&welcome, "type"), "joined", "{welcome}");
    assert_eq!(
        s(&welcome, "epoch"),
        epoch,
        "the room's epoch is as it was: {welcome}"
    );
    let mut history = Vec::new();
    loop {
        let message = recv(ws).await;
        match s(&message, "type").as_str() {
            "event" => {
                assert_eq!(s(&message, "room"), room);
                history.push(s(&message, "data"));
            }
            "recovered" | "resync" => return (history, message),
            other => panic!("unexpected {other}: {message}"),
        }
    }
}

/// What an attacker's resume must be answered.
#[derive(Debug)]
enum Expect {
    /// `joined` with the room's epoch, then `resync` with this reason.
    Resync(&'static str),
    /// `joined`, the whole history of the room so far, then `recovered`.
    Everything,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_positions_never_change_what_others_see() {
    let redis = RedisServer::start();
    let a = gateway(&redis);
    let b = gateway(&redis);

    let mut alice = connect(&a, "alice", "room=R").await;
    let welcome = recv(&mut alice).await;
    assert_eq!(s(&welcome, "type"), "joined");
    assert_eq!(s(&welcome, "last_event_id"), "");
    let epoch = s(&welcome, "epoch");
    let mut sam = connect(&b, "sam", "room=R").await;
    assert_eq!(s(&recv(&mut sam).await, "epoch"), epoch);
    send(&mut sam, "m0").await;
    let m0 = until_event(&mut alice, "R", "m0").await;
    until_event(&mut sam, "R", "m0").await;
    alice.close(None).await.unwrap();
    drop(alice);

    let mut other = connect(&a, "olga", "room=elsewhere").await;
    let elsewhere = s(&recv(&mut other).await, "epoch");
    assert_ne!(elsewhere, epoch);

    let max = "9007199254740991";
    // The hostile positions against the room's head `last`.
    let hostile = |last: &str| {
        let last_ms = last.parse::<EventId>().unwrap().millis();
        let far = last_ms + 1_000_000_000; // eleven days ahead of the room
        [
            (
                format!("last_event_id={max}-0&epoch={epoch}"),
                Expect::Resync("ahead"),
            ),
            (
                format!("last_event_id={max}-{max}&epoch={epoch}"),
                Expect::Resync("ahead"),
            ),
            (
                format!("last_event_id={far}-0&epoch={epoch}"),
                Expect::Resync("ahead"),
            ),
            (
                format!("last_event_id={last_ms}-{max}&epoch={epoch}"),
                Expect::Resync("ahead"),
            ),
            (
                format!("last_event_id=0-0&epoch={epoch}"),
                Expect::Everything,
            ),
            (format!("epoch={epoch}"), Expect::Everything),
            (
                format!("last_event_id={m0}&epoch={elsewhere}"),
                Expect::Resync("epoch_changed"),
            ),
            (
                format!("last_event_id={max}-0&epoch={elsewhere}"),
                Expect::Resync("epoch_changed"),
            ),
            (
                format!("last_event_id={max}-0&epoch=0ff0ff"),
                Expect::Resync("epoch_changed"),
            ),
            (
                format!("last_event_id=0-0&epoch={}", "f".repeat(64)),
                Expect::Resync("epoch_changed"),
            ),
        ]
    };
    let big = "9".repeat(10_000);
    let refused = [
        format!("last_event_id=9007199254740992-0&epoch={epoch}"),
        format!("last_event_id=1-9007199254740992&epoch={epoch}"),
        format!("last_event_id=1-99999999999999999&epoch={epoch}"),
        format!("last_event_id=18446744073709551616-0&epoch={epoch}"),
        format!("last_event_id=-1-0&epoch={epoch}"),
        format!("last_event_id=1-&epoch={epoch}"),
        format!("last_event_id={big}-0&epoch={epoch}"),
        format!("last_event_id=1-0&epoch={}", "f".repeat(65)),
        format!("last_event_id={max}-0&epoch=zz"),
        "last_event_id=1-0&epoch=ABC".to_owned(),
        "last_event_id=1-0&epoch=not-an-epoch".to_owned(),
        "last_event_id=1-0&epoch=%C3%A9".to_owned(),
        "last_event_id=1-0&epoch=%FF".to_owned(),
        format!("last_event_id=%FF&epoch={epoch}"),
        "last_event_id=1-0&epoch=".to_owned(),
        "last_event_id=1-0".to_owned(),
        format!("last_event_id={max}-0"),
    ];
    let mut sent = vec!["m0".to_owned()];
    let mut last = m0.clone();
    for round in 0..3 {
        for (i, (query, expected)) in hostile(&last).iter().enumerate() {
            let node = if i % 2 == 0 { &a } else { &b };
            let mut mallory = connect(node, "mallory", &format!("room=R&{query}")).await;
            let (history, end) = resume_answer(&mut mallory, "R", &epoch).await;
            match expected {
                Expect::Resync(reason) => {
                    assert!(history.is_empty(), "{query}: {history:?}");
                    assert_eq!(
                        (s(&end, "type"), s(&end, "room"), s(&end, "reason")),
                        ("resync".into(), "R".into(), (*reason).into()),
                        "round {round}: {query}"
                    );
                }
                Expect::Everything => {
                    assert_eq!(history, sent, "round {round}: {query}");
                    assert_eq!(s(&end, "type"), "recovered", "{query}: {end}");
                    assert_eq!(end["count"].as_u64(), Some(sent.len() as u64));
                }
            }
            mallory.close(None).await.unwrap();
        }
        for query in &refused {
            assert_eq!(
                status_of(&a, &format!("room=R&{query}")).await,
                400,
                "round {round}: {query}"
            );
        }
        // The room goes on between the attacks.
        let data = format!("m{}", round + 1);
        send(&mut sam, &data).await;
        last = until_event(&mut sam, "R", &data).await;
        sent.push(data);
    }

    // Alice resumes with her real position, on the other node: exactly
    // the gap, in order, then `recovered`; then live events.
    let mut alice = connect(
        &b,
        "alice",
        &format!("room=R&last_event_id={m0}&epoch={epoch}"),
    )
    .await;
    let (gap, end) = resume_answer(&mut alice, "R", &epoch).await;
    assert_eq!(gap, ["m1", "m2", "m3"], "{end}");
    assert_eq!(
        (s(&end, "type"), end["count"].as_u64()),
        ("recovered".into(), Some(3)),
        "{end}"
    );
    send(&mut sam, "live").await;
    until_event(&mut alice, "R", "live").await;
    // And the other room is untouched too.
    let mut olga = connect(&b, "olga", &format!("room=elsewhere&epoch={elsewhere}")).await;
    let (history, end) = resume_answer(&mut olga, "elsewhere", &elsewhere).await;
    assert!(history.is_empty());
    assert_eq!(s(&end, "type"), "recovered", "{end}");
}

/// Redis's clock, in milliseconds.
async fn redis_millis(
    conn: &mut tower_window::store::redis::redis::aio::MultiplexedConnection,
) -> u64 {
    let (secs, micros): (u64, u64) = tower_window::store::redis::redis::cmd("TIME")
        .query_async(conn)
        .await
        .unwrap();
    secs * 1000 + micros / 1000
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_that_kept_the_epoch_is_never_recovered() {
    use tower_window::store::redis::redis;

    let redis = RedisServer::start();
    let a = gateway(&redis);
    let b = gateway(&redis);
    let mut conn = redis.async_connection().await;
    let keys = ["tw:ev:{room%3Afragile}:s", "tw:ev:{room%3Afragile}:m"];

    let mut alice = connect(&a, "alice", "room=fragile").await;
    let epoch = s(&recv(&mut alice).await, "epoch");
    let mut sam = connect(&b, "sam", "room=fragile").await;
    recv(&mut sam).await;
    send(&mut sam, "m0").await;
    let m0 = until_event(&mut alice, "fragile", "m0").await;
    until_event(&mut sam, "fragile", "m0").await;
    // A backup of the room, taken after m0.
    let mut backup = Vec::new();
    for key in keys {
        let payload: Vec<u8> = redis::cmd("DUMP")
            .arg(key)
            .query_async(&mut conn)
            .await
            .unwrap();
        backup.push(payload);
    }
    send(&mut sam, "m1").await;
    send(&mut sam, "m2").await;
    until_event(&mut alice, "fragile", "m1").await;
    let m2 = until_event(&mut alice, "fragile", "m2").await;
    until_event(&mut sam, "fragile", "m2").await;
    alice.close(None).await.unwrap();
    drop(alice);

    // The backup is restored over the room: m1 and m2 are gone, the epoch
    // is the backup's (the room's own).
    for (key, payload) in keys.iter().zip(backup) {
        let _: () = redis::cmd("RESTORE")
            .arg(*key)
            .arg(600_000)
            .arg(payload)
            .arg("REPLACE")
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    // Let Redis's clock pass m2 (bounded), so the room's next id is new.
    let m2_ms = m2.parse::<EventId>().unwrap().millis();
    for _ in 0..200 {
        if redis_millis(&mut conn).await > m2_ms {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(redis_millis(&mut conn).await > m2_ms);
    // The room goes on: m3 follows m0.
    send(&mut sam, "m3").await;
    until_event(&mut sam, "fragile", "m3").await;

    // Alice had m2; what followed it may be lost: never `recovered`.
    let query = format!("room=fragile&last_event_id={m2}&epoch={epoch}");
    let mut alice = connect(&b, "alice", &query).await;
    let (history, end) = resume_answer(&mut alice, "fragile", &epoch).await;
    assert!(history.is_empty(), "{history:?}");
    assert_eq!(
        (s(&end, "type"), s(&end, "reason")),
        ("resync".into(), "too_old".into()),
        "never recovered across lost events: {end}"
    );
    send(&mut sam, "m4").await;
    until_event(&mut alice, "fragile", "m4").await;
    // Bob had only m0: nothing after it is lost; he recovers m3 and m4.
    let query = format!("room=fragile&last_event_id={m0}&epoch={epoch}");
    let mut bob = connect(&a, "bob", &query).await;
    let (gap, end) = resume_answer(&mut bob, "fragile", &epoch).await;
    assert_eq!(gap, ["m3", "m4"]);
    assert_eq!(s(&end, "type"), "recovered", "{end}");
}
