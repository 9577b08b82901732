//! Key extractors for HTTP request values: [`Header`], [`Query`] and
//! [`Extension`], for `http::Request<B>` and `http::request::Parts`.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName};
use http::{Extensions, Uri};

use super::{KeyExtractor, NoKey, WindowKey};

/// The longest key value [`Header`] and [`Query`] accept by default, in
/// bytes. The layer answers a longer one with
/// [`Rejection::KeyTooLong`](crate::layer::Rejection::KeyTooLong).
pub const DEFAULT_MAX_LEN: usize = 1024;

/// A request the HTTP extractors read: `http::Request<B>` or `Parts`.
pub(crate) trait HttpRequest {
    fn parts(&self) -> (&HeaderMap, &Uri, &Extensions);
}

impl<B> HttpRequest for http::Request<B> {
    fn parts(&self) -> (&HeaderMap, &Uri, &Extensions) {
        (self.headers(), self.uri(), self.extensions())
    }
}

impl HttpRequest for http::request::Parts {
    fn parts(&self) -> (&HeaderMap, &Uri, &Extensions) {
        (&self.headers, &self.uri, &self.extensions)
    }
}

/// `value` as a key, unless empty or longer than `max_len` bytes.
pub(super) fn bounded_key(value: &[u8], max_len: usize) -> Result<WindowKey, NoKey> {
    match value.len() {
        0 => Err(NoKey::Missing),
        len if len > max_len => Err(NoKey::TooLong { max_len }),
        _ => Ok(WindowKey::for_subject_copy(value)),
    }
}

/// A header name that is not valid (see [`Header::new`]).
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid header name {0:?}")]
pub struct InvalidHeaderName(String);

crate::error_debug::debug_as_display!(InvalidHeaderName);

/// The value of a request header (the first one, if repeated), as raw
/// bytes. Absent, empty or longer than [`max_len`](Self::max_len), no key.
///
/// ```
/// use tower_window::key::{Header, KeyExtractor};
///
/// let key = Header::new("X-Api-Key")?;
/// let request = http::Request::builder().header("x-api-key", "k-123").body(()).unwrap();
/// assert_eq!(key.extract(&request).unwrap().subject(), b"k-123");
/// assert!(key.extract(&http::Request::new(())).is_none());
/// assert!(Header::new("no spaces").is_err());
/// # Ok::<(), tower_window::key::InvalidHeaderName>(())
/// ```
#[derive(Debug, Clone)]
pub struct Header {
    name: HeaderName,
    pub(super) max_len: usize,
}

impl Header {
    /// Keys requests by the header `name` (any case).
    pub fn new(name: &str) -> Result<Self, InvalidHeaderName> {
        let parsed = HeaderName::try_from(name)
            .map_err(|_| InvalidHeaderName(name.chars().take(80).collect()))?;
        Ok(Self::from_name(parsed))
    }

    /// Keys requests by the header `name`.
    pub fn from_name(name: HeaderName) -> Self {
        Self {
            name,
            max_len: DEFAULT_MAX_LEN,
        }
    }

    /// Values longer than `max_len` bytes give no key ([`NoKey::TooLong`];
    /// default [`DEFAULT_MAX_LEN`]).
    pub fn max_len(mut self, max_len: usize) -> Self {
        self.max_len = max_len;
        self
    }

    /// The header's name.
    pub fn name(&self) -> &HeaderName {
        &self.name
    }

    pub(super) fn key_of_headers(&self, headers: &HeaderMap) -> Result<WindowKey, NoKey> {
        let value = headers.get(&self.name).ok_or(NoKey::Missing)?;
        bounded_key(value.as_bytes(), self.max_len)
    }
}

impl<R: HttpRequest> KeyExtractor<R> for Header {
    fn extract(&self, request: &R) -> Option<WindowKey> {
        self.try_extract(request).ok()
    }

    fn try_extract(&self, request: &R) -> Result<WindowKey, NoKey> {
        self.key_of_headers(request.parts().0)
    }
}

/// The URL-decoded value of a query parameter (its first occurrence);
/// malformed escapes are kept as they are. Absent, empty or longer than
/// [`max_len`](Self::max_len), no key.
///
/// ```
/// use tower_window::key::{KeyExtractor, Query};
///
/// let key = Query::new("api_key");
/// let request = http::Request::builder().uri("/search?q=x&api_key=a%20b&api_key=other").body(()).unwrap();
/// assert_eq!(key.extract(&request).unwrap().subject(), b"a b");
/// ```
#[derive(Debug, Clone)]
pub struct Query {
    param: Box<str>,
    max_len: usize,
}

impl Query {
    /// Keys requests by the query parameter `param` (matched after decoding).
    pub fn new(param: impl Into<String>) -> Self {
        Self {
            param: param.into().into_boxed_str(),
            max_len: DEFAULT_MAX_LEN,
        }
    }

    /// Values longer than `max_len` bytes (decoded) give no key
    /// ([`NoKey::TooLong`]; default [`DEFAULT_MAX_LEN`]).
    pub fn max_len(mut self, max_len: usize) -> Self {
        self.max_len = max_len;
        self
    }
}

impl<R: HttpRequest> KeyExtractor<R> for Query {
    fn extract(&self, request: &R) -> Option<WindowKey> {
        self.try_extract(request).ok()
    }

    fn try_extract(&self, request: &R) -> Result<WindowKey, NoKey> {
        let query = request.parts().1.query().ok_or(NoKey::Missing)?;
        for pair in query.as_bytes().split(|&b| b == b'&') {
            let (name, value) = match pair.iter().position(|&b| b == b'=') {
                Some(eq) => (&pair[..eq], &pair[eq + 1..]),
                None => (pair, &[][..]),
            };
            if *url_decode(name) != *self.param.as_bytes() {
                continue;
            }
            return bounded_key(&url_decode(value), self.max_len);
        }
        Err(NoKey::Missing)
    }
}

/// `application/x-www-form-urlencoded` decoding, leaving malformed escapes as they are.
fn url_decode(input: &[u8]) -> Cow<'_, [u8]> {
    if !input.iter().any(|&b| b == b'%' || b == b'+') {
        return Cow::Borrowed(input);
    }
    let mut out = Vec::with_capacity(input.len());
    let mut rest = input;
    while let Some((&byte, tail)) = rest.split_first() {
        rest = tail;
        match byte {
            b'+' => out.push(b' '),
            b'%' => match (
                tail.first().copied().and_then(hex),
                tail.get(1).copied().and_then(hex),
            ) {
                (Some(high), Some(low)) => {
                    out.push(high << 4 | low);
                    rest = &tail[2..];
                }
                _ => out.push(b'%'),
            },
            other => out.push(other),
        }
    }
    Cow::Owned(out)
}

fn hex(digit: u8) -> Option<u8> {
    char::from(digit)
        .to_digit(16)
        .and_then(|d| u8::try_from(d).ok())
}

/// A key computed from a request extension of type `T` (one an
/// authentication layer inserted, say). No such extension, no key.
///
/// ```
/// use tower_window::key::{Extension, KeyExtractor};
///
/// #[derive(Clone)]
/// struct User { id: String }
///
/// let key = Extension::new(|user: &User| user.id.clone());
/// let mut request = http::Request::new(());
/// assert!(key.extract(&request).is_none());
/// request.extensions_mut().insert(User { id: "u-7".into() });
/// assert_eq!(key.extract(&request).unwrap().subject(), b"u-7");
/// ```
pub struct Extension<T, F = fn(&T) -> Bytes> {
    subject: F,
    _extension: PhantomData<fn() -> T>,
}

impl<T, F> Extension<T, F> {
    /// Keys requests by `subject(extension)`, anything `Into<Bytes>`.
    pub fn new(subject: F) -> Self {
        Self {
            subject,
            _extension: PhantomData,
        }
    }
}

impl<T, F: Clone> Clone for Extension<T, F> {
    fn clone(&self) -> Self {
        Self::new(self.subject.clone())
    }
}

impl<T, F> fmt::Debug for Extension<T, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Extension")
            .field(&std::any::type_name::<T>())
            .finish()
    }
}

impl<T, F, V, R> KeyExtractor<R> for Extension<T, F>
where
    T: Send + Sync + 'static,
    F: Fn(&T) -> V + Send + Sync,
    V: Into<Bytes>,
    R: HttpRequest,
{
    fn extract(&self, request: &R) -> Option<WindowKey> {
        let extension = request.parts().2.get::<T>()?;
        Some(WindowKey::for_subject((self.subject)(extension)))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::key::test_requests::{request, subject};
    use crate::key::Constant;

    #[test]
    fn header_reads_raw_bytes_and_first_value() {
        let key = Header::new("X-User").unwrap();
        assert_eq!(key.name(), "x-user");
        let req = request("/", &[("x-user", b"\xff\xfe bin"), ("x-user", b"second")]);
        assert_eq!(subject(key.extract(&req)).unwrap(), b"\xff\xfe bin");
        assert_eq!(
            subject(key.extract(&request("/", &[("x-user", b"")]))),
            None
        );
        assert_eq!(subject(key.extract(&request("/", &[]))), None);
        let (parts, ()) = req.into_parts();
        assert_eq!(subject(key.extract(&parts)).unwrap(), b"\xff\xfe bin");
    }

    #[test]
    fn header_rejects_huge_values_and_bad_names() {
        let huge = vec![b'a'; 64 * 1024];
        let req = request("/", &[("x-user", &huge)]);
        assert!(Header::new("x-user").unwrap().extract(&req).is_none());
        assert_eq!(
            subject(
                Header::new("x-user")
                    .unwrap()
                    .max_len(usize::MAX)
                    .extract(&req)
            )
            .unwrap()
            .len(),
            huge.len()
        );
        let at_limit = vec![b'b'; DEFAULT_MAX_LEN];
        assert!(Header::new("x-user")
            .unwrap()
            .extract(&request("/", &[("x-user", &at_limit)]))
            .is_some());
        assert!(Header::new("bad header").is_err());
        assert!(Header::new("").is_err());
    }

    #[test]
    fn header_new_refuses_an_invalid_name_with_a_typed_error() {
        let error = Header::new("no spaces").unwrap_err();
        assert_eq!(error.to_string(), r#"invalid header name "no spaces""#);
    }

    #[test]
    fn query_decodes_first_occurrence() {
        let key = Query::new("key");
        let get = |uri: &str| subject(key.extract(&request(uri, &[])));
        assert_eq!(get("/?key=a+b%2Fc&key=second").unwrap(), b"a b/c");
        assert_eq!(get("/?other=1&k%65y=enc").unwrap(), b"enc");
        assert_eq!(get("/?key=%ff%FE").unwrap(), b"\xff\xfe");
        assert_eq!(get("/?key=100%&x").unwrap(), b"100%");
        assert_eq!(get("/?key=%zz%4").unwrap(), b"%zz%4");
        assert_eq!(get("/?key=a=b").unwrap(), b"a=b");
        assert_eq!(get("/?key="), None);
        assert_eq!(get("/?key"), None);
        assert_eq!(get("/?keys=1&akey=2"), None);
        assert_eq!(get("/"), None);
        assert_eq!(get("/?"), None);
        let huge = format!("/?key={}", "x".repeat(DEFAULT_MAX_LEN + 1));
        assert_eq!(get(&huge), None);
    }

    #[test]
    fn extension_maps_a_typed_extension() {
        #[derive(Clone)]
        struct Tenant(&'static str);
        let key = Extension::new(|t: &Tenant| t.0);
        let mut req = request("/", &[]);
        assert!(key.extract(&req).is_none());
        req.extensions_mut().insert(Tenant("acme"));
        assert_eq!(subject(key.extract(&req)).unwrap(), b"acme");
        let named: Extension<Tenant> =
            Extension::new(|t: &Tenant| Bytes::from_static(t.0.as_bytes()));
        assert_eq!(subject(named.clone().extract(&req)).unwrap(), b"acme");
        let (parts, ()) = req.into_parts();
        assert_eq!(subject(named.extract(&parts)).unwrap(), b"acme");
    }

    #[test]
    fn constant_works_for_any_request() {
        assert_eq!(subject(Constant::new("x").extract(&42u8)).unwrap(), b"x");
        assert_eq!(
            Constant::global().extract(&()).unwrap(),
            WindowKey::global()
        );
        let key = WindowKey::new("t", "s");
        assert_eq!(
            Constant::from_key(key.clone()).extract(&request("/", &[])),
            Some(key)
        );
    }
}
