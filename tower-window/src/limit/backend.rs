//! [`Backend`]: what a backend does for policies (windows).

use std::sync::Arc;

use super::SettleRequest;
use crate::store::{CheckRequest, Guard, Op, Store, StoreError};
use crate::{Decision, Policy, WindowKey};

/// A home for rate-limit windows: what a [`Limiter`](crate::Limiter) asks
/// of its store's backend.
///
/// One call decides one request against a whole [`Policy`] atomically: it
/// admits only if every quota admits, then records the cost in every quota;
/// a denial changes nothing (beyond dropping expired state). Implementations
/// must decide alike for the same inputs and times (the `tower-window-tests`
/// differential suite compares them).
///
/// An in-process backend answers with [`Op::ready`]; a networked one with
/// [`Guard::run`], which applies the store handle's budget, retries,
/// in-flight bound and breaker. The operation owns what it needs
/// (`'static`), so a waiting check owns it too.
pub trait Backend: Send + Sync + 'static {
    /// Checks `request` and records it if admitted.
    fn check<'a>(
        &'a self,
        guard: &mut Guard<'a>,
        request: CheckRequest<'a>,
    ) -> Op<'static, Decision>;

    /// Evaluates `request` against every quota and records nothing: each
    /// quota's state as it stands, `allowed` whether the cost would fit
    /// ([`Limiter::peek_policy`](crate::Limiter::peek_policy)). The default
    /// answers [`StoreErrorKind::InvalidRequest`](crate::StoreErrorKind::InvalidRequest).
    fn peek<'a>(
        &'a self,
        guard: &mut Guard<'a>,
        request: CheckRequest<'a>,
    ) -> Op<'static, Decision> {
        let _ = (guard, request);
        Op::ready(Err(StoreError::invalid("this store cannot peek")))
    }

    /// Settles `request` ([`Limiter::settle`](crate::Limiter::settle)):
    /// takes back the reserved units each quota did not use where they
    /// still count, and records usage past the reservation whether or not
    /// it fits; answers each quota's state once settled, as a check of one
    /// unit would see it (recording nothing). The default answers
    /// [`StoreErrorKind::InvalidRequest`](crate::StoreErrorKind::InvalidRequest).
    fn settle<'a>(
        &'a self,
        guard: &mut Guard<'a>,
        request: SettleRequest<'a>,
    ) -> Op<'static, Decision> {
        let _ = (guard, request);
        Op::ready(Err(StoreError::invalid("this store cannot settle usage")))
    }

    /// The independent failure domain of `key` under `policy` (a Redis
    /// Cluster primary, say), or `None` for one domain (the default) or
    /// one not known yet.
    ///
    /// The store handle keeps one breaker per domain, so failures in one
    /// send only its keys to the fallback. Values above 16383 share the
    /// breaker of their value modulo 16384. Called on every guarded call:
    /// keep it cheap and free of I/O.
    fn failure_domain(&self, key: &WindowKey, policy: &Policy) -> Option<u16> {
        let _ = (key, policy);
        None
    }
}

/// The windows' backend of `store`.
pub(crate) fn of(store: &Store) -> Option<Arc<dyn Backend>> {
    crate::store::plugged!(store, dyn Backend)
}

impl crate::store::Backend {
    /// A backend of windows only, behind a network unless
    /// [`in_process`](Self::in_process) says otherwise.
    pub fn windows(windows: impl Backend) -> Self {
        Self::own().with_part::<dyn Backend>(Arc::new(windows))
    }
}
