//! [`Backend`]: what a backend does for policies (windows).

use std::sync::Arc;

use crate::store::{CheckRequest, Guard, Op, Store, StoreError, StoreErrorKind};
use crate::{Decision, Policy, WindowKey};

/// A home for rate-limit windows: the operations a [`Limiter`](crate::Limiter)
/// asks of its store's backend.
///
/// One call decides one request against a whole [`Policy`]: it reads every
/// quota's window, admits only if every quota admits, and then records the
/// cost in every quota, all atomically. A denied request changes nothing in
/// any quota (beyond dropping expired state). Every implementation must give
/// the same decisions for the same inputs and times; the differential suite
/// in the `tower-window-tests` package checks [`MemoryStore`](crate::MemoryStore)
/// and [`RedisStore`](crate::RedisStore) against each other and a model.
///
/// An in-process backend answers with [`Op::ready`]; a backend behind a
/// network with [`Guard::run`], which bounds the call by the store handle's
/// budget, retries, in-flight bound and breaker. Either way the operation
/// owns what it needs (`'static`): its future holds a clone of the
/// backend's handle and of what the request names, so the check waiting
/// for it owns it too (the layer keeps that check in its response future,
/// unboxed).
pub trait Backend: Send + Sync + 'static {
    /// Checks `request` and records it if admitted.
    fn check<'a>(
        &'a self,
        guard: &mut Guard<'a>,
        request: CheckRequest<'a>,
    ) -> Op<'static, Decision>;

    /// Evaluates `request` against every quota of its policy and records
    /// nothing: each quota's state as it stands (`remaining` before the
    /// cost, `reset_after` now), `allowed` whether the cost would fit. For
    /// usage reports ([`Limiter::peek_policy`](crate::Limiter::peek_policy)).
    ///
    /// The default answers [`StoreErrorKind::InvalidRequest`]: a backend
    /// that cannot peek says so.
    fn peek<'a>(
        &'a self,
        guard: &mut Guard<'a>,
        request: CheckRequest<'a>,
    ) -> Op<'static, Decision> {
        let _ = (guard, request);
        Op::ready(Err(StoreError::new(
            StoreErrorKind::InvalidRequest,
            "this store cannot peek",
        )))
    }

    /// Which independent failure domain the keys of `key` under `policy` live
    /// in (for example the Redis Cluster primary serving their hash slot),
    /// or `None` when the backend is one failure domain (the default) or the
    /// domain is not known yet.
    ///
    /// The store handle keeps one circuit breaker per domain, so failures
    /// in one domain send only that domain's keys to the fallback. Values
    /// should be below 16384; larger ones share the breaker of their value
    /// modulo 16384. Called once per call that has a breaker: keep it cheap
    /// and free of I/O.
    fn failure_domain(&self, key: &WindowKey, policy: &Policy) -> Option<u16> {
        let _ = (key, policy);
        None
    }
}

/// The windows' backend of `store`: the one it was given, or its native
/// store's.
pub(crate) fn of(store: &Store) -> Option<Arc<dyn Backend>> {
    crate::store::plugged!(store, dyn Backend)
}

impl crate::store::Backend {
    /// A backend of windows only (no quota leases, connection seats, dedup
    /// or event windows), behind a network unless
    /// [`in_process`](Self::in_process) says otherwise.
    pub fn windows(windows: impl Backend) -> Self {
        Self::own().with_part::<dyn Backend>(Arc::new(windows))
    }
}
