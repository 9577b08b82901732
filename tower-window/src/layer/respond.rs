//! How the layer talks back: [`Http`] responses or [`Typed`] errors.

use std::fmt;

#[cfg(feature = "http")]
use crate::layer::headers::{insert_rate_limit_headers, insert_retry_after, RateLimitHeaders};
#[cfg(feature = "http")]
use crate::layer::OnRejection;
use crate::layer::{DefaultRejection, Rejection};
use crate::Decision;

/// A boxed error, as returned by [`Typed`] services.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The layer's mode: how a decision shows up on the request and response,
/// and how a [`Rejection`] becomes the service's output. Everything that
/// differs between protocols lives here.
pub trait Respond<Req, Res, E>: Send + Sync + 'static {
    /// The service's error type.
    type Error;

    /// What the response of an admitted request needs from its decision.
    type Admitted: Send + 'static;

    /// Called with an admitted request before the inner service sees it.
    fn on_request(&self, request: &mut Req, decision: Decision) -> Self::Admitted;

    /// Called with the inner service's response to an admitted request.
    fn on_response(admitted: Self::Admitted, response: &mut Res);

    /// The service's output for a request that the layer did not let through.
    fn on_rejection(&self, rejection: Rejection) -> Result<Res, Self::Error>;

    /// Converts an error of the inner service.
    fn map_error(error: E) -> Self::Error;
}

/// HTTP mode (the default; inert without the `http` feature): decisions
/// become headers, rejections the [`OnRejection`] `R`'s responses with
/// `Retry-After` and the headers. Inner errors pass through unchanged. See
/// the [module docs](crate::layer).
#[derive(Clone, Copy)]
pub struct Http<R = DefaultRejection> {
    // Read only by the `Respond` impl, which needs the `http` feature.
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    rejection: R,
    legacy_headers: bool,
    decision_extension: bool,
}

impl<R: Default> Default for Http<R> {
    fn default() -> Self {
        Self::new(R::default())
    }
}

impl<R> Http<R> {
    /// HTTP mode answering rejections with `rejection`, without legacy headers.
    pub fn new(rejection: R) -> Self {
        Self {
            rejection,
            legacy_headers: false,
            decision_extension: true,
        }
    }

    /// Also send `X-RateLimit-Limit`, `X-RateLimit-Remaining` and `X-RateLimit-Reset`.
    pub fn legacy_headers(mut self, enabled: bool) -> Self {
        self.legacy_headers = enabled;
        self
    }

    /// Whether an admitted request carries its [`Decision`] in its
    /// extensions (on by default; off saves two allocations a request).
    pub fn decision_extension(mut self, enabled: bool) -> Self {
        self.decision_extension = enabled;
        self
    }

    /// Answer rejections with `rejection` instead.
    pub fn rejection<R2>(self, rejection: R2) -> Http<R2> {
        Http {
            rejection,
            legacy_headers: self.legacy_headers,
            decision_extension: self.decision_extension,
        }
    }
}

impl<R> fmt::Debug for Http<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Http")
            .field("rejection", &std::any::type_name::<R>())
            .field("legacy_headers", &self.legacy_headers)
            .field("decision_extension", &self.decision_extension)
            .finish()
    }
}

#[cfg(feature = "http")]
impl<B, ResB, E, R> Respond<http::Request<B>, http::Response<ResB>, E> for Http<R>
where
    R: OnRejection<ResB>,
{
    type Error = E;
    type Admitted = RateLimitHeaders;

    fn on_request(&self, request: &mut http::Request<B>, decision: Decision) -> RateLimitHeaders {
        let headers = RateLimitHeaders::new(&decision, self.legacy_headers);
        if self.decision_extension {
            request.extensions_mut().insert(decision);
        }
        headers
    }

    fn on_response(headers: RateLimitHeaders, response: &mut http::Response<ResB>) {
        headers.append_to(response.headers_mut());
    }

    fn on_rejection(&self, rejection: Rejection) -> Result<http::Response<ResB>, E> {
        let mut response = self.rejection.response(&rejection);
        if let Some(decision) = rejection.decision() {
            let headers = response.headers_mut();
            if let Some(wait) = decision.retry_after {
                insert_retry_after(headers, wait);
            }
            insert_rate_limit_headers(headers, decision, self.legacy_headers);
        }
        response.extensions_mut().insert(rejection);
        Ok(response)
    }

    fn map_error(error: E) -> E {
        error
    }
}

/// Typed mode, for any `Service<Req>`: the error is a [`BoxError`], the
/// [`Rejection`] or the inner error.
#[derive(Debug, Clone, Copy, Default)]
pub struct Typed;

impl<Req, Res, E> Respond<Req, Res, E> for Typed
where
    E: Into<BoxError>,
{
    type Error = BoxError;
    type Admitted = ();

    fn on_request(&self, _request: &mut Req, _decision: Decision) {}

    fn on_response((): (), _response: &mut Res) {}

    fn on_rejection(&self, rejection: Rejection) -> Result<Res, BoxError> {
        Err(Box::new(rejection))
    }

    fn map_error(error: E) -> BoxError {
        error.into()
    }
}
