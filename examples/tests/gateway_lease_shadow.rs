//! Issue 22, defect 1, through the built `gateway` binary: quota leases
//! (`--lease 8`) on Redis for tenants whose policies have shadow quotas.
//!
//! A `trial` tenant as in `examples/tenants.toml` (its one quota is a
//! shadow), a `pilot` tenant with an enforced and a shadow quota, and an
//! `acme` tenant without shadow quotas on the same Redis, with
//! `--fallback fail-closed --debug-headers`. Before the fix every leased
//! check of a policy with a shadow quota failed in the store, so these
//! requests were answered by the fallback (`fallback(error)`, then
//! `fallback(circuit_open)` for every tenant on that Redis).
#![allow(clippy::unwrap_used)]

mod support;

use std::collections::HashMap;

use support::{get_as, GatewayProcess};
use tower_window_tests::redis_server::RedisServer;

const TENANTS: &str = r#"
[tenants.trial]
quotas = { minute = "5/1m" }
shadow = ["minute"]

[tenants.pilot]
quotas = { burst = "30/1m", preview = "3/1m" }
shadow = ["preview"]

[tenants.acme]
quotas = { sustained = "5/1m" }
"#;

fn counter(text: &str, name: &str, label: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(label))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap() as u64)
        .sum()
}

#[test]
fn leases_on_redis_count_shadow_quotas_and_never_fall_back() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tenants.toml");
    std::fs::write(&file, TENANTS).unwrap();
    let gateway = GatewayProcess::start(&[
        "--tenants",
        file.to_str().unwrap(),
        "--lease",
        "8",
        "--redis-url",
        &redis.url(),
        // The test is about what the store decides, not the time budget: a
        // slow call on a loaded machine must not become a fallback answer.
        "--redis-timeout-ms",
        "5000",
        "--fallback",
        "fail-closed",
        "--debug-headers",
    ]);
    let port = gateway.port();
    let mut admitted: HashMap<&str, usize> = HashMap::new();
    let mut sources: HashMap<String, usize> = HashMap::new();
    let mut policies: HashMap<&str, String> = HashMap::new();
    // Interleaved: a fallback decision for one tenant's policy (an open
    // breaker for the whole Redis) would show in the others' answers.
    for i in 0..50 {
        for tenant in ["trial", "pilot", "acme"] {
            if tenant == "acme" && i >= 10 {
                continue;
            }
            let answer = get_as(port, "/api/hello", tenant, "alice");
            let source = answer.header("x-ratelimit-source").to_owned();
            assert!(
                !source.starts_with("fallback") && answer.status != 503,
                "{tenant} request {i} answered by the fallback ({source}, {}):\n{}",
                answer.status,
                gateway.log()
            );
            match answer.status {
                200 => *admitted.entry(tenant).or_default() += 1,
                429 => {}
                other => panic!("{tenant} request {i}: status {other}"),
            }
            *sources.entry(format!("{tenant} {source}")).or_default() += 1;
            policies.insert(tenant, answer.header("ratelimit-policy").to_owned());
        }
    }
    eprintln!("admitted {admitted:?}, sources {sources:?}");
    // Only the enforced quotas decide: trial has none, pilot's burst admits
    // 30, acme's sustained 5. (Pilot's burst is large enough for its key to
    // lease at all: only a key checked `DEFAULT_HOT_CHECKS` times within a
    // lease TTL leases, and a lease starts at one unit and doubles.)
    assert_eq!(admitted.get("trial"), Some(&50), "trial: nothing enforced");
    assert_eq!(admitted.get("pilot"), Some(&30), "pilot: burst = 30/1m");
    assert_eq!(admitted.get("acme"), Some(&5), "acme: sustained = 5/1m");
    assert!(
        sources.get("trial lease").is_some_and(|n| *n > 0)
            && sources.get("pilot lease").is_some_and(|n| *n > 0),
        "leases were spent: {sources:?}"
    );
    // The shadow quotas are advertised as such.
    assert!(
        policies["trial"].contains(r#""minute";q=5;w=60;shadow"#),
        "{}",
        policies["trial"]
    );
    assert!(
        policies["pilot"].contains(r#""preview";q=3;w=60;shadow"#)
            && policies["pilot"].contains(r#""burst";q=30;w=60"#),
        "{}",
        policies["pilot"]
    );
    // Their would-be denials are counted: trial's shadow quota admits 5 of
    // its 50 requests (it is counted exactly, leased or not); pilot's
    // admits 3 of the 30 admitted, and would have denied the other 27.
    let metrics = support::http_get(port, "/metrics").unwrap();
    let trial = counter(
        &metrics,
        "tower_window_shadow_denials_total",
        r#"quota="minute""#,
    );
    assert_eq!(trial, 45, "trial's shadow denials:\n{metrics}");
    let pilot = counter(
        &metrics,
        "tower_window_shadow_denials_total",
        r#"quota="preview""#,
    );
    assert!(pilot >= 27, "pilot's shadow denials: {pilot}\n{metrics}");
}
