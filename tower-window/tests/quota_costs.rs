//! A cost per quota (`Limiter::check_policy_per_quota`) with the limiter's
//! tiers, on the embedded store with a `ManualClock`: the local tier
//! repeats a denial only for checks that cost at least as much in every
//! quota, leases are left alone (the store decides, counting what they
//! hold), and a store failure reaches the fallback with every quota's cost.
#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};

use tower_window::fallback::{FallbackRequest, LocalWindow};
use tower_window::store::{Backend, Guard, Op};
use tower_window::{
    limit, CheckRequest, Cost, Decision, DecisionSource, LeaseConfig, Limiter, LimiterBuilder,
    ManualClock, MemoryStore, Policy, Quota, QuotaCosts, Store, StoreError, StoreErrorKind,
    WindowKey,
};

const START: u64 = 1_700_000_000_000_000;

fn cost(units: u32) -> Cost {
    Cost::new(units).unwrap()
}

/// requests: 10 a minute; bytes: 100 a minute.
fn policy() -> Policy {
    Policy::new(
        "api",
        vec![
            "10/1m".parse::<Quota>().unwrap().named("requests").unwrap(),
            "100/1m".parse::<Quota>().unwrap().named("bytes").unwrap(),
        ],
    )
    .unwrap()
}

/// A limiter of `policy` on an embedded store, both on one manual clock.
fn on_memory(policy: &Policy) -> LimiterBuilder {
    let clock = ManualClock::new(START);
    let store = MemoryStore::builder().clock(clock.clone()).build();
    Limiter::builder(store, policy.clone())
}

fn remaining(d: &Decision) -> Vec<u32> {
    d.quotas().iter().map(|q| q.remaining()).collect()
}

#[tokio::test]
async fn the_local_tier_repeats_a_denial_only_for_costs_at_least_as_high() {
    let policy = policy();
    let limiter = on_memory(&policy).local_capacity(100).build();
    let key = WindowKey::for_subject("alice");
    let d = limiter
        .check_policy_per_quota(&key, &policy, &QuotaCosts::from([cost(1), cost(90)]))
        .await
        .unwrap();
    assert_eq!(remaining(&d), [9, 10]);
    // 20 bytes do not fit the 10 left: the store denies, the tier remembers
    // a denial of at most 20 units.
    let d = limiter
        .check_policy_per_quota(&key, &policy, &QuotaCosts::from([cost(1), cost(20)]))
        .await
        .unwrap();
    assert!(!d.allowed());
    assert_eq!(d.source(), DecisionSource::Store);
    // 5 bytes (and one request) may fit: the store is asked, and admits.
    let d = limiter
        .check_policy_per_quota(&key, &policy, &QuotaCosts::from([cost(1), cost(5)]))
        .await
        .unwrap();
    assert!(d.allowed());
    assert_eq!(d.source(), DecisionSource::Store);
    assert_eq!(remaining(&d), [8, 5]);
    // The remembered denial of (1, 20) still holds (a cheaper admission
    // does not drop it): answered locally, as is 20 in both quotas.
    let d = limiter
        .check_policy_per_quota(&key, &policy, &QuotaCosts::from([cost(1), cost(20)]))
        .await
        .unwrap();
    assert_eq!(
        (d.allowed(), d.source()),
        (false, DecisionSource::LocalCache)
    );
    let d = limiter.check_policy(&key, &policy, 20).await.unwrap();
    assert_eq!(
        (d.allowed(), d.source()),
        (false, DecisionSource::LocalCache)
    );
    // (1, 20) and (2, 25) are no cheaper in any quota: answered locally;
    // (1, 19) may fit where (1, 20) did not: the store is asked.
    let stats = limiter.stats();
    for costs in [[1, 20], [2, 25], [1, 19]] {
        let costs = QuotaCosts::from(costs.map(cost));
        let d = limiter
            .check_policy_per_quota(&key, &policy, &costs)
            .await
            .unwrap();
        assert!(!d.allowed(), "{costs:?}: {d:?}");
    }
    let after = limiter.stats();
    assert_eq!(
        after.local_cache - stats.local_cache,
        2,
        "(1, 20) and (2, 25)"
    );
    assert_eq!(after.store - stats.store, 1, "(1, 19)");
    // Nothing the denials saw was counted.
    let usage = limiter.peek_policy(&key, &policy, 1).await.unwrap();
    assert_eq!(remaining(&usage), [8, 5]);
}

#[tokio::test]
async fn a_check_of_different_costs_leaves_leases_alone_and_stays_exact() {
    let policy = policy();
    let limiter = on_memory(&policy)
        .leases(LeaseConfig::new(8).hot_after(1).refill_ahead(false))
        .build();
    let key = WindowKey::for_subject("hot");
    // Uniform checks lease and spend locally.
    for _ in 0..4 {
        assert!(limiter
            .check_policy(&key, &policy, 1)
            .await
            .unwrap()
            .allowed());
    }
    let leased = limiter.stats().lease;
    assert!(leased >= 1, "{:?}", limiter.stats());
    // Checks of different costs go to the store, which counts the units
    // the lease holds: the bound holds whatever the lease keeps.
    let mut admitted = 0;
    for _ in 0..20 {
        let d = limiter
            .check_policy_per_quota(&key, &policy, &QuotaCosts::from([cost(1), cost(9)]))
            .await
            .unwrap();
        assert_ne!(d.source(), DecisionSource::Lease);
        admitted += u32::from(d.allowed());
    }
    assert_eq!(limiter.stats().lease, leased, "no lease spent");
    // requests: 4 uniform + the lease's held units + admitted <= 10;
    // bytes: 4 + held + 9 x admitted <= 100.
    assert!(4 + 9 * admitted <= 100 && 4 + admitted <= 10, "{admitted}");
    assert!(admitted >= 1, "the store had room: {admitted}");
    // Once the lease is refunded, everything the store counted is exact.
    limiter.refund_leases().await;
    let usage = limiter.peek_policy(&key, &policy, 1).await.unwrap();
    assert_eq!(
        remaining(&usage),
        [10 - 4 - admitted, 100 - 4 - 9 * admitted]
    );
}

/// What a fallback was asked: the request's cost, and each quota's.
type Asked = (u32, Vec<u32>);

/// A store that cannot be reached.
struct Down;

impl limit::Backend for Down {
    fn check<'a>(&'a self, _: &mut Guard<'a>, _: CheckRequest<'a>) -> Op<'static, Decision> {
        Op::ready(Err(StoreError::new(
            StoreErrorKind::Unavailable,
            "connection refused",
        )))
    }
}

fn down(clock: &ManualClock) -> Store {
    Store::from(Backend::windows(Down).in_process(true).clock(clock.clone()))
}

#[tokio::test]
async fn the_fallback_sees_every_quotas_cost() {
    let clock = ManualClock::new(START);
    let seen: Arc<Mutex<Vec<Asked>>> = Arc::default();
    let record = Arc::clone(&seen);
    // A fallback that records what it was asked, and admits.
    let policy = policy();
    let limiter = Limiter::builder(down(&clock), policy.clone())
        .fallback(move |r: &FallbackRequest<'_>| {
            let each = (0..r.policy.len()).map(|i| r.cost_of(i).get()).collect();
            record.lock().unwrap().push((r.cost.get(), each));
            let quota = r.policy.first().clone();
            let window = quota.window();
            Decision::allow(quota, 0, window)
        })
        .build();
    let key = WindowKey::for_subject("alice");
    let d = limiter
        .check_policy_per_quota(&key, &policy, &QuotaCosts::from([cost(2), cost(30)]))
        .await
        .unwrap();
    assert!(matches!(d.source(), DecisionSource::Fallback(_)));
    assert_eq!(*seen.lock().unwrap(), [(30, vec![2, 30])]);
    // LocalWindow decides each quota at its own cost (half of each limit:
    // 5 requests, 50 bytes): 30 bytes fit once.
    let local = Limiter::builder(down(&clock), policy.clone())
        .fallback(LocalWindow::new(0.5).unwrap())
        .build();
    let mut admitted = Vec::new();
    for _ in 0..3 {
        let d = local
            .check_policy_per_quota(&key, &policy, &QuotaCosts::from([cost(1), cost(30)]))
            .await
            .unwrap();
        admitted.push(d.allowed());
    }
    assert_eq!(admitted, [true, false, false]);
}
