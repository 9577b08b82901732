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
//! | `GET /tenants/{tenant}/audit?subject=&outcome=&since=&until=&before=&limit=` | `{"records":[{"id":"1700000000000-0","at_micros":1700000000000123,"tenant":"acme","subject":"alice","policy":"acme","quota":"burst","outcome":"denied","remaining":0,"source":"store","node":"5f0c…"}],"next":"1700000000000-0"}`: the tenant's [audit records](tower_window::audit), newest first (see below); 404 when the limiter has no audit log |
//!
//! A tenant object is its [`TenantSpec`] as in the tenants file (also the
//! shape of a `PUT` body) plus `"name"` and `"source": "file" | "runtime"`;
//! the listing's `default` is the file's `[default]` with
//! `"source": "default"`. A runtime change (`PUT`, `DELETE`) wins over the
//! file, reloads included, until the next runtime change.
//!
//! The audit route reads the log of the router's limiter
//! ([`Limiter::audit`]) for any valid tenant name, listed or not (a closed
//! tenant's records stay until the log's retention trims them). Its
//! parameters, each optional, once at most (an empty one is as if absent):
//!
//! | parameter | filter |
//! |---|---|
//! | `subject` | that subject's records only (cut to [`MAX_SUBJECT_LEN`] bytes as records are; at most 1024 bytes) |
//! | `outcome` | one of [`AuditOutcome::NAMES`]: `allowed`, `denied`, `shadow_denied`, `admin_put`, `admin_reset`, `admin_delete`, `admin_reload` |
//! | `since`, `until` | records decided at or after / at or before this time, in **microseconds since the Unix epoch** (a record's `at_micros`); `since` at most `until` |
//! | `before` | the previous page's `next`: the page after it (older records) |
//! | `limit` | at most this many records, 1 to [`AuditQuery::MAX_LIMIT`] (default [`AuditQuery::DEFAULT_LIMIT`]) |
//!
//! `next` is `null` on the last page. A page may hold fewer than `limit`
//! records and still have a `next` (a filter that matches rarely ends a
//! page after [`AuditQuery::MAX_SCAN`] entries). Records still in a node's
//! buffer (written within about
//! [`AuditLog::DEFAULT_FLUSH_INTERVAL`](tower_window::AuditLog::DEFAULT_FLUSH_INTERVAL))
//! are not listed yet. An unknown parameter, a repeated one, an unknown
//! outcome, a time that is not a whole number, `since` after `until`, a
//! `limit` out of range or a malformed `before` is a `400`.
//!
//! Every request needs `Authorization: Bearer <token>` (compared in constant
//! time), else `401` with `WWW-Authenticate: Bearer`. Bad input (a tenant
//! name [`validate_tenant_name`] refuses, a bad body or quota) is `400`,
//! store failures `503`, unknown paths `404` and methods `405` (with
//! `Allow`), each with a problem+json body.

use axum::body::Bytes;
use axum::extract::{Path, Query, Request, State};
use axum::http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tower_window::audit::{AuditOutcome, AuditQuery, MAX_SUBJECT_LEN};
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

/// The admin routes over `registry`, reading usage (and the audit log,
/// [`Limiter::audit`]) through `limiter`,
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
        .route("/tenants/{tenant}/audit", get(audit))
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
         tenants/{tenant}/runtime, tenants/{tenant}/reset, tenants/{tenant}/usage/{subject} \
         and tenants/{tenant}/audit"
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
    unavailable(&error, REGISTRY_STORE)
}

/// What a failed registry or usage call could not reach.
const REGISTRY_STORE: &str = "the tenant registry's store";

fn unavailable(error: &dyn std::fmt::Display, what: &str) -> Response {
    tracing::warn!(%error, "tenant admin call failed");
    problem(
        StatusCode::SERVICE_UNAVAILABLE,
        crate::TYPE_UNAVAILABLE,
        "Store unavailable",
        format!("{what} could not be reached; try again"),
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
        Err(error) => return unavailable(&error, REGISTRY_STORE),
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

/// The longest `subject` filter, in bytes (as the usage route's subject).
const MAX_SUBJECT_FILTER: usize = 1024;

/// `GET /tenants/{tenant}/audit`: a page of the tenant's audit records.
async fn audit(
    State(admin): State<Admin>,
    Path(tenant): Path<String>,
    params: Result<Query<Vec<(String, String)>>, axum::extract::rejection::QueryRejection>,
) -> Response {
    if let Err(error) = validate_tenant_name(&tenant) {
        return failed(error);
    }
    let Ok(Query(params)) = params else {
        return invalid_input("the query string is not valid form data".to_owned());
    };
    let Some(log) = admin.limiter.audit() else {
        return not_found(
            "auditing is off: this limiter has no audit log (the gateway and the rls turn it on \
             with --audit)"
                .to_owned(),
        );
    };
    let query = match audit_query(tenant, &params) {
        Ok(query) => query,
        Err(detail) => return invalid_input(detail),
    };
    let page = match log.query(&query).await {
        Ok(page) => page,
        Err(error) => return unavailable(&error, "the audit log's store"),
    };
    match serde_json::to_value(&page.records) {
        Ok(records) => Json(json!({ "records": records, "next": page.next })).into_response(),
        Err(error) => unavailable(&error, "the audit log"),
    }
}

/// The query `params` ask for, or what is wrong with them.
fn audit_query(tenant: String, params: &[(String, String)]) -> Result<AuditQuery, String> {
    const NAMES: [&str; 6] = ["subject", "outcome", "since", "until", "before", "limit"];
    let mut seen = [false; NAMES.len()];
    let mut query = AuditQuery::new(tenant);
    for (name, value) in params {
        let Some(index) = NAMES.iter().position(|n| n == name) else {
            let mut shown: String = name.chars().take(64).collect();
            if shown.len() < name.len() {
                shown.push('…');
            }
            return Err(format!(
                "unknown parameter {shown:?}: the parameters are subject, outcome, since, until, before and limit"
            ));
        };
        if std::mem::replace(&mut seen[index], true) {
            return Err(format!("parameter {name:?} is given more than once"));
        }
        if value.is_empty() {
            continue;
        }
        match NAMES[index] {
            "subject" => query.subject = Some(subject_filter(value)?),
            "outcome" => {
                let outcome = value.parse::<AuditOutcome>().map_err(|_| {
                    format!(
                        "unknown outcome {:?}: expected one of {}",
                        value.chars().take(64).collect::<String>(),
                        AuditOutcome::NAMES.join(", ")
                    )
                })?;
                query.outcome = Some(outcome);
            }
            "since" => query.since_micros = Some(micros(name, value)?),
            "until" => query.until_micros = Some(micros(name, value)?),
            "before" => query.before = Some(cursor(value)?),
            _ => query.limit = page_limit(value)?,
        }
    }
    if let (Some(since), Some(until)) = (query.since_micros, query.until_micros) {
        if since > until {
            return Err(format!(
                "since ({since}) is after until ({until}): no record can match"
            ));
        }
    }
    Ok(query)
}

/// A `subject` filter, cut as records cut their subjects.
fn subject_filter(value: &str) -> Result<String, String> {
    if value.len() > MAX_SUBJECT_FILTER {
        return Err(format!(
            "the subject must be at most {MAX_SUBJECT_FILTER} bytes"
        ));
    }
    let mut end = value.len().min(MAX_SUBJECT_LEN);
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    Ok(value[..end].to_owned())
}

/// `text` as a whole number: digits only (no sign), in range.
fn whole<T: std::str::FromStr>(text: &str) -> Option<T> {
    let digits = !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
    text.parse().ok().filter(|_| digits)
}

/// `since` / `until`: microseconds since the Unix epoch.
fn micros(name: &str, value: &str) -> Result<u64, String> {
    whole(value).ok_or_else(|| {
        format!(
            "{name} must be a time in microseconds since the Unix epoch (a whole number, \
             as a record's at_micros), e.g. {name}=1700000000000000"
        )
    })
}

/// `before`: a page's `next`, `<ms>-<seq>`.
fn cursor(value: &str) -> Result<String, String> {
    match value.split_once('-') {
        Some((ms, seq)) if whole::<u64>(ms).is_some() && whole::<u64>(seq).is_some() => {
            Ok(value.to_owned())
        }
        _ => Err(
            "before must be a page's next, as the previous answer gave it (<ms>-<seq>, e.g. \
             1700000000000-0)"
                .to_owned(),
        ),
    }
}

/// `limit`: 1 to [`AuditQuery::MAX_LIMIT`].
fn page_limit(value: &str) -> Result<usize, String> {
    let range = 1..=AuditQuery::MAX_LIMIT;
    whole(value)
        .filter(|limit| range.contains(limit))
        .ok_or_else(|| format!("limit must be a whole number from 1 to {}", range.end()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use axum::body::Body;
    use axum::http::{header, Request};
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    use tower_window::tenant::TenantsConfig;
    use tower_window::{AuditLog, ManualClock, MemoryStore, Quota, RedisStore, Store};

    use super::*;

    const TOKEN: &str = "t0ken";
    const T0: u64 = 1_700_000_000_000_000;

    fn app(limiter: Limiter) -> Router {
        let registry = TenantRegistry::new(TenantsConfig::new());
        Router::new().nest("/admin", router(registry, limiter, TOKEN))
    }

    /// A limiter of `1/1h` auditing on a memory store whose clock starts at
    /// [`T0`].
    fn audited() -> (Limiter, ManualClock) {
        let clock = ManualClock::new(T0);
        let store = Store::from(MemoryStore::builder().clock(clock.clone()).build());
        let log = AuditLog::builder(store.clone()).build();
        let limiter = Limiter::builder(store, "1/1h".parse::<Quota>().unwrap())
            .local_capacity(0)
            .audit(log)
            .build();
        (limiter, clock)
    }

    async fn get(app: &Router, uri: &str, token: Option<&str>) -> (StatusCode, String, Value) {
        let mut request = Request::get(uri);
        if let Some(token) = token {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let response = app
            .clone()
            .oneshot(request.body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let kind = response
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            kind,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    fn subjects(body: &Value) -> Vec<(String, u64)> {
        body["records"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["subject"].as_str().unwrap().to_owned(),
                    r["at_micros"].as_u64().unwrap(),
                )
            })
            .collect()
    }

    #[tokio::test]
    async fn the_audit_route_filters_and_pages_newest_first() {
        let (limiter, clock) = audited();
        // alice denied at T0+1s, +2s, +3s; bob at +4s, +5s (each first
        // check admitted, not recorded).
        for (user, times) in [("alice", 3), ("bob", 2)] {
            let key = WindowKey::new("acme", user);
            assert!(limiter.check(&key, 1).await.unwrap().allowed());
            for _ in 0..times {
                clock.advance(Duration::from_secs(1));
                assert!(!limiter.check(&key, 1).await.unwrap().allowed());
            }
        }
        let app = app(limiter);
        let second = |n: u64| T0 + n * 1_000_000;
        let (status, _, body) = get(&app, "/admin/tenants/acme/audit", Some(TOKEN)).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let all = subjects(&body);
        let expected: Vec<(String, u64)> = [
            ("bob", 5),
            ("bob", 4),
            ("alice", 3),
            ("alice", 2),
            ("alice", 1),
        ]
        .iter()
        .map(|(s, n)| ((*s).to_owned(), second(*n)))
        .collect();
        assert_eq!(all, expected);
        assert_eq!(body["next"], Value::Null);
        let first = &body["records"][0];
        assert_eq!(
            (
                &first["outcome"],
                &first["quota"],
                &first["source"],
                &first["tenant"]
            ),
            (
                &json!("denied"),
                &json!("default"),
                &json!("store"),
                &json!("acme")
            )
        );

        // By subject, outcome and time range (bounds included); empty
        // parameters are as if absent.
        let uri = "/admin/tenants/acme/audit?subject=alice&outcome=denied&before=&limit=";
        let (_, _, body) = get(&app, uri, Some(TOKEN)).await;
        assert_eq!(subjects(&body), expected[2..]);
        let uri = format!(
            "/admin/tenants/acme/audit?since={}&until={}",
            second(2),
            second(4)
        );
        let (_, _, body) = get(&app, &uri, Some(TOKEN)).await;
        assert_eq!(subjects(&body), expected[1..4]);
        let (_, _, body) = get(
            &app,
            "/admin/tenants/acme/audit?outcome=allowed",
            Some(TOKEN),
        )
        .await;
        assert_eq!(body, json!({"records": [], "next": null}));
        // Another tenant's log is its own.
        let (_, _, body) = get(&app, "/admin/tenants/other/audit", Some(TOKEN)).await;
        assert_eq!(body, json!({"records": [], "next": null}));

        // Pages of two, following `next`.
        let mut pages = Vec::new();
        let mut uri = "/admin/tenants/acme/audit?limit=2".to_owned();
        loop {
            let (status, _, body) = get(&app, &uri, Some(TOKEN)).await;
            assert_eq!(status, StatusCode::OK, "{body}");
            pages.push(subjects(&body));
            let Some(next) = body["next"].as_str() else {
                break;
            };
            uri = format!("/admin/tenants/acme/audit?limit=2&before={next}");
            assert!(pages.len() < 5, "{pages:?}");
        }
        assert_eq!(pages.concat(), expected);
        assert_eq!(pages.iter().map(Vec::len).collect::<Vec<_>>(), [2, 2, 1]);
    }

    #[tokio::test]
    async fn bad_audit_parameters_are_400_problems() {
        let (limiter, _) = audited();
        let app = app(limiter);
        let long = format!("subject={}", "x".repeat(1025));
        for query in [
            "outcome=refused",
            "outcome=DENIED",
            "limit=0",
            "limit=1001",
            "limit=99999999999999999999999999",
            "limit=-1",
            "limit=%2B5",
            "limit=ten",
            "before=x",
            "before=1-",
            "before=-1",
            "before=1-2-3",
            "before=99999999999999999999999-0",
            "since=yesterday",
            "since=2024-01-01T00:00:00Z",
            "until=-5",
            "since=20&until=10",
            "subjct=alice",
            "subject=a&subject=b",
            long.as_str(),
        ] {
            let uri = format!("/admin/tenants/acme/audit?{query}");
            let (status, kind, body) = get(&app, &uri, Some(TOKEN)).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {body}");
            assert_eq!(kind, "application/problem+json", "{query}");
            assert_eq!(body["type"], TYPE_INVALID_INPUT, "{query}");
            assert!(
                body["detail"].as_str().unwrap().len() < 300,
                "{query}: {body}"
            );
        }
        // Invalid UTF-8 in the query is read lossily (as axum's `Query`
        // does); a tenant name refused is a 400.
        let (status, _, body) =
            get(&app, "/admin/tenants/acme/audit?subject=%FF", Some(TOKEN)).await;
        assert_eq!((status, &body["records"]), (StatusCode::OK, &json!([])));
        let (status, _, body) = get(&app, "/admin/tenants/a%20b/audit", Some(TOKEN)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        // The largest limit and a well-formed cursor are fine.
        let uri =
            "/admin/tenants/acme/audit?limit=1000&before=0-0&since=0&until=18446744073709551615";
        let (status, _, body) = get(&app, uri, Some(TOKEN)).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        // Without the token: 401, before anything else.
        let (status, _, _) = get(&app, "/admin/tenants/acme/audit?limit=0", None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        let (status, _, _) = get(&app, "/admin/tenants/acme/audit", Some("nope")).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
    }

    #[tokio::test]
    async fn without_an_audit_log_the_route_says_auditing_is_off() {
        let limiter = Limiter::new(MemoryStore::new(), "1/1h".parse::<Quota>().unwrap());
        let (status, kind, body) =
            get(&app(limiter), "/admin/tenants/acme/audit", Some(TOKEN)).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
        assert_eq!(kind, "application/problem+json");
        assert_eq!(body["type"], TYPE_NOT_FOUND);
        assert!(
            body["detail"].as_str().unwrap().contains("auditing is off"),
            "{body}"
        );
    }

    #[tokio::test]
    async fn an_unreachable_audit_store_is_a_503() {
        // Nothing listens on a reserved loopback port: every call is refused.
        let port = tower_window_tests::redis_server::closed_port();
        let redis = RedisStore::from_url(&format!("redis://127.0.0.1:{port}")).unwrap();
        let store = Store::builder(redis)
            .timeout(Duration::from_millis(500))
            .build();
        let log = AuditLog::builder(store.clone()).build();
        let limiter = Limiter::builder(store, "1/1h".parse::<Quota>().unwrap())
            .audit(log)
            .build();
        let (status, kind, body) =
            get(&app(limiter), "/admin/tenants/acme/audit", Some(TOKEN)).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert_eq!(kind, "application/problem+json");
        assert_eq!(body["type"], crate::TYPE_UNAVAILABLE);
        // The store's error is logged, not shown.
        assert!(!body.to_string().contains(&port.to_string()), "{body}");
    }
}
