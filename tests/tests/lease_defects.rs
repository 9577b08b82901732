//! Regression tests for issue 22's quota lease defects, on `MemoryStore`, a
//! real `redis-server` and the real 3-primary Redis Cluster, with explicit
//! times (a `ManualClock` shared by each limiter and its store):
//!
//! 1. Leases with shadow quotas: the same random sequence of checks, through
//!    a leasing `Limiter`, on policies mixing enforced and shadow quotas of
//!    every algorithm with tenant-scoped ones, gets the same decisions from
//!    every store (allowed, source, remaining, retry, every quota's state),
//!    never a fallback, within every enforced quota's bound; a shadow quota's
//!    would-be admissions respect its own bound and its would-be denials are
//!    reported for leased admissions too.
//! 2. Many expired lease records in one key: past 10,000 of them every later
//!    reserve and refund still succeeds, and each call drops a bounded batch
//!    until none is left; a sliding log holding more than 10,000 members at
//!    a lease's timestamp (written by something else) is refunded without
//!    failing, exactly.
#![allow(clippy::unwrap_used)]

use std::fmt::Write as _;

use futures_util::StreamExt as _;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tower_window::lease::{Lease, RefundRequest, ReserveRequest};
use tower_window::store::{Backend as StoreBackend, Guard};
use tower_window::{
    Algorithm, CheckRequest, Cost, Decision, DecisionSource, LeaseConfig, Limiter, ManualClock,
    MemoryStore, Policy, Quota, RedisStore, Scope, Store, WindowKey,
};
use tower_window_tests::redis_cluster::RedisCluster;
use tower_window_tests::redis_server::RedisServer;
use tower_window_tests::shared::Quotas;

/// 1_700_000_000 s: a multiple of 10 s (a bucket boundary) and of 1 s.
const START: u64 = 1_700_000_000_000_000;
const S: u64 = 1_000_000;

/// A prefix no other run or test shares.
fn unique(what: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("ld{what}{}x{nanos}:", std::process::id())
}

/// The three stores, each on its own clock.
enum Backend {
    Memory,
    Single(Arc<RedisServer>),
    Cluster(Arc<RedisCluster>),
}

impl Backend {
    fn all() -> Vec<Backend> {
        vec![
            Backend::Memory,
            Backend::Single(RedisServer::shared()),
            Backend::Cluster(RedisCluster::shared()),
        ]
    }

    fn name(&self) -> &'static str {
        match self {
            Backend::Memory => "memory",
            Backend::Single(_) => "redis",
            Backend::Cluster(_) => "cluster",
        }
    }

    /// The store, to call directly, and the same store as a backend to
    /// make a [`Store`] handle of.
    fn store(&self, prefix: &str, clock: &ManualClock) -> (Arc<dyn Quotas>, StoreBackend) {
        let redis = |builder: tower_window::RedisStoreBuilder| {
            let store = Arc::new(builder.prefix(prefix).clock(clock.clone()).build().unwrap());
            (
                Arc::clone(&store) as Arc<dyn Quotas>,
                StoreBackend::from(store),
            )
        };
        match self {
            Backend::Memory => {
                // Clones share one state.
                let store = MemoryStore::builder().clock(clock.clone()).build();
                (Arc::new(store.clone()), StoreBackend::from(store))
            }
            Backend::Single(server) => redis(RedisStore::builder().url(server.url())),
            Backend::Cluster(cluster) => redis(RedisStore::builder().cluster(cluster.urls())),
        }
    }

    /// Connections to every node holding keys (one for a single server).
    fn connections(&self) -> Vec<redis::Connection> {
        match self {
            Backend::Memory => Vec::new(),
            Backend::Single(server) => vec![server.connection()],
            Backend::Cluster(cluster) => cluster
                .nodes()
                .iter()
                .map(RedisServer::connection)
                .collect(),
        }
    }
}

fn quota(text: &str, name: &str) -> Quota {
    text.parse::<Quota>().unwrap().named(name).unwrap()
}

/// The algorithm suffixes of the DSL, every algorithm once.
const ALGORITHMS: [&str; 4] = ["", " sliding-counter(10s)", " fixed-window", " gcra"];

/// The policies of the differential run for one algorithm: enforced and
/// shadow quotas, per subject and per tenant; enforced and shadow per
/// subject only (the subject key form); shadow quotas only.
fn policies(algorithm: &str) -> Vec<Policy> {
    let q = |limit: &str, name: &str| quota(&format!("{limit}{algorithm}"), name);
    vec![
        Policy::new(
            "mixed",
            [
                q("6/1m", "user"),
                q("10/1m", "org").scoped(Scope::Tenant),
                q("3/1m", "trial").shadowed(true),
                q("5/1m", "trial_org").scoped(Scope::Tenant).shadowed(true),
            ],
        )
        .unwrap(),
        Policy::new(
            "subject",
            [q("6/1m", "user"), q("3/1m", "trial").shadowed(true)],
        )
        .unwrap(),
        Policy::new("shadow_only", [q("3/1m", "trial").shadowed(true)]).unwrap(),
    ]
}

/// A tiny deterministic generator (xorshift64*), so every store sees the
/// same sequence.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One operation of the sequence.
#[derive(Debug, Clone, Copy)]
enum Op {
    /// Advance the clock by this many µs, then check `subject` at `cost`.
    Check {
        advance: u64,
        subject: u8,
        cost: u32,
    },
    /// Give every held lease back (a graceful restart).
    RefundAll,
}

fn sequence(seed: u64, steps: usize) -> Vec<Op> {
    let mut rng = Rng(seed);
    (0..steps)
        .map(|_| {
            if rng.below(40) == 0 {
                return Op::RefundAll;
            }
            // Mostly short steps (leases are spent), now and then one past
            // the lease TTL (leases expire with units left).
            let advance = if rng.below(12) == 0 {
                6 * S + rng.below(S)
            } else {
                rng.below(900_000)
            };
            Op::Check {
                advance,
                subject: u8::try_from(rng.below(3)).unwrap(),
                cost: if rng.below(5) == 0 { 2 } else { 1 },
            }
        })
        .collect()
}

/// Everything a decision says that the stores must agree on.
fn describe(d: &Decision) -> String {
    let mut out = format!(
        "allowed={} source={} remaining={} retry={:?} at={} |",
        d.allowed(),
        d.source().as_str(),
        d.remaining(),
        d.retry_after(),
        d.timestamp_micros() - START
    );
    for q in d.quotas() {
        write!(
            out,
            " {}:{}:{}",
            q.quota().name(),
            u8::from(q.allowed()),
            q.remaining()
        )
        .unwrap();
    }
    out
}

/// One admission, as the bound checks read it.
struct Admitted {
    at: u64,
    cost: u32,
    subject: u8,
    /// Per quota (policy order): whether that quota's state admitted it
    /// (a shadow quota's would-be admission).
    fits: Vec<bool>,
}

/// Runs `ops` on one store; the transcript and the admissions.
async fn run(
    backend: &Backend,
    policy: &Policy,
    ops: &[Op],
    tenant: &str,
) -> (Vec<String>, Vec<Admitted>) {
    let clock = ManualClock::new(START);
    let (store, handle) = backend.store(&unique("diff"), &clock);
    let handle = Store::builder(handle)
        .without_timeout()
        .without_breaker()
        .build();
    let limiter = Limiter::builder(handle, policy.clone())
        .leases(LeaseConfig::new(4).ttl(Duration::from_secs(5)))
        .build();
    let keys: Vec<WindowKey> = (0..3)
        .map(|i| WindowKey::new(tenant.to_owned(), format!("subject-{i}")))
        .collect();
    let mut transcript = Vec::new();
    let mut admitted = Vec::new();
    let mut now = START;
    for (step, op) in ops.iter().enumerate() {
        match *op {
            Op::Check {
                advance,
                subject,
                cost,
            } => {
                now += advance;
                clock.set(now);
                let key = &keys[usize::from(subject)];
                let d = limiter
                    .check(key, cost)
                    .await
                    .unwrap_or_else(|e| panic!("{}: step {step}: {e}", backend.name()));
                assert!(
                    !matches!(d.source(), DecisionSource::Fallback(_)),
                    "{} {}: step {step} answered by the fallback: {d:?}",
                    backend.name(),
                    policy.name()
                );
                if d.allowed() {
                    admitted.push(Admitted {
                        at: d.timestamp_micros(),
                        cost,
                        subject,
                        fits: d.quotas().iter().map(|q| q.allowed()).collect(),
                    });
                }
                transcript.push(format!("{step} s{subject} c{cost}: {}", describe(&d)));
            }
            Op::RefundAll => {
                let returned = limiter.refund_leases().await;
                transcript.push(format!("{step} refund: {returned}"));
            }
        }
    }
    // At the end every held unit goes back, and every quota's window reads
    // the same on every store.
    let returned = limiter.refund_leases().await;
    transcript.push(format!("end refund: {returned}"));
    let stats = limiter.lease_stats().unwrap();
    assert_eq!(
        stats.granted,
        stats.spent + stats.refunded + stats.expired_unspent,
        "{}: {stats:?}",
        backend.name()
    );
    for key in &keys {
        for q in policy.quotas() {
            // A quota's window is the one the policy's key form names:
            // peek through the whole policy and read that quota's state.
            let request = CheckRequest::new(key, policy, Cost::ONE);
            let d = store.peek(&mut Guard::bare(), request).await.unwrap();
            let state = d
                .quotas()
                .iter()
                .find(|s| s.quota().name() == q.name())
                .unwrap();
            transcript.push(format!(
                "end {} {}: remaining {}",
                String::from_utf8_lossy(key.subject()),
                q.name(),
                state.remaining()
            ));
        }
    }
    (transcript, admitted)
}

/// Units admitted (or, for a shadow quota, that it would have admitted)
/// never exceed the quota's bound, by its algorithm's definition.
fn check_bound(quota: &Quota, times: &[(u64, u32)], what: &str) {
    let w = quota.window_micros();
    let l = u64::from(quota.limit());
    match quota.algorithm() {
        Algorithm::SlidingLog | Algorithm::SlidingCounter { .. } => {
            for (j, &(tj, _)) in times.iter().enumerate() {
                let units: u64 = times[..=j]
                    .iter()
                    .filter(|(t, _)| *t + w > tj)
                    .map(|(_, c)| u64::from(*c))
                    .sum();
                assert!(
                    units <= l,
                    "{what}: {units} units in the window ending {tj}"
                );
            }
        }
        Algorithm::FixedWindow => {
            for &(tj, _) in times {
                let units: u64 = times
                    .iter()
                    .filter(|(t, _)| t / w == tj / w)
                    .map(|(_, c)| u64::from(*c))
                    .sum();
                assert!(units <= l, "{what}: {units} units in the window of {tj}");
            }
        }
        Algorithm::Gcra => {
            let t = quota.emission_interval_micros();
            let burst = u64::from(quota.capacity());
            for i in 0..times.len() {
                let mut units = 0u64;
                for j in i..times.len() {
                    units += u64::from(times[j].1);
                    assert!(
                        units <= burst + (times[j].0 - times[i].0) / t,
                        "{what}: {units} units within {} µs",
                        times[j].0 - times[i].0
                    );
                }
            }
        }
        _ => unreachable!(),
    }
}

/// Defect 1: the same checks, the same decisions, on every store; leases
/// with shadow quotas never reach the fallback; every bound holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_with_shadow_quotas_decide_alike_on_every_store() {
    let backends = Backend::all();
    let mut shadow_denials_from_leases = 0;
    let mut summary = Vec::new();
    for (a, algorithm) in ALGORITHMS.iter().enumerate() {
        for (p, policy) in policies(algorithm).into_iter().enumerate() {
            let seed = 0x9E37_79B9_7F4A_7C15 ^ ((a as u64) << 8 | p as u64);
            let ops = sequence(seed, 160);
            let tenant = unique("tenant");
            let mut transcripts = Vec::new();
            let mut first_admitted = None;
            for backend in &backends {
                let (transcript, admitted) = run(backend, &policy, &ops, &tenant).await;
                transcripts.push((backend.name(), transcript));
                first_admitted.get_or_insert(admitted);
            }
            let (reference_name, reference) = &transcripts[0];
            for (name, transcript) in &transcripts[1..] {
                for (i, (mine, theirs)) in reference.iter().zip(transcript).enumerate() {
                    assert_eq!(
                        mine,
                        theirs,
                        "{algorithm:?} {}: {reference_name} and {name} differ at line {i} (seed {seed:#x})\n{}",
                        policy.name(),
                        reference[i.saturating_sub(5)..=i].join("\n")
                    );
                }
                assert_eq!(reference.len(), transcript.len());
            }
            let admitted = first_admitted.unwrap();
            assert!(!admitted.is_empty());
            for (i, q) in policy.quotas().iter().enumerate() {
                let subjects: Vec<Option<u8>> = match q.scope() {
                    Scope::Tenant => vec![None],
                    _ => (0..3).map(Some).collect(),
                };
                for subject in subjects {
                    let times: Vec<(u64, u32)> = admitted
                        .iter()
                        .filter(|x| subject.is_none_or(|s| x.subject == s))
                        .filter(|x| x.fits[i])
                        .map(|x| (x.at, x.cost))
                        .collect();
                    check_bound(
                        q,
                        &times,
                        &format!("{algorithm:?} {} {} {subject:?}", policy.name(), q.name()),
                    );
                }
            }
            let leased_denials = reference
                .iter()
                .filter(|l| l.contains("allowed=true source=lease"))
                .filter(|l| l.contains(":0:"))
                .count();
            shadow_denials_from_leases += leased_denials;
            let admitted_units: u32 = admitted.iter().map(|x| x.cost).sum();
            summary.push(format!(
                "{:>22} {:>11}: {} checks, {admitted_units} units admitted, {leased_denials} leased admissions with a shadow denial",
                format!("{algorithm:?}"),
                policy.name(),
                reference.len()
            ));
        }
    }
    eprintln!("{}", summary.join("\n"));
    assert!(
        shadow_denials_from_leases > 0,
        "no leased admission reported a shadow quota's would-be denial"
    );
}

/// Lease records in the store's `:lr` hash of `prefix` (fields other than
/// `seq`, `ld` and `exp`), and the key's node and name.
fn records(conns: &mut [redis::Connection], prefix: &str) -> Option<(usize, String, u64)> {
    for (i, conn) in conns.iter_mut().enumerate() {
        let mut cursor = 0u64;
        for _ in 0..100_000 {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(format!("{prefix}*:lr"))
                .arg("COUNT")
                .arg(1000)
                .query(conn)
                .unwrap();
            if let Some(key) = keys.into_iter().next() {
                let fields: u64 = redis::cmd("HLEN").arg(&key).query(conn).unwrap();
                return Some((i, key, fields.saturating_sub(3)));
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
    }
    None
}

/// Lease records in the `:lr` hash `key` on `conn` (fields other than `seq`,
/// `ld` and `exp`; 0 once the hash is gone).
fn record_count(conn: &mut redis::Connection, key: &str) -> u64 {
    let fields: u64 = redis::cmd("HLEN").arg(key).query(conn).unwrap();
    fields.saturating_sub(3)
}

/// How many expired records are built up in one key.
const EXPIRED: u64 = 10_500;

/// Defect 2: more than 10,000 expired lease records in one key. Every later
/// reserve and refund succeeds; each call drops a bounded batch of them;
/// after a bounded number of calls none is left, and the keys still carry
/// TTLs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_expired_lease_records_never_fail_a_call() {
    for backend in Backend::all() {
        let name = backend.name();
        let prefix = unique("records");
        let clock = ManualClock::new(START);
        let (store, _) = backend.store(&prefix, &clock);
        let mut conns = backend.connections();
        // A window of 1 s from START; each lease of 1 unit ends with it.
        let policy = Policy::from(quota("100000/1s fixed-window", "wide"));
        let key = WindowKey::new("records", "hot");
        let reserve =
            |want: u32| ReserveRequest::new(&key, &policy, want, 1, Duration::from_secs(1));
        // Real reservations, 64 in flight (one explicit time: the records
        // are told apart by their sequence numbers).
        let leases: Vec<Lease> = futures_util::stream::iter(0..EXPIRED)
            .map(|_| {
                let store = store.clone();
                let request = reserve(1);
                async move {
                    let reserved = store.reserve(&mut Guard::bare(), request).await;
                    reserved.unwrap().lease
                }
            })
            .buffer_unordered(64)
            .map(|lease| lease.unwrap_or_else(|| panic!("{name}: a lease")))
            .collect()
            .await;
        assert!(leases.iter().all(|l| l.deadline_micros == START + S));
        let early: Vec<Lease> = leases.into_iter().take(3).collect();
        let found = records(&mut conns, &prefix);
        if let Some((_, _, n)) = &found {
            assert_eq!(*n, EXPIRED, "{name}");
        }
        // The window is over: every record has stopped counting.
        let mut now = START + S + 1;
        clock.set(now);
        let mut before = EXPIRED;
        let mut calls = 0;
        let mut live: Vec<Lease> = Vec::new();
        loop {
            calls += 1;
            assert!(
                calls <= 400,
                "{name}: still {before} records after {calls} calls"
            );
            now += 1;
            clock.set(now);
            let added = if calls % 3 == 0 {
                // A refund of an expired lease: nothing comes back, nothing fails.
                let old = &early[calls % early.len()];
                let returned = store
                    .refund(
                        &mut Guard::bare(),
                        RefundRequest::new(&key, &policy, old, 1),
                    )
                    .await
                    .unwrap_or_else(|e| panic!("{name}: refund after {calls} calls: {e}"));
                assert_eq!(returned, 0, "{name}: an expired lease returns nothing");
                0
            } else if calls % 3 == 1 {
                let r = store
                    .reserve(&mut Guard::bare(), reserve(2))
                    .await
                    .unwrap_or_else(|e| panic!("{name}: reserve after {calls} calls: {e}"));
                live.push(r.lease.unwrap_or_else(|| panic!("{name}: a lease")));
                1
            } else {
                // A refund of a live lease: exact.
                let lease = live.pop().unwrap();
                let returned = store
                    .refund(
                        &mut Guard::bare(),
                        RefundRequest::new(&key, &policy, &lease, lease.granted),
                    )
                    .await
                    .unwrap_or_else(|e| panic!("{name}: refund after {calls} calls: {e}"));
                assert_eq!(
                    returned, lease.granted,
                    "{name}: a live lease comes back whole"
                );
                0
            };
            let Some((node, lr, _)) = &found else {
                if calls >= 30 {
                    break;
                }
                continue;
            };
            let after = record_count(&mut conns[*node], lr);
            let dropped = (before + added).saturating_sub(after);
            assert!(
                dropped <= 1_000,
                "{name}: one call dropped {dropped} records: unbounded work"
            );
            before = after;
            if after <= live.len() as u64 {
                break;
            }
        }
        if let Some((node, lr, _)) = found {
            let conn = &mut conns[node];
            let lx = format!("{}:lx", lr.strip_suffix(":lr").unwrap());
            for k in [&lr, &lx] {
                // -2: gone (an empty set is deleted); -1 would be a key
                // without a TTL.
                let ttl: i64 = redis::cmd("PTTL").arg(k).query(conn).unwrap();
                assert!(ttl > 0 || ttl == -2, "{name}: {k} has no TTL ({ttl})");
            }
            eprintln!("{name}: {EXPIRED} expired records gone after {calls} calls");
        }
        // The window's count is what the live leases hold.
        let d = store
            .peek(
                &mut Guard::bare(),
                CheckRequest::new(&key, &policy, Cost::ONE),
            )
            .await
            .unwrap();
        let held: u32 = live.iter().map(|l| l.granted).sum();
        assert_eq!(d.remaining(), 100_000 - held, "{name}");
    }
}

/// Defect 2, the refund path: a sliding log with more than 10,000 members at
/// a lease's timestamp (written by something else: an older version, a
/// restore) is refunded without failing, exactly, and nothing else in the
/// log is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_reads_a_bounded_part_of_a_crowded_log() {
    for backend in Backend::all().into_iter().skip(1) {
        let name = backend.name();
        let prefix = unique("crowded");
        let clock = ManualClock::new(START);
        let (store, _) = backend.store(&prefix, &clock);
        let mut conns = backend.connections();
        let policy = Policy::from(quota("100000/1m", "log"));
        let key = WindowKey::new("crowded", "hot");
        let lease = store
            .reserve(
                &mut Guard::bare(),
                ReserveRequest::new(&key, &policy, 10, 1, Duration::from_secs(1)),
            )
            .await
            .unwrap()
            .lease
            .unwrap();
        assert_eq!(lease.granted, 10);
        let at = lease.deadline_micros;
        // The log key: the sorted set under the prefix that is not the
        // leases' own (`:lx`).
        let mut found = None;
        for (i, conn) in conns.iter_mut().enumerate() {
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(format!("{prefix}*"))
                .query(conn)
                .unwrap();
            for k in keys {
                let kind: String = redis::cmd("TYPE").arg(&k).query(conn).unwrap();
                if kind == "zset" && !k.ends_with(":lx") {
                    assert!(found.is_none(), "{name}: two logs");
                    found = Some((i, k));
                }
            }
        }
        let (node, log) = found.unwrap_or_else(|| panic!("{name}: no log key"));
        let conn = &mut conns[node];
        for chunk in (11..10_011u64).collect::<Vec<_>>().chunks(1_000) {
            let mut cmd = redis::cmd("ZADD");
            cmd.arg(&log);
            for units in chunk {
                cmd.arg(at).arg(format!("{at}:{units}"));
            }
            let _: u64 = cmd.query(conn).unwrap();
        }
        let units_at = |conn: &mut redis::Connection| -> (u64, u64) {
            let members: Vec<String> = redis::cmd("ZRANGEBYSCORE")
                .arg(&log)
                .arg(at)
                .arg(at)
                .query(conn)
                .unwrap();
            let units = members
                .iter()
                .map(|m| m.rsplit(':').next().unwrap().parse::<u64>().unwrap())
                .sum();
            (members.len() as u64, units)
        };
        let (members, before) = units_at(conn);
        assert_eq!(members, 10_001);
        let returned = store
            .refund(
                &mut Guard::bare(),
                RefundRequest::new(&key, &policy, &lease, 10),
            )
            .await
            .unwrap_or_else(|e| panic!("{name}: refund of a crowded log: {e}"));
        assert_eq!(returned, 10, "{name}");
        let (_, after) = units_at(conn);
        assert_eq!(
            before - after,
            10,
            "{name}: exactly the lease's units came back"
        );
        let again = store
            .refund(
                &mut Guard::bare(),
                RefundRequest::new(&key, &policy, &lease, 10),
            )
            .await
            .unwrap();
        assert_eq!(again, 0, "{name}: once");
    }
}
