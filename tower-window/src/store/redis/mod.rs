//! [`RedisStore`]: windows in Redis or Redis Cluster, shared by every node.
//!
//! Each decision is one `EVALSHA` of one Lua script, whatever the policy:
//! it reads Redis's own `TIME`, evaluates every quota of the policy, records
//! the cost in all of them only if all admit, and sets a TTL on every key it
//! writes — atomically, in one round trip. Node clocks play no part, so skew
//! between gateway nodes changes nothing.
//!
//! ```no_run
//! use std::time::Duration;
//! use tower_window::{Limiter, Quota, RedisStore, WindowKey};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::builder()
//!     .url("redis://127.0.0.1:6379")
//!     .prefix("myapp:rl:")
//!     .connect_timeout(Duration::from_millis(500))
//!     .build()?;
//! store.connect().await?; // optional: connect and load the script now
//! let limiter = Limiter::new(store, "100/1m".parse::<Quota>()?);
//! let decision = limiter.check(&WindowKey::for_subject("alice"), 1).await?;
//! println!("allowed: {}, remaining: {}", decision.allowed(), decision.remaining());
//! # Ok(())
//! # }
//! ```
//!
//! Deadlines, retries, the in-flight bound and circuit breakers are the
//! resilience stack of the [`Store`](crate::Store) handle made from it;
//! the Redis client itself only bounds one connection attempt
//! ([`RedisStoreBuilder::connect_timeout`]).
//!
//! # Keys
//!
//! A quota's window lives at [`redis_key`]`(prefix, key, policy, quota)`:
//! injective, bounded, and every key of one decision in one hash slot.
//!
//! # Failure domains
//!
//! On a cluster store, the failure domain
//! ([`limit::Backend::failure_domain`](crate::limit::Backend::failure_domain))
//! is the primary that serves the policy's hash slot, from the cluster's
//! own slot map (`CLUSTER SLOTS`, loaded on connect and reloaded in the
//! background after `MOVED`, a failover or a refused node, at most four
//! times a second, else once a second while the store is used). So a dead
//! primary opens only its own breaker, and when its replica takes over,
//! the next reload gives its slots the new primary's breaker, closed: their
//! keys are decided by Redis again about a second after the failover, with
//! no probe needed. A single-node store is one domain.
//!
//! # Failover, resharding, restarts
//!
//! - The cluster client follows `MOVED` and `ASK` itself, at most twice per
//!   call and without long waits; other errors come back at once, to be
//!   retried within the store's time budget (redis-rs's default waits
//!   outlive any budget).
//! - A node's replies and the client's own topology queries are bounded by
//!   the connect timeout, so a node that vanished without closing its
//!   sockets cannot stall the connection.
//! - A node without our script (a promoted replica, a restart,
//!   `SCRIPT FLUSH`) answers `NOSCRIPT`, and gets the script by one `EVAL`.
//! - With Redis's default `cluster-require-full-coverage yes`, every node
//!   answers `CLUSTERDOWN` while a failed primary's slots have no primary
//!   yet, so every key goes to the fallback for that interval; with `no`,
//!   only the failed primary's keys do.
//!
//! `tests/tests/redis_fault_recovery.rs` in the repository checks that,
//! under load from two nodes, every key is decided by Redis again within
//! 2 s of the cluster being whole after a primary is killed, a manual
//! failover, a resharding, the old primary's return as a replica and a
//! single server's restart.
//!
//! # Errors and retries
//!
//! Only errors where Redis certainly did not run the script (a refused or
//! never-made connection, `CLUSTERDOWN`, `TRYAGAIN`, `MOVED`, `ASK`,
//! `MASTERDOWN`, `LOADING`, `READONLY`, `NOSCRIPT`) are marked
//! [`not_applied`](crate::StoreError::not_applied) and may be retried. A
//! connection that breaks with a call in flight is never retried: the
//! script may have run. So a connection that died while idle fails its
//! first call before the store reconnects.
//!
//! # Connections
//!
//! All calls share one multiplexed connection (or one cluster connection),
//! made on first use (or by [`RedisStore::connect`]) and again after a
//! connection error; nothing but the `EVALSHA` is sent per decision. A
//! `deadpool_redis` pool ([`RedisStoreBuilder::pool`]) lends one connection
//! that the store keeps, so its recycle `PING` is paid once per reconnect.
//! [`redis`] and [`deadpool_redis`] are re-exported, so a pool or a cluster
//! client is built with the versions this crate uses; give a cluster pool's
//! `ClusterClient` few retries with short waits and a response timeout, as
//! [`RedisStoreBuilder::cluster`] does.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::cluster::ClusterClient;
use redis::IntoConnectionInfo;

use crate::store::StoreError;
use crate::Clock;
use script::LuaScript;

pub(crate) mod call;
pub(crate) mod connection;
pub(crate) mod keys;
pub(crate) mod script;
pub(crate) mod tls;
pub(crate) mod topology;
#[cfg(feature = "tls")]
pub use tls::{RedisTls, RedisTlsError};
use topology::TopologyCache;

/// The `deadpool_redis` this crate is built with (for
/// [`RedisStoreBuilder::pool`] and [`RedisStoreBuilder::cluster_pool`]).
pub use deadpool_redis;
/// The `redis` crate this crate is built with.
pub use redis;

use connection::{Conn, Connection, Connector};
pub use keys::redis_key;
use redis::cluster_async::ClusterConnection;

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "tw:";
/// The default connect timeout.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// The lowest TTL when an explicit clock is used: Redis expires keys by its
/// own clock, which need not move with the given one.
pub(crate) const EXPLICIT_CLOCK_MIN_TTL_MS: u64 = 60_000;

/// The Redis or Redis Cluster backend of a [`Store`](crate::Store).
///
/// Build one with [`builder`](Self::builder), or with the shorthands
/// [`from_url`](Self::from_url), [`cluster`](Self::cluster),
/// [`from_pool`](Self::from_pool) and
/// [`from_cluster_pool`](Self::from_cluster_pool) (then adjust it with
/// [`prefix`](Self::prefix), [`connect_timeout`](Self::connect_timeout)
/// and [`clock`](Self::clock)).
/// See the [module docs](crate::store::redis) for the key layout and how
/// connections are used.
///
/// Cheap to clone: clones share the connection and the slot map, so a
/// store operation's future owns one and borrows nothing.
#[derive(Clone)]
pub struct RedisStore {
    pub(crate) connection: Connection,
    pub(crate) prefix: Arc<str>,
    pub(crate) clock: Option<Arc<dyn Clock>>,
    /// Hash slot to primary, for [`limit::Backend::failure_domain`](crate::limit::Backend::failure_domain) on a cluster.
    pub(crate) topology: Arc<TopologyCache>,
}

impl RedisStore {
    fn new(connector: Connector, connect_timeout: Duration) -> Self {
        Self {
            connection: Connection::new(connector, connect_timeout),
            prefix: Arc::from(DEFAULT_PREFIX),
            topology: Arc::new(TopologyCache::new()),
            clock: None,
        }
    }

    /// A builder: one of [`url`](RedisStoreBuilder::url),
    /// [`cluster`](RedisStoreBuilder::cluster), [`pool`](RedisStoreBuilder::pool)
    /// or [`cluster_pool`](RedisStoreBuilder::cluster_pool), then the settings.
    ///
    /// ```
    /// use tower_window::RedisStore;
    ///
    /// let store = RedisStore::builder()
    ///     .cluster(["redis://10.0.0.1:6379", "redis://10.0.0.2:6379"])
    ///     .prefix("rl:")
    ///     .build()?;
    /// assert_eq!(store.key_prefix(), "rl:");
    /// assert!(RedisStore::builder().build().is_err()); // no server given
    /// # Ok::<(), tower_window::store::redis::RedisConfigError>(())
    /// ```
    pub fn builder() -> RedisStoreBuilder {
        RedisStoreBuilder::default()
    }

    /// A store on the Redis server at `url` (`redis://[user:pass@]host:port[/db]`);
    /// short for `RedisStore::builder().url(url).build()`.
    ///
    /// Does not connect yet: the first check (or [`connect`](Self::connect)) does.
    pub fn from_url(url: &str) -> Result<Self, RedisConfigError> {
        Self::builder().url(url).build()
    }

    /// A store on connections from a `deadpool_redis` pool; short for
    /// `RedisStore::builder().pool(pool).build()`, which cannot fail.
    ///
    /// The store checks out one connection and multiplexes every decision over
    /// it, so the pool's recycle `PING` is not paid per decision; it returns
    /// the connection and takes another only after a connection error. The
    /// pool's wait timeout bounds that checkout; an exhausted pool is
    /// [`StoreErrorKind::Overloaded`](crate::StoreErrorKind::Overloaded).
    pub fn from_pool(pool: deadpool_redis::Pool) -> Self {
        Self::new(Connector::Pool(pool), DEFAULT_CONNECT_TIMEOUT)
    }

    /// A store on the Redis Cluster reachable through any of `urls`; short
    /// for `RedisStore::builder().cluster(urls).build()`.
    ///
    /// Does not connect yet: the first check (or [`connect`](Self::connect)) does.
    pub fn cluster<I, S>(urls: I) -> Result<Self, RedisConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Self::builder().cluster(urls).build()
    }

    /// A store on a Redis Cluster connection from a `deadpool_redis` cluster pool
    /// (checked out once and shared, like [`from_pool`](Self::from_pool)).
    pub fn from_cluster_pool(pool: deadpool_redis::cluster::Pool) -> Self {
        Self::new(Connector::ClusterPool(pool), DEFAULT_CONNECT_TIMEOUT)
    }

    /// Prefixes every key (default [`DEFAULT_PREFIX`], `"tw:"`); see
    /// [`RedisStoreBuilder::prefix`].
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Arc::from(prefix.into());
        self
    }

    /// How long one connection attempt may take; see
    /// [`RedisStoreBuilder::connect_timeout`].
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connection.set_connect_timeout(timeout);
        self
    }

    /// The key prefix in use.
    pub fn key_prefix(&self) -> &str {
        &self.prefix
    }

    /// Connects now and loads `script`, instead of on the first call (see
    /// [`connect`](Self::connect)).
    pub(crate) async fn connect_loading(&self, script: &LuaScript) -> Result<(), StoreError> {
        if let (Conn::Cluster(mut conn), _) = self.connection.get().await? {
            // The slot map now too, so breakers are per primary from the
            // first check.
            if let Err(error) = self.topology.refresh(&mut conn).await {
                tracing::debug!(%error, "redis cluster topology load failed");
            }
        }
        // To every primary of a cluster; a node that misses it later (a
        // promoted replica) gets it by `EVAL` on first use.
        self.call::<String>(call::Call::Cmd(&script.load_cmd()))
            .await
            .map(drop)
    }

    /// Reloads the slot map (`CLUSTER SLOTS`) in the background when it was
    /// never loaded, a `MOVED`/failover made it stale, or it is a second
    /// old (see [`topology`]); never on the request's own time, and not at
    /// all outside a Tokio runtime.
    pub(crate) fn refresh_topology_if_due(&self, cluster: &ClusterConnection) {
        if !self.topology.needs_refresh() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let topology = Arc::clone(&self.topology);
        let mut cluster = cluster.clone();
        runtime.spawn(async move {
            if let Err(error) = topology.refresh(&mut cluster).await {
                tracing::debug!(%error, "redis cluster topology refresh failed");
            }
        });
    }
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .field("cluster", &self.connection.is_cluster())
            .field("explicit_clock", &self.clock.is_some())
            .finish_non_exhaustive()
    }
}

/// Where a [`RedisStoreBuilder`] connects.
enum Target {
    Url(String),
    Cluster(Vec<String>),
    Pool(deadpool_redis::Pool),
    ClusterPool(deadpool_redis::cluster::Pool),
}

/// Builds a [`RedisStore`]; see [`RedisStore::builder`].
///
/// Exactly one of [`url`](Self::url), [`cluster`](Self::cluster),
/// [`pool`](Self::pool) and [`cluster_pool`](Self::cluster_pool) names the
/// server (the last one given wins).
#[must_use]
pub struct RedisStoreBuilder {
    target: Option<Target>,
    prefix: String,
    connect_timeout: Duration,
    clock: Option<Arc<dyn Clock>>,
    tls: tls::TlsSettings,
}

impl Default for RedisStoreBuilder {
    fn default() -> Self {
        Self {
            target: None,
            prefix: DEFAULT_PREFIX.to_owned(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            clock: None,
            tls: tls::TlsSettings::default(),
        }
    }
}

impl fmt::Debug for RedisStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // URLs may carry passwords: name the kind of target only.
        let target = match &self.target {
            None => "none",
            Some(Target::Url(_)) => "url",
            Some(Target::Cluster(_)) => "cluster",
            Some(Target::Pool(_)) => "pool",
            Some(Target::ClusterPool(_)) => "cluster_pool",
        };
        f.debug_struct("RedisStoreBuilder")
            .field("target", &target)
            .field("prefix", &self.prefix)
            .field("connect_timeout", &self.connect_timeout)
            .field("explicit_clock", &self.clock.is_some())
            .finish()
    }
}

impl RedisStoreBuilder {
    /// The Redis server at `url` (`redis://[user:pass@]host:port[/db]`,
    /// `rediss://` with TLS when redis-rs is built with it). Checked by
    /// [`build`](Self::build).
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.target = Some(Target::Url(url.into()));
        self
    }

    /// The Redis Cluster reachable through any of `urls` (seed nodes; the
    /// rest of the cluster is discovered). Checked by [`build`](Self::build).
    pub fn cluster<I, S>(mut self, urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let urls = urls.into_iter().map(|u| u.as_ref().to_owned()).collect();
        self.target = Some(Target::Cluster(urls));
        self
    }

    /// Connections from a `deadpool_redis` pool (use the re-exported
    /// [`deadpool_redis`]); see [`RedisStore::from_pool`].
    pub fn pool(mut self, pool: deadpool_redis::Pool) -> Self {
        self.target = Some(Target::Pool(pool));
        self
    }

    /// A cluster connection from a `deadpool_redis` cluster pool; see
    /// [`RedisStore::from_cluster_pool`].
    pub fn cluster_pool(mut self, pool: deadpool_redis::cluster::Pool) -> Self {
        self.target = Some(Target::ClusterPool(pool));
        self
    }

    /// Prefixes every key (default [`DEFAULT_PREFIX`], `"tw:"`). Braces and
    /// bytes that are not printable ASCII are escaped.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long one connection attempt may take (default
    /// [`DEFAULT_CONNECT_TIMEOUT`], 1 s). Attempts run in the background, so
    /// a check never waits for one longer than the
    /// [`Store`](crate::Store)'s time budget allows.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Decides with `clock` instead of the Redis server's `TIME`, and makes
    /// it the store's clock (breakers, local and lease tiers, fallback);
    /// without it those read the [`SystemClock`](crate::SystemClock).
    ///
    /// For tests and simulations that drive a [`ManualClock`](crate::ManualClock).
    /// In production leave it unset: with the server's clock, node clock
    /// skew cannot move the windows. Redis expires keys by its own clock,
    /// so keys then get a TTL of at least one minute; expired state is still
    /// ignored by the given clock's time. Readings beyond 2^52 µs are refused.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Checks the configuration and builds the store (it connects on first
    /// use, or on [`RedisStore::connect`]).
    pub fn build(self) -> Result<RedisStore, RedisConfigError> {
        let connector = match self.target.ok_or(RedisConfigError::MissingServer)? {
            Target::Url(url) => Connector::Client(
                url.as_str()
                    .into_connection_info()
                    .and_then(|info| self.tls.client(connection::no_delay(info)))
                    .map_err(RedisConfigError::InvalidUrl)?,
            ),
            Target::Cluster(urls) => {
                let nodes = urls
                    .iter()
                    .map(|url| {
                        url.as_str()
                            .into_connection_info()
                            .and_then(|info| self.tls.node(connection::no_delay(info)))
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(RedisConfigError::InvalidUrl)?;
                if nodes.is_empty() {
                    return Err(RedisConfigError::NoClusterNodes);
                }
                // Check the configuration now; the client itself is built per connect.
                self.tls
                    .cluster(ClusterClient::builder(nodes.clone()))
                    .build()
                    .map_err(RedisConfigError::InvalidUrl)?;
                Connector::Cluster(nodes, self.tls)
            }
            Target::Pool(pool) => Connector::Pool(pool),
            Target::ClusterPool(pool) => Connector::ClusterPool(pool),
        };
        Ok(RedisStore {
            prefix: Arc::from(self.prefix),
            clock: self.clock,
            ..RedisStore::new(connector, self.connect_timeout)
        })
    }
}

/// Why a [`RedisStoreBuilder`] could not build a store (a configuration
/// error, found before any connection is made; failures of a running store
/// are [`StoreError`]s).
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum RedisConfigError {
    /// No URL, cluster or pool was given.
    #[error("no redis server given: set a url, a cluster or a pool")]
    MissingServer,
    /// A cluster needs at least one node URL.
    #[error("a redis cluster needs at least one node url")]
    NoClusterNodes,
    /// A URL could not be parsed (or the client refused it).
    #[error("invalid redis url: {0}")]
    InvalidUrl(#[source] redis::RedisError),
}

crate::error_debug::debug_as_display!(RedisConfigError {
    MissingServer,
    NoClusterNodes,
    InvalidUrl,
});
