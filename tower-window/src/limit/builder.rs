//! [`LimiterBuilder`]: a [`Limiter`] with a local tier, a fallback and leases.

use std::fmt;
use std::sync::Arc;

use super::{Counters, Inner, Limiter};
use crate::fallback::FallbackPolicy;
use crate::limit::local::{LocalTier, DEFAULT_LOCAL_CAPACITY};
use crate::metrics::{LimiterMetrics, MetricParts};
use crate::store::Store;
use crate::Policy;

/// Builds a [`Limiter`]; see [`Limiter::builder`].
///
/// Defaults: a local tier of 100 000 keys, no leases, no fallback. The
/// budget, retries, breakers and clock are the store's ([`Store::builder`],
/// [`Backend::clock`](crate::store::Backend::clock)).
#[must_use]
pub struct LimiterBuilder {
    store: Store,
    policy: Policy,
    local_capacity: u64,
    fallback: Option<Box<dyn FallbackPolicy>>,
    metrics_tenant_label: bool,
    leases: Option<super::LeaseConfig>,
    audit: Option<crate::AuditLog>,
}

impl LimiterBuilder {
    /// The default capacity of the local tier.
    pub const DEFAULT_LOCAL_CAPACITY: u64 = DEFAULT_LOCAL_CAPACITY;

    pub(super) fn new(store: Store, policy: Policy) -> Self {
        Self {
            store,
            policy,
            local_capacity: DEFAULT_LOCAL_CAPACITY,
            fallback: None,
            metrics_tenant_label: false,
            leases: None,
            audit: None,
        }
    }

    /// How many keys the local tier of recent denials holds; `0` turns it
    /// off.
    pub fn local_capacity(mut self, capacity: u64) -> Self {
        self.local_capacity = capacity;
        self
    }

    /// What to answer when the store cannot (default: return the error).
    pub fn fallback(mut self, policy: impl FallbackPolicy) -> Self {
        self.fallback = Some(Box::new(policy));
        self
    }

    /// Leases quota from the store: a node takes blocks of up to
    /// `config.max_units()` units in one store call and admits from them
    /// locally until the lease's deadline, the global bound still exact
    /// (see [`crate::lease`]). Off by default, and with `max_units = 0`. The
    /// lease tier holds as many keys as the local tier (at least 1 000).
    ///
    /// Call [`Limiter::refund_leases`] on graceful shutdown. On a store
    /// without leases every check is a direct check.
    pub fn leases(mut self, config: super::LeaseConfig) -> Self {
        self.leases = (config.max_units() > 0).then_some(config);
        self
    }

    /// Hands every decision to `audit`, which records the ones its
    /// tenant's rules ask for, off the request path (see [`crate::audit`]).
    pub fn audit(mut self, audit: crate::AuditLog) -> Self {
        self.audit = Some(audit);
        self
    }

    /// Adds a `tenant` label (the key's tenant) to the decision metrics
    /// (default off: one series per tenant can be many, and each record
    /// then allocates a lookup). Without the `metrics` feature, nothing.
    pub fn metrics_tenant_label(mut self, enabled: bool) -> Self {
        self.metrics_tenant_label = enabled;
        self
    }

    /// Builds the limiter.
    pub fn build(self) -> Limiter {
        let clock = Arc::clone(self.store.clock());
        let fallback = self.fallback;
        let parts = MetricParts {
            fallback: fallback.is_some(),
            breaker: self.store.breaker_state().is_some(),
            local: self.local_capacity > 0,
        };
        let metrics = Arc::new(LimiterMetrics::new(
            self.policy.first(),
            self.metrics_tenant_label,
            parts,
        ));
        self.store.observe_breakers(&metrics);
        let local = (self.local_capacity > 0).then(|| {
            LocalTier::new(self.local_capacity, clock.clone()).with_metrics(metrics.clone())
        });
        Limiter {
            inner: Arc::new(Inner {
                metrics,
                windows: super::backend::of(&self.store),
                lease_backend: self
                    .leases
                    .is_some()
                    .then(|| crate::store::plugged!(self.store, dyn crate::lease::Backend))
                    .flatten(),
                store: self.store,
                policy: self.policy,
                clock,
                local,
                leases: self.leases.map(|config| {
                    super::lease_tier::LeaseTier::new(config, self.local_capacity.max(1_000))
                }),
                fallback,
                audit: self.audit,
                stats: Counters::default(),
                settles: Default::default(),
            }),
        }
    }
}

impl fmt::Debug for LimiterBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimiterBuilder")
            .field("policy", &self.policy)
            .field("local_capacity", &self.local_capacity)
            .field("fallback", &self.fallback.is_some())
            .field("store", &self.store)
            .field("metrics_tenant_label", &self.metrics_tenant_label)
            .field("audit", &self.audit.is_some())
            .finish_non_exhaustive()
    }
}
