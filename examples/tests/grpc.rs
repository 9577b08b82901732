//! The tonic example (`--bin grpc`, issue 25) with a real tonic client over
//! loopback HTTP/2: per-method quotas, the status codes a client reads, the
//! `google.rpc.RetryInfo` detail (decoded from the status' raw details and
//! with tonic-types), and the `RateLimit` metadata of allowed and denied
//! calls. Counts and values only, never timings.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use prost::Message as _;
use tokio::net::TcpListener;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};
use tonic_types::StatusExt as _;
use tower_window_examples::grpc::pb::inventory_client::InventoryClient;
use tower_window_examples::grpc::pb::{GetItemRequest, ReserveRequest};
use tower_window_examples::grpc::{serve, GrpcArgs, API_KEY};

/// Starts the example on a loopback port with `GetItem` 3/1m and `Reserve`
/// 1/1m per key, and connects a client to it.
async fn start() -> InventoryClient<Channel> {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let args = GrpcArgs {
        get_item: "3/1m".to_owned(),
        reserve: "1/1m".to_owned(),
        ..GrpcArgs::default()
    };
    tokio::spawn(async move { serve(listener, &args).await.unwrap() });
    // The listener is bound: the connection is accepted once the server runs.
    InventoryClient::connect(format!("http://{address}"))
        .await
        .unwrap()
}

fn with_key<T>(message: T, key: Option<&str>) -> Request<T> {
    let mut request = Request::new(message);
    if let Some(key) = key {
        request.metadata_mut().insert(API_KEY, key.parse().unwrap());
    }
    request
}

fn get_item(key: Option<&str>) -> Request<GetItemRequest> {
    with_key(
        GetItemRequest {
            sku: "sku-1".to_owned(),
        },
        key,
    )
}

fn reserve(key: Option<&str>) -> Request<ReserveRequest> {
    with_key(
        ReserveRequest {
            sku: "sku-1".to_owned(),
            units: 2,
        },
        key,
    )
}

/// A `RateLimit` member `"<name>";r=<r>;t=<t>` as `(name, r, t)`.
fn rate_limit(value: &str) -> (String, u64, u64) {
    let mut parts = value.split(';');
    let name = parts.next().unwrap().trim_matches('"').to_owned();
    let mut number = |key: &str| {
        let part = parts.next().unwrap();
        part.strip_prefix(key).unwrap().parse::<u64>().unwrap()
    };
    (name, number("r="), number("t="))
}

/// The `RetryInfo` delay of a status, decoded from its raw
/// `google.rpc.Status` details, and checked against tonic-types' reading.
fn retry_delay(status: &Status) -> Duration {
    let decoded = tonic_types::pb::Status::decode(status.details()).unwrap();
    assert_eq!(decoded.code, status.code() as i32);
    let [detail] = decoded.details.as_slice() else {
        panic!("one detail: {:?}", decoded.details);
    };
    assert_eq!(detail.type_url, "type.googleapis.com/google.rpc.RetryInfo");
    let info = tonic_types::pb::RetryInfo::decode(detail.value.as_slice()).unwrap();
    let delay = info.retry_delay.unwrap();
    assert_eq!(delay.nanos, 0, "whole seconds, rounded up");
    let delay = Duration::from_secs(u64::try_from(delay.seconds).unwrap());
    let read = status.get_details_retry_info().unwrap().retry_delay;
    assert_eq!(read, Some(delay));
    delay
}

#[tokio::test]
async fn per_method_quotas_answer_resource_exhausted_with_retry_info() {
    let mut client = start().await;

    // Allowed: the handler saw the decision, the metadata describes it.
    let response = client.get_item(get_item(Some("k1"))).await.unwrap();
    assert_eq!(response.get_ref().quota_remaining, 2);
    assert_eq!(response.get_ref().in_stock, 42);
    let metadata = response.metadata();
    assert_eq!(
        metadata.get("ratelimit-policy").unwrap(),
        r#""reads";q=3;w=60"#
    );
    let (name, remaining, reset) = rate_limit(metadata.get("ratelimit").unwrap().to_str().unwrap());
    assert_eq!((name.as_str(), remaining), ("reads", 2));
    assert!((1..=60).contains(&reset), "{reset}");

    // GetItem: 3 per key and minute.
    for left in [1, 0] {
        let response = client.get_item(get_item(Some("k1"))).await.unwrap();
        assert_eq!(response.get_ref().quota_remaining, left);
    }
    let denied = client.get_item(get_item(Some("k1"))).await.unwrap_err();
    assert_eq!(denied.code(), Code::ResourceExhausted, "{denied:?}");
    assert!(
        denied.message().contains(r#"quota "reads""#),
        "{}",
        denied.message()
    );
    let delay = retry_delay(&denied);
    assert!(
        delay >= Duration::from_secs(1) && delay <= Duration::from_secs(60),
        "{delay:?}"
    );
    let (name, remaining, _) = rate_limit(
        denied
            .metadata()
            .get("ratelimit")
            .unwrap()
            .to_str()
            .unwrap(),
    );
    assert_eq!((name.as_str(), remaining), ("reads", 0));
    assert_eq!(
        denied.metadata().get("ratelimit-policy").unwrap(),
        r#""reads";q=3;w=60"#
    );

    // Reserve has its own quota (1 per key and minute), untouched by GetItem's.
    let reserved = client.reserve(reserve(Some("k1"))).await.unwrap();
    assert_eq!(reserved.get_ref().units, 2);
    assert_eq!(
        reserved.metadata().get("ratelimit-policy").unwrap(),
        r#""reservations";q=1;w=60"#
    );
    let denied = client.reserve(reserve(Some("k1"))).await.unwrap_err();
    assert_eq!(denied.code(), Code::ResourceExhausted);
    assert!(retry_delay(&denied) >= Duration::from_secs(1));

    // Another caller has its own windows.
    let other = client.get_item(get_item(Some("k2"))).await.unwrap();
    assert_eq!(other.get_ref().quota_remaining, 2);
}

#[tokio::test]
async fn a_call_without_a_key_is_invalid_argument() {
    let mut client = start().await;
    let status = client.get_item(get_item(None)).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("rate-limit key missing"),
        "{status:?}"
    );
    assert!(
        status.details().is_empty(),
        "no RetryInfo for a missing key"
    );
    assert!(status.metadata().get("ratelimit").is_none());
    // The handler's own errors pass through the layer unchanged.
    let mut request = get_item(Some("k1"));
    request.get_mut().sku.clear();
    let status = client.get_item(request).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(status.message(), "sku is empty");
    // The layer admitted it: its RateLimit metadata is there.
    assert!(status.metadata().get("ratelimit").is_some(), "{status:?}");
}
