//! `examples/cluster/run.sh`: starts a 3-primary Redis Cluster and three
//! gateways sharing one limit, answers on each node, and stops every
//! process it started on SIGTERM.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tower_window_tests::redis_server::reserve_port;

mod support;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/cluster/run.sh");

/// The script's process; SIGKILLed (with what it printed) if a check fails.
struct Script {
    child: Child,
}

impl Drop for Script {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            signal(self.child.id(), "TERM");
            let deadline = Instant::now() + Duration::from_secs(10);
            while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn signal(pid: u32, name: &str) {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(status.success(), "kill -{name} {pid}");
}

fn ports(n: usize) -> String {
    (0..n)
        .map(|_| reserve_port().to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Whether `pid` is a live process (a zombie left unreaped counts).
fn exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// `GET /api/hello` as `user`: status and the `ratelimit` header's `r`.
fn hello(port: u16, user: &str) -> (u16, Option<u64>) {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "GET /api/hello HTTP/1.1\r\nhost: x\r\nx-user-id: {user}\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    std::io::Read::read_to_string(&mut stream, &mut response).unwrap();
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap();
    let remaining = response
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("ratelimit:"))
        .and_then(|l| l.split(";r=").nth(1))
        .and_then(|r| r.split(';').next())
        .and_then(|r| r.trim().parse().ok());
    (status, remaining)
}

#[test]
fn run_sh_starts_a_cluster_serves_on_each_node_and_stops_everything() {
    let gateway_ports = ports(3);
    // The same policy with or without `--tenants`: a tenants file whose
    // default is the `--limit` the script falls back to.
    let tenants = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "cluster-script-tenants-{}.toml",
        std::process::id()
    ));
    std::fs::write(&tenants, "[default]\nquotas = { minute = \"3/1m\" }\n").unwrap();
    let mut child = Command::new("bash")
        .arg(SCRIPT)
        .env("GATEWAY", env!("CARGO_BIN_EXE_gateway"))
        .env("REDIS_PORTS", ports(3))
        .env("BUS_PORTS", ports(3))
        .env("GATEWAY_PORTS", &gateway_ports)
        .env("TENANTS", &tenants)
        .env("LIMIT", "minute=3/1m")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    let script = Script { child };
    let (lines, received) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    let err_thread = std::thread::spawn(move || {
        let mut text = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            text.push_str(&line);
            text.push('\n');
        }
        text
    });

    // Wait for "ready" (bounded), collecting what it printed.
    let mut printed = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(90);
    while !printed.iter().any(|l: &String| l.starts_with("ready")) {
        let left = deadline.saturating_duration_since(Instant::now());
        match received.recv_timeout(left) {
            Ok(line) => printed.push(line),
            Err(_) => {
                drop(script);
                panic!(
                    "run.sh not ready within 90 s; printed {printed:?}; stderr:\n{}",
                    err_thread.join().unwrap()
                );
            }
        }
    }
    let field = |name: &str| -> String {
        printed
            .iter()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_owned())
            .unwrap_or_else(|| panic!("no {name} in {printed:?}"))
    };
    let pids: Vec<u32> = field("pids:")
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    let logs = field("logs:");
    // `--tenants` is passed exactly when the gateway has the flag.
    let help = Command::new(env!("CARGO_BIN_EXE_gateway"))
        .arg("--help")
        .output()
        .unwrap();
    let has_tenants = String::from_utf8_lossy(&help.stdout).contains("--tenants");
    assert_eq!(
        field("policy:").starts_with("tenants from"),
        has_tenants,
        "{printed:?}"
    );
    assert_eq!(pids.len(), 6, "{printed:?}");
    assert!(pids.iter().all(|&p| exists(p)), "{printed:?}");
    let gateway_ports: Vec<u16> = gateway_ports
        .split(' ')
        .map(|p| p.parse().unwrap())
        .collect();
    for port in &gateway_ports {
        assert!(
            field("gateways:").contains(&format!("http://127.0.0.1:{port}")),
            "{printed:?}"
        );
    }

    // One request to each node: one window across the three, so the
    // remaining count goes down node after node, and a fourth request on
    // the first node is refused.
    let answers: Vec<_> = gateway_ports.iter().map(|&p| hello(p, "dana")).collect();
    assert_eq!(
        answers,
        [(200, Some(2)), (200, Some(1)), (200, Some(0))],
        "{printed:?}"
    );
    assert_eq!(hello(gateway_ports[0], "dana").0, 429);
    // The demo page is served too.
    let page = support::http_get(gateway_ports[1], "/").unwrap();
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");

    // SIGTERM: every process it started is gone, and its temp dir.
    let mut script = script;
    signal(script.child.id(), "TERM");
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = script.child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "run.sh did not stop in 20 s");
        std::thread::sleep(Duration::from_millis(50));
    };
    let stderr = err_thread.join().unwrap();
    assert_eq!(status.code(), Some(143), "{stderr}");
    assert!(stderr.contains("stopped"), "{stderr}");
    let left: Vec<u32> = pids.iter().copied().filter(|&p| exists(p)).collect();
    assert!(left.is_empty(), "processes left: {left:?}\n{stderr}");
    assert!(!Path::new(&logs).exists(), "{logs} left behind");
    for port in gateway_ports {
        assert!(support::http_get(port, "/healthz").is_none(), "{port}");
    }
    let _ = std::fs::remove_file(&tenants);
}
