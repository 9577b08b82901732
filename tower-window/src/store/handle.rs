//! [`Store`]: the store handle every capability is made from.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use super::guard::breaker::{BreakerConfig, BreakerState, Breakers};
use super::guard::retry::RetryConfig;
use super::guard::{Guard, Resilience};
use super::parts::Parts;
use super::{Op, StoreError};
use crate::metrics::Calls;
use crate::{Clock, MemoryStore, SystemClock};

/// A store: one backend ([`MemoryStore`], [`RedisStore`](crate::RedisStore)
/// or your own) and the resilience stack every operation on it goes
/// through: a time budget, retries only where the backend certainly did not
/// apply the operation, a bound on calls in flight, and circuit breakers
/// per failure domain (a Redis Cluster primary) that also trip on slow
/// calls.
///
/// Every capability ([`Limiter`](crate::Limiter),
/// [`ConnectionLimiter`](crate::ConnectionLimiter),
/// [`DedupWindow`](crate::DedupWindow),
/// [`EventWindow`](crate::events::EventWindow)) is made from a store and
/// shares its stack. Cheap to clone: clones are the same store.
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
    backend: Arc<Backend>,
    resilience: Arc<Resilience>,
}

impl Store {
    /// The store's one clock (its backend's): the breakers', and the local
    /// tier's, lease tier's and fallback's of every limiter on the store.
    pub(crate) fn clock(&self) -> &Arc<dyn Clock> {
        &self.resilience.clock
    }

    /// A store on the embedded [`MemoryStore`] with default settings.
    pub fn memory() -> Self {
        Self::from(MemoryStore::new())
    }

    /// A builder for a store on `backend`.
    ///
    /// Defaults: for a backend behind a network,
    /// [`StoreBuilder::DEFAULT_TIMEOUT`], [`RetryConfig::default`],
    /// [`BreakerConfig::default`] and [`StoreBuilder::DEFAULT_MAX_IN_FLIGHT`];
    /// for an in-process backend none of them. The budget and retries need
    /// a tokio runtime with time enabled.
    pub fn builder(backend: impl Into<Backend>) -> StoreBuilder {
        let backend = backend.into();
        let networked = !backend.in_process;
        StoreBuilder {
            backend,
            timeout: networked.then_some(StoreBuilder::DEFAULT_TIMEOUT),
            retry: if networked {
                RetryConfig::default()
            } else {
                RetryConfig::none()
            },
            breaker: networked.then(BreakerConfig::default),
            max_in_flight: networked.then_some(StoreBuilder::DEFAULT_MAX_IN_FLIGHT),
        }
    }

    /// A store on `backend` with no budget, retries, in-flight bound or
    /// breaker: every operation is one call, its error returned as it is.
    pub fn bare(backend: impl Into<Backend>) -> Self {
        Self::from(backend).without_resilience()
    }

    /// The worst state of the store's breakers, if it has them.
    pub fn breaker_state(&self) -> Option<BreakerState> {
        self.breakers().map(Breakers::worst)
    }

    fn breakers(&self) -> Option<&Breakers> {
        self.resilience.breakers.as_ref()
    }

    /// How many breakers are open (0 without breakers).
    pub fn open_breakers(&self) -> usize {
        self.breakers().map_or(0, Breakers::open)
    }

    /// The state of failure domain `domain`'s breaker, if the store has
    /// breakers.
    pub(crate) fn breaker_state_of(&self, domain: Option<u16>) -> Option<BreakerState> {
        Some(self.breakers()?.state_of(domain))
    }

    /// Exports the breakers' state in a capability's `metrics`.
    pub(crate) fn observe_breakers(&self, metrics: &Arc<crate::metrics::LimiterMetrics>) {
        if let Some(breakers) = self.breakers() {
            breakers.observe(metrics);
        }
    }

    /// The same backend as a [`bare`](Self::bare) store: for a probe that
    /// must see what the backend answers rather than an open breaker.
    pub fn without_resilience(&self) -> Self {
        Store {
            backend: Arc::clone(&self.backend),
            resilience: Arc::new(Resilience::bare(Arc::clone(&self.resilience.clock))),
        }
    }

    /// The time budget of one operation, if any.
    pub fn timeout(&self) -> Option<Duration> {
        self.resilience.timeout
    }

    /// Whether the backend answers every operation in-process.
    pub fn is_in_process(&self) -> bool {
        self.backend.in_process
    }

    /// The backend of the capability whose backend trait is `B`: the one
    /// given to [`Backend`], else the one `plug` makes of the native store,
    /// once per store.
    pub(crate) fn backend<B: ?Sized + Send + Sync + 'static>(
        &self,
        plug: impl FnOnce(&Native) -> Option<Arc<B>>,
    ) -> Option<Arc<B>> {
        let parts = &self.backend.parts;
        if let Some(backend) = parts.get::<Arc<B>>() {
            return Some(backend);
        }
        let plugged = plug(&self.backend.native)?;
        Some(parts.get_or_insert_with(|| plugged))
    }

    /// One operation of a capability on its backend, through the
    /// resilience stack: the one way a capability reaches a backend.
    ///
    /// A missing `backend` is
    /// [`Unsupported`](crate::StoreErrorKind::Unsupported) `what`; `domain`
    /// is asked only when the store keeps breakers. The result borrows only
    /// what the operation's does (`'o`).
    pub(crate) fn call<'a, 'o, B: ?Sized, T: Send + 'o>(
        &'a self,
        backend: Option<&'a B>,
        what: &'static str,
        domain: impl FnOnce(&'a B) -> Option<u16>,
        calls: Calls<'a>,
        operation: impl FnOnce(&'a B, &mut Guard<'a>) -> Op<'o, T>,
    ) -> Op<'o, T> {
        let Some(backend) = backend else {
            return Op::ready(Err(StoreError::unsupported(what)));
        };
        let (domain, ticket) = match &self.resilience.breakers {
            None => (None, None),
            Some(breakers) => {
                let domain = domain(backend);
                match breakers.get(domain).acquire() {
                    None => return Op::ready(Err(StoreError::circuit_open())),
                    ticket => (domain, ticket),
                }
            }
        };
        let mut guard = Guard::new(&self.resilience, domain, ticket, calls);
        let op = operation(backend, &mut guard);
        guard.settle(op)
    }
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("backend", &self.backend)
            .field("timeout", &self.resilience.timeout)
            .field("retry", &self.resilience.retry)
            .field("breaker", &self.breaker_state())
            .finish_non_exhaustive()
    }
}

/// A store on a backend with the defaults of [`Store::builder`].
impl<B: Into<Backend>> From<B> for Store {
    fn from(backend: B) -> Self {
        Store::builder(backend).build()
    }
}

/// A store's backend: [`MemoryStore`] or [`RedisStore`](crate::RedisStore)
/// (every capability), or your own implementations of the capabilities'
/// backend traits, starting from [`windows`](Self::windows) and adding
/// [`with_leases`](Self::with_leases), [`with_connections`](Self::with_connections),
/// [`with_dedup`](Self::with_dedup) or [`with_events`](Self::with_events);
/// a capability it lacks answers
/// [`Unsupported`](crate::StoreErrorKind::Unsupported).
pub struct Backend {
    native: Native,
    /// Capabilities' backends: given here, or plugged on first use.
    parts: Parts,
    in_process: bool,
    clock: Arc<dyn Clock>,
}

/// The backend of the capability whose backend trait is `$backend` on
/// `$store` (see [`Store::backend`]).
macro_rules! plugged {
    ($store:expr, $backend:ty) => {
        $store.backend::<$backend>(|native| match native {
            $crate::store::Native::Memory(memory) => {
                Some(::std::sync::Arc::new(memory.clone()) as ::std::sync::Arc<$backend>)
            }
            #[cfg(feature = "redis")]
            $crate::store::Native::Redis(redis) => {
                Some(::std::sync::Arc::clone(redis) as ::std::sync::Arc<$backend>)
            }
            $crate::store::Native::Own => None,
        })
    };
}
pub(crate) use plugged;

/// The store behind a [`Backend`]; each capability's folder implements
/// its backend trait for both.
#[derive(Debug)]
pub(crate) enum Native {
    Memory(MemoryStore),
    #[cfg(feature = "redis")]
    Redis(Arc<crate::RedisStore>),
    /// Only the backends given to the [`Backend`].
    Own,
}

impl Backend {
    fn native(native: Native, in_process: bool, clock: Arc<dyn Clock>) -> Self {
        Self {
            native,
            parts: Parts::default(),
            in_process,
            clock,
        }
    }

    /// A backend of only what `with_part` gives it, behind a network.
    pub(crate) fn own() -> Self {
        Self::native(Native::Own, false, Arc::new(SystemClock))
    }

    pub(crate) fn with_part<B: ?Sized + Send + Sync + 'static>(mut self, backend: Arc<B>) -> Self {
        self.parts.insert(backend);
        self
    }

    /// Whether every operation is answered in-process (then
    /// [`Store::builder`]'s defaults bound nothing).
    pub fn in_process(mut self, in_process: bool) -> Self {
        self.in_process = in_process;
        self
    }

    /// The store's clock, for a backend of your own (default
    /// [`SystemClock`]): what its breakers, and the local tier, lease tier
    /// and fallback of every limiter on it, read. [`MemoryStore`] and
    /// [`RedisStore`](crate::RedisStore) bring their own.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }
}

impl fmt::Debug for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The clock is a `dyn Clock`, which has no `Debug`.
        f.debug_struct("Backend")
            .field("native", &self.native)
            .field("parts", &self.parts)
            .field("in_process", &self.in_process)
            .finish_non_exhaustive()
    }
}

impl From<MemoryStore> for Backend {
    fn from(memory: MemoryStore) -> Self {
        let clock = Arc::clone(&memory.clock);
        Self::native(Native::Memory(memory), true, clock)
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
        let clock = redis.clock.clone().unwrap_or_else(|| Arc::new(SystemClock));
        Self::native(Native::Redis(redis), false, clock)
    }
}

/// Builds a [`Store`]; see [`Store::builder`].
#[derive(Debug)]
#[must_use]
pub struct StoreBuilder {
    backend: Backend,
    timeout: Option<Duration>,
    retry: RetryConfig,
    breaker: Option<BreakerConfig>,
    max_in_flight: Option<usize>,
}

impl StoreBuilder {
    /// The default time budget of one operation on a networked backend:
    /// 50 ms.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);
    /// The default bound on calls in flight: 1024.
    pub const DEFAULT_MAX_IN_FLIGHT: usize = 1024;

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

    /// How failed calls are retried.
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

    /// At most `n` calls in flight; past it an operation fails at once
    /// with [`Overloaded`](crate::StoreErrorKind::Overloaded).
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
        let breakers = self
            .breaker
            .map(|config| Breakers::new(config, Arc::clone(&self.backend.clock)));
        let clock = Arc::clone(&self.backend.clock);
        Store {
            backend: Arc::new(self.backend),
            resilience: Arc::new(Resilience {
                timeout: self.timeout,
                retry: self.retry,
                in_flight: self.max_in_flight.map(Semaphore::new),
                breakers,
                clock,
            }),
        }
    }
}
