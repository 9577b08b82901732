//! A circuit breaker in front of the store.
//!
//! Closed, every check reaches the store and its outcome is counted. After
//! [`consecutive_failures`](BreakerConfig::consecutive_failures) failures in a
//! row, a [`failure_ratio`](BreakerConfig::failure_ratio) over a rolling
//! window with enough calls, or a share of [slow calls](BreakerConfig::slow_calls)
//! over the same window, the breaker opens: checks go straight to the
//! fallback without touching the store. After the
//! [`cooldown`](BreakerConfig::cooldown) it is half-open: a few probe checks
//! reach the store; one fast success closes it, a failure or a slow success
//! opens it again.
//!
//! Time comes from the store handle's [`Clock`](crate::Clock); a call's latency is measured by
//! the caller and passed to [`Breaker::success`].
//!
//! # One breaker per failure domain
//!
//! A store may name independent failure domains for its requests
//! ([`limit::Backend::failure_domain`](crate::limit::Backend::failure_domain): for a Redis Cluster, the primary
//! that serves the key). The store handle then keeps one breaker per failure
//! domain, each with the same [`BreakerConfig`], created on the first check
//! that reaches that domain (at most [`MAX_SHARDS`](shards::MAX_SHARDS) of them, plus one
//! store-wide breaker for requests without a domain). A dead cluster primary
//! opens its own breaker only; keys served by healthy primaries keep reaching
//! the store.

mod config;
mod machine;
mod shards;
mod shared;
mod window;

pub use config::BreakerConfig;
pub use machine::BreakerState;
pub(crate) use machine::{Breaker, Ticket};
pub(crate) use shards::Breakers;
