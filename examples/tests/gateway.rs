//! The example gateway, driven through `build_app`.
#![allow(clippy::unwrap_used)]

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use futures_util::{SinkExt, StreamExt};
use http_body_util::BodyExt;
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message;
use tower::ServiceExt;
use tower_window::{ManualClock, MemoryStore, Quota};
use tower_window_examples::gateway::{build_app, GatewayConfig};

/// The gateway on a store whose clock stands still: windows never move
/// during a test.
fn app(limit: &str) -> Router {
    let store = MemoryStore::builder()
        .clock(ManualClock::new(1_700_000_000_000_000))
        .build();
    build_app(GatewayConfig::with_store(
        limit.parse::<Quota>().unwrap(),
        store,
    ))
}

fn get(path: &str, user: Option<&str>) -> Request<Body> {
    let mut builder = Request::get(path);
    if let Some(user) = user {
        builder = builder.header("x-user-id", user);
    }
    builder.body(Body::empty()).unwrap()
}

fn ws_request(user: &str) -> Request<Body> {
    Request::get("/ws")
        .header("x-user-id", user)
        .header(header::CONNECTION, "upgrade")
        .header(header::UPGRADE, "websocket")
        .header(header::SEC_WEBSOCKET_VERSION, "13")
        .header(header::SEC_WEBSOCKET_KEY, "dGhlIHNhbXBsZSBub25jZQ==")
        .body(Body::empty())
        .unwrap()
}

async fn json(response: axum::response::Response) -> Value {
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}

#[tokio::test]
async fn healthz_is_not_limited() {
    let app = app("1/1m");
    for _ in 0..5 {
        let response = app.clone().oneshot(get("/healthz", None)).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert!(!response.headers().contains_key("ratelimit"));
    }
}

#[tokio::test]
async fn hello_then_429() {
    let app = app("2/1m");
    for remaining in [1, 0] {
        let response = app
            .clone()
            .oneshot(get("/api/hello", Some("alice")))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert!(response.headers().contains_key("ratelimit"));
        let body = json(response).await;
        assert_eq!(body["message"], "hello, alice");
        assert_eq!(body["remaining"], remaining);
    }
    let response = app
        .clone()
        .oneshot(get("/api/hello", Some("alice")))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(response.headers()[header::RETRY_AFTER], "60");
    assert_eq!(
        response.headers()[header::CONTENT_TYPE],
        "application/problem+json"
    );
    let body = json(response).await;
    assert_eq!(body["status"], 429);

    // Another user, and the same user in another tenant, have their own windows.
    let response = app
        .clone()
        .oneshot(get("/api/hello", Some("bob")))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let request = Request::get("/api/hello")
        .header("x-user-id", "alice")
        .header("x-tenant-id", "acme")
        .body(Body::empty())
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
}

#[tokio::test]
async fn missing_user_is_400_problem() {
    let response = app("2/1m").oneshot(get("/api/hello", None)).await.unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        response.headers()[header::CONTENT_TYPE],
        "application/problem+json"
    );
    let body = json(response).await;
    assert_eq!(body["status"], 400);
    assert_eq!(body["title"], "Missing rate-limit key");
}

#[tokio::test]
async fn websocket_upgrade_is_limited() {
    let app = app("2/1m");
    // Within the limit the request reaches the handler. `oneshot` has no
    // connection to upgrade, so axum answers 426 — not the limiter.
    let response = app.clone().oneshot(ws_request("carol")).await.unwrap();
    assert_eq!(response.status(), StatusCode::UPGRADE_REQUIRED);
    assert!(response.headers().contains_key("ratelimit"));
    // /api/hello and /ws share the window.
    let response = app
        .clone()
        .oneshot(get("/api/hello", Some("carol")))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let response = app.clone().oneshot(ws_request("carol")).await.unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        response.headers()[header::CONTENT_TYPE],
        "application/problem+json"
    );
}

/// A real server on loopback: the echo works, and the upgrade is refused
/// with 429 once the window is full.
#[tokio::test]
async fn websocket_echo_over_loopback() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        axum::serve(listener, app("1/1m")).await.unwrap();
    });

    let url = format!("ws://{address}/ws");
    let (mut socket, response) = tokio_tungstenite::connect_async(ws_client_request(&url, "dave"))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SWITCHING_PROTOCOLS);
    socket.send(Message::text("ping?")).await.unwrap();
    let echoed = socket.next().await.unwrap().unwrap();
    assert_eq!(echoed, Message::text("ping?"));
    socket.close(None).await.unwrap();

    match tokio_tungstenite::connect_async(ws_client_request(&url, "dave")).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        }
        other => panic!("expected a 429 handshake failure, got {other:?}"),
    }
    server.abort();
}

fn ws_client_request(
    url: &str,
    user: &str,
) -> tokio_tungstenite::tungstenite::handshake::client::Request {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut request = url.into_client_request().unwrap();
    request
        .headers_mut()
        .insert("x-user-id", user.parse().unwrap());
    request
}

/// `--limit burst=2/1m --limit sustained=3/1h`: one policy per user. The
/// headers list both quotas and name the tightest; a request denied by one
/// quota consumes nothing from the other.
#[tokio::test]
async fn several_limits_are_one_policy() {
    use clap::Parser;
    let args = tower_window_examples::gateway::Args::try_parse_from([
        "gateway",
        "--limit",
        "burst=2/1m",
        "--limit",
        "sustained=3/1h",
    ])
    .unwrap();
    let clock = ManualClock::new(1_700_000_000_000_000);
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let config = GatewayConfig::with_store(args.policy().unwrap(), store);
    let app = build_app(config);
    let call = || app.clone().oneshot(get("/api/hello", Some("sam")));
    let response = call().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()["ratelimit-policy"],
        r#""burst";q=2;w=60, "sustained";q=3;w=3600"#
    );
    // 1 of 2 left is a smaller share than 2 of 3.
    assert_eq!(response.headers()["ratelimit"], r#""burst";r=1;t=60"#);
    assert_eq!(call().await.unwrap().status(), StatusCode::OK);
    // burst is spent: denied, and sustained keeps its last unit.
    for _ in 0..3 {
        let denied = call().await.unwrap();
        assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(denied.headers()["ratelimit"], r#""burst";r=0;t=60"#);
    }
    // A minute later burst has room again, and sustained still has the one
    // unit the three denials did not take: admitted once, then sustained
    // (the hourly quota) is the one that denies.
    clock.advance(std::time::Duration::from_secs(60));
    assert_eq!(call().await.unwrap().status(), StatusCode::OK);
    let denied = call().await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.headers()["ratelimit"], r#""sustained";r=0;t=3600"#);
}

/// Requests the router refuses — a method a route does not serve (405) or
/// a path it does not have (404) — are not charged: afterwards the user
/// still has the whole quota, with and without `--debug-headers` (whose
/// middleware sits inside and outside the limit) and with `--tenants`.
#[tokio::test]
async fn refused_requests_are_not_charged() {
    use clap::Parser;
    let dir = tempfile::tempdir().unwrap();
    let tenants = dir.path().join("tenants.toml");
    std::fs::write(
        &tenants,
        "[default]\nquotas = { default = \"100/1m\" }\n[tenants.acme]\nquotas = { default = \"100/1m\" }\n",
    )
    .unwrap();
    let variants: [&[&str]; 3] = [
        &[],
        &["--debug-headers"],
        &["--tenants", tenants.to_str().unwrap()],
    ];
    for flags in variants {
        let mut argv = vec!["gateway", "--limit", "100/1m"];
        argv.extend_from_slice(flags);
        let args = tower_window_examples::gateway::Args::try_parse_from(argv).unwrap();
        let app = build_app(args.into_config().unwrap());
        let request = |method: &str, path: &str| {
            Request::builder()
                .method(method)
                .uri(path)
                .header("x-user-id", "refused")
                .header("x-tenant-id", "acme")
                .body(Body::empty())
                .unwrap()
        };
        for (method, path, status) in [
            ("POST", "/api/hello", StatusCode::METHOD_NOT_ALLOWED),
            ("PUT", "/api/hello", StatusCode::METHOD_NOT_ALLOWED),
            ("DELETE", "/api/hello", StatusCode::METHOD_NOT_ALLOWED),
            ("POST", "/ws", StatusCode::METHOD_NOT_ALLOWED),
            ("GET", "/api/hello/extra", StatusCode::NOT_FOUND),
            ("GET", "/api/nope", StatusCode::NOT_FOUND),
            ("POST", "/api/nope", StatusCode::NOT_FOUND),
        ] {
            for _ in 0..3 {
                let response = app.clone().oneshot(request(method, path)).await.unwrap();
                assert_eq!(response.status(), status, "{flags:?}: {method} {path}");
                assert!(
                    !response.headers().contains_key("ratelimit"),
                    "{flags:?}: {method} {path} was checked"
                );
            }
        }
        let response = app
            .clone()
            .oneshot(request("GET", "/api/hello"))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            response.headers()["ratelimit"],
            r#""default";r=99;t=60"#,
            "{flags:?}: 21 refused requests charged nothing"
        );
        assert_eq!(json(response).await["remaining"], 99, "{flags:?}");
    }
}
