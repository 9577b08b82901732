//! `cargo run --release -p tower-window-examples --bin rls -- --config examples/rls/config.yaml`
//!
//! An Envoy rate limit service (`envoy.service.ratelimit.v3`) reading
//! envoyproxy/ratelimit's rule files, with sliding windows; see
//! `tower_window_examples::rls` and `examples/README.md`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, FromArgMatches};
use tower_window::Store;
use tower_window_examples::gateway::metrics::{install_recorder, metrics_router};
use tower_window_examples::process::{
    fail, init_logging, shutdown_signal, EXIT_CONFIG, EXIT_RUNTIME,
};
use tower_window_examples::redis_tls::{redis_store, TlsFiles};
use tower_window_examples::rls::{build, serve, serve_with_tonic, settings, GrpcServer, RlsArgs};
use tower_window_examples::store_probe::{describe_store, StoreProbe};

/// The rls's flags, and the store probe's beside them.
#[derive(Debug, clap::Parser)]
#[command(
    name = "rls",
    version,
    about = "An Envoy rate limit service with sliding windows, on tower-window"
)]
struct Cli {
    #[command(flatten)]
    rls: RlsArgs,

    /// Refuse to start (exit 1) when the store cannot be reached at start,
    /// instead of logging why and answering from `--fallback` until it can
    /// (`GET /readyz` on `--metrics-listen` answers 503 meanwhile).
    #[arg(long, env = "TW_RLS_REQUIRE_STORE")]
    require_store: bool,

    /// With `rediss://`: a PEM file of the CA certificate(s) that signed
    /// the Redis server's certificate, trusted instead of the system's
    /// root certificates (a single Redis and every cluster node).
    #[arg(long, env = "TW_RLS_REDIS_CA_FILE", value_name = "FILE")]
    redis_ca_file: Option<PathBuf>,

    /// With `rediss://`: a PEM client certificate to present (mutual
    /// TLS), with `--redis-client-key`.
    #[arg(long, env = "TW_RLS_REDIS_CLIENT_CERT", value_name = "FILE")]
    redis_client_cert: Option<PathBuf>,

    /// The PEM private key of `--redis-client-cert`.
    #[arg(long, env = "TW_RLS_REDIS_CLIENT_KEY", value_name = "FILE")]
    redis_client_key: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> ExitCode {
    init_logging();
    // envoyproxy/ratelimit's settings (`REDIS_URL`, `RUNTIME_ROOT`, ...)
    // under the flags: a flag or `TW_RLS_*` variable wins.
    let matches = Cli::command().get_matches();
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|error| error.exit());
    if let Err(error) = settings::apply(&mut cli.rls, &matches, &|name| std::env::var(name).ok()) {
        return fail(&error, EXIT_CONFIG);
    }
    let Cli {
        rls: args,
        require_store,
        redis_ca_file,
        redis_client_cert,
        redis_client_key,
    } = cli;
    let store_name = describe_store(args.redis_url.as_deref(), &args.redis_cluster);
    let tls = TlsFiles {
        ca_file: redis_ca_file,
        client_cert: redis_client_cert,
        client_key: redis_client_key,
    };
    // With TLS files, the same store built with them (`RlsArgs` knows only
    // the URL): same Redis, same time budget.
    let tls_store = match tls.is_given() {
        true => match redis_store(args.redis_url.as_deref(), &args.redis_cluster, &tls) {
            Ok(redis) => redis.map(|redis| {
                Store::builder(redis)
                    .timeout(Duration::from_millis(args.redis_timeout_ms))
                    .build()
            }),
            Err(error) => return fail(&error, EXIT_CONFIG),
        },
        false => None,
    };
    let listen = args.listen;
    let metrics_listen = args.metrics_listen;
    let grpc_server = args.grpc_server;
    // Before anything records: a registration made earlier is lost.
    let handle = metrics_listen.map(|_| install_recorder());
    let mut config = match args.into_config() {
        Ok(config) => config,
        Err(error) => return fail(&error, EXIT_CONFIG),
    };
    if let Some(store) = tls_store {
        config.store = store;
    }
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
    // One line naming the store and why it cannot be reached, if so.
    let probe = StoreProbe::new(&config.store, store_name);
    if let Err(error) = probe.at_start(require_store).await {
        return fail(&error, EXIT_RUNTIME);
    }
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
        tracing::info!(%address, "metrics at /metrics, liveness at /healthz, readiness at /readyz");
        let router = metrics_router(handle)
            .route("/healthz", axum::routing::get(|| async { "ok" }))
            .merge(probe.router());
        tokio::spawn(async move {
            if let Err(error) = axum::serve(metrics, router).await {
                tracing::warn!(%error, "the metrics listener stopped");
            }
        });
    }
    match listener.local_addr() {
        Ok(address) => tracing::info!(
            %address,
            server = ?grpc_server,
            "serving envoy.service.ratelimit.v3.RateLimitService"
        ),
        Err(error) => tracing::warn!(%error, "serving, on an address the system does not tell"),
    }
    let limiter = rls.service.limiter().clone();
    let served = match grpc_server {
        GrpcServer::Tonic => serve_with_tonic(listener, rls.service, shutdown_signal())
            .await
            .map_err(|e| e.to_string()),
        GrpcServer::H2 => serve(listener, rls.service, shutdown_signal())
            .await
            .map_err(|e| e.to_string()),
    };
    if let Err(error) = served {
        return fail(&format!("serving failed: {error}"), EXIT_RUNTIME);
    }
    // Give back what this node's leases did not spend.
    let returned = limiter.refund_leases().await;
    tracing::info!(returned, "stopped");
    ExitCode::SUCCESS
}
