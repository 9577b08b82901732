//! The [`Store`](crate::Store)'s resilience stack. Every operation asks
//! its failure domain's breaker and is lent a [`Guard`]; an answer ready at
//! once is reported to the breaker there and then, and a networked backend
//! builds its future with [`Guard::run`], which puts the whole stack and
//! the call's metrics into that one boxed future.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

pub(crate) mod breaker;
mod on_failure;
pub(crate) mod retry;

use breaker::{Breaker, Breakers, Ticket};
pub use on_failure::OnFailure;
use retry::RetryConfig;

use super::op::Op;
use crate::metrics::{Calls, StoreTimer};
use crate::store::{StoreError, StoreErrorKind};
use crate::Clock;

pub(crate) struct Resilience {
    pub(crate) timeout: Option<Duration>,
    pub(crate) retry: RetryConfig,
    pub(crate) in_flight: Option<Semaphore>,
    pub(crate) breakers: Option<Breakers>,
    /// The breakers' clock.
    pub(crate) clock: Arc<dyn Clock>,
}

impl Resilience {
    pub(crate) fn bare(clock: Arc<dyn Clock>) -> Self {
        Self {
            timeout: None,
            retry: RetryConfig::none(),
            in_flight: None,
            breakers: None,
            clock,
        }
    }

    /// Reserves a slot for one store call, if the bound allows.
    fn try_reserve(&self) -> Result<Option<SemaphorePermit<'_>>, StoreError> {
        match &self.in_flight {
            None => Ok(None),
            Some(semaphore) => semaphore.try_acquire().map(Some).map_err(|_| {
                StoreError::new(
                    StoreErrorKind::Overloaded,
                    "too many store calls in flight on this node",
                )
            }),
        }
    }
}

/// One call's share of its [`Store`](crate::Store)'s resilience stack,
/// lent to the backend operation: an in-process backend ignores it and
/// answers [`Op::ready`]; a networked one answers with [`run`](Self::run).
pub struct Guard<'a> {
    outcome: Outcome<&'a Arc<Resilience>>,
    calls: Calls<'a>,
    ran: bool,
}

impl<'a> Guard<'a> {
    /// A guard of no store: nothing bounded or recorded. For calling a
    /// backend directly, as its conformance tests do.
    pub fn bare() -> Self {
        static BARE: std::sync::LazyLock<Arc<Resilience>> =
            std::sync::LazyLock::new(|| Arc::new(Resilience::bare(Arc::new(crate::SystemClock))));
        Guard::new(&BARE, None, None, Calls::default())
    }

    pub(crate) fn new(
        resilience: &'a Arc<Resilience>,
        domain: Option<u16>,
        ticket: Option<Ticket>,
        calls: Calls<'a>,
    ) -> Self {
        Guard {
            outcome: Outcome {
                resilience,
                domain,
                ticket,
            },
            calls,
            ran: false,
        }
    }

    /// Bounds `op`, the answer of the operation this guard was lent to:
    /// one built with [`run`](Self::run) already is.
    #[inline(always)]
    pub(crate) fn settle<'o, T: Send + 'o>(mut self, op: Op<'o, T>) -> Op<'o, T> {
        if self.ran {
            return op;
        }
        match op.ready_ref() {
            Some(result) => {
                // Decided in-process: nothing to time, retry or bound. The
                // answer is looked at in place (a decision is large:
                // moving it out and back costs more than the rest).
                let error = result.as_ref().err();
                self.calls.store_call(StoreTimer::start(false), error);
                match error {
                    None => self.outcome.success(Duration::ZERO),
                    Some(error) => self.outcome.failure(error),
                }
                op
            }
            // A future built without `Guard::run`: bound it all the same.
            None => self.run_once(op),
        }
    }

    /// The operation as a future bounded by the stack: `attempt` makes one
    /// attempt, and is called again only after an error marked
    /// [`not_applied`](StoreError::not_applied). The future borrows only
    /// what `attempt` does.
    pub fn run<'o, T, F, Fut>(&mut self, attempt: F) -> Op<'o, T>
    where
        T: Send + 'o,
        F: FnMut() -> Fut + Send + 'o,
        Fut: std::future::Future<Output = Result<T, StoreError>> + Send + 'o,
    {
        self.ran = true;
        let resilience = Arc::clone(self.outcome.resilience);
        let calls = self.calls.to_owned();
        let mut outcome = Outcome {
            resilience: Arc::clone(&resilience),
            domain: self.outcome.domain,
            ticket: self.outcome.ticket.take(),
        };
        Op::pending(async move {
            // Dropping `outcome` early (or cancelled) frees a probe's slot.
            let _permit = resilience.try_reserve()?;
            let timer = StoreTimer::start(true);
            let started = resilience.clock.now_micros();
            let deadline = resilience
                .timeout
                .and_then(|budget| Instant::now().checked_add(budget));
            let attempts = retry::with_retries(resilience.retry, attempt, deadline, || {
                calls.store_retry();
            });
            let result = match (resilience.timeout, deadline) {
                (Some(budget), Some(deadline)) => tokio::time::timeout_at(deadline, attempts)
                    .await
                    .unwrap_or_else(|_| {
                        Err(StoreError::new(
                            StoreErrorKind::Timeout,
                            format!("no store decision within {budget:?}"),
                        ))
                    }),
                _ => attempts.await,
            };
            calls.store_call(timer, result.as_ref().err());
            match &result {
                Ok(_) => {
                    let latency = resilience.clock.now_micros().saturating_sub(started);
                    outcome.success(Duration::from_micros(latency));
                }
                Err(error) => {
                    // The error's text names no key.
                    tracing::warn!(
                        policy = calls.owner(),
                        kind = error.kind().as_str(),
                        %error,
                        "rate-limit store call failed"
                    );
                    outcome.failure(error);
                }
            }
            result
        })
    }

    /// Bounds a future built without [`run`](Self::run), with no retry.
    fn run_once<'o, T: Send + 'o>(mut self, op: Op<'o, T>) -> Op<'o, T> {
        let mut op = Some(op);
        self.run(move || {
            let op = op.take();
            async move {
                match op {
                    Some(op) => op.await,
                    None => Err(StoreError::new(
                        StoreErrorKind::Unsupported,
                        "this store operation cannot be retried",
                    )),
                }
            }
        })
    }
}

impl std::fmt::Debug for Guard<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("timeout", &self.outcome.resilience.timeout)
            .field("breaker", &self.outcome.resilience.breakers.is_some())
            .finish_non_exhaustive()
    }
}

/// Reports a call's outcome to its breaker once; dropped unreported, it
/// frees its probe slot. `R` borrows the stack while the call starts and
/// owns it in a guarded future.
struct Outcome<R: AsRef<Resilience>> {
    resilience: R,
    domain: Option<u16>,
    ticket: Option<Ticket>,
}

impl<R: AsRef<Resilience>> Outcome<R> {
    fn take(&mut self) -> Option<(&Breaker, Ticket)> {
        let ticket = self.ticket.take()?;
        let breakers = self.resilience.as_ref().breakers.as_ref()?;
        Some((breakers.get(self.domain), ticket))
    }

    fn success(&mut self, latency: Duration) {
        if let Some((b, t)) = self.take() {
            b.success(t, latency);
        }
    }

    /// A store failure, unless `error` is the caller's fault or our own
    /// overload, which say nothing of the store's health.
    fn failure(&mut self, error: &StoreError) {
        let Some((b, t)) = self.take() else {
            return;
        };
        match error.kind() {
            StoreErrorKind::InvalidRequest
            | StoreErrorKind::Unsupported
            | StoreErrorKind::Overloaded
            | StoreErrorKind::CircuitOpen => b.release(t),
            _ => b.failure(t),
        }
    }
}

impl<R: AsRef<Resilience>> Drop for Outcome<R> {
    fn drop(&mut self) {
        if let Some((b, t)) = self.take() {
            b.release(t);
        }
    }
}
