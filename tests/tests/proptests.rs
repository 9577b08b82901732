//! Property tests of the four algorithms on [`MemoryStore`] with a manual
//! clock: random quotas, monotone arrival times and costs.
//!
//! Each run checks, step by step and at the end:
//! - every decision (allowed, remaining, reset_after, retry_after) equals a
//!   brute-force reference model written from the algorithm's definition
//!   (recomputing sums over all past admissions, not the store's update
//!   rules);
//! - the algorithm's guarantee over all admissions: sliding log and sliding
//!   counter admit at most `L` units in every window `(t - W, t]`; fixed
//!   window at most `L` per aligned window; GCRA at most `B + (b - a) / T`
//!   units in every interval `[a, b]`;
//! - a rejected request never changes state: a twin store receives the
//!   same requests plus injected rejected ones (costs above capacity,
//!   repeats of denials) and must decide every shared request identically;
//! - `retry_after` is truthful and tight: waiting it admits the same cost,
//!   waiting one microsecond less does not.
//!
//! And under concurrency, for random policies of several quotas (some per
//! tenant) on one `MemoryStore` and on one real `redis-server`: no quota is
//! consumed by a denied request (each quota's use equals the admitted
//! requests' costs) and no quota's use exceeds its capacity.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use proptest::prelude::*;
use tower_window::limit::Backend as _;
use tower_window::store::Guard;
use tower_window::{
    Algorithm, CheckRequest, Cost, LimitError, Limiter, ManualClock, MemoryStore, Policy, Quota,
    WindowKey,
};

const START: u64 = 1_700_000_000_000_000;

/// One decision, durations in µs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    allowed: bool,
    remaining: u64,
    reset_after: u64,
    retry_after: Option<u64>,
}

fn allow(remaining: u64, reset_after: u64) -> Seen {
    Seen {
        allowed: true,
        remaining,
        reset_after,
        retry_after: Some(0),
    }
}

fn deny(remaining: u64, reset_after: u64, retry_after: Option<u64>) -> Seen {
    Seen {
        allowed: false,
        remaining,
        reset_after,
        retry_after,
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap()
}

/// The reference models: the definitions, evaluated by brute force.
#[derive(Debug, Clone)]
enum Model {
    SlidingLog {
        limit: u64,
        window: u64,
        admitted: Vec<(u64, u64)>,
    },
    SlidingCounter {
        limit: u64,
        granularity: u64,
        buckets: u64,
        admitted: Vec<(u64, u64)>,
    },
    FixedWindow {
        limit: u64,
        window: u64,
        admitted: Vec<(u64, u64)>,
    },
    /// GCRA as a leaky bucket: `level` µs of backlog at `last`, draining
    /// one µs per µs; each unit adds `interval`; capacity `burst * interval`.
    Gcra {
        interval: u64,
        burst: u64,
        level: u64,
        last: u64,
    },
}

impl Model {
    fn new(quota: &Quota) -> Self {
        let limit = u64::from(quota.limit());
        let window = quota.window_micros();
        match quota.algorithm() {
            Algorithm::SlidingLog => Self::SlidingLog {
                limit,
                window,
                admitted: Vec::new(),
            },
            Algorithm::SlidingCounter { granularity } => {
                let granularity = micros(granularity);
                Self::SlidingCounter {
                    limit,
                    granularity,
                    buckets: window / granularity,
                    admitted: Vec::new(),
                }
            }
            Algorithm::FixedWindow => Self::FixedWindow {
                limit,
                window,
                admitted: Vec::new(),
            },
            Algorithm::Gcra => Self::Gcra {
                interval: window.div_ceil(limit),
                burst: u64::from(quota.burst().unwrap_or(quota.limit())),
                level: 0,
                last: 0,
            },
            _ => unreachable!(),
        }
    }

    /// Decides `cost` at `t` and records it if admitted.
    fn decide(&mut self, t: u64, cost: u64) -> Seen {
        match self {
            Self::SlidingLog {
                limit,
                window,
                admitted,
            } => {
                let (limit, window) = (*limit, *window);
                // An admission at ts counts at x iff x - W < ts, i.e. ts + W > x.
                let used = |x: u64| -> u64 {
                    admitted
                        .iter()
                        .filter(|(ts, _)| ts + window > x)
                        .map(|(_, c)| c)
                        .sum()
                };
                let ends: Vec<u64> = admitted
                    .iter()
                    .filter(|(ts, _)| ts + window > t)
                    .map(|(ts, _)| ts + window - t)
                    .collect();
                let u = used(t);
                let reset = ends.iter().copied().max().unwrap_or(0);
                if cost > limit {
                    deny(limit - u, reset, None)
                } else if u + cost <= limit {
                    admitted.push((t, cost));
                    allow(limit - u - cost, window)
                } else {
                    let retry = ends
                        .iter()
                        .copied()
                        .filter(|r| used(t + r) + cost <= limit)
                        .min();
                    deny(limit - u, reset, retry)
                }
            }
            Self::SlidingCounter {
                limit,
                granularity,
                buckets,
                admitted,
            } => {
                let (limit, g, n) = (*limit, *granularity, *buckets);
                // Counts while its bucket overlaps (x - W, x]; stops at
                // (bucket + n + 1) G.
                let end = |ts: u64| (ts / g + n + 1) * g;
                let used = |x: u64| -> u64 {
                    admitted
                        .iter()
                        .filter(|(ts, _)| end(*ts) > x)
                        .map(|(_, c)| c)
                        .sum()
                };
                let ends: Vec<u64> = admitted
                    .iter()
                    .filter(|(ts, _)| end(*ts) > t)
                    .map(|(ts, _)| end(*ts) - t)
                    .collect();
                let u = used(t);
                let reset = ends.iter().copied().max().unwrap_or(0);
                if cost > limit {
                    deny(limit - u, reset, None)
                } else if u + cost <= limit {
                    admitted.push((t, cost));
                    allow(limit - u - cost, end(t) - t)
                } else {
                    let retry = ends
                        .iter()
                        .copied()
                        .filter(|r| used(t + r) + cost <= limit)
                        .min();
                    deny(limit - u, reset, retry)
                }
            }
            Self::FixedWindow {
                limit,
                window,
                admitted,
            } => {
                let (limit, w) = (*limit, *window);
                let u: u64 = admitted
                    .iter()
                    .filter(|(ts, _)| ts / w == t / w)
                    .map(|(_, c)| c)
                    .sum();
                let reset = (t / w + 1) * w - t;
                if cost > limit {
                    deny(limit - u, reset, None)
                } else if u + cost <= limit {
                    admitted.push((t, cost));
                    allow(limit - u - cost, reset)
                } else {
                    deny(limit - u, reset, Some(reset))
                }
            }
            Self::Gcra {
                interval,
                burst,
                level,
                last,
            } => {
                let capacity = *burst * *interval;
                let now_level = level.saturating_sub(t - *last);
                let remaining = (capacity - now_level) / *interval;
                if cost > *burst {
                    deny(remaining, now_level, None)
                } else if now_level + cost * *interval <= capacity {
                    *level = now_level + cost * *interval;
                    *last = t;
                    allow((capacity - *level) / *interval, *level)
                } else {
                    let retry = now_level + cost * *interval - capacity;
                    deny(remaining, now_level, Some(retry))
                }
            }
        }
    }
}

/// What to do next.
#[derive(Debug, Clone)]
enum Step {
    /// Wait `dt` µs, then ask for `cost`.
    Request { dt: u64, cost: u32 },
    /// After a denial: wait `retry_after - 1` µs (still denied), then 1 µs
    /// more (admitted), asking for the denied cost each time.
    WaitRetry,
}

struct Harness {
    quota: Quota,
    key: WindowKey,
    clock: ManualClock,
    store: MemoryStore,
    twin: MemoryStore,
    model: Model,
    now: u64,
    admitted: Vec<(u64, u64)>,
    last: Option<(u32, Seen)>,
}

fn check(store: &MemoryStore, key: &WindowKey, quota: &Quota, cost: u32) -> Seen {
    let policy = Policy::from(quota.clone());
    let request = CheckRequest::new(key, &policy, Cost::new(cost).unwrap());
    let decision = store
        .check(&mut Guard::bare(), request)
        .into_ready()
        .expect("the memory store decides without waiting")
        .unwrap();
    Seen {
        allowed: decision.allowed(),
        remaining: u64::from(decision.remaining()),
        reset_after: micros(decision.reset_after()),
        retry_after: decision.retry_after().map(micros),
    }
}

impl Harness {
    fn new(quota: Quota, start: u64) -> Self {
        let clock = ManualClock::new(start);
        // Windows may be 1 ms: keep real-time expiry far from the test.
        let make = || {
            MemoryStore::builder()
                .clock(clock.clone())
                .max_keys(16)
                .expiry_grace(Duration::from_secs(3600))
                .build()
        };
        Self {
            model: Model::new(&quota),
            key: WindowKey::new("proptest", "key"),
            store: make(),
            twin: make(),
            clock,
            quota,
            now: start,
            admitted: Vec::new(),
            last: None,
        }
    }

    fn capacity(&self) -> u32 {
        self.quota.capacity()
    }

    /// Asks for `cost` now on both stores and the model; all must agree.
    /// The twin then also gets requests that must be rejected.
    fn request(&mut self, cost: u32) -> Seen {
        self.clock.set(self.now);
        let seen = check(&self.store, &self.key, &self.quota, cost);
        let want = self.model.decide(self.now, u64::from(cost));
        assert_eq!(
            seen,
            want,
            "{} cost {cost} at START + {} µs",
            self.quota,
            self.now - START
        );
        let twin = check(&self.twin, &self.key, &self.quota, cost);
        assert_eq!(
            twin, seen,
            "the twin store (with injected rejections) diverged"
        );
        if seen.allowed {
            self.admitted.push((self.now, u64::from(cost)));
        } else {
            let again = check(&self.twin, &self.key, &self.quota, cost);
            assert_eq!(again, seen, "repeating a denial changes its answer");
        }
        for junk in [self.capacity().saturating_add(1), u32::MAX] {
            if junk > self.capacity() {
                let rejected = check(&self.twin, &self.key, &self.quota, junk);
                assert!(!rejected.allowed && rejected.retry_after.is_none());
            }
        }
        self.last = Some((cost, seen));
        seen
    }

    fn run(&mut self, step: &Step) {
        match *step {
            Step::Request { dt, cost } => {
                self.now += dt;
                self.request(cost);
            }
            Step::WaitRetry => {
                let Some((cost, seen)) = self.last else {
                    return;
                };
                let Some(retry) = seen.retry_after.filter(|r| !seen.allowed && *r > 0) else {
                    return;
                };
                self.now += retry - 1;
                let early = self.request(cost);
                assert!(!early.allowed, "admitted 1 µs before retry_after");
                self.now += 1;
                let on_time = self.request(cost);
                assert!(on_time.allowed, "denied after waiting retry_after");
            }
        }
    }

    /// The algorithm's guarantee over every admission made.
    fn check_guarantee(&self) {
        let limit = u64::from(self.quota.limit());
        let window = self.quota.window_micros();
        let a = &self.admitted;
        match self.quota.algorithm() {
            Algorithm::SlidingLog | Algorithm::SlidingCounter { .. } => {
                // The fullest window of length W ends at an admission.
                for &(end, _) in a {
                    let sum: u64 = a
                        .iter()
                        .filter(|(t, _)| *t <= end && t + window > end)
                        .map(|(_, c)| c)
                        .sum();
                    assert!(sum <= limit, "{sum} units in the window ending at {end}");
                }
            }
            Algorithm::FixedWindow => {
                for &(t0, _) in a {
                    let sum: u64 = a
                        .iter()
                        .filter(|(t, _)| t / window == t0 / window)
                        .map(|(_, c)| c)
                        .sum();
                    assert!(sum <= limit, "{sum} units in the window of {t0}");
                }
            }
            Algorithm::Gcra => {
                let interval = self.quota.emission_interval_micros();
                let burst = u64::from(self.quota.capacity());
                for (i, &(from, _)) in a.iter().enumerate() {
                    let mut sum = 0;
                    for &(to, c) in &a[i..] {
                        sum += c;
                        assert!(
                            sum * interval <= burst * interval + (to - from),
                            "{sum} units in [{from}, {to}]"
                        );
                    }
                }
            }
            _ => unreachable!(),
        }
    }
}

/// Steps for a quota of capacity `cap` and window `w` µs: mostly short
/// gaps, some exactly `w` or `w - 1` (window edges), some long idles.
fn steps(cap: u32, w: u64) -> impl Strategy<Value = Vec<Step>> {
    let dt = prop_oneof![
        3 => Just(0u64),
        8 => 0..=w / 6,
        3 => 0..=w,
        2 => prop_oneof![Just(w), Just(w - 1), Just(w / 2)],
        1 => w..=3 * w,
    ];
    let cost = prop_oneof![
        10 => 1..=cap,
        1 => Just(cap.saturating_add(1)),
        1 => Just(u32::MAX),
    ];
    let step = prop_oneof![
        8 => (dt, cost).prop_map(|(dt, cost)| Step::Request { dt, cost }),
        1 => Just(Step::WaitRetry),
    ];
    proptest::collection::vec(step, 1..60)
}

/// Windows from 1 ms to 2 min, in whole ms.
fn window_ms() -> impl Strategy<Value = u64> {
    prop_oneof![1..=20u64, 1_000..=120_000u64]
}

/// Start exactly on a second boundary, or anywhere within a window.
fn start(w: u64) -> impl Strategy<Value = u64> {
    prop_oneof![Just(START), (0..w).prop_map(|o| START + o)]
}

fn run_case(quota: Quota, start: u64, steps: &[Step]) {
    let mut harness = Harness::new(quota, start);
    for step in steps {
        harness.run(step);
    }
    harness.check_guarantee();
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        ..ProptestConfig::default()
    }
}

fn build(builder: tower_window::QuotaBuilder) -> Quota {
    builder.build().unwrap()
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn sliding_log((quota, start, steps) in (1..=8u32, window_ms()).prop_flat_map(|(limit, ms)| {
        let quota = build(Quota::builder().limit(limit).window(Duration::from_millis(ms)));
        let w = quota.window_micros();
        (Just(quota), start(w), steps(limit, w))
    })) {
        run_case(quota, start, &steps);
    }

    #[test]
    fn sliding_counter((quota, start, steps) in (1..=8u32, 1..=8u64, prop_oneof![1..=5u64, 500..=15_000u64])
        .prop_flat_map(|(limit, n, g)| {
            let quota = build(
                Quota::builder()
                    .limit(limit)
                    .window(Duration::from_millis(n * g))
                    .granularity(Duration::from_millis(g)),
            );
            let w = quota.window_micros();
            (Just(quota), start(w), steps(limit, w))
        })) {
        run_case(quota, start, &steps);
    }

    #[test]
    fn fixed_window((quota, start, steps) in (1..=8u32, window_ms()).prop_flat_map(|(limit, ms)| {
        let quota = build(
            Quota::builder()
                .limit(limit)
                .window(Duration::from_millis(ms))
                .algorithm(Algorithm::FixedWindow),
        );
        let w = quota.window_micros();
        (Just(quota), start(w), steps(limit, w))
    })) {
        run_case(quota, start, &steps);
    }

    #[test]
    fn gcra((quota, start, steps) in (1..=8u32, window_ms(), proptest::option::of(1..=12u32))
        .prop_flat_map(|(limit, ms, burst)| {
            let mut builder = Quota::builder()
                .limit(limit)
                .window(Duration::from_millis(ms))
                .algorithm(Algorithm::Gcra);
            if let Some(burst) = burst {
                builder = builder.burst(burst);
            }
            let quota = build(builder);
            let w = quota.window_micros();
            (Just(quota.clone()), start(w), steps(quota.capacity(), w))
        })) {
        run_case(quota, start, &steps);
    }
}

/// Any valid quota: limits up to u32::MAX, windows up to the 366-day
/// maximum, any granularity that divides the window, any burst.
fn any_quota() -> impl Strategy<Value = Quota> {
    let max_ms = u64::try_from(tower_window::quota::MAX_WINDOW.as_millis()).unwrap();
    (
        1..=u32::MAX,
        prop_oneof![1..=1_000u64, 1..=max_ms],
        0..4u8,
        1..=tower_window::quota::MAX_BUCKETS,
        proptest::option::of(1..=u32::MAX),
    )
        .prop_filter_map(
            "GCRA bursts whose span exceeds the longest window are rejected by the builder",
            move |(limit, ms, algorithm, buckets, burst)| {
                let builder = Quota::builder().limit(limit);
                let builder = match algorithm {
                    0 => builder.window(Duration::from_millis(ms)),
                    1 => {
                        // Granularity g ms with n buckets: window n g ms within bounds.
                        let g = (ms / buckets).max(1);
                        let n = (max_ms / g).clamp(1, buckets);
                        builder
                            .window(Duration::from_millis(n * g))
                            .granularity(Duration::from_millis(g))
                    }
                    2 => builder
                        .window(Duration::from_millis(ms))
                        .algorithm(Algorithm::FixedWindow),
                    _ => {
                        let builder = builder
                            .window(Duration::from_millis(ms))
                            .algorithm(Algorithm::Gcra);
                        match burst {
                            Some(burst) => builder.burst(burst),
                            None => builder,
                        }
                    }
                };
                builder.build().ok()
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Arbitrary (even non-monotone, extreme) times and costs never panic
    /// (tests build with overflow checks) and decisions stay coherent.
    #[test]
    fn arbitrary_inputs_never_panic(
        quota in any_quota(),
        requests in proptest::collection::vec(
            (
                prop_oneof![any::<u64>(), Just(u64::MAX), Just(0u64), START..START + 10_000_000_000],
                prop_oneof![any::<u32>(), Just(u32::MAX), 1..=8u32],
            ),
            1..24,
        ),
    ) {
        let clock = ManualClock::new(0);
        let store = MemoryStore::builder().clock(clock.clone()).max_keys(16).build();
        let key = WindowKey::new("proptest", "arbitrary");
        let policy = Policy::from(quota.clone());
        // On the same store (clones share it), for the one cost a store can
        // no longer be asked.
        let limiter = Limiter::new(store.clone(), policy.clone());
        for (t, cost) in requests {
            clock.set(t);
            // A zero cost cannot be built, so no store is ever asked one:
            // the limiter refuses it at once, a typed error.
            let Some(units) = Cost::new(cost) else {
                let refused = limiter.check(&key, cost).into_ready();
                prop_assert!(
                    matches!(refused, Ok(Err(LimitError::ZeroCost))),
                    "only a zero cost is an error, refused at once"
                );
                continue;
            };
            let result = store
                .check(&mut Guard::bare(), CheckRequest::new(&key, &policy, units))
                .into_ready()
                .expect("the memory store decides without waiting");
            let decision = match result {
                Ok(decision) => decision,
                Err(e) => {
                    return Err(TestCaseError::fail(format!(
                        "only a zero cost is an error: cost {cost}: {e}"
                    )))
                }
            };
            prop_assert!(cost > 0);
            prop_assert!(decision.remaining() <= quota.capacity());
            prop_assert_eq!(decision.timestamp_micros(), t);
            if decision.allowed() {
                prop_assert!(cost <= quota.capacity());
                prop_assert_eq!(decision.retry_after(), Some(Duration::ZERO));
            } else if cost > quota.capacity() {
                prop_assert_eq!(decision.retry_after(), None);
            } else {
                prop_assert!(decision.retry_after().is_some());
            }
        }
    }
}

mod concurrent {
    use std::sync::Arc;

    use proptest::prelude::*;
    use tower_window::limit;
    use tower_window::store::Guard;
    use tower_window::{
        CheckRequest, Cost, ManualClock, MemoryStore, Policy, Quota, RedisStore, Scope, WindowKey,
    };
    use tower_window_tests::redis_server::RedisServer;

    const START: u64 = 1_700_000_000_000_000;
    const SUBJECTS: [&str; 2] = ["alice", "bob"];

    fn any_policy() -> impl Strategy<Value = Policy> {
        let quota = (
            prop_oneof![
                Just(""),
                Just(" sliding-counter(10s)"),
                Just(" fixed-window"),
                Just(" gcra"),
            ],
            3u32..30,
            any::<bool>(),
        );
        proptest::collection::vec(quota, 1..=4).prop_map(|quotas| {
            let quotas = quotas
                .into_iter()
                .enumerate()
                .map(|(i, (algorithm, limit, tenant))| {
                    let q = format!("{limit}/1m{algorithm}")
                        .parse::<Quota>()
                        .unwrap()
                        .named(&format!("q{i}"))
                        .unwrap();
                    if tenant {
                        q.scoped(Scope::Tenant)
                    } else {
                        q
                    }
                });
            Policy::new("concurrent", quotas).unwrap()
        })
    }

    /// Per task: (subject index, cost) requests.
    fn any_plan() -> impl Strategy<Value = Vec<Vec<(usize, u32)>>> {
        proptest::collection::vec(
            proptest::collection::vec((0..SUBJECTS.len(), 1u32..=4), 4..16),
            2..=4,
        )
    }

    /// Runs the plan's tasks at once on `store` (its clock stands still),
    /// then checks every quota's use against the admitted costs.
    async fn run(
        store: Arc<dyn limit::Backend>,
        policy: Policy,
        tenant: String,
        plan: Vec<Vec<(usize, u32)>>,
    ) -> Result<(), TestCaseError> {
        let tasks: Vec<_> = plan
            .into_iter()
            .map(|requests| {
                let (store, policy, tenant) = (store.clone(), policy.clone(), tenant.clone());
                tokio::spawn(async move {
                    let mut admitted = [0u64; SUBJECTS.len()];
                    for (subject, cost) in requests {
                        let key = WindowKey::new(tenant.clone(), SUBJECTS[subject]);
                        let request = CheckRequest::new(&key, &policy, Cost::new(cost).unwrap());
                        let d = store.check(&mut Guard::bare(), request).await.unwrap();
                        assert_eq!(d.allowed(), d.quotas().iter().all(|q| q.allowed()));
                        if d.allowed() {
                            admitted[subject] += u64::from(cost);
                        }
                    }
                    admitted
                })
            })
            .collect();
        let mut admitted = [0u64; SUBJECTS.len()];
        for task in tasks {
            for (total, a) in admitted.iter_mut().zip(task.await.unwrap()) {
                *total += a;
            }
        }
        let all: u64 = admitted.iter().sum();
        for (subject, &mine) in SUBJECTS.iter().zip(&admitted) {
            // A cost that never fits reports every quota's state unchanged.
            let key = WindowKey::new(tenant.clone(), *subject);
            let request = CheckRequest::new(&key, &policy, Cost::new(u32::MAX).unwrap());
            let probe = store.check(&mut Guard::bare(), request).await.unwrap();
            prop_assert!(!probe.allowed());
            for state in probe.quotas() {
                let quota = &state.quota();
                let used = match quota.scope() {
                    Scope::Tenant => all,
                    _ => mine,
                };
                let capacity = u64::from(quota.capacity());
                prop_assert!(
                    used <= capacity,
                    "{}: {used} admitted of {capacity}",
                    quota.name()
                );
                prop_assert_eq!(
                    u64::from(state.remaining()),
                    capacity - used,
                    "{} ({}) for {}: remaining after {} admitted",
                    quota.name(),
                    quota,
                    subject,
                    used
                );
            }
        }
        Ok(())
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .enable_all()
            .build()
            .unwrap()
    }

    fn tenant(store: &str) -> String {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        format!(
            "{store}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        #[test]
        fn denied_requests_consume_no_quota_on_the_memory_store(
            policy in any_policy(),
            plan in any_plan(),
        ) {
            let store = MemoryStore::builder().clock(ManualClock::new(START)).build();
            runtime().block_on(run(Arc::new(store), policy, tenant("memory"), plan))?;
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

        #[test]
        fn denied_requests_consume_no_quota_on_redis(
            policy in any_policy(),
            plan in any_plan(),
        ) {
            let server = RedisServer::shared();
            let store = RedisStore::builder()
                .url(server.url())
                .prefix("concurrent:")
                .clock(ManualClock::new(START))
                .build()
                .unwrap();
            runtime().block_on(run(Arc::new(store), policy, tenant("redis"), plan))?;
        }
    }
}
