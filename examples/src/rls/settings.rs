//! envoyproxy/ratelimit's settings, read by their own names, so that the
//! same environment (and the same volume mounts) start the rls.
//!
//! Each applies only where neither the flag nor its `TW_RLS_*` variable was
//! given (flags keep precedence over the environment):
//!
//! | setting | becomes |
//! |---|---|
//! | `GRPC_HOST`, `GRPC_PORT` | `--listen HOST:PORT` (defaults `0.0.0.0`, `8081` once either is set) |
//! | `RUNTIME_ROOT`, `RUNTIME_SUBDIRECTORY`, `RUNTIME_APPDIRECTORY` | `--config ROOT/SUBDIRECTORY/APPDIRECTORY` (defaults `/srv/runtime_data/current`, none, `config` once one is set) |
//! | `REDIS_URL`, `REDIS_TYPE`, `REDIS_SOCKET_TYPE`, `REDIS_AUTH`, `REDIS_TLS` | `--redis-url` (`SINGLE`) or `--redis-cluster` (`CLUSTER`); `tcp` addresses `host:port`, `unix` a socket path |
//! | `SHADOW_MODE`, `QUOTA_MODE`, `MERGE_DOMAIN_CONFIG`, `RESPONSE_DYNAMIC_METADATA` | `--shadow-mode`, `--quota-mode`, `--merge-domain-config`, `--dynamic-metadata` |
//! | `LOCAL_CACHE_SIZE_IN_BYTES` | `--local-cache-keys` = bytes / [`LOCAL_CACHE_ENTRY_BYTES`] (0: off) |
//! | `USE_PROMETHEUS`, `PROMETHEUS_ADDR` | `--metrics-listen` (`:9090` is `0.0.0.0:9090`; the path is `/metrics`) |
//! | `LIMIT_RESPONSE_HEADERS_ENABLED`, `LIMIT_LIMIT_HEADER`, `LIMIT_REMAINING_HEADER`, `LIMIT_RESET_HEADER` | `--response-headers`, `--limit-header`, `--remaining-header`, `--reset-header` |
//! | `LIMIT_PER_UNIT_HEADERS_ENABLED` | `--per-unit-headers` |
//! | `LIMIT_REQUEST_HEADERS_ENABLED`, `LIMIT_REQUEST_LIMIT_HEADER`, `LIMIT_REQUEST_REMAINING_HEADER`, `LIMIT_REQUEST_RESET_HEADER` | `--request-headers`, `--request-limit-header`, `--request-remaining-header`, `--request-reset-header` |
//! | `BACKEND_TYPE` | `redis` only (`memcache` is refused, naming the setting) |
//!
//! Booleans are read as Go's `strconv.ParseBool` reads them (`1`, `t`,
//! `true`, `TRUE`, `True`, `0`, `f`, ...), as envoyproxy/ratelimit does.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use clap::parser::ValueSource;
use clap::ArgMatches;

use super::RlsArgs;
use crate::gateway::ConfigError;

/// Every envoyproxy/ratelimit setting this module reads.
pub const READ: &[&str] = &[
    "BACKEND_TYPE",
    "GRPC_HOST",
    "GRPC_PORT",
    "RUNTIME_ROOT",
    "RUNTIME_SUBDIRECTORY",
    "RUNTIME_APPDIRECTORY",
    "REDIS_URL",
    "REDIS_TYPE",
    "REDIS_SOCKET_TYPE",
    "REDIS_AUTH",
    "REDIS_TLS",
    "SHADOW_MODE",
    "QUOTA_MODE",
    "MERGE_DOMAIN_CONFIG",
    "RESPONSE_DYNAMIC_METADATA",
    "LOCAL_CACHE_SIZE_IN_BYTES",
    "USE_PROMETHEUS",
    "PROMETHEUS_ADDR",
    "LIMIT_RESPONSE_HEADERS_ENABLED",
    "LIMIT_LIMIT_HEADER",
    "LIMIT_REMAINING_HEADER",
    "LIMIT_RESET_HEADER",
    "LIMIT_REQUEST_HEADERS_ENABLED",
    "LIMIT_PER_UNIT_HEADERS_ENABLED",
    "LIMIT_REQUEST_LIMIT_HEADER",
    "LIMIT_REQUEST_REMAINING_HEADER",
    "LIMIT_REQUEST_RESET_HEADER",
];

/// How many bytes of `LOCAL_CACHE_SIZE_IN_BYTES` one key of the local tier
/// is counted as: a key (domain, rule and values), its deadline and the
/// cache's own bookkeeping.
pub const LOCAL_CACHE_ENTRY_BYTES: u64 = 256;

/// Applies envoyproxy/ratelimit's settings that `env` holds to `args`,
/// where `matches` (the command line `args` came from) shows that neither
/// the flag nor its `TW_RLS_*` variable gave a value.
pub fn apply(
    args: &mut RlsArgs,
    matches: &ArgMatches,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(), ConfigError> {
    let given = |id: &str| {
        matches!(
            matches.value_source(id),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        )
    };
    if let Some(backend) = env("BACKEND_TYPE") {
        if !backend.eq_ignore_ascii_case("redis") {
            return Err(ConfigError::new(
                "BACKEND_TYPE",
                backend,
                "only redis is served here (or the embedded store, without REDIS_URL)",
                "unset BACKEND_TYPE, or set it to redis with REDIS_URL",
            ));
        }
    }
    if !given("listen") {
        let host = env("GRPC_HOST");
        let port = env("GRPC_PORT");
        if host.is_some() || port.is_some() {
            args.listen = grpc_listen(host.as_deref(), port.as_deref())?;
        }
    }
    if !given("config") {
        if let Some(dir) = runtime_dir(env) {
            args.config = vec![dir];
        }
    }
    if !given("redis_url") && !given("redis_cluster") {
        if let Some(url) = env("REDIS_URL") {
            match redis_urls(&url, env)? {
                Redis::Single(url) => args.redis_url = Some(url),
                Redis::Cluster(urls) => args.redis_cluster = urls,
            }
        }
    }
    for (id, name, field) in [
        ("shadow_mode", "SHADOW_MODE", &mut args.shadow_mode),
        ("quota_mode", "QUOTA_MODE", &mut args.quota_mode),
        (
            "dynamic_metadata",
            "RESPONSE_DYNAMIC_METADATA",
            &mut args.dynamic_metadata,
        ),
        (
            "merge_domain_config",
            "MERGE_DOMAIN_CONFIG",
            &mut args.merge_domain_config,
        ),
        (
            "response_headers",
            "LIMIT_RESPONSE_HEADERS_ENABLED",
            &mut args.response_headers,
        ),
        (
            "request_headers",
            "LIMIT_REQUEST_HEADERS_ENABLED",
            &mut args.request_headers,
        ),
        (
            "per_unit_headers",
            "LIMIT_PER_UNIT_HEADERS_ENABLED",
            &mut args.per_unit_headers,
        ),
    ] {
        if !given(id) {
            if let Some(value) = env(name) {
                *field = go_bool(name, &value)?;
            }
        }
    }
    for (id, name, field) in [
        ("limit_header", "LIMIT_LIMIT_HEADER", &mut args.limit_header),
        (
            "remaining_header",
            "LIMIT_REMAINING_HEADER",
            &mut args.remaining_header,
        ),
        ("reset_header", "LIMIT_RESET_HEADER", &mut args.reset_header),
        (
            "request_limit_header",
            "LIMIT_REQUEST_LIMIT_HEADER",
            &mut args.request_limit_header,
        ),
        (
            "request_remaining_header",
            "LIMIT_REQUEST_REMAINING_HEADER",
            &mut args.request_remaining_header,
        ),
        (
            "request_reset_header",
            "LIMIT_REQUEST_RESET_HEADER",
            &mut args.request_reset_header,
        ),
    ] {
        if !given(id) {
            if let Some(value) = env(name).filter(|v| !v.is_empty()) {
                if http::HeaderName::from_bytes(value.as_bytes()).is_err() {
                    return Err(ConfigError::new(
                        name,
                        value,
                        "not an HTTP header name",
                        format!(
                            "write a name of letters, digits and -, e.g. {name}=RateLimit-Limit"
                        ),
                    ));
                }
                *field = value;
            }
        }
    }
    if !given("metrics_listen") {
        let on = match env("USE_PROMETHEUS") {
            Some(value) => go_bool("USE_PROMETHEUS", &value)?,
            None => false,
        };
        if on {
            let addr = env("PROMETHEUS_ADDR").unwrap_or_else(|| ":9090".to_owned());
            args.metrics_listen = Some(prometheus_addr(&addr)?);
        }
    }
    if !given("local_cache_keys") {
        if let Some(bytes) = env("LOCAL_CACHE_SIZE_IN_BYTES") {
            let bytes: u64 = bytes.trim().parse().map_err(|_| {
                ConfigError::new(
                    "LOCAL_CACHE_SIZE_IN_BYTES",
                    bytes.clone(),
                    "not a number of bytes",
                    "write a whole number, e.g. LOCAL_CACHE_SIZE_IN_BYTES=1048576 (0 turns the local cache off)",
                )
            })?;
            args.local_cache_keys = bytes / LOCAL_CACHE_ENTRY_BYTES;
        }
    }
    Ok(())
}

/// `GRPC_HOST` and `GRPC_PORT` as an address (envoyproxy/ratelimit's
/// defaults for the one not set).
fn grpc_listen(host: Option<&str>, port: Option<&str>) -> Result<SocketAddr, ConfigError> {
    let host = host.unwrap_or("0.0.0.0");
    let port = port.unwrap_or("8081");
    let ip: IpAddr = host.trim().parse().map_err(|_| {
        ConfigError::new(
            "GRPC_HOST",
            host,
            "not an IP address",
            "write an address to listen on, e.g. GRPC_HOST=0.0.0.0",
        )
    })?;
    let port: u16 = port.trim().parse().map_err(|_| {
        ConfigError::new(
            "GRPC_PORT",
            port,
            "not a port (0-65535)",
            "write a port, e.g. GRPC_PORT=8081",
        )
    })?;
    Ok(SocketAddr::new(ip, port))
}

/// `PROMETHEUS_ADDR` (Go's `host:port`, `:port` meaning every address).
fn prometheus_addr(addr: &str) -> Result<SocketAddr, ConfigError> {
    let trimmed = addr.trim();
    let full = match trimmed.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => trimmed.to_owned(),
    };
    full.parse().map_err(|_| {
        ConfigError::new(
            "PROMETHEUS_ADDR",
            addr,
            "not an address to listen on",
            "write IP:PORT or :PORT, e.g. PROMETHEUS_ADDR=:9090",
        )
    })
}

/// `RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY`, when any of
/// them is set.
fn runtime_dir(env: &dyn Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let root = env("RUNTIME_ROOT");
    let sub = env("RUNTIME_SUBDIRECTORY");
    let app = env("RUNTIME_APPDIRECTORY");
    if root.is_none() && sub.is_none() && app.is_none() {
        return None;
    }
    let mut dir = PathBuf::from(root.unwrap_or_else(|| "/srv/runtime_data/current".to_owned()));
    if let Some(sub) = sub.filter(|s| !s.is_empty()) {
        dir.push(sub);
    }
    dir.push(app.unwrap_or_else(|| "config".to_owned()));
    Some(dir)
}

/// Where `REDIS_URL` points, as our flags take it.
#[derive(Debug, PartialEq, Eq)]
enum Redis {
    Single(String),
    Cluster(Vec<String>),
}

/// `REDIS_URL` (with `REDIS_TYPE`, `REDIS_SOCKET_TYPE`, `REDIS_AUTH`,
/// `REDIS_TLS`) as Redis URLs.
fn redis_urls(url: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Redis, ConfigError> {
    let kind = env("REDIS_TYPE").unwrap_or_else(|| "SINGLE".to_owned());
    let socket = env("REDIS_SOCKET_TYPE").unwrap_or_else(|| "unix".to_owned());
    let tls = match env("REDIS_TLS") {
        Some(value) => go_bool("REDIS_TLS", &value)?,
        None => false,
    };
    let auth = env("REDIS_AUTH").filter(|a| !a.is_empty());
    // `user:password` or a bare password, as envoyproxy/ratelimit reads it.
    let credentials = auth.map(|auth| match auth.split_once(':') {
        Some((user, password)) => format!("{user}:{password}@"),
        None => format!(":{auth}@"),
    });
    let scheme = if tls { "rediss" } else { "redis" };
    let tcp = |address: &str| {
        let address = address.trim();
        if address.contains("://") {
            address.to_owned()
        } else {
            format!(
                "{scheme}://{}{address}",
                credentials.as_deref().unwrap_or("")
            )
        }
    };
    let unix = socket.eq_ignore_ascii_case("unix");
    if !unix && !socket.eq_ignore_ascii_case("tcp") {
        return Err(ConfigError::new(
            "REDIS_SOCKET_TYPE",
            socket,
            "expected tcp or unix",
            "write REDIS_SOCKET_TYPE=tcp for host:port addresses",
        ));
    }
    match kind.to_ascii_uppercase().as_str() {
        "SINGLE" if unix && !url.contains("://") => {
            Ok(Redis::Single(format!("redis+unix://{}", url.trim())))
        }
        "SINGLE" => Ok(Redis::Single(tcp(url))),
        "CLUSTER" if unix => Err(ConfigError::new(
            "REDIS_SOCKET_TYPE",
            socket,
            "a Redis Cluster is reached over tcp",
            "write REDIS_SOCKET_TYPE=tcp with REDIS_URL=host1:port1,host2:port2",
        )),
        "CLUSTER" => Ok(Redis::Cluster(url.split(',').map(tcp).collect())),
        _ => Err(ConfigError::new(
            "REDIS_TYPE",
            kind,
            "expected SINGLE or CLUSTER (Sentinel is not served here)",
            "write REDIS_TYPE=SINGLE or REDIS_TYPE=CLUSTER",
        )),
    }
}

/// A boolean as Go's `strconv.ParseBool` reads it.
fn go_bool(name: &'static str, value: &str) -> Result<bool, ConfigError> {
    match value.trim() {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" | "" => Ok(false),
        _ => Err(ConfigError::new(
            name,
            value,
            "not a boolean",
            format!("write {name}=true or {name}=false"),
        )),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::HashMap;

    use clap::{CommandFactory, FromArgMatches};

    use super::*;

    fn with(argv: &[&str], vars: &[(&str, &str)]) -> Result<RlsArgs, ConfigError> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let matches = RlsArgs::command().try_get_matches_from(argv).unwrap();
        let mut args = RlsArgs::from_arg_matches(&matches).unwrap();
        apply(&mut args, &matches, &|name| vars.get(name).cloned())?;
        Ok(args)
    }

    #[test]
    fn reference_settings_apply_where_no_flag_was_given() {
        let args = with(
            &["rls"],
            &[
                ("GRPC_PORT", "9000"),
                ("RUNTIME_ROOT", "/data"),
                ("RUNTIME_SUBDIRECTORY", "ratelimit"),
                ("REDIS_SOCKET_TYPE", "tcp"),
                ("REDIS_URL", "redis:6379"),
                ("SHADOW_MODE", "1"),
                ("MERGE_DOMAIN_CONFIG", "True"),
                ("LOCAL_CACHE_SIZE_IN_BYTES", "1024"),
                ("USE_PROMETHEUS", "true"),
            ],
        )
        .unwrap();
        assert_eq!(args.listen.to_string(), "0.0.0.0:9000");
        assert_eq!(args.config, [PathBuf::from("/data/ratelimit/config")]);
        assert_eq!(args.redis_url.as_deref(), Some("redis://redis:6379"));
        assert!(args.shadow_mode && args.merge_domain_config && !args.quota_mode);
        assert_eq!(args.local_cache_keys, 4);
        assert_eq!(args.metrics_listen.unwrap().to_string(), "0.0.0.0:9090");
    }

    #[test]
    fn flags_keep_precedence() {
        let args = with(
            &[
                "rls",
                "--listen",
                "127.0.0.1:1",
                "--config",
                "a.yaml",
                "--local-cache-keys",
                "7",
            ],
            &[
                ("GRPC_PORT", "9000"),
                ("RUNTIME_ROOT", "/data"),
                ("LOCAL_CACHE_SIZE_IN_BYTES", "0"),
            ],
        )
        .unwrap();
        assert_eq!(args.listen.to_string(), "127.0.0.1:1");
        assert_eq!(args.config, [PathBuf::from("a.yaml")]);
        assert_eq!(args.local_cache_keys, 7);
    }

    #[test]
    fn every_setting_read_is_listed() {
        let source = include_str!("settings.rs");
        let code = source.split("mod tests").next().unwrap();
        for (i, _) in code.match_indices("env(\"") {
            let name = code[i + 5..].split('"').next().unwrap();
            assert!(READ.contains(&name), "{name} is read but not in READ");
        }
        let mut fields = 0;
        for (i, _) in code.match_indices("&mut args.") {
            let name = code[..i].rsplit('"').nth(1).unwrap();
            assert!(READ.contains(&name), "{name} is read but not in READ");
            fields += 1;
        }
        assert!(fields >= 10, "{fields}");
    }

    #[test]
    fn redis_layouts() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                vars.iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert_eq!(
            redis_urls("/var/run/redis.sock", &env(&[])).unwrap(),
            Redis::Single("redis+unix:///var/run/redis.sock".to_owned())
        );
        assert_eq!(
            redis_urls(
                "a:1,b:2",
                &env(&[
                    ("REDIS_TYPE", "cluster"),
                    ("REDIS_SOCKET_TYPE", "tcp"),
                    ("REDIS_AUTH", "pw")
                ])
            )
            .unwrap(),
            Redis::Cluster(vec![
                "redis://:pw@a:1".to_owned(),
                "redis://:pw@b:2".to_owned()
            ])
        );
        let error = redis_urls("x:1", &env(&[("REDIS_TYPE", "SENTINEL")])).unwrap_err();
        assert_eq!(error.flag, "REDIS_TYPE");
        let error = go_bool("SHADOW_MODE", "yes").unwrap_err().to_string();
        assert!(error.contains("SHADOW_MODE yes: not a boolean"), "{error}");
    }
}
