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
//! With `--audit`, the page's "Last denials" panel shows its tenant's
//! denials (an HTTP request and flooded messages), and no other tenant's
//! (screenshot in `target/demo-audit-screenshots/`).
//!
//! Needs `node`, `/usr/bin/chromium` and `npm ci` in `tests/browser`
//! (`.ci/test` installs them); without them the test fails and says what
//! to install. It never skips.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use serde_json::Value;
use tower_window_tests::redis_server::RedisServer;

mod support;

use support::{get_as, GatewayProcess, CHROMIUM};

/// One browser scenario at a time (each runs chromium and gateways).
static BROWSER: Mutex<()> = Mutex::new(());

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
    let _one_at_a_time = BROWSER.lock().unwrap_or_else(|e| e.into_inner());
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

/// The audit scenario, run by `node --input-type=module` in `tests/browser`
/// (for `playwright-core`): alice's page (tenant `demo`) joins a room,
/// shows bob's HTTP denial in "Last denials", floods messages past
/// `--message-limit`, then shows her own denials there. Prints one JSON
/// line: the panel's state and rows.
const AUDIT_SCENARIO: &str = r##"
import { chromium } from "playwright-core";
import { mkdirSync } from "node:fs";
import { join } from "node:path";

const STEP_MS = 15_000;
const env = process.env;
const log = (...parts) => console.error("[audit]", ...parts);
const result = { ok: false, steps: [] };
const step = (name) => { result.steps.push(name); log("step", name); };
const browser = await chromium.launch({
  executablePath: env.TW_CHROMIUM,
  headless: true,
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
const rows = (page) => page.$$eval("#denials tbody tr", (trs) => trs.map((tr) => ({
  at: Number(tr.dataset.at), subject: tr.dataset.subject, quota: tr.dataset.quota,
  source: tr.dataset.source, cells: [...tr.cells].map((c) => c.textContent),
})));
try {
  const page = await (await browser.newContext({ viewport: { width: 1200, height: 820 } })).newPage();
  page.on("pageerror", (error) => log("page error:", String(error)));
  step("join");
  await page.goto(`${env.TW_NODE}/?tenant=demo&user=alice&room=audit&autoconnect=1`);
  await page.waitForSelector('#status[data-state="open"]', { timeout: STEP_MS });
  step("bob's denial shown");
  await page.waitForSelector('#denials[data-audit="on"] tr[data-subject="bob"]', { timeout: STEP_MS });
  result.before = await rows(page);
  step("flood");
  for (let i = 0; i < Number(env.TW_FLOOD); i += 1) {
    await page.fill("#send-input", `flood ${i}`);
    await page.press("#send-input", "Enter");
  }
  await page.waitForSelector('#notices li[data-type="rate_limited"]', { timeout: STEP_MS });
  step("alice's denials shown");
  await page.waitForSelector('#denials tr[data-subject="alice"][data-quota="messages"]', { timeout: STEP_MS });
  result.audit = await page.$eval("#denials", (t) => t.dataset.audit);
  result.rows = await rows(page);
  result.hint = await page.$eval("#denials-hint", (p) => p.textContent);
  mkdirSync(env.TW_SHOTS, { recursive: true });
  result.screenshot = join(env.TW_SHOTS, "audit-denials.png");
  await page.screenshot({ path: result.screenshot, fullPage: true });
  result.ok = true;
} catch (error) {
  result.error = String(error && error.stack || error);
} finally {
  await browser.close().catch(() => {});
}
console.log(JSON.stringify(result));
"##;

#[test]
fn the_last_denials_panel_shows_the_tenants_denials_in_chromium() {
    let _one_at_a_time = BROWSER.lock().unwrap_or_else(|e| e.into_inner());
    check_prerequisites();
    let redis = RedisServer::start();
    let gateway = GatewayProcess::start(&[
        "--redis-url",
        &redis.url(),
        "--redis-timeout-ms",
        "2000",
        "--audit",
        "--limit",
        "2/1h",
        "--message-limit",
        "3/1m",
    ]);
    // bob of tenant `demo` is denied over HTTP; so is mallory, of another
    // tenant, whom alice's page must never show.
    for tenant_user in [("demo", "bob"), ("other", "mallory")] {
        let statuses: Vec<u16> = (0..3)
            .map(|_| get_as(gateway.port(), "/api/hello", tenant_user.0, tenant_user.1).status)
            .collect();
        assert_eq!(statuses, [200, 200, 429], "{tenant_user:?}");
    }
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap()
        .join("demo-audit-screenshots");
    let _ = std::fs::remove_dir_all(&shots);
    let output = support::run_bounded(
        Command::new("node")
            .current_dir(browser_dir())
            .args(["--input-type=module", "-e", AUDIT_SCENARIO])
            .env("TW_NODE", gateway.url())
            .env("TW_CHROMIUM", CHROMIUM)
            .env("TW_FLOOD", "6")
            .env("TW_SHOTS", &shots),
        Duration::from_secs(90),
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let last = stdout.lines().last().unwrap_or_default();
    let result: Value = serde_json::from_str(last)
        .unwrap_or_else(|e| panic!("no JSON from the audit scenario ({e}):\n{stdout}\n{stderr}"));
    let context = format!(
        "{result:#}\nstderr:\n{stderr}\ngateway log:\n{}",
        gateway.log()
    );
    assert_eq!(result["ok"], true, "{context}");
    assert_eq!(result["audit"], "on", "{context}");

    // Before the flood: bob's one HTTP denial, by the `--limit` quota.
    let before = result["before"].as_array().unwrap();
    let before: Vec<(&str, &str)> = before
        .iter()
        .map(|r| (r["subject"].as_str().unwrap(), r["quota"].as_str().unwrap()))
        .collect();
    assert_eq!(before, [("bob", "default")], "{context}");
    // After: alice's message denials (3 of 6 past 3/1m; the panel may
    // have polled before the last ones were written), newest first, over
    // bob's; never mallory's.
    let rows = result["rows"].as_array().unwrap();
    let who: Vec<(&str, &str)> = rows
        .iter()
        .map(|r| (r["subject"].as_str().unwrap(), r["quota"].as_str().unwrap()))
        .collect();
    let alice = who
        .iter()
        .take_while(|w| **w == ("alice", "messages"))
        .count();
    assert!((1..=3).contains(&alice), "{context}");
    assert_eq!(who[alice..], [("bob", "default")], "{context}");
    let at: Vec<u64> = rows.iter().map(|r| r["at"].as_u64().unwrap()).collect();
    assert!(
        at.windows(2).all(|w| w[0] >= w[1]),
        "newest first: {context}"
    );
    for row in rows {
        let cells = row["cells"].as_array().unwrap();
        assert_eq!(cells.len(), 4, "{context}");
        assert!(
            cells.iter().all(|c| !c.as_str().unwrap().is_empty()),
            "{context}"
        );
        assert!(row["source"].as_str().unwrap().len() > 1, "{context}");
    }
    assert!(
        result["hint"].as_str().unwrap().contains("demo"),
        "{context}"
    );
    let shot = std::fs::read(result["screenshot"].as_str().unwrap()).unwrap();
    assert!(shot.starts_with(b"\x89PNG"), "{context}");
}
