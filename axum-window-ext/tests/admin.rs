//! The tenant admin router on its own: the listing's default, handing a
//! tenant back to the file, closing a tenant served by the default, and
//! problem bodies (with a `type`) for unknown routes and methods.
#![allow(clippy::unwrap_used)]

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use axum_window_ext::admin::{self, TYPE_METHOD_NOT_ALLOWED, TYPE_NOT_FOUND};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;
use tower_window::tenant::{Resolution, TenantRegistry, TenantSpec, TenantsConfig};
use tower_window::{Limiter, MemoryStore, Quota};

const TOKEN: &str = "t0ken";

fn spec(quotas: &[(&str, &str)]) -> TenantSpec {
    let mut builder = TenantSpec::builder();
    for (name, dsl) in quotas {
        builder = builder.quota(name, dsl).unwrap();
    }
    builder.build().unwrap()
}

fn app(config: TenantsConfig) -> (Router, TenantRegistry) {
    let registry = TenantRegistry::new(config);
    let limiter = Limiter::new(MemoryStore::new(), "100/1m".parse::<Quota>().unwrap());
    let app = Router::new().nest("/admin", admin::router(registry.clone(), limiter, TOKEN));
    (app, registry)
}

async fn call(
    app: &Router,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, axum::http::HeaderMap, Value) {
    let builder = Request::builder()
        .method(method)
        .uri(path)
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"));
    let request = match body {
        Some(body) => builder.body(Body::from(body.to_string())).unwrap(),
        None => builder.body(Body::empty()).unwrap(),
    };
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        headers,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

fn limit_of(registry: &TenantRegistry, tenant: &str) -> Option<u32> {
    match registry.resolve(tenant.as_bytes()) {
        Resolution::Limited(policy) => Some(policy.first().limit()),
        _ => None,
    }
}

/// A problem body: its content type, status and a `type`.
fn assert_problem(
    status: StatusCode,
    headers: &axum::http::HeaderMap,
    body: &Value,
    want: StatusCode,
    kind: &str,
) {
    assert_eq!(status, want, "{body}");
    assert_eq!(headers[header::CONTENT_TYPE], "application/problem+json");
    assert_eq!(body["type"], kind, "{body}");
    assert_eq!(body["status"], want.as_u16());
    assert!(
        body["title"].is_string() && body["detail"].is_string(),
        "{body}"
    );
}

#[tokio::test]
async fn the_listing_shows_the_default_marked_as_such() {
    let file = TenantsConfig::new()
        .with_tenant("acme", spec(&[("burst", "3/1m")]))
        .unwrap()
        .with_default(spec(&[("minute", "60/1m")]));
    let (app, _) = app(file);
    let (status, _, body) = call(&app, "GET", "/admin/tenants", None).await;
    assert_eq!(status, 200);
    assert_eq!(
        body,
        json!({
            "tenants": [{"name": "acme", "quotas": {"burst": "3/1m"}, "source": "file"}],
            "default": {"quotas": {"minute": "60/1m"}, "source": "default"},
        })
    );
    // Without a [default]: null.
    let (app, _) = app_without_default();
    let (_, _, body) = call(&app, "GET", "/admin/tenants", None).await;
    assert_eq!(body["default"], Value::Null);
    assert_eq!(body["tenants"].as_array().unwrap().len(), 1);
}

fn app_without_default() -> (Router, TenantRegistry) {
    app(TenantsConfig::new()
        .with_tenant("acme", spec(&[("burst", "3/1m")]))
        .unwrap())
}

#[tokio::test]
async fn a_tenant_changed_at_runtime_can_be_handed_back_to_the_file() {
    let file = || {
        TenantsConfig::new()
            .with_tenant("acme", spec(&[("burst", "3/1m")]))
            .unwrap()
            .with_default(spec(&[("minute", "60/1m")]))
    };
    let (app, registry) = app(file());
    let put = json!({"quotas": {"burst": "9/1m"}});
    assert_eq!(
        call(&app, "PUT", "/admin/tenants/acme", Some(put)).await.0,
        200
    );
    // A reload does not undo the runtime change...
    registry.set_config(
        TenantsConfig::new()
            .with_tenant("acme", spec(&[("burst", "4/1m")]))
            .unwrap()
            .with_default(spec(&[("minute", "60/1m")])),
    );
    assert_eq!(limit_of(&registry, "acme"), Some(9));
    // ...handing it back does: the file's entry as it stands now.
    let (status, _, _) = call(&app, "DELETE", "/admin/tenants/acme/runtime", None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(limit_of(&registry, "acme"), Some(4));
    let (_, _, body) = call(&app, "GET", "/admin/tenants/acme", None).await;
    assert_eq!(
        body,
        json!({"name": "acme", "quotas": {"burst": "4/1m"}, "source": "file"})
    );
    // Nothing left to hand back: 404 with a problem body.
    let (status, headers, body) = call(&app, "DELETE", "/admin/tenants/acme/runtime", None).await;
    assert_problem(
        status,
        &headers,
        &body,
        StatusCode::NOT_FOUND,
        TYPE_NOT_FOUND,
    );
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("no runtime record"),
        "{body}"
    );

    // A closed tenant too: closed (the default serves it), then the file's again.
    assert_eq!(
        call(&app, "DELETE", "/admin/tenants/acme", None).await.0,
        204
    );
    assert_eq!(limit_of(&registry, "acme"), Some(60));
    assert_eq!(
        call(&app, "DELETE", "/admin/tenants/acme/runtime", None)
            .await
            .0,
        204
    );
    assert_eq!(limit_of(&registry, "acme"), Some(4));

    // A tenant defined only at runtime goes back to what the file says of
    // it: nothing, so the default.
    let put = json!({"quotas": {"burst": "2/1m"}});
    assert_eq!(
        call(&app, "PUT", "/admin/tenants/newco", Some(put)).await.0,
        200
    );
    assert_eq!(limit_of(&registry, "newco"), Some(2));
    assert_eq!(
        call(&app, "DELETE", "/admin/tenants/newco/runtime", None)
            .await
            .0,
        204
    );
    assert_eq!(limit_of(&registry, "newco"), Some(60));
    assert_eq!(call(&app, "GET", "/admin/tenants/newco", None).await.0, 404);
    // A bad name is a 400, as everywhere.
    assert_eq!(
        call(&app, "DELETE", "/admin/tenants/a%20b/runtime", None)
            .await
            .0,
        400
    );
}

#[tokio::test]
async fn delete_takes_what_reset_and_usage_take() {
    // Only a default, as the gateway without `--tenants`.
    let (app, registry) = app(TenantsConfig::new().with_default(spec(&[("default", "2/1m")])));
    for path in ["/admin/tenants/anyone/usage/gina"] {
        assert_eq!(call(&app, "GET", path, None).await.0, 200);
    }
    assert_eq!(
        call(&app, "POST", "/admin/tenants/anyone/reset", None)
            .await
            .0,
        204
    );
    assert_eq!(
        call(&app, "DELETE", "/admin/tenants/anyone", None).await.0,
        204
    );
    // Still served by the default (closing never refuses a tenant the
    // default covers), and still accepted by all three.
    assert_eq!(limit_of(&registry, "anyone"), Some(2));
    assert_eq!(
        call(&app, "GET", "/admin/tenants/anyone/usage/gina", None)
            .await
            .0,
        200
    );
    assert_eq!(
        call(&app, "POST", "/admin/tenants/anyone/reset", None)
            .await
            .0,
        204
    );
    assert_eq!(
        call(&app, "DELETE", "/admin/tenants/anyone", None).await.0,
        204
    );
    // GET lists tenants, and this one is not listed: the 404 says why.
    let (status, headers, body) = call(&app, "GET", "/admin/tenants/anyone", None).await;
    assert_problem(
        status,
        &headers,
        &body,
        StatusCode::NOT_FOUND,
        TYPE_NOT_FOUND,
    );
    assert!(
        body["detail"].as_str().unwrap().contains("[default]"),
        "{body}"
    );

    // Without a default, all three refuse an unknown tenant alike.
    let (app, _) = app_without_default();
    for (method, path) in [
        ("GET", "/admin/tenants/nobody/usage/gina"),
        ("POST", "/admin/tenants/nobody/reset"),
        ("DELETE", "/admin/tenants/nobody"),
    ] {
        let (status, headers, body) = call(&app, method, path, None).await;
        assert_problem(
            status,
            &headers,
            &body,
            StatusCode::NOT_FOUND,
            TYPE_NOT_FOUND,
        );
    }
}

#[tokio::test]
async fn unknown_routes_and_methods_are_problems() {
    let (app, _) = app_without_default();
    // (`/admin/` is the outer router's: axum's `nest` does not pass it on.)
    for path in [
        "/admin",
        "/admin/nope",
        "/admin/tenants/acme/nope",
        "/admin/tenants/acme/usage",
    ] {
        let (status, headers, body) = call(&app, "GET", path, None).await;
        assert_problem(
            status,
            &headers,
            &body,
            StatusCode::NOT_FOUND,
            TYPE_NOT_FOUND,
        );
    }
    for (method, path, allow) in [
        ("PATCH", "/admin/tenants/acme", "GET,HEAD,PUT,DELETE"),
        ("POST", "/admin/tenants", "GET,HEAD"),
        ("GET", "/admin/tenants/acme/reset", "POST"),
        ("GET", "/admin/tenants/acme/runtime", "DELETE"),
    ] {
        let (status, headers, body) = call(&app, method, path, None).await;
        assert_problem(
            status,
            &headers,
            &body,
            StatusCode::METHOD_NOT_ALLOWED,
            TYPE_METHOD_NOT_ALLOWED,
        );
        assert_eq!(headers[header::ALLOW], allow, "{method} {path}");
    }
    // Without the token a wrong method is a 401 like any admin request.
    let request = Request::patch("/admin/tenants/acme")
        .body(Body::empty())
        .unwrap();
    assert_eq!(
        app.oneshot(request).await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );
}
