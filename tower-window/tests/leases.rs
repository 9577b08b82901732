//! Quota leases in the limiter, on the embedded store with a `ManualClock`:
//! local spending, adaptive size, refunds on expiry and on demand, the wait
//! a denial reports while other nodes hold units, and metrics.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use tower_window::lease::ReserveRequest;
use tower_window::store::{Backend, Guard, Op};
use tower_window::{
    lease, limit, CheckRequest, Cost, Decision, DecisionSource, LeaseConfig, Limiter, ManualClock,
    MemoryStore, Policy, Quota, Store, StoreErrorKind, WindowKey,
};

const START: u64 = 1_700_000_000_000_000;

fn limiter(store: &MemoryStore, quota: &str, max: u32) -> Limiter {
    Limiter::builder(store.clone(), quota.parse::<Quota>().unwrap())
        .leases(classic(max))
        .build()
}

/// Every key leases from its first check and reserves only when its lease
/// is empty: the exact schedules these tests assert (reservations of 1, 2,
/// 4, 8 units...) are those rules'. The defaults (only hot keys lease, the
/// next lease is reserved ahead of need) have their own tests in
/// `lease_refills.rs`.
fn classic(max: u32) -> LeaseConfig {
    LeaseConfig::new(max).hot_after(1).refill_ahead(false)
}

fn setup() -> (MemoryStore, ManualClock) {
    let clock = ManualClock::new(START);
    (MemoryStore::builder().clock(clock.clone()).build(), clock)
}

#[tokio::test]
async fn leases_double_while_hot_and_are_spent_without_the_store() {
    let (store, _) = setup();
    let limiter = limiter(&store, "1000/1m", 8);
    let key = WindowKey::for_subject("hot");
    let mut sources = Vec::new();
    for _ in 0..30 {
        let d = limiter.check(&key, 1).await.unwrap();
        assert!(d.allowed());
        sources.push(d.source());
    }
    // Reservations of 1, 2, 4, 8, 8, 8 units admit checks 1, 2, 4, 8, 16
    // and 24; every other check spends a held unit.
    let store_checks: Vec<usize> = sources
        .iter()
        .enumerate()
        .filter(|(_, s)| **s == DecisionSource::Store)
        .map(|(i, _)| i + 1)
        .collect();
    assert_eq!(store_checks, [1, 2, 4, 8, 16, 24]);
    assert!(sources
        .iter()
        .all(|s| matches!(s, DecisionSource::Store | DecisionSource::Lease)));
    let stats = limiter.lease_stats().unwrap();
    assert_eq!((stats.granted, stats.spent), (31, 30));
    assert_eq!(limiter.stats().lease, 24);
    assert_eq!(limiter.stats().store, 6);
    // The one unit left goes back, and the store counts exactly 30.
    assert_eq!(limiter.refund_leases().await, 1);
    assert_eq!(limiter.lease_stats().unwrap().refunded, 1);
    assert_eq!(limiter.refund_leases().await, 0);
    let probe = Limiter::new(store.clone(), "1000/1m".parse::<Quota>().unwrap());
    assert_eq!(
        probe.check(&key, 1).await.unwrap().remaining(),
        1000 - 30 - 1
    );
}

#[tokio::test]
async fn an_expired_lease_is_refunded_and_the_next_one_is_smaller() {
    let (store, clock) = setup();
    let limiter = limiter(&store, "1000/1m", 8);
    let key = WindowKey::for_subject("cooling");
    limiter.check(&key, 1).await.unwrap();
    // A lease of 2: one admitted with it, one held.
    assert_eq!(
        limiter.check(&key, 1).await.unwrap().source(),
        DecisionSource::Store
    );
    assert_eq!(limiter.lease_stats().unwrap().granted, 3);
    // Past the 1 s deadline (a tenth of the window, at most 1 s).
    clock.advance(Duration::from_secs(2));
    let d = limiter.check(&key, 1).await.unwrap();
    assert_eq!(d.source(), DecisionSource::Store);
    let stats = limiter.lease_stats().unwrap();
    assert_eq!(stats.expired_unspent, 1);
    assert_eq!(
        stats.returned, 1,
        "a late refund still returns unspent units"
    );
    assert_eq!(stats.granted, 4, "the next lease halved to 1");
    let probe = Limiter::new(store.clone(), "1000/1m".parse::<Quota>().unwrap());
    assert_eq!(
        probe.check(&key, 1).await.unwrap().remaining(),
        1000 - 3 - 1
    );
}

#[tokio::test]
async fn a_denial_waits_no_longer_than_the_leases_others_hold() {
    let (store, clock) = setup();
    let a = limiter(&store, "4/1m", 4);
    let b = limiter(&store, "4/1m", 4);
    let key = WindowKey::for_subject("shared");
    assert!(a.check(&key, 1).await.unwrap().allowed());
    assert!(a.check(&key, 1).await.unwrap().allowed()); // a lease of 2, one held
    assert!(b.check(&key, 1).await.unwrap().allowed());
    let denied = b.check(&key, 1).await.unwrap();
    assert!(!denied.allowed());
    assert_eq!(denied.source(), DecisionSource::Store);
    // The log would say 60 s (the oldest entry); a's lease ends in 1 s.
    assert_eq!(denied.retry_after(), Some(Duration::from_secs(1)));
    // a shuts down: its held unit goes back.
    assert_eq!(a.refund_leases().await, 1);
    clock.advance(Duration::from_secs(1));
    let again = b.check(&key, 1).await.unwrap();
    assert!(again.allowed(), "the refunded unit is b's now");
    assert!(!b.check(&key, 1).await.unwrap().allowed());
}

#[tokio::test]
async fn multi_quota_leases_take_from_every_quota() {
    let (store, _) = setup();
    let policy = Policy::new(
        "p",
        [
            "100/1m fixed-window"
                .parse::<Quota>()
                .unwrap()
                .named("minute")
                .unwrap(),
            "6/1h".parse::<Quota>().unwrap().named("hour").unwrap(),
        ],
    )
    .unwrap();
    let limiter = Limiter::builder(store.clone(), policy.clone())
        .leases(classic(64))
        .build();
    let key = WindowKey::for_subject("multi");
    let mut admitted = 0;
    for _ in 0..20 {
        admitted += u32::from(limiter.check(&key, 1).await.unwrap().allowed());
    }
    assert_eq!(admitted, 6, "the hour's 6 bound leased units too");
    limiter.refund_leases().await;
    let probe = Limiter::new(store.clone(), policy);
    let d = probe.check(&key, 1).await.unwrap();
    assert!(!d.allowed());
    assert_eq!(
        d.quotas()[0].remaining(),
        100 - 6,
        "the minute counts the same 6"
    );
}

/// An enforced quota and a shadow one (issue 22, defect 1).
fn with_shadow(shadow: &str) -> Policy {
    Policy::new(
        "p",
        [
            "20/1m fixed-window"
                .parse::<Quota>()
                .unwrap()
                .named("burst")
                .unwrap(),
            shadow
                .parse::<Quota>()
                .unwrap()
                .named("trial")
                .unwrap()
                .shadowed(true),
        ],
    )
    .unwrap()
}

/// Checks of `cost`: the decisions, and the units the shadow quota
/// admitted (would have).
async fn leased_checks(
    limiter: &Limiter,
    key: &WindowKey,
    n: usize,
    cost: u32,
) -> (Vec<Decision>, u32) {
    let mut decisions = Vec::new();
    let mut shadow_admitted = 0;
    for _ in 0..n {
        let d = limiter.check(key, cost).await.unwrap();
        if d.allowed() && d.quotas()[1].allowed() {
            shadow_admitted += cost;
        }
        decisions.push(d);
    }
    (decisions, shadow_admitted)
}

#[tokio::test]
async fn leased_admissions_report_a_shadow_quotas_would_be_denials() {
    let (store, _) = setup();
    let policy = with_shadow("3/1m");
    let limiter = Limiter::builder(store.clone(), policy.clone())
        .leases(classic(8))
        .build();
    let key = WindowKey::for_subject("trial");
    let (decisions, shadow_admitted) = leased_checks(&limiter, &key, 10, 1).await;
    assert!(
        decisions.iter().all(|d| d.allowed()),
        "the shadow never denies"
    );
    assert_eq!(
        shadow_admitted, 3,
        "the shadow quota admits its limit, leased or not"
    );
    let denials: Vec<(usize, DecisionSource)> = decisions
        .iter()
        .enumerate()
        .filter(|(_, d)| d.shadow_denials().count() == 1)
        .map(|(i, d)| (i, d.source()))
        .collect();
    assert_eq!(denials.len(), 7, "{denials:?}");
    assert!(
        denials.iter().any(|(_, s)| *s == DecisionSource::Lease),
        "leased admissions report them: {denials:?}"
    );
    // The enforced quota alone sized the leases: 1, 2, 4, then 7 (half of
    // the 13 left, rounded up); the full shadow quota shrank none.
    assert_eq!(limiter.lease_stats().unwrap().granted, 14);
    limiter.refund_leases().await;
    let probe = Limiter::new(store.clone(), policy);
    let d = probe.check(&key, 1).await.unwrap();
    assert_eq!(
        d.quotas()[0].remaining(),
        20 - 10 - 1,
        "the enforced quota counts 10"
    );
    assert_eq!(d.quotas()[1].remaining(), 0, "the shadow counts its 3");
}

#[tokio::test]
async fn a_shadow_quota_keeps_only_the_spends_it_would_have_admitted() {
    // Costs of 2 against a shadow hold of 3: one spend fits, the unit left
    // never does. The limiter names what each shadow quota still holds when
    // it refunds, so the window counts exactly the spends that fit.
    let (store, _) = setup();
    let policy = with_shadow("3/1m");
    let limiter = Limiter::builder(store.clone(), policy.clone())
        .leases(classic(8))
        .build();
    let key = WindowKey::for_subject("straddle");
    let (decisions, shadow_admitted) = leased_checks(&limiter, &key, 8, 2).await;
    assert_eq!(decisions.iter().filter(|d| d.allowed()).count(), 8);
    assert_eq!(shadow_admitted, 2);
    limiter.refund_leases().await;
    let peek = limit::Backend::peek(
        &store,
        &mut Guard::bare(),
        CheckRequest::new(&key, &policy, Cost::ONE),
    )
    .await
    .unwrap();
    assert_eq!(peek.quotas()[0].remaining(), 20 - 16);
    assert_eq!(
        peek.quotas()[1].remaining(),
        3 - 2,
        "exactly the spend that fit"
    );
}

#[tokio::test]
async fn leases_of_shadow_quotas_only_admit_everything_and_count_exactly() {
    let (store, _) = setup();
    let trial = "5/1m"
        .parse::<Quota>()
        .unwrap()
        .named("trial")
        .unwrap()
        .shadowed(true);
    let policy = Policy::from(trial.clone());
    let limiter = Limiter::builder(store.clone(), policy.clone())
        .leases(classic(8))
        .build();
    let key = WindowKey::for_subject("only");
    let mut shadow_admitted = 0;
    for _ in 0..50 {
        let d = limiter.check(&key, 1).await.unwrap();
        assert!(d.allowed());
        assert_ne!(d.source(), DecisionSource::LocalCache);
        shadow_admitted += u32::from(d.quotas()[0].allowed());
    }
    assert_eq!(shadow_admitted, 5);
    assert!(limiter.stats().lease > 0, "leases were spent");
    limiter.refund_leases().await;
    let peek = limit::Backend::peek(
        &store,
        &mut Guard::bare(),
        CheckRequest::new(&key, &policy, Cost::ONE),
    )
    .await
    .unwrap();
    assert_eq!(peek.remaining(), 0, "the shadow counts its 5");
}

/// A store without leases: only checks.
struct ChecksOnly(MemoryStore);

impl limit::Backend for ChecksOnly {
    fn check<'a>(
        &'a self,
        guard: &mut Guard<'a>,
        request: CheckRequest<'a>,
    ) -> Op<'static, Decision> {
        limit::Backend::check(&self.0, guard, request)
    }
}

#[tokio::test]
async fn a_store_without_leases_decides_every_check() {
    let (store, clock) = setup();
    let checks_only = Store::from(Backend::windows(ChecksOnly(store)).clock(clock));
    let limiter = Limiter::builder(checks_only, "3/1m".parse::<Quota>().unwrap())
        .leases(classic(8))
        .build();
    let key = WindowKey::for_subject("plain");
    for _ in 0..3 {
        let d = limiter.check(&key, 1).await.unwrap();
        assert!(d.allowed());
        assert_eq!(d.source(), DecisionSource::Store);
    }
    assert!(!limiter.check(&key, 1).await.unwrap().allowed());
    assert_eq!(limiter.lease_stats().unwrap().granted, 0);
}

#[test]
fn a_gcra_ttl_that_leaves_no_room_is_refused() {
    let policy = Policy::from("5/1s gcra".parse::<Quota>().unwrap());
    // T = 200 ms, B T = 1 s: a TTL up to 800 ms leaves room for a token.
    assert!(LeaseConfig::new(4)
        .ttl(Duration::from_millis(800))
        .validate(&policy)
        .is_ok());
    let error = LeaseConfig::new(4)
        .ttl(Duration::from_millis(801))
        .validate(&policy)
        .unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::InvalidRequest);
    // The default TTL (a tenth of the window) fits.
    assert!(LeaseConfig::new(4).validate(&policy).is_ok());
}

#[test]
fn zero_units_turns_leases_off() {
    let limiter = Limiter::builder(MemoryStore::new(), "3/1m".parse::<Quota>().unwrap())
        .leases(LeaseConfig::new(0))
        .build();
    assert!(limiter.lease_stats().is_none());
}

#[cfg(feature = "metrics")]
mod metrics {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    use tower_window::metrics::{DECISIONS_TOTAL, LEASE_UNITS_TOTAL, SHADOW_DENIALS_TOTAL};

    use super::*;

    #[test]
    fn lease_units_are_counted() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        ::metrics::with_local_recorder(&recorder, || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .unwrap();
            runtime.block_on(async {
                let (store, clock) = setup();
                let limiter = limiter(&store, "1000/1m", 8);
                let key = WindowKey::for_subject("m");
                for _ in 0..30 {
                    limiter.check(&key, 1).await.unwrap();
                }
                clock.advance(Duration::from_secs(2));
                // The 1 unit left expired: refunded on the next check, which
                // reserves again (a lease of 4: 3 held).
                limiter.check(&key, 1).await.unwrap();
                limiter.refund_leases().await;
            });
        });
        let mut seen = std::collections::BTreeMap::new();
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let (_, key) = key.into_parts();
            let labels: Vec<String> = key
                .labels()
                .filter(|l| l.key() != "quota")
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            if let DebugValue::Counter(n) = value {
                seen.insert(format!("{} {}", key.name(), labels.join(",")), n);
            }
        }
        let get = |k: &str| {
            *seen
                .get(k)
                .unwrap_or_else(|| panic!("{k} missing: {seen:?}"))
        };
        assert_eq!(get(&format!("{LEASE_UNITS_TOTAL} event=granted")), 31 + 4);
        assert_eq!(get(&format!("{LEASE_UNITS_TOTAL} event=spent")), 31);
        assert_eq!(get(&format!("{LEASE_UNITS_TOTAL} event=expired")), 1);
        assert_eq!(get(&format!("{LEASE_UNITS_TOTAL} event=refunded")), 3);
        assert_eq!(
            get(&format!("{DECISIONS_TOTAL} outcome=allowed,source=lease")),
            24
        );
    }

    #[test]
    fn shadow_denials_of_leased_admissions_are_counted() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        ::metrics::with_local_recorder(&recorder, || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .unwrap();
            runtime.block_on(async {
                let (store, _) = setup();
                let limiter = Limiter::builder(store, with_shadow("3/1m"))
                    .leases(classic(8))
                    .build();
                let key = WindowKey::for_subject("m");
                for _ in 0..10 {
                    assert!(limiter.check(&key, 1).await.unwrap().allowed());
                }
            });
        });
        let denials: u64 = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter_map(|(key, _, _, value)| {
                let (_, key) = key.into_parts();
                let trial = key
                    .labels()
                    .any(|l| l.key() == "quota" && l.value() == "trial");
                match value {
                    DebugValue::Counter(n) if key.name() == SHADOW_DENIALS_TOTAL && trial => {
                        Some(n)
                    }
                    _ => None,
                }
            })
            .sum();
        assert_eq!(denials, 7, "10 admitted, 3 fit the shadow quota");
    }
}

#[tokio::test]
async fn discarded_leases_are_not_spent_nor_refunded() {
    let (store, _) = setup();
    let limiter = limiter(&store, "1000/1m", 8);
    let key = WindowKey::for_subject("reset");
    for _ in 0..2 {
        limiter.check(&key, 1).await.unwrap();
    }
    assert_eq!(limiter.discard_leases().await, 1);
    assert_eq!(limiter.refund_leases().await, 0);
    // The next check reserves afresh instead of spending the dropped unit.
    assert_eq!(
        limiter.check(&key, 1).await.unwrap().source(),
        DecisionSource::Store
    );
}

#[tokio::test]
async fn a_sliding_log_lease_outlives_idle_expiry_until_w_after_its_deadline() {
    let (store, clock) = setup();
    let quota: Quota = "2/1m".parse().unwrap();
    let policy = Policy::from(quota.clone());
    let key = WindowKey::for_subject("idle");
    // A lease TTL of 10 s: its units are dated START + 10 s. (A sliding
    // log's lease may take its whole room: both units.)
    let lease = lease::Backend::reserve(
        &store,
        &mut Guard::bare(),
        ReserveRequest::new(&key, &policy, 2, 1, Duration::from_secs(10)),
    )
    .await
    .unwrap();
    assert_eq!(lease.granted(), 2);
    // Past W + the grace after the reservation, but before W after the deadline.
    clock.advance(Duration::from_secs(65));
    store.run_pending_tasks();
    let probe = Limiter::new(store.clone(), quota);
    let d = probe.check(&key, 1).await.unwrap();
    assert!(!d.allowed(), "the leased units still count");
    assert_eq!(d.remaining(), 0);
}
