//! One Redis call with the store's connection handling: reconnect after a
//! connection error, slot-map refresh after a topology change, a missing
//! function loaded on its node, `NOSCRIPT` answered by one `EVAL` (see
//! [`script`](super::script)).

use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{ErrorKind, FromRedisValue, RedisError, ServerErrorKind, Value};

use super::connection::{is_connection_error, is_topology_change, map_error, Conn};
use super::script::{is_already_loaded, is_function_missing, Functions, LuaScript, ScriptCall};
use super::RedisStore;
use crate::store::{StoreError, StoreErrorKind};

/// The largest explicit timestamp: Lua numbers are doubles.
pub(crate) const MAX_EXPLICIT_MICROS: u64 = 1 << 52;

/// How many times one call loads its function library when the node says
/// the function is missing.
const MAX_FUNCTION_LOADS: u32 = 3;

pub(crate) enum Call<'a> {
    Cmd(&'a redis::Cmd),
    Script(&'a ScriptCall),
}

impl RedisStore {
    /// Sends `call` on the store's connection and parses the reply.
    pub(crate) async fn call<T: FromRedisValue>(&self, call: Call<'_>) -> Result<T, StoreError> {
        let (conn, generation) = self.connection.get().await?;
        if let Conn::Cluster(cluster) = &conn {
            self.refresh_topology_if_due(cluster);
        }
        send(&conn, &call, &self.functions).await.map_err(|error| {
            if is_connection_error(&error) {
                self.connection.invalidate(generation);
            }
            if let Conn::Cluster(cluster) = &conn {
                self.note_topology_change(cluster, &error);
            }
            map_error(error)
        })
    }

    /// Has the slot map reloaded if `error` says the topology changed.
    fn note_topology_change(&self, cluster: &ClusterConnection, error: &RedisError) {
        if is_topology_change(error) {
            self.topology.mark_stale();
            self.refresh_topology_if_due(cluster);
        }
    }

    /// Sends `calls` of `script` (each on one hash slot, not necessarily
    /// the same) to the primary serving `slot` in one pipeline, after a
    /// `FUNCTION LOAD REPLACE` (or a `SCRIPT LOAD`) so a node without the
    /// script runs them all.
    ///
    /// Answers each call's reply in order (a call whose slot moved answers
    /// `MOVED` as a `Value::ServerError`), or `None` when the whole
    /// pipeline was redirected and no reply is known. Only for calls that
    /// may run twice: the cluster client may resend it after a redirect.
    pub(crate) async fn call_routed(
        &self,
        slot: u16,
        script: &LuaScript,
        calls: &[ScriptCall],
    ) -> Result<Option<Vec<Value>>, StoreError> {
        let (conn, _) = self.connection.get().await?;
        let Conn::Cluster(cluster) = &conn else {
            return Err(StoreError::new(
                StoreErrorKind::Unsupported,
                "a routed pipeline needs a cluster store",
            ));
        };
        self.refresh_topology_if_due(cluster);
        loop {
            let functions = self.functions.on();
            // The script is loaded first, so a node without it (after a
            // restart or a FUNCTION FLUSH) runs the calls: neither load
            // ever answers an error (one would fail the whole pipeline).
            // Replacing the renewal library costs ~0.2 ms of Redis per
            // pipeline (one per primary per heartbeat tick).
            let mut pipeline = redis::pipe();
            pipeline.add_command(match functions {
                true => script.function_replace_cmd(),
                false => script.load_cmd(),
            });
            for call in calls {
                pipeline.add_command(if functions {
                    call.fcall()
                } else {
                    call.evalsha()
                });
            }
            let route = SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master));
            let reply = cluster
                .clone()
                .route_pipeline(pipeline, 0, calls.len() + 1, route)
                .await;
            // A server without functions refuses the whole pipeline or
            // each command in it: go by EVALSHA.
            let refused = match &reply {
                Ok(replies) => errors(replies).next(),
                Err(error) => Some(error.clone()),
            };
            if let Some(error) = refused.filter(|_| functions) {
                if self.functions.off_if_unsupported(&error) {
                    continue;
                }
            }
            return self.routed_replies(cluster, reply, calls.len());
        }
    }

    /// [`call_routed`](Self::call_routed)'s answer from the pipeline's
    /// `reply`: the load's, then one per call of `calls`.
    fn routed_replies(
        &self,
        cluster: &ClusterConnection,
        reply: Result<Vec<Value>, RedisError>,
        calls: usize,
    ) -> Result<Option<Vec<Value>>, StoreError> {
        match reply {
            Ok(mut replies) if replies.len() == calls + 1 => {
                replies.remove(0); // the load's
                if let Some(error) = errors(&replies).find(is_topology_change) {
                    self.note_topology_change(cluster, &error);
                }
                Ok(Some(replies))
            }
            Ok(_) => Err(StoreError::protocol("a pipeline reply of the wrong length")),
            Err(error) => {
                self.note_topology_change(cluster, &error);
                if matches!(
                    error.kind(),
                    ErrorKind::Server(
                        ServerErrorKind::Moved
                            | ServerErrorKind::Ask
                            | ServerErrorKind::TryAgain
                            | ServerErrorKind::ReadOnly
                    )
                ) {
                    // The node answered, only not for every slot: a
                    // success for its breaker.
                    return Ok(None);
                }
                Err(map_error(error))
            }
        }
    }

    /// The failure domain of hash slot `slot` (a cluster primary), if
    /// known. Also has the slot map reloaded when due: it is asked even
    /// while a breaker is open and nothing reaches Redis, so a failed
    /// primary's slots reach their new primary's breaker without a call.
    pub(crate) fn slot_domain(&self, slot: u16) -> Option<u16> {
        if !self.connection.is_cluster() {
            return None;
        }
        if self.topology.needs_refresh() {
            if let Some(Conn::Cluster(cluster)) = self.connection.ready() {
                self.refresh_topology_if_due(&cluster);
            }
        }
        self.topology.domain_of(slot)
    }

    /// The explicit clock's reading, if the store has one.
    pub(crate) fn explicit_now(&self) -> Result<Option<u64>, StoreError> {
        let Some(clock) = &self.clock else {
            return Ok(None);
        };
        let now = clock.now_micros();
        if now > MAX_EXPLICIT_MICROS {
            return Err(StoreError::invalid(
                "clock reading beyond 2^52 microseconds",
            ));
        }
        Ok(Some(now))
    }
}

/// The errors among a pipeline's `replies`.
fn errors(replies: &[Value]) -> impl Iterator<Item = RedisError> + '_ {
    replies.iter().filter_map(|reply| match reply {
        Value::ServerError(error) => Some(error.clone().into()),
        _ => None,
    })
}

/// Sends `call` on `conn`. A script goes as a function while `functions`
/// is on: one the node lacks is loaded there and called again (up to
/// [`MAX_FUNCTION_LOADS`] times). Without functions, by `EVALSHA`, then by
/// `EVAL` on `NOSCRIPT`. A missing function or script did not run, so
/// neither can run twice.
pub(crate) async fn send<T: FromRedisValue>(
    conn: &Conn,
    call: &Call<'_>,
    functions: &Functions,
) -> Result<T, redis::RedisError> {
    let script = match call {
        Call::Cmd(cmd) => return query(conn, cmd).await,
        Call::Script(script) => script,
    };
    if functions.on() {
        // Loaded again if it is gone again before the call (a `FUNCTION
        // FLUSH` between the load and the call): bounded, as each round
        // trip may meet another flush.
        let mut loads = 0;
        loop {
            match query(conn, &script.fcall()).await {
                Err(error) if is_function_missing(&error) && loads < MAX_FUNCTION_LOADS => {
                    load_function(conn, script.script(), script.slot()).await?;
                    loads += 1;
                }
                Err(error) if loads == 0 && functions.off_if_unsupported(&error) => break,
                other => return other,
            }
        }
    }
    match query(conn, &script.evalsha()).await {
        Err(error)
            if error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
        {
            query(conn, &script.eval()).await
        }
        other => other,
    }
}

/// Loads `script`'s function library on the node serving `slot` (on a
/// cluster; `FUNCTION LOAD` would otherwise go to every primary, and fail
/// while one is unreachable). "Already exists" is success: another call
/// loaded it first.
async fn load_function(
    conn: &Conn,
    script: &LuaScript,
    slot: u16,
) -> Result<(), redis::RedisError> {
    let load = script.function_load_cmd();
    let loaded = match conn.clone() {
        Conn::Single(mut c) => load.query_async::<Value>(&mut c).await,
        Conn::Cluster(mut c) => {
            let route = Route::new(slot, SlotAddr::Master);
            let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
            c.route_command(load, routing).await
        }
    };
    match loaded {
        Err(error) if is_already_loaded(&error) => Ok(()),
        other => other.map(drop),
    }
}

pub(crate) async fn query<T: FromRedisValue>(
    conn: &Conn,
    cmd: &redis::Cmd,
) -> Result<T, redis::RedisError> {
    match conn.clone() {
        Conn::Single(mut c) => cmd.query_async(&mut c).await,
        Conn::Cluster(mut c) => cmd.query_async(&mut c).await,
    }
}
