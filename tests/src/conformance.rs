//! The store conformance suite: one set of scenarios, written once, that
//! every window backend ([`limit::Backend`]) must pass with the same
//! decisions.
//!
//! Each scenario drives a store through an exact sequence with a
//! [`ManualClock`] and compares every field of every decision (allowed,
//! remaining, reset_after, retry_after, timestamp) with numbers worked out
//! by hand from the algorithm contract (see the docs of
//! `tower_window::algorithm`), not recomputed by the code under test.
//!
//! # Plugging in a store
//!
//! Implement [`StoreFactory`] (async, so a networked store can connect; it
//! must take its time from the given clock, e.g. by passing explicit
//! timestamps to its scripts), then write a test file holding only:
//!
//! ```text
//! tower_window_tests::conformance_tests!(MyStoreFactory::new());
//! ```
//!
//! The macro expands to one `#[tokio::test]` per scenario (the test crate
//! needs `tokio` with the `macros` and `rt` features). Scenarios use keys
//! unique to the scenario and the run, so they may share one server and run
//! in parallel.
//!
//! The clock starts at [`START`] (2023-11-14T22:13:20Z), which is a multiple
//! of 10 s and 20 s into a minute, so scenarios cover times in the middle of
//! a window and exactly on window and bucket boundaries. All windows are at
//! least a minute and every written TTL is several seconds of real time, so a
//! store that expires keys in real time (Redis) cannot lose state while a
//! scenario runs.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use std::sync::Arc;

use tower_window::limit::{self, Backend as _};
use tower_window::store::{self, Guard};
use tower_window::{
    CheckRequest, Clock, Cost, Decision, DecisionSource, LimitError, Limiter, ManualClock,
    MemoryStore, Policy, Quota, QuotaCosts, Scope, Store, WindowKey,
};

use crate::shared::Shared;

/// The clock's reading when every scenario starts (µs since the epoch):
/// 1_700_000_000 s, a multiple of 10 s and 20 s into a minute.
pub const START: u64 = 1_700_000_000_000_000;

const S: u64 = 1_000_000;
/// The end of the minute that contains [`START`].
const MINUTE_END: u64 = START + 40 * S;

/// Makes the store under test, one per scenario.
pub trait StoreFactory {
    /// The store under test.
    type Store: limit::Backend;

    /// A store whose decisions use `clock` as "now". Panic if the store
    /// cannot be made (the scenario then fails with that message).
    fn make(&self, clock: ManualClock) -> impl Future<Output = Self::Store> + Send;
}

/// Makes [`MemoryStore`]s with the default settings and the given clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct MemoryStoreFactory;

impl StoreFactory for MemoryStoreFactory {
    type Store = MemoryStore;

    fn make(&self, clock: ManualClock) -> impl Future<Output = MemoryStore> + Send {
        std::future::ready(MemoryStore::builder().clock(clock).build())
    }
}

/// Expands to one `#[tokio::test]` per conformance scenario, each running
/// it against the store made by the factory expression (evaluated once per
/// test).
///
/// ```no_run
/// tower_window_tests::conformance_tests!(tower_window_tests::conformance::MemoryStoreFactory);
/// ```
#[macro_export]
macro_rules! conformance_tests {
    ($factory:expr) => {
        $crate::conformance_tests!(@each $factory;
            sliding_log_sequence,
            sliding_log_costs_and_retry_walk,
            sliding_log_idle_expiry,
            sliding_counter_sequence,
            sliding_counter_single_bucket_on_boundaries,
            sliding_counter_idle_expiry,
            fixed_window_sequence,
            fixed_window_idle_expiry,
            gcra_sequence,
            gcra_burst,
            gcra_emission_interval_rounds_up,
            gcra_idle_expiry,
            cost_above_capacity_is_never_admitted,
            denial_consumes_nothing,
            keys_tenants_and_quotas_are_independent,
            huge_costs_do_not_overflow,
            zero_cost_is_an_invalid_request,
            retry_walk_is_bounded,
            policy_shapes_match_the_memory_store,
            a_denial_moves_no_quota,
            tenant_quota_is_shared_by_subjects,
            rolling_limit_change_keeps_the_window,
            shadow_quota_never_denies_and_records_only_what_fits,
            peek_reads_every_quota_and_consumes_nothing,
            quota_costs_are_decided_together,
        );
    };
    (@each $factory:expr; $($scenario:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $scenario() {
                let factory = $factory;
                $crate::conformance::$scenario(&factory).await;
            }
        )*
    };
}

/// What a scenario expects of one decision (durations in µs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    allowed: bool,
    remaining: u32,
    reset_after: u64,
    retry_after: Option<u64>,
}

/// An admission leaving `remaining`, full again after `reset_after` µs.
fn allow(remaining: u32, reset_after: u64) -> Seen {
    Seen {
        allowed: true,
        remaining,
        reset_after,
        retry_after: Some(0),
    }
}

/// A denial: the same cost fits after `retry_after` µs.
fn deny(remaining: u32, reset_after: u64, retry_after: u64) -> Seen {
    Seen {
        allowed: false,
        remaining,
        reset_after,
        retry_after: Some(retry_after),
    }
}

/// A denial of a cost that can never fit (`retry_after = None`).
fn never(remaining: u32, reset_after: u64) -> Seen {
    Seen {
        allowed: false,
        remaining,
        reset_after,
        retry_after: None,
    }
}

/// A scenario's cost as the backends take it (every scenario cost is at
/// least 1; a zero cost cannot be built, see
/// [`zero_cost_is_an_invalid_request`]).
fn cost_of(units: u32) -> Cost {
    Cost::new(units).unwrap_or_else(|| panic!("a scenario cost of {units}"))
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl From<&Decision> for Seen {
    fn from(d: &Decision) -> Self {
        Self {
            allowed: d.allowed(),
            remaining: d.remaining(),
            reset_after: micros(d.reset_after()),
            retry_after: d.retry_after().map(micros),
        }
    }
}

/// A tenant no other scenario or run uses: the scenario's name, the
/// process, the wall time and a counter.
fn unique_tenant(scenario: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "conformance:{scenario}:{}:{nanos}:{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

fn quota(text: &str) -> Quota {
    text.parse()
        .unwrap_or_else(|e| panic!("quota {text:?} should parse: {e}"))
}

/// One scenario's store, clock and key space.
struct Run<S> {
    scenario: &'static str,
    /// Shared so that a [`Limiter`] can be made on the same backend.
    store: Arc<S>,
    clock: ManualClock,
    tenant: String,
}

impl<S: limit::Backend> Run<S> {
    async fn start<F: StoreFactory<Store = S>>(factory: &F, scenario: &'static str) -> Self {
        let clock = ManualClock::new(START);
        let store = Arc::new(factory.make(clock.clone()).await);
        Self {
            scenario,
            store,
            clock,
            tenant: unique_tenant(scenario),
        }
    }

    /// `subject` in this run's tenant.
    fn key(&self, subject: &str) -> WindowKey {
        WindowKey::new(self.tenant.clone(), subject.to_owned())
    }

    /// `subject` in this run's tenant with `suffix` appended to the tenant.
    fn key_in(&self, tenant_suffix: &str, subject: &str) -> WindowKey {
        WindowKey::new(
            format!("{}{tenant_suffix}", self.tenant),
            subject.to_owned(),
        )
    }

    /// Sets the clock to `t` (µs since the epoch).
    fn at(&self, t: u64) {
        self.clock.set(t);
    }

    /// Checks `quota` alone (a one-quota policy) and returns the decision,
    /// asserting the fields every decision must have.
    async fn check(&self, key: &WindowKey, quota: &Quota, cost: u32) -> Decision {
        let decision = self
            .check_policy(key, &Policy::from(quota.clone()), cost)
            .await;
        assert_eq!(decision.quota(), quota, "{}: decision quota", self.scenario);
        decision
    }

    /// Checks a whole policy and returns the decision, asserting the fields
    /// every decision must have.
    async fn check_policy(&self, key: &WindowKey, policy: &Policy, cost: u32) -> Decision {
        self.decide(CheckRequest::new(key, policy, cost_of(cost)))
            .await
    }

    /// Checks a whole policy with `costs[i]` units in quota `i`.
    async fn check_each(&self, key: &WindowKey, policy: &Policy, costs: &[u32]) -> Decision {
        let costs: Vec<Cost> = costs.iter().map(|&c| cost_of(c)).collect();
        let request = CheckRequest::new(key, policy, Cost::ONE).with_quota_costs(&costs);
        self.decide(request).await
    }

    async fn decide(&self, request: CheckRequest<'_>) -> Decision {
        let (policy, cost) = (request.policy, request.cost);
        let now = self.clock.now_micros();
        let decision = self
            .store
            .check(&mut Guard::bare(), request)
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "{}: {policy} cost {cost} at START + {} µs: store error: {e}",
                    self.scenario,
                    now.wrapping_sub(START)
                )
            });
        assert_eq!(
            decision.timestamp_micros(),
            now,
            "{}: a decision carries the store clock's time",
            self.scenario
        );
        assert_eq!(
            decision.source(),
            DecisionSource::Store,
            "{}: decision source",
            self.scenario
        );
        let names: Vec<&str> = decision.quotas().iter().map(|q| q.quota().name()).collect();
        let want: Vec<&str> = policy.quotas().iter().map(Quota::name).collect();
        assert_eq!(
            names, want,
            "{}: every quota, in policy order",
            self.scenario
        );
        assert_eq!(
            decision.allowed(),
            decision
                .quotas()
                .iter()
                .all(|q| q.allowed() || q.quota().is_shadow()),
            "{}: admitted only if every enforced quota admits",
            self.scenario
        );
        decision
    }

    /// Peeks at a whole policy (records nothing).
    async fn peek_policy(&self, key: &WindowKey, policy: &Policy, cost: u32) -> Decision {
        let decision = self
            .store
            .peek(
                &mut Guard::bare(),
                CheckRequest::new(key, policy, cost_of(cost)),
            )
            .await
            .unwrap_or_else(|e| panic!("{}: peek {policy}: store error: {e}", self.scenario));
        assert_eq!(
            decision.timestamp_micros(),
            self.clock.now_micros(),
            "{}: a peek carries the store clock's time",
            self.scenario
        );
        decision
    }

    /// Checks `cost` at the current time and asserts the decision is `want`.
    async fn expect(&self, step: &str, key: &WindowKey, quota: &Quota, cost: u32, want: Seen) {
        let decision = self.check(key, quota, cost).await;
        assert_eq!(
            Seen::from(&decision),
            want,
            "{}, step {step:?}: {quota} cost {cost} at START + {} µs",
            self.scenario,
            self.clock.now_micros().wrapping_sub(START)
        );
    }
}

/// Sliding log "3/1m": admit to the limit, exact retry to the oldest entry,
/// and the window edge `t = ts + W` (the entry no longer counts).
pub async fn sliding_log_sequence<F: StoreFactory>(factory: &F) {
    let run = Run::start(factory, "sliding_log_sequence").await;
    let q = quota("3/1m");
    let k = run.key("user");
    run.expect("first", &k, &q, 1, allow(2, 60 * S)).await;
    run.at(START + 10 * S);
    run.expect("second", &k, &q, 1, allow(1, 60 * S)).await;
    run.at(START + 20 * S);
    run.expect("third", &k, &q, 1, allow(0, 60 * S)).await;
    run.expect("full", &k, &q, 1, deny(0, 60 * S, 40 * S)).await;
    run.at(START + 60 * S - 1);
    run.expect("1 µs before the edge", &k, &q, 1, deny(0, 20 * S + 1, 1))
        .await;
    run.at(START + 60 * S);
    run.expect("on the edge", &k, &q, 1, allow(0, 60 * S)).await;
    run.expect("full again", &k, &q, 1, deny(0, 60 * S, 10 * S))
        .await;
    run.at(START + 70 * S);
    run.expect("second entry left", &k, &q, 1, allow(0, 60 * S))
        .await;
}

/// Sliding log "10/1m" with costs > 1: the retry walks past as many old
/// entries as the cost needs; a cost above the limit never fits.
pub async fn sliding_log_costs_and_retry_walk<F: StoreFactory>(factory: &F) {
    let run = Run::start(factory, "sliding_log_costs_and_retry_walk").await;
    let q = quota("10/1m");
    let k = run.key("user");
    run.expect("4 units", &k, &q, 4, allow(6, 60 * S)).await;
    run.at(START + 5 * S);
    run.expect("5 units", &k, &q, 5, allow(1, 60 * S)).await;
    run.at(START + 10 * S);
    run.expect(
        "3 needs the first entry",
        &k,
        &q,
        3,
        deny(1, 55 * S, 50 * S),
    )
    .await;
    run.expect("7 needs both entries", &k, &q, 7, deny(1, 55 * S, 55 * S))
        .await;
    run.expect(
        "2 needs the first entry",
        &k,
        &q,
        2,
        deny(1, 55 * S, 50 * S),
    )
    .await;
    run.expect("1 fits", &k, &q, 1, allow(0, 60 * S)).await;
    run.expect("11 never fits", &k, &q, 11, never(0, 60 * S))
        .await;
    run.expect("10 needs all three", &k, &q, 10, deny(0, 60 * S, 60 * S))
        .await;
    run.at(START + 60 * S);
    run.expect("first entry left", &k, &q, 4, allow(0, 60 * S))
        .await;
    run.expect("then the second", &k, &q, 1, deny(0, 60 * S, 5 * S))
        .await;
}

/// Sliding log "2/1m": state idle far past its window counts as empty.
pub async fn sliding_log_idle_expiry<F: StoreFactory>(factory: &F) {
    let run = Run::start(factory, "sliding_log_idle_expiry").await;
    let q = quota("2/1m");
    let k = run.key("user");
    run.expect("fill", &k, &q, 2, allow(0, 60 * S)).await;
    run.at(START + S);
    run.expect("full", &k, &q, 1, deny(0, 59 * S, 59 * S)).await;
    run.at(START + 3600 * S);
    run.expect("an hour later", &k, &q, 2, allow(0, 60 * S))
        .await;
    run.expect("full again", &k, &q, 1, deny(0, 60 * S, 60 * S))
        .await;
}

/// Sliding counter "4/1m sliding-counter(10s)" (n = 6 buckets): n + 1
/// buckets count; a bucket stops counting at its end plus W, exactly on a
/// bucket boundary.
pub async fn sliding_counter_sequence<F: StoreFactory>(factory: &F) {
    let run = Run::start(factory, "sliding_counter_sequence").await;
    let q = quota("4/1m sliding-counter(10s)");
    let k = run.key("user");
    // Bucket B = START / 10 s stops counting at START + 70 s.
    run.at(START + 3 * S);
    run.expect("bucket B", &k, &q, 1, allow(3, 67 * S)).await;
    // Bucket B + 1 stops counting at START + 80 s.
    run.at(START + 15 * S);
    run.expect("bucket B+1", &k, &q, 2, allow(1, 65 * S)).await;
    run.expect("needs bucket B", &k, &q, 2, deny(1, 65 * S, 55 * S))
        .await;
    run.at(START + 70 * S - 1);
    run.expect("1 µs before B leaves", &k, &q, 2, deny(1, 10 * S + 1, 1))
        .await;
    run.at(START + 70 * S);
    run.expect("B left on the boundary", &k, &q, 2, allow(0, 70 * S))
        .await;
    run.expect("needs bucket B+1", &k, &q, 1, deny(0, 70 * S, 10 * S))
        .await;
    run.expect("5 never fits", &k, &q, 5, never(0, 70 * S))
        .await;
    run.at(START + 80 * S);
    run.expect("B+1 left", &k, &q, 2, allow(0, 70 * S)).await;
}

/// Sliding counter "2/1m sliding-counter(1m)": one bucket per window, so the
/// previous window's bucket still counts; starts on a minute boundary.
pub async fn sliding_counter_single_bucket_on_boundaries<F: StoreFactory>(factory: &F) {
    let run = Run::start(factory, "sliding_counter_single_bucket_on_boundaries").await;
    let q = quota("2/1m sliding-counter(1m)");
    let k = run.key("user");
    let e = MINUTE_END;
    run.at(e);
    run.expect("on the boundary", &k, &q, 2, allow(0, 120 * S))
        .await;
    run.at(e + 59 * S);
    run.expect("same bucket", &k, &q, 1, deny(0, 61 * S, 61 * S))
        .await;
    run.at(e + 60 * S);
    run.expect(
        "next bucket, old one counts",
        &k,
        &q,
        1,
        deny(0, 60 * S, 60 * S),
    )
    .await;
    run.at(e + 120 * S - 1);
    run.expect("1 µs before it leaves", &k, &q, 1, deny(0, 1, 1))
        .await;
    run.at(e + 120 * S);
    run.expect("it left", &k, &q, 2, allow(0, 120 * S)).await;
}

/// Sliding counter "3/1m sliding-counter(10s)": idle state counts as empty.
pub async fn sliding_counter_idle_expiry<F: StoreFactory>(factory: &F) {
    let run = Run::start(factory, "sliding_counter_idle_expiry").await;
    let q = quota("3/1m sliding-counter(10s)");
    let k = run.key("user");
    run.expect("fill on a bucket boundary", &k, &q, 3, allow(0, 70 * S))
        .await;
    run.at(START + 86_405 * S);
    run.expect("a day later", &k, &q, 3, allow(0, 65 * S)).await;
    run.expect("full again", &k, &q, 1, deny(0, 65 * S, 65 * S))
        .await;
}

/// Fixed window "3/1m fixed-window": aligned windows; the one holding START
/// ends at START + 40 s; a new window starts empty exactly at its start.
pub async fn fixed_window_sequence<F: StoreFactory>(factory: &F) {
    let run = Run::start(factory, "fixed_window_sequence").await;
    let q = quota("3/1m fixed-window");
    let k = run.key("user");
    let e = MINUTE_END;
    run.expect("2 units", &k, &q, 2, allow(1, 40 * S)).await;
    run.at(START + 10 * S);
    run.expect("2 more do not fit", &k, &q, 2, deny(1, 30 * S, 30 * S))
        .await;
    run.expect("1 fits", &k, &q, 1, allow(0, 30 * S)).await;
    run.at(e - 1);
    run.expect("last µs of the window", &k, &q, 1, deny(0, 1, 1))
        .await;
    run.at(e);
    run.expect("next window", &k, &q, 3, allow(0, 60 * S)).await;
    run.expect("full", &k, &q, 1, deny(0, 60 * S, 60 * S)).await;
    run.expect("4 never fits", &k, &q, 4, never(0, 60 * S))
        .await;
    run.at(e + 60 * S - 1);
    run.expect("last µs again", &k, &q, 1, deny(0, 1, 1)).await;
    run.at(e + 60 * S);
    run.expect("third window", &k, &q, 1, allow(2, 60 * S))
        .await;
}

/// Fixed window "3/1m fixed-window": a window long gone counts as empty.
pub async fn fixed_window_idle_expiry<F: StoreFactory>(factory: &F) {
    let run = Run::start(factory, "fixed_window_idle_expiry").await;
    let q = quota("3/1m fixed-window");
    let k = run.key("user");
    run.expect("fill", &k, &q, 3, allow(0, 40 * S)).await;
    run.at(MINUTE_END + 3617 * S);
    run.expect("an hour later", &k, &q, 3, allow(0, 43 * S))
        .await;
    run.expect("full again", &k, &q, 1, deny(0, 43 * S, 43 * S))
        .await;
}

/// GCRA "5/1m gcra": T = 12 s, B = 5, B T = 60 s. Burst, steady rate, the
/// exact instant tat catches up, remaining from the backlog.
pub async fn gcra_sequence<F: StoreFactory>(factory: &F) {
    let run = Run::start(factory, "gcra_sequence").await;
    let q = quota("5/1m gcra");
    let k = run.key("user");
    run.expect("1 unit", &k, &q, 1, allow(4, 12 * S)).await;
    run.expect("the rest of the burst", &k, &q, 4, allow(0, 60 * S))
        .await;
    run.expect("empty", &k, &q, 1, deny(0, 60 * S, 12 * S))
        .await;
    run.at(START + 12 * S - 1);
    run.expect("1 µs early", &k, &q, 1, deny(0, 48 * S + 1, 1))
        .await;
    run.at(START + 12 * S);
    run.expect("one interval later", &k, &q, 1, allow(0, 60 * S))
        .await;
    // tat = START + 72 s; backlog 42 s at START + 30 s.
    run.at(START + 30 * S);
    run.expect("2 do not fit", &k, &q, 2, deny(1, 42 * S, 6 * S))
        .await;
    run.expect("1 fits", &k, &q, 1, allow(0, 54 * S)).await;
    run.expect("6 never fits", &k, &q, 6, never(0, 54 * S))
        .await;
}

/// GCRA "2/1m gcra(burst=6)": T = 30 s, B = 6, B T = 180 s. The burst can
/// exceed the limit; capacity is the burst.
pub async fn gcra_burst<F: StoreFactory>(factory: &F) {
    let run = Run::start(factory, "gcra_burst").await;
    let q = quota("2/1m gcra(burst=6)");
    let k = run.key("user");
    run.expect("7 never fits", &k, &q, 7, never(6, 0)).await;
    run.expect("the whole burst", &k, &q, 6, allow(0, 180 * S))
        .await;
    run.expect("empty", &k, &q, 1, deny(0, 180 * S, 30 * S))
        .await;
    run.at(START + 60 * S);
    run.expect("the rate refills 2 a minute", &k, &q, 2, allow(0, 180 * S))
        .await;
    run.at(START + 132 * S);
    run.expect("3 do not fit yet", &k, &q, 3, deny(2, 108 * S, 18 * S))
        .await;
    run.expect("2 fit", &k, &q, 2, allow(0, 168 * S)).await;
    run.expect("7 never fits", &k, &q, 7, never(0, 168 * S))
        .await;
}

/// GCRA "7/1m gcra": T = ceil(60 s / 7) = 8_571_429 µs, so B T =
/// 60_000_003 µs: the interval rounds up, never faster than the limit.
pub async fn gcra_emission_interval_rounds_up<F: StoreFactory>(factory: &F) {
    let run = Run::start(factory, "gcra_emission_interval_rounds_up").await;
    let q = quota("7/1m gcra");
    let k = run.key("user");
    run.expect("the burst", &k, &q, 7, allow(0, 60_000_003))
        .await;
    run.expect("one interval", &k, &q, 1, deny(0, 60_000_003, 8_571_429))
        .await;
    run.at(START + 8_571_429);
    run.expect("after one interval", &k, &q, 1, allow(0, 60_000_003))
        .await;
}

/// GCRA "5/1m gcra": a tat long past counts as empty.
pub async fn gcra_idle_expiry<F: StoreFactory>(factory: &F) {
    let run = Run::start(factory, "gcra_idle_expiry").await;
    let q = quota("5/1m gcra");
    let k = run.key("user");
    run.expect("the burst", &k, &q, 5, allow(0, 60 * S)).await;
    run.at(START + S);
    run.expect("empty", &k, &q, 1, deny(0, 59 * S, 11 * S))
        .await;
    run.at(START + 7200 * S);
    run.expect("two hours later", &k, &q, 5, allow(0, 60 * S))
        .await;
}

/// Every algorithm: a cost above the capacity (the limit, or the GCRA
/// burst) is denied with `retry_after = None` and consumes nothing, on an
/// empty key and on a used one.
pub async fn cost_above_capacity_is_never_admitted<F: StoreFactory>(factory: &F) {
    let run = Run::start(factory, "cost_above_capacity_is_never_admitted").await;
    // (quota, reset_after of a full admission at START, same when empty)
    let cases = [
        ("5/1m", 60 * S, 0),
        ("5/1m sliding-counter(10s)", 70 * S, 0),
        // Fixed window: reset_after is the end of the current window.
        ("5/1m fixed-window", 40 * S, 40 * S),
    ];
    for (text, full_reset, empty_reset) in cases {
        let q = quota(text);
        let k = run.key(text);
        run.expect("6 on empty", &k, &q, 6, never(5, empty_reset))
            .await;
        run.expect("u32::MAX on empty", &k, &q, u32::MAX, never(5, empty_reset))
            .await;
        run.expect("5 fits", &k, &q, 5, allow(0, full_reset)).await;
        run.expect("6 on full", &k, &q, 6, never(0, full_reset))
            .await;
    }
    // GCRA's capacity is the burst: T = 12 s, B = 2, B T = 24 s.
    let q = quota("5/1m gcra(burst=2)");
    let k = run.key("gcra");
    run.expect("3 on empty", &k, &q, 3, never(2, 0)).await;
    run.expect("the limit is above the burst", &k, &q, 5, never(2, 0))
        .await;
    run.expect("u32::MAX on empty", &k, &q, u32::MAX, never(2, 0))
        .await;
    run.expect("2 fit", &k, &q, 2, allow(0, 24 * S)).await;
    run.expect("3 on full", &k, &q, 3, never(0, 24 * S)).await;
}

/// Every algorithm at capacity 3: many denials (fitting costs and costs that
/// never fit) change nothing: the answers repeat exactly, and the wait the
/// first denial gave is exact to the microsecond.
pub async fn denial_consumes_nothing<F: StoreFactory>(factory: &F) {
    let run = Run::start(factory, "denial_consumes_nothing").await;
    // (quota, reset after filling at START, wait from START + 1 s for
    //  costs 1, 2, 3, reset_after 1 µs before the first wait is over,
    //  remaining after the wait when 1 unit is taken)
    let cases: [(&str, u64, [u64; 3], u64, u32); 4] = [
        ("3/1m", 60 * S, [59 * S; 3], 1, 2),
        ("3/1m sliding-counter(10s)", 70 * S, [69 * S; 3], 1, 2),
        ("3/1m fixed-window", 40 * S, [39 * S; 3], 1, 2),
        // GCRA: T = 20 s, tat = START + 60 s; each unit waits one more T.
        ("3/1m gcra", 60 * S, [19 * S, 39 * S, 59 * S], 40 * S + 1, 0),
    ];
    for (text, full_reset, waits, reset_before, remaining_after) in cases {
        let q = quota(text);
        let k = run.key(text);
        run.at(START);
        run.expect("fill", &k, &q, 3, allow(0, full_reset)).await;
        run.at(START + S);
        let backlog = full_reset - S;
        for round in 0..10 {
            for (cost, wait) in (1..=3).zip(waits) {
                run.expect(
                    &format!("round {round}"),
                    &k,
                    &q,
                    cost,
                    deny(0, backlog, wait),
                )
                .await;
            }
            for cost in [4, 1000, u32::MAX] {
                run.expect(&format!("round {round}"), &k, &q, cost, never(0, backlog))
                    .await;
            }
        }
        run.at(START + S + waits[0] - 1);
        run.expect(
            "1 µs before the wait is over",
            &k,
            &q,
            1,
            deny(0, reset_before, 1),
        )
        .await;
        run.at(START + S + waits[0]);
        let after = run.check(&k, &q, 1).await;
        assert!(
            after.allowed() && after.remaining() == remaining_after,
            "denial_consumes_nothing: {text}: after the wait: {after:?}"
        );
    }
}

/// Keys differing only in tenant, subject, quota name or quota definition
/// never share a window, including keys that would collide if tenant and
/// subject were naively joined, or that contain hash-tag braces.
pub async fn keys_tenants_and_quotas_are_independent<F: StoreFactory>(factory: &F) {
    let run = Run::start(factory, "keys_tenants_and_quotas_are_independent").await;
    for text in [
        "1/1m",
        "1/1m sliding-counter(10s)",
        "1/1m fixed-window",
        "1/1m gcra",
    ] {
        let q = quota(text);
        let k = run.key("user");
        let used = run.check(&k, &q, 1).await;
        assert!(used.allowed(), "{text}: first use of the key: {used:?}");
        let full = run.check(&k, &q, 1).await;
        assert!(!full.allowed(), "{text}: key is full: {full:?}");
        let others = [
            ("another subject", run.key("user2")),
            ("another tenant", run.key_in("-b", "user")),
            ("tenant + ':x', subject 'y'", run.key_in(":x", "y")),
            ("subject 'x:y'", run.key("x:y")),
            ("subject with braces", run.key("{user}")),
            ("subject with a closing brace", run.key("}user")),
            ("empty subject", run.key("")),
        ];
        for (what, other) in &others {
            let d = run.check(other, &q, 1).await;
            assert!(d.allowed(), "{text}: {what} is independent: {d:?}");
        }
        let renamed = q
            .clone()
            .named("other-name")
            .unwrap_or_else(|e| panic!("{e}"));
        let d = run.check(&k, &renamed, 1).await;
        assert!(
            d.allowed(),
            "{text}: another quota name is independent: {d:?}"
        );
        let longer = quota(&text.replacen("/1m", "/2m", 1));
        let d = run.check(&k, &longer, 1).await;
        assert!(d.allowed(), "{text}: another window is independent: {d:?}");
        let d = run.check(&k, &q, 1).await;
        assert!(!d.allowed(), "{text}: the first key is still full: {d:?}");
    }
}

/// Every algorithm with limit u32::MAX: a cost of u32::MAX is admitted
/// exactly once and nothing overflows.
pub async fn huge_costs_do_not_overflow<F: StoreFactory>(factory: &F) {
    let run = Run::start(factory, "huge_costs_do_not_overflow").await;
    let max = u64::from(u32::MAX);
    let cases = [
        ("4294967295/1m", 60 * S, 60 * S),
        ("4294967295/1m sliding-counter(10s)", 70 * S, 70 * S),
        ("4294967295/1m fixed-window", 40 * S, 40 * S),
        // GCRA: T = ceil(60 s / (2^32 - 1)) = 1 µs, B T = 2^32 - 1 µs.
        ("4294967295/1m gcra", max, 1),
    ];
    for (text, reset, wait) in cases {
        let q = quota(text);
        let k = run.key(text);
        run.expect("u32::MAX", &k, &q, u32::MAX, allow(0, reset))
            .await;
        run.expect("one more", &k, &q, 1, deny(0, reset, wait))
            .await;
        run.expect(
            "u32::MAX again",
            &k,
            &q,
            u32::MAX,
            deny(0, reset, wait.max(reset)),
        )
        .await;
    }
}

/// A cost of 0 is an invalid request and records nothing. A backend can no
/// longer be sent one (a [`Cost`] is never 0); the [`Limiter`] on the
/// backend refuses it with a typed error before any store call.
pub async fn zero_cost_is_an_invalid_request<F: StoreFactory>(factory: &F) {
    let run = Run::start(factory, "zero_cost_is_an_invalid_request").await;
    assert_eq!(Cost::new(0), None, "a zero cost cannot be built");
    let store = Store::bare(store::Backend::windows(Shared::of(&run.store)));
    for (text, reset) in [
        ("2/1m", 60 * S),
        ("2/1m sliding-counter(10s)", 70 * S),
        ("2/1m fixed-window", 40 * S),
        ("2/1m gcra", 30 * S),
    ] {
        let q = quota(text);
        let k = run.key(text);
        let limiter = Limiter::new(store.clone(), q.clone());
        match limiter.check(&k, 0).await {
            Err(e) => assert!(matches!(e, LimitError::ZeroCost), "{text}: {e}"),
            Ok(d) => panic!("{text}: a zero cost was decided: {d:?}"),
        }
        run.expect("after the invalid request", &k, &q, 1, allow(1, reset))
            .await;
    }
}

/// The retry walk of a denial looks at no more than 128 slots (log entries,
/// non-empty buckets): a wait that needs more is reported as `reset_after`
/// (later than exact, never earlier); one within 128 is exact.
pub async fn retry_walk_is_bounded<F: StoreFactory>(factory: &F) {
    let run = Run::start(factory, "retry_walk_is_bounded").await;
    // Sliding log: 200 entries, one per second.
    let q = quota("200/1h");
    let k = run.key("log");
    for i in 0..200 {
        run.at(START + i * S);
        run.expect("fill", &k, &q, 1, allow(199 - i as u32, 3600 * S))
            .await;
    }
    // 100 units free when entry 99 (START + 99 s) expires; 150 need 150 entries.
    run.expect("within the walk", &k, &q, 100, deny(0, 3600 * S, 3500 * S))
        .await;
    run.expect("beyond the walk", &k, &q, 150, deny(0, 3600 * S, 3600 * S))
        .await;
    // Sliding counter: 150 admissions in every other 10 s bucket (n = 360).
    let q = quota("150/1h sliding-counter(10s)");
    let k = run.key("counter");
    for i in 0..150 {
        run.at(START + i * 20 * S);
        run.expect("fill", &k, &q, 1, allow(149 - i as u32, 3610 * S))
            .await;
    }
    // Now = START + 2980 s. Bucket i counts until START + 20 i s + 3610 s.
    run.expect(
        "within the walk",
        &k,
        &q,
        120,
        deny(0, 3610 * S, (119 * 20 + 3610 - 2980) * S),
    )
    .await;
    run.expect("beyond the walk", &k, &q, 140, deny(0, 3610 * S, 3610 * S))
        .await;
}

fn named(text: &str, name: &str) -> Quota {
    quota(text)
        .named(name)
        .unwrap_or_else(|e| panic!("quota name {name:?}: {e}"))
}

fn per_tenant(text: &str, name: &str) -> Quota {
    named(text, name).scoped(Scope::Tenant)
}

fn policy(name: &str, quotas: impl IntoIterator<Item = Quota>) -> Policy {
    Policy::new(name, quotas).unwrap_or_else(|e| panic!("policy {name:?}: {e}"))
}

/// Every quota's state of a decision, by name.
fn states(d: &Decision) -> Vec<(String, Seen)> {
    d.quotas()
        .iter()
        .map(|q| {
            let seen = Seen {
                allowed: q.allowed(),
                remaining: q.remaining(),
                reset_after: micros(q.reset_after()),
                retry_after: q.retry_after().map(micros),
            };
            (q.quota().name().to_owned(), seen)
        })
        .collect()
}

fn want(states: &[(&str, Seen)]) -> Vec<(String, Seen)> {
    states.iter().map(|(n, s)| ((*n).to_owned(), *s)).collect()
}

/// Every policy shape, driven through one pseudo-random sequence of times,
/// subjects and costs, decides exactly as a [`MemoryStore`] on the same
/// clock: every field of every decision and of every quota's state.
pub async fn policy_shapes_match_the_memory_store<F: StoreFactory>(factory: &F) {
    let run = Run::start(factory, "policy_shapes_match_the_memory_store").await;
    let memory = MemoryStore::builder().clock(run.clock.clone()).build();
    let shapes = [
        policy("single", [named("5/20s", "only")]),
        policy(
            "two",
            [
                named("3/5s gcra", "burst"),
                named("10/1m sliding-counter(10s)", "sustained"),
            ],
        ),
        policy(
            "all-four",
            [
                named("6/30s", "log"),
                named("8/1m sliding-counter(10s)", "counter"),
                named("7/20s fixed-window", "fixed"),
                named("4/10s gcra(burst=5)", "gcra"),
            ],
        ),
        policy(
            "tenant-and-subject",
            [
                named("4/30s", "user"),
                per_tenant("9/1m fixed-window", "org"),
            ],
        ),
        policy(
            "tenant-shared",
            [
                named("5/1m sliding-counter(10s)", "user"),
                per_tenant("6/1m", "org"),
                per_tenant("3/10s gcra", "org-burst"),
            ],
        ),
    ];
    let mut admitted = 0;
    let mut denied = 0;
    for (i, p) in shapes.iter().enumerate() {
        let keys = [run.key("alice"), run.key("bob")];
        let mut now = START;
        let mut seed: u64 = 0x9E37_79B9_7F4A_7C15 ^ i as u64;
        for step in 0..80 {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let r = seed >> 33;
            now += (r % 5) * 1_250_000 + (r >> 8) % 1000;
            run.at(now);
            let key = &keys[usize::from(r & (1 << 20) != 0)];
            let cost = 1 + ((r >> 12) % 3) as u32;
            let got = run.check_policy(key, p, cost).await;
            let expected = memory
                .check(&mut Guard::bare(), CheckRequest::new(key, p, cost_of(cost)))
                .await
                .unwrap_or_else(|e| panic!("memory store: {e}"));
            assert_eq!(
                got,
                expected,
                "policy_shapes_match_the_memory_store: {} ({p}), step {step}: cost {cost} at START + {} µs",
                p.name(),
                now - START
            );
            if got.allowed() {
                admitted += 1;
            } else {
                denied += 1;
            }
        }
    }
    assert!(
        admitted > 50 && denied > 50,
        "the sequences exercise both outcomes: {admitted} admitted, {denied} denied"
    );
}

/// All-or-nothing: while one quota of a policy denies, no quota's state
/// moves (the others report their state as it stands, admitting), however
/// many denials; the next admission takes the cost from every quota.
pub async fn a_denial_moves_no_quota<F: StoreFactory>(factory: &F) {
    let run = Run::start(factory, "a_denial_moves_no_quota").await;
    let p = policy(
        "p",
        [
            named("10/1m", "log"),
            named("10/1m sliding-counter(10s)", "counter"),
            named("2/1m fixed-window", "tight"),
            named("10/1m gcra", "gcra"),
        ],
    );
    let k = run.key("user");
    let d = run.check_policy(&k, &p, 2).await;
    assert!(d.allowed(), "a_denial_moves_no_quota: {d:?}");
    assert_eq!(
        states(&d),
        want(&[
            ("log", allow(8, 60 * S)),
            ("counter", allow(8, 70 * S)),
            ("tight", allow(0, 40 * S)),
            // T = 6 s: tat = START + 12 s.
            ("gcra", allow(8, 12 * S)),
        ]),
        "a_denial_moves_no_quota: the admission"
    );
    run.at(START + S);
    for round in 0..5 {
        for cost in [1, 2] {
            let d = run.check_policy(&k, &p, cost).await;
            assert!(!d.allowed(), "round {round}: {d:?}");
            assert_eq!(
                (d.quota().name(), Seen::from(&d)),
                ("tight", deny(0, 39 * S, 39 * S)),
                "a_denial_moves_no_quota: the deciding quota"
            );
            assert_eq!(
                states(&d),
                want(&[
                    ("log", allow(8, 59 * S)),
                    ("counter", allow(8, 69 * S)),
                    ("tight", deny(0, 39 * S, 39 * S)),
                    ("gcra", allow(8, 11 * S)),
                ]),
                "a_denial_moves_no_quota: round {round}, cost {cost}"
            );
        }
    }
    // The next fixed window: admitted, 1 unit from every quota.
    run.at(MINUTE_END);
    let d = run.check_policy(&k, &p, 1).await;
    assert_eq!(
        states(&d),
        want(&[
            ("log", allow(7, 60 * S)),
            ("counter", allow(7, 70 * S)),
            ("tight", allow(1, 60 * S)),
            // tat (START + 12 s) is past: from now, one interval.
            ("gcra", allow(9, 6 * S)),
        ]),
        "a_denial_moves_no_quota: after the window"
    );
}

/// A tenant-scoped quota is one window per tenant, shared by its subjects;
/// the subject quota beside it stays per subject; other tenants are apart.
pub async fn tenant_quota_is_shared_by_subjects<F: StoreFactory>(factory: &F) {
    let run = Run::start(factory, "tenant_quota_is_shared_by_subjects").await;
    let p = policy(
        "p",
        [
            named("3/1m", "user"),
            per_tenant("4/1m fixed-window", "org"),
        ],
    );
    let (alice, bob) = (run.key("alice"), run.key("bob"));
    let d = run.check_policy(&alice, &p, 2).await;
    assert_eq!(
        states(&d),
        want(&[("user", allow(1, 60 * S)), ("org", allow(2, 40 * S))]),
        "tenant_quota_is_shared_by_subjects: alice"
    );
    let d = run.check_policy(&bob, &p, 2).await;
    assert_eq!(
        states(&d),
        want(&[("user", allow(1, 60 * S)), ("org", allow(0, 40 * S))]),
        "tenant_quota_is_shared_by_subjects: bob"
    );
    let d = run.check_policy(&alice, &p, 1).await;
    assert!(!d.allowed());
    assert_eq!(
        (d.quota().name(), Seen::from(&d)),
        ("org", deny(0, 40 * S, 40 * S))
    );
    assert_eq!(
        states(&d),
        want(&[("user", allow(1, 60 * S)), ("org", deny(0, 40 * S, 40 * S))]),
        "tenant_quota_is_shared_by_subjects: the tenant is full"
    );
    let other = run.key_in("-b", "alice");
    let d = run.check_policy(&other, &p, 1).await;
    assert_eq!(
        states(&d),
        want(&[("user", allow(2, 60 * S)), ("org", allow(3, 40 * S))]),
        "tenant_quota_is_shared_by_subjects: another tenant"
    );
    // The tenant's window opens again with the next minute; the subject
    // windows still count.
    run.at(MINUTE_END);
    let d = run.check_policy(&alice, &p, 1).await;
    assert_eq!(
        states(&d),
        want(&[("user", allow(0, 60 * S)), ("org", allow(3, 60 * S))]),
        "tenant_quota_is_shared_by_subjects: next minute"
    );
}

/// A rolling limit change (same name, window and algorithm, another limit)
/// keeps the window: 30 used of 100, then 170 left of 200. Changing the
/// window starts afresh.
pub async fn rolling_limit_change_keeps_the_window<F: StoreFactory>(factory: &F) {
    let run = Run::start(factory, "rolling_limit_change_keeps_the_window").await;
    // (algorithm, reset after 30 at START, remaining and reset of the
    //  200/1m quota before a cost)
    let cases: [(&str, u64, u32, u64); 4] = [
        ("", 60 * S, 170, 60 * S),
        (" sliding-counter(10s)", 70 * S, 170, 70 * S),
        (" fixed-window", 40 * S, 170, 40 * S),
        // 100/1m: T = 600 ms, tat = START + 18 s; 200/1m: T = 300 ms, B T = 60 s.
        (" gcra", 18 * S, 140, 18 * S),
    ];
    for (algorithm, reset, left, left_reset) in cases {
        let old = named(&format!("100/1m{algorithm}"), "api");
        let new = named(&format!("200/1m{algorithm}"), "api");
        let other = named("1000/1h gcra", "hourly");
        let k = run.key(algorithm);
        run.at(START);
        let d = run
            .check_policy(&k, &policy("v1", [old, other.clone()]), 30)
            .await;
        assert_eq!(
            states(&d)[0],
            ("api".to_owned(), allow(70, reset)),
            "{algorithm}: 30 used"
        );
        let v2 = policy("v2", [new.clone(), other]);
        let d = run.check_policy(&k, &v2, u32::MAX).await;
        assert_eq!(
            states(&d)[0],
            ("api".to_owned(), never(left, left_reset)),
            "{algorithm}: the window is kept"
        );
        let fresh = named(&format!("200/2m{algorithm}"), "api");
        let d = run.check(&k, &fresh, 1).await;
        assert!(
            d.allowed() && d.remaining() == 199,
            "{algorithm}: another window starts afresh: {d:?}"
        );
    }
}

/// A shadow quota never denies: its would-be denial admits (reported as
/// the quota's `allowed = false`), records nothing in the shadow window
/// (it keeps counting only what it would itself have admitted), and never
/// decides while an enforced quota exists; an enforced denial records
/// nothing in either.
pub async fn shadow_quota_never_denies_and_records_only_what_fits<F: StoreFactory>(factory: &F) {
    let run = Run::start(factory, "shadow_quota_never_denies").await;
    let p = policy(
        "p",
        [
            named("3/1m", "burst"),
            named("2/1m", "trial").shadowed(true),
        ],
    );
    let k = run.key("user");
    let d = run.check_policy(&k, &p, 1).await;
    assert_eq!(
        states(&d),
        want(&[("burst", allow(2, 60 * S)), ("trial", allow(1, 60 * S))])
    );
    let d = run.check_policy(&k, &p, 1).await;
    assert_eq!(
        states(&d),
        want(&[("burst", allow(1, 60 * S)), ("trial", allow(0, 60 * S))])
    );
    run.at(START + 30 * S);
    let d = run.check_policy(&k, &p, 1).await;
    assert!(d.allowed(), "a shadow quota never denies: {d:?}");
    assert_eq!(
        (d.quota().name(), Seen::from(&d)),
        ("burst", allow(0, 60 * S))
    );
    assert_eq!(
        states(&d),
        want(&[
            ("burst", allow(0, 60 * S)),
            ("trial", deny(0, 30 * S, 30 * S))
        ])
    );
    assert_eq!(d.shadow_denials().count(), 1);
    // The enforced quota denies: the decision is its, nothing is recorded.
    let d = run.check_policy(&k, &p, 1).await;
    assert!(!d.allowed());
    assert_eq!(
        (d.quota().name(), Seen::from(&d)),
        ("burst", deny(0, 60 * S, 30 * S))
    );
    // The entries of START expire: had the shadow quota recorded the
    // admission at START + 30 s, it would have 1 left, not 2.
    run.at(START + 60 * S);
    let d = run.check_policy(&k, &p, 1).await;
    assert_eq!(
        states(&d),
        want(&[("burst", allow(1, 60 * S)), ("trial", allow(1, 60 * S))]),
        "shadow_quota_never_denies: the shadow window holds what it admitted"
    );
}

/// A peek reports every quota's state as it stands (remaining before any
/// cost) and whether the cost would fit, and records nothing, for every
/// algorithm: peeks in between change no later decision.
pub async fn peek_reads_every_quota_and_consumes_nothing<F: StoreFactory>(factory: &F) {
    let run = Run::start(factory, "peek_consumes_nothing").await;
    let p = policy(
        "p",
        [
            named("3/1m", "log"),
            named("5/1m fixed-window", "fixed"),
            named("10/1m gcra", "gcra"),
            named("10/1m sliding-counter(10s)", "counter"),
        ],
    );
    let fresh = run.peek_policy(&run.key("nobody"), &p, 1).await;
    assert!(fresh.allowed());
    let left: Vec<u32> = fresh.quotas().iter().map(|q| q.remaining()).collect();
    assert_eq!(left, [3, 5, 10, 10], "a key never checked is full");
    let k = run.key("user");
    let d = run.check_policy(&k, &p, 2).await;
    let after = want(&[
        ("log", allow(1, 60 * S)),
        ("fixed", allow(3, 40 * S)),
        // T = 6 s: tat = START + 12 s.
        ("gcra", allow(8, 12 * S)),
        ("counter", allow(8, 70 * S)),
    ]);
    assert_eq!(states(&d), after);
    for _ in 0..3 {
        let peek = run.peek_policy(&k, &p, 1).await;
        assert!(peek.allowed());
        assert_eq!(states(&peek), after, "peek_consumes_nothing: as it stands");
    }
    let peek = run.peek_policy(&k, &p, 2).await;
    assert!(!peek.allowed(), "2 more do not fit the log: {peek:?}");
    assert_eq!(
        states(&peek)[0],
        ("log".to_owned(), deny(1, 60 * S, 60 * S))
    );
    // The next admission takes exactly its cost from what the check left.
    let d = run.check_policy(&k, &p, 1).await;
    assert_eq!(
        states(&d),
        want(&[
            ("log", allow(0, 60 * S)),
            ("fixed", allow(2, 40 * S)),
            ("gcra", allow(7, 18 * S)),
            ("counter", allow(7, 70 * S)),
        ])
    );
}

/// A request with a cost per quota (an Envoy request whose descriptors
/// carry their own `hits_addend`) is decided in one call like any other:
/// each quota takes its own cost, a denial by one counts nothing in any,
/// and a peek asks about the same costs. The limiter refuses a cost list
/// that does not match the policy with a typed error, before any call.
pub async fn quota_costs_are_decided_together<F: StoreFactory>(factory: &F) {
    let run = Run::start(factory, "quota_costs_are_decided_together").await;
    let p = policy(
        "p",
        [
            named("10/1m", "requests"),
            named("100/1m fixed-window", "bytes"),
            named("10/1m gcra", "gcra"),
            named("10/1m sliding-counter(10s)", "counter"),
        ],
    );
    let k = run.key("user");
    let d = run.check_each(&k, &p, &[1, 60, 2, 3]).await;
    assert!(d.allowed(), "quota_costs: {d:?}");
    let first = want(&[
        ("requests", allow(9, 60 * S)),
        ("bytes", allow(40, 40 * S)),
        // T = 6 s: 2 units, tat = START + 12 s.
        ("gcra", allow(8, 12 * S)),
        ("counter", allow(7, 70 * S)),
    ]);
    assert_eq!(states(&d), first, "quota_costs: each quota its own cost");
    // 60 bytes no longer fit: denied, and no quota moves.
    for _ in 0..3 {
        let d = run.check_each(&k, &p, &[1, 60, 1, 1]).await;
        assert!(!d.allowed(), "quota_costs: {d:?}");
        assert_eq!(d.quota().name(), "bytes");
        let mut as_it_stands = first.clone();
        as_it_stands[1] = ("bytes".to_owned(), deny(40, 40 * S, 40 * S));
        assert_eq!(states(&d), as_it_stands, "quota_costs: a denial");
    }
    let ask = [cost_of(1), cost_of(41), cost_of(1), cost_of(1)];
    let peek = run
        .store
        .peek(
            &mut Guard::bare(),
            CheckRequest::new(&k, &p, Cost::ONE).with_quota_costs(&ask),
        )
        .await
        .unwrap_or_else(|e| panic!("quota_costs: peek: {e}"));
    assert!(!peek.allowed(), "41 bytes do not fit 40: {peek:?}");
    assert_eq!(states(&peek), {
        let mut p = first.clone();
        p[1] = ("bytes".to_owned(), deny(40, 40 * S, 40 * S));
        p
    });
    let d = run.check_each(&k, &p, &[1, 40, 1, 1]).await;
    assert_eq!(
        states(&d),
        want(&[
            ("requests", allow(8, 60 * S)),
            ("bytes", allow(0, 40 * S)),
            ("gcra", allow(7, 18 * S)),
            ("counter", allow(6, 70 * S)),
        ]),
        "quota_costs: the admission after the denials took only its own costs"
    );
    // Through a limiter: a list of the wrong length is refused, and equal
    // costs are one cost.
    let store = Store::bare(store::Backend::windows(Shared::of(&run.store)));
    let limiter = Limiter::new(store, p.clone());
    let three = QuotaCosts::from([Cost::ONE; 3]);
    match limiter.check_policy_per_quota(&k, &p, &three).await {
        Err(LimitError::QuotaCosts {
            quotas: 4,
            costs: 3,
        }) => {}
        other => panic!("quota_costs: three costs for four quotas: {other:?}"),
    }
    match limiter.peek_policy_per_quota(&k, &p, &three).await {
        Err(LimitError::QuotaCosts {
            quotas: 4,
            costs: 3,
        }) => {}
        other => panic!("quota_costs: a peek with three costs: {other:?}"),
    }
    let d = limiter
        .check_policy_per_quota(
            &k,
            &p,
            &QuotaCosts::from([Cost::ONE, cost_of(1), Cost::ONE, Cost::ONE]),
        )
        .await
        .unwrap_or_else(|e| panic!("quota_costs: {e}"));
    assert!(!d.allowed(), "no byte left: {d:?}");
    run.at(MINUTE_END);
    let d = limiter
        .check_policy_per_quota(
            &k,
            &p,
            &QuotaCosts::from([Cost::ONE, cost_of(100), Cost::ONE, Cost::ONE]),
        )
        .await
        .unwrap_or_else(|e| panic!("quota_costs: {e}"));
    assert_eq!(
        (
            d.allowed(),
            d.quotas()[0].remaining(),
            d.quotas()[1].remaining()
        ),
        (true, 7, 0),
        "quota_costs: the next fixed window takes 100 bytes and one request"
    );
}
