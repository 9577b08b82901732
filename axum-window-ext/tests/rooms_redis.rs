//! `ws::rooms` on a throwaway `redis-server`, read live with the blocking
//! `XREAD` tail (`RoomHubBuilder::tail`), over real sockets: two nodes
//! (two hubs, each with its own tail), live fan-out across them, a resume
//! on the other node with the gap in pages then live events, and an
//! overflow closed with 1013.
#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used)]

mod rooms_support;

use std::sync::Arc;

use axum_window_ext::ws::rooms::{RoomHub, RoomName, CLOSE_OVERFLOW, HISTORY_PAGE};
use tower_window::RedisStore;
use tower_window_tests::redis_server::RedisServer;

use rooms_support::*;

/// A node: a hub on the Redis at `url` with a tail of its own.
fn node(url: &str) -> RoomHub {
    let store = Arc::new(RedisStore::from_url(url).unwrap());
    let tail = store.event_tail().unwrap();
    hub(store).tail(tail).build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rooms_on_redis_fan_out_across_nodes_and_resume_on_the_other() {
    let redis = RedisServer::start();
    let (a, b) = (node(&redis.url()), node(&redis.url()));
    assert!(format!("{a:?}").contains(r#"live: "tail""#), "{a:?}");
    let (node_a, node_b) = (serve(a, None).await, serve(b.clone(), None).await);
    let mut alice = connect(node_a, "/rooms/lobby?user=alice", None).await;
    let mut bob = connect(node_b, "/rooms/lobby?user=bob", None).await;
    let epoch = s(&recv(&mut alice).await, "epoch");
    assert_eq!(s(&recv(&mut bob).await, "epoch"), epoch);
    for i in 0..4 {
        send(&mut alice, &format!("m{i}")).await;
    }
    let seen = events(&mut alice, "lobby", 4).await;
    assert_eq!(data(&seen), numbered(0..4));
    assert_eq!(data(&events(&mut bob, "lobby", 4).await), numbered(0..4));
    let last = s(&seen[3], "id");
    alice.close(None).await.unwrap();

    // The gap: more than one history page, published on node B.
    let room = RoomName::new("lobby").unwrap();
    let gap = HISTORY_PAGE as usize + 30;
    for i in 4..4 + gap {
        b.publish(&room, "bob", &format!("m{i}")).await.unwrap();
    }
    assert_eq!(
        data(&events(&mut bob, "lobby", gap).await),
        numbered(4..4 + gap)
    );

    let path = format!("/rooms/lobby?user=alice&epoch={epoch}&last_event_id={last}");
    let mut alice = connect(node_b, &path, None).await;
    assert_eq!(s(&recv(&mut alice).await, "type"), "joined");
    let end = 4 + gap;
    assert_eq!(
        data(&events(&mut alice, "lobby", gap).await),
        numbered(4..end)
    );
    let recovered = recv(&mut alice).await;
    assert_eq!(
        (s(&recovered, "type"), recovered["count"].as_u64()),
        ("recovered".to_owned(), Some(gap as u64))
    );
    // Live again, from both nodes, exactly once each.
    let mut carol = connect(node_a, "/rooms/lobby?user=carol", None).await;
    assert_eq!(s(&recv(&mut carol).await, "type"), "joined");
    send(&mut carol, &format!("m{end}")).await;
    assert_eq!(
        data(&events(&mut alice, "lobby", 1).await),
        numbered(end..end + 1)
    );
    send(&mut bob, &format!("m{}", end + 1)).await;
    assert_eq!(
        data(&events(&mut alice, "lobby", 1).await),
        numbered(end + 1..end + 2)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overflow_on_redis_is_closed_with_1013() {
    let redis = RedisServer::start();
    let store = Arc::new(RedisStore::from_url(&redis.url()).unwrap());
    let tail = store.event_tail().unwrap();
    let hub = hub(store).tail(tail).queue_capacity(1).build();
    let address = serve(hub.clone(), Some(4096)).await;
    let room = RoomName::new("busy").unwrap();
    let mut slow = connect(address, "/rooms/busy", Some(4096)).await;
    assert_eq!(s(&recv(&mut slow).await, "type"), "joined");
    let payload = "x".repeat(4096);
    let mut published = 0;
    while hub.sockets_in(&room) == 1 {
        assert!(
            published < 2_000,
            "still in the room after {published} events"
        );
        hub.publish(&room, "bob", &payload).await.unwrap();
        published += 1;
    }
    let mut got = 0;
    let close = loop {
        assert!(got <= published, "more events than published");
        match frame(&mut slow).await {
            Ok(message) if s(&message, "type") == "event" => got += 1,
            Ok(message) => {
                assert_eq!(s(&message, "reason"), "overflow", "{message}");
                break frame(&mut slow)
                    .await
                    .expect_err("the close after the resync");
            }
            Err(close) => panic!("closed before the resync: {close:?}"),
        }
    };
    assert_eq!(u16::from(close.expect("a code").code), CLOSE_OVERFLOW);
}
