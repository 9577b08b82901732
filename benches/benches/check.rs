//! Nanoseconds per `Limiter::check` on the embedded `MemoryStore`, one quota
//! (issue 10: median ≤ 150 ns), on one thread.
//!
//! ```text
//! cargo bench -p tower-window-benches --bench check
//! ```
//!
//! Cases: the default algorithm (sliding log), sliding counter, fixed window
//! and GCRA, each admitting every check of one present key (`hot`), and
//! each rotating over 10 000 present keys (`rotating`: issue 24's case,
//! where a check's cost is cache misses). The future is
//! polled once with a no-op waker: the memory store decides at once, as the
//! layer's first poll does. No timing is asserted.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use criterion::{criterion_group, criterion_main, Criterion};
use tower_window::{Limiter, MemoryStore, Quota, WindowKey};

fn now<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("an in-process decision was pending"),
    }
}

fn limiter(dsl: &str) -> Limiter {
    Limiter::new(MemoryStore::new(), dsl.parse::<Quota>().unwrap())
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("limiter_check_memory");
    let key = WindowKey::for_subject("alice");
    for (name, dsl) in [
        ("hot/sliding_log", "1000000000/1s"),
        (
            "hot/sliding_counter",
            "1000000000/1s sliding-counter(100ms)",
        ),
        ("hot/fixed_window", "1000000000/1s fixed-window"),
        ("hot/gcra", "1000000000/1s gcra"),
    ] {
        let limiter = limiter(dsl);
        assert!(now(limiter.check(&key, 1)).unwrap().allowed());
        group.bench_function(name, |b| {
            b.iter(|| black_box(now(limiter.check(black_box(&key), 1)).unwrap()));
        });
    }
    let keys: Vec<WindowKey> = (0..10_000)
        .map(|i| WindowKey::for_subject(format!("u{i}")))
        .collect();
    for (name, dsl) in [
        ("rotating_10000/sliding_log", "1000000000/1s"),
        (
            "rotating_10000/sliding_counter",
            "1000000000/1s sliding-counter(100ms)",
        ),
        ("rotating_10000/fixed_window", "1000000000/1s fixed-window"),
        ("rotating_10000/gcra", "1000000000/1s gcra"),
    ] {
        let limiter = limiter(dsl);
        for key in &keys {
            assert!(now(limiter.check(key, 1)).unwrap().allowed());
        }
        let mut i = 0;
        group.bench_function(name, |b| {
            b.iter(|| {
                i = (i + 1) % keys.len();
                black_box(now(limiter.check(black_box(&keys[i]), 1)).unwrap())
            });
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
