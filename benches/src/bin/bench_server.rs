//! HTTP server for the load benchmark (`benches/load/run.sh`): one trivial
//! axum route, `GET /` answering `ok`, behind the rate limiter chosen by
//! `--variant`, every variant keyed by the `x-user-id` header.
//!
//! ```text
//! cargo run --release -p tower-window-benches --bin bench_server -- --variant memory
//! ```
//!
//! Variants (the letters of `benches/README.md`):
//! - `none` (a): no limiter;
//! - `memory` (b): `SlidingWindowLayer` over a `MemoryStore` (bare `Limiter::new`;
//!   `--lease` and `--local-capacity` add leases and a local tier);
//! - `governor` (c): `tower_governor` with a `KeyExtractor` on `x-user-id`;
//! - `redis` (d): `SlidingWindowLayer` over a `RedisStore` (`--redis-url`),
//!   `Limiter::builder` defaults (local tier, 50 ms budget, breaker) plus a
//!   `LocalWindow` fallback;
//! - `redis-down` (e): the same limiter pointed at a closed loopback port; the
//!   server makes checks until the breaker is open before it listens;
//! - `local-flood` (f): the same limiter as `redis` with a tiny quota
//!   (`--flood-quota`), for a load of one user: after the first denials the
//!   local tier answers without Redis.
//!
//! All variants run on the same runtime: tokio multi-thread, `--workers`
//! (default 2) worker threads. The server prints `listening on ADDR` on stdout
//! once it accepts connections, and runs until killed.
#![allow(clippy::print_stdout)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::routing::get;
use axum::Router;
use clap::{Parser, ValueEnum};
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::KeyExtractor as GovernorKeyExtractor;
use tower_governor::{GovernorError, GovernorLayer};
use tower_window::fallback::{FailOpen, LocalWindow};
use tower_window::key::Header;
use tower_window::{
    BreakerState, LeaseConfig, Limiter, LimiterBuilder, MemoryStore, Quota, RedisStore,
    SlidingWindowLayer, WindowKey,
};

/// The header every variant keys on.
const USER_HEADER: &str = "x-user-id";

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Variant {
    /// (a) No limiter.
    None,
    /// (b) tower-window on the memory store.
    Memory,
    /// (c) tower_governor.
    Governor,
    /// (d) tower-window on Redis.
    Redis,
    /// (e) tower-window with Redis unreachable and the breaker open.
    RedisDown,
    /// (f) tower-window on Redis, one over-limit user answered by the local tier.
    LocalFlood,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Fallback {
    /// `FailOpen`: admit without the store.
    FailOpen,
    /// `LocalWindow::new(1.0)`: the full quota in a per-node memory window.
    LocalWindow,
}

/// Load-benchmark server: `GET /` behind one rate-limiter variant.
#[derive(Debug, Parser)]
struct Args {
    /// Which limiter guards the route.
    #[arg(long, value_enum)]
    variant: Variant,
    /// Address to listen on (port 0: any free port; the chosen one is printed).
    #[arg(long, default_value = "127.0.0.1:0")]
    addr: SocketAddr,
    /// tower-window quota per user for all variants but `local-flood`
    /// (tower_governor gets the same rate and burst).
    #[arg(long, default_value = "1000/1s")]
    quota: Quota,
    /// tower_governor: replenish one request every this many microseconds
    /// (1000 µs with burst 1000 ≈ 1000/1s).
    #[arg(long, default_value_t = 1000)]
    governor_period_us: u64,
    /// tower_governor: burst size.
    #[arg(long, default_value_t = 1000)]
    governor_burst: u32,
    /// Quota of the `local-flood` variant (one user, far over it).
    #[arg(long, default_value = "10/1h")]
    flood_quota: Quota,
    /// Redis URL for `redis` and `local-flood`.
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    redis_url: String,
    /// Fallback policy of the Redis variants.
    #[arg(long, value_enum, default_value = "local-window")]
    fallback: Fallback,
    /// Tokio worker threads (the same for every variant).
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// tower-window variants: whether an admitted request carries its
    /// `Decision` in its extensions (`--decision-extension false`: the
    /// headers only, as tower_governor does).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    decision_extension: bool,
    /// `memory` and `redis`: lease up to this many units per hot key
    /// (`LeaseConfig::new`; 0, the default: no leases).
    #[arg(long, default_value_t = 0)]
    lease: u32,
    /// `memory`: keys of the local tier (default 0, as `Limiter::new`; the
    /// lease tier holds as many keys, at least 1,000).
    #[arg(long, default_value_t = 0)]
    local_capacity: u64,
}

/// tower_governor key: the `x-user-id` header's value.
#[derive(Debug, Clone, Copy)]
struct UserHeader;

impl GovernorKeyExtractor for UserHeader {
    type Key = Box<[u8]>;

    fn extract<T>(&self, req: &http::Request<T>) -> Result<Self::Key, GovernorError> {
        req.headers()
            .get(USER_HEADER)
            .map(|v| Box::from(v.as_bytes()))
            .ok_or(GovernorError::UnableToExtractKey)
    }
}

async fn ok() -> &'static str {
    "ok"
}

fn redis_limiter(
    url: &str,
    quota: Quota,
    fallback: Fallback,
    lease: u32,
) -> Result<Limiter, String> {
    let store = RedisStore::from_url(url).map_err(|e| format!("redis store: {e}"))?;
    let builder = with_leases(Limiter::builder(store, quota.clone()), lease);
    let builder = match fallback {
        Fallback::FailOpen => builder.fallback(FailOpen::new()),
        Fallback::LocalWindow => {
            builder.fallback(LocalWindow::new(1.0).map_err(|e| format!("share: {e}"))?)
        }
    };
    Ok(builder.build())
}

/// The builder with leases of up to `lease` units (0: none).
fn with_leases(builder: LimiterBuilder, lease: u32) -> LimiterBuilder {
    if lease == 0 {
        builder
    } else {
        builder.leases(LeaseConfig::new(lease))
    }
}

fn tower_window_app(limiter: Limiter, decision_extension: bool) -> Router {
    Router::new().route("/", get(ok)).layer(
        SlidingWindowLayer::new(
            limiter,
            Header::from_name(http::HeaderName::from_static(USER_HEADER)),
        )
        .decision_extension(decision_extension),
    )
}

/// A loopback port nothing listens on (bound, then released).
fn closed_port() -> Result<u16, String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    drop(listener);
    Ok(port)
}

/// Checks until the breaker opens (bounded: at most 10 s).
async fn open_breaker(limiter: &Limiter) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let key = WindowKey::for_subject("warm-up");
    while limiter.breaker_state() != Some(BreakerState::Open) {
        if Instant::now() > deadline {
            return Err(format!(
                "breaker still {:?} after 10 s",
                limiter.breaker_state()
            ));
        }
        let _ = limiter.check(&key, 1).await;
    }
    Ok(())
}

async fn app(args: &Args) -> Result<Router, String> {
    Ok(match args.variant {
        Variant::None => Router::new().route("/", get(ok)),
        Variant::Memory => tower_window_app(
            with_leases(
                Limiter::builder(MemoryStore::new(), args.quota.clone())
                    .local_capacity(args.local_capacity),
                args.lease,
            )
            .build(),
            args.decision_extension,
        ),
        Variant::Governor => {
            let config = GovernorConfigBuilder::default()
                .key_extractor(UserHeader)
                .per_nanosecond(args.governor_period_us.saturating_mul(1000))
                .burst_size(args.governor_burst)
                .use_headers()
                .finish()
                .ok_or("invalid tower_governor configuration")?;
            Router::new()
                .route("/", get(ok))
                .layer(GovernorLayer::new(config))
        }
        Variant::Redis => tower_window_app(
            redis_limiter(
                &args.redis_url,
                args.quota.clone(),
                args.fallback,
                args.lease,
            )?,
            args.decision_extension,
        ),
        Variant::LocalFlood => tower_window_app(
            redis_limiter(&args.redis_url, args.flood_quota.clone(), args.fallback, 0)?,
            args.decision_extension,
        ),
        Variant::RedisDown => {
            let url = format!("redis://127.0.0.1:{}", closed_port()?);
            let limiter = redis_limiter(&url, args.quota.clone(), args.fallback, 0)?;
            open_breaker(&limiter).await?;
            tower_window_app(limiter, args.decision_extension)
        }
    })
}

async fn serve(args: Args) -> Result<(), String> {
    let app = app(&args).await?;
    let listener = tokio::net::TcpListener::bind(args.addr)
        .await
        .map_err(|e| format!("bind {}: {e}", args.addr))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    println!("listening on {addr}");
    axum::serve(listener, app)
        .await
        .map_err(|e| format!("serve: {e}"))
}

fn main() {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.workers.max(1))
        .enable_all()
        .build();
    let result = match runtime {
        Ok(runtime) => runtime.block_on(serve(args)),
        Err(e) => Err(format!("runtime: {e}")),
    };
    if let Err(error) = result {
        eprintln!("bench_server: {error}");
        std::process::exit(1);
    }
}
