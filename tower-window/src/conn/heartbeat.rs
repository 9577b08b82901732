//! The node's heartbeat: renews all live seats, batched per partition or
//! per route.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use futures_util::future::join_all;
use tokio::task::JoinHandle;

use super::backend::SeatRef;
use super::limiter::{ConnectionLimiter, Live, Shared};
use super::metrics;
use crate::{StoreError, StoreErrorKind};

/// Renewal calls of one tick in flight at once.
const HEARTBEAT_CONCURRENCY: usize = 16;

/// What one heartbeat tick did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct HeartbeatReport {
    /// Seats found live and extended.
    pub renewed: usize,
    /// Seats found gone, reported to their holders.
    pub lost: usize,
    /// Seats whose renewal call failed (not declared lost).
    pub failed: usize,
    /// Store calls (round trips) made, re-sent ones included.
    pub calls: usize,
    /// Seats a routed call could not answer, sent again per partition.
    pub resent: usize,
}

/// Whether the stack refused a call before it reached the store.
fn refused(error: &StoreError) -> bool {
    matches!(
        error.kind(),
        StoreErrorKind::CircuitOpen | StoreErrorKind::Overloaded
    )
}

/// The seats of one store call (indexes into the tick's snapshot), and
/// their route (`None`: one partition, sent with `renew`).
struct Group {
    members: Vec<usize>,
    route: Option<u16>,
}

/// One call per `batch` seats of each bucket, keyed by route and
/// partition.
fn groups(buckets: BTreeMap<(Option<u16>, u16), Vec<usize>>, batch: usize) -> Vec<Group> {
    let mut groups = Vec::new();
    for ((route, _), members) in buckets {
        groups.extend(members.chunks(batch).map(|chunk| Group {
            members: chunk.to_vec(),
            route,
        }));
    }
    groups
}

/// Splits `groups` into waves of at most [`HEARTBEAT_CONCURRENCY`] calls,
/// at most one per route: a primary's pipelines would queue behind each
/// other, and each must fit the store's time budget on its own.
fn waves(groups: &[Group]) -> Vec<Vec<usize>> {
    let full = |wave: &Vec<usize>| wave.len() >= HEARTBEAT_CONCURRENCY;
    let mut waves: Vec<Vec<usize>> = Vec::new();
    // Per route, the first wave it may join.
    let mut next: BTreeMap<u16, usize> = BTreeMap::new();
    // Waves before `open` are full.
    let mut open = 0;
    for (i, group) in groups.iter().enumerate() {
        let first = group.route.and_then(|route| next.get(&route).copied());
        let mut wave = first.unwrap_or(0).max(open);
        while waves.get(wave).is_some_and(full) {
            wave += 1;
        }
        if wave == waves.len() {
            waves.push(Vec::new());
        }
        waves[wave].push(i);
        if let Some(route) = group.route {
            next.insert(route, wave + 1);
        }
        while waves.get(open).is_some_and(full) {
            open += 1;
        }
    }
    waves
}

/// The running heartbeat task of a [`ConnectionLimiter`]. Dropping the
/// handle leaves it running until every clone of the limiter is gone.
#[derive(Debug)]
pub struct HeartbeatHandle {
    task: JoinHandle<()>,
}

impl HeartbeatHandle {
    /// Stops the heartbeat: this node's seats then expire after their TTL.
    pub fn abort(&self) {
        self.task.abort();
    }

    /// Whether the task has ended.
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }
}

impl ConnectionLimiter {
    /// Spawns a task running [`heartbeat`](Self::heartbeat) every
    /// `ttl / 3` until every clone of the limiter is dropped. Call it once
    /// per limiter.
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime, like `tokio::spawn`.
    pub fn start_heartbeat(&self) -> HeartbeatHandle {
        let period = self.ttl() / 3;
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

    /// One heartbeat tick: renews every live seat of this limiter, in
    /// batches per partition or per [`renew_route`](super::Backend::renew_route),
    /// 16 calls at a time. Seats a routed call could not answer are sent
    /// again per partition, which follows redirects and confines a failure
    /// to its slot. Seats found gone are reported lost.
    pub async fn heartbeat(&self) -> HeartbeatReport {
        let shared = &*self.shared;
        let tenant_capped = shared.tenant_capped();
        let Some(backend) = shared.backend.as_deref() else {
            return HeartbeatReport::default();
        };
        let entry = |(seq, live): (&u64, &Live)| (*seq, live.key.clone(), live.id.clone());
        let snapshot: Vec<_> = shared.live().iter().map(entry).collect();
        let partition_of = |key| backend.seat_partition(key, tenant_capped);
        let seat_partitions: Vec<u16> = snapshot.iter().map(|s| partition_of(&s.1)).collect();
        let mut buckets: BTreeMap<_, Vec<usize>> = BTreeMap::new();
        let mut partitions: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
        for (i, &partition) in seat_partitions.iter().enumerate() {
            partitions.entry(partition).or_default().push(i);
        }
        for (partition, members) in partitions {
            let route = backend.renew_route(partition);
            let bucket = buckets.entry((route, route.unwrap_or(partition)));
            bucket.or_default().extend(members);
        }
        let batch = backend.max_renew_batch().max(1);
        let ttl = self.ttl();
        let seat = |i: usize| SeatRef::new(&snapshot[i].1, &snapshot[i].2, tenant_capped);
        let renew = |group: &Group| {
            let refs: Vec<SeatRef<'_>> = group.members.iter().map(|&i| seat(i)).collect();
            // A route's breaker is that of any of its seats' partitions.
            let (first, routed) = (&snapshot[group.members[0]].1, group.route.is_some());
            async move {
                let refs = &refs;
                let renew = shared.call(first, |backend, guard| {
                    if routed {
                        return backend.renew_routed(guard, refs, ttl);
                    }
                    let alive = backend.renew(guard, refs, ttl);
                    alive.map(|result| result.map(|alive| alive.into_iter().map(Some).collect()))
                });
                renew.await
            }
        };
        let mut report = HeartbeatReport::default();
        let mut lost = Vec::new();
        // The routed calls, then one call per partition for the seats they
        // could not answer.
        let mut pending = groups(buckets, batch);
        for pass in 0..2 {
            if pending.is_empty() {
                break;
            }
            report.calls += pending.len();
            // Bounded: the heartbeat must not crowd out (or be refused by)
            // the store's in-flight bound.
            let mut results = Vec::with_capacity(pending.len());
            for wave in waves(&pending) {
                let answers = join_all(wave.iter().map(|&i| renew(&pending[i]))).await;
                results.extend(wave.into_iter().zip(answers));
            }
            let mut unanswered: BTreeMap<_, Vec<usize>> = BTreeMap::new();
            let mut resend = |i: usize| {
                let bucket = unanswered.entry((None, seat_partitions[i]));
                bucket.or_default().push(i);
            };
            for (i, result) in results {
                let group = &pending[i];
                match result {
                    Ok(alive) if alive.len() == group.members.len() => {
                        for (&i, alive) in group.members.iter().zip(alive) {
                            match alive {
                                Some(true) => report.renewed += 1,
                                Some(false) => lost.push(snapshot[i].0),
                                None if pass == 0 => resend(i),
                                // Never found gone: not declared lost.
                                None => report.failed += 1,
                            }
                        }
                    }
                    // Sent again per partition, unless the stack refused the
                    // call (it would refuse those too).
                    Err(error) if group.route.is_some() && pass == 0 && !refused(&error) => {
                        group.members.iter().for_each(|&i| resend(i));
                    }
                    Ok(_) | Err(_) => report.failed += group.members.len(),
                }
            }
            report.resent += unanswered.values().map(Vec::len).sum::<usize>();
            pending = groups(unanswered, batch);
        }
        let live = {
            let mut live = shared.live();
            for seq in lost {
                if let Some(entry) = live.remove(&seq) {
                    entry.lost.send_replace(true);
                    report.lost += 1;
                }
            }
            i64::try_from(live.len()).unwrap_or(i64::MAX)
        };
        let before = shared.reported_live.swap(live, Ordering::AcqRel);
        metrics::heartbeat(&report, live - before);
        report
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::conn::{Acquire, Backend, GrantReply, GrantRequest};
    use crate::store::{Guard, Op};
    use crate::{MemoryStore, Store, WindowKey};

    /// A memory store whose seats live in 8 partitions (by the subject's
    /// last byte) served by 2 routes (partition % 2), as a cluster's slots
    /// by primaries. A routed call does not answer partition 3's seats (as
    /// a primary answering `MOVED` for a slot that moved).
    struct Routed {
        memory: Arc<MemoryStore>,
        routed: Arc<AtomicUsize>,
        single: Arc<AtomicUsize>,
        /// Routed calls of route 1 fail with this.
        fail_route_1: Option<StoreErrorKind>,
    }

    impl Backend for Routed {
        fn grant<'a>(
            &'a self,
            guard: &mut Guard<'a>,
            request: GrantRequest<'a>,
        ) -> Op<'a, GrantReply> {
            self.memory.grant(guard, request)
        }

        fn renew<'a>(
            &'a self,
            guard: &mut Guard<'a>,
            seats: &'a [SeatRef<'a>],
            ttl: Duration,
        ) -> Op<'a, Vec<bool>> {
            let partition = self.seat_partition(seats[0].key, false);
            assert!(seats
                .iter()
                .all(|s| self.seat_partition(s.key, false) == partition));
            self.single.fetch_add(1, Ordering::Relaxed);
            self.memory.renew(guard, seats, ttl)
        }

        fn release<'a>(&'a self, guard: &mut Guard<'a>, seat: SeatRef<'a>) -> Op<'a, bool> {
            self.memory.release(guard, seat)
        }

        fn presence<'a>(
            &'a self,
            guard: &mut Guard<'a>,
            key: &'a WindowKey,
            tenant_capped: bool,
        ) -> Op<'a, u32> {
            self.memory.presence(guard, key, tenant_capped)
        }

        fn seat_partition(&self, key: &WindowKey, _: bool) -> u16 {
            u16::from(key.subject().last().copied().unwrap_or(0) % 8)
        }

        fn renew_route(&self, partition: u16) -> Option<u16> {
            Some(partition % 2)
        }

        fn renew_routed<'a>(
            &'a self,
            guard: &mut Guard<'a>,
            seats: &'a [SeatRef<'a>],
            ttl: Duration,
        ) -> Op<'a, Vec<Option<bool>>> {
            let route = self.seat_partition(seats[0].key, false) % 2;
            assert!(seats
                .iter()
                .all(|s| self.seat_partition(s.key, false) % 2 == route));
            self.routed.fetch_add(1, Ordering::Relaxed);
            if let (1, Some(kind)) = (route, self.fail_route_1) {
                return Op::ready(Err(StoreError::new(kind, "test")));
            }
            let moved: Vec<bool> = seats
                .iter()
                .map(|s| self.seat_partition(s.key, false) == 3)
                .collect();
            self.memory.renew(guard, seats, ttl).map(move |result| {
                result.map(|alive| {
                    alive
                        .into_iter()
                        .zip(moved)
                        .map(|(alive, moved)| (!moved).then_some(alive))
                        .collect()
                })
            })
        }

        fn max_renew_batch(&self) -> usize {
            25
        }
    }

    fn limiter(fail_route_1: Option<StoreErrorKind>) -> (ConnectionLimiter, Routed) {
        let memory = Arc::new(MemoryStore::new());
        let backend = Routed {
            memory: Arc::clone(&memory),
            routed: Arc::new(AtomicUsize::new(0)),
            single: Arc::new(AtomicUsize::new(0)),
            fail_route_1,
        };
        let counters = Routed {
            memory,
            routed: Arc::clone(&backend.routed),
            single: Arc::clone(&backend.single),
            fail_route_1,
        };
        let store = Store::bare(
            crate::store::Backend::windows(MemoryStore::new())
                .with_connections(backend)
                .in_process(true),
        );
        let limiter = ConnectionLimiter::builder(store)
            .ttl(Duration::from_secs(60))
            .build()
            .unwrap();
        (limiter, counters)
    }

    /// 80 seats: 10 per partition, 40 per route.
    async fn seats(limiter: &ConnectionLimiter) -> Vec<crate::conn::ConnectionSeat> {
        let mut seats = Vec::new();
        for i in 0..80 {
            let key = WindowKey::new("t", format!("u{i}-{}", i % 8));
            match limiter.acquire(&key).await.unwrap() {
                Acquire::Granted(seat) => seats.push(seat),
                Acquire::Denied(denied) => panic!("{denied:?}"),
            }
        }
        seats
    }

    #[tokio::test]
    async fn conn_heartbeat_one_call_per_route_and_batch_moved_seats_resent_by_partition() {
        let (limiter, backend) = limiter(None);
        let seats = seats(&limiter).await;
        // One seat gone from the store: found gone, reported lost.
        let gone = &seats[5];
        backend
            .memory
            .release(
                &mut Guard::bare(),
                SeatRef::new(gone.key(), gone.id(), false),
            )
            .await
            .unwrap();
        let report = limiter.heartbeat().await;
        // Per route 40 seats in batches of 25: 2 routed calls each; the 10
        // seats of partition 3 are sent again in one call of their own.
        assert_eq!(backend.routed.load(Ordering::Relaxed), 4);
        assert_eq!(backend.single.load(Ordering::Relaxed), 1);
        assert_eq!(report.calls, 5, "{report:?}");
        assert_eq!(report.resent, 10, "{report:?}");
        assert_eq!((report.renewed, report.lost, report.failed), (79, 1, 0));
        assert!(gone.is_lost());
        assert_eq!(seats.iter().filter(|s| s.is_lost()).count(), 1);
    }

    #[tokio::test]
    async fn conn_heartbeat_a_failed_routed_call_is_sent_again_by_partition() {
        let (limiter, backend) = limiter(Some(StoreErrorKind::Timeout));
        let seats = seats(&limiter).await;
        let report = limiter.heartbeat().await;
        // Route 1's two calls failed: its 4 partitions (1, 3, 5, 7) are
        // sent again, one call each.
        assert_eq!(backend.routed.load(Ordering::Relaxed), 4);
        assert_eq!(backend.single.load(Ordering::Relaxed), 4);
        assert_eq!((report.calls, report.resent), (8, 40), "{report:?}");
        assert_eq!((report.renewed, report.lost, report.failed), (80, 0, 0));
        assert!(seats.iter().all(|s| !s.is_lost()));
    }

    #[tokio::test]
    async fn conn_heartbeat_a_refused_routed_call_is_not_sent_again() {
        let (limiter, backend) = limiter(Some(StoreErrorKind::CircuitOpen));
        let seats = seats(&limiter).await;
        let report = limiter.heartbeat().await;
        assert_eq!(backend.single.load(Ordering::Relaxed), 0);
        assert_eq!((report.calls, report.resent), (4, 0), "{report:?}");
        // Failed, never declared lost.
        assert_eq!((report.renewed, report.lost, report.failed), (40, 0, 40));
        assert!(seats.iter().all(|s| !s.is_lost()));
    }

    #[test]
    fn conn_heartbeat_waves_hold_one_call_per_route() {
        let group = |route: Option<u16>| Group {
            members: vec![0],
            route,
        };
        // 3 routes of 6 calls each, then 40 single-partition calls, then
        // 20 calls of one more route.
        let mut groups: Vec<Group> = (0..3)
            .flat_map(|route| (0..6).map(move |_| group(Some(route))))
            .collect();
        groups.extend((0..40).map(|_| group(None)));
        groups.extend((0..20).map(|_| group(Some(7))));
        let waves = waves(&groups);
        let mut seen: Vec<usize> = waves.iter().flatten().copied().collect();
        seen.sort_unstable();
        assert_eq!(
            seen,
            (0..groups.len()).collect::<Vec<_>>(),
            "each call once"
        );
        for wave in &waves {
            assert!(wave.len() <= HEARTBEAT_CONCURRENCY);
            let mut routes: Vec<u16> = wave.iter().filter_map(|&i| groups[i].route).collect();
            let all = routes.len();
            routes.sort_unstable();
            routes.dedup();
            assert_eq!(routes.len(), all, "one call per route in a wave: {wave:?}");
        }
        // Waves 0-2 are full (3 routed calls and 13 single ones each), so
        // route 7's 20 calls take one wave each from wave 3 on.
        assert_eq!(waves.len(), 23);
        assert_eq!(waves[0].len(), HEARTBEAT_CONCURRENCY);
        assert_eq!(
            waves[3].len(),
            3 + 1 + 1,
            "routes 0-2, a single one, route 7"
        );
    }
}
