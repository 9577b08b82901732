//! `ProblemJson` and `RejectionResponse` without a router.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum_window_ext::{
    ProblemJson, RejectionResponse, TYPE_DEGRADED, TYPE_RATE_LIMITED, TYPE_UNAVAILABLE,
};
use http_body_util::BodyExt;
use serde_json::Value;
use tower_window::layer::{OnRejection, Rejection};
use tower_window::{Decision, DecisionSource, FallbackReason, Quota};

async fn json(body: Body) -> Value {
    serde_json::from_slice(&body.collect().await.unwrap().to_bytes()).unwrap()
}

fn denial(retry_after: Option<Duration>) -> Rejection {
    let quota: Quota = "10/1m".parse::<Quota>().unwrap().named("api").unwrap();
    Rejection::RateLimited(Decision::deny(
        quota,
        3,
        Duration::from_millis(59_001),
        retry_after,
    ))
}

#[tokio::test]
async fn cost_that_never_fits_has_null_retry_after() {
    let response = ProblemJson::new().response(&denial(None));
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    let problem = json(response.into_body()).await;
    assert_eq!(problem["type"], TYPE_RATE_LIMITED);
    assert_eq!(problem["retry_after"], Value::Null);
    assert_eq!(problem["remaining"], 3);
    assert_eq!(problem["reset_after"], 60);
    // Built by hand, without `with_policy`: the policy is not known.
    assert_eq!(problem["policy"], Value::Null);
    assert_eq!(problem["quota"], "api");
    assert_eq!(problem["definition"], "10/1m");
    assert!(problem["detail"].as_str().unwrap().contains("never"));
}

/// Issue 26: the body's `policy` is the policy's name and `quota` the
/// deciding quota's name (it was `"policy":"burst"`, the quota's name, and
/// `"quota":"1/1h"`, its DSL text, now `definition`), through the layer and
/// through `RejectionResponse` after a handler's own check, for the
/// limiter's policy and for another one given to `check_policy`.
#[tokio::test]
async fn the_body_names_the_policy_and_the_deciding_quota() {
    use axum::routing::get;
    use tower::ServiceExt;
    use tower_window::key::Header;
    use tower_window::{Limiter, MemoryStore, Policy, WindowKey};

    let policy = Policy::builder("api")
        .quota("burst", "1/1h")
        .unwrap()
        .quota("daily", "100/1d")
        .unwrap()
        .build()
        .unwrap();
    let limiter = Limiter::new(MemoryStore::new(), policy);
    let app = axum::Router::new()
        .route("/", get(|| async { "ok" }))
        .route_layer(axum_window_ext::layer(
            limiter.clone(),
            Header::new("x-user-id").unwrap(),
        ));
    let request = || {
        axum::http::Request::get("/")
            .header("x-user-id", "ann")
            .body(Body::empty())
            .unwrap()
    };
    assert_eq!(app.clone().oneshot(request()).await.unwrap().status(), 200);
    let denied = app.oneshot(request()).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    let problem = json(denied.into_body()).await;
    assert_eq!(problem["policy"], "api", "{problem}");
    assert_eq!(problem["quota"], "burst", "{problem}");
    assert_eq!(problem["definition"], "1/1h", "{problem}");
    assert_eq!(problem["limit"], 1, "{problem}");

    // A handler's own check against another policy.
    let exports = Policy::builder("exports")
        .quota("hourly", "1/1h")
        .unwrap()
        .build()
        .unwrap();
    let key = WindowKey::for_subject("ann");
    assert!(limiter
        .check_policy(&key, &exports, 1)
        .await
        .unwrap()
        .allowed());
    let decision = limiter.check_policy(&key, &exports, 1).await.unwrap();
    let response = RejectionResponse(Rejection::for_denial(
        decision,
        StatusCode::SERVICE_UNAVAILABLE,
    ))
    .into_response();
    let problem = json(response.into_body()).await;
    assert_eq!(problem["policy"], "exports", "{problem}");
    assert_eq!(problem["quota"], "hourly", "{problem}");
    assert_eq!(problem["definition"], "1/1h", "{problem}");
}

#[tokio::test]
async fn rejection_response_is_complete() {
    let response = RejectionResponse(denial(Some(Duration::from_millis(1)))).into_response();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(response.headers()[header::RETRY_AFTER], "1");
    assert!(response.headers().contains_key("ratelimit"));
    assert!(response.headers().contains_key("ratelimit-policy"));
    assert_eq!(
        response.headers()[header::CONTENT_TYPE],
        "application/problem+json"
    );
    assert!(response.extensions().get::<Rejection>().is_some());
    let problem = json(response.into_body()).await;
    assert_eq!(problem["retry_after"], 1);
}

#[tokio::test]
async fn unavailable_hides_the_message() {
    let response = RejectionResponse::unavailable("redis://secret@host refused").into_response();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(!response.headers().contains_key(header::RETRY_AFTER));
    let problem = json(response.into_body()).await;
    assert_eq!(problem["type"], TYPE_UNAVAILABLE);
    assert_eq!(problem["status"], 503);
    assert!(!problem.to_string().contains("secret"));

    let response = RejectionResponse::missing_key(StatusCode::UNAUTHORIZED).into_response();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn degraded_denial_has_its_own_type_and_the_policy_status() {
    let quota: Quota = "10/1m".parse().unwrap();
    let decision = Decision::deny(quota, 0, Duration::ZERO, Some(Duration::from_secs(1)))
        .with_source(DecisionSource::Fallback(FallbackReason::Timeout));
    let rejection = Rejection::Degraded {
        decision,
        status: StatusCode::SERVICE_UNAVAILABLE.into(),
    };
    let response = RejectionResponse(rejection).into_response();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()[header::RETRY_AFTER], "1");
    let problem = json(response.into_body()).await;
    assert_eq!(problem["type"], TYPE_DEGRADED);
    assert_eq!(problem["status"], 503);
    assert_eq!(problem["retry_after"], 1);
}
