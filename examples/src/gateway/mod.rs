//! The example gateway: an axum server limited per tenant and user.
//!
//! - `GET /api/hello`: limited per tenant + user (tenant header, default
//!   `"public"`; user header required, 400 problem+json without it).
//! - `GET /ws`: a WebSocket echo; the upgrade request is limited by the same
//!   layer and window as `/api/hello` (tenant and user also from the
//!   `tenant` / `user` query parameters, demo only), then by a cluster-wide
//!   cap of connections per user (`--max-connections-per-user`); messages
//!   are limited (`--message-limit`, `--byte-limit`, `--on-message-limit`,
//!   `--max-message-bytes`) and deduplicated by `id` (`--dedup-window`).
//!   See [`ws`] and `examples/README.md`.
//! - `GET /presence?tenant=T&user=U`: `{"online":true,"connections":2}`,
//!   never limited.
//!   `GET /ws?room=R` joins room R instead of the echo, on the library's
//!   rooms ([`axum_window_ext::ws::rooms`]).
//! - `GET /healthz`: liveness, never limited.
//! - `GET /readyz`: readiness, never limited: `200` when the store can
//!   decide, `503` (`"status":"degraded"` and the reason) while it cannot
//!   (unreachable, breakers open); see [`crate::store_probe`].
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
//! `--lease N` turns quota leases on (each node spends up to `N` units of a
//! hot key locally per store call; `--lease-ttl`), and the binary refunds
//! what its leases left on graceful shutdown.
//!
//! With `--tenants FILE` each tenant (the tenant header) gets its own
//! policy from the file, hot-reloaded on change (see [`tenants`]); with
//! `--admin-token TOKEN` the tenant admin API of
//! [`axum_window_ext::admin`] is mounted at `/admin`.
//!
//! [`Args`] are the command-line flags (each also read from a `TW_*`
//! environment variable); [`Args::into_config`] turns them into a
//! [`GatewayConfig`]; [`build_app`] turns that into a [`Router`](axum::Router).

mod app;
mod config;
pub mod demo;
pub mod flags;
mod identity;
mod inbound_stream;
pub mod metrics;
pub mod tenants;
pub mod ws;

pub use app::{build_app, build_app_with_limiter, build_gateway, Gateway, RATELIMIT_SOURCE};
pub(crate) use config::{check_redis_url, redis_url_error};
pub use config::{
    AlgorithmArg, Args, ConfigError, FallbackArg, GatewayConfig, Resilience, RoomsConfig, RoomsRead,
};
