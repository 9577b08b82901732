//! [`audit::Backend`] for [`MemoryStore`]: a bounded log in memory, in
//! the order written, the oldest entry evicted first (over all tenants).
//! Retention by age; by length only the store's bound
//! ([`max_audit_records`](MemoryStoreBuilder::max_audit_records)).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use super::query::EntryId;
use crate::audit::{self, AuditBatch, AuditPage, AuditQuery, AuditRecord};
use crate::store::{Guard, MemoryStore, MemoryStoreBuilder, Op};

/// The audit entries a memory store keeps.
pub(crate) struct AuditEntries {
    log: Mutex<Log>,
    max_entries: usize,
}

#[derive(Default)]
struct Log {
    /// Every tenant's entries with their ids, oldest first.
    entries: VecDeque<(EntryId, AuditRecord)>,
    last: Option<EntryId>,
}

impl AuditEntries {
    fn new(max_entries: usize) -> Self {
        Self {
            log: Mutex::default(),
            max_entries: max_entries.max(1),
        }
    }

    fn log(&self) -> std::sync::MutexGuard<'_, Log> {
        crate::sync::lock(&self.log)
    }

    fn append(&self, batch: &AuditBatch, now_micros: u64) {
        let now_ms = now_micros / 1_000;
        let mut log = self.log();
        for text in batch.records() {
            let id = match log.last {
                Some(last) if last.ms >= now_ms => EntryId {
                    ms: last.ms,
                    seq: last.seq + 1,
                },
                _ => EntryId { ms: now_ms, seq: 0 },
            };
            let Some(record) =
                AuditRecord::from_fields(&batch.tenant, &id.to_string(), [("r", text)])
            else {
                continue; // not a record's text: nothing to keep
            };
            log.last = Some(id);
            log.entries.push_back((id, record));
        }
        let max_age = u64::try_from(batch.retention.max_age.as_millis()).unwrap_or(u64::MAX);
        let oldest_kept = now_ms.saturating_sub(max_age);
        while log.entries.len() > self.max_entries
            || log
                .entries
                .front()
                .is_some_and(|(id, _)| id.ms < oldest_kept)
        {
            log.entries.pop_front();
        }
    }

    fn query(&self, query: &AuditQuery) -> AuditPage {
        let log = self.log();
        let before = query.before.as_deref().and_then(EntryId::parse);
        let mut page = AuditPage::default();
        let (mut scanned, mut last) = (0, None);
        let newest_first = log.entries.iter().rev();
        let tenants = newest_first
            .filter(|(id, r)| r.tenant == query.tenant && before.is_none_or(|b| *id < b));
        for (id, record) in tenants {
            if !query.reaches(id.ms) {
                break;
            }
            if page.records.len() == query.limit || scanned == AuditQuery::MAX_SCAN {
                page.next = last.map(|id: EntryId| id.to_string());
                break;
            }
            (scanned, last) = (scanned + 1, Some(*id));
            if query.matches(record) {
                page.records.push(record.clone());
            }
        }
        page
    }
}

impl MemoryStore {
    /// The default of [`MemoryStoreBuilder::max_audit_records`].
    pub const DEFAULT_MAX_AUDIT_RECORDS: usize = 10_000;

    fn audit_entries(&self) -> Arc<AuditEntries> {
        self.part(|_| Arc::new(AuditEntries::new(Self::DEFAULT_MAX_AUDIT_RECORDS)))
    }
}

impl MemoryStoreBuilder {
    /// The most [audit records](crate::audit) kept, over all tenants
    /// (default [`MemoryStore::DEFAULT_MAX_AUDIT_RECORDS`]; at least 1);
    /// beyond it the oldest go first.
    pub fn max_audit_records(mut self, max: usize) -> Self {
        self.parts.insert(Arc::new(AuditEntries::new(max)));
        self
    }
}

impl audit::Backend for MemoryStore {
    fn append<'a>(&'a self, _: &mut Guard<'a>, batch: &'a AuditBatch) -> Op<'a, ()> {
        self.audit_entries().append(batch, self.clock.now_micros());
        Op::ready(Ok(()))
    }

    fn query<'a>(&'a self, _: &mut Guard<'a>, query: &'a AuditQuery) -> Op<'a, AuditPage> {
        Op::ready(Ok(self.audit_entries().query(query)))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use crate::audit::{AuditLog, AuditOutcome, AuditQuery, AuditRules};
    use crate::{Limiter, ManualClock, MemoryStore, Quota, Store, WindowKey};

    const T0: u64 = 1_700_000_000_000_000;

    fn rig(max_records: usize, max_age: Duration) -> (ManualClock, Limiter, AuditLog) {
        let clock = ManualClock::new(T0);
        let memory = MemoryStore::builder()
            .clock(clock.clone())
            .max_audit_records(max_records)
            .build();
        let store = Store::from(memory);
        let audit = AuditLog::builder(store.clone())
            .rules(AuditRules::default().sample_admissions(1))
            .retention(1_000, max_age)
            .build();
        let limiter = Limiter::builder(store, "2/1m".parse::<Quota>().unwrap())
            .audit(audit.clone())
            .build();
        (clock, limiter, audit)
    }

    #[tokio::test]
    async fn bounded_paged_and_trimmed_by_age() {
        let (clock, limiter, audit) = rig(50, Duration::from_secs(10));
        for i in 0..80 {
            let key = WindowKey::new(if i % 2 == 0 { "a" } else { "b" }, format!("u{}", i % 4));
            limiter.check(&key, 1).await.unwrap();
            clock.advance(Duration::from_millis(1));
        }
        // 80 written, the store keeps the newest 50 (25 per tenant).
        assert_eq!(audit.stats().written, 80);
        let mut seen = Vec::new();
        let mut query = AuditQuery::new("a").limit(4);
        loop {
            let page = audit.query(&query).await.unwrap();
            assert!(page.records.len() <= 4);
            seen.extend(page.records);
            match page.next {
                Some(next) => query = query.before(next),
                None => break,
            }
        }
        assert_eq!(seen.len(), 25);
        assert!(
            seen.windows(2).all(|w| w[0].at_micros > w[1].at_micros),
            "newest first"
        );
        let denied = AuditQuery::new("a")
            .subject("u0")
            .outcome(AuditOutcome::Denied);
        let page = audit.query(&denied).await.unwrap();
        assert!(!page.records.is_empty());
        assert!(page
            .records
            .iter()
            .all(|r| r.subject == "u0" && r.outcome == AuditOutcome::Denied));
        let late = AuditQuery::new("a").between(Some(T0 + 70_000), None);
        let page = audit.query(&late).await.unwrap();
        assert_eq!(
            page.records.len(),
            5,
            "decided at 70..80 ms, every other one tenant a"
        );
        // Past the age kept, the next write trims what is older.
        clock.advance(Duration::from_secs(11));
        limiter
            .check(&WindowKey::new("a", "late"), 1)
            .await
            .unwrap();
        let page = audit.query(&AuditQuery::new("a")).await.unwrap();
        assert_eq!(page.records.len(), 1);
        assert_eq!(page.records[0].subject, "late");
    }
}
