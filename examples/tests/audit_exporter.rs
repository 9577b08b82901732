//! The audit exporter as real processes on a real `redis-server` (and a
//! real 3-primary cluster): records written through the library
//! (`AuditLog` + `Limiter::audit`, every admission sampled) are exported
//! to a file exactly once — with the exporter SIGKILLed mid-stream and
//! restarted while records keep coming, and from hand-made crash states (a
//! torn last line; a round written and only partly acknowledged). Every
//! line parses as JSON and equals the stream's entry; a foreign entry ends
//! in the dead letters.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value as Json;
use tower_window::audit::{AuditLog, AuditRecord, AuditRules, AuditStats};
use tower_window::store::redis::redis::{self, ConnectionLike, Value};
use tower_window::{Limiter, Quota, RedisStore, Store, WindowKey};
use tower_window_tests::redis_cluster::{key_slot, primary_of, RedisCluster};
use tower_window_tests::redis_server::RedisServer;

const GROUP: &str = "audit-exporters";
/// Every wait is bounded.
const WAIT: Duration = Duration::from_secs(90);

fn tenants(names: &[&str]) -> Vec<String> {
    names.iter().map(|t| (*t).to_owned()).collect()
}

// ------------------------------------------------------------- processes

struct Exporter {
    child: Child,
    log: PathBuf,
}

fn exporter(dir: &Path, name: &str, flags: &[&str]) -> Exporter {
    let log = dir.join(format!("{name}.log"));
    let child = Command::new(env!("CARGO_BIN_EXE_audit-exporter"))
        .args(flags)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(File::create(&log).unwrap()))
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .spawn()
        .unwrap();
    Exporter { child, log }
}

impl Exporter {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGKILL: no cleanup, no acks.
    fn kill(mut self) -> String {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        self.log()
    }

    /// Waits (bounded) for a successful exit; its log.
    fn wait_exit(mut self) -> String {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                let log = self.log();
                assert!(status.success(), "the exporter failed: {log}");
                return log;
            }
            if start.elapsed() > WAIT {
                let _ = self.child.kill();
                panic!("the exporter did not finish: {}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < WAIT, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn lines_in(path: &Path) -> usize {
    std::fs::read(path)
        .map(|b| b.iter().filter(|&&c| c == b'\n').count())
        .unwrap_or(0)
}

// ---------------------------------------------------------------- records

/// Decisions checked through a `Limiter` whose `AuditLog` records every
/// admission, one key per tenant per step, on a thread of its own; counted
/// in records.
struct Writer {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<AuditStats>,
}

impl Writer {
    /// Writes at least `min` and at most `max` records (multiples of the
    /// tenant count), stopping past `min` once told to; `pace` between
    /// every 10 steps. The store is made on the writer's own runtime (a
    /// store's connections die with the runtime they were made on).
    fn start(
        store: impl FnOnce() -> RedisStore + Send + 'static,
        tenants: Vec<String>,
        min: u64,
        max: u64,
        pace: Duration,
    ) -> Self {
        // A node id per log: a log applies a node's batch numbers once,
        // and a new log numbers its batches from 1 again.
        static WRITERS: AtomicU64 = AtomicU64::new(0);
        let node = format!("writer-{}", WRITERS.fetch_add(1, Ordering::Relaxed));
        let stop = Arc::new(AtomicBool::new(false));
        let told = Arc::clone(&stop);
        let handle = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                // A budget for a loaded 2-core machine, not for speed.
                let store = Store::builder(store())
                    .timeout(Duration::from_secs(5))
                    .build();
                let audit = AuditLog::builder(store.clone())
                    .rules(AuditRules::default().sample_admissions(1))
                    .node(node)
                    .build();
                let limiter = Limiter::builder(store, "1000000/1h".parse::<Quota>().unwrap())
                    .audit(audit.clone())
                    .build();
                let mut written = 0_u64;
                for step in 0_u64.. {
                    if written >= max || (written >= min && told.load(Ordering::Relaxed)) {
                        break;
                    }
                    for tenant in &tenants {
                        let key = WindowKey::new(tenant.clone(), format!("user-{}", step % 7));
                        assert!(limiter.check(&key, 1).await.unwrap().allowed());
                        written += 1;
                    }
                    if step % 10 == 9 && !pace.is_zero() {
                        tokio::time::sleep(pace).await;
                    }
                }
                assert!(audit.flush().await, "the audit log flushed");
                let stats = audit.stats();
                assert_eq!(stats.recorded, written, "{stats:?}");
                assert_eq!(stats.written, written, "{stats:?}");
                stats
            })
        });
        Self { stop, handle }
    }

    fn finish(self) -> AuditStats {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().unwrap()
    }
}

/// Where a writer connects.
#[derive(Clone)]
enum Target {
    Url(String),
    Cluster(Vec<String>),
}

impl Target {
    fn store(&self) -> RedisStore {
        match self {
            Self::Url(url) => RedisStore::from_url(url).unwrap(),
            Self::Cluster(urls) => RedisStore::cluster(urls).unwrap(),
        }
    }
}

fn write_now(target: &Target, tenants: &[String], records: u64) {
    let target = target.clone();
    let store = move || target.store();
    Writer::start(store, tenants.to_vec(), records, records, Duration::ZERO).finish();
}

fn text(value: &Value) -> String {
    match value {
        Value::BulkString(b) => String::from_utf8(b.clone()).unwrap(),
        Value::SimpleString(s) => s.clone(),
        other => panic!("not text: {other:?}"),
    }
}

/// Entries of `stream`: `(id, [(field, value)])`, oldest first.
fn xrange(conn: &mut impl ConnectionLike, stream: &[u8]) -> Vec<(String, Vec<(String, String)>)> {
    let reply: Value = redis::cmd("XRANGE")
        .arg(stream)
        .arg("-")
        .arg("+")
        .query(conn)
        .unwrap();
    let Value::Array(items) = reply else {
        panic!("{reply:?}")
    };
    items
        .iter()
        .map(|item| {
            let Value::Array(pair) = item else {
                panic!("{item:?}")
            };
            let Value::Array(fields) = &pair[1] else {
                panic!("{item:?}")
            };
            let fields = fields
                .chunks_exact(2)
                .map(|kv| (text(&kv[0]), text(&kv[1])))
                .collect();
            (text(&pair[0]), fields)
        })
        .collect()
}

/// The record's JSON line, as the exporter writes it.
fn json_line(tenant: &str, id: &str, fields: &[(String, String)]) -> String {
    let record = AuditRecord::from_fields(
        tenant,
        id,
        fields.iter().map(|(n, v)| (n.as_str(), v.as_str())),
    )
    .unwrap();
    let mut line = serde_json::to_string(&record).unwrap();
    line.push('\n');
    line
}

fn pending(conn: &mut impl ConnectionLike, stream: &[u8]) -> i64 {
    let reply: Value = redis::cmd("XPENDING")
        .arg(stream)
        .arg(GROUP)
        .query(conn)
        .unwrap();
    match reply {
        Value::Array(summary) => match summary.first() {
            Some(Value::Int(n)) => *n,
            _ => 0,
        },
        _ => 0,
    }
}

/// Every record of `tenants`' streams is in `file` exactly once and as its
/// JSON, the file is JSON lines, and nothing is pending; the record count.
fn assert_exported_once(
    conn: &mut impl ConnectionLike,
    store: &RedisStore,
    tenants: &[String],
    file: &Path,
) -> usize {
    let mut expected: HashMap<(String, String), Json> = HashMap::new();
    for tenant in tenants {
        let stream = store.audit_stream(tenant);
        for (id, fields) in xrange(conn, &stream) {
            let json = serde_json::from_str(&json_line(tenant, &id, &fields)).unwrap();
            expected.insert((tenant.clone(), id), json);
        }
        assert_eq!(pending(conn, &stream), 0, "{tenant}: nothing pending");
    }
    let content = std::fs::read_to_string(file).unwrap();
    assert!(content.is_empty() || content.ends_with('\n'), "whole lines");
    let mut seen: BTreeMap<(String, String), usize> = BTreeMap::new();
    for (n, line) in content.lines().enumerate() {
        let json: Json = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("line {} is no JSON ({e}): {line}", n + 1));
        let key = (
            json["tenant"].as_str().unwrap().to_owned(),
            json["id"].as_str().unwrap().to_owned(),
        );
        assert_eq!(
            expected.get(&key),
            Some(&json),
            "line {} is a stream entry's record",
            n + 1
        );
        *seen.entry(key).or_default() += 1;
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "written more than once: {twice:?}");
    assert_eq!(seen.len(), expected.len(), "every record written");
    expected.len()
}

// ------------------------------------------------------------------ tests

#[test]
fn an_exporter_killed_mid_stream_and_restarted_writes_every_record_once() {
    let redis = RedisServer::start();
    let url = redis.url();
    let mut conn = redis.connection();
    let store = RedisStore::from_url(&url).unwrap();
    let names = tenants(&["acme", "globex", "initech"]);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("audit.jsonl");
    let out_flag = out.to_str().unwrap();
    let flags = [
        "--redis-url",
        &url,
        "--consumer",
        "e1",
        "--output",
        out_flag,
        "--batch",
        "16",
        "--ack-delay-ms",
        "10",
        "--block-ms",
        "100",
        "--discover-every-ms",
        "100",
    ];

    // Records keep coming (about 1,500 a second) until told to stop, past
    // 3,000 at least.
    let target = Target::Url(url.clone());
    let writer = Writer::start(
        move || target.store(),
        names.clone(),
        3_000,
        60_000,
        Duration::from_millis(20),
    );
    let mut logs = Vec::new();
    let mut target = 200;
    for run in 0..3 {
        let e = exporter(dir.path(), &format!("run{run}"), &flags);
        wait_for("lines to be exported", || {
            assert!(!writer.handle.is_finished(), "the writer stopped early");
            lines_in(&out) >= target
        });
        logs.push(e.kill());
        target = lines_in(&out) + 300;
        if run == 1 {
            // As if killed inside the append: half a line, no newline.
            let mut file = OpenOptions::new().append(true).open(&out).unwrap();
            file.write_all(br#"{"id":"1-0","at_micros":17"#).unwrap();
        }
    }
    // The last run sees the writer stop.
    let last = exporter(dir.path(), "run3", &flags);
    let stats = writer.finish();
    assert!(stats.written >= 3_000, "{stats:?}");
    let total = usize::try_from(stats.written).unwrap();
    wait_for("every record to be exported", || lines_in(&out) >= total);
    wait_for("every record to be acknowledged", || {
        names
            .iter()
            .all(|t| pending(&mut conn, &store.audit_stream(t)) == 0)
    });
    logs.push(last.kill());
    // Killed idle: a restart has nothing to write.
    let again = exporter(
        dir.path(),
        "run4",
        &[&flags[..], &["--exit-when-idle"][..]].concat(),
    );
    logs.push(again.wait_exit());

    assert_eq!(assert_exported_once(&mut conn, &store, &names, &out), total);
    assert_eq!(lines_in(&out), total);
    assert!(
        logs[2].contains("cut a torn last line"),
        "the torn line was cut: {}",
        logs[2]
    );
    let restarts_with_pending = logs
        .iter()
        .filter(|log| log.contains("finishing own pending entries"))
        .count();
    let restarts_with_written = logs
        .iter()
        .filter(|log| log.contains("already written before the restart"))
        .count();
    eprintln!(
        "{total} records; of 4 restarts, {restarts_with_pending} found entries of theirs \
         pending, {restarts_with_written} of them already in the file"
    );
}

#[test]
fn a_crash_after_the_write_and_before_the_acks_writes_nothing_twice() {
    let redis = RedisServer::start();
    let url = redis.url();
    let mut conn = redis.connection();
    let store = RedisStore::from_url(&url).unwrap();
    let names = tenants(&["t0", "t1", "t2"]);
    let streams: Vec<Vec<u8>> = names.iter().map(|t| store.audit_stream(t)).collect();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("audit.jsonl");
    let flags = [
        "--redis-url",
        &url,
        "--consumer",
        "e1",
        "--output",
        out.to_str().unwrap(),
        "--exit-when-idle",
        "--block-ms",
        "50",
    ];
    let target = Target::Url(url.clone());
    write_now(&target, &names, 30);
    exporter(dir.path(), "first", &flags).wait_exit();
    assert_eq!(lines_in(&out), 30);

    // What a round of 10 entries per stream leaves when the exporter dies
    // (a) inside its append: 13 whole lines and half of the 14th, nothing
    // acknowledged; (b) after its append and its first stream's XACK.
    let round = |conn: &mut redis::Connection| {
        let mut cmd = redis::cmd("XREADGROUP");
        cmd.arg("GROUP")
            .arg(GROUP)
            .arg("e1")
            .arg("COUNT")
            .arg(10)
            .arg("STREAMS");
        for stream in &streams {
            cmd.arg(stream.as_slice());
        }
        for _ in &streams {
            cmd.arg(">");
        }
        let reply: Value = cmd.query(conn).unwrap();
        let Value::Array(per_stream) = reply else {
            panic!("{reply:?}")
        };
        assert_eq!(per_stream.len(), 3);
        let mut lines = Vec::new();
        for (tenant, stream) in names.iter().zip(&streams) {
            let read = per_stream
                .iter()
                .find_map(|pair| match pair {
                    Value::Array(pair) if text(&pair[0]).as_bytes() == stream.as_slice() => {
                        Some(pair[1].clone())
                    }
                    _ => None,
                })
                .unwrap();
            let Value::Array(entries) = read else {
                panic!("{read:?}")
            };
            assert_eq!(entries.len(), 10);
            for entry in &entries {
                let Value::Array(pair) = entry else {
                    panic!("{entry:?}")
                };
                let Value::Array(fields) = &pair[1] else {
                    panic!("{entry:?}")
                };
                let fields: Vec<(String, String)> = fields
                    .chunks_exact(2)
                    .map(|kv| (text(&kv[0]), text(&kv[1])))
                    .collect();
                let id = text(&pair[0]);
                lines.push((id.clone(), json_line(tenant, &id, &fields)));
            }
        }
        lines
    };

    // (a)
    write_now(&target, &names, 60);
    let lines = round(&mut conn);
    let mut file = OpenOptions::new().append(true).open(&out).unwrap();
    for (_, line) in &lines[..13] {
        file.write_all(line.as_bytes()).unwrap();
    }
    file.write_all(&lines[13].1.as_bytes()[..20]).unwrap();
    let log = exporter(dir.path(), "torn", &flags).wait_exit();
    assert!(log.contains("cut a torn last line"), "{log}");
    assert!(
        log.contains("already written before the restart; acknowledging count=13"),
        "{log}"
    );
    assert_eq!(assert_exported_once(&mut conn, &store, &names, &out), 90);

    // (b)
    write_now(&target, &names, 60);
    let lines = round(&mut conn);
    for (_, line) in &lines {
        file.write_all(line.as_bytes()).unwrap();
    }
    let mut ack = redis::cmd("XACK");
    ack.arg(streams[0].as_slice()).arg(GROUP);
    for (id, _) in &lines[..10] {
        ack.arg(id);
    }
    assert_eq!(ack.query::<i64>(&mut conn).unwrap(), 10);
    let log = exporter(dir.path(), "acked", &flags).wait_exit();
    assert!(
        log.contains("already written before the restart; acknowledging count=20"),
        "{log}"
    );
    assert_eq!(assert_exported_once(&mut conn, &store, &names, &out), 150);
}

#[test]
fn a_foreign_entry_ends_in_the_dead_letters() {
    let redis = RedisServer::start();
    let url = redis.url();
    let mut conn = redis.connection();
    let store = RedisStore::from_url(&url).unwrap();
    let names = tenants(&["t0"]);
    let target = Target::Url(url.clone());
    write_now(&target, &names, 10);
    let stream = store.audit_stream("t0");
    let foreign: String = redis::cmd("XADD")
        .arg(stream.as_slice())
        .arg("*")
        .arg("foo")
        .arg("bar")
        .query(&mut conn)
        .unwrap();
    write_now(&target, &names, 5);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("audit.jsonl");
    let log = exporter(
        dir.path(),
        "dl",
        &[
            "--redis-url",
            &url,
            "--consumer",
            "e1",
            "--output",
            out.to_str().unwrap(),
            "--idle-timeout-ms",
            "200",
            "--max-deliveries",
            "2",
            "--block-ms",
            "50",
            "--dead-letter",
            "dead",
            "--exit-when-idle",
        ],
    )
    .wait_exit();
    assert!(log.contains("entry sent to the dead letters"), "{log}");
    assert_eq!(lines_in(&out), 15);
    let content = std::fs::read_to_string(&out).unwrap();
    assert!(!content.contains(&foreign), "{content}");
    assert_eq!(pending(&mut conn, &stream), 0);
    let dead = xrange(&mut conn, b"dead");
    assert_eq!(dead.len(), 1, "{dead:?}");
    let fields: HashMap<_, _> = dead[0].1.iter().cloned().collect();
    assert_eq!(fields["original_id"], foreign);
    assert_eq!(fields["tenant"], "t0");
    assert_eq!(fields["reason"], "not an audit record");
    assert_eq!(fields["deliveries"], "2");
    assert_eq!(fields["field:foo"], "bar");
    assert_eq!(fields["stream"].as_bytes(), stream.as_slice());
}

#[test]
fn on_a_cluster_every_primarys_streams_are_exported_once() {
    let cluster = RedisCluster::start();
    let urls = cluster.urls();
    let store = RedisStore::cluster(&urls).unwrap();
    // One tenant whose log lives on each primary.
    let mut names = Vec::new();
    for i in 0.. {
        let tenant = format!("tenant-{i}");
        let owner = primary_of(key_slot(&store.audit_stream(&tenant)));
        if !names.iter().any(|(_, o)| *o == owner) {
            names.push((tenant, owner));
        }
        if names.len() == 3 {
            break;
        }
    }
    let names: Vec<String> = names.into_iter().map(|(t, _)| t).collect();
    let mut conn = redis::cluster::ClusterClient::new(urls.clone())
        .unwrap()
        .get_connection()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("audit.jsonl");
    let mut flags = vec![
        "--consumer",
        "e1",
        "--output",
        out.to_str().unwrap(),
        "--batch",
        "16",
        "--ack-delay-ms",
        "10",
        "--block-ms",
        "50",
        "--discover-every-ms",
        "100",
    ];
    for url in &urls {
        flags.extend(["--cluster-url", url.as_str()]);
    }

    let target = Target::Cluster(urls.clone());
    write_now(&target, &names, 600);
    let e = exporter(dir.path(), "first", &flags);
    wait_for("lines to be exported", || lines_in(&out) >= 100);
    e.kill();
    write_now(&target, &names, 300);
    flags.push("--exit-when-idle");
    exporter(dir.path(), "second", &flags).wait_exit();
    assert_eq!(assert_exported_once(&mut conn, &store, &names, &out), 900);
}
