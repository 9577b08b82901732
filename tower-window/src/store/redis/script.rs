//! Our Lua scripts, sent by `EVALSHA` and on `NOSCRIPT` by one `EVAL` to
//! the same node.
//!
//! redis-rs's `Script::invoke_async` answers `NOSCRIPT` with a
//! `SCRIPT LOAD` to every primary, which fails if one is unreachable: just
//! after a failover, when the promoted replica has no scripts, the client
//! may still name the dead primary. `EVAL` runs on the key's node only and
//! leaves the script in its cache.

use redis::{Cmd, ToRedisArgs};

/// A Lua script of ours: its source and SHA1 (what `EVALSHA` names).
pub(crate) struct LuaScript {
    source: &'static str,
    sha: String,
}

impl LuaScript {
    pub(crate) fn new(source: &'static str) -> Self {
        Self {
            source,
            sha: redis::Script::new(source).get_hash().to_owned(),
        }
    }

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

    /// `SCRIPT LOAD` of the source.
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
    pub(crate) fn key(&mut self, key: impl ToRedisArgs) -> &mut Self {
        key.write_redis_args(&mut self.keys);
        self
    }

    pub(crate) fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        arg.write_redis_args(&mut self.args);
        self
    }

    pub(crate) fn evalsha(&self) -> Cmd {
        self.command("EVALSHA", self.script.sha.as_bytes())
    }

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
