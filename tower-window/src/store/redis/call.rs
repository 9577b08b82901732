//! One Redis call (a command or a script) with the store's connection
//! handling: reconnect after a connection error, slot-map refresh after a
//! topology change, `NOSCRIPT` reloads. Shared by the store operations
//! beside the policy check (dedup, connection leases, ...).

use redis::{FromRedisValue, ScriptInvocation};

use super::connection::{is_connection_error, is_topology_change, map_error, Conn};
use super::keys::{encode_component, Crc16, Sink, CLUSTER_SLOTS};
use super::RedisStore;
use crate::store::StoreError;
use crate::WindowKey;

/// What to send.
pub(crate) enum Call<'a> {
    /// A plain command.
    Cmd(&'a redis::Cmd),
    /// A script, by `EVALSHA` (loaded on `NOSCRIPT`).
    Script(&'a ScriptInvocation<'a>),
}

impl RedisStore {
    /// Sends `call` on the store's connection and parses the reply.
    pub(crate) async fn call<T: FromRedisValue>(&self, call: Call<'_>) -> Result<T, StoreError> {
        const NOSCRIPT_ATTEMPTS: u32 = 3;
        let (conn, generation) = self.connection.get().await?;
        if let Conn::Cluster(cluster) = &conn {
            self.refresh_topology_if_due(cluster);
        }
        let mut attempts = 0;
        let reply: Result<T, redis::RedisError> = loop {
            attempts += 1;
            let reply = match (&call, conn.clone()) {
                (Call::Cmd(cmd), Conn::Single(mut c)) => cmd.query_async(&mut c).await,
                (Call::Cmd(cmd), Conn::Cluster(mut c)) => cmd.query_async(&mut c).await,
                (Call::Script(s), Conn::Single(mut c)) => s.invoke_async(&mut c).await,
                (Call::Script(s), Conn::Cluster(mut c)) => s.invoke_async(&mut c).await,
            };
            match reply {
                Err(error)
                    if error.kind()
                        == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
                        && attempts < NOSCRIPT_ATTEMPTS => {}
                other => break other,
            }
        };
        reply.map_err(|error| {
            if is_connection_error(&error) {
                self.connection.invalidate(generation);
            }
            if let Conn::Cluster(cluster) = &conn {
                if is_topology_change(&error) {
                    self.topology.mark_stale();
                    self.refresh_topology_if_due(cluster);
                }
            }
            map_error(error)
        })
    }

    /// The failure domain of the hash slot `slot` (a cluster primary), or
    /// `None` on a single node or before the slot map loaded.
    pub(crate) fn slot_domain(&self, slot: u16) -> Option<u16> {
        if !self.connection.is_cluster() {
            return None;
        }
        self.topology.domain_of(slot)
    }

    /// The explicit clock's reading, if the store has one (tests), checked
    /// to fit a Lua number exactly.
    pub(crate) fn explicit_now(&self) -> Result<Option<u64>, StoreError> {
        match &self.clock {
            Some(clock) => {
                let now = clock.now_micros();
                if now > super::scripts::MAX_EXPLICIT_MICROS {
                    return Err(StoreError::new(
                        crate::StoreErrorKind::InvalidRequest,
                        "clock reading beyond 2^52 microseconds",
                    ));
                }
                Ok(Some(now))
            }
            None => Ok(None),
        }
    }
}

/// Appends `<prefix>{<tenant>:<subject>}` (the subject form's hash tag, as
/// [`redis_key`](super::redis_key) writes it) to `out`.
pub(crate) fn subject_tag(out: &mut Vec<u8>, prefix: &str, key: &WindowKey) {
    super::keys::write_prefix(out, prefix);
    out.push(b'{');
    encode_component(out, key.tenant());
    out.push(b':');
    encode_component(out, key.subject());
    out.push(b'}');
}

/// The hash slot of [`subject_tag`]'s keys.
pub(crate) fn subject_slot(key: &WindowKey) -> u16 {
    let mut crc = Crc16::default();
    encode_component(&mut crc, key.tenant());
    crc.put(b":");
    encode_component(&mut crc, key.subject());
    crc.value() % CLUSTER_SLOTS
}
