//! [`ConnectionRefused`]: 429 for an upgrade past a connection cap.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tower_window::conn::ConnectionDenied;
use tower_window::layer::{ceil_secs, insert_retry_after};

use crate::problem::problem_json;

/// The response to an upgrade refused by a connection cap, instead of the
/// `101`: `429` with `Retry-After`, `RateLimit-Policy: "connections";q=<cap>`,
/// `RateLimit: "connections";r=0;t=<secs>` and a problem+json body.
///
/// The wait (until the oldest seat expires) is capped at
/// [`MAX_RETRY_AFTER`](Self::MAX_RETRY_AFTER): connections usually close
/// sooner than their seats expire.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionRefused {
    denied: ConnectionDenied,
}

impl ConnectionRefused {
    /// The longest `Retry-After` sent (1 s).
    pub const MAX_RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

    /// The refusal of `denied`.
    pub fn new(denied: ConnectionDenied) -> Self {
        Self { denied }
    }

    /// What refused it.
    pub fn denied(&self) -> &ConnectionDenied {
        &self.denied
    }
}

impl IntoResponse for ConnectionRefused {
    fn into_response(self) -> Response {
        let denied = self.denied;
        let wait = denied
            .retry_after
            .clamp(std::time::Duration::from_millis(1), Self::MAX_RETRY_AFTER);
        let body = json!({
            "type": crate::TYPE_RATE_LIMITED,
            "title": "Too many connections",
            "status": 429,
            "detail": format!("at most {} concurrent connections per {}", denied.cap, denied.scope.as_str()),
            "quota": "connections",
            "retry_after_ms": u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
        });
        let mut response = problem_json(StatusCode::TOO_MANY_REQUESTS, &body);
        let headers = response.headers_mut();
        insert_retry_after(headers, wait);
        if let Ok(value) = HeaderValue::from_str(&format!("\"connections\";q={}", denied.cap)) {
            headers.append("ratelimit-policy", value);
        }
        if let Ok(value) =
            HeaderValue::from_str(&format!("\"connections\";r=0;t={}", ceil_secs(wait)))
        {
            headers.append("ratelimit", value);
        }
        response.extensions_mut().insert(denied);
        response
    }
}
