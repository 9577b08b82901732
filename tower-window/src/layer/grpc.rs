//! gRPC mode ([`Grpc`]): rejections in the trailers-only form gRPC clients
//! read as a status, with `google.rpc.RetryInfo` details.

use std::fmt;
use std::time::Duration;

use http::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use tonic_types::{ErrorDetails, StatusExt};

use super::headers::{insert_rate_limit_headers, RateLimitHeaders};
use super::{ceil_secs, Admission, Http, Rejection, Respond, Status};

/// A gRPC status code (`grpc-status`): the layer's own type, so its
/// signatures name no gRPC framework.
///
/// ```
/// use tower_window::layer::{GrpcCode, Status};
///
/// assert_eq!(GrpcCode::RESOURCE_EXHAUSTED.as_i32(), 8);
/// assert_eq!(GrpcCode::for_http_status(Status::BAD_REQUEST), GrpcCode::INVALID_ARGUMENT);
/// assert_eq!(GrpcCode::for_http_status(Status::SERVICE_UNAVAILABLE), GrpcCode::UNAVAILABLE);
/// assert_eq!(GrpcCode::UNAVAILABLE.name(), "UNAVAILABLE");
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GrpcCode(i32);

impl GrpcCode {
    /// `2 UNKNOWN`: an HTTP status with no closer gRPC code.
    pub const UNKNOWN: Self = Self(2);
    /// `3 INVALID_ARGUMENT`: a missing key or one too long (`400`).
    pub const INVALID_ARGUMENT: Self = Self(3);
    /// `5 NOT_FOUND` (`404`).
    pub const NOT_FOUND: Self = Self(5);
    /// `7 PERMISSION_DENIED`: an unknown tenant (`403`).
    pub const PERMISSION_DENIED: Self = Self(7);
    /// `8 RESOURCE_EXHAUSTED`: an exhausted quota (`429`).
    pub const RESOURCE_EXHAUSTED: Self = Self(8);
    /// `13 INTERNAL` (`500`).
    pub const INTERNAL: Self = Self(13);
    /// `14 UNAVAILABLE`: degraded or undecided (`503`).
    pub const UNAVAILABLE: Self = Self(14);
    /// `16 UNAUTHENTICATED` (`401`).
    pub const UNAUTHENTICATED: Self = Self(16);

    /// The code `code` (any number; gRPC defines `0..=16`).
    #[must_use]
    pub const fn new(code: i32) -> Self {
        Self(code)
    }

    /// The numeric code, as `grpc-status` carries it.
    #[must_use]
    pub const fn as_i32(self) -> i32 {
        self.0
    }

    /// The gRPC code closest to an HTTP status (the constants above;
    /// anything else `UNKNOWN`).
    #[must_use]
    pub fn for_http_status(status: Status) -> Self {
        match status.as_u16() {
            400 => Self::INVALID_ARGUMENT,
            401 => Self::UNAUTHENTICATED,
            403 => Self::PERMISSION_DENIED,
            404 => Self::NOT_FOUND,
            429 => Self::RESOURCE_EXHAUSTED,
            500 => Self::INTERNAL,
            503 => Self::UNAVAILABLE,
            _ => Self::UNKNOWN,
        }
    }

    /// The code's name (`RESOURCE_EXHAUSTED`), or `"CODE"` for a number
    /// gRPC does not define.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self.0 {
            0 => "OK",
            1 => "CANCELLED",
            2 => "UNKNOWN",
            3 => "INVALID_ARGUMENT",
            4 => "DEADLINE_EXCEEDED",
            5 => "NOT_FOUND",
            6 => "ALREADY_EXISTS",
            7 => "PERMISSION_DENIED",
            8 => "RESOURCE_EXHAUSTED",
            9 => "FAILED_PRECONDITION",
            10 => "ABORTED",
            11 => "OUT_OF_RANGE",
            12 => "UNIMPLEMENTED",
            13 => "INTERNAL",
            14 => "UNAVAILABLE",
            15 => "DATA_LOSS",
            16 => "UNAUTHENTICATED",
            _ => "CODE",
        }
    }
}

impl fmt::Debug for GrpcCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GrpcCode({} {})", self.0, self.name())
    }
}

impl fmt::Display for GrpcCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl PartialEq<i32> for GrpcCode {
    fn eq(&self, other: &i32) -> bool {
        self.0 == *other
    }
}

impl Rejection {
    /// The gRPC status code [`Grpc`] mode answers with: `RESOURCE_EXHAUSTED`
    /// for an exhausted quota, else [`GrpcCode::for_http_status`] of the
    /// [`status`](Self::status).
    pub fn grpc_code(&self) -> GrpcCode {
        match self {
            Self::RateLimited(_) => GrpcCode::RESOURCE_EXHAUSTED,
            _ => GrpcCode::for_http_status(self.status()),
        }
    }
}

/// gRPC mode ([`SlidingWindowLayer::grpc`](crate::SlidingWindowLayer::grpc)),
/// for tonic services.
///
/// - Admitted: the [`Decision`](crate::Decision) goes into the request's
///   extensions and the `RateLimit` headers into the response metadata, as
///   in HTTP mode.
/// - Rejected: a *trailers-only* response (HTTP `200`, `application/grpc`,
///   empty body) with `grpc-status` ([`Rejection::grpc_code`]),
///   `grpc-message` ([`Rejection::detail`]), the `RateLimit` metadata and,
///   when a retry can succeed, `grpc-status-details-bin` holding a
///   `google.rpc.RetryInfo` whose `retry_delay` is `Retry-After`'s number.
///   The [`Rejection`] is in the response's extensions.
/// - Inner errors pass through unchanged.
///
/// ```
/// use std::convert::Infallible;
/// use tower::{ServiceBuilder, ServiceExt};
/// use tower_window::key::{GrpcMethod, KeyExtractorExt, Metadata};
/// use tower_window::{Limiter, MemoryStore, Quota, SlidingWindowLayer};
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let limiter = Limiter::new(MemoryStore::new(), "1/1m".parse::<Quota>()?);
/// // One window per API key and method.
/// let key = Metadata::new("x-api-key")?.with_tenant(GrpcMethod::new());
/// let service = ServiceBuilder::new()
///     .layer(SlidingWindowLayer::new(limiter, key).grpc())
///     .service_fn(|_req: http::Request<String>| async {
///         Ok::<_, Infallible>(http::Response::new(String::new()))
///     });
/// let call = || {
///     http::Request::builder()
///         .uri("/shop.Cart/Add")
///         .header("content-type", "application/grpc")
///         .header("x-api-key", "k1")
///         .body(String::new())
/// };
/// let allowed = service.clone().oneshot(call()?).await?;
/// assert_eq!(allowed.headers()["ratelimit"], r#""default";r=0;t=60"#);
/// let denied = service.clone().oneshot(call()?).await?;
/// assert_eq!(denied.status(), 200);
/// assert_eq!(denied.headers()["content-type"], "application/grpc");
/// assert_eq!(denied.headers()["grpc-status"], "8");
/// assert!(denied.headers().contains_key("grpc-status-details-bin"));
///
/// let anonymous = http::Request::builder().uri("/shop.Cart/Add").body(String::new())?;
/// assert_eq!(service.oneshot(anonymous).await?.headers()["grpc-status"], "3");
/// # Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
/// # }).unwrap();
/// ```
#[derive(Debug, Clone, Copy, Default)]
#[non_exhaustive]
pub struct Grpc {
    /// What an admission does, as in HTTP mode without legacy headers.
    http: Http,
}

impl Grpc {
    /// gRPC mode with the decision in admitted requests' extensions.
    pub fn new() -> Self {
        Self::default()
    }

    /// See [`Http::decision_extension`].
    pub fn decision_extension(self, enabled: bool) -> Self {
        Self {
            http: self.http.decision_extension(enabled),
        }
    }
}

const APPLICATION_GRPC: HeaderValue = HeaderValue::from_static("application/grpc");
/// `grpc-status`, set alone when the full status cannot be written.
const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");

impl<B, ResB, E> Respond<http::Request<B>, http::Response<ResB>, E> for Grpc
where
    ResB: Default,
{
    type Error = E;
    type Response = http::Response<ResB>;
    type Admitted = RateLimitHeaders;

    fn on_request(
        &self,
        request: &mut http::Request<B>,
        admission: Admission<'_>,
    ) -> RateLimitHeaders {
        Respond::<_, http::Response<ResB>, E>::on_request(&self.http, request, admission)
    }

    fn on_response(
        headers: Option<RateLimitHeaders>,
        response: http::Response<ResB>,
    ) -> http::Response<ResB> {
        RateLimitHeaders::added_to(headers, response)
    }

    fn on_rejection(&self, rejection: Rejection) -> Result<http::Response<ResB>, E> {
        let mut response = http::Response::new(ResB::default());
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, APPLICATION_GRPC);
        insert_grpc_status(headers, &rejection);
        if let Some(decision) = rejection.decision() {
            insert_rate_limit_headers(headers, decision, false);
        }
        response.extensions_mut().insert(rejection);
        Ok(response)
    }

    fn map_error(error: E) -> E {
        error
    }
}

fn insert_grpc_status(headers: &mut HeaderMap, rejection: &Rejection) {
    let code = rejection.grpc_code();
    let tonic_code = tonic::Code::from_i32(code.as_i32());
    let message = rejection.detail();
    let status = match rejection.decision().and_then(|d| d.retry_after) {
        Some(wait) => {
            // `Retry-After`'s number: never 0, or the client retries at once.
            let delay = Duration::from_secs(ceil_secs(wait).max(1));
            let details = ErrorDetails::with_retry_info(Some(delay));
            tonic::Status::with_error_details(tonic_code, message, details)
        }
        None => tonic::Status::new(tonic_code, message),
    };
    if status.add_header(headers).is_err() {
        // Unreachable (encoded message and details); never omit the status.
        headers.insert(GRPC_STATUS, HeaderValue::from(code.as_i32()));
    }
}
