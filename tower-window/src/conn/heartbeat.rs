//! The node's one heartbeat: renews all live seats, batched per partition.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};

use futures_util::future::join_all;
use tokio::task::JoinHandle;

use super::backend::SeatRef;
use super::limiter::{ConnectionLimiter, Shared};
use crate::WindowKey;

/// Renewal calls of one tick in flight at once.
const HEARTBEAT_CONCURRENCY: usize = 16;

/// What one heartbeat tick did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct HeartbeatReport {
    /// Seats found live and extended.
    pub renewed: usize,
    /// Seats found gone (expired or reset), reported to their holders.
    pub lost: usize,
    /// Seats whose renewal call failed (not declared lost).
    pub failed: usize,
    /// Store calls made (one per partition and batch).
    pub calls: usize,
}

/// The running heartbeat task of a [`ConnectionLimiter`].
///
/// Dropping the handle leaves the task running (it ends when every clone
/// of the limiter is gone); [`abort`](Self::abort) stops it.
#[derive(Debug)]
pub struct HeartbeatHandle {
    task: JoinHandle<()>,
}

impl HeartbeatHandle {
    /// Stops the heartbeat: this node's seats then expire after their TTL
    /// (what a crashed node looks like to the cluster).
    pub fn abort(&self) {
        self.task.abort();
    }

    /// Whether the task has ended.
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }
}

impl ConnectionLimiter {
    /// Spawns the node's heartbeat on the current Tokio runtime: every
    /// `ttl / 3` one [`heartbeat`](Self::heartbeat). Call it once per node
    /// (per limiter); it ends when every clone of the limiter is dropped.
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime, like `tokio::spawn`.
    pub fn start_heartbeat(&self) -> HeartbeatHandle {
        let period = self.shared.ttl / 3;
        let weak: Weak<Shared> = Arc::downgrade(&self.shared);
        let task = tokio::spawn(async move {
            let mut interval = tokio::time::interval(period);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            interval.tick().await; // the first tick is immediate
            loop {
                interval.tick().await;
                let Some(shared) = weak.upgrade() else {
                    return;
                };
                let report = ConnectionLimiter { shared }.heartbeat().await;
                if report.lost > 0 || report.failed > 0 {
                    tracing::debug!(
                        renewed = report.renewed,
                        lost = report.lost,
                        failed = report.failed,
                        "connection heartbeat"
                    );
                }
            }
        });
        HeartbeatHandle { task }
    }

    /// One heartbeat tick: renews every live seat of this node, one store
    /// call per partition (Redis Cluster hash slot) and batch of
    /// [`max_renew_batch`](super::Backend::max_renew_batch),
    /// 16 at a time, each through the store's resilience stack. Seats
    /// found gone are removed and reported lost to their holders.
    pub async fn heartbeat(&self) -> HeartbeatReport {
        let shared = &*self.shared;
        let tenant_capped = shared.tenant_capped();
        let Some(store) = shared.store.inner.connections.as_deref() else {
            return HeartbeatReport::default();
        };
        let snapshot: Vec<(u64, WindowKey, Vec<u8>)> = shared
            .live()
            .iter()
            .map(|(seq, live)| (*seq, live.key.clone(), live.id.clone()))
            .collect();
        let mut partitions: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
        for (i, (_, key, _)) in snapshot.iter().enumerate() {
            partitions
                .entry(store.seat_partition(key, tenant_capped))
                .or_default()
                .push(i);
        }
        let batch = store.max_renew_batch().max(1);
        let mut groups: Vec<(u16, &[usize])> = Vec::new();
        for (partition, members) in &partitions {
            for chunk in members.chunks(batch) {
                groups.push((*partition, chunk));
            }
        }
        let ttl = shared.ttl;
        let renew = |partition: u16, members: &'_ [usize]| {
            let refs: Vec<SeatRef<'_>> = members
                .iter()
                .map(|&i| SeatRef::new(&snapshot[i].1, &snapshot[i].2, tenant_capped))
                .collect();
            async move {
                let refs = &refs;
                shared
                    .call(
                        |_| partition,
                        |backend, guard| backend.renew(guard, refs, ttl),
                    )
                    .await
            }
        };
        // A bounded number at once: a cluster node may hold seats in
        // thousands of slots, and the heartbeat must not crowd out (or be
        // refused by) the limiter's in-flight bound.
        let mut results = Vec::with_capacity(groups.len());
        for wave in groups.chunks(HEARTBEAT_CONCURRENCY) {
            let answers = join_all(
                wave.iter()
                    .map(|(partition, members)| renew(*partition, members)),
            )
            .await;
            results.extend(wave.iter().map(|(_, members)| *members).zip(answers));
        }
        let mut report = HeartbeatReport {
            calls: groups.len(),
            ..HeartbeatReport::default()
        };
        let mut lost = Vec::new();
        for (members, result) in results {
            match result {
                Ok(alive) if alive.len() == members.len() => {
                    for (&i, alive) in members.iter().zip(alive) {
                        if alive {
                            report.renewed += 1;
                        } else {
                            lost.push(snapshot[i].0);
                        }
                    }
                }
                Ok(_) | Err(_) => report.failed += members.len(),
            }
        }
        if !lost.is_empty() {
            let mut live = shared.live();
            for seq in lost {
                if let Some(entry) = live.remove(&seq) {
                    // The holder learns it; the seat is never re-acquired.
                    entry.lost.send_replace(true);
                    report.lost += 1;
                }
            }
        }
        let live = i64::try_from(shared.live().len()).unwrap_or(i64::MAX);
        let before = shared
            .reported_live
            .swap(live, std::sync::atomic::Ordering::AcqRel);
        crate::metrics::connection_heartbeat(
            crate::metrics::HeartbeatCounts {
                lost: report.lost,
                failed: report.failed,
                calls: report.calls,
            },
            live - before,
        );
        report
    }
}
