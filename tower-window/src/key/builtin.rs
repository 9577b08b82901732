//! Built-in key extractors for HTTP requests.
//!
//! Each implements [`KeyExtractor`] for `http::Request<B>` (any body) and for
//! `http::request::Parts`, and produces [`WindowKey::for_subject`] keys;
//! combine them with [`KeyExtractorExt`](super::KeyExtractorExt) for tenants
//! and fallbacks. [`Constant`](super::Constant) works for any request type.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName};
use http::{Extensions, Uri};

use super::{KeyExtractor, WindowKey};

/// The longest key value [`Header`] and [`Query`] accept by default, in bytes.
pub const DEFAULT_MAX_LEN: usize = 1024;

/// Implements `KeyExtractor` for `http::Request<B>` and `http::request::Parts`
/// through the type's `key_of_parts`.
macro_rules! http_extractor {
    ($ty:ty) => {
        impl<B> KeyExtractor<http::Request<B>> for $ty {
            fn extract(&self, request: &http::Request<B>) -> Option<WindowKey> {
                self.key_of_parts(request.headers(), request.uri(), request.extensions())
            }
        }

        impl KeyExtractor<http::request::Parts> for $ty {
            fn extract(&self, parts: &http::request::Parts) -> Option<WindowKey> {
                self.key_of_parts(&parts.headers, &parts.uri, &parts.extensions)
            }
        }
    };
}

/// A header name that is not valid (see [`Header::new`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid header name {0:?}")]
pub struct InvalidHeaderName(String);

/// The value of a request header (the first one, if repeated), as raw bytes.
///
/// An absent or empty header, or one longer than
/// [`max_len`](Self::max_len) ([`DEFAULT_MAX_LEN`] by default), gives no key.
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
    max_len: usize,
}

impl Header {
    /// Keys requests by the header `name` (any case), or fails if it is not
    /// a valid header name.
    pub fn new(name: &str) -> Result<Self, InvalidHeaderName> {
        let parsed = HeaderName::try_from(name)
            .map_err(|_| InvalidHeaderName(name.chars().take(80).collect()))?;
        Ok(Self::from_name(parsed))
    }

    /// Keys requests by the header `name` (already a valid name: cannot fail).
    pub fn from_name(name: HeaderName) -> Self {
        Self {
            name,
            max_len: DEFAULT_MAX_LEN,
        }
    }

    /// Values longer than `max_len` bytes give no key.
    pub fn max_len(mut self, max_len: usize) -> Self {
        self.max_len = max_len;
        self
    }

    /// The header's name.
    pub fn name(&self) -> &HeaderName {
        &self.name
    }

    fn key_of_parts(&self, headers: &HeaderMap, _: &Uri, _: &Extensions) -> Option<WindowKey> {
        self.key_of_headers(headers)
    }

    /// The longest value that gives a key, in bytes.
    #[cfg(feature = "grpc")]
    pub(super) fn max_len_bytes(&self) -> usize {
        self.max_len
    }

    pub(super) fn key_of_headers(&self, headers: &HeaderMap) -> Option<WindowKey> {
        let value = headers.get(&self.name)?.as_bytes();
        if value.is_empty() || value.len() > self.max_len {
            return None;
        }
        Some(WindowKey::for_subject_copy(value))
    }
}

http_extractor!(Header);

/// An IP address (or network) as text, written on the stack.
struct IpText {
    len: usize,
    buf: [u8; super::INLINE_PART],
}

impl Default for IpText {
    fn default() -> Self {
        Self {
            len: 0,
            buf: [0; super::INLINE_PART],
        }
    }
}

impl IpText {
    fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl fmt::Write for IpText {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self.len + s.len();
        self.buf
            .get_mut(self.len..end)
            .ok_or(fmt::Error)?
            .copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// The URL-decoded value of a query parameter (its first occurrence).
///
/// `+` decodes to a space and `%XX` to its byte; malformed escapes are kept
/// as they are. An absent or empty parameter, or a value longer than
/// [`max_len`](Self::max_len) ([`DEFAULT_MAX_LEN`] by default), gives no key.
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

    /// Values longer than `max_len` bytes (decoded) give no key.
    pub fn max_len(mut self, max_len: usize) -> Self {
        self.max_len = max_len;
        self
    }

    fn key_of_parts(&self, _: &HeaderMap, uri: &Uri, _: &Extensions) -> Option<WindowKey> {
        let query = uri.query()?;
        for pair in query.as_bytes().split(|&b| b == b'&') {
            let (name, value) = match pair.iter().position(|&b| b == b'=') {
                Some(eq) => (&pair[..eq], &pair[eq + 1..]),
                None => (pair, &[][..]),
            };
            if *url_decode(name) != *self.param.as_bytes() {
                continue;
            }
            let value = url_decode(value);
            if value.is_empty() || value.len() > self.max_len {
                return None;
            }
            return Some(WindowKey::for_subject_copy(&value));
        }
        None
    }
}

http_extractor!(Query);

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
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        b'A'..=b'F' => Some(digit - b'A' + 10),
        _ => None,
    }
}

/// A key computed from a request extension of type `T`, for example one that
/// an authentication layer inserted. No such extension, no key.
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
    /// Keys requests by `subject(extension)`; `subject` returns anything
    /// convertible into [`Bytes`] (`String`, `Vec<u8>`, `&'static str`, ...).
    pub fn new(subject: F) -> Self {
        Self {
            subject,
            _extension: PhantomData,
        }
    }

    fn key_of_extension<V>(&self, extensions: &Extensions) -> Option<WindowKey>
    where
        T: Send + Sync + 'static,
        F: Fn(&T) -> V,
        V: Into<Bytes>,
    {
        let extension = extensions.get::<T>()?;
        Some(WindowKey::for_subject((self.subject)(extension)))
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

impl<T, F, V, B> KeyExtractor<http::Request<B>> for Extension<T, F>
where
    T: Send + Sync + 'static,
    F: Fn(&T) -> V + Send + Sync,
    V: Into<Bytes>,
{
    fn extract(&self, request: &http::Request<B>) -> Option<WindowKey> {
        self.key_of_extension(request.extensions())
    }
}

impl<T, F, V> KeyExtractor<http::request::Parts> for Extension<T, F>
where
    T: Send + Sync + 'static,
    F: Fn(&T) -> V + Send + Sync,
    V: Into<Bytes>,
{
    fn extract(&self, parts: &http::request::Parts) -> Option<WindowKey> {
        self.key_of_extension(&parts.extensions)
    }
}

/// The client's IP address, from a `std::net::SocketAddr` (or `IpAddr`)
/// request extension holding the peer address, as servers insert it.
///
/// Without [`trusted_proxies`](Self::trusted_proxies) the peer address is
/// the key and `X-Forwarded-For` is ignored (any client can send it). With
/// them, see [`TrustedProxies::client_ip`]. The key's subject is the address
/// in text form (`192.0.2.7`, `2001:db8::1`), or the network for IPv6 with
/// [`ipv6_prefix`](Self::ipv6_prefix) (`2001:db8::/64`). (axum's
/// `ConnectInfo<SocketAddr>` is a different type; `axum-window-ext` reads it.)
///
/// ```
/// use std::net::SocketAddr;
/// use tower_window::key::{KeyExtractor, PeerIp, TrustedProxies};
///
/// let key = PeerIp::new().trusted_proxies("10.0.0.0/8".parse().unwrap());
/// let mut request = http::Request::builder()
///     .header("x-forwarded-for", "203.0.113.9, 198.51.100.4, 10.0.0.2")
///     .body(())
///     .unwrap();
/// request.extensions_mut().insert("10.0.0.1:4711".parse::<SocketAddr>().unwrap());
/// assert_eq!(key.extract(&request).unwrap().subject(), b"198.51.100.4");
/// ```
#[derive(Debug, Clone)]
pub struct PeerIp {
    proxies: Option<TrustedProxies>,
    ipv6_prefix: u8,
}

impl Default for PeerIp {
    fn default() -> Self {
        Self::new()
    }
}

impl PeerIp {
    /// Keys requests by the peer address, trusting no proxy.
    pub fn new() -> Self {
        Self {
            proxies: None,
            ipv6_prefix: 128,
        }
    }

    /// Walks `X-Forwarded-For` through these proxies (see [`TrustedProxies::client_ip`]).
    pub fn trusted_proxies(mut self, proxies: TrustedProxies) -> Self {
        self.proxies = Some(proxies);
        self
    }

    /// Keys IPv6 clients by their network of this prefix length (at most 128,
    /// the default) rather than by address: one host usually has a whole /64.
    pub fn ipv6_prefix(mut self, prefix_len: u8) -> Self {
        self.ipv6_prefix = prefix_len.min(128);
        self
    }

    /// The client address for a connection from `peer` carrying `headers`.
    pub fn client_ip(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        match &self.proxies {
            Some(proxies) => proxies.client_ip(peer, headers),
            None => peer.to_canonical(),
        }
    }

    /// The key for a connection from `peer` carrying `headers` (for servers
    /// that keep the peer address elsewhere than in a request extension).
    pub fn key_for(&self, peer: IpAddr, headers: &HeaderMap) -> WindowKey {
        // Written on the stack and held inline in the key: no allocation.
        fn write_ip(out: &mut impl fmt::Write, ip: IpAddr, ipv6_prefix: u8) -> fmt::Result {
            match ip {
                IpAddr::V6(ip) if ipv6_prefix < 128 => {
                    let masked = Ipv6Addr::from(u128::from(ip) & mask_v6(ipv6_prefix));
                    write!(out, "{masked}/{ipv6_prefix}")
                }
                ip => write!(out, "{ip}"),
            }
        }
        let ip = self.client_ip(peer, headers);
        let mut text = IpText::default();
        match write_ip(&mut text, ip, self.ipv6_prefix) {
            Ok(()) => WindowKey::for_subject_copy(text.as_bytes()),
            // Longer than the stack buffer (no address is): on the heap.
            Err(fmt::Error) => {
                let mut owned = String::new();
                let _ = write_ip(&mut owned, ip, self.ipv6_prefix);
                WindowKey::for_subject(owned)
            }
        }
    }

    fn key_of_parts(
        &self,
        headers: &HeaderMap,
        _: &Uri,
        extensions: &Extensions,
    ) -> Option<WindowKey> {
        let peer = match extensions.get::<SocketAddr>() {
            Some(addr) => addr.ip(),
            None => *extensions.get::<IpAddr>()?,
        };
        Some(self.key_for(peer, headers))
    }
}

http_extractor!(PeerIp);

/// The most `X-Forwarded-For` entries [`TrustedProxies::client_ip`] examines.
const MAX_HOPS: usize = 32;

/// The proxies whose `X-Forwarded-For` entries are believed: a list of IP
/// networks (`10.0.0.0/8`, `2001:db8::/32`) and addresses (`192.0.2.1`).
///
/// Parse one from a comma- or space-separated list, or build it with
/// [`trust`](Self::trust). IPv4-mapped IPv6 addresses (`::ffff:10.0.0.1`)
/// count as their IPv4 address.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies {
    networks: Vec<Network>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Network {
    addr: IpAddr,
    prefix_len: u8,
}

impl Network {
    fn new(addr: IpAddr, prefix_len: u8) -> Option<Self> {
        let addr = addr.to_canonical();
        let addr = match addr {
            IpAddr::V4(v4) if prefix_len <= 32 => {
                IpAddr::V4(Ipv4Addr::from(u32::from(v4) & mask_v4(prefix_len)))
            }
            IpAddr::V6(v6) if prefix_len <= 128 => {
                IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask_v6(prefix_len)))
            }
            _ => return None,
        };
        Some(Self { addr, prefix_len })
    }

    fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                u32::from(ip) & mask_v4(self.prefix_len) == u32::from(net)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                u128::from(ip) & mask_v6(self.prefix_len) == u128::from(net)
            }
            _ => false,
        }
    }
}

fn mask_v4(prefix_len: u8) -> u32 {
    u32::MAX
        .checked_shl(32 - u32::from(prefix_len.min(32)))
        .unwrap_or(0)
}

fn mask_v6(prefix_len: u8) -> u128 {
    u128::MAX
        .checked_shl(128 - u32::from(prefix_len.min(128)))
        .unwrap_or(0)
}

/// A trusted-proxy network that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid trusted proxy network {input:?}: {reason}")]
pub struct InvalidNetwork {
    input: String,
    reason: &'static str,
}

impl TrustedProxies {
    /// Trusts no proxy: the peer address is always the client's.
    pub fn new() -> Self {
        Self::default()
    }

    /// Trusts loopback and private networks (`127.0.0.0/8`, `10.0.0.0/8`,
    /// `172.16.0.0/12`, `192.168.0.0/16`, `::1/128`, `fc00::/7`), where
    /// load balancers usually live.
    pub fn private_networks() -> Self {
        let networks = [
            (IpAddr::V4(Ipv4Addr::new(127, 0, 0, 0)), 8),
            (IpAddr::V4(Ipv4Addr::new(10, 0, 0, 0)), 8),
            (IpAddr::V4(Ipv4Addr::new(172, 16, 0, 0)), 12),
            (IpAddr::V4(Ipv4Addr::new(192, 168, 0, 0)), 16),
            (IpAddr::V6(Ipv6Addr::LOCALHOST), 128),
            (IpAddr::V6(Ipv6Addr::new(0xfc00, 0, 0, 0, 0, 0, 0, 0)), 7),
        ];
        Self {
            networks: networks
                .into_iter()
                .filter_map(|(addr, len)| Network::new(addr, len))
                .collect(),
        }
    }

    /// Also trusts `network`: an address or `address/prefix-length`.
    pub fn trust(mut self, network: &str) -> Result<Self, InvalidNetwork> {
        self.networks.push(parse_network(network)?);
        Ok(self)
    }

    /// Whether `ip` is a trusted proxy.
    pub fn is_trusted(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.networks.iter().any(|net| net.contains(ip))
    }

    /// The client address of a connection from `peer` carrying `headers`.
    ///
    /// If `peer` is not trusted, it is the client. Otherwise the
    /// `X-Forwarded-For` entries (all header lines, in order) are walked from
    /// the right, the end the trusted proxies appended to, skipping trusted
    /// addresses: the first untrusted entry is the client. Entries to its left
    /// were written by the client and are never believed. An entry that is not
    /// an IP address (`unknown`, garbage, non-UTF-8) stops the walk, and so do
    /// more than 32 entries: then the last trusted address seen is returned.
    /// If every entry is trusted, the left-most is returned.
    pub fn client_ip(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let mut current = peer.to_canonical();
        if !self.is_trusted(current) {
            return current;
        }
        let hops = headers
            .get_all("x-forwarded-for")
            .iter()
            .rev()
            .flat_map(|line| line.as_bytes().rsplit(|&b| b == b','));
        for (seen, entry) in hops.enumerate() {
            if seen >= MAX_HOPS {
                break;
            }
            let Some(ip) = parse_hop(entry) else { break };
            if !self.is_trusted(ip) {
                return ip;
            }
            current = ip;
        }
        current
    }
}

impl FromStr for TrustedProxies {
    type Err = InvalidNetwork;

    /// A comma- or whitespace-separated list of networks and addresses.
    fn from_str(list: &str) -> Result<Self, Self::Err> {
        list.split(|c: char| c == ',' || c.is_whitespace())
            .filter(|item| !item.is_empty())
            .try_fold(Self::new(), |proxies, item| proxies.trust(item))
    }
}

fn parse_network(input: &str) -> Result<Network, InvalidNetwork> {
    let error = |reason| InvalidNetwork {
        input: input.chars().take(64).collect(),
        reason,
    };
    let (addr, prefix_len) = match input.trim().split_once('/') {
        Some((addr, len)) => (
            addr,
            Some(len.parse::<u8>().map_err(|_| error("bad prefix length"))?),
        ),
        None => (input.trim(), None),
    };
    let addr: IpAddr = addr.parse().map_err(|_| error("not an IP address"))?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let prefix_len = prefix_len.unwrap_or(max);
    if prefix_len > max {
        return Err(error("prefix length too long for the address family"));
    }
    // An IPv4-mapped network (`::ffff:10.0.0.0/104`) is stored as IPv4.
    let (addr, prefix_len) = match (addr, addr.to_canonical()) {
        (IpAddr::V6(_), IpAddr::V4(v4)) if prefix_len >= 96 => (IpAddr::V4(v4), prefix_len - 96),
        _ => (addr, prefix_len),
    };
    Network::new(addr, prefix_len).ok_or_else(|| error("bad prefix length"))
}

/// One `X-Forwarded-For` entry: an address, optionally with a port
/// (`192.0.2.1:8080`, `[2001:db8::1]:443`) or in brackets.
fn parse_hop(entry: &[u8]) -> Option<IpAddr> {
    let entry = std::str::from_utf8(entry).ok()?.trim();
    if entry.len() > 64 {
        return None;
    }
    let ip = entry
        .parse::<IpAddr>()
        .ok()
        .or_else(|| entry.parse::<SocketAddr>().ok().map(|addr| addr.ip()))
        .or_else(|| {
            entry
                .strip_prefix('[')
                .and_then(|e| e.strip_suffix(']'))
                .and_then(|e| e.parse::<Ipv6Addr>().ok())
                .map(IpAddr::V6)
        })?;
    Some(ip.to_canonical())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use http::HeaderValue;

    use super::*;
    use crate::key::Constant;

    fn subject(key: Option<WindowKey>) -> Option<Vec<u8>> {
        key.map(|k| k.subject().to_vec())
    }

    fn request(uri: &str, headers: &[(&str, &[u8])]) -> http::Request<()> {
        let mut request = http::Request::builder().uri(uri).body(()).unwrap();
        for (name, value) in headers {
            request.headers_mut().append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_bytes(value).unwrap(),
            );
        }
        request
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn xff(values: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append("x-forwarded-for", HeaderValue::from_str(value).unwrap());
        }
        headers
    }

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
    fn peer_ip_without_proxies_ignores_forwarded_for() {
        let key = PeerIp::new();
        let mut req = request("/", &[("x-forwarded-for", b"1.1.1.1")]);
        assert!(key.extract(&req).is_none());
        req.extensions_mut()
            .insert(SocketAddr::from(([192, 0, 2, 7], 5000)));
        assert_eq!(subject(key.extract(&req)).unwrap(), b"192.0.2.7");

        let mut req = request("/", &[]);
        req.extensions_mut().insert(ip("::ffff:192.0.2.8"));
        assert_eq!(subject(key.extract(&req)).unwrap(), b"192.0.2.8");
    }

    #[test]
    fn peer_ip_groups_ipv6_by_prefix() {
        let key = PeerIp::new().ipv6_prefix(64);
        let k = key.key_for(ip("2001:db8:1:2:3:4:5:6"), &HeaderMap::new());
        assert_eq!(k.subject(), b"2001:db8:1:2::/64");
        let k = key.key_for(ip("192.0.2.1"), &HeaderMap::new());
        assert_eq!(k.subject(), b"192.0.2.1");
        let k = PeerIp::new()
            .ipv6_prefix(0)
            .key_for(ip("2001:db8::1"), &HeaderMap::new());
        assert_eq!(k.subject(), b"::/0");
        let k = PeerIp::new()
            .ipv6_prefix(200)
            .key_for(ip("2001:db8::1"), &HeaderMap::new());
        assert_eq!(k.subject(), b"2001:db8::1");
    }

    #[test]
    fn untrusted_peer_is_the_client() {
        let proxies: TrustedProxies = "10.0.0.0/8".parse().unwrap();
        let headers = xff(&["10.0.0.1"]);
        assert_eq!(
            proxies.client_ip(ip("203.0.113.1"), &headers),
            ip("203.0.113.1")
        );
    }

    #[test]
    fn forwarded_for_is_walked_from_the_right() {
        let proxies: TrustedProxies = "10.0.0.0/8, 192.168.1.1".parse().unwrap();
        let peer = ip("10.0.0.1");
        // The client spoofed a left-most entry; the right-most untrusted one wins.
        let headers = xff(&["6.6.6.6, 198.51.100.4, 192.168.1.1"]);
        assert_eq!(proxies.client_ip(peer, &headers), ip("198.51.100.4"));
        // A spoofed trusted-looking entry to the left of the client does not help.
        let headers = xff(&["10.9.9.9, 198.51.100.4"]);
        assert_eq!(proxies.client_ip(peer, &headers), ip("198.51.100.4"));
        // Several header lines form one list, in order.
        let headers = xff(&["6.6.6.6", "198.51.100.5", "10.0.0.3"]);
        assert_eq!(proxies.client_ip(peer, &headers), ip("198.51.100.5"));
        // Ports, brackets, spaces and IPv4-mapped addresses.
        let headers = xff(&["[2001:db8::9]:443 ,  ::ffff:10.1.1.1 ,10.0.0.2:8080"]);
        assert_eq!(proxies.client_ip(peer, &headers), ip("2001:db8::9"));
        let headers = xff(&["[2001:db8::8]"]);
        assert_eq!(proxies.client_ip(peer, &headers), ip("2001:db8::8"));
    }

    #[test]
    fn forwarded_for_without_untrusted_entries() {
        let proxies: TrustedProxies = "10.0.0.0/8".parse().unwrap();
        let peer = ip("10.0.0.1");
        assert_eq!(proxies.client_ip(peer, &HeaderMap::new()), peer);
        let headers = xff(&["10.0.0.7, 10.0.0.8"]);
        assert_eq!(proxies.client_ip(peer, &headers), ip("10.0.0.7"));
    }

    #[test]
    fn hostile_forwarded_for_stops_the_walk() {
        let proxies: TrustedProxies = "10.0.0.0/8".parse().unwrap();
        let peer = ip("10.0.0.1");
        for value in [
            "1.2.3.4, unknown",
            "1.2.3.4, ",
            "1.2.3.4,,",
            "",
            "1.2.3.4, 999.1.1.1",
            "1.2.3.4, 10.0.0.2 10.0.0.3",
        ] {
            assert_eq!(proxies.client_ip(peer, &xff(&[value])), peer, "{value:?}");
        }
        // Garbage after a trusted hop: the last trusted address seen.
        let headers = xff(&["1.2.3.4, garbage, 10.0.0.5"]);
        assert_eq!(proxies.client_ip(peer, &headers), ip("10.0.0.5"));
        // Non-UTF-8 bytes.
        let mut headers = HeaderMap::new();
        headers.append(
            "x-forwarded-for",
            HeaderValue::from_bytes(b"1.2.3.4, \xff\xfe").unwrap(),
        );
        assert_eq!(proxies.client_ip(peer, &headers), peer);
        // A huge list of trusted hops is cut off.
        let long = vec!["10.0.0.9"; 10_000].join(",");
        let headers = xff(&[&format!("6.6.6.6,{long}")]);
        assert_eq!(proxies.client_ip(peer, &headers), ip("10.0.0.9"));
        // A huge entry.
        let headers = xff(&[&"9".repeat(100_000)]);
        assert_eq!(proxies.client_ip(peer, &headers), peer);
    }

    #[test]
    fn peer_ip_uses_trusted_proxies() {
        let key = PeerIp::new().trusted_proxies(TrustedProxies::private_networks());
        let mut req = request("/", &[("x-forwarded-for", b"6.6.6.6, 198.51.100.4")]);
        req.extensions_mut()
            .insert(SocketAddr::from(([127, 0, 0, 1], 1)));
        assert_eq!(subject(key.extract(&req)).unwrap(), b"198.51.100.4");
    }

    #[test]
    fn trusted_proxies_parse() {
        let proxies: TrustedProxies = " 10.0.0.0/8,192.168.0.1 fd00::/8 ::ffff:172.16.0.0/108"
            .parse()
            .unwrap();
        assert!(proxies.is_trusted(ip("10.255.0.1")));
        assert!(proxies.is_trusted(ip("::ffff:10.0.0.1")));
        assert!(proxies.is_trusted(ip("192.168.0.1")));
        assert!(!proxies.is_trusted(ip("192.168.0.2")));
        assert!(proxies.is_trusted(ip("fd12::1")));
        assert!(proxies.is_trusted(ip("172.31.255.255")));
        assert!(!proxies.is_trusted(ip("172.32.0.0")));
        assert!(!proxies.is_trusted(ip("11.0.0.1")));
        assert_eq!("".parse::<TrustedProxies>().unwrap(), TrustedProxies::new());
        let all: TrustedProxies = "0.0.0.0/0".parse().unwrap();
        assert!(all.is_trusted(ip("8.8.8.8")));
        assert!(!all.is_trusted(ip("::2")));
        for bad in [
            "10.0.0.0/33",
            "::/129",
            "10.0.0.0/x",
            "foo",
            "10.0.0.0/",
            "/8",
            "1.2.3.4/-1",
        ] {
            let error = bad.parse::<TrustedProxies>().unwrap_err();
            assert!(
                error.to_string().contains("invalid trusted proxy"),
                "{bad}: {error}"
            );
        }
        assert!(TrustedProxies::new()
            .trust("1.2.3.4")
            .unwrap()
            .is_trusted(ip("1.2.3.4")));
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
