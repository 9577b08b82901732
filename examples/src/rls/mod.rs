//! An Envoy rate limit service (`--bin rls`): Envoy's
//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` over gRPC
//! (tonic, the API types of the `envoy-types` crate), with the rules of
//! envoyproxy/ratelimit's YAML files and tower-window's windows — sliding
//! by default — on the embedded store, Redis or Redis Cluster.
//!
//! - [`config`]: the YAML format (plus `algorithm`), checked as
//!   envoyproxy/ratelimit checks it;
//! - [`matching`]: the rule of each descriptor;
//! - [`service`]: the decision — every descriptor of a request in one
//!   store call, all or nothing —, and the answer;
//! - [`reload`]: the files watched and reloaded as a whole;
//! - [`server`]: the gRPC server (HTTP/2, one task per connection);
//! - [`metrics`]: the service's own series;
//! - [`settings`]: envoyproxy/ratelimit's settings, read by their own names;
//! - [`audit`]: the decisions in an audit trail (`--audit`).
//!
//! Everything the gateway has carries over, with the same flags (each also
//! from a `TW_RLS_*` variable): Redis (`--redis-url`) and Redis Cluster
//! (`--redis-cluster`) with a time budget (`--redis-timeout-ms`), the
//! store's breakers, a local tier of recent denials and a fallback policy
//! (`--fallback`, `--expected-nodes`); quota leases (`--lease`,
//! `--lease-ttl`); metrics on `--metrics-listen` for the bundled dashboard;
//! the decision audit trail (`--audit`, from `TW_AUDIT`: [`audit`]).
//! envoyproxy/ratelimit's own settings (`RUNTIME_ROOT`, `REDIS_URL`,
//! `SHADOW_MODE`, ...) are read too, where no flag gives the value
//! ([`settings`]). See `examples/README.md` for pointing Envoy at it, and
//! its compatibility table.

pub mod audit;
pub mod config;
pub mod dynamic_metadata;
pub mod matching;
pub mod metrics;
pub mod reload;
pub mod server;
pub mod service;
pub mod settings;
pub mod tonic_server;

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use clap::Parser;
use tower_window::fallback::{FailClosed, FailOpen, LocalWindow};
use tower_window::{AuditLog, LeaseConfig, Limiter, MemoryStore, Quota, RedisStore, Store};

use crate::gateway::flags;
use crate::gateway::{ConfigError, FallbackArg};
pub use config::{LoadOptions, RlsConfig, RlsConfigError};
pub use server::serve;
pub use service::RlsService;
pub use tonic_server::serve_with_tonic;

/// The rls's flags. Every flag can also be set from the environment
/// variable shown in `--help`.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "rls",
    version,
    about = "An Envoy rate limit service with sliding windows, on tower-window"
)]
pub struct RlsArgs {
    /// Address to serve gRPC (HTTP/2 without TLS) on: IP:PORT.
    #[arg(long, env = "TW_RLS_LISTEN", default_value = "127.0.0.1:8081", value_parser = flags::listen)]
    pub listen: SocketAddr,

    /// A rules file (envoyproxy/ratelimit's YAML, one domain per file), or
    /// a directory of `*.yaml` files. Repeat it for several; in the
    /// environment, separate them with `,`. Watched and reloaded as a
    /// whole; a broken set is refused and the old rules stay. Without it,
    /// envoyproxy/ratelimit's `RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY`.
    #[arg(
        long,
        env = "TW_RLS_CONFIG",
        value_name = "FILE|DIR",
        value_delimiter = ','
    )]
    pub config: Vec<PathBuf>,

    /// Answer every request OK (`SHADOW_MODE`): each descriptor keeps its
    /// code, every window counts on its own, only the overall code is OK.
    #[arg(long, env = "TW_RLS_SHADOW_MODE")]
    pub shadow_mode: bool,

    /// Treat every rule as `quota_mode: true` (`QUOTA_MODE`).
    #[arg(long, env = "TW_RLS_QUOTA_MODE")]
    pub quota_mode: bool,

    /// Answer with `dynamic_metadata`: the request, the passed rules'
    /// `metadata` and the backends still in quota (`RESPONSE_DYNAMIC_METADATA`).
    #[arg(long, env = "TW_RLS_DYNAMIC_METADATA")]
    pub dynamic_metadata: bool,

    /// One domain may span several files: their rules are merged
    /// (`MERGE_DOMAIN_CONFIG`); without it a domain in two files is refused.
    #[arg(long, env = "TW_RLS_MERGE_DOMAIN_CONFIG")]
    pub merge_domain_config: bool,

    /// How many keys the local tier of recent denials holds (0: off);
    /// envoyproxy/ratelimit's `LOCAL_CACHE_SIZE_IN_BYTES` sets it to
    /// bytes / 256.
    #[arg(long, env = "TW_RLS_LOCAL_CACHE_KEYS", default_value = "100000", value_parser = clap::value_parser!(u64))]
    pub local_cache_keys: u64,

    /// Redis URL (`redis://host:port[/db]`): every rls on the same Redis
    /// shares the same windows. Without it (and without
    /// `--redis-cluster`) the embedded store is used.
    #[arg(long, env = "TW_RLS_REDIS_URL", conflicts_with = "redis_cluster")]
    pub redis_url: Option<String>,

    /// Redis Cluster seed node URLs, comma-separated.
    #[arg(long, env = "TW_RLS_REDIS_CLUSTER", value_delimiter = ',')]
    pub redis_cluster: Vec<String>,

    /// What to answer while Redis is slow or down: `fail-open` (OK),
    /// `fail-closed` (OVER_LIMIT), `local` (a window on this node with a
    /// share of each limit, see `--expected-nodes`). Envoy's own
    /// `failure_mode_deny` applies when the rls itself cannot answer.
    #[arg(long, env = "TW_RLS_FALLBACK", value_enum, default_value_t = FallbackArg::Local)]
    pub fallback: FallbackArg,

    /// How many rls nodes share the Redis (the `local` fallback's share is
    /// limit / expected-nodes).
    #[arg(long, env = "TW_RLS_EXPECTED_NODES", default_value = "1", value_parser = flags::expected_nodes)]
    pub expected_nodes: NonZeroU32,

    /// Time budget of one decision against Redis, retries included, in
    /// milliseconds; past it the fallback answers.
    #[arg(long, env = "TW_RLS_REDIS_TIMEOUT_MS", default_value = "50", value_parser = flags::redis_timeout_ms)]
    pub redis_timeout_ms: u64,

    /// The largest quota lease, in units: up to this many units of a hot
    /// window are taken in one store call and spent on this node, the
    /// limit still exact across nodes. 0 (the default) turns leases off.
    #[arg(long, env = "TW_RLS_LEASE", default_value = "0", value_parser = flags::count)]
    pub lease: u32,

    /// How long a lease may be spent (`250ms`, `1s`; a bare number is
    /// milliseconds). Default: a tenth of the shortest window, at most 1s.
    #[arg(long, env = "TW_RLS_LEASE_TTL", value_name = "DURATION", value_parser = flags::lease_ttl)]
    pub lease_ttl: Option<Duration>,

    /// Answer with the rate limit headers (`--limit-header`,
    /// `--remaining-header`, `--reset-header`) of the descriptor that binds
    /// in `response_headers_to_add`: Envoy adds them to the client's
    /// response.
    #[arg(long, env = "TW_RLS_RESPONSE_HEADERS")]
    pub response_headers: bool,

    /// The response's limit header.
    #[arg(long, env = "TW_RLS_LIMIT_HEADER", default_value = "RateLimit-Limit", value_parser = header_name)]
    pub limit_header: String,

    /// The response's remaining header.
    #[arg(long, env = "TW_RLS_REMAINING_HEADER", default_value = "RateLimit-Remaining", value_parser = header_name)]
    pub remaining_header: String,

    /// The response's reset header (whole seconds).
    #[arg(long, env = "TW_RLS_RESET_HEADER", default_value = "RateLimit-Reset", value_parser = header_name)]
    pub reset_header: String,

    /// Answer with per-unit headers in `response_headers_to_add`, before
    /// the others: for each unit, the limit and remaining of its
    /// descriptor with the least remaining (`RateLimit-Limit-Seconds`,
    /// `RateLimit-Remaining-Seconds`, `-Minutes`, ...; named after
    /// `--limit-header` and `--remaining-header`).
    #[arg(long, env = "TW_RLS_PER_UNIT_HEADERS")]
    pub per_unit_headers: bool,

    /// Answer with the rate limit headers (`--request-limit-header`, ...) in
    /// `request_headers_to_add`: Envoy adds them to the request it sends
    /// upstream.
    #[arg(long, env = "TW_RLS_REQUEST_HEADERS")]
    pub request_headers: bool,

    /// The upstream request's limit header.
    #[arg(long, env = "TW_RLS_REQUEST_LIMIT_HEADER", default_value = "RateLimit-Limit", value_parser = header_name)]
    pub request_limit_header: String,

    /// The upstream request's remaining header.
    #[arg(long, env = "TW_RLS_REQUEST_REMAINING_HEADER", default_value = "RateLimit-Remaining", value_parser = header_name)]
    pub request_remaining_header: String,

    /// The upstream request's reset header.
    #[arg(long, env = "TW_RLS_REQUEST_RESET_HEADER", default_value = "RateLimit-Reset", value_parser = header_name)]
    pub request_reset_header: String,

    /// Serve Prometheus metrics at `http://ADDR/metrics` (IP:PORT).
    #[arg(long, env = "TW_RLS_METRICS_LISTEN", value_parser = flags::listen)]
    pub metrics_listen: Option<SocketAddr>,

    /// Which gRPC server answers: `h2` (HTTP/2 straight to the service,
    /// the fastest) or `tonic` (tonic's server: its router, layers and
    /// `grpc-timeout` enforcement). Both answer the same.
    #[arg(long, env = "TW_RLS_GRPC_SERVER", value_enum, default_value_t = GrpcServer::H2)]
    pub grpc_server: GrpcServer,

    /// `--audit` and its flags (from `TW_AUDIT*`).
    #[command(flatten)]
    pub audit: audit::AuditArgs,
}

/// The gRPC server of `--grpc-server`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum GrpcServer {
    /// [`serve`]: HTTP/2 (`h2`) straight to the service.
    H2,
    /// [`serve_with_tonic`]: tonic's `Server`.
    Tonic,
}

/// What [`build`] needs, made from [`RlsArgs`].
#[non_exhaustive]
pub struct RlsServerConfig {
    /// The rules as loaded, and their sources (for the reload).
    pub rules: RlsConfig,
    /// `--config`.
    pub sources: Vec<PathBuf>,
    /// The one store.
    pub store: Store,
    /// `Some` on Redis: the fallback policy.
    pub fallback: Option<(FallbackArg, NonZeroU32)>,
    /// Quota leases.
    pub leases: Option<LeaseConfig>,
    /// `--response-headers`, `--request-headers` and their names.
    pub headers: service::Headers,
    /// `--shadow-mode` and `--quota-mode`.
    pub modes: service::Modes,
    /// `--local-cache-keys`.
    pub local_cache_keys: u64,
    /// `--audit` and its flags: `Some` when on.
    pub audit: Option<audit::AuditSettings>,
    /// The one audit log, once built (on `store`).
    audit_log: audit::OneLog,
}

impl std::fmt::Debug for RlsServerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RlsServerConfig")
            .field("domains", &self.rules.domains.len())
            .field("sources", &self.sources)
            .field("fallback", &self.fallback)
            .field("leases", &self.leases)
            .field("audit", &self.audit)
            .finish_non_exhaustive()
    }
}

impl RlsArgs {
    /// The flags of this process's command line, then envoyproxy/ratelimit's
    /// settings from its environment where no flag was given (see
    /// [`settings`]). Exits with clap's message on a bad command line.
    pub fn from_env() -> Result<Self, ConfigError> {
        use clap::{CommandFactory, FromArgMatches};
        let matches = Self::command().get_matches();
        let mut args = Self::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
        settings::apply(&mut args, &matches, &|name| std::env::var(name).ok())?;
        Ok(args)
    }

    /// Checks the flags and loads the rules.
    pub fn into_config(self) -> Result<RlsServerConfig, ConfigError> {
        if self.config.is_empty() {
            return Err(ConfigError::new(
                "--config",
                "",
                "no rules to serve",
                "give --config FILE|DIR (or TW_RLS_CONFIG), or envoyproxy/ratelimit's RUNTIME_ROOT, RUNTIME_SUBDIRECTORY and RUNTIME_APPDIRECTORY",
            ));
        }
        let options = LoadOptions::merging(self.merge_domain_config);
        let rules = RlsConfig::load(&self.config, options).map_err(|error| {
            ConfigError::new(
                "--config",
                self.config
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(","),
                error.to_string(),
                config_fix(&error),
            )
        })?;
        let timeout = Duration::from_millis(self.redis_timeout_ms);
        let redis = if let Some(url) = &self.redis_url {
            crate::gateway::check_redis_url("--redis-url", url)?;
            Some(
                RedisStore::from_url(url)
                    .map_err(|e| crate::gateway::redis_url_error("--redis-url", url, &e))?,
            )
        } else if !self.redis_cluster.is_empty() {
            for url in &self.redis_cluster {
                crate::gateway::check_redis_url("--redis-cluster", url)?;
            }
            Some(RedisStore::cluster(&self.redis_cluster).map_err(|e| {
                crate::gateway::redis_url_error(
                    "--redis-cluster",
                    &self.redis_cluster.join(","),
                    &e,
                )
            })?)
        } else {
            None
        };
        let audit = self.audit.settings();
        let (store, fallback) = match redis {
            Some(redis) => (
                Store::builder(redis).timeout(timeout).build(),
                Some((self.fallback, self.expected_nodes)),
            ),
            // The embedded store's audit log keeps `--audit-max-len`
            // records over all domains.
            None => match &audit {
                Some(audit) => (
                    Store::from(
                        MemoryStore::builder()
                            .max_audit_records(usize::try_from(audit.max_len).unwrap_or(usize::MAX))
                            .build(),
                    ),
                    None,
                ),
                None => (Store::from(MemoryStore::new()), None),
            },
        };
        let leases = (self.lease > 0).then(|| {
            let config = LeaseConfig::new(self.lease);
            match self.lease_ttl {
                Some(ttl) => config.ttl(ttl),
                None => config,
            }
        });
        Ok(RlsServerConfig {
            rules,
            sources: self.config,
            store,
            fallback,
            leases,
            headers: service::Headers {
                response: self.response_headers.then(|| {
                    service::HeaderNames::new(
                        &self.limit_header,
                        &self.remaining_header,
                        &self.reset_header,
                    )
                }),
                per_unit: self.per_unit_headers.then(|| {
                    service::HeaderNames::new(
                        &self.limit_header,
                        &self.remaining_header,
                        &self.reset_header,
                    )
                }),
                request: self.request_headers.then(|| {
                    service::HeaderNames::new(
                        &self.request_limit_header,
                        &self.request_remaining_header,
                        &self.request_reset_header,
                    )
                }),
            },
            modes: service::Modes::new(self.shadow_mode, self.quota_mode)
                .with_dynamic_metadata(self.dynamic_metadata),
            local_cache_keys: self.local_cache_keys,
            audit,
            audit_log: audit::OneLog::default(),
        })
    }
}

/// A header name as HTTP allows one.
fn header_name(name: &str) -> Result<String, String> {
    http::HeaderName::from_bytes(name.as_bytes())
        .map(|_| name.to_owned())
        .map_err(|_| format!("not an HTTP header name: {name:?} (letters, digits and - are safe)"))
}

/// What to do about a refused rules set.
fn config_fix(error: &RlsConfigError) -> String {
    if error.problem.starts_with("cannot read") || error.problem.starts_with("cannot list") {
        "give the path of a rules file or of a directory of *.yaml rules files".to_owned()
    } else if error.problem.starts_with("no config file") {
        "put the rules (*.yaml) in the directory, or name a file".to_owned()
    } else {
        format!(
            "correct {} (the format: examples/rls/config.yaml and examples/README.md, section rls)",
            error.file.display()
        )
    }
}

impl RlsServerConfig {
    /// The audit log of `--audit` on [`store`](Self::store), if on: built
    /// the first time it is asked for, the same log after (every limiter
    /// of this configuration hands its decisions to it).
    pub fn audit_log(&self) -> Option<AuditLog> {
        let settings = self.audit.as_ref()?;
        Some(self.audit_log.get(settings, &self.store))
    }

    /// The limiter: a local tier of recent denials, the fallback on Redis,
    /// leases if asked, the audit log with `--audit`. Its own policy is
    /// never checked (every request brings its own); it only names the
    /// limiter's default.
    pub fn limiter(&self) -> Limiter {
        let placeholder = Quota::per_second(1)
            .and_then(|q| q.named("rls"))
            .unwrap_or_else(|_| unreachable!("1/1s named rls is a valid quota"));
        let mut builder =
            Limiter::builder(self.store.clone(), placeholder).local_capacity(self.local_cache_keys);
        if let Some(leases) = self.leases {
            builder = builder.leases(leases);
        }
        if let Some(audit) = self.audit_log() {
            builder = builder.audit(audit);
        }
        match self.fallback {
            Some((FallbackArg::FailOpen, _)) => builder.fallback(FailOpen),
            Some((FallbackArg::FailClosed, _)) => builder.fallback(FailClosed::new()),
            Some((FallbackArg::Local, nodes)) => builder.fallback(LocalWindow::per_node(nodes)),
            None => builder,
        }
        .build()
    }
}

/// A running rls: its service (and limiter), and the reload watch.
#[derive(Debug)]
pub struct Rls {
    /// The service.
    pub service: RlsService,
    /// The reload watch (`None` when hot reload is off).
    pub watch: Option<reload::RlsWatch>,
}

/// Builds the service for `config` and starts watching its files (inside a
/// Tokio runtime).
pub fn build(config: RlsServerConfig) -> Rls {
    let limiter = config.limiter();
    if let (Some(settings), Some(audit)) = (&config.audit, limiter.audit()) {
        tracing::info!(
            node = audit.node(),
            sample_admissions = settings.rules.admission_sample,
            buffer = settings.capacity,
            max_len = settings.max_len,
            max_age_s = settings.max_age.as_secs(),
            "audit trail on: each domain's denials, fallback decisions and shadow denials"
        );
    }
    let names = config.rules.quota_names();
    metrics::register_at_zero(names.iter().map(String::as_str));
    let first = reload::read(&config.sources);
    let rules = Arc::new(ArcSwap::from_pointee(config.rules));
    let watch = reload::watch(Arc::clone(&rules), config.sources, first);
    let service = RlsService::new(rules, limiter, false)
        .with_modes(config.modes)
        .with_headers(config.headers);
    Rls { service, watch }
}
