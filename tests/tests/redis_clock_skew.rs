//! Invariant 3 (store clock) under real clock skew: two limiter processes
//! (`skew_node`) run under libfaketime with clocks 5 s ahead and 5 s behind,
//! share one Redis, and alternate checks on one key per algorithm. Because
//! the scripts read Redis `TIME`, they admit exactly the limit between them,
//! `remaining` counts down across the nodes, and every decision carries the
//! server's time. The second test runs the same nodes with `--caller-clock`
//! (the store given the node's own clock) and shows those checks fail then.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tower_window_tests::redis_server::RedisServer;

/// Every algorithm, one 3 s window each.
const QUOTAS: [&str; 4] = [
    "5/3s",
    "5/3s sliding-counter(1s)",
    "5/3s fixed-window",
    "5/3s gcra",
];
const LIMIT: usize = 5;
/// Checks per algorithm: the limit, then as many denials.
const CHECKS: usize = 2 * LIMIT;
const WINDOW_MICROS: u64 = 3_000_000;
const SKEW_MICROS: i64 = 5_000_000;
/// How long one reply from a node may take before the test fails.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// The libfaketime preload library, from `dpkg -L libfaketime` or known
/// install paths; panics with install instructions when it is missing.
fn libfaketime() -> PathBuf {
    let from_dpkg = Command::new("dpkg")
        .args(["-L", "libfaketime"])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .and_then(|out| {
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(PathBuf::from)
                .find(|p| p.file_name().is_some_and(|n| n == "libfaketime.so.1"))
        });
    let known = [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/faketime/libfaketime.so.1",
        "/usr/local/lib/faketime/libfaketime.so.1",
    ];
    from_dpkg
        .into_iter()
        .chain(known.iter().map(PathBuf::from))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "libfaketime.so.1 not found (tried `dpkg -L libfaketime` and {known:?}): \
                 the clock-skew test needs it. Install it with `apt-get install -y faketime` \
                 (or run `bash .ci/test`, which does)."
            )
        })
}

fn real_now_micros() -> i64 {
    let micros = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros();
    i64::try_from(micros).unwrap()
}

fn server_time(conn: &mut redis::Connection) -> i64 {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query(conn).unwrap();
    secs * 1_000_000 + micros
}

/// One `skew_node` process under libfaketime; killed on drop.
struct Node {
    name: String,
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
}

impl Node {
    fn spawn(lib: &Path, faketime: &str, caller_clock: bool, server: &RedisServer) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_skew_node"));
        if caller_clock {
            command.arg("--caller-clock");
        }
        let mut child = command
            .arg(server.url())
            .arg("skew:")
            .args(QUOTAS)
            .env("LD_PRELOAD", lib)
            .env("FAKETIME", faketime)
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn skew_node");
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self {
            name: format!("node FAKETIME={faketime}"),
            child,
            stdin,
            lines,
        }
    }

    /// Sends one command and returns its reply's words after the tag.
    fn request(&mut self, command: &str, tag: &str) -> Vec<i64> {
        writeln!(self.stdin, "{command}").unwrap();
        self.stdin.flush().unwrap();
        let line = self
            .lines
            .recv_timeout(REPLY_TIMEOUT)
            .unwrap_or_else(|e| panic!("{}: no reply to {command:?}: {e}", self.name));
        let mut words = line.split_whitespace();
        assert_eq!(
            words.next(),
            Some(tag),
            "{}: {command:?} -> {line:?}",
            self.name
        );
        words
            .map(|w| match w {
                "true" => 1,
                "false" => 0,
                n => n.parse().unwrap(),
            })
            .collect()
    }

    /// The node's own `SystemTime::now`, in µs.
    fn now(&mut self) -> i64 {
        self.request("now", "now")[0]
    }

    fn check(&mut self, quota: usize, subject: &str) -> Reply {
        let words = self.request(&format!("check {quota} {subject}"), "decision");
        Reply {
            allowed: words[0] == 1,
            remaining: words[1],
            timestamp: words[2],
            node_now: words[3],
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug, Clone, Copy)]
struct Reply {
    allowed: bool,
    remaining: i64,
    timestamp: i64,
    node_now: i64,
}

/// One decision with Redis `TIME` read just before and just after it.
#[derive(Debug, Clone, Copy)]
struct Row {
    node: usize,
    reply: Reply,
    before: i64,
    after: i64,
    /// The test's own (unskewed) clock just before and just after.
    real_before: i64,
    real_after: i64,
}

/// Spawns the nodes 5 s ahead and 5 s behind and checks that their own
/// clocks really are skewed (proves the injection works).
fn skewed_nodes(server: &RedisServer, caller_clock: bool) -> [Node; 2] {
    let lib = libfaketime();
    let mut nodes = [
        Node::spawn(&lib, "+5s", caller_clock, server),
        Node::spawn(&lib, "-5s", caller_clock, server),
    ];
    for (node, sign) in nodes.iter_mut().zip([1, -1]) {
        let t0 = real_now_micros();
        let node_now = node.now();
        let t1 = real_now_micros();
        // node_now = real + 5 s with real in [t0, t1] (mirrored for -5 s).
        let (low, high) = if sign > 0 {
            (node_now - t1, node_now - t0)
        } else {
            (t0 - node_now, t1 - node_now)
        };
        assert!(
            low > 4_000_000 && high < 6_000_000,
            "{}: its clock is off by {}..{} µs from the test's, not about {sign}x5 s: \
             libfaketime did not take effect",
            node.name,
            low,
            high
        );
    }
    nodes
}

/// Alternates `CHECKS` checks per algorithm between the nodes, one fresh
/// key per algorithm, all inside one 3 s window of Redis time.
fn run(server: &RedisServer, nodes: &mut [Node; 2], align: bool) -> Vec<Vec<Row>> {
    let mut conn = server.connection();
    if align {
        // Start within the first second of a fixed window, so the whole run
        // (milliseconds) stays inside it unless the machine stalls for 2 s.
        let into = u64::try_from(server_time(&mut conn)).unwrap() % WINDOW_MICROS;
        if into > 1_000_000 {
            std::thread::sleep(Duration::from_micros(WINDOW_MICROS - into + 20_000));
        }
    }
    let run_id = real_now_micros();
    (0..QUOTAS.len())
        .map(|quota| {
            let subject = format!("skewed-{run_id}-{quota}");
            (0..CHECKS)
                .map(|i| {
                    let node = i % 2;
                    let real_before = real_now_micros();
                    let before = server_time(&mut conn);
                    let reply = nodes[node].check(quota, &subject);
                    let after = server_time(&mut conn);
                    let real_after = real_now_micros();
                    Row {
                        node,
                        reply,
                        before,
                        after,
                        real_before,
                        real_after,
                    }
                })
                .collect()
        })
        .collect()
}

/// What the store-clock invariant requires of one algorithm's run: returns
/// the violations found in the decisions (admissions, `remaining`) and in
/// their timestamps; both empty when it holds.
fn violations(quota: &str, rows: &[Row]) -> (Vec<String>, Vec<String>) {
    let mut decisions = Vec::new();
    let allowed: Vec<bool> = rows.iter().map(|r| r.reply.allowed).collect();
    let expected: Vec<bool> = (0..CHECKS).map(|i| i < LIMIT).collect();
    if allowed != expected {
        decisions.push(format!(
            "{quota}: admissions {allowed:?}, expected exactly {LIMIT} then denials"
        ));
    }
    let remaining: Vec<i64> = rows.iter().map(|r| r.reply.remaining).collect();
    let expected: Vec<i64> = (0..CHECKS)
        .map(|i| (LIMIT as i64 - 1 - i as i64).max(0))
        .collect();
    if remaining != expected {
        decisions.push(format!(
            "{quota}: remaining {remaining:?} across alternating nodes, expected {expected:?}"
        ));
    }
    let mut stamps = Vec::new();
    let outside: Vec<String> = rows
        .iter()
        .enumerate()
        .filter(|(_, r)| !(r.before..=r.after).contains(&r.reply.timestamp))
        .map(|(i, r)| {
            let ts = r.reply.timestamp;
            let off = if ts < r.before {
                ts - r.before
            } else {
                ts - r.after
            };
            format!(
                "check {i} (node {}, own clock {}) at {ts}: {:+} ms",
                r.node,
                r.reply.node_now,
                off / 1000
            )
        })
        .collect();
    if !outside.is_empty() {
        stamps.push(format!(
            "{quota}: {} of {CHECKS} decisions not stamped with Redis TIME (first: {})",
            outside.len(),
            outside[0]
        ));
    }
    let far = rows
        .iter()
        .filter(|r| {
            !(r.real_before - 1_000_000..=r.real_after + 1_000_000).contains(&r.reply.timestamp)
        })
        .count();
    if far > 0 {
        stamps.push(format!(
            "{quota}: {far} of {CHECKS} decisions stamped more than 1 s from the test's clock"
        ));
    }
    (decisions, stamps)
}

/// The nodes' clocks are 10 s apart, yet one key per algorithm sees exact
/// admissions, a shared countdown and the server's timestamps.
#[test]
fn server_clock_decides_under_real_skew() {
    let server = RedisServer::start();
    let mut nodes = skewed_nodes(&server, false);
    let runs = run(&server, &mut nodes, true);
    // On Redis time, not the decisions' timestamps (those are under test).
    let first = runs[0][0].before;
    let last = runs[QUOTAS.len() - 1][CHECKS - 1].after;
    let window = |t: i64| u64::try_from(t).unwrap() / WINDOW_MICROS;
    assert_eq!(
        window(first),
        window(last),
        "the run crossed a 3 s window boundary of Redis time (the machine stalled for > 2 s)"
    );
    let found: Vec<String> = QUOTAS
        .iter()
        .zip(&runs)
        .flat_map(|(quota, rows)| {
            let (decisions, stamps) = violations(quota, rows);
            decisions.into_iter().chain(stamps)
        })
        .collect();
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// The same run with the store given each node's own clock
/// (`RedisStore::clock(SystemClock)`): the invariant's checks fail, so the
/// test above can fail: every algorithm's admissions or countdown go wrong
/// (the nodes' clocks, 10 s apart, fall in different windows; the fixed
/// window admits more than its limit), and the timestamps are the nodes'.
#[test]
fn caller_clock_breaks_under_real_skew() {
    let server = RedisServer::start();
    let mut nodes = skewed_nodes(&server, true);
    let runs = run(&server, &mut nodes, false);
    for (quota, rows) in QUOTAS.iter().zip(&runs) {
        let (decisions, stamps) = violations(quota, rows);
        assert!(
            !decisions.is_empty(),
            "{quota}: caller clocks 10 s apart still gave exact admissions and a shared countdown"
        );
        assert_eq!(
            stamps.len(),
            2,
            "{quota}: caller clocks 10 s apart should stamp every decision off Redis TIME \
             and off the test's clock: {stamps:?}"
        );
        let (ahead, behind) = (rows[0].reply.timestamp, rows[1].reply.timestamp);
        let apart = ahead - behind;
        assert!(
            (2 * SKEW_MICROS - 2_000_000..2 * SKEW_MICROS + 2_000_000).contains(&apart),
            "{quota}: decisions of the two nodes are {apart} µs apart, not about 10 s"
        );
    }
    let fixed = &runs[2];
    let admitted = fixed.iter().filter(|r| r.reply.allowed).count();
    assert!(
        admitted > LIMIT,
        "5/3s fixed-window on caller clocks 10 s apart admitted only {admitted}: {fixed:?}"
    );
}
