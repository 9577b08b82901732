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
//! Units are `ms`, `s`, `m`, `h` and `d`. [`Quota`]'s `Display` writes the same
//! DSL, so `q.to_string().parse::<Quota>() == Ok(q)` for every quota (the name
//! and the [`Scope`] are carried separately, see [`Quota::name`] and
//! [`Quota::scoped`]).
//!
//! Several named quotas decided together form a [`Policy`].

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
/// Cheap to clone. Build one by parsing the DSL (see the [module
/// docs](crate::quota)) or with [`Quota::builder`]; every invalid value is a
/// [`QuotaError`].
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

/// A quota's values, behind one reference count: a decision names its
/// quota on every check, and cloning one pointer is what keeps that cheap.
#[derive(Clone, PartialEq, Eq, Hash)]
struct QuotaData {
    /// `"<name>|<definition>"` (plus `|tenant` for a tenant-scoped quota),
    /// computed once. The name is read from it (names hold no `|`).
    id: Arc<str>,
    /// The name's length: `id[..name_len]` is the name.
    name_len: usize,
    /// `state_id`'s hash (see `crate::key::state_key::id_hash`).
    state_id_hash: u64,
    /// `"<name>|<window>|<shape>[|tenant]"`: what a store keys the state by.
    /// It leaves out the limit (and the GCRA burst), so changing only the
    /// limit keeps every window; see [`Quota::state_id`].
    state_id: Arc<str>,
    limit: NonZeroU32,
    window_micros: u64,
    algorithm: Algorithm,
    burst: Option<NonZeroU32>,
    scope: Scope,
    /// Checked and counted, never denies (see [`Quota::shadowed`]).
    shadow: bool,
    /// The tenant's state generation (see [`Quota::with_generation`]).
    generation: u64,
    /// Which of the quota's separate windows this is (see
    /// [`Quota::with_instance`]); `None` for the quota's one window.
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

    /// The same quota under another name (used in `RateLimit-Policy` headers
    /// and store keys). Names are 1 to 64 characters of `[A-Za-z0-9_.-]`.
    pub fn named(mut self, name: &str) -> Result<Self, QuotaError> {
        validate_name(name)?;
        self.set_ids(name);
        Ok(self)
    }

    /// The same quota counted per `scope`: per subject (the default, one
    /// window per tenant and subject) or per tenant (one window shared by
    /// every subject of the tenant).
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

    /// Whose window this quota counts: per subject or per tenant.
    pub fn scope(&self) -> Scope {
        self.0.scope
    }

    /// The same quota as a *shadow* quota (or enforced again with `false`):
    /// checked and counted like any other, reported in `RateLimit-Policy`
    /// (with a `shadow` parameter) and in the metrics, but it never denies.
    /// For trying a new limit safely.
    ///
    /// Precisely: a policy admits a request when every enforced quota
    /// admits it. A shadow quota that the cost fits records it like an
    /// enforced one (when the request is admitted); a shadow quota that the
    /// cost does not fit records nothing (its window keeps counting what
    /// it would itself have admitted) and reports the would-be denial in
    /// [`QuotaDecision::allowed`](crate::QuotaDecision::allowed) = `false`
    /// and [`QuotaDecision::is_shadow_denial`](crate::QuotaDecision::is_shadow_denial),
    /// counted in `tower_window_shadow_denials_total`. The flag is not
    /// part of the [state id](Self::state_id): turning a shadow quota into
    /// an enforced one keeps its windows.
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

    /// The same quota with `change` made to its values, and its ids
    /// recomputed (under the same name).
    fn changed(mut self, change: impl FnOnce(&mut QuotaData)) -> Self {
        change(Arc::make_mut(&mut self.0));
        let name = self.name().to_owned();
        self.set_ids(&name);
        self
    }

    /// Whether `other` is a clone of this very quota (one allocation): a
    /// cheap first test before comparing ids (the metrics' own-quota test).
    pub(crate) fn same_allocation(&self, other: &Quota) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// The same quota in state generation `generation` (default 0): the
    /// generation is part of the [state id](Self::state_id), so windows of
    /// one generation are never read by another. A
    /// [`TenantRegistry`](crate::tenant::TenantRegistry) bumps a tenant's
    /// generation to reset it: on every node and every Redis Cluster
    /// primary at once, without deleting a key (the old windows expire by
    /// their TTLs).
    #[must_use]
    pub fn with_generation(self, generation: u64) -> Self {
        self.changed(|data| data.generation = generation)
    }

    /// The state generation (see [`with_generation`](Self::with_generation)).
    pub fn generation(&self) -> u64 {
        self.0.generation
    }

    /// The same quota counting a window of its own for `instance`: one
    /// quota definition, many independent windows under one
    /// [`WindowKey`](crate::WindowKey), told apart by arbitrary text (an
    /// Envoy rate limit descriptor's entries, say), so that several of
    /// them can be decided together in one [`Policy`] — one store call,
    /// all or nothing.
    ///
    /// The instance takes the name's place in the [state id](Self::state_id)
    /// (`i:<instance>|<window>|<shape>...`) and is added to the
    /// [id](Self::id), percent-escaped (`%`, `|`, `,`, `:`, control bytes
    /// and non-ASCII bytes become `%XX`): distinct instances never share a
    /// window, no instance can pass for a name (names hold no `:`), and the
    /// name is free to differ from one policy to the next (a descriptor's
    /// position in a request, say) while the window stays the instance's.
    /// Stores escape state ids again (the Redis keys hash a long one and
    /// never let it pick a hash slot). The name stays what metrics and
    /// headers show. An empty instance is a window of its own, apart from
    /// the quota's plain one.
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

    /// The instance this quota's window is for (see
    /// [`with_instance`](Self::with_instance)); `None` for the quota's one
    /// plain window.
    pub fn instance(&self) -> Option<&str> {
        self.0.instance.as_deref()
    }

    /// The quota's name; `"default"` unless set.
    pub fn name(&self) -> &str {
        // The id starts with the name and `|`, an ASCII character boundary.
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

    /// The most units one key can be admitted at once: the burst for GCRA
    /// (default `limit`), otherwise the limit. A cost above it never fits.
    pub fn capacity(&self) -> u32 {
        match self.0.algorithm {
            Algorithm::Gcra => self.0.burst.unwrap_or(self.0.limit).get(),
            _ => self.0.limit.get(),
        }
    }

    /// The sliding counter's bucket width in microseconds, if that is the algorithm.
    pub fn granularity_micros(&self) -> Option<u64> {
        match self.0.algorithm {
            Algorithm::SlidingCounter { granularity } => Some(duration_micros(granularity)),
            _ => None,
        }
    }

    /// GCRA emission interval in microseconds: `ceil(window / limit)`.
    /// Rounding up means the rate is never faster than `limit / window`.
    pub fn emission_interval_micros(&self) -> u64 {
        self.0.window_micros.div_ceil(u64::from(self.0.limit.get()))
    }

    /// The longest a key's state can matter after its last write: past it,
    /// every algorithm treats the state as empty. Stores use it as an idle
    /// expiry. (`W` for the log and the fixed window, `W + G` for the
    /// sliding counter, `burst × emission interval` for GCRA.)
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
