//! [`AuditQuery`] and [`AuditPage`]: reading a tenant's recent records.

use std::time::Duration;

use super::record::{AuditOutcome, AuditRecord};

/// Which of a tenant's records to list, newest first, a page at a time.
///
/// ```
/// use tower_window::audit::{AuditOutcome, AuditQuery};
///
/// let query = AuditQuery::new("acme").subject("alice").outcome(AuditOutcome::Denied).limit(20);
/// assert_eq!(query.limit, 20);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AuditQuery {
    /// The tenant.
    pub tenant: String,
    /// Only this subject's records.
    pub subject: Option<String>,
    /// Only records with this outcome.
    pub outcome: Option<AuditOutcome>,
    /// Only records decided at or after this time (µs since the epoch).
    pub since_micros: Option<u64>,
    /// Only records decided at or before this time (µs since the epoch).
    pub until_micros: Option<u64>,
    /// Only entries older than this one (the previous page's
    /// [`next`](AuditPage::next)).
    pub before: Option<String>,
    /// At most this many records (1 to [`AuditQuery::MAX_LIMIT`]).
    pub limit: usize,
}

impl AuditQuery {
    /// The default page size.
    pub const DEFAULT_LIMIT: usize = 50;
    /// The largest page.
    pub const MAX_LIMIT: usize = 1_000;
    /// The most entries one page looks at (filters that match rarely end a
    /// page early, with a cursor to go on).
    pub const MAX_SCAN: usize = 10_000;

    /// The newest [`DEFAULT_LIMIT`](Self::DEFAULT_LIMIT) records of `tenant`.
    pub fn new(tenant: impl Into<String>) -> Self {
        Self {
            tenant: tenant.into(),
            subject: None,
            outcome: None,
            since_micros: None,
            until_micros: None,
            before: None,
            limit: Self::DEFAULT_LIMIT,
        }
    }

    /// Only `subject`'s records.
    pub fn subject(mut self, subject: impl Into<String>) -> Self {
        self.subject = Some(subject.into());
        self
    }

    /// Only records with `outcome`.
    pub fn outcome(mut self, outcome: AuditOutcome) -> Self {
        self.outcome = Some(outcome);
        self
    }

    /// Only records decided in `[since, until]` (µs since the epoch).
    pub fn between(mut self, since_micros: Option<u64>, until_micros: Option<u64>) -> Self {
        self.since_micros = since_micros;
        self.until_micros = until_micros;
        self
    }

    /// The page after the one whose [`next`](AuditPage::next) is `cursor`.
    pub fn before(mut self, cursor: impl Into<String>) -> Self {
        self.before = Some(cursor.into());
        self
    }

    /// At most `limit` records (clamped to 1..=[`MAX_LIMIT`](Self::MAX_LIMIT)).
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit.clamp(1, Self::MAX_LIMIT);
        self
    }

    /// Whether `record` passes the filters (the tenant and the cursor are
    /// the backend's to apply).
    pub fn matches(&self, record: &AuditRecord) -> bool {
        self.subject.as_ref().is_none_or(|s| *s == record.subject)
            && self.outcome.is_none_or(|o| o == record.outcome)
            && self.since_micros.is_none_or(|t| record.at_micros >= t)
            && self.until_micros.is_none_or(|t| record.at_micros <= t)
    }

    /// Whether entries written before `written_ms` (ms since the epoch)
    /// can still match: a record is written after it is decided.
    pub fn reaches(&self, written_ms: u64) -> bool {
        self.since_micros.is_none_or(|t| written_ms >= t / 1_000)
    }
}

/// One page of an [`AuditQuery`]'s answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct AuditPage {
    /// The records, newest first.
    pub records: Vec<AuditRecord>,
    /// Where the next (older) page starts
    /// ([`AuditQuery::before`]); `None` when there is none.
    pub next: Option<String>,
}

/// A log entry's id: milliseconds and a sequence number, `<ms>-<seq>`,
/// as Redis Streams write them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct EntryId {
    pub(crate) ms: u64,
    pub(crate) seq: u64,
}

impl EntryId {
    pub(crate) fn parse(text: &str) -> Option<Self> {
        let (ms, seq) = text.split_once('-')?;
        Some(Self {
            ms: ms.parse().ok()?,
            seq: seq.parse().ok()?,
        })
    }

    /// The largest id below this one, `None` for the first possible id.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn previous(self) -> Option<Self> {
        match (self.ms, self.seq) {
            (0, 0) => None,
            (ms, 0) => Some(Self {
                ms: ms - 1,
                seq: u64::MAX,
            }),
            (ms, seq) => Some(Self { ms, seq: seq - 1 }),
        }
    }
}

impl std::fmt::Display for EntryId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.ms, self.seq)
    }
}

/// How long and how much of a tenant's log is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Retention {
    /// Entries kept per tenant, about (trimmed in whole blocks on Redis).
    pub max_len: u64,
    /// Entries older than this are trimmed, and a log with no new entry
    /// for this long expires.
    pub max_age: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_ids_order_and_step_back() {
        let id = EntryId::parse("1700-0").unwrap_or_else(|| unreachable!());
        assert_eq!(
            id.previous().map(|p| p.to_string()).as_deref(),
            Some(&*format!("1699-{}", u64::MAX))
        );
        assert!(EntryId::parse("1-2") < EntryId::parse("2-0"));
        assert_eq!(EntryId::parse("0-0").and_then(EntryId::previous), None);
        assert_eq!(EntryId::parse("x-1"), None);
    }
}
