//! Keys by the client's network address: [`PeerIp`] and [`TrustedProxies`].

use std::io::{Cursor, Write as _};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

use http::header::HeaderMap;

use super::builtin::HttpRequest;
use super::{KeyExtractor, NoKey, WindowKey};

/// The client's IP address, from the peer address servers insert as a
/// `SocketAddr` (or `IpAddr`) request extension (axum's `ConnectInfo` is
/// read by `axum-window-ext`).
///
/// `X-Forwarded-For` is ignored unless [`trusted_proxies`](Self::trusted_proxies)
/// are set. The subject is the address as text (`192.0.2.7`), or for IPv6
/// with [`ipv6_prefix`](Self::ipv6_prefix) the network (`2001:db8::/64`).
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
    proxies: TrustedProxies,
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
            proxies: TrustedProxies::new(),
            ipv6_prefix: 128,
        }
    }

    /// Walks `X-Forwarded-For` through these proxies (see [`TrustedProxies::client_ip`]).
    pub fn trusted_proxies(mut self, proxies: TrustedProxies) -> Self {
        self.proxies = proxies;
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
        self.proxies.client_ip(peer, headers)
    }

    /// The key for a connection from `peer` carrying `headers` (for servers
    /// that keep the peer address elsewhere than in a request extension).
    pub fn key_for(&self, peer: IpAddr, headers: &HeaderMap) -> WindowKey {
        // Written on the stack and held inline in the key: no allocation.
        let mut text = Cursor::new([0; super::INLINE_PART]);
        let _ = match (self.client_ip(peer, headers), self.ipv6_prefix) {
            (ip @ IpAddr::V6(_), prefix) if prefix < 128 => {
                let network = masked(ip, prefix).unwrap_or(ip);
                write!(text, "{network}/{prefix}")
            }
            (ip, _) => write!(text, "{ip}"),
        };
        let len = text.position() as usize;
        WindowKey::for_subject_copy(&text.get_ref()[..len])
    }
}

impl<R: HttpRequest> KeyExtractor<R> for PeerIp {
    fn extract(&self, request: &R) -> Option<WindowKey> {
        self.try_extract(request).ok()
    }

    fn try_extract(&self, request: &R) -> Result<WindowKey, NoKey> {
        let (headers, _, extensions) = request.parts();
        let peer = match extensions.get::<SocketAddr>() {
            Some(addr) => addr.ip(),
            None => *extensions.get::<IpAddr>().ok_or(NoKey::Missing)?,
        };
        Ok(self.key_for(peer, headers))
    }
}

/// The most `X-Forwarded-For` entries [`TrustedProxies::client_ip`] examines.
const MAX_HOPS: usize = 32;

/// The proxies whose `X-Forwarded-For` entries are believed: IP networks
/// (`10.0.0.0/8`) and addresses (`192.0.2.1`), parsed from a comma- or
/// space-separated list or added with [`trust`](Self::trust). IPv4-mapped
/// IPv6 addresses count as their IPv4 address.
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
        let addr = masked(addr.to_canonical(), prefix_len)?;
        Some(Self { addr, prefix_len })
    }

    fn contains(&self, ip: IpAddr) -> bool {
        // An address of the other family never masks to this network.
        masked(ip, self.prefix_len) == Some(self.addr)
    }
}

/// `addr` with all but its first `prefix_len` bits cleared; `None` when
/// the prefix is longer than the address.
fn masked(addr: IpAddr, prefix_len: u8) -> Option<IpAddr> {
    let bits = u32::from(prefix_len);
    match addr {
        IpAddr::V4(v4) if bits <= 32 => {
            let mask = u32::MAX.checked_shl(32 - bits).unwrap_or(0);
            Some(Ipv4Addr::from_bits(v4.to_bits() & mask).into())
        }
        IpAddr::V6(v6) if bits <= 128 => {
            let mask = u128::MAX.checked_shl(128 - bits).unwrap_or(0);
            Some(Ipv6Addr::from_bits(v6.to_bits() & mask).into())
        }
        _ => None,
    }
}

/// A trusted-proxy network that could not be parsed.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid trusted proxy network {input:?}: {reason}")]
pub struct InvalidNetwork {
    input: String,
    reason: &'static str,
}

crate::error_debug::debug_as_display!(InvalidNetwork);

impl TrustedProxies {
    /// Trusts no proxy: the peer address is always the client's.
    pub fn new() -> Self {
        Self::default()
    }

    /// Trusts loopback and private networks: `127.0.0.0/8`, `10.0.0.0/8`,
    /// `172.16.0.0/12`, `192.168.0.0/16`, `::1/128` and `fc00::/7`.
    pub fn private_networks() -> Self {
        // Valid networks: the parse cannot fail.
        "127.0.0.0/8 10.0.0.0/8 172.16.0.0/12 192.168.0.0/16 ::1/128 fc00::/7"
            .parse()
            .unwrap_or_default()
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
    /// An untrusted `peer` is the client. Otherwise `X-Forwarded-For` (all
    /// lines, in order) is walked from the right, the end trusted proxies
    /// append to: the first untrusted entry is the client (entries left of
    /// it are the client's own, never believed). An entry that is not an IP
    /// address, or more than 32 entries, stops the walk at the last trusted
    /// address seen; if every entry is trusted, the left-most is returned.
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
    use crate::key::test_requests::{request, subject};

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
}
