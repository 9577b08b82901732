//! [`events::Backend`] for [`MemoryStore`]: event windows in a bounded
//! cache (`max_keys` of them); an evicted or expired window is made again
//! with a new epoch, so a position in the old one resyncs.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use quick_cache::sync::Cache;

use super::wakeups::LocalWakeups;
use crate::events::{
    self as events, check_batch, check_limit, Appended, Epoch, Event, EventId, EventRequest,
    Position, Resume, ResyncReason, Retention,
};
use crate::store::MemoryStore;
use crate::store::{Guard, Op, StoreError};
use crate::sync::lock;

type EventLogs = Cache<Vec<u8>, Arc<Mutex<Log>>>;

impl MemoryStore {
    fn event_logs(&self) -> Arc<EventLogs> {
        self.part(|store| {
            let max_keys = usize::try_from(store.max_keys().max(1)).unwrap_or(usize::MAX);
            Arc::new(Cache::new(max_keys))
        })
    }

    fn event_wakeups(&self) -> Arc<LocalWakeups> {
        self.part(|_| Arc::new(LocalWakeups::default()))
    }

    /// `f` on the window, locked, with its current epoch and now in ms.
    fn event_window<T>(
        &self,
        request: &EventRequest<'_>,
        f: impl FnOnce(&mut Log, Epoch, u64) -> T,
    ) -> T {
        let now_us = self.clock.now_micros();
        let logs = self.event_logs();
        let new = || Ok::<_, std::convert::Infallible>(Arc::default());
        let Ok(log) = logs.get_or_insert_with(request.key, new);
        let mut log = lock(&log);
        let epoch = log.live(now_us, request);
        f(&mut log, epoch, now_us / 1000)
    }

    /// Appends `events` in order, then wakes the window's readers.
    fn append_now(
        &self,
        request: EventRequest<'_>,
        events: &[&[(&str, &[u8])]],
    ) -> Result<Vec<Appended>, StoreError> {
        check_batch(events)?;
        let appended = self.event_window(&request, |log, epoch, now_ms| {
            let mut appended = Vec::with_capacity(events.len());
            for fields in events {
                let id = log.next_id(now_ms)?;
                let prev = log.last;
                let fields = fields
                    .iter()
                    .map(|(name, value)| ((*name).to_owned(), Bytes::copy_from_slice(value)))
                    .collect();
                log.entries.push_back(Entry { id, prev, fields });
                log.last = id;
                appended.push(Appended::new(epoch.clone(), id));
            }
            log.trim(now_ms, request.retention);
            log.touch(now_ms, request.retention);
            Ok::<_, StoreError>(appended)
        })?;
        self.event_wakeups().appended(request.key);
        Ok(appended)
    }
}

#[derive(Default)]
struct Log {
    epoch: Option<Epoch>,
    /// The last id generated (kept or not).
    last: EventId,
    /// Store ms.
    expires_at: u64,
    entries: VecDeque<Entry>,
}

struct Entry {
    id: EventId,
    /// The id generated before this one, to see gaps exactly.
    prev: EventId,
    fields: Vec<(String, Bytes)>,
}

impl Log {
    /// The current epoch, made anew (emptying the window) if it was never
    /// made or expired.
    fn live(&mut self, now_us: u64, request: &EventRequest<'_>) -> Epoch {
        let now_ms = now_us / 1000;
        match &self.epoch {
            Some(epoch) if now_ms < self.expires_at => epoch.clone(),
            _ => {
                let epoch = Epoch::made(format!("{now_us:x}{:016x}", request.nonce));
                *self = Log::default();
                self.epoch = Some(epoch.clone());
                self.touch(now_ms, request.retention);
                epoch
            }
        }
    }

    fn touch(&mut self, now_ms: u64, retention: Retention) {
        self.expires_at = now_ms.saturating_add(retention.ttl_millis());
    }

    fn trim(&mut self, now_ms: u64, retention: Retention) {
        let horizon = now_ms.saturating_sub(retention.window_millis());
        let expired = self.entries.partition_point(|e| e.id.millis() < horizon);
        let max_len = usize::try_from(retention.max_len()).unwrap_or(usize::MAX);
        let excess = self.entries.len().saturating_sub(max_len);
        self.entries.drain(..expired.max(excess));
    }

    fn next_id(&self, now_ms: u64) -> Result<EventId, StoreError> {
        let next = if now_ms > self.last.millis() {
            EventId::new(now_ms, 0)
        } else {
            EventId::new(self.last.millis(), self.last.seq() + 1)
        };
        next.ok_or_else(|| StoreError::invalid("event ids exhausted"))
    }
}

impl events::Backend for MemoryStore {
    fn wakeups(self: Arc<Self>) -> Result<events::EventWakeups, StoreError> {
        Ok(self.event_wakeups().wakeups())
    }

    fn append<'a>(
        &'a self,
        _: &mut Guard<'a>,
        request: EventRequest<'a>,
        fields: &'a [(&'a str, &'a [u8])],
    ) -> Op<'a, Appended> {
        let appended = self.append_now(request, &[fields]);
        Op::ready(appended.map(|mut appended| appended.remove(0)))
    }

    fn append_many<'a>(
        &'a self,
        _: &mut Guard<'a>,
        request: EventRequest<'a>,
        events: &'a [&'a [(&'a str, &'a [u8])]],
    ) -> Op<'a, Vec<Appended>> {
        Op::ready(self.append_now(request, events))
    }

    fn head<'a>(&'a self, _: &mut Guard<'a>, request: EventRequest<'a>) -> Op<'a, Position> {
        Op::ready(Ok(self.event_window(&request, |log, epoch, now_ms| {
            log.touch(now_ms, request.retention);
            Position::new(epoch, (log.last != EventId::ZERO).then_some(log.last))
        })))
    }

    fn read<'a>(
        &'a self,
        _: &mut Guard<'a>,
        request: EventRequest<'a>,
        from: &'a Position,
        limit: u32,
    ) -> Op<'a, Resume> {
        let read = |log: &mut Log, epoch: Epoch, now_ms: u64| {
            if epoch != from.epoch {
                return Resume::Resync(ResyncReason::EpochChanged);
            }
            let after = from.after();
            if after > log.last {
                return Resume::Resync(ResyncReason::Ahead);
            }
            log.trim(now_ms, request.retention);
            let start = log.entries.partition_point(|entry| entry.id <= after);
            // Entries leave only from the front, so the kept ones are a
            // chain: checking the first one after the position is enough
            // (with none after it, the position must be the last id).
            let unbroken = log.entries.get(start).map_or(log.last, |first| first.prev) == after;
            if !unbroken {
                return Resume::Resync(ResyncReason::TooOld);
            }
            let limit = usize::try_from(limit).unwrap_or(usize::MAX);
            let page = log.entries.range(start..).take(limit);
            let events = page.map(|entry| Event::new(entry.id, entry.fields.clone()));
            Resume::Recovered(events.collect())
        };
        Op::ready(check_limit(limit).map(|()| self.event_window(&request, read)))
    }

    fn len<'a>(&'a self, _: &mut Guard<'a>, request: EventRequest<'a>) -> Op<'a, u64> {
        let now_ms = self.clock.now_micros() / 1000;
        let Some(log) = self.event_logs().get(request.key) else {
            return Op::ready(Ok(0));
        };
        let log = lock(&log);
        let live = log.epoch.is_some() && now_ms < log.expires_at;
        Op::ready(Ok(if live { log.entries.len() as u64 } else { 0 }))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use super::*;
    use crate::events::EventWindow;
    use crate::ManualClock;

    /// An idle window expires with its TTL (window + grace on the store's
    /// clock) and comes back with a new epoch: a position in the old one
    /// resyncs; an evicted one does the same.
    #[tokio::test]
    async fn expired_or_evicted_windows_start_a_new_epoch() {
        let clock = ManualClock::new(1_700_000_000_000_000);
        let store = MemoryStore::builder()
            .clock(clock.clone())
            .max_keys(2)
            .build();
        let retention = Retention::new(Duration::from_secs(10), 100).unwrap();
        let events = EventWindow::new(store, retention);
        let joined = events.position("a").await.unwrap();
        events.append("a", &[("d", b"1")]).await.unwrap();
        clock.advance(Duration::from_millis(retention.ttl_millis() - 1));
        assert_eq!(events.position("a").await.unwrap().epoch, joined.epoch);
        clock.advance(Duration::from_millis(retention.ttl_millis()));
        assert_eq!(events.len("a").await.unwrap(), 0);
        let again = events.position("a").await.unwrap();
        assert_ne!(again.epoch, joined.epoch);
        assert_eq!(again.last_id, None);
        assert_eq!(
            events.resume("a", &joined, 10).await.unwrap(),
            Resume::Resync(ResyncReason::EpochChanged)
        );
        // A flood of other windows evicts "a" (capacity 2).
        for i in 0..500 {
            for _ in 0..3 {
                events.position(format!("other-{i}")).await.unwrap();
            }
        }
        let evicted = events.resume("a", &again, 10).await.unwrap();
        assert_eq!(evicted, Resume::Resync(ResyncReason::EpochChanged));
    }
}
