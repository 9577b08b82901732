//! Fencing tokens after a failover that lost the last grants and landed
//! on a primary whose clock is behind (issue 22).
//!
//! Real asynchronous replication on two `redis-server`s: the replica R
//! follows the primary P, then stops following (`REPLICAOF NO ONE`: what a
//! promotion does) while P keeps granting. Those grants are the ones a
//! failover loses. Then P takes R's data as R's replica (full resync: P
//! forgets the lost grants) and is promoted back, so the nodes, which talk
//! to P's address, now face the promoted replica's data. The stores' clock
//! (explicit) is set a day behind: the new primary's clock.
//!
//! What must hold (`ConnectionSeat::fence`): every token a node is
//! granted is larger than every token that node was granted before; a
//! node that never saw a lost token gets one above everything it saw and
//! everything the new primary kept (whether above the lost ones cannot be
//! known: the test prints it); once any node's grant carried the counter
//! past the lost tokens, every node's next token is above them too.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use tower_window::conn::{Acquire, ConnectionLimiter, ConnectionSeat};
use tower_window::{ManualClock, RedisStore, Store, WindowKey};
use tower_window_tests::redis_server::RedisServer;

const START: u64 = 1_700_000_000_000_000;
const DAY: u64 = 86_400_000_000;
const PREFIX: &str = "fence-failover:";
/// Bound on waiting for replication (polled).
const SYNC_PATIENCE: Duration = Duration::from_secs(20);

fn query<T: redis::FromRedisValue>(node: &RedisServer, args: &[&str]) -> T {
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query(&mut node.connection()).unwrap()
}

fn info_field(info: &str, name: &str) -> Option<String> {
    info.lines()
        .find_map(|line| line.strip_prefix(&format!("{name}:")))
        .map(|value| value.trim().to_owned())
}

/// Waits until `replica` is linked to its primary and has applied
/// everything `primary` wrote so far.
fn wait_synced(primary: &RedisServer, replica: &RedisServer) {
    let deadline = Instant::now() + SYNC_PATIENCE;
    loop {
        let p: String = query(primary, &["INFO", "replication"]);
        let r: String = query(replica, &["INFO", "replication"]);
        let up = info_field(&r, "master_link_status").as_deref() == Some("up");
        let written: Option<u64> =
            info_field(&p, "master_repl_offset").and_then(|v| v.parse().ok());
        let applied: Option<u64> = info_field(&r, "slave_repl_offset").and_then(|v| v.parse().ok());
        if up && written.is_some() && written == applied {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "replica not synced within {SYNC_PATIENCE:?}: {r}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn replicate(replica: &RedisServer, primary: &RedisServer) {
    let _: () = query(
        replica,
        &["REPLICAOF", "127.0.0.1", &primary.port().to_string()],
    );
    wait_synced(primary, replica);
}

fn promote(node: &RedisServer) {
    let _: () = query(node, &["REPLICAOF", "NO", "ONE"]);
}

/// The fencing counter of `key` as P holds it.
fn stored_fence(node: &RedisServer, key: &WindowKey) -> u64 {
    let name = format!(
        "{PREFIX}{{{}:{}}}:#conn:f",
        String::from_utf8_lossy(key.tenant()),
        String::from_utf8_lossy(key.subject())
    );
    let value: Option<u64> = query(node, &["GET", &name]);
    value.unwrap_or(0)
}

fn node_limiter(store: &Arc<RedisStore>) -> ConnectionLimiter {
    ConnectionLimiter::builder(Store::bare(Arc::clone(store)))
        .ttl(Duration::from_secs(15))
        .build()
        .unwrap()
}

async fn granted(limiter: &ConnectionLimiter, key: &WindowKey) -> ConnectionSeat {
    // Bounded: right after the promotion a call may meet a dropped
    // connection or an empty script cache; the limiter's fallback would
    // then hand out a degraded lease (fence 0), which is not the store's.
    for _ in 0..50 {
        match limiter.acquire(key).await.unwrap() {
            Acquire::Granted(lease) if !lease.is_degraded() => return lease,
            Acquire::Granted(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            Acquire::Denied(denied) => panic!("denied: {denied:?}"),
        }
    }
    panic!("the store never granted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_never_go_back_after_a_lossy_failover_to_a_clock_behind() {
    let primary = RedisServer::start();
    let replica = RedisServer::start();
    replicate(&replica, &primary);

    let clock = ManualClock::new(START);
    let store = Arc::new(
        RedisStore::builder()
            .url(primary.url())
            .prefix(PREFIX)
            .clock(clock.clone())
            .build()
            .unwrap(),
    );
    // Node A makes the grants that will be lost; node B only grants before.
    let (a, b) = (node_limiter(&store), node_limiter(&store));
    let (user, other) = (WindowKey::new("t", "user"), WindowKey::new("t", "other"));

    let mut held = vec![granted(&a, &user).await, granted(&b, &user).await];
    let b_seen = held[1].fence();
    clock.advance(Duration::from_millis(10));
    held.push(granted(&a, &other).await);
    wait_synced(&primary, &replica);
    let kept = stored_fence(&primary, &user);

    // The replica stops following; the primary keeps granting (lost).
    promote(&replica);
    clock.advance(Duration::from_secs(1));
    let mut a_seen = 0;
    for _ in 0..3 {
        let lease = granted(&a, &user).await;
        a_seen = a_seen.max(lease.fence());
        held.push(lease);
    }
    assert!(a_seen > kept);

    // The failover: the nodes' Redis now holds the promoted replica's data.
    replicate(&primary, &replica);
    promote(&primary);
    assert_eq!(
        stored_fence(&primary, &user),
        kept,
        "the last grants were lost"
    );
    // ... and its clock is a day behind.
    clock.set(START - DAY);

    // B first: it never saw the lost tokens, and nothing the new primary
    // holds or reads from its clock is above them. Its token is above
    // everything B saw and everything the new primary kept; whether it is
    // above the lost ones is what cannot be known (printed below).
    let b_next = granted(&b, &user).await.fence();
    assert!(b_next > b_seen && b_next > kept, "node B: {b_next}");
    assert!(b_next >= START - DAY, "at least the new primary's clock");
    // A keeps its own floor: above every token it was granted, lost or not.
    let a_next = granted(&a, &user).await.fence();
    assert!(
        a_next > a_seen,
        "node A's token went back: {a_next} after {a_seen} (a lossy failover, clock a day behind)"
    );
    assert!(
        a_next > b_next,
        "and the subject's counter moves on from it"
    );
    let a_other = granted(&a, &other).await.fence();
    assert!(a_other > a_next, "node A's tokens grow across subjects too");
    let b_after = granted(&b, &user).await.fence();
    assert!(b_after > a_next, "once the counter is back, for every node");
    eprintln!(
        "lost tokens up to {a_seen} (the new primary kept {kept}); after the failover \
         B got {b_next} (below the lost ones: {}), then A {a_next}, then B {b_after}",
        b_next < a_seen
    );
    for lease in held {
        std::mem::forget(lease);
    }
}
