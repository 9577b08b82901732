//! The store conformance suite, unchanged, on `RedisStore`: a real
//! `redis-server` and a real 3-primary Redis Cluster.
//!
//! The stores take "now" from the suite's `ManualClock` (passed to the Lua
//! scripts as an explicit timestamp); everything else is production code.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tower_window::{ManualClock, RedisStore};
use tower_window_tests::conformance::StoreFactory;
use tower_window_tests::redis_cluster::RedisCluster;
use tower_window_tests::redis_server::RedisServer;

/// Generous: the suite asserts decisions, not latency, and CI machines are small.
const TIMEOUT: Duration = Duration::from_secs(5);

/// RedisStores on one shared test server.
struct SingleRedis(Arc<RedisServer>);

impl SingleRedis {
    fn new() -> Self {
        Self(RedisServer::shared())
    }
}

impl StoreFactory for SingleRedis {
    type Store = RedisStore;

    fn make(&self, clock: ManualClock) -> impl Future<Output = RedisStore> + Send {
        let store = RedisStore::from_url(&self.0.url())
            .expect("valid url")
            .prefix("conformance:")
            .timeout(TIMEOUT)
            .clock(clock);
        std::future::ready(store)
    }
}

/// RedisStores on one shared test cluster.
struct ClusterRedis(Arc<RedisCluster>);

impl ClusterRedis {
    fn new() -> Self {
        Self(RedisCluster::shared())
    }
}

impl StoreFactory for ClusterRedis {
    type Store = RedisStore;

    fn make(&self, clock: ManualClock) -> impl Future<Output = RedisStore> + Send {
        let store = RedisStore::cluster(self.0.urls())
            .expect("valid urls")
            .prefix("conformance:")
            .timeout(TIMEOUT)
            .clock(clock);
        std::future::ready(store)
    }
}

mod single {
    tower_window_tests::conformance_tests!(super::SingleRedis::new());
}

mod cluster {
    tower_window_tests::conformance_tests!(super::ClusterRedis::new());
}
