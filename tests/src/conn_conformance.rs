//! The connection-seat conformance suite: one set of scenarios every
//! connection backend ([`conn::Backend`]) must pass with the same answers (memory, single
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
    self, Acquire, Backend as _, CapScope, ConnectionLimiter, ConnectionSeat, GrantReply,
    GrantRequest, SeatRef,
};
use tower_window::store::{self, Guard};
use tower_window::{limit, ManualClock, Store, WindowKey};

use crate::conformance::{StoreFactory, START};
use crate::shared::Shared;

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
            mixed_ttls_keep_the_longest_lease,
            fence_survives_clock_steps,
            fence_is_above_the_floor,
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
    F::Store: conn::Backend,
{
    let clock = ManualClock::new(START);
    let store = Arc::new(factory.make(clock.clone()).await);
    Setup { store, clock }
}

impl<S: limit::Backend + conn::Backend> Setup<S> {
    fn limiter(&self, per_subject: u32, per_tenant: u32) -> ConnectionLimiter {
        self.limiter_with_ttl(per_subject, per_tenant, TTL)
    }

    fn limiter_with_ttl(
        &self,
        per_subject: u32,
        per_tenant: u32,
        ttl: Duration,
    ) -> ConnectionLimiter {
        let store = Store::bare(
            store::Backend::windows(Shared::of(&self.store))
                .with_connections(Shared::of(&self.store)),
        );
        ConnectionLimiter::builder(store)
            .max_per_subject(per_subject)
            .max_per_tenant(per_tenant)
            .ttl(ttl)
            .build()
            .expect("valid ttl")
    }

    /// Grants and releases `n` leases of other subjects: a store may forget
    /// sets past their life on any grant (the memory store sweeps every 64),
    /// so this gives it every chance to forget one too early.
    async fn churn(&self, n: usize) {
        let other = self.limiter(0, 0);
        for i in 0..n {
            let k = key(&format!("churn-{i}"));
            granted(&other, &k).await.release().await.expect("released");
        }
    }
}

async fn granted(limiter: &ConnectionLimiter, key: &WindowKey) -> ConnectionSeat {
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
    F::Store: conn::Backend,
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
    F::Store: conn::Backend,
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
    F::Store: conn::Backend,
{
    let setup = setup(factory).await;
    let limiter = setup.limiter(0, 0);
    let store = &*setup.store;
    let k = key("renew");
    let a = granted(&limiter, &k).await;
    let b = granted(&limiter, &k).await;
    setup.clock.advance(TTL / 2);
    let both = [
        SeatRef::new(&k, a.id(), false),
        SeatRef::new(&k, b.id(), false),
    ];
    assert_eq!(
        store
            .renew(&mut Guard::bare(), &both, TTL)
            .await
            .expect("renew"),
        [true, true]
    );
    // Past the grant's expiry, inside the renewal's.
    setup.clock.advance(TTL * 3 / 4);
    assert_eq!(connections(&limiter, &k).await, 2);
    let b_id = b.id().to_vec();
    b.release().await.expect("released");
    let both = [
        SeatRef::new(&k, a.id(), false),
        SeatRef::new(&k, &b_id, false),
    ];
    assert_eq!(
        store
            .renew(&mut Guard::bare(), &both, TTL)
            .await
            .expect("renew"),
        [true, false]
    );
    assert_eq!(connections(&limiter, &k).await, 1);
    setup.clock.advance(TTL);
    let only_a = [SeatRef::new(&k, a.id(), false)];
    assert_eq!(
        store
            .renew(&mut Guard::bare(), &only_a, TTL)
            .await
            .expect("renew"),
        [false]
    );
    assert_eq!(
        store
            .renew(&mut Guard::bare(), &only_a, TTL)
            .await
            .expect("renew"),
        [false]
    );
    assert_eq!(connections(&limiter, &k).await, 0, "never revived");
    std::mem::forget(a);
}

/// The node's heartbeat renews what is live and reports what is gone to
/// the lease's holder, once; the lost lease is not re-acquired.
pub async fn heartbeat_reports_lost_and_never_reacquires<F: StoreFactory>(factory: &F)
where
    F::Store: conn::Backend,
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
    assert_eq!(other.live_seats(), 0);
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
    F::Store: conn::Backend,
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
    F::Store: conn::Backend,
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
    F::Store: conn::Backend,
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
    F::Store: conn::Backend,
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
    let mut fences: Vec<u64> = leases.iter().map(ConnectionSeat::fence).collect();
    fences.sort_unstable();
    fences.dedup();
    assert_eq!(fences.len(), 5, "fences are unique");
    assert_eq!(connections(&limiter, &k).await, 5);
    for lease in leases {
        lease.release().await.expect("released");
    }
    assert_eq!(connections(&limiter, &k).await, 0);
}

/// Issue 22, defect 5: nodes with different lease TTLs on one store (a
/// rolling change of the TTL). A subject's set must live as long as its
/// longest live lease: a node with a short TTL granting, renewing or
/// releasing in it never cuts a longer lease of another node, so the cap
/// holds and the long lease survives.
pub async fn mixed_ttls_keep_the_longest_lease<F: StoreFactory>(factory: &F)
where
    F::Store: conn::Backend,
{
    let setup = setup(factory).await;
    let long = setup.limiter_with_ttl(2, 0, Duration::from_secs(60));
    let short = setup.limiter_with_ttl(2, 0, Duration::from_secs(1));
    let k = key("mixed-ttl");
    let a = granted(&long, &k).await;
    // A grant and a release by the short-TTL node.
    granted(&short, &k).await.release().await.expect("released");
    setup.clock.advance(Duration::from_millis(2_500));
    setup.churn(64).await;
    let b1 = granted(&short, &k).await;
    match short.acquire(&k).await.expect("answer") {
        Acquire::Denied(denied) => {
            assert_eq!(denied.scope, CapScope::Subject);
            assert_eq!(denied.count, 2, "the long lease still counts");
        }
        Acquire::Granted(_) => panic!("a third connection under a cap of 2"),
    }
    assert_eq!(connections(&long, &k).await, 2);
    // Renewals by both nodes: the short one renews last.
    let report = long.heartbeat().await;
    assert_eq!(
        (report.renewed, report.lost),
        (1, 0),
        "the long lease lives"
    );
    assert_eq!(short.heartbeat().await.renewed, 1);
    setup.clock.advance(Duration::from_millis(2_500));
    setup.churn(64).await;
    // b1 expired (1 s); the long lease, renewed 2.5 s ago for 60 s, did not.
    assert_eq!(connections(&long, &k).await, 1);
    let b2 = granted(&short, &k).await;
    assert!(
        matches!(short.acquire(&k).await.expect("answer"), Acquire::Denied(_)),
        "a third connection under a cap of 2 after renewals"
    );
    let report = long.heartbeat().await;
    assert_eq!(
        (report.renewed, report.lost),
        (1, 0),
        "the long lease lives"
    );
    assert!(!a.is_lost());
    assert_eq!(short.heartbeat().await.lost, 1, "b1 expired: reported lost");
    assert!(b1.is_lost());
    std::mem::forget(b1);
    b2.release().await.expect("released");
    a.release().await.expect("released");
    assert_eq!(connections(&long, &k).await, 0);
}

/// Fencing tokens of a subject keep growing when the store's clock steps
/// back or forward by days, while the store keeps the subject's token
/// (issue 22: a clock step, an NTP correction).
pub async fn fence_survives_clock_steps<F: StoreFactory>(factory: &F)
where
    F::Store: conn::Backend,
{
    const DAY: Duration = Duration::from_secs(86_400);
    let setup = setup(factory).await;
    let limiter = setup.limiter(0, 0);
    let k = key("fence-steps");
    let mut last = 0;
    let mut held = Vec::new();
    for step in 0..6 {
        let lease = granted(&limiter, &k).await;
        assert!(
            lease.fence() > last,
            "step {step}: {} after {last}",
            lease.fence()
        );
        last = lease.fence();
        held.push(lease);
        if step % 2 == 0 {
            setup.clock.set(START - DAY.as_micros() as u64 * (step + 1));
        } else {
            setup.clock.set(START + DAY.as_micros() as u64 / 2 * step);
        }
    }
    for lease in held {
        std::mem::forget(lease);
    }
}

/// A grant's fence is above the caller's floor (the highest token a node
/// was granted, which it keeps itself), above the subject's last token and
/// above the store's clock: exactly the largest of the three, plus one.
pub async fn fence_is_above_the_floor<F: StoreFactory>(factory: &F)
where
    F::Store: conn::Backend,
{
    let setup = setup(factory).await;
    let store = &*setup.store;
    let k = key("floor");
    let floor = START * 2;
    let grant = |id: &'static [u8], floor: u64| {
        let lease = SeatRef::new(&k, id, false);
        store.grant(
            &mut Guard::bare(),
            GrantRequest::new(lease, TTL, 0, 0).with_fence_floor(floor),
        )
    };
    let fence = |reply: GrantReply| match reply {
        GrantReply::Granted { fence, .. } => fence,
        other => panic!("not granted: {other:?}"),
    };
    // Above the clock: the floor decides.
    assert_eq!(fence(grant(b"a", floor).await.expect("grant")), floor + 1);
    // No floor: the subject's last token decides.
    assert_eq!(fence(grant(b"b", 0).await.expect("grant")), floor + 2);
    // A floor below the last token changes nothing.
    assert_eq!(fence(grant(b"c", START).await.expect("grant")), floor + 3);
    // A fresh subject without a floor: the clock.
    let fresh = key("floor-fresh");
    let lease = SeatRef::new(&fresh, b"d", false);
    let reply = store
        .grant(&mut Guard::bare(), GrantRequest::new(lease, TTL, 0, 0))
        .await
        .expect("grant");
    assert_eq!(fence(reply), START);
    for (subject, id) in [(&k, &b"a"[..]), (&k, b"b"), (&k, b"c"), (&fresh, b"d")] {
        store
            .release(&mut Guard::bare(), SeatRef::new(subject, id, false))
            .await
            .expect("released");
    }
}
