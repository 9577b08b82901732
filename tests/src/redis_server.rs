//! A throwaway `redis-server` on loopback, killed on drop.
//!
//! Each server gets a port from [`reserve_port`] (never handed out twice,
//! retried with a new one when taken), its own temporary directory, and no
//! persistence (`--save "" --appendonly no`).
//! The system Redis on 6379 is never touched.

use std::io;
use std::net::{TcpListener, UdpSocket};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tempfile::TempDir;

const START_ATTEMPTS: usize = 20;
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// Panics with install instructions unless `program` is on `PATH`.
pub(crate) fn require(program: &str) {
    let found = Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    assert!(
        found,
        "`{program}` is not on PATH: the Redis tests need a real Redis. \
         Install it with `apt-get install -y redis-server` (or run `bash .ci/test`, which does)."
    );
}

/// Lowest port the allocator hands out.
const PORT_LOW: u16 = 20_000;
/// Highest port (exclusive) the allocator hands out, unless the kernel's
/// ephemeral range starts lower (see [`port_high`]).
const PORT_HIGH: u16 = 32_768;

/// The process-wide port allocator: a cursor over `[PORT_LOW, high)` that
/// starts at a per-process random offset and only moves forward, so no port
/// is handed out twice in one process, plus the cross-process leases held.
struct Ports {
    start: u16,
    high: u16,
    /// How many candidates have been tried since `start`.
    tried: u32,
    /// Leases (one per handed-out port) held until the process exits.
    leases: Vec<UdpSocket>,
}

static PORTS: Mutex<Option<Ports>> = Mutex::new(None);

/// The upper bound of the allocator's range: below the kernel's ephemeral
/// range, so an outgoing connection (or a `bind(0)`) never lands on a
/// port the allocator handed out, e.g. while a server restarts on it.
fn port_high() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .map_or(PORT_HIGH, |low| low.clamp(PORT_LOW + 1_000, PORT_HIGH))
}

/// A loopback port that is free now and that nothing else will be given:
/// never returned twice in this process, leased across processes (a UDP
/// socket bound to the same port number, held until this process exits,
/// so concurrent `cargo test` runs stay apart), and outside the kernel's
/// ephemeral range.
///
/// The port stays reserved after the server on it is dropped or killed: a
/// restart may take it again, and nothing else can. A port reserved and
/// never started on is a closed port that refuses connections (see
/// [`closed_port`]).
pub fn reserve_port() -> u16 {
    let mut guard = PORTS.lock().unwrap_or_else(|e| e.into_inner());
    let ports = guard.get_or_insert_with(|| {
        let high = port_high();
        Ports {
            start: PORT_LOW + (random() % u64::from(high - PORT_LOW)) as u16,
            high,
            tried: 0,
            leases: Vec::new(),
        }
    });
    let span = u32::from(ports.high - PORT_LOW);
    while ports.tried < span {
        let offset = (u32::from(ports.start - PORT_LOW) + ports.tried) % span;
        ports.tried += 1;
        let port = PORT_LOW + offset as u16;
        let Some(lease) = lease(port) else {
            continue; // another process holds it
        };
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            ports.leases.push(lease);
            return port;
        }
    }
    panic!(
        "no free loopback port left in {PORT_LOW}..{} for this process",
        ports.high
    );
}

/// A cross-process lease on `port`: a UDP socket bound to the same port
/// number (UDP ports are a namespace of their own, so the TCP server is
/// unaffected). Only one process can hold it, and the kernel releases it
/// when the process exits, so no stale lease survives a crashed run.
fn lease(port: u16) -> Option<UdpSocket> {
    UdpSocket::bind(("127.0.0.1", port)).ok()
}

/// A reserved port nothing ever listens on: connecting to it is refused.
/// Unlike a port found by binding and dropping a listener, no other test
/// (in this process or a concurrent run) can start a server on it.
pub fn closed_port() -> u16 {
    reserve_port()
}

/// A pseudo-random number (std's randomly keyed hasher; no extra dependency).
pub(crate) fn random() -> u64 {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    hasher.finish()
}

/// `redis-server` arguments for a server without Redis Functions, as
/// before Redis 7: `FCALL` and `FUNCTION` renamed away.
pub const WITHOUT_FUNCTIONS: &[&str] = &[
    "--rename-command",
    "FCALL",
    "",
    "--rename-command",
    "FUNCTION",
    "",
];

/// A running `redis-server` process; stopped (SIGKILL) and cleaned up on drop.
pub struct RedisServer {
    child: Child,
    port: u16,
    dir: TempDir,
    /// The extra arguments it was started with (a restart keeps them, so a
    /// cluster node comes back as the same cluster node).
    extra: Vec<String>,
}

impl RedisServer {
    /// Starts a standalone server on a random loopback port and waits until
    /// it answers `PING`.
    pub fn start() -> Self {
        Self::start_with(&[], false)
    }

    /// Starts a standalone server with extra arguments, e.g.
    /// `["--rename-command", "FCALL", ""]` for a server without functions.
    pub fn start_with_args(extra: &[&str]) -> Self {
        Self::start_with(extra, false)
    }

    /// One server shared by every caller holding it; a new one is started
    /// once the last holder drops it. Use this for test groups.
    pub fn shared() -> Arc<Self> {
        static SHARED: Mutex<Weak<RedisServer>> = Mutex::new(Weak::new());
        let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(server) = shared.upgrade() {
            return server;
        }
        let server = Arc::new(Self::start());
        *shared = Arc::downgrade(&server);
        server
    }

    /// Starts a server with extra arguments on a reserved port; with
    /// `cluster_bus`, the cluster bus gets a reserved port of its own
    /// (`--cluster-port`, kept across restarts).
    pub(crate) fn start_with(extra: &[&str], cluster_bus: bool) -> Self {
        require("redis-server");
        let mut last_error = String::new();
        for _ in 0..START_ATTEMPTS {
            let port = reserve_port();
            let bus = cluster_bus.then(|| reserve_port().to_string());
            let mut extra: Vec<&str> = extra.to_vec();
            if let Some(bus) = &bus {
                extra.extend(["--cluster-port", bus.as_str()]);
            }
            let extra = extra.as_slice();
            let dir = tempfile::Builder::new()
                .prefix("tower-window-redis-")
                .tempdir()
                .expect("create a temp dir for redis-server");
            match Self::spawn(port, dir.path(), extra) {
                Ok(mut child) => match wait_ready(port, &mut child) {
                    Ok(()) => {
                        let extra = extra.iter().map(|a| (*a).to_owned()).collect();
                        return Self {
                            child,
                            port,
                            dir,
                            extra,
                        };
                    }
                    Err(error) => {
                        let _ = child.kill();
                        let _ = child.wait();
                        let log = std::fs::read_to_string(dir.path().join("redis.log"))
                            .unwrap_or_default();
                        last_error = format!("{error}; log tail: {}", tail(&log));
                    }
                },
                Err(error) => last_error = error.to_string(),
            }
        }
        panic!("could not start redis-server after {START_ATTEMPTS} attempts: {last_error}");
    }

    fn spawn(port: u16, dir: &Path, extra: &[&str]) -> io::Result<Child> {
        Command::new("redis-server")
            .args(["--port", &port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .args(["--daemonize", "no"])
            .arg("--dir")
            .arg(dir)
            .args(["--logfile", "redis.log"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
    }

    /// Kills the server and starts a new one on the same port, directory and
    /// arguments (a Redis restart: connections drop, the script cache is
    /// empty; a cluster node rejoins from its `nodes.conf`).
    pub fn restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let extra: Vec<&str> = self.extra.iter().map(String::as_str).collect();
            let mut child =
                Self::spawn(self.port, self.dir.path(), &extra).expect("respawn redis-server");
            match wait_ready(self.port, &mut child) {
                Ok(()) => {
                    self.child = child;
                    return;
                }
                Err(error) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    assert!(
                        Instant::now() < deadline,
                        "could not restart redis-server: {error}"
                    );
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
    }

    /// Stops the server (it stays down until [`restart`](Self::restart)).
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The server's working directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A blocking connection for setup and inspection.
    pub fn connection(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .and_then(|client| client.get_connection_with_timeout(Duration::from_secs(5)))
            .expect("connect to the test redis-server")
    }

    /// A new async connection for inspection (commands from tests).
    pub async fn async_connection(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url())
            .expect("valid url")
            .get_multiplexed_async_connection()
            .await
            .expect("connect to the test redis-server")
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl std::fmt::Debug for RedisServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisServer")
            .field("port", &self.port)
            .finish()
    }
}

fn tail(text: &str) -> &str {
    let start = text.len().saturating_sub(600);
    let start = (start..text.len())
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(text.len());
    &text[start..]
}

/// Waits until the server on `port` answers `PING`, or the process exits.
pub(crate) fn wait_ready(port: u16, child: &mut Child) -> Result<(), String> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let url = format!("redis://127.0.0.1:{port}/");
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("redis-server exited early: {status}"));
        }
        let pong = redis::Client::open(url.as_str())
            .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(200)))
            .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
        if matches!(pong.as_deref(), Ok("PONG")) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "redis-server on {port} did not answer PING: {pong:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
