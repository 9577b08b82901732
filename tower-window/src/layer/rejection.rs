//! Why the layer did not call the inner service.

use std::fmt;
use std::sync::Arc;

use super::Status;
use crate::Decision;

/// Why the layer answered instead of the inner service.
///
/// Over HTTP it is in the response's extensions (so outer layers can tell
/// the limiter's 429 from the application's); in typed mode it is the
/// boxed error. A store denial is [`RateLimited`](Self::RateLimited), a
/// [`FallbackPolicy`](crate::fallback::FallbackPolicy) denial while the store
/// cannot decide [`Degraded`](Self::Degraded): "you sent too much" versus
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
    /// The key is longer than the extractor accepts
    /// ([`NoKey::TooLong`](crate::key::NoKey::TooLong)): `400` whatever the
    /// [`MissingKey`](super::MissingKey) policy. Not `431`: the key may come
    /// from a query, path or gRPC metadata, and `431` means a transport limit.
    KeyTooLong {
        /// The longest key the extractor accepts, in bytes.
        max_len: usize,
    },
    /// The store could not decide and the fallback policy denied the request.
    Degraded {
        /// The fallback policy's denial.
        decision: Decision,
        /// The layer's [`degraded_status`](super::SlidingWindowLayer::degraded_status).
        status: Status,
    },
    /// The key's tenant has no policy in the layer's
    /// [tenant registry](crate::tenant::TenantRegistry).
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
    /// `degraded_status` for a fallback decision, else
    /// [`RateLimited`](Self::RateLimited).
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

    /// Whether this is [`Degraded`](Self::Degraded).
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
                let retry = decision
                    .retry_after
                    .map_or("try again later".to_owned(), |wait| {
                        format!("retry in {} s", super::ceil_secs(wait).max(1))
                    });
                format!(
                    "the rate limiter is degraded ({reason}) and its fallback policy \
                     denied the request; {retry}"
                )
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

/// Builds the HTTP response (status and body) for a [`Rejection`]; the
/// layer adds the headers and extension. Closures
/// `Fn(&Rejection) -> http::Response<B>` implement it.
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

/// An empty body (`B::default()`) with the rejection's status
/// (`axum-window-ext` has a problem+json one).
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
