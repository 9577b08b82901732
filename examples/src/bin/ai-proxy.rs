//! `cargo run --release -p tower-window-examples --bin ai-proxy -- --fake-upstream`
//!
//! An OpenAI-style proxy: `POST /v1/...` forwarded to `--upstream`, each
//! tenant (`x-tenant`) limited to `--budget` tokens, settled from the
//! streamed answers. See `examples/README.md` ("ai-proxy").

use std::process::ExitCode;

use clap::Parser;
use tower_window_examples::ai_proxy::{fake_model, Args, Proxy};
use tower_window_examples::process::{
    fail, init_logging, shutdown_signal, EXIT_CONFIG, EXIT_RUNTIME,
};

#[tokio::main]
async fn main() -> ExitCode {
    init_logging();

    let mut args = Args::parse();
    let (listen, grace) = (args.listen, args.shutdown_grace);
    if args.fake_upstream {
        let model = match tokio::net::TcpListener::bind("127.0.0.1:0").await {
            Ok(model) => model,
            Err(error) => return fail(&format!("fake upstream: {error}"), EXIT_RUNTIME),
        };
        let address = model.local_addr().map(|a| format!("http://{a}"));
        args.upstream = address.ok();
        tokio::spawn(async move { axum::serve(model, fake_model()).await });
    }
    let upstream = args.upstream.clone().unwrap_or_default();
    let budget = args.budget.to_string();
    let config = match args.into_config() {
        Ok(config) => config,
        Err(error) => return fail(&error, EXIT_CONFIG),
    };
    tracing::info!(%upstream, %budget, estimate = config.estimate, "configured");
    let proxy = Proxy::new(config);
    let limiter = proxy.limiter().clone();
    let listener = match tokio::net::TcpListener::bind(listen).await {
        Ok(listener) => listener,
        Err(error) => return fail(&format!("--listen {listen}: {error}"), EXIT_RUNTIME),
    };
    tracing::info!(address = %listen, "listening");
    if let Err(error) = proxy.serve(listener, shutdown_signal(), grace).await {
        return fail(&format!("serving failed: {error}"), EXIT_RUNTIME);
    }
    let stats = limiter.stats();
    tracing::info!(
        settled = stats.settled,
        settle_errors = stats.settle_errors,
        "stopped: every answer's tokens settled"
    );
    ExitCode::SUCCESS
}
