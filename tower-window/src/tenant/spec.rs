//! [`TenantSpec`]: a tenant's quotas, or unlimited.

use std::collections::HashMap;
use std::fmt;

use super::TenantError;
use crate::audit::AuditRules;
use crate::{Policy, Quota, QuotaError, Scope};

/// The first word of a record's audit line: a quota line starts with its
/// name, which never holds `@`.
const AUDIT_LINE: &str = "@audit";

/// A tenant's definition: its named quotas (some possibly
/// [shadow](Quota::shadowed)), or unlimited, and optionally its own
/// [`AuditRules`] (see [`TenantRegistry::with_audit`](super::TenantRegistry::with_audit)).
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
    audit: Option<AuditRules>,
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
            audit: None,
        })
    }

    /// An unlimited tenant: its requests never reach the store.
    pub fn unlimited() -> Self {
        Self {
            quotas: Vec::new(),
            unlimited: true,
            audit: None,
        }
    }

    /// The same spec with its own audit rules (`None`: the audit log's).
    ///
    /// ```
    /// use tower_window::audit::AuditRules;
    /// use tower_window::tenant::TenantSpec;
    ///
    /// let spec = TenantSpec::unlimited().with_audit(Some(AuditRules::none()));
    /// assert_eq!(spec.audit(), Some(AuditRules::none()));
    /// ```
    #[must_use]
    pub fn with_audit(mut self, rules: Option<AuditRules>) -> Self {
        self.audit = rules;
        self
    }

    /// The tenant's own audit rules; `None`: the audit log's apply.
    pub fn audit(&self) -> Option<AuditRules> {
        self.audit
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
    /// `name\tscope\tshadow(0/1)\tdsl`; then, only for a spec with its own
    /// audit rules, the line `@audit\tdenials=0|1\tdegraded=0|1\t
    /// shadow_denials=0|1\tadmin=0|1\tadmission_sample=<n>`. A spec
    /// without audit rules is written as before they existed, so nodes of
    /// an older version still read it.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn encode(&self) -> String {
        let mut text = if self.unlimited {
            "U".to_owned()
        } else {
            let lines = self.quotas.iter().map(|q| {
                let shadow = u8::from(q.is_shadow());
                format!("\n{}\t{}\t{shadow}\t{q}", q.name(), q.scope().as_str())
            });
            std::iter::once("Q".to_owned()).chain(lines).collect()
        };
        if let Some(rules) = &self.audit {
            let flag = u8::from;
            text.push_str(&format!(
                "\n{AUDIT_LINE}\tdenials={}\tdegraded={}\tshadow_denials={}\tadmin={}\tadmission_sample={}",
                flag(rules.denials),
                flag(rules.degraded),
                flag(rules.shadow_denials),
                flag(rules.admin),
                rules.admission_sample,
            ));
        }
        text
    }

    /// Parses [`encode`](Self::encode)'s text.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn decode(text: &str) -> Result<Self, TenantError> {
        let bad = || TenantError::Record(text.chars().take(80).collect());
        let mut lines = text.split('\n');
        let unlimited = match lines.next() {
            Some("U") => true,
            Some("Q") => false,
            _ => return Err(bad()),
        };
        let mut builder = Self::builder();
        let mut audit = None;
        for line in lines {
            if let Some(fields) = line.strip_prefix(AUDIT_LINE) {
                if audit.is_some() {
                    return Err(bad());
                }
                audit = Some(decode_audit(fields).ok_or_else(bad)?);
                continue;
            }
            let parts: Vec<&str> = line.splitn(4, '\t').collect();
            let [name, scope, shadow, dsl] = parts[..] else {
                return Err(bad());
            };
            if unlimited {
                return Err(bad());
            }
            builder
                .add(name, dsl, scope.parse(), shadow == "1")
                .map_err(|_| bad())?;
        }
        let spec = if unlimited {
            Self::unlimited()
        } else {
            builder.build()?
        };
        Ok(spec.with_audit(audit))
    }
}

/// The rules of an audit line's fields (after `@audit`): every field once,
/// each `\t<name>=<value>`.
fn decode_audit(fields: &str) -> Option<AuditRules> {
    let mut values = HashMap::new();
    for field in fields.strip_prefix('\t')?.split('\t') {
        let (name, value) = field.split_once('=')?;
        if values.insert(name, value).is_some() {
            return None;
        }
    }
    let mut take = |name: &str| values.remove(name);
    let flag = |value: Option<&str>| match value? {
        "0" => Some(false),
        "1" => Some(true),
        _ => None,
    };
    let rules = AuditRules {
        denials: flag(take("denials"))?,
        degraded: flag(take("degraded"))?,
        shadow_denials: flag(take("shadow_denials"))?,
        admin: flag(take("admin"))?,
        admission_sample: take("admission_sample")?.parse().ok()?,
    };
    values.is_empty().then_some(rules)
}

impl fmt::Debug for TenantSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = f.debug_tuple("TenantSpec");
        if self.unlimited {
            out.field(&format_args!("unlimited"));
        } else {
            out.field(&self.quotas);
        }
        if let Some(rules) = &self.audit {
            out.field(rules);
        }
        out.finish()
    }
}

/// Builds a [`TenantSpec`]; see [`TenantSpec::builder`].
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct TenantSpecBuilder {
    quotas: Vec<Quota>,
    audit: Option<AuditRules>,
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
        let quota = self.quotas.iter_mut().find(|q| q.name() == name);
        let quota = quota.ok_or_else(|| TenantError::UnknownShadow {
            tenant: None,
            quota: name.chars().take(80).collect(),
        })?;
        *quota = quota.clone().shadowed(true);
        Ok(self)
    }

    /// Gives the tenant its own audit rules (by default the audit log's
    /// apply): see [`TenantRegistry::with_audit`](super::TenantRegistry::with_audit).
    pub fn audit(mut self, rules: AuditRules) -> Self {
        self.audit = Some(rules);
        self
    }

    /// Checks the quotas and builds the spec.
    pub fn build(self) -> Result<TenantSpec, TenantError> {
        Ok(TenantSpec::new(self.quotas)?.with_audit(self.audit))
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
    fn audit_rules_ride_in_the_record_and_old_records_still_read() {
        let plain = TenantSpec::builder()
            .quota("burst", "10/1s")
            .unwrap()
            .build()
            .unwrap();
        // Without audit rules: byte for byte the record of before.
        assert_eq!(plain.encode(), "Q\nburst\tsubject\t0\t10/1s");
        assert_eq!(TenantSpec::unlimited().encode(), "U");
        // Records written by older nodes read as specs without rules.
        let old = TenantSpec::decode("Q\nburst\tsubject\t0\t10/1s").unwrap();
        assert_eq!((old.audit(), &old), (None, &plain));
        assert_eq!(TenantSpec::decode("U").unwrap().audit(), None);

        let rules = AuditRules {
            denials: false,
            admission_sample: 7,
            ..AuditRules::default()
        };
        let audited = TenantSpec::builder()
            .quota("burst", "10/1s")
            .unwrap()
            .audit(rules)
            .build()
            .unwrap();
        assert_eq!(
            audited.encode(),
            "Q\nburst\tsubject\t0\t10/1s\n@audit\tdenials=0\tdegraded=1\tshadow_denials=1\tadmin=1\tadmission_sample=7"
        );
        assert_ne!(audited, plain, "the rules are part of the spec");
        for spec in [
            audited.clone(),
            TenantSpec::unlimited().with_audit(Some(AuditRules::none())),
            TenantSpec::unlimited()
                .with_audit(Some(AuditRules::default().sample_admissions(u32::MAX))),
        ] {
            let back = TenantSpec::decode(&spec.encode()).unwrap();
            assert_eq!((back.audit(), &back), (spec.audit(), &spec));
        }
        // The audit line may come anywhere after the header.
        let first = "Q\n@audit\tdenials=0\tdegraded=1\tshadow_denials=1\tadmin=1\tadmission_sample=7\nburst\tsubject\t0\t10/1s";
        assert_eq!(TenantSpec::decode(first).unwrap(), audited);
        let full = "denials=1\tdegraded=1\tshadow_denials=1\tadmin=1\tadmission_sample=0";
        for bad in [
            "Q\nburst\tsubject\t0\t1/s\n@audit".to_owned(),
            "Q\nburst\tsubject\t0\t1/s\n@audit\t".to_owned(),
            format!("Q\nb\tsubject\t0\t1/s\n@audit\t{full}\n@audit\t{full}"),
            format!("Q\nb\tsubject\t0\t1/s\n@audit {full}"),
            format!("Q\nb\tsubject\t0\t1/s\n@audit\t{full}\tdenials=1"),
            format!("Q\nb\tsubject\t0\t1/s\n@audit\t{full}\tverbose=1"),
            "Q\nb\tsubject\t0\t1/s\n@audit\tdenials=2\tdegraded=1\tshadow_denials=1\tadmin=1\tadmission_sample=0".to_owned(),
            "Q\nb\tsubject\t0\t1/s\n@audit\tdenials=1\tdegraded=1\tshadow_denials=1\tadmin=1\tadmission_sample=-1".to_owned(),
            "Q\nb\tsubject\t0\t1/s\n@audit\tdenials=1\tdegraded=1\tshadow_denials=1\tadmin=1".to_owned(),
            format!("Q\n@audit\t{full}"),
            "U\nburst\tsubject\t0\t1/s".to_owned(),
        ] {
            assert!(TenantSpec::decode(&bad).is_err(), "{bad:?}");
        }
        // A quota name never starts an audit line.
        assert!(TenantSpec::builder().quota("@audit", "1/s").is_err());
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
