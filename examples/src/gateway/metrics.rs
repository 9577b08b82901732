//! `GET /metrics`: every tower-window metric as Prometheus text.
//!
//! [`install_recorder`] installs a `metrics-exporter-prometheus` recorder as
//! the process's global `metrics` recorder (once; later calls return the
//! same handle) and describes tower-window's metrics;
//! [`register_at_zero`] exports every series the bundled dashboard charts
//! at zero from the start; [`metrics_router`] serves what the recorder
//! holds. The route is not rate limited.
//!
//! A series exists only once something registered it, and a registration
//! made before the recorder is installed is lost: the gateway installs the
//! recorder before it builds anything that records.

use std::sync::OnceLock;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tower_window::metrics::{describe, STORE_CALL_BUCKETS, STORE_CALL_DURATION_SECONDS};

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the Prometheus recorder (on the first call) and returns its
/// handle. The store-call duration is a true histogram (buckets
/// [`STORE_CALL_BUCKETS`]), so dashboards can use `histogram_quantile`.
///
/// If another global recorder was installed first, the handle renders an
/// empty page and a warning is logged.
pub fn install_recorder() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            // The bucket list is a non-empty constant, so this cannot fail;
            // fall back to the default builder (a summary) if it ever does.
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full(STORE_CALL_DURATION_SECONDS.to_owned()),
                    STORE_CALL_BUCKETS,
                )
                .unwrap_or_else(|_| PrometheusBuilder::new());
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            if let Err(error) = ::metrics::set_global_recorder(recorder) {
                tracing::warn!(%error, "a metrics recorder is already installed; /metrics stays empty");
            }
            describe();
            handle
        })
        .clone()
}

/// Registers, at zero, every series the dashboard
/// (`examples/grafana/tower-window.json`) charts: every limiter series of
/// each quota in `quotas` (the quotas the gateway checks: its policy, each
/// tenant's, `/api/quota`'s own and `/ws`'s message and byte quotas), every
/// dedup and connection-seat series, and the tenants-file reloads. The
/// rooms' series are registered by the room hub. Call it after
/// [`install_recorder`]; adding zero changes no value, so calling it again
/// (after a reload) is harmless.
pub fn register_at_zero<'a>(quotas: impl IntoIterator<Item = &'a str>) {
    for quota in quotas {
        tower_window::metrics::register_quota(quota);
    }
    tower_window::metrics::register_ws();
    super::tenants::register_reloads();
}

/// `GET /metrics` answering with the Prometheus text exposition format.
pub fn metrics_router(handle: PrometheusHandle) -> Router {
    Router::new()
        .route("/metrics", get(scrape))
        .with_state(handle)
}

async fn scrape(State(handle): State<PrometheusHandle>) -> impl IntoResponse {
    handle.run_upkeep();
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        handle.render(),
    )
}
