//! The gateway with `--tenants` and `--admin-token`: per-tenant policies,
//! hot reload, the admin API, shadow quotas and unknown tenants.
#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use clap::Parser;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;
use tower_window_examples::gateway::{build_app, Args};
use tower_window_tests::redis_server::RedisServer;

const TOKEN: &str = "s3cret-token";

const FILE: &str = r#"
[tenants.acme]
quotas = { burst = "3/1m", sustained = "1000/1h sliding-counter(1m)" }

[tenants.trial]
quotas = { burst = "10/1m", minute = "2/1m" }
shadow = ["minute"]

[tenants.internal]
unlimited = true
"#;

fn write(path: &std::path::Path, text: &str) {
    // Write then rename, as editors and deploys do: the watcher never
    // reads a half-written file.
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::File::create(&tmp).unwrap();
    file.write_all(text.as_bytes()).unwrap();
    file.sync_all().unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn gateway(dir: &tempfile::TempDir, text: &str) -> (Router, std::path::PathBuf) {
    let path = dir.path().join("tenants.toml");
    write(&path, text);
    let args = Args::try_parse_from([
        "gateway",
        "--tenants",
        path.to_str().unwrap(),
        "--admin-token",
        TOKEN,
    ])
    .unwrap();
    (build_app(args.into_config().unwrap()), path)
}

fn hello(tenant: &str, user: &str) -> Request<Body> {
    Request::get("/api/hello")
        .header("x-tenant-id", tenant)
        .header("x-user-id", user)
        .body(Body::empty())
        .unwrap()
}

fn admin(method: &str, path: &str, auth: Option<&str>, body: Option<Value>) -> Request<Body> {
    let mut builder = Request::builder().method(method).uri(path);
    if let Some(auth) = auth {
        builder = builder.header(header::AUTHORIZATION, auth);
    }
    match body {
        Some(body) => builder
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body.to_string()))
            .unwrap(),
        None => builder.body(Body::empty()).unwrap(),
    }
}

fn bearer() -> Option<&'static str> {
    Some("Bearer s3cret-token")
}

async fn call(app: &Router, request: Request<Body>) -> (StatusCode, axum::http::HeaderMap, Value) {
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, headers, body)
}

async fn statuses(app: &Router, tenant: &str, user: &str, n: usize) -> Vec<u16> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(call(app, hello(tenant, user)).await.0.as_u16());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_get_their_own_policies() {
    let dir = tempfile::tempdir().unwrap();
    let (app, _) = gateway(&dir, FILE);
    assert_eq!(
        statuses(&app, "acme", "alice", 4).await,
        [200, 200, 200, 429]
    );
    // Unlimited: never limited, no headers.
    let (status, headers, _) = call(&app, hello("internal", "bob")).await;
    assert_eq!(status, 200);
    assert!(!headers.contains_key("ratelimit"));
    assert_eq!(statuses(&app, "internal", "bob", 50).await, [200; 50]);
    // No [default]: an unknown tenant is 403 with a problem body.
    let (status, headers, body) = call(&app, hello("nobody", "carol")).await;
    assert_eq!(status, 403);
    assert_eq!(headers[header::CONTENT_TYPE], "application/problem+json");
    assert_eq!(body["type"], "urn:tower-window:problem:unknown-tenant");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_quotas_never_deny_but_show_in_headers_and_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let (app, _) = gateway(&dir, FILE);
    let user = "shadow-user";
    // minute = 2/1m is shadow: 5 requests, all admitted.
    assert_eq!(statuses(&app, "trial", user, 5).await, [200; 5]);
    let (_, headers, _) = call(&app, hello("trial", user)).await;
    let policy = headers["ratelimit-policy"].to_str().unwrap();
    assert!(policy.contains(r#""minute";q=2;w=60;shadow"#), "{policy}");
    assert!(policy.contains(r#""burst";q=10;w=60"#), "{policy}");
    // The enforced quota decides RateLimit.
    let state = headers["ratelimit"].to_str().unwrap();
    assert!(state.starts_with(r#""burst";r=4"#), "{state}");
    let response = app
        .clone()
        .oneshot(Request::get("/metrics").body(Body::empty()).unwrap())
        .await
        .unwrap();
    let text = String::from_utf8(
        response
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
    .unwrap();
    let denials: u64 = text
        .lines()
        .filter(|l| {
            l.starts_with("tower_window_shadow_denials_total{") && l.contains(r#"quota="minute""#)
        })
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap() as u64)
        .sum();
    assert!(denials >= 4, "4 would-be denials counted: {text}");
}

async fn reloads(app: &Router, result: &str) -> u64 {
    let response = app
        .clone()
        .oneshot(Request::get("/metrics").body(Body::empty()).unwrap())
        .await
        .unwrap();
    let text = String::from_utf8(
        response
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
    .unwrap();
    text.lines()
        .filter(|l| {
            l.starts_with("tower_window_config_reload_total{")
                && l.contains(&format!("result=\"{result}\""))
        })
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap() as u64)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_reload_changes_limits_and_refuses_broken_files() {
    let dir = tempfile::tempdir().unwrap();
    let (app, path) = gateway(&dir, FILE);
    let policy =
        |headers: &axum::http::HeaderMap| headers["ratelimit-policy"].to_str().unwrap().to_owned();
    let (_, headers, _) = call(&app, hello("acme", "reload")).await;
    assert!(policy(&headers).contains(r#""burst";q=3;w=60"#));
    let ok_before = reloads(&app, "ok").await;
    // Requests keep flowing during the swap: every one is answered by the
    // old or the new configuration, none fails.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let traffic = tokio::spawn({
        let (app, stop) = (app.clone(), std::sync::Arc::clone(&stop));
        async move {
            let mut answered = Vec::new();
            for i in 0..5000 {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                let user = format!("during-{}", i % 50);
                answered.push(call(&app, hello("acme", &user)).await.0.as_u16());
                tokio::task::yield_now().await;
            }
            answered
        }
    });
    write(
        &path,
        &FILE.replace(r#"burst = "3/1m""#, r#"burst = "5/1m""#),
    );
    // Bounded wait for the watcher (no restart): at most 1000 × 10 ms.
    let mut seen = String::new();
    for _ in 0..1000 {
        let (_, headers, _) = call(&app, hello("acme", "reload-probe")).await;
        seen = policy(&headers);
        if seen.contains(r#""burst";q=5;w=60"#) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(seen.contains(r#""burst";q=5;w=60"#), "{seen}");
    assert!(reloads(&app, "ok").await > ok_before);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let answered = traffic.await.unwrap();
    assert!(!answered.is_empty());
    assert!(
        answered.iter().all(|s| *s == 200 || *s == 429),
        "every request during the reload was answered: {answered:?}"
    );
    // The window was kept: "reload" used 1 of 5.
    let (_, headers, _) = call(&app, hello("acme", "reload")).await;
    assert!(
        headers["ratelimit"].to_str().unwrap().contains("r=3"),
        "{headers:?}"
    );

    // A broken file is refused; the old limits stay.
    let errors_before = reloads(&app, "error").await;
    write(&path, "[tenants.acme]\nquotas = { burst = \"0/1m\" }\n");
    let mut refused = false;
    for _ in 0..1000 {
        if reloads(&app, "error").await > errors_before {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(refused, "the broken file was seen and refused");
    let (_, headers, _) = call(&app, hello("acme", "reload-after")).await;
    assert!(policy(&headers).contains(r#""burst";q=5;w=60"#));
    assert_eq!(call(&app, hello("internal", "x")).await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_needs_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let (app, _) = gateway(&dir, FILE);
    for auth in [
        None,
        Some("Bearer wrong-token"),
        Some("Basic czNjcmV0LXRva2Vu"),
        Some("s3cret-token"),
        Some("Bearer "),
        Some("Bearer s3cret-token-and-more"),
    ] {
        for (method, path) in [
            ("GET", "/admin/tenants"),
            ("GET", "/admin/tenants/acme"),
            ("POST", "/admin/tenants/acme/reset"),
            ("DELETE", "/admin/tenants/acme"),
        ] {
            let (status, headers, body) = call(&app, admin(method, path, auth, None)).await;
            assert_eq!(status, 401, "{method} {path} with {auth:?}");
            assert_eq!(headers[header::WWW_AUTHENTICATE], "Bearer");
            assert_eq!(body["status"], 401);
        }
    }
    // Nothing was reset or closed.
    assert_eq!(
        call(&app, admin("GET", "/admin/tenants/acme", bearer(), None))
            .await
            .0,
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_manages_tenants() {
    let dir = tempfile::tempdir().unwrap();
    let (app, _) = gateway(&dir, FILE);
    let (status, _, body) = call(&app, admin("GET", "/admin/tenants", bearer(), None)).await;
    assert_eq!(status, 200);
    let names: Vec<&str> = body["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["acme", "internal", "trial"]);
    let (_, _, acme) = call(&app, admin("GET", "/admin/tenants/acme", bearer(), None)).await;
    assert_eq!(
        acme,
        json!({"name": "acme", "quotas": {"burst": "3/1m", "sustained": "1000/1h sliding-counter(1m)"}, "source": "file"})
    );
    assert_eq!(
        call(&app, admin("GET", "/admin/tenants/nobody", bearer(), None))
            .await
            .0,
        404
    );

    // Usage reads the store and consumes nothing.
    assert_eq!(statuses(&app, "acme", "dave", 2).await, [200, 200]);
    let usage = || admin("GET", "/admin/tenants/acme/usage/dave", bearer(), None);
    for _ in 0..3 {
        let (status, _, body) = call(&app, usage()).await;
        assert_eq!(status, 200);
        assert_eq!(body["quotas"]["burst"]["limit"], 3);
        assert_eq!(body["quotas"]["burst"]["remaining"], 1);
        assert_eq!(body["quotas"]["sustained"]["remaining"], 998);
        let reset = body["quotas"]["burst"]["reset_after_ms"].as_u64().unwrap();
        assert!(reset > 0 && reset <= 60_000, "{body}");
    }
    let (_, headers, _) = call(&app, hello("acme", "dave")).await;
    assert!(headers["ratelimit"]
        .to_str()
        .unwrap()
        .starts_with(r#""burst";r=0"#));

    // Reset: dave starts afresh.
    assert_eq!(
        call(
            &app,
            admin("POST", "/admin/tenants/acme/reset", bearer(), None)
        )
        .await
        .0,
        204
    );
    let (_, _, body) = call(&app, usage()).await;
    assert_eq!(body["quotas"]["burst"]["remaining"], 3);

    // PUT a new tenant (init), then replace it.
    let (status, _, body) = call(
        &app,
        admin(
            "PUT",
            "/admin/tenants/newco",
            bearer(),
            Some(json!({"quotas": {"burst": "5/10s"}})),
        ),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        body,
        json!({"name": "newco", "quotas": {"burst": "5/10s"}, "source": "runtime"})
    );
    assert_eq!(
        statuses(&app, "newco", "erin", 6).await,
        [200, 200, 200, 200, 200, 429]
    );
    let (status, _, _) = call(
        &app,
        admin(
            "PUT",
            "/admin/tenants/newco",
            bearer(),
            Some(json!({"quotas": {"burst": "7/10s", "org": {"limit": "100/1m", "scope": "tenant"}}, "shadow": ["org"]})),
        ),
    )
    .await;
    assert_eq!(status, 200);

    // Close: 403 from then on; closing again is 404.
    assert_eq!(
        call(
            &app,
            admin("DELETE", "/admin/tenants/newco", bearer(), None)
        )
        .await
        .0,
        204
    );
    assert_eq!(call(&app, hello("newco", "erin")).await.0, 403);
    assert_eq!(
        call(
            &app,
            admin("DELETE", "/admin/tenants/newco", bearer(), None)
        )
        .await
        .0,
        404
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_admin_input_is_400_with_a_problem() {
    let dir = tempfile::tempdir().unwrap();
    let (app, _) = gateway(&dir, FILE);
    let long = "x".repeat(129);
    let cases: Vec<(&str, String, Option<Value>, &str)> = vec![
        (
            "PUT",
            "/admin/tenants/newco".into(),
            Some(json!({"quotas": {"burst": "0/1s"}})),
            "burst",
        ),
        (
            "PUT",
            "/admin/tenants/newco".into(),
            Some(json!({"quotas": {"burst": "10/1parsec"}})),
            "burst",
        ),
        (
            "PUT",
            "/admin/tenants/newco".into(),
            Some(json!({"quotas": {}})),
            "at least one quota",
        ),
        (
            "PUT",
            "/admin/tenants/newco".into(),
            Some(json!({"quotas": {"a": "1/s"}, "shadow": ["b"]})),
            "\"b\"",
        ),
        (
            "PUT",
            "/admin/tenants/newco".into(),
            Some(json!({"limits": {}})),
            "limits",
        ),
        (
            "PUT",
            "/admin/tenants/newco".into(),
            Some(json!({"quotas": {"bad name": "1/s"}})),
            "bad name",
        ),
        (
            "PUT",
            "/admin/tenants/a%20b".into(),
            Some(json!({"quotas": {"a": "1/s"}})),
            "invalid tenant name",
        ),
        (
            "GET",
            format!("/admin/tenants/{long}"),
            None,
            "invalid tenant name",
        ),
        (
            "POST",
            "/admin/tenants/a%0Ab/reset".into(),
            None,
            "invalid tenant name",
        ),
    ];
    for (method, path, body, needle) in cases {
        let (status, headers, problem) =
            call(&app, admin(method, &path, bearer(), body.clone())).await;
        assert_eq!(status, 400, "{method} {path} {body:?}: {problem}");
        assert_eq!(headers[header::CONTENT_TYPE], "application/problem+json");
        assert_eq!(problem["type"], "urn:tower-window:problem:invalid-input");
        let detail = problem["detail"].as_str().unwrap();
        assert!(detail.contains(needle), "{needle:?} in {detail}");
    }
    // A body that is not JSON at all.
    let request = Request::put("/admin/tenants/newco")
        .header(header::AUTHORIZATION, "Bearer s3cret-token")
        .body(Body::from("quotas = nope"))
        .unwrap();
    assert_eq!(call(&app, request).await.0, 400);
    assert!(
        call(&app, admin("GET", "/admin/tenants/newco", bearer(), None))
            .await
            .0
            == 404
    );
}

#[tokio::test]
async fn no_token_no_admin_routes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tenants.toml");
    write(&path, FILE);
    let args = Args::try_parse_from(["gateway", "--tenants", path.to_str().unwrap()]).unwrap();
    let app = build_app(args.into_config().unwrap());
    let (status, _, _) = call(&app, admin("GET", "/admin/tenants", bearer(), None)).await;
    assert_eq!(status, 404);
    assert_eq!(call(&app, hello("acme", "x")).await.0, 200);
    // A broken file at start is a configuration error naming the problem.
    write(&path, "[tenants.acme]\nquotas = { burst = \"0/1m\" }\n");
    let error = Args::try_parse_from(["gateway", "--tenants", path.to_str().unwrap()])
        .unwrap()
        .into_config()
        .unwrap_err()
        .to_string();
    assert!(error.contains(r#"tenant "acme": quota "burst""#), "{error}");
}

/// Point 1 through two gateways on one Redis, each with its own
/// connections: a change on A is honoured by B.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_changes_on_one_gateway_reach_the_other() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tenants.toml");
    write(&path, FILE);
    let node = || {
        let args = Args::try_parse_from([
            "gateway",
            "--redis-url",
            &redis.url(),
            "--tenants",
            path.to_str().unwrap(),
            "--admin-token",
            TOKEN,
        ])
        .unwrap();
        build_app(args.into_config().unwrap())
    };
    let (a, b) = (node(), node());
    let until = |app: Router, step: &'static str, want: u16| async move {
        let mut last = (StatusCode::OK, axum::http::HeaderMap::new(), Value::Null);
        for _ in 0..1000 {
            last = call(&app, hello("newco", "frank")).await;
            if last.0.as_u16() == want {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("{step}: never {want}, last {last:?}");
    };
    // B does not know newco yet; A defines it.
    assert_eq!(call(&b, hello("newco", "frank")).await.0, 403);
    let body = json!({"quotas": {"burst": "2/1m"}});
    assert_eq!(
        call(
            &a,
            admin("PUT", "/admin/tenants/newco", bearer(), Some(body))
        )
        .await
        .0,
        200
    );
    until(b.clone(), "init", 200).await;
    assert_eq!(call(&a, hello("newco", "frank")).await.0, 200);
    assert_eq!(
        call(&b, hello("newco", "frank")).await.0,
        429,
        "one window: 2 of 2 used"
    );
    assert_eq!(
        call(
            &a,
            admin("POST", "/admin/tenants/newco/reset", bearer(), None)
        )
        .await
        .0,
        204
    );
    until(b.clone(), "newco", 200).await;
    assert_eq!(
        call(&a, admin("DELETE", "/admin/tenants/newco", bearer(), None))
            .await
            .0,
        204
    );
    until(b.clone(), "close", 403).await;
    // B's admin API sees what A did.
    assert_eq!(
        call(&b, admin("GET", "/admin/tenants/newco", bearer(), None))
            .await
            .0,
        404
    );
}

/// `--admin-token` without `--tenants`: every tenant starts on the
/// `--limit` policy, and the admin API defines others at runtime.
#[tokio::test]
async fn admin_without_a_tenants_file_starts_from_the_limit_policy() {
    let args =
        Args::try_parse_from(["gateway", "--limit", "2/1m", "--admin-token", TOKEN]).unwrap();
    let app = build_app(args.into_config().unwrap());
    assert_eq!(statuses(&app, "anyone", "gina", 3).await, [200, 200, 429]);
    let (_, _, body) = call(&app, admin("GET", "/admin/tenants", bearer(), None)).await;
    assert_eq!(
        body,
        json!({"tenants": [], "default": {"quotas": {"default": "2/1m"}, "source": "default"}})
    );
    let body = json!({"quotas": {"burst": "3/1m"}});
    assert_eq!(
        call(
            &app,
            admin("PUT", "/admin/tenants/vip", bearer(), Some(body))
        )
        .await
        .0,
        200
    );
    assert_eq!(statuses(&app, "vip", "gina", 4).await, [200, 200, 200, 429]);
}

/// Without `--tenants` every tenant is on the `--limit` default: `DELETE`
/// takes the tenants `usage` and `reset` take (a 204, not a 404), and the
/// tenant stays on the default with fresh windows.
#[tokio::test]
async fn without_a_tenants_file_delete_takes_what_usage_and_reset_take() {
    let args =
        Args::try_parse_from(["gateway", "--limit", "2/1m", "--admin-token", TOKEN]).unwrap();
    let app = build_app(args.into_config().unwrap());
    assert_eq!(statuses(&app, "anyone", "gina", 3).await, [200, 200, 429]);
    let usage = || admin("GET", "/admin/tenants/anyone/usage/gina", bearer(), None);
    let (status, _, body) = call(&app, usage()).await;
    assert_eq!(
        (
            status.as_u16(),
            body["quotas"]["default"]["remaining"].clone()
        ),
        (200, json!(0))
    );
    let delete = || admin("DELETE", "/admin/tenants/anyone", bearer(), None);
    assert_eq!(call(&app, delete()).await.0, 204);
    assert_eq!(statuses(&app, "anyone", "gina", 3).await, [200, 200, 429]);
    assert_eq!(
        call(
            &app,
            admin("POST", "/admin/tenants/anyone/reset", bearer(), None)
        )
        .await
        .0,
        204
    );
    assert_eq!(call(&app, delete()).await.0, 204);
    // And back to the file (here: its default) when asked.
    let revert = admin("DELETE", "/admin/tenants/anyone/runtime", bearer(), None);
    assert_eq!(call(&app, revert).await.0, 204);
    assert_eq!(call(&app, usage()).await.0, 200);
}

/// A tenant changed at runtime wins over reloads of the file until it is
/// handed back (`DELETE /admin/tenants/{tenant}/runtime`); then the file as
/// it stands decides, with no restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_change_is_handed_back_to_the_reloaded_file() {
    let dir = tempfile::tempdir().unwrap();
    let (app, path) = gateway(&dir, FILE);
    let policy =
        |headers: &axum::http::HeaderMap| headers["ratelimit-policy"].to_str().unwrap().to_owned();
    let body = json!({"quotas": {"burst": "9/1m"}});
    assert_eq!(
        call(
            &app,
            admin("PUT", "/admin/tenants/acme", bearer(), Some(body))
        )
        .await
        .0,
        200
    );
    write(
        &path,
        &FILE.replace(r#"burst = "3/1m""#, r#"burst = "4/1m""#),
    );
    // The reload happens (trial's quota is new) but acme stays runtime.
    let mut seen = 0;
    for _ in 0..500 {
        seen = reloads(&app, "ok").await;
        if seen > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(seen > 0, "the file was reloaded");
    let (_, headers, _) = call(&app, hello("acme", "hand-back")).await;
    assert!(
        policy(&headers).contains(r#""burst";q=9;w=60"#),
        "{headers:?}"
    );
    let revert = || admin("DELETE", "/admin/tenants/acme/runtime", bearer(), None);
    assert_eq!(call(&app, revert()).await.0, 204);
    let (_, headers, _) = call(&app, hello("acme", "hand-back")).await;
    assert!(
        policy(&headers).contains(r#""burst";q=4;w=60"#),
        "{headers:?}"
    );
    let (_, _, acme) = call(&app, admin("GET", "/admin/tenants/acme", bearer(), None)).await;
    assert_eq!(acme["source"], "file");
    let (status, headers, body) = call(&app, revert()).await;
    assert_eq!(status, 404);
    assert_eq!(headers[header::CONTENT_TYPE], "application/problem+json");
    assert_eq!(body["type"], "urn:tower-window:problem:not-found");
}

/// Handing a tenant back on one gateway reaches the other (Redis).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_back_on_one_gateway_reaches_the_other() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tenants.toml");
    write(&path, FILE);
    let node = || {
        let args = Args::try_parse_from([
            "gateway",
            "--redis-url",
            &redis.url(),
            "--tenants",
            path.to_str().unwrap(),
            "--admin-token",
            TOKEN,
        ])
        .unwrap();
        build_app(args.into_config().unwrap())
    };
    let (a, b) = (node(), node());
    let burst_on = |app: Router, want: &'static str| async move {
        let mut last = String::new();
        for _ in 0..1000 {
            let (_, headers, _) = call(&app, hello("acme", "hand-back-b")).await;
            last = headers["ratelimit-policy"].to_str().unwrap().to_owned();
            if last.contains(want) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("never {want}: {last}");
    };
    let body = json!({"quotas": {"burst": "50/1m"}});
    assert_eq!(
        call(
            &a,
            admin("PUT", "/admin/tenants/acme", bearer(), Some(body))
        )
        .await
        .0,
        200
    );
    burst_on(b.clone(), r#""burst";q=50;w=60"#).await;
    assert_eq!(
        call(
            &a,
            admin("DELETE", "/admin/tenants/acme/runtime", bearer(), None)
        )
        .await
        .0,
        204
    );
    burst_on(b.clone(), r#""burst";q=3;w=60"#).await;
    let (_, _, acme) = call(&b, admin("GET", "/admin/tenants/acme", bearer(), None)).await;
    assert_eq!(acme["source"], "file");
    // A gateway started later loads no record for it either.
    let c = node();
    burst_on(c, r#""burst";q=3;w=60"#).await;
}

/// Every problem body of the gateway has a `type`: the 400s of
/// `/presence` and `/ws?room=`, unknown routes (admin or not).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_problem_body_has_a_type() {
    let dir = tempfile::tempdir().unwrap();
    let (app, _) = gateway(&dir, FILE);
    let problem = |(status, headers, body): (StatusCode, axum::http::HeaderMap, Value),
                   want: u16| {
        assert_eq!(status.as_u16(), want, "{body}");
        assert_eq!(headers[header::CONTENT_TYPE], "application/problem+json");
        assert!(
            body["type"]
                .as_str()
                .is_some_and(|t| t.starts_with("urn:tower-window:problem:")),
            "{body}"
        );
        assert_eq!(body["status"], want, "{body}");
        assert!(body["detail"].is_string(), "{body}");
    };
    let get = |path: &str| Request::get(path).body(Body::empty()).unwrap();
    problem(call(&app, get("/presence")).await, 400);
    problem(call(&app, get("/presence?user=a&user=b")).await, 400);
    problem(call(&app, get("/nope")).await, 404);
    problem(
        call(&app, admin("GET", "/admin/nope", bearer(), None)).await,
        404,
    );
    problem(
        call(&app, admin("GET", "/admin/", bearer(), None)).await,
        404,
    );
    problem(
        call(&app, admin("PATCH", "/admin/tenants/acme", bearer(), None)).await,
        405,
    );

    // `/ws` refuses before the upgrade, so it needs a real connection.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    for query in [
        "room=bad%20name",
        "room=ok&last_event_id=1-0",
        "room=ok&epoch=zz!&last_event_id=1-0",
    ] {
        let (status, body) = upgrade(address, &format!("/ws?{query}")).await;
        assert_eq!(status, 400, "{query}: {body}");
        let body: Value = serde_json::from_str(&body).unwrap();
        assert!(
            body["type"]
                .as_str()
                .is_some_and(|t| t.starts_with("urn:tower-window:problem:")),
            "{query}: {body}"
        );
        assert!(body["detail"].is_string(), "{query}: {body}");
    }
    server.abort();
}

/// A WebSocket upgrade of `path` over a fresh connection: the status and
/// body of a refusal.
async fn upgrade(address: std::net::SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let request = format!(
        "GET {path} HTTP/1.1\r\nhost: {address}\r\nx-user-id: u\r\nx-tenant-id: internal\r\n\
         connection: upgrade\r\n\
         upgrade: websocket\r\nsec-websocket-version: 13\r\n\
         sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), async {
        let mut buf = [0u8; 4096];
        loop {
            let n = stream.read(&mut buf).await.unwrap();
            response.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&response);
            if n == 0 || text.contains("}") {
                break;
            }
        }
    });
    read.await.unwrap();
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text.split(' ').nth(1).unwrap().parse().unwrap();
    let body = text.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned();
    (status, body)
}
