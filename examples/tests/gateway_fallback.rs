//! The gateway's fallback flags and debug header: Redis down (a loopback port
//! where nothing listens) under each `--fallback`, and a real `redis-server`
//! for the store and local-cache sources.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request, Response, StatusCode};
use axum::Router;
use clap::Parser;
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;
use tower_window_examples::gateway::{build_app, Args, RATELIMIT_SOURCE};
use tower_window_tests::redis_server::{closed_port, RedisServer};

/// A loopback URL where nothing listens: a port the harness reserved and
/// never started anything on, so no other test's server can appear there.
fn dead_redis_url() -> String {
    format!("redis://127.0.0.1:{}", closed_port())
}

fn node(flags: &[&str]) -> Router {
    let mut argv = vec!["gateway"];
    argv.extend_from_slice(flags);
    build_app(Args::try_parse_from(argv).unwrap().into_config().unwrap())
}

fn hello(user: &str) -> Request<Body> {
    Request::get("/api/hello")
        .header("x-user-id", user)
        .body(Body::empty())
        .unwrap()
}

/// One request. The guard only keeps a broken build from hanging the suite
/// (it is not a timing assertion).
async fn send(app: &Router, request: Request<Body>) -> Response<Body> {
    tokio::time::timeout(Duration::from_secs(10), app.clone().oneshot(request))
        .await
        .expect("the gateway answers within its budget, not after a hang")
        .unwrap()
}

fn source(response: &Response<Body>) -> Option<&str> {
    response
        .headers()
        .get(RATELIMIT_SOURCE)
        .map(|v| v.to_str().unwrap())
}

fn assert_fallback_source(response: &Response<Body>) {
    let source = source(response).expect("debug header present");
    assert!(
        source.starts_with("fallback(") && source.ends_with(')'),
        "{source}"
    );
}

async fn json(response: Response<Body>) -> Value {
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_fail_open_admits_degraded() {
    let url = dead_redis_url();
    let app = node(&[
        "--limit",
        "1/1h",
        "--redis-url",
        &url,
        "--fallback",
        "fail-open",
        "--debug-headers",
    ]);
    // Past the limit: fail-open admits everything, each one marked degraded.
    for _ in 0..3 {
        let response = send(&app, hello("ann")).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_fallback_source(&response);
        assert_eq!(json(response).await["degraded"], true);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_fail_closed_is_503_problem() {
    let url = dead_redis_url();
    let app = node(&[
        "--redis-url",
        &url,
        "--fallback",
        "fail-closed",
        "--redis-timeout-ms",
        "30",
        "--debug-headers",
    ]);
    for _ in 0..2 {
        let response = send(&app, hello("bea")).await;
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_fallback_source(&response);
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            "application/problem+json"
        );
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
        let body = json(response).await;
        assert_eq!(body["status"], 503);
        assert_eq!(body["title"], "Rate limiter degraded");
    }
    // Unlimited routes do not depend on Redis.
    let response = send(&app, Request::get("/healthz").body(Body::empty()).unwrap()).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(source(&response), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_local_admits_the_node_share_then_429() {
    let url = dead_redis_url();
    // 4 per hour over 2 expected nodes: this node admits 2 on its own.
    let app = node(&[
        "--limit",
        "4/1h",
        "--redis-url",
        &url,
        "--expected-nodes",
        "2",
        "--debug-headers",
    ]);
    for _ in 0..2 {
        let response = send(&app, hello("cy")).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_fallback_source(&response);
    }
    let response = send(&app, hello("cy")).await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_fallback_source(&response);
    assert!(response.headers().contains_key(header::RETRY_AFTER));
    assert_eq!(json(response).await["title"], "Rate limiter degraded");
    // Another user has a share of their own.
    let response = send(&app, hello("dee")).await;
    assert_eq!(response.status(), StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debug_header_is_off_by_default() {
    let url = dead_redis_url();
    let app = node(&["--redis-url", &url]);
    let response = send(&app, hello("eve")).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(source(&response), None);
    assert_eq!(json(response).await["degraded"], true);

    let app = node(&["--limit", "1/1h"]);
    for status in [StatusCode::OK, StatusCode::TOO_MANY_REQUESTS] {
        let response = send(&app, hello("eve")).await;
        assert_eq!(response.status(), status);
        assert_eq!(source(&response), None);
    }
}

#[tokio::test]
async fn debug_header_on_the_embedded_store() {
    let app = node(&["--limit", "1/1h", "--debug-headers"]);
    for status in [StatusCode::OK, StatusCode::TOO_MANY_REQUESTS] {
        let response = send(&app, hello("fay")).await;
        assert_eq!(response.status(), status);
        assert_eq!(source(&response), Some("store"));
    }
    // No key, no decision, no header.
    let response = send(
        &app,
        Request::get("/api/hello").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(source(&response), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_redis_store_then_local_cache() {
    let redis = RedisServer::start();
    let url = redis.url();
    // The healthy path is under test, not the budget: a generous one keeps
    // a slow first call (connect, script load) from falling back.
    let app = node(&[
        "--limit",
        "1/1h",
        "--redis-url",
        &url,
        "--redis-timeout-ms",
        "5000",
        "--debug-headers",
    ]);
    let response = send(&app, hello("gus")).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(source(&response), Some("store"));
    assert_eq!(json(response).await["degraded"], false);
    // Redis denies and the node remembers the denial ...
    let response = send(&app, hello("gus")).await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(source(&response), Some("store"));
    // ... so repeated requests are denied locally, without Redis.
    for _ in 0..3 {
        let response = send(&app, hello("gus")).await;
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(source(&response), Some("local_cache"));
        assert_eq!(json(response).await["title"], "Too Many Requests");
    }
}
