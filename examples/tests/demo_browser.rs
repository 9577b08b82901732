//! The demo page in a real browser: Debian's `chromium`, headless, driven by
//! `playwright-core` (`tests/browser/demo.mjs`) against one real
//! `redis-server` and two gateway processes.
//!
//! Two pages as two users in one room on two nodes: a message typed in one
//! appears in the other; flooding shows the rate-limit notice; stopping
//! node A makes page A reconnect to node B and show the messages it missed,
//! in order; when the room's history is lost in Redis, the page's resume
//! shows "history lost: resynced". Screenshots go to
//! `target/demo-screenshots/`.
//!
//! Needs `node`, `/usr/bin/chromium` and `npm ci` in `tests/browser`
//! (`.ci/test` installs them); without them the test fails and says what
//! to install. It never skips.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use tower_window_tests::redis_server::RedisServer;

mod support;

use support::{GatewayProcess, CHROMIUM};

fn browser_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser")
}

/// `target/demo-screenshots` (beside `target/tmp`).
fn screenshot_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap()
        .join("demo-screenshots")
}

/// Fails with what to install when a prerequisite is missing.
fn check_prerequisites() {
    let node = Command::new("node").arg("--version").output();
    assert!(
        node.as_ref().is_ok_and(|o| o.status.success()),
        "the browser test needs `node` (Debian: apt-get install -y nodejs npm): {node:?}"
    );
    assert!(
        Path::new(CHROMIUM).exists(),
        "the browser test needs Debian's chromium at {CHROMIUM} (apt-get install -y chromium); \
         .ci/test installs it when run as root"
    );
    let playwright = browser_dir().join("node_modules/playwright-core/package.json");
    assert!(
        playwright.exists(),
        "the browser test needs playwright-core: run `npm ci` in {} (.ci/test does)",
        browser_dir().display()
    );
}

#[test]
fn two_users_chat_hit_the_limit_and_fail_over_in_chromium() {
    check_prerequisites();
    let redis = RedisServer::start();
    let flags = [
        "--redis-url",
        &redis.url(),
        "--redis-timeout-ms",
        "2000",
        "--message-limit",
        "10/10s",
    ];
    let a = GatewayProcess::start(&flags);
    let b = GatewayProcess::start(&flags);
    let shots = screenshot_dir();
    let _ = std::fs::remove_dir_all(&shots);

    let output = support::run_bounded(
        Command::new("node")
            .current_dir(browser_dir())
            .arg("demo.mjs")
            .args(["--node-a", &a.url(), "--node-b", &b.url()])
            .args(["--node-a-pid", &a.pid().to_string()])
            .args(["--redis-port", &redis.port().to_string()])
            .args(["--chromium", CHROMIUM, "--flood", "15"])
            .arg("--screenshots")
            .arg(&shots),
        Duration::from_secs(150),
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let last = stdout.lines().last().unwrap_or_default();
    let result: Value = serde_json::from_str(last)
        .unwrap_or_else(|e| panic!("no JSON from demo.mjs ({e}):\n{stdout}\n{stderr}"));
    let context = format!("{result:#}\nstderr:\n{stderr}\nnode A log:\n{}", a.log());
    assert_eq!(result["ok"], true, "{context}");

    // Each page on its own node first.
    assert_eq!(result["aliceNodeBefore"], a.url(), "{context}");
    assert_eq!(result["bobNode"], b.url(), "{context}");
    // A message typed in one page appears in the other, both ways; bob's
    // page sees alice online.
    assert_eq!(result["chatSeenByBob"], true, "{context}");
    assert_eq!(result["chatSeenByAlice"], true, "{context}");
    assert_eq!(result["bobSeesAliceOnline"], true, "{context}");
    assert_eq!(result["quotaRows"], true, "{context}");
    // Flooding 15 messages against 10/10s (one already sent): the notice
    // shows, and at most the quota's remainder was delivered.
    assert!(
        result["rateLimitedNotices"].as_u64().unwrap() >= 1,
        "{context}"
    );
    let admitted = result["admittedFlood"].as_u64().unwrap();
    assert!((1..=9).contains(&admitted), "{context}");
    assert!(
        !result["exhaustedQuotas"].as_array().unwrap().is_empty(),
        "{context}"
    );

    // Failover: page A now on node B, told it recovered exactly the three
    // messages it missed, which it shows in order, as history.
    assert_eq!(result["aliceNodeAfter"], b.url(), "{context}");
    assert_eq!(result["recovery"]["state"], "recovered", "{context}");
    assert_eq!(result["recovery"]["count"], 3, "{context}");
    assert_eq!(result["aliceHistory"], result["missed"], "{context}");
    // Both pages show the same events, in the same order, none twice.
    let alice_ids = result["aliceIds"].as_array().unwrap();
    assert_eq!(alice_ids, result["bobIds"].as_array().unwrap(), "{context}");
    let unique: BTreeSet<&str> = alice_ids.iter().map(|id| id.as_str().unwrap()).collect();
    assert_eq!(unique.len(), alice_ids.len(), "{context}");
    let texts: Vec<&str> = result["aliceTexts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    let tail: Vec<&str> = texts[texts.len() - 3..].to_vec();
    assert_eq!(tail, ["missed 1", "missed 2", "missed 3"], "{context}");
    assert_eq!(result["chatAfterFailover"], true, "{context}");

    // History lost (the room's keys deleted): the resume is a resync,
    // never "recovered", and live messages flow again.
    assert!(
        result["deletedRoomKeys"].as_u64().unwrap() >= 1,
        "{context}"
    );
    assert_eq!(result["resync"]["state"], "resync", "{context}");
    let reason = result["resync"]["reason"].as_str().unwrap();
    assert!(["epoch_changed", "too_old"].contains(&reason), "{context}");
    assert_eq!(result["liveAfterResync"], true, "{context}");

    // The screenshots exist and are PNGs.
    let screenshots = result["screenshots"].as_array().unwrap();
    assert_eq!(screenshots.len(), 6, "{context}");
    for path in screenshots {
        let bytes = std::fs::read(path.as_str().unwrap()).unwrap();
        assert!(bytes.starts_with(b"\x89PNG"), "{path}");
    }
    drop(b);
}
