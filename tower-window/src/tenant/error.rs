//! [`TenantError`]: why a tenant definition, file or lifecycle call failed.

use crate::{PolicyError, QuotaError, StoreError};

/// Why a tenant definition, a tenants file or a lifecycle call failed.
/// Definition errors name the tenant (when known), the quota and the problem.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum TenantError {
    /// The tenant name is not valid (see
    /// [`validate_tenant_name`](super::validate_tenant_name)).
    #[error(
        "invalid tenant name {0:?}: use 1 to 128 bytes without control characters, whitespace or '/'"
    )]
    InvalidName(String),
    /// A quota is invalid.
    #[error("{}quota {quota:?}: {error}", named(.tenant.as_deref()))]
    Quota {
        /// The tenant (`None` for a definition not yet given a name).
        tenant: Option<String>,
        /// The quota's name.
        quota: String,
        /// What is wrong with it.
        #[source]
        error: QuotaError,
    },
    /// The quotas do not make a policy (none, too many, two of one name).
    #[error("{}{error}", named(.tenant.as_deref()))]
    Policy {
        /// The tenant.
        tenant: Option<String>,
        /// What is wrong.
        #[source]
        error: PolicyError,
    },
    /// `shadow` names a quota the tenant does not have.
    #[error(
        "{}quota {quota:?}: listed in shadow but not defined in quotas",
        named(.tenant.as_deref())
    )]
    UnknownShadow {
        /// The tenant.
        tenant: Option<String>,
        /// The name in `shadow`.
        quota: String,
    },
    /// The file (or request body) is not valid TOML (JSON) of the expected shape.
    #[error("{0}")]
    Syntax(String),
    /// Several problems of one file, each naming its tenant and quota.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Invalid(Vec<TenantError>),
    /// A record kept in the store could not be read back.
    #[error("unreadable tenant record {0:?}")]
    Record(String),
    /// The store failed.
    #[error("tenant registry: {0}")]
    Store(#[source] StoreError),
}

crate::error_debug::debug_as_display!(TenantError {
    InvalidName,
    Quota,
    Policy,
    UnknownShadow,
    Syntax,
    Invalid,
    Record,
    Store,
});

/// `tenant "<name>": `, or nothing.
pub(super) fn named(tenant: Option<&str>) -> String {
    let prefix = tenant.map(|tenant| format!("tenant {tenant:?}: "));
    prefix.unwrap_or_default()
}

impl TenantError {
    /// The same error, naming `tenant`.
    #[cfg_attr(not(feature = "serde"), allow(dead_code))]
    pub(crate) fn for_tenant(mut self, name: &str) -> Self {
        if let Self::Quota { tenant, .. }
        | Self::Policy { tenant, .. }
        | Self::UnknownShadow { tenant, .. } = &mut self
        {
            *tenant = Some(name.to_owned());
        }
        self
    }

    /// Whether the caller's input is at fault (a 400), not the store.
    pub fn is_invalid_input(&self) -> bool {
        !matches!(self, Self::Store(_) | Self::Record(_))
    }
}
