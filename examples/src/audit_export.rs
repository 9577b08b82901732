//! The audit exporter: reads every tenant's audit stream
//! (`<prefix>{@<tenant>}:#audit`, see [`tower_window::audit`]) with a Redis
//! consumer group and writes each record as one JSON line (the
//! [`AuditRecord`]'s JSON: `id`, `at_micros`, `tenant`, `subject`, `policy`,
//! `quota`, `outcome`, `remaining`, `source`, `node`) to a file or stdout,
//! for a SIEM or a Kafka pipeline.
//!
//! * Streams are found with `SCAN … MATCH` [`RedisStore::audit_stream_pattern`]
//!   `TYPE stream` (on a cluster, on every primary), again every
//!   `--discover-every-ms`; each gets the group (`XGROUP CREATE … 0`,
//!   `BUSYGROUP` ignored, never `MKSTREAM`: a tenant's log expires, and an
//!   empty stream the exporter made would not).
//! * `XREADGROUP` reads new entries; on a single Redis one call over every
//!   stream waits `--block-ms`, on a cluster one call per stream (each on
//!   its primary, concurrently) and a pause of `--block-ms` when all were
//!   empty.
//! * `XAUTOCLAIM` takes over entries pending longer than
//!   `--idle-timeout-ms` (another exporter died, or a reply was lost).
//! * An entry that is no audit record (a foreign writer's) fails; on its
//!   `--max-deliveries`-th delivery it is copied to the `--dead-letter`
//!   stream with the reason and acknowledged (in one `MULTI` on a single
//!   Redis; on a cluster the two keys live on different slots, so the copy
//!   comes first and a crash between the two copies it again: dead letters
//!   are at least once there). An entry trimmed away while pending is
//!   acknowledged without a line.
//! * Transient Redis errors are retried with exponential backoff and jitter
//!   ([`backon`]), reconnecting a single Redis; past the retries the
//!   exporter stops with an error and, restarted, resumes exactly.
//!
//! # Exactly once to a file
//!
//! The exporter works in rounds: it reads, writes the round's lines grouped
//! by stream in one append, `fsync`s the file, and only then acknowledges
//! the round with one `XACK` per stream, one after the other in the order of
//! the lines. An entry is acknowledged only once its line is durable, so a
//! crash (SIGKILL, anywhere) loses nothing. What a crash can leave is:
//!
//! 1. a torn last line (killed inside the append): on start the bytes after
//!    the last newline are cut off (`set_len`, `fsync`); that entry is still
//!    pending, so it is written again, whole;
//! 2. lines written but not acknowledged. They are the file's last lines:
//!    each round is acknowledged before the next is written, in the order of
//!    its lines, and `XACK` of one stream is atomic, so the acknowledged part
//!    of the last round is a prefix of its lines and the rest a suffix of the
//!    file. On start, the exporter (same `--consumer`: it owns those pending
//!    entries) reads its pending entries (`XREADGROUP … 0`), then reads the
//!    file backwards from the end for as long as each line's
//!    `(tenant, id)` is one of them: those are already written, and are
//!    acknowledged (in file order) without being written again. The first
//!    line that is not pending ends the search — every earlier line was
//!    acknowledged — so the search reads at most one round. Then the rest of
//!    its pending entries are exported as a round.
//!
//! So with one exporter per `--consumer` and `--output`, restarted with both
//! unchanged, every entry is in the file exactly once. Its limits:
//!
//! * stdout (`--output -`) cannot be read back: a restart writes the
//!   unacknowledged last round again (at least once);
//! * an entry another exporter takes over with `XAUTOCLAIM` after it wrote
//!   the line to its own file and died before `XACK` is in both files (at
//!   least once across files, at most one round per death); keep
//!   `--idle-timeout-ms` above the time a restart takes, and above a round's;
//! * a file edited, rotated or shared by two exporters voids the argument.
//!
//! A record's `tenant` is its entry's `tenant` field (the name in full,
//! even where the stream's key holds it hashed).

use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBuilder};
use clap::Parser;
use futures_util::future::join_all;
use tower_window::audit::AuditRecord;
use tower_window::store::redis::redis::aio::MultiplexedConnection;
use tower_window::store::redis::redis::cluster::ClusterClient;
use tower_window::store::redis::redis::cluster_async::ClusterConnection;
use tower_window::store::redis::redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use tower_window::store::redis::redis::{self, Cmd, RedisError, RedisResult, Value};
use tower_window::store::redis::DEFAULT_PREFIX;
use tower_window::RedisStore;

/// The exporter's flags (each also read from a `TW_*` environment variable).
#[derive(Debug, Clone, Parser)]
#[command(
    name = "audit-exporter",
    version,
    about = "Exports the audit trail's Redis streams as JSON lines, exactly once to a file"
)]
pub struct ExporterArgs {
    /// Redis URL (a single server).
    #[arg(
        long,
        env = "TW_REDIS_URL",
        conflicts_with = "cluster_url",
        required_unless_present = "cluster_url"
    )]
    pub redis_url: Option<String>,

    /// A Redis Cluster seed node's URL; repeat it (or separate URLs with
    /// commas) for several. Streams are discovered on every primary.
    #[arg(long, env = "TW_CLUSTER_URL", value_delimiter = ',')]
    pub cluster_url: Vec<String>,

    /// The store's key prefix (`RedisStore`'s, default `tw:`).
    #[arg(long, env = "TW_REDIS_PREFIX", default_value = DEFAULT_PREFIX)]
    pub prefix: String,

    /// The consumer group, on every tenant's stream.
    #[arg(long, env = "TW_AUDIT_GROUP", default_value = "audit-exporters")]
    pub group: String,

    /// This exporter's consumer name; keep it (and `--output`) across
    /// restarts: a restarted exporter finishes its own pending entries.
    #[arg(long, env = "TW_CONSUMER")]
    pub consumer: String,

    /// The file the lines are appended to (created if missing), or `-` for
    /// stdout (at least once across a restart).
    #[arg(long, env = "TW_AUDIT_OUTPUT", default_value = "-")]
    pub output: String,

    /// Take over entries pending this long with any consumer (ms).
    #[arg(long, env = "TW_IDLE_TIMEOUT_MS", default_value = "60000",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub idle_timeout_ms: u64,

    /// Deliveries after which an entry that is no audit record goes to
    /// the dead letters.
    #[arg(long, env = "TW_MAX_DELIVERIES", default_value = "3",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_deliveries: u64,

    /// The dead-letter stream (default: `<prefix>audit:dead`).
    #[arg(long, env = "TW_DEAD_LETTER")]
    pub dead_letter: Option<String>,

    /// Entries read per stream per call.
    #[arg(long, env = "TW_BATCH", default_value = "256",
          value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub batch: u64,

    /// How long one read waits for new entries (ms).
    #[arg(long, env = "TW_BLOCK_MS", default_value = "500",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub block_ms: u64,

    /// Look for new tenants' streams this often (ms).
    #[arg(long, env = "TW_DISCOVER_EVERY_MS", default_value = "5000",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub discover_every_ms: u64,

    /// Wait this long between a round's durable write and its `XACK` (ms),
    /// to widen the crash window in tests and demos.
    #[arg(long, env = "TW_ACK_DELAY_MS", default_value = "0")]
    pub ack_delay_ms: u64,

    /// Serve Prometheus metrics on this address (`/metrics`).
    #[arg(long, env = "TW_METRICS_LISTEN")]
    pub metrics_listen: Option<std::net::SocketAddr>,

    /// Stop once no stream has anything new and nothing is pending in the
    /// group (for tests and batch runs).
    #[arg(long)]
    pub exit_when_idle: bool,
}

/// Why the exporter stopped.
#[derive(Debug)]
#[non_exhaustive]
pub enum ExportError {
    /// Redis failed (after retries).
    Redis(RedisError),
    /// The output failed.
    Output(io::Error),
    /// A setting was refused.
    Config(String),
}

impl std::fmt::Display for ExportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Redis(error) => write!(f, "redis: {error}"),
            Self::Output(error) => write!(f, "output: {error}"),
            Self::Config(problem) => f.write_str(problem),
        }
    }
}

impl std::error::Error for ExportError {}

impl From<RedisError> for ExportError {
    fn from(error: RedisError) -> Self {
        Self::Redis(error)
    }
}

impl From<io::Error> for ExportError {
    fn from(error: io::Error) -> Self {
        Self::Output(error)
    }
}

// ------------------------------------------------------------------ output

/// Where the lines go.
enum Output {
    Stdout,
    File(File),
}

/// Bytes read at a time when reading a file backwards.
const BACK_CHUNK: u64 = 64 * 1024;

impl Output {
    /// Opens `spec` (`-`: stdout) and cuts a torn last line off a file.
    fn open(spec: &str) -> io::Result<Self> {
        if spec == "-" {
            return Ok(Self::Stdout);
        }
        let path = Path::new(spec);
        let created = !path.exists();
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(path)?;
        if created {
            file.sync_all()?;
            // The new name itself durable too.
            let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
            File::open(parent.unwrap_or(Path::new(".")))?.sync_all()?;
        }
        let cut = cut_torn_line(&mut file)?;
        if cut > 0 {
            tracing::warn!(bytes = cut, "cut a torn last line off the output");
        }
        Ok(Self::File(file))
    }

    /// Appends `lines` and makes them durable (a file: `fsync`; stdout:
    /// flushed).
    fn write_durably(&mut self, lines: &[u8]) -> io::Result<()> {
        if lines.is_empty() {
            return Ok(());
        }
        match self {
            Self::Stdout => {
                let mut out = io::stdout().lock();
                out.write_all(lines)?;
                out.flush()
            }
            Self::File(file) => {
                file.write_all(lines)?;
                file.sync_data()
            }
        }
    }
}

/// Truncates `file` after its last newline; the bytes cut.
fn cut_torn_line(file: &mut File) -> io::Result<u64> {
    let len = file.metadata()?.len();
    let mut end = len;
    let mut chunk = Vec::new();
    let keep = loop {
        if end == 0 {
            break 0;
        }
        let start = end.saturating_sub(BACK_CHUNK);
        read_at(file, start, end, &mut chunk)?;
        if let Some(at) = chunk.iter().rposition(|&b| b == b'\n') {
            break start + at as u64 + 1;
        }
        end = start;
    };
    if keep < len {
        file.set_len(keep)?;
        file.sync_all()?;
    }
    Ok(len - keep)
}

fn read_at(file: &mut File, start: u64, end: u64, into: &mut Vec<u8>) -> io::Result<()> {
    into.clear();
    file.seek(SeekFrom::Start(start))?;
    Read::by_ref(file).take(end - start).read_to_end(into)?;
    if (into.len() as u64) < end - start {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the output shrank while being read",
        ));
    }
    Ok(())
}

/// The lines of a file that is empty or ends with a newline, last first,
/// each without its newline.
struct LinesBack<'a> {
    file: &'a mut File,
    /// Where the bytes not yet read start.
    start: u64,
    /// The unread bytes before them: the end of the next line back.
    tail: Vec<u8>,
    done: bool,
}

impl<'a> LinesBack<'a> {
    fn new(file: &'a mut File) -> io::Result<Self> {
        let len = file.metadata()?.len();
        Ok(Self {
            file,
            start: len.saturating_sub(1),
            tail: Vec::new(),
            done: len == 0,
        })
    }

    fn next_line(&mut self) -> io::Result<Option<Vec<u8>>> {
        loop {
            if self.done {
                return Ok(None);
            }
            if let Some(at) = self.tail.iter().rposition(|&b| b == b'\n') {
                let line = self.tail.split_off(at + 1);
                self.tail.truncate(at);
                return Ok(Some(line));
            }
            if self.start == 0 {
                self.done = true;
                return Ok(Some(std::mem::take(&mut self.tail)));
            }
            let from = self.start.saturating_sub(BACK_CHUNK);
            let mut chunk = Vec::new();
            read_at(self.file, from, self.start, &mut chunk)?;
            chunk.append(&mut self.tail);
            self.tail = chunk;
            self.start = from;
        }
    }
}

/// The `(tenant, id)` of a line, if it is a record's JSON.
fn line_key(line: &[u8]) -> Option<(String, String)> {
    #[derive(serde::Deserialize)]
    struct Key {
        tenant: String,
        id: String,
    }
    let key: Key = serde_json::from_slice(line).ok()?;
    Some((key.tenant, key.id))
}

/// Which of `pending` the file's last lines already hold, in file order:
/// the longest run of last lines that are all pending (see the module
/// docs).
fn already_written(
    file: &mut File,
    pending: &HashSet<(String, String)>,
) -> io::Result<Vec<(String, String)>> {
    let mut found = Vec::new();
    let mut seen = HashSet::new();
    let mut lines = LinesBack::new(file)?;
    while found.len() < pending.len() {
        let Some(line) = lines.next_line()? else {
            break;
        };
        match line_key(&line) {
            Some(key) if pending.contains(&key) && seen.insert(key.clone()) => found.push(key),
            _ => break,
        }
    }
    found.reverse();
    Ok(found)
}

// ------------------------------------------------------------------- redis

/// The connection: one Redis (reconnected on failure) or a cluster.
enum Conn {
    Single {
        /// Boxed: a client is large, and only reconnecting needs it.
        client: Box<redis::Client>,
        conn: MultiplexedConnection,
    },
    Cluster(ClusterConnection),
}

impl Conn {
    async fn once(&mut self, cmd: &Cmd, node: Option<&(String, u16)>) -> RedisResult<Value> {
        match (self, node) {
            (Self::Single { conn, .. }, _) => cmd.query_async(conn).await,
            (Self::Cluster(conn), None) => cmd.query_async(conn).await,
            (Self::Cluster(conn), Some((host, port))) => {
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port: *port,
                });
                conn.route_command(cmd.clone(), routing).await
            }
        }
    }

    async fn each_once(&mut self, cmds: &[Cmd]) -> RedisResult<Vec<RedisResult<Value>>> {
        match self {
            Self::Single { conn, .. } => {
                let mut pipe = redis::pipe();
                pipe.ignore_errors();
                for cmd in cmds {
                    pipe.add_command(cmd.clone());
                }
                pipe.query_async(conn).await
            }
            Self::Cluster(conn) => {
                let calls = cmds.iter().map(|cmd| {
                    let mut conn = conn.clone();
                    async move { cmd.query_async::<Value>(&mut conn).await }
                });
                Ok(join_all(calls).await)
            }
        }
    }

    async fn reconnect(&mut self) {
        if let Self::Single { client, conn } = self {
            match client.get_multiplexed_async_connection().await {
                Ok(fresh) => *conn = fresh,
                Err(error) => tracing::warn!(%error, "reconnecting to redis failed"),
            }
        }
    }
}

fn backoff() -> impl Iterator<Item = Duration> {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(50))
        .with_max_delay(Duration::from_secs(2))
        .with_max_times(8)
        .with_jitter()
        .build()
}

/// Whether `error` may pass by itself (worth a retry).
fn transient(error: &RedisError) -> bool {
    error.is_io_error()
        || error.is_timeout()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || matches!(
            error.code(),
            Some("LOADING" | "TRYAGAIN" | "CLUSTERDOWN" | "MASTERDOWN")
        )
}

fn is_nogroup(error: &RedisError) -> bool {
    error.code() == Some("NOGROUP")
}

fn bytes(value: &Value) -> Option<Vec<u8>> {
    match value {
        Value::BulkString(b) => Some(b.clone()),
        Value::SimpleString(s) => Some(s.clone().into_bytes()),
        Value::Int(i) => Some(i.to_string().into_bytes()),
        _ => None,
    }
}

fn string(value: &Value) -> Option<String> {
    bytes(value).and_then(|b| String::from_utf8(b).ok())
}

/// The `(key, value)` pairs of an `XREADGROUP` reply (RESP2 array or
/// RESP3 map).
fn per_stream(reply: Value) -> Vec<(Value, Value)> {
    match reply {
        Value::Array(items) => items
            .into_iter()
            .filter_map(|item| match item {
                Value::Array(pair) => {
                    let mut pair = pair.into_iter();
                    Some((pair.next()?, pair.next()?))
                }
                _ => None,
            })
            .collect(),
        Value::Map(pairs) => pairs,
        _ => Vec::new(),
    }
}

/// One stream entry as read.
struct Entry {
    stream: usize,
    id: String,
    /// `None`: trimmed away while pending.
    fields: Option<Vec<(Vec<u8>, Vec<u8>)>>,
    /// Read with `>`: its first delivery.
    fresh: bool,
}

/// The entries of an `XRANGE`-shaped list: `[[id, [f, v, ...] | nil], ...]`.
fn entries(stream: usize, list: &Value, fresh: bool) -> Vec<Entry> {
    let Value::Array(items) = list else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|item| {
            let Value::Array(pair) = item else {
                return None;
            };
            let id = string(pair.first()?)?;
            let fields = match pair.get(1) {
                Some(Value::Array(fields)) => Some(
                    fields
                        .chunks_exact(2)
                        .filter_map(|kv| Some((bytes(&kv[0])?, bytes(&kv[1])?)))
                        .collect(),
                ),
                Some(Value::Map(fields)) => Some(
                    fields
                        .iter()
                        .filter_map(|(k, v)| Some((bytes(k)?, bytes(v)?)))
                        .collect(),
                ),
                _ => None,
            };
            Some(Entry {
                stream,
                id,
                fields,
                fresh,
            })
        })
        .collect()
}

/// A tenant's stream.
struct Stream {
    key: Vec<u8>,
    tenant: String,
    /// Where the next `XAUTOCLAIM` starts.
    claim_from: String,
}

/// `%XX` decoded; `None` on a malformed escape.
fn unescape(tag: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(tag.len());
    let mut rest = tag;
    while let Some((&byte, after)) = rest.split_first() {
        if byte == b'%' {
            let hex = std::str::from_utf8(after.get(..2)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            rest = &after[2..];
        } else {
            out.push(byte);
            rest = after;
        }
    }
    Some(out)
}

/// The tenant whose audit stream `key` is under `store`'s prefix (see the
/// module docs for names that cannot be read back); `None` if `key` is no
/// audit stream.
pub fn tenant_of(store: &RedisStore, key: &[u8]) -> Option<String> {
    const TAIL: &[u8] = b"}:#audit";
    let empty = store.audit_stream("");
    let head = empty.strip_suffix(TAIL)?;
    let tag = key.strip_prefix(head)?.strip_suffix(TAIL)?;
    if tag.contains(&b'}') {
        return None;
    }
    if let Some(tenant) = unescape(tag).and_then(|b| String::from_utf8(b).ok()) {
        if store.audit_stream(&tenant) == key {
            return Some(tenant);
        }
    }
    Some(String::from_utf8_lossy(tag).into_owned())
}

/// The record of an entry, `None` if it is no audit record.
fn record_of(tenant: &str, id: &str, fields: &[(Vec<u8>, Vec<u8>)]) -> Option<AuditRecord> {
    let mut pairs = Vec::with_capacity(fields.len());
    for (name, value) in fields {
        pairs.push((
            std::str::from_utf8(name).ok()?,
            std::str::from_utf8(value).ok()?,
        ));
    }
    AuditRecord::from_fields(tenant, id, pairs)
}

fn count(outcome: &'static str, n: usize) {
    if n > 0 {
        metrics::counter!("tower_window_audit_export_records_total", "outcome" => outcome)
            .increment(n as u64);
    }
}

// ---------------------------------------------------------------- exporter

/// The exporter.
pub struct Exporter {
    args: ExporterArgs,
    conn: Conn,
    /// The key layout (never connected).
    store: RedisStore,
    dead_letter: String,
    output: Output,
    streams: Vec<Stream>,
    known: HashMap<Vec<u8>, usize>,
    next_discovery: Instant,
    /// Create the group on every stream found (a stream vanished or was
    /// made again).
    recreate_groups: bool,
    next_claim: Instant,
}

impl Exporter {
    /// Connects and opens the output (cutting a torn last line).
    pub async fn connect(args: ExporterArgs) -> Result<Self, ExportError> {
        let builder = RedisStore::builder().prefix(args.prefix.clone());
        let (conn, builder) = match &args.redis_url {
            Some(url) => {
                let client = crate::redis_client::no_delay_client(url)?;
                let conn = client.get_multiplexed_async_connection().await?;
                (
                    Conn::Single {
                        client: Box::new(client),
                        conn,
                    },
                    builder.url(url.clone()),
                )
            }
            None if args.cluster_url.is_empty() => {
                return Err(ExportError::Config(
                    "give --redis-url or --cluster-url".into(),
                ))
            }
            None => {
                let client = ClusterClient::new(args.cluster_url.clone())?;
                let conn = client.get_async_connection().await?;
                (Conn::Cluster(conn), builder.cluster(&args.cluster_url))
            }
        };
        let store = builder
            .build()
            .map_err(|e| ExportError::Config(e.to_string()))?;
        let dead_letter = args
            .dead_letter
            .clone()
            .unwrap_or_else(|| format!("{}audit:dead", args.prefix));
        let output = Output::open(&args.output)?;
        let now = Instant::now();
        Ok(Self {
            args,
            conn,
            store,
            dead_letter,
            output,
            streams: Vec::new(),
            known: HashMap::new(),
            next_discovery: now,
            recreate_groups: false,
            next_claim: now,
        })
    }

    /// The tenants' streams found so far.
    pub fn streams(&self) -> usize {
        self.streams.len()
    }

    /// Runs until idle (`--exit-when-idle`) or forever. Stopping it (a
    /// dropped future, a signal, SIGKILL) at any point is safe.
    pub async fn run(&mut self) -> Result<(), ExportError> {
        self.discover().await?;
        self.recover().await?;
        loop {
            if Instant::now() >= self.next_discovery || self.recreate_groups {
                self.discover().await?;
            }
            let mut round = Vec::new();
            if Instant::now() >= self.next_claim {
                round = self.claim().await?;
                let every = Duration::from_millis((self.args.idle_timeout_ms / 2).max(10));
                self.next_claim = Instant::now() + every;
            }
            let block = round.is_empty();
            round.extend(self.read_new(block).await?);
            let busy = !round.is_empty();
            self.export(round).await?;
            if self.args.exit_when_idle && !busy && !self.recreate_groups && self.idle().await? {
                return Ok(());
            }
        }
    }

    // ---------------------------------------------------------- commands

    /// `cmd` (on `node` of a cluster), retrying transient errors.
    async fn query(&mut self, cmd: &Cmd, node: Option<&(String, u16)>) -> RedisResult<Value> {
        let mut delays = backoff();
        loop {
            match self.conn.once(cmd, node).await {
                Err(error) if transient(&error) => {
                    let Some(delay) = delays.next() else {
                        return Err(error);
                    };
                    tracing::warn!(%error, ?delay, "redis failed; retrying");
                    tokio::time::sleep(delay).await;
                    self.conn.reconnect().await;
                }
                other => return other,
            }
        }
    }

    /// `cmds`, one answer each (pipelined on one Redis, concurrently on a
    /// cluster); a failure of the whole is retried when transient.
    async fn each(&mut self, cmds: &[Cmd]) -> RedisResult<Vec<RedisResult<Value>>> {
        if cmds.is_empty() {
            return Ok(Vec::new());
        }
        let mut delays = backoff();
        loop {
            match self.conn.each_once(cmds).await {
                Err(error) if transient(&error) => {
                    let Some(delay) = delays.next() else {
                        return Err(error);
                    };
                    tracing::warn!(%error, ?delay, "redis failed; retrying");
                    tokio::time::sleep(delay).await;
                    self.conn.reconnect().await;
                }
                other => return other,
            }
        }
    }

    /// One answer of [`each`](Self::each): `None` when it failed in a way
    /// that passes (the stream vanished: rediscover; a transient error:
    /// its entries, if any were delivered, are claimed later).
    fn answer(&mut self, answer: RedisResult<Value>) -> Result<Option<Value>, ExportError> {
        match answer {
            Ok(value) => Ok(Some(value)),
            Err(error) if is_nogroup(&error) => {
                self.recreate_groups = true;
                Ok(None)
            }
            Err(error) if transient(&error) => {
                tracing::warn!(%error, "a stream's read failed; its entries come back later");
                Ok(None)
            }
            Err(error) => Err(error.into()),
        }
    }

    fn read_cmd(&self, key: &[u8], from: &str, block: Option<u64>) -> Cmd {
        let mut cmd = redis::cmd("XREADGROUP");
        cmd.arg("GROUP")
            .arg(&self.args.group)
            .arg(&self.args.consumer)
            .arg("COUNT")
            .arg(self.args.batch);
        if let Some(block) = block {
            cmd.arg("BLOCK").arg(block);
        }
        cmd.arg("STREAMS").arg(key).arg(from);
        cmd
    }

    // --------------------------------------------------------- discovery

    /// The primaries of a cluster, `(host, port)`.
    async fn primaries(&mut self) -> RedisResult<Vec<(String, u16)>> {
        let reply = self.query(redis::cmd("CLUSTER").arg("SLOTS"), None).await?;
        let mut out = Vec::new();
        if let Value::Array(ranges) = reply {
            for range in &ranges {
                let Value::Array(parts) = range else { continue };
                let Some(Value::Array(node)) = parts.get(2) else {
                    continue;
                };
                let host = node.first().and_then(string);
                let port = match node.get(1) {
                    Some(Value::Int(port)) => u16::try_from(*port).ok(),
                    _ => None,
                };
                if let (Some(host), Some(port)) = (host, port) {
                    if !out.contains(&(host.clone(), port)) {
                        out.push((host, port));
                    }
                }
            }
        }
        Ok(out)
    }

    /// Every audit stream's key (on a cluster, on every primary).
    async fn scan(&mut self) -> RedisResult<Vec<Vec<u8>>> {
        let nodes = match self.conn {
            Conn::Single { .. } => vec![None],
            Conn::Cluster(_) => self.primaries().await?.into_iter().map(Some).collect(),
        };
        let pattern = self.store.audit_stream_pattern();
        let mut keys = Vec::new();
        for node in &nodes {
            let mut cursor = "0".to_owned();
            loop {
                let mut cmd = redis::cmd("SCAN");
                cmd.arg(&cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(1000)
                    .arg("TYPE")
                    .arg("stream");
                let reply = self.query(&cmd, node.as_ref()).await?;
                let Value::Array(parts) = reply else { break };
                if let Some(Value::Array(found)) = parts.get(1) {
                    keys.extend(found.iter().filter_map(bytes));
                }
                cursor = parts.first().and_then(string).unwrap_or_default();
                if cursor == "0" || cursor.is_empty() {
                    break;
                }
            }
        }
        keys.sort();
        keys.dedup();
        Ok(keys)
    }

    /// Finds the streams, makes the group on new ones, forgets vanished
    /// ones.
    async fn discover(&mut self) -> Result<(), ExportError> {
        let recreate = std::mem::take(&mut self.recreate_groups);
        let keys = self.scan().await?;
        let keys: Vec<(Vec<u8>, String)> = keys
            .into_iter()
            .filter_map(|key| {
                let tenant = tenant_of(&self.store, &key)?;
                Some((key, tenant))
            })
            .collect();
        let create: Vec<&Vec<u8>> = keys
            .iter()
            .map(|(key, _)| key)
            .filter(|key| recreate || !self.known.contains_key(*key))
            .collect();
        let cmds: Vec<Cmd> = create
            .iter()
            .map(|key| {
                let mut cmd = redis::cmd("XGROUP");
                cmd.arg("CREATE")
                    .arg(key.as_slice())
                    .arg(&self.args.group)
                    .arg("0");
                cmd
            })
            .collect();
        let answers = self.each(&cmds).await?;
        let mut gone = HashSet::new();
        for (key, answer) in create.iter().zip(answers) {
            match answer {
                Ok(_) => tracing::info!(stream = %String::from_utf8_lossy(key), "group created"),
                Err(error) if error.code() == Some("BUSYGROUP") => {}
                // Expired between SCAN and XGROUP: found again if written.
                Err(error)
                    if error.code() == Some("ERR")
                        && error.to_string().contains("requires the key to exist") =>
                {
                    gone.insert((*key).clone());
                }
                Err(error) if transient(&error) => {
                    gone.insert((*key).clone());
                    self.recreate_groups = true;
                }
                Err(error) => return Err(error.into()),
            }
        }
        let mut old: HashMap<Vec<u8>, Stream> = self
            .streams
            .drain(..)
            .map(|stream| (stream.key.clone(), stream))
            .collect();
        self.known.clear();
        for (key, tenant) in keys {
            if gone.contains(&key) {
                continue;
            }
            let stream = old.remove(&key).unwrap_or(Stream {
                key: key.clone(),
                tenant,
                claim_from: "0-0".into(),
            });
            self.known.insert(key, self.streams.len());
            self.streams.push(stream);
        }
        let every = Duration::from_millis(self.args.discover_every_ms);
        self.next_discovery = Instant::now() + every;
        Ok(())
    }

    // ------------------------------------------------------------ reading

    /// This consumer's pending entries (it died with them), oldest first
    /// per stream.
    async fn own_pending(&mut self) -> Result<Vec<Entry>, ExportError> {
        let mut cursors: Vec<(usize, String)> = (0..self.streams.len())
            .map(|s| (s, "0".to_owned()))
            .collect();
        let mut out = Vec::new();
        while !cursors.is_empty() {
            let cmds: Vec<Cmd> = cursors
                .iter()
                .map(|(s, from)| self.read_cmd(&self.streams[*s].key, from, None))
                .collect();
            let answers = self.each(&cmds).await?;
            let mut next = Vec::new();
            for ((s, _), answer) in cursors.into_iter().zip(answers) {
                let Some(reply) = self.answer(answer)? else {
                    continue;
                };
                for (_, list) in per_stream(reply) {
                    let read = entries(s, &list, false);
                    if let Some(last) = read.last() {
                        next.push((s, last.id.clone()));
                    }
                    out.extend(read);
                }
            }
            cursors = next;
        }
        Ok(out)
    }

    /// New entries: on one Redis one call over every stream (waiting
    /// `--block-ms` if `block`), on a cluster one per stream.
    async fn read_new(&mut self, block: bool) -> Result<Vec<Entry>, ExportError> {
        if self.streams.is_empty() {
            if block {
                tokio::time::sleep(Duration::from_millis(self.args.block_ms)).await;
            }
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        if let Conn::Single { .. } = self.conn {
            let mut cmd = redis::cmd("XREADGROUP");
            cmd.arg("GROUP")
                .arg(&self.args.group)
                .arg(&self.args.consumer)
                .arg("COUNT")
                .arg(self.args.batch);
            if block {
                cmd.arg("BLOCK").arg(self.args.block_ms);
            }
            cmd.arg("STREAMS");
            for stream in &self.streams {
                cmd.arg(stream.key.as_slice());
            }
            for _ in &self.streams {
                cmd.arg(">");
            }
            let reply = match self.query(&cmd, None).await {
                Ok(reply) => reply,
                Err(error) if is_nogroup(&error) => {
                    self.recreate_groups = true;
                    return Ok(Vec::new());
                }
                Err(error) => return Err(error.into()),
            };
            for (key, list) in per_stream(reply) {
                if let Some(&s) = bytes(&key).and_then(|k| self.known.get(&k)) {
                    out.extend(entries(s, &list, true));
                }
            }
        } else {
            let cmds: Vec<Cmd> = self
                .streams
                .iter()
                .map(|stream| self.read_cmd(&stream.key, ">", None))
                .collect();
            for (s, answer) in self.each(&cmds).await?.into_iter().enumerate() {
                if let Some(reply) = self.answer(answer)? {
                    for (_, list) in per_stream(reply) {
                        out.extend(entries(s, &list, true));
                    }
                }
            }
            if out.is_empty() && block {
                tokio::time::sleep(Duration::from_millis(self.args.block_ms)).await;
            }
        }
        Ok(out)
    }

    /// Entries pending longer than `--idle-timeout-ms`, taken over.
    async fn claim(&mut self) -> Result<Vec<Entry>, ExportError> {
        let cmds: Vec<Cmd> = self
            .streams
            .iter()
            .map(|stream| {
                let mut cmd = redis::cmd("XAUTOCLAIM");
                cmd.arg(stream.key.as_slice())
                    .arg(&self.args.group)
                    .arg(&self.args.consumer)
                    .arg(self.args.idle_timeout_ms)
                    .arg(&stream.claim_from)
                    .arg("COUNT")
                    .arg(self.args.batch);
                cmd
            })
            .collect();
        let mut out = Vec::new();
        for (s, answer) in self.each(&cmds).await?.into_iter().enumerate() {
            let Some(Value::Array(parts)) = self.answer(answer)? else {
                continue;
            };
            self.streams[s].claim_from = parts
                .first()
                .and_then(string)
                .unwrap_or_else(|| "0-0".into());
            if let Some(list) = parts.get(1) {
                out.extend(entries(s, list, false));
            }
        }
        if !out.is_empty() {
            tracing::info!(count = out.len(), "claimed idle entries");
        }
        Ok(out)
    }

    /// Whether nothing is pending in the group on any stream.
    async fn idle(&mut self) -> Result<bool, ExportError> {
        let cmds: Vec<Cmd> = self
            .streams
            .iter()
            .map(|stream| {
                let mut cmd = redis::cmd("XPENDING");
                cmd.arg(stream.key.as_slice()).arg(&self.args.group);
                cmd
            })
            .collect();
        for answer in self.each(&cmds).await? {
            match self.answer(answer)? {
                Some(Value::Array(summary)) => {
                    if !matches!(summary.first(), Some(Value::Int(0))) {
                        return Ok(false);
                    }
                }
                Some(_) => {}
                None => return Ok(false),
            }
        }
        Ok(true)
    }

    /// How many times the group delivered entry `id` of stream `s`.
    async fn deliveries(&mut self, s: usize, id: &str) -> Result<u64, ExportError> {
        let mut cmd = redis::cmd("XPENDING");
        cmd.arg(self.streams[s].key.as_slice())
            .arg(&self.args.group)
            .arg(id)
            .arg(id)
            .arg(1);
        let reply = self.query(&cmd, None).await?;
        let count = match reply {
            Value::Array(rows) => match rows.first() {
                Some(Value::Array(row)) => match row.get(3) {
                    Some(Value::Int(n)) => u64::try_from(*n).unwrap_or(1),
                    _ => 1,
                },
                _ => 1,
            },
            _ => 1,
        };
        Ok(count)
    }

    // ------------------------------------------------------------ writing

    /// Finishes what a previous run of this consumer left: acknowledges
    /// the pending entries the file already holds, exports the others.
    async fn recover(&mut self) -> Result<(), ExportError> {
        let pending = self.own_pending().await?;
        if pending.is_empty() {
            return Ok(());
        }
        tracing::info!(count = pending.len(), "finishing own pending entries");
        let Output::File(file) = &mut self.output else {
            // stdout cannot be read back: at least once.
            return self.export(pending).await;
        };
        let keys: HashSet<(String, String)> = pending
            .iter()
            .filter(|e| e.fields.is_some())
            .map(|e| (self.streams[e.stream].tenant.clone(), e.id.clone()))
            .collect();
        let written = already_written(file, &keys)?;
        if !written.is_empty() {
            tracing::info!(
                count = written.len(),
                "already written before the restart; acknowledging"
            );
            count("already_written", written.len());
            let stream_of: HashMap<(String, String), usize> = pending
                .iter()
                .map(|e| {
                    (
                        (self.streams[e.stream].tenant.clone(), e.id.clone()),
                        e.stream,
                    )
                })
                .collect();
            // In file order, a run of one stream's lines per XACK.
            let mut runs: Vec<(usize, Vec<String>)> = Vec::new();
            for key in &written {
                let Some(&s) = stream_of.get(key) else {
                    continue;
                };
                match runs.last_mut() {
                    Some((last, ids)) if *last == s => ids.push(key.1.clone()),
                    _ => runs.push((s, vec![key.1.clone()])),
                }
            }
            for (s, ids) in &runs {
                self.ack(*s, ids).await?;
            }
        }
        let written: HashSet<(String, String)> = written.into_iter().collect();
        let rest: Vec<Entry> = pending
            .into_iter()
            .filter(|e| !written.contains(&(self.streams[e.stream].tenant.clone(), e.id.clone())))
            .collect();
        self.export(rest).await
    }

    async fn ack(&mut self, s: usize, ids: &[String]) -> Result<(), ExportError> {
        let mut cmd = redis::cmd("XACK");
        cmd.arg(self.streams[s].key.as_slice())
            .arg(&self.args.group);
        for id in ids {
            cmd.arg(id);
        }
        self.query(&cmd, None).await?;
        Ok(())
    }

    /// One round: its lines written grouped by stream and made durable,
    /// then acknowledged stream by stream in the same order; then the
    /// entries that are no audit records (dead letters on their last
    /// delivery).
    async fn export(&mut self, mut round: Vec<Entry>) -> Result<(), ExportError> {
        if round.is_empty() {
            return Ok(());
        }
        round.sort_by_key(|e| e.stream); // stable: each stream's order kept
        let mut lines = Vec::new();
        let mut acks: Vec<(usize, Vec<String>)> = Vec::new();
        let mut failed = Vec::new();
        let (mut exported, mut trimmed) = (0, 0);
        for entry in round {
            match &entry.fields {
                None => trimmed += 1,
                Some(fields) => {
                    let tenant = &self.streams[entry.stream].tenant;
                    match record_of(tenant, &entry.id, fields) {
                        Some(record) => {
                            serde_json::to_writer(&mut lines, &record).map_err(io::Error::from)?;
                            lines.push(b'\n');
                            exported += 1;
                        }
                        None => {
                            failed.push(entry);
                            continue;
                        }
                    }
                }
            }
            match acks.last_mut() {
                Some((s, ids)) if *s == entry.stream => ids.push(entry.id),
                _ => acks.push((entry.stream, vec![entry.id])),
            }
        }
        self.output.write_durably(&lines)?;
        if exported > 0 && self.args.ack_delay_ms > 0 {
            tokio::time::sleep(Duration::from_millis(self.args.ack_delay_ms)).await;
        }
        for (s, ids) in &acks {
            self.ack(*s, ids).await?;
        }
        count("exported", exported);
        if trimmed > 0 {
            tracing::warn!(
                count = trimmed,
                "pending entries were trimmed from their log before export"
            );
            count("trimmed", trimmed);
        }
        for entry in failed {
            let deliveries = if entry.fresh {
                1
            } else {
                self.deliveries(entry.stream, &entry.id).await?
            };
            if deliveries >= self.args.max_deliveries {
                self.send_to_dead_letters(&entry, deliveries).await?;
            } else {
                // Left pending: claimed again after the idle timeout.
                tracing::warn!(id = %entry.id, deliveries, "an entry is no audit record");
                count("failed", 1);
            }
        }
        Ok(())
    }

    /// Copies the entry to the dead letters with the reason and acks it
    /// (in one `MULTI` on a single Redis).
    async fn send_to_dead_letters(
        &mut self,
        entry: &Entry,
        deliveries: u64,
    ) -> Result<(), ExportError> {
        let stream = &self.streams[entry.stream];
        let mut add = redis::cmd("XADD");
        add.arg(&self.dead_letter)
            .arg("MAXLEN")
            .arg("~")
            .arg(100_000)
            .arg("*")
            .arg("stream")
            .arg(stream.key.as_slice())
            .arg("tenant")
            .arg(&stream.tenant)
            .arg("original_id")
            .arg(&entry.id)
            .arg("reason")
            .arg("not an audit record")
            .arg("deliveries")
            .arg(deliveries)
            .arg("consumer")
            .arg(&self.args.consumer);
        for (name, value) in entry.fields.iter().flatten() {
            let mut field = b"field:".to_vec();
            field.extend_from_slice(name);
            add.arg(field).arg(value.as_slice());
        }
        let mut ack = redis::cmd("XACK");
        ack.arg(stream.key.as_slice())
            .arg(&self.args.group)
            .arg(&entry.id);
        match &mut self.conn {
            Conn::Single { conn, .. } => {
                let mut pipe = redis::pipe();
                pipe.atomic().add_command(add).ignore();
                pipe.add_command(ack).ignore();
                let () = pipe.query_async(conn).await?;
            }
            Conn::Cluster(_) => {
                self.query(&add, None).await?;
                self.query(&ack, None).await?;
            }
        }
        count("dead_letter", 1);
        tracing::warn!(id = %entry.id, deliveries, "entry sent to the dead letters");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn file_with(text: &[u8]) -> File {
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(text).unwrap();
        file
    }

    fn all_back(file: &mut File) -> Vec<String> {
        let mut lines = LinesBack::new(file).unwrap();
        let mut out = Vec::new();
        while let Some(line) = lines.next_line().unwrap() {
            out.push(String::from_utf8(line).unwrap());
        }
        out
    }

    #[test]
    fn lines_read_backwards() {
        assert!(all_back(&mut file_with(b"")).is_empty());
        assert_eq!(all_back(&mut file_with(b"a\n")), ["a"]);
        assert_eq!(
            all_back(&mut file_with(b"a\nbb\n\nc\n")),
            ["c", "", "bb", "a"]
        );
        // Across chunk boundaries.
        let long: String = "x".repeat(BACK_CHUNK as usize + 7);
        let text = format!("{long}\nshort\n{long}\n");
        assert_eq!(
            all_back(&mut file_with(text.as_bytes())),
            [&long, "short", &long]
        );
    }

    #[test]
    fn a_torn_last_line_is_cut() {
        let mut file = file_with(b"{\"a\":1}\n{\"a\":");
        assert_eq!(cut_torn_line(&mut file).unwrap(), 5);
        assert_eq!(file.metadata().unwrap().len(), 8);
        assert_eq!(cut_torn_line(&mut file).unwrap(), 0);
        let mut torn_only = file_with(b"{\"a\"");
        assert_eq!(cut_torn_line(&mut torn_only).unwrap(), 4);
        assert_eq!(torn_only.metadata().unwrap().len(), 0);
    }

    #[test]
    fn only_the_pending_run_at_the_end_counts_as_written() {
        let line = |t: &str, id: &str| format!("{{\"id\":\"{id}\",\"tenant\":\"{t}\"}}\n");
        let text = [
            line("a", "1-0"),
            line("b", "5-0"), // pending, but before an acknowledged line
            line("a", "2-0"),
            line("a", "3-0"),
            line("b", "4-0"),
        ]
        .concat();
        let key = |t: &str, id: &str| (t.to_owned(), id.to_owned());
        let pending: HashSet<_> = [
            key("a", "3-0"),
            key("b", "4-0"),
            key("b", "5-0"),
            key("c", "9-0"),
        ]
        .into_iter()
        .collect();
        let written = already_written(&mut file_with(text.as_bytes()), &pending).unwrap();
        assert_eq!(written, [key("a", "3-0"), key("b", "4-0")]);
    }

    #[test]
    fn tenants_are_read_back_from_stream_keys() {
        let store = RedisStore::builder()
            .url("redis://127.0.0.1:1")
            .prefix("p:")
            .build()
            .unwrap();
        for tenant in ["acme", "", "a:b{c}%d é", "#x"] {
            let key = store.audit_stream(tenant);
            assert_eq!(tenant_of(&store, &key).as_deref(), Some(tenant));
        }
        let long = "z".repeat(200);
        let key = store.audit_stream(&long);
        let tag = tenant_of(&store, &key).unwrap();
        assert!(tag.starts_with('#') && tag.len() == 65, "{tag}");
        assert_eq!(tenant_of(&store, b"q:{@acme}:#audit"), None);
        assert_eq!(tenant_of(&store, b"p:{@a}:x}:#audit"), None);
        assert_eq!(tenant_of(&store, b"p:{acme}:#audit"), None);
    }
}
