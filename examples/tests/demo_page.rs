//! The demo page's routes, driven through `build_app`: the embedded assets,
//! and `GET /api/quota` peeking without consuming.
#![allow(clippy::unwrap_used)]

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::response::Response;
use axum::Router;
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;
use tower_window::{ManualClock, MemoryStore, Policy, Quota};
use tower_window_examples::gateway::{build_app, GatewayConfig};

/// The gateway on a store whose clock stands still.
fn app(policy: Policy) -> Router {
    let store = MemoryStore::builder()
        .clock(ManualClock::new(1_700_000_000_000_000))
        .build();
    build_app(GatewayConfig::with_store(policy, store))
}

async fn get(app: &Router, uri: &str, headers: &[(&str, &str)]) -> Response {
    let mut request = Request::get(uri);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    app.clone()
        .oneshot(request.body(Body::empty()).unwrap())
        .await
        .unwrap()
}

async fn body(response: Response) -> String {
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

fn header_of<'a>(response: &'a Response, name: &str) -> Option<&'a str> {
    response.headers().get(name).map(|v| v.to_str().unwrap())
}

#[tokio::test]
async fn serves_the_embedded_page_and_assets_unlimited() {
    let app = app(Policy::from("1/1h".parse::<Quota>().unwrap()));
    for _ in 0..3 {
        let response = get(&app, "/", &[]).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            header_of(&response, "content-type"),
            Some("text/html; charset=utf-8")
        );
        let csp = header_of(&response, "content-security-policy").unwrap();
        assert!(csp.contains("default-src 'self'"), "{csp}");
        assert!(!response.headers().contains_key("ratelimit"));
        let html = body(response).await;
        for id in [
            "id=\"messages\"",
            "id=\"send-input\"",
            "id=\"quotas\"",
            "id=\"presence\"",
            "id=\"notices\"",
            "id=\"recovery\"",
            "id=\"status\"",
        ] {
            assert!(html.contains(id), "{id}");
        }
    }
    for (path, kind) in [
        ("/demo/demo.css", "text/css; charset=utf-8"),
        ("/demo/demo.js", "text/javascript; charset=utf-8"),
    ] {
        let response = get(&app, path, &[]).await;
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        assert_eq!(header_of(&response, "content-type"), Some(kind));
        assert_eq!(
            header_of(&response, "x-content-type-options"),
            Some("nosniff")
        );
        assert!(!body(response).await.is_empty());
    }
    // The assets are the files in src/gateway/demo/, byte for byte.
    let js = body(get(&app, "/demo/demo.js", &[]).await).await;
    let file = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/src/gateway/demo/demo.js"
    ))
    .unwrap();
    assert_eq!(js, file);
}

#[tokio::test]
async fn quota_peeks_every_quota_without_consuming_it() {
    let policy = Policy::new(
        "gateway",
        [
            "3/1m".parse::<Quota>().unwrap().named("burst").unwrap(),
            "10/1h"
                .parse::<Quota>()
                .unwrap()
                .named("sustained")
                .unwrap(),
        ],
    )
    .unwrap();
    let app = app(policy);
    let user = [("x-user-id", "ann"), ("x-tenant-id", "acme")];
    let peek = "/api/quota?tenant=acme&user=ann";

    // Many peeks consume nothing: the first request still sees a full window.
    for _ in 0..5 {
        let response = get(&app, peek, &[]).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            header_of(&response, "access-control-allow-origin"),
            Some("*")
        );
        assert!(header_of(&response, "access-control-expose-headers")
            .unwrap()
            .contains("ratelimit"));
        assert_eq!(
            header_of(&response, "ratelimit-policy"),
            Some(r#""burst";q=3;w=60, "sustained";q=10;w=3600"#)
        );
        let json: Value = serde_json::from_str(&body(response).await).unwrap();
        assert_eq!(json["quotas"]["burst"]["remaining"], 3, "{json}");
        assert_eq!(json["quotas"]["burst"]["limit"], 3, "{json}");
        assert_eq!(json["quotas"]["sustained"]["remaining"], 10, "{json}");
        assert_eq!(json["degraded"], false);
        assert_eq!(
            (json["tenant"].as_str(), json["user"].as_str()),
            (Some("acme"), Some("ann"))
        );
    }
    let response = get(&app, "/api/hello", &user).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(header_of(&response, "access-control-allow-origin"), None);
    let hello: Value = serde_json::from_str(&body(response).await).unwrap();
    assert_eq!(hello["remaining"], 2);

    // The peek follows the requests, by query parameters or by headers.
    for response in [
        get(&app, peek, &[]).await,
        get(&app, "/api/quota", &user).await,
    ] {
        assert_eq!(
            header_of(&response, "ratelimit"),
            Some(r#""burst";r=2;t=60"#)
        );
        let json: Value = serde_json::from_str(&body(response).await).unwrap();
        assert_eq!(json["quotas"]["burst"]["remaining"], 2, "{json}");
        assert_eq!(json["quotas"]["burst"]["reset_after_ms"], 60_000, "{json}");
        assert_eq!(json["quotas"]["sustained"]["remaining"], 9, "{json}");
    }
    // Spend the burst: the peek shows 0 left and still consumes nothing
    // (sustained stays at 7 after two more admissions).
    for expected in [
        StatusCode::OK,
        StatusCode::OK,
        StatusCode::TOO_MANY_REQUESTS,
    ] {
        assert_eq!(get(&app, "/api/hello", &user).await.status(), expected);
    }
    let json: Value = serde_json::from_str(&body(get(&app, peek, &[]).await).await).unwrap();
    assert_eq!(json["quotas"]["burst"]["remaining"], 0, "{json}");
    assert_eq!(json["quotas"]["sustained"]["remaining"], 7, "{json}");
    // Another tenant's same user is untouched.
    let json: Value =
        serde_json::from_str(&body(get(&app, "/api/quota?tenant=other&user=ann", &[]).await).await)
            .unwrap();
    assert_eq!(json["quotas"]["burst"]["remaining"], 3, "{json}");
}

#[tokio::test]
async fn quota_has_its_own_limit_and_rejects_bad_keys() {
    let app = app(Policy::from("5/1m".parse::<Quota>().unwrap()));
    // `quota-poll=60/1m`: the 61st poll in the window is refused.
    let mut statuses = Vec::new();
    for _ in 0..61 {
        statuses.push(get(&app, "/api/quota?user=poller", &[]).await.status());
    }
    assert!(statuses[..60].iter().all(|s| *s == StatusCode::OK));
    let refused = get(&app, "/api/quota?user=poller", &[]).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(refused.headers().contains_key("retry-after"));
    // The polls consumed nothing of the user's own quota.
    let hello = get(&app, "/api/hello", &[("x-user-id", "poller")]).await;
    let hello: Value = serde_json::from_str(&body(hello).await).unwrap();
    assert_eq!(hello["remaining"], 4);

    // No user, an empty one, or one too long: 400 problem+json.
    let long = format!("/api/quota?user={}", "x".repeat(257));
    for uri in [
        "/api/quota",
        "/api/quota?user=",
        "/api/quota?tenant=acme",
        long.as_str(),
    ] {
        let response = get(&app, uri, &[]).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{uri}");
        assert_eq!(
            header_of(&response, header::CONTENT_TYPE.as_str()),
            Some("application/problem+json"),
            "{uri}"
        );
    }
    // A malformed query (a field twice) is a 400 from the extractor.
    let response = get(&app, "/api/quota?user=a&user=b", &[]).await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
}
