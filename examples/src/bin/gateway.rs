//! `cargo run --release -p tower-window-examples --bin gateway -- --help`
//!
//! An axum server on the embedded store or Redis: `GET /api/hello` and the
//! `GET /ws` WebSocket echo are limited per tenant and user, `GET /healthz`
//! (liveness) and `GET /readyz` (readiness: 503 while the store cannot
//! decide) are not. See `examples/README.md`.

use std::net::SocketAddr;
use std::process::ExitCode;

use axum::serve::ListenerExt;
use clap::Parser;
use tower_window_examples::gateway::{build_app_with_limiter, Args};
use tower_window_examples::process::{
    fail, init_logging, shutdown_signal, EXIT_CONFIG, EXIT_RUNTIME,
};
use tower_window_examples::store_probe::StoreProbe;

#[tokio::main]
async fn main() -> ExitCode {
    init_logging();

    let args = Args::parse();
    let listen = args.listen;
    let config = match args.into_config() {
        Ok(config) => config,
        Err(error) => return fail(&error, EXIT_CONFIG),
    };
    match &config.tenants {
        // The `--limit` policy serves no tenant then: name what does.
        Some(file) => {
            let (tenants, default) = file.summary();
            tracing::info!(
                file = %file.path.display(),
                %tenants,
                %default,
                tenant_header = %config.tenant_header,
                user_header = %config.user_header,
                "configured: per-tenant policies from the tenants file"
            );
        }
        None => tracing::info!(
            limit = %config
                .policy
                .quotas()
                .iter()
                .map(|q| format!("{}={q}", q.name()))
                .collect::<Vec<_>>()
                .join(" "),
            tenant_header = %config.tenant_header,
            user_header = %config.user_header,
            "configured: one policy for every tenant and user"
        ),
    }
    if let Some(resilience) = &config.resilience {
        tracing::info!(
            fallback = %resilience.fallback,
            expected_nodes = resilience.expected_nodes.get(),
            timeout_ms = config.store.timeout().unwrap_or_default().as_millis(),
            "redis fallback"
        );
    }
    if let Some(leases) = &config.leases {
        tracing::info!(
            max_units = leases.max_units(),
            ttl_ms = leases.ttl_for(&config.policy).as_millis(),
            "quota leases"
        );
    }
    // One line naming the store and why it cannot be reached, if so.
    let probe = StoreProbe::new(&config.store, &config.store_name);
    if let Err(error) = probe.at_start(config.require_store).await {
        return fail(&error, EXIT_RUNTIME);
    }
    let (app, limiter) = build_app_with_limiter(config);

    let listener = match tokio::net::TcpListener::bind(listen).await {
        Ok(listener) => listener,
        Err(error) => {
            let fix = match error.kind() {
                std::io::ErrorKind::AddrInUse => {
                    "another process listens there: stop it, or give another --listen (e.g. 127.0.0.1:3001)"
                }
                std::io::ErrorKind::PermissionDenied => {
                    "ports below 1024 need privileges: give a port above 1023 (e.g. --listen 127.0.0.1:3000)"
                }
                _ => "give an address of this machine, e.g. --listen 127.0.0.1:3000 or 0.0.0.0:3000",
            };
            return fail(
                &format!("--listen {listen}: cannot listen there: {error}\n  fix: {fix}"),
                EXIT_RUNTIME,
            );
        }
    };
    match listener.local_addr() {
        Ok(address) => tracing::info!(%address, "listening"),
        Err(error) => tracing::warn!(%error, "listening, on an address the system does not tell"),
    }
    // Small WebSocket frames go out at once rather than wait for the
    // client's acknowledgement of the previous one (Nagle's algorithm).
    let listener = listener.tap_io(|socket| {
        if let Err(error) = socket.set_nodelay(true) {
            tracing::debug!(%error, "TCP_NODELAY not set");
        }
    });
    let served = axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown_signal())
    .await;
    if let Err(error) = served {
        return fail(&format!("serving failed: {error}"), EXIT_RUNTIME);
    }
    // Give back what this node's leases did not spend, so other nodes can
    // use it now rather than when the leases' records expire.
    let returned = limiter.refund_leases().await;
    // Write what the audit log still holds (bounded: it gives up while the
    // store keeps failing).
    let audit_flushed = match limiter.audit() {
        Some(audit) => audit.flush().await,
        None => true,
    };
    tracing::info!(returned, audit_flushed, "stopped");
    ExitCode::SUCCESS
}
