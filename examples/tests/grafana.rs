//! `examples/grafana/`: the dashboard's queries are valid PromQL (promtool),
//! the scrape config and provisioning files fit together, and a real
//! Prometheus scraping a real gateway process runs every query.
//!
//! Needs `promtool` and `prometheus` (Debian package `prometheus`; `.ci/test`
//! installs it); without them the tests fail and say so.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use tower_window_tests::redis_server::reserve_port;

mod support;

use support::{http_get, run_bounded, GatewayProcess};

fn grafana_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("grafana")
}

fn require(program: &str) {
    let found = Command::new(program)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "`{program}` is not on PATH: install Debian's `prometheus` package \
         (apt-get install -y prometheus; .ci/test does)"
    );
}

/// Every `expr` in the dashboard, with Grafana's variables replaced by
/// values Prometheus accepts.
fn dashboard_queries() -> Vec<String> {
    fn walk(value: &Value, out: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                for (key, value) in map {
                    match (key.as_str(), value) {
                        ("expr", Value::String(expr)) => out.push(expr.clone()),
                        _ => walk(value, out),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let text = std::fs::read_to_string(grafana_dir().join("tower-window.json")).unwrap();
    let dashboard: Value = serde_json::from_str(&text).unwrap();
    let mut exprs = Vec::new();
    walk(&dashboard, &mut exprs);
    assert!(exprs.len() >= 20, "{exprs:?}");
    exprs
        .iter()
        .map(|e| {
            e.replace("$__rate_interval", "1m")
                .replace("$__range", "5m")
                .replace("$message_quota", ".*(message|byte).*")
                .replace("$quota", ".*")
        })
        .inspect(|e| assert!(!e.contains('$'), "unknown variable in {e}"))
        .collect()
}

/// The dashboard's queries but the rls row's (`tower_window_rls_*`, series
/// only the rls records).
fn gateway_queries() -> Vec<String> {
    dashboard_queries()
        .into_iter()
        .filter(|e| !e.contains("tower_window_rls_"))
        .collect()
}

#[test]
fn dashboard_queries_parse_and_the_configs_are_valid() {
    require("promtool");
    let queries = dashboard_queries();
    // Each query as a recording rule: `promtool check rules` parses them
    // (JSON is YAML).
    let rules: Vec<Value> = queries
        .iter()
        .enumerate()
        .map(
            |(i, expr)| serde_json::json!({"record": format!("dashboard:query_{i}"), "expr": expr}),
        )
        .collect();
    let file = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("dashboard-rules-{}.yml", std::process::id()));
    let rules = serde_json::json!({"groups": [{"name": "dashboard", "rules": rules}]});
    std::fs::write(&file, rules.to_string()).unwrap();
    let output = run_bounded(
        Command::new("promtool").args(["check", "rules"]).arg(&file),
        Duration::from_secs(60),
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}{stderr}");
    assert!(
        stdout.contains(&format!("SUCCESS: {} rules found", queries.len())),
        "{stdout}"
    );
    let _ = std::fs::remove_file(&file);

    let output = run_bounded(
        Command::new("promtool")
            .args(["check", "config"])
            .arg(grafana_dir().join("prometheus.yml")),
        Duration::from_secs(60),
    );
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );

    // The scrape config targets the gateways of examples/cluster/run.sh.
    let prometheus = std::fs::read_to_string(grafana_dir().join("prometheus.yml")).unwrap();
    let script = std::fs::read_to_string(grafana_dir().join("../cluster/run.sh")).unwrap();
    for port in ["3001", "3002", "3003"] {
        assert!(prometheus.contains(&format!("127.0.0.1:{port}")), "{port}");
        assert!(script.contains(port), "{port}");
    }
    // The data source is the Prometheus the docs start, by the uid-free
    // `${datasource}` variable's default; the dashboard provider reads
    // the folder holding the dashboard.
    let datasource =
        std::fs::read_to_string(grafana_dir().join("provisioning/datasources/prometheus.yaml"))
            .unwrap();
    assert!(datasource.contains("type: prometheus"));
    assert!(datasource.contains("url: http://127.0.0.1:9090"));
    assert!(datasource.contains("isDefault: true"));
    let provider =
        std::fs::read_to_string(grafana_dir().join("provisioning/dashboards/tower-window.yaml"))
            .unwrap();
    assert!(provider.contains("type: file"));
    assert!(provider.contains("path: ${TW_GRAFANA_DIR}"));
    assert!(grafana_dir().join("tower-window.json").exists());
}

/// `promtool query instant` against `url`: stdout, or the failure.
fn query(url: &str, expr: &str) -> Result<String, String> {
    let output = run_bounded(
        Command::new("promtool").args(["query", "instant", url, expr]),
        Duration::from_secs(30),
    );
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if output.status.success() {
        Ok(stdout)
    } else {
        Err(format!(
            "{stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

/// A `prometheus` process; killed on drop.
struct Prometheus(std::process::Child);

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A real Prometheus scraping the gateway on `port` every second with the
/// shipped config, once it holds `ready` (a query with a result); its URL
/// and data folder (removed by the caller).
fn prometheus_for(port: u16, ready: &str) -> (Prometheus, String, PathBuf) {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("prometheus-{}-{port}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // The shipped config, scraping this gateway every second.
    let shipped = std::fs::read_to_string(grafana_dir().join("prometheus.yml")).unwrap();
    let config = shipped
        .replace("scrape_interval: 5s", "scrape_interval: 1s")
        .replace(
            "          - 127.0.0.1:3001\n          - 127.0.0.1:3002\n          - 127.0.0.1:3003\n",
            &format!("          - 127.0.0.1:{port}\n"),
        );
    assert_ne!(config, shipped);
    std::fs::write(dir.join("prometheus.yml"), &config).unwrap();
    let web = reserve_port();
    let url = format!("http://127.0.0.1:{web}");
    let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    let prometheus = Prometheus(
        Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{web}"))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );

    // Wait (bounded) until `ready` has a result.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let answer = query(&url, ready);
        if answer.as_ref().is_ok_and(|a| a.contains("=>")) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no scrape in 60 s: {answer:?}\n{}",
            std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    (prometheus, url, dir)
}

#[test]
fn real_prometheus_scrapes_a_gateway_and_runs_every_dashboard_query() {
    require("promtool");
    require("prometheus");
    let gateway = GatewayProcess::start(&["--limit", "3/1m"]);
    let port: u16 = gateway.url().rsplit(':').next().unwrap().parse().unwrap();
    // Admissions and denials, so the decision series exist.
    for _ in 0..5 {
        assert!(http_get(port, "/api/hello").is_some());
    }

    let (_prometheus, url, dir) = prometheus_for(port, "tower_window_decisions_total");
    let up = query(&url, "up").unwrap();
    assert!(up.contains("=> 1 @"), "{up}");

    // Every dashboard query runs against the real data without an error.
    for expr in dashboard_queries() {
        if let Err(error) = query(&url, &expr) {
            panic!("{expr}: {error}");
        }
    }
    let per_node = query(
        &url,
        "sum by (instance) (tower_window_decisions_total{outcome=\"denied\"})",
    )
    .unwrap();
    assert!(
        per_node.contains(&format!("instance=\"127.0.0.1:{port}\"")),
        "{per_node}"
    );
    drop(gateway);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn real_prometheus_charts_every_dashboard_query_of_a_fresh_gateway() {
    require("promtool");
    require("prometheus");
    // Every row's feature on, and nothing asked of the gateway: a fresh
    // node's dashboard must chart zeros, not "No data".
    let tenants = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("fresh-tenants-{}.toml", std::process::id()));
    std::fs::write(
        &tenants,
        "[default]\nquotas = { minute = \"60/1m\" }\n\n[tenants.trial]\nquotas = { minute = \"5/1m\" }\nshadow = [\"minute\"]\n",
    )
    .unwrap();
    let gateway = GatewayProcess::start(&[
        "--tenants",
        tenants.to_str().unwrap(),
        "--message-limit",
        "10/10s",
        "--byte-limit",
        "65536/10s",
    ]);
    let port: u16 = gateway.url().rsplit(':').next().unwrap().parse().unwrap();
    // `rate()` needs two samples in its window: wait for three scrapes.
    let (_prometheus, url, dir) = prometheus_for(port, "count_over_time(up[1m]) >= 3");
    let mut empty = Vec::new();
    // The rls row charts the rls's own series, which a gateway does not
    // record (tests/rls.rs checks a fresh rls exports them).
    for expr in gateway_queries() {
        let answer = query(&url, &expr).unwrap_or_else(|e| panic!("{expr}: {e}"));
        if !answer.contains("=>") {
            empty.push(expr);
        }
    }
    assert!(
        empty.is_empty(),
        "{} dashboard queries have no data on a fresh gateway: {empty:#?}",
        empty.len()
    );
    drop(gateway);
    let _ = std::fs::remove_file(&tenants);
    let _ = std::fs::remove_dir_all(&dir);
}
