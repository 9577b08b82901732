//! The `rls`'s rule files are reloaded as a whole while it serves: a good
//! change is in force within a bounded wait, a broken file refuses the set
//! (the old rules of every file stay, one refusal counted), and fixing it
//! reloads. Windows survive a change of limit.
#![allow(clippy::unwrap_used)]

mod rls_support;

use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use rls_support::{config_dir, descriptor, request, should, write_atomically, RlsProcess};
use tonic::transport::Channel;

fn rules(domain: &str, limit: u32) -> String {
    format!("domain: {domain}\ndescriptors:\n  - key: user\n    rate_limit: {{unit: hour, requests_per_unit: {limit}}}\n")
}

/// `(limit, remaining)` of one call for `user=u` in `domain`.
async fn probe(client: &mut RateLimitServiceClient<Channel>, domain: &str) -> (u32, u32) {
    let r = should(client, request(domain, vec![descriptor(&[("user", "u")])])).await;
    let status = &r.statuses[0];
    (
        status
            .current_limit
            .as_ref()
            .map_or(0, |l| l.requests_per_unit),
        status.limit_remaining,
    )
}

/// Waits (at most 15 s) until `done` holds.
fn wait_for(what: &str, rls: &RlsProcess, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !done() {
        assert!(
            Instant::now() < deadline,
            "{what} within 15 s:\n{}",
            rls.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_of_files_reloads_as_a_whole_and_a_broken_one_is_refused() {
    let dir = config_dir(&[
        ("a.yaml", &rules("alpha", 10)),
        ("b.yaml", &rules("beta", 10)),
    ]);
    let rls = RlsProcess::start(&["--config", dir.path().to_str().unwrap()]);
    let mut client = rls.client().await;
    assert_eq!(probe(&mut client, "alpha").await, (10, 9));
    assert_eq!(probe(&mut client, "beta").await, (10, 9));

    // A good change: alpha's limit is 20 now; its window is kept.
    write_atomically(&dir.path().join("a.yaml"), &rules("alpha", 20));
    wait_for("the reload", &rls, || {
        rls.counter("tower_window_config_reload_total{result=\"ok\"}") >= 1
    });
    assert_eq!(probe(&mut client, "alpha").await, (20, 18));

    // A broken file refuses the whole set: alpha's change in the same
    // burst is not taken either.
    write_atomically(&dir.path().join("a.yaml"), &rules("alpha", 30));
    write_atomically(&dir.path().join("b.yaml"), "domain: beta\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n");
    wait_for("the refusal", &rls, || {
        rls.counter("tower_window_config_reload_total{result=\"error\"}") == 1
    });
    assert!(
        rls.log()
            .contains("b.yaml: invalid rate limit unit 'fortnight'"),
        "{}",
        rls.log()
    );
    assert_eq!(probe(&mut client, "alpha").await, (20, 17));
    assert_eq!(probe(&mut client, "beta").await, (10, 8));

    // A new file of the directory, also broken (a domain twice): refused.
    write_atomically(&dir.path().join("c.yaml"), &rules("alpha", 5));
    // Fixing b while c still duplicates alpha: refused again.
    write_atomically(&dir.path().join("b.yaml"), &rules("beta", 40));
    wait_for("the second refusal", &rls, || {
        rls.counter("tower_window_config_reload_total{result=\"error\"}") == 2
    });
    assert!(
        rls.log().contains("duplicate domain 'alpha'"),
        "{}",
        rls.log()
    );
    assert_eq!(probe(&mut client, "beta").await, (10, 7));

    // Removing c makes the set whole: every file's change is in force.
    std::fs::remove_file(dir.path().join("c.yaml")).unwrap();
    wait_for("the second reload", &rls, || {
        rls.counter("tower_window_config_reload_total{result=\"ok\"}") >= 2
    });
    assert_eq!(probe(&mut client, "alpha").await, (30, 26));
    assert_eq!(probe(&mut client, "beta").await, (40, 36));
    assert_eq!(
        rls.counter("tower_window_config_reload_total{result=\"error\"}"),
        2
    );
}
