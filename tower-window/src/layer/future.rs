//! [`ResponseFuture`]: waits for the decision, then for the inner service.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use pin_project_lite::pin_project;
use tower_service::Service;

use super::service::admission;
use super::{Admission, Rejection, Respond, Status};
use crate::Check;

pin_project! {
    /// The response future of [`SlidingWindow`](crate::SlidingWindow): the
    /// limiter's decision, then (if admitted) the inner service's response,
    /// as the mode answers it.
    pub struct ResponseFuture<S, Req, M>
    where
        S: Service<Req>,
        M: Respond<Req, S::Response, S::Error>,
    {
        #[pin]
        state: State<S, Req, M>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, Req, M>
    where
        S: Service<Req>,
        M: Respond<Req, S::Response, S::Error>,
    {
        // Waiting for the check, with the readied inner service and the request.
        Deciding {
            check: Check<'static>,
            degraded_status: Status,
            call: Option<(S, Req)>,
            mode: Arc<M>,
        },
        // Admitted (or unlimited): waiting for the inner service.
        Calling {
            #[pin]
            future: S::Future,
            admitted: Option<M::Admitted>,
        },
        // Answered without the inner service.
        Ready {
            output: Option<Result<M::Response, M::Error>>,
        },
    }
}

impl<S, Req, M> ResponseFuture<S, Req, M>
where
    S: Service<Req>,
    M: Respond<Req, S::Response, S::Error>,
{
    pub(super) fn deciding(
        check: Check<'static>,
        degraded_status: Status,
        service: S,
        request: Req,
        mode: &Arc<M>,
    ) -> Self {
        Self {
            state: State::Deciding {
                check,
                degraded_status,
                call: Some((service, request)),
                mode: Arc::clone(mode),
            },
        }
    }

    pub(super) fn calling(future: S::Future, admitted: Option<M::Admitted>) -> Self {
        Self {
            state: State::Calling { future, admitted },
        }
    }

    pub(super) fn ready(output: Result<M::Response, M::Error>) -> Self {
        Self {
            state: State::Ready {
                output: Some(output),
            },
        }
    }
}

impl<S, Req, M> Future for ResponseFuture<S, Req, M>
where
    S: Service<Req>,
    M: Respond<Req, S::Response, S::Error>,
{
    type Output = Result<M::Response, M::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProj::Deciding {
                    check,
                    degraded_status,
                    call,
                    mode,
                } => {
                    let result =
                        admission(ready!(Pin::new(&mut *check).poll(cx)), *degraded_status);
                    let Some((mut service, mut request)) = call.take() else {
                        panic!("ResponseFuture polled after completion");
                    };
                    let rejection = match (result, check.parts()) {
                        (Ok(decision), Some((limiter, key, policy, cost))) => {
                            let admission = Admission {
                                decision,
                                limiter,
                                key,
                                policy,
                                cost: cost.get(),
                            };
                            let admitted = mode.on_request(&mut request, admission);
                            let future = service.call(request);
                            state.set(State::Calling {
                                future,
                                admitted: Some(admitted),
                            });
                            continue;
                        }
                        (Err(rejection), _) => rejection,
                        // A check that waited keeps what it was of.
                        (Ok(_), None) => Rejection::Unavailable {
                            message: Arc::from("the check lost what it was of"),
                        },
                    };
                    let output = mode.on_rejection(rejection);
                    state.set(State::Ready { output: None });
                    return Poll::Ready(output);
                }
                StateProj::Calling { future, admitted } => {
                    let output = match ready!(future.poll(cx)) {
                        Ok(response) => Ok(M::on_response(admitted.take(), response)),
                        Err(error) => Err(M::map_error(error)),
                    };
                    state.set(State::Ready { output: None });
                    return Poll::Ready(output);
                }
                StateProj::Ready { output } => {
                    let Some(output) = output.take() else {
                        panic!("ResponseFuture polled after completion");
                    };
                    return Poll::Ready(output);
                }
            }
        }
    }
}

impl<S, Req, M> fmt::Debug for ResponseFuture<S, Req, M>
where
    S: Service<Req>,
    M: Respond<Req, S::Response, S::Error>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Deciding { .. } => "deciding",
            State::Calling { .. } => "calling",
            State::Ready { .. } => "ready",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}
