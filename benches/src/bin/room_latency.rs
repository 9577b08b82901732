//! Room delivery benchmark: end-to-end latency of a room event across two
//! gateway nodes (sent to node B, received on node A through Redis
//! Streams and A's blocking `XREAD` reader), and messages per second per
//! room.
//!
//! ```text
//! cargo run --release -p tower-window-benches --bin room_latency [-- <paced messages> <burst messages>]
//! ```
//!
//! Spawns its own `redis-server` on a random loopback port and two
//! gateways (`build_app`, `--redis-url`) on loopback ports in this
//! process; the clients are tokio-tungstenite sockets. No timing is
//! asserted; the numbers are printed as a Markdown table.
#![allow(clippy::print_stdout, clippy::unwrap_used)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use clap::Parser;
use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use tower_window_examples::gateway::{build_app, Args};
use tower_window_tests::redis_server::RedisServer;

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

async fn node(redis_url: &str) -> SocketAddr {
    let args = Args::try_parse_from([
        "gateway",
        "--limit",
        "100000000/1m",
        "--redis-url",
        redis_url,
        "--redis-timeout-ms",
        "5000",
    ])
    .unwrap();
    let app = build_app(args.into_config().unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    address
}

async fn connect(address: SocketAddr, user: &str, room: &str) -> Ws {
    let mut request = format!("ws://{address}/ws?room={room}")
        .into_client_request()
        .unwrap();
    request
        .headers_mut()
        .insert("x-user-id", user.parse().unwrap());
    let (mut ws, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    let welcome = ws.next().await.unwrap().unwrap();
    assert!(welcome.to_text().unwrap().contains("joined"));
    ws
}

/// Receives `n` events and returns, per `data`, when it arrived.
async fn receive(mut ws: Ws, n: usize) -> (Ws, HashMap<String, Instant>) {
    let seen = receive_on(&mut ws, n).await;
    (ws, seen)
}

async fn receive_on(ws: &mut Ws, n: usize) -> HashMap<String, Instant> {
    let mut seen = HashMap::with_capacity(n);
    while seen.len() < n {
        let message = tokio::time::timeout(Duration::from_secs(60), ws.next())
            .await
            .expect("events keep coming")
            .unwrap()
            .unwrap();
        if let Message::Text(text) = message {
            let value: serde_json::Value = serde_json::from_str(&text).unwrap();
            if value["type"] == "event" {
                seen.insert(value["data"].as_str().unwrap().to_owned(), Instant::now());
            }
        }
    }
    seen
}

/// Sends one message until both sockets have it.
async fn warm_up(mut receiver: Ws, sender: &mut Ws) -> Ws {
    sender.send(Message::text("warm-up")).await.unwrap();
    receive_on(&mut receiver, 1).await;
    receive_on(sender, 1).await;
    receiver
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1000.0)
}

#[tokio::main]
async fn main() {
    let mut argv = std::env::args().skip(1);
    let paced: usize = argv.next().and_then(|a| a.parse().ok()).unwrap_or(2000);
    let burst: usize = argv.next().and_then(|a| a.parse().ok()).unwrap_or(20_000);
    let redis = RedisServer::start();
    let a = node(&redis.url()).await;
    let b = node(&redis.url()).await;

    // 1. Latency: one message every 2 ms from B, received on A.
    let receiver = connect(a, "reader", "latency").await;
    let mut sender = connect(b, "writer", "latency").await;
    // Warm up: node A's reader has the room in its XREAD before measuring
    // (a room new to a node is picked up within one 100 ms XREAD block).
    let receiver = warm_up(receiver, &mut sender).await;
    let reading = tokio::spawn(receive(receiver, paced));
    let mut sent = HashMap::with_capacity(paced);
    let mut tick = tokio::time::interval(Duration::from_millis(2));
    for i in 0..paced {
        tick.tick().await;
        let data = format!("p{i}");
        sent.insert(data.clone(), Instant::now());
        sender.send(Message::text(data)).await.unwrap();
        // The sender is in the room too: drain its copies without waiting.
        while let Some(Ok(_)) = futures_util::FutureExt::now_or_never(sender.next()).flatten() {}
    }
    let (_, got) = reading.await.unwrap();
    let mut latencies: Vec<Duration> = got
        .iter()
        .map(|(data, at)| at.duration_since(sent[data]))
        .collect();
    latencies.sort();

    // 2. Throughput: one room, one sender on B sending as fast as it can,
    // one receiver on A; from the first send to the last receipt.
    let receiver = connect(a, "reader", "burst").await;
    let mut sender = connect(b, "writer", "burst").await;
    let receiver = warm_up(receiver, &mut sender).await;
    let (mut sink, mut echo) = sender.split();
    let drain = tokio::spawn(async move {
        let mut n = 0;
        while n < burst {
            match echo.next().await {
                Some(Ok(Message::Text(_))) => n += 1,
                Some(Ok(_)) => {}
                _ => break,
            }
        }
    });
    let reading = tokio::spawn(receive(receiver, burst));
    let start = Instant::now();
    for i in 0..burst {
        sink.feed(Message::text(format!("b{i}"))).await.unwrap();
    }
    sink.flush().await.unwrap();
    let (_, got) = reading.await.unwrap();
    let last = got.values().max().copied().unwrap();
    let rate = burst as f64 / last.duration_since(start).as_secs_f64();
    drain.await.unwrap();

    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!("| measurement | value |");
    println!("|---|---|");
    println!(
        "| paced messages (1 per 2 ms, node B to node A) | {} |",
        latencies.len()
    );
    println!(
        "| latency p50 (ms) | {} |",
        ms(percentile(&latencies, 0.50))
    );
    println!(
        "| latency p99 (ms) | {} |",
        ms(percentile(&latencies, 0.99))
    );
    println!("| latency max (ms) | {} |", ms(*latencies.last().unwrap()));
    println!("| burst messages, one room | {burst} |");
    println!("| messages/s per room (send to last receipt) | {rate:.0} |");
    println!("| cores | {cores} |");
}
