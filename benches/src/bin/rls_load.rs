//! A small load client for the examples' `rls` (Envoy's
//! `ShouldRateLimit` over gRPC): `--connections` HTTP/2 connections,
//! `--concurrency` calls in flight on each, one descriptor per call (or
//! one per key of `--key a,b,c`; a hot value, or `--keys` values taken in
//! turn), for `--seconds` or at most `--max-requests` calls, whichever
//! ends first. Prints one line:
//!
//! ```text
//! requests=123456 ok=123456 over_limit=0 errors=0 seconds=5.00 rps=24691.2
//! ```
//!
//! ```text
//! cargo run --release -p tower-window-benches --bin rls_load -- \
//!     --target http://127.0.0.1:8081 --domain bench --key user --seconds 5
//! ```
//!
//! `--client envoy` sends each call as Envoy's gRPC client does, over the
//! `h2` crate directly: a HEADERS frame (with Envoy's `te`, `content-type`
//! and the rate limit filter's default `grpc-timeout: 20m`) and one DATA
//! frame that ends the stream. tonic's client (`--client tonic`, the
//! default) ends the stream with an empty DATA frame of its own and sends
//! no `grpc-timeout`.
//!
//! No timing is asserted; `benches/load/rls_table.sh` runs it against the
//! rls and wrk against the gateway, interleaved, and reports both.
#![allow(clippy::print_stdout)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use prost::Message as _;
use tonic::transport::Endpoint;

#[derive(Debug, Parser)]
#[command(name = "rls_load", about = "ShouldRateLimit load against an rls")]
struct Args {
    /// The rls: `http://IP:PORT`.
    #[arg(long)]
    target: String,
    /// HTTP/2 connections.
    #[arg(long, default_value = "4")]
    connections: usize,
    /// Calls in flight on each connection.
    #[arg(long, default_value = "8")]
    concurrency: usize,
    /// How long to send, in seconds (at most 600).
    #[arg(long, default_value = "5")]
    seconds: u64,
    /// The most calls to send.
    #[arg(long, default_value = "100000000")]
    max_requests: u64,
    /// Seconds of calls before the measured ones (not counted).
    #[arg(long, default_value = "1")]
    warmup: u64,
    /// The request's domain.
    #[arg(long, default_value = "bench")]
    domain: String,
    /// The descriptor's key; several, comma-separated (`a,b,c`): one
    /// descriptor each, all with the same value, in one request.
    #[arg(long, default_value = "user", value_delimiter = ',')]
    key: Vec<String>,
    /// Distinct values of the key, taken in turn (1: one hot key).
    #[arg(long, default_value = "1")]
    keys: u64,
    /// `tonic`: tonic's generated client; `envoy`: HTTP/2 frames as
    /// Envoy's gRPC client sends them (see the top of this file).
    #[arg(long, value_enum, default_value_t = ClientKind::Tonic)]
    client: ClientKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ClientKind {
    Tonic,
    Envoy,
}

/// One connection, of either kind.
#[derive(Clone)]
enum Client {
    Tonic(RateLimitServiceClient<tonic::transport::Channel>),
    Envoy(h2::client::SendRequest<Bytes>, Arc<str>),
}

/// The gRPC method called.
const METHOD: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

impl Client {
    async fn connect(args: &Args) -> Result<Self, Box<dyn std::error::Error>> {
        Ok(match args.client {
            ClientKind::Tonic => {
                // One endpoint per connection: tonic multiplexes calls on one.
                let channel = Endpoint::from_shared(args.target.clone())?
                    .tcp_nodelay(true)
                    .connect()
                    .await?;
                Self::Tonic(RateLimitServiceClient::new(channel))
            }
            ClientKind::Envoy => {
                let address = args
                    .target
                    .strip_prefix("http://")
                    .unwrap_or(&args.target)
                    .trim_end_matches('/');
                let tcp = tokio::net::TcpStream::connect(address).await?;
                tcp.set_nodelay(true)?;
                let (send, connection) = h2::client::Builder::new()
                    .initial_window_size(1 << 20)
                    .initial_connection_window_size(1 << 20)
                    .handshake::<_, Bytes>(tcp)
                    .await?;
                tokio::spawn(async move {
                    let _ = connection.await;
                });
                Self::Envoy(send, Arc::from(format!("http://{address}{METHOD}")))
            }
        })
    }

    /// One call: its overall code, or `None` for an error.
    async fn call(&mut self, request: RateLimitRequest) -> Option<i32> {
        match self {
            Self::Tonic(client) => client
                .should_rate_limit(request)
                .await
                .ok()
                .map(|r| r.get_ref().overall_code),
            Self::Envoy(send, uri) => envoy_call(send, uri, &request).await,
        }
    }
}

/// `request` as Envoy sends it: HEADERS, then the message in one DATA
/// frame that ends the stream.
async fn envoy_call(
    send: &mut h2::client::SendRequest<Bytes>,
    uri: &str,
    request: &RateLimitRequest,
) -> Option<i32> {
    let head = http::Request::post(uri)
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("grpc-timeout", "20m")
        .body(())
        .ok()?;
    let mut message = Vec::with_capacity(5 + request.encoded_len());
    message.push(0);
    message.extend_from_slice(&u32::try_from(request.encoded_len()).ok()?.to_be_bytes());
    request.encode(&mut message).ok()?;
    // At most the server's concurrent streams in flight.
    std::future::poll_fn(|cx| send.poll_ready(cx)).await.ok()?;
    let (response, mut stream) = send.send_request(head, false).ok()?;
    stream.send_data(Bytes::from(message), true).ok()?;
    let (head, mut body) = response.await.ok()?.into_parts();
    if head.status != http::StatusCode::OK {
        return None;
    }
    let mut data = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.ok()?;
        let _ = body.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(&chunk);
    }
    let trailers = body.trailers().await.ok()??;
    if trailers.get("grpc-status")?.as_bytes() != b"0" || data.len() < 5 {
        return None;
    }
    RateLimitResponse::decode(&data[5..])
        .ok()
        .map(|r| r.overall_code)
}

#[derive(Default)]
struct Counts {
    ok: AtomicU64,
    over: AtomicU64,
    errors: AtomicU64,
}

fn request(args: &Args, n: u64) -> RateLimitRequest {
    let value = format!("u{}", n % args.keys.max(1));
    RateLimitRequest {
        domain: args.domain.clone(),
        descriptors: args
            .key
            .iter()
            .map(|key| RateLimitDescriptor {
                entries: vec![Entry {
                    key: key.clone(),
                    value: value.clone(),
                }],
                ..RateLimitDescriptor::default()
            })
            .collect(),
        hits_addend: 1,
    }
}

/// Sends calls on every connection until `until` or `budget` calls are
/// taken; counts them in `counts`.
async fn run(
    args: &Arc<Args>,
    clients: &[Client],
    until: Instant,
    budget: u64,
    counts: &Arc<Counts>,
) {
    let taken = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for (c, client) in clients.iter().enumerate() {
        for t in 0..args.concurrency {
            let mut client = client.clone();
            let args = Arc::clone(args);
            let counts = Arc::clone(counts);
            let taken = Arc::clone(&taken);
            let mut n = (c * args.concurrency + t) as u64;
            tasks.spawn(async move {
                while Instant::now() < until && taken.fetch_add(1, Ordering::Relaxed) < budget {
                    n = n.wrapping_add(7919);
                    let counter = match client.call(request(&args, n)).await {
                        Some(code) if code == Code::Ok as i32 => &counts.ok,
                        Some(_) => &counts.over,
                        None => &counts.errors,
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    }
    while tasks.join_next().await.is_some() {}
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Arc::new(Args::parse());
    let seconds = args.seconds.clamp(1, 600);
    let mut clients = Vec::with_capacity(args.connections);
    for _ in 0..args.connections.max(1) {
        clients.push(Client::connect(&args).await?);
    }
    if args.warmup > 0 {
        let until = Instant::now() + Duration::from_secs(args.warmup.min(60));
        run(
            &args,
            &clients,
            until,
            u64::MAX,
            &Arc::new(Counts::default()),
        )
        .await;
    }
    let counts = Arc::new(Counts::default());
    let start = Instant::now();
    run(
        &args,
        &clients,
        start + Duration::from_secs(seconds),
        args.max_requests,
        &counts,
    )
    .await;
    let elapsed = start.elapsed().as_secs_f64();
    let ok = counts.ok.load(Ordering::Relaxed);
    let over = counts.over.load(Ordering::Relaxed);
    let errors = counts.errors.load(Ordering::Relaxed);
    let total = ok + over + errors;
    println!(
        "requests={total} ok={ok} over_limit={over} errors={errors} seconds={elapsed:.2} rps={:.1}",
        total as f64 / elapsed
    );
    Ok(())
}
