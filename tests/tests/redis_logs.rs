//! DESIGN.md invariant 8 on real Redis failures: connection refused (a
//! closed port), a timeout (Redis held with `CLIENT PAUSE ... WRITE` beyond
//! a small budget), no password / a wrong password (`CONFIG SET
//! requirepass`) and an ACL user without access to the keys. Every span and
//! event at every level is captured (one global subscriber writing into a
//! shared buffer, so the redis-rs driver tasks on worker threads are
//! captured too); no line at info or above may hold the key's tenant or
//! subject bytes, or any password or user name of the URLs. What appears at
//! debug and trace is printed (run with `--nocapture`) and reported.
#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tower::{service_fn, Layer, ServiceExt};
use tower_window::fallback::FailOpen;
use tower_window::key::Header;
use tower_window::{
    BreakerConfig, KeyExtractorExt, Limiter, Quota, RedisStore, RetryConfig, SlidingWindowLayer,
    Store, WindowKey,
};
use tower_window_tests::redis_cluster::RedisCluster;
use tower_window_tests::redis_server::RedisServer;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

const TENANT: &str = "tenant-marker-7f3a";
const SUBJECT: &str = "subject-marker-9c1e";
const PASSWORD: &str = "secret-pw-31d7";
const WRONG_PASSWORD: &str = "wrong-pw-5d2b";
const ACL_USER: &str = "acl-user-marker-c0de";
const ACL_PASSWORD: &str = "acl-pw-8e44";
/// Everything that must not be logged at info or above.
const SECRETS: [&str; 6] = [
    TENANT,
    SUBJECT,
    PASSWORD,
    WRONG_PASSWORD,
    ACL_USER,
    ACL_PASSWORD,
];

// ---------------------------------------------------------------- capture

/// One captured line: its level, and its text (`span <target> <name>
/// fields` or `event <target> fields`, a span's later records appended).
#[derive(Default)]
struct Lines(Mutex<Vec<(Level, String)>>);

struct Capture(&'static Lines);

struct Fields(String);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.push_str(&format!(" {}={:?}", field.name(), value));
    }
}

impl Subscriber for Capture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let mut fields = Fields(String::new());
        span.record(&mut fields);
        let meta = span.metadata();
        let mut lines = self.0 .0.lock().unwrap();
        lines.push((
            *meta.level(),
            format!("span {} {}{}", meta.target(), meta.name(), fields.0),
        ));
        Id::from_u64(lines.len() as u64)
    }

    fn record(&self, id: &Id, values: &Record<'_>) {
        let mut fields = Fields(String::new());
        values.record(&mut fields);
        let index = usize::try_from(id.into_u64() - 1).unwrap();
        self.0 .0.lock().unwrap()[index].1.push_str(&fields.0);
    }

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut fields = Fields(String::new());
        event.record(&mut fields);
        let meta = event.metadata();
        self.0 .0.lock().unwrap().push((
            *meta.level(),
            format!("event {} {}{}", meta.target(), meta.name(), fields.0),
        ));
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

/// The process-wide capture, installed once.
fn lines() -> &'static Lines {
    static LINES: OnceLock<&'static Lines> = OnceLock::new();
    LINES.get_or_init(|| {
        let lines: &'static Lines = Box::leak(Box::default());
        tracing::subscriber::set_global_default(Capture(lines)).unwrap();
        lines
    })
}

/// Checks every line captured so far: nothing secret at info or above.
/// Prints the lines at debug and below that hold a secret, and returns the
/// lines whose text contains `needle` (to check a scenario was logged).
fn audit(needle: &str) -> Vec<(Level, String)> {
    let all = lines().0.lock().unwrap().clone();
    for (level, line) in &all {
        let leaked: Vec<&str> = SECRETS
            .iter()
            .copied()
            .filter(|s| line.contains(s))
            .collect();
        if leaked.is_empty() {
            continue;
        }
        assert!(*level > Level::INFO, "{leaked:?} logged at {level}: {line}");
        eprintln!("secret at {level} (allowed below info): {leaked:?} in {line}");
    }
    all.into_iter()
        .filter(|(_, line)| line.contains(needle))
        .collect()
}

// ---------------------------------------------------------------- scenario

async fn ok(_request: Request<String>) -> Result<Response<String>, Infallible> {
    Ok(Response::new(String::new()))
}

fn quota(policy: &str) -> Quota {
    "5/1m".parse::<Quota>().unwrap().named(policy).unwrap()
}

/// Drives one failing store three ways: a limiter without fallback through
/// the layer (the request is refused, not hung), the same directly, and a
/// fail-open limiter (degraded decisions). The policy is named `policy` so
/// that the scenario's log lines can be told apart. Returns them.
async fn drive(store: RedisStore, policy: &str, budget: Duration) -> Vec<(Level, String)> {
    lines();
    let store = Arc::new(store);
    let strict = Store::builder(store.clone())
        .timeout(budget)
        .retry(RetryConfig::default().max_retries(1))
        .build();
    let strict = Limiter::new(strict, quota(policy));
    let service = SlidingWindowLayer::new(
        strict.clone(),
        Header::new("x-user-id")
            .unwrap()
            .with_tenant(Header::new("x-tenant-id").unwrap()),
    )
    .layer(service_fn(ok));
    let response = service
        .oneshot(
            Request::builder()
                .header("x-tenant-id", TENANT)
                .header("x-user-id", SUBJECT)
                .body(String::new())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(
        response.status(),
        StatusCode::SERVICE_UNAVAILABLE,
        "{policy}"
    );

    let key = WindowKey::new(TENANT, SUBJECT);
    assert!(strict.check(&key, 1).await.is_err(), "{policy}");

    let open = Store::builder(store)
        .timeout(budget)
        .breaker(BreakerConfig::default().consecutive_failures(1))
        .build();
    let open = Limiter::builder(open, quota(policy))
        .fallback(FailOpen::new())
        .build();
    for _ in 0..3 {
        assert!(open.check(&key, 1).await.unwrap().is_degraded(), "{policy}");
    }

    let scenario = audit(&format!("\"{policy}\""));
    let warnings = scenario
        .iter()
        .filter(|(level, _)| *level == Level::WARN)
        .count();
    // The strict limiter's two failed checks and the fail-open one's first
    // (its breaker is open after that) are each logged at warn.
    assert!(warnings >= 3, "{policy}: {scenario:#?}");
    for (level, line) in &scenario {
        eprintln!("{policy}: {level} {line}");
    }
    // The layer's own warning for the refused request (it names no policy).
    assert!(
        !audit("rate limiter could not decide").is_empty(),
        "{policy}: the layer logged nothing"
    );
    scenario
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_refused_logs_no_secret() {
    let port = tower_window_tests::redis_server::closed_port();
    let url = format!("redis://:{PASSWORD}@127.0.0.1:{port}/");
    let store = RedisStore::from_url(&url).unwrap();
    drive(store, "refused-single", Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_connection_refused_logs_no_secret() {
    let url = format!(
        "redis://{ACL_USER}:{PASSWORD}@127.0.0.1:{}/",
        tower_window_tests::redis_server::closed_port()
    );
    let store = RedisStore::cluster([url]).unwrap();
    drive(store, "refused-cluster", Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_logs_no_secret() {
    let server = RedisServer::start();
    let mut admin = server.async_connection().await;
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg(PASSWORD)
        .query_async(&mut admin)
        .await
        .unwrap();
    let url = format!("redis://:{PASSWORD}@127.0.0.1:{}/", server.port());
    let store = RedisStore::from_url(&url).unwrap();
    // Connected and scripts loaded first: the budget below is the fault's.
    store.connect().await.unwrap();
    let () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(30_000)
        .arg("WRITE")
        .query_async(&mut admin)
        .await
        .unwrap();
    let scenario = drive(store, "timeout", Duration::from_millis(20)).await;
    let () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert!(
        scenario.iter().any(|(_, l)| l.contains("timeout")),
        "{scenario:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_and_wrong_password_log_no_secret() {
    let server = RedisServer::start();
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg(PASSWORD)
        .query(&mut server.connection())
        .unwrap();
    let port = server.port();
    let none = RedisStore::from_url(&format!("redis://127.0.0.1:{port}/")).unwrap();
    drive(none, "no-password", Duration::from_secs(2)).await;
    let wrong =
        RedisStore::from_url(&format!("redis://:{WRONG_PASSWORD}@127.0.0.1:{port}/")).unwrap();
    drive(wrong, "wrong-password", Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_denied_keys_log_no_secret() {
    let server = RedisServer::start();
    let () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(ACL_USER)
        .arg("on")
        .arg(format!(">{ACL_PASSWORD}"))
        .arg("~elsewhere:*")
        .arg("+@all")
        .query(&mut server.connection())
        .unwrap();
    let url = format!(
        "redis://{ACL_USER}:{ACL_PASSWORD}@127.0.0.1:{}/",
        server.port()
    );
    let store = RedisStore::builder()
        .url(&url)
        .prefix("acl-denied:")
        .build()
        .unwrap();
    drive(store, "acl-denied", Duration::from_secs(2)).await;
    let wrong = format!(
        "redis://{ACL_USER}:{WRONG_PASSWORD}@127.0.0.1:{}/",
        server.port()
    );
    drive(
        RedisStore::from_url(&wrong).unwrap(),
        "acl-wrong-password",
        Duration::from_secs(2),
    )
    .await;
}

/// A cluster whose nodes require a password the URLs do not have.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_wrong_password_logs_no_secret() {
    let cluster = RedisCluster::start();
    for node in cluster.nodes() {
        let () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("requirepass")
            .arg(PASSWORD)
            .query(&mut node.connection())
            .unwrap();
    }
    let urls: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|n| format!("redis://:{WRONG_PASSWORD}@127.0.0.1:{}/", n.port()))
        .collect();
    drive(
        RedisStore::cluster(urls).unwrap(),
        "cluster-wrong-password",
        Duration::from_secs(2),
    )
    .await;
}
