//! The Tower middleware: [`SlidingWindowLayer`] and [`SlidingWindow`].
//!
//! For each request the layer extracts a key, weighs the request with a
//! [`RequestCost`] and checks it against the [`Limiter`](crate::Limiter);
//! only an admitted request reaches the inner service.
//!
//! # HTTP (the default mode, [`Http`])
//!
//! - Admitted: the [`Decision`](crate::Decision) goes into the request's
//!   extensions, and the response gets `RateLimit` and `RateLimit-Policy`
//!   headers (see [`insert_rate_limit_headers`]).
//! - Denied: `429` from an [`OnRejection`] (default [`DefaultRejection`]),
//!   with `Retry-After` and the same headers; the [`Rejection`] is in the
//!   response's extensions.
//! - No key: [`MissingKey`]; a key too long: `400` ([`Rejection::KeyTooLong`]).
//! - Limiter failure: `503` ([`Rejection::Unavailable`]).
//! - Degraded (the [`FallbackPolicy`](crate::FallbackPolicy) answers): an
//!   admission goes through with `source = Fallback(reason)`; a denial is a
//!   [`Rejection::Degraded`] with the layer's
//!   [`degraded_status`](SlidingWindowLayer::degraded_status).
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
//! `SlidingWindowLayer::grpc` answers tonic callers with gRPC statuses and
//! sends the `RateLimit` headers as metadata; see `Grpc`.
//!
//! # Any other service ([`Typed`])
//!
//! [`typed_errors`](SlidingWindowLayer::typed_errors): a rejection is the
//! service's error, a boxed [`Rejection`].
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
#[cfg(feature = "http")]
mod metered;
#[cfg(feature = "http")]
mod metering;
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
pub use metered::{HeadCount, HeadUsage, MeterUsage, Metered, Usage, UsageCounter};
#[cfg(feature = "http")]
pub use metering::{Meter, Metering};
#[cfg(feature = "http")]
pub use rejection::OnRejection;
pub use rejection::{DefaultRejection, Rejection};
pub use respond::{Admission, BoxError, Http, Respond, Typed};
pub use seconds::ceil_secs;
pub use service::SlidingWindow;
pub use status::Status;
