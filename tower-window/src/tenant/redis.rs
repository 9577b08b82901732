//! The tenant registry's Redis side: its records, generations and control
//! stream (see [`crate::tenant`]), all under the hash tag `{tw-tenants}`.

use std::sync::{Arc, LazyLock, Weak};
use std::time::Duration;

use redis::Value;
use tokio::task::JoinHandle;

use super::backend::{Backend, Recorded};
use super::registry::{Change, Inner};
use super::ControlConfig;
use crate::store::redis::call::{send, Call};
use crate::store::redis::connection::{map_error, Conn, Dedicated};
use crate::store::redis::keys::{prefixed_key, Crc16, Sink, CLUSTER_SLOTS};
use crate::store::redis::script::LuaScript;
use crate::store::redis::RedisStore;
use crate::store::{Guard, Op, StoreError, StoreErrorKind};
use crate::tenant::stream_id;

static LIFECYCLE: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(include_str!("scripts/lifecycle.lua")));
static LOAD: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(include_str!("scripts/load.lua")));

/// The registry's three keys: records, generations, control stream.
fn keys(prefix: &str) -> [Vec<u8>; 3] {
    [
        prefixed_key(prefix, b"{tw-tenants}:records"),
        prefixed_key(prefix, b"{tw-tenants}:generations"),
        prefixed_key(prefix, b"{tw-tenants}:control"),
    ]
}

/// The hash slot of the registry's keys (their tag, `tw-tenants`).
fn tenants_slot() -> u16 {
    let mut crc = Crc16::default();
    crc.put(b"tw-tenants");
    crc.value() % CLUSTER_SLOTS
}

pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Backend for RedisStore {
    fn record<'a>(&'a self, guard: &mut Guard<'a>, change: Recorded<'a>) -> Op<'a, u64> {
        guard.run(move || self.tenant_change(change))
    }

    fn failure_domain(&self) -> Option<u16> {
        self.slot_domain(tenants_slot())
    }

    /// The control-stream reader, on a connection of its own (see
    /// `follow.rs`): it blocks in `XREAD` for up to
    /// [`block`](ControlConfig::block), longer than any store budget, and
    /// would otherwise hold one of the store's shared connections.
    fn follow(
        self: Arc<Self>,
        registry: Weak<Inner>,
        control: ControlConfig,
    ) -> Option<JoinHandle<()>> {
        Some(tokio::spawn(super::follow::follow(registry, self, control)))
    }
}

/// The runtime state as one atomic read.
pub(crate) struct Loaded {
    pub(crate) last_id: String,
    /// Entries ever added to the stream up to `last_id` (`None` before Redis 7).
    pub(crate) entries_added: Option<u64>,
    pub(crate) records: Vec<(String, String)>,
    pub(crate) generations: Vec<(String, u64)>,
}

/// One control-stream entry.
pub(crate) struct Entry {
    pub(crate) id: String,
    pub(crate) fields: Vec<(String, String)>,
}

impl Entry {
    pub(crate) fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

fn protocol(what: &str) -> StoreError {
    StoreError::new(
        StoreErrorKind::Protocol,
        format!("unexpected tenant registry reply: {what}"),
    )
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        _ => None,
    }
}

fn items(value: &Value) -> Option<Vec<&Value>> {
    match value {
        Value::Array(items) | Value::Set(items) => Some(items.iter().collect()),
        Value::Map(pairs) => Some(pairs.iter().flat_map(|(k, v)| [k, v]).collect()),
        _ => None,
    }
}

fn pairs(value: &Value) -> Option<Vec<(String, String)>> {
    let flat = items(value)?;
    flat.chunks_exact(2)
        .map(|pair| Some((text(pair[0])?, text(pair[1])?)))
        .collect()
}

async fn query(conn: &Conn, cmd: &redis::Cmd) -> Result<Value, redis::RedisError> {
    send(conn, &Call::Cmd(cmd)).await
}

impl RedisStore {
    /// Records one lifecycle change and appends it to the control stream,
    /// atomically (one script); the tenant's generation after it.
    async fn tenant_change(&self, recorded: Recorded<'_>) -> Result<u64, StoreError> {
        let [records, generations, control] = keys(&self.prefix);
        let (op, spec) = match recorded.change {
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
            .arg(recorded.tenant)
            .arg(spec)
            .arg(recorded.control.max_len)
            .arg(millis(recorded.control.ttl));
        let (_, generation): (String, String) = self.call(Call::Script(&call)).await?;
        generation.parse().map_err(|_| protocol("generation"))
    }

    /// A connection of its own for the registry's control-stream reader.
    pub(crate) async fn tenant_reader(&self) -> Result<TenantReader, StoreError> {
        Ok(TenantReader {
            conn: self.connection.dedicated().await?,
            keys: keys(&self.prefix),
        })
    }
}

/// The control-stream reader's own connection (it blocks in `XREAD`).
pub(crate) struct TenantReader {
    conn: Dedicated,
    keys: [Vec<u8>; 3],
}

impl TenantReader {
    /// Reads the whole runtime state and the stream's first and last ids,
    /// atomically, refreshing the keys' TTL.
    pub(crate) async fn load(&mut self, ttl_ms: u64) -> Result<Loaded, StoreError> {
        let mut call = LOAD.prepare_invoke();
        for key in &self.keys {
            call.key(key.clone());
        }
        call.arg(ttl_ms);
        let reply: Value = send(&self.conn.conn, &Call::Script(&call))
            .await
            .map_err(map_error)?;
        let parts = items(&reply).ok_or_else(|| protocol("load"))?;
        let [last, _first, records, generations, added] = parts[..] else {
            return Err(protocol("load arity"));
        };
        let generations = pairs(generations)
            .ok_or_else(|| protocol("generations"))?
            .into_iter()
            .map(|(k, v)| Ok((k, v.parse().map_err(|_| protocol("generation"))?)))
            .collect::<Result<_, StoreError>>()?;
        Ok(Loaded {
            last_id: text(last).ok_or_else(|| protocol("last id"))?,
            entries_added: match added {
                Value::Int(n) => u64::try_from(*n).ok(),
                _ => None,
            },
            records: pairs(records).ok_or_else(|| protocol("records"))?,
            generations,
        })
    }

    /// Whether an entry after our position was trimmed from the stream.
    ///
    /// `seen` counts the entries ever added up to our position (`None`
    /// when unknown). `MAXLEN` trims from the oldest end, so the trimmed
    /// entries are the first `entries-added - length` ever added: some of
    /// them come after our position exactly when there are more of them
    /// than `seen` (`XINFO STREAM`, Redis 7). Before Redis 7: whether the
    /// oldest entry left is newer than a position other than the start.
    pub(crate) async fn trimmed_past(
        &mut self,
        last_id: &str,
        seen: Option<u64>,
    ) -> Result<bool, StoreError> {
        let mut cmd = redis::cmd("XINFO");
        cmd.arg("STREAM").arg(&self.keys[2]);
        let reply = match query(&self.conn.conn, &cmd).await {
            Ok(reply) => reply,
            // No stream (yet, or it expired): nothing after us was trimmed.
            Err(error)
                if error.kind()
                    == redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError) =>
            {
                return Ok(false)
            }
            Err(error) => return Err(map_error(error)),
        };
        let info = items(&reply).ok_or_else(|| protocol("xinfo"))?;
        let field = |name: &str| {
            info.chunks_exact(2)
                .find(|pair| text(pair[0]).as_deref() == Some(name))
                .map(|pair| pair[1])
        };
        let number = |name: &str| {
            field(name)
                .and_then(text)
                .and_then(|n| n.parse::<u64>().ok())
        };
        if let (Some(added), Some(length), Some(seen)) =
            (number("entries-added"), number("length"), seen)
        {
            return Ok(added.saturating_sub(length) > seen);
        }
        let first = field("first-entry")
            .and_then(items)
            .and_then(|entry| entry.first().and_then(|id| text(id)));
        Ok(last_id != "0-0" && first.is_some_and(|first| stream_id(&first) > stream_id(last_id)))
    }

    /// Entries after `last_id`, waiting up to `block_ms` for one.
    pub(crate) async fn read(
        &mut self,
        last_id: &str,
        block_ms: u64,
        count: u64,
    ) -> Result<Vec<Entry>, StoreError> {
        let mut cmd = redis::cmd("XREAD");
        cmd.arg("COUNT")
            .arg(count)
            .arg("BLOCK")
            .arg(block_ms)
            .arg("STREAMS")
            .arg(&self.keys[2])
            .arg(last_id);
        let reply = query(&self.conn.conn, &cmd).await.map_err(map_error)?;
        if matches!(reply, Value::Nil) {
            return Ok(Vec::new());
        }
        // One stream: [[stream, [[id, [field, value, ...]], ...]]], or
        // {stream: [...]} in RESP3.
        let entries = match &reply {
            Value::Map(streams) => streams.first().map(|(_, entries)| entries),
            Value::Array(streams) => streams.first().and_then(|stream| match stream {
                Value::Array(pair) => pair.get(1),
                _ => None,
            }),
            _ => None,
        }
        .ok_or_else(|| protocol("xread"))?;
        entries_of(entries)
    }
}

fn entries_of(value: &Value) -> Result<Vec<Entry>, StoreError> {
    let entries = items(value).ok_or_else(|| protocol("xread entries"))?;
    entries
        .into_iter()
        .map(|entry| {
            let parts = items(entry).ok_or_else(|| protocol("xread entry"))?;
            let [id, fields] = parts[..] else {
                return Err(protocol("xread entry arity"));
            };
            Ok(Entry {
                id: text(id).ok_or_else(|| protocol("xread id"))?,
                fields: pairs(fields).ok_or_else(|| protocol("xread fields"))?,
            })
        })
        .collect()
}
