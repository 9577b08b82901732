//! [`SlidingWindow`]: the middleware's `Service`.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use tower_service::Service;

use super::future::ResponseFuture;
use super::{Admission, MissingKey, Rejection, RequestCost, Respond, SlidingWindowLayer, Status};
use crate::key::NoKey;
use crate::tenant::Resolution;
use crate::{Decision, KeyExtractor, LimitError, Limiter};

/// What every clone of one [`SlidingWindow`] shares: its layer, the mode
/// behind an `Arc` that response futures hold.
type Shared<K, C, M> = SlidingWindowLayer<K, C, Arc<M>>;

/// Checks each request against a [`Limiter`] before calling `S`.
///
/// Built by [`SlidingWindowLayer`]; clones share the limiter.
///
/// The check starts in `call`. A decision made at once sends an admitted
/// request straight to the inner service `poll_ready` readied; one that must
/// wait (a store call) takes the readied service along and leaves a clone.
pub struct SlidingWindow<S, K, C, M> {
    inner: S,
    shared: Arc<Shared<K, C, M>>,
}

impl<S, K, C, M> SlidingWindow<S, K, C, M> {
    pub(super) fn new(inner: S, shared: Arc<Shared<K, C, M>>) -> Self {
        Self { inner, shared }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// The limiter shared by all clones of this service.
    pub fn limiter(&self) -> &Limiter {
        &self.shared.limiter
    }
}

impl<S: Clone, K, C, M> Clone for SlidingWindow<S, K, C, M> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: fmt::Debug, K, C, M: fmt::Debug> fmt::Debug for SlidingWindow<S, K, C, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlidingWindow")
            .field("inner", &self.inner)
            .field("limiter", &self.shared.limiter)
            .field("missing_key", &self.shared.missing_key)
            .field("mode", &self.shared.mode)
            .finish_non_exhaustive()
    }
}

impl<S, K, C, M, Req> Service<Req> for SlidingWindow<S, K, C, M>
where
    S: Service<Req> + Clone,
    K: KeyExtractor<Req>,
    C: RequestCost<Req>,
    M: Respond<Req, S::Response, S::Error>,
{
    type Response = M::Response;
    type Error = M::Error;
    type Future = ResponseFuture<S, Req, M>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(M::map_error)
    }

    fn call(&mut self, mut request: Req) -> Self::Future {
        let shared = &*self.shared;
        let reject = |rejection| ResponseFuture::ready(shared.mode.on_rejection(rejection));
        let key = match (shared.key.try_extract(&request), shared.missing_key) {
            (Ok(key), _) => key,
            (Err(NoKey::TooLong { max_len }), _) => {
                return reject(Rejection::KeyTooLong { max_len })
            }
            (Err(_), MissingKey::Reject(status)) => {
                return reject(Rejection::MissingKey { status })
            }
            (Err(_), MissingKey::Skip) => {
                return ResponseFuture::calling(self.inner.call(request), None)
            }
        };
        let cost = shared.cost.cost(&request);
        if cost == 0 {
            // Free requests are neither checked nor counted.
            return ResponseFuture::calling(self.inner.call(request), None);
        }
        let policy = match &shared.tenants {
            None => None,
            Some(registry) => match registry.resolve(key.tenant()) {
                Resolution::Limited(policy) => Some(policy),
                Resolution::Unlimited => {
                    return ResponseFuture::calling(self.inner.call(request), None)
                }
                Resolution::Unknown => {
                    return reject(Rejection::UnknownTenant {
                        status: Status::FORBIDDEN,
                    })
                }
            },
        };
        // An answer available at once is acted on where it lies, without a
        // future or a box (each move of a decision is a copy).
        let (limiter, checked) = (
            &shared.limiter,
            policy.as_ref().unwrap_or(shared.limiter.policy()),
        );
        let check = match shared.mode.check(limiter, &key, checked, cost).into_ready() {
            Ok(result) => result,
            Err(check) => {
                // The readied service goes with the request; a fresh clone stays.
                let clone = self.inner.clone();
                let inner = std::mem::replace(&mut self.inner, clone);
                let status = shared.degraded_status;
                return ResponseFuture::deciding(check, status, inner, request, &shared.mode);
            }
        };
        match admission(check, shared.degraded_status) {
            Ok(decision) => {
                let admission = Admission {
                    decision,
                    limiter,
                    key: &key,
                    policy: checked,
                    cost,
                };
                let admitted = shared.mode.on_request(&mut request, admission);
                ResponseFuture::calling(self.inner.call(request), Some(admitted))
            }
            Err(rejection) => reject(rejection),
        }
    }
}

/// The limiter's answer as an admission or the rejection to answer with.
#[allow(clippy::result_large_err)] // moved once, into the response future
pub(super) fn admission(
    result: Result<Decision, LimitError>,
    degraded_status: Status,
) -> Result<Decision, Rejection> {
    match result {
        Ok(decision) if decision.allowed => Ok(decision),
        Ok(decision) => Err(Rejection::for_denial(decision, degraded_status)),
        Err(error) => {
            tracing::warn!(%error, "rate limiter could not decide; rejecting");
            Err(Rejection::Unavailable {
                message: Arc::from(error.to_string()),
            })
        }
    }
}
