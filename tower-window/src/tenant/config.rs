//! [`TenantsConfig`]: the tenants file (TOML) and its validation.

use std::collections::BTreeMap;

use super::{validate_tenant_name, TenantError, TenantSpec};

/// Every tenant a file defines, and the default for the others. The file
/// format (TOML, feature `serde`; see [`from_toml`](Self::from_toml)):
///
/// ```toml
/// [default]                       # tenants not listed; omit it and unknown tenants get 403
/// quotas = { minute = "60/1m" }
///
/// [tenants.acme]
/// quotas = { burst = "10/1s", sustained = "1000/1h sliding-counter(1m)" }
///
/// [tenants.bigco]
/// quotas = { burst = "100/1s gcra", org = { limit = "5000/1m", scope = "tenant" } }
///
/// [tenants.trial]
/// quotas = { minute = "5/1m" }
/// shadow = ["minute"]
///
/// [tenants.internal]
/// unlimited = true                # never reaches the store
///
/// [tenants.acme.audit]            # optional: acme's own audit rules
/// denials = true
/// degraded = true
/// shadow_denials = true
/// admin = true
/// admission_sample = 100          # and 1 admission in 100 (0: none)
/// ```
///
/// A quota is the DSL text (see [`crate::quota`]) or a table `{ limit =
/// "<dsl>", scope = "subject" | "tenant", shadow = true | false }`;
/// `shadow` lists quotas that never deny. Quotas keep the file's order.
///
/// An `audit` table (in a tenant, or in `[default]`) gives the tenant its
/// own [`AuditRules`](crate::audit::AuditRules) (fields left out take
/// their [default](crate::audit::AuditRules::default)); without one the
/// audit log's rules apply. See
/// [`TenantRegistry::with_audit`](super::TenantRegistry::with_audit).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TenantsConfig {
    /// The spec of tenants not listed; `None`: they are unknown.
    pub default: Option<TenantSpec>,
    /// Tenants by name.
    pub tenants: BTreeMap<String, TenantSpec>,
}

impl TenantsConfig {
    /// An empty configuration: no tenants, no default.
    pub fn new() -> Self {
        Self::default()
    }

    /// The same configuration with `default` for tenants not listed.
    #[must_use]
    pub fn with_default(mut self, default: TenantSpec) -> Self {
        self.default = Some(default);
        self
    }

    /// The same configuration with tenant `name` defined as `spec`.
    pub fn with_tenant(mut self, name: &str, spec: TenantSpec) -> Result<Self, TenantError> {
        validate_tenant_name(name)?;
        self.tenants.insert(name.to_owned(), spec);
        Ok(self)
    }
}

#[cfg(feature = "serde")]
mod file {
    use std::collections::BTreeMap;
    use std::fmt;

    use serde::de::{MapAccess, Visitor};
    use serde::ser::SerializeMap;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::super::{validate_tenant_name, TenantError, TenantSpec};
    use super::TenantsConfig;
    use crate::audit::AuditRules;
    use crate::{Quota, Scope};

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct FileRepr {
        default: Option<SpecRepr>,
        #[serde(default)]
        tenants: BTreeMap<String, SpecRepr>,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct SpecRepr {
        #[serde(default)]
        quotas: Ordered,
        #[serde(default)]
        shadow: Vec<String>,
        #[serde(default)]
        unlimited: bool,
        #[serde(default)]
        audit: Option<AuditRules>,
    }

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum QuotaRepr {
        Text(String),
        Table {
            limit: String,
            #[serde(default)]
            scope: Option<String>,
            #[serde(default)]
            shadow: bool,
        },
    }

    /// A map kept in the order written.
    #[derive(Default)]
    struct Ordered(Vec<(String, QuotaRepr)>);

    impl<'de> Deserialize<'de> for Ordered {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            struct OrderedVisitor;
            impl<'de> Visitor<'de> for OrderedVisitor {
                type Value = Ordered;
                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str("a table of quotas: name = \"<limit>/<window>\"")
                }
                fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Ordered, A::Error> {
                    let mut entries = Vec::new();
                    while let Some(entry) = map.next_entry()? {
                        entries.push(entry);
                    }
                    Ok(Ordered(entries))
                }
            }
            deserializer.deserialize_map(OrderedVisitor)
        }
    }

    impl SpecRepr {
        /// Every problem of this definition.
        fn into_spec(self, tenant: Option<&str>) -> Result<TenantSpec, Vec<TenantError>> {
            let named = |e: TenantError| match tenant {
                Some(t) => e.for_tenant(t),
                None => e,
            };
            if self.unlimited {
                if !self.quotas.0.is_empty() || !self.shadow.is_empty() {
                    return Err(vec![TenantError::Syntax(format!(
                        "{}an unlimited tenant has no quotas or shadow quotas",
                        super::super::error::named(tenant)
                    ))]);
                }
                return Ok(TenantSpec::unlimited().with_audit(self.audit));
            }
            let mut problems = Vec::new();
            let mut builder = TenantSpec::builder();
            for (name, repr) in self.quotas.0 {
                let (text, scope, shadow) = match repr {
                    QuotaRepr::Text(text) => (text, None, false),
                    QuotaRepr::Table {
                        limit,
                        scope,
                        shadow,
                    } => (limit, scope, shadow),
                };
                let scope = scope.as_deref().map_or(Ok(Scope::Subject), str::parse);
                if let Err(error) = builder.add(&name, &text, scope, shadow) {
                    problems.push(named(error));
                }
            }
            if !problems.is_empty() {
                return Err(problems);
            }
            // After the quotas: a quota that failed would look like an
            // unknown shadow.
            for name in &self.shadow {
                builder = builder.shadow(name).map_err(|e| vec![named(e)])?;
            }
            let spec = builder.build().map_err(|e| vec![named(e)])?;
            Ok(spec.with_audit(self.audit))
        }
    }

    impl TenantsConfig {
        /// Parses and validates a tenants file (see the [type
        /// docs](TenantsConfig)) as a whole, reporting every problem.
        ///
        /// ```
        /// use tower_window::tenant::TenantsConfig;
        ///
        /// let config = TenantsConfig::from_toml(r#"
        ///     [tenants.acme]
        ///     quotas = { burst = "10/1s", sustained = "1000/1h sliding-counter(1m)" }
        /// "#)?;
        /// assert_eq!(config.tenants["acme"].quotas()[1].name(), "sustained");
        ///
        /// let broken = TenantsConfig::from_toml(r#"
        ///     [tenants.acme]
        ///     quotas = { burst = "0/1s" }
        ///     [tenants.trial]
        ///     quotas = { minute = "5/1m" }
        ///     shadow = ["hour"]
        /// "#).unwrap_err().to_string();
        /// assert!(broken.contains(r#"tenant "acme": quota "burst""#), "{broken}");
        /// assert!(broken.contains(r#"tenant "trial": quota "hour""#), "{broken}");
        /// # Ok::<(), tower_window::tenant::TenantError>(())
        /// ```
        pub fn from_toml(text: &str) -> Result<Self, TenantError> {
            let repr: FileRepr =
                toml::from_str(text).map_err(|e| TenantError::Syntax(e.to_string()))?;
            let mut problems = Vec::new();
            let mut keep = |spec: Result<TenantSpec, Vec<TenantError>>| {
                spec.map_err(|mut errors| problems.append(&mut errors)).ok()
            };
            let default = repr
                .default
                .and_then(|d| keep(d.into_spec(Some("[default]"))));
            let mut tenants = BTreeMap::new();
            for (name, repr) in repr.tenants {
                let valid = validate_tenant_name(&name).map_err(|error| vec![error]);
                if let Some(spec) = keep(valid.and_then(|()| repr.into_spec(Some(&name)))) {
                    tenants.insert(name, spec);
                }
            }
            match problems.len() {
                0 => Ok(Self { default, tenants }),
                1 => Err(problems.remove(0)),
                _ => Err(TenantError::Invalid(problems)),
            }
        }
    }

    impl<'de> Deserialize<'de> for TenantSpec {
        /// As in the tenants file.
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            SpecRepr::deserialize(deserializer)?
                .into_spec(None)
                .map_err(|mut problems| serde::de::Error::custom(problems.remove(0)))
        }
    }

    /// A quota as the admin API shows it.
    struct QuotaOut<'a>(&'a Quota);

    impl Serialize for QuotaOut<'_> {
        fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            let quota = self.0;
            if quota.scope() == Scope::Subject {
                return serializer.collect_str(quota);
            }
            let mut map = serializer.serialize_map(Some(2))?;
            map.serialize_entry("limit", &quota.to_string())?;
            map.serialize_entry("scope", quota.scope().as_str())?;
            map.end()
        }
    }

    struct QuotasOut<'a>(&'a [Quota]);

    impl Serialize for QuotasOut<'_> {
        fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            serializer.collect_map(self.0.iter().map(|quota| (quota.name(), QuotaOut(quota))))
        }
    }

    impl Serialize for TenantSpec {
        /// As in the tenants file, quotas as DSL text (a table for a
        /// tenant-scoped one).
        fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            let shadow: Vec<&str> = self
                .quotas()
                .iter()
                .filter(|q| q.is_shadow())
                .map(Quota::name)
                .collect();
            let mut map = serializer.serialize_map(None)?;
            map.serialize_entry("quotas", &QuotasOut(self.quotas()))?;
            if !shadow.is_empty() {
                map.serialize_entry("shadow", &shadow)?;
            }
            if self.is_unlimited() {
                map.serialize_entry("unlimited", &true)?;
            }
            if let Some(rules) = self.audit() {
                map.serialize_entry("audit", &rules)?;
            }
            map.end()
        }
    }
}

#[cfg(all(test, feature = "serde"))]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::audit::AuditRules;
    use crate::Scope;

    #[test]
    fn the_shipped_example_parses_in_order() {
        let config =
            TenantsConfig::from_toml(include_str!("../../../examples/tenants.toml")).unwrap();
        let names = |t: &str| -> Vec<String> {
            config.tenants[t]
                .quotas()
                .iter()
                .map(|q| q.name().to_owned())
                .collect()
        };
        assert_eq!(names("acme"), ["burst", "sustained"]);
        assert_eq!(names("bigco"), ["burst", "org"]);
        assert_eq!(config.tenants["bigco"].quotas()[1].scope(), Scope::Tenant);
        assert!(config.tenants["trial"].quotas()[0].is_shadow());
        assert_eq!(config.default.as_ref().unwrap().quotas()[0].limit(), 60);
        // Order is the file's, not alphabetical.
        let config = TenantsConfig::from_toml(
            "[tenants.x]\nquotas = { zeta = \"1/s\", alpha = \"2/s\", mid = \"3/s\" }",
        )
        .unwrap();
        let order: Vec<&str> = config.tenants["x"]
            .quotas()
            .iter()
            .map(|q| q.name())
            .collect();
        assert_eq!(order, ["zeta", "alpha", "mid"]);
    }

    #[test]
    fn every_problem_names_its_tenant_and_quota() {
        let err = TenantsConfig::from_toml(
            r#"
            [default]
            quotas = { minute = "60/1x" }
            [tenants.acme]
            quotas = { burst = "0/1s", ok = "1/s" }
            [tenants.bigco]
            quotas = { org = { limit = "5/1m", scope = "planet" } }
            [tenants.trial]
            quotas = { minute = "5/1m" }
            shadow = ["hour"]
            [tenants."a b"]
            quotas = { x = "1/s" }
            [tenants.empty]
            quotas = {}
            [tenants.both]
            unlimited = true
            quotas = { x = "1/s" }
            "#,
        )
        .unwrap_err()
        .to_string();
        for needle in [
            r#"tenant "[default]": quota "minute""#,
            r#"tenant "acme": quota "burst""#,
            r#"tenant "bigco": quota "org""#,
            "planet",
            r#"tenant "trial": quota "hour""#,
            r#"invalid tenant name "a b""#,
            r#"tenant "empty""#,
            r#"tenant "both""#,
        ] {
            assert!(err.contains(needle), "{needle:?} in {err}");
        }
        for bad in [
            "[tenants.x]\nquotas = 3",
            "[tenants.x]\nlimits = {}",
            "nonsense = [",
        ] {
            assert!(matches!(
                TenantsConfig::from_toml(bad),
                Err(TenantError::Syntax(_))
            ));
        }
    }

    #[test]
    fn audit_tables_give_tenants_their_own_rules() {
        let config = TenantsConfig::from_toml(
            r#"
            [default]
            quotas = { minute = "60/1m" }
            audit = { admission_sample = 10 }
            [tenants.acme]
            quotas = { burst = "10/1s" }
            [tenants.acme.audit]
            denials = false
            admin = false
            [tenants.internal]
            unlimited = true
            audit = { denials = false, degraded = false, shadow_denials = false, admin = true }
            [tenants.plain]
            quotas = { burst = "10/1s" }
            "#,
        )
        .unwrap();
        let acme = config.tenants["acme"].audit().unwrap();
        assert!(!acme.denials && !acme.admin && acme.degraded && acme.shadow_denials);
        assert_eq!(acme.admission_sample, 0);
        let internal = config.tenants["internal"].audit().unwrap();
        assert!(config.tenants["internal"].is_unlimited());
        assert_eq!(
            internal,
            AuditRules {
                admin: true,
                ..AuditRules::none()
            }
        );
        assert_eq!(config.tenants["plain"].audit(), None);
        let default = config.default.as_ref().unwrap().audit().unwrap();
        assert_eq!(default, AuditRules::default().sample_admissions(10));
        // The admin API shows (and takes back) the rules.
        let json = serde_json::to_value(&config.tenants["acme"]).unwrap();
        assert_eq!(json["audit"]["denials"], false);
        assert_eq!(json["audit"]["admission_sample"], 0);
        let back: TenantSpec = serde_json::from_value(json).unwrap();
        assert_eq!(back, config.tenants["acme"]);
        let json = serde_json::to_value(&config.tenants["plain"]).unwrap();
        assert!(json.get("audit").is_none());

        for bad in [
            "[tenants.x]\nquotas = { a = \"1/s\" }\naudit = { verbose = true }",
            "[tenants.x]\nquotas = { a = \"1/s\" }\naudit = { denials = \"yes\" }",
            "[tenants.x]\nquotas = { a = \"1/s\" }\naudit = { admission_sample = -1 }",
            "[tenants.x]\nquotas = { a = \"1/s\" }\naudit = { admission_sample = 4294967296 }",
            "[tenants.x]\nquotas = { a = \"1/s\" }\naudit = true",
            "[default]\nquotas = { a = \"1/s\" }\n[default.audit]\nadmin = 1",
        ] {
            assert!(
                matches!(TenantsConfig::from_toml(bad), Err(TenantError::Syntax(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn specs_serialize_as_the_admin_api_shows_them() {
        let config =
            TenantsConfig::from_toml(include_str!("../../../examples/tenants.toml")).unwrap();
        let json = serde_json::to_value(&config.tenants["bigco"]).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"quotas": {"burst": "100/1s gcra", "org": {"limit": "5000/1m", "scope": "tenant"}}})
        );
        let json = serde_json::to_value(&config.tenants["trial"]).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"quotas": {"minute": "5/1m"}, "shadow": ["minute"]})
        );
        let back: TenantSpec = serde_json::from_value(json).unwrap();
        assert_eq!(back, config.tenants["trial"]);
        let unlimited = serde_json::to_value(TenantSpec::unlimited()).unwrap();
        assert_eq!(
            serde_json::from_value::<TenantSpec>(unlimited).unwrap(),
            TenantSpec::unlimited()
        );
    }
}
