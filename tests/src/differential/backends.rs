//! The stores every case runs on: a fresh `MemoryStore` per case, one real
//! Redis and one real 3-primary Redis Cluster per test binary, all on one
//! `ManualClock` (the Redis stores pass its readings to their scripts).

use std::sync::Arc;

use tower_window::{ManualClock, MemoryStore, RedisStore};

use crate::conformance::START;
use crate::redis_cluster::RedisCluster;
use crate::redis_server::RedisServer;

/// The names stores go by in messages and counts.
pub const STORES: [&str; 3] = ["memory", "redis", "cluster"];

/// Shared servers, their stores and the clock.
pub struct Backends {
    /// The clock every store decides by.
    pub clock: ManualClock,
    /// A store on the single Redis.
    pub redis: Arc<RedisStore>,
    /// A store on the cluster.
    pub cluster: Arc<RedisStore>,
    /// A plain connection to the single Redis (inspection, snapshots).
    pub redis_admin: redis::aio::MultiplexedConnection,
    /// A cluster connection (routes by key) for the same.
    pub cluster_admin: redis::cluster_async::ClusterConnection,
    /// A nonce of this process: keys of two runs on one server never meet.
    pub nonce: u64,
    // Kept alive (and killed on drop) with the stores.
    _server: Arc<RedisServer>,
    _nodes: Arc<RedisCluster>,
}

impl Backends {
    /// Starts (or joins) this binary's Redis and cluster and builds the
    /// stores on a clock at [`START`].
    pub fn start(runtime: &tokio::runtime::Runtime) -> Self {
        let server = RedisServer::shared();
        let nodes = RedisCluster::shared();
        let clock = ManualClock::new(START);
        let redis = RedisStore::builder()
            .url(server.url())
            .clock(clock.clone())
            .build()
            .expect("a redis url");
        let cluster = RedisStore::builder()
            .cluster(nodes.urls())
            .clock(clock.clone())
            .build()
            .expect("cluster urls");
        let (redis_admin, cluster_admin) = runtime.block_on(async {
            let single = server.async_connection().await;
            let cluster = redis::cluster::ClusterClient::new(nodes.urls())
                .expect("cluster urls")
                .get_async_connection()
                .await
                .expect("a cluster connection");
            (single, cluster)
        });
        Self {
            clock,
            redis: Arc::new(redis),
            cluster: Arc::new(cluster),
            redis_admin,
            cluster_admin,
            nonce: crate::redis_server::random() & 0xff_ffff,
            _server: server,
            _nodes: nodes,
        }
    }

    /// A new embedded store on the shared clock (one per case: its state
    /// starts empty like the case's fresh keys on Redis).
    pub fn memory(&self) -> MemoryStore {
        MemoryStore::builder().clock(self.clock.clone()).build()
    }

    /// A key namespace unique to execution `run` of this process.
    pub fn namespace(&self, run: u64) -> String {
        format!("d{:x}r{run}", self.nonce)
    }

    /// An admin connection to the server behind store `index` (1: the
    /// single Redis, 2: the cluster).
    pub fn admin(&self, index: usize) -> Admin {
        match index {
            1 => Admin::Single(self.redis_admin.clone()),
            _ => Admin::Cluster(self.cluster_admin.clone()),
        }
    }
}

/// A connection for commands of the test itself (not of a store).
pub enum Admin {
    /// To the single Redis.
    Single(redis::aio::MultiplexedConnection),
    /// To the cluster, routed by key.
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Admin {
    /// Runs `cmd`.
    pub async fn query<T: redis::FromRedisValue>(
        &mut self,
        cmd: &redis::Cmd,
    ) -> redis::RedisResult<T> {
        match self {
            Self::Single(conn) => cmd.query_async(conn).await,
            Self::Cluster(conn) => cmd.query_async(conn).await,
        }
    }
}
