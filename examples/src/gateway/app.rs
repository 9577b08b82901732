//! The router.

use std::collections::HashMap;

use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{Query, Request};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::IntoResponse;
use axum::response::Response;
use axum::routing::get;
use axum::{Json, Router};
use axum_window_ext::RateLimitInfo;
use serde_json::{json, Value};
use tower_window::key::{Constant, Header, KeyExtractorExt};
use tower_window::layer::Rejection;
use tower_window::{Decision, DecisionSource};

use tower_window::events::{EventWindow, Position};

use super::rooms::{valid_room, RoomHub};
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
    let degraded_status = config.degraded_status();
    let key = Header::from_name(config.user_header.clone())
        .with_tenant(Header::from_name(config.tenant_header.clone()).or(Constant::new("public")));
    let events = EventWindow::from_shared_store(
        limiter.clone(),
        config.rooms.store.clone(),
        config.rooms.retention,
    );
    let tail = config
        .rooms
        .redis
        .as_ref()
        .and_then(|redis| redis.event_tail().ok());
    let mut rooms = match tail {
        Some(tail) => RoomHub::tailing(events, tail),
        None => RoomHub::polling(events),
    };
    if let Some((client, stream)) = config.rooms.inbound.clone() {
        rooms = rooms.inbound(client, stream);
    }
    let state = AppState {
        user_header: config.user_header,
        rooms,
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
}

/// What handlers share.
#[derive(Debug, Clone)]
struct AppState {
    user_header: HeaderName,
    rooms: RoomHub,
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

/// `/ws`: the echo, or with `?room=R` (and optionally `epoch` and
/// `last_event_id` to resume) a room. Bad room names and positions are
/// answered 400 before the upgrade.
async fn websocket(
    axum::extract::State(state): axum::extract::State<AppState>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
    upgrade: WebSocketUpgrade,
) -> Response {
    let Some(room) = query.get("room") else {
        return upgrade.on_upgrade(ws::echo);
    };
    if !valid_room(room) {
        return bad_request("room: 1 to 64 characters of [A-Za-z0-9_.-]");
    }
    let resume = match (query.get("epoch"), query.get("last_event_id")) {
        (Some(epoch), last) => match Position::parse(epoch, last.map_or("", String::as_str)) {
            Ok(position) => Some(position),
            Err(error) => return bad_request(&error.to_string()),
        },
        (None, Some(_)) => return bad_request("last_event_id needs its epoch"),
        (None, None) => None,
    };
    let user = headers
        .get(&state.user_header)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let (hub, room) = (state.rooms, room.clone());
    upgrade.on_upgrade(move |socket| ws::room(socket, hub, room, user, resume))
}

fn bad_request(detail: &str) -> Response {
    (StatusCode::BAD_REQUEST, detail.to_owned()).into_response()
}

async fn healthz() -> &'static str {
    "ok"
}
