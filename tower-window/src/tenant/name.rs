//! Tenant names: what a registry, its config file and the admin API accept.

use super::TenantError;

/// The longest tenant name, in bytes.
pub const MAX_TENANT_NAME_LEN: usize = 128;

/// Checks a tenant name: 1 to [`MAX_TENANT_NAME_LEN`] bytes of UTF-8,
/// without control characters, whitespace or `/`.
///
/// Anything else is allowed, since store keys escape every byte; `/` is
/// refused so that a name is one path segment of the admin API.
///
/// ```
/// use tower_window::tenant::validate_tenant_name;
///
/// assert!(validate_tenant_name("acme").is_ok());
/// assert!(validate_tenant_name("{acme}:eu|1").is_ok());
/// assert!(validate_tenant_name("Ünïcødé-テナント").is_ok());
/// assert!(validate_tenant_name("").is_err());
/// assert!(validate_tenant_name("a b").is_err());
/// assert!(validate_tenant_name("a/b").is_err());
/// assert!(validate_tenant_name(&"x".repeat(129)).is_err());
/// ```
pub fn validate_tenant_name(name: &str) -> Result<(), TenantError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_TENANT_NAME_LEN
        && name
            .chars()
            .all(|c| !c.is_control() && !c.is_whitespace() && c != '/');
    if ok {
        Ok(())
    } else {
        Err(TenantError::InvalidName(name.chars().take(80).collect()))
    }
}
