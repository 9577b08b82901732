//! [`TenantError`]: why a tenant definition, file or lifecycle call failed.

use std::fmt;

use crate::{PolicyError, QuotaError, StoreError};

/// Why a tenant definition, a tenants file or a lifecycle call failed.
///
/// Definition errors name the tenant (when known), the quota and the problem.
#[non_exhaustive]
pub enum TenantError {
    /// The tenant name is empty, too long, or holds control characters,
    /// whitespace or `/` (see [`validate_tenant_name`](super::validate_tenant_name)).
    InvalidName(String),
    /// A quota is invalid.
    Quota {
        /// The tenant (`None` for a definition not yet given a name).
        tenant: Option<String>,
        /// The quota's name.
        quota: String,
        /// What is wrong with it.
        error: QuotaError,
    },
    /// The quotas do not make a policy (none, too many, two of one name).
    Policy {
        /// The tenant.
        tenant: Option<String>,
        /// What is wrong.
        error: PolicyError,
    },
    /// `shadow` names a quota the tenant does not have.
    UnknownShadow {
        /// The tenant.
        tenant: Option<String>,
        /// The name in `shadow`.
        quota: String,
    },
    /// The file (or request body) is not valid TOML (JSON) of the expected shape.
    Syntax(String),
    /// Several problems of one file, each naming its tenant and quota.
    Invalid(Vec<TenantError>),
    /// A record kept in the store could not be read back.
    Record(String),
    /// The store failed.
    Store(StoreError),
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

impl fmt::Display for TenantError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Self::Quota {
            tenant: Some(tenant),
            ..
        }
        | Self::Policy {
            tenant: Some(tenant),
            ..
        }
        | Self::UnknownShadow {
            tenant: Some(tenant),
            ..
        } = self
        {
            write!(f, "tenant {tenant:?}: ")?;
        }
        match self {
            Self::InvalidName(name) => write!(
                f,
                "invalid tenant name {name:?}: use 1 to 128 bytes without control characters, whitespace or '/'"
            ),
            Self::Quota { quota, error, .. } => write!(f, "quota {quota:?}: {error}"),
            Self::Policy { error, .. } => write!(f, "{error}"),
            Self::UnknownShadow { quota, .. } => {
                write!(f, "quota {quota:?}: listed in shadow but not defined in quotas")
            }
            Self::Syntax(message) => write!(f, "{message}"),
            Self::Invalid(problems) => {
                let problems: Vec<String> = problems.iter().map(ToString::to_string).collect();
                f.write_str(&problems.join("; "))
            }
            Self::Record(text) => write!(f, "unreadable tenant record {text:?}"),
            Self::Store(error) => write!(f, "tenant registry: {error}"),
        }
    }
}

impl std::error::Error for TenantError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Quota { error, .. } => Some(error),
            Self::Policy { error, .. } => Some(error),
            Self::Store(error) => Some(error),
            _ => None,
        }
    }
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
