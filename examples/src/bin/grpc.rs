//! `cargo run -p tower-window-examples --bin grpc -- --listen 127.0.0.1:50051`
//!
//! A tonic service with per-method quotas; see
//! `tower_window_examples::grpc` and `examples/README.md`.

use clap::Parser;
use tower_window_examples::grpc::{serve, BoxError, GrpcArgs};
use tower_window_examples::process::init_logging;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    init_logging();
    let args = GrpcArgs::parse();
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    tracing::info!(
        address = %listener.local_addr()?,
        get_item = %args.get_item,
        reserve = %args.reserve,
        default = %args.default,
        "serving inventory.v1.Inventory"
    );
    serve(listener, &args).await
}
