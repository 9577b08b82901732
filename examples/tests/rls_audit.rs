//! `rls --audit` on a real `redis-server`: each denied request is one
//! record in its domain's stream (`<prefix>{@<domain>}:#audit`), with the
//! quota that denied it, the outcome and who decided; sampled admissions
//! with `TW_AUDIT_SAMPLE_ADMISSIONS`; what is buffered at a graceful
//! shutdown is written before the process exits (both gRPC servers); and
//! without `--audit` nothing is written.
#![allow(clippy::unwrap_used)]

mod rls_support;

use std::fs::File;
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use rls_support::{codes, config_dir, descriptor, overall, request, should, RlsProcess};
use tower_window::audit::{AuditOutcome, AuditQuery, AuditRecord};
use tower_window::{AuditLog, RedisStore, Store};
use tower_window_tests::redis_cluster::query;
use tower_window_tests::redis_server::{reserve_port, RedisServer};

const DOMAIN: &str = "audited";

/// `per-user`: 2 an hour per user; the `path` rule (no name: its quota is
/// named after its path) 1 an hour per path.
const RULES: &str = "
domain: audited
descriptors:
  - key: user
    rate_limit: {name: per-user, unit: hour, requests_per_unit: 2}
  - key: path
    rate_limit: {unit: hour, requests_per_unit: 1}
";

/// The longest a test waits for the log to be written.
const WRITTEN_WITHIN: Duration = Duration::from_secs(15);

/// `--config` of the rules, on `redis`, with a generous time budget (a
/// slow first call on a loaded machine stays a store decision).
fn flags<'a>(rules: &'a str, url: &'a str) -> Vec<&'a str> {
    vec![
        "--config",
        rules,
        "--redis-url",
        url,
        "--redis-timeout-ms",
        "5000",
        "--fallback",
        "fail-closed",
    ]
}

/// The domain's audit stream, as the rls's store names it (the same
/// default prefix).
fn stream(url: &str) -> String {
    let redis = RedisStore::from_url(url).unwrap();
    String::from_utf8(redis.audit_stream(DOMAIN)).unwrap()
}

/// Entries in the domain's stream (`XLEN`).
fn stream_len(redis: &RedisServer) -> u64 {
    query(redis, &["XLEN", &stream(&redis.url())]).unwrap()
}

/// A counter or gauge on a `/metrics` page: the sum of the series named
/// `name` whose labels contain `label`.
fn series(page: &str, name: &str, label: &str) -> u64 {
    page.lines()
        .filter(|line| line.starts_with(name) && line.contains(label))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

/// Waits (at most [`WRITTEN_WITHIN`]) until `rls` says it wrote `records`
/// and buffers none, and the stream holds them: nothing is left to be
/// written after.
fn wait_written(rls: &RlsProcess, redis: &RedisServer, records: u64) {
    let deadline = Instant::now() + WRITTEN_WITHIN;
    loop {
        let page = rls.metrics();
        let written = series(
            &page,
            "tower_window_audit_records_total",
            "outcome=\"written\"",
        );
        let buffered = series(&page, "tower_window_audit_buffered", "");
        let len = stream_len(redis);
        if written >= records && buffered == 0 && len >= records {
            assert_eq!(
                (written, len),
                (records, records),
                "written (metrics), in the stream"
            );
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{written} of {records} records written ({buffered} buffered, {len} in the stream) within {WRITTEN_WITHIN:?}:\n{}",
            rls.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The domain's records on `url`, oldest first, read as an exporter would
/// (an audit log on a store of the same prefix).
async fn records(url: &str) -> Vec<AuditRecord> {
    let store = Store::from(RedisStore::from_url(url).unwrap());
    let log = AuditLog::builder(store).build();
    let page = log
        .query(&AuditQuery::new(DOMAIN).limit(AuditQuery::MAX_LIMIT))
        .await
        .unwrap();
    assert!(page.next.is_none(), "one page holds them");
    let mut records = page.records;
    records.reverse();
    records
}

/// Each record's (quota, outcome, source, remaining), oldest first.
fn summary(records: &[AuditRecord]) -> Vec<(String, AuditOutcome, String, u32)> {
    records
        .iter()
        .map(|r| {
            (
                r.quota.clone(),
                r.outcome,
                r.source.to_string(),
                r.remaining,
            )
        })
        .collect()
}

fn row(
    quota: &str,
    outcome: AuditOutcome,
    source: &str,
    remaining: u32,
) -> (String, AuditOutcome, String, u32) {
    (quota.to_owned(), outcome, source.to_owned(), remaining)
}

/// Sends `calls` requests of one descriptor `(key, value)`; their overall
/// codes.
async fn send(rls: &RlsProcess, (key, value): (&str, &str), calls: usize) -> Vec<Code> {
    let mut client = rls.client().await;
    let mut answers = Vec::with_capacity(calls);
    for _ in 0..calls {
        let r = should(
            &mut client,
            request(DOMAIN, vec![descriptor(&[(key, value)])]),
        )
        .await;
        answers.push(overall(&r));
    }
    answers
}

const OK: Code = Code::Ok;
const OVER: Code = Code::OverLimit;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_denial_is_one_record_in_the_domains_stream() {
    let redis = RedisServer::start();
    let url = redis.url();
    let dir = config_dir(&[("audited.yaml", RULES)]);
    let rules = dir.path().join("audited.yaml");
    let mut argv = flags(rules.to_str().unwrap(), &url);
    argv.push("--audit");
    let rls = RlsProcess::start(&argv);

    // Two descriptors denied: alice past per-user's 2, /login past 1.
    assert_eq!(
        send(&rls, ("user", "alice"), 5).await,
        [OK, OK, OVER, OVER, OVER]
    );
    assert_eq!(
        send(&rls, ("path", "/login"), 4).await,
        [OK, OVER, OVER, OVER]
    );
    // Both in one request, both over: one decision, one record.
    let mut client = rls.client().await;
    let both = should(
        &mut client,
        request(
            DOMAIN,
            vec![
                descriptor(&[("user", "alice")]),
                descriptor(&[("path", "/login")]),
            ],
        ),
    )
    .await;
    assert_eq!(overall(&both), OVER);
    assert_eq!(codes(&both), [OVER, OVER]);

    wait_written(&rls, &redis, 7);
    let records = records(&url).await;
    // Admissions are not recorded (no sampling); the first denial of a
    // window is the store's, the next ones the local tier's (it remembers
    // the denial).
    let denied = AuditOutcome::Denied;
    assert_eq!(
        summary(&records[..6]),
        [
            row("per-user", denied, "store", 0),
            row("per-user", denied, "local_cache", 0),
            row("per-user", denied, "local_cache", 0),
            row("path", denied, "store", 0),
            row("path", denied, "local_cache", 0),
            row("path", denied, "local_cache", 0),
        ]
    );
    let last = &records[6];
    assert!(
        ["per-user", "path"].contains(&last.quota.as_str()),
        "{last:?}"
    );
    assert_eq!(
        (last.outcome, last.source.to_string(), last.remaining),
        (denied, "store".to_owned(), 0)
    );
    // The domain is the tenant; the rls's window key has no subject.
    for record in &records {
        assert_eq!(
            (
                record.tenant.as_str(),
                record.subject.as_str(),
                record.policy.as_str()
            ),
            (DOMAIN, "", "rls"),
            "{record:?}"
        );
        assert!(
            !record.node.is_empty() && record.at_micros > 0,
            "{record:?}"
        );
    }
    assert!(
        records.windows(2).all(|w| w[0].at_micros <= w[1].at_micros),
        "in the order decided"
    );
    // Only this domain's stream exists, under the store's default prefix.
    let streams: Vec<String> = query(&redis, &["KEYS", "*:#audit"]).unwrap();
    assert_eq!(streams, [stream(&url)]);
    assert_eq!(stream(&url), "tw:{@audited}:#audit");
    let log = rls.log();
    assert!(log.contains("audit trail on"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampled_admissions_are_recorded_from_the_environment() {
    let redis = RedisServer::start();
    let url = redis.url();
    let dir = config_dir(&[("audited.yaml", RULES)]);
    let rules = dir.path().join("audited.yaml");
    let rls = RlsProcess::start_with_env(
        &flags(rules.to_str().unwrap(), &url),
        &[
            ("TW_AUDIT", "true"),
            ("TW_AUDIT_SAMPLE_ADMISSIONS", "1"),
            ("TW_AUDIT_MAX_LEN", "1000"),
            ("TW_AUDIT_MAX_AGE", "3600"),
        ],
    );
    assert_eq!(send(&rls, ("user", "carol"), 3).await, [OK, OK, OVER]);
    wait_written(&rls, &redis, 3);
    let (allowed, denied) = (AuditOutcome::Allowed, AuditOutcome::Denied);
    assert_eq!(
        summary(&records(&url).await),
        [
            row("per-user", allowed, "store", 1),
            row("per-user", allowed, "store", 0),
            row("per-user", denied, "store", 0),
        ]
    );
    // --audit-max-age: the stream expires after an hour without records.
    let ttl: i64 = query(&redis, &["PTTL", &stream(&url)]).unwrap();
    assert!(ttl > 3_500_000 && ttl <= 3_600_000, "{ttl}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_audit_nothing_is_written() {
    let redis = RedisServer::start();
    let url = redis.url();
    let dir = config_dir(&[("audited.yaml", RULES)]);
    let rules = dir.path().join("audited.yaml");
    let rls = RlsProcess::start(&flags(rules.to_str().unwrap(), &url));
    assert_eq!(send(&rls, ("user", "dave"), 4).await, [OK, OK, OVER, OVER]);
    assert_eq!(send(&rls, ("path", "/x"), 2).await, [OK, OVER]);
    // The windows are on this Redis; no audit stream is, and the rls has
    // no audit log (nothing buffered to be written later).
    let keys: Vec<String> = query(&redis, &["KEYS", "*"]).unwrap();
    assert!(!keys.is_empty());
    assert!(keys.iter().all(|k| !k.contains("#audit")), "{keys:?}");
    let page = rls.metrics();
    assert!(!page.contains("tower_window_audit_"), "{page}");
    let log = rls.log();
    assert!(
        !log.contains("audit trail") && !log.contains("audit log"),
        "{log}"
    );
}

/// An `rls` started here (its pid is needed for SIGTERM); killed on drop.
struct Stoppable {
    child: Child,
    port: u16,
    log: tempfile::NamedTempFile,
}

impl Stoppable {
    fn start(flags: &[&str]) -> Self {
        let port = reserve_port();
        let log = tempfile::NamedTempFile::new().unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_rls"));
        for name in tower_window_examples::rls::settings::READ {
            command.env_remove(name);
        }
        let child = command
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .args(flags)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(log.path()).unwrap())
            .spawn()
            .unwrap();
        let mut rls = Self { child, port, log };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !(rls.log().contains("serving envoy.service.ratelimit.v3")
            && TcpStream::connect(("127.0.0.1", port)).is_ok())
        {
            assert!(
                rls.child.try_wait().unwrap().is_none(),
                "exited:\n{}",
                rls.log()
            );
            assert!(
                Instant::now() < deadline,
                "not serving within 20 s:\n{}",
                rls.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        rls
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }

    /// SIGTERM, then its exit (within 20 s).
    fn terminate(&mut self) -> std::process::ExitStatus {
        let sent = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "still running 20 s after SIGTERM:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Stoppable {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_shutdown_writes_what_is_buffered() {
    let redis = RedisServer::start();
    let url = redis.url();
    let dir = config_dir(&[("audited.yaml", RULES)]);
    let rules = dir.path().join("audited.yaml");
    for (server, user, before) in [("h2", "erin", 0), ("tonic", "frank", 3)] {
        let mut argv = flags(rules.to_str().unwrap(), &url);
        argv.extend(["--audit", "--grpc-server", server]);
        let mut rls = Stoppable::start(&argv);
        let mut client = tonic_client(rls.port).await;
        let mut answers = Vec::new();
        for _ in 0..5 {
            let r = should(
                &mut client,
                request(DOMAIN, vec![descriptor(&[("user", user)])]),
            )
            .await;
            answers.push(overall(&r));
        }
        assert_eq!(answers, [OK, OK, OVER, OVER, OVER], "{server}");
        drop(client);
        // Redis holds writes back for 300 ms, and the rls is stopped at
        // once: records still buffered are written before it exits.
        let () = query(&redis, &["CLIENT", "PAUSE", "300", "WRITE"]).unwrap();
        let status = rls.terminate();
        assert!(status.success(), "{server}: {status}:\n{}", rls.log());
        let log = rls.log();
        assert!(log.contains("audit log flushed"), "{server}:\n{log}");
        assert_eq!(stream_len(&redis), before + 3, "{server}:\n{log}");
    }
    let records = records(&url).await;
    let denials: Vec<_> = records
        .iter()
        .map(|r| (r.quota.as_str(), r.outcome, r.node.as_str()))
        .collect();
    assert_eq!(denials.len(), 6);
    assert!(denials
        .iter()
        .all(|(q, o, _)| *q == "per-user" && *o == AuditOutcome::Denied));
    // Two processes, two node ids.
    assert_ne!(denials[0].2, denials[3].2);
}

async fn tonic_client(
    port: u16,
) -> envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient<
    tonic::transport::Channel,
>{
    envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient::connect(
        format!("http://127.0.0.1:{port}"),
    )
    .await
    .unwrap()
}
