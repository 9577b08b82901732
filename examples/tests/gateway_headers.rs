//! What the built gateway's rate-limit headers and problem bodies say
//! (issue 26), black box: a shadow quota is never advertised as spent in
//! `RateLimit` (tenant `trial` of `examples/tenants.toml`), and a 429's
//! problem body names the policy and the deciding quota.
#![allow(clippy::unwrap_used)]

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::Value;
use support::GatewayProcess;

/// A response: its status line, its headers (names lower-case), its body.
struct Answer {
    status: String,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// `GET /api/hello` as `tenant`/`user`, on a fresh connection (bounded).
fn hello(gateway: &GatewayProcess, tenant: Option<&str>, user: &str) -> Answer {
    let addr = gateway.url().trim_start_matches("http://").to_owned();
    let mut stream = TcpStream::connect(&addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let tenant = tenant.map_or(String::new(), |t| format!("x-tenant-id: {t}\r\n"));
    write!(
        stream,
        "GET /api/hello HTTP/1.1\r\nhost: 127.0.0.1\r\n{tenant}x-user-id: {user}\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap().to_owned();
    let headers = lines
        .map(|line| {
            let (name, value) = line.split_once(':').unwrap();
            (name.trim().to_ascii_lowercase(), value.trim().to_owned())
        })
        .collect();
    Answer {
        status,
        headers,
        body: body.to_owned(),
    }
}

fn tenants_file() -> String {
    format!("{}/tenants.toml", env!("CARGO_MANIFEST_DIR"))
}

/// Issue 26, bug 3: tenant `trial` (its only quota, `minute = 5/1m`, in
/// shadow) keeps admitting past 5 and never says `RateLimit: r=0`; its
/// quota stays visible in `RateLimit-Policy` with the marker. `acme`
/// (enforced quotas) still gets `RateLimit`.
#[test]
fn a_shadow_quota_is_never_advertised_as_spent() {
    let gateway = GatewayProcess::start(&["--tenants", &tenants_file()]);
    for n in 1..=7 {
        let answer = hello(&gateway, Some("trial"), "tia");
        assert_eq!(answer.status, "HTTP/1.1 200 OK", "request {n}");
        assert_eq!(
            answer.header("ratelimit-policy"),
            Some(r#""minute";q=5;w=60;shadow"#),
            "request {n}"
        );
        assert_eq!(
            answer.header("ratelimit"),
            None,
            "request {n} advertises a shadow quota: {:?}",
            answer.headers
        );
    }
    let acme = hello(&gateway, Some("acme"), "al");
    assert_eq!(acme.status, "HTTP/1.1 200 OK");
    assert_eq!(
        acme.header("ratelimit-policy"),
        Some(r#""burst";q=10;w=1, "sustained";q=1000;w=3600"#)
    );
    assert!(
        acme.header("ratelimit")
            .is_some_and(|v| v.starts_with(r#""burst";r=9;"#)),
        "{:?}",
        acme.headers
    );
}

/// Issue 26: the 429 body's `policy` is the policy's name (the gateway's
/// `--limit`s form the policy `gateway`; a tenant's is named after the
/// tenant) and `quota` the deciding quota's; `definition` is its DSL.
#[test]
fn a_problem_body_names_the_policy_and_the_deciding_quota() {
    let gateway = GatewayProcess::start(&["--limit", "burst=1/1h", "--limit", "sustained=100/1m"]);
    assert_eq!(hello(&gateway, None, "bo").status, "HTTP/1.1 200 OK");
    let denied = hello(&gateway, None, "bo");
    assert_eq!(denied.status, "HTTP/1.1 429 Too Many Requests");
    let problem: Value = serde_json::from_str(&denied.body).unwrap();
    assert_eq!(problem["policy"], "gateway", "{problem}");
    assert_eq!(problem["quota"], "burst", "{problem}");
    assert_eq!(problem["definition"], "1/1h", "{problem}");

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tenants.toml");
    std::fs::write(
        &file,
        "[tenants.slowco]\nquotas = { hourly = \"1/1h\", daily = \"100/1d\" }\n",
    )
    .unwrap();
    let gateway = GatewayProcess::start(&["--tenants", file.to_str().unwrap()]);
    assert_eq!(
        hello(&gateway, Some("slowco"), "bo").status,
        "HTTP/1.1 200 OK"
    );
    let denied = hello(&gateway, Some("slowco"), "bo");
    assert_eq!(denied.status, "HTTP/1.1 429 Too Many Requests");
    let problem: Value = serde_json::from_str(&denied.body).unwrap();
    assert_eq!(problem["policy"], "slowco", "{problem}");
    assert_eq!(problem["quota"], "hourly", "{problem}");
    assert_eq!(problem["definition"], "1/1h", "{problem}");
}
