//! The contributor's scripts (issue 37): `.ci/test ARGS` runs exactly the
//! cargo command its arguments select (no installs, no feature matrix),
//! `.ci/test` alone and `.ci/run` the whole suite, and
//! `examples/cluster/run.sh` finds the gateway it built under
//! `CARGO_TARGET_DIR`.
//!
//! The scripts run for real; only the programs they start that these tests
//! cannot run themselves are stand-ins on `PATH` that write down how they
//! were called: `cargo` (a nested cargo would rebuild the workspace),
//! `apt-get` and `npm` (no network here). The stand-in `cargo build`
//! copies this build's gateway to where cargo would put it.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tower_window_tests::redis_server::reserve_port;

mod support;

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

/// A directory of stand-ins for `cargo`, `apt-get` and `npm`, each
/// appending `<name> <args>` to `calls.log` beside them.
struct StandIns {
    dir: tempfile::TempDir,
}

impl StandIns {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("calls.log");
        for name in ["cargo", "apt-get", "npm"] {
            let mut script = format!("#!/bin/sh\necho \"{name} $*\" >> '{}'\n", log.display());
            if name == "cargo" {
                // `cargo build ... --bin gateway`: this build's gateway,
                // where cargo would put a release build of it.
                script.push_str(&format!(
                    "if [ \"$1\" = build ]; then mkdir -p \"$CARGO_TARGET_DIR/release\" && cp '{}' \"$CARGO_TARGET_DIR/release/gateway\"; fi\n",
                    env!("CARGO_BIN_EXE_gateway")
                ));
            }
            let path = dir.path().join(name);
            std::fs::write(&path, script).unwrap();
            let status = Command::new("chmod").arg("+x").arg(&path).status().unwrap();
            assert!(status.success());
        }
        Self { dir }
    }

    /// `PATH` with the stand-ins first.
    fn path(&self) -> String {
        format!(
            "{}:{}",
            self.dir.path().display(),
            std::env::var("PATH").unwrap_or_default()
        )
    }

    /// The calls so far, one per line.
    fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("calls.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Runs `bash <script> <args>` from the workspace root (bounded).
    fn run(&self, script: &str, args: &[&str]) -> std::process::Output {
        support::run_bounded(
            Command::new("bash")
                .arg(script)
                .args(args)
                .current_dir(ROOT)
                .env("PATH", self.path()),
            Duration::from_secs(60),
        )
    }
}

fn cargo_calls(calls: &[String]) -> Vec<&str> {
    calls
        .iter()
        .filter(|c| c.starts_with("cargo "))
        .map(String::as_str)
        .collect()
}

#[test]
fn ci_test_with_arguments_runs_exactly_what_they_select() {
    let stand_ins = StandIns::new();
    let out = stand_ins.run(".ci/test", &["-p", "axum-window-ext", "--test", "problem"]);
    assert!(out.status.success(), "{out:?}");
    // One cargo command, nothing installed, no `npm ci`.
    assert_eq!(
        stand_ins.calls(),
        ["cargo test --locked -p axum-window-ext --test problem"]
    );
}

#[test]
fn ci_test_without_arguments_is_the_full_run() {
    let stand_ins = StandIns::new();
    let out = stand_ins.run(".ci/test", &[]);
    assert!(out.status.success(), "{out:?}");
    let calls = stand_ins.calls();
    assert!(
        calls.iter().any(|c| c.starts_with("npm ci")),
        "the browser test's packages: {calls:?}"
    );
    let cargo = cargo_calls(&calls);
    let mut expected =
        vec!["cargo test -p tower-window --no-default-features --lib --tests --locked".to_owned()];
    for feature in ["tower", "http", "grpc", "redis", "metrics", "serde", "tls"] {
        expected.push(format!(
            "cargo test -p tower-window --no-default-features --features {feature} --lib --tests --locked"
        ));
    }
    expected.push("cargo test --workspace --locked".to_owned());
    assert_eq!(cargo, expected);
}

#[test]
fn ci_run_runs_the_checks_then_the_full_test_command() {
    let stand_ins = StandIns::new();
    let out = stand_ins.run(".ci/run", &[]);
    assert!(out.status.success(), "{out:?}");
    let calls = stand_ins.calls();
    let cargo = cargo_calls(&calls);
    assert_eq!(cargo.first(), Some(&"cargo fmt --all --check"), "{calls:?}");
    assert_eq!(
        cargo.last(),
        Some(&"cargo test --workspace --locked"),
        "{calls:?}"
    );
    assert!(
        cargo
            .iter()
            .any(|c| c.starts_with("cargo clippy --workspace")),
        "{calls:?}"
    );
    for check in [
        "cargo publish --workspace --dry-run --locked --allow-dirty",
        "cargo deny check licenses bans sources",
    ] {
        assert!(cargo.contains(&check), "{check}: {calls:?}");
    }
    assert_eq!(
        cargo
            .iter()
            .filter(|c| c.starts_with("cargo test -p tower-window --no-default-features"))
            .count(),
        8,
        "{calls:?}"
    );

    // Arguments would narrow the tests: `.ci/run` refuses them.
    let stand_ins = StandIns::new();
    let out = stand_ins.run(".ci/run", &["-p", "tower-window"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("bash .ci/test ARGS"),
        "{out:?}"
    );
    assert!(stand_ins.calls().is_empty(), "{:?}", stand_ins.calls());
}

/// `run.sh`'s process; TERM, then KILL, on drop.
struct Script(Child);

impl Drop for Script {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.0.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.0.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn cluster_run_sh_runs_the_gateway_it_built_under_cargo_target_dir() {
    let stand_ins = StandIns::new();
    let target = tempfile::tempdir().unwrap();
    let ports = |n: usize| {
        (0..n)
            .map(|_| reserve_port().to_string())
            .collect::<Vec<_>>()
            .join(" ")
    };
    let gateway_ports = ports(3);
    let mut child = Command::new("bash")
        .arg(Path::new(ROOT).join("examples/cluster/run.sh"))
        .env("PATH", stand_ins.path())
        .env("CARGO_TARGET_DIR", target.path())
        .env_remove("GATEWAY")
        .env("REDIS_PORTS", ports(3))
        .env("BUS_PORTS", ports(3))
        .env("GATEWAY_PORTS", &gateway_ports)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    let script = Script(child);
    let (lines, received) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    let err_thread =
        std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut printed = Vec::new();
    while !printed.iter().any(|l: &String| l.starts_with("ready")) {
        match received.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) => printed.push(line),
            Err(_) => {
                drop(script);
                panic!(
                    "run.sh not ready; printed {printed:?}; stderr:\n{}",
                    err_thread.join().unwrap()
                );
            }
        }
    }
    let built: PathBuf = target
        .path()
        .canonicalize()
        .unwrap()
        .join("release/gateway");
    assert!(built.exists());
    assert!(
        stand_ins
            .calls()
            .iter()
            .any(|c| c.starts_with("cargo build --release")),
        "{:?}",
        stand_ins.calls()
    );
    // The gateways run are the binary built there (the last three pids).
    let pids: Vec<String> = printed
        .iter()
        .find_map(|l| l.strip_prefix("pids:"))
        .unwrap()
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    assert_eq!(pids.len(), 6, "{printed:?}");
    for pid in &pids[3..] {
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
        assert_eq!(exe, built, "{printed:?}");
    }
    let port: u16 = gateway_ports.split(' ').next().unwrap().parse().unwrap();
    let answer = support::get_as(port, "/api/hello", "acme", "dana");
    assert_eq!(answer.status, 200);
    drop(script);
    let stderr = err_thread.join().unwrap();
    assert!(
        stderr.contains(&target.path().display().to_string()),
        "{stderr}"
    );
}
