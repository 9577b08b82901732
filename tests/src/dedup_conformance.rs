//! The dedup conformance suite: one set of scenarios every
//! dedup backend ([`dedup::Backend`]) must pass with the same answers
//! (memory, single Redis, Redis Cluster), on a [`ManualClock`].
//!
//! Plug a store in with a [`StoreFactory`] whose store is also a
//! [`dedup::Backend`], then:
//!
//! ```text
//! tower_window_tests::dedup_conformance_tests!(MyFactory::new());
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tower_window::dedup::{self, DedupError, DedupWindow};
use tower_window::store;
use tower_window::{ManualClock, Store, WindowKey};

use crate::conformance::{StoreFactory, START};
use crate::shared::Shared;

/// Expands to one `#[tokio::test]` per dedup scenario.
#[macro_export]
macro_rules! dedup_conformance_tests {
    ($factory:expr) => {
        $crate::dedup_conformance_tests!(@each $factory;
            first_then_repeat,
            keys_and_ids_are_independent,
            window_expiry_on_the_store_clock,
            concurrent_callers_have_one_first,
            hostile_and_long_ids_are_distinct,
            invalid_ids_are_typed_errors,
        );
    };
    (@each $factory:expr; $($scenario:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() {
                let factory = $factory;
                $crate::dedup_conformance::$scenario(&factory).await;
            }
        )*
    };
}

/// A key unique to this run and scenario (scenarios may share a server).
fn key(scenario: &str) -> WindowKey {
    static RUN: AtomicU64 = AtomicU64::new(0);
    let run = RUN.fetch_add(1, Ordering::Relaxed);
    let nonce = crate::redis_server::random();
    WindowKey::new("dedup-tenant", format!("{scenario}:{nonce:x}:{run}"))
}

async fn window<F>(factory: &F, clock: ManualClock, window: Duration) -> DedupWindow
where
    F: StoreFactory,
    F::Store: dedup::Backend,
{
    let backend = Arc::new(factory.make(clock).await);
    let store =
        Store::bare(store::Backend::windows(Shared::of(&backend)).with_dedup(Shared::of(&backend)));
    DedupWindow::builder(store)
        .window(window)
        .build()
        .expect("valid window")
}

async fn seen(dedup: &DedupWindow, key: &WindowKey, id: &[u8]) -> bool {
    dedup.first_seen(key, id).await.expect("store answers")
}

/// The first ask is new, every repeat inside the window is not.
pub async fn first_then_repeat<F: StoreFactory>(factory: &F)
where
    F::Store: dedup::Backend,
{
    let dedup = window(factory, ManualClock::new(START), Duration::from_secs(120)).await;
    let k = key("first_then_repeat");
    assert!(seen(&dedup, &k, b"m-1").await);
    for _ in 0..3 {
        assert!(!seen(&dedup, &k, b"m-1").await);
    }
}

/// Ids are per (tenant, subject): the same id elsewhere is new.
pub async fn keys_and_ids_are_independent<F: StoreFactory>(factory: &F)
where
    F::Store: dedup::Backend,
{
    let dedup = window(factory, ManualClock::new(START), Duration::from_secs(120)).await;
    let k = key("independent");
    let other_subject = WindowKey::new(k.tenant().to_vec(), [k.subject(), b"x"].concat());
    let other_tenant = WindowKey::new(b"other-tenant".to_vec(), k.subject().to_vec());
    assert!(seen(&dedup, &k, b"a").await);
    assert!(seen(&dedup, &k, b"b").await);
    assert!(seen(&dedup, &other_subject, b"a").await);
    assert!(seen(&dedup, &other_tenant, b"a").await);
    assert!(!seen(&dedup, &k, b"a").await);
    assert!(!seen(&dedup, &other_subject, b"a").await);
    assert!(!seen(&dedup, &other_tenant, b"a").await);
}

/// An id is remembered for exactly the window on the store's clock, then
/// new again (and remembered again).
pub async fn window_expiry_on_the_store_clock<F: StoreFactory>(factory: &F)
where
    F::Store: dedup::Backend,
{
    let clock = ManualClock::new(START);
    let dedup = window(factory, clock.clone(), Duration::from_secs(10)).await;
    let k = key("expiry");
    assert!(seen(&dedup, &k, b"m").await);
    clock.advance(Duration::from_micros(9_999_999));
    assert!(!seen(&dedup, &k, b"m").await, "still inside the window");
    clock.advance(Duration::from_micros(1));
    assert!(seen(&dedup, &k, b"m").await, "the window has passed");
    assert!(!seen(&dedup, &k, b"m").await, "and is remembered again");
    clock.advance(Duration::from_secs(10));
    assert!(seen(&dedup, &k, b"m").await);
}

/// Of many concurrent callers with one id, exactly one is first.
pub async fn concurrent_callers_have_one_first<F: StoreFactory>(factory: &F)
where
    F::Store: dedup::Backend,
{
    let dedup = window(factory, ManualClock::new(START), Duration::from_secs(120)).await;
    let k = key("concurrent");
    for round in 0..5u32 {
        let id = format!("id-{round}");
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let dedup = dedup.clone();
                let k = k.clone();
                let id = id.clone();
                tokio::spawn(async move { seen(&dedup, &k, id.as_bytes()).await })
            })
            .collect();
        let mut firsts = 0;
        for task in tasks {
            if task.await.expect("task") {
                firsts += 1;
            }
        }
        assert_eq!(firsts, 1, "round {round}: exactly one first");
    }
}

/// Ids that differ only in escaped bytes, or only at the end of a long
/// (hashed) id, are distinct.
pub async fn hostile_and_long_ids_are_distinct<F: StoreFactory>(factory: &F)
where
    F::Store: dedup::Backend,
{
    let dedup = window(factory, ManualClock::new(START), Duration::from_secs(120)).await;
    let k = key("hostile");
    let mut long_a = vec![b'z'; DedupWindow::DEFAULT_MAX_ID_LEN];
    let mut long_b = long_a.clone();
    long_a[DedupWindow::DEFAULT_MAX_ID_LEN - 1] = b'a';
    long_b[DedupWindow::DEFAULT_MAX_ID_LEN - 1] = b'b';
    let ids: [&[u8]; 7] = [
        b"a:b",
        b"a%3Ab",
        b"{x}",
        b"#dedup",
        b"\xff\x00",
        &long_a,
        &long_b,
    ];
    for id in ids {
        assert!(seen(&dedup, &k, id).await, "{id:?} is new");
    }
    for id in ids {
        assert!(!seen(&dedup, &k, id).await, "{id:?} is a repeat");
    }
}

/// Empty and over-long ids are typed errors, never a store call.
pub async fn invalid_ids_are_typed_errors<F: StoreFactory>(factory: &F)
where
    F::Store: dedup::Backend,
{
    let dedup = window(factory, ManualClock::new(START), Duration::from_secs(120)).await;
    let k = key("invalid");
    assert!(matches!(
        dedup.first_seen(&k, b"").await,
        Err(DedupError::EmptyId)
    ));
    let long = vec![b'x'; DedupWindow::DEFAULT_MAX_ID_LEN + 1];
    assert!(matches!(
        dedup.first_seen(&k, &long).await,
        Err(DedupError::IdTooLong { len, max }) if len == long.len() && max == DedupWindow::DEFAULT_MAX_ID_LEN
    ));
}
