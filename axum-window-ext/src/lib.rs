//! [axum] integration for [`tower_window`].
//!
//! - [`layer`]: a [`SlidingWindowLayer`] answering rejections with RFC 9457
//!   problem+json ([`ProblemJson`]). Put it on a route's method router
//!   (`get(handler).route_layer(layer)`) so only requests the route serves
//!   are charged: `Router::route_layer` also charges axum's `405`s, and
//!   `Router::layer` every request, `404`s included.
//! - [`RateLimitInfo`]: the layer's [`Decision`](tower_window::Decision) in
//!   a handler; [`RejectionResponse`]: a [`Rejection`] a handler can return.
//! - [`PathParam`] and [`ConnectInfoIp`]: key extractors that need axum.
//!
//! ```
//! use axum::{routing::get, Router};
//! use axum_window_ext::RateLimitInfo;
//! use tower_window::key::{Constant, Header, KeyExtractorExt};
//! use tower_window::{Limiter, MemoryStore, Quota};
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let limiter = Limiter::new(MemoryStore::new(), "100/1m".parse::<Quota>()?);
//! // Per user, within the tenant named by `x-tenant-id` (default "public").
//! let key = Header::new("x-user-id")?.with_tenant(Header::new("x-tenant-id")?.or(Constant::new("public")));
//! let hello = get(|RateLimitInfo(d): RateLimitInfo| async move {
//!     format!("hello, {} left", d.remaining())
//! });
//! let app: Router = Router::new().route("/hello", hello.route_layer(axum_window_ext::layer(limiter, key)));
//!
//! use tower::ServiceExt; // `oneshot`
//! let request = http::Request::get("/hello").header("x-user-id", "alice").body(axum::body::Body::empty())?;
//! let response = app.clone().oneshot(request).await?;
//! assert_eq!(response.status(), 200);
//! assert_eq!(response.headers()["ratelimit"], "\"default\";r=99;t=60");
//! // A method the route does not serve is axum's 405, and costs nothing.
//! let request = http::Request::post("/hello").header("x-user-id", "alice").body(axum::body::Body::empty())?;
//! assert_eq!(app.clone().oneshot(request).await?.status(), 405);
//! let request = http::Request::get("/hello").header("x-user-id", "alice").body(axum::body::Body::empty())?;
//! assert_eq!(app.oneshot(request).await?.headers()["ratelimit"], "\"default\";r=98;t=60");
//! # Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
//! # }).unwrap();
//! ```
//!
//! [axum]: https://docs.rs/axum
// docs.rs (`--cfg docsrs`, nightly) marks each feature-gated item with its feature.
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "admin")]
pub mod admin;
mod extract;
mod key;
mod problem;
pub mod ws;

pub use extract::{MissingRateLimitInfo, RateLimitInfo};
pub use key::{ConnectInfoIp, PathParam};
pub use problem::{
    ProblemJson, RejectionResponse, PROBLEM_JSON, TYPE_DEGRADED, TYPE_INVALID_INPUT,
    TYPE_KEY_TOO_LONG, TYPE_MISSING_KEY, TYPE_RATE_LIMITED, TYPE_UNAVAILABLE, TYPE_UNKNOWN_TENANT,
};

pub use tower_window::layer::Rejection;

// The READMEs' Rust examples are doctests of this crate.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct WorkspaceReadme;

#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct CrateReadme;

#[cfg(doctest)]
#[doc = include_str!("../../tower-window/README.md")]
struct CoreReadme;

use tower_window::layer::{Http, UnitCost};
use tower_window::{Limiter, SlidingWindowLayer};

/// A [`SlidingWindowLayer`] answering rejections with [`ProblemJson`].
pub type AxumSlidingWindowLayer<K, C = UnitCost> = SlidingWindowLayer<K, C, Http<ProblemJson>>;

/// `SlidingWindowLayer::new(limiter, key).rejection(ProblemJson::new())`;
/// configure it further like any [`SlidingWindowLayer`].
pub fn layer<K>(limiter: Limiter, key: K) -> AxumSlidingWindowLayer<K> {
    SlidingWindowLayer::new(limiter, key).rejection(ProblemJson::new())
}
