//! The layer in `Grpc` mode (issue 25), through `tower::ServiceExt::oneshot`:
//! the trailers-only answers a gRPC client reads as a status, their
//! `google.rpc.RetryInfo` details decoded from the wire bytes, and the
//! `RateLimit` metadata. CI also runs this file with `--no-default-features
//! --features grpc`. Time is a `ManualClock`; nothing sleeps.

#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::time::Duration;

use base64::Engine as _;
use http::{HeaderMap, Request, Response};
use prost::Message as _;
use tower::{service_fn, Layer, ServiceExt};
use tower_window::fallback::FailClosed;
use tower_window::key::{GrpcMethod, KeyExtractorExt, Metadata};
use tower_window::layer::{Grpc, GrpcCode, MissingKey, Rejection, SlidingWindowLayer, Status};
use tower_window::store::{Backend, Guard, Op};
use tower_window::tenant::{TenantRegistry, TenantSpec, TenantsConfig};
use tower_window::{
    limit, CheckRequest, Decision, Limiter, ManualClock, MemoryStore, Quota, RetryConfig, Store,
    StoreError, StoreErrorKind,
};

/// Answers every check with a denial waiting `retry_after`.
struct DenyingStore(Option<Duration>);

impl limit::Backend for DenyingStore {
    fn check<'a>(&'a self, _: &mut Guard<'a>, request: CheckRequest<'a>) -> Op<'static, Decision> {
        let quota = request.policy.first().clone();
        Op::ready(Ok(Decision::deny(
            quota,
            0,
            Duration::from_secs(60),
            self.0,
        )))
    }
}

/// Always fails.
struct FailingStore;

impl limit::Backend for FailingStore {
    fn check<'a>(&'a self, guard: &mut Guard<'a>, _: CheckRequest<'a>) -> Op<'static, Decision> {
        guard.run(|| async {
            Err(StoreError::new(
                StoreErrorKind::Unavailable,
                "connection refused",
            ))
        })
    }
}

fn quota(dsl: &str) -> Quota {
    dsl.parse().unwrap()
}

fn call(path: &str, api_key: Option<&str>) -> Request<String> {
    let mut builder = Request::builder()
        .method("POST")
        .uri(path)
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(key) = api_key {
        builder = builder.header("x-api-key", key);
    }
    builder.body(String::new()).unwrap()
}

/// Echoes whether the handler saw the decision.
async fn handler(request: Request<String>) -> Result<Response<String>, Infallible> {
    let body = match request.extensions().get::<Decision>() {
        Some(decision) => format!("remaining={}", decision.remaining()),
        None => "no decision".to_owned(),
    };
    let mut response = Response::new(body);
    response
        .headers_mut()
        .insert("content-type", "application/grpc".parse().unwrap());
    Ok(response)
}

fn layer(limiter: Limiter) -> SlidingWindowLayer<Metadata, tower_window::layer::UnitCost, Grpc> {
    SlidingWindowLayer::new(limiter, Metadata::new("x-api-key").unwrap()).grpc()
}

/// The `google.rpc.Status` of `grpc-status-details-bin`, decoded from the
/// wire (base64 without padding, as gRPC writes it).
fn details(headers: &HeaderMap) -> Option<tonic_types::pb::Status> {
    let text = headers.get("grpc-status-details-bin")?.to_str().unwrap();
    assert!(!text.ends_with('='), "gRPC sends unpadded base64: {text}");
    let bytes = base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(text)
        .unwrap();
    Some(tonic_types::pb::Status::decode(bytes.as_slice()).unwrap())
}

/// The `RetryInfo.retry_delay` of a status' details, as (seconds, nanos).
fn retry_delay(status: &tonic_types::pb::Status) -> (i64, i32) {
    let [detail] = status.details.as_slice() else {
        panic!("one detail, got {:?}", status.details);
    };
    assert_eq!(detail.type_url, "type.googleapis.com/google.rpc.RetryInfo");
    let info = tonic_types::pb::RetryInfo::decode(detail.value.as_slice()).unwrap();
    let delay = info.retry_delay.unwrap();
    (delay.seconds, delay.nanos)
}

fn assert_trailers_only(response: &Response<String>, code: &str) {
    assert_eq!(response.status(), 200, "gRPC answers errors with HTTP 200");
    assert_eq!(response.headers()["content-type"], "application/grpc");
    assert_eq!(response.headers()["grpc-status"], code);
    assert!(response.body().is_empty(), "trailers-only: no body");
}

#[tokio::test]
async fn admitted_calls_carry_the_decision_and_ratelimit_metadata() {
    let limiter = Limiter::new(MemoryStore::new(), quota("2/1m"));
    let service = layer(limiter).layer(service_fn(handler));
    let response = service
        .clone()
        .oneshot(call("/shop.Cart/Add", Some("k1")))
        .await
        .unwrap();
    assert_eq!(response.body(), "remaining=1");
    assert!(!response.headers().contains_key("grpc-status"));
    assert_eq!(response.headers()["ratelimit"], r#""default";r=1;t=60"#);
    assert_eq!(
        response.headers()["ratelimit-policy"],
        r#""default";q=2;w=60"#
    );
    // Without the extension, the handler sees no decision; headers stay.
    let limiter = Limiter::new(MemoryStore::new(), quota("2/1m"));
    let service = layer(limiter)
        .decision_extension(false)
        .layer(service_fn(handler));
    let response = service
        .oneshot(call("/shop.Cart/Add", Some("k1")))
        .await
        .unwrap();
    assert_eq!(response.body(), "no decision");
    assert!(response.headers().contains_key("ratelimit"));
}

#[tokio::test]
async fn a_denial_is_resource_exhausted_with_retry_info_and_ratelimit_metadata() {
    let limiter = Limiter::new(MemoryStore::new(), quota("2/1m"));
    let service = layer(limiter).layer(service_fn(handler));
    for _ in 0..2 {
        let ok = service
            .clone()
            .oneshot(call("/shop.Cart/Add", Some("k1")))
            .await
            .unwrap();
        assert!(!ok.headers().contains_key("grpc-status"));
    }
    let denied = service
        .clone()
        .oneshot(call("/shop.Cart/Add", Some("k1")))
        .await
        .unwrap();
    assert_trailers_only(&denied, "8");
    let message = denied.headers()["grpc-message"].to_str().unwrap();
    assert!(message.starts_with("quota%20%22default%22"), "{message}");
    let status = details(denied.headers()).expect("RetryInfo details");
    assert_eq!(status.code, 8);
    assert!(
        status.message.starts_with("quota \"default\""),
        "{status:?}"
    );
    let (seconds, nanos) = retry_delay(&status);
    assert!((1..=60).contains(&seconds), "{seconds}");
    assert_eq!(nanos, 0, "whole seconds, rounded up");
    assert_eq!(denied.headers()["ratelimit"], r#""default";r=0;t=60"#);
    assert_eq!(
        denied.headers()["ratelimit-policy"],
        r#""default";q=2;w=60"#
    );
    let rejection = denied.extensions().get::<Rejection>().unwrap();
    assert_eq!(rejection.grpc_code(), GrpcCode::RESOURCE_EXHAUSTED);
    // tonic reads the same status and details.
    let tonic_status = tonic::Status::from_header_map(denied.headers()).unwrap();
    assert_eq!(tonic_status.code(), tonic::Code::ResourceExhausted);
    let info = tonic_types::StatusExt::get_details_retry_info(&tonic_status).unwrap();
    assert_eq!(info.retry_delay, Some(Duration::from_secs(seconds as u64)));
    // Another key is not affected.
    let other = service
        .oneshot(call("/shop.Cart/Add", Some("k2")))
        .await
        .unwrap();
    assert_eq!(other.body(), "remaining=1");
}

#[tokio::test]
async fn retry_delay_rounds_up_and_is_never_zero() {
    for (wait, expected) in [
        (Some(Duration::ZERO), Some(1)),
        (Some(Duration::from_millis(300)), Some(1)),
        (Some(Duration::from_millis(1_000)), Some(1)),
        (Some(Duration::from_millis(1_200)), Some(2)),
        (None, None),
    ] {
        let store = Store::bare(Backend::windows(DenyingStore(wait)));
        let service = layer(Limiter::new(store, quota("5/1m"))).layer(service_fn(handler));
        let denied = service
            .oneshot(call("/shop.Cart/Add", Some("k1")))
            .await
            .unwrap();
        assert_trailers_only(&denied, "8");
        let delay = details(denied.headers()).map(|status| retry_delay(&status));
        assert_eq!(delay, expected.map(|s| (s, 0)), "{wait:?}");
        assert!(denied.headers().contains_key("ratelimit"));
    }
}

#[tokio::test]
async fn a_missing_key_is_invalid_argument_or_the_configured_code() {
    let limiter = Limiter::new(MemoryStore::new(), quota("2/1m"));
    let service = layer(limiter.clone()).layer(service_fn(handler));
    let response = service.oneshot(call("/shop.Cart/Add", None)).await.unwrap();
    assert_trailers_only(&response, "3");
    assert!(response.headers().contains_key("grpc-message"));
    assert!(details(response.headers()).is_none());
    assert!(!response.headers().contains_key("ratelimit"));

    let service = layer(limiter)
        .on_missing_key(MissingKey::Reject(Status::UNAUTHORIZED))
        .layer(service_fn(handler));
    let response = service.oneshot(call("/shop.Cart/Add", None)).await.unwrap();
    assert_trailers_only(&response, "16");
}

#[tokio::test]
async fn a_degraded_denial_is_unavailable_with_retry_info() {
    let clock = ManualClock::new(1_700_000_040_000_000);
    let store = Store::builder(Backend::windows(FailingStore).clock(clock.clone()))
        .retry(RetryConfig::none())
        .build();
    let limiter = Limiter::builder(store, quota("5/1m"))
        .fallback(FailClosed::new().retry_after(Duration::from_millis(2_500)))
        .build();
    let service = layer(limiter.clone()).layer(service_fn(handler));
    let response = service
        .oneshot(call("/shop.Cart/Add", Some("k1")))
        .await
        .unwrap();
    assert_trailers_only(&response, "14");
    let status = details(response.headers()).unwrap();
    assert_eq!(status.code, 14);
    assert_eq!(retry_delay(&status), (3, 0));
    assert!(response.headers().contains_key("ratelimit-policy"));
    assert!(response
        .extensions()
        .get::<Rejection>()
        .unwrap()
        .is_degraded());

    // A degraded status of 429 makes it RESOURCE_EXHAUSTED, still degraded.
    let service = layer(limiter)
        .degraded_status(Status::TOO_MANY_REQUESTS)
        .layer(service_fn(handler));
    let response = service
        .oneshot(call("/shop.Cart/Add", Some("k1")))
        .await
        .unwrap();
    assert_trailers_only(&response, "8");
    assert!(response
        .extensions()
        .get::<Rejection>()
        .unwrap()
        .is_degraded());
}

#[tokio::test]
async fn per_method_quotas_from_a_tenant_registry() {
    let config = TenantsConfig::new()
        .with_default(
            TenantSpec::builder()
                .quota("calls", "3/1m")
                .unwrap()
                .build()
                .unwrap(),
        )
        .with_tenant(
            "shop.Cart.Checkout",
            TenantSpec::builder()
                .quota("checkout", "1/1m")
                .unwrap()
                .build()
                .unwrap(),
        )
        .unwrap();
    let limiter = Limiter::new(MemoryStore::new(), quota("100/1m"));
    let key = Metadata::new("x-api-key")
        .unwrap()
        .with_tenant(GrpcMethod::new());
    let service = SlidingWindowLayer::new(limiter, key)
        .grpc()
        .tenants(TenantRegistry::new(config))
        .layer(service_fn(handler));
    let mut codes = Vec::new();
    for path in ["/shop.Cart/Checkout"; 2]
        .into_iter()
        .chain(["/shop.Cart/Add"; 4])
    {
        let response = service
            .clone()
            .oneshot(call(path, Some("k1")))
            .await
            .unwrap();
        let code = response
            .headers()
            .get("grpc-status")
            .map_or("ok".to_owned(), |v| v.to_str().unwrap().to_owned());
        codes.push(code);
    }
    assert_eq!(codes, ["ok", "8", "ok", "ok", "ok", "8"]);
    let response = service
        .oneshot(call("/shop.Cart/Checkout", Some("k2")))
        .await
        .unwrap();
    assert_eq!(
        response.headers()["ratelimit-policy"],
        r#""checkout";q=1;w=60"#
    );
}

#[test]
fn the_grpc_layer_is_clone_send_sync() {
    fn assert_bounds<T: Clone + Send + Sync + 'static>(_: &T) {}
    let limiter = Limiter::new(MemoryStore::new(), quota("2/1m"));
    let layer = layer(limiter);
    assert_bounds(&layer);
    assert_bounds(&layer.layer(service_fn(handler)));
}
