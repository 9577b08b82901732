//! `rls` processes and a tonic client built from the same `envoy-types`,
//! for the tests that drive the built `rls` binary.
#![allow(dead_code, clippy::unwrap_used)] // each test crate uses part of it

use std::fs::File;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use tonic::transport::Channel;
use tower_window_tests::redis_server::reserve_port;

/// An `rls` process on reserved loopback ports (gRPC and metrics); killed
/// on drop.
pub(crate) struct RlsProcess {
    child: Child,
    port: u16,
    metrics_port: u16,
    log: PathBuf,
}

impl RlsProcess {
    /// Starts `rls` with `flags` (and `--listen`, `--metrics-listen`), and
    /// waits until its gRPC port accepts connections (at most 20 s; panics
    /// with its log otherwise).
    pub(crate) fn start(flags: &[&str]) -> Self {
        Self::start_with_env(flags, &[])
    }

    /// [`start`](Self::start) with `env` set for the process. When `env`
    /// sets `GRPC_PORT`, that is the port served (no `--listen`).
    pub(crate) fn start_with_env(flags: &[&str], env: &[(&str, &str)]) -> Self {
        let grpc_port = env
            .iter()
            .find(|(name, _)| *name == "GRPC_PORT")
            .map(|(_, port)| port.parse::<u16>().unwrap());
        let port = grpc_port.unwrap_or_else(reserve_port);
        let metrics_port = reserve_port();
        let log = std::env::temp_dir().join(format!(
            "tower-window-rls-{}-{port}.log",
            std::process::id()
        ));
        let mut command = Command::new(env!("CARGO_BIN_EXE_rls"));
        if grpc_port.is_none() {
            command.arg("--listen").arg(format!("127.0.0.1:{port}"));
        }
        // Only the settings a test gives: none of envoyproxy/ratelimit's
        // from the environment the tests run in.
        for name in tower_window_examples::rls::settings::READ {
            command.env_remove(name);
        }
        let child = command
            .arg("--metrics-listen")
            .arg(format!("127.0.0.1:{metrics_port}"))
            .args(flags)
            .envs(env.iter().copied())
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut rls = Self {
            child,
            port,
            metrics_port,
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = rls.child.try_wait().unwrap() {
                panic!(
                    "rls {flags:?} exited with {status} before serving:\n{}",
                    rls.log()
                );
            }
            if rls.log().contains("serving envoy.service.ratelimit.v3")
                && TcpStream::connect(("127.0.0.1", port)).is_ok()
            {
                return rls;
            }
            assert!(
                Instant::now() < deadline,
                "rls did not serve within 20 s:\n{}",
                rls.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A tonic client connected to it.
    pub(crate) async fn client(&self) -> RateLimitServiceClient<Channel> {
        RateLimitServiceClient::connect(format!("http://127.0.0.1:{}", self.port))
            .await
            .unwrap()
    }

    /// Its gRPC port.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// What it logged so far.
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Its `/metrics` page (bounded by 5 s timeouts).
    pub(crate) fn metrics(&self) -> String {
        let mut stream = TcpStream::connect(("127.0.0.1", self.metrics_port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        write!(
            stream,
            "GET /metrics HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n"
        )
        .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        response
    }

    /// A counter's value on `/metrics` (0 when absent); `series` is the
    /// name with its labels as Prometheus prints them.
    pub(crate) fn counter(&self, series: &str) -> u64 {
        self.metrics()
            .lines()
            .find_map(|line| line.strip_prefix(series)?.trim().parse::<f64>().ok())
            .map_or(0, |v| v as u64)
    }
}

impl Drop for RlsProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// A descriptor of `(key, value)` entries.
pub(crate) fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(key, value)| Entry {
                key: (*key).to_owned(),
                value: (*value).to_owned(),
            })
            .collect(),
        ..RateLimitDescriptor::default()
    }
}

/// A descriptor of `(key, value)` entries with its own `hits_addend`.
pub(crate) fn costing(entries: &[(&str, &str)], cost: u64) -> RateLimitDescriptor {
    RateLimitDescriptor {
        hits_addend: Some(UInt64Value { value: cost }),
        ..descriptor(entries)
    }
}

/// A request of `descriptors` in `domain`.
pub(crate) fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors,
        hits_addend: 0,
    }
}

/// Calls `ShouldRateLimit` (bounded by 10 s).
pub(crate) async fn should(
    client: &mut RateLimitServiceClient<Channel>,
    request: RateLimitRequest,
) -> RateLimitResponse {
    tokio::time::timeout(Duration::from_secs(10), client.should_rate_limit(request))
        .await
        .expect("an answer within 10 s")
        .unwrap()
        .into_inner()
}

/// The overall code of a response.
pub(crate) fn overall(response: &RateLimitResponse) -> Code {
    Code::try_from(response.overall_code).unwrap()
}

/// Each descriptor's code.
pub(crate) fn codes(response: &RateLimitResponse) -> Vec<Code> {
    response
        .statuses
        .iter()
        .map(|s| Code::try_from(s.code).unwrap())
        .collect()
}

/// A temporary directory holding `files` (name, text).
pub(crate) fn config_dir(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in files {
        write_atomically(&dir.path().join(name), text);
    }
    dir
}

/// Writes `text` to `path` as deploys do: a temporary file renamed onto it.
pub(crate) fn write_atomically(path: &Path, text: &str) {
    let temp = path.with_extension("tmp");
    std::fs::write(&temp, text).unwrap();
    std::fs::rename(&temp, path).unwrap();
}
