//! Distributed sliding-window rate limiting for [Tower] services.
//!
//! A [`SlidingWindowLayer`] wraps any service: a [`KeyExtractor`] names
//! each request's window, a [`Limiter`] checks it against a [`Quota`] in a
//! [`Store`] ([`MemoryStore`] in process, or Redis), and the request
//! proceeds with `RateLimit` headers or gets `429` with `Retry-After`.
//!
//! ```
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_window::{key::Header, Limiter, MemoryStore, SlidingWindowLayer, Quota};
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let limiter = Limiter::new(MemoryStore::new(), "100/1m".parse::<Quota>()?);
//! let service = ServiceBuilder::new()
//!     .layer(SlidingWindowLayer::new(limiter, Header::new("x-user-id")?))
//!     .service_fn(|_req: http::Request<String>| async {
//!         Ok::<_, std::convert::Infallible>(http::Response::new(String::from("hello")))
//!     });
//! let request = http::Request::builder().header("x-user-id", "alice").body(String::new())?;
//! let response = service.oneshot(request).await?;
//! assert_eq!(response.status(), 200);
//! assert!(response.headers().contains_key("ratelimit"));
//! # Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
//! # }).unwrap();
//! ```
//!
//! [Tower]: https://docs.rs/tower
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod algorithm;
pub mod audit;
mod clock;
pub mod conn;
mod cost;
mod decision;
pub mod dedup;
mod error_debug;
pub mod events;
pub use limit::fallback;
pub mod key;
#[cfg(feature = "tower")]
pub mod layer;
pub mod lease;
pub mod limit;
pub mod metrics;
pub mod quota;
pub mod store;
mod sync;
pub mod tenant;

/// The `bytes` crate this one is built with ([`WindowKey`] parts are `Bytes`).
pub use bytes;
/// The `http` crate of the layer's and the extractors' signatures.
#[cfg(feature = "http")]
pub use http;

pub use algorithm::Algorithm;
pub use audit::AuditLog;
pub use clock::{Clock, ManualClock, MonotonicClock, SystemClock};
pub use conn::{ConnectionLimiter, ConnectionSeat};
pub use cost::{Cost, IntoCost, QuotaCosts, ZeroCost};
pub use decision::{Decision, DecisionSource, FallbackReason, QuotaDecision};
pub use dedup::DedupWindow;
pub use fallback::FallbackPolicy;
pub use key::{KeyExtractor, KeyExtractorExt, WindowKey};
#[cfg(feature = "tower")]
pub use layer::{MissingKey, Rejection, SlidingWindow, SlidingWindowLayer};
pub use limit::{Check, LimitError, Limiter};
pub use limit::{LeaseConfig, LeaseStats, LimiterBuilder, LimiterStats};
pub use quota::{Policy, PolicyError, Quota, QuotaBuilder, QuotaError, Scope};
pub use store::guard::breaker::{BreakerConfig, BreakerState};
pub use store::guard::retry::RetryConfig;
pub use store::{CheckRequest, MemoryStore, Store, StoreBuilder, StoreError, StoreErrorKind};
#[cfg(feature = "redis")]
pub use store::{RedisConfigError, RedisStore, RedisStoreBuilder};

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
