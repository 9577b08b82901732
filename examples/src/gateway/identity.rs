//! Who a request is: the tenant and user every route of the gateway keys
//! by, derived by one rule so that what a route limits is what it leases,
//! deduplicates and reports.
//!
//! Each part (tenant, user) is read from its sources in order (the
//! tenant/user header, the `tenant`/`user` query parameter, as the route
//! allows); the first source that is present and not empty decides, as raw
//! bytes (header bytes as sent, query values percent-decoded byte for byte,
//! never replaced by U+FFFD). A deciding value longer than the route's
//! limit is an error (`400`), never a fall-through to the next source or to
//! the `public` tenant: a request that names a tenant or user is never
//! counted against another one. A `tenant` or `user` query parameter given
//! twice is ambiguous (`400`) on every route that reads the query. Without
//! any source the tenant is `public` and the user is missing (`400`).

use axum::body::Bytes;
use axum::http::{HeaderMap, HeaderName, Request, Uri};
use tower_window::key::{Header, KeyExtractor, NoKey, Query, DEFAULT_MAX_LEN};
use tower_window::WindowKey;

/// The tenant of a request that names none.
pub(super) const DEFAULT_TENANT: &str = "public";

/// Where a route reads the tenant and user, in order of precedence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Sources {
    /// The headers only (`/api/hello`).
    Headers,
    /// The headers, else the query parameters (`/ws`: browsers cannot set
    /// headers on a WebSocket).
    HeadersThenQuery,
    /// The query parameters, else the headers (`/api/quota`).
    QueryThenHeaders,
    /// The query parameters only (`/presence`).
    Query,
}

/// Why a request has no key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BadIdentity {
    /// No source names a user.
    MissingUser,
    /// The query parameter of `part` (`"tenant"` or `"user"`) is given
    /// more than once.
    Repeated {
        /// `"tenant"` or `"user"`.
        part: &'static str,
    },
    /// The deciding value of `part` (`"tenant"` or `"user"`) is longer
    /// than the route accepts.
    TooLong {
        /// `"tenant"` or `"user"`.
        part: &'static str,
        /// The longest accepted, in bytes.
        max: usize,
    },
}

impl BadIdentity {
    /// The problem detail of the `400`.
    pub(super) fn detail(&self) -> String {
        match self {
            Self::MissingUser => "missing user (header or ?user=)".to_owned(),
            Self::Repeated { part } => format!("the {part} query parameter is given twice"),
            Self::TooLong { part, max } => format!("the {part} is longer than {max} bytes"),
        }
    }
}

/// One part's two sources (no header for a query-only route).
#[derive(Debug, Clone)]
struct Part {
    name: &'static str,
    header: Option<Header>,
    query: Query,
}

impl Part {
    /// The extractors read raw values; the length rule is [`Identity`]'s.
    fn new(name: &'static str, header: Option<HeaderName>) -> Self {
        Self {
            name,
            header: header.map(|h| Header::from_name(h).max_len(usize::MAX)),
            query: Query::new(name).max_len(usize::MAX),
        }
    }
}

/// The gateway's key rule for one route (see the module docs); also the
/// route's [`KeyExtractor`], so the limiter keys exactly as the handler.
#[derive(Debug, Clone)]
pub(super) struct Identity {
    tenant: Part,
    user: Part,
    sources: Sources,
    max_len: usize,
}

impl Identity {
    /// Tenant and user from `sources`, each at most [`DEFAULT_MAX_LEN`]
    /// bytes (what tower-window's own extractors accept).
    pub(super) fn new(
        tenant_header: HeaderName,
        user_header: HeaderName,
        sources: Sources,
    ) -> Self {
        Self {
            tenant: Part::new("tenant", Some(tenant_header)),
            user: Part::new("user", Some(user_header)),
            sources,
            max_len: DEFAULT_MAX_LEN,
        }
    }

    /// Tenant and user from the query parameters only ([`Sources::Query`]).
    pub(super) fn query_only() -> Self {
        Self {
            tenant: Part::new("tenant", None),
            user: Part::new("user", None),
            sources: Sources::Query,
            max_len: DEFAULT_MAX_LEN,
        }
    }

    /// Values longer than `max_len` bytes are refused.
    pub(super) fn max_len(mut self, max_len: usize) -> Self {
        self.max_len = max_len;
        self
    }

    /// The key of a request with these headers and URI.
    pub(super) fn key(&self, headers: &HeaderMap, uri: &Uri) -> Result<WindowKey, BadIdentity> {
        let mut request = Request::new(());
        *request.uri_mut() = uri.clone();
        *request.headers_mut() = headers.clone();
        self.key_of(&request)
    }

    fn key_of<B>(&self, request: &Request<B>) -> Result<WindowKey, BadIdentity> {
        let user = self
            .part(&self.user, request)?
            .ok_or(BadIdentity::MissingUser)?;
        let tenant = self
            .part(&self.tenant, request)?
            .unwrap_or(Bytes::from_static(DEFAULT_TENANT.as_bytes()));
        Ok(WindowKey::new(tenant, user))
    }

    /// The deciding value of `part`: `None` when no source has one.
    fn part<B>(&self, part: &Part, request: &Request<B>) -> Result<Option<Bytes>, BadIdentity> {
        if self.sources != Sources::Headers && occurrences(request.uri(), part.name) > 1 {
            return Err(BadIdentity::Repeated { part: part.name });
        }
        let header = || part.header.as_ref().and_then(|h| h.extract(request));
        let query = || part.query.extract(request);
        // Both extractors give no key for an absent or empty value.
        let found = match self.sources {
            Sources::Headers => header(),
            Sources::HeadersThenQuery => header().or_else(query),
            Sources::QueryThenHeaders => query().or_else(header),
            Sources::Query => query(),
        };
        match found {
            None => Ok(None),
            Some(key) if key.subject().len() > self.max_len => Err(BadIdentity::TooLong {
                part: part.name,
                max: self.max_len,
            }),
            Some(key) => Ok(Some(Bytes::copy_from_slice(key.subject()))),
        }
    }
}

/// How often the query of `uri` names the parameter `name` (names
/// percent-decoded, as the extractors match them).
fn occurrences(uri: &Uri, name: &str) -> usize {
    let Some(query) = uri.query() else {
        return 0;
    };
    query
        .split('&')
        .filter(|pair| {
            let raw = pair.split_once('=').map_or(*pair, |(n, _)| n);
            decoded_eq(raw.as_bytes(), name.as_bytes())
        })
        .count()
}

/// Whether the `application/x-www-form-urlencoded` text `raw` decodes to
/// `name` (a malformed escape stands for itself).
fn decoded_eq(raw: &[u8], name: &[u8]) -> bool {
    let hex = |b: u8| char::from(b).to_digit(16);
    let mut decoded = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let byte = match raw[i] {
            b'+' => b' ',
            b'%' => {
                match (
                    raw.get(i + 1).and_then(|&b| hex(b)),
                    raw.get(i + 2).and_then(|&b| hex(b)),
                ) {
                    (Some(high), Some(low)) => {
                        i += 2;
                        // Two hex digits: at most 255.
                        u8::try_from(high * 16 + low).unwrap_or(b'%')
                    }
                    _ => b'%',
                }
            }
            other => other,
        };
        decoded.push(byte);
        i += 1;
    }
    decoded == name
}

impl<B> KeyExtractor<Request<B>> for Identity {
    fn extract(&self, request: &Request<B>) -> Option<WindowKey> {
        self.key_of(request).ok()
    }

    /// A part too long is the layer's `key-too-long` rejection; any other
    /// failure its `missing-key` one.
    fn try_extract(&self, request: &Request<B>) -> Result<WindowKey, NoKey> {
        self.key_of(request).map_err(|error| match error {
            BadIdentity::TooLong { max, .. } => NoKey::TooLong { max_len: max },
            BadIdentity::MissingUser | BadIdentity::Repeated { .. } => NoKey::Missing,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn identity(sources: Sources) -> Identity {
        Identity::new(
            HeaderName::from_static("x-tenant-id"),
            HeaderName::from_static("x-user-id"),
            sources,
        )
    }

    fn request(uri: &str, headers: &[(&str, &[u8])]) -> (HeaderMap, Uri) {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                axum::http::HeaderValue::from_bytes(value).unwrap(),
            );
        }
        (map, uri.parse().unwrap())
    }

    fn key(
        sources: Sources,
        uri: &str,
        headers: &[(&str, &[u8])],
    ) -> Result<(Vec<u8>, Vec<u8>), BadIdentity> {
        let (headers, uri) = request(uri, headers);
        identity(sources)
            .key(&headers, &uri)
            .map(|k| (k.tenant().to_vec(), k.subject().to_vec()))
    }

    #[test]
    fn sources_in_order() {
        let both = [("x-tenant-id", &b"h-t"[..]), ("x-user-id", &b"h-u"[..])];
        let uri = "/?tenant=q-t&user=q-u";
        let pair = |t: &str, u: &str| Ok((t.as_bytes().to_vec(), u.as_bytes().to_vec()));
        assert_eq!(key(Sources::Headers, uri, &both), pair("h-t", "h-u"));
        assert_eq!(
            key(Sources::HeadersThenQuery, uri, &both),
            pair("h-t", "h-u")
        );
        assert_eq!(key(Sources::HeadersThenQuery, uri, &[]), pair("q-t", "q-u"));
        assert_eq!(
            key(Sources::QueryThenHeaders, uri, &both),
            pair("q-t", "q-u")
        );
        assert_eq!(
            key(Sources::QueryThenHeaders, "/", &both),
            pair("h-t", "h-u")
        );
        assert_eq!(
            key(Sources::Query, "/?user=q-u", &both),
            pair("public", "q-u")
        );
        let (map, only_uri) = request("/?user=q-u", &both);
        let only = Identity::query_only().key(&map, &only_uri).unwrap();
        assert_eq!(only.subject(), b"q-u");
        // Empty is absent.
        assert_eq!(
            key(
                Sources::HeadersThenQuery,
                "/?user=q-u&tenant=",
                &[("x-user-id", b"")]
            ),
            pair("public", "q-u")
        );
        assert_eq!(
            key(Sources::Headers, uri, &[]),
            Err(BadIdentity::MissingUser)
        );
    }

    #[test]
    fn a_repeated_query_parameter_is_ambiguous() {
        for uri in [
            "/?user=a&user=b",
            "/?user=a&%75ser=b",
            "/?tenant=a&user=u&tenant=b",
        ] {
            assert!(
                matches!(
                    key(Sources::Query, uri, &[]),
                    Err(BadIdentity::Repeated { .. })
                ),
                "{uri}"
            );
        }
        assert!(key(Sources::Query, "/?user=a&users=b&user%=c", &[]).is_ok());
        // A route that reads only headers does not look at the query.
        assert!(key(Sources::Headers, "/?user=a&user=b", &[("x-user-id", b"h")]).is_ok());
        assert!(decoded_eq(b"%75s+r", b"us r"));
        assert!(decoded_eq(b"%7", b"%7"));
        assert!(decoded_eq(b"%zz", b"%zz"));
    }

    #[test]
    fn bytes_are_kept_exactly() {
        // Percent-encoded invalid UTF-8 is not U+FFFD: `%ff` and `%EF%BF%BD`
        // are two users.
        let ff = key(Sources::Query, "/?user=%ff", &[]).unwrap();
        let replacement = key(Sources::Query, "/?user=%EF%BF%BD", &[]).unwrap();
        assert_eq!(ff.1, b"\xff");
        assert_ne!(ff, replacement);
        // Raw non-ASCII header bytes decide; the query is not consulted.
        let raw = key(
            Sources::HeadersThenQuery,
            "/?user=victim",
            &[("x-user-id", b"\xc3\xa9\xff")],
        )
        .unwrap();
        assert_eq!(raw.1, b"\xc3\xa9\xff");
    }

    #[test]
    fn too_long_is_refused_never_replaced() {
        let long = vec![b'a'; DEFAULT_MAX_LEN + 1];
        let at_limit = vec![b'a'; DEFAULT_MAX_LEN];
        // A tenant too long is not `public`; a user too long is not the query's.
        assert_eq!(
            key(
                Sources::Headers,
                "/",
                &[("x-user-id", b"v"), ("x-tenant-id", &long)]
            ),
            Err(BadIdentity::TooLong {
                part: "tenant",
                max: DEFAULT_MAX_LEN
            })
        );
        assert_eq!(
            key(
                Sources::HeadersThenQuery,
                "/?user=victim",
                &[("x-user-id", &long)]
            ),
            Err(BadIdentity::TooLong {
                part: "user",
                max: DEFAULT_MAX_LEN
            })
        );
        assert!(key(Sources::Headers, "/", &[("x-user-id", &at_limit)]).is_ok());
        let (headers, uri) = request("/?user=abc", &[]);
        assert!(identity(Sources::Query)
            .max_len(2)
            .key(&headers, &uri)
            .is_err());
    }
}
