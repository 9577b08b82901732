//! `application/problem+json` (RFC 9457) bodies for rejections.

use std::convert::Infallible;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::header::CONTENT_TYPE;
use http::{HeaderValue, StatusCode};
use serde::Serialize;
use tower_window::layer::{ceil_secs, Http, OnRejection, Rejection, Respond};

/// The media type of problem details (RFC 9457).
pub const PROBLEM_JSON: &str = "application/problem+json";

/// The `type` of a rate-limit denial (429).
pub const TYPE_RATE_LIMITED: &str = "urn:tower-window:problem:rate-limited";
/// The `type` of a request that carries no rate-limit key (400/401).
pub const TYPE_MISSING_KEY: &str = "urn:tower-window:problem:missing-key";
/// The `type` of a request whose rate-limit key is longer than the key
/// extractor accepts (400; see [`Rejection::KeyTooLong`]).
pub const TYPE_KEY_TOO_LONG: &str = "urn:tower-window:problem:key-too-long";
/// The `type` of input a route refuses (400): an admin call's, a room's
/// [resume position](crate::ws::rooms::Resume).
pub const TYPE_INVALID_INPUT: &str = "urn:tower-window:problem:invalid-input";
/// The `type` of a limiter that could not decide (503).
pub const TYPE_UNAVAILABLE: &str = "urn:tower-window:problem:unavailable";
/// The `type` of a request whose tenant is unknown (403).
pub const TYPE_UNKNOWN_TENANT: &str = "urn:tower-window:problem:unknown-tenant";
/// The `type` of a denial by the fallback policy while the store cannot
/// decide (503, or the policy's status).
pub const TYPE_DEGRADED: &str = "urn:tower-window:problem:degraded";

/// Answers rejections with an RFC 9457 `application/problem+json` body of
/// `type`, `title`, `status` and `detail`; a rate-limit denial (429, and a
/// degraded denial) also has
///
/// | member | holds |
/// |---|---|
/// | `policy` | the name of the policy that denied ([`Decision::policy_name`](tower_window::Decision::policy_name): the limiter's policy, or the tenant's); `null` for a decision built by hand without [`with_policy`](tower_window::Decision::with_policy) |
/// | `quota` | the name of the deciding quota within it ([`Decision::quota`](tower_window::Decision::quota)) |
/// | `definition` | that quota in the quota DSL (`100/1m`) |
/// | `limit` | its limit (the burst for GCRA) |
/// | `remaining` | units left in its window |
/// | `reset_after` | seconds until its window is full again, rounded up |
/// | `retry_after` | seconds until the same request could be admitted, rounded up and at least 1, as in `Retry-After`; `null` when the request's cost can never fit |
///
/// Store failure messages are never shown to clients.
///
/// ```
/// use axum_window_ext::ProblemJson;
/// use tower_window::layer::{OnRejection, Rejection};
/// use tower_window::{Limiter, MemoryStore, Policy, WindowKey};
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let policy = Policy::builder("api").quota("burst", "1/1s")?.quota("daily", "100/1d")?.build()?;
/// let limiter = Limiter::new(MemoryStore::new(), policy);
/// let key = WindowKey::for_subject("alice");
/// limiter.check(&key, 1).await?;
/// let denied = limiter.check(&key, 1).await?;
/// let response = ProblemJson::new().response(&Rejection::RateLimited(denied));
/// let body = axum::body::to_bytes(response.into_body(), 4096).await?;
/// let problem: serde_json::Value = serde_json::from_slice(&body)?;
/// assert_eq!((&problem["policy"], &problem["quota"]), (&"api".into(), &"burst".into()));
/// assert_eq!(problem["definition"], "1/1s");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Debug, Clone, Copy, Default)]
#[non_exhaustive]
pub struct ProblemJson;

impl ProblemJson {
    /// A problem+json responder.
    pub fn new() -> Self {
        Self
    }
}

#[derive(Serialize)]
struct Problem<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    title: &'static str,
    status: u16,
    detail: String,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    limit: Option<LimitMembers<'a>>,
}

#[derive(Serialize)]
struct LimitMembers<'a> {
    policy: Option<&'a str>,
    quota: &'a str,
    definition: String,
    limit: u32,
    remaining: u32,
    reset_after: u64,
    retry_after: Option<u64>,
}

impl OnRejection<Body> for ProblemJson {
    fn response(&self, rejection: &Rejection) -> Response {
        let kind = match rejection {
            Rejection::RateLimited(_) => TYPE_RATE_LIMITED,
            Rejection::MissingKey { .. } => TYPE_MISSING_KEY,
            Rejection::KeyTooLong { .. } => TYPE_KEY_TOO_LONG,
            Rejection::Unavailable { .. } => TYPE_UNAVAILABLE,
            Rejection::Degraded { .. } => TYPE_DEGRADED,
            Rejection::UnknownTenant { .. } => TYPE_UNKNOWN_TENANT,
            // A kind this version does not know: RFC 9457's "no further semantics".
            _ => "about:blank",
        };
        let limit = rejection.decision().map(|decision| LimitMembers {
            policy: decision.policy_name(),
            quota: decision.quota().name(),
            definition: decision.quota().to_string(),
            limit: decision.limit(),
            remaining: decision.remaining(),
            reset_after: ceil_secs(decision.reset_after()),
            // Like `Retry-After`: rounded up, and at least 1 for a denial.
            retry_after: decision.retry_after().map(|wait| ceil_secs(wait).max(1)),
        });
        let status = rejection.status().into();
        let problem = Problem {
            kind,
            title: rejection.title(),
            status: rejection.status().as_u16(),
            detail: rejection.detail(),
            limit,
        };
        problem_json(status, &problem)
    }
}

/// A problem+json response with no members beyond the standard four.
pub(crate) fn problem(status: StatusCode, kind: &str, title: &str, detail: String) -> Response {
    let body = serde_json::json!({
        "type": kind,
        "title": title,
        "status": status.as_u16(),
        "detail": detail,
    });
    problem_json(status, &body)
}

/// A `400` of the [`TYPE_INVALID_INPUT`] type.
pub(crate) fn invalid_input(detail: String) -> Response {
    problem(
        StatusCode::BAD_REQUEST,
        TYPE_INVALID_INPUT,
        "Invalid input",
        detail,
    )
}

/// `status` with the problem details document `body`.
pub(crate) fn problem_json(status: StatusCode, body: &impl Serialize) -> Response {
    let mut response = (status, axum::Json(body)).into_response();
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    response
}

/// A [`Rejection`] a handler can return, answered as the layer with
/// [`ProblemJson`] answers it (headers included, the [`Rejection`] in the
/// response's extensions); for limits a handler checks itself:
///
/// ```
/// use axum::response::{IntoResponse, Response};
/// use axum_window_ext::RejectionResponse;
/// use tower_window::layer::Rejection;
/// use tower_window::{Limiter, MemoryStore, WindowKey};
///
/// async fn handler(limiter: Limiter) -> Response {
///     match limiter.check(&WindowKey::for_subject("exports"), 1).await {
///         Ok(decision) if decision.allowed() => "exported".into_response(),
///         // `for_denial` answers a fallback (degraded) denial with the given status.
///         Ok(decision) => {
///             let rejection = Rejection::for_denial(decision, http::StatusCode::SERVICE_UNAVAILABLE);
///             RejectionResponse(rejection).into_response()
///         }
///         Err(error) => RejectionResponse::unavailable(error.to_string()).into_response(),
///     }
/// }
/// # let _ = handler;
/// ```
#[derive(Debug, Clone)]
pub struct RejectionResponse(pub Rejection);

impl RejectionResponse {
    /// A 503 for a limiter that could not decide; `message` goes to the
    /// [`Rejection`] extension, not to the client.
    pub fn unavailable(message: impl Into<std::sync::Arc<str>>) -> Self {
        Self(Rejection::Unavailable {
            message: message.into(),
        })
    }

    /// A missing-key rejection answered with `status` (400 or 401 are usual).
    pub fn missing_key(status: impl Into<tower_window::layer::Status>) -> Self {
        Self(Rejection::MissingKey {
            status: status.into(),
        })
    }
}

impl From<Rejection> for RejectionResponse {
    fn from(rejection: Rejection) -> Self {
        Self(rejection)
    }
}

impl IntoResponse for RejectionResponse {
    fn into_response(self) -> Response {
        let layer = Http::new(ProblemJson);
        match Respond::<http::Request<()>, Response, Infallible>::on_rejection(&layer, self.0) {
            Ok(response) => response,
            Err(never) => match never {},
        }
    }
}
