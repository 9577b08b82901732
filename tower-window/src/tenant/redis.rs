//! The tenant registry's Redis side: records, generations and control
//! stream under the hash tag `{tw-tenants}`, and the control-stream reader.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Weak};
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use redis::{FromRedisValue, Value};
use tokio::task::JoinHandle;

use super::backend::{Backend, Recorded};
use super::registry::{Change, Inner};
use super::{ControlConfig, TenantError, TenantRegistry, TenantSpec};
use crate::store::redis::call::{send, Call};
use crate::store::redis::connection::{map_error, Dedicated};
use crate::store::redis::keys::{prefixed_key, Crc16, Sink, CLUSTER_SLOTS};
use crate::store::redis::script::{Functions, LuaScript};
use crate::store::redis::RedisStore;
use crate::store::{Guard, Op, StoreError};

static LIFECYCLE: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new("", include_str!("scripts/lifecycle.lua")));
static LOAD: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new("", include_str!("scripts/load.lua")));

/// The registry's three keys: records, generations, control stream.
fn keys(prefix: &str) -> [Vec<u8>; 3] {
    [
        prefixed_key(prefix, b"{tw-tenants}:records"),
        prefixed_key(prefix, b"{tw-tenants}:generations"),
        prefixed_key(prefix, b"{tw-tenants}:control"),
    ]
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A stream id `ms-seq` as a comparable pair (`(0, 0)` when unreadable).
fn stream_id(id: &str) -> (u64, u64) {
    let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
    (ms.parse().unwrap_or(0), seq.parse().unwrap_or(0))
}

impl Backend for RedisStore {
    fn record<'a>(&'a self, guard: &mut Guard<'a>, change: Recorded<'a>) -> Op<'a, u64> {
        // One script records the change and appends it to the control stream.
        guard.run(move || async move {
            let [records, generations, control] = keys(&self.prefix);
            let (op, spec) = match change.change {
                Change::Init(spec) => ("init", spec.encode()),
                Change::Reset => ("reset", String::new()),
                Change::Close => ("close", String::new()),
                Change::Revert => ("revert", String::new()),
            };
            let mut call = LIFECYCLE.prepare_invoke();
            call.key(records)
                .key(generations)
                .key(control)
                .arg(op)
                .arg(change.tenant)
                .arg(spec)
                .arg(change.control.max_len)
                .arg(millis(change.control.ttl));
            let (_, generation): (String, u64) = self.call(Call::Script(&call)).await?;
            Ok(generation)
        })
    }

    fn failure_domain(&self) -> Option<u16> {
        let mut crc = Crc16::default();
        crc.put(b"tw-tenants");
        self.slot_domain(crc.value() % CLUSTER_SLOTS)
    }

    /// The reader blocks in `XREAD` longer than any store budget, so it
    /// reads on a connection of its own.
    fn follow(
        self: Arc<Self>,
        registry: Weak<Inner>,
        control: ControlConfig,
    ) -> Option<JoinHandle<()>> {
        Some(tokio::spawn(follow(registry, self, control)))
    }
}

type Entry = (String, HashMap<String, String>);

/// The control-stream reader's own connection.
struct Reader {
    conn: Dedicated,
    functions: Functions,
    keys: [Vec<u8>; 3],
}

impl Reader {
    async fn send<T: FromRedisValue>(&self, call: Call<'_>) -> Result<T, redis::RedisError> {
        send(&self.conn.conn, &call, &self.functions).await
    }

    /// Loads the whole runtime state into `registry`; the position to
    /// follow from, or `None` once the registry is gone.
    async fn load(
        &self,
        registry: &Weak<Inner>,
        control: &ControlConfig,
    ) -> Result<Option<Position>, StoreError> {
        let mut call = LOAD.prepare_invoke();
        for key in &self.keys {
            call.key(key.clone());
        }
        call.arg(millis(control.ttl));
        let loaded: (
            String,
            String,
            HashMap<String, String>,
            HashMap<String, u64>,
            i64,
        ) = self.send(Call::Script(&call)).await.map_err(map_error)?;
        let (last_id, _first, records, generations, entries_added) = loaded;
        let Some(inner) = registry.upgrade() else {
            return Ok(None);
        };
        let registry = TenantRegistry { inner };
        let _applying = registry.inner.applying.lock().await;
        let runtime = records.into_iter().filter_map(|(tenant, record)| {
            let record = match record.split_once('\n') {
                Some(("A", spec)) => TenantSpec::decode(spec).map(Some),
                None if record == "C" => Ok(None),
                _ => Err(TenantError::Record(record.chars().take(80).collect())),
            };
            let record = record.inspect_err(|error| {
                tracing::warn!(%error, "skipping an unreadable tenant record");
            });
            Some((tenant, record.ok()?))
        });
        registry.replace_runtime(runtime.collect(), generations);
        Ok(Some(Position {
            last_id: Some(last_id),
            // -1 before Redis 7: unknown.
            seen: u64::try_from(entries_added).ok(),
        }))
    }

    /// Whether an entry after our position was trimmed from the stream:
    /// on Redis 7, whether more than `seen` (the entries added up to our
    /// position) were trimmed (`entries-added - length`); before, whether
    /// the oldest entry left is newer than our position.
    async fn trimmed_past(&self, last_id: &str, seen: Option<u64>) -> Result<bool, StoreError> {
        let mut cmd = redis::cmd("XINFO");
        cmd.arg("STREAM").arg(&self.keys[2]);
        let info: HashMap<String, Value> = match self.send(Call::Cmd(&cmd)).await {
            Ok(info) => info,
            // No stream: nothing was trimmed.
            Err(error)
                if error.kind()
                    == redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError) =>
            {
                return Ok(false)
            }
            Err(error) => return Err(map_error(error)),
        };
        let field = |name: &str| info.get(name).map(redis::from_redis_value_ref);
        if let (Some(Ok(added)), Some(Ok(length)), Some(seen)) =
            (field("entries-added"), field("length"), seen)
        {
            return Ok(u64::saturating_sub(added, length) > seen);
        }
        let first = info.get("first-entry").map(redis::from_redis_value_ref);
        let first: Option<(String, Value)> = first.and_then(Result::ok);
        Ok(last_id != "0-0"
            && first.is_some_and(|(first, _)| stream_id(&first) > stream_id(last_id)))
    }

    /// Entries after `last_id`, waiting up to `block` for one.
    async fn read(&self, last_id: &str, block: Duration) -> Result<Vec<Entry>, StoreError> {
        let mut cmd = redis::cmd("XREAD");
        cmd.arg("COUNT")
            .arg(100)
            .arg("BLOCK")
            .arg(millis(block))
            .arg("STREAMS")
            .arg(&self.keys[2])
            .arg(last_id);
        // One stream: [[stream, entries]], {stream: entries} in RESP3, or nil.
        let streams: Vec<(String, Vec<Entry>)> =
            self.send(Call::Cmd(&cmd)).await.map_err(map_error)?;
        Ok(streams
            .into_iter()
            .flat_map(|(_, entries)| entries)
            .collect())
    }
}

#[derive(Default)]
struct Position {
    /// The last entry applied or loaded; `None`: load first.
    last_id: Option<String>,
    /// Entries added to the stream up to `last_id`, when known.
    seen: Option<u64>,
}

/// The reader: load everything, then follow the stream; after an error,
/// reconnect with backoff and read on from the last id.
async fn follow(registry: Weak<Inner>, store: Arc<RedisStore>, control: ControlConfig) {
    let backoff = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(20))
        .with_max_delay(Duration::from_secs(1))
        .with_jitter()
        .without_max_times();
    let mut delays = backoff.build();
    let mut position = Position::default();
    let mut connected = false;
    while let Err(error) =
        follow_once(&registry, &store, &control, &mut position, &mut connected).await
    {
        tracing::warn!(%error, "tenant control stream: reconnecting");
        if std::mem::take(&mut connected) {
            delays = backoff.build();
        }
        if let Some(delay) = delays.next() {
            tokio::time::sleep(delay).await;
        }
    }
}

/// Follows until the registry is gone (`Ok`) or an error; sets `connected`
/// once loaded.
async fn follow_once(
    registry: &Weak<Inner>,
    store: &RedisStore,
    control: &ControlConfig,
    position: &mut Position,
    connected: &mut bool,
) -> Result<(), StoreError> {
    let reader = Reader {
        conn: store.connection.dedicated().await?,
        functions: store.functions.clone(),
        keys: keys(&store.prefix),
    };
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
            match reader.load(registry, control).await? {
                Some(loaded) => *position = loaded,
                None => return Ok(()),
            }
        }
        *connected = true;
        let from = position.last_id.as_deref().unwrap_or("0-0");
        let entries = reader.read(from, control.block).await?;
        let Some(inner) = registry.upgrade() else {
            return Ok(());
        };
        let registry = TenantRegistry { inner };
        let _applying = registry.inner.applying.lock().await;
        for (id, fields) in entries {
            apply_entry(&registry, &fields);
            position.last_id = Some(id);
            position.seen = position.seen.map(|n| n + 1);
        }
    }
}

fn apply_entry(registry: &TenantRegistry, fields: &HashMap<String, String>) {
    let field = |name: &str| fields.get(name).map(String::as_str);
    let (Some(op), Some(tenant), Some(generation)) = (
        field("op"),
        field("tenant"),
        field("gen").and_then(|g| g.parse::<u64>().ok()),
    ) else {
        tracing::warn!("skipping a malformed tenant control entry");
        return;
    };
    let change = match op {
        "init" => TenantSpec::decode(field("spec").unwrap_or("")).map(Change::Init),
        "reset" => Ok(Change::Reset),
        "close" => Ok(Change::Close),
        "revert" => Ok(Change::Revert),
        _ => return,
    };
    match change {
        Ok(change) => registry.apply(tenant, change, Some(generation), false),
        Err(error) => tracing::warn!(%error, "skipping an unreadable tenant control entry"),
    }
}
