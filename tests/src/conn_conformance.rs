//! The connection-lease conformance suite: one set of scenarios every
//! [`ConnectionStore`] must pass with the same answers (memory, single
//! Redis, Redis Cluster), driven by a [`ManualClock`] through a
//! [`ConnectionLimiter`] and directly.
//!
//! ```text
//! tower_window_tests::conn_conformance_tests!(MyFactory::new());
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tower_window::conn::{
    Acquire, CapScope, ConnectionLease, ConnectionLimiter, ConnectionStore, LeaseRef,
};
use tower_window::{Limiter, ManualClock, Quota, Store, WindowKey};

use crate::conformance::{StoreFactory, START};

/// Expands to one `#[tokio::test]` per connection-lease scenario.
#[macro_export]
macro_rules! conn_conformance_tests {
    ($factory:expr) => {
        $crate::conn_conformance_tests!(@each $factory;
            cap_admits_below_and_refuses_at,
            expired_leases_free_their_place,
            renewal_extends_and_reports_gone,
            heartbeat_reports_lost_and_never_reacquires,
            fence_only_grows,
            tenant_cap_counts_every_subject,
            keys_are_independent,
            concurrent_grants_never_exceed_the_cap,
        );
    };
    (@each $factory:expr; $($scenario:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() {
                let factory = $factory;
                $crate::conn_conformance::$scenario(&factory).await;
            }
        )*
    };
}

const TTL: Duration = Duration::from_secs(15);

fn key(scenario: &str) -> WindowKey {
    static RUN: AtomicU64 = AtomicU64::new(0);
    let run = RUN.fetch_add(1, Ordering::Relaxed);
    let nonce = crate::redis_server::random();
    WindowKey::new(
        format!("conn-tenant-{nonce:x}-{run}"),
        format!("{scenario}:{run}"),
    )
}

struct Setup<S> {
    store: Arc<S>,
    clock: ManualClock,
}

async fn setup<F>(factory: &F) -> Setup<F::Store>
where
    F: StoreFactory,
    F::Store: ConnectionStore,
{
    let clock = ManualClock::new(START);
    let store = Arc::new(factory.make(clock.clone()).await);
    Setup { store, clock }
}

impl<S: Store + ConnectionStore> Setup<S> {
    fn limiter(&self, per_subject: u32, per_tenant: u32) -> ConnectionLimiter {
        let quota: Quota = "1/1s".parse().expect("valid quota");
        let limiter = Limiter::new(Arc::clone(&self.store) as Arc<dyn Store>, quota);
        ConnectionLimiter::builder(limiter, Arc::clone(&self.store))
            .max_per_subject(per_subject)
            .max_per_tenant(per_tenant)
            .ttl(TTL)
            .build()
            .expect("valid ttl")
    }
}

async fn granted(limiter: &ConnectionLimiter, key: &WindowKey) -> ConnectionLease {
    match limiter.acquire(key).await.expect("store answers") {
        Acquire::Granted(lease) => {
            assert!(!lease.is_degraded());
            lease
        }
        Acquire::Denied(denied) => panic!("denied: {denied:?}"),
    }
}

async fn connections(limiter: &ConnectionLimiter, key: &WindowKey) -> u32 {
    let presence = limiter.presence(key).await.expect("store answers");
    assert_eq!(presence.online, presence.connections > 0);
    presence.connections
}

/// A cap of 3 admits 3 (with growing fences), refuses the 4th with the
/// count and the wait until the oldest lease expires, and admits again
/// after a release.
pub async fn cap_admits_below_and_refuses_at<F: StoreFactory>(factory: &F)
where
    F::Store: ConnectionStore,
{
    let setup = setup(factory).await;
    let limiter = setup.limiter(3, 0);
    let k = key("cap");
    let mut leases = Vec::new();
    for _ in 0..3 {
        leases.push(granted(&limiter, &k).await);
        setup.clock.advance(Duration::from_secs(1));
    }
    assert!(leases.windows(2).all(|w| w[0].fence() < w[1].fence()));
    assert_eq!(connections(&limiter, &k).await, 3);
    match limiter.acquire(&k).await.expect("store answers") {
        Acquire::Denied(denied) => {
            assert_eq!(denied.scope, CapScope::Subject);
            assert_eq!((denied.cap, denied.count), (3, 3));
            // The oldest was granted 3 s ago with a 15 s TTL.
            assert_eq!(denied.retry_after, Duration::from_secs(12));
            assert_eq!(denied.fallback, None);
        }
        Acquire::Granted(_) => panic!("the 4th connection was admitted"),
    }
    assert_eq!(connections(&limiter, &k).await, 3, "a refusal adds nothing");
    leases
        .pop()
        .expect("a lease")
        .release()
        .await
        .expect("released");
    assert_eq!(connections(&limiter, &k).await, 2);
    leases.push(granted(&limiter, &k).await);
    assert_eq!(connections(&limiter, &k).await, 3);
    for lease in leases {
        lease.release().await.expect("released");
    }
    assert_eq!(connections(&limiter, &k).await, 0);
}

/// A lease nobody renews stops counting at its TTL on the store's clock,
/// exactly: still counted 1 µs before, gone at it.
pub async fn expired_leases_free_their_place<F: StoreFactory>(factory: &F)
where
    F::Store: ConnectionStore,
{
    let setup = setup(factory).await;
    let limiter = setup.limiter(1, 0);
    let k = key("expiry");
    let first = granted(&limiter, &k).await;
    setup.clock.advance(TTL - Duration::from_micros(1));
    assert_eq!(connections(&limiter, &k).await, 1);
    assert!(matches!(
        limiter.acquire(&k).await.expect("answer"),
        Acquire::Denied(_)
    ));
    setup.clock.advance(Duration::from_micros(1));
    assert_eq!(connections(&limiter, &k).await, 0);
    let second = granted(&limiter, &k).await;
    assert!(second.fence() > first.fence());
    assert_eq!(connections(&limiter, &k).await, 1);
    std::mem::forget(first); // expired: nothing to release
    second.release().await.expect("released");
}

/// A renewal extends live leases to now + TTL and answers per lease; a
/// released or expired lease answers false and is not revived.
pub async fn renewal_extends_and_reports_gone<F: StoreFactory>(factory: &F)
where
    F::Store: ConnectionStore,
{
    let setup = setup(factory).await;
    let limiter = setup.limiter(0, 0);
    let store = &*setup.store;
    let k = key("renew");
    let a = granted(&limiter, &k).await;
    let b = granted(&limiter, &k).await;
    setup.clock.advance(TTL / 2);
    let both = [
        LeaseRef::new(&k, a.id(), false),
        LeaseRef::new(&k, b.id(), false),
    ];
    assert_eq!(store.renew(&both, TTL).await.expect("renew"), [true, true]);
    // Past the grant's expiry, inside the renewal's.
    setup.clock.advance(TTL * 3 / 4);
    assert_eq!(connections(&limiter, &k).await, 2);
    let b_id = b.id().to_vec();
    b.release().await.expect("released");
    let both = [
        LeaseRef::new(&k, a.id(), false),
        LeaseRef::new(&k, &b_id, false),
    ];
    assert_eq!(store.renew(&both, TTL).await.expect("renew"), [true, false]);
    assert_eq!(connections(&limiter, &k).await, 1);
    setup.clock.advance(TTL);
    let only_a = [LeaseRef::new(&k, a.id(), false)];
    assert_eq!(store.renew(&only_a, TTL).await.expect("renew"), [false]);
    assert_eq!(store.renew(&only_a, TTL).await.expect("renew"), [false]);
    assert_eq!(connections(&limiter, &k).await, 0, "never revived");
    std::mem::forget(a);
}

/// The node's heartbeat renews what is live and reports what is gone to
/// the lease's holder, once; the lost lease is not re-acquired.
pub async fn heartbeat_reports_lost_and_never_reacquires<F: StoreFactory>(factory: &F)
where
    F::Store: ConnectionStore,
{
    let setup = setup(factory).await;
    let limiter = setup.limiter(2, 0);
    let k = key("heartbeat");
    let kept = granted(&limiter, &k).await;
    setup.clock.advance(TTL / 3);
    let report = limiter.heartbeat().await;
    assert_eq!((report.renewed, report.lost, report.failed), (1, 0, 0));
    assert_eq!(report.calls, 1);
    // Another holder's view: the same store, another node.
    let other = setup.limiter(2, 0);
    let foreign = granted(&other, &k).await;
    let mut signal = foreign.lost();
    // Only `limiter` beats; `other` is a node that stopped.
    setup.clock.advance(TTL * 2 / 3);
    assert_eq!(limiter.heartbeat().await.renewed, 1);
    setup.clock.advance(TTL * 2 / 3);
    assert_eq!(limiter.heartbeat().await.renewed, 1);
    assert_eq!(
        connections(&limiter, &k).await,
        1,
        "the stopped node's lease expired"
    );
    let report = other.heartbeat().await;
    assert_eq!((report.renewed, report.lost), (0, 1));
    assert!(foreign.is_lost());
    signal.wait().await; // resolves: reported
    assert_eq!(other.live_leases(), 0);
    assert_eq!(other.heartbeat().await, Default::default(), "reported once");
    assert_eq!(connections(&limiter, &k).await, 1, "not re-acquired");
    assert!(!kept.is_lost());
    drop(foreign);
    kept.release().await.expect("released");
    assert_eq!(connections(&limiter, &k).await, 0);
}

/// Fencing tokens grow across releases, expiry of every lease and the
/// expiry of the subject's keys.
pub async fn fence_only_grows<F: StoreFactory>(factory: &F)
where
    F::Store: ConnectionStore,
{
    let setup = setup(factory).await;
    let limiter = setup.limiter(0, 0);
    let k = key("fence");
    let mut last = 0;
    for step in 0..4 {
        let lease = granted(&limiter, &k).await;
        assert!(lease.fence() > last, "step {step}");
        last = lease.fence();
        if step % 2 == 0 {
            lease.release().await.expect("released");
        } else {
            std::mem::forget(lease);
            setup.clock.advance(TTL * 2);
        }
    }
}

/// A tenant cap counts the leases of every subject of the tenant.
pub async fn tenant_cap_counts_every_subject<F: StoreFactory>(factory: &F)
where
    F::Store: ConnectionStore,
{
    let setup = setup(factory).await;
    let limiter = setup.limiter(2, 3);
    let base = key("tenant");
    let user = |name: &str| WindowKey::new(base.tenant().to_vec(), name.as_bytes().to_vec());
    let a1 = granted(&limiter, &user("a")).await;
    let a2 = granted(&limiter, &user("a")).await;
    match limiter.acquire(&user("a")).await.expect("answer") {
        Acquire::Denied(denied) => assert_eq!(denied.scope, CapScope::Subject),
        Acquire::Granted(_) => panic!("subject cap ignored"),
    }
    let b1 = granted(&limiter, &user("b")).await;
    match limiter.acquire(&user("c")).await.expect("answer") {
        Acquire::Denied(denied) => {
            assert_eq!(denied.scope, CapScope::Tenant);
            assert_eq!((denied.cap, denied.count), (3, 3));
        }
        Acquire::Granted(_) => panic!("tenant cap ignored"),
    }
    assert_eq!(connections(&limiter, &user("a")).await, 2);
    assert_eq!(connections(&limiter, &user("c")).await, 0);
    a1.release().await.expect("released");
    let c1 = granted(&limiter, &user("c")).await;
    assert_eq!(limiter.heartbeat().await.renewed, 3);
    for lease in [a2, b1, c1] {
        lease.release().await.expect("released");
    }
    assert_eq!(limiter.heartbeat().await.calls, 0);
}

/// Subjects and tenants with hostile bytes do not share leases.
pub async fn keys_are_independent<F: StoreFactory>(factory: &F)
where
    F::Store: ConnectionStore,
{
    let setup = setup(factory).await;
    let limiter = setup.limiter(1, 0);
    let base = key("independent");
    let t = base.tenant().to_vec();
    let keys = [
        WindowKey::new(t.clone(), b"a:b".to_vec()),
        WindowKey::new([t.as_slice(), b":a"].concat(), b"b".to_vec()),
        WindowKey::new(t.clone(), b"a%3Ab".to_vec()),
        WindowKey::new(t.clone(), b"{a}".to_vec()),
    ];
    let mut leases = Vec::new();
    for k in &keys {
        leases.push(granted(&limiter, k).await);
    }
    for k in &keys {
        assert_eq!(connections(&limiter, k).await, 1);
    }
    for lease in leases {
        lease.release().await.expect("released");
    }
}

/// Many concurrent grants for one subject admit exactly the cap.
pub async fn concurrent_grants_never_exceed_the_cap<F: StoreFactory>(factory: &F)
where
    F::Store: ConnectionStore,
{
    let setup = setup(factory).await;
    let limiter = setup.limiter(5, 0);
    let k = key("concurrent");
    let tasks: Vec<_> = (0..24)
        .map(|_| {
            let limiter = limiter.clone();
            let k = k.clone();
            tokio::spawn(async move { limiter.acquire(&k).await.expect("answer") })
        })
        .collect();
    let mut leases = Vec::new();
    for task in tasks {
        if let Acquire::Granted(lease) = task.await.expect("task") {
            leases.push(lease);
        }
    }
    assert_eq!(leases.len(), 5);
    let mut fences: Vec<u64> = leases.iter().map(ConnectionLease::fence).collect();
    fences.sort_unstable();
    fences.dedup();
    assert_eq!(fences.len(), 5, "fences are unique");
    assert_eq!(connections(&limiter, &k).await, 5);
    for lease in leases {
        lease.release().await.expect("released");
    }
    assert_eq!(connections(&limiter, &k).await, 0);
}
