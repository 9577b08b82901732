//! The router.

use axum::extract::Request;
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
use axum::{Json, Router};
use axum_window_ext::ws::rooms::RoomHub;
use axum_window_ext::RateLimitInfo;
use serde_json::{json, Value};
use tower_window::layer::Rejection;
use tower_window::{Decision, DecisionSource};

use tower_window::events::EventWindow;

use super::identity::{Identity, Sources};
use super::inbound_stream::InboundStream;
use super::{ws, GatewayConfig};

/// The debug header naming who decided (`--debug-headers`).
pub const RATELIMIT_SOURCE: HeaderName = HeaderName::from_static("x-ratelimit-source");

/// The gateway's routes, limited as `config` says.
///
/// `/api/hello` and `/ws` share one [`Limiter`](tower_window::Limiter) and key (tenant + user);
/// the other routes (`/healthz`, `/metrics`, ...) are never limited, and
/// neither is a request the router refuses (404, or 405 for a method a
/// route does not serve): the limits wrap each route's method router.
pub fn build_app(config: GatewayConfig) -> Router {
    build_gateway(config).router
}

/// [`build_app`], and the limiter its routes share (to
/// [refund its leases](tower_window::Limiter::refund_leases) on shutdown).
pub fn build_app_with_limiter(config: GatewayConfig) -> (Router, tower_window::Limiter) {
    let gateway = build_gateway(config);
    (gateway.router, gateway.limiter)
}

/// A built gateway: its routes, the limiter they share and its node's
/// WebSocket machinery.
#[derive(Debug)]
#[non_exhaustive]
pub struct Gateway {
    /// The routes (what [`build_app`] returns).
    pub router: Router,
    /// The limiter the routes share (to
    /// [refund its leases](tower_window::Limiter::refund_leases) on shutdown).
    pub limiter: tower_window::Limiter,
    /// The node's connection limiter and heartbeat.
    pub ws: ws::WsHandles,
    /// The watch of the `--tenants` file (`None` without one, or when it
    /// cannot be watched).
    pub tenants_watch: Option<super::tenants::TenantsWatch>,
}

/// Like [`build_app`], also handing out the limiter and the node's
/// WebSocket machinery (its connection limiter and heartbeat task).
pub fn build_gateway(config: GatewayConfig) -> Gateway {
    // First: what is built below registers series (the room hub at once,
    // the rest at zero further down), and a series registered before the
    // recorder exists is lost.
    let recorder = super::metrics::install_recorder();
    let readiness = crate::store_probe::StoreProbe::new(&config.store, &config.store_name);
    let limiter = config.limiter();
    let shared = limiter.clone();
    let degraded_status = config.degraded_status();
    // With `--audit`, the tenants' rules and the admin changes made here
    // go to the limiter's audit log.
    let registry = super::tenants::registry(&config).map(|registry| match limiter.audit() {
        Some(audit) => registry.with_audit(audit.clone()),
        None => registry,
    });
    let tenants_watch = match (&registry, &config.tenants) {
        (Some(registry), Some(file)) => super::tenants::watch(registry.clone(), file),
        _ => None,
    };
    let admin = match (&registry, &config.admin_token) {
        (Some(registry), Some(token)) => Some(axum_window_ext::admin::router(
            registry.clone(),
            limiter.clone(),
            token,
        )),
        _ => None,
    };
    // `/api/quota` reports the tenant's policy (from the registry when there
    // is one; an unknown or unlimited tenant has none) and the per-message
    // and per-byte quotas of `/ws`.
    let ws_policies: Vec<tower_window::Policy> = super::ws::message_policies(&config.ws)
        .into_iter()
        .flatten()
        .collect();
    let http_policy = config.policy.clone();
    let tenants = registry.clone();
    let demo = super::demo::router(
        limiter.clone(),
        std::sync::Arc::new(move |tenant: &[u8]| {
            let mut policies = match &tenants {
                Some(registry) => match registry.resolve(tenant) {
                    tower_window::tenant::Resolution::Limited(policy) => vec![policy],
                    _ => Vec::new(),
                },
                None => vec![http_policy.clone()],
            };
            policies.extend(ws_policies.iter().cloned());
            policies
        }),
        config.tenant_header.clone(),
        config.user_header.clone(),
    );
    // One key rule for every route (see `identity`): what a route limits
    // is what it leases, deduplicates and reports.
    let key = Identity::new(
        config.tenant_header.clone(),
        config.user_header.clone(),
        Sources::Headers,
    );
    let ws_key = Identity::new(
        config.tenant_header.clone(),
        config.user_header.clone(),
        Sources::HeadersThenQuery,
    );
    let fallback_closed = matches!(
        config.resilience.map(|r| r.fallback),
        Some(super::FallbackArg::FailClosed)
    );
    // Rooms (`/ws?room=R`): event windows in the same store.
    let events = EventWindow::new(config.store.clone(), config.rooms.retention);
    // One hub per node: on Redis (single or cluster) a room is read when
    // Redis pushes a wake-up for it (its own connections); the embedded
    // store is polled and woken by local appends.
    let tail = config.rooms.tail.then(|| events.tail().ok()).flatten();
    let mut rooms = RoomHub::builder(events);
    if let Some(tail) = tail {
        rooms = rooms.tail(tail);
    }
    let inbound = config
        .rooms
        .inbound
        .clone()
        .map(|(client, stream)| InboundStream::new(client, stream));
    let (ws_state, ws_handles) = ws::WsState::new(
        &config.ws,
        &config.store,
        &limiter,
        fallback_closed,
        ws_key.clone(),
    );
    let ws_state = ws_state.with_rooms(rooms.build(), inbound);
    // Every quota this gateway checks charts zero before its first decision.
    let mut quotas: std::collections::BTreeSet<String> = config
        .policy
        .quotas()
        .iter()
        .chain(ws_policies_for_metrics(&config.ws).iter())
        .map(|quota| quota.name().to_owned())
        .collect();
    quotas.extend(super::demo::poll_quota_name());
    if let Some(registry) = &registry {
        quotas.extend(super::tenants::quota_names(registry));
    }
    super::metrics::register_at_zero(quotas.iter().map(String::as_str));
    let ws_state = std::sync::Arc::new(ws_state);
    // `/ws` is limited like `/api/hello`, keyed by the headers or (browsers
    // cannot set headers on a WebSocket; demo only) the query parameters.
    let mut ws_layer =
        axum_window_ext::layer(limiter.clone(), ws_key).degraded_status(degraded_status);
    if let Some(registry) = &registry {
        ws_layer = ws_layer.tenants(registry.clone());
    }
    // The layers go on the method router, not the `Router`: axum's 405 for
    // another method is the method router's fallback, which
    // `Router::route_layer` wraps too, so `POST /ws` would be charged.
    let ws_router = Router::new()
        .route("/ws", get(ws::handler).route_layer(ws_layer))
        .route("/presence", get(ws::presence))
        .with_state(ws_state);
    let state = AppState {
        user_header: config.user_header,
    };

    // Limited routes. The layers wrap the method router (`get(..)`), so
    // only requests it serves are charged: a 405 (`POST /api/hello`, the
    // method router's fallback) is not, and a 404 never reaches them.
    let mut hello_route = get(hello);
    if config.debug_headers {
        // Inside the limiter: sees the admitted request's `Decision`.
        hello_route = hello_route.route_layer(middleware::from_fn(admitted_source));
    }
    let mut layer = axum_window_ext::layer(limiter, key).degraded_status(degraded_status);
    if let Some(registry) = registry {
        layer = layer.tenants(registry);
    }
    hello_route = hello_route.route_layer(layer);
    if config.debug_headers {
        // Outside the limiter: sees the denial's `Rejection`.
        hello_route = hello_route.route_layer(middleware::map_response(denied_source));
    }

    // Unlimited routes.
    let mut router = Router::new()
        .route("/api/hello", hello_route)
        .route("/healthz", get(healthz))
        .with_state(state)
        .merge(ws_router);
    if let Some(admin) = admin {
        router = router.nest("/admin", admin);
    }
    let router = router
        .merge(readiness.router())
        .merge(super::metrics::metrics_router(recorder))
        .merge(demo)
        .fallback(no_route)
        .layer(middleware::from_fn(super::demo::cross_origin_reads));
    Gateway {
        router,
        limiter: shared,
        ws: ws_handles,
        tenants_watch,
    }
}

/// The quotas of `/ws`'s message and byte policies.
fn ws_policies_for_metrics(config: &ws::WsConfig) -> Vec<tower_window::Quota> {
    ws::message_policies(config)
        .into_iter()
        .flatten()
        .flat_map(|policy| policy.quotas().to_vec())
        .collect()
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
    let source = request.extensions().get::<Decision>().map(|d| d.source());
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
        .map(|d| d.source());
    if let Some(value) = source.and_then(source_value) {
        response.headers_mut().insert(RATELIMIT_SOURCE, value);
    }
    response
}

async fn hello(
    axum::extract::State(state): axum::extract::State<AppState>,
    headers: HeaderMap,
    info: Option<RateLimitInfo>,
) -> Json<Value> {
    let user = headers
        .get(&state.user_header)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("?");
    let Some(RateLimitInfo(decision)) = info else {
        // An unlimited tenant (`--tenants`): never checked.
        return Json(json!({
            "message": format!("hello, {user}"),
            "unlimited": true,
        }));
    };
    tracing::debug!(remaining = decision.remaining(), source = %decision.source(), "hello");
    Json(json!({
        "message": format!("hello, {user}"),
        "remaining": decision.remaining(),
        "limit": decision.limit(),
        "degraded": decision.is_degraded(),
    }))
}

async fn healthz() -> &'static str {
    "ok"
}

/// A path no route has: a problem+json 404 like every other refusal (and,
/// like them, never charged).
async fn no_route() -> Response {
    use axum::response::IntoResponse;
    let body = json!({
        "type": axum_window_ext::admin::TYPE_NOT_FOUND,
        "title": "Not found",
        "status": 404,
        "detail": "no route has this path (the routes: examples/README.md)",
    });
    let mut response = (axum::http::StatusCode::NOT_FOUND, Json(body)).into_response();
    response.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        HeaderValue::from_static(axum_window_ext::PROBLEM_JSON),
    );
    response
}
