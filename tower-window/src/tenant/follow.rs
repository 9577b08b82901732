//! The control-stream reader on Redis: a background task per registry
//! that loads the whole runtime state, then follows the stream on a
//! connection of its own (it blocks in `XREAD`, which would hold a shared
//! connection and the store's budget).

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};

use super::control::ControlConfig;
use super::redis::{millis, Entry, Loaded, TenantReader};
use super::registry::{Change, Inner, Record};
use super::{TenantError, TenantRegistry, TenantSpec};
use crate::store::StoreError;
use crate::RedisStore;

/// The reader: load everything, then follow the stream from the loaded
/// id. After an error it reconnects (with backoff) and reads on from its
/// last id, so a node that was cut off catches up with what it missed;
/// if that id was trimmed from the stream meanwhile, it loads everything
/// again instead.
pub(crate) async fn follow(registry: Weak<Inner>, store: Arc<RedisStore>, config: ControlConfig) {
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
    reader: &mut TenantReader,
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
