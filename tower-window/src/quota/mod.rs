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

mod policy;
mod scope;
#[cfg(feature = "serde")]
mod serde;

pub use policy::{Policy, PolicyBuilder, PolicyError, MAX_QUOTAS};
pub use scope::Scope;

use std::fmt;
use std::num::NonZeroU32;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use crate::Algorithm;

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
    pub fn scoped(mut self, scope: Scope) -> Self {
        Arc::make_mut(&mut self.0).scope = scope;
        let name = self.name().to_owned();
        self.set_ids(&name);
        self
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
    pub fn shadowed(mut self, shadow: bool) -> Self {
        Arc::make_mut(&mut self.0).shadow = shadow;
        let name = self.name().to_owned();
        self.set_ids(&name);
        self
    }

    /// Whether this is a shadow quota (see [`shadowed`](Self::shadowed)).
    pub fn is_shadow(&self) -> bool {
        self.0.shadow
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
    pub fn with_generation(mut self, generation: u64) -> Self {
        Arc::make_mut(&mut self.0).generation = generation;
        let name = self.name().to_owned();
        self.set_ids(&name);
        self
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
    pub fn with_instance(mut self, instance: &str) -> Self {
        Arc::make_mut(&mut self.0).instance = Some(Arc::from(instance));
        let name = self.name().to_owned();
        self.set_ids(&name);
        self
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

    /// A stable identifier of this quota's definition and name
    /// (`"<name>|<definition>"`), used to keep the state of different quotas
    /// apart in a store.
    pub fn id(&self) -> &str {
        &self.0.id
    }

    /// The same identifier as a cheaply cloned shared string.
    pub fn shared_id(&self) -> Arc<str> {
        Arc::clone(&self.0.id)
    }

    /// The identity of this quota's state in a store:
    /// `"<name>|<window>|<shape>"` (plus `|tenant` when tenant-scoped),
    /// where the shape is the algorithm with its granularity. The limit and
    /// the GCRA burst are not part of it, so a rolling change from `100/1m`
    /// to `200/1m` keeps every window (and `remaining` counts on from what
    /// was used); changing the name, window, algorithm, granularity or
    /// scope starts fresh windows.
    ///
    /// ```
    /// use tower_window::Quota;
    ///
    /// let old: Quota = "100/1m".parse()?;
    /// let new: Quota = "200/1m".parse()?;
    /// assert_eq!(old.state_id(), new.state_id());
    /// assert_ne!(old.state_id(), "100/1m fixed-window".parse::<Quota>()?.state_id());
    /// # Ok::<(), tower_window::QuotaError>(())
    /// ```
    pub fn state_id(&self) -> &str {
        &self.0.state_id
    }

    /// The same identifier as a cheaply cloned shared string.
    /// [`state_id`](Self::state_id)'s hash, computed once.
    pub(crate) fn state_id_hash(&self) -> u64 {
        self.0.state_id_hash
    }

    pub(crate) fn shared_state_id(&self) -> Arc<str> {
        Arc::clone(&self.0.state_id)
    }

    fn set_ids(&mut self, name: &str) {
        let scope = match self.0.scope {
            Scope::Subject => "",
            Scope::Tenant => "|tenant",
        };
        let shape = match self.0.algorithm {
            // The burst is GCRA's other limit: it may change like the limit.
            Algorithm::Gcra => "gcra".to_owned(),
            other => other.to_string(),
        };
        // The generation is part of both ids (a reset tenant's windows are
        // new keys everywhere); the shadow flag only of the id (switching a
        // quota from shadow to enforced keeps its windows).
        let generation = match self.0.generation {
            0 => String::new(),
            g => format!("|g{g}"),
        };
        let shadow = if self.0.shadow { "|shadow" } else { "" };
        // The instance goes last in the id, so nothing after it needs
        // telling apart from it, and in the name's place in the state id,
        // so the window is the instance's whatever the name (`i:` cannot
        // start a name, which holds no `:`). Escaped, it holds no `|`
        // (ids) or `,` (policy ids) of its own.
        let instance = self.0.instance.as_deref().map(|instance| {
            let mut text = String::with_capacity(instance.len() + 2);
            text.push_str("i:");
            for byte in instance.bytes() {
                if matches!(byte, b'%' | b'|' | b',' | b':') || !(b' '..0x7f).contains(&byte) {
                    text.push('%');
                    text.push(char::from(HEX_DIGITS[usize::from(byte >> 4)]));
                    text.push(char::from(HEX_DIGITS[usize::from(byte & 15)]));
                } else {
                    text.push(char::from(byte));
                }
            }
            text
        });
        let id = Arc::from(match &instance {
            Some(instance) => format!("{name}|{self}{scope}{generation}{shadow}|{instance}"),
            None => format!("{name}|{self}{scope}{generation}{shadow}"),
        });
        let state_id = Arc::from(format!(
            "{}|{}|{shape}{scope}{generation}",
            instance.as_deref().unwrap_or(name),
            FormatDuration(self.window())
        ));
        let data = Arc::make_mut(&mut self.0);
        data.name_len = name.len();
        data.state_id_hash = crate::key::state_key::id_hash(&state_id);
        data.id = id;
        data.state_id = state_id;
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

impl fmt::Display for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.0.limit, FormatDuration(self.window()))?;
        match (self.0.algorithm, self.0.burst) {
            (Algorithm::SlidingLog, _) => Ok(()),
            (Algorithm::Gcra, Some(burst)) => write!(f, " gcra(burst={burst})"),
            (algorithm, _) => write!(f, " {algorithm}"),
        }
    }
}

/// Writes a duration in the DSL's largest exact unit (`1m`, `90s`, `500ms`).
pub(crate) struct FormatDuration(pub(crate) Duration);

impl fmt::Display for FormatDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let micros = duration_micros(self.0);
        for (unit, size) in UNITS.iter().rev() {
            if micros.is_multiple_of(*size) {
                return write!(f, "{}{unit}", micros / size);
            }
        }
        write!(f, "{micros}us")
    }
}

/// Upper-case hex digits for [`Quota::with_instance`]'s escapes.
const HEX_DIGITS: &[u8; 16] = b"0123456789ABCDEF";

/// DSL units and their size in microseconds, smallest first.
const UNITS: [(&str, u64); 5] = [
    ("ms", 1_000),
    ("s", 1_000_000),
    ("m", 60_000_000),
    ("h", 3_600_000_000),
    ("d", 86_400_000_000),
];

fn duration_micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Why a quota is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QuotaError {
    /// The text is not of the form `<limit>/<window>[ <algorithm>]`.
    #[error("invalid quota {input:?}: {reason}")]
    Syntax {
        /// The text that was parsed.
        input: String,
        /// What was expected.
        reason: String,
    },
    /// The limit is not a whole number that fits in 32 bits.
    #[error("invalid quota limit {0:?}: expected a whole number from 1 to 4294967295")]
    InvalidLimit(String),
    /// The limit is zero.
    #[error("quota limit must be at least 1")]
    ZeroLimit,
    /// No limit was given to the builder.
    #[error("quota limit is missing")]
    MissingLimit,
    /// No window was given to the builder.
    #[error("quota window is missing")]
    MissingWindow,
    /// The window is zero.
    #[error("quota window must be longer than zero")]
    ZeroWindow,
    /// The window (or granularity) is not a whole number of milliseconds.
    #[error("quota durations must be whole milliseconds, got {0:?}")]
    Precision(Duration),
    /// A duration's unit is not one of `ms`, `s`, `m`, `h`, `d`.
    #[error("unknown duration unit {0:?}: expected ms, s, m, h or d")]
    UnknownUnit(String),
    /// The window is longer than [`MAX_WINDOW`] or its number overflows.
    #[error("quota window is too long: the most is 366d")]
    WindowTooLong,
    /// The algorithm name is not known.
    #[error("unknown algorithm {0:?}: expected sliding-log, sliding-counter(<granularity>), fixed-window or gcra[(burst=<n>)]")]
    UnknownAlgorithm(String),
    /// The sliding counter's granularity is zero.
    #[error("sliding-counter granularity must be longer than zero")]
    ZeroGranularity,
    /// The sliding counter's granularity does not divide the window.
    #[error("sliding-counter granularity {granularity:?} does not divide the window {window:?}")]
    GranularityDoesNotDivide {
        /// The bucket width.
        granularity: Duration,
        /// The window.
        window: Duration,
    },
    /// The sliding counter would keep more than [`MAX_BUCKETS`] buckets.
    #[error("sliding-counter would keep {buckets} buckets per key; the most is {max}")]
    TooManyBuckets {
        /// window / granularity.
        buckets: u64,
        /// The allowed maximum.
        max: u64,
    },
    /// A burst was given for an algorithm other than GCRA.
    #[error("a burst is only meaningful for the gcra algorithm, not {0}")]
    BurstWithoutGcra(&'static str),
    /// The burst is zero or not a number.
    #[error("gcra burst must be a whole number from 1 to 4294967295, got {0:?}")]
    InvalidBurst(String),
    /// GCRA's burst times its emission interval is longer than [`MAX_WINDOW`].
    #[error("gcra burst is too large: burst x (window / limit) must not exceed 366d")]
    BurstTooLarge,
    /// A scope other than `subject` or `tenant`.
    #[error("unknown quota scope {0:?}: expected subject or tenant")]
    UnknownScope(String),
    /// The quota name is empty, too long or has characters outside `[A-Za-z0-9_.-]`.
    #[error("invalid quota name {0:?}: use 1 to 64 characters of A-Z, a-z, 0-9, '_', '.', '-'")]
    InvalidName(String),
}

/// Builds a [`Quota`], checking every value.
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct QuotaBuilder {
    name: Option<String>,
    limit: Option<u32>,
    window: Option<Duration>,
    algorithm: Algorithm,
    granularity: Option<Duration>,
    burst: Option<u32>,
    scope: Scope,
}

impl QuotaBuilder {
    /// Per subject (default) or per tenant; see [`Quota::scoped`].
    pub fn scope(mut self, scope: Scope) -> Self {
        self.scope = scope;
        self
    }

    /// Units admitted per window (at least 1).
    pub fn limit(mut self, limit: u32) -> Self {
        self.limit = Some(limit);
        self
    }

    /// The window length (whole milliseconds, at most [`MAX_WINDOW`]).
    pub fn window(mut self, window: Duration) -> Self {
        self.window = Some(window);
        self
    }

    /// The counting algorithm (default [`Algorithm::SlidingLog`]).
    pub fn algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = algorithm;
        self
    }

    /// Use [`Algorithm::SlidingCounter`] with this bucket width.
    pub fn granularity(mut self, granularity: Duration) -> Self {
        self.granularity = Some(granularity);
        self.algorithm = Algorithm::SlidingCounter { granularity };
        self
    }

    /// The GCRA burst (default: the limit). Only valid with [`Algorithm::Gcra`].
    pub fn burst(mut self, burst: u32) -> Self {
        self.burst = Some(burst);
        self
    }

    /// The quota's name (default `"default"`).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Checks every value and builds the quota.
    pub fn build(self) -> Result<Quota, QuotaError> {
        let limit = self.limit.ok_or(QuotaError::MissingLimit)?;
        let limit = NonZeroU32::new(limit).ok_or(QuotaError::ZeroLimit)?;
        let window = self.window.ok_or(QuotaError::MissingWindow)?;
        let window_micros = checked_millis_as_micros(window, QuotaError::ZeroWindow)?;
        if window > MAX_WINDOW {
            return Err(QuotaError::WindowTooLong);
        }
        let algorithm = match self.algorithm {
            Algorithm::SlidingCounter { granularity } => {
                let granularity = self.granularity.unwrap_or(granularity);
                let g = checked_millis_as_micros(granularity, QuotaError::ZeroGranularity)?;
                if !window_micros.is_multiple_of(g) {
                    return Err(QuotaError::GranularityDoesNotDivide {
                        granularity,
                        window,
                    });
                }
                let buckets = window_micros / g;
                if buckets > MAX_BUCKETS {
                    return Err(QuotaError::TooManyBuckets {
                        buckets,
                        max: MAX_BUCKETS,
                    });
                }
                Algorithm::SlidingCounter { granularity }
            }
            other => other,
        };
        let burst = match self.burst {
            None => None,
            Some(_) if algorithm != Algorithm::Gcra => {
                return Err(QuotaError::BurstWithoutGcra(algorithm.name()))
            }
            Some(b) => Some(NonZeroU32::new(b).ok_or(QuotaError::InvalidBurst(b.to_string()))?),
        };
        if algorithm == Algorithm::Gcra {
            // burst × emission interval is how far ahead GCRA's theoretical
            // arrival time may run; bounding it by the longest window keeps
            // every sum far below 2^53 µs, exact in u64 and in Lua's doubles.
            let capacity = u64::from(burst.unwrap_or(limit).get());
            let span = capacity.saturating_mul(window_micros.div_ceil(u64::from(limit.get())));
            if span > duration_micros(MAX_WINDOW) {
                return Err(QuotaError::BurstTooLarge);
            }
        }
        let name = self.name.as_deref().unwrap_or(DEFAULT_NAME);
        validate_name(name)?;
        let mut quota = Quota(Arc::new(QuotaData {
            id: Arc::from(""),
            name_len: 0,
            state_id_hash: 0,
            state_id: Arc::from(""),
            limit,
            window_micros,
            algorithm,
            burst,
            scope: self.scope,
            shadow: false,
            generation: 0,
            instance: None,
        }));
        quota.set_ids(name);
        Ok(quota)
    }
}

/// A sensible sliding-counter granularity for `window`: the smallest bucket
/// that divides the window into at most 60 whole-millisecond buckets.
pub fn default_granularity(window: Duration) -> Duration {
    let millis = u64::try_from(window.as_millis()).unwrap_or(u64::MAX).max(1);
    let buckets = (1..=60u64)
        .rev()
        .find(|n| millis.is_multiple_of(*n))
        .unwrap_or(1);
    Duration::from_millis(millis / buckets)
}

fn checked_millis_as_micros(d: Duration, zero: QuotaError) -> Result<u64, QuotaError> {
    if d.is_zero() {
        return Err(zero);
    }
    if d > MAX_WINDOW {
        return Err(QuotaError::WindowTooLong);
    }
    if !d.subsec_nanos().is_multiple_of(1_000_000) {
        return Err(QuotaError::Precision(d));
    }
    Ok(duration_micros(d))
}

fn validate_name(name: &str) -> Result<(), QuotaError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(QuotaError::InvalidName(name.chars().take(80).collect()))
    }
}

/// Parses a duration as the DSL writes it: `<n><unit>`, or `<unit>`
/// meaning 1, with the units `ms`, `s`, `m`, `h` and `d`.
///
/// The quota DSL's own parser, public so that programs reading durations
/// elsewhere (flags, config files) accept exactly what a quota does. It
/// checks only the form: no surrounding whitespace, a whole number, a known
/// unit, and a result that fits in `u64` microseconds; bounds (zero, a
/// maximum) are the caller's.
///
/// ```
/// use std::time::Duration;
/// use tower_window::quota::{parse_duration, QuotaError};
///
/// assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
/// assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
/// assert_eq!(parse_duration("m"), Ok(Duration::from_secs(60)));
/// assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
/// assert!(matches!(parse_duration("15"), Err(QuotaError::UnknownUnit(_))));
/// assert!(matches!(parse_duration("1.5s"), Err(QuotaError::UnknownUnit(_))));
/// ```
pub fn parse_duration(text: &str) -> Result<Duration, QuotaError> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let size = UNITS
        .iter()
        .find(|(name, _)| *name == unit)
        .map(|(_, size)| *size)
        .ok_or_else(|| QuotaError::UnknownUnit(unit.chars().take(16).collect()))?;
    let count: u64 = if number.is_empty() {
        1
    } else {
        number.parse().map_err(|_| QuotaError::WindowTooLong)?
    };
    let micros = count.checked_mul(size).ok_or(QuotaError::WindowTooLong)?;
    Ok(Duration::from_micros(micros))
}

fn syntax(input: &str, reason: &str) -> QuotaError {
    QuotaError::Syntax {
        input: input.chars().take(80).collect(),
        reason: reason.to_owned(),
    }
}

impl FromStr for Quota {
    type Err = QuotaError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let text = input.trim();
        if text.is_empty() {
            return Err(syntax(
                input,
                "empty; expected <limit>/<window>, e.g. 100/1m",
            ));
        }
        let (rate, algorithm) = match text.split_once(char::is_whitespace) {
            Some((rate, rest)) => (rate, Some(rest.trim())),
            None => (text, None),
        };
        let (limit, window) = rate
            .split_once('/')
            .ok_or_else(|| syntax(input, "expected <limit>/<window>, e.g. 100/1m"))?;
        if limit.is_empty() || !limit.bytes().all(|b| b.is_ascii_digit()) {
            return Err(QuotaError::InvalidLimit(limit.chars().take(32).collect()));
        }
        let limit: u32 = limit
            .parse()
            .map_err(|_| QuotaError::InvalidLimit(limit.chars().take(32).collect()))?;
        let mut builder = Quota::builder()
            .limit(limit)
            .window(parse_duration(window)?);
        if let Some(algorithm) = algorithm {
            builder = apply_algorithm(builder, algorithm)?;
        }
        builder.build()
    }
}

/// Parses the DSL's algorithm part onto a builder.
fn apply_algorithm(builder: QuotaBuilder, text: &str) -> Result<QuotaBuilder, QuotaError> {
    let (name, argument) = match text.split_once('(') {
        Some((name, rest)) => {
            let argument = rest
                .strip_suffix(')')
                .ok_or_else(|| syntax(text, "missing ')' after the algorithm's argument"))?;
            (name, Some(argument.trim()))
        }
        None => (text, None),
    };
    match (name, argument) {
        ("sliding-log", None) => Ok(builder.algorithm(Algorithm::SlidingLog)),
        ("fixed-window", None) => Ok(builder.algorithm(Algorithm::FixedWindow)),
        ("gcra", None) => Ok(builder.algorithm(Algorithm::Gcra)),
        ("gcra", Some(argument)) => {
            let burst = argument
                .strip_prefix("burst=")
                .ok_or_else(|| syntax(text, "expected gcra(burst=<n>)"))?;
            let value: u32 = burst
                .parse()
                .map_err(|_| QuotaError::InvalidBurst(burst.chars().take(32).collect()))?;
            Ok(builder.algorithm(Algorithm::Gcra).burst(value))
        }
        ("sliding-counter", Some(argument)) => Ok(builder.granularity(parse_duration(argument)?)),
        ("sliding-counter", None) => {
            let window = builder.window.unwrap_or(Duration::ZERO);
            Ok(builder.granularity(default_granularity(window)))
        }
        _ => Err(QuotaError::UnknownAlgorithm(
            text.chars().take(64).collect(),
        )),
    }
}
