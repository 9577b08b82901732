//! Key extractors for gRPC calls: [`Metadata`] and [`GrpcMethod`]. A call
//! is an `http::Request` (metadata in the headers, `/package.Service/Method`
//! the path), so they read what the HTTP extractors read.

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine as _;
use http::header::HeaderMap;
use http::Uri;

use super::builtin::{bounded_key, Header, HttpRequest, DEFAULT_MAX_LEN};
use super::{KeyExtractor, NoKey, WindowKey};

/// A metadata key [`Metadata`] refuses.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid gRPC metadata key {key:?}: {reason}")]
pub struct InvalidMetadataKey {
    key: String,
    reason: &'static str,
}

crate::error_debug::debug_as_display!(InvalidMetadataKey);

impl InvalidMetadataKey {
    fn new(key: &str, reason: &'static str) -> Self {
        Self {
            key: key.chars().take(80).collect(),
            reason,
        }
    }
}

/// Base64 as gRPC sends binary metadata: receivers must accept it padded
/// or not.
const BINARY: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_encode_padding(false)
        .with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// The value of a gRPC call's metadata entry (the first one, if repeated).
///
/// An ASCII key ([`new`](Self::new)) is read as [`Header`] reads it. A
/// binary key ([`binary`](Self::binary)) is decoded from base64, padded or
/// not (one window for both spellings); a value that is not base64 is no
/// key. Keys follow gRPC's rules: lowercase letters, digits, `-`, `_` and
/// `.` (uppercase is lowercased), not starting with the reserved `grpc-`.
///
/// ```
/// use tower_window::key::{KeyExtractor, Metadata};
///
/// let key = Metadata::new("x-api-key")?;
/// let call = http::Request::builder().header("x-api-key", "k-1").body(()).unwrap();
/// assert_eq!(key.extract(&call).unwrap().subject(), b"k-1");
/// // A binary key must be asked for as such.
/// assert!(Metadata::new("x-token-bin").is_err());
/// let token = Metadata::binary("x-token-bin")?;
/// let call = http::Request::builder().header("x-token-bin", "AAEC").body(()).unwrap();
/// assert_eq!(token.extract(&call).unwrap().subject(), [0, 1, 2]);
/// # Ok::<(), tower_window::key::InvalidMetadataKey>(())
/// ```
#[derive(Debug, Clone)]
pub struct Metadata {
    header: Header,
    binary: bool,
}

impl Metadata {
    /// Keys calls by the ASCII metadata entry `key` (not ending in `-bin`).
    pub fn new(key: &str) -> Result<Self, InvalidMetadataKey> {
        Self::of_kind(key, false)
    }

    /// Keys calls by the decoded bytes of the binary metadata entry `key`,
    /// which must end in `-bin`.
    pub fn binary(key: &str) -> Result<Self, InvalidMetadataKey> {
        Self::of_kind(key, true)
    }

    fn of_kind(key: &str, binary: bool) -> Result<Self, InvalidMetadataKey> {
        let lower = key.to_ascii_lowercase();
        let valid = !lower.is_empty()
            && lower
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b));
        let reason = if !valid {
            "keys are lowercase letters, digits, '-', '_' and '.'"
        } else if lower.starts_with("grpc-") {
            "grpc- keys are reserved"
        } else if lower.ends_with("-bin") && !binary {
            "a binary (-bin) key holds base64; use Metadata::binary"
        } else if !lower.ends_with("-bin") && binary {
            "a binary key ends in -bin; use Metadata::new for an ASCII one"
        } else {
            let header = Header::new(&lower)
                .map_err(|_| InvalidMetadataKey::new(key, "not a header name"))?;
            return Ok(Self { header, binary });
        };
        Err(InvalidMetadataKey::new(key, reason))
    }

    /// Values longer than `max_len` bytes (decoded) give no key
    /// ([`NoKey::TooLong`]; default [`DEFAULT_MAX_LEN`]).
    pub fn max_len(mut self, max_len: usize) -> Self {
        self.header = self.header.max_len(max_len);
        self
    }

    /// The metadata key (lowercase).
    pub fn key(&self) -> &str {
        self.header.name().as_str()
    }

    /// Whether this is a binary (`-bin`) key, decoded from base64.
    pub fn is_binary(&self) -> bool {
        self.binary
    }

    fn key_of_headers(&self, headers: &HeaderMap) -> Result<WindowKey, NoKey> {
        if !self.binary {
            return self.header.key_of_headers(headers);
        }
        let encoded = headers
            .get(self.header.name())
            .ok_or(NoKey::Missing)?
            .as_bytes();
        let max_len = self.header.max_len;
        // Decoding never shrinks below 3/4 of the text: skip hopeless values.
        if encoded.len() / 4 * 3 > max_len.saturating_add(3) {
            return Err(NoKey::TooLong { max_len });
        }
        let decoded = BINARY.decode(encoded).map_err(|_| NoKey::Missing)?;
        bounded_key(&decoded, max_len)
    }
}

impl<R: HttpRequest> KeyExtractor<R> for Metadata {
    fn extract(&self, request: &R) -> Option<WindowKey> {
        self.try_extract(request).ok()
    }

    fn try_extract(&self, request: &R) -> Result<WindowKey, NoKey> {
        self.key_of_headers(request.parts().0)
    }
}

/// Which part of `/package.Service/Method` a [`GrpcMethod`] keys by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Part {
    #[default]
    Method,
    Service,
    Path,
}

/// The called gRPC method, from the request path `/package.Service/Method`.
/// A path that is not `/<service>/<method>` (ASCII letters, digits, `_`,
/// `-` and `.`, no `.` in the method, at most [`DEFAULT_MAX_LEN`] bytes)
/// gives no key.
///
/// ```
/// use tower_window::key::{GrpcMethod, KeyExtractor};
///
/// let call = http::Request::builder().uri("/shop.v1.Cart/AddItem").body(()).unwrap();
/// assert_eq!(GrpcMethod::new().extract(&call).unwrap().subject(), b"shop.v1.Cart.AddItem");
/// assert_eq!(GrpcMethod::service().extract(&call).unwrap().subject(), b"shop.v1.Cart");
/// assert_eq!(GrpcMethod::path().extract(&call).unwrap().subject(), b"/shop.v1.Cart/AddItem");
/// let not_grpc = http::Request::builder().uri("/index.html").body(()).unwrap();
/// assert!(GrpcMethod::new().extract(&not_grpc).is_none());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GrpcMethod {
    part: Part,
}

impl GrpcMethod {
    /// Keys calls by the method's full name, `package.Service.Method`: a
    /// valid [tenant name](crate::tenant::validate_tenant_name), to select a
    /// per-method policy from a [`TenantRegistry`](crate::tenant::TenantRegistry).
    pub fn new() -> Self {
        Self { part: Part::Method }
    }

    /// Keys calls by the service's full name, `package.Service`.
    pub fn service() -> Self {
        Self {
            part: Part::Service,
        }
    }

    /// Keys calls by the path as sent, `/package.Service/Method`.
    pub fn path() -> Self {
        Self { part: Part::Path }
    }

    fn key_of_uri(&self, uri: &Uri) -> Option<WindowKey> {
        let path = uri.path();
        let (service, method) = split_path(path)?;
        Some(match self.part {
            Part::Path => WindowKey::for_subject_copy(path.as_bytes()),
            Part::Service => WindowKey::for_subject_copy(service.as_bytes()),
            Part::Method => WindowKey::for_subject(format!("{service}.{method}")),
        })
    }
}

/// `/service/method` as `(service, method)`.
fn split_path(path: &str) -> Option<(&str, &str)> {
    if path.len() > DEFAULT_MAX_LEN {
        return None;
    }
    let (service, method) = path.strip_prefix('/')?.split_once('/')?;
    let name_byte = |b: u8| b.is_ascii_alphanumeric() || b"_-.".contains(&b);
    let ok = !service.is_empty()
        && !method.is_empty()
        && service.bytes().all(name_byte)
        && method.bytes().all(|b| b != b'.' && name_byte(b));
    ok.then_some((service, method))
}

impl<R: HttpRequest> KeyExtractor<R> for GrpcMethod {
    fn extract(&self, request: &R) -> Option<WindowKey> {
        self.key_of_uri(request.parts().1)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::key::{Constant, KeyExtractorExt};

    fn call(uri: &str, headers: &[(&str, &str)]) -> http::Request<()> {
        let mut builder = http::Request::builder().uri(uri);
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder.body(()).unwrap()
    }

    fn subject(key: Option<WindowKey>) -> Option<Vec<u8>> {
        key.map(|k| k.subject().to_vec())
    }

    #[test]
    fn metadata_keys_follow_grpc_rules() {
        assert_eq!(Metadata::new("X-Api-Key").unwrap().key(), "x-api-key");
        for bad in ["", "a b", "x/y", "ключ", "grpc-timeout", "Grpc-Foo"] {
            assert!(Metadata::new(bad).is_err(), "{bad}");
        }
        let error = Metadata::new("x-token-bin").unwrap_err();
        assert!(error.to_string().contains("Metadata::binary"), "{error}");
        let error = Metadata::binary("x-token").unwrap_err();
        assert!(error.to_string().contains("ends in -bin"), "{error}");
        assert!(Metadata::binary("X-Token-Bin").unwrap().is_binary());
    }

    #[test]
    fn ascii_metadata_reads_like_a_header() {
        let key = Metadata::new("x-user").unwrap();
        let req = call("/a.B/C", &[("x-user", "alice"), ("x-user", "bob")]);
        assert_eq!(subject(key.extract(&req)).unwrap(), b"alice");
        assert_eq!(subject(key.extract(&call("/", &[("x-user", "")]))), None);
        assert_eq!(subject(key.extract(&call("/", &[]))), None);
        let long = "x".repeat(DEFAULT_MAX_LEN + 1);
        assert_eq!(subject(key.extract(&call("/", &[("x-user", &long)]))), None);
        let (parts, ()) = req.into_parts();
        assert_eq!(subject(key.extract(&parts)).unwrap(), b"alice");
    }

    #[test]
    fn binary_metadata_is_decoded_padded_or_not() {
        let key = Metadata::binary("x-id-bin").unwrap();
        // b"\xff\x00" is "/wA" unpadded, "/wA=" padded: one window.
        let unpadded = subject(key.extract(&call("/", &[("x-id-bin", "/wA")])));
        let padded = subject(key.extract(&call("/", &[("x-id-bin", "/wA=")])));
        assert_eq!(unpadded.as_deref(), Some(&b"\xff\x00"[..]));
        assert_eq!(unpadded, padded);
        for bad in ["", "***", "/w=A", "-_-_"] {
            assert_eq!(
                subject(key.extract(&call("/", &[("x-id-bin", bad)]))),
                None,
                "{bad}"
            );
        }
        let short = key.clone().max_len(2);
        assert!(short.extract(&call("/", &[("x-id-bin", "AAEC")])).is_none());
        assert!(short.extract(&call("/", &[("x-id-bin", "AAE")])).is_some());
        let huge = "A".repeat(64 * 1024);
        assert!(key.extract(&call("/", &[("x-id-bin", &huge)])).is_none());
    }

    #[test]
    fn grpc_method_parses_only_method_paths() {
        let method = GrpcMethod::new();
        let get = |uri: &str| subject(method.extract(&call(uri, &[])));
        assert_eq!(
            get("/helloworld.Greeter/SayHello").unwrap(),
            b"helloworld.Greeter.SayHello"
        );
        assert_eq!(get("/Greeter/SayHello").unwrap(), b"Greeter.SayHello");
        for bad in [
            "/", "/a", "/a/", "//b", "/a/b/c", "/a/b.c", "/a%2Fb/c", "/a:b/c",
        ] {
            assert_eq!(get(bad), None, "{bad}");
        }
        let long = format!("/{}/M", "s".repeat(DEFAULT_MAX_LEN));
        assert_eq!(get(&long), None);
        let req = call("/pkg.Svc/Do?x=1", &[]);
        assert_eq!(
            subject(GrpcMethod::service().extract(&req)).unwrap(),
            b"pkg.Svc"
        );
        assert_eq!(
            subject(GrpcMethod::path().extract(&req)).unwrap(),
            b"/pkg.Svc/Do"
        );
        let (parts, ()) = req.into_parts();
        assert_eq!(subject(method.extract(&parts)).unwrap(), b"pkg.Svc.Do");
    }

    #[test]
    fn grpc_extractors_combine() {
        let key = Metadata::new("x-api-key")
            .unwrap()
            .or(Constant::new("anonymous"))
            .with_tenant(GrpcMethod::new());
        let with = key
            .extract(&call("/a.B/C", &[("x-api-key", "k1")]))
            .unwrap();
        assert_eq!((with.tenant(), with.subject()), (&b"a.B.C"[..], &b"k1"[..]));
        let without = key.extract(&call("/a.B/C", &[])).unwrap();
        assert_eq!(without.subject(), b"anonymous");
        assert!(key.extract(&call("/not-grpc", &[])).is_none());
        // The method's full name is a valid tenant name.
        let name = String::from_utf8(with.tenant().to_vec()).unwrap();
        assert!(crate::tenant::validate_tenant_name(&name).is_ok());
    }
}
