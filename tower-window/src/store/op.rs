//! [`Op`]: what a store operation returns — its answer at once, or a future.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::future::BoxFuture;

use crate::store::StoreError;

/// One store operation's answer: ready at once (an in-process backend), or
/// a future (a networked one, built with
/// [`Guard::run`](crate::store::Guard::run)). The caller asks
/// [`into_ready`](Self::into_ready) and awaits only an answer that has to
/// wait (an `Op` is a future itself).
///
/// ```
/// use tower_window::store::Op;
///
/// let op: Op<'_, u32> = Op::ready(Ok(7));
/// assert_eq!(op.into_ready().ok().and_then(Result::ok), Some(7));
/// ```
#[must_use = "a store operation does nothing unless its answer is used"]
pub struct Op<'a, T> {
    state: State<'a, T>,
}

enum State<'a, T> {
    Ready(Option<Result<T, StoreError>>),
    Pending(BoxFuture<'a, Result<T, StoreError>>),
}

impl<'a, T> Op<'a, T> {
    /// An answer available now.
    #[inline]
    pub fn ready(result: Result<T, StoreError>) -> Self {
        Self {
            state: State::Ready(Some(result)),
        }
    }

    /// An answer that has to wait for `future`.
    pub fn pending(future: impl Future<Output = Result<T, StoreError>> + Send + 'a) -> Self {
        Self::boxed(Box::pin(future))
    }

    /// An answer that has to wait for an already boxed `future`.
    pub fn boxed(future: BoxFuture<'a, Result<T, StoreError>>) -> Self {
        Self {
            state: State::Pending(future),
        }
    }

    /// Whether the answer is available now.
    pub fn is_ready(&self) -> bool {
        matches!(self.state, State::Ready(Some(_)))
    }

    #[inline]
    pub(crate) fn ready_ref(&self) -> Option<&Result<T, StoreError>> {
        match &self.state {
            State::Ready(result) => result.as_ref(),
            State::Pending(_) => None,
        }
    }

    /// The answer, if it is available now; the operation itself otherwise.
    pub fn into_ready(self) -> Result<Result<T, StoreError>, Self> {
        match self.state {
            State::Ready(Some(result)) => Ok(result),
            state => Err(Self { state }),
        }
    }

    /// The answer if it is available now, else the future to await it.
    #[inline]
    pub(crate) fn split(self) -> Result<Result<T, StoreError>, BoxFuture<'a, Result<T, StoreError>>>
    where
        T: Send + 'a,
    {
        match self.state {
            State::Ready(Some(result)) => Ok(result),
            State::Ready(None) => Ok(Err(used_twice())),
            State::Pending(future) => Err(future),
        }
    }

    /// The answer mapped by `f`, at once or when it arrives.
    pub fn map<U>(
        self,
        f: impl FnOnce(Result<T, StoreError>) -> Result<U, StoreError> + Send + 'a,
    ) -> Op<'a, U>
    where
        T: Send + 'a,
    {
        match self.state {
            State::Ready(Some(result)) => Op::ready(f(result)),
            State::Ready(None) => Op::ready(Err(used_twice())),
            State::Pending(future) => Op::pending(async move { f(future.await) }),
        }
    }
}

impl<T> Future for Op<'_, T> {
    type Output = Result<T, StoreError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // `State` holds no self-reference: `Op` is `Unpin`.
        let this = self.get_mut();
        match &mut this.state {
            State::Ready(result) => Poll::Ready(result.take().unwrap_or_else(|| Err(used_twice()))),
            State::Pending(future) => future.as_mut().poll(cx),
        }
    }
}

impl<T> Unpin for Op<'_, T> {}

impl<T> fmt::Debug for Op<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            State::Ready(Some(_)) => "ready",
            State::Ready(None) => "taken",
            State::Pending(_) => "pending",
        };
        f.debug_struct("Op").field("state", &state).finish()
    }
}

fn used_twice() -> StoreError {
    StoreError::invalid("a store operation's answer was taken twice")
}
