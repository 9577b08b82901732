//! End-to-end tests of `SlidingWindowLayer` through `tower::ServiceExt::oneshot`.
//!
//! Time is a `ManualClock`; nothing sleeps. The stores are small test-only
//! backends (`limit::Backend` implementations) (a fixed-window counter following the crate's
//! algorithm contract, a scripted store and a failing one) so that these
//! tests depend only on the layer.

#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::future::BoxFuture;
use http::{HeaderMap, Request, Response, StatusCode};
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_window::fallback::{FailClosed, FailOpen, FallbackRequest, LocalWindow};
use tower_window::key::{Constant, Header};
use tower_window::layer::{
    Http, MissingKey, Rejection, ResponseFuture, SlidingWindow, SlidingWindowLayer, Typed, UnitCost,
};
use tower_window::store::{Backend, Guard, Op, OwnedCheckRequest, StoreBuilder};
use tower_window::{
    limit, BreakerConfig, CheckRequest, Decision, DecisionSource, FallbackPolicy, FallbackReason,
    Limiter, ManualClock, MemoryStore, Policy, Quota, RetryConfig, Store, StoreError,
    StoreErrorKind, WindowKey,
};

// ---------------------------------------------------------------- stores

/// A store on a test backend (behind a network, with the defaults).
fn networked(backend: impl limit::Backend) -> StoreBuilder {
    Store::builder(Backend::windows(backend))
}

/// Answers every check with the same decision (for its quota).
struct ScriptedStore(Decision);

impl limit::Backend for ScriptedStore {
    fn check<'a>(&'a self, _: &mut Guard<'a>, request: CheckRequest<'a>) -> Op<'static, Decision> {
        // The scripted answer, reported against the request's quota.
        let d = &self.0;
        let quota = request.policy.first().clone();
        let decision = if d.allowed() {
            Decision::allow(quota, d.remaining(), d.reset_after())
        } else {
            Decision::deny(quota, d.remaining(), d.reset_after(), d.retry_after())
        }
        .with_source(d.source())
        .with_timestamp_micros(d.timestamp_micros());
        Op::ready(Ok(decision))
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

/// The memory store behind a network-like boundary: every check yields to
/// the runtime once, so the layer's decision is pending at its first poll.
struct YieldingStore(MemoryStore);

impl limit::Backend for YieldingStore {
    fn check<'a>(
        &'a self,
        guard: &mut Guard<'a>,
        request: CheckRequest<'a>,
    ) -> Op<'static, Decision> {
        let (store, request) = (self.0.clone(), OwnedCheckRequest::from(request));
        guard.run(move || {
            let (store, request) = (store.clone(), request.clone());
            async move {
                tokio::task::yield_now().await;
                limit::Backend::check(&store, &mut Guard::bare(), request.as_request()).await
            }
        })
    }
}

// ---------------------------------------------------------------- helpers

/// One minute past an aligned minute, plus `offset`.
fn clock_at(offset: Duration) -> ManualClock {
    let clock = ManualClock::new(1_700_000_040_000_000);
    clock.advance(offset);
    clock
}

fn quota(dsl: &str) -> Quota {
    dsl.parse::<Quota>().unwrap().named("api").unwrap()
}

fn fixed_limiter(dsl: &str, clock: &ManualClock) -> Limiter {
    Limiter::new(
        MemoryStore::builder().clock(clock.clone()).build(),
        quota(dsl),
    )
}

fn request(user: Option<&str>) -> Request<String> {
    let mut builder = Request::builder().uri("/api");
    if let Some(user) = user {
        builder = builder.header("x-user-id", user);
    }
    builder.body(String::new()).unwrap()
}

/// Echoes `remaining=<n>` from the `Decision` extension, or `no decision`.
async fn handler(request: Request<String>) -> Result<Response<String>, Infallible> {
    let body = match request.extensions().get::<Decision>() {
        Some(decision) => format!("remaining={}", decision.remaining()),
        None => "no decision".to_owned(),
    };
    Ok(Response::new(body))
}

type Params = Vec<(String, i64)>;

/// Parses a `RateLimit`/`RateLimit-Policy` field as a structured-field list:
/// `(name, [(param, integer)])` per member.
fn parse_list(headers: &HeaderMap, name: &str) -> Vec<(String, Params)> {
    let joined = headers
        .get_all(name)
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect::<Vec<_>>()
        .join(", ");
    let list: sfv::List = sfv::Parser::new(&joined).parse().unwrap();
    list.into_iter()
        .map(|entry| match entry {
            sfv::ListEntry::Item(item) => {
                let name = item.bare_item.as_string().unwrap().as_str().to_owned();
                let params = item
                    .params
                    .iter()
                    .map(|(k, v)| (k.as_str().to_owned(), i64::from(v.as_integer().unwrap())))
                    .collect();
                (name, params)
            }
            sfv::ListEntry::InnerList(_) => panic!("unexpected inner list in {name}"),
        })
        .collect()
}

fn params(pairs: &[(&str, i64)]) -> Params {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
}

// ---------------------------------------------------------------- HTTP mode

#[tokio::test]
async fn allowed_response_has_structured_ratelimit_headers() {
    let clock = clock_at(Duration::from_millis(10_200));
    let layer = SlidingWindowLayer::new(
        fixed_limiter("5/1m fixed-window", &clock),
        Header::new("x-user-id").unwrap(),
    );
    let service = layer.layer(service_fn(handler));

    let response = service.oneshot(request(Some("alice"))).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.body(), "remaining=4");
    let headers = response.headers();
    assert_eq!(
        parse_list(headers, "ratelimit-policy"),
        [("api".to_owned(), params(&[("q", 5), ("w", 60)]))]
    );
    // 49.8 s left in the window: rounded up to 50.
    assert_eq!(
        parse_list(headers, "ratelimit"),
        [("api".to_owned(), params(&[("r", 4), ("t", 50)]))]
    );
    assert!(!headers.contains_key("retry-after"));
    assert!(!headers.contains_key("x-ratelimit-limit"));
    assert!(response.extensions().get::<Rejection>().is_none());
}

/// The rates a policy's headers advertise, for every algorithm: `q` per `w`
/// is the sustained rate (GCRA: not its burst; sub-second windows: scaled
/// to whole seconds), every quota is listed, and `RateLimit` names the
/// tightest one. Parsed back by an independent structured-field parser.
#[tokio::test]
async fn a_policy_advertises_every_quota_at_its_sustained_rate() {
    let clock = clock_at(Duration::ZERO);
    let policy = Policy::builder("mixed")
        .quota("gcra", "10/s gcra(burst=20)")
        .unwrap()
        .quota("fast", "250/500ms")
        .unwrap()
        .quota("counter", "600/1m sliding-counter(1s)")
        .unwrap()
        .quota("hourly", "3/1h")
        .unwrap()
        .build()
        .unwrap();
    let limiter = Limiter::new(MemoryStore::builder().clock(clock.clone()).build(), policy);
    let service = SlidingWindowLayer::new(limiter, Header::new("x-user-id").unwrap())
        .layer(service_fn(handler));
    let response = service
        .clone()
        .oneshot(request(Some("rita")))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        parse_list(response.headers(), "ratelimit-policy"),
        [
            (
                "gcra".to_owned(),
                params(&[("q", 10), ("w", 1), ("burst", 20)])
            ),
            ("fast".to_owned(), params(&[("q", 500), ("w", 1)])),
            ("counter".to_owned(), params(&[("q", 600), ("w", 60)])),
            ("hourly".to_owned(), params(&[("q", 3), ("w", 3600)])),
        ]
    );
    // 2 of 3 left is the smallest share: the hourly quota is the tightest.
    assert_eq!(
        parse_list(response.headers(), "ratelimit"),
        [("hourly".to_owned(), params(&[("r", 2), ("t", 3600)]))]
    );
    for _ in 0..2 {
        service
            .clone()
            .oneshot(request(Some("rita")))
            .await
            .unwrap();
    }
    let denied = service.oneshot(request(Some("rita"))).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.headers()["retry-after"], "3600");
    assert_eq!(
        parse_list(denied.headers(), "ratelimit"),
        [("hourly".to_owned(), params(&[("r", 0), ("t", 3600)]))]
    );
    assert_eq!(parse_list(denied.headers(), "ratelimit-policy").len(), 4);
}

#[tokio::test]
async fn decision_is_visible_to_the_inner_handler() {
    let clock = clock_at(Duration::ZERO);
    let layer = SlidingWindowLayer::new(
        fixed_limiter("3/1m fixed-window", &clock),
        Header::new("x-user-id").unwrap(),
    );
    let mut service = layer.layer(service_fn(handler));
    for expected in ["remaining=2", "remaining=1", "remaining=0"] {
        let response = service
            .ready()
            .await
            .unwrap()
            .call(request(Some("bob")))
            .await
            .unwrap();
        assert_eq!(response.body(), expected);
    }
}

#[tokio::test]
async fn without_the_decision_extension_the_headers_stay() {
    let clock = clock_at(Duration::ZERO);
    let layer = SlidingWindowLayer::new(
        fixed_limiter("2/1m fixed-window", &clock),
        Header::new("x-user-id").unwrap(),
    )
    .decision_extension(false);
    let mut service = layer.layer(service_fn(handler));
    for remaining in [1, 0] {
        let response = service
            .ready()
            .await
            .unwrap()
            .call(request(Some("bob")))
            .await
            .unwrap();
        // The handler sees no decision; the response still says where
        // the window stands, and the window still counts.
        assert_eq!(response.body(), "no decision");
        assert_eq!(
            parse_list(response.headers(), "ratelimit"),
            vec![("api".to_owned(), params(&[("r", remaining), ("t", 60)]))]
        );
    }
    let denied = service
        .ready()
        .await
        .unwrap()
        .call(request(Some("bob")))
        .await
        .unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn denial_is_429_with_retry_after_rounded_up() {
    // Exhaust the window, then stand 1.2 s before its end.
    let clock = clock_at(Duration::ZERO);
    let layer = SlidingWindowLayer::new(
        fixed_limiter("2/1m fixed-window", &clock),
        Header::new("x-user-id").unwrap(),
    );
    let mut service = layer.layer(service_fn(handler));
    for _ in 0..2 {
        let response = service
            .ready()
            .await
            .unwrap()
            .call(request(Some("carol")))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }
    clock.advance(Duration::from_millis(58_800));
    let denied = service
        .ready()
        .await
        .unwrap()
        .call(request(Some("carol")))
        .await
        .unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.headers()["retry-after"], "2");
    assert_eq!(
        parse_list(denied.headers(), "ratelimit"),
        [("api".to_owned(), params(&[("r", 0), ("t", 2)]))]
    );
    assert_eq!(
        parse_list(denied.headers(), "ratelimit-policy"),
        [("api".to_owned(), params(&[("q", 2), ("w", 60)]))]
    );
    assert!(
        denied.body().is_empty(),
        "the default rejection has an empty body"
    );
    match denied.extensions().get::<Rejection>() {
        Some(Rejection::RateLimited(decision)) => {
            assert!(!decision.allowed());
            assert_eq!(decision.retry_after(), Some(Duration::from_millis(1_200)));
        }
        other => panic!("expected RateLimited, got {other:?}"),
    }
    // Another user is unaffected; the window rolls over.
    let other = service
        .ready()
        .await
        .unwrap()
        .call(request(Some("dave")))
        .await
        .unwrap();
    assert_eq!(other.status(), StatusCode::OK);
    clock.advance(Duration::from_millis(1_200));
    let again = service
        .ready()
        .await
        .unwrap()
        .call(request(Some("carol")))
        .await
        .unwrap();
    assert_eq!(again.status(), StatusCode::OK);
}

#[tokio::test]
async fn retry_after_never_rounds_down_to_zero() {
    for (wait, expected) in [
        (Duration::from_millis(300), "1"),
        (Duration::from_micros(1), "1"),
        (Duration::from_millis(1_000), "1"),
        (Duration::from_millis(1_001), "2"),
        (Duration::from_secs(3_600), "3600"),
    ] {
        let denial = Decision::deny(quota("1/1h"), 0, wait, Some(wait));
        let limiter = Limiter::new(networked(ScriptedStore(denial)).build(), quota("1/1h"));
        let service =
            SlidingWindowLayer::new(limiter, Constant::global()).layer(service_fn(handler));
        let response = service.oneshot(request(None)).await.unwrap();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()["retry-after"], expected, "wait {wait:?}");
    }
}

#[tokio::test]
async fn cost_above_the_limit_has_no_retry_after() {
    let clock = clock_at(Duration::ZERO);
    let layer = SlidingWindowLayer::new(
        fixed_limiter("5/1m fixed-window", &clock),
        Header::new("x-user-id").unwrap(),
    )
    .cost(|_: &Request<String>| 6);
    let response = layer
        .layer(service_fn(handler))
        .oneshot(request(Some("erin")))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(!response.headers().contains_key("retry-after"));
    assert_eq!(
        parse_list(response.headers(), "ratelimit"),
        [("api".to_owned(), params(&[("r", 5), ("t", 60)]))]
    );
    let rejection = response.extensions().get::<Rejection>().unwrap();
    assert_eq!(rejection.decision().unwrap().retry_after(), None);
}

#[tokio::test]
async fn legacy_headers_are_opt_in() {
    let clock = clock_at(Duration::from_millis(500));
    let limiter = fixed_limiter("10/1m fixed-window", &clock);
    let plain = SlidingWindowLayer::new(limiter.clone(), Header::new("x-user-id").unwrap())
        .legacy_headers(false);
    let response = plain
        .layer(service_fn(handler))
        .oneshot(request(Some("fay")))
        .await
        .unwrap();
    assert!(!response.headers().contains_key("x-ratelimit-limit"));
    assert!(!response.headers().contains_key("x-ratelimit-remaining"));
    assert!(!response.headers().contains_key("x-ratelimit-reset"));

    let legacy =
        SlidingWindowLayer::new(limiter, Header::new("x-user-id").unwrap()).legacy_headers(true);
    let response = legacy
        .layer(service_fn(handler))
        .oneshot(request(Some("fay")))
        .await
        .unwrap();
    let headers = response.headers();
    assert_eq!(headers["x-ratelimit-limit"], "10");
    assert_eq!(headers["x-ratelimit-remaining"], "8");
    assert_eq!(headers["x-ratelimit-reset"], "60"); // 59.5 s, rounded up
    assert!(headers.contains_key("ratelimit"));
}

#[tokio::test]
async fn custom_cost_function() {
    let clock = clock_at(Duration::ZERO);
    let layer = SlidingWindowLayer::new(
        fixed_limiter("10/1m fixed-window", &clock),
        Header::new("x-user-id").unwrap(),
    )
    .cost(|req: &Request<String>| {
        req.headers()
            .get("x-cost")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(1)
    });
    let mut service = layer.layer(service_fn(handler));
    let weighted = |cost: &str| {
        let mut req = request(Some("gus"));
        req.headers_mut().insert("x-cost", cost.parse().unwrap());
        req
    };
    let response = service
        .ready()
        .await
        .unwrap()
        .call(weighted("7"))
        .await
        .unwrap();
    assert_eq!(response.body(), "remaining=3");
    let response = service
        .ready()
        .await
        .unwrap()
        .call(weighted("4"))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        parse_list(response.headers(), "ratelimit"),
        [("api".to_owned(), params(&[("r", 3), ("t", 60)]))]
    );
    // The denial consumed nothing: 3 units still fit.
    let response = service
        .ready()
        .await
        .unwrap()
        .call(weighted("3"))
        .await
        .unwrap();
    assert_eq!(response.body(), "remaining=0");
}

#[tokio::test]
async fn zero_cost_requests_are_free() {
    let clock = clock_at(Duration::ZERO);
    let layer = SlidingWindowLayer::new(
        fixed_limiter("1/1m fixed-window", &clock),
        Header::new("x-user-id").unwrap(),
    )
    .cost(|req: &Request<String>| u32::from(req.uri().path() != "/healthz"));
    let mut service = layer.layer(service_fn(handler));
    for _ in 0..3 {
        let health = Request::builder()
            .uri("/healthz")
            .header("x-user-id", "h")
            .body(String::new())
            .unwrap();
        let response = service.ready().await.unwrap().call(health).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.body(), "no decision");
        assert!(!response.headers().contains_key("ratelimit"));
    }
    let response = service
        .ready()
        .await
        .unwrap()
        .call(request(Some("h")))
        .await
        .unwrap();
    assert_eq!(response.body(), "remaining=0");
}

#[tokio::test]
async fn missing_key_is_rejected_with_400_by_default() {
    let clock = clock_at(Duration::ZERO);
    let layer = SlidingWindowLayer::new(
        fixed_limiter("5/1m", &clock),
        Header::new("x-user-id").unwrap(),
    );
    let response = layer
        .layer(service_fn(handler))
        .oneshot(request(None))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert!(!response.headers().contains_key("ratelimit"));
    assert!(!response.headers().contains_key("retry-after"));
    assert!(matches!(
        response.extensions().get::<Rejection>(),
        Some(Rejection::MissingKey { status }) if *status == StatusCode::BAD_REQUEST
    ));

    let layer = SlidingWindowLayer::new(
        fixed_limiter("5/1m", &clock),
        Header::new("x-user-id").unwrap(),
    )
    .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED.into()));
    let response = layer
        .layer(service_fn(handler))
        .oneshot(request(None))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn missing_key_skip_lets_requests_through_unlimited() {
    let clock = clock_at(Duration::ZERO);
    let layer = SlidingWindowLayer::new(
        fixed_limiter("1/1m fixed-window", &clock),
        Header::new("x-user-id").unwrap(),
    )
    .on_missing_key(MissingKey::Skip);
    let mut service = layer.layer(service_fn(handler));
    for _ in 0..3 {
        let response = service
            .ready()
            .await
            .unwrap()
            .call(request(None))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.body(), "no decision");
        assert!(!response.headers().contains_key("ratelimit"));
    }
    let keyed = service
        .ready()
        .await
        .unwrap()
        .call(request(Some("ivy")))
        .await
        .unwrap();
    assert_eq!(keyed.body(), "remaining=0");
}

#[tokio::test]
async fn store_failure_is_503_unavailable() {
    let layer = SlidingWindowLayer::new(
        Limiter::new(networked(FailingStore).build(), quota("5/1m")),
        Header::new("x-user-id").unwrap(),
    );
    let response = layer
        .layer(service_fn(handler))
        .oneshot(request(Some("jo")))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(!response.headers().contains_key("retry-after"));
    match response.extensions().get::<Rejection>() {
        Some(Rejection::Unavailable { message }) => assert!(message.contains("connection refused")),
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

#[tokio::test]
async fn custom_rejection_response_keeps_the_headers() {
    let clock = clock_at(Duration::ZERO);
    let layer = SlidingWindowLayer::new(
        fixed_limiter("1/1m fixed-window", &clock),
        Header::new("x-user-id").unwrap(),
    )
    .legacy_headers(true)
    .rejection(|rejection: &Rejection| {
        let mut response = Response::new(format!("{}: {}", rejection.title(), rejection.detail()));
        *response.status_mut() = rejection.status().into();
        response
    });
    let mut service = layer.layer(service_fn(handler));
    service
        .ready()
        .await
        .unwrap()
        .call(request(Some("kim")))
        .await
        .unwrap();
    let denied = service
        .ready()
        .await
        .unwrap()
        .call(request(Some("kim")))
        .await
        .unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(
        denied.body().starts_with("Too Many Requests: "),
        "{}",
        denied.body()
    );
    assert_eq!(denied.headers()["retry-after"], "60");
    assert_eq!(denied.headers()["x-ratelimit-remaining"], "0");
    assert!(denied.headers().contains_key("ratelimit"));
}

#[tokio::test]
async fn inner_errors_pass_through_in_http_mode() {
    let clock = clock_at(Duration::ZERO);
    let layer = SlidingWindowLayer::new(
        fixed_limiter("5/1m", &clock),
        Header::new("x-user-id").unwrap(),
    );
    let service = layer.layer(service_fn(|_: Request<String>| async {
        Err::<Response<String>, _>(std::io::Error::other("boom"))
    }));
    let error: std::io::Error = service.oneshot(request(Some("lu"))).await.unwrap_err();
    assert_eq!(error.to_string(), "boom");
}

#[tokio::test]
async fn all_clones_share_one_limiter() {
    let clock = clock_at(Duration::ZERO);
    let layer = SlidingWindowLayer::new(
        fixed_limiter("2/1m fixed-window", &clock),
        Header::new("x-user-id").unwrap(),
    );
    let first = layer.layer(service_fn(handler));
    let second = first.clone();
    let from_other_layer_clone = layer.clone().layer(service_fn(handler));
    for _ in 0..2 {
        let response = first.clone().oneshot(request(Some("max"))).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }
    let response = second.oneshot(request(Some("max"))).await.unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    let response = from_other_layer_clone
        .oneshot(request(Some("max")))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
}

/// A service that must be `poll_ready`-ed before `call`; clones start unready.
struct NeedsReady {
    ready: bool,
    calls: Arc<AtomicUsize>,
}

impl Clone for NeedsReady {
    fn clone(&self) -> Self {
        Self {
            ready: false,
            calls: Arc::clone(&self.calls),
        }
    }
}

impl Service<Request<String>> for NeedsReady {
    type Response = Response<String>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response<String>, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.ready = true;
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _request: Request<String>) -> Self::Future {
        assert!(self.ready, "called without poll_ready");
        self.ready = false;
        self.calls.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok(Response::new(String::new())))
    }
}

#[tokio::test]
async fn the_readied_service_is_the_one_called() {
    // A decision ready at once (memory store) calls the readied service in
    // `call`; one that must wait (yielding store) hands it to the future.
    for yielding in [false, true] {
        let clock = clock_at(Duration::ZERO);
        let store = MemoryStore::builder().clock(clock).build();
        let limiter = if yielding {
            Limiter::new(
                networked(YieldingStore(store)).build(),
                quota("2/1m fixed-window"),
            )
        } else {
            Limiter::new(store, quota("2/1m fixed-window"))
        };
        let calls = Arc::new(AtomicUsize::new(0));
        let layer = SlidingWindowLayer::new(limiter, Header::new("x-user-id").unwrap())
            .on_missing_key(MissingKey::Skip);
        let mut service = layer.layer(NeedsReady {
            ready: false,
            calls: Arc::clone(&calls),
        });
        let users = [Some("nia"), None, Some("nia"), Some("nia"), Some("ola")];
        let mut statuses = Vec::new();
        for user in users {
            let response = service
                .ready()
                .await
                .unwrap()
                .call(request(user))
                .await
                .unwrap();
            statuses.push(response.status());
        }
        let (ok, limited) = (StatusCode::OK, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(statuses, [ok, ok, ok, limited, ok], "yielding: {yielding}");
        // Every admitted request reached the inner service, once.
        assert_eq!(calls.load(Ordering::SeqCst), 4, "yielding: {yielding}");
    }
}

#[tokio::test]
async fn the_check_happens_in_call_even_if_the_future_is_dropped() {
    let clock = clock_at(Duration::ZERO);
    let layer = SlidingWindowLayer::new(
        fixed_limiter("2/1m fixed-window", &clock),
        Header::new("x-user-id").unwrap(),
    );
    let mut service = layer.layer(service_fn(handler));
    // A memory-store decision is made in `call`: dropping the response
    // future unpolled does not take the request back.
    drop(service.ready().await.unwrap().call(request(Some("pia"))));
    let response = service
        .ready()
        .await
        .unwrap()
        .call(request(Some("pia")))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let response = service
        .ready()
        .await
        .unwrap()
        .call(request(Some("pia")))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
}

// ---------------------------------------------------------------- typed mode

#[derive(Debug, PartialEq)]
struct Job(u32);

#[tokio::test]
async fn typed_mode_rejects_with_a_downcastable_error() {
    let clock = clock_at(Duration::ZERO);
    let layer = SlidingWindowLayer::new(
        fixed_limiter("2/1m fixed-window", &clock),
        Constant::new("jobs"),
    )
    .cost(|job: &Job| job.0)
    .typed_errors();
    let service = layer.layer(service_fn(|job: Job| async move {
        if job.0 == 2 {
            Err(std::io::Error::other("inner failure"))
        } else {
            Ok(job.0 * 10)
        }
    }));
    // Allowed; the response is untouched.
    assert_eq!(service.clone().oneshot(Job(1)).await.unwrap(), 10);
    // Cost 3 > limit 2: a rejection that can never fit.
    let error = service.clone().oneshot(Job(3)).await.unwrap_err();
    let rejection = error.downcast_ref::<Rejection>().unwrap();
    assert_eq!(rejection.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(rejection.decision().unwrap().retry_after(), None);
    // The last unit, then an exhausted window.
    assert_eq!(service.clone().oneshot(Job(1)).await.unwrap(), 10);
    let error = service.clone().oneshot(Job(1)).await.unwrap_err();
    match error.downcast_ref::<Rejection>() {
        Some(Rejection::RateLimited(decision)) => {
            assert_eq!(decision.retry_after(), Some(Duration::from_secs(60)));
        }
        other => panic!("expected RateLimited, got {other:?}"),
    }
    // Inner errors pass through, boxed.
    clock.advance(Duration::from_secs(60));
    let error = service.oneshot(Job(2)).await.unwrap_err();
    assert!(error.downcast_ref::<Rejection>().is_none());
    assert_eq!(
        error.downcast_ref::<std::io::Error>().unwrap().to_string(),
        "inner failure"
    );
}

#[tokio::test]
async fn typed_mode_missing_key_and_store_failure() {
    let key = |job: &Job| (job.0 > 0).then(|| WindowKey::for_subject(job.0.to_string()));
    let clock = clock_at(Duration::ZERO);
    let service = SlidingWindowLayer::new(fixed_limiter("5/1m", &clock), key)
        .typed_errors()
        .layer(service_fn(
            |job: Job| async move { Ok::<_, Infallible>(job) },
        ));
    assert_eq!(service.clone().oneshot(Job(4)).await.unwrap(), Job(4));
    let error = service.oneshot(Job(0)).await.unwrap_err();
    assert!(matches!(
        error.downcast_ref::<Rejection>(),
        Some(Rejection::MissingKey { status }) if *status == StatusCode::BAD_REQUEST
    ));

    let service = SlidingWindowLayer::new(
        Limiter::new(networked(FailingStore).build(), quota("5/1m")),
        Constant::global(),
    )
    .typed_errors()
    .layer(service_fn(
        |job: Job| async move { Ok::<_, Infallible>(job) },
    ));
    let error = service.oneshot(Job(1)).await.unwrap_err();
    assert!(matches!(
        error.downcast_ref::<Rejection>(),
        Some(Rejection::Unavailable { .. })
    ));
}

// ---------------------------------------------------------------- bounds

fn assert_send<T: Send>() {}
fn assert_sync<T: Sync>() {}
fn assert_clone<T: Clone>() {}
fn assert_static<T: 'static>() {}
fn assert_infallible<S: Service<Request<String>, Error = Infallible>>() {}

type HandlerFn = fn(Request<String>) -> std::future::Ready<Result<Response<String>, Infallible>>;
type HttpLayer = SlidingWindowLayer<Header, UnitCost, Http>;
type HttpService = SlidingWindow<tower::util::ServiceFn<HandlerFn>, Header, UnitCost, Http>;
type TypedService = SlidingWindow<tower::util::ServiceFn<HandlerFn>, Constant, UnitCost, Typed>;

#[test]
fn layer_service_and_future_have_the_bounds_axum_needs() {
    assert_send::<HttpLayer>();
    assert_sync::<HttpLayer>();
    assert_clone::<HttpLayer>();
    assert_static::<HttpLayer>();

    assert_send::<HttpService>();
    assert_sync::<HttpService>();
    assert_clone::<HttpService>();
    assert_static::<HttpService>();
    assert_infallible::<HttpService>();

    assert_send::<ResponseFuture<tower::util::ServiceFn<HandlerFn>, Request<String>, Http>>();
    assert_send::<TypedService>();
    assert_sync::<TypedService>();
    assert_clone::<TypedService>();
}

#[test]
fn futures_of_closure_layers_are_send() {
    // A layer with closure key and cost functions, as users write them.
    let clock = clock_at(Duration::ZERO);
    let layer = SlidingWindowLayer::new(fixed_limiter("5/1m", &clock), |req: &Request<String>| {
        req.headers()
            .get("x-user-id")
            .map(|v| WindowKey::for_subject(v.as_bytes().to_vec()))
    })
    .cost(|_: &Request<String>| 2);
    let mut service = layer.layer(service_fn(handler));
    fn is_send<T: Send + 'static>(_: &T) {}
    is_send(&layer);
    is_send(&service);
    is_send(&service.call(request(Some("x"))));
    let _ = service.get_ref();
    let _ = service.get_mut();
    let _inner = service.into_inner();
}

#[tokio::test]
async fn combined_extractors_infer_the_request_type_from_the_service() {
    use tower_window::key::PeerIp;
    use tower_window::KeyExtractorExt;

    let clock = clock_at(Duration::ZERO);
    // Per user (or per peer IP when anonymous), within the tenant header's tenant or "public".
    let key = Header::new("x-user-id")
        .unwrap()
        .or(PeerIp::new())
        .with_tenant(
            Header::new("x-tenant-id")
                .unwrap()
                .or(Constant::new("public")),
        );
    let layer = SlidingWindowLayer::new(fixed_limiter("1/1m fixed-window", &clock), key);
    let mut service = layer.layer(service_fn(handler));
    let mut call = |tenant: Option<&str>, user: Option<&str>| {
        let mut req = request(user);
        if let Some(tenant) = tenant {
            req.headers_mut()
                .insert("x-tenant-id", tenant.parse().unwrap());
        }
        req.extensions_mut()
            .insert(std::net::SocketAddr::from(([192, 0, 2, 1], 9)));
        let response = service.call(req);
        async move { response.await.unwrap().status() }
    };
    assert_eq!(call(Some("acme"), Some("u")).await, StatusCode::OK);
    assert_eq!(
        call(Some("acme"), Some("u")).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Same user, other tenant: another window.
    assert_eq!(call(Some("globex"), Some("u")).await, StatusCode::OK);
    // No tenant header: the "public" tenant.
    assert_eq!(call(None, Some("u")).await, StatusCode::OK);
    // Anonymous: keyed by peer IP.
    assert_eq!(call(None, None).await, StatusCode::OK);
    assert_eq!(call(None, None).await, StatusCode::TOO_MANY_REQUESTS);
}

#[test]
fn combinators_can_name_the_request_type() {
    use tower_window::key::PeerIp;
    use tower_window::{KeyExtractor, KeyExtractorExt};

    let tenant = KeyExtractorExt::<Request<String>>::or(
        Header::new("x-tenant-id").unwrap(),
        Constant::new("public"),
    );
    let key = KeyExtractorExt::<Request<String>>::with_tenant(
        Header::new("x-user-id").unwrap().or(PeerIp::new()),
        tenant,
    );
    let window = key.clone().extract(&request(Some("zed"))).unwrap();
    assert_eq!(
        (window.tenant(), window.subject()),
        (&b"public"[..], &b"zed"[..])
    );
    assert!(format!("{key:?}").contains("WithTenant"));
}

#[test]
fn combined_extractors_work_on_request_parts() {
    use tower_window::key::{Query, TrustedProxies};
    use tower_window::{key::PeerIp, KeyExtractor, KeyExtractorExt};

    let key = Query::new("key")
        .or(PeerIp::new().trusted_proxies(TrustedProxies::private_networks()))
        .with_tenant(
            Header::new("x-tenant-id")
                .unwrap()
                .or(Constant::new("public")),
        );
    let (parts, _) = Request::builder()
        .uri("/?key=k1")
        .body(())
        .unwrap()
        .into_parts();
    let window = key.extract(&parts).unwrap();
    assert_eq!(
        (window.tenant(), window.subject()),
        (&b"public"[..], &b"k1"[..])
    );
}

/// Never ready: `poll_ready` fails.
#[derive(Clone)]
struct Broken;

impl Service<Job> for Broken {
    type Response = u32;
    type Error = std::io::Error;
    type Future = std::future::Ready<Result<u32, std::io::Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), std::io::Error>> {
        Poll::Ready(Err(std::io::Error::other("not ready")))
    }

    fn call(&mut self, _job: Job) -> Self::Future {
        unreachable!("never ready")
    }
}

#[tokio::test]
async fn typed_mode_maps_readiness_errors() {
    let clock = clock_at(Duration::ZERO);
    let service = SlidingWindowLayer::new(fixed_limiter("5/1m", &clock), Constant::global())
        .typed_errors()
        .layer(Broken);
    let error = service.oneshot(Job(1)).await.unwrap_err();
    assert_eq!(
        error.downcast_ref::<std::io::Error>().unwrap().to_string(),
        "not ready"
    );
}

// ---------------------------------------------------------------- degraded (fallback) decisions

/// A resilient limiter on the always-failing store: no retries (each check
/// fails at once), the default breaker, `policy` as the fallback.
fn degraded_limiter(dsl: &str, policy: impl FallbackPolicy, clock: &ManualClock) -> Limiter {
    let store = Store::builder(Backend::windows(FailingStore).clock(clock.clone()))
        .retry(RetryConfig::none())
        .build();
    Limiter::builder(store, quota(dsl)).fallback(policy).build()
}

/// Echoes the `Decision` extension's source and whether it is degraded.
async fn source_handler(request: Request<String>) -> Result<Response<String>, Infallible> {
    let body = match request.extensions().get::<Decision>() {
        Some(decision) => format!(
            "source={} degraded={}",
            decision.source(),
            decision.is_degraded()
        ),
        None => "no decision".to_owned(),
    };
    Ok(Response::new(body))
}

type BoxedHandler = fn(Request<String>) -> BoxFuture<'static, Result<Response<String>, Infallible>>;
type DegradedService = SlidingWindow<tower::util::ServiceFn<BoxedHandler>, Header, UnitCost, Http>;

fn degraded_service(limiter: Limiter) -> DegradedService {
    let handler: BoxedHandler = |request| Box::pin(source_handler(request));
    SlidingWindowLayer::new(limiter, Header::new("x-user-id").unwrap()).layer(service_fn(handler))
}

#[tokio::test]
async fn fail_closed_denial_is_503_degraded_with_retry_after() {
    let clock = clock_at(Duration::ZERO);
    let limiter = degraded_limiter("5/1m", FailClosed::default(), &clock);
    let service = degraded_service(limiter.clone());
    let response = service.oneshot(request(Some("kai"))).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()["retry-after"], "1");
    // The denial's decision still describes the quota.
    assert!(response.headers().contains_key("ratelimit-policy"));
    match response.extensions().get::<Rejection>() {
        Some(rejection @ Rejection::Degraded { decision, status }) => {
            assert_eq!(*status, StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(rejection.status(), StatusCode::SERVICE_UNAVAILABLE);
            assert!(rejection.is_degraded());
            assert_eq!(
                decision.source(),
                DecisionSource::Fallback(FallbackReason::Unavailable)
            );
            assert_eq!(rejection.title(), "Rate limiter degraded");
            assert!(rejection.detail().contains("unavailable"), "{rejection}");
        }
        other => panic!("expected Degraded, got {other:?}"),
    }
    assert_eq!(
        limiter.stats().fallback(FallbackReason::Unavailable),
        1,
        "counted as degraded"
    );
}

#[tokio::test]
async fn fail_closed_can_answer_429_and_is_still_degraded() {
    let clock = clock_at(Duration::ZERO);
    let policy = FailClosed::new().retry_after(Duration::from_millis(2_500));
    let handler: BoxedHandler = |request| Box::pin(source_handler(request));
    let service = SlidingWindowLayer::new(
        degraded_limiter("5/1m", policy, &clock),
        Header::new("x-user-id").unwrap(),
    )
    .degraded_status(StatusCode::TOO_MANY_REQUESTS)
    .layer(service_fn(handler));
    let response = service.oneshot(request(Some("kai"))).await.unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(response.headers()["retry-after"], "3");
    let rejection = response.extensions().get::<Rejection>().unwrap();
    assert!(rejection.is_degraded(), "{rejection:?}");
    assert_eq!(rejection.status(), StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn fail_open_admission_is_visible_to_the_handler_as_degraded() {
    let clock = clock_at(Duration::ZERO);
    let limiter = degraded_limiter("1/1m", FailOpen, &clock);
    let service = degraded_service(limiter.clone());
    // More than the limit: every request is admitted, each one degraded.
    for _ in 0..3 {
        let response = service.clone().oneshot(request(Some("lee"))).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            response.body(),
            "source=fallback(unavailable) degraded=true"
        );
        assert!(response.headers().contains_key("ratelimit"));
    }
    assert_eq!(limiter.stats().fallback_total(), 3);
    assert_eq!(limiter.stats().store, 0);
}

#[tokio::test]
async fn local_window_admits_a_share_then_denies_with_the_degraded_status() {
    let clock = clock_at(Duration::ZERO);
    // Half of 4 per minute on this node while the store is down.
    let policy = LocalWindow::new(0.5).unwrap();
    let handler: BoxedHandler = |request| Box::pin(source_handler(request));
    let service = SlidingWindowLayer::new(
        degraded_limiter("4/1m fixed-window", policy, &clock),
        Header::new("x-user-id").unwrap(),
    )
    .degraded_status(StatusCode::TOO_MANY_REQUESTS)
    .layer(service_fn(handler));
    for _ in 0..2 {
        let response = service.clone().oneshot(request(Some("max"))).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert!(
            response.body().contains("degraded=true"),
            "{}",
            response.body()
        );
    }
    let response = service.clone().oneshot(request(Some("max"))).await.unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(response.headers()["retry-after"], "60");
    let rejection = response.extensions().get::<Rejection>().unwrap();
    assert!(rejection.is_degraded(), "{rejection:?}");
    // Another key has its own local share.
    let response = service.oneshot(request(Some("ned"))).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
}

#[tokio::test]
async fn closure_policy_decides_and_the_limiter_marks_it_degraded() {
    let clock = clock_at(Duration::ZERO);
    // Admit one user, deny everyone else, and claim to be the store.
    let policy = |r: &FallbackRequest<'_>| {
        let decision = if r.key.subject() == b"vip".as_slice() {
            Decision::allow(r.policy.first().clone(), 0, r.policy.first().window())
        } else {
            Decision::deny(r.policy.first().clone(), 0, r.policy.first().window(), None)
        };
        decision.with_source(DecisionSource::Store)
    };
    let service = degraded_service(degraded_limiter("5/1m", policy, &clock));
    let response = service.clone().oneshot(request(Some("vip"))).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.body(),
        "source=fallback(unavailable) degraded=true"
    );
    let response = service.oneshot(request(Some("pat"))).await.unwrap();
    // A closure's denial answers with the layer's degraded status (default
    // 503), like every degraded denial; no Retry-After since the policy gave
    // no wait.
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(!response.headers().contains_key("retry-after"));
    let rejection = response.extensions().get::<Rejection>().unwrap();
    assert!(rejection.is_degraded(), "{rejection:?}");
    assert!(
        rejection.detail().contains("try again later"),
        "{rejection}"
    );
}

#[tokio::test]
async fn open_breaker_denials_name_the_reason() {
    let clock = clock_at(Duration::ZERO);
    let store = Store::builder(Backend::windows(FailingStore).clock(clock.clone()))
        .retry(RetryConfig::none())
        .breaker(BreakerConfig::default().consecutive_failures(1))
        .build();
    let limiter = Limiter::builder(store, quota("5/1m"))
        .fallback(FailClosed::default())
        .build();
    let service = degraded_service(limiter.clone());
    let first = service
        .clone()
        .oneshot(request(Some("quinn")))
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::SERVICE_UNAVAILABLE);
    let second = service.oneshot(request(Some("quinn"))).await.unwrap();
    assert_eq!(second.status(), StatusCode::SERVICE_UNAVAILABLE);
    let decision = second
        .extensions()
        .get::<Rejection>()
        .unwrap()
        .decision()
        .unwrap();
    assert_eq!(
        decision.source(),
        DecisionSource::Fallback(FallbackReason::CircuitOpen)
    );
    assert_eq!(limiter.stats().fallback(FallbackReason::CircuitOpen), 1);
}

#[tokio::test]
async fn store_denials_stay_429_rate_limited_under_a_fail_closed_limiter() {
    let clock = clock_at(Duration::ZERO);
    let limiter = Limiter::builder(
        MemoryStore::builder().clock(clock.clone()).build(),
        quota("1/1m fixed-window"),
    )
    .fallback(FailClosed::default())
    .build();
    let service = degraded_service(limiter);
    let response = service.clone().oneshot(request(Some("rae"))).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.body(), "source=store degraded=false");
    for source in [DecisionSource::Store, DecisionSource::LocalCache] {
        let response = service.clone().oneshot(request(Some("rae"))).await.unwrap();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        match response.extensions().get::<Rejection>() {
            Some(Rejection::RateLimited(decision)) => assert_eq!(decision.source(), source),
            other => panic!("expected RateLimited, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn typed_mode_degraded_denial_says_degraded() {
    let clock = clock_at(Duration::ZERO);
    let service = SlidingWindowLayer::new(
        degraded_limiter("5/1m", FailClosed::default(), &clock),
        Constant::global(),
    )
    .typed_errors()
    .layer(service_fn(
        |job: Job| async move { Ok::<_, Infallible>(job) },
    ));
    let error = service.oneshot(Job(1)).await.unwrap_err();
    let rejection = error.downcast_ref::<Rejection>().unwrap();
    assert!(rejection.is_degraded());
    assert_eq!(rejection.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(error.to_string().contains("degraded"), "{error}");
    assert_eq!(
        rejection.decision().unwrap().source(),
        DecisionSource::Fallback(FallbackReason::Unavailable)
    );
}

// ---------------------------------------------------------------- nested limiters

/// Names a quota `name` (the header lists tell the layers apart).
fn named(dsl: &str, name: &str) -> Quota {
    dsl.parse::<Quota>().unwrap().named(name).unwrap()
}

/// Two layers on one route, outer quota 5/1m and inner 1/1m, both per user
/// on their own memory store: the outer one decides first, so a request the
/// inner one denies has already consumed a unit of the outer quota. Denials
/// by the outer one never reach the inner one (nothing consumed there). The
/// inner 429 passes through the outer layer like any response and carries
/// both layers' `RateLimit` members (the outer one's after the inner one's).
#[tokio::test]
async fn nested_layers_an_inner_denial_has_consumed_the_outer_quota() {
    let clock = clock_at(Duration::ZERO);
    let store = |clock: &ManualClock| MemoryStore::builder().clock(clock.clone()).build();
    let outer = Limiter::new(store(&clock), named("5/1m fixed-window", "outer"));
    let inner = Limiter::new(store(&clock), named("1/1m fixed-window", "inner"));
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let service = SlidingWindowLayer::new(outer.clone(), Header::new("x-user-id").unwrap()).layer(
        SlidingWindowLayer::new(inner.clone(), Header::new("x-user-id").unwrap()).layer(
            service_fn(move |request: Request<String>| {
                counted.fetch_add(1, Ordering::SeqCst);
                handler(request)
            }),
        ),
    );

    let first = service.clone().oneshot(request(Some("nia"))).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    // The handler sees the inner layer's decision (it replaced the outer's).
    assert_eq!(first.body(), "remaining=0");

    let mut statuses = Vec::new();
    for _ in 0..6 {
        let response = service.clone().oneshot(request(Some("nia"))).await.unwrap();
        statuses.push(response.status());
        if statuses.len() == 1 {
            // An inner denial: both layers' members, inner first.
            let names: Vec<String> = parse_list(response.headers(), "ratelimit")
                .into_iter()
                .map(|(name, _)| name)
                .collect();
            assert_eq!(names, ["inner", "outer"]);
            assert!(matches!(
                response.extensions().get::<Rejection>(),
                Some(Rejection::RateLimited(decision)) if decision.quota().name() == "inner"
            ));
        }
    }
    // Requests 2..=5 pass the outer layer (consuming it) and are denied by
    // the inner one; 6 and 7 are denied by the outer one.
    assert_eq!(statuses, [StatusCode::TOO_MANY_REQUESTS; 6]);
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    let key = WindowKey::for_subject("nia");
    // Outer: 5 of 5 used, by 1 admitted and 4 inner-denied requests.
    let outer_now = outer.check(&key, 1).await.unwrap();
    assert!(!outer_now.allowed());
    assert_eq!(outer_now.remaining(), 0);
    // Inner: only the one admitted request; its denials consumed nothing.
    let inner_now = inner.check(&key, 1).await.unwrap();
    assert!(!inner_now.allowed());
    assert_eq!(inner_now.remaining(), 0);
    // Unit by unit, for a fresh user: one admitted request and one inner
    // denial leave the outer quota at 3 of 5; this direct check takes a
    // third unit, leaving 2.
    let fresh = service.clone().oneshot(request(Some("oli"))).await.unwrap();
    assert_eq!(fresh.status(), StatusCode::OK);
    let denied = service.clone().oneshot(request(Some("oli"))).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    let oli = WindowKey::for_subject("oli");
    assert_eq!(outer.check(&oli, 1).await.unwrap().remaining(), 2);
}

/// The all-or-nothing alternative to nesting: one layer with a two-quota
/// `Policy`. A request denied by the tighter quota consumes nothing in the
/// other (DESIGN.md invariant 2), as seen through a one-quota policy on the
/// same window.
#[tokio::test]
async fn one_layer_with_a_two_quota_policy_is_all_or_nothing() {
    let clock = clock_at(Duration::ZERO);
    let wide = named("5/1m fixed-window", "outer");
    let tight = named("1/1m fixed-window", "inner");
    let policy = Policy::new("both", [wide.clone(), tight]).unwrap();
    let limiter = Limiter::new(MemoryStore::builder().clock(clock.clone()).build(), policy);
    let service = SlidingWindowLayer::new(limiter.clone(), Header::new("x-user-id").unwrap())
        .layer(service_fn(handler));
    let statuses = [
        service
            .clone()
            .oneshot(request(Some("nia")))
            .await
            .unwrap()
            .status(),
        service
            .clone()
            .oneshot(request(Some("nia")))
            .await
            .unwrap()
            .status(),
        service
            .clone()
            .oneshot(request(Some("nia")))
            .await
            .unwrap()
            .status(),
    ];
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    // The wide quota's window holds the one admitted request only: this
    // check is the second unit, leaving 3.
    let wide_only = Policy::from(wide);
    let decision = limiter
        .check_policy(&WindowKey::for_subject("nia"), &wide_only, 1)
        .await
        .unwrap();
    assert!(decision.allowed());
    assert_eq!(decision.remaining(), 3);
}

// ---------------------------------------------------------------- shadow quotas

/// Issue 26, bug 3: a shadow quota is never advertised as spent. A policy
/// whose only quota is shadow keeps admitting past its limit; its
/// responses list it in `RateLimit-Policy` with the `shadow` marker and
/// carry no `RateLimit` (nor legacy) header, so a client honouring the
/// header never backs off from a limit that is not enforced. Beside an
/// enforced quota, `RateLimit` describes the enforced one, also once the
/// shadow quota is spent.
#[tokio::test]
async fn shadow_quotas_are_never_advertised_in_ratelimit() {
    let clock = clock_at(Duration::ZERO);
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let trial = Policy::new("trial", [named("5/1m", "minute").shadowed(true)]).unwrap();
    let service = SlidingWindowLayer::new(
        Limiter::new(store.clone(), trial),
        Header::new("x-user-id").unwrap(),
    )
    .legacy_headers(true)
    .layer(service_fn(handler));
    for n in 1..=7 {
        let response = service.clone().oneshot(request(Some("tia"))).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "request {n}");
        let headers = response.headers();
        assert_eq!(
            headers["ratelimit-policy"], r#""minute";q=5;w=60;shadow"#,
            "request {n}"
        );
        for name in [
            "ratelimit",
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
        ] {
            assert!(
                !headers.contains_key(name),
                "request {n} advertises {name}: {headers:?}"
            );
        }
    }

    let mixed = Policy::new(
        "mixed",
        [
            named("100/1m", "sustained"),
            named("2/1m", "minute").shadowed(true),
        ],
    )
    .unwrap();
    let service = SlidingWindowLayer::new(
        Limiter::new(store, mixed),
        Header::new("x-user-id").unwrap(),
    )
    .legacy_headers(true)
    .layer(service_fn(handler));
    for n in 1..=4 {
        let response = service.clone().oneshot(request(Some("max"))).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "request {n}");
        let headers = response.headers();
        assert_eq!(
            headers["ratelimit-policy"],
            r#""sustained";q=100;w=60, "minute";q=2;w=60;shadow"#
        );
        assert_eq!(
            parse_list(headers, "ratelimit"),
            [("sustained".to_owned(), params(&[("r", 100 - n), ("t", 60)]))],
            "request {n}"
        );
        assert_eq!(headers["x-ratelimit-limit"], "100");
    }
}
