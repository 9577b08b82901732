//! Our Lua scripts and how one is sent: `EVALSHA`, and on `NOSCRIPT` one
//! `EVAL` of the source to the same node.
//!
//! redis-rs's own `Script::invoke_async` answers `NOSCRIPT` with a
//! `SCRIPT LOAD`, which a cluster connection sends to every primary it
//! knows and which fails as a whole if one of them is unreachable. Right
//! after a failover that is exactly the case: the promoted replica has an
//! empty script cache, and the client's slot map may still name the dead
//! primary. `EVAL` is routed by the script's first key like `EVALSHA`, runs
//! the script once and leaves it in that node's cache, so the next
//! `EVALSHA` finds it: one extra round trip, on one node, and nothing that
//! depends on the rest of the cluster.

use redis::{Cmd, ToRedisArgs};

/// A Lua script of ours: its source and SHA1 (what `EVALSHA` names).
pub(crate) struct LuaScript {
    source: &'static str,
    sha: String,
}

impl LuaScript {
    /// The script `source`.
    pub(crate) fn new(source: &'static str) -> Self {
        Self {
            source,
            sha: redis::Script::new(source).get_hash().to_owned(),
        }
    }

    /// The SHA1 of the source.
    pub(crate) fn sha(&self) -> &str {
        &self.sha
    }

    /// A call of this script with `key` as its first key.
    pub(crate) fn key(&'static self, key: impl ToRedisArgs) -> ScriptCall {
        let mut call = self.prepare_invoke();
        call.key(key);
        call
    }

    /// A call of this script, to fill with keys and arguments.
    pub(crate) fn prepare_invoke(&'static self) -> ScriptCall {
        ScriptCall {
            script: self,
            keys: Vec::new(),
            args: Vec::new(),
        }
    }

    /// `SCRIPT LOAD` of the source (to warm a node's cache).
    pub(crate) fn load_cmd(&self) -> Cmd {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(self.source);
        cmd
    }
}

/// One call of a [`LuaScript`]: its keys (`KEYS`) and arguments (`ARGV`).
pub(crate) struct ScriptCall {
    script: &'static LuaScript,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl ScriptCall {
    /// Adds a key (`KEYS[i]`).
    pub(crate) fn key(&mut self, key: impl ToRedisArgs) -> &mut Self {
        key.write_redis_args(&mut self.keys);
        self
    }

    /// Adds an argument (`ARGV[i]`).
    pub(crate) fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        arg.write_redis_args(&mut self.args);
        self
    }

    /// `EVALSHA <sha> <keys> <args>`.
    pub(crate) fn evalsha(&self) -> Cmd {
        self.command("EVALSHA", self.script.sha.as_bytes())
    }

    /// `EVAL <source> <keys> <args>`: runs the script where `EVALSHA`
    /// would, and caches it there.
    pub(crate) fn eval(&self) -> Cmd {
        self.command("EVAL", self.script.source.as_bytes())
    }

    fn command(&self, name: &str, script: &[u8]) -> Cmd {
        let mut cmd = redis::cmd(name);
        cmd.arg(script)
            .arg(self.keys.len())
            .arg(&*self.keys)
            .arg(&*self.args);
        cmd
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use std::sync::LazyLock;

    static ECHO: LazyLock<LuaScript> = LazyLock::new(|| LuaScript::new("return ARGV[1]\n"));

    fn words(cmd: &Cmd) -> Vec<String> {
        cmd.args_iter()
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => String::from_utf8(bytes.to_vec()).unwrap(),
                _ => "<not a plain argument>".to_owned(),
            })
            .collect()
    }

    #[test]
    fn evalsha_and_eval_carry_the_same_keys_and_arguments() {
        let mut call = ECHO.prepare_invoke();
        call.key("k1").key(b"k2".to_vec()).arg(7).arg("x");
        assert_eq!(
            ECHO.sha(),
            redis::Script::new("return ARGV[1]\n").get_hash()
        );
        assert_eq!(
            words(&call.evalsha()),
            ["EVALSHA", ECHO.sha(), "2", "k1", "k2", "7", "x"]
        );
        assert_eq!(
            words(&call.eval()),
            ["EVAL", "return ARGV[1]\n", "2", "k1", "k2", "7", "x"]
        );
        assert_eq!(
            words(&ECHO.load_cmd()),
            ["SCRIPT", "LOAD", "return ARGV[1]\n"]
        );
    }
}
