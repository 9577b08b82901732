//! [`EventTail`]: live events of many windows with one blocking `XREAD`.

use std::fmt;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Value};

use super::redis::{array, event_keys, parsed, tagged_event, text};
use crate::events::{Epoch, Event, EventId};
use crate::store::redis::connection::map_error;
use crate::store::redis::RedisStore;
use crate::store::StoreError;

/// New events of one window, from [`EventTail::read`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TailBatch {
    /// The index of the window in the `read` call's list.
    pub index: usize,
    /// The events after the given id, each with its epoch (entries not
    /// written by an event window are skipped).
    pub events: Vec<(Epoch, Event)>,
    /// The id of the last entry read, skipped or not.
    pub last_id: Option<EventId>,
}

/// Reads new events of many event windows with one blocking `XREAD`, on
/// a connection of its own. Single-node Redis only (a cluster cannot
/// `XREAD` keys of several slots at once).
pub struct EventTail {
    client: redis::Client,
    prefix: String,
    conn: Option<MultiplexedConnection>,
}

impl fmt::Debug for EventTail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventTail")
            .field("prefix", &self.prefix)
            .field("connected", &self.conn.is_some())
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// A live reader of this store's event windows, connecting on its
    /// first read. A store not built from a URL is
    /// [`StoreErrorKind::InvalidRequest`](crate::StoreErrorKind::InvalidRequest).
    pub fn event_tail(&self) -> Result<EventTail, StoreError> {
        let client = self.connection.client().ok_or_else(|| {
            StoreError::invalid("live event reads need a store built from a redis url")
        })?;
        Ok(EventTail {
            client,
            prefix: self.prefix.to_string(),
            conn: None,
        })
    }
}

impl EventTail {
    /// Events after each `(window key, last id seen)`, at most `count` per
    /// window, waiting up to `block` for the first (an empty answer: none
    /// came). After a connection error the next call reconnects.
    pub async fn read(
        &mut self,
        windows: &[(&[u8], EventId)],
        block: Duration,
        count: usize,
    ) -> Result<Vec<TailBatch>, StoreError> {
        if windows.is_empty() {
            tokio::time::sleep(block).await;
            return Ok(Vec::new());
        }
        let mut conn = match &self.conn {
            Some(conn) => conn.clone(),
            None => {
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(crate::store::redis::DEFAULT_CONNECT_TIMEOUT))
                    .set_response_timeout(None);
                let conn = self
                    .client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await
                    .map_err(map_error)?;
                self.conn = Some(conn.clone());
                conn
            }
        };
        let keys: Vec<Vec<u8>> = windows
            .iter()
            .map(|(key, _)| event_keys(&self.prefix, key).0)
            .collect();
        let mut cmd = redis::cmd("XREAD");
        cmd.arg("COUNT")
            .arg(count.max(1))
            .arg("BLOCK")
            .arg(u64::try_from(block.as_millis()).unwrap_or(u64::MAX).max(1))
            .arg("STREAMS")
            .arg(&keys);
        for (_, after) in windows {
            cmd.arg(after.to_string());
        }
        let reply: Value = cmd.query_async(&mut conn).await.map_err(|error| {
            self.conn = None;
            map_error(error)
        })?;
        let streams = match &reply {
            Value::Nil => return Ok(Vec::new()),
            Value::Array(streams) => streams.as_slice(),
            _ => {
                return Err(StoreError::protocol(
                    "XREAD: unexpected reply (RESP3 is not supported)",
                ))
            }
        };
        let mut batches = Vec::with_capacity(streams.len());
        for stream in streams {
            let [name, entries] = array(stream)? else {
                return Err(StoreError::protocol("XREAD: a stream is [key, entries]"));
            };
            let name = text(name)?;
            let Some(index) = keys.iter().position(|k| k.as_slice() == name) else {
                continue;
            };
            let mut events = Vec::new();
            let mut last_id = None;
            for entry in array(entries)? {
                if let Some(Ok(entry_id)) = array(entry).ok().and_then(|e| e.first()).map(parsed) {
                    last_id = Some(entry_id);
                }
                match tagged_event(entry) {
                    Ok(event) => events.push(event),
                    Err(error) => tracing::debug!(%error, "skipping a foreign stream entry"),
                }
            }
            batches.push(TailBatch {
                index,
                events,
                last_id,
            });
        }
        Ok(batches)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use crate::events::{EventWindow, Retention};
    use crate::{MemoryStore, RedisStore, StoreErrorKind};

    #[test]
    fn an_event_window_has_a_tail_on_a_single_redis_only() {
        let retention = Retention::new(Duration::from_secs(60), 10).unwrap();
        // Made without a connection: the tail connects on its first read.
        let redis = RedisStore::from_url("redis://127.0.0.1:1").unwrap();
        assert!(EventWindow::new(redis, retention).tail().is_ok());
        let memory = EventWindow::new(MemoryStore::new(), retention);
        assert_eq!(
            memory.tail().unwrap_err().kind(),
            StoreErrorKind::Unsupported
        );
    }
}
