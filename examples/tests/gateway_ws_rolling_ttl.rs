//! Issue 22, defect 5, black box: a rolling change of
//! `--connection-lease-ttl`. Two `gateway` processes share one throwaway
//! Redis with `--max-connections-per-user 2`, node A with a 60 s lease TTL
//! and node B with 1 s. A holds one socket; B opens and closes one; once
//! B's key TTL (1 s + 1 s margin) has passed for real, B opens two more:
//! the second is refused with 429, and A's socket still works.
//!
//! The only waits are the ones a real TTL needs (2.5 s, once) and bounded
//! polls; the test counts sockets, it never times them.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use tower_window_tests::redis_server::RedisServer;

use support::GatewayProcess;

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Everything a read may wait (a bound, never asserted as a speed).
const PATIENCE: Duration = Duration::from_secs(10);
/// Past node B's key TTL (1 s lease + 1 s margin): the 2.5 s.
const PAST_B_KEY_TTL: Duration = Duration::from_millis(2_500);
const USER: &str = "rolling";

fn gateway(redis: &RedisServer, ttl: &str) -> GatewayProcess {
    let url = redis.url();
    GatewayProcess::start(&[
        "--limit",
        "100000/1m",
        "--redis-url",
        &url,
        "--redis-timeout-ms",
        "5000",
        "--max-connections-per-user",
        "2",
        "--connection-lease-ttl",
        ttl,
    ])
}

fn ws_url(gateway: &GatewayProcess) -> String {
    gateway.url().replacen("http://", "ws://", 1) + "/ws"
}

async fn connect(gateway: &GatewayProcess) -> Result<Ws, WsError> {
    let mut request = ws_url(gateway).into_client_request().unwrap();
    request
        .headers_mut()
        .insert("x-user-id", USER.parse().unwrap());
    tokio::time::timeout(PATIENCE, tokio_tungstenite::connect_async(request))
        .await
        .expect("the upgrade is answered within the bound")
        .map(|(ws, _)| ws)
}

/// `GET /presence` for the user: the live connections cluster-wide, or
/// `None` when it is not a 200 (a breaker open on a loaded machine).
async fn presence(gateway: &GatewayProcess) -> Option<u64> {
    let addr = gateway.url().replacen("http://", "", 1);
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "GET /presence?tenant=public&user={USER} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    tokio::time::timeout(PATIENCE, stream.read_to_string(&mut response))
        .await
        .expect("presence answered within the bound")
        .unwrap();
    if !response.starts_with("HTTP/1.1 200") {
        return None;
    }
    let body = response.split("\r\n\r\n").nth(1)?;
    let value: Value = serde_json::from_str(body.trim()).ok()?;
    value["connections"].as_u64()
}

/// Polls presence until it reports `connections` (bounded: 200 polls).
async fn await_presence(gateway: &GatewayProcess, connections: u64) {
    for _ in 0..200 {
        if presence(gateway).await == Some(connections) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "presence never reached {connections}: {:?}",
        presence(gateway).await
    );
}

/// One text round trip: the socket is served (the gateway echoes texts).
async fn echoes(ws: &mut Ws, text: &str) -> bool {
    if ws.send(Message::text(text.to_owned())).await.is_err() {
        return false;
    }
    loop {
        match tokio::time::timeout(PATIENCE, ws.next()).await {
            Ok(Some(Ok(Message::Text(reply)))) => return reply.as_str() == text,
            Ok(Some(Ok(Message::Ping(_) | Message::Pong(_)))) => continue,
            _ => return false,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_ttl_change_keeps_the_connection_cap() {
    let redis = RedisServer::start();
    let a = gateway(&redis, "60s");
    let b = gateway(&redis, "1s");

    let mut on_a = connect(&a).await.expect("A's socket");
    let mut first_on_b = connect(&b).await.expect("B's first socket");
    await_presence(&a, 2).await;
    first_on_b.close(None).await.unwrap();
    await_presence(&a, 1).await;

    tokio::time::sleep(PAST_B_KEY_TTL).await;

    let mut live = vec![connect(&b)
        .await
        .expect("B's second socket: one place is free")];
    match connect(&b).await {
        Err(WsError::Http(response)) => assert_eq!(response.status(), 429),
        Err(other) => panic!("refused otherwise: {other}"),
        Ok(ws) => {
            live.push(ws);
            panic!(
                "3 live sockets under a cap of 2: B's short TTL expired A's lease \
                 (presence now {:?})",
                presence(&a).await
            );
        }
    }
    assert_eq!(presence(&a).await, Some(2));
    assert_eq!(presence(&b).await, Some(2));
    assert!(
        echoes(&mut on_a, "still-here").await,
        "A's socket is served"
    );
    assert!(echoes(&mut live[0], "b-live").await, "B's socket is served");
}
