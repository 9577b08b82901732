//! `cargo run -p tower-window-examples --bin inbound-worker -- --redis-url redis://127.0.0.1:6379 --consumer w1`
//!
//! Consumes the inbound stream with a consumer group; see
//! `tower_window_examples::inbound` and `examples/README.md`.

use clap::Parser;
use tower_window_examples::gateway::metrics::{install_recorder, metrics_router};
use tower_window_examples::inbound::{Worker, WorkerArgs};
use tower_window_examples::process::init_logging;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    init_logging();
    let args = WorkerArgs::parse();
    if let Some(listen) = args.metrics_listen {
        let router = metrics_router(install_recorder());
        let listener = tokio::net::TcpListener::bind(listen).await?;
        tracing::info!(address = %listener.local_addr()?, "metrics");
        tokio::spawn(async move { axum::serve(listener, router).await });
    }
    tracing::info!(consumer = %args.consumer, stream = %args.stream, group = %args.group, "starting");
    let mut worker = Worker::connect(args).await?;
    worker.run().await?;
    tracing::info!("idle; stopping");
    Ok(())
}
