//! `cargo run --release -p tower-window-examples --bin gateway -- --help`
//!
//! An axum server on the embedded store or Redis: `GET /api/hello` and the
//! `GET /ws` WebSocket echo are limited per tenant and user, `GET /healthz`
//! is not. See `examples/README.md`.

use std::io::IsTerminal;
use std::net::SocketAddr;

use clap::Parser;
use tower_window_examples::gateway::{build_app_with_limiter, Args};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();

    let args = Args::parse();
    let listen = args.listen;
    let config = args.into_config()?;
    tracing::info!(policy = %config.policy, tenant_header = %config.tenant_header, user_header = %config.user_header, "configured");
    if let Some(resilience) = &config.resilience {
        tracing::info!(
            fallback = %resilience.fallback,
            expected_nodes = resilience.expected_nodes.get(),
            timeout_ms = resilience.timeout.as_millis(),
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
    let (app, limiter) = build_app_with_limiter(config);

    let listener = tokio::net::TcpListener::bind(listen).await?;
    tracing::info!(address = %listener.local_addr()?, "listening");
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown_signal())
    .await?;
    // Give back what this node's leases did not spend, so other nodes can
    // use it now rather than when the leases' records expire.
    let returned = limiter.refund_leases().await;
    tracing::info!(returned, "stopped");
    Ok(())
}

/// Resolves on Ctrl-C (and SIGTERM on Unix).
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::warn!(%error, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
    tracing::info!("shutting down");
}
