//! [`RateLimitInfo`]: the layer's [`Decision`] in a handler.

use std::convert::Infallible;
use std::fmt;

use axum::extract::{FromRequestParts, OptionalFromRequestParts};
use axum::response::{IntoResponse, Response};
use http::request::Parts;
use http::StatusCode;
use tower_window::Decision;

/// The [`Decision`] the rate-limit layer made for this request (from the
/// request's extensions).
///
/// Where no layer ran, extraction fails with [`MissingRateLimitInfo`]
/// (500); extract `Option<RateLimitInfo>` where the layer is optional.
/// When `decision.quota().is_shadow()` nothing is enforced: like the
/// layer's `RateLimit` header, do not present its figures as a limit.
///
/// ```
/// use axum::{routing::get, Router};
/// use axum_window_ext::RateLimitInfo;
///
/// async fn hello(RateLimitInfo(decision): RateLimitInfo) -> String {
///     format!("hello; {} requests left", decision.remaining())
/// }
///
/// async fn maybe(info: Option<RateLimitInfo>) -> &'static str {
///     if info.is_some() { "limited" } else { "unlimited" }
/// }
///
/// let app: Router = Router::new().route("/hello", get(hello)).route("/maybe", get(maybe));
/// # let _ = app;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimitInfo(pub Decision);

impl<S: Send + Sync> FromRequestParts<S> for RateLimitInfo {
    type Rejection = MissingRateLimitInfo;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        from_parts(parts).ok_or(MissingRateLimitInfo { _priv: () })
    }
}

impl<S: Send + Sync> OptionalFromRequestParts<S> for RateLimitInfo {
    type Rejection = Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        _state: &S,
    ) -> Result<Option<Self>, Self::Rejection> {
        Ok(from_parts(parts))
    }
}

fn from_parts(parts: &Parts) -> Option<RateLimitInfo> {
    parts
        .extensions
        .get::<Decision>()
        .cloned()
        .map(RateLimitInfo)
}

impl std::ops::Deref for RateLimitInfo {
    type Target = Decision;

    fn deref(&self) -> &Decision {
        &self.0
    }
}

/// [`RateLimitInfo`] was extracted but no rate-limit layer ran (500).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingRateLimitInfo {
    _priv: (),
}

impl MissingRateLimitInfo {
    /// The status of the rejection response.
    pub fn status(&self) -> StatusCode {
        StatusCode::INTERNAL_SERVER_ERROR
    }

    /// The body of the rejection response.
    pub fn body_text(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for MissingRateLimitInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "Missing rate-limit decision: is the tower-window layer installed on this route?",
        )
    }
}

impl std::error::Error for MissingRateLimitInfo {}

impl IntoResponse for MissingRateLimitInfo {
    fn into_response(self) -> Response {
        (self.status(), self.body_text()).into_response()
    }
}
