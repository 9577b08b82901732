//! Differential test: random sequences of (time step, cost) give exactly the
//! same decisions from `RedisStore` (Lua) and `MemoryStore` (the Rust
//! reference), for every algorithm, including small steps back in time:
//! checks, and reservations settled later below, at or past their estimate
//! (debt), or usage recorded with no reservation.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use tower_window::limit::{Backend as _, Reserved, SettleRequest};
use tower_window::store::Guard;
use tower_window::{CheckRequest, Cost, ManualClock, MemoryStore, Quota, RedisStore, WindowKey};
use tower_window_tests::conformance::START;
use tower_window_tests::redis_server::RedisServer;

const QUOTAS: &[&str] = &[
    "3/1s",
    "5/2s",
    "4/1s sliding-counter(250ms)",
    "6/2s sliding-counter(1s)",
    "3/1s fixed-window",
    "7/3s fixed-window",
    "3/1s gcra",
    "2/1s gcra(burst=5)",
    "7/1s gcra(burst=3)",
];

/// What a step does with its cost.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Check,
    /// A check whose admission is a reservation, settled by a later step.
    Reserve,
    /// Settles the oldest open reservation with the step's cost as usage
    /// (a cost of 8 settles 0: nothing used).
    Settle,
    /// Records the cost with no reservation, whether or not it fits.
    Record,
}

fn ops() -> impl Strategy<Value = Vec<(i64, u32, Kind)>> {
    // Steps from 100 ms back to 2.5 s forward (often 0: same microsecond),
    // costs from 1 to 8 (some above every limit here).
    proptest::collection::vec(
        (
            prop_oneof![Just(0i64), -100_000i64..0, 0i64..2_500_000, 0i64..50_000],
            1u32..=8,
            prop_oneof![
                6 => Just(Kind::Check),
                2 => Just(Kind::Reserve),
                2 => Just(Kind::Settle),
                1 => Just(Kind::Record),
            ],
        ),
        1..40,
    )
}

/// What a decision says: the verdict and time, and each quota's state.
type Seen = (bool, u64, Vec<(bool, u32, Duration, Option<Duration>)>);

fn seen(d: &tower_window::Decision) -> Seen {
    let quotas = d
        .quotas()
        .iter()
        .map(|q| (q.allowed(), q.remaining(), q.reset_after(), q.retry_after()));
    (d.allowed(), d.timestamp_micros(), quotas.collect())
}

#[test]
fn redis_matches_memory_store() {
    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let clock = ManualClock::new(START);
    let redis = RedisStore::builder()
        .url(server.url())
        .clock(clock.clone())
        .build()
        .unwrap();
    let memory = MemoryStore::builder().clock(clock.clone()).build();
    static CASE: AtomicU64 = AtomicU64::new(0);
    static ALLOWED: AtomicU64 = AtomicU64::new(0);
    static DENIED: AtomicU64 = AtomicU64::new(0);
    static SETTLED: AtomicU64 = AtomicU64::new(0);

    let config = ProptestConfig {
        cases: 96,
        ..ProptestConfig::default()
    };
    proptest!(config, |(quota_index in 0..QUOTAS.len(), shadow in proptest::option::weighted(0.3, 0..QUOTAS.len()), start_offset in 0u64..3_000_000, steps in ops())| {
        let quota: Quota = QUOTAS[quota_index].parse().unwrap();
        // Sometimes beside a shadow quota, which records only what fits.
        let policy = match shadow {
            None => tower_window::Policy::from(quota.clone()),
            Some(j) => {
                let shadow = QUOTAS[j].parse::<Quota>().unwrap().named("shadow").unwrap();
                tower_window::Policy::new("p", [quota.clone(), shadow.shadowed(true)]).unwrap()
            }
        };
        let key = WindowKey::new("diff", format!("case-{}", CASE.fetch_add(1, Ordering::Relaxed)));
        let mut now = START + start_offset;
        runtime.block_on(async {
            let mut open = std::collections::VecDeque::new();
            for (i, (step, cost, kind)) in steps.iter().enumerate() {
                now = now.saturating_add_signed(*step);
                clock.set(now);
                let request = CheckRequest::new(&key, &policy, Cost::new(*cost).unwrap());
                let (want, got) = match kind {
                    Kind::Check | Kind::Reserve => (
                        memory.check(&mut Guard::bare(), request).await,
                        redis.check(&mut Guard::bare(), request).await,
                    ),
                    Kind::Settle | Kind::Record => {
                        let reserved = match kind {
                            Kind::Settle => open.pop_front().unwrap_or(Reserved::NONE),
                            _ => Reserved::NONE,
                        };
                        let settle = SettleRequest::new(&key, &policy, reserved, cost % 8);
                        SETTLED.fetch_add(1, Ordering::Relaxed);
                        (
                            memory.settle(&mut Guard::bare(), settle).await,
                            redis.settle(&mut Guard::bare(), settle).await,
                        )
                    }
                };
                let at = now.cast_signed() - START.cast_signed();
                let context = format!("{quota} step {i} ({kind:?} {cost} at START + {at} µs)");
                let (want, got) = match (want, got) {
                    (Ok(want), Ok(got)) => (want, got),
                    // Both refuse (GCRA cannot give part of a reservation back).
                    (Err(want), Err(got)) if want.kind() == got.kind() => continue,
                    (want, got) => {
                        return Err(TestCaseError::fail(format!("{context}: {want:?} / {got:?}")))
                    }
                };
                if matches!(kind, Kind::Reserve) {
                    open.push_back(Reserved::of(&want, *cost));
                }
                let counter = if want.allowed() { &ALLOWED } else { &DENIED };
                counter.fetch_add(1, Ordering::Relaxed);
                prop_assert_eq!(seen(&got), seen(&want), "{}", context);
            }
            Ok(())
        })?;
    });
    // The sequences exercised both outcomes, many times.
    assert!(ALLOWED.load(Ordering::Relaxed) > 200, "{ALLOWED:?}");
    assert!(DENIED.load(Ordering::Relaxed) > 200, "{DENIED:?}");
    assert!(SETTLED.load(Ordering::Relaxed) > 200, "{SETTLED:?}");
}
