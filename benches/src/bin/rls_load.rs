//! A small load client for the examples' `rls` (Envoy's
//! `ShouldRateLimit` over gRPC): `--connections` HTTP/2 connections,
//! `--concurrency` calls in flight on each, one descriptor per call (a hot
//! key, or `--keys` values taken in turn), for `--seconds` or at most
//! `--max-requests` calls, whichever ends first. Prints one line:
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
//! No timing is asserted; `benches/load/rls_table.sh` runs it against the
//! rls and wrk against the gateway, interleaved, and reports both.
#![allow(clippy::print_stdout)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
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
    /// The descriptor's key.
    #[arg(long, default_value = "user")]
    key: String,
    /// Distinct values of the key, taken in turn (1: one hot key).
    #[arg(long, default_value = "1")]
    keys: u64,
}

#[derive(Default)]
struct Counts {
    ok: AtomicU64,
    over: AtomicU64,
    errors: AtomicU64,
}

fn request(args: &Args, n: u64) -> RateLimitRequest {
    RateLimitRequest {
        domain: args.domain.clone(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: args.key.clone(),
                value: format!("u{}", n % args.keys.max(1)),
            }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 1,
    }
}

/// Sends calls on every connection until `until` or `budget` calls are
/// taken; counts them in `counts`.
async fn run(
    args: &Arc<Args>,
    clients: &[RateLimitServiceClient<tonic::transport::Channel>],
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
                    let counter = match client.should_rate_limit(request(&args, n)).await {
                        Ok(response) if response.get_ref().overall_code == Code::Ok as i32 => {
                            &counts.ok
                        }
                        Ok(_) => &counts.over,
                        Err(_) => &counts.errors,
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
        // One endpoint per connection: tonic multiplexes calls on one.
        let channel = Endpoint::from_shared(args.target.clone())?
            .tcp_nodelay(true)
            .connect()
            .await?;
        clients.push(RateLimitServiceClient::new(channel));
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
