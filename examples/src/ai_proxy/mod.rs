//! The AI proxy example: an axum proxy in front of an OpenAI-style model,
//! each tenant (the `x-tenant` header) limited to a budget of tokens per
//! window, on the embedded store or shared by every proxy node on Redis.
//!
//! The tokens of an answer are known only when its stream ends, so each
//! request reserves an estimate (`--estimate`) before it is forwarded, and
//! the tokens the client was sent ([`Tokens`]) are settled when the answer
//! ends, however it ends: complete, client gone, upstream failed or
//! stalled (`--idle-timeout`), or cut at shutdown. What the estimate did
//! not use is given back; usage past it is recorded even past the budget
//! ("debt"), and the tenant gets `429` until it slides out. See
//! [`tower_window::layer::Metered`].
//!
//! - `POST /v1/...`: forwarded to `--upstream` with its path, limited.
//!   Without the tenant header: `400` problem+json.
//! - A streamed answer that the proxy ends early ends with a last
//!   `data: {"error":{"type":...}}` event (`upstream_error`,
//!   `upstream_timeout`, `shutting_down`), so the client gets a complete
//!   HTTP answer that says why.
//! - [`fake_model`] is a model to run it against (`--fake-upstream`).
//!
//! [`Args`] are the flags; [`Args::into_config`] makes a [`ProxyConfig`],
//! [`Proxy::new`] the app, [`Proxy::serve`] serves it and shuts it down.

mod model;
mod proxy;
mod tokens;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use axum::http::{HeaderName, Uri};
use axum::routing::any;
use axum::Router;
use clap::Parser;
use tower_window::key::Header;
use tower_window::quota::parse_duration;
use tower_window::{Algorithm, Limiter, MemoryStore, Quota, Store};

pub use model::{fake_model, DELAY_MS, FAIL_AFTER, MAX_TOKENS, STALL_AFTER};
pub use tokens::Tokens;

use crate::gateway::flags;
use crate::gateway::ConfigError;
use crate::redis_tls::{redis_store, TlsFiles};

/// The `ai-proxy` binary's flags.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "ai-proxy",
    version,
    about = "An OpenAI-style proxy with token budgets per tenant, by tower-window"
)]
pub struct Args {
    /// Address to listen on: IP:PORT.
    #[arg(long, env = "TW_LISTEN", default_value = "127.0.0.1:3000", value_parser = flags::listen)]
    pub listen: SocketAddr,

    /// The model upstream, `http://host:port`; requests keep their path.
    #[arg(long, env = "TW_UPSTREAM", conflicts_with = "fake_upstream")]
    pub upstream: Option<String>,

    /// Start the fake model (streams `max_tokens` tokens of "tok") in this
    /// process and forward to it.
    #[arg(long)]
    pub fake_upstream: bool,

    /// Tokens per tenant, in the quota DSL (`100000/1m`, `2000000/1d
    /// sliding-counter(1h)`); not GCRA, which cannot give back part of a
    /// reservation.
    #[arg(long, env = "TW_BUDGET", default_value = "100000/1m", value_parser = flags::quota)]
    pub budget: Quota,

    /// Tokens reserved per request before it is forwarded; the answer's
    /// real count replaces it when it ends.
    #[arg(long, env = "TW_ESTIMATE", default_value = "256", value_parser = flags::positive_count)]
    pub estimate: u32,

    /// Header naming the tenant (required).
    #[arg(long, env = "TW_TENANT_HEADER", default_value = "x-tenant", value_parser = flags::header_name)]
    pub tenant_header: HeaderName,

    /// Redis URL: every proxy on the same Redis shares the budgets. Without
    /// it (or `--redis-cluster`) the embedded store is used.
    #[arg(long, env = "TW_REDIS_URL", conflicts_with = "redis_cluster")]
    pub redis_url: Option<String>,

    /// Redis Cluster seed node URLs, comma-separated.
    #[arg(long, env = "TW_REDIS_CLUSTER", value_delimiter = ',')]
    pub redis_cluster: Vec<String>,

    /// Time budget of one reservation or settle against Redis, retries
    /// included, in milliseconds.
    #[arg(long, env = "TW_REDIS_TIMEOUT_MS", default_value = "50", value_parser = flags::redis_timeout_ms)]
    pub redis_timeout_ms: u64,

    /// A stream whose model sends nothing for this long is ended (and
    /// charged what it sent); also the wait for the model's answer head.
    #[arg(long, env = "TW_IDLE_TIMEOUT", default_value = "30s", value_parser = duration)]
    pub idle_timeout: Duration,

    /// On shutdown, streams in flight may finish for this long; then they
    /// are cut (and charged what they sent).
    #[arg(long, env = "TW_SHUTDOWN_GRACE", default_value = "10s", value_parser = duration)]
    pub shutdown_grace: Duration,
}

/// A duration in the quota DSL's units (`250ms`, `30s`, `2m`).
fn duration(text: &str) -> Result<Duration, String> {
    parse_duration(text.trim()).map_err(|e| format!("{e}: expected e.g. 250ms, 30s or 2m"))
}

impl Args {
    /// The proxy these flags describe (the upstream given, or started by
    /// the caller for `--fake-upstream` and put in `upstream`).
    pub fn into_config(self) -> Result<ProxyConfig, ConfigError> {
        if self.budget.algorithm() == Algorithm::Gcra {
            return Err(ConfigError::new(
                "--budget",
                self.budget.to_string(),
                "gcra cannot give back the unused part of a reservation",
                "use a sliding log (the default), sliding-counter(...) or fixed-window budget",
            ));
        }
        let upstream = self.upstream.as_deref().unwrap_or_default();
        let base = upstream
            .parse::<Uri>()
            .ok()
            .filter(|u| u.scheme_str() == Some("http") && u.authority().is_some());
        let Some(base) = base else {
            return Err(ConfigError::new(
                "--upstream",
                upstream,
                "expected http://host:port (plain HTTP; the path is the request's)",
                "give e.g. --upstream http://127.0.0.1:8000, or --fake-upstream",
            ));
        };
        let redis = redis_store(
            self.redis_url.as_deref(),
            &self.redis_cluster,
            &TlsFiles::default(),
        )?;
        let store = match redis {
            Some(redis) => Store::builder(redis)
                .timeout(Duration::from_millis(self.redis_timeout_ms))
                .build(),
            None => Store::from(MemoryStore::new()),
        };
        Ok(ProxyConfig {
            limiter: Limiter::new(store, self.budget),
            upstream: base,
            estimate: self.estimate,
            tenant_header: self.tenant_header,
            idle_timeout: self.idle_timeout,
        })
    }
}

/// What [`Proxy::new`] needs.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// The budget per tenant, on its store.
    pub limiter: Limiter,
    /// The model upstream, `http://host:port`.
    pub upstream: Uri,
    /// Tokens reserved per request.
    pub estimate: u32,
    /// Header naming the tenant.
    pub tenant_header: HeaderName,
    /// How long the model may send nothing.
    pub idle_timeout: Duration,
}

/// The proxy: its app and its limiter.
pub struct Proxy {
    router: Router,
    limiter: Limiter,
    upstream: Arc<proxy::Upstream>,
}

impl Proxy {
    /// The app of `config`.
    pub fn new(config: ProxyConfig) -> Self {
        let upstream = proxy::Upstream::new(config.upstream, config.idle_timeout);
        let estimate = config.estimate;
        let tenant = Header::from_name(config.tenant_header);
        let budget = axum_window_ext::layer(config.limiter.clone(), tenant)
            .cost(move |_: &Request| estimate)
            .metered(Tokens::default);
        let router = Router::new()
            .route("/v1/{*path}", any(proxy::forward))
            .route_layer(budget)
            .with_state(Arc::clone(&upstream));
        Self {
            router,
            limiter: config.limiter,
            upstream,
        }
    }

    /// The app, to serve or to call.
    pub fn router(&self) -> Router {
        self.router.clone()
    }

    /// The limiter of the tenants' budgets.
    pub fn limiter(&self) -> &Limiter {
        &self.limiter
    }

    /// Serves on `listener` until `shutdown` resolves; then takes no new
    /// connection, lets the streams in flight finish for `grace`, cuts
    /// those still running, and returns once every connection is closed
    /// and every answer's tokens are settled in the store.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
        grace: Duration,
    ) -> std::io::Result<()> {
        let upstream = Arc::clone(&self.upstream);
        let draining = async move {
            shutdown.await;
            tokio::spawn(async move {
                tokio::time::sleep(grace).await;
                upstream.cut_streams();
            });
        };
        axum::serve(listener, self.router)
            .with_graceful_shutdown(draining)
            .await?;
        self.limiter.settled().await;
        Ok(())
    }
}
