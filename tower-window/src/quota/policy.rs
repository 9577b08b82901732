//! [`Policy`]: a named, ordered set of quotas decided together.

use std::fmt;
use std::sync::Arc;

use super::id::validate_name;
use super::{Quota, QuotaError, Scope};

/// The most quotas one policy may hold.
pub const MAX_QUOTAS: usize = 16;

/// A named, ordered set of one or more uniquely named [`Quota`]s, decided
/// together: a request is admitted only if every quota admits it, and a
/// denied request consumes nothing in any of them.
///
/// Cheap to clone. A [`Quota`] converts into a one-quota policy of its name.
///
/// ```
/// use tower_window::{Policy, Quota};
///
/// let policy = Policy::builder("api")
///     .quota("burst", "20/1s")?
///     .quota("sustained", "1000/1h sliding-counter(1m)")?
///     .build()?;
/// assert_eq!(policy.len(), 2);
/// assert_eq!(policy.quotas()[1].name(), "sustained");
///
/// let single: Policy = "100/1m".parse::<Quota>()?.into();
/// assert_eq!(single.name(), "default");
///
/// // Names are unique within a policy.
/// let twice = Policy::new("p", ["1/s".parse::<Quota>()?, "2/s".parse::<Quota>()?]);
/// assert!(twice.is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Policy {
    inner: Arc<Inner>,
}

struct Inner {
    name: Box<str>,
    quotas: Box<[Quota]>,
    /// `"<name>:<quota id>,<quota id>..."`.
    id: Arc<str>,
    id_hash: u64,
    tenant_scoped: bool,
    /// Read on every leased check (the lease TTL derives from it).
    shortest_window: std::time::Duration,
}

impl Policy {
    /// A policy of `quotas`, in order.
    pub fn new(name: &str, quotas: impl IntoIterator<Item = Quota>) -> Result<Self, PolicyError> {
        validate_name(name)
            .map_err(|_| PolicyError::InvalidName(name.chars().take(80).collect()))?;
        let quotas: Vec<Quota> = quotas.into_iter().collect();
        if quotas.is_empty() {
            return Err(PolicyError::Empty);
        }
        if quotas.len() > MAX_QUOTAS {
            return Err(PolicyError::TooManyQuotas(quotas.len()));
        }
        for (i, quota) in quotas.iter().enumerate() {
            if quotas[..i].iter().any(|q| q.name() == quota.name()) {
                return Err(PolicyError::DuplicateName(quota.name().to_owned()));
            }
        }
        Ok(Self::from_checked(name, quotas))
    }

    fn from_checked(name: &str, quotas: Vec<Quota>) -> Self {
        let ids: Vec<&str> = quotas.iter().map(Quota::id).collect();
        let id = format!("{name}:{}", ids.join(","));
        let tenant_scoped = quotas.iter().any(|q| q.scope() == Scope::Tenant);
        Self {
            inner: Arc::new(Inner {
                shortest_window: quotas.iter().map(Quota::window).min().unwrap_or_default(),
                name: name.into(),
                quotas: quotas.into_boxed_slice(),
                id_hash: crate::key::state_key::id_hash(&id),
                id: Arc::from(id),
                tenant_scoped,
            }),
        }
    }

    /// A builder that adds quotas by name and DSL text.
    pub fn builder(name: &str) -> PolicyBuilder {
        PolicyBuilder {
            name: name.to_owned(),
            quotas: Vec::new(),
        }
    }

    /// The policy's name (for logs and metrics; headers show the quotas').
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The quotas, in order (at least one).
    pub fn quotas(&self) -> &[Quota] {
        &self.inner.quotas
    }

    /// The first quota (every policy has one).
    pub fn first(&self) -> &Quota {
        &self.inner.quotas[0]
    }

    /// The quota named `name`.
    pub fn quota(&self, name: &str) -> Option<&Quota> {
        self.inner.quotas.iter().find(|q| q.name() == name)
    }

    /// How many quotas the policy holds (at least 1).
    #[allow(clippy::len_without_is_empty)] // never empty
    pub fn len(&self) -> usize {
        self.inner.quotas.len()
    }

    /// Whether any quota is counted per tenant ([`Scope::Tenant`]).
    pub fn has_tenant_scope(&self) -> bool {
        self.inner.tenant_scoped
    }

    /// A stable identifier of the policy (its name and every quota's id).
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// [`id`](Self::id)'s hash, computed once.
    pub(crate) fn id_hash(&self) -> u64 {
        self.inner.id_hash
    }

    /// The shortest window of its quotas, computed once.
    pub(crate) fn shortest_window(&self) -> std::time::Duration {
        self.inner.shortest_window
    }

    /// [`shortest_window`](Self::shortest_window) in whole µs.
    pub(crate) fn shortest_window_micros(&self) -> u64 {
        crate::clock::duration_micros(self.inner.shortest_window)
    }

    /// The same identifier as a shared string.
    pub(crate) fn shared_id(&self) -> &Arc<str> {
        &self.inner.id
    }

    /// The same policy with every quota replaced by `map(quota)`, which must
    /// keep names unique; `None` if `map` drops one.
    pub(crate) fn map_quotas(&self, map: impl Fn(&Quota) -> Option<Quota>) -> Option<Self> {
        let quotas: Vec<Quota> = self.quotas().iter().filter_map(map).collect();
        (quotas.len() == self.len()).then(|| Self::from_checked(self.name(), quotas))
    }
}

impl From<Quota> for Policy {
    fn from(quota: Quota) -> Self {
        let name = quota.name().to_owned();
        Self::from_checked(&name, vec![quota])
    }
}

impl PartialEq for Policy {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner) || self.inner.id == other.inner.id
    }
}

impl Eq for Policy {}

impl std::hash::Hash for Policy {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.inner.id.hash(state);
    }
}

impl fmt::Debug for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Policy")
            .field("name", &self.name())
            .field("quotas", &self.quotas())
            .finish()
    }
}

impl fmt::Display for Policy {
    /// `name = quota, name = quota scope=tenant`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, quota) in self.quotas().iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{} = {quota}", quota.name())?;
            if quota.scope() == Scope::Tenant {
                f.write_str(" scope=tenant")?;
            }
        }
        Ok(())
    }
}

/// Builds a [`Policy`] quota by quota; see [`Policy::builder`].
#[derive(Debug, Clone)]
#[must_use]
pub struct PolicyBuilder {
    name: String,
    quotas: Vec<Quota>,
}

impl PolicyBuilder {
    /// Adds the quota `dsl` (see [`crate::quota`]) under `name`.
    pub fn quota(self, name: &str, dsl: &str) -> Result<Self, PolicyError> {
        let quota = dsl
            .parse::<Quota>()
            .and_then(|q| q.named(name))
            .map_err(|error| PolicyError::Quota {
                name: name.chars().take(80).collect(),
                error,
            })?;
        Ok(self.with(quota))
    }

    /// Adds a quota (under its own name).
    pub fn with(mut self, quota: Quota) -> Self {
        self.quotas.push(quota);
        self
    }

    /// Checks the set (see [`Policy::new`]) and builds the policy.
    pub fn build(self) -> Result<Policy, PolicyError> {
        Policy::new(&self.name, self.quotas)
    }
}

/// Why a set of quotas is not a valid [`Policy`].
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// A policy needs at least one quota.
    #[error("a policy needs at least one quota")]
    Empty,
    /// More quotas than [`MAX_QUOTAS`].
    #[error("a policy holds at most {MAX_QUOTAS} quotas, got {0}")]
    TooManyQuotas(usize),
    /// Two quotas of one policy share a name.
    #[error("two quotas of one policy are both named {0:?}")]
    DuplicateName(String),
    /// The policy name is not 1 to 64 characters of `[A-Za-z0-9_.-]`.
    #[error("invalid policy name {0:?}: use 1 to 64 characters of A-Z, a-z, 0-9, '_', '.', '-'")]
    InvalidName(String),
    /// A quota of the policy is invalid.
    #[error("quota {name:?}: {error}")]
    Quota {
        /// The quota's name.
        name: String,
        /// What is wrong with it.
        error: QuotaError,
    },
}

crate::error_debug::debug_as_display!(PolicyError {
    Empty,
    TooManyQuotas,
    DuplicateName,
    InvalidName,
    Quota,
});

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn duplicate_names_empty_and_too_many_are_refused() {
        let q = |text: &str, name: &str| text.parse::<Quota>().unwrap().named(name).unwrap();
        assert_eq!(
            Policy::new("p", [q("1/s", "a"), q("2/m", "a")]).unwrap_err(),
            PolicyError::DuplicateName("a".into())
        );
        assert_eq!(Policy::new("p", []).unwrap_err(), PolicyError::Empty);
        let many = (0..=MAX_QUOTAS).map(|i| q("1/s", &format!("q{i}")));
        assert_eq!(
            Policy::new("p", many).unwrap_err(),
            PolicyError::TooManyQuotas(MAX_QUOTAS + 1)
        );
        assert!(matches!(
            Policy::new("a b", [q("1/s", "a")]),
            Err(PolicyError::InvalidName(_))
        ));
        let err = Policy::builder("p").quota("x", "0/s").unwrap_err();
        assert!(matches!(err, PolicyError::Quota { ref name, .. } if name == "x"));
        assert!(err.to_string().contains("\"x\""), "{err}");
    }

    #[test]
    fn order_ids_and_scope() {
        let build = || {
            let org = "60/1m".parse::<Quota>().unwrap().named("org").unwrap();
            Policy::builder("api")
                .quota("burst", "5/1s")
                .unwrap()
                .with(org.scoped(Scope::Tenant))
                .build()
                .unwrap()
        };
        let p = build();
        assert_eq!(p.first().name(), "burst");
        assert_eq!(p.quota("org").unwrap().scope(), Scope::Tenant);
        assert!(p.has_tenant_scope());
        assert_eq!(p.to_string(), "burst = 5/1s, org = 60/1m scope=tenant");
        let same = build();
        assert_eq!(p, same);
        let single = Policy::from("5/1s".parse::<Quota>().unwrap());
        assert!(!single.has_tenant_scope());
        assert_ne!(single, p);
    }
}
