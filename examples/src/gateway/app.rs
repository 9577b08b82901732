//! The router.

use axum::extract::ws::WebSocketUpgrade;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::get;
use axum::{Json, Router};
use axum_window_ext::RateLimitInfo;
use serde_json::{json, Value};
use tower_window::key::{Constant, Header, KeyExtractorExt};
use tower_window::Limiter;

use super::{ws, GatewayConfig};

/// The gateway's routes, limited as `config` says.
///
/// `/api/hello` and `/ws` share one [`Limiter`] and key (tenant + user);
/// `/healthz` is added after the `route_layer` and is never limited.
pub fn build_app(config: GatewayConfig) -> Router {
    let limiter = Limiter::from_shared_store(config.store.clone(), config.quota.clone());
    let key = Header::new(config.user_header.clone())
        .with_tenant(Header::new(config.tenant_header.clone()).or(Constant::new("public")));
    let state = AppState {
        user_header: config.user_header,
    };
    Router::new()
        .route("/api/hello", get(hello))
        .route("/ws", get(websocket))
        .route_layer(axum_window_ext::layer(limiter, key))
        .route("/healthz", get(healthz))
        .with_state(state)
        .merge(super::metrics::metrics_router(
            super::metrics::install_recorder(),
        ))
}

#[derive(Debug, Clone)]
struct AppState {
    user_header: axum::http::HeaderName,
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
    tracing::debug!(remaining = decision.remaining, "hello");
    Json(json!({
        "message": format!("hello, {user}"),
        "remaining": decision.remaining,
        "limit": decision.limit(),
    }))
}

async fn websocket(upgrade: WebSocketUpgrade) -> Response {
    upgrade.on_upgrade(ws::echo)
}

async fn healthz() -> &'static str {
    "ok"
}
