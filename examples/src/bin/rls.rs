//! `cargo run --release -p tower-window-examples --bin rls -- --config examples/rls/config.yaml`
//!
//! An Envoy rate limit service (`envoy.service.ratelimit.v3`) reading
//! envoyproxy/ratelimit's rule files, with sliding windows; see
//! `tower_window_examples::rls` and `examples/README.md`.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use tower_window_examples::gateway::metrics::{install_recorder, metrics_router};
use tower_window_examples::rls::{build, serve, RlsArgs};
use tracing_subscriber::EnvFilter;

/// The exit code of a configuration the rls refuses (clap's, for a flag it
/// cannot parse).
const EXIT_CONFIG: u8 = 2;
/// The exit code of a failure after the configuration was accepted.
const EXIT_RUNTIME: u8 = 1;

fn fail(message: &dyn std::fmt::Display, code: u8) -> ExitCode {
    let text = message.to_string();
    let mut lines = text.lines();
    eprintln!("error: {}", lines.next().unwrap_or_default());
    for line in lines {
        eprintln!("{line}");
    }
    ExitCode::from(code)
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let args = RlsArgs::parse();
    let listen = args.listen;
    let metrics_listen = args.metrics_listen;
    // Before anything records: a registration made earlier is lost.
    let handle = metrics_listen.map(|_| install_recorder());
    let config = match args.into_config() {
        Ok(config) => config,
        Err(error) => return fail(&error, EXIT_CONFIG),
    };
    tracing::info!(
        domains = %config
            .rules
            .domains
            .keys()
            .cloned()
            .collect::<Vec<_>>()
            .join(","),
        rules = config.rules.rule_count(),
        store = if config.fallback.is_some() { "redis" } else { "embedded" },
        leases = config.leases.map_or(0, |l| l.max_units()),
        "configured"
    );
    let rls = build(config);
    let listener = match tokio::net::TcpListener::bind(listen).await {
        Ok(listener) => listener,
        Err(error) => {
            return fail(
                &format!("--listen {listen}: cannot listen there: {error}"),
                EXIT_RUNTIME,
            )
        }
    };
    if let (Some(address), Some(handle)) = (metrics_listen, handle) {
        let metrics = match tokio::net::TcpListener::bind(address).await {
            Ok(listener) => listener,
            Err(error) => {
                return fail(
                    &format!("--metrics-listen {address}: cannot listen there: {error}"),
                    EXIT_RUNTIME,
                )
            }
        };
        tracing::info!(%address, "metrics at /metrics");
        tokio::spawn(async move {
            if let Err(error) = axum::serve(metrics, metrics_router(handle)).await {
                tracing::warn!(%error, "the metrics listener stopped");
            }
        });
    }
    match listener.local_addr() {
        Ok(address) => {
            tracing::info!(%address, "serving envoy.service.ratelimit.v3.RateLimitService")
        }
        Err(error) => tracing::warn!(%error, "serving, on an address the system does not tell"),
    }
    let limiter = rls.service.limiter().clone();
    if let Err(error) = serve(listener, rls.service, shutdown_signal()).await {
        return fail(&format!("serving failed: {error}"), EXIT_RUNTIME);
    }
    // Give back what this node's leases did not spend.
    let returned = limiter.refund_leases().await;
    tracing::info!(returned, "stopped");
    ExitCode::SUCCESS
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
