//! The circuit breakers of a store handle: one state machine
//! ([`machine`]) per failure domain ([`shards`]; a Redis Cluster primary),
//! all configured by one [`BreakerConfig`], whose docs say when a breaker
//! opens and how it recovers.

mod config;
mod machine;
mod shards;
mod shared;
mod window;

pub use config::BreakerConfig;
pub use machine::BreakerState;
pub(crate) use machine::{Breaker, Ticket};
pub(crate) use shards::Breakers;
