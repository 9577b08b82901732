//! [`Check`]: the future of [`Limiter::check`] and [`Limiter::check_policy`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, Waker};

use futures_util::future::BoxFuture;

use crate::limit::lease_tier::Leased;
use crate::limit::local::Lookup;
use crate::limit::{LimitError, Limiter};
use crate::store::{CheckRequest, StoreError};
use crate::{Cost, Decision, Policy, QuotaCosts, WindowKey};

/// The future of one [`Limiter::check`] or [`Limiter::check_policy`].
///
/// It does nothing until polled. Its first poll asks the local tier and the
/// store, and completes without allocating when the answer is ready at once
/// (an in-process store, the local tier, a lease). A check that has to wait
/// clones the limiter, key and policy then, so it outlives the references
/// it was made from.
///
/// [`into_ready`](Self::into_ready) takes an answer available at once, or
/// hands back the started check as a `Check<'static>` to await anywhere:
///
/// ```
/// use tower_window::{Limiter, MemoryStore, Quota, WindowKey};
///
/// let limiter = Limiter::new(MemoryStore::new(), "1/1m".parse::<Quota>()?);
/// let key = WindowKey::for_subject("alice");
/// let first = limiter.check(&key, 1).into_ready().expect("in-process")?;
/// assert!(first.allowed());
/// let second = limiter.check(&key, 1).into_ready().expect("in-process")?;
/// assert!(!second.allowed());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "futures do nothing unless you `.await` or poll them"]
pub struct Check<'a> {
    state: State<'a>,
}

enum State<'a> {
    /// A refusal is boxed to keep `Check` small.
    Start(Of<'a>, Result<Cost, Box<LimitError>>),
    /// Boxed: what a waiting check owns would widen every check.
    Waiting(Box<Waiting>),
    /// Answered after waiting: what it was of, for [`Check::parts`].
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    Answered(Box<Waiting>),
    Done,
}

/// What a check is of: borrowed until it has to wait.
#[derive(Clone, Copy)]
struct Of<'a> {
    limiter: &'a Limiter,
    key: &'a WindowKey,
    policy: &'a Policy,
    /// Each quota's cost when they differ (the check's cost is then the
    /// largest).
    quota_costs: Option<&'a QuotaCosts>,
    /// A reservation, to be settled: never spent from a lease.
    reserving: bool,
}

/// A started check waiting for an answer, owning what it is of.
struct Waiting {
    limiter: Limiter,
    key: WindowKey,
    policy: Policy,
    quota_costs: Option<QuotaCosts>,
    reserving: bool,
    cost: Cost,
    /// The clock at the start when a `tower_window.check` span is wanted,
    /// else 0.
    traced: u64,
    on: On,
}

enum On {
    /// `stale`: the local tier held an expired denial.
    Store {
        future: BoxFuture<'static, Result<Decision, StoreError>>,
        stale: bool,
    },
    /// A reservation, or a wait for one.
    Leased(BoxFuture<'static, Result<Decision, LimitError>>),
}

impl<'a> Check<'a> {
    /// A check of `cost` units of `key` under `policy`; `quota_costs`: each
    /// quota's cost when they differ (`cost` is then the largest);
    /// `reserving`: a reservation ([`Limiter::reserve`]).
    pub(crate) fn new(
        limiter: &'a Limiter,
        key: &'a WindowKey,
        policy: &'a Policy,
        cost: Result<Cost, Box<LimitError>>,
        quota_costs: Option<&'a QuotaCosts>,
        reserving: bool,
    ) -> Self {
        let of = Of {
            limiter,
            key,
            policy,
            quota_costs,
            reserving,
        };
        Self {
            state: State::Start(of, cost),
        }
    }

    /// The decision, if it is available without waiting; else the check
    /// itself, started and owning what it waits with, to be awaited.
    pub fn into_ready(mut self) -> Result<Result<Decision, LimitError>, Check<'static>> {
        let mut cx = Context::from_waker(Waker::noop());
        match Pin::new(&mut self).poll(&mut cx) {
            Poll::Ready(result) => Ok(result),
            Poll::Pending => match self.state {
                State::Waiting(waiting) => Err(Check {
                    state: State::Waiting(waiting),
                }),
                // A check is pending only while it waits.
                State::Start(..) | State::Answered(_) | State::Done => {
                    panic!("`Check` pending without waiting")
                }
            },
        }
    }

    /// The limiter, key, policy and cost of a check that had to wait,
    /// once answered (the layer's mode reads them with the decision).
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    pub(crate) fn parts(&self) -> Option<(&Limiter, &WindowKey, &Policy, Cost)> {
        match &self.state {
            State::Answered(waiting) => Some((
                &waiting.limiter,
                &waiting.key,
                &waiting.policy,
                waiting.cost,
            )),
            _ => None,
        }
    }
}

impl<'a> Of<'a> {
    fn request(self, cost: Cost) -> CheckRequest<'a> {
        CheckRequest {
            quota_costs: self.quota_costs.map(QuotaCosts::as_slice),
            ..CheckRequest::new(self.key, self.policy, cost)
        }
    }

    fn waiting(self, cost: Cost, traced: u64, on: On) -> Box<Waiting> {
        Box::new(Waiting {
            limiter: self.limiter.clone(),
            key: self.key.clone(),
            policy: self.policy.clone(),
            quota_costs: self.quota_costs.cloned(),
            reserving: self.reserving,
            cost,
            traced,
            on,
        })
    }

    /// The first step: the lease tier, else the local tier and the store.
    fn start(self, cost: Cost) -> Result<Result<Decision, LimitError>, Box<Waiting>> {
        let limiter = self.limiter;
        let inner = &*limiter.inner;
        let traced = if tracing::enabled!(tracing::Level::DEBUG) {
            inner.clock.now_micros().max(1)
        } else {
            0
        };
        // A lease holds the same units in every quota, and cannot take
        // back what a reservation did not use.
        let leased = inner
            .leases
            .as_ref()
            .filter(|_| self.quota_costs.is_none() && !self.reserving)
            .and_then(|tier| Some((tier, tier.lease_ttl(self.policy)?)));
        let Some((tier, ttl)) = leased else {
            return self.start_direct(cost, traced);
        };
        let owned = || (limiter.clone(), self.key.clone(), self.policy.clone());
        let future: BoxFuture<'static, _> =
            match limiter.spend_leased(tier, ttl, self.key, self.policy, cost.get()) {
                Leased::Spent(decision, None) => {
                    return Ok(self.finish(Ok(decision), cost, traced))
                }
                Leased::Spent(decision, Some(slot)) => {
                    let (limiter, key, policy) = owned();
                    Box::pin(
                        async move { limiter.refill_ahead(slot, &key, &policy, decision).await },
                    )
                }
                Leased::Empty(slot, hot) => {
                    let (limiter, key, policy) = owned();
                    Box::pin(
                        async move { limiter.decide_leased(slot, hot, &key, &policy, cost).await },
                    )
                }
                Leased::Direct => return self.start_direct(cost, traced),
            };
        Err(self.waiting(cost, traced, On::Leased(future)))
    }

    /// The first step without a lease: the local tier, then the store.
    fn start_direct(
        self,
        cost: Cost,
        traced: u64,
    ) -> Result<Result<Decision, LimitError>, Box<Waiting>> {
        let inner = &*self.limiter.inner;
        let mut stale = false;
        if let Some(local) = &inner.local {
            match local.lookup(self.request(cost)) {
                Lookup::Hit(decision) => {
                    inner.stats.local_cache.fetch_add(1, Ordering::Relaxed);
                    return Ok(self.finish(Ok(decision), cost, traced));
                }
                Lookup::Miss { stale: s } => stale = s,
            }
        }
        match self.limiter.check_store(self.request(cost)).split() {
            Ok(result) => Ok(self.stored(result, cost, stale, traced)),
            Err(future) => Err(self.waiting(cost, traced, On::Store { future, stale })),
        }
    }

    // Always inlined: the decision is then built where the caller returns
    // it, not copied through each step.
    #[inline(always)]
    fn stored(
        self,
        result: Result<Decision, StoreError>,
        cost: Cost,
        stale: bool,
        traced: u64,
    ) -> Result<Decision, LimitError> {
        match result {
            Ok(decision) => {
                self.limiter
                    .note_stored(self.request(cost), stale, &decision);
                self.finish(Ok(decision), cost, traced)
            }
            Err(error) => {
                let decided = self.limiter.fall_back(self.request(cost), error);
                self.finish(decided, cost, traced)
            }
        }
    }

    /// The check's answer, counted in the metrics and recorded in a span if
    /// one is wanted.
    #[inline(always)]
    fn finish(
        self,
        mut result: Result<Decision, LimitError>,
        cost: Cost,
        traced: u64,
    ) -> Result<Decision, LimitError> {
        let inner = &*self.limiter.inner;
        if let Ok(decision) = &mut result {
            // A denial names its policy (problem bodies say which one denied).
            decision.record_denial_policy(self.policy);
            inner.metrics.decision(self.key, decision);
            if let Some(audit) = &inner.audit {
                audit.decision(self.key, self.policy.name(), decision);
            }
        }
        if traced != 0 {
            let decided = result.as_ref().ok();
            let outcome = match decided {
                Some(decision) if decision.allowed => "allowed",
                Some(_) => "denied",
                None => "error",
            };
            tracing::debug_span!(
                "tower_window.check",
                policy = self.policy.name(),
                cost = cost.get(),
                quota = decided.map(|decision| decision.quota().name()),
                outcome,
                source = decided.map(|decision| decision.source.as_str()),
                remaining = decided.map(|decision| decision.remaining),
                duration_us = inner.clock.now_micros().saturating_sub(traced),
            );
        }
        result
    }
}

impl Waiting {
    fn of(&self) -> Of<'_> {
        Of {
            limiter: &self.limiter,
            key: &self.key,
            policy: &self.policy,
            quota_costs: self.quota_costs.as_ref(),
            reserving: self.reserving,
        }
    }

    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<Decision, LimitError>> {
        let (cost, traced) = (self.cost, self.traced);
        Poll::Ready(match &mut self.on {
            On::Store { future, stale } => {
                let stale = *stale;
                let result = std::task::ready!(future.as_mut().poll(cx));
                self.of().stored(result, cost, stale, traced)
            }
            On::Leased(future) => {
                let result = std::task::ready!(future.as_mut().poll(cx));
                self.of().finish(result, cost, traced)
            }
        })
    }
}

impl Future for Check<'_> {
    type Output = Result<Decision, LimitError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // `Check` is `Unpin`: it holds no self-reference.
        let this = &mut *self;
        if let State::Waiting(waiting) = &mut this.state {
            let answer = waiting.poll(cx);
            if answer.is_ready() {
                if let State::Waiting(waiting) = std::mem::replace(&mut this.state, State::Done) {
                    this.state = State::Answered(waiting);
                }
            }
            return answer;
        }
        match std::mem::replace(&mut this.state, State::Done) {
            State::Start(_, Err(refused)) => Poll::Ready(Err(*refused)),
            State::Start(of, Ok(cost)) => match of.start(cost) {
                Ok(result) => Poll::Ready(result),
                Err(waiting) => {
                    this.state = State::Waiting(waiting);
                    Pin::new(this).poll(cx)
                }
            },
            State::Waiting(_) | State::Answered(_) | State::Done => {
                panic!("`Check` polled after completion")
            }
        }
    }
}

impl fmt::Debug for Check<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Start(..) => "start",
            State::Waiting(waiting) => match waiting.on {
                On::Store { .. } => "store",
                On::Leased(_) => "leased",
            },
            State::Answered(_) | State::Done => "done",
        };
        f.debug_struct("Check").field("state", &state).finish()
    }
}
