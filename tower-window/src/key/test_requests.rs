//! Requests and subjects for the HTTP extractors' unit tests.
#![allow(clippy::unwrap_used)]

use http::header::HeaderName;
use http::HeaderValue;

use super::WindowKey;

/// The subject of an extracted key, as bytes.
pub(crate) fn subject(key: Option<WindowKey>) -> Option<Vec<u8>> {
    key.map(|k| k.subject().to_vec())
}

/// A request for `uri` carrying `headers` (repeated names appended).
pub(crate) fn request(uri: &str, headers: &[(&str, &[u8])]) -> http::Request<()> {
    let mut request = http::Request::builder().uri(uri).body(()).unwrap();
    for (name, value) in headers {
        request.headers_mut().append(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_bytes(value).unwrap(),
        );
    }
    request
}
