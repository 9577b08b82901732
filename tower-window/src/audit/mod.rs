//! [`AuditLog`]: the decision audit trail — who was limited, by which
//! quota, when, and who decided — durable, bounded, queryable, and off the
//! request path.
//!
//! A [`Limiter`](crate::Limiter) built with
//! [`audit`](crate::LimiterBuilder::audit) hands each decision to the log,
//! which keeps the ones its tenant's [`AuditRules`] ask for (denials,
//! degraded decisions, shadow denials, admin changes, one admission in N)
//! in a bounded buffer. A background task writes them in batches, one call
//! per tenant per batch, all of a round in flight at once (pipelined on
//! each node). A request never waits for the log: a store outage keeps
//! records back while the buffer has room, then drops new ones and counts
//! them (`tower_window_audit_records_total{outcome="dropped_full"}`).
//!
//! Each batch carries this node's id and a sequence number, and the store
//! applies a batch once: a batch retried after an answer was lost is not
//! written twice, so a record is written at most once and, unless counted
//! as dropped, exactly once. A tenant's later records are not written
//! before its earlier ones.
//!
//! On Redis each tenant's log is a stream, `<prefix>{@<tenant>}:#audit`
//! (one tenant's records share a slot; tenants spread over the cluster),
//! trimmed by length (`MAXLEN ~`) and age (`MINID ~`, on Redis's clock),
//! and expiring when nothing was written for the retention period. The
//! embedded store keeps a bounded log in memory and answers the same
//! [`AuditQuery`]s.
//!
//! ```
//! use tower_window::audit::{AuditLog, AuditOutcome, AuditQuery};
//! use tower_window::{Limiter, Quota, Store, WindowKey};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let store = Store::memory();
//! let audit = AuditLog::builder(store.clone()).build();
//! let limiter = Limiter::builder(store, "1/1m".parse::<Quota>()?).audit(audit.clone()).build();
//! let key = WindowKey::new("acme", "alice");
//! assert!(limiter.check(&key, 1).await?.allowed());
//! assert!(!limiter.check(&key, 1).await?.allowed());
//! audit.flush().await;
//! let page = audit.query(&AuditQuery::new("acme")).await?;
//! assert_eq!(page.records.len(), 1);
//! assert_eq!((page.records[0].subject.as_str(), page.records[0].outcome), ("alice", AuditOutcome::Denied));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

use crate::metrics::{Calls, LimiterMetrics};
use crate::store::{Guard, Op, Store, StoreError};
use crate::{Decision, WindowKey};

mod buffer;
mod memory;
mod query;
mod record;
#[cfg(feature = "redis")]
mod redis;
mod rules;

use buffer::Buffer;
pub use query::{AuditPage, AuditQuery, Retention};
use record::Fields;
pub use record::{AdminAction, AuditOutcome, AuditRecord, UnknownName, MAX_SUBJECT_LEN};
pub use rules::AuditRules;

/// Records of one tenant, in order, written together and at most once.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AuditBatch {
    /// The tenant whose log they go to.
    pub tenant: String,
    /// The writing node's id.
    pub node: String,
    /// The batch's number: increasing per node, from the store clock's
    /// reading (µs) when the log was built, so a node restarted under the
    /// same id goes on above its last number; a backend applies a batch
    /// only if its number is above the last one it applied from `node`
    /// for `tenant`.
    pub seq: u64,
    /// How much of the tenant's log to keep.
    pub retention: Retention,
    /// The records' texts, one after another.
    text: String,
    /// Where each record's text ends in `text`.
    ends: Vec<usize>,
}

impl AuditBatch {
    /// The records, oldest first, each as its entry's text
    /// ([`AuditRecord::encode`]; [`AuditRecord::from_fields`] reads it
    /// back): what Redis stores, written once, when the decision was
    /// recorded.
    pub fn records(&self) -> impl ExactSizeIterator<Item = &str> {
        (0..self.ends.len()).map(|i| {
            let start = i.checked_sub(1).map_or(0, |before| self.ends[before]);
            self.text.get(start..self.ends[i]).unwrap_or_default()
        })
    }

    /// How many records it holds.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    fn push(&mut self, record: &str) {
        self.text.push_str(record);
        self.ends.push(self.text.len());
    }
}

/// What a backend does for audit logs, implemented by
/// [`MemoryStore`](crate::MemoryStore) and (feature `redis`)
/// [`RedisStore`](crate::RedisStore).
pub trait Backend: Send + Sync + 'static {
    /// Appends `batch` to its tenant's log, unless a batch of the same node
    /// with a number at least `batch.seq` was applied there; trims the log
    /// to `batch.retention`.
    fn append<'a>(&'a self, guard: &mut Guard<'a>, batch: &'a AuditBatch) -> Op<'a, ()>;

    /// A page of `query`'s tenant's records, newest first.
    fn query<'a>(&'a self, guard: &mut Guard<'a>, query: &'a AuditQuery) -> Op<'a, AuditPage>;

    /// The failure domain of `tenant`'s log (see
    /// [`limit::Backend::failure_domain`](crate::limit::Backend::failure_domain)).
    fn failure_domain(&self, tenant: &str) -> Option<u16> {
        let _ = tenant;
        None
    }
}

/// Counts of an [`AuditLog`]'s records since it was built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct AuditStats {
    /// Records handed to the buffer.
    pub recorded: u64,
    /// Records written to the log.
    pub written: u64,
    /// Records dropped because the buffer was full.
    pub dropped_full: u64,
    /// Records dropped because the log refused them (not for being
    /// unreachable: those wait).
    pub dropped_failed: u64,
    /// Records waiting in the buffer.
    pub buffered: u64,
}

/// The decision audit trail on a store (see the [module docs](self)).
/// Cheap to clone: clones are the same log.
#[derive(Clone)]
pub struct AuditLog {
    inner: Arc<Inner>,
}

struct Inner {
    store: Store,
    backend: Option<Arc<dyn Backend>>,
    metrics: Arc<LimiterMetrics>,
    node: String,
    default_rules: AuditRules,
    tenant_rules: ArcSwap<HashMap<String, AuditRules>>,
    admissions: AtomicU64,
    retention: Retention,
    buffer: Buffer,
}

impl AuditLog {
    /// The default buffer size, in records.
    pub const DEFAULT_CAPACITY: usize = 10_000;
    /// The default most records written per round.
    pub const DEFAULT_MAX_BATCH: usize = 512;
    /// The default pause between rounds.
    pub const DEFAULT_FLUSH_INTERVAL: Duration = Duration::from_millis(50);
    /// The default retention: 100,000 entries per tenant, 7 days.
    pub const DEFAULT_RETENTION: Retention = Retention {
        max_len: 100_000,
        max_age: Duration::from_secs(7 * 24 * 3600),
    };

    /// A builder for a log on `store`.
    pub fn builder(store: impl Into<Store>) -> AuditLogBuilder {
        AuditLogBuilder {
            store: store.into(),
            rules: AuditRules::default(),
            capacity: Self::DEFAULT_CAPACITY,
            max_batch: Self::DEFAULT_MAX_BATCH,
            flush_interval: Self::DEFAULT_FLUSH_INTERVAL,
            retention: Self::DEFAULT_RETENTION,
            node: None,
        }
    }

    /// This node's id in the records it writes.
    pub fn node(&self) -> &str {
        &self.inner.node
    }

    /// The rules of `tenant`: its own, else the log's default.
    pub fn rules(&self, tenant: &str) -> AuditRules {
        let inner = &*self.inner;
        let own = inner.tenant_rules.load();
        own.get(tenant).copied().unwrap_or(inner.default_rules)
    }

    /// Sets `tenant`'s own rules (`None`: the default's again).
    pub fn set_tenant_rules(&self, tenant: &str, rules: Option<AuditRules>) {
        self.inner.tenant_rules.rcu(|all| {
            let mut all = HashMap::clone(all);
            match rules {
                Some(rules) => all.insert(tenant.to_owned(), rules),
                None => all.remove(tenant),
            };
            all
        });
    }

    /// Records `decision` for `key` under the policy named `policy`, if
    /// the tenant's rules want it. Never waits and never fails: the
    /// record is buffered, or counted as dropped.
    pub fn decision(&self, key: &WindowKey, policy: &str, decision: &Decision) {
        let inner = &*self.inner;
        let rules = if inner.tenant_rules.load().is_empty() {
            inner.default_rules
        } else {
            self.rules(&String::from_utf8_lossy(key.tenant()))
        };
        if let Some(outcome) = rules.outcome(decision, &inner.admissions) {
            let record = Fields::of_decision(key, policy, decision, outcome, &inner.node);
            buffer::push(&self.inner, &record);
        }
    }

    /// Records an admin change to `tenant`, if its rules want them.
    pub fn admin_change(&self, tenant: &str, action: AdminAction) {
        if self.rules(tenant).admin {
            let inner = &*self.inner;
            let now = inner.store.clock().now_micros();
            let record = AuditRecord::of_change(tenant, action, now, &inner.node);
            buffer::push(&self.inner, &record.fields());
        }
    }

    /// A page of records (see [`AuditQuery`]). Records still in this
    /// node's buffer are not in it yet ([`flush`](Self::flush) first).
    pub async fn query(&self, query: &AuditQuery) -> Result<AuditPage, StoreError> {
        let inner = &*self.inner;
        if inner.store.is_in_process() {
            // What a concurrent record left behind (it found a round on).
            buffer::flush(&self.inner, Duration::ZERO).await;
        }
        let tenant = query.tenant.as_str();
        inner
            .store
            .call(
                inner.backend.as_deref(),
                "audit logs",
                |backend| backend.failure_domain(tenant),
                Calls::to(&inner.metrics, None),
                |backend, guard| backend.query(guard, query),
            )
            .await
    }

    /// Writes what is buffered now; `true` once it is written (or
    /// dropped), `false` if the store is still failing after the store's
    /// time budget times ten (at least a second).
    pub async fn flush(&self) -> bool {
        let budget = self.inner.store.timeout().unwrap_or_default() * 10;
        buffer::flush(&self.inner, budget.max(Duration::from_secs(1))).await
    }

    /// Counts since the log was built.
    pub fn stats(&self) -> AuditStats {
        self.inner.buffer.stats()
    }
}

impl fmt::Debug for AuditLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = &*self.inner;
        f.debug_struct("AuditLog")
            .field("node", &inner.node)
            .field("rules", &inner.default_rules)
            .field("retention", &inner.retention)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

/// Builds an [`AuditLog`]; see [`AuditLog::builder`].
#[derive(Debug)]
#[must_use]
pub struct AuditLogBuilder {
    store: Store,
    rules: AuditRules,
    capacity: usize,
    max_batch: usize,
    flush_interval: Duration,
    retention: Retention,
    node: Option<String>,
}

impl AuditLogBuilder {
    /// The rules of tenants without their own (default
    /// [`AuditRules::default`]).
    pub fn rules(mut self, rules: AuditRules) -> Self {
        self.rules = rules;
        self
    }

    /// Records buffered at most (default [`AuditLog::DEFAULT_CAPACITY`];
    /// at least 1); past it new records are dropped and counted.
    pub fn capacity(mut self, records: usize) -> Self {
        self.capacity = records.max(1);
        self
    }

    /// Records written per round at most (default
    /// [`AuditLog::DEFAULT_MAX_BATCH`]; at least 1).
    pub fn max_batch(mut self, records: usize) -> Self {
        self.max_batch = records.max(1);
        self
    }

    /// The pause between rounds while the buffer holds less than a batch
    /// (default [`AuditLog::DEFAULT_FLUSH_INTERVAL`]).
    pub fn flush_interval(mut self, interval: Duration) -> Self {
        self.flush_interval = interval.max(Duration::from_millis(1));
        self
    }

    /// How much of each tenant's log is kept (default
    /// [`AuditLog::DEFAULT_RETENTION`]; at least 1 entry and 1 s).
    pub fn retention(mut self, max_len: u64, max_age: Duration) -> Self {
        self.retention = Retention {
            max_len: max_len.max(1),
            max_age: max_age.max(Duration::from_secs(1)),
        };
        self
    }

    /// This node's id in its records (default: 16 random hex digits).
    pub fn node(mut self, node: impl Into<String>) -> Self {
        self.node = Some(node.into());
        self
    }

    /// Builds the log. On a store behind a network, its writer runs on
    /// the tokio runtime of the first record (until the log is dropped).
    pub fn build(self) -> AuditLog {
        let node = self
            .node
            .unwrap_or_else(|| format!("{:016x}", fastrand::u64(..)));
        let first_seq = self.store.clock().now_micros();
        AuditLog {
            inner: Arc::new(Inner {
                backend: crate::store::plugged!(self.store, dyn Backend),
                store: self.store,
                metrics: LimiterMetrics::named("audit"),
                node,
                default_rules: self.rules,
                tenant_rules: ArcSwap::default(),
                admissions: AtomicU64::new(0),
                retention: self.retention,
                buffer: Buffer::new(
                    self.capacity,
                    self.max_batch,
                    self.flush_interval,
                    first_seq,
                ),
            }),
        }
    }
}

impl crate::store::Backend {
    /// With audit logs.
    pub fn with_audit(self, audit: impl Backend) -> Self {
        self.with_part::<dyn Backend>(Arc::new(audit))
    }
}
