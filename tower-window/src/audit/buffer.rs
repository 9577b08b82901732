//! The bounded buffer between decisions and the log, and the writer that
//! empties it: one round at a time, a failed batch retried (alone, as it
//! was) before anything newer, so a tenant's records keep their order.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures_util::FutureExt;

use super::record::Fields;
use super::{AuditBatch, AuditStats, Inner};
use crate::metrics::Calls;
use crate::{StoreError, StoreErrorKind};

/// The longest pause between rounds while the log fails.
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// Batches of a round in flight at once.
const MAX_BATCHES_IN_FLIGHT: usize = 8;
/// Attempts after which a batch the log refuses (not an outage) is dropped.
const MAX_REFUSALS: u32 = 3;

pub(super) struct Buffer {
    state: Mutex<State>,
    /// Held for a round: rounds never overlap.
    round: tokio::sync::Mutex<()>,
    capacity: usize,
    max_batch: usize,
    interval: Duration,
    writer: AtomicBool,
    recorded: AtomicU64,
    written: AtomicU64,
    dropped_full: AtomicU64,
    dropped_failed: AtomicU64,
}

#[derive(Default)]
struct State {
    /// The waiting records' texts, one after another: written in place,
    /// so keeping a record allocates nothing once the buffer has grown.
    text: String,
    /// The waiting records, oldest first.
    queue: VecDeque<Queued>,
    /// Batches of the last round that failed: the next round's.
    pending: Vec<Pending>,
    /// Records in `pending`.
    pending_records: usize,
    next_seq: u64,
}

/// Where a waiting record's text and its tenant are in `State::text`.
struct Queued {
    end: usize,
    tenant: Range<usize>,
}

struct Pending {
    batch: AuditBatch,
    refusals: u32,
}

/// How a round went.
enum Round {
    Idle,
    /// Written; `full`: a full batch is waiting already.
    Wrote {
        full: bool,
    },
    Failed,
}

impl Buffer {
    /// A buffer whose batches are numbered from `first_seq` up.
    pub(super) fn new(
        capacity: usize,
        max_batch: usize,
        interval: Duration,
        first_seq: u64,
    ) -> Self {
        Self {
            state: Mutex::new(State {
                next_seq: first_seq,
                ..State::default()
            }),
            round: tokio::sync::Mutex::new(()),
            capacity,
            max_batch,
            interval,
            writer: AtomicBool::new(false),
            recorded: AtomicU64::new(0),
            written: AtomicU64::new(0),
            dropped_full: AtomicU64::new(0),
            dropped_failed: AtomicU64::new(0),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        crate::sync::lock(&self.state)
    }

    pub(super) fn stats(&self) -> AuditStats {
        let state = self.state();
        AuditStats {
            recorded: self.recorded.load(Ordering::Relaxed),
            written: self.written.load(Ordering::Relaxed),
            dropped_full: self.dropped_full.load(Ordering::Relaxed),
            dropped_failed: self.dropped_failed.load(Ordering::Relaxed),
            buffered: (state.queue.len() + state.pending_records) as u64,
        }
    }

    /// Keeps `record`, or counts it dropped when the buffer is full.
    fn keep(&self, record: &Fields<'_>) {
        self.recorded.fetch_add(1, Ordering::Relaxed);
        let mut state = self.state();
        if state.queue.len() + state.pending_records >= self.capacity {
            drop(state);
            self.dropped_full.fetch_add(1, Ordering::Relaxed);
            count("dropped_full", 1);
            return;
        }
        let tenant = record.write(&mut state.text);
        let end = state.text.len();
        state.queue.push_back(Queued { end, tenant });
    }

    /// The next round's batches: the failed ones, else up to `max_batch`
    /// new records grouped by tenant, in order.
    fn take_round(&self, inner: &Inner) -> Vec<Pending> {
        let mut state = self.state();
        if !state.pending.is_empty() {
            state.pending_records = 0;
            return std::mem::take(&mut state.pending);
        }
        let n = state.queue.len().min(self.max_batch);
        let mut round: Vec<Pending> = Vec::new();
        let State { text, queue, .. } = &mut *state;
        let round_end = n.checked_sub(1).map_or(0, |last| queue[last].end);
        let mut start = 0;
        for (i, Queued { end, tenant }) in queue.drain(..n).enumerate() {
            let (record, tenant) = (&text[start..end], &text[tenant]);
            match round.iter_mut().find(|p| p.batch.tenant == tenant) {
                Some(pending) => pending.batch.push(record),
                None => {
                    // The round's first batch gets room for the rest of
                    // it: when one tenant has the round (a flood), its
                    // batch never grows. Later tenants' batches grow as
                    // they fill, so a round of many tenants allocates no
                    // more than its own size in room it may not use.
                    let first = round.is_empty();
                    let mut batch = AuditBatch {
                        tenant: tenant.to_owned(),
                        node: inner.node.clone(),
                        seq: 0,
                        retention: inner.retention,
                        text: String::with_capacity(if first { round_end - start } else { 0 }),
                        ends: Vec::with_capacity(if first { n - i } else { 0 }),
                    };
                    batch.push(record);
                    round.push(Pending { batch, refusals: 0 });
                }
            }
            start = end;
        }
        // What was taken leaves the text: all of it (the usual case; the
        // text keeps its room), or the front, the rest moving up.
        if queue.is_empty() {
            text.clear();
        } else {
            text.drain(..start);
            for queued in queue.iter_mut() {
                queued.end -= start;
                queued.tenant = queued.tenant.start - start..queued.tenant.end - start;
            }
        }
        for pending in &mut round {
            state.next_seq += 1;
            pending.batch.seq = state.next_seq;
        }
        round
    }

    /// Counts what a round wrote; keeps what failed for the next round.
    fn settle(&self, round: Vec<(Pending, Result<(), StoreError>)>) -> Round {
        let mut failed = Vec::new();
        for (mut pending, result) in round {
            let n = pending.batch.len();
            match result {
                Ok(()) => {
                    self.written.fetch_add(n as u64, Ordering::Relaxed);
                    count("written", n);
                }
                Err(error) => {
                    if !is_outage(&error) {
                        pending.refusals += 1;
                    }
                    if pending.refusals >= MAX_REFUSALS {
                        tracing::warn!(%error, records = n, "the audit log refused a batch: dropped");
                        self.dropped_failed.fetch_add(n as u64, Ordering::Relaxed);
                        count("dropped_failed", n);
                    } else {
                        failed.push(pending);
                    }
                }
            }
        }
        let mut state = self.state();
        let outcome = if failed.is_empty() {
            // Straight on only for a full batch: records trickling in
            // while a round was out wait for the interval, or every round
            // would carry a handful and pay its call for them.
            Round::Wrote {
                full: state.queue.len() >= self.max_batch,
            }
        } else {
            Round::Failed
        };
        state.pending_records = failed.iter().map(|p| p.batch.len()).sum();
        state.pending = failed;
        if crate::metrics::ENABLED {
            let buffered = state.queue.len() + state.pending_records;
            ::metrics::gauge!(crate::metrics::AUDIT_BUFFERED).set(buffered as f64);
        }
        outcome
    }

    fn is_empty(&self) -> bool {
        let state = self.state();
        state.queue.is_empty() && state.pending.is_empty()
    }
}

/// Buffers `record` and makes sure it gets written: at once on an
/// in-process store, else by the writer task.
pub(super) fn push(inner: &Arc<Inner>, record: &Fields<'_>) {
    inner.buffer.keep(record);
    if inner.store.is_in_process() {
        // The embedded backend answers at once: written now, in order.
        let _ = write_round(inner).now_or_never();
        return;
    }
    let buffer = &inner.buffer;
    if !buffer.writer.load(Ordering::Relaxed) {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            if !buffer.writer.swap(true, Ordering::AcqRel) {
                runtime.spawn(writer(Arc::downgrade(inner)));
            }
        }
    }
}

/// Writes until `budget` has passed or nothing is left; `true` if nothing is.
pub(super) async fn flush(inner: &Arc<Inner>, budget: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + budget;
    let mut backoff = Duration::ZERO;
    loop {
        if let Round::Failed = write_round(inner).await {
            backoff = (backoff * 2).clamp(Duration::from_millis(5), MAX_BACKOFF);
            if tokio::time::Instant::now() + backoff > deadline {
                return inner.buffer.is_empty();
            }
            tokio::time::sleep(backoff).await;
        }
        if inner.buffer.is_empty() {
            return true;
        }
    }
}

/// The writer task: a round, then a pause (none while a full batch is waiting,
/// growing while the log fails), until the log is dropped.
async fn writer(log: Weak<Inner>) {
    let mut backoff = Duration::ZERO;
    loop {
        let Some(inner) = log.upgrade() else { return };
        let interval = inner.buffer.interval;
        let pause = match write_round(&inner).await {
            Round::Wrote { full: true } => Duration::ZERO,
            Round::Idle | Round::Wrote { full: false } => {
                backoff = Duration::ZERO;
                interval
            }
            Round::Failed => {
                backoff = (backoff * 2).clamp(interval, MAX_BACKOFF);
                backoff
            }
        };
        drop(inner);
        if pause.is_zero() {
            tokio::task::yield_now().await;
        } else {
            tokio::time::sleep(pause).await;
        }
    }
}

/// One round: its batches (one per tenant) sent
/// [`MAX_BATCHES_IN_FLIGHT`] at a time through the store's resilience
/// stack, pipelined on each node's connection.
async fn write_round(inner: &Inner) -> Round {
    let buffer = &inner.buffer;
    let _round = buffer.round.lock().await;
    let round = buffer.take_round(inner);
    if round.is_empty() {
        return Round::Idle;
    }
    // A few at a time: the batches share the store's in-flight bound with
    // the decisions, which must never wait for auditing.
    let mut results = Vec::with_capacity(round.len());
    for chunk in round.chunks(MAX_BATCHES_IN_FLIGHT) {
        let calls = chunk.iter().map(|pending| {
            let batch = &pending.batch;
            inner.store.call(
                inner.backend.as_deref(),
                "audit logs",
                |backend| backend.failure_domain(&batch.tenant),
                Calls::to(&inner.metrics, None),
                |backend, guard| backend.append(guard, batch),
            )
        });
        results.extend(futures_util::future::join_all(calls).await);
    }
    buffer.settle(round.into_iter().zip(results).collect())
}

/// Whether `error` says the log was out of reach (the batch waits), not
/// that it refused the batch.
fn is_outage(error: &StoreError) -> bool {
    matches!(
        error.kind(),
        StoreErrorKind::Unavailable
            | StoreErrorKind::Timeout
            | StoreErrorKind::Overloaded
            | StoreErrorKind::CircuitOpen
    )
}

/// Counts `n` records with `outcome` in `tower_window_audit_records_total`.
fn count(outcome: &'static str, n: usize) {
    if crate::metrics::ENABLED && n > 0 {
        ::metrics::counter!(crate::metrics::AUDIT_RECORDS_TOTAL, "outcome" => outcome)
            .increment(n as u64);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use crate::audit::{AdminAction, AuditLog, AuditRecord};
    use crate::Store;

    #[test]
    fn a_round_takes_the_oldest_records_grouped_by_tenant_and_the_rest_stays_whole() {
        let log = AuditLog::builder(Store::memory())
            .max_batch(4)
            .node("n1")
            .build();
        let inner = &*log.inner;
        let written: Vec<AuditRecord> = (0..10)
            .map(|i| {
                let tenant = ["a", "bb", "a"][i % 3];
                AuditRecord::of_change(tenant, AdminAction::Reset, 1_000 + i as u64, "n1")
            })
            .collect();
        for record in &written {
            inner.buffer.keep(&record.fields());
        }
        let mut read = Vec::new();
        let mut rounds = 0;
        loop {
            let round = inner.buffer.take_round(inner);
            if round.is_empty() {
                break;
            }
            rounds += 1;
            assert!(round.iter().map(|p| p.batch.len()).sum::<usize>() <= 4);
            for pending in round {
                for text in pending.batch.records() {
                    let record = AuditRecord::from_fields("", "", [("r", text)]).unwrap();
                    assert_eq!(record.tenant, pending.batch.tenant);
                    read.push(record);
                }
            }
        }
        assert_eq!(rounds, 3, "4 + 4 + 2 records");
        // Within a tenant, the order they were kept in.
        for tenant in ["a", "bb"] {
            let of = |records: &[AuditRecord]| -> Vec<u64> {
                records
                    .iter()
                    .filter(|r| r.tenant == tenant)
                    .map(|r| r.at_micros)
                    .collect()
            };
            assert_eq!(of(&read), of(&written), "{tenant}");
        }
        assert_eq!(read.len(), written.len());
    }
}
