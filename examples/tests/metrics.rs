//! The gateway's `GET /metrics` holds every metric the Grafana dashboard in
//! `examples/grafana/tower-window.json` queries.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use clap::Parser;
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;
use tower_window::fallback::FailOpen;
use tower_window::{
    BreakerConfig, Limiter, ManualClock, MemoryStore, Quota, RetryConfig, Store, WindowKey,
};
use tower_window_examples::gateway::metrics::install_recorder;
use tower_window_examples::gateway::{build_app, Args, GatewayConfig};
use tower_window_tests::redis_server::closed_port;

const DASHBOARD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/grafana/tower-window.json");

fn hello(user: &str) -> Request<Body> {
    Request::get("/api/hello")
        .header("x-user-id", user)
        .body(Body::empty())
        .unwrap()
}

async fn text(app: &Router, path: &str) -> (StatusCode, Option<String>, String) {
    let response = app
        .clone()
        .oneshot(Request::get(path).body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let content_type = response
        .headers()
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap().to_owned());
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        content_type,
        String::from_utf8(body.to_vec()).unwrap(),
    )
}

/// Every `expr` string anywhere in the dashboard.
fn exprs(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("expr", Value::String(expr)) => out.push(expr.clone()),
                    _ => exprs(value, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| exprs(v, out)),
        _ => {}
    }
}

/// The `tower_window_*` identifiers in a PromQL expression.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(start) = rest.find("tower_window_") {
        let tail = &rest[start..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(tail.len());
        names.push(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names
}

/// A scrape: sample names (as written on sample lines) and `# TYPE`s.
struct Scrape {
    samples: BTreeSet<String>,
    types: Vec<(String, String)>,
}

impl Scrape {
    fn parse(text: &str) -> Self {
        let mut samples = BTreeSet::new();
        let mut types = Vec::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut parts = rest.split_whitespace();
                if let (Some(name), Some(kind)) = (parts.next(), parts.next()) {
                    types.push((name.to_owned(), kind.to_owned()));
                }
            } else if !line.starts_with('#') && !line.trim().is_empty() {
                let end = line.find(['{', ' ']).unwrap_or(line.len());
                samples.insert(line[..end].to_owned());
            }
        }
        Self { samples, types }
    }

    fn kind(&self, family: &str) -> Option<&str> {
        self.types
            .iter()
            .find(|(name, _)| name == family)
            .map(|(_, kind)| kind.as_str())
    }

    /// The family a dashboard name belongs to: itself, or for a histogram's
    /// `_bucket` / `_sum` / `_count` series the histogram.
    fn family<'a>(&self, name: &'a str) -> &'a str {
        for suffix in ["_bucket", "_sum", "_count"] {
            if let Some(base) = name.strip_suffix(suffix) {
                if self.kind(base) == Some("histogram") {
                    return base;
                }
            }
        }
        name
    }
}

#[tokio::test]
async fn scrape_holds_every_metric_the_dashboard_queries() {
    // Gateway traffic on the embedded store: admissions, then denials.
    let store = MemoryStore::builder()
        .clock(ManualClock::new(1_700_000_000_000_000))
        .build();
    let app = build_app(GatewayConfig::with_store(
        "3/1m".parse::<Quota>().unwrap(),
        store,
    ));
    let mut statuses = Vec::new();
    for _ in 0..5 {
        let response = app.clone().oneshot(hello("alice")).await.unwrap();
        statuses.push(response.status());
    }
    assert_eq!(statuses.iter().filter(|s| **s == StatusCode::OK).count(), 3);
    assert_eq!(
        statuses
            .iter()
            .filter(|s| **s == StatusCode::TOO_MANY_REQUESTS)
            .count(),
        2
    );

    // A gateway whose Redis is a closed loopback port: store errors, and
    // with `--fallback fail-closed` a degraded 503.
    let url = format!("redis://127.0.0.1:{}", closed_port());
    let args = Args::try_parse_from([
        "gateway",
        "--limit",
        "3/1m",
        "--redis-url",
        &url,
        "--fallback",
        "fail-closed",
    ])
    .unwrap();
    let broken = build_app(args.into_config().unwrap());
    let response = broken.clone().oneshot(hello("alice")).await.unwrap();
    assert!(response.status().is_server_error(), "{}", response.status());

    // Limiters in the same process, recording into the recorder the gateway
    // installed, fill in the other series with exact counts. One on the
    // embedded store: admissions, a store denial, then local-tier hits.
    let quota = "3/1m".parse::<Quota>().unwrap().named("resilient").unwrap();
    let resilient = Limiter::builder(MemoryStore::new(), quota.clone())
        .fallback(FailOpen::new())
        .build();
    let key = WindowKey::for_subject("bob");
    let mut allowed = 0;
    for _ in 0..5 {
        allowed += u32::from(resilient.check(&key, 1).await.unwrap().allowed());
    }
    assert_eq!(allowed, 3);
    // One with quota leases: leased units granted and spent (every key
    // leases from its first check, so six checks are enough).
    let leased = Limiter::builder(
        MemoryStore::new(),
        "100/1m".parse::<Quota>().unwrap().named("leased").unwrap(),
    )
    .leases(tower_window::LeaseConfig::new(4).hot_after(1))
    .build();
    for _ in 0..6 {
        assert!(leased.check(&key, 1).await.unwrap().allowed());
    }
    leased.refund_leases().await;
    // A shadow quota that would deny: admitted, counted as a shadow denial.
    let shadowed = Limiter::new(
        MemoryStore::new(),
        "1/1m"
            .parse::<Quota>()
            .unwrap()
            .named("trial")
            .unwrap()
            .shadowed(true),
    );
    for _ in 0..2 {
        assert!(shadowed.check(&key, 1).await.unwrap().allowed());
    }
    // A tenants file that cannot be reloaded: refused and counted.
    let dir = tempfile::tempdir().unwrap();
    let tenants_path = dir.path().join("tenants.toml");
    std::fs::write(
        &tenants_path,
        "[tenants.acme]\nquotas = { minute = \"not a quota\" }\n",
    )
    .unwrap();
    let registry =
        tower_window::tenant::TenantRegistry::new(tower_window::tenant::TenantsConfig::new());
    tower_window_examples::gateway::tenants::reload(&registry, &tenants_path, &mut None);
    // Connection seats and dedup on the embedded store: a grant, a
    // heartbeat tick, a release, and a first and repeated message id.
    {
        let store = Store::from(MemoryStore::new());
        let connections = tower_window::ConnectionLimiter::builder(store.clone())
            .max_per_subject(2)
            .build()
            .unwrap();
        let tower_window::conn::Acquire::Granted(lease) = connections.acquire(&key).await.unwrap()
        else {
            panic!("the first connection is granted");
        };
        let report = connections.heartbeat().await;
        assert_eq!(report.lost, 0);
        lease.release().await.unwrap();
        let dedup = tower_window::DedupWindow::builder(store).build().unwrap();
        assert!(dedup.first_seen(&key, b"m1").await.unwrap());
        assert!(!dedup.first_seen(&key, b"m1").await.unwrap());
    }
    // One on the unreachable Redis: a store error opens the breaker, then
    // fail-open admits without the store.
    let broken_store_limiter = {
        let redis = tower_window::RedisStore::from_url(&url).unwrap();
        let store = Store::builder(redis)
            .retry(RetryConfig::none())
            .timeout(Duration::from_secs(5))
            .breaker(
                BreakerConfig::default()
                    .consecutive_failures(1)
                    .cooldown(Duration::from_secs(3600)),
            )
            .build();
        Limiter::builder(store, quota.named("degraded-redis").unwrap())
            .fallback(FailOpen::new())
            .build()
    };
    for _ in 0..3 {
        let decision = broken_store_limiter.check(&key, 1).await.unwrap();
        assert!(decision.allowed() && decision.is_degraded());
    }

    let (status, content_type, body) = text(&app, "/metrics").await;
    assert_eq!(status, StatusCode::OK);
    assert!(content_type.unwrap().starts_with("text/plain"));
    assert!(!body.contains("alice") && !body.contains("bob"), "{body}");
    let scrape = Scrape::parse(&body);

    // Every metric the dashboard queries is in the scrape.
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(DASHBOARD).unwrap()).unwrap();
    let mut all = Vec::new();
    exprs(&dashboard, &mut all);
    // The rls row: series only the rls records (tests/rls.rs).
    all.retain(|e| !e.contains("tower_window_rls_"));
    assert!(all.len() >= 10, "{all:?}");
    let mut used = BTreeSet::new();
    for expr in &all {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "no metric in {expr}");
        used.extend(names);
    }
    let missing: Vec<_> = used
        .iter()
        .filter(|name| !scrape.samples.contains(name.as_str()))
        .collect();
    assert!(missing.is_empty(), "missing {missing:?} in\n{body}");
    // The latency panel uses a real histogram, not a summary.
    assert_eq!(
        scrape.kind("tower_window_store_call_duration_seconds"),
        Some("histogram")
    );
    assert_eq!(
        scrape.family("tower_window_store_call_duration_seconds_bucket"),
        "tower_window_store_call_duration_seconds"
    );

    // And the dashboard covers every metric tower-window records.
    let families: BTreeSet<_> = used.iter().map(|n| scrape.family(n)).collect();
    for name in tower_window::metrics::ALL {
        assert!(families.contains(name), "no panel queries {name}");
    }

    // Store errors by kind and the breaker came from the broken Redis.
    assert!(body
        .lines()
        .any(|l| l.starts_with("tower_window_store_errors_total{")
            && l.contains("kind=\"unavailable\"")
            && l.contains("quota=\"degraded-redis\"")
            && !l.ends_with(" 0")));
    assert!(body
        .lines()
        .any(|l| l.starts_with("tower_window_breaker_state{")
            && l.contains("quota=\"degraded-redis\"")
            && l.ends_with(" 2")));
    assert!(body
        .lines()
        .any(|l| l.starts_with("tower_window_fallback_admissions_total{")
            && l.contains("reason=\"circuit_open\"")
            && l.ends_with(" 2")));
}

#[tokio::test]
async fn install_recorder_is_idempotent_and_metrics_is_not_limited() {
    let first = install_recorder();
    let second = install_recorder();
    let app = build_app(GatewayConfig::new("1/1h".parse::<Quota>().unwrap()));
    // A decision the recorder sees, under a subject no other test uses.
    let response = app
        .clone()
        .oneshot(hello("idempotent-recorder"))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    for _ in 0..3 {
        let (status, _, body) = text(&app, "/metrics").await;
        assert_eq!(status, StatusCode::OK, "/metrics was rate limited");
        assert!(body.contains("tower_window_"), "{body}");
    }
    // Both handles render one registry (a second install did not replace
    // the recorder with an empty one): the decision shows in each.
    for handle in [&first, &second] {
        let page = handle.render();
        assert!(
            page.lines()
                .any(|l| l.starts_with("tower_window_decisions_total{")),
            "{page}"
        );
    }
}

// ---------------------------------------------------------------------------
// A fresh gateway process: every series the dashboard charts is exported
// from the start, at zero, so no panel of a new node says "No data".
// ---------------------------------------------------------------------------

mod support;

use std::collections::BTreeMap;

use support::{http_get, GatewayProcess};
use tower_window_tests::redis_server::RedisServer;

/// A tenants file with a shadow quota and a tenant-scoped one, as
/// `examples/tenants.toml` has.
const TENANTS: &str = r#"
[default]
quotas = { minute = "60/1m" }

[tenants.acme]
quotas = { burst = "10/1s", org = { limit = "5000/1m", scope = "tenant" } }

[tenants.trial]
quotas = { minute = "5/1m" }
shadow = ["minute"]
"#;

/// One sample line of a Prometheus text page: name and labels.
#[derive(Debug)]
struct Series {
    name: String,
    labels: BTreeMap<String, String>,
}

/// The sample lines of a scrape (comments skipped).
fn series(text: &str) -> Vec<Series> {
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let end = line.find(['{', ' ']).unwrap_or(line.len());
        let name = line[..end].to_owned();
        let mut labels = BTreeMap::new();
        if line[end..].starts_with('{') {
            let close = line.rfind('}').unwrap();
            labels = parse_labels(&line[end + 1..close]);
        }
        out.push(Series { name, labels });
    }
    out
}

/// `k="v",k2="v2"` (values with `\"` and `\\` escapes) as a map; also
/// reads PromQL matchers, returning `k` → `(op, value)` through
/// [`matchers`].
fn parse_labels(text: &str) -> BTreeMap<String, String> {
    matchers(text).into_iter().map(|(k, _, v)| (k, v)).collect()
}

/// A label matcher: the label, the operator, the quoted value.
type Matcher = (String, String, String);

/// The `name op "value"` pairs of a label list (`=`, `!=`, `=~`, `!~`).
fn matchers(text: &str) -> Vec<Matcher> {
    let mut out = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        let op_start = rest.find(['=', '!']).unwrap();
        let key = rest[..op_start].trim().to_owned();
        let after = &rest[op_start..];
        let op_len =
            if after.starts_with("=~") || after.starts_with("!=") || after.starts_with("!~") {
                2
            } else {
                1
            };
        let op = after[..op_len].to_owned();
        let after = after[op_len..].trim_start();
        assert!(after.starts_with('"'), "unquoted label value in {text}");
        let mut value = String::new();
        let mut chars = after[1..].char_indices();
        let mut consumed = 0;
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, next)) = chars.next() {
                        value.push(match next {
                            'n' => '\n',
                            other => other,
                        });
                    }
                }
                '"' => {
                    consumed = i + 2;
                    break;
                }
                other => value.push(other),
            }
        }
        out.push((key, op, value));
        rest = after[consumed..]
            .trim_start()
            .trim_start_matches(',')
            .trim_start();
    }
    out
}

/// Every `tower_window_*` selector of every dashboard query: the metric
/// name and its label matchers.
fn dashboard_selectors() -> Vec<(String, Vec<Matcher>)> {
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(DASHBOARD).unwrap()).unwrap();
    let mut all = Vec::new();
    exprs(&dashboard, &mut all);
    let mut selectors = Vec::new();
    for expr in &all {
        let mut rest = expr.as_str();
        while let Some(start) = rest.find("tower_window_") {
            let tail = &rest[start..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(tail.len());
            let name = tail[..end].to_owned();
            let mut found = Vec::new();
            if tail[end..].starts_with('{') {
                let close = tail[end..].find('}').unwrap() + end;
                found = matchers(&tail[end + 1..close]);
                rest = &tail[close..];
            } else {
                rest = &tail[end..];
            }
            // The rls row: series only the rls records (tests/rls.rs).
            if !name.starts_with("tower_window_rls_") {
                selectors.push((name, found));
            }
        }
    }
    assert!(selectors.len() >= 30, "{selectors:?}");
    selectors
}

/// Whether a label value satisfies a dashboard matcher, with the
/// dashboard's variables at their defaults (`$quota`: All; `$message_quota`:
/// `.*(message|byte).*`).
fn satisfies(op: &str, pattern: &str, value: Option<&String>) -> bool {
    match (op, pattern) {
        ("=", _) => value.map(String::as_str) == Some(pattern),
        ("=~", "$quota") => true,
        ("=~", "$message_quota") => {
            value.is_some_and(|v| v.contains("message") || v.contains("byte"))
        }
        _ => panic!("extend the test for the matcher {op}{pattern:?}"),
    }
}

/// The dashboard selectors no series of `scrape` satisfies: the panels
/// that would say "No data".
fn missing_selectors(scrape: &str) -> Vec<String> {
    let series = series(scrape);
    let mut missing = BTreeSet::new();
    for (name, matchers) in dashboard_selectors() {
        let found = series.iter().any(|s| {
            s.name == name
                && matchers
                    .iter()
                    .all(|(key, op, pattern)| satisfies(op, pattern, s.labels.get(key)))
        });
        if !found {
            let shown: Vec<String> = matchers
                .iter()
                .map(|(k, op, v)| format!("{k}{op}{v:?}"))
                .collect();
            missing.insert(if shown.is_empty() {
                name
            } else {
                format!("{name}{{{}}}", shown.join(","))
            });
        }
    }
    missing.into_iter().collect()
}

/// `GET /metrics` of a gateway process: the body.
fn scrape_process(gateway: &GatewayProcess) -> String {
    let port: u16 = gateway.url().rsplit(':').next().unwrap().parse().unwrap();
    let response = http_get(port, "/metrics").unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    response.split_once("\r\n\r\n").unwrap().1.to_owned()
}

/// A gateway with every feature the dashboard has a row for, on `store`
/// flags, fresh: nothing but `/healthz` (the start-up probe) was asked.
fn fresh_gateway(store: &[&str], dir: &tempfile::TempDir) -> GatewayProcess {
    let tenants = dir.path().join("tenants.toml");
    std::fs::write(&tenants, TENANTS).unwrap();
    let mut flags = vec![
        "--tenants",
        tenants.to_str().unwrap(),
        "--admin-token",
        "fresh-token",
        "--message-limit",
        "10/10s",
        "--byte-limit",
        "65536/10s",
        "--lease",
        "4",
    ];
    flags.extend_from_slice(store);
    GatewayProcess::start(&flags)
}

fn assert_fresh_scrape_is_complete(store: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let gateway = fresh_gateway(store, &dir);
    let body = scrape_process(&gateway);
    let missing = missing_selectors(&body);
    assert!(
        missing.is_empty(),
        "a fresh gateway ({store:?}) exports no series for {} dashboard selectors: {missing:#?}\n{body}",
        missing.len()
    );
    // Nothing was decided yet: every decision series is at zero.
    let decisions: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with("tower_window_decisions_total{"))
        .collect();
    assert!(!decisions.is_empty());
    for line in decisions {
        assert!(line.ends_with(" 0"), "not zero on a fresh gateway: {line}");
    }
    assert!(!gateway.log().contains("panicked"), "{}", gateway.log());
}

#[test]
fn fresh_gateway_exports_every_dashboard_series_at_zero_on_the_embedded_store() {
    assert_fresh_scrape_is_complete(&[]);
}

#[test]
fn fresh_gateway_exports_every_dashboard_series_at_zero_on_redis() {
    let redis = RedisServer::start();
    let url = redis.url();
    assert_fresh_scrape_is_complete(&["--redis-url", &url]);
}

#[test]
fn fresh_gateway_with_default_flags_exports_every_dashboard_metric() {
    // No tenants, no message quotas: the names are there all the same
    // (the message-quota panels filter on quotas this node does not have).
    let gateway = GatewayProcess::start(&[]);
    let body = scrape_process(&gateway);
    let scrape = Scrape::parse(&body);
    let missing: Vec<String> = dashboard_selectors()
        .into_iter()
        .map(|(name, _)| name)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .filter(|name| !scrape.samples.contains(name))
        .collect();
    assert!(missing.is_empty(), "missing {missing:#?}\n{body}");
}
