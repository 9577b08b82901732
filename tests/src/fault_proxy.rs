//! A TCP proxy that injects network faults between a client and a server.
//!
//! [`FaultProxy::start`] listens on a reserved loopback port (see
//! [`reserve_port`]) and forwards each connection to a target.
//! [`FaultProxy::set_mode`] switches, at any time, between:
//! - [`Mode::PassThrough`]: forward both ways;
//! - [`Mode::Latency`]: forward, delaying every chunk by a base latency plus
//!   a random jitter;
//! - [`Mode::Blackhole`]: accept connections and read what clients send, but
//!   forward and answer nothing (a network partition): the bytes are held,
//!   and delivered in order once the mode changes back, as TCP would after a
//!   partition heals, so a multiplexed client never sees a reply go missing;
//! - [`Mode::Reset`]: abort every open connection with a TCP RST
//!   (`SO_LINGER` 0), and every new one right after accepting it;
//! - [`Mode::Refuse`]: abort every open connection and stop listening, so
//!   connects are refused (a dead server); leaving this mode listens again on
//!   the same port.
//!
//! [`FaultProxy::stats`] counts accepted connections and bytes in each
//! direction, so a test can assert that a client touched no socket.
//! Dropping the proxy stops it and closes its connections.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::redis_server::reserve_port;

/// What the proxy does with traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forward both ways.
    PassThrough,
    /// Forward, delaying each chunk by `base` plus a uniformly random part
    /// of `jitter`.
    Latency {
        /// The least delay.
        base: Duration,
        /// The most extra delay.
        jitter: Duration,
    },
    /// Accept and read, forward and answer nothing; held bytes flow again
    /// when the mode changes to pass-through or latency.
    Blackhole,
    /// Abort open connections and every new one with a TCP reset.
    Reset,
    /// Abort open connections and stop listening: connects are refused.
    Refuse,
}

/// Counters of what went through the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProxyStats {
    /// Connections accepted from clients.
    pub connections: u64,
    /// Bytes received from clients (forwarded or not).
    pub bytes_from_clients: u64,
    /// Bytes sent to clients.
    pub bytes_to_clients: u64,
}

impl ProxyStats {
    /// Whether no client connected or sent or received a byte.
    pub fn is_untouched(&self) -> bool {
        *self == Self::default()
    }
}

#[derive(Default)]
struct Counters {
    connections: AtomicU64,
    bytes_from_clients: AtomicU64,
    bytes_to_clients: AtomicU64,
}

struct Shared {
    target: SocketAddr,
    counters: Counters,
    mode: watch::Sender<Mode>,
    /// Bumped to abort every open connection.
    kill: watch::Sender<u64>,
}

/// A fault-injecting TCP proxy on `127.0.0.1`.
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultProxy")
            .field("addr", &self.addr)
            .field("target", &self.shared.target)
            .field("mode", &self.mode())
            .finish()
    }
}

impl FaultProxy {
    /// Starts a pass-through proxy to `target` on a loopback port from
    /// [`reserve_port`], so nothing else can take the port while the proxy
    /// is in `Refuse` mode (or after it is dropped).
    pub async fn start(target: SocketAddr) -> io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", reserve_port())).await?;
        let addr = listener.local_addr()?;
        let (mode, _) = watch::channel(Mode::PassThrough);
        let (kill, _) = watch::channel(0);
        let shared = Arc::new(Shared {
            target,
            counters: Counters::default(),
            mode,
            kill,
        });
        let accept = tokio::spawn(accept_loop(listener, addr, shared.clone()));
        Ok(Self {
            addr,
            shared,
            accept,
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The `redis://` URL of the proxy (for a Redis target).
    pub fn redis_url(&self) -> String {
        format!("redis://{}/", self.addr)
    }

    /// The current mode.
    pub fn mode(&self) -> Mode {
        *self.shared.mode.borrow()
    }

    /// Switches the mode; open connections follow at once.
    pub fn set_mode(&self, mode: Mode) {
        if matches!(mode, Mode::Reset | Mode::Refuse) {
            self.shared.kill.send_modify(|epoch| *epoch += 1);
        }
        self.shared.mode.send_replace(mode);
    }

    /// Aborts every open connection with a TCP reset, without changing mode.
    pub fn reset_connections(&self) {
        self.shared.kill.send_modify(|epoch| *epoch += 1);
    }

    /// What went through the proxy so far.
    pub fn stats(&self) -> ProxyStats {
        let c = &self.shared.counters;
        ProxyStats {
            connections: c.connections.load(Ordering::SeqCst),
            bytes_from_clients: c.bytes_from_clients.load(Ordering::SeqCst),
            bytes_to_clients: c.bytes_to_clients.load(Ordering::SeqCst),
        }
    }

    /// Sets every counter back to zero.
    pub fn reset_stats(&self) {
        let c = &self.shared.counters;
        c.connections.store(0, Ordering::SeqCst);
        c.bytes_from_clients.store(0, Ordering::SeqCst);
        c.bytes_to_clients.store(0, Ordering::SeqCst);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
        // Connection tasks end when they see the kill signal.
        self.shared.kill.send_modify(|epoch| *epoch += 1);
    }
}

async fn accept_loop(listener: TcpListener, addr: SocketAddr, shared: Arc<Shared>) {
    let mut listener = Some(listener);
    let mut mode_rx = shared.mode.subscribe();
    loop {
        let mode = *mode_rx.borrow_and_update();
        match (&listener, mode) {
            (Some(_), Mode::Refuse) => listener = None,
            (None, Mode::Refuse) => {}
            (None, _) => listener = rebind(addr).await,
            (Some(_), _) => {}
        }
        let Some(active) = &listener else {
            if mode_rx.changed().await.is_err() {
                return;
            }
            continue;
        };
        tokio::select! {
            changed = mode_rx.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            accepted = active.accept() => {
                if let Ok((client, _)) = accepted {
                    shared.counters.connections.fetch_add(1, Ordering::SeqCst);
                    tokio::spawn(serve(client, shared.clone()));
                }
            }
        }
    }
}

/// Listens on `addr` again after `Refuse`, retrying briefly if the port is
/// still held by the old socket.
async fn rebind(addr: SocketAddr) -> Option<TcpListener> {
    for _ in 0..100 {
        if let Ok(listener) = TcpListener::bind(addr).await {
            return Some(listener);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

async fn serve(mut client: TcpStream, shared: Arc<Shared>) {
    let mut kill = shared.kill.subscribe();
    kill.borrow_and_update();
    if matches!(*shared.mode.borrow(), Mode::Reset | Mode::Refuse) {
        abort(client);
        return;
    }
    // Connect upstream even while blackholed: the client's bytes are held
    // until the partition heals, like TCP retransmission would.
    let Ok(mut upstream) = TcpStream::connect(shared.target).await else {
        abort(client);
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let killed = {
        let (mut client_read, mut client_write) = client.split();
        let (mut up_read, mut up_write) = upstream.split();
        let both = async {
            tokio::try_join!(
                pump(&mut client_read, &mut up_write, &shared, Direction::Up),
                pump(&mut up_read, &mut client_write, &shared, Direction::Down),
            )
        };
        tokio::select! {
            _ = kill.changed() => true,
            // A failed direction (a reset by either side) resets the client.
            done = both => done.is_err(),
        }
    };
    if killed {
        abort(client);
    }
}

/// Closes `stream` with a TCP reset.
fn abort(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}

#[derive(Clone, Copy)]
enum Direction {
    /// Client to target.
    Up,
    /// Target to client.
    Down,
}

/// Forwards one direction until end of stream, following the mode: held
/// while blackholed (still reading, so every byte a client sends is
/// counted), delayed under latency, passed through otherwise.
async fn pump<R, W>(
    from: &mut R,
    to: &mut W,
    shared: &Shared,
    direction: Direction,
) -> io::Result<()>
where
    R: AsyncReadExt + Unpin,
    W: AsyncWriteExt + Unpin,
{
    let mut mode_rx = shared.mode.subscribe();
    let mut rng = Rng::seeded();
    let mut buf = vec![0u8; 16 * 1024];
    let mut held: Vec<u8> = Vec::new();
    loop {
        let mode = *mode_rx.borrow_and_update();
        let blackholed = mode == Mode::Blackhole;
        if !blackholed && !held.is_empty() {
            forward(to, &held, mode, &mut rng, shared, direction).await?;
            held.clear();
        }
        tokio::select! {
            read = from.read(&mut buf) => {
                let n = read?;
                if n == 0 {
                    // Half-close; the other direction may still be busy.
                    let _ = to.shutdown().await;
                    return Ok(());
                }
                if let Direction::Up = direction {
                    shared
                        .counters
                        .bytes_from_clients
                        .fetch_add(n as u64, Ordering::SeqCst);
                }
                held.extend_from_slice(&buf[..n]);
                let mode = *mode_rx.borrow_and_update();
                if mode != Mode::Blackhole {
                    forward(to, &held, mode, &mut rng, shared, direction).await?;
                    held.clear();
                }
            }
            changed = mode_rx.changed(), if blackholed => {
                if changed.is_err() {
                    return Ok(());
                }
            }
        }
    }
}

async fn forward<W>(
    to: &mut W,
    bytes: &[u8],
    mode: Mode,
    rng: &mut Rng,
    shared: &Shared,
    direction: Direction,
) -> io::Result<()>
where
    W: AsyncWriteExt + Unpin,
{
    if let Mode::Latency { base, jitter } = mode {
        tokio::time::sleep(base + jitter.mul_f64(rng.unit())).await;
    }
    to.write_all(bytes).await?;
    if let Direction::Down = direction {
        shared
            .counters
            .bytes_to_clients
            .fetch_add(bytes.len() as u64, Ordering::SeqCst);
    }
    Ok(())
}

/// A small splitmix64 generator for latency jitter (test-only quality).
struct Rng(u64);

impl Rng {
    fn seeded() -> Self {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        Self(u64::from(nanos) ^ 0x9E37_79B9_7F4A_7C15)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Instant;

    use super::*;
    use crate::redis_server::closed_port;

    /// A loopback echo server; returns its address.
    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = stream.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    async fn roundtrip(stream: &mut TcpStream, msg: &[u8]) -> io::Result<Vec<u8>> {
        stream.write_all(msg).await?;
        let mut buf = vec![0u8; msg.len()];
        stream.read_exact(&mut buf).await?;
        Ok(buf)
    }

    const WAIT: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn passes_through_and_counts() {
        let proxy = FaultProxy::start(echo_server().await).await.unwrap();
        assert!(proxy.stats().is_untouched());
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(roundtrip(&mut s, b"hello").await.unwrap(), b"hello");
        assert_eq!(roundtrip(&mut s, b"again!").await.unwrap(), b"again!");
        let stats = proxy.stats();
        assert_eq!(stats.connections, 1);
        assert_eq!(stats.bytes_from_clients, 11);
        assert_eq!(stats.bytes_to_clients, 11);
        proxy.reset_stats();
        assert!(proxy.stats().is_untouched());
    }

    #[tokio::test]
    async fn adds_latency() {
        let proxy = FaultProxy::start(echo_server().await).await.unwrap();
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        proxy.set_mode(Mode::Latency {
            base: Duration::from_millis(30),
            jitter: Duration::from_millis(10),
        });
        let start = Instant::now();
        assert_eq!(roundtrip(&mut s, b"slow").await.unwrap(), b"slow");
        // Both directions are delayed: at least 2 × base. (Lower bound only:
        // an upper bound would depend on the machine's speed.)
        assert!(start.elapsed() >= Duration::from_millis(60));
        proxy.set_mode(Mode::PassThrough);
        assert_eq!(roundtrip(&mut s, b"fast").await.unwrap(), b"fast");
    }

    #[tokio::test]
    async fn blackhole_accepts_but_never_answers() {
        let proxy = FaultProxy::start(echo_server().await).await.unwrap();
        proxy.set_mode(Mode::Blackhole);
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        let answer = tokio::time::timeout(Duration::from_millis(200), roundtrip(&mut s, b"ping"));
        assert!(answer.await.is_err(), "no answer from a blackhole");
        let stats = proxy.stats();
        assert_eq!(stats.connections, 1);
        assert_eq!(stats.bytes_from_clients, 4);
        assert_eq!(stats.bytes_to_clients, 0);

        // An open connection goes silent too.
        proxy.set_mode(Mode::PassThrough);
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(roundtrip(&mut s, b"up").await.unwrap(), b"up");
        proxy.set_mode(Mode::Blackhole);
        s.write_all(b"held").await.unwrap();
        let mut buf = [0u8; 4];
        let answer = tokio::time::timeout(Duration::from_millis(200), s.read_exact(&mut buf));
        assert!(answer.await.is_err(), "no answer while blackholed");
        // Healing delivers what was held, in order.
        proxy.set_mode(Mode::PassThrough);
        let mut buf = [0u8; 4];
        tokio::time::timeout(WAIT, s.read_exact(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&buf, b"held");
        assert_eq!(roundtrip(&mut s, b"next").await.unwrap(), b"next");
    }

    #[tokio::test]
    async fn reset_aborts_open_and_new_connections() {
        let proxy = FaultProxy::start(echo_server().await).await.unwrap();
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(roundtrip(&mut s, b"hi").await.unwrap(), b"hi");
        proxy.set_mode(Mode::Reset);
        let err = tokio::time::timeout(WAIT, roundtrip(&mut s, b"x"))
            .await
            .unwrap()
            .unwrap_err();
        assert!(
            matches!(
                err.kind(),
                io::ErrorKind::ConnectionReset
                    | io::ErrorKind::UnexpectedEof
                    | io::ErrorKind::BrokenPipe
            ),
            "{err:?}"
        );
        // New connections are accepted, then reset.
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        let result = tokio::time::timeout(WAIT, roundtrip(&mut s, b"x"))
            .await
            .unwrap();
        assert!(result.is_err());
        proxy.set_mode(Mode::PassThrough);
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(roundtrip(&mut s, b"back").await.unwrap(), b"back");
    }

    #[tokio::test]
    async fn refuse_stops_listening_and_recovers_on_the_same_port() {
        let proxy = FaultProxy::start(echo_server().await).await.unwrap();
        let addr = proxy.addr();
        let mut open = TcpStream::connect(addr).await.unwrap();
        assert_eq!(roundtrip(&mut open, b"a").await.unwrap(), b"a");
        proxy.set_mode(Mode::Refuse);
        let refused = tokio::time::timeout(WAIT, async {
            loop {
                match TcpStream::connect(addr).await {
                    Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => break,
                    // The listener closes asynchronously; try again.
                    _ => tokio::task::yield_now().await,
                }
            }
        });
        refused.await.unwrap();
        assert!(
            roundtrip(&mut open, b"b").await.is_err(),
            "open connection aborted"
        );
        proxy.set_mode(Mode::PassThrough);
        let mut s = tokio::time::timeout(WAIT, async {
            loop {
                if let Ok(s) = TcpStream::connect(addr).await {
                    break s;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .unwrap();
        assert_eq!(roundtrip(&mut s, b"c").await.unwrap(), b"c");
    }

    #[tokio::test]
    async fn an_unreachable_target_resets_clients() {
        // A reserved port nothing ever listens on.
        let dead = SocketAddr::from(([127, 0, 0, 1], closed_port()));
        let proxy = FaultProxy::start(dead).await.unwrap();
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        let result = tokio::time::timeout(WAIT, roundtrip(&mut s, b"x"))
            .await
            .unwrap();
        assert!(result.is_err());
        assert_eq!(proxy.stats().connections, 1);
    }
}
