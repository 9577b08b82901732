//! The example gateway: an axum server limited per tenant and user.
//!
//! - `GET /api/hello`: limited per tenant + user (tenant header, default
//!   `"public"`; user header required, 400 problem+json without it).
//! - `GET /ws`: a WebSocket echo; the upgrade request is limited by the same
//!   layer and window as `/api/hello`.
//! - `GET /healthz`: never limited.
//! - `GET /`: the demo page, and `GET /api/quota`: the quotas it shows,
//!   peeked without consuming them (see [`demo`]).
//! - `GET /metrics`: Prometheus text of tower-window's metrics, never limited
//!   (see [`metrics`]).
//!
//! With Redis (`--redis-url` / `--redis-cluster`) the limiter has a local
//! tier of recent denials, a circuit breaker, a time budget per decision
//! (`--redis-timeout-ms`) and a fallback policy (`--fallback`): `local`
//! (default; a window on this node with `limit / --expected-nodes`),
//! `fail-open` or `fail-closed` (503). `--debug-headers` adds
//! [`RATELIMIT_SOURCE`] (`x-ratelimit-source`) naming who decided.
//!
//! [`Args`] are the command-line flags (each also read from a `TW_*`
//! environment variable); [`Args::into_config`] turns them into a
//! [`GatewayConfig`]; [`build_app`] turns that into a [`Router`](axum::Router).

mod app;
mod config;
pub mod demo;
pub mod metrics;
mod ws;

pub use app::{build_app, RATELIMIT_SOURCE};
pub use config::{AlgorithmArg, Args, ConfigError, FallbackArg, GatewayConfig, Resilience};
