//! [`Check`]: the future of [`Limiter::check`] and [`Limiter::check_policy`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::future::BoxFuture;

use crate::limiter::{LimitError, Limiter};
use crate::{Decision, Policy, WindowKey};

/// The future of one [`Limiter::check`] or [`Limiter::check_policy`].
///
/// Like any future it does nothing until polled. Its first poll decides at
/// once when the store decides in-process (see [`Limiter::check_sync`]),
/// without allocating; only a check that has to wait (a Redis call, a
/// fallback, a lease) boxes the rest of its work. So a `Check` stays a few
/// words wide whatever the slow path holds, and moving it costs nothing.
#[must_use = "futures do nothing unless you `.await` or poll them"]
pub struct Check<'a> {
    state: State<'a>,
}

enum State<'a> {
    Start {
        limiter: &'a Limiter,
        key: &'a WindowKey,
        policy: &'a Policy,
        cost: u32,
    },
    Waiting(BoxFuture<'a, Result<Decision, LimitError>>),
    Done,
}

impl<'a> Check<'a> {
    pub(crate) fn new(
        limiter: &'a Limiter,
        key: &'a WindowKey,
        policy: &'a Policy,
        cost: u32,
    ) -> Self {
        Self {
            state: State::Start {
                limiter,
                key,
                policy,
                cost,
            },
        }
    }
}

impl Future for Check<'_> {
    type Output = Result<Decision, LimitError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        if let State::Start {
            limiter,
            key,
            policy,
            cost,
        } = this.state
        {
            let decided = limiter.poll_in_process(key, policy, cost);
            if decided.is_ready() {
                this.state = State::Done;
                return decided;
            }
            this.state = State::Waiting(Box::pin(limiter.check_policy_async(key, policy, cost)));
        }
        match &mut this.state {
            State::Waiting(future) => {
                let output = std::task::ready!(future.as_mut().poll(cx));
                this.state = State::Done;
                Poll::Ready(output)
            }
            State::Start { .. } | State::Done => panic!("`Check` polled after completion"),
        }
    }
}

impl fmt::Debug for Check<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            State::Start { .. } => "start",
            State::Waiting(_) => "waiting",
            State::Done => "done",
        };
        f.debug_struct("Check").field("state", &state).finish()
    }
}
