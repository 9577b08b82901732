//! The store's own faults under concurrent load (issue 22): a Redis Cluster
//! primary killed and its replica promoted (with and without
//! `cluster-require-full-coverage`), the dead primary back as a replica, a
//! manual `CLUSTER FAILOVER`, a resharding with `redis-cli --cluster
//! reshard`, and a single Redis restarted.
//!
//! Two limiter "nodes", each with its own store connection as two gateway
//! processes would have, check keys on every primary from several tasks
//! each ([`Load`]) while the test breaks the store. Every scenario then
//! asks of the decisions:
//!
//! - every key is decided by the store again, on every node, within
//!   [`RECOVERY`] (2 s) of
//!   the store being whole again (the cluster reporting `ok` on every live
//!   node with every slot served);
//! - keys of primaries the fault did not touch never leave the store (with
//!   `cluster-require-full-coverage yes`, Redis's default, every node
//!   refuses every key with `CLUSTERDOWN` while the failed primary's slots
//!   have no primary: there, they leave only in that interval);
//! - no decision takes longer than the time budget plus a small constant;
//! - the global bound holds: over-admission is at most what the store
//!   forgot (acknowledged writes a promoted replica never received), which
//!   is printed, and none where nothing was lost; no charge is applied
//!   twice.
//!
//! The limiters are configured as the gateway's: a 50 ms budget, the
//! default breaker and retries, fail-closed (so every admission is the
//! store's). The load is steady, not saturating: 3 tasks per node, each
//! pausing between checks. Scenarios run one at a time (each starts its
//! own servers). Every wait is bounded.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::thread::sleep;
use std::time::Duration;

use tower_window::fallback::FailClosed;
use tower_window::store::redis::redis_key;
use tower_window::{
    DecisionSource, FallbackReason, Limiter, Policy, Quota, RedisStore, Store, WindowKey,
};
use tower_window_tests::fault_load::{Load, Record, Run, Target};
use tower_window_tests::redis_cluster::{key_slot, query, RedisCluster};
use tower_window_tests::redis_server::RedisServer;

/// Each decision's time budget (the gateway's default).
const BUDGET: Duration = Duration::from_millis(50);
/// What a decision may take beyond the budget (scheduling on a busy box).
const LATENCY_SLACK: Duration = Duration::from_millis(250);
/// Every key is decided by the store again this soon after the store is
/// whole.
const RECOVERY: Duration = Duration::from_secs(2);
/// How long the load runs on after the recovery window.
const OBSERVE: Duration = Duration::from_secs(3);
/// Load before the fault.
const WARMUP: Duration = Duration::from_millis(1500);
/// Limiter nodes, each with its own store connection.
const NODES: usize = 2;
/// Keys that are never denied, per primary.
const FREE_KEYS: usize = 8;
/// Keys that run out of quota during the run, per primary.
const BOUND_KEYS: usize = 2;
const BOUND_LIMIT: u32 = 30;
/// The default key prefix.
const PREFIX: &str = "tw:";

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn free_policy() -> Policy {
    Policy::from(
        "1000000/1h"
            .parse::<Quota>()
            .unwrap()
            .named("free")
            .unwrap(),
    )
}

fn bound_policy() -> Policy {
    let quota = format!("{BOUND_LIMIT}/1h").parse::<Quota>().unwrap();
    Policy::from(quota.named("bound").unwrap())
}

fn limit_of(policy: &Policy) -> u32 {
    policy.first().limit()
}

/// A gateway-like limiter: the default breaker, the budget, fail-closed (the fallback admits nothing, so every admission is
/// the store's). Node 1 has no local tier, so it keeps asking the store for
/// keys that are out of quota (a promoted replica that forgot admissions
/// would admit them again: the bound check sees it).
fn node(store: RedisStore, index: usize) -> Limiter {
    let store = Store::builder(store).timeout(BUDGET).build();
    let builder = Limiter::builder(store, free_policy()).fallback(FailClosed::new());
    if index == 1 {
        builder.local_capacity(0).build()
    } else {
        builder.build()
    }
}

/// `FREE_KEYS` + `BOUND_KEYS` keys on each of the cluster's primaries, by
/// the slot their keys hash to; a key's group is its primary's node index.
fn targets_on(
    cluster: &RedisCluster,
    primaries: &[usize],
    pick: impl Fn(u16) -> bool,
) -> Vec<Target> {
    let mut targets = Vec::new();
    for (policy, per_primary) in [(free_policy(), FREE_KEYS), (bound_policy(), BOUND_KEYS)] {
        let mut found = vec![0; cluster.nodes().len()];
        for i in 0..200_000 {
            let key = WindowKey::new("t", format!("{}-{i}", policy.first().name()));
            let slot = key_slot(&redis_key(PREFIX, &key, &policy, policy.first()));
            if !pick(slot) {
                continue;
            }
            let primary = cluster.owner(primaries[0], slot);
            if found[primary] < per_primary {
                found[primary] += 1;
                targets.push(Target {
                    key,
                    policy: policy.clone(),
                    group: primary,
                });
            }
            if primaries.iter().all(|&p| found[p] == per_primary) {
                break;
            }
        }
        assert!(
            primaries.iter().all(|&p| found[p] == per_primary),
            "keys on every primary: {found:?}"
        );
    }
    targets
}

fn cluster_nodes(cluster: &RedisCluster) -> Vec<Limiter> {
    (0..NODES)
        .map(|i| node(RedisStore::cluster(cluster.urls()).unwrap(), i))
        .collect()
}

fn is_fallback(record: &Record) -> bool {
    matches!(record.source, DecisionSource::Fallback(_))
}

/// The share of decisions that may time out on a healthy store because
/// the machine is busy (two cores, six servers and the load), as one in
/// this many. Any other fallback reason, or more timeouts, fails.
const NOISE: usize = 200;

/// Asserts that `fallbacks` (of `total` decisions, `what`) are only the
/// noise of a busy machine: a few isolated time-outs, no other reason.
fn assert_noise(name: &str, fallbacks: &[&Record], total: usize, what: &str, timeline: &str) {
    let hard: Vec<&&Record> = fallbacks
        .iter()
        .filter(|r| r.source != DecisionSource::Fallback(FallbackReason::Timeout))
        .collect();
    assert!(
        hard.is_empty(),
        "{name}: {} fallback decisions {what}, first {:?}\n{timeline}",
        hard.len(),
        hard.first()
    );
    eprintln!(
        "{name}: {} of {total} decisions {what} timed out",
        fallbacks.len()
    );
    assert!(
        fallbacks.len() * NOISE <= total,
        "{name}: {} of {total} decisions {what} timed out, first {:?}\n{timeline}",
        fallbacks.len(),
        fallbacks.first()
    );
}

/// Asserts what every scenario must show; `quiet` are the groups whose
/// keys never leave the store, `windows` the intervals (from, whole) after
/// each of which every key is decided by the store within [`RECOVERY`],
/// and the groups that may have lost acknowledged writes.
fn check(
    name: &str,
    run: &Run,
    targets: &[Target],
    quiet: &[usize],
    windows: &[(Duration, Duration)],
    may_forget: &[usize],
) {
    let timeline = run.timeline();
    eprintln!(
        "{name}: {} decisions; windows {windows:?}\n{timeline}",
        run.records.len()
    );
    // Every key decided by the store within RECOVERY of each window's end,
    // until the next window starts.
    for (i, (_, whole)) in windows.iter().enumerate() {
        let from = *whole + RECOVERY;
        let to = windows.get(i + 1).map_or(Duration::MAX, |next| next.0);
        let after: Vec<&Record> = run
            .records
            .iter()
            .filter(|r| (from..to).contains(&r.started))
            .collect();
        let late: Vec<&Record> = after.iter().copied().filter(|r| is_fallback(r)).collect();
        assert_noise(
            name,
            &late,
            after.len(),
            &format!("more than {RECOVERY:?} after the store was whole at {whole:?}"),
            &timeline,
        );
        // On every node: a node whose connection stayed wedged would
        // otherwise hide behind the other one's store decisions.
        let nodes: BTreeSet<usize> = run.records.iter().map(|r| r.node).collect();
        assert_eq!(nodes.len(), NODES, "{name}: both nodes checked");
        for node in &nodes {
            for (key, target) in targets.iter().enumerate() {
                let decided = after
                    .iter()
                    .any(|r| r.node == *node && r.key == key && !is_fallback(r));
                assert!(
                    decided,
                    "{name}: {:?} was not decided by the store on node {node} after {from:?}\n{timeline}",
                    target.key
                );
            }
        }
    }
    let of_quiet: Vec<&Record> = run
        .records
        .iter()
        .filter(|r| quiet.contains(&run.group(r.key)))
        .collect();
    let loud: Vec<&Record> = of_quiet
        .iter()
        .copied()
        .filter(|r| is_fallback(r))
        .collect();
    assert_noise(
        name,
        &loud,
        of_quiet.len(),
        &format!("for keys of untouched primaries {quiet:?}"),
        &timeline,
    );
    let slowest = run.max_latency();
    eprintln!("{name}: slowest decision {slowest:?} (budget {BUDGET:?})");
    assert!(
        slowest <= BUDGET + LATENCY_SLACK,
        "{name}: a decision took {slowest:?}, budget {BUDGET:?}"
    );
    let (mut over_all, mut forgotten_all) = (0, 0);
    for (key, target) in targets.iter().enumerate() {
        let limit = limit_of(&target.policy);
        let (over, forgotten) = run.bound(key, limit);
        over_all += over;
        forgotten_all += forgotten;
        assert!(
            over <= forgotten,
            "{name}: {:?} admitted {over} beyond its limit of {limit}, the store forgot {forgotten}",
            target.key
        );
        if !may_forget.contains(&target.group) {
            assert_eq!(
                forgotten, 0,
                "{name}: {:?} forgot admissions on an untouched primary",
                target.key
            );
            let unseen = run.unseen_charges(key, limit);
            assert!(
                unseen <= run.timed_out(key),
                "{name}: {:?} charged {unseen} units no admission reports, {} calls timed out",
                target.key,
                run.timed_out(key)
            );
        }
    }
    eprintln!("{name}: global bound: {over_all} admissions beyond a limit, {forgotten_all} admissions the store forgot (lost writes)");
}

/// A primary killed (SIGKILL) under load, its replica promoted, then the
/// dead primary back as a replica of its successor. Without full coverage,
/// the other primaries' keys never leave the store.
#[test]
fn killed_primary_then_back_as_replica() {
    let _serial = serial();
    let mut cluster =
        RedisCluster::start_with_replicas_and(&["--cluster-require-full-coverage", "no"]);
    let pairs = cluster.pairs();
    let (victim, heir) = pairs[0];
    let primaries: Vec<usize> = pairs.iter().map(|p| p.0).collect();
    let targets = targets_on(&cluster, &primaries, |_| true);
    let load = Load::start(
        cluster_nodes(&cluster),
        targets.clone(),
        3,
        Duration::from_secs(90),
    );
    sleep(WARMUP);
    let killed = load.now();
    cluster.nodes_mut()[victim].stop();
    let live: Vec<usize> = (0..6).filter(|&i| i != victim).collect();
    cluster.wait_until_whole("the replica takes over", &live, || true);
    let whole_again = load.now();
    sleep(RECOVERY + OBSERVE);
    let restarted = load.now();
    cluster.nodes_mut()[victim].restart();
    let all: Vec<usize> = (0..6).collect();
    cluster.wait_until_whole("the old primary rejoins as a replica", &all, || {
        query::<String>(&cluster.nodes()[victim], &["INFO", "replication"])
            .is_ok_and(|i| i.contains("role:slave") && i.contains("master_link_status:up"))
    });
    let whole_twice = load.now();
    sleep(RECOVERY + OBSERVE);
    let run = load.stop(&targets);
    let quiet: Vec<usize> = primaries.iter().copied().filter(|&p| p != victim).collect();
    check(
        "killed primary",
        &run,
        &targets,
        &quiet,
        &[(killed, whole_again), (restarted, whole_twice)],
        &[victim],
    );
    // The heir serves the victim's keys now.
    let moved = targets.iter().find(|t| t.group == victim).unwrap();
    let slot = key_slot(&redis_key(
        PREFIX,
        &moved.key,
        &moved.policy,
        moved.policy.first(),
    ));
    assert_eq!(cluster.owner(heir, slot), heir);
    // Back as a replica, the old primary changed nothing: no key left the
    // store from its restart on.
    let after: Vec<&Record> = run
        .records
        .iter()
        .filter(|r| r.started >= restarted)
        .collect();
    let left: Vec<&Record> = after.iter().copied().filter(|r| is_fallback(r)).collect();
    assert_noise(
        "killed primary",
        &left,
        after.len(),
        "after the old primary came back",
        &run.timeline(),
    );
}

/// The same kill with Redis's default `cluster-require-full-coverage yes`:
/// every node answers `CLUSTERDOWN` for every key until the replica takes
/// over, so every key leaves the store then; all return within RECOVERY
/// of the cluster being whole.
#[test]
fn killed_primary_with_full_coverage() {
    let _serial = serial();
    let mut cluster = RedisCluster::start_with_replicas();
    let pairs = cluster.pairs();
    let (victim, _) = pairs[1];
    let primaries: Vec<usize> = pairs.iter().map(|p| p.0).collect();
    let targets = targets_on(&cluster, &primaries, |_| true);
    let load = Load::start(
        cluster_nodes(&cluster),
        targets.clone(),
        3,
        Duration::from_secs(60),
    );
    sleep(WARMUP);
    let killed = load.now();
    cluster.nodes_mut()[victim].stop();
    let live: Vec<usize> = (0..6).filter(|&i| i != victim).collect();
    cluster.wait_until_whole("the replica takes over", &live, || true);
    let whole_again = load.now();
    sleep(RECOVERY + OBSERVE);
    let run = load.stop(&targets);
    check(
        "killed primary, full coverage",
        &run,
        &targets,
        &[],
        &[(killed, whole_again)],
        &[victim],
    );
    // Keys of the other primaries left the store only between the kill
    // and the recovery window's end.
    let outside: Vec<&Record> = run
        .records
        .iter()
        .filter(|r| {
            run.group(r.key) != victim && !(killed..whole_again + RECOVERY).contains(&r.started)
        })
        .collect();
    let left: Vec<&Record> = outside.iter().copied().filter(|r| is_fallback(r)).collect();
    assert_noise(
        "killed primary, full coverage",
        &left,
        outside.len(),
        "for keys of live primaries outside the failover",
        &run.timeline(),
    );
}

/// A manual `CLUSTER FAILOVER` (the replica takes over, losing nothing).
#[test]
fn manual_failover() {
    let _serial = serial();
    let cluster = RedisCluster::start_with_replicas_and(&["--cluster-require-full-coverage", "no"]);
    let pairs = cluster.pairs();
    let (old, new) = pairs[2];
    let primaries: Vec<usize> = pairs.iter().map(|p| p.0).collect();
    let targets = targets_on(&cluster, &primaries, |_| true);
    let load = Load::start(
        cluster_nodes(&cluster),
        targets.clone(),
        3,
        Duration::from_secs(60),
    );
    sleep(WARMUP);
    let started = load.now();
    let reply: String = query(&cluster.nodes()[new], &["CLUSTER", "FAILOVER"]).unwrap();
    assert_eq!(reply, "OK");
    let all: Vec<usize> = (0..6).collect();
    cluster.wait_until_whole("the replica takes over", &all, || {
        query::<String>(&cluster.nodes()[old], &["INFO", "replication"])
            .is_ok_and(|i| i.contains("role:slave") && i.contains("master_link_status:up"))
    });
    let whole_again = load.now();
    sleep(RECOVERY + OBSERVE);
    let run = load.stop(&targets);
    let quiet: Vec<usize> = primaries.iter().copied().filter(|&p| p != old).collect();
    check(
        "manual failover",
        &run,
        &targets,
        &quiet,
        &[(started, whole_again)],
        &[],
    );
}

/// `redis-cli --cluster reshard` of a few slots holding some of the keys,
/// from one primary to another, under load.
#[test]
fn resharding() {
    let _serial = serial();
    let cluster = RedisCluster::start_with_replicas_and(&["--cluster-require-full-coverage", "no"]);
    let pairs = cluster.pairs();
    let primaries: Vec<usize> = pairs.iter().map(|p| p.0).collect();
    let (from, to) = (primaries[0], primaries[1]);
    // redis-cli moves the source's lowest slots: take keys from the first
    // 64 of them, plus keys on the other primaries.
    let lowest = cluster
        .slot_ranges(from)
        .iter()
        .filter(|(_, _, port)| *port == cluster.nodes()[from].port())
        .map(|(start, _, _)| *start)
        .min()
        .unwrap();
    const MOVED: u16 = 64;
    let moving = |slot: u16| (lowest..lowest + MOVED).contains(&slot);
    let mut targets = targets_on(&cluster, &[from], moving);
    let others = targets_on(&cluster, &primaries, |slot| !moving(slot));
    targets.extend(others.into_iter().filter(|t| t.group != from));
    let id_of = |node: usize| -> String {
        query::<String>(&cluster.nodes()[node], &["CLUSTER", "MYID"]).unwrap()
    };
    let (from_id, to_id) = (id_of(from), id_of(to));
    let load = Load::start(
        cluster_nodes(&cluster),
        targets.clone(),
        3,
        Duration::from_secs(60),
    );
    sleep(WARMUP);
    let started = load.now();
    let output = std::process::Command::new("redis-cli")
        .args(["--cluster", "reshard", &cluster.nodes()[from].addr()])
        .args(["--cluster-from", &from_id, "--cluster-to", &to_id])
        .args(["--cluster-slots", &MOVED.to_string(), "--cluster-yes"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "reshard failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let all: Vec<usize> = (0..6).collect();
    cluster.wait_until_whole("every node agrees on the new slot map", &all, || {
        all.iter().all(|&n| cluster.owner(n, lowest) == to)
    });
    let whole_again = load.now();
    sleep(RECOVERY + OBSERVE);
    let run = load.stop(&targets);
    // Keys of the slots that did not move never leave the store; the
    // moved ones come back within RECOVERY; nothing is lost.
    let quiet: Vec<usize> = primaries.iter().copied().filter(|&p| p != from).collect();
    check(
        "resharding",
        &run,
        &targets,
        &quiet,
        &[(started, whole_again)],
        &[],
    );
}

/// A single Redis restarted (SIGKILL, then started again on the same
/// port, empty: no persistence) under load.
#[test]
fn single_redis_restarted() {
    let _serial = serial();
    let mut server = RedisServer::start();
    let mut targets = Vec::new();
    for (policy, count) in [
        (free_policy(), 3 * FREE_KEYS),
        (bound_policy(), 3 * BOUND_KEYS),
    ] {
        for i in 0..count {
            targets.push(Target {
                key: WindowKey::new("t", format!("{}-{i}", policy.first().name())),
                policy: policy.clone(),
                group: 0,
            });
        }
    }
    let nodes = (0..NODES)
        .map(|i| node(RedisStore::from_url(&server.url()).unwrap(), i))
        .collect();
    let load = Load::start(nodes, targets.clone(), 3, Duration::from_secs(60));
    sleep(WARMUP);
    let started = load.now();
    server.restart();
    let back = load.now();
    sleep(RECOVERY + OBSERVE);
    let run = load.stop(&targets);
    // The restart forgot everything: over-admission up to that is allowed
    // (and reported).
    check(
        "single redis restarted",
        &run,
        &targets,
        &[],
        &[(started, back)],
        &[0],
    );
}
