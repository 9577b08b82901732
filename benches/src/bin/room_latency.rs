//! Room delivery benchmark: end-to-end latency of a room event across two
//! gateway nodes (sent to node B, received on node A through Redis
//! Streams and A's reader, woken by the append's pushed wake-up), messages
//! per second per room, and the Redis commands per second that idle rooms
//! cost, on a single Redis and on a 3-primary Redis Cluster in one run.
//!
//! ```text
//! cargo run --release -p tower-window-benches --bin room_latency [-- <paced messages> <burst messages> <idle rooms> <idle seconds>]
//! ```
//!
//! Spawns its own `redis-server` and 3-primary cluster on random loopback
//! ports and two gateways (`build_app`, `--redis-url` or
//! `--redis-cluster`) per backend on loopback ports in this process; the
//! clients are tokio-tungstenite sockets. The idle rooms are joined
//! through two `RoomHub`s (two nodes) directly (20,000 WebSockets would
//! exceed the file limit), once read by pushed wake-ups (the default) and
//! once polled (the reader before issue 24), with one blocking `XREAD`
//! tail as well on the single Redis. No timing is asserted; the numbers
//! are printed as Markdown tables.
#![allow(clippy::print_stdout, clippy::unwrap_used)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum_window_ext::ws::rooms::{RoomHub, RoomHubBuilder, RoomName, RoomSession};
use clap::Parser;
use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use tower_window::events::{EventWindow, Retention};
use tower_window::{RedisStore, Store};
use tower_window_examples::gateway::{build_app, Args};
use tower_window_tests::redis_cluster::{query, RedisCluster};
use tower_window_tests::redis_server::RedisServer;

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Where the nodes' store is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Backend {
    Single,
    Cluster,
}

/// A gateway node. Its rooms keep `history_max` events: at least the
/// burst, so a reader that falls behind during it still reads on (one that
/// fell behind what the room keeps would drop its sockets with a resync).
async fn node(backend: Backend, urls: &[String], history_max: usize) -> SocketAddr {
    let history_max = history_max.to_string();
    let (flag, value) = match backend {
        Backend::Single => ("--redis-url", urls[0].clone()),
        Backend::Cluster => ("--redis-cluster", urls.join(",")),
    };
    let args = Args::try_parse_from([
        "gateway",
        "--limit",
        "100000000/1m",
        flag,
        &value,
        "--redis-timeout-ms",
        "5000",
        "--history-max",
        &history_max,
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
        let Ok(message) = tokio::time::timeout(Duration::from_secs(15), ws.next()).await else {
            panic!("events stopped: {} of {n} arrived", seen.len());
        };
        let message = message.expect("the socket is open").expect("a frame");
        if let Message::Text(text) = message {
            let value: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert!(
                value["type"] == "event" || value["type"] == "joined",
                "not an event: {value}"
            );
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

/// Latency and throughput through two gateway nodes on `backend`:
/// (p50, p99, max, messages/s per room).
async fn deliveries(
    backend: Backend,
    urls: &[String],
    paced: usize,
    burst: usize,
) -> (Duration, Duration, Duration, f64) {
    let a = node(backend, urls, burst.max(1000)).await;
    let b = node(backend, urls, burst.max(1000)).await;

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
                Some(Ok(Message::Text(text))) => {
                    // Anything but its own events (a limit's notice, a
                    // failed append) means the burst is not what it sent.
                    assert!(
                        text.contains(r#""type":"event""#),
                        "the sender was told: {text}"
                    );
                    n += 1;
                }
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

    (
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.99),
        *latencies.last().unwrap(),
        rate,
    )
}

/// How the idle hubs read their rooms.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reader {
    Push,
    Poll,
    Tail,
}

impl Reader {
    fn name(self) -> &'static str {
        match self {
            Reader::Push => "pushed wake-ups",
            Reader::Poll => "polling (before)",
            Reader::Tail => "XREAD tail",
        }
    }
}

/// A hub (a node) on `backend` reading its rooms with `reader`.
fn idle_hub(backend: Backend, urls: &[String], reader: Reader) -> RoomHub {
    let store = Arc::new(match backend {
        Backend::Single => RedisStore::from_url(&urls[0]).unwrap(),
        Backend::Cluster => RedisStore::cluster(urls).unwrap(),
    });
    let retention = Retention::new(Duration::from_secs(600), 1000).unwrap();
    let builder: RoomHubBuilder =
        // 20,000 joins at once on a loaded machine: a generous budget.
        RoomHub::builder(EventWindow::new(
            Store::builder(Arc::clone(&store))
                .timeout(Duration::from_secs(10))
                .build(),
            retention,
        ));
    match reader {
        Reader::Push => builder.build(),
        Reader::Poll => builder.polling().build(),
        Reader::Tail => builder.tail(store.event_tail().unwrap()).build(),
    }
}

/// Redis commands per second (all nodes, every command but the
/// measurement's own) while `rooms` idle rooms are joined on two nodes,
/// over `seconds`; the time Redis spent in them (ms per second, from
/// `usec` of `INFO commandstats`); and the top commands.
async fn idle(
    backend: Backend,
    urls: &[String],
    nodes: &[&RedisServer],
    reader: Reader,
    rooms: usize,
    seconds: u64,
) -> (f64, f64, String) {
    let hubs = [
        idle_hub(backend, urls, reader),
        idle_hub(backend, urls, reader),
    ];
    let mut sessions: Vec<RoomSession> = Vec::with_capacity(2 * rooms);
    for hub in &hubs {
        for i in 0..rooms {
            let room = RoomName::new(format!("idle{i}")).unwrap();
            sessions.push(hub.join(&room, None).await.unwrap());
        }
    }
    // Settle: every subscription made, every first read done.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for node in nodes {
        let _: () = query(node, &["CONFIG", "RESETSTAT"]).unwrap();
    }
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let mut calls: HashMap<String, u64> = HashMap::new();
    let mut usec: u64 = 0;
    for node in nodes {
        let info: String = query(node, &["INFO", "commandstats"]).unwrap();
        for line in info.lines() {
            let Some((name, rest)) = line
                .strip_prefix("cmdstat_")
                .and_then(|l| l.split_once(':'))
            else {
                continue;
            };
            let command = name.split('|').next().unwrap_or_default();
            if ["info", "config"].contains(&command) {
                continue;
            }
            let field = |key: &str| -> u64 {
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix(key))
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0)
            };
            *calls.entry(name.to_owned()).or_default() += field("calls=");
            usec += field("usec=");
        }
    }
    drop(sessions);
    drop(hubs);
    let total: u64 = calls.values().sum();
    let mut top: Vec<(String, u64)> = calls.into_iter().collect();
    top.sort_by_key(|entry| std::cmp::Reverse(entry.1));
    let top = top
        .iter()
        .take(3)
        .map(|(name, n)| format!("{name} {n}"))
        .collect::<Vec<_>>()
        .join(", ");
    (
        total as f64 / seconds as f64,
        usec as f64 / 1000.0 / seconds as f64,
        top,
    )
}

#[tokio::main]
async fn main() {
    let mut argv = std::env::args().skip(1);
    let paced: usize = argv.next().and_then(|a| a.parse().ok()).unwrap_or(2000);
    let burst: usize = argv.next().and_then(|a| a.parse().ok()).unwrap_or(20_000);
    let rooms: usize = argv.next().and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let seconds: u64 = argv.next().and_then(|a| a.parse().ok()).unwrap_or(10);
    let redis = RedisServer::start();
    let cluster = RedisCluster::start();
    let single_urls = vec![redis.url()];
    let cluster_urls = cluster.urls();
    let cluster_nodes: Vec<&RedisServer> = cluster.nodes().iter().collect();

    println!("| backend | latency p50 (ms) | latency p99 (ms) | max (ms) | messages/s per room |");
    println!("|---|---|---|---|---|");
    let mut p = Vec::new();
    for (name, backend, urls) in [
        ("single Redis", Backend::Single, &single_urls),
        (
            "Redis Cluster (3 primaries)",
            Backend::Cluster,
            &cluster_urls,
        ),
    ] {
        let (p50, p99, max, rate) = deliveries(backend, urls, paced, burst).await;
        println!(
            "| {name} | {} | {} | {} | {rate:.0} |",
            ms(p50),
            ms(p99),
            ms(max)
        );
        p.push((p50, p99));
    }
    println!(
        "\ncluster / single: p50 {:.2}x, p99 {:.2}x\n",
        p[1].0.as_secs_f64() / p[0].0.as_secs_f64(),
        p[1].1.as_secs_f64() / p[0].1.as_secs_f64()
    );

    println!("| backend | reader | idle rooms x nodes | Redis commands/s | Redis CPU in commands (ms/s) | top commands over {seconds} s |");
    println!("|---|---|---|---|---|---|");
    for (name, backend, urls, nodes, readers) in [
        (
            "single Redis",
            Backend::Single,
            &single_urls,
            vec![&redis],
            vec![Reader::Push, Reader::Tail, Reader::Poll],
        ),
        (
            "Redis Cluster (3 primaries)",
            Backend::Cluster,
            &cluster_urls,
            cluster_nodes.clone(),
            vec![Reader::Push, Reader::Poll],
        ),
    ] {
        for reader in readers {
            let (rate, cpu, top) = idle(backend, urls, &nodes, reader, rooms, seconds).await;
            println!(
                "| {name} | {} | {rooms} x 2 | {rate:.1} | {cpu:.1} | {top} |",
                reader.name()
            );
        }
    }
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!("\ncores: {cores}");
}
