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

fn tenant_prefix(f: &mut fmt::Formatter<'_>, tenant: &Option<String>) -> fmt::Result {
    match tenant {
        Some(tenant) => write!(f, "tenant {tenant:?}: "),
        None => Ok(()),
    }
}

impl fmt::Display for TenantError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidName(name) => write!(
                f,
                "invalid tenant name {name:?}: use 1 to 128 bytes without control characters, whitespace or '/'"
            ),
            Self::Quota {
                tenant,
                quota,
                error,
            } => {
                tenant_prefix(f, tenant)?;
                write!(f, "quota {quota:?}: {error}")
            }
            Self::Policy { tenant, error } => {
                tenant_prefix(f, tenant)?;
                write!(f, "{error}")
            }
            Self::UnknownShadow { tenant, quota } => {
                tenant_prefix(f, tenant)?;
                write!(f, "quota {quota:?}: listed in shadow but not defined in quotas")
            }
            Self::Syntax(message) => write!(f, "{message}"),
            Self::Invalid(problems) => {
                for (i, problem) in problems.iter().enumerate() {
                    if i > 0 {
                        f.write_str("; ")?;
                    }
                    write!(f, "{problem}")?;
                }
                Ok(())
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
    pub(crate) fn for_tenant(self, name: &str) -> Self {
        let named = Some(name.to_owned());
        match self {
            Self::Quota { quota, error, .. } => Self::Quota {
                tenant: named,
                quota,
                error,
            },
            Self::Policy { error, .. } => Self::Policy {
                tenant: named,
                error,
            },
            Self::UnknownShadow { quota, .. } => Self::UnknownShadow {
                tenant: named,
                quota,
            },
            other => other,
        }
    }

    /// Whether the caller's input is at fault (a 400), not the store.
    pub fn is_invalid_input(&self) -> bool {
        !matches!(self, Self::Store(_) | Self::Record(_))
    }
}
