//! The store's one shared connection, cloned per call (a handle, not a
//! socket). It is made on first use by a background task, so one caller's
//! deadline never cuts a slow connect short for everyone, and made again
//! only after a connection-level error.

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
    Client(redis::Client),
    Pool(deadpool_redis::Pool),
    /// Seed nodes, and the TLS settings for every node.
    Cluster(Vec<redis::ConnectionInfo>, super::tls::TlsSettings),
    ClusterPool(deadpool_redis::cluster::Pool),
}

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

/// A pooled connection, checked out until dropped.
type Keeper = Option<Box<dyn std::any::Any + Send + Sync>>;

type ConnectResult = Result<(Conn, u64), (StoreErrorKind, String)>;

enum State {
    /// No connection; `generation` is the last one's (0: none yet).
    Idle { generation: u64 },
    Connecting {
        pending: Shared<BoxFuture<'static, ConnectResult>>,
        generation: u64,
    },
    Ready {
        conn: Conn,
        generation: u64,
        _keeper: Keeper,
    },
}

#[derive(Clone)]
pub(crate) struct Connection {
    connector: Arc<Connector>,
    state: Arc<Mutex<State>>,
    connect_timeout: Duration,
}

impl Connection {
    pub(crate) fn new(connector: Connector, connect_timeout: Duration) -> Self {
        Self {
            connector: Arc::new(connector),
            state: Arc::new(Mutex::new(State::Idle { generation: 0 })),
            connect_timeout,
        }
    }

    pub(crate) fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The client of a store made from a URL.
    pub(crate) fn client(&self) -> Option<redis::Client> {
        match &*self.connector {
            Connector::Client(client) => Some(client.clone()),
            _ => None,
        }
    }

    /// The URL's server, or the first cluster seed (whose credentials and
    /// settings every node shares); `None` for a pool.
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
                State::Idle { generation } => {
                    let generation = generation + 1;
                    let pending = self.spawn_connect(generation);
                    *state = State::Connecting {
                        pending: pending.clone(),
                        generation,
                    };
                    pending
                }
            }
        };
        // A connection that could not be made sent nothing.
        pending
            .await
            .map_err(|(kind, message)| StoreError::new(kind, message).not_applied())
    }

    fn spawn_connect(&self, generation: u64) -> Shared<BoxFuture<'static, ConnectResult>> {
        let connector = Arc::clone(&self.connector);
        let state = Arc::clone(&self.state);
        let timeout = self.connect_timeout;
        let task_state = Arc::clone(&state);
        let task = tokio::spawn(async move {
            let result = connect(&connector, timeout, Some(timeout)).await;
            let mut state = lock(&task_state);
            match result {
                Ok((conn, keeper)) => {
                    *state = State::Ready {
                        conn: conn.clone(),
                        generation,
                        _keeper: keeper,
                    };
                    Ok((conn, generation))
                }
                Err(error) => {
                    *state = State::Idle { generation };
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
                    *state = State::Idle { generation };
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

    /// A connection of its own, for a reader that blocks (`XREAD BLOCK`);
    /// from a pool, one checked out while it is held.
    pub(crate) async fn dedicated(&self) -> Result<Dedicated, StoreError> {
        let (conn, keeper) = connect(&self.connector, self.connect_timeout, None).await?;
        Ok(Dedicated {
            conn,
            _keeper: keeper,
        })
    }

    /// Drops the connection of `generation` after a connection-level error
    /// (a cluster connection heals itself).
    pub(crate) fn invalidate(&self, generation: u64) {
        if self.is_cluster() {
            return;
        }
        let mut state = lock(&self.state);
        if matches!(&*state, State::Ready { generation: g, .. } if *g == generation) {
            *state = State::Idle { generation };
        }
    }
}

/// The cluster client's own retries: enough to follow a `MOVED` and then an
/// `ASK`. Other errors come back to the store, whose retries fit its budget
/// and never repeat a call that may have run (redis-rs's default waits
/// outlast any budget).
const CLUSTER_RETRIES: u32 = 2;
/// Its wait before a retry: `2 * 2^retry` ms within 1..=10 ms.
const CLUSTER_RETRY_WAIT_MIN_MS: u64 = 1;
const CLUSTER_RETRY_WAIT_MAX_MS: u64 = 10;

/// A connection by `connector` within `timeout`; on a cluster, each reply
/// within `cluster_replies` (the store's calls), or unbounded (a reader
/// that blocks).
async fn connect(
    connector: &Connector,
    timeout: Duration,
    cluster_replies: Option<Duration>,
) -> Result<(Conn, Keeper), StoreError> {
    let connecting = async {
        match connector {
            Connector::Client(client) => {
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(timeout))
                    // Each call has its own deadline.
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
                if let Some(bound) = cluster_replies {
                    // Also bounds the client's own slot refresh, which holds
                    // its routing table while it asks each node: a primary
                    // gone without closing its sockets would stall every call.
                    builder = builder.response_timeout(bound);
                }
                let client = builder.build().map_err(map_error)?;
                let conn = client.get_async_connection().await.map_err(map_error)?;
                Ok((Conn::Cluster(conn), None))
            }
            Connector::ClusterPool(pool) => {
                let pooled = pool.get().await.map_err(map_pool_error)?;
                let conn = Conn::Cluster((*pooled).clone());
                Ok((conn, Some(Box::new(pooled) as _)))
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

/// Whether the server certainly did not run the command that failed with
/// `error` (nothing was sent, or [`refused_unrun`]), so sending it again
/// cannot apply it twice. False for any error not known to be safe.
pub(crate) fn script_cannot_have_run(error: &RedisError) -> bool {
    if error.is_timeout() {
        return false;
    }
    // Connecting failed: nothing was sent.
    error.is_connection_refusal()
        || io_kind(error) == Some(std::io::ErrorKind::NotConnected)
        || refused_unrun(error)
}

/// Whether a node refused the command before running it, or the cluster
/// connection had none to send it on.
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

/// Whether `error` on a cluster says its topology changed (so the slot map
/// is due): a refused connection, or a [`refused_unrun`] error other than
/// `LOADING` and `NOSCRIPT` (`READONLY`: a primary was demoted).
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
    // redis-rs hands out the io::Error in an Arc.
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
        // The store's health, not our own overload: counts for the breaker.
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

/// Maps a pool error: all but a connection error sent no command.
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

/// `TCP_NODELAY` for every connection the store opens: with Nagle's
/// algorithm (redis-rs's default) a multiplexed connection's small writes
/// can wait for the peer's delayed ACK (40 ms on Linux).
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
