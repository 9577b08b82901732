//! Why the layer did not call the inner service, and how that becomes a response.

use std::fmt;
use std::sync::Arc;

use super::Status;
use crate::Decision;

/// Why the layer answered instead of the inner service.
///
/// For HTTP it is also inserted into the rejection response's extensions, so
/// outer layers can tell a limiter's 429 from the application's. In typed
/// (non-HTTP) mode it is the service's error (boxed; downcast to read it).
///
/// A denial by the store (or by the local tier, which only repeats the
/// store's denials) is [`RateLimited`](Self::RateLimited), answered `429`. A
/// denial by the limiter's [`FallbackPolicy`](crate::fallback::FallbackPolicy)
/// while the store cannot decide is [`Degraded`](Self::Degraded), answered
/// with the layer's
/// [`degraded_status`](super::SlidingWindowLayer::degraded_status) (`503`
/// by default), so clients and operators can tell "you sent too much" from
/// "the limiter is degraded".
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Rejection {
    /// The quota is exhausted.
    RateLimited(Decision),
    /// The request carries no key and the missing-key policy rejects it.
    MissingKey {
        /// The status to answer with (400 or 401 are usual).
        status: Status,
    },
    /// The request's key is longer than the key extractor accepts
    /// ([`NoKey::TooLong`](crate::key::NoKey::TooLong)): answered `400 Bad
    /// Request` whatever the [`MissingKey`](super::MissingKey) policy, since
    /// the client did name itself, wrongly.
    ///
    /// Why `400` and not `431 Request Header Fields Too Large`: the request
    /// is well-formed HTTP that the server read in full; it is one field's
    /// value that this service refuses, as it would refuse any malformed
    /// value, and the key may come from the query, a path or gRPC metadata,
    /// where `431` would name the wrong thing. Clients and proxies read
    /// `431` as "the header section is too large for this server", a
    /// transport limit; the `400`'s detail says which limit was passed.
    KeyTooLong {
        /// The longest key the extractor accepts, in bytes.
        max_len: usize,
    },
    /// The store could not decide and the limiter's fallback policy denied
    /// the request; `decision.source` is `Fallback(reason)`.
    Degraded {
        /// The fallback policy's denial (its `retry_after` becomes
        /// `Retry-After`).
        decision: Decision,
        /// The status to answer with: the policy's
        /// layer's [`degraded_status`](super::SlidingWindowLayer::degraded_status).
        status: Status,
    },
    /// The request's tenant is neither defined nor covered by a default
    /// policy in the layer's [tenant registry](crate::tenant::TenantRegistry)
    /// (or was closed).
    UnknownTenant {
        /// The status to answer with (`403 Forbidden`).
        status: Status,
    },
    /// The limiter could not decide (store failure without a fallback).
    Unavailable {
        /// What failed, for logs; never shown to clients by the built-in bodies.
        message: Arc<str>,
    },
}

impl Rejection {
    /// The rejection for a denial: [`Degraded`](Self::Degraded) with
    /// `degraded_status` when the decision came from the fallback policy,
    /// else [`RateLimited`](Self::RateLimited).
    ///
    /// The layer uses it; code that calls a [`Limiter`](crate::Limiter) by
    /// itself can too.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_window::layer::{Rejection, Status};
    /// use tower_window::{Decision, DecisionSource, FallbackReason, Quota};
    ///
    /// let wait = Some(Duration::from_secs(1));
    /// let denial = Decision::deny("10/1m".parse::<Quota>()?, 0, Duration::ZERO, wait);
    /// let store = Rejection::for_denial(denial.clone(), Status::SERVICE_UNAVAILABLE);
    /// assert_eq!(store.status(), 429);
    /// let degraded = denial.with_source(DecisionSource::Fallback(FallbackReason::Timeout));
    /// let degraded = Rejection::for_denial(degraded, Status::SERVICE_UNAVAILABLE);
    /// assert_eq!(degraded.status(), 503);
    /// assert!(degraded.is_degraded());
    /// # Ok::<(), tower_window::QuotaError>(())
    /// ```
    pub fn for_denial(decision: Decision, degraded_status: impl Into<Status>) -> Self {
        if decision.is_degraded() {
            Self::Degraded {
                status: degraded_status.into(),
                decision,
            }
        } else {
            Self::RateLimited(decision)
        }
    }

    /// The HTTP status for this rejection.
    pub fn status(&self) -> Status {
        match self {
            Self::RateLimited(_) => Status::TOO_MANY_REQUESTS,
            Self::KeyTooLong { .. } => Status::BAD_REQUEST,
            Self::MissingKey { status }
            | Self::UnknownTenant { status }
            | Self::Degraded { status, .. } => *status,
            Self::Unavailable { .. } => Status::SERVICE_UNAVAILABLE,
        }
    }

    /// The denial's decision, when there is one (rate limited or degraded).
    pub fn decision(&self) -> Option<&Decision> {
        match self {
            Self::RateLimited(decision) | Self::Degraded { decision, .. } => Some(decision),
            _ => None,
        }
    }

    /// Whether the fallback policy denied the request because the store
    /// could not decide.
    pub fn is_degraded(&self) -> bool {
        matches!(self, Self::Degraded { .. })
    }

    /// A short, human-readable summary (an RFC 9457 `title`).
    pub fn title(&self) -> &'static str {
        match self {
            Self::RateLimited(_) => "Too Many Requests",
            Self::MissingKey { .. } => "Missing rate-limit key",
            Self::KeyTooLong { .. } => "Rate-limit key too long",
            Self::Degraded { .. } => "Rate limiter degraded",
            Self::UnknownTenant { .. } => "Unknown tenant",
            Self::Unavailable { .. } => "Rate limiter unavailable",
        }
    }

    /// A longer explanation safe to show clients (an RFC 9457 `detail`).
    pub fn detail(&self) -> String {
        match self {
            Self::RateLimited(decision) => match decision.retry_after {
                Some(wait) => format!(
                    "quota {:?} ({}) exhausted; retry in {} s",
                    decision.quota().name(),
                    decision.quota(),
                    super::ceil_secs(wait)
                ),
                None => format!(
                    "request cost exceeds quota {:?} ({}) and can never be admitted",
                    decision.quota().name(),
                    decision.quota()
                ),
            },
            Self::MissingKey { .. } => {
                "the request does not identify who is calling (rate-limit key missing)".to_owned()
            }
            Self::KeyTooLong { max_len } => {
                format!("the value that identifies who is calling is longer than {max_len} bytes (rate-limit key too long)")
            }
            Self::Degraded { decision, .. } => {
                let reason = match decision.source {
                    crate::DecisionSource::Fallback(reason) => reason.as_str(),
                    _ => "unknown",
                };
                match decision.retry_after {
                    Some(wait) => format!(
                        "the rate limiter is degraded ({reason}) and its fallback policy \
                         denied the request; retry in {} s",
                        super::ceil_secs(wait).max(1)
                    ),
                    None => format!(
                        "the rate limiter is degraded ({reason}) and its fallback policy \
                         denied the request; try again later"
                    ),
                }
            }
            Self::Unavailable { .. } => {
                "the rate limiter could not decide; try again later".to_owned()
            }
            Self::UnknownTenant { .. } => {
                "the request's tenant is not known to this service".to_owned()
            }
        }
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unavailable { message } => write!(f, "{}: {message}", self.title()),
            _ => write!(f, "{}: {}", self.title(), self.detail()),
        }
    }
}

impl std::error::Error for Rejection {}

/// Builds the HTTP response for a [`Rejection`] (its status and body).
///
/// The layer adds `Retry-After` and `RateLimit` headers and the
/// [`Rejection`] extension afterwards, so implementations only choose a body.
/// Closures `Fn(&Rejection) -> http::Response<B>` implement it.
#[cfg(feature = "http")]
pub trait OnRejection<B>: Clone + Send + Sync + 'static {
    /// The response for `rejection`.
    fn response(&self, rejection: &Rejection) -> http::Response<B>;
}

#[cfg(feature = "http")]
impl<F, B> OnRejection<B> for F
where
    F: Fn(&Rejection) -> http::Response<B> + Clone + Send + Sync + 'static,
{
    fn response(&self, rejection: &Rejection) -> http::Response<B> {
        self(rejection)
    }
}

/// An empty body (`B::default()`) with the rejection's status.
/// `axum-window-ext` offers an `application/problem+json` one. (Without the
/// `http` feature it is only the default type parameter of [`Http`](super::Http).)
#[derive(Debug, Clone, Copy, Default)]
#[non_exhaustive]
pub struct DefaultRejection;

#[cfg(feature = "http")]
impl<B: Default> OnRejection<B> for DefaultRejection {
    fn response(&self, rejection: &Rejection) -> http::Response<B> {
        let mut response = http::Response::new(B::default());
        *response.status_mut() = rejection.status().into();
        response
    }
}
