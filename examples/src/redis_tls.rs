//! The gateway's and the rls's Redis store from their flags: `--redis-url`
//! or `--redis-cluster`, and for `rediss://` the CA to trust and a client
//! certificate (`--redis-ca-file`, `--redis-client-cert`,
//! `--redis-client-key`). A user and password go in the URL.

use std::path::PathBuf;

use tower_window::store::redis::RedisTls;
use tower_window::RedisStore;

use crate::gateway::{check_redis_url, redis_url_error, ConfigError};

/// The TLS files of a `rediss://` store (all optional: without them the
/// system's roots verify the server and no client certificate is shown).
#[derive(Debug, Clone, Default)]
pub struct TlsFiles {
    /// A PEM file of the CA certificate(s) to trust instead of the
    /// system's roots.
    pub ca_file: Option<PathBuf>,
    /// A PEM client certificate (with `client_key`).
    pub client_cert: Option<PathBuf>,
    /// The client certificate's PEM private key.
    pub client_key: Option<PathBuf>,
}

impl TlsFiles {
    /// Whether any file is given.
    pub fn is_given(&self) -> bool {
        self.ca_file.is_some() || self.client_cert.is_some() || self.client_key.is_some()
    }

    fn load(&self) -> Result<Option<RedisTls>, ConfigError> {
        if !self.is_given() {
            return Ok(None);
        }
        let mut tls = RedisTls::new();
        if let Some(path) = &self.ca_file {
            tls = tls
                .ca_file(path)
                .map_err(|error| unreadable("--redis-ca-file", path, &error.to_string()))?;
        }
        match (&self.client_cert, &self.client_key) {
            (Some(cert), Some(key)) => {
                tls = tls.client_cert_files(cert, key).map_err(|error| {
                    let flag = if error.path() == cert.as_path() {
                        "--redis-client-cert"
                    } else {
                        "--redis-client-key"
                    };
                    unreadable(flag, error.path(), &error.to_string())
                })?;
            }
            (None, None) => {}
            (Some(path), None) => return Err(half_pair("--redis-client-cert", path)),
            (None, Some(path)) => return Err(half_pair("--redis-client-key", path)),
        }
        Ok(Some(tls))
    }
}

fn half_pair(flag: &'static str, path: &std::path::Path) -> ConfigError {
    ConfigError::new(
        flag,
        path.display().to_string(),
        "a client certificate needs both --redis-client-cert and --redis-client-key",
        "give the client certificate and its private key together",
    )
}

fn unreadable(flag: &'static str, path: &std::path::Path, error: &str) -> ConfigError {
    ConfigError::new(
        flag,
        path.display().to_string(),
        error.to_owned(),
        "give a readable PEM file",
    )
}

/// The Redis store the flags name, `None` for neither URL nor cluster.
/// TLS files need a `rediss://` URL.
pub fn redis_store(
    url: Option<&str>,
    cluster: &[String],
    tls: &TlsFiles,
) -> Result<Option<RedisStore>, ConfigError> {
    let settings = tls.load()?;
    let (flag, target, builder) = if let Some(url) = url {
        check_redis_url("--redis-url", url)?;
        (
            "--redis-url",
            url.to_owned(),
            RedisStore::builder().url(url),
        )
    } else if !cluster.is_empty() {
        for url in cluster {
            check_redis_url("--redis-cluster", url)?;
        }
        (
            "--redis-cluster",
            cluster.join(","),
            RedisStore::builder().cluster(cluster),
        )
    } else if tls.is_given() {
        return Err(ConfigError::new(
            "--redis-ca-file/--redis-client-cert",
            String::new(),
            "TLS files without a Redis: the embedded store has no connection",
            "give --redis-url rediss://... or --redis-cluster rediss://..., or leave the TLS files out",
        ));
    } else {
        return Ok(None);
    };
    let builder = match settings {
        Some(settings) => builder.tls(settings),
        None => builder,
    };
    builder.build().map(Some).map_err(|error| match error {
        tower_window::RedisConfigError::InvalidUrl(redis) => redis_url_error(flag, &target, &redis),
        other => ConfigError::new(flag, target, other.to_string(), "check the flag's value"),
    })
}
