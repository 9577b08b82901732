//! `cargo run -p tower-window-examples --bin audit-exporter -- --redis-url redis://127.0.0.1:6379 --consumer e1 --output audit.jsonl`
//!
//! Exports every tenant's audit stream as JSON lines; see
//! `tower_window_examples::audit_export` and `examples/README.md`.

use std::process::ExitCode;

use clap::Parser;
use tower_window_examples::audit_export::{Exporter, ExporterArgs};
use tower_window_examples::gateway::metrics::{install_recorder, metrics_router};
use tower_window_examples::process::{fail, init_logging, shutdown_signal, EXIT_RUNTIME};

#[tokio::main]
async fn main() -> ExitCode {
    init_logging();
    let args = ExporterArgs::parse();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => fail(&error, EXIT_RUNTIME),
    }
}

async fn run(args: ExporterArgs) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    if let Some(listen) = args.metrics_listen {
        let router = metrics_router(install_recorder());
        let listener = tokio::net::TcpListener::bind(listen).await?;
        tracing::info!(address = %listener.local_addr()?, "metrics");
        tokio::spawn(async move { axum::serve(listener, router).await });
    }
    tracing::info!(consumer = %args.consumer, group = %args.group, output = %args.output, "starting");
    let mut exporter = Exporter::connect(args).await?;
    // Stopping between two awaits is as safe as a crash (module docs).
    tokio::select! {
        result = exporter.run() => result?,
        () = shutdown_signal() => {}
    }
    tracing::info!(streams = exporter.streams(), "stopping");
    Ok(())
}
