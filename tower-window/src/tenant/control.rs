//! The control channel on Redis: lifecycle changes written with their
//! records in one script, and a background reader per registry that
//! follows the control stream on a connection of its own.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use tokio::task::JoinHandle;

use super::registry::{Change, Inner, Record};
use super::{TenantError, TenantRegistry, TenantSpec, TenantsConfig};
use crate::store::{StoreError, StoreErrorKind};
use crate::tenant::redis::{Entry, Loaded};
use crate::RedisStore;

/// How the registry uses Redis; see [`TenantRegistry::redis`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ControlConfig {
    /// Approximate length the control stream is trimmed to (`MAXLEN ~`).
    pub max_len: u64,
    /// TTL of the records, generations and stream, refreshed by every
    /// change and every node's load (default 30 days).
    pub ttl: Duration,
    /// How long one `XREAD` blocks (default 500 ms; an entry ends it at once).
    pub block: Duration,
    /// How long a lifecycle call may take, retries included (default 2 s).
    pub timeout: Duration,
}

impl Default for ControlConfig {
    fn default() -> Self {
        Self {
            max_len: 1000,
            ttl: Duration::from_secs(30 * 24 * 3600),
            block: Duration::from_millis(500),
            timeout: Duration::from_secs(2),
        }
    }
}

impl ControlConfig {
    /// Sets [`max_len`](Self::max_len).
    #[must_use]
    pub fn max_len(mut self, max_len: u64) -> Self {
        self.max_len = max_len;
        self
    }

    /// Sets [`ttl`](Self::ttl).
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Sets [`block`](Self::block).
    #[must_use]
    pub fn block(mut self, block: Duration) -> Self {
        self.block = block;
        self
    }

    /// Sets [`timeout`](Self::timeout).
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
}

pub(crate) struct Control {
    store: Arc<RedisStore>,
    config: ControlConfig,
    reader: JoinHandle<()>,
}

impl Drop for Control {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Control {
    /// Records `change` and announces it; the tenant's generation after it.
    /// Retried (with backoff, within the timeout) only when Redis certainly
    /// did not run the script.
    pub(crate) async fn publish(&self, tenant: &str, change: &Change) -> Result<u64, TenantError> {
        let (op, spec) = match change {
            Change::Init(spec) => ("init", spec.encode()),
            Change::Reset => ("reset", String::new()),
            Change::Close => ("close", String::new()),
            Change::Revert => ("revert", String::new()),
        };
        let attempt = || async {
            self.store
                .tenant_change(
                    op,
                    tenant,
                    &spec,
                    self.config.max_len,
                    millis(self.config.ttl),
                )
                .await
        };
        let mut delays = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(10))
            .with_max_delay(Duration::from_millis(200))
            .with_max_times(5)
            .build();
        let work = async {
            loop {
                match attempt().await {
                    Err(error) if error.is_retryable() => match delays.next() {
                        Some(delay) => tokio::time::sleep(delay).await,
                        None => return Err(error),
                    },
                    other => return other,
                }
            }
        };
        match tokio::time::timeout(self.config.timeout, work).await {
            Ok(result) => result.map_err(TenantError::Store),
            Err(_) => Err(TenantError::Store(StoreError::new(
                StoreErrorKind::Timeout,
                "tenant lifecycle change timed out",
            ))),
        }
    }
}

impl TenantRegistry {
    /// A registry of `config` whose lifecycle changes persist in `store`'s
    /// Redis and reach every registry on it: see the [module docs](super).
    ///
    /// Spawns the control-stream reader on the current Tokio runtime; it
    /// first loads the whole runtime state ([`loaded`](Self::loaded) waits
    /// for that), then follows the stream. Dropping the last clone of the
    /// registry stops it.
    pub fn redis(config: TenantsConfig, store: Arc<RedisStore>) -> Self {
        Self::redis_with(config, store, ControlConfig::default())
    }

    /// [`redis`](Self::redis) with explicit settings.
    pub fn redis_with(
        config: TenantsConfig,
        store: Arc<RedisStore>,
        control: ControlConfig,
    ) -> Self {
        // The reader starts once the registry exists: upgrading its weak
        // handle before that would read as "the registry is gone".
        let (start, started) = tokio::sync::oneshot::channel();
        let registry = Self::with_parts(config, |weak| {
            let reader = tokio::spawn({
                let (weak, store, control) = (weak.clone(), Arc::clone(&store), control.clone());
                async move {
                    if started.await.is_ok() {
                        follow(weak, store, control).await;
                    }
                }
            });
            Some(Control {
                store,
                config: control,
                reader,
            })
        });
        let _ = start.send(());
        registry
    }
}

/// The reader: load everything, then follow the stream from the loaded
/// id. After an error it reconnects (with backoff) and reads on from its
/// last id, so a node that was cut off catches up with what it missed;
/// if that id was trimmed from the stream meanwhile, it loads everything
/// again instead.
async fn follow(registry: Weak<Inner>, store: Arc<RedisStore>, config: ControlConfig) {
    let backoff = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(20))
        .with_max_delay(Duration::from_secs(1))
        .with_jitter()
        .without_max_times();
    let mut delays = backoff.build();
    let mut position = Position::default();
    loop {
        match follow_once(&registry, &store, &config, &mut position, &mut || {
            delays = backoff.build();
        })
        .await
        {
            Ok(()) => return, // the registry is gone
            Err(error) => {
                tracing::warn!(%error, "tenant control stream: reconnecting");
                if let Some(delay) = delays.next() {
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }
}

async fn follow_once(
    registry: &Weak<Inner>,
    store: &RedisStore,
    config: &ControlConfig,
    position: &mut Position,
    connected: &mut (dyn FnMut() + Send),
) -> Result<(), StoreError> {
    let mut reader = store.tenant_reader().await?;
    loop {
        let reload = match position.last_id.as_deref() {
            None => true,
            Some(last) => {
                let trimmed = reader.trimmed_past(last, position.seen).await?;
                if trimmed {
                    tracing::info!("tenant control stream trimmed past this node: reloading");
                }
                trimmed
            }
        };
        if reload {
            match load(registry, &mut reader, config).await? {
                Some(loaded) => *position = loaded,
                None => return Ok(()),
            }
        }
        connected();
        let from = position.last_id.clone().unwrap_or_else(|| "0-0".to_owned());
        let entries = reader.read(&from, millis(config.block), 100).await?;
        let Some(inner) = registry.upgrade() else {
            return Ok(());
        };
        let registry = TenantRegistry { inner };
        for entry in entries {
            apply_entry(&registry, &entry);
            position.last_id = Some(entry.id);
            position.seen = position.seen.map(|n| n + 1);
        }
    }
}

/// Where a reader is in the control stream.
#[derive(Default)]
struct Position {
    /// The last entry applied (or the last at the load); `None`: load first.
    last_id: Option<String>,
    /// Entries ever added to the stream up to `last_id`, when known.
    seen: Option<u64>,
}

/// Loads the whole runtime state into the registry; the position to
/// follow from, or `None` once the registry is gone.
async fn load(
    registry: &Weak<Inner>,
    reader: &mut crate::tenant::redis::TenantReader,
    config: &ControlConfig,
) -> Result<Option<Position>, StoreError> {
    let Loaded {
        last_id,
        entries_added,
        records,
        generations,
    } = reader.load(millis(config.ttl)).await?;
    let Some(inner) = registry.upgrade() else {
        return Ok(None);
    };
    let registry = TenantRegistry { inner };
    let mut runtime = HashMap::new();
    for (tenant, record) in records {
        match decode_record(&record) {
            Ok(record) => {
                runtime.insert(tenant, record);
            }
            Err(error) => tracing::warn!(%error, "skipping an unreadable tenant record"),
        }
    }
    registry.replace_runtime(runtime, generations.into_iter().collect());
    registry.inner.loaded.send_modify(|n| *n += 1);
    Ok(Some(Position {
        last_id: Some(last_id),
        seen: entries_added,
    }))
}

fn decode_record(record: &str) -> Result<Record, TenantError> {
    match record.split_once('\n') {
        Some(("A", spec)) => TenantSpec::decode(spec).map(Record::Active),
        None if record == "C" => Ok(Record::Closed),
        _ => Err(TenantError::Record(record.chars().take(80).collect())),
    }
}

fn apply_entry(registry: &TenantRegistry, entry: &Entry) {
    let (Some(op), Some(tenant), Some(generation)) = (
        entry.field("op"),
        entry.field("tenant"),
        entry.field("gen").and_then(|g| g.parse::<u64>().ok()),
    ) else {
        tracing::warn!("skipping a malformed tenant control entry");
        return;
    };
    let change = match op {
        "init" => match TenantSpec::decode(entry.field("spec").unwrap_or("")) {
            Ok(spec) => Change::Init(spec),
            Err(error) => {
                tracing::warn!(%error, "skipping an unreadable tenant control entry");
                return;
            }
        },
        "reset" => Change::Reset,
        "close" => Change::Close,
        "revert" => Change::Revert,
        _ => return,
    };
    registry.apply(tenant, change, Some(generation));
}
