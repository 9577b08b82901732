//! axum routers end to end through `tower::ServiceExt::oneshot`.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{header, Request, StatusCode};
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use axum_window_ext::{
    ConnectInfoIp, PathParam, ProblemJson, RateLimitInfo, TYPE_MISSING_KEY, TYPE_RATE_LIMITED,
};
use http_body_util::BodyExt;
use serde_json::Value;
use sfv::{BareItem, List, ListEntry, Parser};
use tower::ServiceExt;
use tower_window::key::{Header, TrustedProxies};
use tower_window::layer::Rejection;
use tower_window::{Limiter, ManualClock, MemoryStore, Quota};

const T0: u64 = 1_700_000_000_000_000;

fn limiter(quota: &str) -> (Limiter, ManualClock) {
    let clock = ManualClock::new(T0);
    let store = MemoryStore::builder().clock(clock.clone()).build();
    (Limiter::new(store, quota.parse::<Quota>().unwrap()), clock)
}

fn request(path: &str, user: Option<&str>) -> Request<Body> {
    let mut builder = Request::get(path);
    if let Some(user) = user {
        builder = builder.header("x-user-id", user);
    }
    builder.body(Body::empty()).unwrap()
}

async fn body_json(response: Response) -> Value {
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}

async fn body_text(response: Response) -> String {
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// One structured-field list member: its string and integer parameters.
fn sf_item(response: &Response, name: &str) -> (String, Vec<(String, i64)>) {
    let value = response.headers()[name].to_str().unwrap();
    let list: List = Parser::new(value).parse().unwrap();
    assert_eq!(list.len(), 1, "{name}: {value}");
    let ListEntry::Item(item) = &list[0] else {
        panic!("{name}: not an item: {value}")
    };
    let BareItem::String(policy) = &item.bare_item else {
        panic!("{name}: not a string: {value}")
    };
    let params = item
        .params
        .iter()
        .map(|(k, v)| {
            let BareItem::Integer(n) = v else {
                panic!("{name}: {k} is not an integer: {value}")
            };
            (k.as_str().to_owned(), i64::from(*n))
        })
        .collect();
    (policy.as_str().to_owned(), params)
}

fn param(params: &[(String, i64)], key: &str) -> i64 {
    params.iter().find(|(k, _)| k == key).unwrap().1
}

async fn remaining(RateLimitInfo(decision): RateLimitInfo) -> String {
    decision.remaining().to_string()
}

fn hello_app(limiter: Limiter) -> Router {
    Router::new()
        .route("/hello", get(remaining))
        .layer(axum_window_ext::layer(
            limiter,
            Header::new("x-user-id").unwrap(),
        ))
}

#[tokio::test]
async fn layer_allows_with_headers_then_429_problem() {
    let (limiter, clock) = limiter("2/1m");
    let app = hello_app(limiter);

    let response = app
        .clone()
        .oneshot(request("/hello", Some("alice")))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let (name, policy) = sf_item(&response, "ratelimit-policy");
    assert_eq!(name, "default");
    assert_eq!(param(&policy, "q"), 2);
    assert_eq!(param(&policy, "w"), 60);
    let (name, state) = sf_item(&response, "ratelimit");
    assert_eq!(name, "default");
    assert_eq!(param(&state, "r"), 1);
    assert_eq!(param(&state, "t"), 60);
    assert!(!response.headers().contains_key(header::RETRY_AFTER));
    assert_eq!(
        body_text(response).await,
        "1",
        "the handler saw the Decision"
    );

    clock.advance(Duration::from_millis(10_500));
    let response = app
        .clone()
        .oneshot(request("/hello", Some("alice")))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(body_text(response).await, "0");

    let response = app
        .clone()
        .oneshot(request("/hello", Some("alice")))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        response.headers()[header::CONTENT_TYPE],
        "application/problem+json"
    );
    // The oldest admission expires 49.5 s from now: rounded up, never down.
    assert_eq!(response.headers()[header::RETRY_AFTER], "50");
    let (_, state) = sf_item(&response, "ratelimit");
    assert_eq!(param(&state, "r"), 0);
    assert!(matches!(
        response.extensions().get::<Rejection>(),
        Some(Rejection::RateLimited(_))
    ));
    let problem = body_json(response).await;
    assert_eq!(problem["type"], TYPE_RATE_LIMITED);
    assert_eq!(problem["title"], "Too Many Requests");
    assert_eq!(problem["status"], 429);
    assert_eq!(problem["retry_after"], 50);
    assert_eq!(problem["limit"], 2);
    assert_eq!(problem["remaining"], 0);
    // An unnamed quota is a one-quota policy of its name, `default`.
    assert_eq!(problem["policy"], "default");
    assert_eq!(problem["quota"], "default");
    assert_eq!(problem["definition"], "2/1m");
    assert!(problem["detail"].as_str().unwrap().contains("exhausted"));

    // Other users are unaffected; the same user is admitted once a slot frees.
    let response = app
        .clone()
        .oneshot(request("/hello", Some("bob")))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    clock.advance(Duration::from_millis(49_500));
    let response = app
        .clone()
        .oneshot(request("/hello", Some("alice")))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
}

#[tokio::test]
async fn missing_key_is_400_problem() {
    let (limiter, _clock) = limiter("2/1m");
    let response = hello_app(limiter)
        .oneshot(request("/hello", None))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        response.headers()[header::CONTENT_TYPE],
        "application/problem+json"
    );
    assert!(!response.headers().contains_key(header::RETRY_AFTER));
    let problem = body_json(response).await;
    assert_eq!(problem["type"], TYPE_MISSING_KEY);
    assert_eq!(problem["status"], 400);
    assert_eq!(problem["title"], "Missing rate-limit key");
    assert!(problem.get("retry_after").is_none());
}

#[tokio::test]
async fn layer_covers_the_fallback_route_layer_does_not() {
    let (limiter, _clock) = limiter("1/1m");
    let layered = Router::new()
        .route("/a", get(|| async { "a" }))
        .layer(axum_window_ext::layer(
            limiter,
            Header::new("x-user-id").unwrap(),
        ));
    let response = layered
        .clone()
        .oneshot(request("/nope", Some("u")))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    let response = layered
        .clone()
        .oneshot(request("/a", Some("u")))
        .await
        .unwrap();
    assert_eq!(
        response.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "the 404 counted"
    );

    let (limiter, _clock) = self::limiter("1/1m");
    let routed = Router::new()
        .route("/a", get(|| async { "a" }))
        .route("/b", get(|| async { "b" }))
        .route_layer(axum_window_ext::layer(
            limiter,
            Header::new("x-user-id").unwrap(),
        ))
        .route("/open", get(|| async { "open" }));
    for _ in 0..3 {
        let response = routed
            .clone()
            .oneshot(request("/nope", Some("u")))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
        let response = routed
            .clone()
            .oneshot(request("/open", None))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert!(!response.headers().contains_key("ratelimit"));
    }
    let response = routed
        .clone()
        .oneshot(request("/a", Some("u")))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    // One limiter for the whole route_layer: /b shares /a's window.
    let response = routed
        .clone()
        .oneshot(request("/b", Some("u")))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
}

/// The pattern of the READMEs: the layer on the method router
/// (`get(handler).route_layer(layer)`). A method the route does not serve
/// (axum's 405) and a path no route has (404) are then not charged.
#[tokio::test]
async fn the_method_route_layer_charges_neither_405_nor_404() {
    let (limiter, _clock) = limiter("2/1m");
    let app = Router::new().route(
        "/hello",
        get(|| async { "hello" }).route_layer(axum_window_ext::layer(
            limiter,
            Header::new("x-user-id").unwrap(),
        )),
    );
    let call = |method: &str, path: &str| {
        let request = Request::builder()
            .method(method)
            .uri(path)
            .header("x-user-id", "u")
            .body(Body::empty())
            .unwrap();
        app.clone().oneshot(request)
    };
    for _ in 0..3 {
        for method in ["POST", "PUT", "DELETE", "PATCH"] {
            let response = call(method, "/hello").await.unwrap();
            assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
            assert_eq!(response.headers()[header::ALLOW], "GET,HEAD");
            assert!(!response.headers().contains_key("ratelimit"), "{method}");
        }
        let response = call("GET", "/nope").await.unwrap();
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
    }
    let response = call("GET", "/hello").await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["ratelimit"], r#""default";r=1;t=60"#);
    // HEAD is served (by the GET handler) and so charged.
    assert_eq!(
        call("HEAD", "/hello").await.unwrap().status(),
        StatusCode::OK
    );
    assert_eq!(
        call("GET", "/hello").await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );

    // Why the READMEs do not use `Router::route_layer`: it layers each
    // route's method router whole, axum's 405 answer included, so a
    // refused method is charged (404s, which no route has, are not).
    let (limiter, _clock) = self::limiter("2/1m");
    let routed = Router::new()
        .route("/hello", get(|| async { "hello" }))
        .route_layer(axum_window_ext::layer(
            limiter,
            Header::new("x-user-id").unwrap(),
        ));
    let post = Request::post("/hello")
        .header("x-user-id", "u")
        .body(Body::empty())
        .unwrap();
    let response = routed.clone().oneshot(post).await.unwrap();
    assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
    let response = routed.oneshot(request("/hello", Some("u"))).await.unwrap();
    assert_eq!(
        response.headers()["ratelimit"],
        r#""default";r=0;t=60"#,
        "the 405 was charged"
    );
}

#[tokio::test]
async fn rate_limit_info_without_layer() {
    async fn optional(info: Option<RateLimitInfo>) -> &'static str {
        if info.is_some() {
            "some"
        } else {
            "none"
        }
    }
    let app = Router::new()
        .route("/required", get(remaining))
        .route("/optional", get(optional));
    let response = app
        .clone()
        .oneshot(request("/required", None))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert!(body_text(response).await.contains("layer"));
    let response = app
        .clone()
        .oneshot(request("/optional", None))
        .await
        .unwrap();
    assert_eq!(body_text(response).await, "none");

    let (limiter, _clock) = limiter("5/1m");
    let app = app.layer(axum_window_ext::layer(
        limiter,
        Header::new("x-user-id").unwrap(),
    ));
    let response = app
        .clone()
        .oneshot(request("/optional", Some("u")))
        .await
        .unwrap();
    assert_eq!(body_text(response).await, "some");
}

#[tokio::test]
async fn path_param_limits_per_value() {
    for use_route_layer in [true, false] {
        let (limiter, _clock) = limiter("1/1m");
        let layer = axum_window_ext::layer(limiter, PathParam::new("id"));
        let router = Router::new().route("/users/{id}/posts", get(|| async { "posts" }));
        let app = if use_route_layer {
            router.route_layer(layer)
        } else {
            router.layer(layer)
        };
        let status = |path: &'static str| {
            let app = app.clone();
            async move { app.oneshot(request(path, None)).await.unwrap().status() }
        };
        assert_eq!(status("/users/1/posts").await, StatusCode::OK);
        assert_eq!(
            status("/users/1/posts").await,
            StatusCode::TOO_MANY_REQUESTS
        );
        assert_eq!(status("/users/2/posts").await, StatusCode::OK);
        // Percent-decoded: `%41` is `A`.
        assert_eq!(status("/users/%41/posts").await, StatusCode::OK);
        assert_eq!(
            status("/users/A/posts").await,
            StatusCode::TOO_MANY_REQUESTS
        );
    }
}

#[tokio::test]
async fn path_param_inside_a_nested_router() {
    let (limiter, _clock) = limiter("1/1m");
    let inner = Router::new()
        .route("/users/{id}", get(|| async { "user" }))
        .route_layer(axum_window_ext::layer(limiter, PathParam::new("id")));
    let app = Router::new().nest("/t/{tenant}", inner);
    let status = |path: &'static str| {
        let app = app.clone();
        async move { app.oneshot(request(path, None)).await.unwrap().status() }
    };
    assert_eq!(status("/t/acme/users/7").await, StatusCode::OK);
    assert_eq!(
        status("/t/other/users/7").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(status("/t/acme/users/8").await, StatusCode::OK);
}

#[tokio::test]
async fn path_param_missing_is_400() {
    let (limiter, _clock) = limiter("1/1m");
    let app = Router::new()
        .route("/items", get(|| async { "items" }))
        .route_layer(axum_window_ext::layer(limiter, PathParam::new("id")));
    let response = app.oneshot(request("/items", None)).await.unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
}

fn from_peer(peer: &str, forwarded_for: Option<&str>) -> Request<Body> {
    let mut request = request("/hello", None);
    let peer: SocketAddr = peer.parse().unwrap();
    request.extensions_mut().insert(ConnectInfo(peer));
    if let Some(xff) = forwarded_for {
        request
            .headers_mut()
            .insert("x-forwarded-for", xff.parse().unwrap());
    }
    request
}

#[tokio::test]
async fn connect_info_ip_ignores_spoofed_forwarded_for() {
    let (limiter, _clock) = limiter("1/1m");
    let app = Router::new()
        .route("/hello", get(remaining))
        .layer(axum_window_ext::layer(limiter, ConnectInfoIp::new()));
    let send = |request: Request<Body>| {
        let app = app.clone();
        async move { app.oneshot(request).await.unwrap().status() }
    };
    assert_eq!(
        send(from_peer("192.0.2.1:1000", None)).await,
        StatusCode::OK
    );
    // No trusted proxies: X-Forwarded-For changes nothing, ports do not matter.
    assert_eq!(
        send(from_peer("192.0.2.1:2000", Some("198.51.100.7"))).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        send(from_peer("192.0.2.2:1000", None)).await,
        StatusCode::OK
    );
    // No ConnectInfo: no key.
    assert_eq!(send(request("/hello", None)).await, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn connect_info_ip_behind_trusted_proxy() {
    let (limiter, _clock) = limiter("1/1m");
    let proxies: TrustedProxies = "10.0.0.0/8".parse().unwrap();
    let app = Router::new()
        .route("/hello", get(remaining))
        .layer(axum_window_ext::layer(
            limiter,
            ConnectInfoIp::new().trusted_proxies(proxies),
        ));
    let send = |request: Request<Body>| {
        let app = app.clone();
        async move { app.oneshot(request).await.unwrap().status() }
    };
    let proxy = "10.1.2.3:443";
    assert_eq!(
        send(from_peer(proxy, Some("203.0.113.9"))).await,
        StatusCode::OK
    );
    // The client prepends a made-up address: the right-most untrusted hop
    // is still 203.0.113.9.
    assert_eq!(
        send(from_peer(proxy, Some("198.51.100.1, 203.0.113.9"))).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        send(from_peer(proxy, Some("203.0.113.9, 10.9.9.9"))).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        send(from_peer(proxy, Some("203.0.113.10"))).await,
        StatusCode::OK
    );
    // An untrusted peer's header is ignored.
    assert_eq!(
        send(from_peer("203.0.113.9:5000", Some("198.51.100.50"))).await,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[test]
fn bounds() {
    fn assert_clone_send_sync<T: Clone + Send + Sync + 'static>() {}
    assert_clone_send_sync::<axum_window_ext::AxumSlidingWindowLayer<Header>>();
    assert_clone_send_sync::<axum_window_ext::AxumSlidingWindowLayer<PathParam>>();
    assert_clone_send_sync::<axum_window_ext::AxumSlidingWindowLayer<ConnectInfoIp>>();
    assert_clone_send_sync::<
        tower_window::SlidingWindow<
            axum::routing::Route,
            Header,
            tower_window::layer::UnitCost,
            tower_window::layer::Http<ProblemJson>,
        >,
    >();
    assert_clone_send_sync::<ProblemJson>();
    assert_clone_send_sync::<RateLimitInfo>();
    assert_clone_send_sync::<axum_window_ext::RejectionResponse>();
    assert_clone_send_sync::<axum_window_ext::MissingRateLimitInfo>();
}
