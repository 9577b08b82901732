//! How the layer talks back: [`Http`] responses or [`Typed`] errors.

use std::fmt;

#[cfg(feature = "http")]
use crate::layer::headers::{insert_rate_limit_headers, insert_retry_after, RateLimitHeaders};
#[cfg(feature = "http")]
use crate::layer::OnRejection;
use crate::layer::{DefaultRejection, Rejection};
use crate::{Check, Decision, Limiter, Policy, WindowKey};

/// A boxed error, as returned by [`Typed`] services.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The layer's mode: how a decision shows up on the request and response,
/// and how a [`Rejection`] becomes the service's output. Everything that
/// differs between protocols lives here.
pub trait Respond<Req, Res, E>: Send + Sync + 'static {
    /// The service's error type.
    type Error;

    /// The service's response type (the inner service's, or one that
    /// wraps it).
    type Response;

    /// What the response of an admitted request needs from its admission.
    type Admitted: Send + 'static;

    /// The check of `cost` units the layer makes for a request (by default
    /// [`Limiter::check_policy`]).
    fn check<'a>(
        &self,
        limiter: &'a Limiter,
        key: &'a WindowKey,
        policy: &'a Policy,
        cost: u32,
    ) -> Check<'a> {
        limiter.check_policy(key, policy, cost)
    }

    /// Called with an admitted request before the inner service sees it.
    fn on_request(&self, request: &mut Req, admission: Admission<'_>) -> Self::Admitted;

    /// Called with the inner service's response: to an admitted request,
    /// or (`None`) to one the layer let through unchecked.
    fn on_response(admitted: Option<Self::Admitted>, response: Res) -> Self::Response;

    /// The service's output for a request that the layer did not let through.
    fn on_rejection(&self, rejection: Rejection) -> Result<Self::Response, Self::Error>;

    /// Converts an error of the inner service.
    fn map_error(error: E) -> Self::Error;
}

/// An admitted request, as the layer's [`Respond`] mode sees it.
#[derive(Debug)]
#[non_exhaustive]
pub struct Admission<'a> {
    /// The limiter's decision.
    pub decision: Decision,
    /// The limiter that decided.
    pub limiter: &'a Limiter,
    /// The request's key.
    pub key: &'a WindowKey,
    /// The policy it was checked against (its tenant's, with tenants).
    pub policy: &'a Policy,
    /// The units checked.
    pub cost: u32,
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
    type Response = http::Response<ResB>;
    type Admitted = RateLimitHeaders;

    fn on_request(
        &self,
        request: &mut http::Request<B>,
        admission: Admission<'_>,
    ) -> RateLimitHeaders {
        let decision = admission.decision;
        let headers = RateLimitHeaders::new(&decision, self.legacy_headers);
        if self.decision_extension {
            request.extensions_mut().insert(decision);
        }
        headers
    }

    fn on_response(
        headers: Option<RateLimitHeaders>,
        response: http::Response<ResB>,
    ) -> http::Response<ResB> {
        RateLimitHeaders::added_to(headers, response)
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
    type Response = Res;
    type Admitted = ();

    fn on_request(&self, _request: &mut Req, _admission: Admission<'_>) {}

    fn on_response(_: Option<()>, response: Res) -> Res {
        response
    }

    fn on_rejection(&self, rejection: Rejection) -> Result<Res, BoxError> {
        Err(Box::new(rejection))
    }

    fn map_error(error: E) -> BoxError {
        error.into()
    }
}
