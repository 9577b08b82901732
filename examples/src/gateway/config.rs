//! Command-line flags and the configuration built from them.

use std::fmt;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::time::Duration;

use axum::http::{HeaderName, StatusCode};
use clap::{Parser, ValueEnum};
use tower_window::events::Retention;
use tower_window::fallback::{FailClosed, FailOpen, LocalWindow};
use tower_window::quota::default_granularity;
use tower_window::store::redis::redis;
use tower_window::{
    Algorithm, AuditLog, LeaseConfig, Limiter, MemoryStore, Policy, Quota, QuotaError, Store,
};

use super::flags;
use super::ws::{WsArgs, WsConfig};

/// The gateway's flags. Every flag can also be set from the environment
/// variable shown in `--help`.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "gateway",
    version,
    about = "An axum gateway rate limited by tower-window"
)]
pub struct Args {
    /// Address to listen on: IP:PORT (`127.0.0.1:3000`, `0.0.0.0:3000`,
    /// `[::1]:3000`).
    #[arg(long, env = "TW_LISTEN", default_value = "127.0.0.1:3000", value_parser = flags::listen)]
    pub listen: SocketAddr,

    /// Quota per tenant and user, as `NAME=DSL` or just `DSL` (named
    /// `default`), in the quota DSL (`100/1m`, `10/s`,
    /// `5000/1h sliding-counter(1m)`, `10/s gcra(burst=20)`). Repeat it for
    /// several quotas, checked together as one policy: a request is admitted
    /// only if every quota admits it (`--limit burst=5/1s --limit
    /// sustained=100/1m`). In the environment, separate them with `;`.
    #[arg(
        long,
        env = "TW_LIMIT",
        default_value = "100/1m",
        value_delimiter = ';',
        value_parser = flags::named_quota
    )]
    pub limit: Vec<Quota>,

    /// Counting algorithm; overrides the one written in every `--limit` and
    /// keeps its numbers. `sliding-counter` picks a granularity of at most
    /// 60 buckets per window.
    #[arg(long, env = "TW_ALGORITHM", value_enum)]
    pub algorithm: Option<AlgorithmArg>,

    /// Header naming the tenant; requests without it are in tenant `public`.
    #[arg(long, env = "TW_TENANT_HEADER", default_value = "x-tenant-id", value_parser = flags::header_name)]
    pub tenant_header: HeaderName,

    /// Header naming the user; requests without it are rejected with 400.
    #[arg(long, env = "TW_USER_HEADER", default_value = "x-user-id", value_parser = flags::header_name)]
    pub user_header: HeaderName,

    /// Redis URL, `redis://host:port[/db]` (`rediss://` for TLS,
    /// `redis+unix:///path` for a socket): every gateway using the same
    /// Redis shares the same windows. Without it the embedded store is used.
    #[arg(long, env = "TW_REDIS_URL", conflicts_with = "redis_cluster")]
    pub redis_url: Option<String>,

    /// Redis Cluster seed node URLs, comma-separated
    /// (`redis://10.0.0.1:7000,redis://10.0.0.2:7000`).
    #[arg(long, env = "TW_REDIS_CLUSTER", value_delimiter = ',')]
    pub redis_cluster: Vec<String>,

    /// With `rediss://`: a PEM file of the CA certificate(s) that signed
    /// the Redis server's certificate, trusted instead of the system's
    /// root certificates (a single Redis and every cluster node).
    #[arg(long, env = "TW_REDIS_CA_FILE", value_name = "FILE")]
    pub redis_ca_file: Option<std::path::PathBuf>,

    /// With `rediss://`: a PEM client certificate to present (mutual
    /// TLS), with `--redis-client-key`.
    #[arg(long, env = "TW_REDIS_CLIENT_CERT", value_name = "FILE")]
    pub redis_client_cert: Option<std::path::PathBuf>,

    /// The PEM private key of `--redis-client-cert`.
    #[arg(long, env = "TW_REDIS_CLIENT_KEY", value_name = "FILE")]
    pub redis_client_key: Option<std::path::PathBuf>,

    /// What to answer while Redis is slow or down (with `--redis-url` /
    /// `--redis-cluster`; the embedded store does not fail): `fail-open`
    /// admits, `fail-closed` answers 503, `local` keeps a window on this node
    /// with a share of the limit (see `--expected-nodes`) and answers 429
    /// past it.
    #[arg(long, env = "TW_FALLBACK", value_enum, default_value_t = FallbackArg::Local)]
    pub fallback: FallbackArg,

    /// How many gateway nodes share the Redis: with `--fallback local` each
    /// node admits limit / expected-nodes (rounded up, at least 1) per
    /// window on its own while Redis is down.
    #[arg(
        long,
        env = "TW_EXPECTED_NODES",
        default_value = "1",
        value_parser = flags::expected_nodes,
        allow_negative_numbers = true
    )]
    pub expected_nodes: NonZeroU32,

    /// Time budget of one rate-limit decision against Redis, retries
    /// included, in milliseconds (at least 1); past it the fallback answers.
    #[arg(
        long,
        env = "TW_REDIS_TIMEOUT_MS",
        default_value = "50",
        value_parser = flags::redis_timeout_ms,
        allow_negative_numbers = true
    )]
    pub redis_timeout_ms: u64,

    /// Refuse to start (exit 1) when the store cannot be reached at start,
    /// instead of logging why and answering from `--fallback` until it
    /// can (`GET /readyz` answers 503 meanwhile).
    #[arg(long, env = "TW_REQUIRE_STORE")]
    pub require_store: bool,

    /// Add `x-ratelimit-source: store|local_cache|fallback(<reason>)`
    /// to limited responses (allowed and denied), naming who decided, so
    /// operators can see degradation.
    #[arg(long, env = "TW_DEBUG_HEADERS")]
    pub debug_headers: bool,

    /// A tenants file (TOML, see `examples/tenants.toml`): per-tenant
    /// policies, watched and hot-reloaded. Without it every tenant gets
    /// the `--limit` policy.
    #[arg(long, env = "TW_TENANTS", value_name = "FILE")]
    pub tenants: Option<std::path::PathBuf>,

    /// Serve the tenant admin API at `/admin`, guarded by this bearer
    /// token (not empty). Without it there are no admin routes.
    #[arg(
        long,
        env = "TW_ADMIN_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    pub admin_token: Option<String>,

    /// The audit trail (`--audit` and its settings): with `--admin-token`,
    /// `GET /admin/tenants/{tenant}/audit` lists a tenant's records, and
    /// the demo page shows a tenant's last denials.
    #[command(flatten)]
    pub audit: crate::audit_flags::AuditArgs,

    /// The largest quota lease, in units: each node takes up to this many
    /// units of a hot key's window in one store call and admits from them
    /// locally, with the limit still exact across nodes. 0 (the default)
    /// turns leases off.
    #[arg(
        long,
        env = "TW_LEASE",
        default_value = "0",
        value_parser = flags::count,
        allow_negative_numbers = true
    )]
    pub lease: u32,

    /// How long a lease may be spent, from 1ms to 1h, in the quota DSL's
    /// units (`250ms`, `1s`, `2m`, `1h`; a bare number is milliseconds).
    /// Default: a tenth of the shortest window, at most 1s.
    #[arg(
        long,
        env = "TW_LEASE_TTL",
        value_name = "DURATION",
        value_parser = flags::lease_ttl,
        allow_hyphen_values = true
    )]
    pub lease_ttl: Option<Duration>,

    /// With `--lease`: lease only keys checked at least this many times
    /// within one lease TTL; the others go to the store directly (a lease
    /// costs a reservation and a refund, which pay only for a hot key).
    /// `0` or `1`: every key leases from its first check.
    #[arg(
        long,
        env = "TW_LEASE_HOT_AFTER",
        value_name = "CHECKS",
        default_value_t = LeaseConfig::DEFAULT_HOT_CHECKS,
        value_parser = flags::count,
        allow_negative_numbers = true
    )]
    pub lease_hot_after: u32,

    /// The WebSocket flags (`/ws`, `/presence`; see `ws.rs`).
    #[command(flatten)]
    pub ws: WsArgs,

    /// How long each room (`/ws?room=R`) keeps its events for clients that
    /// resume, from 1ms to 30d, in the quota DSL's units (`500ms`, `30s`,
    /// `10m`, `1h`, `7d`).
    #[arg(
        long,
        env = "TW_HISTORY",
        default_value = "10m",
        value_name = "DURATION",
        value_parser = flags::history,
        allow_hyphen_values = true
    )]
    pub history: Duration,

    /// The most events each room keeps for resumes (the newest ones), from
    /// 1 to 10000000.
    #[arg(
        long,
        env = "TW_HISTORY_MAX",
        default_value = "10000",
        value_parser = flags::history_max,
        allow_negative_numbers = true
    )]
    pub history_max: u64,

    /// Also append every room message to this Redis stream (fields `id`,
    /// `room`, `from`, `data`) for `inbound-worker` (with `--redis-url`).
    #[arg(long, env = "TW_INBOUND_STREAM", requires = "redis_url")]
    pub inbound_stream: Option<String>,

    /// How a node reads its rooms' live events on Redis: `push` (Redis
    /// pushes a wake-up per append, then the node reads the room; a single
    /// Redis or a cluster, no command for an idle room) or `tail` (one
    /// blocking `XREAD` over every room the node serves, whose reply holds
    /// the events: one round trip less per event, but each call names
    /// every room; `--redis-url` only).
    #[arg(long, env = "TW_ROOMS_READ", value_enum, default_value_t = RoomsRead::Push)]
    pub rooms_read: RoomsRead,
}

/// `--rooms-read` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum RoomsRead {
    /// Read a room when Redis pushes its wake-up.
    #[default]
    Push,
    /// One blocking `XREAD` over every room (single Redis only).
    Tail,
}

/// How rooms keep their events (`--history`, `--history-max`), in the
/// gateway's store.
#[derive(Clone)]
#[non_exhaustive]
pub struct RoomsConfig {
    /// What each room keeps.
    pub retention: Retention,
    /// Read the rooms' live events with one blocking `XREAD` on a
    /// connection of its own: only on a single Redis (the gateway's store
    /// a `RedisStore` from a URL). Otherwise rooms on Redis (single or
    /// cluster) are read when Redis pushes a wake-up, and rooms on the
    /// embedded store are polled (and woken by local appends).
    pub tail: bool,
    /// `--inbound-stream`: a client of the Redis and the stream name.
    pub inbound: Option<(redis::Client, String)>,
}

impl RoomsConfig {
    /// Rooms keeping `retention`, read live by pushed wake-ups on Redis
    /// (polled on the embedded store).
    pub fn new(retention: Retention) -> Self {
        Self {
            retention,
            tail: false,
            inbound: None,
        }
    }

    /// Rooms keeping `retention`, read live with a blocking `XREAD` on the
    /// gateway's single Redis.
    pub fn tailed(retention: Retention) -> Self {
        Self {
            tail: true,
            ..Self::new(retention)
        }
    }
}

impl Default for RoomsConfig {
    /// The flags' defaults (10 minutes, 10000 events), polled.
    fn default() -> Self {
        let retention = Retention::new(Duration::from_secs(600), 10_000)
            .unwrap_or_else(|_| unreachable!("the default retention is valid"));
        Self::new(retention)
    }
}

impl fmt::Debug for RoomsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RoomsConfig")
            .field("retention", &self.retention)
            .field("tail", &self.tail)
            .field("inbound", &self.inbound.as_ref().map(|(_, stream)| stream))
            .finish_non_exhaustive()
    }
}

/// `--fallback` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum FallbackArg {
    /// Admit every request while Redis cannot decide.
    FailOpen,
    /// Deny every request with `503 Service Unavailable`.
    FailClosed,
    /// A window on this node with `limit / --expected-nodes`; `429` past it.
    #[default]
    Local,
}

impl fmt::Display for FallbackArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::FailOpen => "fail-open",
            Self::FailClosed => "fail-closed",
            Self::Local => "local",
        })
    }
}

/// How a limiter on Redis degrades: its fallback policy. (The time budget
/// of each Redis call, `--redis-timeout-ms`, is the store's:
/// [`GatewayConfig::store`].)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Resilience {
    /// The fallback policy (`--fallback`).
    pub fallback: FallbackArg,
    /// Nodes sharing the store; the `local` share is `1 / expected_nodes`.
    pub expected_nodes: NonZeroU32,
}

impl Default for Resilience {
    /// `local` with one node (the flags' defaults).
    fn default() -> Self {
        Self {
            fallback: FallbackArg::Local,
            expected_nodes: NonZeroU32::MIN,
        }
    }
}

/// `--algorithm` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AlgorithmArg {
    /// Exact sliding log.
    SlidingLog,
    /// Bucketed sliding counter.
    SlidingCounter,
    /// Windows aligned to the epoch.
    FixedWindow,
    /// Generic cell rate algorithm (token bucket).
    Gcra,
}

impl Args {
    /// The policy to enforce per tenant and user: every `--limit`, with
    /// `--algorithm` applied, named `gateway`.
    pub fn policy(&self) -> Result<Policy, ConfigError> {
        let quotas = self
            .limit
            .iter()
            .map(|quota| {
                self.with_algorithm(quota).map_err(|error| {
                    let algorithm = self
                        .algorithm
                        .and_then(|a| a.to_possible_value())
                        .map(|v| v.get_name().to_owned())
                        .unwrap_or_default();
                    ConfigError::new(
                        "--algorithm",
                        algorithm,
                        format!("cannot apply it to --limit {}: {error}", named(quota)),
                        "drop --algorithm and write the algorithm into that --limit, e.g. --limit '10/s gcra(burst=20)'",
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Policy::new("gateway", quotas).map_err(|error| {
            let value = self.limit.iter().map(named).collect::<Vec<_>>().join(", ");
            ConfigError::new(
                "--limit",
                value,
                error.to_string(),
                "give each --limit a name of its own: --limit burst=5/1s --limit sustained=100/1m",
            )
        })
    }

    /// `base` with `--algorithm` applied.
    fn with_algorithm(&self, base: &Quota) -> Result<Quota, QuotaError> {
        let Some(algorithm) = self.algorithm else {
            return Ok(base.clone());
        };
        let mut builder = Quota::builder()
            .name(base.name())
            .limit(base.limit())
            .window(base.window());
        builder = match algorithm {
            AlgorithmArg::SlidingLog => builder.algorithm(Algorithm::SlidingLog),
            AlgorithmArg::SlidingCounter => builder.granularity(default_granularity(base.window())),
            AlgorithmArg::FixedWindow => builder.algorithm(Algorithm::FixedWindow),
            AlgorithmArg::Gcra => {
                let builder = builder.algorithm(Algorithm::Gcra);
                match base.burst() {
                    Some(burst) => builder.burst(burst),
                    None => builder,
                }
            }
        };
        builder.build()
    }

    /// Builds the gateway's configuration, including its one store.
    ///
    /// With `--redis-url` / `--redis-cluster` the store is Redis with a
    /// time budget of `--redis-timeout-ms` per call (retries included) and
    /// the default retries, breakers and in-flight bound, and the limiter
    /// is resilient ([`GatewayConfig::resilience`] is set from
    /// `--fallback` and `--expected-nodes`); the embedded store has none
    /// of them.
    pub fn into_config(self) -> Result<GatewayConfig, ConfigError> {
        let policy = self.policy()?;
        if self
            .admin_token
            .as_deref()
            .is_some_and(|t| t.trim().is_empty())
        {
            return Err(ConfigError::new(
                "--admin-token",
                self.admin_token.clone().unwrap_or_default(),
                "is empty: the admin API would be mounted with no way to use it",
                "give a token, e.g. --admin-token \"$(openssl rand -hex 16)\", or leave the flag (and TW_ADMIN_TOKEN) out to serve no admin API",
            ));
        }
        let timeout = Duration::from_millis(self.redis_timeout_ms);
        let store_name =
            crate::store_probe::describe_store(self.redis_url.as_deref(), &self.redis_cluster);
        if self.rooms_read == RoomsRead::Tail && self.redis_url.is_none() {
            return Err(ConfigError::new(
                "--rooms-read",
                "tail".to_owned(),
                "needs --redis-url: a cluster cannot XREAD rooms of several slots at once, and the embedded store has no XREAD",
                "use --rooms-read push (the default), or a single Redis with --redis-url",
            ));
        }
        let redis = crate::redis_tls::redis_store(
            self.redis_url.as_deref(),
            &self.redis_cluster,
            &crate::redis_tls::TlsFiles {
                ca_file: self.redis_ca_file.clone(),
                client_cert: self.redis_client_cert.clone(),
                client_key: self.redis_client_key.clone(),
            },
        )?;
        let tenants = match &self.tenants {
            Some(path) => Some(super::tenants::TenantsFile::load(path)?),
            None => None,
        };
        // `--history` and `--history-max` were checked against these bounds
        // when parsed; a hand-built `Args` may still be out of them.
        let retention = Retention::new(self.history, self.history_max).map_err(|error| {
            ConfigError::new(
                "--history/--history-max",
                format!(
                    "{} / {}",
                    flags::format_duration(self.history),
                    self.history_max
                ),
                error.to_string(),
                "keep --history from 1ms to 30d and --history-max from 1 to 10000000",
            )
        })?;
        let ws = self.ws.clone().into_config();
        // One store: every capability (the limiter, the connection cap,
        // message limits, dedup, rooms, the demo's peeks) is made from it,
        // so one time budget and one set of breakers bound every call.
        let (store, resilience, mut rooms) = match redis {
            Some(redis) => {
                let store = Store::builder(redis).timeout(timeout).build();
                let resilience = Resilience {
                    fallback: self.fallback,
                    expected_nodes: self.expected_nodes,
                };
                // Rooms are read when Redis pushes a wake-up (sharded
                // pub/sub published by the append), on a single Redis and a
                // cluster alike: no command for an idle room. On a single
                // Redis, `--rooms-read tail` reads them with one blocking
                // XREAD instead.
                let rooms = match self.rooms_read {
                    RoomsRead::Push => RoomsConfig::new(retention),
                    RoomsRead::Tail => RoomsConfig::tailed(retention),
                };
                (store, Some(resilience), rooms)
            }
            None => {
                let memory = match self.audit.settings() {
                    // The embedded store's bound is over all tenants.
                    Some(audit) => audit.memory_store(),
                    None => MemoryStore::new(),
                };
                (Store::from(memory), None, RoomsConfig::new(retention))
            }
        };
        // The audit trail in the same store, handed every decision of the
        // gateway's limiter.
        let audit = self.audit.settings().map(|audit| audit.log(store.clone()));
        ws.validate().map_err(|problem| {
            ConfigError::new(
                "--connection-seat-ttl/--dedup-window",
                format!(
                    "{} / {}",
                    flags::format_duration(ws.connection_seat_ttl),
                    flags::format_duration(ws.dedup_window)
                ),
                problem,
                "keep --connection-seat-ttl from 30ms to 1h and --dedup-window from 1ms to 7d",
            )
        })?;
        let leases = (self.lease > 0).then(|| {
            let config = LeaseConfig::new(self.lease).hot_after(self.lease_hot_after);
            match self.lease_ttl {
                Some(ttl) => config.ttl(ttl),
                None => config,
            }
        });
        if let Some(leases) = &leases {
            if leases.validate(&policy).is_err() {
                return Err(lease_error(self.lease, self.lease_ttl, leases, &policy));
            }
        }
        if let (Some(url), Some(stream)) = (&self.redis_url, &self.inbound_stream) {
            if stream.trim().is_empty() {
                return Err(ConfigError::new(
                    "--inbound-stream",
                    stream.clone(),
                    "is empty: expected the name of a Redis stream",
                    "name the stream inbound-worker reads, e.g. --inbound-stream tw:inbound",
                ));
            }
            let client = crate::redis_client::no_delay_client(url)
                .map_err(|e| redis_url_error("--redis-url", url, &e))?;
            rooms.inbound = Some((client, stream.clone()));
        }
        Ok(GatewayConfig {
            policy,
            store,
            store_name,
            require_store: self.require_store,
            tenant_header: self.tenant_header,
            user_header: self.user_header,
            resilience,
            debug_headers: self.debug_headers,
            tenants,
            admin_token: self.admin_token,
            leases,
            audit,
            rooms,
            ws,
        })
    }
}

/// Everything [`build_app`](super::build_app) needs.
#[derive(Clone)]
#[non_exhaustive]
pub struct GatewayConfig {
    /// The policy (one or more quotas) per tenant and user.
    pub policy: Policy,
    /// The one store every capability is made from (windows, quota leases,
    /// connection seats, dedup ids, rooms' events): the embedded store, or
    /// Redis with `--redis-url` / `--redis-cluster` (and then the tenant
    /// registry's control channel too).
    pub store: Store,
    /// The store as logs and `GET /readyz` name it: `embedded`, or its
    /// URL(s) without password.
    pub store_name: String,
    /// Refuse to start when the store cannot be reached
    /// (`--require-store`).
    pub require_store: bool,
    /// Header naming the tenant (default tenant: `public`).
    pub tenant_header: HeaderName,
    /// Header naming the user (required).
    pub user_header: HeaderName,
    /// `Some` for a store that can fail (Redis): the limiter gets a local
    /// tier of recent denials and a fallback policy (the store has the
    /// time budget and the breakers). `None`: a bare limiter (the embedded
    /// store).
    pub resilience: Option<Resilience>,
    /// Add the `x-ratelimit-source` header (`--debug-headers`).
    pub debug_headers: bool,
    /// The tenants file (`--tenants`), watched and hot-reloaded.
    pub tenants: Option<super::tenants::TenantsFile>,
    /// The admin API's bearer token (`--admin-token`); `None`: no admin routes.
    pub admin_token: Option<String>,
    /// Quota leases (`--lease`, `--lease-ttl`); `None`: off.
    pub leases: Option<LeaseConfig>,
    /// The audit trail every decision of the limiter is handed to
    /// (`--audit` and its flags), on [`store`](Self::store); `None`: off.
    pub audit: Option<AuditLog>,
    /// Where `/ws?room=R` keeps its events (`--history`, `--history-max`).
    pub rooms: RoomsConfig,
    /// `/ws` and `/presence`: connection cap, message limits, dedup.
    pub ws: WsConfig,
}

impl GatewayConfig {
    /// `policy` (or one quota) on a fresh embedded store, with the default
    /// headers.
    pub fn new(policy: impl Into<Policy>) -> Self {
        Self::with_store(policy, MemoryStore::new())
    }

    /// `policy` (or one quota) on `store` (a [`Store`], or a backend made
    /// into one with its defaults), which also keeps the WebSocket
    /// connection seats, dedup ids and rooms, with the default headers.
    pub fn with_store(policy: impl Into<Policy>, store: impl Into<Store>) -> Self {
        let store = store.into();
        Self {
            policy: policy.into(),
            store_name: if store.is_in_process() {
                "embedded"
            } else {
                "redis"
            }
            .to_owned(),
            store,
            require_store: false,
            tenant_header: HeaderName::from_static("x-tenant-id"),
            user_header: HeaderName::from_static("x-user-id"),
            resilience: None,
            debug_headers: false,
            tenants: None,
            admin_token: None,
            leases: None,
            audit: None,
            rooms: RoomsConfig::default(),
            ws: WsConfig::new(),
        }
    }

    /// Leases quota (see [`LimiterBuilder::leases`](tower_window::LimiterBuilder::leases)).
    pub fn leases(mut self, leases: LeaseConfig) -> Self {
        self.leases = Some(leases);
        self
    }

    /// Hands every decision of the limiter to `log` (see
    /// [`audit`](Self::audit)).
    pub fn audit(mut self, log: AuditLog) -> Self {
        self.audit = Some(log);
        self
    }

    /// Where rooms keep their events.
    pub fn rooms(mut self, rooms: RoomsConfig) -> Self {
        self.rooms = rooms;
        self
    }

    /// Makes the limiter resilient (see [`resilience`](Self::resilience)).
    pub fn resilience(mut self, resilience: Resilience) -> Self {
        self.resilience = Some(resilience);
        self
    }

    /// Adds (or not) the `x-ratelimit-source` header.
    pub fn debug_headers(mut self, enabled: bool) -> Self {
        self.debug_headers = enabled;
        self
    }

    /// The limiter for this configuration, on [`store`](Self::store): bare
    /// (no local tier, no fallback) without
    /// [`resilience`](Self::resilience) (with quota leases, the default
    /// local tier); with it, built by [`Limiter::builder`] with the default
    /// local tier and the fallback policy. With [`audit`](Self::audit), it
    /// hands every decision to that log.
    pub fn limiter(&self) -> Limiter {
        let mut builder = Limiter::builder(self.store.clone(), self.policy.clone());
        if let Some(audit) = &self.audit {
            builder = builder.audit(audit.clone());
        }
        let Some(resilience) = self.resilience else {
            let Some(leases) = self.leases else {
                // What `Limiter::new` builds.
                return builder.local_capacity(0).build();
            };
            return builder.leases(leases).build();
        };
        if let Some(leases) = self.leases {
            builder = builder.leases(leases);
        }
        match resilience.fallback {
            FallbackArg::FailOpen => builder.fallback(FailOpen),
            FallbackArg::FailClosed => builder.fallback(FailClosed::new()),
            FallbackArg::Local => {
                builder.fallback(LocalWindow::per_node(resilience.expected_nodes))
            }
        }
        .build()
    }

    /// The status of a degraded denial: `503` for `fail-closed`, `429` for
    /// the `local` window (past its share the node is rate limiting).
    pub fn degraded_status(&self) -> StatusCode {
        match self.resilience.map(|r| r.fallback) {
            Some(FallbackArg::Local) => StatusCode::TOO_MANY_REQUESTS,
            _ => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

impl fmt::Debug for GatewayConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GatewayConfig")
            .field("policy", &self.policy)
            .field("store", &self.store_name)
            .field("require_store", &self.require_store)
            .field("tenant_header", &self.tenant_header)
            .field("user_header", &self.user_header)
            .field("resilience", &self.resilience)
            .field("debug_headers", &self.debug_headers)
            .field("leases", &self.leases)
            .field("audit", &self.audit)
            .field("ws", &self.ws)
            .finish_non_exhaustive()
    }
}

/// Why the flags do not make a configuration: which flag, its value,
/// what is wrong with it (and what it expects), and how to fix it.
///
/// `Display` writes one message, a line per part: the flag and its value
/// with the problem first, then any further lines of the problem (a TOML
/// parse error points at the line and column), then the fix:
///
/// ```text
/// --redis-url localhost:6500: not a Redis URL: expected redis://host:port[/db] (rediss:// for TLS, redis+unix:///path for a socket)
///   fix: write --redis-url redis://localhost:6500
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConfigError {
    /// The flag at fault (`--redis-url`), or the flags that conflict
    /// (`--lease/--lease-ttl`).
    pub flag: &'static str,
    /// Its value as given (or the default in force).
    pub value: String,
    /// What is wrong, and what the flag expects; may span several lines.
    pub problem: String,
    /// How to fix it.
    pub fix: String,
}

impl ConfigError {
    pub(crate) fn new(
        flag: &'static str,
        value: impl Into<String>,
        problem: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self {
            flag,
            value: value.into(),
            problem: problem.into(),
            fix: fix.into(),
        }
    }
}

/// A value as a shell would need it written: bare when it is plain, else
/// in single quotes (`''` for an empty one).
pub(super) fn shell_quote(value: &str) -> String {
    let plain = !value.is_empty()
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.,:/=@+%[]".contains(&b));
    if plain {
        value.to_owned()
    } else {
        format!("'{}'", value.replace('\'', r"'\''"))
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut lines = self.problem.lines();
        let first = lines.next().unwrap_or_default();
        write!(f, "{} {}: {first}", self.flag, shell_quote(&self.value))?;
        for line in lines {
            write!(f, "\n  {line}")?;
        }
        if !self.fix.is_empty() {
            write!(f, "\n  fix: {}", self.fix)?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

/// A `--limit` as written: `NAME=DSL`.
fn named(quota: &Quota) -> String {
    format!("{}={quota}", quota.name())
}

const REDIS_URL_FORM: &str =
    "expected redis://host:port[/db] (rediss:// for TLS, redis+unix:///path for a socket)";

/// Refuses a Redis URL the client cannot parse, naming it (one of a
/// cluster's URLs, say) and the likely fix.
pub(crate) fn check_redis_url(flag: &'static str, url: &str) -> Result<(), ConfigError> {
    use tower_window::store::redis::redis::IntoConnectionInfo;
    match url.into_connection_info() {
        Ok(_) => Ok(()),
        Err(error) => Err(redis_url_error(flag, url, &error)),
    }
}

pub(crate) fn redis_url_error(
    flag: &'static str,
    url: &str,
    error: &dyn std::error::Error,
) -> ConfigError {
    let url = url.trim();
    let fix = match url.split_once("://") {
        _ if url.is_empty() => format!("give a URL, e.g. {flag} redis://127.0.0.1:6379"),
        None => format!("write {flag} redis://{url}"),
        Some((scheme, rest)) if !scheme.starts_with("redis") && scheme != "unix" => {
            format!("write {flag} redis://{rest}")
        }
        Some(_) => format!(
            "write it as redis://host:port[/db] (the db a number), e.g. {flag} redis://127.0.0.1:6379/0"
        ),
    };
    ConfigError::new(
        flag,
        url,
        format!("not a Redis URL: {REDIS_URL_FORM}\n(the Redis client says: {error})"),
        fix,
    )
}

/// Why `--lease`/`--lease-ttl` cannot lease under `policy`: a GCRA quota
/// dates leased tokens at the deadline, so a lease's TTL must be at most
/// `(burst - 1)` emission intervals (see `LeaseConfig::validate`); the
/// message names the quota and the largest TTL that fits.
fn lease_error(
    units: u32,
    given: Option<Duration>,
    leases: &LeaseConfig,
    policy: &Policy,
) -> ConfigError {
    let ttl = leases.ttl_for(policy);
    let ttl_text = match given {
        Some(ttl) => flags::format_duration(ttl),
        None => format!(
            "{} (the default: a tenth of the shortest window, at most 1s)",
            flags::format_duration(ttl)
        ),
    };
    let tight = policy
        .quotas()
        .iter()
        .filter(|q| q.algorithm() == Algorithm::Gcra)
        .map(|q| {
            let interval = q.emission_interval_micros().max(1);
            let max = u64::from(q.capacity().saturating_sub(1)).saturating_mul(interval);
            (q, Duration::from_micros(max))
        })
        .min_by_key(|(_, max)| *max);
    let Some((quota, max)) = tight else {
        return ConfigError::new(
            "--lease/--lease-ttl",
            format!("{units} / {ttl_text}"),
            "no lease fits the policy",
            "lower --lease-ttl, or drop --lease",
        );
    };
    let what = format!(
        "a lease of {ttl_text} leaves no room in quota {:?} ({quota}): a GCRA quota takes leased tokens at the lease's deadline, so a lease may last at most (burst - 1) x window / limit",
        quota.name()
    );
    // Lease TTLs are whole milliseconds: round the bound down.
    let max = Duration::from_millis(u64::try_from(max.as_millis()).unwrap_or(u64::MAX));
    let (flag, value) = match given {
        Some(ttl) => ("--lease-ttl", flags::format_duration(ttl)),
        None => ("--lease", units.to_string()),
    };
    if max.is_zero() {
        ConfigError::new(
            flag,
            value,
            format!(
                "{what}; with a burst of {} that is 0: no lease can ever be granted",
                quota.capacity()
            ),
            format!(
                "give the quota a burst of at least 2 (e.g. --limit '{}={} gcra(burst=2)'), or drop --lease",
                quota.name(),
                format_rate(quota)
            ),
        )
    } else {
        let max = flags::format_duration(max);
        ConfigError::new(
            flag,
            value,
            format!("{what}, here {max}"),
            format!("lower --lease-ttl to at most {max} (e.g. --lease-ttl {max}), or give the quota a larger burst"),
        )
    }
}

/// `<limit>/<window>` of `quota`.
fn format_rate(quota: &Quota) -> String {
    format!(
        "{}/{}",
        quota.limit(),
        flags::format_duration(quota.window())
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn args(extra: &[&str]) -> Args {
        let mut argv = vec!["gateway"];
        argv.extend_from_slice(extra);
        Args::try_parse_from(argv).unwrap()
    }

    #[test]
    fn defaults() {
        let args = args(&[]);
        assert_eq!(args.listen, "127.0.0.1:3000".parse().unwrap());
        assert_eq!(
            args.policy().unwrap(),
            Policy::new("gateway", ["100/1m".parse().unwrap()]).unwrap()
        );
        assert_eq!(args.tenant_header, "x-tenant-id");
        assert_eq!(args.user_header, "x-user-id");
    }

    fn quota(extra: &[&str]) -> Quota {
        args(extra).policy().unwrap().first().clone()
    }

    #[test]
    fn several_named_limits_make_one_policy() {
        let policy = args(&["--limit", "burst=5/1s", "--limit", "sustained = 100/1m"])
            .policy()
            .unwrap();
        let names: Vec<&str> = policy.quotas().iter().map(|q| q.name()).collect();
        assert_eq!(names, ["burst", "sustained"]);
        assert_eq!(policy.quotas()[1].limit(), 100);
        // `=` inside the algorithm's argument is not a name.
        let gcra = quota(&["--limit", "10/s gcra(burst=20)"]);
        assert_eq!((gcra.name(), gcra.capacity()), ("default", 20));
        let named = quota(&["--limit", "api=10/s gcra(burst=20)"]);
        assert_eq!((named.name(), named.capacity()), ("api", 20));
        // The algorithm flag applies to every quota.
        let policy = args(&[
            "--limit",
            "a=5/1s",
            "--limit",
            "b=9/1m",
            "--algorithm",
            "gcra",
        ])
        .policy()
        .unwrap();
        assert!(policy
            .quotas()
            .iter()
            .all(|q| q.algorithm() == Algorithm::Gcra));
        // Two quotas of one name are refused with the name.
        let err = args(&["--limit", "a=5/1s", "--limit", "a=9/1m"])
            .into_config()
            .unwrap_err();
        assert!(err.to_string().contains("\"a\""), "{err}");
        for bad in ["bad name=5/1s", "=5/1s", "x=0/1s"] {
            assert!(
                Args::try_parse_from(["gateway", "--limit", bad]).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn algorithm_keeps_the_numbers() {
        let q = quota(&["--limit", "10/1m", "--algorithm", "gcra"]);
        assert_eq!(q.algorithm(), Algorithm::Gcra);
        assert_eq!((q.limit(), q.window_micros()), (10, 60_000_000));
        let q = quota(&["--limit", "10/1m", "--algorithm", "sliding-counter"]);
        assert_eq!(
            q.algorithm(),
            Algorithm::SlidingCounter {
                granularity: std::time::Duration::from_secs(1)
            }
        );
        let q = quota(&["--limit", "10/1m", "--algorithm", "fixed-window"]);
        assert_eq!(q.algorithm(), Algorithm::FixedWindow);
        let q = quota(&["--limit", "10/s gcra(burst=20)", "--algorithm", "gcra"]);
        assert_eq!(q.capacity(), 20);
    }

    #[test]
    fn fallback_flags() {
        let a = args(&[]);
        assert_eq!(a.fallback, FallbackArg::Local);
        assert_eq!(a.expected_nodes.get(), 1);
        assert_eq!(a.redis_timeout_ms, 50);
        assert!(!a.debug_headers);
        for (flag, expected) in [
            ("fail-open", FallbackArg::FailOpen),
            ("fail-closed", FallbackArg::FailClosed),
            ("local", FallbackArg::Local),
        ] {
            assert_eq!(args(&["--fallback", flag]).fallback, expected);
            assert_eq!(expected.to_string(), flag);
        }
        let a = args(&[
            "--expected-nodes",
            "4",
            "--redis-timeout-ms",
            "20",
            "--debug-headers",
        ]);
        assert_eq!(a.expected_nodes.get(), 4);
        assert_eq!(a.redis_timeout_ms, 20);
        assert!(a.debug_headers);
        for bad in [
            &["--fallback", "fail-sometimes"][..],
            &["--expected-nodes", "0"],
            &["--redis-timeout-ms", "0"],
            &["--redis-timeout-ms", "-5"],
        ] {
            let mut argv = vec!["gateway"];
            argv.extend_from_slice(bad);
            assert!(Args::try_parse_from(argv).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn resilience_only_with_redis() {
        let config = args(&["--fallback", "fail-closed", "--debug-headers"])
            .into_config()
            .unwrap();
        assert_eq!(config.resilience, None);
        assert!(config.debug_headers);
        let config = args(&[
            "--redis-url",
            "redis://127.0.0.1:1",
            "--fallback",
            "fail-closed",
            "--expected-nodes",
            "3",
            "--redis-timeout-ms",
            "20",
        ])
        .into_config()
        .unwrap();
        assert_eq!(
            config.resilience,
            Some(Resilience {
                fallback: FallbackArg::FailClosed,
                expected_nodes: NonZeroU32::new(3).unwrap(),
            })
        );
        assert_eq!(config.store.timeout(), Some(Duration::from_millis(20)));
        assert_eq!(config.degraded_status(), 503);
        let limiter = config.limiter();
        assert!(limiter.breaker_state().is_some());
    }

    #[test]
    fn lease_flags() {
        let off = args(&[]).into_config().unwrap();
        assert!(off.leases.is_none());
        let on = args(&["--lease", "100"]).into_config().unwrap();
        let leases = on.leases.unwrap();
        assert_eq!(leases.max_units(), 100);
        assert_eq!(leases.hot_checks(), LeaseConfig::DEFAULT_HOT_CHECKS);
        let every = args(&["--lease", "100", "--lease-hot-after", "1"])
            .into_config()
            .unwrap();
        assert_eq!(every.leases.unwrap().hot_checks(), 1);
        for bad in ["-1", "x", "4294967296"] {
            assert!(
                Args::try_parse_from(["gateway", "--lease-hot-after", bad]).is_err(),
                "{bad}"
            );
        }
        assert_eq!(leases.ttl_for(&on.policy), Duration::from_secs(1));
        let ttl = args(&["--lease", "8", "--lease-ttl", "250ms"])
            .into_config()
            .unwrap();
        assert_eq!(
            ttl.leases.unwrap().ttl_for(&ttl.policy),
            Duration::from_millis(250)
        );
        assert_eq!(
            args(&["--lease-ttl", "2s"]).lease_ttl,
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            args(&["--lease-ttl", "40"]).lease_ttl,
            Some(Duration::from_millis(40))
        );
        // At most 1h, as documented (`1h` itself was refused when the
        // parser knew no `h`).
        assert_eq!(
            args(&["--lease-ttl", "1h"]).lease_ttl,
            Some(Duration::from_secs(3600))
        );
        for bad in ["0", "61m", "x", "-1s", "2d"] {
            assert!(
                Args::try_parse_from(["gateway", "--lease-ttl", bad]).is_err(),
                "{bad}"
            );
        }
        assert!(Args::try_parse_from(["gateway", "--lease", "-1"]).is_err());
        // A GCRA quota too small for the TTL is refused, not approximated.
        let error = args(&[
            "--limit",
            "5/1s",
            "--algorithm",
            "gcra",
            "--lease",
            "4",
            "--lease-ttl",
            "900ms",
        ])
        .into_config()
        .unwrap_err();
        assert_eq!(error.flag, "--lease-ttl", "{error}");
        assert!(error.fix.contains("at most 800ms"), "{error}");
    }

    #[test]
    fn audit_flags() {
        let off = args(&[]);
        assert!(off.audit.settings().is_none());
        let config = off.into_config().unwrap();
        assert!(config.audit.is_none());
        assert!(config.limiter().audit().is_none());

        let on = args(&[
            "--audit",
            "--audit-sample-admissions",
            "10",
            "--audit-buffer",
            "500",
            "--audit-max-len",
            "2000",
            "--audit-max-age",
            "3600",
        ]);
        let settings = on.audit.settings().unwrap();
        assert_eq!(
            (settings.capacity, settings.max_len, settings.max_age),
            (500, 2000, Duration::from_secs(3600))
        );
        let config = on.into_config().unwrap();
        let log = config.audit.clone().unwrap();
        assert_eq!(log.rules("acme").admission_sample, 10);
        assert!(log.rules("acme").denials);
        // The limiter hands its decisions to the configured log, on Redis
        // too (with its fallback).
        assert_eq!(config.limiter().audit().unwrap().node(), log.node());
        let redis = args(&["--audit", "--redis-url", "redis://127.0.0.1:1"])
            .into_config()
            .unwrap();
        assert!(redis.limiter().audit().is_some());
        // The flags' bounds: `audit_flags`'s tests.
    }

    #[test]
    fn rejects_bad_input() {
        let argv = ["gateway", "--limit", "0/1m"];
        assert!(Args::try_parse_from(argv).is_err());
        let argv = ["gateway", "--algorithm", "leaky-bucket"];
        assert!(Args::try_parse_from(argv).is_err());
    }
}
