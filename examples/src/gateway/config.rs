//! Command-line flags and the configuration built from them.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::http::HeaderName;
use clap::{Parser, ValueEnum};
use tower_window::quota::default_granularity;
use tower_window::{Algorithm, MemoryStore, Quota, QuotaError, Store};

/// The gateway's flags. Every flag can also be set from the environment
/// variable shown in `--help`.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "gateway",
    version,
    about = "An axum gateway rate limited by tower-window"
)]
pub struct Args {
    /// Address to listen on.
    #[arg(long, env = "TW_LISTEN", default_value = "127.0.0.1:3000")]
    pub listen: SocketAddr,

    /// Quota per tenant and user, in the quota DSL (`100/1m`, `10/s`,
    /// `5000/1h sliding-counter(1m)`, `10/s gcra(burst=20)`).
    #[arg(long, env = "TW_LIMIT", default_value = "100/1m")]
    pub limit: Quota,

    /// Counting algorithm; overrides the one written in `--limit` and keeps
    /// its numbers. `sliding-counter` picks a granularity of at most 60
    /// buckets per window.
    #[arg(long, env = "TW_ALGORITHM", value_enum)]
    pub algorithm: Option<AlgorithmArg>,

    /// Header naming the tenant; requests without it are in tenant `public`.
    #[arg(long, env = "TW_TENANT_HEADER", default_value = "x-tenant-id")]
    pub tenant_header: HeaderName,

    /// Header naming the user; requests without it are rejected with 400.
    #[arg(long, env = "TW_USER_HEADER", default_value = "x-user-id")]
    pub user_header: HeaderName,
}

/// `--algorithm` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AlgorithmArg {
    /// Exact sliding log.
    SlidingLog,
    /// Bucketed sliding counter.
    SlidingCounter,
    /// Windows aligned to the epoch.
    FixedWindow,
    /// Generic cell rate algorithm (token bucket).
    Gcra,
}

impl Args {
    /// The quota to enforce: `--limit`, with `--algorithm` applied.
    pub fn quota(&self) -> Result<Quota, QuotaError> {
        let Some(algorithm) = self.algorithm else {
            return Ok(self.limit.clone());
        };
        let base = &self.limit;
        let mut builder = Quota::builder()
            .name(base.name())
            .limit(base.limit())
            .window(base.window());
        builder = match algorithm {
            AlgorithmArg::SlidingLog => builder.algorithm(Algorithm::SlidingLog),
            AlgorithmArg::SlidingCounter => builder.granularity(default_granularity(base.window())),
            AlgorithmArg::FixedWindow => builder.algorithm(Algorithm::FixedWindow),
            AlgorithmArg::Gcra => {
                let builder = builder.algorithm(Algorithm::Gcra);
                match base.burst() {
                    Some(burst) => builder.burst(burst),
                    None => builder,
                }
            }
        };
        builder.build()
    }

    /// Builds the gateway's configuration, including its store.
    pub fn into_config(self) -> Result<GatewayConfig, ConfigError> {
        let quota = self.quota().map_err(ConfigError::Quota)?;
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        Ok(GatewayConfig {
            quota,
            store,
            tenant_header: self.tenant_header,
            user_header: self.user_header,
        })
    }
}

/// Everything [`build_app`](super::build_app) needs.
#[derive(Clone)]
#[non_exhaustive]
pub struct GatewayConfig {
    /// The quota per tenant and user.
    pub quota: Quota,
    /// Where windows live (the embedded store for now).
    pub store: Arc<dyn Store>,
    /// Header naming the tenant (default tenant: `public`).
    pub tenant_header: HeaderName,
    /// Header naming the user (required).
    pub user_header: HeaderName,
}

impl GatewayConfig {
    /// `quota` on a fresh embedded store, with the default headers.
    pub fn new(quota: Quota) -> Self {
        Self::with_store(quota, Arc::new(MemoryStore::new()))
    }

    /// `quota` on `store`, with the default headers.
    pub fn with_store(quota: Quota, store: Arc<dyn Store>) -> Self {
        Self {
            quota,
            store,
            tenant_header: HeaderName::from_static("x-tenant-id"),
            user_header: HeaderName::from_static("x-user-id"),
        }
    }
}

impl fmt::Debug for GatewayConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GatewayConfig")
            .field("quota", &self.quota)
            .field("tenant_header", &self.tenant_header)
            .field("user_header", &self.user_header)
            .finish_non_exhaustive()
    }
}

/// Why the flags do not make a configuration.
#[derive(Debug)]
#[non_exhaustive]
pub enum ConfigError {
    /// `--limit` and `--algorithm` do not make a valid quota.
    Quota(QuotaError),
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Quota(error) => write!(f, "invalid --limit/--algorithm: {error}"),
        }
    }
}

impl std::error::Error for ConfigError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Quota(error) => Some(error),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn args(extra: &[&str]) -> Args {
        let mut argv = vec!["gateway"];
        argv.extend_from_slice(extra);
        Args::try_parse_from(argv).unwrap()
    }

    #[test]
    fn defaults() {
        let args = args(&[]);
        assert_eq!(args.listen, "127.0.0.1:3000".parse().unwrap());
        assert_eq!(args.quota().unwrap(), "100/1m".parse().unwrap());
        assert_eq!(args.tenant_header, "x-tenant-id");
        assert_eq!(args.user_header, "x-user-id");
    }

    #[test]
    fn algorithm_keeps_the_numbers() {
        let q = args(&["--limit", "10/1m", "--algorithm", "gcra"])
            .quota()
            .unwrap();
        assert_eq!(q.algorithm(), Algorithm::Gcra);
        assert_eq!((q.limit(), q.window_micros()), (10, 60_000_000));
        let q = args(&["--limit", "10/1m", "--algorithm", "sliding-counter"])
            .quota()
            .unwrap();
        assert_eq!(
            q.algorithm(),
            Algorithm::SlidingCounter {
                granularity: std::time::Duration::from_secs(1)
            }
        );
        let q = args(&["--limit", "10/1m", "--algorithm", "fixed-window"])
            .quota()
            .unwrap();
        assert_eq!(q.algorithm(), Algorithm::FixedWindow);
        let q = args(&["--limit", "10/s gcra(burst=20)", "--algorithm", "gcra"])
            .quota()
            .unwrap();
        assert_eq!(q.capacity(), 20);
    }

    #[test]
    fn rejects_bad_input() {
        let argv = ["gateway", "--limit", "0/1m"];
        assert!(Args::try_parse_from(argv).is_err());
        let argv = ["gateway", "--algorithm", "leaky-bucket"];
        assert!(Args::try_parse_from(argv).is_err());
    }
}
