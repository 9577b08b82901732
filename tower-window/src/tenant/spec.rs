//! [`TenantSpec`]: a tenant's quotas, or unlimited.

use std::fmt;

use super::TenantError;
use crate::{Policy, Quota, QuotaError, Scope};

/// A tenant's definition: its named quotas (some possibly
/// [shadow](Quota::shadowed)), or unlimited.
///
/// ```
/// use tower_window::tenant::TenantSpec;
///
/// let spec = TenantSpec::builder()
///     .quota("burst", "10/1s")?
///     .tenant_quota("org", "5000/1m")?
///     .quota("trial", "5/1m")?
///     .shadow("trial")?
///     .build()?;
/// assert_eq!(spec.quotas().len(), 3);
/// assert!(spec.quotas()[2].is_shadow());
/// assert!(TenantSpec::unlimited().is_unlimited());
/// # Ok::<(), tower_window::tenant::TenantError>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct TenantSpec {
    quotas: Vec<Quota>,
    unlimited: bool,
}

impl TenantSpec {
    /// A builder adding quotas one by one.
    pub fn builder() -> TenantSpecBuilder {
        TenantSpecBuilder::default()
    }

    /// A spec of `quotas` (named, unique, at most
    /// [`MAX_QUOTAS`](crate::quota::MAX_QUOTAS)).
    pub fn new(quotas: impl IntoIterator<Item = Quota>) -> Result<Self, TenantError> {
        let quotas: Vec<Quota> = quotas.into_iter().collect();
        Policy::new("tenant", quotas.iter().cloned()).map_err(|error| TenantError::Policy {
            tenant: None,
            error,
        })?;
        Ok(Self {
            quotas,
            unlimited: false,
        })
    }

    /// An unlimited tenant: its requests never reach the store.
    pub fn unlimited() -> Self {
        Self {
            quotas: Vec::new(),
            unlimited: true,
        }
    }

    /// Whether the tenant is unlimited.
    pub fn is_unlimited(&self) -> bool {
        self.unlimited
    }

    /// The quotas, in order.
    pub fn quotas(&self) -> &[Quota] {
        &self.quotas
    }

    /// The policy of tenant `tenant` in state generation `generation`
    /// (`None` for an unlimited tenant).
    pub(crate) fn policy(&self, tenant: &str, generation: u64) -> Option<Policy> {
        if self.unlimited {
            return None;
        }
        let quotas = || {
            let quotas = self.quotas.iter();
            quotas.map(|q| q.clone().with_generation(generation))
        };
        // A tenant name that is not a valid policy name becomes `tenant`.
        let policy = Policy::new(tenant, quotas());
        policy.or_else(|_| Policy::new("tenant", quotas())).ok()
    }

    /// The Redis record: `U` (unlimited), or `Q` then one line per quota,
    /// `name\tscope\tshadow(0/1)\tdsl`.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn encode(&self) -> String {
        if self.unlimited {
            return "U".to_owned();
        }
        let lines = self.quotas.iter().map(|q| {
            let shadow = u8::from(q.is_shadow());
            format!("\n{}\t{}\t{shadow}\t{q}", q.name(), q.scope().as_str())
        });
        std::iter::once("Q".to_owned()).chain(lines).collect()
    }

    /// Parses [`encode`](Self::encode)'s text.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn decode(text: &str) -> Result<Self, TenantError> {
        let bad = || TenantError::Record(text.chars().take(80).collect());
        let mut lines = text.split('\n');
        match lines.next() {
            Some("U") => Ok(Self::unlimited()),
            Some("Q") => {
                let mut builder = Self::builder();
                for line in lines {
                    let parts: Vec<&str> = line.splitn(4, '\t').collect();
                    let [name, scope, shadow, dsl] = parts[..] else {
                        return Err(bad());
                    };
                    builder
                        .add(name, dsl, scope.parse(), shadow == "1")
                        .map_err(|_| bad())?;
                }
                builder.build()
            }
            _ => Err(bad()),
        }
    }
}

impl fmt::Debug for TenantSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.unlimited {
            return f.write_str("TenantSpec(unlimited)");
        }
        f.debug_tuple("TenantSpec").field(&self.quotas).finish()
    }
}

/// Builds a [`TenantSpec`]; see [`TenantSpec::builder`].
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct TenantSpecBuilder {
    quotas: Vec<Quota>,
}

impl TenantSpecBuilder {
    /// Adds the per-subject quota `dsl` (see [`crate::quota`]) as `name`.
    pub fn quota(mut self, name: &str, dsl: &str) -> Result<Self, TenantError> {
        self.add(name, dsl, Ok(Scope::Subject), false)?;
        Ok(self)
    }

    /// Adds the per-tenant quota `dsl` as `name`.
    pub fn tenant_quota(mut self, name: &str, dsl: &str) -> Result<Self, TenantError> {
        self.add(name, dsl, Ok(Scope::Tenant), false)?;
        Ok(self)
    }

    pub(crate) fn add(
        &mut self,
        name: &str,
        dsl: &str,
        scope: Result<Scope, QuotaError>,
        shadow: bool,
    ) -> Result<(), TenantError> {
        let quota = dsl.parse::<Quota>().and_then(|q| q.named(name));
        let quota = quota.and_then(|q| Ok(q.scoped(scope?).shadowed(shadow)));
        self.quotas.push(quota.map_err(|error| TenantError::Quota {
            tenant: None,
            quota: name.chars().take(80).collect(),
            error,
        })?);
        Ok(())
    }

    /// Adds a quota as it is.
    pub fn with(mut self, quota: Quota) -> Self {
        self.quotas.push(quota);
        self
    }

    /// Makes the quota `name` (added before) a shadow quota.
    pub fn shadow(mut self, name: &str) -> Result<Self, TenantError> {
        self.set_shadow(name)?;
        Ok(self)
    }

    pub(crate) fn set_shadow(&mut self, name: &str) -> Result<(), TenantError> {
        let quota = self.quotas.iter_mut().find(|q| q.name() == name);
        let quota = quota.ok_or_else(|| TenantError::UnknownShadow {
            tenant: None,
            quota: name.chars().take(80).collect(),
        })?;
        *quota = quota.clone().shadowed(true);
        Ok(())
    }

    /// Checks the quotas and builds the spec.
    pub fn build(self) -> Result<TenantSpec, TenantError> {
        TenantSpec::new(self.quotas)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn records_round_trip() {
        let spec = TenantSpec::builder()
            .quota("burst", "100/1s gcra")
            .unwrap()
            .tenant_quota("org", "5000/1m")
            .unwrap()
            .quota("sustained", "1000/1h sliding-counter(1m)")
            .unwrap()
            .shadow("sustained")
            .unwrap()
            .build()
            .unwrap();
        assert_eq!(TenantSpec::decode(&spec.encode()).unwrap(), spec);
        let unlimited = TenantSpec::unlimited();
        assert_eq!(TenantSpec::decode(&unlimited.encode()).unwrap(), unlimited);
        for bad in [
            "",
            "X",
            "Q\nburst\tsubject",
            "Q\nb\tplanet\t0\t1/s",
            "Q\nb\tsubject\t0\t0/s",
        ] {
            assert!(TenantSpec::decode(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn policies_carry_the_generation() {
        let spec = TenantSpec::builder()
            .quota("a", "1/s")
            .unwrap()
            .build()
            .unwrap();
        let p0 = spec.policy("acme", 0).unwrap();
        let p1 = spec.policy("acme", 1).unwrap();
        assert_ne!(p0.first().state_id(), p1.first().state_id());
        assert_eq!(p0.name(), "acme");
        assert_eq!(spec.policy("a{b}", 0).unwrap().name(), "tenant");
        assert!(TenantSpec::unlimited().policy("x", 3).is_none());
    }
}
