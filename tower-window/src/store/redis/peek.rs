//! [`RedisStore`] peeks: one `EVALSHA` of the peek script (`scripts/peek.lua`),
//! which evaluates a whole policy and records nothing.

use std::sync::LazyLock;

use redis::Script;

use super::connection::{is_connection_error, is_topology_change, map_error, Conn};
use super::{scripts, RedisStore, EXPLICIT_CLOCK_MIN_TTL_MS};
use crate::store::{CheckRequest, StoreError, StoreErrorKind};
use crate::Decision;

/// The prelude and the algorithm fragments, then `peek.lua` in place of
/// `policy.lua`: the same KEYS and ARGV, no commit.
static PEEK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("scripts/prelude.lua"),
        include_str!("scripts/sliding_log.lua"),
        include_str!("scripts/sliding_counter.lua"),
        include_str!("scripts/fixed_window.lua"),
        include_str!("scripts/gcra.lua"),
        include_str!("scripts/peek.lua"),
    ))
});

impl RedisStore {
    /// Evaluates the request's policy on the server's clock and records
    /// nothing (expired state the evaluation drops is written back dropped,
    /// which changes no decision). One round trip, in the policy's slot.
    pub(super) async fn peek_policy(
        &self,
        request: CheckRequest<'_>,
    ) -> Result<Decision, StoreError> {
        if request.cost == 0 {
            return Err(StoreError::new(
                StoreErrorKind::InvalidRequest,
                "a request must cost at least 1 unit",
            ));
        }
        let now = match &self.clock {
            Some(clock) => {
                let now = clock.now_micros();
                if now > scripts::MAX_EXPLICIT_MICROS {
                    return Err(StoreError::new(
                        StoreErrorKind::InvalidRequest,
                        "clock reading beyond 2^52 microseconds",
                    ));
                }
                Some(now)
            }
            None => None,
        };
        let min_ttl_ms = if now.is_some() {
            EXPLICIT_CLOCK_MIN_TTL_MS
        } else {
            0
        };
        let call = scripts::invocation_of(
            &PEEK,
            &self.prefix,
            request.key,
            request.policy,
            request.cost,
            now,
            min_ttl_ms,
        );
        let (conn, generation) = self.connection.get().await?;
        // redis-rs loads the script on NOSCRIPT and retries once.
        let reply: Result<Vec<i64>, _> = match conn.clone() {
            Conn::Single(mut conn) => call.invoke_async(&mut conn).await,
            Conn::Cluster(mut conn) => call.invoke_async(&mut conn).await,
        };
        let reply = reply.map_err(|error| {
            if is_connection_error(&error) {
                self.connection.invalidate(generation);
            }
            if matches!(conn, Conn::Cluster(_)) && is_topology_change(&error) {
                self.topology.mark_stale();
            }
            map_error(error)
        })?;
        scripts::decision(request.policy, &reply)
    }
}
