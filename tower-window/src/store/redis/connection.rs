//! Getting a connection without paying for it on the hot path.
//!
//! All decisions of one store share one multiplexed connection (or one
//! cluster connection), cloned per call: a clone is a handle, not a socket,
//! and sends nothing. A connection is made on first use by a background task
//! (so a caller's deadline never cuts a slow connect short for everyone) and
//! made again only after a connection-level error.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::{BoxFuture, FutureExt, Shared};
use redis::aio::MultiplexedConnection;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, ErrorKind, RedisError, ServerErrorKind};

use crate::store::{StoreError, StoreErrorKind};
use crate::sync::lock;

/// How to make a connection.
pub(crate) enum Connector {
    /// A plain client from a URL.
    Client(redis::Client),
    /// A deadpool pool: one pooled connection is taken and multiplexed.
    Pool(deadpool_redis::Pool),
    /// Redis Cluster seed nodes, and the TLS settings for every node.
    Cluster(Vec<redis::ConnectionInfo>, super::tls::TlsSettings),
    /// A deadpool cluster pool: one pooled cluster connection is taken and shared.
    ClusterPool(deadpool_redis::cluster::Pool),
}

/// A cheap, cloneable handle to send commands on.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

/// A connection of its own (see [`Connection::dedicated`]).
pub(crate) struct Dedicated {
    pub(crate) conn: Conn,
    _keeper: Keeper,
}

/// Keeps a pooled connection checked out while its handle is in use (its
/// `Drop` returns it to the pool).
type Keeper = Option<Box<dyn std::any::Any + Send + Sync>>;

type ConnectResult = Result<(Conn, u64), (StoreErrorKind, String)>;

enum State {
    Idle,
    Connecting {
        pending: Shared<BoxFuture<'static, ConnectResult>>,
        generation: u64,
    },
    Ready {
        conn: Conn,
        generation: u64,
        _keeper: Arc<Keeper>,
    },
}

#[derive(Clone)]
pub(crate) struct Connection {
    connector: Arc<Connector>,
    state: Arc<Mutex<State>>,
    generation: Arc<AtomicU64>,
    connect_timeout: Duration,
}

impl Connection {
    pub(crate) fn new(connector: Connector, connect_timeout: Duration) -> Self {
        Self {
            connector: Arc::new(connector),
            state: Arc::new(Mutex::new(State::Idle)),
            generation: Arc::new(AtomicU64::new(0)),
            connect_timeout,
        }
    }

    pub(crate) fn set_connect_timeout(&mut self, timeout: Duration) {
        self.connect_timeout = timeout;
    }

    /// How long one connection attempt may take.
    pub(crate) fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The client of a store made from a URL (to open a dedicated
    /// connection, e.g. for blocking reads), `None` otherwise.
    pub(crate) fn client(&self) -> Option<redis::Client> {
        match &*self.connector {
            Connector::Client(client) => Some(client.clone()),
            _ => None,
        }
    }

    /// How to reach one node of this store directly (for a connection
    /// of another kind, such as the event windows' RESP3 subscriptions):
    /// the URL's server, or the first cluster seed (whose user, password
    /// and settings every node shares). `None` for a pool.
    pub(crate) fn node_info(&self) -> Option<redis::ConnectionInfo> {
        match &*self.connector {
            Connector::Client(client) => Some(client.get_connection_info().clone()),
            Connector::Cluster(nodes, _) => nodes.first().cloned(),
            Connector::Pool(_) | Connector::ClusterPool(_) => None,
        }
    }

    pub(crate) fn is_cluster(&self) -> bool {
        matches!(
            *self.connector,
            Connector::Cluster(..) | Connector::ClusterPool(_)
        )
    }

    /// The current connection, if one is made (never connects).
    pub(crate) fn ready(&self) -> Option<Conn> {
        match &*lock(&self.state) {
            State::Ready { conn, .. } => Some(conn.clone()),
            _ => None,
        }
    }

    /// The current connection and its generation, connecting if needed.
    pub(crate) async fn get(&self) -> Result<(Conn, u64), StoreError> {
        let pending = {
            let mut state = lock(&self.state);
            match &*state {
                State::Ready {
                    conn, generation, ..
                } => return Ok((conn.clone(), *generation)),
                State::Connecting { pending, .. } => pending.clone(),
                State::Idle => {
                    let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
                    let pending = self.spawn_connect(generation);
                    *state = State::Connecting {
                        pending: pending.clone(),
                        generation,
                    };
                    pending
                }
            }
        };
        pending
            .await
            .map_err(|(kind, message)| StoreError::new(kind, message))
    }

    fn spawn_connect(&self, generation: u64) -> Shared<BoxFuture<'static, ConnectResult>> {
        let connector = Arc::clone(&self.connector);
        let state = Arc::clone(&self.state);
        let timeout = self.connect_timeout;
        let task_state = Arc::clone(&state);
        let task = tokio::spawn(async move {
            let result = connect(&connector, timeout, Use::Shared).await;
            let mut state = lock(&task_state);
            match result {
                Ok((conn, keeper)) => {
                    *state = State::Ready {
                        conn: conn.clone(),
                        generation,
                        _keeper: Arc::new(keeper),
                    };
                    Ok((conn, generation))
                }
                Err(error) => {
                    *state = State::Idle;
                    Err((error.kind(), error.message().to_owned()))
                }
            }
        });
        async move {
            task.await.unwrap_or_else(|_| {
                // The task's runtime shut down before it finished: let the
                // next call start over instead of keeping this failure.
                let mut state = lock(&state);
                if matches!(&*state, State::Connecting { generation: g, .. } if *g == generation) {
                    *state = State::Idle;
                }
                Err((
                    StoreErrorKind::Unavailable,
                    "the redis connect task was cancelled".to_owned(),
                ))
            })
        }
        .boxed()
        .shared()
    }

    /// A connection of its own, never shared with the store's calls (for
    /// a reader that blocks, such as the tenant registry's `XREAD BLOCK`);
    /// from a pool, one checked out for as long as it is held.
    pub(crate) async fn dedicated(&self) -> Result<Dedicated, StoreError> {
        let (conn, keeper) = connect(&self.connector, self.connect_timeout, Use::Dedicated).await?;
        Ok(Dedicated {
            conn,
            _keeper: keeper,
        })
    }

    /// Drops the connection of `generation` after a connection-level error,
    /// so the next call connects again. Cluster connections heal themselves.
    pub(crate) fn invalidate(&self, generation: u64) {
        if self.is_cluster() {
            return;
        }
        let mut state = lock(&self.state);
        if matches!(&*state, State::Ready { generation: g, .. } if *g == generation) {
            *state = State::Idle;
        }
    }
}

/// What a connection is for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Use {
    /// The store's shared connection: calls with a time budget each.
    Shared,
    /// A connection of its own that may block (`XREAD BLOCK`).
    Dedicated,
}

/// How often the cluster client retries a call itself: enough to follow a
/// `MOVED` and then an `ASK` redirect. Everything else (`CLUSTERDOWN`,
/// `TRYAGAIN`, a refused connection) comes back to the limiter, whose
/// retries fit its time budget and never repeat a call that may have run.
/// redis-rs's default (16 retries, waits from 1.28 s) outlasts any budget,
/// so during a failover every call used to time out instead of failing.
const CLUSTER_RETRIES: u32 = 2;
/// The cluster client's wait before its own retry: 1 ms up to
/// `2 * 2^retry` ms (4, 8), at most 10 ms.
const CLUSTER_RETRY_WAIT_MIN_MS: u64 = 1;
const CLUSTER_RETRY_WAIT_MAX_MS: u64 = 10;

/// Connects within `timeout`.
async fn connect(
    connector: &Connector,
    timeout: Duration,
    usage: Use,
) -> Result<(Conn, Keeper), StoreError> {
    let connecting = async {
        match connector {
            Connector::Client(client) => {
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(timeout))
                    // Each call has its own deadline (see RedisStore::timeout).
                    .set_response_timeout(None);
                let conn = client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await
                    .map_err(map_error)?;
                Ok((Conn::Single(conn), None))
            }
            Connector::Pool(pool) => {
                let pooled = pool.get().await.map_err(map_pool_error)?;
                Ok((Conn::Single((*pooled).clone()), Some(Box::new(pooled) as _)))
            }
            Connector::Cluster(nodes, tls) => {
                let mut builder = tls
                    .cluster(ClusterClient::builder(nodes.clone()))
                    .connection_timeout(timeout)
                    .retries(CLUSTER_RETRIES)
                    .min_retry_wait(CLUSTER_RETRY_WAIT_MIN_MS)
                    .max_retry_wait(CLUSTER_RETRY_WAIT_MAX_MS)
                    .retry_wait_formula(2, 2)
                    .tcp_settings(no_delay_settings());
                if usage == Use::Shared {
                    // Bounds the client's own commands too (its slot refresh
                    // asks every known node in turn, holding its routing table
                    // meanwhile): a primary that vanished without closing its
                    // sockets would otherwise stall every call for good.
                    builder = builder.response_timeout(timeout);
                }
                let client = builder.build().map_err(map_error)?;
                let conn = client.get_async_connection().await.map_err(map_error)?;
                Ok((Conn::Cluster(conn), None))
            }
            Connector::ClusterPool(pool) => {
                let pooled = pool.get().await.map_err(map_pool_error)?;
                Ok((
                    Conn::Cluster((*pooled).clone()),
                    Some(Box::new(pooled) as _),
                ))
            }
        }
    };
    tokio::time::timeout(timeout, connecting)
        .await
        .unwrap_or_else(|_| {
            Err(StoreError::new(
                StoreErrorKind::Timeout,
                format!("connecting to redis took longer than {timeout:?}"),
            ))
        })
}

/// Whether `error` means the connection itself is gone.
pub(crate) fn is_connection_error(error: &RedisError) -> bool {
    error.is_io_error()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || error.is_unrecoverable_error()
}

/// Whether the server certainly did not execute the command that failed
/// with `error`, so that sending it again cannot apply it twice.
///
/// True only when the command never reached a server that could run it:
/// the connection was refused or never made (nothing was sent), or the
/// server refused it before running it ([`refused_unrun`]). False for
/// everything else: an I/O error or a dropped connection after sending, a
/// timeout, and any error not known to be safe.
pub(crate) fn script_cannot_have_run(error: &RedisError) -> bool {
    if error.is_timeout() {
        return false;
    }
    // Connecting failed: nothing was sent. `is_connection_dropped` also
    // says yes for these, so they are checked first.
    error.is_connection_refusal()
        || io_kind(error) == Some(std::io::ErrorKind::NotConnected)
        || refused_unrun(error)
}

/// Whether a node refused the command before running it: `CLUSTERDOWN`,
/// `TRYAGAIN`, `MOVED`, `ASK`, `MASTERDOWN`, `LOADING`, `READONLY` (a
/// replica runs no writes), `NOSCRIPT` (the script is not loaded), or the
/// cluster connection found no connection to send it on.
fn refused_unrun(error: &RedisError) -> bool {
    matches!(
        error.kind(),
        ErrorKind::Server(
            ServerErrorKind::ClusterDown
                | ServerErrorKind::TryAgain
                | ServerErrorKind::Moved
                | ServerErrorKind::Ask
                | ServerErrorKind::MasterDown
                | ServerErrorKind::BusyLoading
                | ServerErrorKind::ReadOnly
                | ServerErrorKind::NoScript,
        ) | ErrorKind::ClusterConnectionNotFound
    )
}

/// Whether `error` says the cluster's topology changed, so the slot map
/// (`topology::TopologyCache`) should be refreshed: a [`refused_unrun`]
/// error other than `LOADING` and `NOSCRIPT` (a `READONLY` primary was
/// demoted), or a refused connection. Call it for cluster stores only: on
/// a single node, a refused connection is just that.
pub(crate) fn is_topology_change(error: &RedisError) -> bool {
    let node_state = matches!(
        error.kind(),
        ErrorKind::Server(ServerErrorKind::BusyLoading | ServerErrorKind::NoScript)
    );
    error.is_connection_refusal() || (refused_unrun(error) && !node_state)
}

/// The kind of the `io::Error` inside `error`, if it wraps one.
fn io_kind(error: &RedisError) -> Option<std::io::ErrorKind> {
    type Shared = Arc<dyn std::error::Error + Send + Sync>;
    let source = std::error::Error::source(error)?;
    // redis-rs keeps the io::Error in an Arc and hands out the Arc.
    let inner: &(dyn std::error::Error + 'static) = match source.downcast_ref::<Shared>() {
        Some(shared) => &**shared,
        None => source,
    };
    inner
        .downcast_ref::<std::io::Error>()
        .map(std::io::Error::kind)
}

/// Maps a redis error onto the store's error kinds.
pub(crate) fn map_error(error: RedisError) -> StoreError {
    let kind = if error.is_timeout() {
        StoreErrorKind::Timeout
    } else if is_connection_error(&error)
        || (refused_unrun(&error) && error.kind() != ErrorKind::Server(ServerErrorKind::NoScript))
        // Redis itself is out of memory or stuck in a script: the store's
        // health, not our own overload, so it counts against the breaker.
        || matches!(error.code(), Some("OOM" | "BUSY"))
        || matches!(
            error.kind(),
            ErrorKind::AuthenticationFailed | ErrorKind::InvalidClientConfig
        )
    {
        StoreErrorKind::Unavailable
    } else {
        StoreErrorKind::Protocol
    };
    let mut mapped = StoreError::new(kind, format!("redis: {error}"));
    mapped.not_applied = script_cannot_have_run(&error);
    mapped.with_source(error)
}

/// Maps a pool error: waiting out the pool, a closed pool and a failed
/// hook sent no command (not applied); an error of making a connection is
/// mapped as [`map_error`] maps it.
fn map_pool_error(error: deadpool_redis::PoolError) -> StoreError {
    use deadpool_redis::PoolError;
    let (kind, message) = match error {
        PoolError::Backend(error) => return map_error(error),
        PoolError::Timeout(_) => (
            StoreErrorKind::Overloaded,
            "redis pool: timed out waiting for a connection".to_owned(),
        ),
        PoolError::Closed => (
            StoreErrorKind::Unavailable,
            "redis pool is closed".to_owned(),
        ),
        PoolError::NoRuntimeSpecified => (
            StoreErrorKind::InvalidRequest,
            "redis pool has timeouts but no runtime".to_owned(),
        ),
        PoolError::PostCreateHook(error) => (
            StoreErrorKind::Unavailable,
            format!("redis pool hook: {error}"),
        ),
    };
    StoreError::new(kind, message).not_applied()
}

/// TCP settings of every connection the store opens itself: `TCP_NODELAY`
/// on. redis-rs leaves Nagle's algorithm on by default, and a multiplexed
/// connection writes many small commands while earlier ones are still
/// unanswered: with Nagle a small write can wait for the acknowledgement
/// of the previous one, up to the peer's delayed-ACK timer (40 ms on
/// Linux).
pub(crate) fn no_delay_settings() -> redis::io::tcp::TcpSettings {
    redis::io::tcp::TcpSettings::default().set_nodelay(true)
}

/// `info` with [`no_delay_settings`].
pub(crate) fn no_delay(info: redis::ConnectionInfo) -> redis::ConnectionInfo {
    info.set_tcp_settings(no_delay_settings())
}

#[cfg(test)]
mod tests {
    use std::io;

    use super::*;

    fn io(kind: io::ErrorKind) -> RedisError {
        RedisError::from(io::Error::new(kind, "test"))
    }

    fn server(kind: ServerErrorKind) -> RedisError {
        RedisError::from((ErrorKind::Server(kind), "test"))
    }

    #[test]
    fn errors_that_prove_the_script_did_not_run() {
        for error in [
            io(io::ErrorKind::ConnectionRefused),
            io(io::ErrorKind::NotConnected),
            server(ServerErrorKind::ClusterDown),
            server(ServerErrorKind::TryAgain),
            server(ServerErrorKind::Moved),
            server(ServerErrorKind::Ask),
            server(ServerErrorKind::MasterDown),
            server(ServerErrorKind::BusyLoading),
            server(ServerErrorKind::ReadOnly),
            server(ServerErrorKind::NoScript),
            RedisError::from((ErrorKind::ClusterConnectionNotFound, "no connection")),
        ] {
            assert!(script_cannot_have_run(&error), "{error:?}");
        }
    }

    #[test]
    fn errors_after_sending_or_unknown_may_have_run() {
        for error in [
            io(io::ErrorKind::ConnectionReset),
            io(io::ErrorKind::BrokenPipe),
            io(io::ErrorKind::ConnectionAborted),
            io(io::ErrorKind::UnexpectedEof),
            io(io::ErrorKind::TimedOut),
            io(io::ErrorKind::WouldBlock),
            io(io::ErrorKind::Other),
            // redis-rs's own "connection dropped" errors carry no io::Error.
            RedisError::from((
                ErrorKind::Io,
                "Multiplexed connection driver unexpectedly terminated",
            )),
            server(ServerErrorKind::ResponseError),
            server(ServerErrorKind::ExecAbort),
            RedisError::from((ErrorKind::Parse, "garbled reply")),
            RedisError::from((ErrorKind::Extension, "BUSY")),
            RedisError::from((ErrorKind::UnexpectedReturnType, "odd reply")),
        ] {
            assert!(!script_cannot_have_run(&error), "{error:?}");
        }
    }

    #[test]
    fn pool_errors() {
        use deadpool_redis::PoolError;
        let not_applied = |error| map_pool_error(error).is_not_applied();
        assert!(not_applied(PoolError::Timeout(
            deadpool_redis::TimeoutType::Wait
        )));
        assert!(not_applied(PoolError::Closed));
        assert!(not_applied(PoolError::Backend(io(
            io::ErrorKind::ConnectionRefused
        ))));
        assert!(!not_applied(PoolError::Backend(io(
            io::ErrorKind::ConnectionReset
        ))));
    }

    #[test]
    fn topology_changes() {
        for error in [
            server(ServerErrorKind::Moved),
            server(ServerErrorKind::Ask),
            server(ServerErrorKind::ClusterDown),
            server(ServerErrorKind::TryAgain),
            server(ServerErrorKind::MasterDown),
            server(ServerErrorKind::ReadOnly),
            io(io::ErrorKind::ConnectionRefused),
            RedisError::from((ErrorKind::ClusterConnectionNotFound, "no connection")),
        ] {
            assert!(is_topology_change(&error), "{error:?}");
        }
        for error in [
            io(io::ErrorKind::TimedOut),
            io(io::ErrorKind::ConnectionReset),
            server(ServerErrorKind::NoScript),
            server(ServerErrorKind::BusyLoading),
            server(ServerErrorKind::ResponseError),
        ] {
            assert!(!is_topology_change(&error), "{error:?}");
        }
    }
}
