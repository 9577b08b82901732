//! Two gateway nodes on one real `redis-server` share every window.
#![allow(clippy::unwrap_used)]

use axum::body::Body;
use axum::http::{Request, StatusCode};
use clap::Parser;
use tower::ServiceExt;
use tower_window_examples::gateway::{build_app, Args};
use tower_window_tests::redis_server::RedisServer;

fn hello(user: &str) -> Request<Body> {
    Request::get("/api/hello")
        .header("x-user-id", user)
        .body(Body::empty())
        .unwrap()
}

/// A gateway node on `redis_url`. The test is about shared windows, not the
/// time budget: a generous budget keeps a slow first call (connect, script
/// load) on a loaded machine from turning into a local fallback decision.
fn node(redis_url: &str) -> axum::Router {
    let args = Args::try_parse_from([
        "gateway",
        "--limit",
        "3/1h",
        "--redis-url",
        redis_url,
        "--redis-timeout-ms",
        "5000",
    ])
    .unwrap();
    build_app(args.into_config().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_sharing_redis_enforce_one_limit() {
    let redis = RedisServer::start();
    let (a, b) = (node(&redis.url()), node(&redis.url()));
    let mut statuses = Vec::new();
    for app in [&a, &b, &a, &b, &a] {
        let response = app.clone().oneshot(hello("carol")).await.unwrap();
        statuses.push(response.status());
    }
    use StatusCode as S;
    assert_eq!(
        statuses,
        [
            S::OK,
            S::OK,
            S::OK,
            S::TOO_MANY_REQUESTS,
            S::TOO_MANY_REQUESTS
        ]
    );
    // Another user still has a full window on either node.
    let response = b.clone().oneshot(hello("dave")).await.unwrap();
    assert_eq!(response.status(), S::OK);
}

#[test]
fn redis_url_and_cluster_conflict() {
    let error = Args::try_parse_from([
        "gateway",
        "--redis-url",
        "redis://127.0.0.1:1",
        "--redis-cluster",
        "redis://127.0.0.1:2",
    ])
    .unwrap_err();
    assert_eq!(error.kind(), clap::error::ErrorKind::ArgumentConflict);
}

#[test]
fn bad_redis_url_is_a_config_error() {
    let args = Args::try_parse_from(["gateway", "--redis-url", "not a url"]).unwrap();
    let error = args.into_config().unwrap_err().to_string();
    assert!(error.contains("--redis-url"), "{error}");
}

/// Two nodes with `--lease 8` on one Redis: admissions spent from leases
/// say so (`x-ratelimit-source: lease`), and together the nodes admit
/// exactly the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leasing_nodes_still_admit_exactly_the_limit() {
    let redis = RedisServer::start();
    let leasing = || {
        let args = Args::try_parse_from([
            "gateway",
            "--limit",
            "20/1h",
            "--redis-url",
            &redis.url(),
            "--redis-timeout-ms",
            "5000",
            "--lease",
            "8",
            "--debug-headers",
        ])
        .unwrap();
        tower_window_examples::gateway::build_app_with_limiter(args.into_config().unwrap())
    };
    let ((a, limiter_a), (b, limiter_b)) = (leasing(), leasing());
    let (mut ok, mut from_leases) = (0, 0);
    for i in 0..40 {
        let app = if i % 2 == 0 { &a } else { &b };
        let response = app.clone().oneshot(hello("erin")).await.unwrap();
        if response.status() == StatusCode::OK {
            ok += 1;
            let source = response.headers().get("x-ratelimit-source").unwrap();
            from_leases += usize::from(source == "lease");
        } else {
            assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        }
    }
    assert!(ok <= 20, "{ok} admitted, limit 20");
    assert!(from_leases > 0, "no admission came from a lease");
    // Shutdown: each node gives back what it holds; then every unit not
    // admitted is available again.
    limiter_a.refund_leases().await;
    limiter_b.refund_leases().await;
    let mut more = 0;
    for _ in 0..40 {
        if a.clone().oneshot(hello("erin")).await.unwrap().status() == StatusCode::OK {
            more += 1;
        }
    }
    assert_eq!(
        ok + more,
        20,
        "{ok} + {more}: refunds returned every unspent unit"
    );
}
