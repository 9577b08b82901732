//! The router.

use axum::extract::ws::WebSocketUpgrade;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
use axum::{Json, Router};
use axum_window_ext::RateLimitInfo;
use serde_json::{json, Value};
use tower_window::key::{Constant, Header, KeyExtractorExt};
use tower_window::layer::Rejection;
use tower_window::{Decision, DecisionSource};

use super::{ws, GatewayConfig};

/// The debug header naming who decided (`--debug-headers`).
pub const RATELIMIT_SOURCE: HeaderName = HeaderName::from_static("x-ratelimit-source");

/// The gateway's routes, limited as `config` says.
///
/// `/api/hello` and `/ws` share one [`Limiter`](tower_window::Limiter) and key (tenant + user);
/// routes added after the `route_layer`s (`/healthz`, `/metrics`) are never
/// limited.
pub fn build_app(config: GatewayConfig) -> Router {
    let limiter = config.limiter();
    let http_policy = config.policy.clone();
    let demo = super::demo::router(
        limiter.clone(),
        std::sync::Arc::new(move |_tenant: &str| vec![http_policy.clone()]),
        config.tenant_header.clone(),
        config.user_header.clone(),
    );
    let degraded_status = config.degraded_status();
    let key = Header::from_name(config.user_header.clone())
        .with_tenant(Header::from_name(config.tenant_header.clone()).or(Constant::new("public")));
    let state = AppState {
        user_header: config.user_header,
    };

    // Limited routes.
    let mut router = Router::new()
        .route("/api/hello", get(hello))
        .route("/ws", get(websocket));
    if config.debug_headers {
        // Inside the limiter: sees the admitted request's `Decision`.
        router = router.route_layer(middleware::from_fn(admitted_source));
    }
    router =
        router.route_layer(axum_window_ext::layer(limiter, key).degraded_status(degraded_status));
    if config.debug_headers {
        // Outside the limiter: sees the denial's `Rejection`.
        router = router.route_layer(middleware::map_response(denied_source));
    }

    // Unlimited routes.
    router
        .route("/healthz", get(healthz))
        .with_state(state)
        .merge(super::metrics::metrics_router(
            super::metrics::install_recorder(),
        ))
        .merge(demo)
        .layer(middleware::from_fn(super::demo::cross_origin_reads))
}

/// What handlers share.
#[derive(Debug, Clone)]
struct AppState {
    user_header: HeaderName,
}

fn source_value(source: DecisionSource) -> Option<HeaderValue> {
    HeaderValue::from_str(&source.to_string()).ok()
}

async fn admitted_source(request: Request, next: Next) -> Response {
    let source = request.extensions().get::<Decision>().map(|d| d.source);
    let mut response = next.run(request).await;
    if let Some(value) = source.and_then(source_value) {
        response.headers_mut().insert(RATELIMIT_SOURCE, value);
    }
    response
}

async fn denied_source(mut response: Response) -> Response {
    let source = response
        .extensions()
        .get::<Rejection>()
        .and_then(Rejection::decision)
        .map(|d| d.source);
    if let Some(value) = source.and_then(source_value) {
        response.headers_mut().insert(RATELIMIT_SOURCE, value);
    }
    response
}

async fn hello(
    axum::extract::State(state): axum::extract::State<AppState>,
    headers: HeaderMap,
    RateLimitInfo(decision): RateLimitInfo,
) -> Json<Value> {
    let user = headers
        .get(&state.user_header)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("?");
    tracing::debug!(remaining = decision.remaining, source = %decision.source, "hello");
    Json(json!({
        "message": format!("hello, {user}"),
        "remaining": decision.remaining,
        "limit": decision.limit(),
        "degraded": decision.is_degraded(),
    }))
}

async fn websocket(upgrade: WebSocketUpgrade) -> Response {
    upgrade.on_upgrade(ws::echo)
}

async fn healthz() -> &'static str {
    "ok"
}
