//! [`events::Backend`] for [`RedisStore`]: event windows on Redis Streams.
//!
//! A window `key` is two keys in one hash slot: the stream
//! `<prefix>ev:{<key>}:s` and its meta hash `<prefix>ev:{<key>}:m` (epoch,
//! the primary's replication id, last id, count), `<key>` escaped by
//! `encode_component`; the `ev:` before the brace keeps them apart from
//! rate-limit windows. Each operation is one call of `events.lua`.

use std::sync::LazyLock;

use bytes::Bytes;
use redis::{FromRedisValue, Value};

use crate::events::{
    self as events, check_batch, check_limit, Appended, Epoch, Event, EventId, EventRequest,
    Position, Resume, ResyncReason,
};
use crate::store::redis::call::Call;
use crate::store::redis::keys::{encode_component, write_prefix, Crc16, CLUSTER_SLOTS};
use crate::store::redis::script::{LuaScript, ScriptCall};
use crate::store::redis::RedisStore;
use crate::store::{Guard, Op, StoreError};

static SCRIPT: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new("", include_str!("events.lua")));

/// Our own fields (`p` prev id, `n` number, `e` epoch) before the event's.
const OWN_FIELDS: usize = 6;

/// The stream key and the meta key.
pub(crate) fn event_keys(prefix: &str, key: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let mut stream = Vec::with_capacity(prefix.len() + key.len() + 12);
    write_prefix(&mut stream, prefix);
    stream.extend_from_slice(b"ev:{");
    encode_component(&mut stream, key);
    stream.extend_from_slice(b"}:");
    let mut meta = stream.clone();
    stream.push(b's');
    meta.push(b'm');
    (stream, meta)
}

pub(crate) fn event_slot(key: &[u8]) -> u16 {
    let mut crc = Crc16::default();
    encode_component(&mut crc, key);
    crc.value() % CLUSTER_SLOTS
}

pub(crate) fn text(value: &Value) -> Result<&[u8], StoreError> {
    match value {
        Value::BulkString(bytes) => Ok(bytes),
        Value::SimpleString(text) => Ok(text.as_bytes()),
        _ => Err(StoreError::protocol(
            "redis event script: expected a string",
        )),
    }
}

pub(crate) fn parsed<T: std::str::FromStr>(value: &Value) -> Result<T, StoreError> {
    std::str::from_utf8(text(value)?)
        .ok()
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| StoreError::protocol("redis event script: not an event id or epoch"))
}

pub(crate) fn array(value: &Value) -> Result<&[Value], StoreError> {
    match value {
        Value::Array(items) => Ok(items),
        _ => Err(StoreError::protocol(
            "redis event script: expected an array",
        )),
    }
}

/// One entry, `[id, [p, prev, n, number, e, epoch, name, value, ...]]`.
pub(crate) fn tagged_event(value: &Value) -> Result<(Epoch, Event), StoreError> {
    let [id_value, fields] = array(value)? else {
        return Err(StoreError::protocol(
            "redis event script: an entry is [id, fields]",
        ));
    };
    let fields = array(fields)?;
    if fields.len() < OWN_FIELDS || fields.len() % 2 != 0 {
        return Err(StoreError::protocol("redis event script: bad entry fields"));
    }
    let epoch = parsed(&fields[5])?;
    let fields = fields[OWN_FIELDS..]
        .chunks_exact(2)
        .map(|pair| {
            let name = String::from_utf8(text(&pair[0])?.to_vec()).map_err(|_| {
                StoreError::protocol("redis event script: a field name is not UTF-8")
            })?;
            Ok((name, Bytes::copy_from_slice(text(&pair[1])?)))
        })
        .collect::<Result<_, StoreError>>()?;
    Ok((epoch, Event::new(parsed(id_value)?, fields)))
}

impl RedisStore {
    /// Runs the event script's `op`, with `extra` arguments after the
    /// common ones.
    async fn event_call<T: FromRedisValue>(
        &self,
        request: &EventRequest<'_>,
        op: &str,
        extra: impl FnOnce(&mut ScriptCall),
    ) -> Result<T, StoreError> {
        let (stream, meta) = event_keys(&self.prefix, request.key);
        let mut call = SCRIPT.prepare_invoke();
        call.key(stream).key(meta).arg(op);
        match &self.clock {
            Some(clock) => call.arg(clock.now_micros() / 1000),
            None => call.arg(""),
        };
        let retention = request.retention;
        call.arg(retention.window_millis())
            .arg(retention.max_len())
            .arg(retention.ttl_millis())
            .arg(format!("{:016x}", request.nonce));
        extra(&mut call);
        self.call(Call::Script(&call)).await
    }

    async fn event_append_many(
        &self,
        request: EventRequest<'_>,
        events: &[&[(&str, &[u8])]],
    ) -> Result<Vec<Appended>, StoreError> {
        check_batch(events)?;
        let reply = self.event_call(&request, "b", |call| {
            call.arg(events.len());
            for fields in events {
                call.arg(fields.len() * 2);
                for (name, value) in *fields {
                    call.arg(*name).arg(*value);
                }
            }
        });
        let reply: Value = reply.await?;
        match array(&reply)? {
            [e, ids @ ..] if ids.len() == events.len() => {
                let epoch: Epoch = parsed(e)?;
                ids.iter()
                    .map(|i| Ok(Appended::new(epoch.clone(), parsed(i)?)))
                    .collect()
            }
            _ => Err(StoreError::protocol(
                "redis event script: a batch replies [epoch, id per event]",
            )),
        }
    }
}

impl events::Backend for RedisStore {
    fn wakeups(self: std::sync::Arc<Self>) -> Result<events::EventWakeups, StoreError> {
        self.event_wakeups()
    }

    fn append<'a>(
        &'a self,
        guard: &mut Guard<'a>,
        request: EventRequest<'a>,
        fields: &'a [(&'a str, &'a [u8])],
    ) -> Op<'a, Appended> {
        guard.run(move || async move {
            let mut appended = self.event_append_many(request, &[fields]).await?;
            Ok(appended.remove(0))
        })
    }

    fn append_many<'a>(
        &'a self,
        guard: &mut Guard<'a>,
        request: EventRequest<'a>,
        events: &'a [&'a [(&'a str, &'a [u8])]],
    ) -> Op<'a, Vec<Appended>> {
        guard.run(move || self.event_append_many(request, events))
    }

    fn head<'a>(&'a self, guard: &mut Guard<'a>, request: EventRequest<'a>) -> Op<'a, Position> {
        guard.run(move || async move {
            let (epoch, last): (Value, Value) = self.event_call(&request, "h", |_| {}).await?;
            let last: EventId = parsed(&last)?;
            let last = (last != EventId::ZERO).then_some(last);
            Ok(Position::new(parsed(&epoch)?, last))
        })
    }

    fn read<'a>(
        &'a self,
        guard: &mut Guard<'a>,
        request: EventRequest<'a>,
        from: &'a Position,
        limit: u32,
    ) -> Op<'a, Resume> {
        guard.run(move || async move {
            check_limit(limit)?;
            let reply = self.event_call(&request, "r", |call| {
                call.arg(from.epoch.as_str())
                    .arg(from.after().to_string())
                    .arg(limit);
            });
            let reply: Value = reply.await?;
            let event = |entry| tagged_event(entry).map(|(_, event)| event);
            match array(&reply)? {
                [Value::Int(0)] => Ok(Resume::Recovered(Vec::new())),
                [Value::Int(0), entries] => {
                    let events = array(entries)?.iter().map(event);
                    Ok(Resume::Recovered(events.collect::<Result<_, _>>()?))
                }
                [Value::Int(1)] => Ok(Resume::Resync(ResyncReason::TooOld)),
                [Value::Int(2)] => Ok(Resume::Resync(ResyncReason::EpochChanged)),
                [Value::Int(3)] => Ok(Resume::Resync(ResyncReason::Ahead)),
                _ => Err(StoreError::protocol(
                    "redis event script: unexpected read reply",
                )),
            }
        })
    }

    fn len<'a>(&'a self, guard: &mut Guard<'a>, request: EventRequest<'a>) -> Op<'a, u64> {
        guard.run(move || async move {
            let len: i64 = self.event_call(&request, "l", |_| {}).await?;
            Ok(u64::try_from(len).unwrap_or(0))
        })
    }

    fn failure_domain(&self, key: &[u8]) -> Option<u16> {
        self.slot_domain(event_slot(key))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::store::redis::keys::Sink;

    #[test]
    fn keys_share_one_slot_and_escape_the_key() {
        let (stream, meta) = event_keys("tw:", b"room:{1}");
        assert_eq!(stream, b"tw:ev:{room%3A%7B1%7D}:s".to_vec());
        assert_eq!(meta, b"tw:ev:{room%3A%7B1%7D}:m".to_vec());
        let mut crc = Crc16::default();
        crc.put(b"room%3A%7B1%7D");
        assert_eq!(event_slot(b"room:{1}"), crc.value() % CLUSTER_SLOTS);
        assert_ne!(event_keys("tw:", b"a").0, event_keys("tw:", b"a:s").0);
    }
}
