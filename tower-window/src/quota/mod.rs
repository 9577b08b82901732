//! [`Quota`]: how much, over how long, counted how.
//!
//! A quota is written in a small DSL, `<limit>/<window>[ <algorithm>]`:
//!
//! | text | meaning |
//! |---|---|
//! | `100/1m` | 100 per minute, sliding log (exact) |
//! | `10/s` | 10 per second (a missing number means 1) |
//! | `250/500ms` | 250 per half second |
//! | `5000/1h sliding-counter(1m)` | 5000 per hour in one-minute buckets |
//! | `100/1m fixed-window` | 100 per aligned minute |
//! | `10/s gcra(burst=20)` | 10 per second, bursts of up to 20 |
//!
//! Units are `ms`, `s`, `m`, `h` and `d`. `Display` writes the same DSL (the
//! name and [`Scope`] are carried separately). Several named quotas decided
//! together form a [`Policy`].

mod builder;
mod error;
mod id;
mod parse;
mod policy;
mod scope;
#[cfg(feature = "serde")]
mod serde;

pub use builder::{default_granularity, QuotaBuilder};
pub use error::QuotaError;
pub use parse::parse_duration;
pub(crate) use parse::FormatDuration;
pub use policy::{Policy, PolicyBuilder, PolicyError, MAX_QUOTAS};
pub use scope::Scope;

use std::fmt;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::duration_micros;
use crate::Algorithm;
use id::validate_name;

/// The longest window a quota may have (one year).
pub const MAX_WINDOW: Duration = Duration::from_secs(366 * 24 * 3600);

/// The most buckets a sliding counter may keep per key.
pub const MAX_BUCKETS: u64 = 3600;

pub(crate) const DEFAULT_NAME: &str = "default";

/// A rate limit: `limit` units per `window`, counted by an [`Algorithm`].
///
/// Cheap to clone. Parse the [DSL](crate::quota) or use [`Quota::builder`].
///
/// ```
/// use std::time::Duration;
/// use tower_window::{Algorithm, Quota};
///
/// let parsed: Quota = "100/1m".parse()?;
/// let built = Quota::builder().limit(100).window(Duration::from_secs(60)).build()?;
/// assert_eq!(parsed, built);
/// assert_eq!(parsed.algorithm(), Algorithm::SlidingLog);
///
/// let gcra: Quota = "10/s gcra(burst=20)".parse()?;
/// assert_eq!(gcra.capacity(), 20);
/// assert!("0/1m".parse::<Quota>().is_err());
/// # Ok::<(), tower_window::QuotaError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Quota(Arc<QuotaData>);

/// A quota's values, behind one reference count: decisions clone it.
#[derive(Clone, PartialEq, Eq, Hash)]
struct QuotaData {
    /// See [`Quota::id`]; it starts with the name.
    id: Arc<str>,
    /// `id[..name_len]` is the name.
    name_len: usize,
    state_id_hash: u64,
    /// See [`Quota::state_id`].
    state_id: Arc<str>,
    limit: NonZeroU32,
    window_micros: u64,
    algorithm: Algorithm,
    burst: Option<NonZeroU32>,
    scope: Scope,
    shadow: bool,
    generation: u64,
    instance: Option<Arc<str>>,
}

impl Quota {
    /// A validating builder.
    pub fn builder() -> QuotaBuilder {
        QuotaBuilder::default()
    }

    /// `limit` per `window`, sliding log.
    pub fn per(limit: u32, window: Duration) -> Result<Self, QuotaError> {
        Self::builder().limit(limit).window(window).build()
    }

    /// `limit` per second, sliding log.
    pub fn per_second(limit: u32) -> Result<Self, QuotaError> {
        Self::per(limit, Duration::from_secs(1))
    }

    /// `limit` per minute, sliding log.
    pub fn per_minute(limit: u32) -> Result<Self, QuotaError> {
        Self::per(limit, Duration::from_secs(60))
    }

    /// `limit` per hour, sliding log.
    pub fn per_hour(limit: u32) -> Result<Self, QuotaError> {
        Self::per(limit, Duration::from_secs(3600))
    }

    /// The same quota under another name (shown in `RateLimit-Policy`
    /// headers, part of store keys): 1 to 64 characters of `[A-Za-z0-9_.-]`.
    pub fn named(mut self, name: &str) -> Result<Self, QuotaError> {
        validate_name(name)?;
        self.set_ids(name);
        Ok(self)
    }

    /// The same quota counted per `scope` (default [`Scope::Subject`]).
    ///
    /// ```
    /// use tower_window::quota::{Quota, Scope};
    ///
    /// let org = "5000/1m".parse::<Quota>()?.named("org")?.scoped(Scope::Tenant);
    /// assert_eq!(org.scope(), Scope::Tenant);
    /// # Ok::<(), tower_window::QuotaError>(())
    /// ```
    #[must_use]
    pub fn scoped(self, scope: Scope) -> Self {
        self.changed(|data| data.scope = scope)
    }

    /// Whose window this quota counts.
    pub fn scope(&self) -> Scope {
        self.0.scope
    }

    /// The same quota as a *shadow* quota (or enforced again with `false`):
    /// checked, counted and reported like any other, but it never denies. A
    /// cost it does not fit is not recorded in it, and is reported as a
    /// [shadow denial](crate::QuotaDecision::is_shadow_denial) (counted in
    /// `tower_window_shadow_denials_total`). Enforcing it keeps its windows.
    ///
    /// ```
    /// use tower_window::Quota;
    ///
    /// let trial = "5/1m".parse::<Quota>()?.shadowed(true);
    /// assert!(trial.is_shadow());
    /// assert_eq!(trial.state_id(), "5/1m".parse::<Quota>()?.state_id());
    /// # Ok::<(), tower_window::QuotaError>(())
    /// ```
    #[must_use]
    pub fn shadowed(self, shadow: bool) -> Self {
        self.changed(|data| data.shadow = shadow)
    }

    /// Whether this is a shadow quota (see [`shadowed`](Self::shadowed)).
    pub fn is_shadow(&self) -> bool {
        self.0.shadow
    }

    /// The same quota with `change` made to its values, ids recomputed.
    fn changed(mut self, change: impl FnOnce(&mut QuotaData)) -> Self {
        change(Arc::make_mut(&mut self.0));
        let name = self.name().to_owned();
        self.set_ids(&name);
        self
    }

    /// Whether `other` is a clone of this very quota: cheaper than `==`.
    pub(crate) fn same_allocation(&self, other: &Quota) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// The same quota in state generation `generation` (default 0), part of
    /// the [state id](Self::state_id): bumping it starts fresh windows
    /// everywhere without deleting a key (how a
    /// [`TenantRegistry`](crate::tenant::TenantRegistry) resets a tenant).
    #[must_use]
    pub fn with_generation(self, generation: u64) -> Self {
        self.changed(|data| data.generation = generation)
    }

    /// The state generation (see [`with_generation`](Self::with_generation)).
    pub fn generation(&self) -> u64 {
        self.0.generation
    }

    /// The same quota counting a window of its own for `instance`
    /// (arbitrary text: an Envoy descriptor's entries, say), so that one
    /// [`Policy`] can decide many windows of one definition together.
    ///
    /// The instance, escaped, replaces the name in the
    /// [state id](Self::state_id): distinct instances never share a window,
    /// whatever the names (which metrics and headers still show).
    ///
    /// ```
    /// use tower_window::{Policy, Quota};
    ///
    /// let per_path: Quota = "10/1m".parse::<Quota>()?.named("path")?;
    /// let a = per_path.clone().with_instance("/a");
    /// let b = per_path.clone().with_instance("/b");
    /// assert_ne!(a.state_id(), b.state_id());
    /// assert_eq!(a.instance(), Some("/a"));
    /// assert_eq!(a.name(), "path");
    /// // Escaping keeps every instance apart.
    /// assert_ne!(per_path.clone().with_instance("a|b").state_id(), per_path.clone().with_instance("a%7Cb").state_id());
    /// assert_ne!(per_path.clone().with_instance("").state_id(), per_path.state_id());
    /// // The window is the instance's, whatever the name.
    /// assert_eq!(a.clone().named("first")?.state_id(), a.state_id());
    /// // Two windows of one definition in one policy (names must differ).
    /// let both = Policy::new("request", [a, b.named("path2")?])?;
    /// assert_eq!(both.len(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn with_instance(self, instance: &str) -> Self {
        self.changed(|data| data.instance = Some(Arc::from(instance)))
    }

    /// The instance this quota's window is for, if any (see
    /// [`with_instance`](Self::with_instance)).
    pub fn instance(&self) -> Option<&str> {
        self.0.instance.as_deref()
    }

    /// The quota's name; `"default"` unless set.
    pub fn name(&self) -> &str {
        self.0.id.get(..self.0.name_len).unwrap_or(&self.0.id)
    }

    /// Units admitted per window.
    pub fn limit(&self) -> u32 {
        self.0.limit.get()
    }

    /// The window length.
    pub fn window(&self) -> Duration {
        Duration::from_micros(self.0.window_micros)
    }

    /// The window length in microseconds.
    pub fn window_micros(&self) -> u64 {
        self.0.window_micros
    }

    /// The counting algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.0.algorithm
    }

    /// The GCRA burst, if one was set.
    pub fn burst(&self) -> Option<u32> {
        self.0.burst.map(NonZeroU32::get)
    }

    /// The most units one key can be admitted at once: the GCRA burst, else
    /// the limit.
    pub fn capacity(&self) -> u32 {
        match self.0.algorithm {
            Algorithm::Gcra => self.0.burst.unwrap_or(self.0.limit).get(),
            _ => self.0.limit.get(),
        }
    }

    /// The sliding counter's bucket width in microseconds.
    pub fn granularity_micros(&self) -> Option<u64> {
        match self.0.algorithm {
            Algorithm::SlidingCounter { granularity } => Some(duration_micros(granularity)),
            _ => None,
        }
    }

    /// GCRA emission interval in microseconds, `ceil(window / limit)`: never
    /// faster than `limit / window`.
    pub fn emission_interval_micros(&self) -> u64 {
        self.0.window_micros.div_ceil(u64::from(self.0.limit.get()))
    }

    /// The longest a key's state can matter after its last write (past it,
    /// the state counts as empty): stores' idle expiry.
    pub fn max_state_lifetime(&self) -> Duration {
        let micros = match self.0.algorithm {
            Algorithm::SlidingLog | Algorithm::FixedWindow => self.0.window_micros,
            Algorithm::SlidingCounter { granularity } => self
                .0
                .window_micros
                .saturating_add(duration_micros(granularity)),
            Algorithm::Gcra => u64::from(self.capacity())
                .saturating_mul(self.emission_interval_micros())
                .max(self.0.window_micros),
        };
        Duration::from_micros(micros)
    }
}

impl fmt::Debug for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Quota({:?}: {})", self.name(), self)
    }
}
