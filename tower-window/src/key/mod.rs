//! Who is being limited: [`WindowKey`] and the [`KeyExtractor`] trait.
//!
//! An extractor names the window a request counts against: a tenant and a
//! subject (user, API key, IP address...). With no key, the layer applies
//! its [`MissingKey`](crate::MissingKey) policy (or try another extractor
//! with [`KeyExtractorExt::or`]); a key too long ([`NoKey::TooLong`]) gets
//! its own rejection.
//!
//! ```
//! use tower_window::key::{Constant, Header, KeyExtractor, KeyExtractorExt};
//!
//! // Per user, inside the tenant named by `x-tenant-id` (or "public").
//! let key = Header::new("x-user-id")?.with_tenant(Header::new("x-tenant-id")?.or(Constant::new("public")));
//! let request = http::Request::builder()
//!     .header("x-user-id", "alice")
//!     .body(())
//!     .unwrap();
//! let window = key.extract(&request).unwrap();
//! assert_eq!(window.tenant(), b"public");
//! assert_eq!(window.subject(), b"alice");
//! # Ok::<(), tower_window::key::InvalidHeaderName>(())
//! ```

use std::fmt;
use std::marker::PhantomData;

use bytes::Bytes;

#[cfg(feature = "http")]
mod builtin;
mod constant;
#[cfg(feature = "grpc")]
mod grpc;
#[cfg(feature = "http")]
mod net;
pub(crate) mod state_key;
#[cfg(all(test, feature = "http"))]
mod test_requests;

#[cfg(feature = "http")]
pub use builtin::{Extension, Header, InvalidHeaderName, Query, DEFAULT_MAX_LEN};
pub use constant::Constant;
#[cfg(feature = "grpc")]
pub use grpc::{GrpcMethod, InvalidMetadataKey, Metadata};
#[cfg(feature = "http")]
pub use net::{InvalidNetwork, PeerIp, TrustedProxies};

/// The identity of one window: a tenant and a subject within it.
///
/// Both parts are arbitrary bytes; stores escape them so that no input can
/// collide with or reach another key. Keys compare, order and hash by the
/// tenant's bytes, then the subject's.
#[derive(Clone)]
pub struct WindowKey {
    tenant: Part,
    subject: Part,
}

/// The most bytes a [`WindowKey`] part holds inline: a UUID's text or an
/// IPv6 network (`ffff:…:ffff/128`, 43 bytes) fits.
pub(crate) const INLINE_PART: usize = 46;

/// One part of a [`WindowKey`]. The built-in extractors must copy a
/// request's bytes; held inline, a short copy allocates nothing.
type Part = InlineBytes<INLINE_PART>;

/// Bytes held inline up to `N`, in a shared buffer beyond.
#[derive(Clone)]
pub(crate) enum InlineBytes<const N: usize> {
    Inline { len: u8, buf: [u8; N] },
    Shared(Bytes),
}

impl<const N: usize> InlineBytes<N> {
    /// A copy of `parts`, concatenated.
    pub(crate) fn copy_of(parts: &[&[u8]]) -> Self {
        let len: usize = parts.iter().map(|part| part.len()).sum();
        match u8::try_from(len) {
            Ok(short) if len <= N => {
                let mut buf = [0; N];
                let mut end = 0;
                for part in parts {
                    buf[end..end + part.len()].copy_from_slice(part);
                    end += part.len();
                }
                Self::Inline { len: short, buf }
            }
            _ => Self::Shared(Bytes::from(parts.concat())),
        }
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        match self {
            Self::Inline { len, buf } => &buf[..usize::from(*len)],
            Self::Shared(bytes) => bytes,
        }
    }

    /// The bytes as a shared buffer (copied if inline).
    fn to_bytes(&self) -> Bytes {
        match self {
            Self::Inline { .. } => Bytes::copy_from_slice(self.as_slice()),
            Self::Shared(bytes) => bytes.clone(),
        }
    }
}

impl PartialEq for WindowKey {
    fn eq(&self, other: &Self) -> bool {
        self.tenant() == other.tenant() && self.subject() == other.subject()
    }
}

impl Eq for WindowKey {}

impl std::hash::Hash for WindowKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.tenant().hash(state);
        self.subject().hash(state);
    }
}

impl PartialOrd for WindowKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for WindowKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.tenant(), self.subject()).cmp(&(other.tenant(), other.subject()))
    }
}

impl WindowKey {
    /// The tenant used when none is extracted.
    pub const DEFAULT_TENANT: &'static [u8] = b"default";

    /// A key for `subject` within `tenant`.
    ///
    /// Owned buffers are moved in, borrowed ones copied (see [`KeyPart`]):
    ///
    /// ```
    /// use tower_window::WindowKey;
    ///
    /// fn key_of(user: &str) -> WindowKey {
    ///     WindowKey::new("public", user)
    /// }
    /// let owned = String::from("alice");
    /// assert_eq!(key_of(&owned), WindowKey::new("public", owned.clone()));
    /// assert_eq!(key_of("alice").subject(), b"alice");
    /// assert_eq!(WindowKey::new(b"t".to_vec(), &b"\xff"[..]).subject(), b"\xff");
    /// ```
    pub fn new(tenant: impl KeyPart, subject: impl KeyPart) -> Self {
        Self {
            tenant: Part::Shared(tenant.into_key_bytes()),
            subject: Part::Shared(subject.into_key_bytes()),
        }
    }

    /// A key for a copy of `subject` in the default tenant (inline when
    /// short: no allocation).
    #[cfg(feature = "http")]
    pub(crate) fn for_subject_copy(subject: &[u8]) -> Self {
        Self {
            tenant: Part::Shared(Bytes::from_static(Self::DEFAULT_TENANT)),
            subject: Part::copy_of(&[subject]),
        }
    }

    /// A key for `subject` in the default tenant.
    pub fn for_subject(subject: impl Into<Bytes>) -> Self {
        Self::new(Bytes::from_static(Self::DEFAULT_TENANT), subject.into())
    }

    /// One key shared by every request (a global limit).
    pub fn global() -> Self {
        Self::for_subject(Bytes::from_static(b"global"))
    }

    /// The same subject in another tenant.
    pub fn with_tenant(mut self, tenant: impl Into<Bytes>) -> Self {
        self.tenant = Part::Shared(tenant.into());
        self
    }

    /// The same subject in the tenant named by `other`'s subject, uncopied.
    fn with_tenant_of(mut self, other: WindowKey) -> Self {
        self.tenant = other.subject;
        self
    }

    /// The tenant's bytes.
    pub fn tenant(&self) -> &[u8] {
        self.tenant.as_slice()
    }

    /// Both parts as shared buffers.
    pub(crate) fn shared_parts(&self) -> (Bytes, Bytes) {
        (self.tenant.to_bytes(), self.subject.to_bytes())
    }

    /// The subject's bytes.
    pub fn subject(&self) -> &[u8] {
        self.subject.as_slice()
    }
}

/// What a [`WindowKey`] part can be made from: owned buffers (`Bytes`,
/// `String`, `Vec<u8>`, `Box<[u8]>`) are moved in, borrowed ones copied.
pub trait KeyPart {
    /// The part's bytes.
    fn into_key_bytes(self) -> Bytes;
}

macro_rules! owned_key_part {
    ($($owned:ty),+) => {
        $(impl KeyPart for $owned {
            fn into_key_bytes(self) -> Bytes {
                Bytes::from(self)
            }
        })+
    };
}

owned_key_part!(Bytes, String, Vec<u8>, Box<[u8]>);

/// Any borrowed bytes (`&str`, `&[u8]`, `&[u8; N]`, `&Bytes`...).
impl<T: AsRef<[u8]> + ?Sized> KeyPart for &T {
    fn into_key_bytes(self) -> Bytes {
        Bytes::copy_from_slice(self.as_ref())
    }
}

/// Shows lengths only: keys may hold user identifiers or API keys.
impl fmt::Debug for WindowKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WindowKey")
            .field("tenant_len", &self.tenant().len())
            .field("subject_len", &self.subject().len())
            .finish()
    }
}

/// Why a [`KeyExtractor`] found no key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NoKey {
    /// The request carries no value to key by, or an empty one.
    #[error("the request carries no rate-limit key")]
    Missing,
    /// The value is longer than the extractor accepts.
    #[error("the rate-limit key is longer than {max_len} bytes")]
    TooLong {
        /// The longest value the extractor accepts, in bytes.
        max_len: usize,
    },
}

impl NoKey {
    /// The more telling of two reasons: too long (the client can fix it).
    fn or(self, other: Self) -> Self {
        match (self, other) {
            (Self::Missing, other) => other,
            (too_long, _) => too_long,
        }
    }
}

/// Names the window a request counts against.
///
/// Implemented for closures `Fn(&Req) -> Option<WindowKey>`, for `Option<E>`
/// (`None` finds no key) and the built-ins; combine them with
/// [`KeyExtractorExt`].
pub trait KeyExtractor<Req>: Send + Sync {
    /// The request's key, or `None` when the request carries none.
    fn extract(&self, request: &Req) -> Option<WindowKey>;

    /// The request's key, or why there is none (what the layer calls).
    /// `try_extract(request).ok()` must equal `extract(request)`; the
    /// default always says [`NoKey::Missing`].
    ///
    /// ```
    /// use tower_window::key::{Header, KeyExtractor, NoKey};
    ///
    /// let key = Header::new("x-user-id")?.max_len(8);
    /// let request = |user: &str| http::Request::builder().header("x-user-id", user).body(()).unwrap();
    /// assert_eq!(key.try_extract(&request("alice")).unwrap().subject(), b"alice");
    /// assert_eq!(key.try_extract(&request("a-very-long-id")), Err(NoKey::TooLong { max_len: 8 }));
    /// assert_eq!(key.try_extract(&http::Request::new(())), Err(NoKey::Missing));
    /// # Ok::<(), tower_window::key::InvalidHeaderName>(())
    /// ```
    fn try_extract(&self, request: &Req) -> Result<WindowKey, NoKey> {
        self.extract(request).ok_or(NoKey::Missing)
    }
}

impl<F, Req> KeyExtractor<Req> for F
where
    F: Fn(&Req) -> Option<WindowKey> + Send + Sync,
{
    fn extract(&self, request: &Req) -> Option<WindowKey> {
        self(request)
    }
}

impl<E, Req> KeyExtractor<Req> for Option<E>
where
    E: KeyExtractor<Req>,
{
    fn extract(&self, request: &Req) -> Option<WindowKey> {
        self.as_ref().and_then(|e| e.extract(request))
    }

    fn try_extract(&self, request: &Req) -> Result<WindowKey, NoKey> {
        self.as_ref()
            .map_or(Err(NoKey::Missing), |e| e.try_extract(request))
    }
}

/// Combinators for every [`KeyExtractor`].
///
/// The combined extractors remember the request type `Req`, so it is
/// inferred where they are used; name it with
/// `KeyExtractorExt::<Request>::or(a, b)`.
pub trait KeyExtractorExt<Req>: KeyExtractor<Req> + Sized {
    /// Tries `self`, then `other` when `self` finds no key (or one too
    /// long). A key too long for either is the reason when both fail.
    fn or<E: KeyExtractor<Req>>(self, other: E) -> Or<Self, E, Req> {
        Or {
            first: self,
            second: other,
            _request: PhantomData,
        }
    }

    /// Uses `tenant`'s subject as the tenant of `self`'s key; no tenant,
    /// no key (add a default with [`or`](Self::or) and [`Constant`]).
    fn with_tenant<T: KeyExtractor<Req>>(self, tenant: T) -> WithTenant<Self, T, Req> {
        WithTenant {
            subject: self,
            tenant,
            _request: PhantomData,
        }
    }
}

impl<E: KeyExtractor<Req>, Req> KeyExtractorExt<Req> for E {}

/// See [`KeyExtractorExt::or`].
pub struct Or<A, B, Req> {
    first: A,
    second: B,
    _request: PhantomData<fn(&Req)>,
}

impl<A, B, Req> KeyExtractor<Req> for Or<A, B, Req>
where
    A: KeyExtractor<Req>,
    B: KeyExtractor<Req>,
{
    fn extract(&self, request: &Req) -> Option<WindowKey> {
        self.try_extract(request).ok()
    }

    fn try_extract(&self, request: &Req) -> Result<WindowKey, NoKey> {
        self.first.try_extract(request).or_else(|first| {
            self.second
                .try_extract(request)
                .map_err(|second| first.or(second))
        })
    }
}

impl<A: Clone, B: Clone, Req> Clone for Or<A, B, Req> {
    fn clone(&self) -> Self {
        Self {
            first: self.first.clone(),
            second: self.second.clone(),
            _request: PhantomData,
        }
    }
}

impl<A: fmt::Debug, B: fmt::Debug, Req> fmt::Debug for Or<A, B, Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Or")
            .field("first", &self.first)
            .field("second", &self.second)
            .finish()
    }
}

/// See [`KeyExtractorExt::with_tenant`].
pub struct WithTenant<S, T, Req> {
    subject: S,
    tenant: T,
    _request: PhantomData<fn(&Req)>,
}

impl<S, T, Req> KeyExtractor<Req> for WithTenant<S, T, Req>
where
    S: KeyExtractor<Req>,
    T: KeyExtractor<Req>,
{
    fn extract(&self, request: &Req) -> Option<WindowKey> {
        self.try_extract(request).ok()
    }

    fn try_extract(&self, request: &Req) -> Result<WindowKey, NoKey> {
        match (
            self.tenant.try_extract(request),
            self.subject.try_extract(request),
        ) {
            (Ok(tenant), Ok(subject)) => Ok(subject.with_tenant_of(tenant)),
            (Err(tenant), Err(subject)) => Err(tenant.or(subject)),
            (Err(reason), Ok(_)) | (Ok(_), Err(reason)) => Err(reason),
        }
    }
}

impl<S: Clone, T: Clone, Req> Clone for WithTenant<S, T, Req> {
    fn clone(&self) -> Self {
        Self {
            subject: self.subject.clone(),
            tenant: self.tenant.clone(),
            _request: PhantomData,
        }
    }
}

impl<S: fmt::Debug, T: fmt::Debug, Req> fmt::Debug for WithTenant<S, T, Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WithTenant")
            .field("subject", &self.subject)
            .field("tenant", &self.tenant)
            .finish()
    }
}

// What these test, the inline parts, only the HTTP and gRPC extractors make.
#[cfg(all(test, feature = "http"))]
mod tests {
    use std::collections::hash_map::DefaultHasher;
    use std::hash::{Hash, Hasher};

    use super::*;

    fn hash_of(key: &WindowKey) -> u64 {
        let mut hasher = DefaultHasher::new();
        key.hash(&mut hasher);
        hasher.finish()
    }

    /// A part held inline and the same bytes in a shared buffer are one
    /// key: equal, hashed and ordered alike, both sides of the inline limit.
    #[test]
    fn inline_and_shared_parts_are_the_same_key() {
        for len in [1, INLINE_PART - 1, INLINE_PART, INLINE_PART + 1, 200] {
            let subject = vec![b'k'; len];
            let copied = WindowKey::for_subject_copy(&subject);
            let shared = WindowKey::for_subject(subject.clone());
            assert_eq!(copied, shared);
            assert_eq!(hash_of(&copied), hash_of(&shared));
            assert_eq!(copied.cmp(&shared), std::cmp::Ordering::Equal);
            assert_eq!(copied.subject(), &subject[..]);
            assert_eq!(copied.tenant(), WindowKey::DEFAULT_TENANT);
        }
        let a = WindowKey::for_subject_copy(b"a");
        let b = WindowKey::for_subject("b");
        assert!(a < b);
        // The tenant orders first, as before.
        assert!(WindowKey::new("t1", "z") < WindowKey::for_subject_copy(b"a").with_tenant("t2"));
        // A tenant taken from another key's (inline) subject.
        let tenant = WindowKey::for_subject_copy(b"acme");
        let key = WindowKey::for_subject_copy(b"alice").with_tenant_of(tenant);
        assert_eq!((key.tenant(), key.subject()), (&b"acme"[..], &b"alice"[..]));
        let (t, s) = key.shared_parts();
        assert_eq!((&t[..], &s[..]), (&b"acme"[..], &b"alice"[..]));
    }
}
