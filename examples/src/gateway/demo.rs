//! The demo page and the quota peek it polls.
//!
//! - `GET /`, `GET /demo/demo.css`, `GET /demo/demo.js`: a static page
//!   (`demo/` beside this file, embedded with `include_str!`; no build step,
//!   nothing fetched from elsewhere) that speaks the `/ws` room protocol.
//! - `GET /api/quota?tenant=T&user=U` (or the tenant and user headers):
//!   every quota the gateway enforces for that key, as JSON and as
//!   `RateLimit` / `RateLimit-Policy` headers, **consuming none of them**.
//!   Each policy is peeked ([`Limiter::peek_policy`]): the store reads every
//!   quota's window and records nothing (the store conformance suite checks
//!   it, on the embedded store and on Redis). The route is limited by a quota of its own,
//!   [`POLL_QUOTA`] per tenant and user, so polling costs a store call
//!   that is bounded, and never a message or a request from the user's
//!   quotas.
//! - With `--audit`, the same answer carries `"audit": "on"` and the
//!   tenant's last [`DENIALS_SHOWN`] denials from the audit trail,
//!   `"denials": [{"at_micros","subject","quota","source"}]`, newest
//!   first: that tenant's only, read through the gateway's limiter's log
//!   ([`Limiter::audit`]), so the page never needs the bearer-protected
//!   admin API. A failure to read them leaves the quotas answered
//!   (`"audit": "unavailable"`, no denials). Without `--audit` neither
//!   member is there.
//!
//! The page may poll another node than the one that served it (after a
//! failover), so [`cross_origin_reads`] lets any origin read the two JSON
//! routes it polls (`/api/quota`, `/presence`): they take no credentials
//! and change nothing.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use axum_window_ext::RejectionResponse;
use serde_json::{json, Value};
use tower_window::audit::{AuditOutcome, AuditQuery};
use tower_window::layer::{insert_rate_limit_headers, Rejection};
use tower_window::{AuditLog, Decision, Limiter, Policy, Quota, QuotaDecision};

use super::identity::{BadIdentity, Identity, Sources};

const INDEX_HTML: &str = include_str!("demo/index.html");
const DEMO_CSS: &str = include_str!("demo/demo.css");
const DEMO_JS: &str = include_str!("demo/demo.js");

/// The quota of `GET /api/quota` itself, per tenant and user: the page
/// polls every 2 s, so two tabs of one user fit.
pub const POLL_QUOTA: &str = "quota-poll=60/1m";

/// How many of the tenant's last denials `/api/quota` carries (with
/// `--audit`).
pub const DENIALS_SHOWN: usize = 10;

/// The longest tenant or user name `/api/quota` accepts, in bytes.
pub const MAX_NAME_LEN: usize = 256;

/// Paths any origin may read (see the module docs).
const CROSS_ORIGIN_PATHS: &[&str] = &["/api/quota", "/presence"];

/// The policies `/api/quota` reports for a tenant (its bytes, as the
/// limited routes resolve it): the gateway's HTTP policy for that tenant,
/// and its per-message and per-byte policies where it has them. An empty
/// list reports no quota (an unknown or unlimited tenant).
pub type PolicySource = Arc<dyn Fn(&[u8]) -> Vec<Policy> + Send + Sync>;

/// What `/api/quota` needs.
#[derive(Clone)]
struct QuotaState {
    limiter: Limiter,
    policies: PolicySource,
    poll: Option<Policy>,
    /// Query parameters first, then the headers; [`MAX_NAME_LEN`].
    identity: Identity,
}

/// The demo page's routes (none of them rate limited by the gateway's
/// layer; `/api/quota` has its own [`POLL_QUOTA`]).
///
/// `limiter` is the gateway's limiter (same store, breakers and fallback);
/// `policies` names, per tenant, the policies whose quotas `/api/quota`
/// reports.
pub fn router(
    limiter: Limiter,
    policies: PolicySource,
    tenant_header: HeaderName,
    user_header: HeaderName,
) -> Router {
    let poll = poll_policy();
    let state = QuotaState {
        limiter,
        policies,
        poll,
        identity: Identity::new(tenant_header, user_header, Sources::QueryThenHeaders)
            .max_len(MAX_NAME_LEN),
    };
    Router::new()
        .route("/", get(index))
        .route("/demo/demo.css", get(css))
        .route("/demo/demo.js", get(js))
        .route("/api/quota", get(quota).with_state(state))
}

/// The name of [`POLL_QUOTA`] (for its metrics).
pub(super) fn poll_quota_name() -> Option<String> {
    poll_policy().map(|policy| policy.first().name().to_owned())
}

/// [`POLL_QUOTA`] as a policy (`None` only if the constant were invalid,
/// which the unit test below rules out).
fn poll_policy() -> Option<Policy> {
    let (name, dsl) = POLL_QUOTA.split_once('=')?;
    let quota = dsl.parse::<Quota>().ok()?.named(name).ok()?;
    Some(Policy::from(quota))
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
            (HeaderName::from_static("x-content-type-options"), "nosniff"),
        ],
        body,
    )
        .into_response()
}

async fn index() -> Response {
    let mut response = asset("text/html; charset=utf-8", INDEX_HTML);
    // Everything the page loads comes from the node that served it; its
    // sockets and polls may go to any node the user lists.
    response.headers_mut().insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; connect-src *; img-src 'self' data:; frame-ancestors 'none'",
        ),
    );
    response
}

async fn css() -> Response {
    asset("text/css; charset=utf-8", DEMO_CSS)
}

async fn js() -> Response {
    asset("text/javascript; charset=utf-8", DEMO_JS)
}

/// `GET /api/quota`. The key is the query parameters `tenant` and `user`
/// first (the demo-only fallback for the headers, as on `/ws`: browsers
/// cannot set headers on every request the page makes cross-origin without
/// a preflight), then the headers, by the gateway's one rule
/// ([`Identity`]: raw bytes; too long is `400`, never `public`).
async fn quota(State(state): State<QuotaState>, uri: Uri, headers: HeaderMap) -> Response {
    let key = match state.identity.key(&headers, &uri) {
        Ok(key) => key,
        Err(BadIdentity::TooLong { max, .. }) => {
            return RejectionResponse(Rejection::KeyTooLong { max_len: max }).into_response()
        }
        Err(_) => return RejectionResponse::missing_key(StatusCode::BAD_REQUEST).into_response(),
    };
    let tenant = String::from_utf8_lossy(key.tenant()).into_owned();
    let user = String::from_utf8_lossy(key.subject()).into_owned();

    // The route's own quota: one unit per poll.
    let poll = match &state.poll {
        Some(poll) => state.limiter.check_policy(&key, poll, 1).await.map(Some),
        None => Ok(None),
    };
    match poll {
        Ok(None) => {}
        Ok(Some(decision)) if decision.allowed() => {}
        Ok(Some(decision)) => {
            return RejectionResponse(Rejection::for_denial(
                decision,
                StatusCode::SERVICE_UNAVAILABLE,
            ))
            .into_response()
        }
        Err(error) => return RejectionResponse::unavailable(error.to_string()).into_response(),
    }

    // The peek: the store reads the windows and records nothing (no
    // decision metric either).
    let mut quotas = Vec::new();
    let mut degraded = false;
    for policy in &(state.policies)(key.tenant()) {
        match state.limiter.peek_policy(&key, policy, 1).await {
            Ok(decision) => {
                degraded |= decision.is_degraded();
                quotas.extend(decision.quotas().iter().cloned());
            }
            Err(error) => return RejectionResponse::unavailable(error.to_string()).into_response(),
        }
    }
    let mut body = quota_body(&tenant, &user, &quotas, degraded);
    if let Some(log) = state.limiter.audit() {
        let (audit, denials) = last_denials(log, &tenant).await;
        body["audit"] = Value::from(audit);
        body["denials"] = denials;
    }
    let mut response = Json(body).into_response();
    if let Some(decision) = Decision::from_quotas(quotas) {
        // The headers describe the state (they read the quotas, never
        // whether this peek would have been admitted).
        insert_rate_limit_headers(response.headers_mut(), &decision, false);
    }
    response
}

/// The audit trail's state (`"on"`, or `"unavailable"` when it could not be
/// read) and `tenant`'s last [`DENIALS_SHOWN`] denials, newest first, each
/// `{"at_micros","subject","quota","source"}` (empty unless `"on"`).
async fn last_denials(log: &AuditLog, tenant: &str) -> (&'static str, Value) {
    let query = AuditQuery::new(tenant)
        .outcome(AuditOutcome::Denied)
        .limit(DENIALS_SHOWN);
    match log.query(&query).await {
        Ok(page) => {
            let denials = page
                .records
                .iter()
                .map(|r| {
                    json!({
                        "at_micros": r.at_micros,
                        "subject": r.subject,
                        "quota": r.quota,
                        "source": r.source.to_string(),
                    })
                })
                .collect();
            ("on", Value::Array(denials))
        }
        Err(error) => {
            tracing::debug!(%error, "the demo's denials could not be read");
            ("unavailable", json!([]))
        }
    }
}

/// `{"tenant","user","degraded","quotas":{name:{limit,remaining,reset_after_ms}}}`,
/// the same per-quota shape as the admin API's usage.
fn quota_body(tenant: &str, user: &str, quotas: &[QuotaDecision], degraded: bool) -> Value {
    let quotas: BTreeMap<&str, Value> = quotas
        .iter()
        .map(|q| {
            let reset_ms = u64::try_from(q.reset_after().as_millis()).unwrap_or(u64::MAX);
            (
                q.quota().name(),
                json!({
                    "limit": q.quota().capacity(),
                    "remaining": q.remaining(),
                    "reset_after_ms": reset_ms,
                }),
            )
        })
        .collect();
    json!({
        "tenant": tenant,
        "user": user,
        "degraded": degraded,
        "quotas": quotas,
    })
}

/// Lets any origin read the read-only JSON routes the demo page polls
/// (`/api/quota`, `/presence`), and their `RateLimit` headers. Other
/// routes are untouched. No credentials are involved: the browser sends
/// none cross-origin without `Access-Control-Allow-Credentials`.
pub async fn cross_origin_reads(request: Request, next: Next) -> Response {
    let readable =
        request.method() == Method::GET && CROSS_ORIGIN_PATHS.contains(&request.uri().path());
    let mut response = next.run(request).await;
    if readable {
        let headers = response.headers_mut();
        headers.insert(
            header::ACCESS_CONTROL_ALLOW_ORIGIN,
            HeaderValue::from_static("*"),
        );
        headers.insert(
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static("ratelimit, ratelimit-policy, retry-after"),
        );
    }
    response
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn poll_quota_parses() {
        let policy = poll_policy().unwrap();
        let quota = policy.first();
        assert_eq!(quota.name(), "quota-poll");
        assert_eq!((quota.limit(), quota.window_micros()), (60, 60_000_000));
    }

    #[test]
    fn assets_are_self_contained() {
        // Nothing is fetched from outside: no absolute URL in a src/href.
        for asset in [INDEX_HTML, DEMO_CSS, DEMO_JS] {
            for needle in ["src=\"http", "href=\"http", "@import", "url(http", "//cdn"] {
                assert!(!asset.contains(needle), "{needle}");
            }
        }
        assert!(INDEX_HTML.contains("src=\"/demo/demo.js\""));
        assert!(INDEX_HTML.contains("href=\"/demo/demo.css\""));
    }
}
