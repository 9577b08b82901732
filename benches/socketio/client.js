// The load client of the rooms comparison (issue 24): drives the gateway's
// WebSocket rooms (`ws`) and Socket.IO 4 (`socket.io-client`) the same way,
// in one run, and checks that every message reached every socket in order.
//
//   node client.js --gateway ws://A,ws://B --socketio http://C,http://D [options]
//
// Per system and round: SOCKETS sockets join one fresh room, alternately on
// the system's two nodes; socket 0 (on the first node) is also the one
// publisher, so it receives its own messages like every other socket.
//  1. warm-up: a message every 50 ms until every socket has one (a node
//     picks up a room it was not reading within its reader's next turn);
//  2. latency: LATENCY_MESSAGES at RATE messages/s, each carrying its send
//     time (one monotonic clock for all threads); p50/p99/max over every
//     delivery to every socket;
//  3. saturation: MESSAGES as fast as the slowest socket keeps up with, at
//     most WINDOW messages ahead of it (both systems keep a room's backlog
//     per socket: the gateway closes a socket more than 1024 events behind,
//     Socket.IO buffers without bound, so an open loop would measure
//     buffers, not delivery); deliveries/s = SOCKETS x MESSAGES / (first
//     send to the last socket's last receipt).
// Any gap, repeat, reordering, unexpected frame or close, or a phase not
// done within its time bound, stops the run with exit code 1.
// The receiving sockets run in worker threads so that the client is not
// one core's worth of JSON parsing for 40 sockets.
//
// Options (defaults): --sockets 40, --workers 2, --rounds 3 (interleaved,
// the first system alternating), --rate 250, --latency-messages 5000,
// --messages 20000, --window 256 (at most 1000), --phase-timeout 120 (s),
// --only gateway|socketio, --pids gateway=P,P;socketio=P,P;redis=P (CPU
// per delivery from /proc), --redis URL (Redis's own time per message from
// INFO commandstats). run.sh passes the URLs, --pids and --redis.
"use strict";

const { Worker, isMainThread, parentPort, workerData } = require("node:worker_threads");
const WebSocket = require("ws");
const { io } = require("socket.io-client");

const nowUs = () => Number(process.hrtime.bigint() / 1000n);
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
// Waits poll every millisecond rather than spin: the client shares the
// machine's cores with the servers it measures.
const tick = () => sleep(1);

// ---------------------------------------------------------------- a socket

// Connects socket `index` to `url`; resolves once it is in the room.
// `progress[index]` is the last measured seq received (0 before the first);
// `lastAt[index]` its receipt time (µs); `latency(seq, us)` is called for
// every measured delivery. `fail(reason)` stops the run.
function connect(system, url, room, index, shared, latency, fail) {
  const user = `u${index}`;
  let expected = 1;
  let warm = false;
  let closing = false;
  const receive = (data) => {
    if (typeof data !== "string") return fail(`socket ${index}: non-text data ${typeof data}`);
    if (data.startsWith("w:")) {
      if (expected !== 1) return fail(`socket ${index}: warm-up ${data} after measured message ${expected - 1}`);
      warm = true;
      Atomics.store(shared.warm, index, 1);
      return;
    }
    const colon = data.indexOf(":");
    const seq = Number(data.slice(0, colon));
    const sentUs = Number(data.slice(colon + 1));
    if (seq !== expected) {
      return fail(`socket ${index} (${system}): got message ${seq}, expected ${expected} (gap, repeat or reorder)`);
    }
    if (!warm) return fail(`socket ${index}: measured message ${seq} before any warm-up`);
    expected += 1;
    const at = nowUs();
    latency(seq, at - sentUs);
    Atomics.store(shared.lastAt, index, BigInt(at));
    Atomics.store(shared.progress, index, seq);
  };
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`socket ${index}: no join within 10 s`)), 10_000);
    if (system === "gateway") {
      const ws = new WebSocket(`${url}/ws?room=${room}`, {
        headers: { "x-user-id": user },
        perMessageDeflate: false,
      });
      ws.on("message", (raw, isBinary) => {
        if (isBinary) return fail(`socket ${index}: binary frame`);
        const frame = JSON.parse(raw.toString());
        if (frame.type === "event") return receive(frame.data);
        if (frame.type === "joined") {
          clearTimeout(timer);
          return resolve({ close: () => ((closing = true), ws.close()), send: (text) => ws.send(text) });
        }
        fail(`socket ${index} (gateway): unexpected frame ${raw}`);
      });
      ws.on("close", (code, reason) => closing || fail(`socket ${index} (gateway): closed ${code} ${reason}`));
      ws.on("error", (error) => fail(`socket ${index} (gateway): ${error.message}`));
    } else {
      const socket = io(url, {
        transports: ["websocket"],
        query: { room, user },
        forceNew: true,
        reconnection: false,
      });
      socket.on("event", (event) => receive(event.data));
      socket.on("connect", () => {
        clearTimeout(timer);
        resolve({ close: () => ((closing = true), socket.disconnect()), send: (text) => socket.emit("pub", text) });
      });
      socket.on("disconnect", (reason) => closing || fail(`socket ${index} (socket.io): disconnected: ${reason}`));
      socket.on("connect_error", (error) => fail(`socket ${index} (socket.io): ${error.message}`));
    }
  });
}

function sharedState(sab) {
  const n = sab.progress.length / Int32Array.BYTES_PER_ELEMENT;
  return {
    progress: new Int32Array(sab.progress),
    warm: new Int32Array(sab.warm),
    lastAt: new BigInt64Array(sab.lastAt),
    n,
  };
}

// A latency recorder for the measured seqs [first, last].
function recorder(first, last) {
  const samples = [];
  return {
    samples,
    record: (seq, us) => {
      if (seq >= first && seq <= last) samples.push(us);
    },
  };
}

// ------------------------------------------------------------------ worker

if (!isMainThread) {
  const { system, room, sockets, sab, latencyFirst, latencyLast } = workerData;
  const shared = sharedState(sab);
  const fail = (reason) => {
    parentPort.postMessage({ fail: reason });
  };
  const lat = recorder(latencyFirst, latencyLast);
  Promise.all(sockets.map(({ index, url }) => connect(system, url, room, index, shared, lat.record, fail)))
    .then((conns) => {
      parentPort.postMessage({ ready: true });
      parentPort.on("message", (message) => {
        if (message.done) {
          conns.forEach((c) => c.close());
          const samples = Float64Array.from(lat.samples);
          parentPort.postMessage({ samples }, [samples.buffer]);
        }
      });
    })
    .catch((error) => fail(error.message));
  return;
}

// -------------------------------------------------------------------- main

function parseArgs(argv) {
  const options = {
    gateway: null,
    socketio: null,
    sockets: 40,
    workers: 2,
    rounds: 3,
    rate: 250,
    latencyMessages: 5000,
    messages: 20000,
    window: 256,
    phaseTimeout: 120,
    only: null,
    pids: null,
    redis: null,
  };
  const names = {
    "--gateway": "gateway",
    "--socketio": "socketio",
    "--sockets": "sockets",
    "--workers": "workers",
    "--rounds": "rounds",
    "--rate": "rate",
    "--latency-messages": "latencyMessages",
    "--messages": "messages",
    "--window": "window",
    "--phase-timeout": "phaseTimeout",
    "--only": "only",
    "--pids": "pids",
    "--redis": "redis",
  };
  for (let i = 0; i < argv.length; i += 2) {
    const key = names[argv[i]];
    if (!key || argv[i + 1] === undefined) throw new Error(`unknown or incomplete option ${argv[i]}`);
    options[key] = ["gateway", "socketio"].includes(key) ? argv[i + 1].split(",") : ["only", "pids", "redis"].includes(key) ? argv[i + 1] : Number(argv[i + 1]);
    if (typeof options[key] === "number" && !(Number.isInteger(options[key]) && options[key] > 0)) {
      throw new Error(`${argv[i]} ${argv[i + 1]}: expected a positive whole number`);
    }
  }
  if (options.only !== null && !["gateway", "socketio"].includes(options.only)) throw new Error("--only takes gateway or socketio");
  for (const system of ["gateway", "socketio"]) {
    if (options.only !== null && options.only !== system) continue;
    if (!options[system] || options[system].length !== 2) throw new Error(`--${system} takes two node URLs, comma-separated`);
  }
  // --pids gateway=P,P;socketio=P,P;redis=P: CPU time of those processes
  // is read from /proc around the saturation phase.
  if (options.pids !== null) {
    const pids = {};
    for (const part of options.pids.split(";")) {
      const [name, list] = part.split("=");
      pids[name] = list.split(",").map(Number);
    }
    options.pids = pids;
  }
  if (options.window > 1000) throw new Error("--window above 1000 would overflow the gateway's 1024-event socket queue");
  return options;
}

let failed = false;
function failRun(reason) {
  if (failed) return;
  failed = true;
  console.error(`FAILED: ${reason}`);
  process.exit(1);
}

async function until(what, done, seconds) {
  const deadline = Date.now() + seconds * 1000;
  while (!done()) {
    if (Date.now() > deadline) failRun(`${what}: not done within ${seconds} s`);
    await tick();
  }
}

// CPU seconds (user + system) the processes `pids` have used so far.
const fs = require("node:fs");
const TICKS = 100; // USER_HZ on Linux
function cpuSeconds(pids) {
  let ticks = 0;
  for (const pid of pids) {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, "utf8");
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    ticks += Number(fields[11]) + Number(fields[12]); // utime, stime
  }
  return ticks / TICKS;
}
const cpuNow = (o, system) =>
  o.pids ? { server: cpuSeconds(o.pids[system]), redis: cpuSeconds(o.pids.redis), client: process.cpuUsage() } : null;

// Redis's own count and time of every command so far (`INFO
// commandstats`): what the server spent, whatever the machine's load did
// to the wall clock. Per command name: [calls, usec].
async function commandStats(redis) {
  if (!redis) return null;
  const text = await redis.sendCommand(["INFO", "commandstats"]);
  const stats = new Map();
  for (const m of text.matchAll(/^cmdstat_([^:]+):calls=(\d+),usec=(\d+)/gm)) {
    stats.set(m[1], [Number(m[2]), Number(m[3])]);
  }
  return stats;
}

// The top-level commands between two `commandStats`: a script's
// (`EVALSHA`, `EVAL`) time includes the commands it runs, which Redis also
// counts under their own names, so those are not added again. The
// gateway's appends are scripts (their XADD inside), Socket.IO's are
// plain XADDs; both read with XREAD.
function topLevel(before, after, system) {
  const names = ["evalsha", "eval", "xread", ...(system === "socketio" ? ["xadd"] : [])];
  let calls = 0;
  let usec = 0;
  for (const name of names) {
    const [c0, u0] = before.get(name) ?? [0, 0];
    const [c1, u1] = after.get(name) ?? [0, 0];
    calls += c1 - c0;
    usec += u1 - u0;
  }
  return { calls, usec };
}

function percentile(sorted, p) {
  return sorted[Math.min(sorted.length - 1, Math.round((sorted.length - 1) * p))];
}

async function runOne(system, urls, round, o) {
  const room = `bench-${system}-${process.pid}-${round}`;
  const latencyFirst = 1;
  const latencyLast = o.latencyMessages;
  const total = o.latencyMessages + o.messages;
  const sab = {
    progress: new SharedArrayBuffer(o.sockets * Int32Array.BYTES_PER_ELEMENT),
    warm: new SharedArrayBuffer(o.sockets * Int32Array.BYTES_PER_ELEMENT),
    lastAt: new SharedArrayBuffer(o.sockets * BigInt64Array.BYTES_PER_ELEMENT),
  };
  const shared = sharedState(sab);
  const all = (f) => {
    for (let i = 0; i < o.sockets; i++) if (!f(i)) return false;
    return true;
  };
  const minProgress = () => {
    let min = Infinity;
    for (let i = 0; i < o.sockets; i++) min = Math.min(min, Atomics.load(shared.progress, i));
    return min;
  };
  // Sockets 1.. over the workers; socket i on node i % 2 (socket 0, the
  // publisher, on the first node): half the room on each node.
  const plan = Array.from({ length: o.workers }, () => []);
  for (let index = 1; index < o.sockets; index++) {
    plan[index % o.workers].push({ index, url: urls[index % 2] });
  }
  const workers = plan
    .filter((sockets) => sockets.length > 0)
    .map((sockets) => new Worker(__filename, { workerData: { system, room, sockets, sab, latencyFirst, latencyLast } }));
  let ready = 0;
  const samples = [];
  for (const worker of workers) {
    worker.on("message", (m) => {
      if (m.fail) failRun(m.fail);
      if (m.ready) ready += 1;
      if (m.samples) samples.push(m.samples);
    });
    worker.on("error", (error) => failRun(`worker: ${error.message}`));
  }
  const own = recorder(latencyFirst, latencyLast);
  let publisher;
  try {
    publisher = await connect(system, urls[0], room, 0, shared, own.record, failRun);
  } catch (error) {
    failRun(error.message);
  }
  await until(`${system}: ${o.sockets} sockets joining`, () => ready === workers.length, 30);

  // 1. Warm-up: until every socket has had one.
  for (let k = 0; !all((i) => Atomics.load(shared.warm, i) === 1); k++) {
    if (k >= 200) failRun(`${system}: a warm-up message not received by every socket within 10 s`);
    publisher.send(`w:${k}`);
    await sleep(50);
  }

  // 2. Latency at a fixed rate (send times scheduled from the start, so a
  // late timer does not slow the rate down).
  const periodUs = 1e6 / o.rate;
  const startUs = nowUs();
  for (let seq = latencyFirst; seq <= latencyLast; seq++) {
    const waitUs = startUs + (seq - 1) * periodUs - nowUs();
    if (waitUs >= 1000) await sleep(Math.floor(waitUs / 1000));
    publisher.send(`${seq}:${nowUs()}`);
  }
  await until(`${system}: latency phase delivered to every socket`, () => minProgress() >= latencyLast, o.phaseTimeout);

  // 3. Saturation, at most WINDOW messages ahead of the slowest socket.
  const statsBefore = await commandStats(o.redisClient);
  const cpuBefore = cpuNow(o, system);
  const firstUs = nowUs();
  let next = latencyLast + 1;
  const deadline = Date.now() + o.phaseTimeout * 1000;
  while (next <= total) {
    const limit = Math.min(total, minProgress() + o.window);
    while (next <= limit) {
      publisher.send(`${next}:${nowUs()}`);
      next += 1;
    }
    if (Date.now() > deadline) failRun(`${system}: saturation phase not done within ${o.phaseTimeout} s`);
    await tick();
  }
  await until(`${system}: saturation phase delivered to every socket`, () => minProgress() >= total, o.phaseTimeout);
  let lastUs = 0;
  for (let i = 0; i < o.sockets; i++) lastUs = Math.max(lastUs, Number(Atomics.load(shared.lastAt, i)));
  const cpuAfter = cpuNow(o, system);
  const statsAfter = await commandStats(o.redisClient);
  // Nothing more may arrive (a repeat would fail the socket that gets it).
  await sleep(200);
  if (!all((i) => Atomics.load(shared.progress, i) === total)) failRun(`${system}: a socket got more than ${total} messages`);

  // Collect.
  workers.forEach((w) => w.postMessage({ done: true }));
  await until(`${system}: workers reporting`, () => samples.length === workers.length, 10);
  publisher.close();
  await Promise.all(workers.map((w) => w.terminate()));
  let count = own.samples.length;
  for (const s of samples) count += s.length;
  const latencies = new Float64Array(count);
  latencies.set(own.samples, 0);
  let at = own.samples.length;
  for (const s of samples) {
    latencies.set(s, at);
    at += s.length;
  }
  latencies.sort();
  if (count !== o.sockets * o.latencyMessages) failRun(`${system}: ${count} latency samples, expected ${o.sockets * o.latencyMessages}`);
  const seconds = (lastUs - firstUs) / 1e6;
  return {
    system,
    round,
    deliveries: o.sockets * total,
    perSecond: (o.sockets * o.messages) / seconds,
    seconds,
    p50: percentile(latencies, 0.5) / 1000,
    p99: percentile(latencies, 0.99) / 1000,
    max: latencies[latencies.length - 1] / 1000,
    // CPU of the saturation phase: both server nodes together, and Redis,
    // in µs per delivery; the client's main thread's share is not counted.
    serverUs: cpuAfter ? ((cpuAfter.server - cpuBefore.server) * 1e6) / (o.sockets * o.messages) : null,
    redisUs: cpuAfter ? ((cpuAfter.redis - cpuBefore.redis) * 1e6) / (o.sockets * o.messages) : null,
    // Per message published in the saturation phase.
    redisCalls: statsAfter ? topLevel(statsBefore, statsAfter, system).calls / o.messages : null,
    redisCallUs: statsAfter ? topLevel(statsBefore, statsAfter, system).usec / o.messages : null,
    clientUs: cpuAfter
      ? ((cpuAfter.client.user + cpuAfter.client.system - cpuBefore.client.user - cpuBefore.client.system) / (o.sockets * o.messages))
      : null,
    wallShare: cpuAfter ? (cpuAfter.server - cpuBefore.server + cpuAfter.redis - cpuBefore.redis) / seconds : null,
  };
}

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

async function main() {
  let o;
  try {
    o = parseArgs(process.argv.slice(2));
  } catch (error) {
    console.error(`client.js: ${error.message}`);
    process.exit(2);
  }
  if (o.redis) {
    const { createClient } = require("redis");
    o.redisClient = createClient({ url: o.redis });
    o.redisClient.on("error", (error) => failRun(`redis: ${error.message}`));
    await o.redisClient.connect();
  }
  const results = [];
  for (let round = 1; round <= o.rounds; round++) {
    // Interleaved, and the order alternates, so neither system always
    // runs on a machine warmed (or loaded) by the other.
    const order = (round % 2 ? ["gateway", "socketio"] : ["socketio", "gateway"]).filter((s) => o.only === null || o.only === s);
    for (const system of order) {
      const r = await runOne(system, o[system], round, o);
      results.push(r);
      console.error(
        `round ${round} ${system}: ${r.perSecond.toFixed(0)} deliveries/s, p50 ${r.p50.toFixed(2)} ms, p99 ${r.p99.toFixed(2)} ms, ` +
          `${r.deliveries} deliveries checked in order`,
      );
    }
  }
  const f = (x, d = 2) => x.toFixed(d);
  const cpu = o.pids !== null;
  const stats = o.redisClient !== undefined;
  console.log(
    `| round | system | deliveries/s (saturating) | p50 ms @ ${o.rate}/s | p99 ms @ ${o.rate}/s | max ms | deliveries checked |` +
      (cpu ? " nodes' CPU µs/delivery | Redis CPU µs/delivery | client CPU µs/delivery | cores busy (nodes + Redis) |" : "") +
      (stats ? " Redis calls/message | Redis µs/message (commandstats) |" : ""),
  );
  console.log("|---|---|---|---|---|---|---|" + (cpu ? "---|---|---|---|" : "") + (stats ? "---|---|" : ""));
  for (const r of results) {
    console.log(
      `| ${r.round} | ${r.system === "gateway" ? "gateway rooms" : "Socket.IO"} | ${f(r.perSecond, 0)} | ${f(r.p50)} | ${f(r.p99)} | ${f(r.max)} | ${r.deliveries} |` +
        (cpu ? ` ${f(r.serverUs)} | ${f(r.redisUs)} | ${f(r.clientUs)} | ${f(r.wallShare)} |` : "") +
        (stats ? ` ${f(r.redisCalls)} | ${f(r.redisCallUs, 1)} |` : ""),
    );
  }
  if (o.only !== null) process.exit(0);
  console.log("");
  console.log("| round | gateway / Socket.IO deliveries/s (target >= 1.2) | gateway / Socket.IO p99 (target <= 0.7) |");
  console.log("|---|---|---|");
  const ratios = [];
  for (let round = 1; round <= o.rounds; round++) {
    const g = results.find((r) => r.round === round && r.system === "gateway");
    const s = results.find((r) => r.round === round && r.system === "socketio");
    ratios.push([g.perSecond / s.perSecond, g.p99 / s.p99]);
    console.log(`| ${round} | ${f(g.perSecond / s.perSecond)} | ${f(g.p99 / s.p99)} |`);
  }
  console.log(`| median | ${f(median(ratios.map((r) => r[0])))} | ${f(median(ratios.map((r) => r[1])))} |`);
  process.exit(0);
}

main().catch((error) => failRun(error.stack || String(error)));
