//! Connection seats (the `tower_window::conn::Backend` trait):
//! grants under subject and tenant caps, renewals, releases (late and
//! double ones too), expiries, nodes that stop, presence counts and
//! fencing tokens, from two "nodes" with different lease TTLs (a rolling
//! change of `--connection-lease-ttl`), on the subject form and the tenant
//! form of the keys.
//!
//! The model keeps every lease with its expiry in each set that holds it
//! (the subject's, and in the tenant form the tenant's), and decides by the
//! store contract and invariant 9:
//!
//! * a grant first drops the expired leases of the sets it looks at, then
//!   admits below each cap (live leases only count), else answers the cap,
//!   the count and the wait until the oldest live lease expires;
//! * a renewal extends each live lease to `now + ttl` and answers whether
//!   it was live in every set; a lease found expired is dropped, never
//!   revived; a lease gone is reported to its node, which stops renewing it;
//! * a release answers whether the lease was in the subject's set (for a
//!   lease already expired either answer is allowed: a store may have
//!   dropped it); presence counts the live leases;
//! * fencing tokens of a subject only grow, and are at least the clock;
//! * a subject's set (a Redis key) lives at least as long as its longest
//!   live lease, whatever TTLs the nodes use: checked on the Redis stores
//!   with `PTTL` after every step (defect 5 of issue 22), with the real time
//!   the case took as slack (a Redis key counts down in real time).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use tower_window::conn::{self, CapScope, GrantReply, GrantRequest, SeatRef};
use tower_window::store::Guard;
use tower_window::{Clock, WindowKey};

use super::backends::{Backends, STORES};
use super::runner::{skipped, Capability, Outcome, Tally};
use crate::conformance::START;

const S: u64 = 1_000_000;
const SUBJECTS: u8 = 3;
/// Lease TTLs a node may use (µs): both below and above the 60 s least key
/// TTL an explicit-clock Redis store writes.
const TTLS: [u64; 4] = [2 * S, 15 * S, 90 * S, 180 * S];

/// One step of a connections case.
#[derive(Clone)]
pub enum Op {
    /// The clock moves by this many µs (negative: back).
    Step(i64),
    /// `node` asks for a lease of `subject`.
    Grant {
        /// The node.
        node: usize,
        /// The subject.
        subject: u8,
    },
    /// `node`'s heartbeat: renews every lease it holds.
    Renew(usize),
    /// The lease granted `n`-th (modulo) is released (it may be released,
    /// lost or expired already).
    Release(usize),
    /// How many live leases `subject` has.
    Presence(u8),
    /// `node` stops: it renews and releases nothing any more.
    Crash(usize),
}

impl fmt::Debug for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Step(us) => write!(f, "Step({us} µs)"),
            Self::Grant { node, subject } => write!(f, "Grant(node {node}, s{subject})"),
            Self::Renew(node) => write!(f, "Renew(node {node})"),
            Self::Release(n) => write!(f, "Release(lease #{n})"),
            Self::Presence(subject) => write!(f, "Presence(s{subject})"),
            Self::Crash(node) => write!(f, "Crash(node {node})"),
        }
    }
}

/// A connections case.
#[derive(Debug, Clone)]
pub struct Case {
    /// Leases count against a per-tenant cap too (the tenant form).
    pub tenant_capped: bool,
    /// The cap per subject (0: none).
    pub per_subject: u32,
    /// The cap per tenant (0: none; the tenant form only).
    pub per_tenant: u32,
    /// The lease TTL of node 0 and node 1 (µs).
    pub ttls: [u64; 2],
    /// What happens.
    pub ops: Vec<Op>,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => prop_oneof![
            4 => 0i64..(S as i64),
            3 => 0i64..(20 * S as i64),
            2 => 0i64..(200 * S as i64),
            1 => -(5 * S as i64)..0,
        ]
        .prop_map(Op::Step),
        8 => (0..2usize, 0..SUBJECTS).prop_map(|(node, subject)| Op::Grant { node, subject }),
        3 => (0..2usize).prop_map(Op::Renew),
        3 => (0..64usize).prop_map(Op::Release),
        2 => (0..SUBJECTS).prop_map(Op::Presence),
        1 => (0..2usize).prop_map(Op::Crash),
    ]
}

/// One lease in the model.
#[derive(Debug, Clone)]
struct LeaseM {
    id: String,
    node: usize,
    subject: u8,
    /// Its expiry in the subject's set (None: not in it).
    in_subject: Option<u64>,
    /// Its expiry in the tenant's set (the tenant form).
    in_tenant: Option<u64>,
    /// The node still holds it (renews it).
    held: bool,
}

/// The capability.
pub struct Conn;

fn live(expiry: Option<u64>, now: u64) -> bool {
    expiry.is_some_and(|e| e > now)
}

impl Capability for Conn {
    type Case = Case;
    const NAME: &'static str = "conn";
    const CI_CASES: u64 = 64;

    fn strategy() -> BoxedStrategy<Case> {
        (
            any::<bool>(),
            0..4u32,
            prop_oneof![Just(0u32), Just(2), Just(4)],
            0..TTLS.len(),
            0..TTLS.len(),
            proptest::collection::vec(op(), 1..160),
        )
            .prop_map(|(tenant_capped, per_subject, per_tenant, a, b, ops)| Case {
                tenant_capped,
                per_subject,
                per_tenant: if tenant_capped { per_tenant } else { 0 },
                ttls: [TTLS[a], TTLS[b]],
                ops,
            })
            .boxed()
    }

    async fn run(case: &Case, backends: &Backends, run: u64, tally: &mut Tally) -> Outcome {
        let clock = &backends.clock;
        clock.set(START);
        let real_start = Instant::now();
        let stores: [Arc<dyn conn::Backend>; 3] = [
            Arc::new(backends.memory()),
            backends.redis.clone(),
            backends.cluster.clone(),
        ];
        let tenant = backends.namespace(run);
        let keys: Vec<WindowKey> = (0..SUBJECTS)
            .map(|s| WindowKey::new(tenant.clone(), format!("s{s}")))
            .collect();
        let form = case.tenant_capped;
        let mut leases: Vec<LeaseM> = Vec::new();
        let mut fences: [HashMap<u8, u64>; 3] = Default::default();
        let mut high_water = START;
        for (i, op) in case.ops.iter().enumerate() {
            let now = clock.now_micros();
            high_water = high_water.max(now);
            let at = format!(
                "op {i} {op:?} at START + {} ms",
                (now as i64 - START as i64) / 1000
            );
            match *op {
                Op::Step(us) => clock.set(now.saturating_add_signed(us)),
                Op::Grant { node, subject } => {
                    let ttl = case.ttls[node];
                    let id = format!("n{node}:{}", leases.len());
                    // The model: purge the sets looked at, then the caps.
                    for l in leases.iter_mut().filter(|l| l.subject == subject) {
                        if l.in_subject.is_some_and(|e| e <= now) {
                            l.in_subject = None;
                        }
                    }
                    let in_subject: Vec<u64> = leases
                        .iter()
                        .filter(|l| l.subject == subject)
                        .filter_map(|l| l.in_subject)
                        .collect();
                    let count = in_subject.len() as u32;
                    let want = if case.per_subject > 0 && count >= case.per_subject {
                        Some((
                            CapScope::Subject,
                            count,
                            in_subject.iter().min().copied().unwrap_or(now) - now,
                        ))
                    } else if form {
                        for l in leases.iter_mut() {
                            if l.in_tenant.is_some_and(|e| e <= now) {
                                l.in_tenant = None;
                            }
                        }
                        let in_tenant: Vec<u64> =
                            leases.iter().filter_map(|l| l.in_tenant).collect();
                        let tcount = in_tenant.len() as u32;
                        (case.per_tenant > 0 && tcount >= case.per_tenant).then(|| {
                            (
                                CapScope::Tenant,
                                tcount,
                                in_tenant.iter().min().copied().unwrap_or(now) - now,
                            )
                        })
                    } else {
                        None
                    };
                    let key = &keys[usize::from(subject)];
                    for (s, store) in stores.iter().enumerate() {
                        tally.op(STORES[s]);
                        let request = GrantRequest::new(
                            SeatRef::new(key, id.as_bytes(), form),
                            Duration::from_micros(ttl),
                            case.per_subject,
                            case.per_tenant,
                        );
                        let got = store
                            .grant(&mut Guard::bare(), request)
                            .await
                            .map_err(|e| format!("{at}: {}: {e}", STORES[s]))?;
                        match (got, want) {
                            (GrantReply::Granted { fence, count: c }, None) => {
                                if c != count + 1 {
                                    return Err(format!(
                                        "{at}: {} granted with count {c}, the model {}",
                                        STORES[s],
                                        count + 1
                                    ));
                                }
                                let last = fences[s].insert(subject, fence).unwrap_or(0);
                                if fence <= last || fence < now {
                                    return Err(format!(
                                        "{at}: {} gave fence {fence} after {last} (now {now}): fences only grow and are at least the clock",
                                        STORES[s]
                                    ));
                                }
                            }
                            (
                                GrantReply::Denied {
                                    scope,
                                    count: c,
                                    retry_after,
                                },
                                Some((ws, wc, wr)),
                            ) if scope == ws
                                && c == wc
                                && retry_after == Duration::from_micros(wr) => {}
                            (got, want) => {
                                return Err(format!(
                                    "{at}: {} answered {got:?}, the model {}",
                                    STORES[s],
                                    match want {
                                        None => format!("granted (count {})", count + 1),
                                        Some((scope, c, wait)) => format!("denied by the {scope:?} cap at {c}, retry after {wait} µs"),
                                    }
                                ));
                            }
                        }
                    }
                    match want {
                        None => {
                            leases.push(LeaseM {
                                id,
                                node,
                                subject,
                                in_subject: Some(now + ttl),
                                in_tenant: form.then_some(now + ttl),
                                held: true,
                            });
                            tally.saw("granted");
                        }
                        Some((CapScope::Subject, ..)) => tally.saw("denied by subject cap"),
                        Some(_) => tally.saw("denied by tenant cap"),
                    }
                }
                Op::Renew(node) => {
                    let ttl = case.ttls[node];
                    let held: Vec<usize> = (0..leases.len())
                        .filter(|&j| leases[j].node == node && leases[j].held)
                        .collect();
                    if held.is_empty() {
                        continue;
                    }
                    let mut want = Vec::new();
                    for &j in &held {
                        let l = &mut leases[j];
                        let alive_s = live(l.in_subject, now);
                        let in_t = live(l.in_tenant, now);
                        let alive_t = !form || in_t;
                        for (slot, alive) in
                            [(&mut l.in_subject, alive_s), (&mut l.in_tenant, in_t)]
                        {
                            if alive {
                                *slot = Some(now + ttl);
                            } else {
                                *slot = None;
                            }
                        }
                        want.push(alive_s && alive_t);
                    }
                    for (s, store) in stores.iter().enumerate() {
                        tally.op(STORES[s]);
                        // One call per partition, as a heartbeat does.
                        let mut by_partition: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
                        for (k, &j) in held.iter().enumerate() {
                            let key = &keys[usize::from(leases[j].subject)];
                            by_partition
                                .entry(store.seat_partition(key, form))
                                .or_default()
                                .push(k);
                        }
                        let mut got = vec![false; held.len()];
                        for batch in by_partition.values() {
                            let refs: Vec<SeatRef<'_>> = batch
                                .iter()
                                .map(|&k| {
                                    let l = &leases[held[k]];
                                    SeatRef::new(
                                        &keys[usize::from(l.subject)],
                                        l.id.as_bytes(),
                                        form,
                                    )
                                })
                                .collect();
                            let alive = store
                                .renew(&mut Guard::bare(), &refs, Duration::from_micros(ttl))
                                .await
                                .map_err(|e| format!("{at}: {}: renew: {e}", STORES[s]))?;
                            if alive.len() != batch.len() {
                                return Err(format!(
                                    "{at}: {} answered {} of {} renewals",
                                    STORES[s],
                                    alive.len(),
                                    batch.len()
                                ));
                            }
                            for (&k, a) in batch.iter().zip(alive) {
                                got[k] = a;
                            }
                        }
                        if got != want {
                            let ids: Vec<&str> =
                                held.iter().map(|&j| leases[j].id.as_str()).collect();
                            return Err(format!(
                                "{at}: {} renewed {ids:?} as {got:?}, the model {want:?}",
                                STORES[s]
                            ));
                        }
                    }
                    for (&j, alive) in held.iter().zip(&want) {
                        if !alive {
                            // Lost: reported once, never renewed again.
                            leases[j].held = false;
                            tally.saw("renewal found the lease lost");
                        } else {
                            tally.saw("renewed");
                        }
                    }
                }
                Op::Release(n) => {
                    if leases.is_empty() {
                        continue;
                    }
                    let j = n % leases.len();
                    let l = leases[j].clone();
                    let want: &[bool] = match l.in_subject {
                        None => &[false],
                        Some(e) if e > now => &[true],
                        Some(_) => &[true, false],
                    };
                    let key = &keys[usize::from(l.subject)];
                    for (s, store) in stores.iter().enumerate() {
                        tally.op(STORES[s]);
                        let got = store
                            .release(&mut Guard::bare(), SeatRef::new(key, l.id.as_bytes(), form))
                            .await
                            .map_err(|e| format!("{at}: {}: release: {e}", STORES[s]))?;
                        if !want.contains(&got) {
                            return Err(format!(
                                "{at}: {} released {} answering {got}, the model {want:?}",
                                STORES[s], l.id
                            ));
                        }
                    }
                    let l = &mut leases[j];
                    tally.saw(if live(l.in_subject, now) {
                        "released a live lease"
                    } else {
                        "released a gone lease"
                    });
                    l.in_subject = None;
                    l.in_tenant = None;
                    l.held = false;
                }
                Op::Presence(subject) => {
                    let want = leases
                        .iter()
                        .filter(|l| l.subject == subject && live(l.in_subject, now))
                        .count() as u32;
                    let key = &keys[usize::from(subject)];
                    for (s, store) in stores.iter().enumerate() {
                        tally.op(STORES[s]);
                        let got = store
                            .presence(&mut Guard::bare(), key, form)
                            .await
                            .map_err(|e| format!("{at}: {}: presence: {e}", STORES[s]))?;
                        if got != want {
                            return Err(format!(
                                "{at}: {} counts {got} live leases of s{subject}, the model {want}",
                                STORES[s]
                            ));
                        }
                    }
                    tally.saw(if want > 0 {
                        "presence online"
                    } else {
                        "presence offline"
                    });
                }
                Op::Crash(node) => {
                    for l in leases.iter_mut().filter(|l| l.node == node) {
                        l.held = false;
                    }
                    tally.saw("crash");
                }
            }
            // The sets outlive their longest live lease (Redis keys count
            // down in real time; skipped while the clock is behind its
            // high-water mark: no key TTL can follow a clock going back).
            let now = clock.now_micros();
            if now < high_water || skipped("set-ttl") {
                continue;
            }
            let slack_ms = real_start.elapsed().as_millis() as i64 + 250;
            let mut sets: Vec<(String, u64)> = Vec::new();
            for subject in 0..SUBJECTS {
                let longest = leases
                    .iter()
                    .filter(|l| l.subject == subject)
                    .filter_map(|l| l.in_subject)
                    .filter(|&e| e > now)
                    .max();
                if let Some(e) = longest {
                    let name = if form {
                        format!("tw:{{@{tenant}}}:#conn:s{subject}")
                    } else {
                        format!("tw:{{{tenant}:s{subject}}}:#conn")
                    };
                    sets.push((name, e - now));
                }
            }
            if form {
                if let Some(e) = leases
                    .iter()
                    .filter_map(|l| l.in_tenant)
                    .filter(|&e| e > now)
                    .max()
                {
                    sets.push((format!("tw:{{@{tenant}}}:#conn"), e - now));
                }
            }
            for s in 1..3 {
                let mut admin = backends.admin(s);
                for (name, remaining) in &sets {
                    let mut cmd = redis::cmd("PTTL");
                    cmd.arg(name);
                    let pttl: i64 = admin
                        .query(&cmd)
                        .await
                        .map_err(|e| format!("{at}: PTTL: {e}"))?;
                    let needed = (remaining / 1000) as i64;
                    if pttl < 0 || pttl + slack_ms < needed {
                        return Err(format!(
                            "{at}: on {} the set {name} expires in {pttl} ms, but a live lease in it runs {needed} ms more",
                            STORES[s]
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    fn coverage(tally: &Tally, _cases: u64) -> Outcome {
        for what in [
            "granted",
            "denied by subject cap",
            "denied by tenant cap",
            "renewed",
            "renewal found the lease lost",
            "released a live lease",
            "released a gone lease",
            "presence online",
            "presence offline",
        ] {
            if tally.count(what) < 3 {
                return Err(format!("{what} (seen {} times)", tally.count(what)));
            }
        }
        Ok(())
    }
}
