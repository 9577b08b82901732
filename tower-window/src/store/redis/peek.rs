//! [`RedisStore`] peeks: one `EVALSHA` of the peek script (`scripts/peek.lua`),
//! which evaluates a whole policy and records nothing.

use std::sync::LazyLock;

use super::script::LuaScript;
use super::{scripts, RedisStore};
use crate::store::{CheckRequest, StoreError};
use crate::Decision;

/// The prelude and the algorithm fragments, then `peek.lua` in place of
/// `policy.lua`: the same KEYS and ARGV, no commit.
static PEEK: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(concat!(
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
        let reply = self.policy_script(&PEEK, request).await?;
        scripts::decision(request.policy, &reply)
    }
}
