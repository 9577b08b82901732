//! [`RedisStore`]: windows in Redis or Redis Cluster, shared by every node.
//!
//! Each decision is one `EVALSHA` of a Lua script (one per algorithm) that
//! reads Redis's own `TIME`, decides, records an admission and sets a TTL on
//! every key it writes — atomically, in one round trip. Node clocks play no
//! part, so skew between gateway nodes changes nothing.
//!
//! ```no_run
//! use std::time::Duration;
//! use tower_window::{Limiter, Quota, RedisStore, WindowKey};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::from_url("redis://127.0.0.1:6379")?
//!     .prefix("myapp:rl:")
//!     .timeout(Duration::from_millis(20));
//! store.connect().await?; // optional: connect and load the scripts now
//! let limiter = Limiter::new(store, "100/1m".parse::<Quota>()?);
//! let decision = limiter.check(&WindowKey::for_subject("alice"), 1).await?;
//! println!("allowed: {}, remaining: {}", decision.allowed, decision.remaining);
//! # Ok(())
//! # }
//! ```
//!
//! # Keys
//!
//! A window lives at [`redis_key`]`(prefix, key, quota)`:
//! `<prefix>{<tenant>:<subject>}:<quota id>`, with user bytes escaped or
//! hashed so that keys are injective, bounded and always hash to the slot of
//! `{<tenant>:<subject>}` (the sliding log adds a companion key with the
//! suffix `:m` in the same slot).
//!
//! # Failure domains
//!
//! On a cluster store, [`Store::shard`] is the key's hash slot, so a
//! [`Limiter`](crate::Limiter) keeps one circuit breaker per slot: a dead
//! primary opens the breakers of its own slots only, and keys on healthy
//! slots keep being decided by Redis. A single-node store is one shard.
//!
//! # Connections
//!
//! All calls share one multiplexed connection (or one cluster connection):
//! concurrent decisions are pipelined on it, and nothing but the `EVALSHA`
//! is sent per decision — no `PING`, no `SCRIPT EXISTS`. The connection is
//! made on first use (or by [`RedisStore::connect`]) and made again after a
//! connection error. [`RedisStore::from_pool`] takes one connection from a
//! `deadpool_redis` pool and keeps it, so deadpool's recycle `PING` is paid
//! once per reconnect, never per decision.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use redis::cluster::ClusterClient;
use redis::IntoConnectionInfo;

use crate::store::{CheckRequest, Store, StoreError, StoreErrorKind};
use crate::{Clock, Decision};

mod connection;
mod keys;
mod scripts;
mod topology;
#[doc(hidden)]
pub use topology::__test_support;

use connection::{is_connection_error, map_error, Conn, Connection, Connector};
pub use keys::redis_key;

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "tw:";
/// The default per-call deadline.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);
/// The default connect timeout.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// The lowest TTL when an explicit clock is used: Redis expires keys by its
/// own clock, which need not move with the given one.
const EXPLICIT_CLOCK_MIN_TTL_MS: u64 = 60_000;

/// A [`Store`] in Redis or Redis Cluster.
///
/// Build one with [`from_url`](Self::from_url), [`from_pool`](Self::from_pool),
/// [`cluster`](Self::cluster) or [`from_cluster_pool`](Self::from_cluster_pool),
/// then adjust it with [`prefix`](Self::prefix), [`timeout`](Self::timeout),
/// [`connect_timeout`](Self::connect_timeout), [`max_in_flight`](Self::max_in_flight)
/// and [`clock`](Self::clock).
/// See the [module docs](crate::store::redis) for the key layout and how
/// connections are used.
pub struct RedisStore {
    connection: Connection,
    prefix: String,
    timeout: Duration,
    clock: Option<Arc<dyn Clock>>,
    in_flight: Option<Arc<tokio::sync::Semaphore>>,
}

impl RedisStore {
    fn new(connector: Connector) -> Self {
        Self {
            connection: Connection::new(connector, DEFAULT_CONNECT_TIMEOUT),
            prefix: DEFAULT_PREFIX.to_owned(),
            timeout: DEFAULT_TIMEOUT,
            clock: None,
            in_flight: None,
        }
    }

    /// A store on the Redis server at `url` (`redis://[user:pass@]host:port[/db]`).
    ///
    /// Does not connect yet: the first check (or [`connect`](Self::connect)) does.
    pub fn from_url(url: &str) -> Result<Self, StoreError> {
        let client = redis::Client::open(url).map_err(invalid_url)?;
        Ok(Self::new(Connector::Client(client)))
    }

    /// A store on connections from a `deadpool_redis` pool.
    ///
    /// The store checks out one connection and multiplexes every decision over
    /// it, so the pool's recycle `PING` is not paid per decision; it returns
    /// the connection and takes another only after a connection error. The
    /// pool's wait timeout bounds that checkout; an exhausted pool is
    /// [`StoreErrorKind::Overloaded`].
    pub fn from_pool(pool: deadpool_redis::Pool) -> Self {
        Self::new(Connector::Pool(pool))
    }

    /// A store on the Redis Cluster reachable through any of `urls`.
    ///
    /// Does not connect yet: the first check (or [`connect`](Self::connect)) does.
    pub fn cluster<I, S>(urls: I) -> Result<Self, StoreError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let nodes = urls
            .into_iter()
            .map(|url| url.as_ref().into_connection_info())
            .collect::<Result<Vec<_>, _>>()
            .map_err(invalid_url)?;
        if nodes.is_empty() {
            return Err(StoreError::new(
                StoreErrorKind::InvalidRequest,
                "a redis cluster needs at least one node url",
            ));
        }
        // Check the configuration now; the client itself is built per connect.
        ClusterClient::builder(nodes.clone())
            .build()
            .map_err(invalid_url)?;
        Ok(Self::new(Connector::Cluster(nodes)))
    }

    /// A store on a Redis Cluster connection from a `deadpool_redis` cluster pool
    /// (checked out once and shared, like [`from_pool`](Self::from_pool)).
    pub fn from_cluster_pool(pool: deadpool_redis::cluster::Pool) -> Self {
        Self::new(Connector::ClusterPool(pool))
    }

    /// Prefixes every key (default [`DEFAULT_PREFIX`], `"tw:"`). Braces and
    /// bytes that are not printable ASCII are escaped.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The deadline of one decision, connecting included (default
    /// [`DEFAULT_TIMEOUT`], 50 ms). Past it the check fails with
    /// [`StoreErrorKind::Timeout`].
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How long one connection attempt may take (default
    /// [`DEFAULT_CONNECT_TIMEOUT`], 1 s). Attempts run in the background, so
    /// a check never waits longer than its [`timeout`](Self::timeout).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connection.set_connect_timeout(timeout);
        self
    }

    /// Allows at most `max` decisions in flight at once (default: no limit
    /// beyond what the deadline implies). A check beyond it fails at once with
    /// [`StoreErrorKind::Overloaded`] instead of queueing behind a slow Redis.
    pub fn max_in_flight(mut self, max: usize) -> Self {
        self.in_flight = Some(Arc::new(tokio::sync::Semaphore::new(max)));
        self
    }

    /// Decides with `clock` instead of the Redis server's `TIME`.
    ///
    /// For tests (the conformance suite drives a [`ManualClock`](crate::ManualClock)).
    /// In production leave it unset: with the server's clock, node clock
    /// skew cannot move the windows. Because Redis expires keys by its own
    /// clock, keys then get a TTL of at least one minute; expired state is
    /// still ignored by the given clock's time.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// The key prefix in use.
    pub fn key_prefix(&self) -> &str {
        &self.prefix
    }

    /// Connects now and loads every script, instead of on the first check.
    pub async fn connect(&self) -> Result<(), StoreError> {
        let (conn, generation) = self.connection.get().await?;
        for script in scripts::all() {
            let loaded = match conn.clone() {
                Conn::Single(mut conn) => script.prepare_invoke().load_async(&mut conn).await,
                Conn::Cluster(mut conn) => script.prepare_invoke().load_async(&mut conn).await,
            };
            if let Err(error) = loaded {
                if is_connection_error(&error) {
                    self.connection.invalidate(generation);
                }
                return Err(map_error(error));
            }
        }
        Ok(())
    }

    /// The SHA1 of the script deciding `algorithm`, as used by `EVALSHA`
    /// (for load tests and operators).
    pub fn script_sha(algorithm: crate::Algorithm) -> &'static str {
        scripts::sha_for(algorithm)
    }

    async fn decide(&self, request: CheckRequest<'_>) -> Result<Decision, StoreError> {
        if request.cost == 0 {
            return Err(StoreError::new(
                StoreErrorKind::InvalidRequest,
                "a request must cost at least 1 unit",
            ));
        }
        let now = match &self.clock {
            Some(clock) => {
                let now = clock.now_micros();
                if now > scripts::MAX_EXPLICIT_MICROS {
                    return Err(StoreError::new(
                        StoreErrorKind::InvalidRequest,
                        "clock reading beyond 2^52 microseconds",
                    ));
                }
                Some(now)
            }
            None => None,
        };
        const NOSCRIPT_ATTEMPTS: u32 = 3;
        let min_ttl_ms = if now.is_some() {
            EXPLICIT_CLOCK_MIN_TTL_MS
        } else {
            0
        };
        let [quota] = request.policy.quotas() else {
            return Err(StoreError::new(
                StoreErrorKind::InvalidRequest,
                "policies of several quotas are not supported by RedisStore yet",
            ));
        };
        let key = redis_key(&self.prefix, request.key, quota);
        let call = scripts::invocation(key, quota, request.cost, now, min_ttl_ms);
        let (conn, generation) = self.connection.get().await?;
        // redis-rs answers NOSCRIPT by loading the script and retrying once;
        // a `SCRIPT FLUSH` (or a failover) landing between that load and the
        // retry surfaces a second NOSCRIPT, so go round again, boundedly.
        let mut attempts = 0;
        let reply: Result<Vec<i64>, _> = loop {
            attempts += 1;
            let reply = match conn.clone() {
                Conn::Single(mut conn) => call.invoke_async(&mut conn).await,
                Conn::Cluster(mut conn) => call.invoke_async(&mut conn).await,
            };
            match reply {
                Err(error)
                    if error.kind()
                        == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
                        && attempts < NOSCRIPT_ATTEMPTS => {}
                other => break other,
            }
        };
        let reply = reply.map_err(|error| {
            if is_connection_error(&error) {
                self.connection.invalidate(generation);
            }
            map_error(error)
        })?;
        scripts::decision(quota, &reply)
    }
}

fn invalid_url(error: redis::RedisError) -> StoreError {
    StoreError::new(
        StoreErrorKind::InvalidRequest,
        format!("invalid redis url: {error}"),
    )
}

impl Store for RedisStore {
    fn check<'a>(
        &'a self,
        request: CheckRequest<'a>,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        Box::pin(async move {
            let _permit = match &self.in_flight {
                Some(limit) => Some(limit.try_acquire().map_err(|_| {
                    StoreError::new(
                        StoreErrorKind::Overloaded,
                        "too many redis decisions in flight",
                    )
                })?),
                None => None,
            };
            match tokio::time::timeout(self.timeout, self.decide(request)).await {
                Ok(result) => result,
                Err(_) => Err(StoreError::new(
                    StoreErrorKind::Timeout,
                    format!("redis did not decide within {:?}", self.timeout),
                )),
            }
        })
    }

    /// On a cluster store, the hash slot (0..16384) of the request's keys,
    /// as `CLUSTER KEYSLOT` computes it; `None` on a single-node store.
    /// Computed from the subject's hash tag without building the key.
    fn failure_domain(&self, key: &crate::WindowKey, _policy: &crate::Policy) -> Option<u16> {
        self.connection
            .is_cluster()
            .then(|| keys::cluster_slot(key))
    }
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .field("cluster", &self.connection.is_cluster())
            .field("timeout", &self.timeout)
            .field("explicit_clock", &self.clock.is_some())
            .field(
                "max_in_flight",
                &self.in_flight.as_ref().map(|s| s.available_permits()),
            )
            .finish_non_exhaustive()
    }
}
