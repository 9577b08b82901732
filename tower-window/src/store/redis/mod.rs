//! [`RedisStore`]: windows in Redis or Redis Cluster, shared by every node.
//!
//! Each decision is one `EVALSHA` of one Lua script: it reads Redis's own
//! `TIME`, evaluates every quota of the policy, records the cost in all of
//! them only if all admit, and sets a TTL on every key it writes, atomically
//! in one round trip. Node clocks and their skew play no part.
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
//! Deadlines, retries and breakers belong to the [`Store`](crate::Store)
//! made from it. Keys are laid out by [`redis_key`].
//!
//! # Failure domains and failover
//!
//! On a cluster, an operation's failure domain is the primary serving its
//! hash slot, from `CLUSTER SLOTS` (reloaded in the background after a
//! topology change, at most four times a second, else once a second). A
//! dead primary opens only its own breaker, and about a second after a
//! failover its slots get the new primary's closed breaker.
//!
//! - The cluster client follows `MOVED` and `ASK` itself, at most twice;
//!   other errors come back at once, to be retried within the store's
//!   budget.
//! - Cluster replies are bounded by the connect timeout, so a node gone
//!   without closing its sockets cannot stall the connection.
//! - A node without our script (a promoted replica, a restart,
//!   `SCRIPT FLUSH`) answers `NOSCRIPT` and gets it by one `EVAL`.
//! - With `cluster-require-full-coverage yes` (Redis's default) every key
//!   goes to the fallback while a failed primary's slots have no primary;
//!   with `no`, only that primary's keys do.
//!
//! # Errors and retries
//!
//! Only errors where Redis certainly did not run the script (a refused
//! connection, `CLUSTERDOWN`, `TRYAGAIN`, `MOVED`, `ASK`, `MASTERDOWN`,
//! `LOADING`, `READONLY`, `NOSCRIPT`) are
//! [`not_applied`](crate::StoreError::not_applied) and may be retried; a
//! connection that breaks with a call in flight is not.
//!
//! # Connections
//!
//! All calls share one multiplexed (or cluster) connection, made on first
//! use or by [`RedisStore::connect`] and again after a connection error.
//! [`redis`] and [`deadpool_redis`] are re-exported for building a pool or
//! cluster client with this crate's versions; give a cluster pool's
//! `ClusterClient` few retries with short waits and a response timeout, as
//! [`RedisStoreBuilder::cluster`] does.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::cluster::ClusterClient;
use redis::IntoConnectionInfo;

use crate::store::StoreError;
use crate::Clock;
use script::{Functions, LuaScript};

pub(crate) mod call;
pub(crate) mod connection;
pub(crate) mod keys;
pub(crate) mod script;
pub(crate) mod tls;
pub(crate) mod topology;
#[cfg(feature = "tls")]
pub use tls::{RedisTls, RedisTlsError};
use topology::TopologyCache;

/// The `deadpool_redis` crate this crate is built with.
pub use deadpool_redis;
/// The `redis` crate this crate is built with.
pub use redis;

use connection::{map_error, Conn, Connection, Connector};
pub use keys::redis_key;
use redis::cluster_async::ClusterConnection;

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "tw:";
/// The default connect timeout.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// The lowest TTL with an explicit clock: Redis expires keys by its own.
pub(crate) const EXPLICIT_CLOCK_MIN_TTL_MS: u64 = 60_000;

/// The Redis or Redis Cluster backend of a [`Store`](crate::Store); see
/// the [module docs](crate::store::redis).
///
/// Build one with [`builder`](Self::builder) or a shorthand
/// ([`from_url`](Self::from_url), [`cluster`](Self::cluster),
/// [`from_pool`](Self::from_pool),
/// [`from_cluster_pool`](Self::from_cluster_pool)). Cheap to clone: clones
/// share the connection and the slot map.
#[derive(Clone)]
pub struct RedisStore {
    pub(crate) connection: Connection,
    pub(crate) prefix: Arc<str>,
    pub(crate) clock: Option<Arc<dyn Clock>>,
    /// Hash slot to primary: the failure domains of a cluster.
    pub(crate) topology: Arc<TopologyCache>,
    /// Whether scripts go as Redis Functions.
    pub(crate) functions: Functions,
}

impl RedisStore {
    /// A builder: where to connect, then the settings.
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

    /// Short for `RedisStore::builder().url(url).build()`.
    pub fn from_url(url: &str) -> Result<Self, RedisConfigError> {
        Self::builder().url(url).build()
    }

    /// Short for `RedisStore::builder().pool(pool).build()`, which cannot
    /// fail.
    pub fn from_pool(pool: deadpool_redis::Pool) -> Self {
        Self::builder().with_connector(Connector::Pool(pool))
    }

    /// Short for `RedisStore::builder().cluster(urls).build()`.
    pub fn cluster<I, S>(urls: I) -> Result<Self, RedisConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Self::builder().cluster(urls).build()
    }

    /// Short for `RedisStore::builder().cluster_pool(pool).build()`, which
    /// cannot fail.
    pub fn from_cluster_pool(pool: deadpool_redis::cluster::Pool) -> Self {
        Self::builder().with_connector(Connector::ClusterPool(pool))
    }

    /// The key prefix in use.
    pub fn key_prefix(&self) -> &str {
        &self.prefix
    }

    /// Connects now and loads `script` on every primary (a function
    /// library, or into the script cache), and a cluster's slot map.
    pub(crate) async fn connect_loading(&self, script: &LuaScript) -> Result<(), StoreError> {
        let (conn, _) = self.connection.get().await?;
        if let Conn::Cluster(cluster) = &conn {
            if let Err(error) = self.topology.refresh(&mut cluster.clone()).await {
                tracing::debug!(%error, "redis cluster topology load failed");
            }
        }
        if self.functions.on() {
            match call::query::<redis::Value>(&conn, &script.function_load_cmd()).await {
                Err(error) if self.functions.off_if_unsupported(&error) => {}
                Err(error) if !script::is_already_loaded(&error) => return Err(map_error(error)),
                _ => return Ok(()),
            }
        }
        self.call::<String>(call::Call::Cmd(&script.load_cmd()))
            .await
            .map(drop)
    }

    /// Reloads the slot map in the background when it is due (see
    /// [`topology`]); not at all outside a Tokio runtime.
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
    /// A pool: nothing to check.
    Pool(Box<Connector>),
}

/// Builds a [`RedisStore`]. One of [`url`](Self::url),
/// [`cluster`](Self::cluster), [`pool`](Self::pool) and
/// [`cluster_pool`](Self::cluster_pool) names the server (the last one
/// given wins). The store connects on first use, or on
/// [`RedisStore::connect`].
#[must_use]
pub struct RedisStoreBuilder {
    target: Option<Target>,
    prefix: String,
    connect_timeout: Duration,
    clock: Option<Arc<dyn Clock>>,
    tls: tls::TlsSettings,
    functions: bool,
}

impl Default for RedisStoreBuilder {
    fn default() -> Self {
        Self {
            target: None,
            prefix: DEFAULT_PREFIX.to_owned(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            clock: None,
            tls: tls::TlsSettings::default(),
            functions: true,
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
            Some(Target::Pool(pool)) if matches!(**pool, Connector::ClusterPool(_)) => {
                "cluster_pool"
            }
            Some(Target::Pool(_)) => "pool",
        };
        f.debug_struct("RedisStoreBuilder")
            .field("target", &target)
            .field("prefix", &self.prefix)
            .field("connect_timeout", &self.connect_timeout)
            .field("explicit_clock", &self.clock.is_some())
            .field("functions", &self.functions)
            .finish()
    }
}

impl RedisStoreBuilder {
    /// The Redis server at `url` (`redis://[user:pass@]host:port[/db]`, or
    /// `rediss://` with the `tls` feature).
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.target = Some(Target::Url(url.into()));
        self
    }

    /// The Redis Cluster reachable through any of `urls` (seed nodes).
    pub fn cluster<I, S>(mut self, urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let urls = urls.into_iter().map(|u| u.as_ref().to_owned()).collect();
        self.target = Some(Target::Cluster(urls));
        self
    }

    /// One connection from a `deadpool_redis` pool, checked out and
    /// multiplexed until it fails, so the pool's recycle `PING` is not paid
    /// per call. The pool's wait timeout bounds the checkout; an exhausted
    /// pool is [`StoreErrorKind::Overloaded`](crate::StoreErrorKind::Overloaded).
    pub fn pool(mut self, pool: deadpool_redis::Pool) -> Self {
        self.target = Some(Target::Pool(Box::new(Connector::Pool(pool))));
        self
    }

    /// A cluster connection from a `deadpool_redis` cluster pool, kept
    /// like [`pool`](Self::pool)'s.
    pub fn cluster_pool(mut self, pool: deadpool_redis::cluster::Pool) -> Self {
        self.target = Some(Target::Pool(Box::new(Connector::ClusterPool(pool))));
        self
    }

    /// Prefixes every key (default [`DEFAULT_PREFIX`], `"tw:"`). Braces and
    /// bytes that are not printable ASCII are escaped.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long one connection attempt (on a cluster, also one reply) may
    /// take (default [`DEFAULT_CONNECT_TIMEOUT`]).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Decides with `clock` instead of the Redis server's `TIME`, and makes
    /// it the store's clock (breakers, local and lease tiers, fallback;
    /// without it those read the [`SystemClock`](crate::SystemClock)). For
    /// tests and simulations: with the server's clock, node clock skew
    /// cannot move the windows. Keys then get a TTL of at least one minute
    /// (Redis expires them by its own clock); readings beyond 2^52 µs are
    /// refused.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Whether to call the scripts as Redis Functions (`FCALL`; default
    /// true). A library is loaded once per node (again after a restart
    /// that lost it or a `FUNCTION FLUSH`), and a call runs only the
    /// decision, not the definitions an `EVALSHA` runs every time. A server
    /// without functions (before Redis 7), or an ACL user not allowed
    /// `FCALL` or `FUNCTION LOAD`, is found on the first call and gets
    /// `EVALSHA` from then on; false sends `EVALSHA` from the start.
    pub fn functions(mut self, functions: bool) -> Self {
        self.functions = functions;
        self
    }

    /// Checks the configuration and builds the store.
    pub fn build(mut self) -> Result<RedisStore, RedisConfigError> {
        let connector = match self.target.take().ok_or(RedisConfigError::MissingServer)? {
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
                // Checked now; the client is built per connect.
                self.tls
                    .cluster(ClusterClient::builder(nodes.clone()))
                    .build()
                    .map_err(RedisConfigError::InvalidUrl)?;
                Connector::Cluster(nodes, self.tls.clone())
            }
            Target::Pool(connector) => *connector,
        };
        Ok(self.with_connector(connector))
    }

    /// The store this builder's settings make on `connector`.
    fn with_connector(self, connector: Connector) -> RedisStore {
        RedisStore {
            connection: Connection::new(connector, self.connect_timeout),
            prefix: Arc::from(self.prefix),
            topology: Arc::new(TopologyCache::new()),
            clock: self.clock,
            functions: Functions::new(self.functions),
        }
    }
}

/// Why a [`RedisStoreBuilder`] could not build a store (found before any
/// connection is made).
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
