//! `ws::rooms` in a user's own axum router, on the embedded store, over
//! real sockets (loopback, tokio-tungstenite clients): the welcome and live
//! fan-out, a resume that gets the gap page by page then live events with
//! no gap and no duplicate — also on another hub (another node) on the
//! same store —, an overflow told to resync and closed with 1013, and the
//! protocol's refusals (a bad room name, a bad position, a binary message).
#![allow(clippy::unwrap_used)]

mod rooms_support;

use axum_window_ext::ws::rooms::{RoomName, CLOSE_OVERFLOW, CLOSE_UNSUPPORTED, HISTORY_PAGE};
use tokio_tungstenite::tungstenite::Message;
use tower_window::MemoryStore;

use futures_util::SinkExt;
use rooms_support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sockets_join_and_every_message_reaches_everyone_in_the_room() {
    let hub = hub(MemoryStore::new()).build();
    let address = serve(hub.clone(), None).await;
    let mut alice = connect(address, "/rooms/lobby?user=alice", None).await;
    let mut bob = connect(address, "/rooms/lobby?user=bob", None).await;
    let mut carol = connect(address, "/rooms/other?user=carol", None).await;
    for ws in [&mut alice, &mut bob] {
        let joined = recv(ws).await;
        assert_eq!(
            (s(&joined, "type"), s(&joined, "room")),
            ("joined".to_owned(), "lobby".to_owned())
        );
        assert!(!s(&joined, "epoch").is_empty(), "{joined}");
        assert_eq!(s(&joined, "last_event_id"), "", "the room has no event yet");
    }
    assert_eq!(s(&recv(&mut carol).await, "type"), "joined");
    assert_eq!(hub.sockets_in(&RoomName::new("lobby").unwrap()), 2);

    for i in 0..3 {
        send(&mut alice, &format!("m{i}")).await;
    }
    // Bob speaks once alice's messages are in the room.
    let mut got = events(&mut alice, "lobby", 3).await;
    send(&mut bob, "m3").await;
    got.extend(events(&mut alice, "lobby", 1).await);
    for got in [got, events(&mut bob, "lobby", 4).await] {
        assert_eq!(data(&got), numbered(0..4), "in order, the sender included");
        let from: Vec<String> = got.iter().map(|e| s(e, "from")).collect();
        assert_eq!(from, ["alice", "alice", "alice", "bob"]);
        let ids: Vec<String> = got.iter().map(|e| s(e, "id")).collect();
        assert!(ids.windows(2).all(|w| w[0] != w[1]), "{ids:?}");
    }
    // Nothing of the lobby reached the other room.
    send(&mut carol, "c0").await;
    let event = recv(&mut carol).await;
    assert_eq!(
        (s(&event, "room"), s(&event, "data")),
        ("other".to_owned(), "c0".to_owned())
    );
}

/// A client that left after `m9` resumes from its position while more is
/// published: it gets every event after it exactly once, in order — more
/// than two history pages, then `recovered` counting exactly the history,
/// then live events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_gets_the_gap_then_live_events_with_no_gap_and_no_duplicate() {
    let hub = hub(MemoryStore::new()).build();
    let address = serve(hub.clone(), None).await;
    let room = RoomName::new("lobby").unwrap();
    let mut alice = connect(address, "/rooms/lobby?user=alice", None).await;
    let epoch = s(&recv(&mut alice).await, "epoch");
    for i in 0..10 {
        hub.publish(&room, "bob", &format!("m{i}")).await.unwrap();
    }
    let seen = events(&mut alice, "lobby", 10).await;
    assert_eq!(data(&seen), numbered(0..10));
    let last = s(&seen[9], "id");
    alice.close(None).await.unwrap();
    drop(alice);

    let gap = 2 * HISTORY_PAGE as usize + 50;
    for i in 10..10 + gap {
        hub.publish(&room, "bob", &format!("m{i}")).await.unwrap();
    }
    // More is published while alice resumes: some of it lands in her
    // history, some arrives live; none twice, none missing.
    let end = 10 + gap + 100;
    let publisher = {
        let (hub, room) = (hub.clone(), room.clone());
        tokio::spawn(async move {
            for i in 10 + gap..end {
                hub.publish(&room, "bob", &format!("m{i}")).await.unwrap();
                tokio::task::yield_now().await;
            }
        })
    };
    let path = format!("/rooms/lobby?user=alice&epoch={epoch}&last_event_id={last}");
    let mut alice = connect(address, &path, None).await;
    let joined = recv(&mut alice).await;
    assert_eq!(
        (s(&joined, "type"), s(&joined, "epoch")),
        ("joined".to_owned(), epoch)
    );
    let (got, recovered) =
        resumed_until(&mut alice, "lobby", &format!("m{}", end - 1), 2 * end).await;
    publisher.await.unwrap();
    assert_eq!(got, numbered(10..end));
    let [(at, count)] = recovered[..] else {
        panic!("one recovered, got {recovered:?}");
    };
    assert_eq!(
        at as u64, count,
        "recovered counts exactly the history before it"
    );
    assert!(count >= gap as u64, "the gap is history: {count} < {gap}");
}

/// Two hubs on one store are two nodes: a client resumes on the other one
/// with exactly its gap, then gets live events published on either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_on_another_node_is_recovered() {
    let store = MemoryStore::new();
    let (a, b) = (hub(store.clone()).build(), hub(store).build());
    let (node_a, node_b) = (serve(a, None).await, serve(b, None).await);
    let mut alice = connect(node_a, "/rooms/r?user=alice", None).await;
    let mut bob = connect(node_b, "/rooms/r?user=bob", None).await;
    let epoch = s(&recv(&mut alice).await, "epoch");
    assert_eq!(
        s(&recv(&mut bob).await, "epoch"),
        epoch,
        "one room, one epoch"
    );
    for i in 0..3 {
        send(&mut alice, &format!("m{i}")).await;
    }
    let seen = events(&mut alice, "r", 3).await;
    assert_eq!(data(&events(&mut bob, "r", 3).await), numbered(0..3));
    let last = s(&seen[2], "id");
    alice.close(None).await.unwrap();
    for i in 3..8 {
        send(&mut bob, &format!("m{i}")).await;
    }
    assert_eq!(data(&events(&mut bob, "r", 5).await), numbered(3..8));

    let path = format!("/rooms/r?user=alice&epoch={epoch}&last_event_id={last}");
    let mut alice = connect(node_b, &path, None).await;
    assert_eq!(s(&recv(&mut alice).await, "type"), "joined");
    assert_eq!(data(&events(&mut alice, "r", 5).await), numbered(3..8));
    let recovered = recv(&mut alice).await;
    assert_eq!(
        (s(&recovered, "type"), recovered["count"].as_u64()),
        ("recovered".to_owned(), Some(5))
    );
    // Live from this node and from the other one.
    send(&mut bob, "m8").await;
    assert_eq!(data(&events(&mut alice, "r", 1).await), ["m8"]);
    let mut carol = connect(node_a, "/rooms/r?user=carol", None).await;
    assert_eq!(s(&recv(&mut carol).await, "type"), "joined");
    send(&mut carol, "m9").await;
    assert_eq!(data(&events(&mut alice, "r", 1).await), ["m9"]);
}

/// A socket that stops reading stalls its writes (small kernel buffers on
/// both ends), its bounded queue fills, and it is dropped from the room:
/// it still gets what was queued, in order from the start, then `resync`
/// `overflow`, then the close 1013. The publisher never waits for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_too_slow_for_its_queue_is_told_to_resync_and_closed_with_1013() {
    let hub = hub(MemoryStore::new()).queue_capacity(2).build();
    let address = serve(hub.clone(), Some(4096)).await;
    let room = RoomName::new("busy").unwrap();
    let mut slow = connect(address, "/rooms/busy?user=slow", Some(4096)).await;
    // Joined (so subscribed) before anything is published.
    assert_eq!(s(&recv(&mut slow).await, "type"), "joined");
    let payload = "x".repeat(4096);
    let mut published = 0;
    while hub.sockets_in(&room) == 1 {
        assert!(
            published < 2_000,
            "still in the room after {published} events"
        );
        hub.publish(&room, "bob", &format!("m{published}:{payload}"))
            .await
            .unwrap();
        published += 1;
    }
    // Now read: a prefix of what was published, then the resync and the close.
    let mut got = Vec::new();
    let close = loop {
        assert!(got.len() <= published, "more events than published");
        match frame(&mut slow).await {
            Ok(message) if s(&message, "type") == "event" => {
                let text = s(&message, "data");
                got.push(text.split(':').next().unwrap_or_default().to_owned());
            }
            Ok(message) => {
                assert_eq!(
                    (s(&message, "type"), s(&message, "reason")),
                    ("resync".to_owned(), "overflow".to_owned()),
                    "{message}"
                );
                break frame(&mut slow)
                    .await
                    .expect_err("the close after the resync");
            }
            Err(close) => panic!("closed before the resync: {close:?}"),
        }
    };
    assert_eq!(got, numbered(0..got.len()), "in order from the start");
    assert!(got.len() < published, "the overflow dropped events");
    let close = close.expect("a close frame with a code");
    assert_eq!(u16::from(close.code), CLOSE_OVERFLOW);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_names_positions_and_binary_messages_are_refused() {
    let hub = hub(MemoryStore::new()).build();
    let address = serve(hub, None).await;
    for path in [
        "/rooms/a%20b",
        "/rooms/a:b",
        &format!("/rooms/{}", "x".repeat(65)),
        "/rooms/r?epoch=not%20an%20epoch",
        "/rooms/r?epoch=e1&last_event_id=not-an-id",
    ] {
        assert_eq!(status_of(address, path).await, 400, "{path}");
    }
    let mut ws = connect(address, "/rooms/r", None).await;
    assert_eq!(s(&recv(&mut ws).await, "type"), "joined");
    ws.send(Message::binary(vec![1, 2, 3])).await.unwrap();
    let close = frame(&mut ws)
        .await
        .expect_err("closed")
        .expect("with a code");
    assert_eq!(u16::from(close.code), CLOSE_UNSUPPORTED);
}
