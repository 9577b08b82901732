//! Key extractors that need axum: path parameters and `ConnectInfo`.

use std::borrow::Cow;
use std::net::SocketAddr;

use axum::extract::{ConnectInfo, MatchedPath};
use percent_encoding::percent_decode_str;
use tower_window::key::{KeyExtractor, PeerIp, TrustedProxies, WindowKey};

/// Limits per value of a path parameter, e.g. per `{id}` of `/users/{id}`.
///
/// Reads the matched route's template ([`MatchedPath`], seen by every
/// layer since axum routes first) and takes the parameter's segment of the
/// request path, percent-decoded; a catch-all (`{*rest}`) takes the rest of
/// the path. Requests without a matched route or the parameter have no key.
///
/// ```
/// use axum::{routing::get, Router};
/// use axum_window_ext::PathParam;
/// use tower_window::{Limiter, MemoryStore, Quota};
///
/// let limiter = Limiter::new(MemoryStore::new(), "10/1m".parse::<Quota>().unwrap());
/// let user = get(|| async { "user" });
/// let app: Router = Router::new()
///     .route("/users/{id}", user.route_layer(axum_window_ext::layer(limiter, PathParam::new("id"))));
/// # let _ = app;
/// ```
#[derive(Debug, Clone)]
pub struct PathParam {
    name: Cow<'static, str>,
}

impl PathParam {
    /// The parameter written `{name}` (or `{*name}`) in the route.
    pub fn new(name: impl Into<Cow<'static, str>>) -> Self {
        Self { name: name.into() }
    }

    /// The parameter's raw (percent-encoded) value in `path` for `template`.
    fn find<'p>(&self, template: &str, path: &'p str) -> Option<Cow<'p, str>> {
        let template: Vec<&str> = template.trim_start_matches('/').split('/').collect();
        let path_segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let (index, prefix, suffix, catch_all) =
            template.iter().enumerate().find_map(|(i, segment)| {
                let (prefix, suffix, catch_all) = self.locate(segment)?;
                Some((i, prefix, suffix, catch_all))
            })?;
        // `Router::nest` strips the nest path from the URI but not from
        // `MatchedPath`: then line the segments up from the end.
        let offset = if catch_all || path_segments.len() >= template.len() {
            0
        } else {
            template.len() - path_segments.len()
        };
        let literals_agree = template
            .iter()
            .enumerate()
            .skip(offset)
            .take_while(|(_, segment)| !segment.starts_with("{*"))
            .all(|(i, segment)| {
                segment.contains('{') || path_segments.get(i - offset) == Some(segment)
            });
        if !literals_agree {
            return None;
        }
        let index = index.checked_sub(offset)?;
        if catch_all {
            // `{*rest}` is always the last segment; take the remainder.
            let rest = path_segments.get(index..)?.join("/");
            return (!rest.is_empty()).then_some(Cow::Owned(rest));
        }
        let segment = path_segments.get(index)?;
        let value = segment.strip_prefix(prefix)?.strip_suffix(suffix)?;
        (!value.is_empty()).then_some(Cow::Borrowed(value))
    }

    /// The literal text around `{name}` in `segment`, and whether it is a
    /// catch-all.
    fn locate<'t>(&self, segment: &'t str) -> Option<(&'t str, &'t str, bool)> {
        for (open, catch_all) in [("{", false), ("{*", true)] {
            let needle = format!("{open}{}}}", self.name);
            if let Some(start) = segment.find(&needle) {
                let prefix = &segment[..start];
                let suffix = &segment[start + needle.len()..];
                if prefix.ends_with('{') {
                    continue; // `{{name}}` is an escaped literal
                }
                return Some((prefix, suffix, catch_all));
            }
        }
        None
    }

    fn key(&self, extensions: &http::Extensions, uri: &http::Uri) -> Option<WindowKey> {
        let template = extensions.get::<MatchedPath>()?;
        let raw = self.find(template.as_str(), uri.path())?;
        let value: Vec<u8> = percent_decode_str(&raw).collect();
        Some(WindowKey::for_subject(value))
    }
}

impl<B> KeyExtractor<http::Request<B>> for PathParam {
    fn extract(&self, request: &http::Request<B>) -> Option<WindowKey> {
        self.key(request.extensions(), request.uri())
    }
}

impl KeyExtractor<http::request::Parts> for PathParam {
    fn extract(&self, parts: &http::request::Parts) -> Option<WindowKey> {
        self.key(&parts.extensions, &parts.uri)
    }
}

/// Limits per client IP address, read from axum's `ConnectInfo<SocketAddr>`
/// (serve with `into_make_service_with_connect_info::<SocketAddr>()`;
/// without it a request has no key), keyed as [`PeerIp`] keys it: behind
/// [`trusted_proxies`](Self::trusted_proxies), from `X-Forwarded-For`.
///
/// ```
/// use axum::{routing::get, Router};
/// use axum_window_ext::ConnectInfoIp;
/// use tower_window::{Limiter, MemoryStore, Quota};
///
/// let limiter = Limiter::new(MemoryStore::new(), "60/1m".parse::<Quota>().unwrap());
/// let app: Router = Router::new()
///     .route("/", get(|| async { "hi" }))
///     .layer(axum_window_ext::layer(limiter, ConnectInfoIp::new()));
/// // axum::serve(listener, app.into_make_service_with_connect_info::<std::net::SocketAddr>())
/// # let _ = app;
/// ```
#[derive(Debug, Clone, Default)]
pub struct ConnectInfoIp {
    peer: PeerIp,
}

impl ConnectInfoIp {
    /// The peer address is the client (no proxies trusted).
    pub fn new() -> Self {
        Self::default()
    }

    /// Trusts these proxies' `X-Forwarded-For` entries.
    pub fn trusted_proxies(self, proxies: TrustedProxies) -> Self {
        Self {
            peer: self.peer.trusted_proxies(proxies),
        }
    }

    /// See [`PeerIp::ipv6_prefix`].
    pub fn ipv6_prefix(self, prefix_len: u8) -> Self {
        Self {
            peer: self.peer.ipv6_prefix(prefix_len),
        }
    }
}

/// Reads `ConnectInfo<SocketAddr>` and keys it exactly as `peer` would.
impl From<PeerIp> for ConnectInfoIp {
    fn from(peer: PeerIp) -> Self {
        Self { peer }
    }
}

impl<B> KeyExtractor<http::Request<B>> for ConnectInfoIp {
    fn extract(&self, request: &http::Request<B>) -> Option<WindowKey> {
        let ConnectInfo(peer) = request.extensions().get::<ConnectInfo<SocketAddr>>()?;
        Some(self.peer.key_for(peer.ip(), request.headers()))
    }
}

impl KeyExtractor<http::request::Parts> for ConnectInfoIp {
    fn extract(&self, parts: &http::request::Parts) -> Option<WindowKey> {
        let ConnectInfo(peer) = parts.extensions.get::<ConnectInfo<SocketAddr>>()?;
        Some(self.peer.key_for(peer.ip(), &parts.headers))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn find(name: &'static str, template: &str, path: &str) -> Option<String> {
        PathParam::new(name)
            .find(template, path)
            .map(|v| v.into_owned())
    }

    #[test]
    fn finds_segments() {
        assert_eq!(
            find("id", "/users/{id}", "/users/42").as_deref(),
            Some("42")
        );
        assert_eq!(
            find("id", "/users/{id}/posts/{post}", "/users/a%20b/posts/7").as_deref(),
            Some("a%20b")
        );
        assert_eq!(
            find("post", "/users/{id}/posts/{post}", "/users/1/posts/7").as_deref(),
            Some("7")
        );
        assert_eq!(
            find("rest", "/files/{*rest}", "/files/a/b/c").as_deref(),
            Some("a/b/c")
        );
        assert_eq!(
            find("name", "/img/{name}.png", "/img/cat.png").as_deref(),
            Some("cat")
        );
        // stripped prefix (nested service)
        assert_eq!(
            find("id", "/api/users/{id}", "/users/9").as_deref(),
            Some("9")
        );
    }

    #[test]
    fn misses() {
        assert_eq!(find("id", "/users", "/users"), None);
        assert_eq!(find("other", "/users/{id}", "/users/42"), None);
        assert_eq!(find("id", "/users/{{id}}", "/users/42"), None);
        assert_eq!(find("id", "/users/{id}", "/users/"), None);
        assert_eq!(find("id", "/a/b/c/{id}", "/x/y"), None);
        assert_eq!(find("id", "/users/{id}", "/groups/42"), None);
        assert_eq!(find("rest", "/files/{*rest}", "/other/a/b"), None);
    }
}
