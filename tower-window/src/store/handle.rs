//! [`Store`]: the store handle every capability is made from.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use super::guard::breaker::{BreakerConfig, BreakerState, Breakers};
use super::guard::retry::RetryConfig;
use super::guard::{Resilience, DEFAULT_MAX_IN_FLIGHT, DEFAULT_TIMEOUT};
use crate::{conn, dedup, events, lease, limit, Clock, MemoryStore, SystemClock, WindowKey};

/// A store: one backend ([`MemoryStore`], [`RedisStore`](crate::RedisStore)
/// on one node or a cluster, or your own) and the one resilience stack
/// every operation on it goes through: a time budget, retries only where
/// the backend certainly did not apply the operation, a bound on calls in
/// flight, and circuit breakers per failure domain (a Redis Cluster
/// primary) that also trip on slow calls.
///
/// Every capability is made from a store, so "on the same store" is what
/// the types say: [`Limiter`](crate::Limiter)s (policies and quota leases),
/// [`ConnectionLimiter`](crate::ConnectionLimiter)s (connection slots),
/// [`DedupWindow`](crate::DedupWindow)s and
/// [`EventWindow`](crate::events::EventWindow)s share its breakers, budget
/// and in-flight bound, and each records its store calls under its own name.
///
/// Cheap to clone: clones are the same store.
///
/// ```
/// use std::time::Duration;
/// use tower_window::{Limiter, MemoryStore, Quota, Store};
///
/// // In-process: every operation is answered at once, nothing to bound.
/// let store = Store::from(MemoryStore::new());
/// let api = Limiter::new(store.clone(), "100/1m".parse::<Quota>()?);
/// let burst = Limiter::new(store, "10/1s".parse::<Quota>()?);
/// # let _ = (api, burst);
///
/// // Behind a network: a 20 ms budget per operation, retries included.
/// # #[cfg(feature = "redis")] {
/// let redis = tower_window::RedisStore::from_url("redis://127.0.0.1:6379")?;
/// let store = Store::builder(redis).timeout(Duration::from_millis(20)).build();
/// # let _ = store; }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Store {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) windows: Arc<dyn limit::Backend>,
    pub(crate) leases: Option<Arc<dyn lease::Backend>>,
    pub(crate) connections: Option<Arc<dyn conn::Backend>>,
    pub(crate) dedup: Option<Arc<dyn dedup::Backend>>,
    pub(crate) events: Option<Arc<dyn events::Backend>>,
    /// Whether every operation is answered in-process.
    pub(crate) in_process: bool,
    pub(crate) resilience: Resilience,
    #[cfg(feature = "redis")]
    pub(crate) redis: Option<Arc<crate::RedisStore>>,
}

impl Store {
    /// A store on the embedded [`MemoryStore`] with default settings.
    pub fn memory() -> Self {
        Self::from(MemoryStore::new())
    }

    /// A builder for a store on `backend`, to set its resilience.
    ///
    /// Defaults: for a backend behind a network, a 50 ms budget per
    /// operation, [`RetryConfig::default`], [`BreakerConfig::default`] and
    /// at most 1024 calls in flight; for an in-process backend none of them
    /// (its answers are immediate). The budget and retries use tokio's timer,
    /// so operations must run inside a tokio runtime with time enabled.
    pub fn builder(backend: impl Into<Backend>) -> StoreBuilder {
        let backend = backend.into();
        let networked = !backend.in_process;
        StoreBuilder {
            backend,
            clock: Arc::new(SystemClock),
            timeout: networked.then_some(DEFAULT_TIMEOUT),
            retry: if networked {
                RetryConfig::default()
            } else {
                RetryConfig::none()
            },
            breaker: networked.then(BreakerConfig::default),
            max_in_flight: networked.then_some(DEFAULT_MAX_IN_FLIGHT),
        }
    }

    /// A store on `backend` with no budget, retries, in-flight bound or
    /// breaker: every operation is one call to the backend, its error
    /// returned as it is.
    pub fn bare(backend: impl Into<Backend>) -> Self {
        Self::builder(backend)
            .without_timeout()
            .retry(RetryConfig::none())
            .without_breaker()
            .unbounded_in_flight()
            .build()
    }

    /// The state of the breakers, if the store has them: over several
    /// failure domains (a Redis Cluster's primaries) the worst one.
    pub fn breaker_state(&self) -> Option<BreakerState> {
        self.inner.resilience.breakers.as_ref().map(Breakers::worst)
    }

    /// How many breakers are open (0 without breakers).
    pub fn open_breakers(&self) -> usize {
        self.inner
            .resilience
            .breakers
            .as_ref()
            .map_or(0, Breakers::open)
    }

    /// The state of the breaker guarding `key` under `policy` (its failure
    /// domain's), if the store has breakers. A domain no operation has
    /// reached yet is `Closed`.
    pub fn breaker_state_for(
        &self,
        key: &WindowKey,
        policy: &crate::Policy,
    ) -> Option<BreakerState> {
        let breakers = self.inner.resilience.breakers.as_ref()?;
        Some(breakers.state_of(self.inner.windows.failure_domain(key, policy)))
    }

    /// The time budget of one operation, if any.
    pub fn timeout(&self) -> Option<Duration> {
        self.inner.resilience.timeout
    }

    /// Whether the backend answers every operation in-process.
    pub fn is_in_process(&self) -> bool {
        self.inner.in_process
    }

    /// The Redis backend, if this store is on one (for its Redis-only
    /// parts: a tenant registry's control channel, an event tail).
    #[cfg(feature = "redis")]
    pub fn redis(&self) -> Option<&Arc<crate::RedisStore>> {
        self.inner.redis.as_ref()
    }
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("in_process", &self.inner.in_process)
            .field("timeout", &self.inner.resilience.timeout)
            .field("retry", &self.inner.resilience.retry)
            .field("breaker", &self.breaker_state())
            .finish_non_exhaustive()
    }
}

/// A store on a backend with the defaults of [`Store::builder`].
macro_rules! store_from {
    ($($(#[$attr:meta])* $backend:ty),*) => {$(
        $(#[$attr])*
        impl From<$backend> for Store {
            fn from(backend: $backend) -> Self {
                Store::builder(backend).build()
            }
        }
    )*};
}

store_from!(
    Backend,
    MemoryStore,
    #[cfg(feature = "redis")]
    crate::RedisStore,
    #[cfg(feature = "redis")]
    Arc<crate::RedisStore>
);

/// A store's backend: the implementations of each capability's backend
/// trait ([`limit::Backend`], [`lease::Backend`], [`conn::Backend`],
/// [`dedup::Backend`], [`events::Backend`]) that one store serves.
///
/// [`MemoryStore`] and [`RedisStore`](crate::RedisStore) convert into one
/// with every capability. Your own backend starts from
/// [`windows`](Self::windows) and adds what else it implements; a
/// capability it lacks answers [`StoreErrorKind::Unsupported`](crate::StoreErrorKind::Unsupported).
pub struct Backend {
    windows: Arc<dyn limit::Backend>,
    leases: Option<Arc<dyn lease::Backend>>,
    connections: Option<Arc<dyn conn::Backend>>,
    dedup: Option<Arc<dyn dedup::Backend>>,
    events: Option<Arc<dyn events::Backend>>,
    in_process: bool,
    #[cfg(feature = "redis")]
    redis: Option<Arc<crate::RedisStore>>,
}

impl Backend {
    /// A backend of windows only (no quota leases, connection slots, dedup
    /// or event windows), behind a network unless
    /// [`in_process`](Self::in_process) says otherwise.
    pub fn windows(windows: impl limit::Backend) -> Self {
        Self {
            windows: Arc::new(windows),
            leases: None,
            connections: None,
            dedup: None,
            events: None,
            in_process: false,
            #[cfg(feature = "redis")]
            redis: None,
        }
    }

    /// With quota leases.
    pub fn with_leases(mut self, leases: impl lease::Backend) -> Self {
        self.leases = Some(Arc::new(leases));
        self
    }

    /// With connection slots.
    pub fn with_connections(mut self, connections: impl conn::Backend) -> Self {
        self.connections = Some(Arc::new(connections));
        self
    }

    /// With dedup windows.
    pub fn with_dedup(mut self, dedup: impl dedup::Backend) -> Self {
        self.dedup = Some(Arc::new(dedup));
        self
    }

    /// With event windows.
    pub fn with_events(mut self, events: impl events::Backend) -> Self {
        self.events = Some(Arc::new(events));
        self
    }

    /// Whether every operation is answered in-process (then the store's
    /// defaults bound nothing).
    pub fn in_process(mut self, in_process: bool) -> Self {
        self.in_process = in_process;
        self
    }
}

impl fmt::Debug for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Backend")
            .field("leases", &self.leases.is_some())
            .field("connections", &self.connections.is_some())
            .field("dedup", &self.dedup.is_some())
            .field("events", &self.events.is_some())
            .field("in_process", &self.in_process)
            .finish_non_exhaustive()
    }
}

impl From<MemoryStore> for Backend {
    fn from(memory: MemoryStore) -> Self {
        let memory = Arc::new(memory);
        Self {
            windows: memory.clone(),
            leases: Some(memory.clone()),
            connections: Some(memory.clone()),
            dedup: Some(memory.clone()),
            events: Some(memory),
            in_process: true,
            #[cfg(feature = "redis")]
            redis: None,
        }
    }
}

#[cfg(feature = "redis")]
impl From<crate::RedisStore> for Backend {
    fn from(redis: crate::RedisStore) -> Self {
        Self::from(Arc::new(redis))
    }
}

#[cfg(feature = "redis")]
impl From<Arc<crate::RedisStore>> for Backend {
    fn from(redis: Arc<crate::RedisStore>) -> Self {
        Self {
            windows: redis.clone(),
            leases: Some(redis.clone()),
            connections: Some(redis.clone()),
            dedup: Some(redis.clone()),
            events: Some(redis.clone()),
            in_process: false,
            redis: Some(redis),
        }
    }
}

/// Builds a [`Store`]; see [`Store::builder`].
#[must_use]
pub struct StoreBuilder {
    backend: Backend,
    clock: Arc<dyn Clock>,
    timeout: Option<Duration>,
    retry: RetryConfig,
    breaker: Option<BreakerConfig>,
    max_in_flight: Option<usize>,
}

impl StoreBuilder {
    /// The default time budget of one operation on a backend behind a
    /// network: 50 ms.
    pub const DEFAULT_TIMEOUT: Duration = DEFAULT_TIMEOUT;
    /// The default bound on calls in flight: 1024.
    pub const DEFAULT_MAX_IN_FLIGHT: usize = DEFAULT_MAX_IN_FLIGHT;

    /// The breakers' clock (cooldowns, rolling windows; default
    /// [`SystemClock`]). The backend keeps its own time.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The time budget of one operation, retries included: past it the
    /// operation fails with [`StoreErrorKind::Timeout`](crate::StoreErrorKind::Timeout).
    pub fn timeout(mut self, budget: Duration) -> Self {
        self.timeout = Some(budget);
        self
    }

    /// No time budget.
    pub fn without_timeout(mut self) -> Self {
        self.timeout = None;
        self
    }

    /// How failed calls are retried (only those the backend certainly did
    /// not apply).
    pub fn retry(mut self, retry: RetryConfig) -> Self {
        self.retry = retry;
        self
    }

    /// Circuit breakers with `config`, one per failure domain.
    pub fn breaker(mut self, config: BreakerConfig) -> Self {
        self.breaker = Some(config);
        self
    }

    /// No circuit breakers.
    pub fn without_breaker(mut self) -> Self {
        self.breaker = None;
        self
    }

    /// At most `n` calls in flight on this node; past it an operation fails
    /// at once with [`StoreErrorKind::Overloaded`](crate::StoreErrorKind::Overloaded).
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = Some(n);
        self
    }

    /// No bound on calls in flight.
    pub fn unbounded_in_flight(mut self) -> Self {
        self.max_in_flight = None;
        self
    }

    /// Builds the store.
    pub fn build(self) -> Store {
        let Backend {
            windows,
            leases,
            connections,
            dedup,
            events,
            in_process,
            #[cfg(feature = "redis")]
            redis,
        } = self.backend;
        let breakers = self
            .breaker
            .map(|config| Breakers::new(config, self.clock.clone()));
        Store {
            inner: Arc::new(Inner {
                windows,
                leases,
                connections,
                dedup,
                events,
                in_process,
                resilience: Resilience {
                    timeout: self.timeout,
                    retry: self.retry,
                    in_flight: self.max_in_flight.map(Semaphore::new),
                    breakers,
                    clock: self.clock,
                },
                #[cfg(feature = "redis")]
                redis,
            }),
        }
    }
}

impl fmt::Debug for StoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreBuilder")
            .field("backend", &self.backend)
            .field("timeout", &self.timeout)
            .field("retry", &self.retry)
            .field("breaker", &self.breaker)
            .field("max_in_flight", &self.max_in_flight)
            .finish_non_exhaustive()
    }
}
