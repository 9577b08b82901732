//! [`Scope`]: whose window a quota counts.

use std::fmt;

/// Whose window a [`Quota`](super::Quota) counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Scope {
    /// One window per tenant and subject (the default).
    #[default]
    Subject,
    /// One window per tenant, shared by all of its subjects (an
    /// organisation-wide budget).
    Tenant,
}

impl Scope {
    /// The scope's name as configuration writes it: `subject` or `tenant`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Subject => "subject",
            Self::Tenant => "tenant",
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Scope {
    type Err = super::QuotaError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "subject" => Ok(Self::Subject),
            "tenant" => Ok(Self::Tenant),
            other => Err(super::QuotaError::UnknownScope(
                other.chars().take(32).collect(),
            )),
        }
    }
}
