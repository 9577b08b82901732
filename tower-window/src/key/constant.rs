//! [`Constant`]: the same key for every request, of any type.

use bytes::Bytes;

use super::{KeyExtractor, WindowKey};

/// The same key for every request: one global (or per-tenant) window.
///
/// Works for any request type.
///
/// ```
/// use tower_window::key::{Constant, KeyExtractor};
///
/// let key = Constant::new("everyone");
/// assert_eq!(key.extract(&"any request").unwrap().subject(), b"everyone");
/// ```
#[derive(Debug, Clone)]
pub struct Constant {
    key: WindowKey,
}

impl Constant {
    /// Every request gets the subject `subject` (in the default tenant).
    pub fn new(subject: impl Into<Bytes>) -> Self {
        Self::from_key(WindowKey::for_subject(subject))
    }

    /// Every request gets [`WindowKey::global`].
    pub fn global() -> Self {
        Self::from_key(WindowKey::global())
    }

    /// Every request gets `key`.
    pub fn from_key(key: WindowKey) -> Self {
        Self { key }
    }
}

impl<Req> KeyExtractor<Req> for Constant {
    fn extract(&self, _request: &Req) -> Option<WindowKey> {
        Some(self.key.clone())
    }
}
