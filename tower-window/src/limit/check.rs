//! [`Check`]: the future of [`Limiter::check`] and [`Limiter::check_policy`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, Waker};

use futures_util::future::BoxFuture;

use crate::limit::lease_tier::Leased;
#[cfg(feature = "tower")]
use crate::limit::lease_tier::SpentAtOnce;
use crate::limit::local::Lookup;
use crate::limit::{LimitError, Limiter};
use crate::store::{CheckRequest, StoreError};
use crate::{Cost, Decision, Policy, QuotaCosts, WindowKey};

/// The future of one [`Limiter::check`] or [`Limiter::check_policy`].
///
/// Like any future it does nothing until polled. There is one path for
/// every store: its first poll asks the local tier and then the store's
/// backend, whose answer is ready at once on an in-process backend (the
/// check then completes in that poll, without allocating) and a future on
/// a networked one (the backend's one boxed future, holding the time
/// budget, retries and breaker bookkeeping too). So a `Check` stays a few
/// words wide whatever the slow path holds, and moving it costs nothing.
///
/// [`into_ready`](Self::into_ready) takes the answer when it is available
/// at once, for loops that decide per message without awaiting:
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
    limiter: &'a Limiter,
    key: &'a WindowKey,
    policy: &'a Policy,
    /// Each quota's cost when they differ (the check's own cost is then
    /// the largest); `None`: one cost for every quota.
    quota_costs: Option<&'a QuotaCosts>,
    state: State<'a>,
}

/// What [`Check::leased_at_once`] found.
#[cfg(feature = "tower")]
pub(crate) enum AtOnce {
    /// A live lease decided the check.
    Decided(Result<Decision, LimitError>),
    /// The key is too cold to lease, and was counted: check it with
    /// [`Check::without_leases`].
    Direct,
    /// Nothing done: check it as usual.
    Later,
}

/// Why a check is refused before it starts.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Refused {
    ZeroCost,
    QuotaCosts { quotas: u32, costs: u32 },
}

impl From<crate::ZeroCost> for Refused {
    fn from(_: crate::ZeroCost) -> Self {
        Refused::ZeroCost
    }
}

impl From<Refused> for LimitError {
    fn from(refused: Refused) -> Self {
        match refused {
            Refused::ZeroCost => LimitError::ZeroCost,
            Refused::QuotaCosts { quotas, costs } => LimitError::QuotaCosts {
                quotas: quotas as usize,
                costs: costs as usize,
            },
        }
    }
}

enum State<'a> {
    Start(Result<Cost, Refused>),
    /// Not started, and skips the lease tier: the layer already found the
    /// key too cold to lease, and counted it (see [`Check::leased_at_once`]).
    #[cfg(feature = "tower")]
    StartWithoutLeases(Cost),
    /// The store's answer is on its way. `traced`: the limiter clock's
    /// reading at the start when a `tower_window.check` span is wanted,
    /// else 0.
    Store {
        future: BoxFuture<'a, Result<Decision, StoreError>>,
        cost: Cost,
        stale: bool,
        traced: u64,
    },
    /// A check with quota leases (spend, or reserve).
    Leased {
        future: BoxFuture<'a, Result<Decision, LimitError>>,
        cost: Cost,
        traced: u64,
    },
    Done,
}

impl<'a> Check<'a> {
    pub(crate) fn new(
        limiter: &'a Limiter,
        key: &'a WindowKey,
        policy: &'a Policy,
        cost: Result<Cost, Refused>,
    ) -> Self {
        Self {
            limiter,
            key,
            policy,
            quota_costs: None,
            state: State::Start(cost),
        }
    }

    /// A check of `costs[i]` units in quota `i` of `policy`: one cost for
    /// all when they are equal, refused when the lengths differ.
    pub(crate) fn per_quota(
        limiter: &'a Limiter,
        key: &'a WindowKey,
        policy: &'a Policy,
        costs: &'a QuotaCosts,
    ) -> Self {
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        let (cost, quota_costs) = match costs.as_slice() {
            _ if costs.len() != policy.len() => (
                Err(Refused::QuotaCosts {
                    quotas: count(policy.len()),
                    costs: count(costs.len()),
                }),
                None,
            ),
            [first, rest @ ..] if rest.iter().all(|c| c == first) => (Ok(*first), None),
            _ => (
                Ok(costs.iter().copied().max().unwrap_or(Cost::ONE)),
                Some(costs),
            ),
        };
        Self {
            quota_costs,
            ..Self::new(limiter, key, policy, cost)
        }
    }

    /// The store request of this check (`cost`: its own, the largest when
    /// quotas cost differently).
    fn request(&self, cost: Cost) -> CheckRequest<'a> {
        let request = CheckRequest::new(self.key, self.policy, cost);
        match self.quota_costs {
            Some(costs) => request.with_quota_costs(costs.as_slice()),
            None => request,
        }
    }

    /// The decision, if it is available without waiting (an in-process
    /// store, the local tier, a lease being spent); the check itself
    /// otherwise, started, to be awaited for its answer.
    pub fn into_ready(mut self) -> Result<Result<Decision, LimitError>, Self> {
        let mut cx = Context::from_waker(Waker::noop());
        match Pin::new(&mut self).poll(&mut cx) {
            Poll::Ready(result) => Ok(result),
            Poll::Pending => Err(self),
        }
    }

    /// The check's answer if a live lease gives it at once, with nothing
    /// else to do (no reservation ahead of need); else whether the key is
    /// too cold to lease ([`AtOnce::Direct`]: counted as such, to be
    /// checked [`without_leases`](Self::without_leases)), or nothing done.
    /// For callers that would otherwise box the check to await it (the
    /// layer over a networked store).
    #[cfg(feature = "tower")]
    pub(crate) fn leased_at_once(mut self) -> AtOnce {
        let State::Start(Ok(cost)) = self.state else {
            return AtOnce::Later;
        };
        let limiter = self.limiter;
        let inner = &*limiter.inner;
        let Some((tier, ttl)) = inner
            .leases
            .as_ref()
            .filter(|_| self.quota_costs.is_none())
            .and_then(|tier| Some((tier, tier.lease_ttl(self.policy)?)))
        else {
            return AtOnce::Later;
        };
        let traced = if tracing::enabled!(tracing::Level::DEBUG) {
            inner.clock.now_micros().max(1)
        } else {
            0
        };
        match limiter.spend_at_once(tier, ttl, self.key, self.policy, cost.get()) {
            SpentAtOnce::Spent(decision) => match self.finish(Ok(decision), cost, traced) {
                Poll::Ready(result) => AtOnce::Decided(result),
                Poll::Pending => AtOnce::Later,
            },
            SpentAtOnce::Cold => AtOnce::Direct,
            SpentAtOnce::Not => AtOnce::Later,
        }
    }

    /// The check without the lease tier (see [`AtOnce::Direct`]).
    #[cfg(feature = "tower")]
    pub(crate) fn without_leases(mut self) -> Self {
        if let State::Start(Ok(cost)) = self.state {
            self.state = State::StartWithoutLeases(cost);
        }
        self
    }

    /// The first step: local tier, then the store (or the lease tier).
    fn start(
        &mut self,
        cx: &mut Context<'_>,
        cost: Cost,
        leases: bool,
    ) -> Poll<Result<Decision, LimitError>> {
        let limiter = self.limiter;
        let inner = &*limiter.inner;
        let traced = if tracing::enabled!(tracing::Level::DEBUG) {
            inner.clock.now_micros().max(1)
        } else {
            0
        };
        // Leases hold one count of units for every quota: a check whose
        // quotas cost differently goes to the store (exact all the same,
        // as the store counts what leases hold).
        let leased = inner
            .leases
            .as_ref()
            .filter(|_| leases && self.quota_costs.is_none())
            .and_then(|tier| Some((tier, tier.lease_ttl(self.policy)?)));
        if let Some((tier, ttl)) = leased {
            let (key, policy) = (self.key, self.policy);
            let future: BoxFuture<'a, _> =
                match limiter.spend_leased(tier, ttl, key, policy, cost.get()) {
                    // Spent from a live lease: no store call, no wait.
                    Leased::Spent(decision, None) => {
                        return self.finish(Ok(decision), cost, traced)
                    }
                    Leased::Spent(decision, Some(slot)) => {
                        Box::pin(limiter.refill_ahead(tier, slot, key, policy, decision))
                    }
                    Leased::Empty(slot, hot) => {
                        Box::pin(limiter.decide_leased(tier, slot, hot, key, policy, cost))
                    }
                    // A key too cold to lease: as without leases.
                    Leased::Direct => return self.start_direct(cx, cost, traced),
                };
            self.state = State::Leased {
                future,
                cost,
                traced,
            };
            return self.poll_state(cx);
        }
        self.start_direct(cx, cost, traced)
    }

    /// The first step without a lease: local tier, then the store.
    fn start_direct(
        &mut self,
        cx: &mut Context<'_>,
        cost: Cost,
        traced: u64,
    ) -> Poll<Result<Decision, LimitError>> {
        let limiter = self.limiter;
        let inner = &*limiter.inner;
        let mut stale = false;
        if let Some(local) = &inner.local {
            let quota_costs = self.quota_costs.map(QuotaCosts::as_slice);
            match local.lookup(self.key, self.policy, cost.get(), quota_costs) {
                Lookup::Hit(decision) => {
                    inner.stats.local_cache.fetch_add(1, Ordering::Relaxed);
                    return self.finish(Ok(decision), cost, traced);
                }
                Lookup::Miss { stale: s } => stale = s,
            }
        }
        match limiter.check_store(self.request(cost)).split() {
            Ok(result) => self.stored(result, cost, stale, traced),
            Err(future) => {
                self.state = State::Store {
                    future,
                    cost,
                    stale,
                    traced,
                };
                self.poll_state(cx)
            }
        }
    }

    /// The store answered.
    // Always inlined: the decision is then built where the caller returns
    // it, instead of being copied through each step (measured: callgrind).
    #[inline(always)]
    fn stored(
        &mut self,
        result: Result<Decision, StoreError>,
        cost: Cost,
        stale: bool,
        traced: u64,
    ) -> Poll<Result<Decision, LimitError>> {
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

    /// Polls the future the check waits on.
    fn poll_state(&mut self, cx: &mut Context<'_>) -> Poll<Result<Decision, LimitError>> {
        match &mut self.state {
            State::Store {
                future,
                cost,
                stale,
                traced,
            } => {
                let (cost, stale, traced) = (*cost, *stale, *traced);
                let result = std::task::ready!(future.as_mut().poll(cx));
                self.stored(result, cost, stale, traced)
            }
            State::Leased {
                future,
                cost,
                traced,
            } => {
                let (cost, traced) = (*cost, *traced);
                let result = std::task::ready!(future.as_mut().poll(cx));
                self.finish(result, cost, traced)
            }
            State::Start(_) | State::Done => panic!("`Check` polled after completion"),
            #[cfg(feature = "tower")]
            State::StartWithoutLeases(_) => panic!("`Check` polled after completion"),
        }
    }

    /// The check's answer: counted in the metrics, recorded in a span if
    /// one is wanted.
    #[inline(always)]
    fn finish(
        &mut self,
        mut result: Result<Decision, LimitError>,
        cost: Cost,
        traced: u64,
    ) -> Poll<Result<Decision, LimitError>> {
        if !matches!(self.state, State::Done) {
            // Drops what the check waited on; a check decided in its first
            // poll holds nothing to drop.
            self.state = State::Done;
        }
        let inner = &*self.limiter.inner;
        if let Ok(decision) = &mut result {
            // A denial names its policy (problem bodies say which one denied).
            decision.record_denial_policy(self.policy);
            inner.metrics.decision(self.key, decision);
        }
        if traced != 0 {
            let micros = inner.clock.now_micros().saturating_sub(traced);
            let span = tracing::debug_span!(
                "tower_window.check",
                policy = self.policy.name(),
                cost = cost.get(),
                quota = tracing::field::Empty,
                outcome = tracing::field::Empty,
                source = tracing::field::Empty,
                remaining = tracing::field::Empty,
                duration_us = micros,
            );
            match &result {
                Ok(decision) => {
                    let outcome = if decision.allowed {
                        "allowed"
                    } else {
                        "denied"
                    };
                    span.record("outcome", outcome);
                    span.record("source", decision.source.as_str());
                    span.record("quota", decision.quota().name());
                    span.record("remaining", decision.remaining);
                }
                Err(_) => {
                    span.record("outcome", "error");
                }
            }
        }
        Poll::Ready(result)
    }
}

impl Future for Check<'_> {
    type Output = Result<Decision, LimitError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // `Check` holds no self-reference: it is `Unpin`.
        let this = &mut *self;
        match std::mem::replace(&mut this.state, State::Done) {
            State::Start(Err(refused)) => Poll::Ready(Err(refused.into())),
            State::Start(Ok(cost)) => this.start(cx, cost, true),
            #[cfg(feature = "tower")]
            State::StartWithoutLeases(cost) => this.start(cx, cost, false),
            State::Done => panic!("`Check` polled after completion"),
            waiting => {
                this.state = waiting;
                this.poll_state(cx)
            }
        }
    }
}

impl Unpin for Check<'_> {}

impl fmt::Debug for Check<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            State::Start(_) => "start",
            #[cfg(feature = "tower")]
            State::StartWithoutLeases(_) => "start",
            State::Store { .. } => "store",
            State::Leased { .. } => "leased",
            State::Done => "done",
        };
        f.debug_struct("Check").field("state", &state).finish()
    }
}
