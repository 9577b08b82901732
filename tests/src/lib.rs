//! Cross-crate integration tests and shared test harnesses for tower-window.
//!
//! [`redis_server::RedisServer`] and [`redis_cluster::RedisCluster`] spawn
//! throwaway `redis-server` processes on loopback for the `redis_*` tests.

pub mod conformance;
pub mod conn_conformance;
pub mod dedup_conformance;
pub mod differential;
pub mod event_conformance;
pub mod fault_load;
pub mod fault_proxy;
pub mod lease_conformance;
pub mod redis_cluster;
pub mod redis_server;
pub mod shared;
