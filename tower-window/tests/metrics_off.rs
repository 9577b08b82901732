//! Without the `metrics` feature nothing is recorded: a recorder installed
//! by the application sees no series, however the limiter decides.
//!
//! Built only without the feature (`cargo test -p tower-window
//! --no-default-features`, which `.ci/run` runs); with the feature,
//! `tests/metrics.rs` checks what is recorded.
#![cfg(not(feature = "metrics"))]
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use metrics_util::debugging::DebuggingRecorder;
use tower_window::fallback::FailOpen;
use tower_window::store::{Backend, Guard, Op};
use tower_window::{
    limit, CheckRequest, Decision, Limiter, ManualClock, MemoryStore, Quota, RetryConfig, Store,
    StoreError, StoreErrorKind, WindowKey,
};

/// A store (behind a network) that always fails, so the fallback, breaker
/// and local tier run.
struct Down;

impl limit::Backend for Down {
    fn check<'a>(&'a self, guard: &mut Guard<'a>, _: CheckRequest<'a>) -> Op<'static, Decision> {
        guard.run(|| async { Err(StoreError::new(StoreErrorKind::Unavailable, "down")) })
    }
}

#[tokio::test(start_paused = true)]
async fn metrics_off_records_nothing() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let clock = ManualClock::new(1_700_000_000_000_000);
    let quota: Quota = "2/1m".parse().unwrap();

    let memory = Limiter::builder(
        MemoryStore::builder().clock(clock.clone()).build(),
        quota.clone(),
    )
    .build();
    let key = WindowKey::for_subject("quiet");
    let mut allowed = 0;
    for _ in 0..5 {
        allowed += u32::from(memory.check(&key, 1).await.unwrap().allowed());
    }
    assert_eq!(allowed, 2, "the limiter works; it just records nothing");

    let down = Store::builder(Backend::windows(Down).clock(clock.clone()))
        .retry(RetryConfig::none())
        .timeout(Duration::from_millis(10))
        .build();
    let degraded = Limiter::builder(down, quota).fallback(FailOpen).build();
    for _ in 0..10 {
        let d = degraded.check(&key, 1).await.unwrap();
        assert!(d.is_degraded());
    }
    assert!(degraded.stats().fallback_total() >= 10);

    let series = snapshotter.snapshot().into_vec();
    assert!(
        series.is_empty(),
        "recorded without the metrics feature: {series:?}"
    );
}
