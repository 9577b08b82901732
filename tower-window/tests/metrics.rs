//! Exact metric counts for each kind of decision, recorded into a
//! `DebuggingRecorder` installed as this thread's local recorder (tests run
//! on a current-thread runtime, so every poll sees it).
#![cfg(feature = "metrics")]
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tower_window::fallback::{FailClosed, FailOpen};
use tower_window::metrics as names;
use tower_window::store::{Backend, Guard, Op, OwnedCheckRequest, StoreBuilder};
use tower_window::{
    limit, BreakerConfig, CheckRequest, Decision, Limiter, ManualClock, MemoryStore, Policy, Quota,
    RetryConfig, Store, StoreError, StoreErrorKind, WindowKey,
};

const START: u64 = 1_700_000_000_000_000;

/// One snapshot, keyed by name and the full label set.
struct Snapshot(BTreeMap<(String, Vec<(String, String)>), DebugValue>);

impl Snapshot {
    fn take(snapshotter: &Snapshotter) -> Self {
        let mut map = BTreeMap::new();
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let (_, key) = key.into_parts();
            let mut labels: Vec<_> = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            labels.sort();
            map.insert((key.name().to_owned(), labels), value);
        }
        Self(map)
    }

    fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<&DebugValue> {
        let mut labels: Vec<_> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        labels.sort();
        self.0.get(&(name.to_owned(), labels))
    }

    /// A counter's value; panics if the series was never registered.
    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        match self.get(name, labels) {
            Some(DebugValue::Counter(n)) => *n,
            other => panic!("{name} {labels:?}: expected a counter, got {other:?}\n{self:?}"),
        }
    }

    fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        match self.get(name, labels) {
            Some(DebugValue::Gauge(v)) => v.into_inner(),
            other => panic!("{name} {labels:?}: expected a gauge, got {other:?}\n{self:?}"),
        }
    }

    fn histogram_len(&self, name: &str, labels: &[(&str, &str)]) -> usize {
        match self.get(name, labels) {
            Some(DebugValue::Histogram(v)) => v.len(),
            other => panic!("{name} {labels:?}: expected a histogram, got {other:?}\n{self:?}"),
        }
    }

    fn names(&self) -> Vec<&str> {
        let mut names: Vec<_> = self.0.keys().map(|(n, _)| n.as_str()).collect();
        names.dedup();
        names
    }
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for ((name, labels), value) in &self.0 {
            writeln!(f, "{name} {labels:?} = {value:?}")?;
        }
        Ok(())
    }
}

/// A store that answers from a script of results, then admits.
#[derive(Clone, Default)]
struct ScriptedStore {
    script: Arc<Mutex<VecDeque<Result<(), StoreErrorKind>>>>,
    inner: Arc<MemoryStore>,
}

impl ScriptedStore {
    fn new(clock: &ManualClock) -> Self {
        Self {
            script: Arc::default(),
            inner: Arc::new(MemoryStore::builder().clock(clock.clone()).build()),
        }
    }

    fn fail(&self, kind: StoreErrorKind, times: usize) {
        let mut script = self.script.lock().unwrap();
        script.extend(std::iter::repeat_n(Err(kind), times));
    }

    /// A store on this backend, behind a network (its calls are timed and
    /// bounded), whose breakers run on `clock`.
    fn store(&self, clock: &ManualClock) -> StoreBuilder {
        Store::builder(Backend::windows(self.clone()).clock(clock.clone()))
    }
}

impl limit::Backend for ScriptedStore {
    fn check<'a>(
        &'a self,
        guard: &mut Guard<'a>,
        request: CheckRequest<'a>,
    ) -> Op<'static, Decision> {
        // Each attempt (a retry too) takes the next scripted result.
        let (this, request) = (self.clone(), OwnedCheckRequest::from(request));
        guard.run(move || {
            let next = this.script.lock().unwrap().pop_front();
            let (inner, request) = (this.inner.clone(), request.clone());
            async move {
                match next {
                    Some(Err(kind)) => Err(StoreError::new(kind, "injected").not_applied()),
                    _ => {
                        limit::Backend::check(&*inner, &mut Guard::bare(), request.as_request())
                            .await
                    }
                }
            }
        })
    }
}

fn quota(text: &str) -> Quota {
    text.parse().unwrap()
}

fn recorder() -> (DebuggingRecorder, Snapshotter) {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    (recorder, snapshotter)
}

const Q: (&str, &str) = ("quota", "default");

#[tokio::test]
async fn store_and_local_cache_decisions() {
    let (recorder, snapshotter) = recorder();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let clock = ManualClock::new(START);
    let store = MemoryStore::builder().clock(clock.clone()).build();
    // The embedded store has no breaker by default: give it one, to see it
    // stay closed.
    let store = Store::builder(store)
        .breaker(BreakerConfig::default())
        .build();
    let limiter = Limiter::builder(store, quota("3/1m")).build();
    let alice = WindowKey::for_subject("alice");
    let mut allowed = 0;
    for _ in 0..6 {
        allowed += u32::from(limiter.check(&alice, 1).await.unwrap().allowed());
    }
    assert_eq!(allowed, 3);

    let s = Snapshot::take(&snapshotter);
    let decisions = names::DECISIONS_TOTAL;
    assert_eq!(
        s.counter(decisions, &[("outcome", "allowed"), ("source", "store"), Q]),
        3
    );
    assert_eq!(
        s.counter(decisions, &[("outcome", "denied"), ("source", "store"), Q]),
        1
    );
    assert_eq!(
        s.counter(
            decisions,
            &[("outcome", "denied"), ("source", "local_cache"), Q]
        ),
        2
    );
    assert_eq!(
        s.counter(
            decisions,
            &[("outcome", "allowed"), ("source", "local_cache"), Q]
        ),
        0
    );
    assert_eq!(s.counter(names::LOCAL_CACHE_HITS_TOTAL, &[Q]), 2);
    assert_eq!(s.counter(names::LOCAL_CACHE_MISSES_TOTAL, &[Q]), 4);
    assert_eq!(s.gauge(names::LOCAL_CACHE_ENTRIES, &[Q]), 1.0);
    // Remaining 2, 1, 0 of 3: only the last is below 20 %.
    assert_eq!(s.counter(names::NEAR_LIMIT_TOTAL, &[Q]), 1);
    // An in-process store is not timed: its four calls are in the
    // decisions above, not in the store-call histogram.
    assert_eq!(
        s.histogram_len(names::STORE_CALL_DURATION_SECONDS, &[("outcome", "ok"), Q]),
        0
    );
    assert_eq!(
        s.histogram_len(
            names::STORE_CALL_DURATION_SECONDS,
            &[("outcome", "error"), Q]
        ),
        0
    );
    for kind in [
        "unavailable",
        "timeout",
        "overloaded",
        "protocol",
        "invalid_request",
    ] {
        assert_eq!(
            s.counter(names::STORE_ERRORS_TOTAL, &[("kind", kind), Q]),
            0
        );
    }
    assert_eq!(s.gauge(names::BREAKER_STATE, &[Q]), 0.0);
    assert_eq!(
        s.counter(names::BREAKER_TRANSITIONS_TOTAL, &[("to", "open"), Q]),
        0
    );
    assert_eq!(s.counter(names::STORE_RETRIES_TOTAL, &[Q]), 0);
    // No fallback policy: no fallback series.
    assert!(!s.names().contains(&names::FALLBACK_DECISIONS_TOTAL));
    // Every label value is bounded: the subject is never one.
    for (_, labels) in s.0.keys() {
        assert!(labels.iter().all(|(k, v)| k != "tenant" && v != "alice"));
    }
}

#[tokio::test]
async fn fail_open_counts_fallback_admissions_and_opens_the_breaker() {
    let (recorder, snapshotter) = recorder();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let clock = ManualClock::new(START);
    let store = ScriptedStore::new(&clock);
    store.fail(StoreErrorKind::Unavailable, 2);
    let store = store
        .store(&clock)
        .retry(RetryConfig::none())
        .breaker(
            BreakerConfig::default()
                .consecutive_failures(2)
                .without_failure_ratio()
                .cooldown(Duration::from_secs(10)),
        )
        .build();
    let limiter = Limiter::builder(store, quota("100/1m"))
        .fallback(FailOpen::new())
        .build();
    let key = WindowKey::for_subject("bob");
    for _ in 0..5 {
        let decision = limiter.check(&key, 1).await.unwrap();
        assert!(decision.allowed() && decision.is_degraded());
    }

    let s = Snapshot::take(&snapshotter);
    assert_eq!(
        s.counter(
            names::DECISIONS_TOTAL,
            &[("outcome", "allowed"), ("source", "fallback"), Q]
        ),
        5
    );
    assert_eq!(
        s.counter(
            names::DECISIONS_TOTAL,
            &[("outcome", "allowed"), ("source", "store"), Q]
        ),
        0
    );
    let admissions = names::FALLBACK_ADMISSIONS_TOTAL;
    assert_eq!(s.counter(admissions, &[("reason", "unavailable"), Q]), 2);
    assert_eq!(s.counter(admissions, &[("reason", "circuit_open"), Q]), 3);
    assert_eq!(s.counter(admissions, &[("reason", "timeout"), Q]), 0);
    let fallback = names::FALLBACK_DECISIONS_TOTAL;
    assert_eq!(
        s.counter(
            fallback,
            &[("reason", "unavailable"), ("outcome", "allowed"), Q]
        ),
        2
    );
    assert_eq!(
        s.counter(
            fallback,
            &[("reason", "circuit_open"), ("outcome", "allowed"), Q]
        ),
        3
    );
    assert_eq!(
        s.counter(
            fallback,
            &[("reason", "circuit_open"), ("outcome", "denied"), Q]
        ),
        0
    );
    assert_eq!(
        s.counter(names::STORE_ERRORS_TOTAL, &[("kind", "unavailable"), Q]),
        2
    );
    assert_eq!(
        s.histogram_len(
            names::STORE_CALL_DURATION_SECONDS,
            &[("outcome", "error"), Q]
        ),
        2
    );
    assert_eq!(s.gauge(names::BREAKER_STATE, &[Q]), 2.0);
    assert_eq!(
        s.counter(names::BREAKER_TRANSITIONS_TOTAL, &[("to", "open"), Q]),
        1
    );
    // FailOpen reports remaining = limit - cost: never near the limit.
    assert_eq!(s.counter(names::NEAR_LIMIT_TOTAL, &[Q]), 0);

    // After the cooldown one probe succeeds and closes the breaker.
    clock.advance(Duration::from_secs(10));
    let decision = limiter.check(&key, 1).await.unwrap();
    assert!(decision.allowed() && !decision.is_degraded());
    let s = Snapshot::take(&snapshotter);
    assert_eq!(s.gauge(names::BREAKER_STATE, &[Q]), 0.0);
    // Snapshots reset counters: these are the counts since the last one.
    assert_eq!(
        s.counter(names::BREAKER_TRANSITIONS_TOTAL, &[("to", "half_open"), Q]),
        1
    );
    assert_eq!(
        s.counter(names::BREAKER_TRANSITIONS_TOTAL, &[("to", "closed"), Q]),
        1
    );
    assert_eq!(
        s.counter(
            names::DECISIONS_TOTAL,
            &[("outcome", "allowed"), ("source", "store"), Q]
        ),
        1
    );
}

#[tokio::test]
async fn fail_closed_denials_are_not_admissions() {
    let (recorder, snapshotter) = recorder();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let clock = ManualClock::new(START);
    let store = ScriptedStore::new(&clock);
    store.fail(StoreErrorKind::Timeout, 3);
    let limiter = Limiter::builder(
        store.store(&clock).without_breaker().build(),
        quota("100/1m"),
    )
    .fallback(FailClosed::default())
    .build();
    let key = WindowKey::for_subject("carol");
    for _ in 0..3 {
        assert!(!limiter.check(&key, 1).await.unwrap().allowed());
    }
    let s = Snapshot::take(&snapshotter);
    assert_eq!(
        s.counter(
            names::DECISIONS_TOTAL,
            &[("outcome", "denied"), ("source", "fallback"), Q]
        ),
        3
    );
    assert_eq!(
        s.counter(
            names::FALLBACK_DECISIONS_TOTAL,
            &[("reason", "timeout"), ("outcome", "denied"), Q]
        ),
        3
    );
    assert_eq!(
        s.counter(
            names::FALLBACK_ADMISSIONS_TOTAL,
            &[("reason", "timeout"), Q]
        ),
        0
    );
    assert_eq!(
        s.counter(names::STORE_ERRORS_TOTAL, &[("kind", "timeout"), Q]),
        3
    );
    // No breaker: no breaker series.
    assert!(!s.names().contains(&names::BREAKER_STATE));
}

#[tokio::test]
async fn store_errors_by_kind_and_retries() {
    let (recorder, snapshotter) = recorder();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let clock = ManualClock::new(START);
    let store = ScriptedStore::new(&clock);
    // One retryable failure (retried, then admitted), then two that are not
    // retried, returned as errors without a fallback.
    store.fail(StoreErrorKind::Unavailable, 1);
    let backend = store
        .store(&clock)
        .retry(RetryConfig::default().delays(Duration::ZERO, Duration::ZERO))
        .without_timeout()
        .without_breaker()
        .build();
    let limiter = Limiter::builder(backend, quota("100/1m")).build();
    let key = WindowKey::for_subject("dave");
    assert!(limiter.check(&key, 1).await.unwrap().allowed());
    store.fail(StoreErrorKind::Protocol, 1);
    store.fail(StoreErrorKind::Overloaded, 1);
    assert!(limiter.check(&key, 1).await.is_err());
    assert!(limiter.check(&key, 1).await.is_err());

    let s = Snapshot::take(&snapshotter);
    assert_eq!(s.counter(names::STORE_RETRIES_TOTAL, &[Q]), 1);
    // The retried call succeeded: it is not an error.
    assert_eq!(
        s.counter(names::STORE_ERRORS_TOTAL, &[("kind", "unavailable"), Q]),
        0
    );
    assert_eq!(
        s.counter(names::STORE_ERRORS_TOTAL, &[("kind", "protocol"), Q]),
        1
    );
    assert_eq!(
        s.counter(names::STORE_ERRORS_TOTAL, &[("kind", "overloaded"), Q]),
        1
    );
    assert_eq!(
        s.histogram_len(names::STORE_CALL_DURATION_SECONDS, &[("outcome", "ok"), Q]),
        1
    );
    assert_eq!(
        s.histogram_len(
            names::STORE_CALL_DURATION_SECONDS,
            &[("outcome", "error"), Q]
        ),
        2
    );
    // Errors are not decisions.
    assert_eq!(
        s.counter(
            names::DECISIONS_TOTAL,
            &[("outcome", "allowed"), ("source", "store"), Q]
        ),
        1
    );
    assert_eq!(
        s.counter(
            names::DECISIONS_TOTAL,
            &[("outcome", "denied"), ("source", "store"), Q]
        ),
        0
    );
}

#[tokio::test]
async fn near_limit_is_below_a_fifth_of_the_limit() {
    let (recorder, snapshotter) = recorder();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let limiter = Limiter::new(MemoryStore::new(), quota("10/1h"));
    let key = WindowKey::for_subject("erin");
    // Remaining 9..=0 after each admission; 5 × remaining < 10 for 1 and 0.
    for _ in 0..10 {
        assert!(limiter.check(&key, 1).await.unwrap().allowed());
    }
    assert!(!limiter.check(&key, 1).await.unwrap().allowed());
    let s = Snapshot::take(&snapshotter);
    assert_eq!(s.counter(names::NEAR_LIMIT_TOTAL, &[Q]), 2);
    assert_eq!(
        s.counter(
            names::DECISIONS_TOTAL,
            &[("outcome", "allowed"), ("source", "store"), Q]
        ),
        10
    );
    // A bare limiter has no local tier and no breaker.
    assert!(!s.names().contains(&names::LOCAL_CACHE_ENTRIES));
    assert!(!s.names().contains(&names::BREAKER_STATE));
}

#[tokio::test]
async fn tenant_label_is_opt_in_and_other_quotas_get_their_name() {
    let (recorder, snapshotter) = recorder();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let key = WindowKey::new("acme", "frank");
    let plain = Limiter::builder(MemoryStore::new(), quota("5/1m")).build();
    plain.check(&key, 1).await.unwrap();
    let other = Policy::from(quota("5/1m").named("uploads").unwrap());
    plain.check_policy(&key, &other, 1).await.unwrap();
    let tenants = Limiter::builder(MemoryStore::new(), quota("5/1m").named("api").unwrap())
        .metrics_tenant_label(true)
        .build();
    tenants.check(&key, 1).await.unwrap();
    tenants.check(&key, 1).await.unwrap();

    let s = Snapshot::take(&snapshotter);
    let allowed_store = [("outcome", "allowed"), ("source", "store")];
    let with = |extra: &[(&'static str, &'static str)]| {
        let mut labels = allowed_store.to_vec();
        labels.extend_from_slice(extra);
        labels
    };
    assert_eq!(s.counter(names::DECISIONS_TOTAL, &with(&[Q])), 1);
    assert_eq!(
        s.counter(names::DECISIONS_TOTAL, &with(&[("quota", "uploads")])),
        1
    );
    assert_eq!(
        s.counter(
            names::DECISIONS_TOTAL,
            &with(&[("quota", "api"), ("tenant", "acme")])
        ),
        2
    );
    // The embedded store decides in process and is not timed, under any
    // quota's name.
    assert!(s
        .get(
            names::STORE_CALL_DURATION_SECONDS,
            &[("outcome", "ok"), ("quota", "uploads")]
        )
        .is_none());
    // Tenant labels only on decision series, and never the subject.
    for (name, labels) in s.0.keys() {
        assert!(labels.iter().all(|(_, v)| v != "frank"));
        if labels.iter().any(|(k, _)| k == "tenant") {
            assert!(
                [
                    names::DECISIONS_TOTAL,
                    names::NEAR_LIMIT_TOTAL,
                    names::FALLBACK_DECISIONS_TOTAL,
                    names::FALLBACK_ADMISSIONS_TOTAL
                ]
                .contains(&name.as_str()),
                "{name} has a tenant label"
            );
        }
    }
}

#[tokio::test]
async fn other_quotas_keep_counting_and_tenants_stay_apart() {
    // A policy passed per check (not the limiter's own quota) has its
    // counters cached by quota name after the first decision: the later
    // decisions must land on the same series, and a limiter with tenant
    // labels must still count each tenant on its own.
    let (recorder, snapshotter) = recorder();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let uploads = Policy::from(quota("5/1m").named("uploads").unwrap());
    let key = WindowKey::new("acme", "frank");
    let plain = Limiter::builder(MemoryStore::new(), quota("5/1m")).build();
    for _ in 0..7 {
        plain.check_policy(&key, &uploads, 1).await.unwrap();
    }
    let tenants = Limiter::builder(MemoryStore::new(), quota("5/1m").named("api").unwrap())
        .metrics_tenant_label(true)
        .build();
    for tenant in ["acme", "acme", "globex"] {
        let key = WindowKey::new(tenant, "frank");
        tenants.check_policy(&key, &uploads, 1).await.unwrap();
    }

    let s = Snapshot::take(&snapshotter);
    let series = |outcome: &'static str, extra: &[(&'static str, &'static str)]| {
        let mut labels = vec![("outcome", outcome), ("source", "store")];
        labels.extend_from_slice(extra);
        labels
    };
    let uploads_label = ("quota", "uploads");
    assert_eq!(
        s.counter(names::DECISIONS_TOTAL, &series("allowed", &[uploads_label])),
        5
    );
    // The first denial from the store; the second from the local tier of
    // recent denials, without a store call.
    assert_eq!(
        s.counter(names::DECISIONS_TOTAL, &series("denied", &[uploads_label])),
        1
    );
    assert_eq!(
        s.counter(
            names::DECISIONS_TOTAL,
            &[
                ("outcome", "denied"),
                ("source", "local_cache"),
                uploads_label
            ]
        ),
        1
    );
    // remaining * 5 < limit: the fifth admission only.
    assert_eq!(s.counter(names::NEAR_LIMIT_TOTAL, &[uploads_label]), 1);
    for (tenant, count) in [("acme", 2), ("globex", 1)] {
        assert_eq!(
            s.counter(
                names::DECISIONS_TOTAL,
                &series("allowed", &[uploads_label, ("tenant", tenant)])
            ),
            count,
            "{tenant}"
        );
    }
}

#[test]
fn describe_gives_every_name_a_description() {
    let (recorder, snapshotter) = recorder();
    metrics::with_local_recorder(&recorder, || {
        names::describe();
        for &name in names::ALL {
            metrics::counter!(name).absolute(0);
        }
    });
    let described: Vec<_> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(_, _, description, _)| description.is_some())
        .map(|(key, _, _, _)| key.key().name().to_owned())
        .collect();
    // Gauges and the histogram are described under their own kinds; the
    // counters registered above match the counter descriptions.
    let counters = names::ALL.iter().filter(|n| n.ends_with("_total")).count();
    assert_eq!(described.len(), counters);
    assert!(names::ALL.iter().all(|n| n.starts_with("tower_window_")));
}
