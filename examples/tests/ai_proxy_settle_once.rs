//! Issue 34, "what it must show" 2: an answer's tokens are settled exactly
//! once, however its body ends — complete, client gone, upstream error,
//! timeout, the proxy shutting down — one test each, every one on the
//! embedded store and on a real Redis (where settles run in tasks).
//!
//! "Sent" is what the proxy's body yielded to the server, counted by
//! `Tokens`: where the proxy ends a stream it ends it with an error event
//! and a clean HTTP end, so the client receives exactly what was sent and
//! the recorded tokens can be compared with its own count. A client that
//! goes away is charged what was sent, which may be more than it read (in
//! the sockets' buffers): the exact case is a stream with nothing more to
//! send.
#![allow(clippy::unwrap_used)]

mod ai_proxy_support;

use std::time::Duration;

use ai_proxy_support::{chat, client, model, send, stream, Node, Received, PATIENCE};
use tower_window_examples::ai_proxy::{DELAY_MS, FAIL_AFTER, STALL_AFTER};
use tower_window_tests::redis_server::RedisServer;

const ESTIMATE: &str = "100";

/// The stores each end is tested on: the embedded one, and a Redis shared
/// by the tests of this file (each test its own tenants).
fn stores(redis: &RedisServer) -> [(&'static str, Vec<String>); 2] {
    [
        ("memory", Vec::new()),
        (
            "redis",
            vec![
                "--redis-url".to_owned(),
                redis.url(),
                "--redis-timeout-ms".to_owned(),
                "5000".to_owned(),
            ],
        ),
    ]
}

/// A node on `store` with a budget of 1,000 tokens, `extra` flags and a
/// shutdown grace of `grace`.
async fn node_on(store: &[String], extra: &[&str], grace: Duration) -> Node {
    let mut flags: Vec<&str> = store.iter().map(String::as_str).collect();
    flags.extend(["--budget", "1000/1h", "--estimate", ESTIMATE]);
    flags.extend(extra);
    Node::start(model().await, &flags, grace).await
}

/// Waits (bounded) until `node` counted `n` settles, then checks it stays
/// `n` and none failed: one settle per answer, never two.
async fn settled_exactly(node: &Node, n: u64, what: &str) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while node.limiter.stats().settled < n && tokio::time::Instant::now() < deadline {
        node.limiter.settled().await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Anything that would settle twice has had its chance by now.
    tokio::time::sleep(Duration::from_millis(100)).await;
    node.limiter.settled().await;
    let stats = node.limiter.stats();
    assert_eq!(
        (stats.settled, stats.settle_errors),
        (n, 0),
        "{what}: {stats:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_complete_answer_is_charged_its_tokens_once() {
    let redis = RedisServer::shared();
    for (store, flags) in stores(&redis) {
        let node = node_on(&flags, &[], Duration::ZERO).await;
        let tenant = format!("complete-{store}");
        let request = chat(node.address, &tenant, 40, &[]);
        let (status, received) = stream(&client(), request).await;
        assert_eq!(status, 200);
        assert_eq!(
            (received.deltas, received.usage, received.done),
            (40, Some(40), true)
        );
        settled_exactly(&node, 1, store).await;
        assert_eq!(
            node.recorded(&tenant).await,
            40,
            "{store}: 100 reserved, 60 back"
        );

        // Not streamed: the usage object of the JSON answer.
        let mut request = chat(node.address, &tenant, 130, &[]);
        *request.body_mut() = r#"{"max_tokens":130,"messages":[{"content":"hi"}]}"#.into();
        let (status, mut events) = send(&client(), request).await;
        assert_eq!(status, 200);
        events.read(None).await;
        settled_exactly(&node, 2, store).await;
        assert_eq!(
            node.recorded(&tenant).await,
            170,
            "{store}: 30 past the estimate"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_mid_stream_is_charged_what_it_was_sent_once() {
    let redis = RedisServer::shared();
    for (store, flags) in stores(&redis) {
        let node = node_on(&flags, &[], Duration::ZERO).await;
        let client = client();

        // Exact: the model sends 5 tokens then nothing; the client reads
        // the 5 and goes. Nothing more was sent.
        let tenant = format!("gone-{store}");
        let request = chat(node.address, &tenant, 50, &[(STALL_AFTER, "5")]);
        let (status, mut events) = send(&client, request).await;
        assert_eq!(status, 200);
        events.read(Some(5)).await;
        drop(events);
        settled_exactly(&node, 1, store).await;
        assert_eq!(node.recorded(&tenant).await, 5, "{store}");

        // Flowing: the client reads 5 of 200 and goes while more are on
        // their way; charged from the 5 it read to less than the 200.
        let tenant = format!("gone-flowing-{store}");
        let request = chat(node.address, &tenant, 200, &[(DELAY_MS, "10")]);
        let (_, mut events) = send(&client, request).await;
        events.read(Some(5)).await;
        drop(events);
        settled_exactly(&node, 2, store).await;
        let charged = node.recorded(&tenant).await;
        eprintln!("{store}: the client read 5 tokens, charged {charged}");
        assert!((5..200).contains(&charged), "{store}: charged {charged}");
    }
}

/// A stream the proxy ends early (node `flags`, the model's `controls`)
/// after `deltas` tokens, with the error event `kind`: the client receives
/// the tokens, the event and a clean HTTP end; those tokens are charged,
/// once.
async fn ended_early(flags: &[&str], controls: &[(&str, &str)], deltas: u32, kind: &str) {
    let redis = RedisServer::shared();
    for (store, store_flags) in stores(&redis) {
        let node = node_on(&store_flags, flags, Duration::ZERO).await;
        let tenant = format!("{kind}-{store}");
        let request = chat(node.address, &tenant, 50, controls);
        let (status, received) = stream(&client(), request).await;
        assert_eq!(status, 200);
        let ended = Received {
            deltas,
            error: Some(kind.to_owned()),
            ended: true,
            ..Received::default()
        };
        assert_eq!(received, ended, "{store}");
        settled_exactly(&node, 1, store).await;
        assert_eq!(node.recorded(&tenant).await, u64::from(deltas), "{store}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_error_mid_stream_is_charged_what_was_sent_once() {
    // The model's connection is cut after 7 tokens.
    ended_early(
        &[],
        &[(FAIL_AFTER, "7"), (DELAY_MS, "5")],
        7,
        "upstream_error",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_stream_is_ended_by_the_idle_timeout_and_charged_once() {
    // The model sends 4 tokens, then nothing for longer than 300 ms.
    let idle = ["--idle-timeout", "300ms"];
    ended_early(&idle, &[(STALL_AFTER, "4")], 4, "upstream_timeout").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_in_flight_at_shutdown_are_each_charged_once() {
    let redis = RedisServer::shared();
    for (store, flags) in stores(&redis) {
        let mut node = node_on(&flags, &[], Duration::from_millis(200)).await;
        let tenant = format!("shutdown-{store}");
        let client = client();
        // Three streams the model never finishes, at different points.
        let mut streams = Vec::new();
        for k in [3u32, 5, 8] {
            let stall = k.to_string();
            let request = chat(node.address, &tenant, 100, &[(STALL_AFTER, &stall)]);
            let (status, mut events) = send(&client, request).await;
            assert_eq!(status, 200);
            events.read(Some(k)).await;
            streams.push(tokio::spawn(async move {
                events.read(None).await;
                events.received
            }));
        }
        // The signal: no new connection, 200 ms of grace, then the three
        // are cut; `serve` returns once every answer is settled.
        node.shut_down().await;
        let stats = node.limiter.stats();
        assert_eq!((stats.settled, stats.settle_errors), (3, 0), "{store}");
        let mut sent = 0;
        for stream in streams {
            let received = stream.await.unwrap();
            assert_eq!(received.error.as_deref(), Some("shutting_down"), "{store}");
            assert!(received.ended && !received.done, "{store}: {received:?}");
            sent += u64::from(received.deltas);
        }
        assert_eq!(sent, 3 + 5 + 8);
        assert_eq!(node.recorded(&tenant).await, sent, "{store}");
    }
}
