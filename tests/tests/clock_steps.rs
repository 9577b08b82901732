//! Issue 22, defect 6: clock steps. A failover to a primary whose clock is
//! behind, or an NTP step, moves "now" by hours or days in one go, back or
//! forward. Every algorithm's script must then do work bounded by the
//! state it holds, never by the distance between two timestamps (a script
//! that has written cannot be killed: Redis would be blocked for as long),
//! and decide exactly as its Rust twin ([`MemoryStore`]).
//!
//! How work is measured, deterministically: on a `redis-server` of its
//! own, `CONFIG RESETSTAT` before each call and `INFO commandstats` after
//! count the Redis commands the script issued (each reads at most 128
//! fields, or the whole state once). The bound is asserted per call; a
//! client-side deadline per call is only the fail-safe that ends the test
//! if a script runs away (the server is killed on drop).
//!
//! The Rust twin's loops are counted by unit tests in
//! `tower-window/src/algorithm/timeline.rs` (a test-only counter).
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use proptest::prelude::*;
use tower_window::limit::Backend as _;
use tower_window::store::Guard;
use tower_window::{
    CheckRequest, Cost, Decision, ManualClock, MemoryStore, Policy, Quota, RedisStore, WindowKey,
};
use tower_window_tests::redis_server::RedisServer;

/// 1_700_000_000 s (a multiple of every window and bucket here).
const START: u64 = 1_700_000_000_000_000;
const MS: i64 = 1_000;
const HOUR: i64 = 3_600_000_000;
const DAY: i64 = 24 * HOUR;
/// ~12.7 days: the "2^40 µs" step of the issue.
const P40: i64 = 1 << 40;
/// The most Redis commands one script call may issue for the small states
/// of these tests (a few slots): a handful of reads and writes, whatever
/// the clock did. Before the fix, a step of one hour back on 1 ms buckets
/// took ~28,000 `HMGET`s.
const MAX_COMMANDS_PER_CALL: u64 = 16;
/// The fail-safe per call: far above any bounded script.
const DEADLINE: Duration = Duration::from_secs(20);

/// Every algorithm, with the finest buckets a quota allows (1 ms, and the
/// most buckets per key), µs timestamps in the logs, and windows from 1 s
/// to a day (so day steps land inside and outside them).
const QUOTAS: &[&str] = &[
    "5/1s sliding-counter(1ms)",
    "8/3600ms sliding-counter(1ms)",
    "6/1h sliding-counter(1s)",
    "5/1s",
    "7/1d",
    "5/1s fixed-window",
    "4/1d fixed-window",
    "5/1s gcra",
    "3/1h gcra(burst=6)",
];

/// Redis commands issued since the last `CONFIG RESETSTAT`, not counting
/// the script call itself and the test's own inspection.
fn commands(conn: &mut redis::Connection) -> (u64, String) {
    let stats: String = redis::cmd("INFO").arg("commandstats").query(conn).unwrap();
    let mut total = 0;
    let mut seen = Vec::new();
    for line in stats.lines() {
        let Some(rest) = line.strip_prefix("cmdstat_") else {
            continue;
        };
        let (name, fields) = rest.split_once(':').unwrap();
        let base = name.split('|').next().unwrap();
        if matches!(
            base,
            "fcall"
                | "function"
                | "evalsha"
                | "eval"
                | "info"
                | "config"
                | "client"
                | "hello"
                | "ping"
                | "script"
        ) {
            continue;
        }
        let calls: u64 = fields
            .split(',')
            .find_map(|f| f.strip_prefix("calls="))
            .unwrap()
            .parse()
            .unwrap();
        total += calls;
        seen.push(format!("{name}={calls}"));
    }
    (total, seen.join(" "))
}

fn reset_stats(conn: &mut redis::Connection) {
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query(conn).unwrap();
}

fn seen(d: &Decision) -> (bool, u32, Duration, Option<Duration>, u64) {
    (
        d.allowed(),
        d.remaining(),
        d.reset_after(),
        d.retry_after(),
        d.timestamp_micros(),
    )
}

struct Bench {
    /// Its own server (the command counts are per server); killed on drop.
    _server: RedisServer,
    clock: ManualClock,
    redis: RedisStore,
    memory: MemoryStore,
    conn: redis::Connection,
    /// Calls made, and the most commands one of them issued.
    calls: u64,
    most: u64,
    /// Calls that read a sliding counter's whole hash (a sparse range).
    whole_hash_reads: u64,
}

impl Bench {
    async fn new() -> Self {
        let server = RedisServer::start();
        let clock = ManualClock::new(START);
        let redis = RedisStore::builder()
            .url(server.url())
            .prefix("steps:")
            .clock(clock.clone())
            .build()
            .unwrap();
        redis.connect().await.unwrap();
        let memory = MemoryStore::builder().clock(clock.clone()).build();
        let conn = server.connection();
        // The fail-safe for scripts called directly on this connection.
        conn.set_read_timeout(Some(DEADLINE)).unwrap();
        Self {
            _server: server,
            clock,
            redis,
            memory,
            conn,
            calls: 0,
            most: 0,
            whole_hash_reads: 0,
        }
    }

    /// One check (or peek) at `now` on both stores: the same decision,
    /// and the script's work within the bound.
    async fn step(&mut self, key: &WindowKey, policy: &Policy, now: u64, cost: u32, peek: bool) {
        self.step_within(key, policy, now, cost, peek, MAX_COMMANDS_PER_CALL)
            .await;
    }

    /// [`step`](Self::step) with a bound of `max_commands`.
    async fn step_within(
        &mut self,
        key: &WindowKey,
        policy: &Policy,
        now: u64,
        cost: u32,
        peek: bool,
        max_commands: u64,
    ) {
        self.clock.set(now);
        let request = CheckRequest::new(key, policy, Cost::new(cost).unwrap());
        let (want, got) = if peek {
            reset_stats(&mut self.conn);
            let got =
                tokio::time::timeout(DEADLINE, self.redis.peek(&mut Guard::bare(), request)).await;
            let want = self.memory.peek(&mut Guard::bare(), request).await;
            (want.unwrap(), got)
        } else {
            reset_stats(&mut self.conn);
            let got =
                tokio::time::timeout(DEADLINE, self.redis.check(&mut Guard::bare(), request)).await;
            let want = self.memory.check(&mut Guard::bare(), request).await;
            (want.unwrap(), got)
        };
        let what = format!(
            "{} {} cost {cost} at START {:+} µs",
            policy.first(),
            if peek { "peek" } else { "check" },
            i128::from(now) - i128::from(START)
        );
        let got = got
            .unwrap_or_else(|_| panic!("{what}: the script ran past the {DEADLINE:?} fail-safe"))
            .unwrap();
        let (work, detail) = commands(&mut self.conn);
        self.calls += 1;
        self.most = self.most.max(work);
        self.whole_hash_reads += u64::from(detail.contains("hgetall="));
        assert!(
            work <= max_commands,
            "{what}: {work} Redis commands in one script call ({detail})"
        );
        assert_eq!(seen(&got), seen(&want), "{what}");
    }
}

/// Fixed runs of steps of an hour, a day and 2^40 µs, back and forward,
/// between small steps and a few admissions each, on every algorithm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_of_hours_and_days_do_bounded_work_and_match_the_twin() {
    let mut bench = Bench::new().await;
    // (step, cost): writes before and after every big step.
    let run: &[(i64, u32)] = &[
        (0, 1),
        (MS, 1),
        (MS, 2),
        (-HOUR, 1),
        (0, 1),
        (3 * MS, 3),
        (HOUR, 1),
        (MS, 1),
        (-DAY, 1),
        (MS, 2),
        (0, 9),
        (DAY + 2 * MS, 1),
        (MS, 1),
        (P40, 1),
        (-P40, 1),
        (-P40, 2),
        (MS, 1),
        (2 * P40, 1),
        (-3 * DAY, 1),
        (7 * MS, 1),
        (3 * DAY, 1),
        (HOUR, 1),
    ];
    for (i, text) in QUOTAS.iter().enumerate() {
        let policy = Policy::from(text.parse::<Quota>().unwrap());
        let key = WindowKey::new("steps", format!("fixed-{i}"));
        let mut now = START;
        for &(step, cost) in run {
            now = now.checked_add_signed(step).unwrap();
            bench.step(&key, &policy, now, cost, false).await;
            bench.step(&key, &policy, now, 1, true).await;
        }
    }
    eprintln!(
        "fixed steps: {} script calls, at most {} Redis commands in one, {} whole-hash reads",
        bench.calls, bench.most, bench.whole_hash_reads
    );
    // The steps did leave kept buckets days apart (the case that walked).
    assert!(bench.whole_hash_reads > 0);
}

/// After a step back, the denial's wait walks the kept buckets in order
/// across the gap, as the Rust twin does: with two buckets ahead (written
/// before the clock went back) and one behind, a cost that needs the
/// first bucket ahead to expire waits exactly for it, not for the last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_after_a_step_back_waits_for_the_right_bucket() {
    let mut bench = Bench::new().await;
    let policy = Policy::from("4/1s sliding-counter(1ms)".parse::<Quota>().unwrap());
    let key = WindowKey::new("steps", "walk");
    let mut now = START;
    for (step, cost) in [(0, 1), (MS, 1), (-DAY - MS, 2), (0, 3), (0, 2), (MS, 4)] {
        now = now.checked_add_signed(step).unwrap();
        bench.step(&key, &policy, now, cost, false).await;
    }
}

/// A full sliding counter (a unit in each of its 3600 buckets of 1 ms)
/// across steps of a day: the work follows the state (one batch per 128
/// buckets held), not the 86,400,000 buckets the clock moved over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_counter_across_day_steps_does_work_bounded_by_its_buckets() {
    let mut bench = Bench::new().await;
    let policy = Policy::from("3600/3600ms sliding-counter(1ms)".parse::<Quota>().unwrap());
    let key = WindowKey::new("steps", "full");
    let mut now = START;
    for _ in 0..3_600 {
        bench.step(&key, &policy, now, 1, false).await;
        now += 1_000;
    }
    // Every batch reads or deletes at most 128 buckets: 2 per 128 held
    // (read and delete) and a few more.
    let bound = 8 + 2 * 3_603u64.div_ceil(128);
    let mut most = 0;
    for (step, cost) in [
        (-DAY, 1),
        (0, 5),
        (DAY + 2_000_000, 1),
        (0, 4000),
        (-DAY, 2),
        (3 * DAY, 1),
    ] {
        now = now.checked_add_signed(step).unwrap();
        let before = bench.most;
        bench.most = 0;
        bench
            .step_within(&key, &policy, now, cost, false, bound)
            .await;
        bench.step_within(&key, &policy, now, 1, true, bound).await;
        most = most.max(bench.most);
        bench.most = before.max(bench.most);
    }
    eprintln!("a full counter across day steps: at most {most} Redis commands in one call (bound {bound})");
}

fn big_step() -> impl Strategy<Value = i64> {
    prop_oneof![
        3 => -5_000i64..5_000,
        2 => Just(0i64),
        1 => prop_oneof![Just(HOUR), Just(DAY), Just(P40), Just(3 * DAY)],
        1 => prop_oneof![Just(-HOUR), Just(-DAY), Just(-P40), Just(-3 * DAY)],
        1 => -10 * DAY..10 * DAY,
    ]
}

/// Random runs of small and big steps (µs to 2^40 µs, either way) on every
/// algorithm: the same decisions as the twin, bounded work per call.
#[test]
fn random_clock_steps_do_bounded_work_and_match_the_twin() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let bench = tokio::sync::Mutex::new(runtime.block_on(Bench::new()));
    let case = std::cell::Cell::new(0u64);
    let config = ProptestConfig {
        cases: 128,
        ..ProptestConfig::default()
    };
    proptest!(config, |(
        quota in 0..QUOTAS.len(),
        ops in proptest::collection::vec((big_step(), 1u32..=4, proptest::bool::weighted(0.2)), 1..30),
    )| {
        let policy = Policy::from(QUOTAS[quota].parse::<Quota>().unwrap());
        case.set(case.get() + 1);
        let key = WindowKey::new("steps", format!("random-{}", case.get()));
        let mut now = START;
        runtime.block_on(async {
            let mut bench = bench.lock().await;
            for &(step, cost, peek) in &ops {
                // Keep far from 0 and from the script's 2^52 limit.
                now = now.saturating_add_signed(step).clamp(START / 2, START * 2);
                bench.step(&key, &policy, now, cost, peek).await;
            }
        });
    });
    let bench = bench.into_inner();
    eprintln!(
        "random steps: {} runs, {} script calls, at most {} Redis commands in one, \
         {} whole-hash reads",
        case.get(),
        bench.calls,
        bench.most,
        bench.whole_hash_reads
    );
}

/// The policy script as `RedisStore` assembles it (see `limit/redis.rs`).
const POLICY_SCRIPT: &str = concat!(
    include_str!("../../tower-window/src/algorithm/prelude.lua"),
    include_str!("../../tower-window/src/algorithm/sliding_log.lua"),
    include_str!("../../tower-window/src/algorithm/sliding_counter.lua"),
    include_str!("../../tower-window/src/algorithm/fixed_window.lua"),
    include_str!("../../tower-window/src/algorithm/gcra.lua"),
    include_str!("../../tower-window/src/limit/policy.lua"),
);

/// 1 µs buckets, which no `Quota` can ask for (granularity is whole
/// milliseconds) but the script takes: called directly with W = 1000 µs,
/// G = 1 µs, it must decide exactly as the Rust twin of a 1 s window in
/// 1 ms buckets on times 1000 times larger (every quantity scales by
/// 1000), with bounded work across steps of days and 2^40 µs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_microsecond_buckets_do_bounded_work_and_scale_with_the_twin() {
    let mut bench = Bench::new().await;
    let script = redis::Script::new(POLICY_SCRIPT);
    let policy = Policy::from("5/1s sliding-counter(1ms)".parse::<Quota>().unwrap());
    let key = WindowKey::new("steps", "micro");
    let run: &[(i64, u32)] = &[
        (0, 1),
        (1, 1),
        (1, 2),
        (-DAY, 1),
        (0, 1),
        (3, 3),
        (DAY, 1),
        (2, 1),
        (-P40, 2),
        (0, 9),
        (1, 3),
        (P40 + 5, 1),
        (DAY, 1),
        (-DAY - 3, 2),
        (0, 4),
    ];
    // Lua time t, Rust time 1000 t: both near START.
    let mut t = START / 1_000;
    for &(step, cost) in run {
        t = t.checked_add_signed(step).unwrap();
        reset_stats(&mut bench.conn);
        let reply: Vec<i64> = script
            .key("raw:{micro}:c")
            .arg(t)
            .arg(cost)
            .arg(60_000)
            .arg(1)
            .arg(2)
            .arg(1_000)
            .arg(5)
            .arg(1)
            .invoke(&mut bench.conn)
            .unwrap();
        let (work, detail) = commands(&mut bench.conn);
        assert!(
            work <= MAX_COMMANDS_PER_CALL,
            "1 µs buckets, cost {cost} at {t}: {work} Redis commands ({detail})"
        );
        bench.clock.set(t * 1_000);
        let want = bench
            .memory
            .check(
                &mut Guard::bare(),
                CheckRequest::new(&key, &policy, Cost::new(cost).unwrap()),
            )
            .await
            .unwrap();
        let got = (
            reply[2] == 1,
            u32::try_from(reply[3]).unwrap(),
            Duration::from_micros(u64::try_from(reply[4]).unwrap() * 1_000),
            u64::try_from(reply[5])
                .ok()
                .map(|retry| Duration::from_micros(retry * 1_000)),
        );
        assert_eq!(
            got,
            (
                want.allowed(),
                want.remaining(),
                want.reset_after(),
                want.retry_after()
            ),
            "1 µs buckets, cost {cost} at {t}"
        );
    }
}
