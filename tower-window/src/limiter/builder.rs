//! [`LimiterBuilder`]: a [`Limiter`] with resilience.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use super::{Counters, Inner, Limiter};
use crate::fallback::FallbackPolicy;
use crate::limiter::breaker::{BreakerConfig, Breakers};
use crate::limiter::local::{LocalTier, DEFAULT_LOCAL_CAPACITY};
use crate::limiter::resilience::{Resilience, RetryConfig, DEFAULT_MAX_IN_FLIGHT, DEFAULT_TIMEOUT};
use crate::metrics::{LimiterMetrics, MetricParts};
use crate::store::Store;
use crate::{Clock, Policy, SystemClock};

/// Builds a [`Limiter`] with resilience; see [`Limiter::builder`].
///
/// Defaults: a local tier of 100 000 keys, a 50 ms budget per decision,
/// [`RetryConfig::default`], [`BreakerConfig::default`], at most 1024 store
/// calls in flight, the [`SystemClock`], and no fallback policy (a store
/// failure is returned as an error). The time budget and retries use tokio's
/// timer, so checks must run inside a tokio runtime with time enabled.
#[must_use]
pub struct LimiterBuilder {
    store: Arc<dyn Store>,
    policy: Policy,
    clock: Arc<dyn Clock>,
    local_capacity: u64,
    fallback: Option<Box<dyn FallbackPolicy>>,
    timeout: Option<Duration>,
    retry: RetryConfig,
    breaker: Option<BreakerConfig>,
    max_in_flight: Option<usize>,
    metrics_tenant_label: bool,
    leases: Option<super::LeaseConfig>,
}

impl LimiterBuilder {
    /// The default time budget of one decision: 50 ms.
    pub const DEFAULT_TIMEOUT: Duration = DEFAULT_TIMEOUT;
    /// The default capacity of the local tier: 100 000 keys.
    pub const DEFAULT_LOCAL_CAPACITY: u64 = DEFAULT_LOCAL_CAPACITY;
    /// The default bound on store calls in flight: 1024.
    pub const DEFAULT_MAX_IN_FLIGHT: usize = DEFAULT_MAX_IN_FLIGHT;

    pub(super) fn new(store: Arc<dyn Store>, policy: Policy) -> Self {
        Self {
            store,
            policy,
            clock: Arc::new(SystemClock),
            local_capacity: DEFAULT_LOCAL_CAPACITY,
            fallback: None,
            timeout: Some(DEFAULT_TIMEOUT),
            retry: RetryConfig::default(),
            breaker: Some(BreakerConfig::default()),
            max_in_flight: Some(DEFAULT_MAX_IN_FLIGHT),
            metrics_tenant_label: false,
            leases: None,
        }
    }

    /// The clock of the local tier, the breaker and the fallback policy
    /// (default [`SystemClock`]). The store keeps its own time.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// How many keys the local tier of recent denials holds (default
    /// 100 000); `0` turns the local tier off.
    pub fn local_capacity(mut self, capacity: u64) -> Self {
        self.local_capacity = capacity;
        self
    }

    /// What to answer when the store cannot (default: return the error).
    pub fn fallback(mut self, policy: impl FallbackPolicy) -> Self {
        self.fallback = Some(Box::new(policy));
        self
    }

    /// The time budget of one decision's store call, retries included
    /// (default 50 ms).
    pub fn timeout(mut self, budget: Duration) -> Self {
        self.timeout = Some(budget);
        self
    }

    /// No time budget: a check waits for the store as long as it takes.
    pub fn without_timeout(mut self) -> Self {
        self.timeout = None;
        self
    }

    /// How failed store calls are retried (default [`RetryConfig::default`]).
    pub fn retry(mut self, retry: RetryConfig) -> Self {
        self.retry = retry;
        self
    }

    /// The circuit breaker's configuration (default [`BreakerConfig::default`]).
    ///
    /// Over a store with several failure domains
    /// ([`Store::failure_domain`], e.g. the primaries of a Redis Cluster)
    /// the limiter keeps one breaker with this configuration per domain,
    /// made on the domain's first call, so one dead primary does not send
    /// the live primaries' keys to the fallback.
    pub fn breaker(mut self, config: BreakerConfig) -> Self {
        self.breaker = Some(config);
        self
    }

    /// No circuit breaker.
    pub fn without_breaker(mut self) -> Self {
        self.breaker = None;
        self
    }

    /// At most `n` store calls in flight on this limiter (default 1024,
    /// clamped to `1..=Semaphore::MAX_PERMITS`); beyond it a check takes the
    /// `Overloaded` path at once. Our own overload never counts against the
    /// store's health: it opens no breaker.
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = Some(n.clamp(1, Semaphore::MAX_PERMITS));
        self
    }

    /// No bound on store calls in flight.
    pub fn unbounded_in_flight(mut self) -> Self {
        self.max_in_flight = None;
        self
    }

    /// Leases quota from the store ([`Store::reserve`](crate::Store::reserve)):
    /// a node takes blocks of units (up to `config.max_units()`) in one
    /// store call and admits from them locally until the lease's deadline,
    /// with the global bound still exact (see [`crate::store::lease`]).
    /// `max_units = 0` leaves leases off (the default). The lease tier holds
    /// as many keys as the local tier (at least 1 000).
    ///
    /// Call [`Limiter::refund_leases`] on graceful shutdown. The store must
    /// support leases (the embedded store and Redis do); a store that does
    /// not makes every check fall back to a direct check.
    pub fn leases(mut self, config: super::LeaseConfig) -> Self {
        self.leases = (config.max_units() > 0).then_some(config);
        self
    }

    /// Adds a `tenant` label (the key's tenant) to the decision metrics
    /// (default off: one series per tenant can be many series). The subject
    /// is never a label. With the label on, each record looks its series up
    /// in the recorder, which allocates. Without the `metrics` feature this
    /// does nothing.
    pub fn metrics_tenant_label(mut self, enabled: bool) -> Self {
        self.metrics_tenant_label = enabled;
        self
    }

    /// Builds the limiter.
    pub fn build(self) -> Limiter {
        let clock = self.clock;
        let fallback = self.fallback.map(|mut policy| {
            policy.attach_clock(clock.clone());
            policy
        });
        let parts = MetricParts {
            fallback: fallback.is_some(),
            breaker: self.breaker.is_some(),
            local: self.local_capacity > 0,
        };
        let metrics = Arc::new(LimiterMetrics::new(
            self.policy.first(),
            self.metrics_tenant_label,
            parts,
        ));
        let local = (self.local_capacity > 0).then(|| {
            LocalTier::new(self.local_capacity, clock.clone()).with_metrics(metrics.clone())
        });
        let breaker = self
            .breaker
            .map(|config| Breakers::new(config, clock.clone(), Some(metrics.clone())));
        Limiter {
            inner: Arc::new(Inner {
                metrics,
                store: self.store,
                policy: self.policy,
                clock,
                local,
                leases: self.leases.map(|config| {
                    super::lease::LeaseTier::new(config, self.local_capacity.max(1_000))
                }),
                fallback,
                breaker,
                resilience: Resilience {
                    timeout: self.timeout,
                    retry: self.retry,
                    in_flight: self.max_in_flight.map(Semaphore::new),
                },
                stats: Counters::default(),
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
            .field("timeout", &self.timeout)
            .field("retry", &self.retry)
            .field("breaker", &self.breaker)
            .field("max_in_flight", &self.max_in_flight)
            .field("metrics_tenant_label", &self.metrics_tenant_label)
            .finish_non_exhaustive()
    }
}
