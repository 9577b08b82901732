//! The gateway's audit trail (`--audit`), on the embedded store and on a
//! real `redis-server`: denials of two users and a shadow denial, read back
//! through the admin route `GET /admin/tenants/{tenant}/audit` with every
//! filter and page by page, and the demo page's last denials in
//! `GET /api/quota`. Also: the route's 404 without `--audit`, its 503 when
//! Redis is gone, and `--help` listing the flags.
#![allow(clippy::unwrap_used)]

use std::process::Command;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use clap::Parser;
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;
use tower_window_examples::gateway::{build_gateway, Args, Gateway};
use tower_window_tests::redis_server::RedisServer;

const TOKEN: &str = "s3cret";

/// `acme`: two requests per user per hour, and a shadow quota of three
/// requests per hour for the whole tenant (it only reports).
const TENANTS: &str = r#"
[tenants.acme]
quotas = { burst = "2/1h", preview = { limit = "3/1h", scope = "tenant" } }
shadow = ["preview"]

[tenants.other]
quotas = { burst = "100/1h" }
"#;

/// A gateway with `flags` after `--tenants`, `--admin-token` and a long
/// Redis time budget (the test is about the log, not the budget).
fn gateway(dir: &tempfile::TempDir, flags: &[&str]) -> Gateway {
    let file = dir.path().join("tenants.toml");
    std::fs::write(&file, TENANTS).unwrap();
    let mut argv = vec![
        "gateway",
        "--tenants",
        file.to_str().unwrap(),
        "--admin-token",
        TOKEN,
        "--redis-timeout-ms",
        "5000",
    ];
    argv.extend_from_slice(flags);
    build_gateway(Args::try_parse_from(argv).unwrap().into_config().unwrap())
}

async fn hello(app: &Router, tenant: &str, user: &str) -> StatusCode {
    let request = Request::get("/api/hello")
        .header("x-tenant-id", tenant)
        .header("x-user-id", user)
        .body(Body::empty())
        .unwrap();
    app.clone().oneshot(request).await.unwrap().status()
}

async fn get_json(app: &Router, uri: &str, token: Option<&str>) -> (StatusCode, Value) {
    let mut request = Request::get(uri);
    if let Some(token) = token {
        request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let response = app
        .clone()
        .oneshot(request.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// One record as `(subject, outcome, quota, at_micros)`.
type Row = (String, String, String, u64);

fn rows(body: &Value) -> Vec<Row> {
    body["records"]
        .as_array()
        .unwrap_or_else(|| panic!("no records: {body}"))
        .iter()
        .map(|r| {
            (
                r["subject"].as_str().unwrap().to_owned(),
                r["outcome"].as_str().unwrap().to_owned(),
                r["quota"].as_str().unwrap().to_owned(),
                r["at_micros"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn who(rows: &[Row]) -> Vec<(&str, &str)> {
    rows.iter()
        .map(|(s, o, _, _)| (s.as_str(), o.as_str()))
        .collect()
}

/// Every page of `query` (without `before`), following `next`.
async fn pages(app: &Router, query: &str) -> Vec<Vec<Row>> {
    let mut pages = Vec::new();
    let mut uri = format!("/admin/tenants/acme/audit?{query}");
    loop {
        let (status, body) = get_json(app, &uri, Some(TOKEN)).await;
        assert_eq!(status, StatusCode::OK, "{uri}: {body}");
        pages.push(rows(&body));
        let Some(next) = body["next"].as_str() else {
            return pages;
        };
        assert!(pages.len() < 10, "{query}: too many pages");
        uri = format!("/admin/tenants/acme/audit?{query}&before={next}");
    }
}

/// Denials of alice and bob and one shadow denial, then every filter of
/// the admin route and the demo's last denials.
async fn denials_read_back(gateway: Gateway) {
    let app = gateway.router;
    // preview (tenant-wide, shadow) reaches 3 on bob's first request, so
    // bob's second is admitted and shadow-denied; then burst (2 per user)
    // denies every further request.
    use StatusCode as S;
    for (user, status) in [
        ("alice", S::OK),
        ("alice", S::OK),
        ("bob", S::OK),
        ("bob", S::OK),
        ("alice", S::TOO_MANY_REQUESTS),
        ("bob", S::TOO_MANY_REQUESTS),
        ("alice", S::TOO_MANY_REQUESTS),
        ("alice", S::TOO_MANY_REQUESTS),
        ("bob", S::TOO_MANY_REQUESTS),
    ] {
        assert_eq!(hello(&app, "acme", user).await, status, "{user}");
    }
    // Another tenant's admissions are not recorded (no sampling).
    assert_eq!(hello(&app, "other", "alice").await, S::OK);
    // Written now rather than at the writer's next round.
    let log = gateway.limiter.audit().expect("--audit");
    assert!(log.flush().await);

    // Everything, newest first: the decisions (an admin change the
    // registry may record is left out of this count).
    let (status, body) = get_json(&app, "/admin/tenants/acme/audit", Some(TOKEN)).await;
    assert_eq!(status, S::OK, "{body}");
    assert_eq!(body["next"], Value::Null, "{body}");
    let all: Vec<Row> = rows(&body)
        .into_iter()
        .filter(|(_, outcome, _, _)| !outcome.starts_with("admin_"))
        .collect();
    assert_eq!(
        who(&all),
        [
            ("bob", "denied"),
            ("alice", "denied"),
            ("alice", "denied"),
            ("bob", "denied"),
            ("alice", "denied"),
            ("bob", "shadow_denied"),
        ],
        "{body}"
    );
    assert!(
        all.windows(2).all(|w| w[0].3 > w[1].3),
        "newest first: {all:?}"
    );
    let quotas: Vec<&str> = all.iter().map(|r| r.2.as_str()).collect();
    assert_eq!(
        quotas,
        ["burst", "burst", "burst", "burst", "burst", "preview"]
    );
    let first = &body["records"][0];
    assert_eq!(first["tenant"], "acme");
    assert!(
        first["source"].is_string() && first["node"].is_string(),
        "{first}"
    );

    // By subject, by outcome, both.
    let by = |query: &'static str| {
        let app = app.clone();
        async move {
            let uri = format!("/admin/tenants/acme/audit?{query}");
            let (status, body) = get_json(&app, &uri, Some(TOKEN)).await;
            assert_eq!(status, S::OK, "{query}: {body}");
            rows(&body)
        }
    };
    assert_eq!(by("subject=alice").await, [1, 2, 4].map(|i| all[i].clone()));
    assert_eq!(by("subject=bob").await, [0, 3, 5].map(|i| all[i].clone()));
    assert_eq!(by("outcome=denied").await, all[..5]);
    assert_eq!(by("outcome=shadow_denied").await, all[5..]);
    assert_eq!(
        by("subject=bob&outcome=denied").await,
        [0, 3].map(|i| all[i].clone())
    );
    assert_eq!(by("outcome=allowed").await, []);
    assert_eq!(by("subject=carol").await, []);

    // A time range, bounds included: from bob's first denial to alice's
    // last.
    let uri = format!(
        "/admin/tenants/acme/audit?since={}&until={}",
        all[3].3, all[1].3
    );
    let (_, body) = get_json(&app, &uri, Some(TOKEN)).await;
    assert_eq!(rows(&body), all[1..4]);
    let uri = format!("/admin/tenants/acme/audit?since={}", all[0].3 + 1);
    let (_, body) = get_json(&app, &uri, Some(TOKEN)).await;
    assert_eq!(rows(&body), []);

    // Pages of two, following `next`, filtered and not.
    let denied = pages(&app, "outcome=denied&limit=2").await;
    assert_eq!(denied.iter().map(Vec::len).collect::<Vec<_>>(), [2, 2, 1]);
    assert_eq!(denied.concat(), all[..5]);
    let alice = pages(&app, "subject=alice&limit=2").await;
    assert_eq!(alice.iter().map(Vec::len).collect::<Vec<_>>(), [2, 1]);
    assert_eq!(alice.concat(), [1, 2, 4].map(|i| all[i].clone()));
    let one = pages(&app, "subject=bob&limit=1").await;
    assert_eq!(one.concat(), [0, 3, 5].map(|i| all[i].clone()));

    // Bad parameters: 400 problems.
    for query in ["outcome=nope", "limit=100000", "before=garbage", "since=x"] {
        let uri = format!("/admin/tenants/acme/audit?{query}");
        let (status, body) = get_json(&app, &uri, Some(TOKEN)).await;
        assert_eq!(status, S::BAD_REQUEST, "{query}: {body}");
        assert_eq!(body["type"], axum_window_ext::TYPE_INVALID_INPUT);
    }
    // The bearer token guards it like every admin route.
    let (status, _) = get_json(&app, "/admin/tenants/acme/audit", None).await;
    assert_eq!(status, S::UNAUTHORIZED);

    // The demo page's poll: the tenant's denials only, newest first.
    let (status, body) = get_json(&app, "/api/quota?tenant=acme&user=zed", None).await;
    assert_eq!(status, S::OK, "{body}");
    assert_eq!(body["audit"], "on", "{body}");
    let shown: Vec<(String, String, u64)> = body["denials"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            assert!(d["source"].is_string(), "{d}");
            (
                d["subject"].as_str().unwrap().to_owned(),
                d["quota"].as_str().unwrap().to_owned(),
                d["at_micros"].as_u64().unwrap(),
            )
        })
        .collect();
    let expected: Vec<(String, String, u64)> = all[..5]
        .iter()
        .map(|(s, _, q, at)| (s.clone(), q.clone(), *at))
        .collect();
    assert_eq!(shown, expected, "{body}");
    let (_, body) = get_json(&app, "/api/quota?tenant=other&user=alice", None).await;
    assert_eq!(
        (&body["audit"], &body["denials"]),
        (&"on".into(), &Value::Array(vec![]))
    );

    // An operator's reset through the admin API is recorded once, here.
    let reset = Request::post("/admin/tenants/acme/reset")
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
        .body(Body::empty())
        .unwrap();
    let status = app.clone().oneshot(reset).await.unwrap().status();
    assert_eq!(status, S::NO_CONTENT);
    assert!(log.flush().await);
    let uri = "/admin/tenants/acme/audit?outcome=admin_reset";
    let (status, body) = get_json(&app, uri, Some(TOKEN)).await;
    assert_eq!(status, S::OK, "{body}");
    let resets = body["records"].as_array().unwrap();
    assert_eq!(resets.len(), 1, "{body}");
    assert_eq!(resets[0]["subject"], "", "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denials_are_listed_on_the_embedded_store() {
    let dir = tempfile::tempdir().unwrap();
    denials_read_back(gateway(&dir, &["--audit"])).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denials_are_listed_on_redis_and_a_lost_redis_is_a_503() {
    let mut redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let url = redis.url();
    denials_read_back(gateway(&dir, &["--audit", "--redis-url", &url])).await;

    // Another node on the same Redis reads the same log.
    let other = gateway(
        &dir,
        &["--audit", "--redis-url", &url, "--audit-max-len", "50"],
    );
    let (status, body) = get_json(
        &other.router,
        "/admin/tenants/acme/audit?outcome=denied",
        Some(TOKEN),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(rows(&body).len(), 5, "{body}");

    redis.stop();
    let (status, body) = get_json(&other.router, "/admin/tenants/acme/audit", Some(TOKEN)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["type"], axum_window_ext::TYPE_UNAVAILABLE);
    // The demo's poll still answers its quotas (from the fallback), and
    // says the trail could not be read.
    let (_, body) = get_json(&other.router, "/api/quota?tenant=acme&user=zed", None).await;
    assert_ne!(body["audit"], "on", "{body}");
}

#[tokio::test]
async fn without_audit_the_route_says_it_is_off_and_the_demo_answer_is_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let gateway = gateway(&dir, &[]);
    assert!(gateway.limiter.audit().is_none());
    let app = gateway.router;
    assert_eq!(hello(&app, "acme", "alice").await, StatusCode::OK);
    let (status, body) = get_json(&app, "/admin/tenants/acme/audit", Some(TOKEN)).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(
        body["detail"].as_str().unwrap().contains("auditing is off"),
        "{body}"
    );
    let (status, body) = get_json(&app, "/api/quota?tenant=acme&user=alice", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // Neither member: the answer is as it was before the audit trail.
    assert!(
        body.get("audit").is_none() && body.get("denials").is_none(),
        "{body}"
    );
}

#[test]
fn help_lists_the_audit_flags() {
    let output = Command::new(env!("CARGO_BIN_EXE_gateway"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(output.status.success());
    let help = String::from_utf8(output.stdout).unwrap();
    for flag in [
        "--audit\n",
        "[env: TW_AUDIT=]",
        "--audit-sample-admissions <N>",
        "TW_AUDIT_SAMPLE_ADMISSIONS",
        "--audit-buffer <N>",
        "[default: 10000]",
        "--audit-max-len <N>",
        "[default: 100000]",
        "--audit-max-age <SECS>",
        "[default: 604800]",
    ] {
        assert!(help.contains(flag), "{flag} not in:\n{help}");
    }
    // A setting out of bounds is refused, naming it.
    let output = Command::new(env!("CARGO_BIN_EXE_gateway"))
        .args(["--audit", "--audit-buffer", "0"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--audit-buffer"), "{stderr}");
}
