//! Gateway processes and bounded child processes for the tests that drive
//! the built `gateway` binary.
#![allow(dead_code)] // each test crate uses part of it

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use tower_window_tests::redis_server::reserve_port;

/// Debian's chromium.
pub(crate) const CHROMIUM: &str = "/usr/bin/chromium";

/// The gateway binary: this build's, or the one `TW_GATEWAY_BIN` names, to
/// run a black-box test against another build (an older commit's, to see
/// the test fail there).
fn gateway_binary() -> PathBuf {
    std::env::var_os("TW_GATEWAY_BIN").map_or_else(
        || PathBuf::from(env!("CARGO_BIN_EXE_gateway")),
        PathBuf::from,
    )
}

/// A `gateway` process on a reserved loopback port; killed on drop.
pub(crate) struct GatewayProcess {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl GatewayProcess {
    /// Starts the gateway with `flags` (and `--listen`), and waits until
    /// `GET /healthz` answers (at most 20 s; panics with its log otherwise).
    pub(crate) fn start(flags: &[&str]) -> Self {
        let port = reserve_port();
        let log = std::env::temp_dir().join(format!(
            "tower-window-gateway-{}-{port}.log",
            std::process::id()
        ));
        let child = Command::new(gateway_binary())
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .args(flags)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut gateway = Self { child, port, log };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = gateway.child.try_wait().unwrap() {
                panic!(
                    "gateway {flags:?} exited with {status} before serving:\n{}",
                    gateway.log()
                );
            }
            if http_get(port, "/healthz").is_some_and(|r| r.starts_with("HTTP/1.1 200")) {
                return gateway;
            }
            assert!(
                Instant::now() < deadline,
                "gateway did not serve /healthz within 20 s:\n{}",
                gateway.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The loopback port it listens on.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:PORT`.
    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What it logged so far.
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// A plain HTTP/1.1 GET on loopback: the raw response, or `None` if the
/// connection failed. Bounded by 5 s timeouts.
pub(crate) fn http_get(port: u16, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    stream
        .set_write_timeout(Some(Duration::from_secs(5)))
        .ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nx-user-id: probe\r\nconnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    Some(response)
}

/// One answer: the status and the headers (names lowercased).
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) headers: HashMap<String, String>,
}

impl Answer {
    /// A header's value, or `""` when it is absent.
    pub(crate) fn header(&self, name: &str) -> &str {
        self.headers.get(name).map_or("", String::as_str)
    }
}

/// `GET path` with the `x-tenant-id` and `x-user-id` headers, over a fresh
/// connection; bounded by 10 s timeouts; panics when the gateway does not
/// answer.
pub(crate) fn get_as(port: u16, path: &str, tenant: &str, user: &str) -> Answer {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream
        .set_write_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nx-tenant-id: {tenant}\r\nx-user-id: {user}\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let head = response.split("\r\n\r\n").next().unwrap();
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {response:?}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Answer { status, headers }
}

/// Runs `command` to completion, killing it after `limit`; its output
/// (stdout and stderr captured).
pub(crate) fn run_bounded(command: &mut Command, limit: Duration) -> Output {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    // Drain both pipes on threads so a chatty child never blocks.
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = stdout.read_to_end(&mut buf);
        buf
    });
    let err = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = stderr.read_to_end(&mut buf);
        buf
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Output {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}
