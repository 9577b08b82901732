//! A key longer than its extractor accepts is its own rejection, not a
//! missing key: `400` with its own title and detail over HTTP, a distinct
//! `INVALID_ARGUMENT` message over gRPC, whatever the missing-key policy.
#![cfg(feature = "http")]
#![allow(clippy::unwrap_used)]

use std::convert::Infallible;

use http::{Request, Response, StatusCode};
use tower::{service_fn, Layer, ServiceExt};
use tower_window::key::{Constant, Header, KeyExtractorExt, NoKey, Query, DEFAULT_MAX_LEN};
use tower_window::layer::{MissingKey, Rejection, SlidingWindowLayer};
use tower_window::{KeyExtractor, Limiter, MemoryStore, Quota};

fn limiter() -> Limiter {
    Limiter::new(MemoryStore::new(), "100/1m".parse::<Quota>().unwrap())
}

async fn ok(_: Request<String>) -> Result<Response<String>, Infallible> {
    Ok(Response::new("ok".to_owned()))
}

fn with_user(user: &[u8]) -> Request<String> {
    Request::builder()
        .uri("/")
        .header("x-user-id", user)
        .body(String::new())
        .unwrap()
}

fn anonymous() -> Request<String> {
    Request::builder().uri("/").body(String::new()).unwrap()
}

/// The case: a 1,025-byte `x-user-id` was "rate-limit key missing".
#[tokio::test]
async fn a_key_over_the_bound_is_400_key_too_long_not_missing() {
    let service =
        SlidingWindowLayer::new(limiter(), Header::new("x-user-id").unwrap()).layer(service_fn(ok));
    let too_long = vec![b'a'; DEFAULT_MAX_LEN + 1];
    let response = service.clone().oneshot(with_user(&too_long)).await.unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert!(!response.headers().contains_key("ratelimit"));
    let rejection = response.extensions().get::<Rejection>().unwrap();
    assert!(
        matches!(rejection, Rejection::KeyTooLong { max_len } if *max_len == DEFAULT_MAX_LEN),
        "{rejection:?}"
    );
    assert_eq!(rejection.title(), "Rate-limit key too long");
    assert_eq!(
        rejection.detail(),
        "the value that identifies who is calling is longer than 1024 bytes \
         (rate-limit key too long)"
    );

    let missing = service.clone().oneshot(anonymous()).await.unwrap();
    assert_eq!(missing.status(), StatusCode::BAD_REQUEST);
    let missing = missing.extensions().get::<Rejection>().unwrap();
    assert!(matches!(missing, Rejection::MissingKey { .. }));
    assert_ne!(missing.title(), rejection.title());
    assert_ne!(missing.detail(), rejection.detail());

    let at_bound = vec![b'a'; DEFAULT_MAX_LEN];
    let admitted = service.oneshot(with_user(&at_bound)).await.unwrap();
    assert_eq!(admitted.status(), StatusCode::OK);
}

/// `Skip` lets requests without a key through; one with a key that is too
/// long named itself, wrongly, and is refused.
#[tokio::test]
async fn a_key_too_long_is_refused_even_when_missing_keys_are_skipped() {
    let service = SlidingWindowLayer::new(limiter(), Header::new("x-user-id").unwrap())
        .on_missing_key(MissingKey::Skip)
        .layer(service_fn(ok));
    let response = service
        .clone()
        .oneshot(with_user(&[b'a'; 2000]))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert!(matches!(
        response.extensions().get::<Rejection>(),
        Some(Rejection::KeyTooLong { max_len: 1024 })
    ));
    assert_eq!(
        service.oneshot(anonymous()).await.unwrap().status(),
        StatusCode::OK
    );
}

#[test]
fn the_built_ins_and_combinators_say_why_there_is_no_key() {
    let header = Header::new("x-user-id").unwrap().max_len(4);
    assert_eq!(
        header.try_extract(&with_user(b"abcde")),
        Err(NoKey::TooLong { max_len: 4 })
    );
    assert_eq!(header.try_extract(&with_user(b"")), Err(NoKey::Missing));
    assert_eq!(header.try_extract(&anonymous()), Err(NoKey::Missing));
    assert_eq!(
        header.try_extract(&with_user(b"abcd")).unwrap().subject(),
        b"abcd"
    );

    let query = Query::new("user").max_len(4);
    let get = |uri: &str| query.try_extract(&Request::builder().uri(uri).body(()).unwrap());
    // Decoded length: `%41%41%41%41` is four bytes.
    assert_eq!(get("/?user=%41%41%41%41").unwrap().subject(), b"AAAA");
    assert_eq!(get("/?user=abcde"), Err(NoKey::TooLong { max_len: 4 }));
    assert_eq!(get("/?user="), Err(NoKey::Missing));
    assert_eq!(get("/?other=abcde"), Err(NoKey::Missing));

    // `or` still falls through to the second extractor; with none, too long wins.
    let or = Header::new("x-user-id")
        .unwrap()
        .max_len(4)
        .or(Header::new("x-api-key").unwrap());
    assert_eq!(
        or.try_extract(&with_user(b"abcde")),
        Err(NoKey::TooLong { max_len: 4 })
    );
    let or_constant = or.or(Constant::new("anyone"));
    assert_eq!(
        or_constant
            .try_extract(&with_user(b"abcde"))
            .unwrap()
            .subject(),
        b"anyone"
    );

    // A tenant missing and a subject too long: too long is the reason.
    let tenant = Header::new("x-user-id")
        .unwrap()
        .max_len(4)
        .with_tenant(Header::new("x-tenant-id").unwrap());
    assert_eq!(
        tenant.try_extract(&with_user(b"abcde")),
        Err(NoKey::TooLong { max_len: 4 })
    );
    assert_eq!(tenant.try_extract(&with_user(b"abcd")), Err(NoKey::Missing));

    // `try_extract(r).ok()` is always `extract(r)`.
    for request in [with_user(b"abcde"), with_user(b"abc"), anonymous()] {
        assert_eq!(tenant.try_extract(&request).ok(), tenant.extract(&request));
        assert_eq!(
            or_constant.try_extract(&request).ok(),
            or_constant.extract(&request)
        );
    }
    // A closure only knows "no key": missing.
    let closure = |_: &Request<String>| None;
    assert_eq!(closure.try_extract(&anonymous()), Err(NoKey::Missing));
    assert_eq!(
        NoKey::TooLong { max_len: 4 }.to_string(),
        "the rate-limit key is longer than 4 bytes"
    );
}

#[cfg(feature = "grpc")]
mod grpc {
    use tower_window::key::Metadata;

    use super::*;

    fn call(key: &str, value: &[u8]) -> Request<String> {
        Request::builder()
            .uri("/shop.Cart/Add")
            .header("content-type", "application/grpc")
            .header(key, value)
            .body(String::new())
            .unwrap()
    }

    fn message(response: &Response<String>) -> String {
        let raw = response.headers()["grpc-message"].to_str().unwrap();
        percent_decode(raw)
    }

    fn percent_decode(raw: &str) -> String {
        let bytes = raw.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] == b'%' {
                out.push(u8::from_str_radix(&raw[i + 1..i + 3], 16).unwrap());
                i += 3;
            } else {
                out.push(bytes[i]);
                i += 1;
            }
        }
        String::from_utf8(out).unwrap()
    }

    /// `INVALID_ARGUMENT`, like a missing key, with its own message.
    #[tokio::test]
    async fn a_metadata_key_too_long_is_invalid_argument_with_its_own_message() {
        let key = Metadata::new("x-api-key").unwrap();
        let service = SlidingWindowLayer::new(limiter(), key)
            .grpc()
            .layer(service_fn(ok));
        let too_long = service
            .clone()
            .oneshot(call("x-api-key", &[b'k'; DEFAULT_MAX_LEN + 1]))
            .await
            .unwrap();
        assert_eq!(too_long.headers()["grpc-status"], "3");
        assert_eq!(
            message(&too_long),
            "the value that identifies who is calling is longer than 1024 bytes \
             (rate-limit key too long)"
        );
        let missing = service
            .clone()
            .oneshot(call("x-other", b"k"))
            .await
            .unwrap();
        assert_eq!(missing.headers()["grpc-status"], "3");
        assert_eq!(
            message(&missing),
            "the request does not identify who is calling (rate-limit key missing)"
        );
        let admitted = service.oneshot(call("x-api-key", b"k")).await.unwrap();
        assert!(!admitted.headers().contains_key("grpc-status"));
    }

    #[tokio::test]
    async fn a_binary_key_too_long_once_decoded_is_too_long() {
        let key = Metadata::binary("x-token-bin").unwrap().max_len(3);
        // "AAECAw" is four bytes decoded; "AAEC" three; "@@" is not base64.
        let too_long = key.try_extract(&call("x-token-bin", b"AAECAw"));
        assert_eq!(too_long, Err(NoKey::TooLong { max_len: 3 }));
        let hopeless = key.try_extract(&call("x-token-bin", &[b'A'; 4000]));
        assert_eq!(hopeless, Err(NoKey::TooLong { max_len: 3 }));
        assert_eq!(
            key.try_extract(&call("x-token-bin", b"AAEC"))
                .unwrap()
                .subject(),
            [0, 1, 2]
        );
        assert_eq!(
            key.try_extract(&call("x-token-bin", b"@@")),
            Err(NoKey::Missing)
        );
        assert_eq!(
            key.try_extract(&call("x-token-bin", b"")),
            Err(NoKey::Missing)
        );
    }
}
