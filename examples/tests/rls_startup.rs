//! Whether the built `rls` can reach its store (issue 37): one log line at
//! start naming the store (never its password) and why not, `GET /readyz`
//! on `--metrics-listen` answering 503 while the store cannot decide and
//! 200 when it can (`/healthz`, liveness, stays 200), and
//! `--require-store` refusing to start without it.
#![allow(clippy::unwrap_used)]

mod rls_support;
mod support;

use std::fs::File;
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tower_window_tests::redis_server::{reserve_port, RedisServer};

const RULES: &str = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";

/// An `rls` serving gRPC and `--metrics-listen`; killed on drop.
struct Rls {
    child: Child,
    http_port: u16,
    log: PathBuf,
    _rules: tempfile::TempDir,
}

impl Rls {
    /// Starts it on `redis_url` and waits (at most 20 s) until it serves.
    fn start(redis_url: &str) -> Self {
        let rules = rls_support::config_dir(&[("api.yaml", RULES)]);
        let (port, http_port) = (reserve_port(), reserve_port());
        let log = rules.path().join("rls.log");
        let child = Command::new(env!("CARGO_BIN_EXE_rls"))
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--metrics-listen")
            .arg(format!("127.0.0.1:{http_port}"))
            .arg("--config")
            .arg(rules.path().join("api.yaml"))
            .args(["--redis-url", redis_url])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut rls = Self {
            child,
            http_port,
            log,
            _rules: rules,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !(rls.log().contains("serving envoy.service.ratelimit.v3")
            && TcpStream::connect(("127.0.0.1", port)).is_ok()
            && TcpStream::connect(("127.0.0.1", http_port)).is_ok())
        {
            if let Some(status) = rls.child.try_wait().unwrap() {
                panic!("rls exited with {status}:\n{}", rls.log());
            }
            assert!(
                Instant::now() < deadline,
                "rls did not serve:\n{}",
                rls.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        rls
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The status of `GET path` on the HTTP listener.
    fn status(&self, path: &str) -> (u16, String) {
        let response = support::http_get(self.http_port, path).unwrap();
        let status = response
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap();
        (status, response)
    }

    /// Waits (at most 10 s) until `GET /readyz` answers `status`.
    fn ready_becomes(&self, status: u16) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (now, response) = self.status("/readyz");
            if now == status {
                return response;
            }
            assert!(
                Instant::now() < deadline,
                "/readyz stayed {now}: {response}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Rls {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn an_unresolvable_store_host_is_named_at_start_and_readyz_is_degraded() {
    let rls = Rls::start("redis://rls:s3cret@no-such-host.invalid:6379");
    let log = rls.log();
    assert!(!log.contains("s3cret"), "the password is logged:\n{log}");
    let line = log
        .lines()
        .find(|l| l.contains("store unreachable"))
        .unwrap_or_else(|| panic!("no \"store unreachable\" line:\n{log}"));
    assert!(
        line.contains("redis://rls:***@no-such-host.invalid:6379"),
        "{line}"
    );
    assert!(line.contains("lookup"), "{line}");
    assert_eq!(rls.status("/healthz").0, 200);
    let response = rls.ready_becomes(503);
    assert!(response.contains(r#""status":"degraded""#), "{response}");
}

#[test]
fn readyz_follows_a_stopped_and_restarted_redis() {
    let mut redis = RedisServer::start();
    let rls = Rls::start(&redis.url());
    assert!(rls.log().contains("store reachable"), "{}", rls.log());
    rls.ready_becomes(200);
    redis.stop();
    let response = rls.ready_becomes(503);
    // The pooled connection breaks first, then new ones are refused.
    assert!(
        response.contains(r#""reason":"store unavailable"#),
        "{response}"
    );
    assert_eq!(rls.status("/healthz").0, 200);
    redis.restart();
    rls.ready_becomes(200);
}

#[test]
fn require_store_refuses_to_start_without_the_store() {
    let rules = rls_support::config_dir(&[("api.yaml", RULES)]);
    for (flag, env) in [(Some("--require-store"), None), (None, Some("true"))] {
        let mut command = Command::new(env!("CARGO_BIN_EXE_rls"));
        command
            .arg("--listen")
            .arg(format!("127.0.0.1:{}", reserve_port()))
            .arg("--config")
            .arg(rules.path().join("api.yaml"))
            .args(["--redis-url", "redis://no-such-host.invalid:6379"])
            .args(flag);
        if let Some(value) = env {
            command.env("TW_RLS_REQUIRE_STORE", value);
        }
        let out = support::run_bounded(&mut command, Duration::from_secs(30));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(
            stderr.contains("error: store redis://no-such-host.invalid:6379 cannot be reached"),
            "{stderr}"
        );
    }
}
