//! A store's circuit breakers: one state machine ([`machine`]) per failure
//! domain ([`shards`]), configured by one [`BreakerConfig`].

mod config;
mod machine;
mod shards;
mod window;

pub use config::BreakerConfig;
pub use machine::BreakerState;
pub(crate) use machine::{Breaker, Ticket};
pub(crate) use shards::Breakers;
