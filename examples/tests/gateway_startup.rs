//! What the built `gateway` says when it starts (issue 26): with a tenants
//! file, the file and its tenants (the `--limit` policy serves none of
//! them then); without one, the one policy and its quotas. And (issue 37)
//! whether its store can be reached: one log line naming the store (never
//! its password) and why not, `GET /readyz` answering 503 while the store
//! cannot decide and 200 when it can (`/healthz`, liveness, stays 200), and
//! `--require-store` refusing to start without it.
#![allow(clippy::unwrap_used)]

mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use support::GatewayProcess;
use tower_window_tests::redis_server::{reserve_port, RedisServer};

const TENANTS: &str = r#"
[tenants.acme]
quotas = { burst = "3/1m" }

[tenants.trial]
quotas = { minute = "2/1m" }
shadow = ["minute"]

[tenants.internal]
unlimited = true
"#;

/// The first log line that says how the gateway was configured.
fn configured(gateway: &GatewayProcess) -> String {
    let log = gateway.log();
    log.lines()
        .find(|line| line.contains("configured"))
        .unwrap_or_else(|| panic!("no \"configured\" line in the log:\n{log}"))
        .to_owned()
}

#[test]
fn the_startup_log_names_the_tenants_file_and_its_tenants() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tenants.toml");
    std::fs::write(&file, TENANTS).unwrap();
    let gateway = GatewayProcess::start(&["--tenants", file.to_str().unwrap()]);
    let line = configured(&gateway);
    assert!(
        line.contains("per-tenant policies from the tenants file"),
        "{line}"
    );
    assert!(line.contains(&file.display().to_string()), "{line}");
    for tenant in [
        "acme (burst=3/1m)",
        "trial (minute=2/1m (shadow))",
        "internal (unlimited)",
    ] {
        assert!(line.contains(tenant), "{tenant:?} missing: {line}");
    }
    // No [default]: unknown tenants are refused, and the log says so.
    assert!(line.contains("refused (403)"), "{line}");
    // The unused `--limit` policy is not presented as the configuration.
    assert!(!line.contains("policy=default"), "{line}");
}

#[test]
fn without_a_tenants_file_the_startup_log_names_the_one_policy() {
    let gateway = GatewayProcess::start(&["--limit", "5/1m"]);
    let line = configured(&gateway);
    assert!(
        line.contains("one policy for every tenant and user"),
        "{line}"
    );
    assert!(line.contains("5/1m"), "{line}");
}

/// The status code and body of `GET path`.
fn get(port: u16, path: &str) -> (u16, String) {
    let response = support::http_get(port, path).unwrap();
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status: {response:?}"));
    let body = response
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    (status, body)
}

/// The log line saying the store cannot be reached.
fn unreachable_line(log: &str) -> &str {
    log.lines()
        .find(|line| line.contains("store unreachable"))
        .unwrap_or_else(|| panic!("no \"store unreachable\" line in the log:\n{log}"))
}

/// Waits (at most 10 s) until `GET /readyz` answers `status`; the body.
fn ready_becomes(port: u16, status: u16) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (now, body) = get(port, "/readyz");
        if now == status {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "/readyz stayed {now} ({body}), expected {status}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn an_unresolvable_store_host_is_named_at_start_and_readyz_is_degraded() {
    let gateway = GatewayProcess::start(&["--redis-url", "redis://no-such-host.invalid:6379"]);
    let log = gateway.log();
    let line = unreachable_line(&log);
    assert!(line.contains("redis://no-such-host.invalid:6379"), "{line}");
    // Why: the name does not resolve (the system's words vary).
    let lower = line.to_ascii_lowercase();
    assert!(
        ["lookup", "resolve", "name or service", "nodename"]
            .iter()
            .any(|why| lower.contains(why)),
        "{line}"
    );
    // Liveness: the process serves. Readiness: its store cannot decide.
    assert_eq!(get(gateway.port(), "/healthz").0, 200);
    let (status, body) = get(gateway.port(), "/readyz");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains(r#""status":"degraded""#), "{body}");
    assert!(body.contains("no-such-host.invalid"), "{body}");
}

#[test]
fn a_stopped_redis_is_named_without_its_password() {
    let mut redis = RedisServer::start();
    let port = redis.port();
    redis.stop();
    let url = format!("redis://app:hunter2@127.0.0.1:{port}/0");
    let gateway = GatewayProcess::start(&["--redis-url", &url]);
    let log = gateway.log();
    assert!(!log.contains("hunter2"), "the password is logged:\n{log}");
    let line = unreachable_line(&log);
    assert!(
        line.contains(&format!("redis://app:***@127.0.0.1:{port}/0")),
        "{line}"
    );
    assert!(line.to_ascii_lowercase().contains("refused"), "{line}");
    let body = ready_becomes(gateway.port(), 503);
    assert!(!body.contains("hunter2"), "{body}");
}

#[test]
fn readyz_follows_the_store_and_healthz_does_not() {
    let mut redis = RedisServer::start();
    let gateway = GatewayProcess::start(&["--redis-url", &redis.url()]);
    let log = gateway.log();
    assert!(
        log.lines()
            .any(|l| l.contains("store reachable") && l.contains(&redis.url())),
        "{log}"
    );
    let body = ready_becomes(gateway.port(), 200);
    assert!(body.contains(r#""status":"ready""#), "{body}");

    redis.stop();
    let body = ready_becomes(gateway.port(), 503);
    assert!(body.contains(r#""status":"degraded""#), "{body}");
    assert_eq!(get(gateway.port(), "/healthz").0, 200);

    redis.restart();
    ready_becomes(gateway.port(), 200);
}

#[test]
fn readyz_is_degraded_while_a_breaker_is_open_and_recovers_without_traffic() {
    let mut redis = RedisServer::start();
    let gateway = GatewayProcess::start(&["--redis-url", &redis.url()]);
    ready_becomes(gateway.port(), 200);
    redis.stop();
    // Requests fail over to the fallback until the breaker opens (5
    // failures in a row), then skip the store.
    for _ in 0..10 {
        let answer = support::get_as(gateway.port(), "/api/hello", "acme", "bob");
        assert_eq!(answer.status, 200);
    }
    let (status, body) = get(gateway.port(), "/readyz");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("circuit"), "{body}");
    // Redis back and no request at all: the readiness probe itself is the
    // breaker's probe after its cooldown, so the node becomes ready.
    redis.restart();
    ready_becomes(gateway.port(), 200);
}

#[test]
fn require_store_refuses_to_start_without_the_store() {
    let listen = format!("127.0.0.1:{}", reserve_port());
    // As `GatewayProcess` picks it: this build's, or `TW_GATEWAY_BIN`.
    let gateway =
        std::env::var_os("TW_GATEWAY_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_gateway").into());
    for (flag, env) in [(Some("--require-store"), None), (None, Some("true"))] {
        let mut command = Command::new(&gateway);
        command.args([
            "--listen",
            &listen,
            "--redis-url",
            "redis://no-such-host.invalid:6379",
        ]);
        command.args(flag);
        if let Some(value) = env {
            command.env("TW_REQUIRE_STORE", value);
        }
        let out = support::run_bounded(&mut command, Duration::from_secs(30));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(
            stderr.contains("error: store redis://no-such-host.invalid:6379 cannot be reached"),
            "{stderr}"
        );
        assert!(support::http_get(reserve_port(), "/healthz").is_none());
    }
}
