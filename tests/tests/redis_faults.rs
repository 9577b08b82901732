//! Fault injection against a real `redis-server` on loopback: the fault
//! proxy between the limiter and Redis (latency, blackhole, reset, refuse)
//! and real process faults (`kill -9` and restart on the same port,
//! `SIGSTOP`/`SIGCONT`, `DEBUG SLEEP`, `maxmemory` with `noeviction`).
//!
//! For each fallback policy: every decision that meets a fault returns
//! within the time budget plus a generous constant (healthy decisions are
//! not timed: the budget is far above a loopback call); with the breaker open no socket is touched;
//! after Redis returns, the first probe after the cooldown is decided by
//! Redis again (a `NOSCRIPT` after a restart is invisible); admissions that
//! reached Redis never exceed the quota, and `LocalWindow` admissions during
//! an outage stay within `nodes × ceil(share × limit)` per window.
//!
//! The limiter's clock (breaker cooldown, local tier, local window) is a
//! `ManualClock`; Redis decides with its own `TIME`.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;
use tower_window::fallback::{FailClosed, FailOpen, LocalWindow};
use tower_window::{
    BreakerConfig, BreakerState, Decision, DecisionSource, FallbackReason, Limiter, ManualClock,
    Quota, RedisStore, Store, WindowKey,
};
use tower_window_tests::fault_proxy::{FaultProxy, Mode};

const T0: u64 = 1_700_000_000_000_000;
/// The limiter's time budget per decision: far above a healthy loopback
/// call even on a stalled machine, so healthy decisions never time out.
const BUDGET: Duration = Duration::from_millis(500);
/// The generous bound on top of the budget.
const SLACK: Duration = Duration::from_millis(250);
/// A bound on healthy calls, only so that a hang fails instead of blocking:
/// their duration is not what these tests measure.
const HANG: Duration = Duration::from_secs(20);
const COOLDOWN: Duration = Duration::from_secs(5);
/// Consecutive failures that open the breaker.
const TRIP: u32 = 3;

/// A `redis-server` this test controls: kill, restart on the same port,
/// stop and continue.
struct Redis {
    child: Option<Child>,
    port: u16,
    dir: TempDir,
}

impl Redis {
    fn start() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("tower-window-faults-")
            .tempdir()
            .unwrap();
        let mut redis = Self {
            child: None,
            port: 0,
            dir,
        };
        for _ in 0..20 {
            redis.port = tower_window_tests::redis_server::reserve_port();
            if redis.spawn() {
                return redis;
            }
        }
        panic!("could not start redis-server");
    }

    /// Starts the process on `self.port`; true once it answers `PING`.
    fn spawn(&mut self) -> bool {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .args(["--enable-debug-command", "yes"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(["--logfile", "redis.log"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server on PATH (apt-get install -y redis-server)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(Ok(Some(_))) = self.child.as_mut().map(Child::try_wait) {
                self.child = None;
                return false; // exited: port taken?
            }
            let pong: redis::RedisResult<String> = redis::Client::open(self.url())
                .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(200)))
                .and_then(|mut c| redis::cmd("PING").query(&mut c));
            if pong.is_ok() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill9();
        false
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// `kill -9`.
    fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// A fresh process (no data, no scripts) on the same port.
    fn restart(&mut self) {
        self.kill9();
        for _ in 0..50 {
            if self.spawn() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("redis-server did not restart on port {}", self.port);
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().unwrap().id();
        let status = Command::new("kill")
            .arg(signal)
            .arg(pid.to_string())
            .status()
            .unwrap();
        assert!(status.success());
    }

    fn cmd(&self, args: &[&str]) -> redis::Value {
        let mut conn = redis::Client::open(self.url())
            .unwrap()
            .get_connection_with_timeout(Duration::from_secs(5))
            .unwrap();
        let mut cmd = redis::cmd(args[0]);
        for arg in &args[1..] {
            cmd.arg(*arg);
        }
        cmd.query(&mut conn).unwrap()
    }

    fn info(&self, section: &str) -> String {
        let mut conn = redis::Client::open(self.url())
            .unwrap()
            .get_connection_with_timeout(Duration::from_secs(5))
            .unwrap();
        redis::cmd("INFO").arg(section).query(&mut conn).unwrap()
    }

    /// `calls` of `FCALL` (the scripts) since the last `CONFIG RESETSTAT`.
    fn fcall_calls(&self) -> u64 {
        let info = self.info("commandstats");
        info.lines()
            .find_map(|line| line.strip_prefix("cmdstat_fcall:calls="))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |n| n.parse().unwrap())
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        if let Some(child) = &self.child {
            // A stopped process must be continued to die promptly.
            let _ = Command::new("kill")
                .arg("-CONT")
                .arg(child.id().to_string())
                .status();
        }
        self.kill9();
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Policy {
    FailOpen,
    FailClosed,
    LocalWindow(f64),
}

const POLICIES: [Policy; 3] = [
    Policy::FailOpen,
    Policy::FailClosed,
    Policy::LocalWindow(0.01),
];

fn quota() -> Quota {
    "1000/1m".parse().unwrap()
}

/// One gateway node: its own store (connection), breaker and fallback.
fn node(url: &str, clock: &ManualClock, policy: Policy, prefix: &str) -> Limiter {
    let store = RedisStore::builder()
        .url(url)
        .prefix(prefix)
        .connect_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    // The store's clock (its breaker's, the fallback's) is the manual one;
    // Redis decides on its own TIME.
    let store = Store::builder(tower_window::store::Backend::from(store).clock(clock.clone()))
        .timeout(BUDGET)
        .breaker(
            BreakerConfig::default()
                .consecutive_failures(TRIP)
                .without_failure_ratio()
                .cooldown(COOLDOWN),
        )
        .build();
    let builder = Limiter::builder(store, quota());
    match policy {
        Policy::FailOpen => builder.fallback(FailOpen).build(),
        Policy::FailClosed => builder.fallback(FailClosed::default()).build(),
        Policy::LocalWindow(share) => builder.fallback(LocalWindow::new(share).unwrap()).build(),
    }
}

/// Checks once where no fault is in the way: no timing asserted.
async fn check(limiter: &Limiter, key: &WindowKey) -> Decision {
    tokio::time::timeout(HANG, limiter.check(key, 1))
        .await
        .expect("a healthy decision hung")
        .unwrap()
}

/// Checks once against an injected fault (or with the breaker open),
/// asserting the decision came within the budget plus slack: without the
/// budget, these calls would wait for the fault (forever, or seconds).
async fn timed_check(limiter: &Limiter, key: &WindowKey) -> Decision {
    let start = Instant::now();
    let decision = limiter.check(key, 1).await.unwrap();
    let elapsed = start.elapsed();
    assert!(
        elapsed <= BUDGET + SLACK,
        "a decision took {elapsed:?} ({:?})",
        decision.source()
    );
    decision
}

/// What a degraded decision must look like under `policy`.
fn assert_policy(policy: Policy, d: &Decision) {
    assert!(d.is_degraded(), "{d:?}");
    match policy {
        Policy::FailOpen => assert!(d.allowed()),
        Policy::FailClosed => {
            assert!(!d.allowed());
            assert!(d.retry_after().is_some());
        }
        Policy::LocalWindow(_) => {}
    }
}

/// Drives a node through an outage made by `fault` and a recovery made by
/// `heal`, asserting the four properties.
async fn outage_and_recovery<F, H>(policy: Policy, redis_addr: SocketAddr, fault: F, heal: H)
where
    F: FnOnce(&FaultProxy),
    H: FnOnce(&FaultProxy),
{
    let proxy = FaultProxy::start(redis_addr).await.unwrap();
    let clock = ManualClock::new(T0);
    let limiter = node(&proxy.redis_url(), &clock, policy, "faults:");
    let key = WindowKey::for_subject(format!("outage-{policy:?}-{}", rand_suffix()));

    for _ in 0..3 {
        let d = check(&limiter, &key).await;
        assert_eq!(d.source(), DecisionSource::Store);
        assert!(d.allowed());
    }

    fault(&proxy);
    let mut degraded = Vec::new();
    while limiter.breaker_state() != Some(BreakerState::Open) {
        let d = timed_check(&limiter, &key).await;
        assert_policy(policy, &d);
        assert_ne!(
            d.source(),
            DecisionSource::Fallback(FallbackReason::CircuitOpen)
        );
        degraded.push(d);
        assert!(degraded.len() <= TRIP as usize, "breaker did not open");
    }

    // Open: straight to the fallback without touching a socket.
    proxy.reset_stats();
    for _ in 0..50 {
        let d = timed_check(&limiter, &key).await;
        assert_policy(policy, &d);
        assert_eq!(
            d.source(),
            DecisionSource::Fallback(FallbackReason::CircuitOpen)
        );
        degraded.push(d);
    }
    assert!(proxy.stats().is_untouched(), "{:?}", proxy.stats());
    if let Policy::LocalWindow(share) = policy {
        // One node, one window of the limiter's clock.
        let admitted = degraded.iter().filter(|d| d.allowed()).count();
        let bound = (share * f64::from(quota().limit())).ceil() as usize;
        assert_eq!(admitted, bound, "local window admissions");
    }

    // Recovery: a probe after the cooldown is Redis's decision. A fault
    // that let the node connect and then reset it (the proxy's reset mode)
    // can leave the node a connection that died idle; the first probe on it
    // fails with a reset, which is not retried (the script may have run, and
    // a retry must never charge twice), so it may take one more cooldown.
    heal(&proxy);
    let mut failed_probes = 0;
    // On a loaded machine a reconnect can also outlast the budget; each
    // failed probe reopens the breaker for one more cooldown. Bounded.
    let d = loop {
        clock.advance(COOLDOWN);
        let d = check(&limiter, &key).await;
        if d.source() == DecisionSource::Store || failed_probes == 4 {
            break d;
        }
        failed_probes += 1;
    };
    assert_eq!(
        d.source(),
        DecisionSource::Store,
        "a probe after recovery ({failed_probes} failed first)"
    );
    assert_eq!(limiter.breaker_state(), Some(BreakerState::Closed));
    assert!(proxy.stats().bytes_from_clients > 0);
    for _ in 0..3 {
        assert_eq!(check(&limiter, &key).await.source(), DecisionSource::Store);
    }
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackhole_per_policy() {
    let redis = Redis::start();
    for policy in POLICIES {
        outage_and_recovery(
            policy,
            redis.addr(),
            |p| p.set_mode(Mode::Blackhole),
            |p| p.set_mode(Mode::PassThrough),
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_and_refuse_per_policy() {
    let redis = Redis::start();
    for policy in POLICIES {
        outage_and_recovery(
            policy,
            redis.addr(),
            |p| p.set_mode(Mode::Reset),
            |p| p.set_mode(Mode::PassThrough),
        )
        .await;
        outage_and_recovery(
            policy,
            redis.addr(),
            |p| p.set_mode(Mode::Refuse),
            |p| p.set_mode(Mode::PassThrough),
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_within_and_beyond_the_budget() {
    let redis = Redis::start();
    let proxy = FaultProxy::start(redis.addr()).await.unwrap();
    let clock = ManualClock::new(T0);
    let limiter = node(&proxy.redis_url(), &clock, Policy::FailOpen, "latency:");
    let key = WindowKey::for_subject("latency");
    assert_eq!(check(&limiter, &key).await.source(), DecisionSource::Store);
    // A few ms each way: well inside the budget.
    proxy.set_mode(Mode::Latency {
        base: Duration::from_millis(5),
        jitter: Duration::from_millis(5),
    });
    for _ in 0..5 {
        assert_eq!(check(&limiter, &key).await.source(), DecisionSource::Store);
    }
    // Slower than the budget: timeouts, then the breaker opens.
    proxy.set_mode(Mode::Latency {
        base: BUDGET * 2,
        jitter: Duration::from_millis(50),
    });
    for _ in 0..TRIP {
        let d = timed_check(&limiter, &key).await;
        assert_eq!(
            d.source(),
            DecisionSource::Fallback(FallbackReason::Timeout)
        );
        assert!(d.allowed());
    }
    assert_eq!(limiter.breaker_state(), Some(BreakerState::Open));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_and_restart_on_the_same_port_per_policy() {
    let mut redis = Redis::start();
    for policy in POLICIES {
        let proxy = FaultProxy::start(redis.addr()).await.unwrap();
        let clock = ManualClock::new(T0);
        let limiter = node(&proxy.redis_url(), &clock, policy, "restart:");
        let key = WindowKey::for_subject(format!("restart-{policy:?}"));
        for _ in 0..3 {
            assert_eq!(check(&limiter, &key).await.source(), DecisionSource::Store);
        }

        redis.kill9();
        let mut failures = 0;
        while limiter.breaker_state() != Some(BreakerState::Open) {
            let d = timed_check(&limiter, &key).await;
            assert_policy(policy, &d);
            failures += 1;
            assert!(failures <= TRIP, "breaker did not open");
        }
        proxy.reset_stats();
        for _ in 0..20 {
            let d = timed_check(&limiter, &key).await;
            assert_eq!(
                d.source(),
                DecisionSource::Fallback(FallbackReason::CircuitOpen)
            );
        }
        assert!(proxy.stats().is_untouched(), "{:?}", proxy.stats());

        // A fresh server knows no scripts: the NOSCRIPT must not show.
        redis.restart();
        clock.advance(COOLDOWN);
        let d = check(&limiter, &key).await;
        assert_eq!(
            d.source(),
            DecisionSource::Store,
            "first probe after restart"
        );
        assert!(d.allowed());
        assert_eq!(limiter.breaker_state(), Some(BreakerState::Closed));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigstop_and_sigcont() {
    let redis = Redis::start();
    let clock = ManualClock::new(T0);
    // No proxy: the process itself freezes (the kernel still accepts).
    let limiter = node(&redis.url(), &clock, Policy::FailClosed, "stop:");
    let key = WindowKey::for_subject("stop");
    assert_eq!(check(&limiter, &key).await.source(), DecisionSource::Store);
    redis.signal("-STOP");
    for _ in 0..TRIP {
        let d = timed_check(&limiter, &key).await;
        assert_eq!(
            d.source(),
            DecisionSource::Fallback(FallbackReason::Timeout)
        );
        assert!(!d.allowed());
    }
    assert_eq!(limiter.breaker_state(), Some(BreakerState::Open));
    redis.signal("-CONT");
    clock.advance(COOLDOWN);
    assert_eq!(check(&limiter, &key).await.source(), DecisionSource::Store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debug_sleep_and_client_pause_are_bounded() {
    let redis = Redis::start();
    let clock = ManualClock::new(T0);
    let limiter = node(&redis.url(), &clock, Policy::FailOpen, "sleep:");
    let key = WindowKey::for_subject("sleep");
    assert_eq!(check(&limiter, &key).await.source(), DecisionSource::Store);

    // DEBUG SLEEP blocks the server for far longer than the budget. No head
    // start is assumed: probe until a decision meets the sleeping server
    // (until then Redis decides), and time only that one.
    let url = redis.url();
    let sleeper = std::thread::spawn(move || {
        let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
        let _: redis::Value = redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg("3")
            .query(&mut conn)
            .unwrap();
    });
    let mut probes = 0;
    let d = loop {
        probes += 1;
        assert!(probes <= 1_000, "DEBUG SLEEP never took hold");
        let start = Instant::now();
        let d = check(&limiter, &key).await;
        if d.source() == DecisionSource::Store {
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        }
        let elapsed = start.elapsed();
        assert!(
            elapsed <= BUDGET + SLACK,
            "a decision against a sleeping server took {elapsed:?}"
        );
        break d;
    };
    assert_eq!(
        d.source(),
        DecisionSource::Fallback(FallbackReason::Timeout)
    );
    assert!(d.allowed());
    tokio::task::spawn_blocking(move || sleeper.join().unwrap())
        .await
        .unwrap();
    // The late reply is discarded; the connection stays usable.
    assert_eq!(check(&limiter, &key).await.source(), DecisionSource::Store);

    // CLIENT PAUSE is in effect once it returns (and lasts far longer than
    // the budget); a PING returns when it ends.
    redis.cmd(&["CLIENT", "PAUSE", "3000", "ALL"]);
    let d = timed_check(&limiter, &key).await;
    assert_eq!(
        d.source(),
        DecisionSource::Fallback(FallbackReason::Timeout)
    );
    let url = redis.url();
    tokio::task::spawn_blocking(move || {
        let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
        let _: String = redis::cmd("PING").query(&mut conn).unwrap();
    })
    .await
    .unwrap();
    assert_eq!(check(&limiter, &key).await.source(), DecisionSource::Store);
    assert_eq!(limiter.breaker_state(), Some(BreakerState::Closed));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_memory_is_an_unavailable_fallback() {
    let redis = Redis::start();
    let clock = ManualClock::new(T0);
    let limiter = node(&redis.url(), &clock, Policy::FailClosed, "oom:");
    let key = WindowKey::for_subject("oom");
    assert_eq!(check(&limiter, &key).await.source(), DecisionSource::Store);
    let filler = "x".repeat(2 << 20);
    redis.cmd(&["SET", "filler", &filler]);
    redis.cmd(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    redis.cmd(&["CONFIG", "SET", "maxmemory", "1mb"]);
    let d = timed_check(&limiter, &WindowKey::for_subject("oom-new")).await;
    assert!(!d.allowed());
    // Redis out of memory is the store's health (Unavailable, counted by
    // the breaker), not our own overload.
    assert_eq!(
        d.source(),
        DecisionSource::Fallback(FallbackReason::Unavailable)
    );
    redis.cmd(&["CONFIG", "SET", "maxmemory", "0"]);
    let d = check(&limiter, &WindowKey::for_subject("oom-new")).await;
    assert_eq!(d.source(), DecisionSource::Store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_hot_key_costs_redis_one_call_per_node_per_retry_period() {
    let redis = Redis::start();
    let clock = ManualClock::new(T0);
    let nodes: Vec<Limiter> = (0..3)
        .map(|_| {
            let store = RedisStore::builder()
                .url(redis.url())
                .prefix("hot:")
                .build()
                .unwrap();
            let store =
                Store::builder(tower_window::store::Backend::from(store).clock(clock.clone()))
                    .timeout(Duration::from_secs(2))
                    .build();
            Limiter::builder(store, "5/1m".parse::<Quota>().unwrap()).build()
        })
        .collect();
    let key = WindowKey::for_subject("hot");
    // Warm up connections and scripts, then count from zero.
    for node in &nodes {
        node.check(&WindowKey::for_subject("warm"), 1)
            .await
            .unwrap();
    }
    redis.cmd(&["CONFIG", "RESETSTAT"]);
    let mut admitted = 0;
    for _ in 0..300 {
        for node in &nodes {
            admitted += u32::from(node.check(&key, 1).await.unwrap().allowed());
        }
    }
    assert_eq!(admitted, 5);
    // 5 admissions, then one denial per node remembered for ~1 minute.
    assert_eq!(redis.fcall_calls(), 5 + 3);
    let local: u64 = nodes.iter().map(|n| n.stats().local_cache).sum();
    assert_eq!(local, 900 - 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_global_bound_holds_across_nodes_and_faults() {
    let redis = Redis::start();
    let clock = ManualClock::new(T0);
    const LIMIT: u32 = 30;
    const NODES: usize = 3;
    let quota: Quota = format!("{LIMIT}/1m").parse().unwrap();
    let mut proxies = Vec::new();
    let mut nodes = Vec::new();
    for _ in 0..NODES {
        let proxy = FaultProxy::start(redis.addr()).await.unwrap();
        let store = RedisStore::builder()
            .url(proxy.redis_url())
            .prefix("bound:")
            .build()
            .unwrap();
        let store = Store::builder(tower_window::store::Backend::from(store).clock(clock.clone()))
            .timeout(BUDGET)
            .breaker(
                BreakerConfig::default()
                    .consecutive_failures(TRIP)
                    .cooldown(COOLDOWN),
            )
            .build();
        nodes.push(
            Limiter::builder(store, quota.clone())
                .local_capacity(0)
                .fallback(LocalWindow::per_node(
                    std::num::NonZeroU32::new(NODES as u32).unwrap(),
                ))
                .build(),
        );
        proxies.push(proxy);
    }
    let key = WindowKey::for_subject("bound");
    let mut store_admitted = 0u32;
    let mut local_admitted = [0u32; NODES];
    // Healthy-node calls answered by the fallback (out of the budget on a
    // stalled machine, mostly): each may or may not have reached Redis.
    let mut healthy_fallbacks = 0u32;
    let mut healthy_reasons = Vec::new();
    for round in 0..40 {
        // Faults come and go on nodes 1 and 2 while node 0 stays healthy.
        match round {
            5 => proxies[1].set_mode(Mode::Blackhole),
            10 => proxies[2].set_mode(Mode::Reset),
            25 => {
                proxies[1].set_mode(Mode::PassThrough);
                proxies[2].set_mode(Mode::PassThrough);
                clock.advance(COOLDOWN);
            }
            _ => {}
        }
        let checks = nodes.iter().map(|node| {
            let node = node.clone();
            let key = key.clone();
            tokio::spawn(async move { node.check(&key, 1).await.unwrap() })
        });
        for (node, task) in checks.collect::<Vec<_>>().into_iter().enumerate() {
            let d = task.await.unwrap();
            match (d.allowed(), d.source()) {
                (true, DecisionSource::Store) => store_admitted += 1,
                (true, DecisionSource::Fallback(_)) => local_admitted[node] += 1,
                _ => {}
            }
            // Node 0 is always healthy; node 1 before its blackhole and
            // node 2 before its resets, and both after round 25.
            let healthy = match node {
                0 => true,
                1 => !(5..25).contains(&round),
                _ => !(10..25).contains(&round),
            };
            if healthy {
                if let DecisionSource::Fallback(reason) = d.source() {
                    // A timeout, or on a stalled machine a breaker or a
                    // dropped connection: the call may have reached Redis.
                    healthy_fallbacks += 1;
                    healthy_reasons.push((round, node, reason));
                }
            }
        }
    }
    // Nodes 0 and 2 fill the window (15 + 10 + 15 requests reach Redis by
    // round 14, all before node 1's held requests are released at round 25):
    // Redis reported the limit, never more. A healthy call that fell back on
    // a stalled machine may have been admitted without its caller hearing
    // of it, so the count is exact only when there was none.
    assert!(
        store_admitted <= LIMIT,
        "{store_admitted} admitted by Redis"
    );
    assert!(
        store_admitted + healthy_fallbacks >= LIMIT,
        "{store_admitted} admitted by Redis, {healthy_fallbacks} healthy fallbacks \
         (round, node, reason): {healthy_reasons:?}; degraded per node: {local_admitted:?}"
    );
    // Each node in an outage fills its own local window of ceil(30 / 3) = 10
    // (one window of its clock: the clock moved 5 s of a 1 min window) and
    // no more; the two faulty nodes (20 and 15 degraded decisions) fill it.
    let share = LIMIT.div_ceil(NODES as u32);
    assert!(
        local_admitted.iter().all(|&n| n <= share),
        "{local_admitted:?}"
    );
    assert_eq!(local_admitted[1..], [share, share], "{local_admitted:?}");
    // Redis recorded every admission it reported (and possibly requests
    // that reached it after their callers had given up), and never more
    // than the limit: count the units in the sliding log itself (members
    // are "<timestamp>:<units>"), not what the script says about them.
    let policy: tower_window::Policy = quota.clone().into();
    let log = tower_window::store::redis_key("bound:", &key, &policy, &quota);
    let members: Vec<String> = redis::cmd("ZRANGE")
        .arg(&log)
        .arg(0)
        .arg(-1)
        .query(
            &mut redis::Client::open(redis.url())
                .unwrap()
                .get_connection()
                .unwrap(),
        )
        .unwrap();
    let recorded: u32 = members
        .iter()
        .map(|m| m.rsplit_once(':').unwrap().1.parse::<u32>().unwrap())
        .sum();
    assert!(
        recorded >= store_admitted,
        "{recorded} recorded, {store_admitted} reported"
    );
    // Node 0 alone asked 40 times in a window of 30: the log is full, and
    // Redis says so.
    assert_eq!(recorded, LIMIT, "units in the log");
    let direct = Limiter::new(
        Store::bare(
            RedisStore::builder()
                .url(redis.url())
                .prefix("bound:")
                .build()
                .unwrap(),
        ),
        quota,
    );
    let d = direct.check(&key, 1).await.unwrap();
    assert!(!d.allowed() && d.remaining() == 0, "{d:?}");
}

// A killed cluster primary: tests/redis_primary_loss.rs.
