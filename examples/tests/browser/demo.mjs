// Drives the gateway demo page in Debian's chromium through playwright-core
// (no browser download). Run by examples/tests/demo_browser.rs, which starts
// one redis-server and two gateway processes and asserts on the JSON this
// prints as its last stdout line.
//
//   node demo.mjs --node-a URL --node-a-pid PID --node-b URL --redis-port PORT \
//        --screenshots DIR [--chromium /usr/bin/chromium] [--flood N]
//
// Scenario:
//   1. alice's page is served by node A and lists [A, B]; bob's by node B
//      and lists [B, A]; both join room `lobby` of tenant `demo`.
//   2. alice types a message: bob's page shows it; bob answers: alice sees it.
//   3. alice floods: her page shows the rate_limited notice.
//   4. node A is frozen (SIGSTOP): alice's socket is open but silent; bob
//      sends messages alice misses; node A is killed (SIGKILL).
//   5. alice's page reconnects to node B with last_event_id and epoch and
//      shows "recovered N messages": the missed ones, in order; bob's next
//      message reaches her live through node B.
//   6. The room's keys are deleted in Redis and alice's socket dropped: her
//      resume gets "history lost: resynced", then live messages again.
// Every wait is bounded; any failure prints {"ok":false,"error":...}.

import { chromium } from "playwright-core";
import { execFileSync } from "node:child_process";
import { mkdirSync } from "node:fs";
import { join } from "node:path";

const STEP_MS = 15_000;

function args() {
  const out = { chromium: "/usr/bin/chromium", flood: 15 };
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; i += 2) {
    const key = argv[i].replace(/^--/, "").replace(/-([a-z])/g, (_, c) => c.toUpperCase());
    out[key] = argv[i + 1];
  }
  for (const required of ["nodeA", "nodeAPid", "nodeB", "redisPort", "screenshots"]) {
    if (!out[required]) throw new Error(`missing --${required}`);
  }
  out.flood = Number(out.flood);
  out.nodeAPid = Number(out.nodeAPid);
  return out;
}

const log = (...parts) => console.error("[demo.mjs]", ...parts);

async function ids(page) {
  return page.$$eval("#messages li[data-id]", (lis) => lis.map((li) => li.dataset.id));
}

async function texts(page) {
  return page.$$eval("#messages li[data-id] .text", (els) => els.map((e) => e.textContent));
}

async function say(page, text) {
  await page.fill("#send-input", text);
  await page.press("#send-input", "Enter");
}

async function waitForText(page, text) {
  await page.waitForFunction(
    (t) => [...document.querySelectorAll("#messages li .text")].some((e) => e.textContent === t),
    text,
    { timeout: STEP_MS },
  );
}

async function waitForCount(page, n) {
  await page.waitForFunction(
    (n) => document.querySelectorAll("#messages li[data-id]").length >= n,
    n,
    { timeout: STEP_MS },
  );
}

// Deletes every key whose name holds `room` (the room's stream and its
// epoch, whatever the gateway names them); the count deleted.
function deleteRoomKeys(port, room) {
  const cli = (...args) =>
    execFileSync("redis-cli", ["-p", String(port), ...args], { encoding: "utf8", timeout: 10_000 });
  const keys = cli("--scan", "--pattern", `*${room}*`)
    .split("\n")
    .filter((k) => k.length > 0);
  for (const key of keys) cli("del", key);
  return keys.length;
}

async function main() {
  const opts = args();
  mkdirSync(opts.screenshots, { recursive: true });
  const screenshots = [];
  const result = { ok: false, steps: [] };
  const step = (name) => {
    result.steps.push(name);
    log("step", name);
  };

  const browser = await chromium.launch({
    executablePath: opts.chromium,
    headless: true,
    args: [
      "--headless",
      "--no-sandbox",
      "--disable-gpu",
      "--disable-quic",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
    ],
  });
  const shoot = async (page, name) => {
    const path = join(opts.screenshots, `${name}.png`);
    await page.screenshot({ path, fullPage: true });
    screenshots.push(path);
  };
  try {
    const nodes = (first, second) => encodeURIComponent(`${first},${second}`);
    const pageUrl = (node, user, list) =>
      `${node}/?tenant=demo&user=${user}&room=lobby&nodes=${list}&autoconnect=1`;
    const viewport = { width: 1200, height: 820 };
    const alice = await (await browser.newContext({ viewport })).newPage();
    const bob = await (await browser.newContext({ viewport })).newPage();
    for (const [name, page] of [["alice", alice], ["bob", bob]]) {
      page.on("pageerror", (error) => log(name, "page error:", String(error)));
      page.on("console", (msg) => {
        if (msg.type() === "error") log(name, "console:", msg.text());
      });
    }

    // 1. Both pages join the room, each on its own node.
    step("join");
    await alice.goto(pageUrl(opts.nodeA, "alice", nodes(opts.nodeA, opts.nodeB)));
    await bob.goto(pageUrl(opts.nodeB, "bob", nodes(opts.nodeB, opts.nodeA)));
    for (const page of [alice, bob]) {
      await page.waitForSelector('#status[data-state="open"]', { timeout: STEP_MS });
      // `joined` gave the page its position.
      await page.waitForFunction(() => document.getElementById("epoch").textContent !== "–", null, {
        timeout: STEP_MS,
      });
    }
    result.aliceNodeBefore = await alice.evaluate(() => document.body.dataset.node);
    result.bobNode = await bob.evaluate(() => document.body.dataset.node);
    await shoot(alice, "1-alice-joined");

    // 2. A message typed in one page appears in the other.
    step("chat");
    await say(alice, "hello from alice on node A");
    await waitForText(bob, "hello from alice on node A");
    await say(bob, "hi alice, bob here on node B");
    await waitForText(alice, "hi alice, bob here on node B");
    result.chatSeenByBob = true;
    result.chatSeenByAlice = true;
    // Presence: bob's page sees alice online (GET /presence, polled).
    await bob
      .waitForSelector('#presence li[data-user="alice"][data-online="true"]', { timeout: STEP_MS })
      .then(() => (result.bobSeesAliceOnline = true))
      .catch(() => (result.bobSeesAliceOnline = false));
    // The quota panel filled from GET /api/quota.
    await alice
      .waitForSelector("#quotas tr[data-quota]", { timeout: STEP_MS })
      .then(() => (result.quotaRows = true))
      .catch(() => (result.quotaRows = false));
    result.quotasBeforeFlood = await alice.$$eval("#quotas tr[data-quota]", (rows) =>
      rows.map((r) => ({ quota: r.dataset.quota, remaining: Number(r.dataset.remaining) })),
    );
    await shoot(bob, "2-bob-chat");

    // 3. alice floods: the rate-limit notice shows.
    step("flood");
    for (let i = 1; i <= opts.flood; i += 1) {
      await say(alice, `flood ${i}`);
    }
    await alice.waitForSelector('#notices li[data-type="rate_limited"]', { timeout: STEP_MS });
    result.rateLimitedNotices = await alice.$$eval(
      '#notices li[data-type="rate_limited"]',
      (lis) => lis.length,
    );
    result.exhaustedQuotas = await alice.$$eval('#quotas tr[data-exhausted="true"]', (rows) =>
      rows.map((r) => r.dataset.quota),
    );
    // Let every admitted flood message reach both pages.
    await alice.waitForTimeout(500);
    const settle = async () => {
      for (let i = 0; i < 50; i += 1) {
        const [a, b] = [await ids(alice), await ids(bob)];
        if (a.length === b.length && a.join() === b.join()) return a;
        await alice.waitForTimeout(100);
      }
      throw new Error(`pages disagree: alice ${await ids(alice)} bob ${await ids(bob)}`);
    };
    const beforeStop = await settle();
    result.admittedFlood = (await texts(bob)).filter((t) => t.startsWith("flood ")).length;
    await shoot(alice, "3-alice-rate-limited");

    // 4. Node A goes silent, bob talks, node A dies.
    step("stop-node-a");
    process.kill(opts.nodeAPid, "SIGSTOP");
    const missed = ["missed 1", "missed 2", "missed 3"];
    for (const text of missed) {
      await say(bob, text);
      await waitForText(bob, text);
    }
    // alice's socket is still open to the frozen node: nothing arrived.
    result.aliceCountWhileFrozen = (await ids(alice)).length;
    process.kill(opts.nodeAPid, "SIGKILL");

    // 5. alice reconnects to node B and recovers exactly what she missed.
    step("failover");
    await alice.waitForSelector('#recovery[data-state="recovered"], #recovery[data-state="resync"]', {
      timeout: STEP_MS,
    });
    await waitForCount(alice, beforeStop.length + missed.length);
    await alice.waitForSelector('#status[data-state="open"]', { timeout: STEP_MS });
    result.aliceNodeAfter = await alice.evaluate(() => document.body.dataset.node);
    result.recovery = await alice.$eval("#recovery", (el) => ({
      state: el.dataset.state,
      count: el.dataset.count === undefined ? null : Number(el.dataset.count),
      reason: el.dataset.reason ?? null,
      text: el.textContent,
    }));
    result.aliceIds = await ids(alice);
    result.bobIds = await ids(bob);
    result.aliceTexts = await texts(alice);
    result.bobTexts = await texts(bob);
    result.aliceHistory = await alice.$$eval('#messages li[data-history="true"] .text', (els) =>
      els.map((e) => e.textContent),
    );
    result.missed = missed;
    await shoot(alice, "4-alice-recovered-on-b");

    // And the conversation goes on live over node B (alice's own message
    // quota is still spent by the flood).
    step("after-failover");
    await say(bob, "welcome back, alice");
    await waitForText(alice, "welcome back, alice");
    result.chatAfterFailover = true;
    await shoot(bob, "5-bob-after-failover");

    // 6. History lost: the room's keys vanish from Redis (as a failover
    //    that lost data would), alice's socket drops, and her resume is
    //    answered with resync, never "recovered".
    step("history-lost");
    const deleted = deleteRoomKeys(opts.redisPort, "lobby");
    result.deletedRoomKeys = deleted;
    await alice.evaluate(() => window.towerWindowDemo.socket.close(4000, "test: drop"));
    await alice.waitForSelector('#recovery[data-state="resync"]', { timeout: STEP_MS });
    result.resync = await alice.$eval("#recovery", (el) => ({
      state: el.dataset.state,
      reason: el.dataset.reason ?? null,
      text: el.textContent,
    }));
    await alice.waitForSelector('#status[data-state="open"]', { timeout: STEP_MS });
    await say(bob, "after the history was lost");
    await waitForText(alice, "after the history was lost");
    result.liveAfterResync = true;
    await shoot(alice, "6-alice-history-lost");
    result.ok = true;
  } catch (error) {
    result.error = String(error && error.stack ? error.stack : error);
    for (const [i, context] of browser.contexts().entries()) {
      for (const page of context.pages()) {
        await shoot(page, `failure-page-${i}`).catch(() => {});
      }
    }
  } finally {
    result.screenshots = screenshots;
    await browser.close().catch(() => {});
  }
  console.log(JSON.stringify(result));
}

// A hard stop, whatever hangs.
const watchdog = setTimeout(() => {
  console.log(JSON.stringify({ ok: false, error: "demo.mjs watchdog: 120 s" }));
  process.exit(2);
}, 120_000);
watchdog.unref();

main().catch((error) => {
  console.log(JSON.stringify({ ok: false, error: String(error) }));
  process.exitCode = 1;
});
