//! The store conformance suite, unchanged, on `RedisStore`: a real
//! `redis-server` and a real 3-primary Redis Cluster.
//!
//! The stores take "now" from the suite's `ManualClock` (passed to the Lua
//! scripts as an explicit timestamp); everything else is production code.

use std::future::Future;
use std::sync::Arc;

use tower_window::{ManualClock, RedisStore};
use tower_window_tests::conformance::StoreFactory;
use tower_window_tests::redis_cluster::RedisCluster;
use tower_window_tests::redis_server::RedisServer;

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
        let store = RedisStore::builder()
            .url(self.0.url())
            .prefix("conformance:")
            .clock(clock)
            .build()
            .expect("valid url");
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
        let store = RedisStore::builder()
            .cluster(self.0.urls())
            .prefix("conformance:")
            .clock(clock)
            .build()
            .expect("valid urls");
        std::future::ready(store)
    }
}

mod single {
    tower_window_tests::conformance_tests!(super::SingleRedis::new());
}

mod cluster {
    tower_window_tests::conformance_tests!(super::ClusterRedis::new());
}

mod lease_single {
    tower_window_tests::lease_conformance_tests!(super::SingleRedis::new());
}

mod lease_cluster {
    tower_window_tests::lease_conformance_tests!(super::ClusterRedis::new());
}
