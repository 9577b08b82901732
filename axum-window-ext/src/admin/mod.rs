//! The tenant admin API: a [`Router`] to mount (the gateway mounts it at
//! `/admin`), guarded by a bearer token.
//!
//! | route | answer |
//! |---|---|
//! | `GET /tenants` | `{"tenants":[{"name":"acme","quotas":{"burst":"10/1s"},"source":"file"}],"default":{"quotas":{"minute":"60/1m"},"source":"default"}}` (`"default": null` without a `[default]`) |
//! | `GET /tenants/{tenant}` | that object; 404 if not listed |
//! | `PUT /tenants/{tenant}` with `{"quotas":{"burst":"5/10s"}}` | init or replace at runtime; 200 with the object |
//! | `POST /tenants/{tenant}/reset` | 204 (every window starts afresh, on every node); 404 if neither listed nor covered by `[default]` |
//! | `DELETE /tenants/{tenant}` | close; 204; 404 if neither listed nor covered by `[default]` (a tenant on `[default]` stays on it, with fresh windows) |
//! | `DELETE /tenants/{tenant}/runtime` | hand it back to the file ([`TenantRegistry::revert`]): 204, then it is served as the file says (its entry, `[default]`, or unknown); 404 if it has no runtime record (no `PUT` or `DELETE` since the file) |
//! | `GET /tenants/{tenant}/usage/{subject}` | `{"quotas":{"burst":{"limit":10,"remaining":7,"reset_after_ms":800}}}`, read from the store consuming nothing |
//!
//! A tenant object is its [`TenantSpec`] as in the tenants file (also the
//! shape of a `PUT` body) plus `"name"` and `"source": "file" | "runtime"`;
//! the listing's `default` is the file's `[default]` with
//! `"source": "default"`. A runtime change (`PUT`, `DELETE`) wins over the
//! file, reloads included, until the next runtime change.
//!
//! Every request needs `Authorization: Bearer <token>` (compared in constant
//! time), else `401` with `WWW-Authenticate: Bearer`. Bad input (a tenant
//! name [`validate_tenant_name`] refuses, a bad body or quota) is `400`,
//! store failures `503`, unknown paths `404` and methods `405` (with
//! `Allow`), each with a problem+json body.

use axum::body::Bytes;
use axum::extract::{Path, Request, State};
use axum::http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tower_window::tenant::{
    validate_tenant_name, Resolution, TenantError, TenantInfo, TenantRegistry, TenantSource,
    TenantSpec,
};
use tower_window::{Limiter, WindowKey};

use crate::problem::{invalid_input, problem};

/// The problem `type` of invalid admin input (400).
pub use crate::TYPE_INVALID_INPUT;
/// The problem `type` of a tenant, runtime record or route that does not
/// exist (404).
pub const TYPE_NOT_FOUND: &str = "urn:tower-window:problem:not-found";
/// The problem `type` of a method a route does not serve (405).
pub const TYPE_METHOD_NOT_ALLOWED: &str = "urn:tower-window:problem:method-not-allowed";

#[derive(Clone)]
struct Admin {
    registry: TenantRegistry,
    limiter: Limiter,
    /// `None` for an empty token, which refuses everything.
    token_digest: Option<[u8; 32]>,
}

/// The admin routes over `registry`, reading usage through `limiter`,
/// guarded by `token` (an empty one refuses every request).
///
/// ```
/// use axum::Router;
/// use tower_window::tenant::{TenantRegistry, TenantsConfig};
/// use tower_window::{Limiter, MemoryStore, Quota};
///
/// let registry = TenantRegistry::new(TenantsConfig::new());
/// let limiter = Limiter::new(MemoryStore::new(), "100/1m".parse::<Quota>()?);
/// let app: Router = Router::new().nest("/admin", axum_window_ext::admin::router(registry, limiter, "s3cret"));
/// # Ok::<(), tower_window::QuotaError>(())
/// ```
pub fn router(registry: TenantRegistry, limiter: Limiter, token: &str) -> Router {
    let admin = Admin {
        registry,
        limiter,
        token_digest: (!token.is_empty()).then(|| Sha256::digest(token.as_bytes()).into()),
    };
    Router::new()
        .route("/tenants", get(list))
        .route("/tenants/{tenant}", get(show).put(put).delete(close))
        .route("/tenants/{tenant}/runtime", delete(revert))
        .route("/tenants/{tenant}/reset", post(reset))
        .route("/tenants/{tenant}/usage/{subject}", get(usage))
        // Before the guard: a 405 without the token is a 401 like the rest.
        .method_not_allowed_fallback(method_not_allowed)
        .route_layer(middleware::from_fn_with_state(admin.clone(), authorize))
        .fallback(no_route)
        .with_state(admin)
}

/// Any other path (no token needed: the routes are documented).
async fn no_route() -> Response {
    not_found(
        "no admin route has this path; the routes are tenants, tenants/{tenant}, \
         tenants/{tenant}/runtime, tenants/{tenant}/reset and tenants/{tenant}/usage/{subject}"
            .to_owned(),
    )
}

/// axum adds `Allow`.
async fn method_not_allowed(method: axum::http::Method) -> Response {
    problem(
        StatusCode::METHOD_NOT_ALLOWED,
        TYPE_METHOD_NOT_ALLOWED,
        "Method not allowed",
        format!("this admin route does not serve {method}; the `Allow` header lists what it does"),
    )
}

async fn authorize(State(admin): State<Admin>, request: Request, next: Next) -> Response {
    let presented = request
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, token) = v.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        });
    let ok = match (presented, admin.token_digest) {
        (Some(token), Some(expected)) => {
            let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
            bool::from(digest.ct_eq(&expected))
        }
        _ => false,
    };
    if !ok {
        let mut response = problem(
            StatusCode::UNAUTHORIZED,
            "urn:tower-window:problem:unauthorized",
            "Unauthorized",
            "a valid `Authorization: Bearer <token>` header is required".to_owned(),
        );
        response
            .headers_mut()
            .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        return response;
    }
    next.run(request).await
}

fn not_found(detail: String) -> Response {
    problem(StatusCode::NOT_FOUND, TYPE_NOT_FOUND, "Not found", detail)
}

fn tenant_not_found(admin: &Admin, tenant: &str) -> Response {
    not_found(if admin.registry.effective(tenant).is_some() {
        format!("tenant {tenant:?} is not listed: it is served by [default]")
    } else {
        format!("tenant {tenant:?} is not listed and there is no [default]")
    })
}

/// A registry call's answer: 400 for bad input, else 503 (store failure).
fn failed(error: TenantError) -> Response {
    if error.is_invalid_input() {
        return invalid_input(error.to_string());
    }
    unavailable(&error)
}

fn unavailable(error: &dyn std::fmt::Display) -> Response {
    tracing::warn!(%error, "tenant admin call failed");
    problem(
        StatusCode::SERVICE_UNAVAILABLE,
        crate::TYPE_UNAVAILABLE,
        "Store unavailable",
        "the tenant registry's store could not be reached; try again".to_owned(),
    )
}

fn spec_json(spec: &TenantSpec, source: TenantSource) -> Map<String, Value> {
    let mut object = match serde_json::to_value(spec) {
        Ok(Value::Object(map)) => map,
        _ => Map::new(),
    };
    object.insert("source".to_owned(), Value::from(source.as_str()));
    object
}

fn tenant_json(info: &TenantInfo) -> Value {
    let mut object = spec_json(&info.spec, info.source);
    object.insert("name".to_owned(), Value::from(info.name.clone()));
    Value::Object(object)
}

async fn list(State(admin): State<Admin>) -> Response {
    let tenants: Vec<Value> = admin.registry.tenants().iter().map(tenant_json).collect();
    let default = admin.registry.config().default;
    let default = default.map(|spec| spec_json(&spec, TenantSource::Default));
    Json(json!({ "tenants": tenants, "default": default })).into_response()
}

async fn show(State(admin): State<Admin>, Path(tenant): Path<String>) -> Response {
    if let Err(error) = validate_tenant_name(&tenant) {
        return failed(error);
    }
    match admin.registry.tenant(&tenant) {
        Some(info) => Json(tenant_json(&info)).into_response(),
        None => tenant_not_found(&admin, &tenant),
    }
}

async fn put(state: State<Admin>, Path(tenant): Path<String>, body: Bytes) -> Response {
    // A bad name is the problem, whatever the body.
    let spec = validate_tenant_name(&tenant).and_then(|()| {
        serde_json::from_slice::<TenantSpec>(&body)
            .map_err(|error| TenantError::Syntax(format!("tenant {tenant:?}: {error}")))
    });
    match spec {
        Ok(spec) => match state.registry.init(&tenant, spec).await {
            Ok(()) => show(state, Path(tenant)).await,
            Err(error) => failed(error),
        },
        Err(error) => failed(error),
    }
}

/// The registry checks the name.
fn done(admin: &Admin, tenant: &str, result: Result<bool, TenantError>) -> Response {
    match result {
        Ok(true) => StatusCode::NO_CONTENT.into_response(),
        Ok(false) => tenant_not_found(admin, tenant),
        Err(error) => failed(error),
    }
}

async fn reset(State(admin): State<Admin>, Path(tenant): Path<String>) -> Response {
    done(&admin, &tenant, admin.registry.reset(&tenant).await)
}

async fn close(State(admin): State<Admin>, Path(tenant): Path<String>) -> Response {
    done(&admin, &tenant, admin.registry.close(&tenant).await)
}

async fn revert(State(admin): State<Admin>, Path(tenant): Path<String>) -> Response {
    match admin.registry.revert(&tenant).await {
        Ok(false) => not_found(format!(
            "tenant {tenant:?} has no runtime record: the file already decides it"
        )),
        result => done(&admin, &tenant, result),
    }
}

async fn usage(
    State(admin): State<Admin>,
    Path((tenant, subject)): Path<(String, String)>,
) -> Response {
    if let Err(error) = validate_tenant_name(&tenant) {
        return failed(error);
    }
    if subject.is_empty() || subject.len() > 1024 {
        return invalid_input("the subject must be 1 to 1024 bytes".to_owned());
    }
    let policy = match admin.registry.resolve(tenant.as_bytes()) {
        Resolution::Limited(policy) => policy,
        Resolution::Unlimited => {
            return Json(json!({"quotas": {}, "unlimited": true})).into_response()
        }
        _ => return tenant_not_found(&admin, &tenant),
    };
    let key = WindowKey::new(tenant, subject);
    let decision = match admin.limiter.peek_policy(&key, &policy, 1).await {
        Ok(decision) => decision,
        Err(error) => return unavailable(&error),
    };
    let quotas: Map<String, Value> = decision
        .quotas()
        .iter()
        .map(|q| {
            let reset_after_ms = u64::try_from(q.reset_after().as_millis()).unwrap_or(u64::MAX);
            let usage = json!({
                "limit": q.quota().capacity(),
                "remaining": q.remaining(),
                "reset_after_ms": reset_after_ms,
            });
            (q.quota().name().to_owned(), usage)
        })
        .collect();
    Json(json!({ "quotas": quotas })).into_response()
}
