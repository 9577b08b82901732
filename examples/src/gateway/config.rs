//! Command-line flags and the configuration built from them.

use std::fmt;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderName, StatusCode};
use clap::{Parser, ValueEnum};
use tower_window::conn::ConnectionStore;
use tower_window::dedup::DedupStore;
use tower_window::events::{EventStore, InvalidRetention, Retention};
use tower_window::fallback::{FailClosed, FailOpen, LocalWindow};
use tower_window::quota::default_granularity;
use tower_window::store::redis::redis;
use tower_window::{
    Algorithm, LeaseConfig, Limiter, MemoryStore, Policy, PolicyError, Quota, QuotaError,
    RedisConfigError, RedisStore, Store,
};

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
    /// Address to listen on.
    #[arg(long, env = "TW_LISTEN", default_value = "127.0.0.1:3000")]
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
        value_parser = parse_named_quota
    )]
    pub limit: Vec<Quota>,

    /// Counting algorithm; overrides the one written in every `--limit` and
    /// keeps its numbers. `sliding-counter` picks a granularity of at most
    /// 60 buckets per window.
    #[arg(long, env = "TW_ALGORITHM", value_enum)]
    pub algorithm: Option<AlgorithmArg>,

    /// Header naming the tenant; requests without it are in tenant `public`.
    #[arg(long, env = "TW_TENANT_HEADER", default_value = "x-tenant-id")]
    pub tenant_header: HeaderName,

    /// Header naming the user; requests without it are rejected with 400.
    #[arg(long, env = "TW_USER_HEADER", default_value = "x-user-id")]
    pub user_header: HeaderName,

    /// Redis URL (`redis://host:port/db`): every gateway using the same Redis
    /// shares the same windows. Without it the embedded store is used.
    #[arg(long, env = "TW_REDIS_URL", conflicts_with = "redis_cluster")]
    pub redis_url: Option<String>,

    /// Redis Cluster seed node URLs, comma-separated
    /// (`redis://10.0.0.1:7000,redis://10.0.0.2:7000`).
    #[arg(long, env = "TW_REDIS_CLUSTER", value_delimiter = ',')]
    pub redis_cluster: Vec<String>,

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
    #[arg(long, env = "TW_EXPECTED_NODES", default_value = "1")]
    pub expected_nodes: NonZeroU32,

    /// Time budget of one rate-limit decision against Redis, retries
    /// included, in milliseconds; past it the fallback answers.
    #[arg(
        long,
        env = "TW_REDIS_TIMEOUT_MS",
        default_value = "50",
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub redis_timeout_ms: u64,

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
    /// token. Without it there are no admin routes.
    #[arg(
        long,
        env = "TW_ADMIN_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    pub admin_token: Option<String>,

    /// The largest quota lease, in units: each node takes up to this many
    /// units of a hot key's window in one store call and admits from them
    /// locally, with the limit still exact across nodes. 0 (the default)
    /// turns leases off.
    #[arg(long, env = "TW_LEASE", default_value = "0")]
    pub lease: u32,

    /// How long a lease may be spent (`250ms`, `1s`; a bare number is
    /// milliseconds). Default: a tenth of the shortest window, at most 1 s.
    #[arg(long, env = "TW_LEASE_TTL", value_parser = parse_lease_ttl)]
    pub lease_ttl: Option<Duration>,

    /// The WebSocket flags (`/ws`, `/presence`; see `ws.rs`).
    #[command(flatten)]
    pub ws: WsArgs,

    /// How long each room (`/ws?room=R`) keeps its events for clients that
    /// resume: `500ms`, `30s`, `10m`, `1h`.
    #[arg(long, env = "TW_HISTORY", default_value = "10m", value_parser = parse_duration)]
    pub history: Duration,

    /// The most events each room keeps for resumes (the newest ones).
    #[arg(long, env = "TW_HISTORY_MAX", default_value = "10000")]
    pub history_max: u64,

    /// Also append every room message to this Redis stream (fields `id`,
    /// `room`, `from`, `data`) for `inbound-worker` (with `--redis-url`).
    #[arg(long, env = "TW_INBOUND_STREAM", requires = "redis_url")]
    pub inbound_stream: Option<String>,
}

/// Parses `--history`: a whole number and `ms`, `s`, `m` or `h`.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{text:?}: a number and a unit (ms, s, m, h)"))?;
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?}: a whole number first"))?;
    let millis = match unit {
        "ms" => Some(number),
        "s" => number.checked_mul(1_000),
        "m" => number.checked_mul(60_000),
        "h" => number.checked_mul(3_600_000),
        _ => return Err(format!("{text:?}: the unit is ms, s, m or h")),
    };
    millis
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{text:?}: too long"))
}

/// Where rooms keep their events (`--history`, `--history-max`).
#[derive(Clone)]
#[non_exhaustive]
pub struct RoomsConfig {
    /// What each room keeps.
    pub retention: Retention,
    /// The event store (the limiter's store, when it is Redis).
    pub store: Arc<dyn EventStore>,
    /// The Redis store, for the live reader's own blocking `XREAD`
    /// connection (single node only; otherwise rooms are polled).
    pub redis: Option<Arc<RedisStore>>,
    /// `--inbound-stream`: a client of the Redis and the stream name.
    pub inbound: Option<(redis::Client, String)>,
}

impl RoomsConfig {
    /// Rooms in `store`, keeping `retention`; polled for live events.
    pub fn new(retention: Retention, store: Arc<dyn EventStore>) -> Self {
        Self {
            retention,
            store,
            redis: None,
            inbound: None,
        }
    }

    /// Rooms on `redis`, read live with a blocking `XREAD`.
    pub fn redis(retention: Retention, redis: Arc<RedisStore>) -> Self {
        Self {
            retention,
            store: redis.clone(),
            redis: Some(redis),
            inbound: None,
        }
    }
}

impl Default for RoomsConfig {
    /// The flags' defaults (10 minutes, 10000 events) in an embedded store.
    fn default() -> Self {
        let retention = Retention::new(Duration::from_secs(600), 10_000)
            .unwrap_or_else(|_| unreachable!("the default retention is valid"));
        Self::new(retention, Arc::new(MemoryStore::new()))
    }
}

impl fmt::Debug for RoomsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RoomsConfig")
            .field("retention", &self.retention)
            .field("redis", &self.redis.is_some())
            .field("inbound", &self.inbound.as_ref().map(|(_, stream)| stream))
            .finish_non_exhaustive()
    }
}

/// `--lease-ttl`: `<n>ms`, `<n>s`, `<n>m`, or `<n>` milliseconds; above zero.
fn parse_lease_ttl(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (digits, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => text.split_at(i),
        None => (text, "ms"),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 250ms or 1s"))?;
    let ttl = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        _ => return Err(format!("{text:?}: the unit must be ms, s or m")),
    };
    if ttl.is_zero() || ttl > Duration::from_secs(3600) {
        return Err(format!("{text:?}: a lease TTL is above 0 and at most 1h"));
    }
    Ok(ttl)
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

/// How a limiter on Redis degrades: its fallback policy and time budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Resilience {
    /// The fallback policy (`--fallback`).
    pub fallback: FallbackArg,
    /// Nodes sharing the store; the `local` share is `1 / expected_nodes`.
    pub expected_nodes: NonZeroU32,
    /// The time budget of one decision (`--redis-timeout-ms`).
    pub timeout: Duration,
}

impl Default for Resilience {
    /// `local` with one node and a 50 ms budget (the flags' defaults).
    fn default() -> Self {
        Self {
            fallback: FallbackArg::Local,
            expected_nodes: NonZeroU32::MIN,
            timeout: Duration::from_millis(50),
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

/// Parses `--limit`: `NAME=DSL` or `DSL` (the quota is then named `default`).
fn parse_named_quota(text: &str) -> Result<Quota, QuotaError> {
    match text.split_once('=') {
        // `gcra(burst=20)` has a `=` too, but after a `(`.
        Some((name, dsl)) if !name.contains('(') => dsl.trim().parse::<Quota>()?.named(name.trim()),
        _ => text.parse(),
    }
}

impl Args {
    /// The policy to enforce per tenant and user: every `--limit`, with
    /// `--algorithm` applied, named `gateway`.
    pub fn policy(&self) -> Result<Policy, ConfigError> {
        let quotas = self
            .limit
            .iter()
            .map(|quota| self.with_algorithm(quota))
            .collect::<Result<Vec<_>, _>>()
            .map_err(ConfigError::Quota)?;
        Policy::new("gateway", quotas).map_err(ConfigError::Policy)
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

    /// Builds the gateway's configuration, including its store.
    ///
    /// With `--redis-url` / `--redis-cluster` the limiter is resilient
    /// ([`GatewayConfig::resilience`] is set from `--fallback`,
    /// `--expected-nodes` and `--redis-timeout-ms`); the embedded store is
    /// used bare.
    pub fn into_config(self) -> Result<GatewayConfig, ConfigError> {
        let policy = self.policy()?;
        let timeout = Duration::from_millis(self.redis_timeout_ms);
        let redis = if let Some(url) = &self.redis_url {
            Some(RedisStore::from_url(url).map_err(ConfigError::Store)?)
        } else if !self.redis_cluster.is_empty() {
            Some(RedisStore::cluster(&self.redis_cluster).map_err(ConfigError::Store)?)
        } else {
            None
        };
        let redis = redis.map(Arc::new);
        let tenants = match &self.tenants {
            Some(path) => {
                Some(super::tenants::TenantsFile::load(path).map_err(ConfigError::Tenants)?)
            }
            None => None,
        };
        let retention =
            Retention::new(self.history, self.history_max).map_err(ConfigError::History)?;
        let cluster = !self.redis_cluster.is_empty();
        let ws_args = self.ws.clone();
        let (store, resilience, ws, mut rooms): (Arc<dyn Store>, _, _, _) = match redis.clone() {
            // The limiter's one time budget bounds every Redis call.
            Some(redis) => {
                // A cluster cannot XREAD keys of several slots at once: its
                // rooms are polled.
                let rooms = if cluster {
                    RoomsConfig::new(retention, redis.clone())
                } else {
                    RoomsConfig::redis(retention, redis.clone())
                };
                (
                    redis.clone(),
                    Some(Resilience {
                        fallback: self.fallback,
                        expected_nodes: self.expected_nodes,
                        timeout,
                    }),
                    ws_args.into_config(redis),
                    rooms,
                )
            }
            None => {
                let memory = Arc::new(MemoryStore::new());
                let rooms = RoomsConfig::new(retention, memory.clone());
                (memory.clone(), None, ws_args.into_config(memory), rooms)
            }
        };
        ws.validate().map_err(ConfigError::Ws)?;
        let leases = (self.lease > 0).then(|| {
            let config = LeaseConfig::new(self.lease);
            match self.lease_ttl {
                Some(ttl) => config.ttl(ttl),
                None => config,
            }
        });
        if let Some(leases) = &leases {
            leases.validate(&policy).map_err(ConfigError::Lease)?;
        }
        if let (Some(url), Some(stream)) = (&self.redis_url, &self.inbound_stream) {
            let client = redis::Client::open(url.as_str())
                .map_err(|e| ConfigError::Store(RedisConfigError::InvalidUrl(e)))?;
            rooms.inbound = Some((client, stream.clone()));
        }
        Ok(GatewayConfig {
            policy,
            store,
            tenant_header: self.tenant_header,
            user_header: self.user_header,
            resilience,
            debug_headers: self.debug_headers,
            redis,
            tenants,
            admin_token: self.admin_token.filter(|t| !t.is_empty()),
            leases,
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
    /// Where windows live: the embedded store, or Redis with `--redis-url`
    /// / `--redis-cluster`.
    pub store: Arc<dyn Store>,
    /// Header naming the tenant (default tenant: `public`).
    pub tenant_header: HeaderName,
    /// Header naming the user (required).
    pub user_header: HeaderName,
    /// `Some` for a store that can fail (Redis): the limiter gets a local
    /// tier of recent denials, the default circuit breaker, a time budget and
    /// a fallback policy. `None`: a bare limiter (the embedded store).
    pub resilience: Option<Resilience>,
    /// Add the `x-ratelimit-source` header (`--debug-headers`).
    pub debug_headers: bool,
    /// The Redis store when there is one (the tenant registry's control
    /// channel lives there too).
    pub redis: Option<Arc<RedisStore>>,
    /// The tenants file (`--tenants`), watched and hot-reloaded.
    pub tenants: Option<super::tenants::TenantsFile>,
    /// The admin API's bearer token (`--admin-token`); `None`: no admin routes.
    pub admin_token: Option<String>,
    /// Quota leases (`--lease`, `--lease-ttl`); `None`: off.
    pub leases: Option<LeaseConfig>,
    /// Where `/ws?room=R` keeps its events (`--history`, `--history-max`).
    pub rooms: RoomsConfig,
    /// `/ws` and `/presence`: connection cap, message limits, dedup.
    pub ws: WsConfig,
}

impl GatewayConfig {
    /// `policy` (or one quota) on a fresh embedded store, with the default
    /// headers.
    pub fn new(policy: impl Into<Policy>) -> Self {
        Self::with_shared_store(policy, Arc::new(MemoryStore::new()))
    }

    /// `policy` on `store`, which also keeps the WebSocket connection
    /// leases and dedup ids, with the default headers.
    pub fn with_shared_store<S>(policy: impl Into<Policy>, store: Arc<S>) -> Self
    where
        S: Store + ConnectionStore + DedupStore,
    {
        let ws = WsConfig::new(store.clone());
        Self {
            ws,
            ..Self::with_store(policy, store)
        }
    }

    /// `policy` (or one quota) on `store`, with the default headers. The
    /// WebSocket leases and dedup ids then live in a store of this process
    /// only ([`WsConfig::local`]); see [`with_shared_store`](Self::with_shared_store).
    pub fn with_store(policy: impl Into<Policy>, store: Arc<dyn Store>) -> Self {
        Self {
            policy: policy.into(),
            store,
            tenant_header: HeaderName::from_static("x-tenant-id"),
            user_header: HeaderName::from_static("x-user-id"),
            resilience: None,
            debug_headers: false,
            redis: None,
            tenants: None,
            admin_token: None,
            leases: None,
            rooms: RoomsConfig::default(),
            ws: WsConfig::local(),
        }
    }

    /// Leases quota (see [`LimiterBuilder::leases`](tower_window::LimiterBuilder::leases)).
    pub fn leases(mut self, leases: LeaseConfig) -> Self {
        self.leases = Some(leases);
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

    /// The limiter for this configuration: bare on the embedded store;
    /// with [`resilience`](Self::resilience), built by
    /// [`Limiter::builder`] with the default local tier and circuit breaker,
    /// the time budget and the fallback policy.
    pub fn limiter(&self) -> Limiter {
        let Some(resilience) = self.resilience else {
            let Some(leases) = self.leases else {
                return Limiter::from_shared_store(self.store.clone(), self.policy.clone());
            };
            return Limiter::builder(self.store.clone(), self.policy.clone())
                .leases(leases)
                .without_timeout()
                .without_breaker()
                .build();
        };
        let mut builder =
            Limiter::builder(self.store.clone(), self.policy.clone()).timeout(resilience.timeout);
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
            .field("tenant_header", &self.tenant_header)
            .field("user_header", &self.user_header)
            .field("resilience", &self.resilience)
            .field("debug_headers", &self.debug_headers)
            .field("leases", &self.leases)
            .field("ws", &self.ws)
            .finish_non_exhaustive()
    }
}

/// Why the flags do not make a configuration.
#[derive(Debug)]
#[non_exhaustive]
pub enum ConfigError {
    /// `--limit` and `--algorithm` do not make a valid quota.
    Quota(QuotaError),
    /// The `--limit`s do not make a valid policy (two of one name).
    Policy(PolicyError),
    /// `--redis-url` / `--redis-cluster` do not make a store.
    Store(RedisConfigError),
    /// The `--tenants` file cannot be read or is invalid.
    Tenants(String),
    /// `--lease-ttl` leaves no room for a lease in a quota of the policy.
    Lease(tower_window::StoreError),
    /// `--history` / `--history-max` out of bounds.
    History(InvalidRetention),
    /// A WebSocket flag is out of range.
    Ws(String),
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Quota(error) => write!(f, "invalid --limit/--algorithm: {error}"),
            Self::Policy(error) => write!(f, "invalid --limit: {error}"),
            Self::Store(error) => write!(f, "invalid --redis-url/--redis-cluster: {error}"),
            Self::Tenants(error) => write!(f, "invalid --tenants: {error}"),
            Self::Lease(error) => write!(f, "invalid --lease/--lease-ttl: {error}"),
            Self::History(error) => write!(f, "invalid --history/--history-max: {error}"),
            Self::Ws(error) => f.write_str(error),
        }
    }
}

impl std::error::Error for ConfigError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Quota(error) => Some(error),
            Self::Policy(error) => Some(error),
            Self::Store(error) => Some(error),
            Self::Tenants(_) => None,
            Self::Lease(error) => Some(error),
            Self::History(error) => Some(error),
            Self::Ws(_) => None,
        }
    }
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
                timeout: Duration::from_millis(20),
            })
        );
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
        for bad in ["0", "1h", "x", "-1s", "2d"] {
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
        assert!(matches!(error, ConfigError::Lease(_)), "{error}");
    }

    #[test]
    fn rejects_bad_input() {
        let argv = ["gateway", "--limit", "0/1m"];
        assert!(Args::try_parse_from(argv).is_err());
        let argv = ["gateway", "--algorithm", "leaky-bucket"];
        assert!(Args::try_parse_from(argv).is_err());
    }
}
