//! The Tower middleware: [`SlidingWindowLayer`] and [`SlidingWindow`].
//!
//! For each request the layer asks its [`KeyExtractor`](crate::KeyExtractor)
//! for a key, weighs the request with a [`RequestCost`], and checks it
//! against the [`Limiter`](crate::Limiter). Only an admitted request reaches
//! the inner service.
//!
//! # HTTP (the default mode, [`Http`])
//!
//! - Admitted: the [`Decision`](crate::Decision) is in the request's
//!   extensions for handlers, and the response carries `RateLimit` and
//!   `RateLimit-Policy` headers (draft-ietf-httpapi-ratelimit-headers;
//!   legacy `X-RateLimit-*` ones with
//!   [`legacy_headers(true)`](SlidingWindowLayer::legacy_headers)).
//!   `RateLimit` describes the tightest enforced quota: shadow quotas are
//!   only listed in `RateLimit-Policy`, and a policy of shadow quotas only
//!   sends no `RateLimit` (see [`insert_rate_limit_headers`]).
//! - Denied: `429 Too Many Requests` built by an [`OnRejection`] (by default
//!   [`DefaultRejection`], an empty body), with `Retry-After` in whole
//!   seconds rounded up (absent when the cost can never fit), the same
//!   `RateLimit` headers, and the [`Rejection`] in the response's extensions.
//! - No key: [`MissingKey::Reject`] (400 by default) or [`MissingKey::Skip`].
//! - A key longer than the extractor accepts (`key::DEFAULT_MAX_LEN`, 1024
//!   bytes, by default): `400 Bad Request` ([`Rejection::KeyTooLong`], whose
//!   docs say why not `431`), whatever the missing-key policy.
//! - Limiter failure: `503 Service Unavailable` ([`Rejection::Unavailable`]).
//! - Degraded (the store cannot decide, the limiter's
//!   [`FallbackPolicy`](crate::FallbackPolicy) answers): an admission reaches
//!   the inner service with a [`Decision`](crate::Decision) whose `source` is
//!   `Fallback(reason)`; a denial is a [`Rejection::Degraded`] answered with
//!   the layer's [`degraded_status`](SlidingWindowLayer::degraded_status)
//!   (`503` by default, `429` if so configured) and `Retry-After`.
//!
//! ```
//! use std::convert::Infallible;
//! use tower::{Service, ServiceBuilder, ServiceExt};
//! use tower_window::layer::{MissingKey, SlidingWindowLayer};
//! use tower_window::{key::Header, Decision, Limiter, MemoryStore, Quota};
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let limiter = Limiter::new(MemoryStore::new(), "2/1m".parse::<Quota>()?);
//! let layer = SlidingWindowLayer::new(limiter, Header::new("x-api-key")?)
//!     .cost(|req: &http::Request<String>| if req.method() == "POST" { 2 } else { 1 })
//!     .on_missing_key(MissingKey::Reject(http::StatusCode::UNAUTHORIZED.into()));
//! let mut service = ServiceBuilder::new().layer(layer).service_fn(|req: http::Request<String>| async move {
//!     let remaining = req.extensions().get::<Decision>().map_or(0, |d| d.remaining());
//!     Ok::<_, Infallible>(http::Response::new(format!("{remaining} left")))
//! });
//!
//! let request = || http::Request::builder().header("x-api-key", "k1").body(String::new());
//! let response = service.ready().await?.call(request()?).await?;
//! assert_eq!(response.body(), "1 left");
//! assert_eq!(response.headers()["ratelimit"], r#""default";r=1;t=60"#);
//! assert_eq!(response.headers()["ratelimit-policy"], r#""default";q=2;w=60"#);
//!
//! service.ready().await?.call(request()?).await?;
//! let denied = service.ready().await?.call(request()?).await?;
//! assert_eq!(denied.status(), 429);
//! assert!(denied.headers().contains_key("retry-after"));
//!
//! let anonymous = service.ready().await?.call(http::Request::new(String::new())).await?;
//! assert_eq!(anonymous.status(), 401);
//! # Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
//! # }).unwrap();
//! ```
//!
//! # gRPC (`Grpc`, feature `grpc`)
//!
//! `SlidingWindowLayer::grpc` answers tonic callers in their protocol: a
//! denial is a trailers-only `RESOURCE_EXHAUSTED` with a
//! `google.rpc.RetryInfo` detail (a degraded one `UNAVAILABLE`, a missing
//! key or one too long `INVALID_ARGUMENT`, each with its own message), and the `RateLimit` headers travel as response
//! metadata. `key::Metadata` and `key::GrpcMethod` key calls by metadata
//! and by method. See `Grpc` for an example.
//!
//! # Any other service ([`Typed`])
//!
//! [`typed_errors`](SlidingWindowLayer::typed_errors) turns the layer into
//! one for any `Service<Req>`: a rejection is the error, a boxed
//! [`Rejection`]; inner errors are boxed unchanged.
//!
//! ```
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_window::layer::{Rejection, SlidingWindowLayer};
//! use tower_window::{key::Constant, Limiter, MemoryStore, Quota};
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let limiter = Limiter::new(MemoryStore::new(), "1/1h".parse::<Quota>()?);
//! let service = ServiceBuilder::new()
//!     .layer(SlidingWindowLayer::new(limiter, Constant::new("jobs")).typed_errors())
//!     .service_fn(|job: u64| async move { Ok::<_, std::io::Error>(job * 2) });
//!
//! assert_eq!(service.clone().oneshot(21).await?, 42);
//! let error = service.oneshot(21).await.unwrap_err();
//! let rejection = error.downcast_ref::<Rejection>().unwrap();
//! assert_eq!(rejection.status(), 429);
//! # Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
//! # }).unwrap();
//! ```

mod cost;
mod future;
#[cfg(feature = "grpc")]
mod grpc;
#[cfg(feature = "http")]
mod headers;
#[allow(clippy::module_inception)]
mod layer;
mod rejection;
mod respond;
mod seconds;
mod service;
mod status;

pub use cost::{RequestCost, UnitCost};
pub use future::ResponseFuture;
#[cfg(feature = "grpc")]
pub use grpc::{Grpc, GrpcCode};
#[cfg(feature = "http")]
pub use headers::{insert_rate_limit_headers, insert_retry_after, RateLimitHeaders};
pub use layer::{MissingKey, SlidingWindowLayer};
#[cfg(feature = "http")]
pub use rejection::OnRejection;
pub use rejection::{DefaultRejection, Rejection};
pub use respond::{BoxError, Http, Respond, Typed};
pub use seconds::ceil_secs;
pub use service::SlidingWindow;
pub use status::Status;
