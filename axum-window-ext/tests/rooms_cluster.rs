//! `ws::rooms` on a real 3-primary Redis Cluster, read live by pushed
//! wake-ups (sharded pub/sub published by the append script), over real
//! sockets on two nodes (two hubs):
//!
//! * idle rooms cost (almost) no command: counted with `INFO commandstats`
//!   on every primary over a bounded interval, no event-window script call
//!   at all, where polling made 10 per room, node and second;
//! * events published on either node reach every socket in order, and a
//!   resume on the other node gets the gap, `recovered`, then live events;
//! * a primary killed during live traffic (its replica promoted): every
//!   event the store kept reaches every socket, in order, none missed or
//!   duplicated, and every event a publisher was told was appended is
//!   among them;
//! * the same for rooms whose slots are resharded to another primary
//!   (`redis-cli --cluster reshard`) during live traffic.
#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used)]

mod rooms_support;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum_window_ext::ws::rooms::{RoomHub, RoomName};
use tower_window::events::{Position, Resume};
use tower_window::{RedisStore, Store};
use tower_window_tests::redis_cluster::{key_slot, query, RedisCluster};
use tower_window_tests::redis_server::RedisServer;

use rooms_support::*;

/// A node: a hub on the cluster (pushed wake-ups, the default there),
/// with a time budget per store call for a loaded 2-core machine running
/// three clusters at once (the default 50 ms made a resume's history read
/// fail now and then: the socket is closed with 1011 then).
fn node(cluster: &RedisCluster) -> RoomHub {
    let store = Arc::new(RedisStore::cluster(cluster.urls()).unwrap());
    let store = Store::builder(store)
        .timeout(Duration::from_secs(2))
        .build();
    let hub = hub(store).build();
    assert!(format!("{hub:?}").contains(r#"live: "push""#), "{hub:?}");
    hub
}

/// The hash slot of room `name`'s stream (and wake-up channel).
fn slot_of(name: &str) -> u16 {
    key_slot(format!("tw:ev:{{room%3A{name}}}:s").as_bytes())
}

/// Calls per command since the last `CONFIG RESETSTAT`, summed over `nodes`.
fn commandstats(nodes: &[&RedisServer]) -> HashMap<String, u64> {
    let mut calls = HashMap::new();
    for node in nodes {
        let info: String = query(node, &["INFO", "commandstats"]).unwrap();
        for line in info.lines() {
            let Some((name, rest)) = line
                .strip_prefix("cmdstat_")
                .and_then(|l| l.split_once(':'))
            else {
                continue;
            };
            let n: u64 = rest
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))
                .and_then(|n| n.parse().ok())
                .unwrap();
            *calls.entry(name.to_owned()).or_default() += n;
        }
    }
    calls
}

/// Joins `room` on `address`; the `joined` frame's epoch.
async fn join(address: SocketAddr, room: &str, user: &str) -> (Ws, String) {
    let mut ws = connect(address, &format!("/rooms/{room}?user={user}"), None).await;
    let joined = recv(&mut ws).await;
    assert_eq!(s(&joined, "type"), "joined", "{joined}");
    (ws, s(&joined, "epoch"))
}

/// One publisher over both nodes and every room (message `m` to room
/// `m % rooms`, every 5 ms), retrying a message until the store says it
/// was appended (bounded in count and time). It pauses after a third of
/// the messages until `resume` is notified (having notified `pause`).
/// Returns the count published, `pause`, `resume` and the task (its
/// failed attempts).
#[allow(clippy::type_complexity)]
fn publish(
    a: &RoomHub,
    b: &RoomHub,
    names: &[String],
    messages: usize,
) -> (
    Arc<AtomicUsize>,
    Arc<tokio::sync::Notify>,
    Arc<tokio::sync::Notify>,
    tokio::task::JoinHandle<u32>,
) {
    let published = Arc::new(AtomicUsize::new(0));
    let pause = Arc::new(tokio::sync::Notify::new());
    let resume = Arc::new(tokio::sync::Notify::new());
    let (a, b, names) = (a.clone(), b.clone(), names.to_vec());
    let task = {
        let (published, pause, resume) = (published.clone(), pause.clone(), resume.clone());
        tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(90);
            let mut errors = 0u32;
            for i in 0..messages {
                if i == messages / 3 {
                    pause.notify_one();
                    resume.notified().await;
                }
                let room = RoomName::new(names[i % names.len()].as_str()).unwrap();
                let hub = if i % 2 == 0 { &a } else { &b };
                loop {
                    assert!(Instant::now() < deadline, "publishing m{i} took too long");
                    match hub.publish(&room, "p", &format!("m{i}")).await {
                        Ok(_) => break,
                        Err(_) => {
                            errors += 1;
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                }
                published.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            errors
        })
    };
    (published, pause, resume, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_rooms_on_a_cluster_send_no_commands_and_events_arrive_by_push() {
    let cluster = RedisCluster::start();
    let (a, b) = (node(&cluster), node(&cluster));
    let (node_a, node_b) = (serve(a.clone(), None).await, serve(b.clone(), None).await);
    const ROOMS: usize = 24;
    let names: Vec<String> = (0..ROOMS).map(|i| format!("idle{i}")).collect();
    let mut primaries = std::collections::HashSet::new();
    for name in &names {
        primaries.insert(cluster.owner(0, slot_of(name)));
    }
    assert_eq!(primaries.len(), 3, "the rooms span every primary");
    let mut sockets = Vec::new();
    for name in &names {
        sockets.push((
            join(node_a, name, "a").await.0,
            join(node_b, name, "b").await.0,
        ));
    }
    // Every room delivers by push on both nodes (so every subscription
    // holds before the idle interval starts).
    for (i, name) in names.iter().enumerate() {
        let room = RoomName::new(name.as_str()).unwrap();
        let hub = if i % 2 == 0 { &a } else { &b };
        hub.publish(&room, "p", "first").await.unwrap();
        let (sa, sb) = &mut sockets[i];
        assert_eq!(data(&events(sa, name, 1).await), ["first"]);
        assert_eq!(data(&events(sb, name, 1).await), ["first"]);
    }

    // Idle: 24 rooms on 2 nodes for 3 s. Polling read each room 10 times
    // a second per node (1,440 script calls); pushed wake-ups read none,
    // and each node checks its subscriptions every 2 s (a PING per
    // primary connection and one CLUSTER SLOTS).
    let nodes: Vec<&RedisServer> = cluster.nodes().iter().collect();
    for node in &nodes {
        let _: () = query(node, &["CONFIG", "RESETSTAT"]).unwrap();
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let calls = commandstats(&nodes);
    let scripts = ["evalsha", "eval", "xread", "xrange"]
        .iter()
        .map(|c| calls.get(*c).copied().unwrap_or(0))
        .sum::<u64>();
    let by_nodes: u64 = calls
        .iter()
        .filter(|(name, _)| {
            let command = name.split('|').next().unwrap_or_default();
            !["info", "config", "client", "hello"].contains(&command)
        })
        .map(|(_, n)| n)
        .sum();
    eprintln!("idle 3 s: {calls:?}");
    assert_eq!(scripts, 0, "idle rooms were read: {calls:?}");
    assert!(by_nodes <= 2 * 2 * 4, "idle commands: {calls:?}");

    // Live: a burst on one room from both nodes, in order on both sockets.
    let room = RoomName::new(names[0].as_str()).unwrap();
    for i in 0..60 {
        let hub = if i % 3 == 0 { &b } else { &a };
        hub.publish(&room, "p", &format!("m{i}")).await.unwrap();
    }
    let (sa, sb) = &mut sockets[0];
    assert_eq!(data(&events(sa, &names[0], 60).await), numbered(0..60));
    assert_eq!(data(&events(sb, &names[0], 60).await), numbered(0..60));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_on_the_other_node_of_a_cluster_gets_the_gap_in_order_then_live() {
    let cluster = RedisCluster::start();
    let (a, b) = (node(&cluster), node(&cluster));
    let (node_a, node_b) = (serve(a, None).await, serve(b.clone(), None).await);
    let (mut alice, epoch) = join(node_a, "lobby", "alice").await;
    let (mut bob, _) = join(node_b, "lobby", "bob").await;
    for i in 0..5 {
        send(&mut alice, &format!("m{i}")).await;
    }
    let seen = events(&mut alice, "lobby", 5).await;
    assert_eq!(data(&seen), numbered(0..5));
    assert_eq!(data(&events(&mut bob, "lobby", 5).await), numbered(0..5));
    let last = s(&seen[4], "id");
    alice.close(None).await.unwrap();
    let room = RoomName::new("lobby").unwrap();
    for i in 5..450 {
        b.publish(&room, "bob", &format!("m{i}")).await.unwrap();
    }
    assert_eq!(
        data(&events(&mut bob, "lobby", 445).await),
        numbered(5..450)
    );
    let path = format!("/rooms/lobby?user=alice&epoch={epoch}&last_event_id={last}");
    let mut alice = connect(node_a, &path, None).await;
    assert_eq!(s(&recv(&mut alice).await, "type"), "joined");
    send(&mut bob, "m450").await;
    let (got, recovered) = resumed_until(&mut alice, "lobby", "m450", 1000).await;
    assert_eq!(got, numbered(5..451), "the gap, then live, once each");
    assert_eq!(recovered.len(), 1);
    assert!(
        recovered[0].0 >= 445,
        "recovered after the gap: {recovered:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_loses_no_event_for_any_socket() {
    let mut cluster = RedisCluster::start_with_replicas();
    let (a, b) = (node(&cluster), node(&cluster));
    let (node_a, node_b) = (serve(a.clone(), None).await, serve(b.clone(), None).await);
    const ROOMS: usize = 9;
    let names: Vec<String> = (0..ROOMS).map(|i| format!("fo{i}")).collect();
    let victim = cluster.owner(0, slot_of(&names[0]));
    let replica = cluster
        .pairs()
        .into_iter()
        .find(|(p, _)| *p == victim)
        .unwrap()
        .1;
    let on_victim = names
        .iter()
        .filter(|n| cluster.owner(0, slot_of(n)) == victim)
        .count();
    assert!((1..ROOMS).contains(&on_victim), "{on_victim} rooms on it");
    let mut sockets = Vec::new();
    for name in &names {
        sockets.push((
            join(node_a, name, "a").await.0,
            join(node_b, name, "b").await.0,
        ));
    }

    const MESSAGES: usize = 450;
    let (published, pause, resume, publisher) = publish(&a, &b, &names, MESSAGES);
    // The kill: once the replica has everything the primary acknowledged
    // (an asynchronous replica may lose the last writes of a killed
    // primary, which no reader can deliver), while every socket is live.
    pause.notified().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let primary: String = query(&cluster.nodes()[victim], &["INFO", "replication"]).unwrap();
        let offset = |info: &str, key: &str| -> Option<u64> {
            info.lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().parse().ok())
        };
        let replica_info: String =
            query(&cluster.nodes()[replica], &["INFO", "replication"]).unwrap();
        if offset(&primary, "master_repl_offset:") == offset(&replica_info, "slave_repl_offset:") {
            break;
        }
        assert!(Instant::now() < deadline, "the replica did not catch up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cluster.nodes_mut()[victim].stop();
    resume.notify_one();
    let errors = publisher.await.unwrap();
    assert_eq!(published.load(Ordering::Relaxed), MESSAGES);
    eprintln!("publish errors during the failover: {errors}");
    assert!(errors > 0, "the kill was seen by the publisher");
    let live: Vec<usize> = (0..6).filter(|&i| i != victim).collect();
    cluster.wait_until_whole("after the kill", &live, || true);

    every_socket_got_what_the_store_kept(&a, &names, MESSAGES, &mut sockets).await;
}

/// What the store kept of each room, from its start, in the current
/// epoch, holds every message published to it (message `m` went to room
/// `m % rooms`), and every socket got exactly that, in order, and nothing
/// more within a bounded wait.
async fn every_socket_got_what_the_store_kept(
    a: &RoomHub,
    names: &[String],
    messages: usize,
    sockets: &mut [(Ws, Ws)],
) {
    let rooms = names.len();
    for (i, name) in names.iter().enumerate() {
        let events_window = a.events();
        let key = format!("room:{name}");
        // The store answers again within 2 s of the cluster being whole
        // (invariant 11): retried for a bounded time.
        let deadline = Instant::now() + Duration::from_secs(20);
        let resume = loop {
            let read = async {
                let head = events_window.position(&key).await?;
                events_window
                    .since(&key, &Position::new(head.epoch, None), 10_000)
                    .await
            };
            match read.await {
                Ok(resume) => break resume,
                Err(error) => {
                    assert!(Instant::now() < deadline, "{name}: {error}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        };
        let kept = match resume {
            Resume::Recovered(events) => events
                .iter()
                .map(|e| String::from_utf8(e.field("data").unwrap().to_vec()).unwrap())
                .collect::<Vec<_>>(),
            Resume::Resync(reason) => panic!("{name}: {reason}"),
        };
        let sent: Vec<String> = (i..messages)
            .step_by(rooms)
            .map(|m| format!("m{m}"))
            .collect();
        for message in &sent {
            assert!(
                kept.contains(message),
                "{name}: {message} lost by the store"
            );
        }
        let (sa, sb) = &mut sockets[i];
        for (who, ws) in [("a", sa), ("b", sb)] {
            let got = data(&events(ws, name, kept.len()).await);
            assert_eq!(got, kept, "{name} on node {who}");
            // Nothing more (no duplicate) within a bounded wait.
            let more = tokio::time::timeout(Duration::from_millis(300), frame(ws)).await;
            assert!(more.is_err(), "{name} on node {who}: extra {more:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_room_resharded_to_another_primary_loses_no_event_for_any_socket() {
    let cluster = RedisCluster::start();
    let (a, b) = (node(&cluster), node(&cluster));
    let (node_a, node_b) = (serve(a.clone(), None).await, serve(b.clone(), None).await);
    // redis-cli moves the source's lowest slots: rooms in the first 64 slots
    // of node 0 move to node 1; two more rooms stay where they are.
    let from = cluster.owner(0, 0);
    let to = (from + 1) % 3;
    const MOVED: u16 = 64;
    let moving = |name: &str| slot_of(name) < MOVED;
    let mut names: Vec<String> = (0..100_000)
        .map(|i| format!("rs{i}"))
        .filter(|n| moving(n))
        .take(3)
        .collect();
    names.extend(
        (0..10)
            .map(|i| format!("stay{i}"))
            .filter(|n| !moving(n))
            .take(2),
    );
    assert_eq!(names.len(), 5);
    let mut sockets = Vec::new();
    for name in &names {
        sockets.push((
            join(node_a, name, "a").await.0,
            join(node_b, name, "b").await.0,
        ));
    }
    const MESSAGES: usize = 600;
    let (published, pause, resume, publisher) = publish(&a, &b, &names, MESSAGES);
    pause.notified().await;
    resume.notify_one();
    let id_of = |node: usize| -> String {
        query::<String>(&cluster.nodes()[node], &["CLUSTER", "MYID"]).unwrap()
    };
    let (from_id, to_id) = (id_of(from), id_of(to));
    let output = std::process::Command::new("redis-cli")
        .args(["--cluster", "reshard", &cluster.nodes()[from].addr()])
        .args(["--cluster-from", &from_id, "--cluster-to", &to_id])
        .args(["--cluster-slots", &MOVED.to_string(), "--cluster-yes"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "reshard failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let all: Vec<usize> = (0..3).collect();
    cluster.wait_until_whole("every node agrees on the new slot map", &all, || {
        all.iter()
            .all(|&n| cluster.owner(n, slot_of(&names[0])) == to)
    });
    let errors = publisher.await.unwrap();
    assert_eq!(published.load(Ordering::Relaxed), MESSAGES);
    eprintln!("publish errors during the resharding: {errors}");
    assert_eq!(cluster.owner(0, slot_of(&names[0])), to, "the room moved");
    every_socket_got_what_the_store_kept(&a, &names, MESSAGES, &mut sockets).await;
}
