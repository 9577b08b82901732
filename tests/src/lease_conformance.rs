//! The conformance suite for quota leases: [`lease::Backend::reserve`] and
//! [`lease::Backend::refund`] give the same answers on every store, with
//! numbers worked out by hand from the lease contract (`tower_window::lease`).
//!
//! Plug a store in with the [`StoreFactory`] of the check suite:
//!
//! ```text
//! tower_window_tests::lease_conformance_tests!(MyStoreFactory::new());
//! ```
//!
//! Times are those of the check suite: the clock starts at [`START`], a
//! multiple of 10 s and 20 s into a minute.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tower_window::lease::{self, Backend as _, Lease, RefundRequest, Reservation, ReserveRequest};
use tower_window::limit;
use tower_window::store::Guard;
use tower_window::{
    CheckRequest, Cost, Decision, ManualClock, Policy, Quota, StoreErrorKind, WindowKey,
};

use crate::conformance::{StoreFactory, START};

const S: u64 = 1_000_000;

/// Expands to one `#[tokio::test]` per lease scenario.
#[macro_export]
macro_rules! lease_conformance_tests {
    ($factory:expr) => {
        $crate::lease_conformance_tests!(@each $factory;
            fixed_window_lease_stays_in_its_window,
            sliding_log_lease_counts_at_its_deadline,
            sliding_log_lease_takes_its_whole_room,
            sliding_counter_lease_stays_in_its_bucket,
            gcra_lease_dates_tokens_at_the_deadline,
            policy_lease_is_all_or_nothing,
            empty_reservation_reports_outstanding_leases,
            invalid_leases_are_typed_errors,
            shadow_quota_in_a_lease_is_counted_not_enforced,
            lease_of_only_shadow_quotas_grants_what_is_wanted,
            shadow_quotas_bound_the_lease_like_enforced_ones,
            refunds_ride_on_a_reservation_that_decides_when_it_grants_nothing,
        );
    };
    (@each $factory:expr; $($scenario:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $scenario() {
                let factory = $factory;
                $crate::lease_conformance::$scenario(&factory).await;
            }
        )*
    };
}

struct Run<S> {
    store: S,
    clock: ManualClock,
    key: WindowKey,
    scenario: &'static str,
}

fn quota(text: &str) -> Quota {
    text.parse()
        .unwrap_or_else(|e| panic!("quota {text:?}: {e}"))
}

impl<S: limit::Backend + lease::Backend> Run<S> {
    async fn start<F: StoreFactory<Store = S>>(factory: &F, scenario: &'static str) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let clock = ManualClock::new(START);
        let store = factory.make(clock.clone()).await;
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let tenant = format!(
            "lease:{scenario}:{}:{nanos}:{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        Self {
            store,
            clock,
            key: WindowKey::new(tenant, "s".to_owned()),
            scenario,
        }
    }

    fn at(&self, t: u64) {
        self.clock.set(t);
    }

    async fn reserve(&self, policy: &Policy, want: u32, ttl_secs: u64) -> Reservation {
        let reservation = self
            .store
            .reserve(
                &mut Guard::bare(),
                ReserveRequest::new(&self.key, policy, want, 1, Duration::from_secs(ttl_secs)),
            )
            .await
            .unwrap_or_else(|e| panic!("{}: reserve: {e}", self.scenario));
        assert_eq!(
            reservation.now_micros,
            self.clock_now(),
            "{}: store time",
            self.scenario
        );
        reservation
    }

    async fn reserve_with(&self, request: ReserveRequest<'_>) -> Reservation {
        self.store
            .reserve(&mut Guard::bare(), request)
            .await
            .unwrap_or_else(|e| panic!("{}: reserve: {e}", self.scenario))
    }

    fn clock_now(&self) -> u64 {
        tower_window::Clock::now_micros(&self.clock)
    }

    async fn refund(&self, policy: &Policy, lease: &Lease, unused: u32) -> u32 {
        self.store
            .refund(
                &mut Guard::bare(),
                RefundRequest::new(&self.key, policy, lease, unused),
            )
            .await
            .unwrap_or_else(|e| panic!("{}: refund: {e}", self.scenario))
    }

    async fn check(&self, policy: &Policy, cost: u32) -> Decision {
        self.store
            .check(
                &mut Guard::bare(),
                CheckRequest::new(
                    &self.key,
                    policy,
                    Cost::new(cost).expect("a cost of at least 1"),
                ),
            )
            .await
            .unwrap_or_else(|e| panic!("{}: check: {e}", self.scenario))
    }
}

fn lease_of(r: &Reservation) -> Lease {
    r.lease.clone().expect("a lease was granted")
}

/// "10/1m fixed-window": a lease takes half the room, ends with the window,
/// refunds return units to that window only, once.
pub async fn fixed_window_lease_stays_in_its_window<F: StoreFactory>(factory: &F)
where
    F::Store: lease::Backend,
{
    let run = Run::start(factory, "fixed_window_lease_stays_in_its_window").await;
    let policy = Policy::from(quota("10/1m fixed-window"));
    let r = run.reserve(&policy, 8, 60).await;
    let lease = lease_of(&r);
    assert_eq!(lease.granted, 5, "half the room of 10");
    assert_eq!(lease.deadline_micros, START + 40 * S, "the window's end");
    assert_eq!(r.decision.as_ref().map(|d| d.remaining()), Some(5));
    assert!(run.check(&policy, 5).await.allowed());
    let denied = run.check(&policy, 1).await;
    assert!(!denied.allowed());
    assert_eq!(denied.retry_after(), Some(Duration::from_secs(40)));
    assert_eq!(run.refund(&policy, &lease, 3).await, 3);
    assert_eq!(
        run.refund(&policy, &lease, 3).await,
        0,
        "a second refund is a no-op"
    );
    assert!(run.check(&policy, 3).await.allowed());
    assert!(!run.check(&policy, 1).await.allowed());
    // A refund after the window rolled returns nothing to the new window.
    run.at(START + 40 * S);
    let late = lease_of(&run.reserve(&policy, 2, 60).await);
    assert_eq!(late.granted, 2);
    run.at(START + 100 * S);
    assert!(run.check(&policy, 10).await.allowed());
    assert_eq!(run.refund(&policy, &late, 2).await, 0);
    assert!(!run.check(&policy, 1).await.allowed(), "nothing came back");
}

/// "4/1m" sliding log: leased units are recorded at the deadline and count
/// until W after it; a refund (even after the deadline) takes them back.
pub async fn sliding_log_lease_counts_at_its_deadline<F: StoreFactory>(factory: &F)
where
    F::Store: lease::Backend,
{
    let run = Run::start(factory, "sliding_log_lease_counts_at_its_deadline").await;
    let policy = Policy::from(quota("4/1m"));
    let lease = lease_of(&run.reserve(&policy, 2, 10).await);
    assert_eq!(lease.granted, 2);
    assert_eq!(lease.deadline_micros, START + 10 * S);
    assert!(run.check(&policy, 2).await.allowed());
    assert!(!run.check(&policy, 1).await.allowed());
    // The direct admissions at START left at START + 60 s; the lease's
    // units, dated START + 10 s, count until START + 70 s.
    run.at(START + 61 * S);
    let d = run.check(&policy, 3).await;
    assert!(!d.allowed());
    assert_eq!(d.remaining(), 2);
    assert_eq!(d.retry_after(), Some(Duration::from_secs(9)));
    assert_eq!(run.refund(&policy, &lease, 2).await, 2);
    assert!(run.check(&policy, 4).await.allowed());
    assert_eq!(run.refund(&policy, &lease, 2).await, 0);
}

/// A lease of sliding logs may take their whole room (up to what it
/// wants); with any other enforced quota beside it, half of the least
/// room, rounded up. A shadow quota does not change which.
pub async fn sliding_log_lease_takes_its_whole_room<F: StoreFactory>(factory: &F)
where
    F::Store: lease::Backend,
{
    let run = Run::start(factory, "sliding_log_lease_takes_its_whole_room").await;
    let logs = Policy::from(quota("5/1m"));
    assert!(run.check(&logs, 2).await.allowed());
    assert_eq!(run.reserve(&logs, 10, 10).await.granted(), 3, "all of 3");
    assert_eq!(run.reserve(&logs, 10, 10).await.granted(), 0);
    let shadowed = Policy::new(
        "log-and-shadow",
        [
            quota("5/1m").named("log").expect("name"),
            quota("9/1m fixed-window")
                .named("fw")
                .expect("name")
                .shadowed(true),
        ],
    )
    .expect("policy");
    run.at(START + 120 * S);
    assert_eq!(
        run.reserve(&shadowed, 10, 10).await.granted(),
        5,
        "all of 5"
    );
    let mixed = Policy::new(
        "log-and-window",
        [
            quota("5/1m").named("log2").expect("name"),
            quota("9/1m fixed-window").named("fw2").expect("name"),
        ],
    )
    .expect("policy");
    run.at(START + 240 * S);
    assert_eq!(run.reserve(&mixed, 10, 10).await.granted(), 3, "half of 5");
}

/// "4/1m sliding-counter(10s)": a lease ends with its bucket and its units
/// go back into that bucket.
pub async fn sliding_counter_lease_stays_in_its_bucket<F: StoreFactory>(factory: &F)
where
    F::Store: lease::Backend,
{
    let run = Run::start(factory, "sliding_counter_lease_stays_in_its_bucket").await;
    let policy = Policy::from(quota("4/1m sliding-counter(10s)"));
    run.at(START + 3 * S);
    let lease = lease_of(&run.reserve(&policy, 4, 20).await);
    assert_eq!(lease.granted, 2);
    assert_eq!(lease.deadline_micros, START + 10 * S, "the bucket's end");
    assert!(run.check(&policy, 2).await.allowed());
    assert!(!run.check(&policy, 1).await.allowed());
    assert_eq!(run.refund(&policy, &lease, 1).await, 1);
    let d = run.check(&policy, 1).await;
    assert!(d.allowed());
    assert_eq!(d.remaining(), 0);
    assert_eq!(run.refund(&policy, &lease, 1).await, 0);
}

/// "5/1m gcra" (T = 12 s, B T = 60 s): tokens dated at the deadline; a
/// refund only while no later grant moved the arrival time; a TTL that
/// leaves no room is refused.
pub async fn gcra_lease_dates_tokens_at_the_deadline<F: StoreFactory>(factory: &F)
where
    F::Store: lease::Backend,
{
    let run = Run::start(factory, "gcra_lease_dates_tokens_at_the_deadline").await;
    let policy = Policy::from(quota("5/1m gcra"));
    // Room: (START + 60 s - (START + 24 s)) / 12 s = 3; half, rounded up: 2.
    let lease = lease_of(&run.reserve(&policy, 5, 24).await);
    assert_eq!(lease.granted, 2);
    assert_eq!(lease.deadline_micros, START + 24 * S);
    // tat = START + 48 s: one more token fits now (60 s ahead), not two.
    let d = run.check(&policy, 1).await;
    assert!(d.allowed());
    assert!(!run.check(&policy, 1).await.allowed());
    assert_eq!(
        run.refund(&policy, &lease, 2).await,
        0,
        "a later grant moved tat"
    );
    run.at(START + 120 * S);
    let lease = lease_of(&run.reserve(&policy, 5, 24).await);
    assert_eq!(lease.granted, 2);
    assert_eq!(run.refund(&policy, &lease, 2).await, 2);
    assert!(
        run.check(&policy, 4).await.allowed(),
        "both tokens came back"
    );
    let error = run
        .store
        .reserve(
            &mut Guard::bare(),
            ReserveRequest::new(&run.key, &policy, 1, 1, Duration::from_secs(49)),
        )
        .await
        .expect_err("a TTL of (B - 1) T + 1 s leaves no room");
    assert_eq!(error.kind(), StoreErrorKind::InvalidRequest);
}

/// A policy of two quotas: the lease takes the same units from both, the
/// smaller room decides, and a refund returns them to both.
pub async fn policy_lease_is_all_or_nothing<F: StoreFactory>(factory: &F)
where
    F::Store: lease::Backend,
{
    let run = Run::start(factory, "policy_lease_is_all_or_nothing").await;
    let a = quota("5/1m fixed-window").named("a").expect("name");
    let b = quota("3/1m").named("b").expect("name");
    let policy = Policy::new("ab", [a.clone(), b.clone()]).expect("policy");
    let lease = lease_of(&run.reserve(&policy, 10, 5).await);
    assert_eq!(lease.granted, 2, "half of the smaller room (3), rounded up");
    let only_a = Policy::from(a);
    let only_b = Policy::from(b);
    assert_eq!(run.check(&only_a, 1).await.remaining(), 2);
    assert_eq!(run.check(&only_b, 1).await.remaining(), 0);
    assert_eq!(run.refund(&policy, &lease, 2).await, 2);
    assert_eq!(run.check(&only_a, 1).await.remaining(), 3);
    assert_eq!(run.check(&only_b, 1).await.remaining(), 1);
}

/// When nothing fits, no lease, and the latest deadline of the leases
/// still outstanding.
pub async fn empty_reservation_reports_outstanding_leases<F: StoreFactory>(factory: &F)
where
    F::Store: lease::Backend,
{
    let run = Run::start(factory, "empty_reservation_reports_outstanding_leases").await;
    let policy = Policy::from(quota("2/1m fixed-window"));
    assert_eq!(run.reserve(&policy, 2, 1).await.granted(), 1);
    run.at(START + S / 2);
    let second = run.reserve(&policy, 2, 1).await;
    assert_eq!(second.granted(), 1);
    assert_eq!(second.held_until_micros, Some(START + 3 * S / 2));
    let none = run.reserve(&policy, 2, 1).await;
    assert_eq!(none.granted(), 0);
    assert!(none.decision.is_none());
    assert_eq!(none.held_until_micros, Some(START + 3 * S / 2));
    assert_eq!(none.held_for(), Duration::from_secs(1));
    run.at(START + 2 * S);
    let after = run.reserve(&policy, 2, 1).await;
    assert_eq!(after.granted(), 0);
    assert_eq!(after.held_until_micros, None, "every lease has ended");
}

/// Bad reservations are typed errors, never a lease.
pub async fn invalid_leases_are_typed_errors<F: StoreFactory>(factory: &F)
where
    F::Store: lease::Backend,
{
    let run = Run::start(factory, "invalid_leases_are_typed_errors").await;
    let policy = Policy::from(quota("5/1m"));
    for (want, at_least, ttl) in [(0, 0, 1_000), (1, 0, 1_000), (1, 2, 1_000), (1, 1, 0)] {
        let error = run
            .store
            .reserve(
                &mut Guard::bare(),
                ReserveRequest::new(
                    &run.key,
                    &policy,
                    want,
                    at_least,
                    Duration::from_micros(ttl),
                ),
            )
            .await
            .expect_err("invalid");
        assert_eq!(
            error.kind(),
            StoreErrorKind::InvalidRequest,
            "{want} {at_least} {ttl}"
        );
    }
    assert!(run.check(&policy, 5).await.allowed(), "nothing was taken");
}

/// "10/1m fixed-window", one call each: a reservation gives back the
/// refunds it carries before it takes its share (half of the room they
/// freed); one that grants nothing decides its check as a direct check
/// (denied: nothing taken; admitted: exactly its units taken); a refund of
/// another key is refused.
pub async fn refunds_ride_on_a_reservation_that_decides_when_it_grants_nothing<F: StoreFactory>(
    factory: &F,
) where
    F::Store: lease::Backend,
{
    let run = Run::start(
        factory,
        "refunds_ride_on_a_reservation_that_decides_when_it_grants_nothing",
    )
    .await;
    let policy = Policy::from(quota("10/1m fixed-window"));
    let ttl = Duration::from_secs(5);
    run.at(START);
    let a = lease_of(&run.reserve(&policy, 8, 5).await);
    assert_eq!(a.granted, 5, "half of 10");
    run.at(START + S / 10);
    // 3 of A come back first: a room of 8, half of it leased.
    let refund_a = [RefundRequest::new(&run.key, &policy, &a, 3)];
    let r = run
        .reserve_with(ReserveRequest::new(&run.key, &policy, 8, 1, ttl).refunding(&refund_a))
        .await;
    assert_eq!(r.refunded, 3);
    let b = lease_of(&r);
    assert_eq!(b.granted, 4, "half of 8");
    // 5 - 3 + 4 = 6 counted: a check of 4 fills the window.
    assert!(run.check(&policy, 4).await.allowed());
    // Full: nothing granted, and the check of 1 is denied in the same
    // call, taking nothing.
    let full = run
        .reserve_with(ReserveRequest::new(&run.key, &policy, 2, 1, ttl).deciding())
        .await;
    assert!(full.lease.is_none());
    assert_eq!(full.refunded, 0);
    let denied = full.decision.expect("the check was decided");
    assert!(!denied.allowed());
    // A reservation of nothing: 2 of B come back, then the check of 1 is
    // admitted in the same call, taking exactly 1.
    let refund_b = [RefundRequest::new(&run.key, &policy, &b, 2)];
    let r = run
        .reserve_with(
            ReserveRequest::new(&run.key, &policy, 0, 1, ttl)
                .refunding(&refund_b)
                .deciding(),
        )
        .await;
    assert!(r.lease.is_none());
    assert_eq!(r.refunded, 2);
    let admitted = r.decision.expect("the check was decided");
    assert!(admitted.allowed());
    assert_eq!(admitted.remaining(), 1);
    assert!(run.check(&policy, 1).await.allowed());
    assert!(!run.check(&policy, 1).await.allowed(), "the window is full");
    // A refund of another key's lease rides on no reservation.
    let other = WindowKey::new("another".to_owned(), "s".to_owned());
    let foreign = [RefundRequest::new(&other, &policy, &b, 1)];
    let error = run
        .store
        .reserve(
            &mut Guard::bare(),
            ReserveRequest::new(&run.key, &policy, 1, 1, ttl).refunding(&foreign),
        )
        .await
        .expect_err("a refund of another key");
    assert_eq!(error.kind(), StoreErrorKind::InvalidRequest);
}

/// The shadow quotas of the shadow scenarios, one per algorithm: each has
/// room for exactly 2 units when a lease with a 5 s TTL is taken at
/// [`START`] (the GCRA one: T = 30 s, B T = 90 s, the tokens dated at the
/// deadline, so `(90 s - 5 s) / 30 s = 2`).
const SHADOWS: [&str; 4] = [
    "2/1m",
    "2/1m sliding-counter(10s)",
    "2/1m fixed-window",
    "2/1m gcra(burst=3)",
];

async fn peek_remaining<S: limit::Backend>(run: &Run<S>, quota: &Quota) -> u32 {
    let policy = Policy::from(quota.clone());
    let peek = run
        .store
        .peek(
            &mut Guard::bare(),
            CheckRequest::new(&run.key, &policy, Cost::ONE),
        )
        .await;
    peek.unwrap_or_else(|e| panic!("{}: peek: {e}", run.scenario))
        .remaining()
}

fn shadow_state(decision: &Decision) -> &tower_window::QuotaDecision {
    decision
        .quotas()
        .iter()
        .find(|q| q.quota().is_shadow())
        .expect("a shadow quota")
}

/// An enforced "10/1m fixed-window" and a shadow "2/1m" quota of each
/// algorithm (issue 22, defect 1): the grant is sized by the enforced
/// quota alone; the shadow quota holds what it has room for (never more
/// than the grant), reports its would-be denial when it holds less than
/// the request that reserved, and a refund gives it back what it held
/// beyond the units spent.
pub async fn shadow_quota_in_a_lease_is_counted_not_enforced<F: StoreFactory>(factory: &F)
where
    F::Store: lease::Backend,
{
    for text in SHADOWS {
        let run = Run::start(factory, "shadow_quota_in_a_lease_is_counted_not_enforced").await;
        let enforced = quota("10/1m fixed-window").named("e").expect("name");
        let shadow = quota(text).named("s").expect("name").shadowed(true);
        let policy = Policy::new("es", [enforced.clone(), shadow.clone()]).expect("policy");
        let first = run.reserve(&policy, 8, 5).await;
        let lease = lease_of(&first);
        assert_eq!(lease.granted, 5, "{text}: half the enforced room of 10");
        assert_eq!(lease.held, [5, 2], "{text}: the shadow holds its room");
        assert_eq!(lease.deadline_micros, START + 5 * S, "{text}");
        let decision = first.decision.as_ref().expect("a decision");
        assert!(decision.allowed(), "{text}");
        assert_eq!(
            decision.quota().name(),
            "e",
            "{text}: the enforced quota decides"
        );
        assert_eq!(decision.remaining(), 5, "{text}");
        assert_eq!(
            decision.shadow_denials().count(),
            0,
            "{text}: it holds 2 >= 1"
        );
        assert_eq!(
            shadow_state(decision).remaining(),
            0,
            "{text}: it holds its room"
        );
        assert_eq!(peek_remaining(&run, &enforced).await, 5, "{text}");
        assert_eq!(peek_remaining(&run, &shadow).await, 0, "{text}: 2 held");
        // The shadow quota is full: a lease is granted all the same, and
        // reports the shadow's would-be denial.
        let second = run.reserve(&policy, 8, 5).await;
        let full = lease_of(&second);
        assert_eq!(full.granted, 3, "{text}: half the enforced room of 5");
        assert_eq!(full.held, [3, 0], "{text}");
        let decision = second.decision.as_ref().expect("a decision");
        assert!(decision.allowed(), "{text}: a shadow quota never denies");
        assert_eq!(decision.remaining(), 2, "{text}");
        assert_eq!(
            decision.shadow_denials().count(),
            1,
            "{text}: it holds 0 < 1"
        );
        assert_eq!(peek_remaining(&run, &enforced).await, 2, "{text}");
        // One unit of the first lease spent, four back: the shadow quota
        // held the first two units, keeps the one spent.
        assert_eq!(run.refund(&policy, &lease, 4).await, 4, "{text}");
        assert_eq!(peek_remaining(&run, &enforced).await, 6, "{text}");
        assert_eq!(peek_remaining(&run, &shadow).await, 1, "{text}");
        assert_eq!(run.refund(&policy, &lease, 4).await, 0, "{text}: once");
        // The second lease's shadow held nothing: nothing comes back to it.
        assert_eq!(run.refund(&policy, &full, 2).await, 2, "{text}");
        assert_eq!(peek_remaining(&run, &enforced).await, 8, "{text}");
        assert_eq!(peek_remaining(&run, &shadow).await, 1, "{text}");
        // A direct check beside the leases: as ever, the shadow quota that
        // the cost does not fit reports it and records nothing.
        let direct = run.check(&policy, 2).await;
        assert!(direct.allowed(), "{text}");
        assert_eq!(direct.shadow_denials().count(), 1, "{text}");
        assert_eq!(peek_remaining(&run, &enforced).await, 6, "{text}");
        assert_eq!(peek_remaining(&run, &shadow).await, 1, "{text}");
        // The refund names what the shadow quota still holds (as the
        // limiter does): every enforced unit spent, the shadow's one unit
        // back all the same.
        let third = lease_of(&run.reserve(&policy, 8, 5).await);
        assert_eq!(third.held, [3, 1], "{text}");
        assert_eq!(peek_remaining(&run, &shadow).await, 0, "{text}");
        let named = [0, 1];
        let returned = run
            .store
            .refund(
                &mut Guard::bare(),
                RefundRequest::new(&run.key, &policy, &third, 0).with_shadow_unused(&named),
            )
            .await
            .unwrap_or_else(|e| panic!("{text}: refund: {e}"));
        assert_eq!(returned, 0, "{text}: nothing enforced came back");
        assert_eq!(peek_remaining(&run, &enforced).await, 3, "{text}");
        assert_eq!(peek_remaining(&run, &shadow).await, 1, "{text}");
        assert_eq!(run.refund(&policy, &third, 3).await, 0, "{text}: once");
    }
}

/// A policy of shadow quotas only: nothing enforced bounds a lease, so it
/// grants what was wanted; the shadow quota holds what it has room for.
pub async fn lease_of_only_shadow_quotas_grants_what_is_wanted<F: StoreFactory>(factory: &F)
where
    F::Store: lease::Backend,
{
    let run = Run::start(factory, "lease_of_only_shadow_quotas_grants_what_is_wanted").await;
    let shadow = quota("3/1m").named("trial").expect("name").shadowed(true);
    let policy = Policy::from(shadow.clone());
    let first = run.reserve(&policy, 8, 5).await;
    let lease = lease_of(&first);
    assert_eq!(lease.granted, 8, "nothing enforced: what was wanted");
    assert_eq!(lease.held, [3]);
    let decision = first.decision.as_ref().expect("a decision");
    assert!(decision.allowed());
    assert_eq!(decision.shadow_denials().count(), 0);
    assert_eq!(peek_remaining(&run, &shadow).await, 0, "3 held");
    let second = run.reserve(&policy, 8, 5).await;
    assert_eq!(second.granted(), 8);
    let decision = second.decision.as_ref().expect("a decision");
    assert!(decision.allowed(), "a shadow quota never denies");
    assert_eq!(decision.shadow_denials().count(), 1, "it holds nothing");
    // Nothing of the first lease spent: its 3 held units come back; every
    // unit of the lease is returned (nothing enforced held them).
    assert_eq!(run.refund(&policy, &lease, 8).await, 8);
    assert_eq!(peek_remaining(&run, &shadow).await, 3);
    assert_eq!(run.refund(&policy, &lease, 8).await, 0, "once");
}

/// A shadow quota is counted like an enforced one, so it bounds a lease's
/// deadline (its bucket's end) and refuses a GCRA TTL that leaves it no
/// room, exactly as if it were enforced.
pub async fn shadow_quotas_bound_the_lease_like_enforced_ones<F: StoreFactory>(factory: &F)
where
    F::Store: lease::Backend,
{
    let run = Run::start(factory, "shadow_quotas_bound_the_lease_like_enforced_ones").await;
    let enforced = quota("10/1m").named("e").expect("name");
    let counter = quota("2/1m sliding-counter(10s)")
        .named("s")
        .expect("name")
        .shadowed(true);
    let policy = Policy::new("es", [enforced.clone(), counter]).expect("policy");
    let lease = lease_of(&run.reserve(&policy, 4, 30).await);
    assert_eq!(
        lease.deadline_micros,
        START + 10 * S,
        "the shadow's bucket end"
    );
    let gcra = quota("2/1m gcra").named("g").expect("name").shadowed(true);
    let policy = Policy::new("eg", [enforced, gcra]).expect("policy");
    let error = run
        .store
        .reserve(
            &mut Guard::bare(),
            ReserveRequest::new(&run.key, &policy, 1, 1, Duration::from_secs(45)),
        )
        .await
        .expect_err("(B - 1) T = 30 s < 45 s");
    assert_eq!(error.kind(), StoreErrorKind::InvalidRequest);
}
