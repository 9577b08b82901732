//! The hub and sessions without sockets (moved with the hub from the
//! example gateway's `rooms.rs`).
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use tower_window::events::{Epoch, EventId, EventWindow, Position, Retention};
use tower_window::MemoryStore;

use super::{Outgoing, RoomHub, RoomName, RoomSession};

/// The one place these tests make an event window.
fn hub(capacity: usize) -> RoomHub {
    let retention = Retention::new(Duration::from_secs(600), 1000).unwrap();
    RoomHub::builder(EventWindow::new(MemoryStore::new(), retention))
        .queue_capacity(capacity)
        .build()
}

fn room(name: &str) -> RoomName {
    RoomName::new(name).unwrap()
}

async fn next(session: &mut RoomSession) -> Outgoing {
    tokio::time::timeout(Duration::from_secs(10), session.next())
        .await
        .expect("a frame in time")
        .unwrap()
        .expect("the hub is alive")
}

fn json(frame: Outgoing) -> serde_json::Value {
    match frame {
        Outgoing::Text(text) => serde_json::from_str(text.as_str()).unwrap(),
        Outgoing::Overflow(text) => panic!("overflow: {}", text.as_str()),
    }
}

/// A socket that does not read fills its queue and is dropped from the
/// room with a resync; the socket that reads gets every event, and the
/// publisher never waits.
#[tokio::test]
async fn a_full_queue_drops_only_that_socket() {
    let hub = hub(2);
    let r = room("r");
    let mut slow = hub.join(&r, None).await.unwrap();
    let mut fast = hub.join(&r, None).await.unwrap();
    assert_eq!(json(next(&mut fast).await)["type"], "joined");
    assert_eq!(json(next(&mut slow).await)["type"], "joined");
    for i in 0..10 {
        hub.publish(&r, "u", &i.to_string()).await.unwrap();
        let event = json(next(&mut fast).await);
        assert_eq!(
            (event["type"].as_str(), event["data"].as_str()),
            (Some("event"), Some(&*i.to_string()))
        );
    }
    assert_eq!(hub.sockets_in(&r), 1, "the slow socket left the room");
    assert_eq!(json(next(&mut slow).await)["data"], "0");
    assert_eq!(json(next(&mut slow).await)["data"], "1");
    match next(&mut slow).await {
        Outgoing::Overflow(text) => {
            let resync: serde_json::Value = serde_json::from_str(text.as_str()).unwrap();
            assert_eq!(resync["type"], "resync");
            assert_eq!(resync["reason"], "overflow");
        }
        Outgoing::Text(text) => panic!("expected the overflow, got {}", text.as_str()),
    }
    drop(fast);
    assert_eq!(hub.sockets_in(&r), 0);
}

/// A position ahead of the room (issue 22, defect 3) is answered
/// `resync` `ahead` to that socket alone, on the polling reader too:
/// the room keeps its epoch and an honest resume recovers its gap.
#[tokio::test]
async fn a_position_ahead_is_answered_to_that_socket_alone() {
    let hub = hub(16);
    let r = room("r");
    let mut alice = hub.join(&r, None).await.unwrap();
    let joined = json(next(&mut alice).await);
    let epoch: Epoch = joined["epoch"].as_str().unwrap().parse().unwrap();
    let first = hub.publish(&r, "u", "m0").await.unwrap();
    assert_eq!(json(next(&mut alice).await)["data"], "m0");
    drop(alice);
    let ahead = EventId::new(tower_window::events::MAX_ID_PART, 0).unwrap();
    for i in 0..3 {
        let position = Position::new(epoch.clone(), Some(ahead));
        let mut mallory = hub.join(&r, Some(position)).await.unwrap();
        assert_eq!(json(next(&mut mallory).await)["epoch"], epoch.as_str());
        let resync = json(next(&mut mallory).await);
        assert_eq!(
            (resync["type"].as_str(), resync["reason"].as_str()),
            (Some("resync"), Some("ahead"))
        );
        hub.publish(&r, "u", &format!("m{}", i + 1)).await.unwrap();
    }
    let mut alice = hub
        .join(&r, Some(Position::new(epoch.clone(), Some(first))))
        .await
        .unwrap();
    assert_eq!(json(next(&mut alice).await)["epoch"], epoch.as_str());
    for data in ["m1", "m2", "m3"] {
        assert_eq!(json(next(&mut alice).await)["data"], data);
    }
    let recovered = json(next(&mut alice).await);
    assert_eq!(
        (recovered["type"].as_str(), recovered["count"].as_u64()),
        (Some("recovered"), Some(3))
    );
}

/// Events appended after the join read the room's position but before the
/// history is read are in both the history and the live queue: they are
/// sent once, in history, and the first live event after `recovered` is
/// the next new one.
#[tokio::test]
async fn history_past_the_welcome_is_not_sent_again_live() {
    let hub = hub(16);
    let r = room("r");
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(hub.publish(&r, "u", &format!("m{i}")).await.unwrap());
    }
    let epoch = hub.events().position("room:r").await.unwrap().epoch;
    let from = Position::new(epoch, Some(ids[0]));
    let mut session = hub.join(&r, Some(from)).await.unwrap();
    // Subscribed and welcomed at m2; these two come after the welcome.
    hub.publish(&r, "u", "m3").await.unwrap();
    hub.publish(&r, "u", "m4").await.unwrap();
    let welcome = json(next(&mut session).await);
    assert_eq!(welcome["last_event_id"], ids[2].to_string());
    for data in ["m1", "m2", "m3", "m4"] {
        assert_eq!(json(next(&mut session).await)["data"], data);
    }
    let recovered = json(next(&mut session).await);
    assert_eq!(
        (recovered["type"].as_str(), recovered["count"].as_u64()),
        (Some("recovered"), Some(4))
    );
    hub.publish(&r, "u", "m5").await.unwrap();
    assert_eq!(json(next(&mut session).await)["data"], "m5");
}

/// Events the node's reader can no longer read (the room's history moved
/// past its cursor: here appended straight to the window, which keeps 5,
/// with no wake-up) are never skipped silently: every socket of the room
/// is told to resync and leaves it, and a resume from its last position
/// is answered `too_old`.
#[tokio::test]
async fn a_reader_behind_the_history_drops_its_sockets_with_a_resync() {
    let retention = Retention::new(Duration::from_secs(600), 5).unwrap();
    let hub = RoomHub::builder(EventWindow::new(MemoryStore::new(), retention))
        .queue_capacity(64)
        .build();
    let r = room("r");
    let mut alice = hub.join(&r, None).await.unwrap();
    let mut bob = hub.join(&r, None).await.unwrap();
    let joined = json(next(&mut alice).await);
    assert_eq!(json(next(&mut bob).await)["type"], "joined");
    let first = hub.publish(&r, "u", "m0").await.unwrap();
    assert_eq!(json(next(&mut alice).await)["data"], "m0");
    assert_eq!(json(next(&mut bob).await)["data"], "m0");
    for i in 1..=20 {
        let data = format!("m{i}");
        hub.events()
            .append("room:r", &[("from", &b"u"[..]), ("data", data.as_bytes())])
            .await
            .unwrap();
    }
    hub.publish(&r, "u", "m21").await.unwrap();
    for session in [&mut alice, &mut bob] {
        match next(session).await {
            Outgoing::Overflow(text) => {
                let resync: serde_json::Value = serde_json::from_str(text.as_str()).unwrap();
                assert_eq!(
                    (resync["type"].as_str(), resync["reason"].as_str()),
                    (Some("resync"), Some("overflow"))
                );
            }
            Outgoing::Text(text) => panic!("expected a resync, got {}", text.as_str()),
        }
    }
    assert_eq!(hub.sockets_in(&r), 0, "both sockets left the room");
    drop((alice, bob));
    let epoch: Epoch = joined["epoch"].as_str().unwrap().parse().unwrap();
    let mut again = hub
        .join(&r, Some(Position::new(epoch.clone(), Some(first))))
        .await
        .unwrap();
    assert_eq!(json(next(&mut again).await)["epoch"], epoch.as_str());
    let resync = json(next(&mut again).await);
    assert_eq!(
        (resync["type"].as_str(), resync["reason"].as_str()),
        (Some("resync"), Some("too_old"))
    );
    hub.publish(&r, "u", "m22").await.unwrap();
    assert_eq!(json(next(&mut again).await)["data"], "m22");
}

fn text(frame: Option<axum::extract::ws::Utf8Bytes>) -> Option<serde_json::Value> {
    frame.map(|text| serde_json::from_str(text.as_str()).unwrap())
}

/// `ready_now` hands out what is already there and never waits: the
/// welcome, then live events in order without the ones history already
/// sent; nothing while a resume still has history to read (that is
/// `next`'s, with its store call).
#[tokio::test]
async fn ready_now_takes_only_what_is_already_there() {
    let hub = hub(64);
    let r = room("r");
    let first = hub.publish(&r, "u", "m0").await.unwrap();
    hub.publish(&r, "u", "m1").await.unwrap();
    let epoch = hub.events().position("room:r").await.unwrap().epoch;
    let mut resumed = hub
        .join(&r, Some(Position::new(epoch, Some(first))))
        .await
        .unwrap();
    let mut live = hub.join(&r, None).await.unwrap();
    assert_eq!(text(live.ready_now()).unwrap()["type"], "joined");
    assert_eq!(text(resumed.ready_now()).unwrap()["type"], "joined");
    assert_eq!(text(live.ready_now()), None, "nothing published since");
    assert_eq!(text(resumed.ready_now()), None, "history is next's to read");
    assert_eq!(json(next(&mut resumed).await)["data"], "m1");
    assert_eq!(json(next(&mut resumed).await)["type"], "recovered");

    let data: Vec<String> = (2..7).map(|i| format!("m{i}")).collect();
    let refs: Vec<&str> = data.iter().map(String::as_str).collect();
    hub.publish_many(&r, "u", &refs).await.unwrap();
    // The reader delivers on its own task: the first by `next`, the rest
    // as they land (bounded: 1000 turns of 1 ms).
    let mut got = vec![json(next(&mut live).await)["data"]
        .as_str()
        .unwrap()
        .to_owned()];
    for _ in 0..1000 {
        match text(live.ready_now()) {
            Some(event) => got.push(event["data"].as_str().unwrap().to_owned()),
            None if got.len() == data.len() => break,
            None => tokio::time::sleep(Duration::from_millis(1)).await,
        }
    }
    assert_eq!(got, data);
    assert_eq!(text(live.ready_now()), None);
}

/// On the embedded store the hub reads rooms by the store's wake-ups (a
/// local notify fed by every append), not by polling: an append through
/// another handle on the same store, which never touches the hub, wakes
/// the reader all the same.
#[tokio::test]
async fn on_the_embedded_store_appends_wake_the_reader() {
    let memory = MemoryStore::new();
    let retention = Retention::new(Duration::from_secs(600), 1000).unwrap();
    let hub = RoomHub::new(EventWindow::new(memory.clone(), retention));
    assert!(format!("{hub:?}").contains("\"push\""), "{hub:?}");
    let r = room("r");
    let mut alice = hub.join(&r, None).await.unwrap();
    assert_eq!(json(next(&mut alice).await)["type"], "joined");
    let elsewhere = EventWindow::new(memory, retention);
    for i in 0..3 {
        let data = format!("m{i}");
        elsewhere
            .append("room:r", &[("from", b"u"), ("data", data.as_bytes())])
            .await
            .unwrap();
        assert_eq!(json(next(&mut alice).await)["data"], data.as_str());
    }
}

/// The polling reader (a store without wake-ups, or chosen) still
/// delivers every event, in order.
#[tokio::test]
async fn the_polling_reader_delivers_in_order() {
    let retention = Retention::new(Duration::from_secs(600), 1000).unwrap();
    let hub = RoomHub::builder(EventWindow::new(MemoryStore::new(), retention))
        .polling()
        .build();
    assert!(format!("{hub:?}").contains("\"poll\""), "{hub:?}");
    let r = room("r");
    let mut alice = hub.join(&r, None).await.unwrap();
    assert_eq!(json(next(&mut alice).await)["type"], "joined");
    for i in 0..3 {
        hub.publish(&r, "u", &format!("m{i}")).await.unwrap();
    }
    for i in 0..3 {
        assert_eq!(json(next(&mut alice).await)["data"], format!("m{i}"));
    }
}

/// The module docs' example app, served to real WebSocket clients (moved
/// from the doctest's hidden part).
mod module_example {
    use std::time::Duration;

    use axum::extract::{ws::WebSocketUpgrade, Path, State};
    use axum::{response::Response, routing::get, Router};
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::{Error as WsError, Message};
    use tower_window::events::{EventWindow, Retention};
    use tower_window::{Limiter, MemoryStore, Quota, Store, WindowKey};

    use crate::ws::rooms::{Resume, RoomHub, RoomName};
    use crate::ws::{GuardedSocket, MessageLimits};

    #[derive(Clone)]
    struct Rooms {
        hub: RoomHub,
        limits: MessageLimits,
    }

    async fn room(
        State(rooms): State<Rooms>,
        Path(room): Path<RoomName>,
        Resume(resume): Resume,
        ws: WebSocketUpgrade,
    ) -> Response {
        rooms
            .limits
            .configure(ws)
            .on_upgrade(move |socket| async move {
                let socket =
                    GuardedSocket::new(socket, rooms.limits, WindowKey::for_subject("guest"));
                rooms.hub.serve(socket, &room, resume, "guest").await
            })
    }

    fn app() -> Result<Router, Box<dyn std::error::Error>> {
        let store = Store::from(MemoryStore::new());
        let retention = Retention::new(Duration::from_secs(600), 1000)?;
        let hub = RoomHub::new(EventWindow::new(store.clone(), retention));
        let limits = MessageLimits::builder(Limiter::new(store, "100/1m".parse::<Quota>()?))
            .messages("2/1m".parse::<Quota>()?)
            .build();
        Ok(Router::new()
            .route("/rooms/{room}", get(room))
            .with_state(Rooms { hub, limits }))
    }

    async fn serve(listener: tokio::net::TcpListener) -> Result<(), Box<dyn std::error::Error>> {
        Ok(axum::serve(listener, app()?).await?)
    }

    type Ws = tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >;

    async fn frame(ws: &mut Ws) -> serde_json::Value {
        let next = tokio::time::timeout(Duration::from_secs(10), ws.next());
        match next
            .await
            .expect("a frame in time")
            .expect("open")
            .expect("a frame")
        {
            Message::Text(text) => serde_json::from_str(&text).expect("json"),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn serves_resumes_and_refuses() -> Result<(), Box<dyn std::error::Error>> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("ws://{}/rooms/lobby", listener.local_addr()?);
        let clients = async {
            let (mut alice, _) = tokio_tungstenite::connect_async(url.as_str()).await?;
            let (mut bob, _) = tokio_tungstenite::connect_async(url.as_str()).await?;
            let joined = frame(&mut alice).await;
            assert_eq!(joined["type"], "joined");
            assert_eq!(frame(&mut bob).await["type"], "joined");
            alice.send(Message::text("hello")).await?;
            let mut first = serde_json::Value::Null;
            for ws in [&mut alice, &mut bob] {
                first = frame(ws).await;
                assert_eq!(
                    (&first["type"], &first["data"]),
                    (&"event".into(), &"hello".into())
                );
            }
            alice.send(Message::text("again")).await?;
            assert_eq!(frame(&mut alice).await["data"], "again");
            // The third message of the minute is over the guests' quota: dropped, with a notice.
            alice.send(Message::text("spam")).await?;
            let notice = frame(&mut alice).await;
            assert_eq!(
                (&notice["type"], &notice["quota"]),
                (&"rate_limited".into(), &"messages".into())
            );
            // Resuming after the first event: the second, then `recovered`.
            let resume = format!(
                "{url}?epoch={}&last_event_id={}",
                first["epoch"].as_str().unwrap(),
                first["id"].as_str().unwrap()
            );
            let (mut carol, _) = tokio_tungstenite::connect_async(resume.as_str()).await?;
            assert_eq!(frame(&mut carol).await["type"], "joined");
            assert_eq!(frame(&mut carol).await["data"], "again");
            assert_eq!(frame(&mut carol).await["type"], "recovered");
            // A malformed position is refused before the upgrade.
            match tokio_tungstenite::connect_async(format!("{url}?last_event_id=1-0")).await {
                Err(WsError::Http(response)) => assert_eq!(response.status(), 400),
                other => panic!("{other:?}"),
            }
            Ok::<(), Box<dyn std::error::Error>>(())
        };
        tokio::select! {
            served = serve(listener) => panic!("the server stopped: {served:?}"),
            checked = clients => checked,
        }
    }
}
