//! Our Lua scripts: as Redis Functions (`FCALL`) where the server has
//! them, else by `EVALSHA` (and on `NOSCRIPT` one `EVAL` to the same node).
//!
//! A script is definitions (helpers, the algorithms) and a body that
//! decides one call, reading `KEYS` and `ARGV`. `EVAL` runs both on every
//! call. As a function library, the definitions run once, when the library
//! is loaded; the call runs only the body, as the library's one function.
//! The library and its function are named after the `EVAL` source's SHA1
//! (`tw_<sha1>`), so nodes running two versions of this crate (a rolling
//! upgrade) call each their own, and loading a name that exists is a no-op.
//! Functions outlive a restart where the server persists its data, and
//! reach replicas by replication; the script cache does neither.
//!
//! redis-rs's `Script::invoke_async` answers `NOSCRIPT` with a
//! `SCRIPT LOAD` to every primary, which fails if one is unreachable: just
//! after a failover, when the promoted replica has no scripts, the client
//! may still name the dead primary. `EVAL` runs on the key's node only and
//! leaves the script in its cache; a missing function is loaded on the
//! key's node only, alike (see `call::send`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use redis::{Cmd, RedisError, ToRedisArgs};

use super::keys::key_slot;

/// Whether a store calls its scripts as functions: until the server says
/// it has none (an unknown `FCALL`, or an ACL user without it), or the
/// builder said not to.
#[derive(Clone)]
pub(crate) struct Functions(Arc<AtomicBool>);

impl Functions {
    pub(crate) fn new(on: bool) -> Self {
        Self(Arc::new(AtomicBool::new(on)))
    }

    pub(crate) fn on(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// Turns functions off if `error` says the server has none for us;
    /// whether it did (the call did not run: send it by `EVALSHA`).
    pub(crate) fn off_if_unsupported(&self, error: &RedisError) -> bool {
        // Refused before anything ran: never a command inside a script
        // (Redis answers those `ERR ... script: ...`).
        let detail = error.detail().unwrap_or_default();
        let unsupported = match error.code() {
            Some("NOPERM") => detail.contains("'fcall'") || detail.contains("'function|"),
            Some("ERR") => detail.starts_with("unknown command"),
            _ => false,
        };
        if unsupported && self.0.swap(false, Ordering::Relaxed) {
            tracing::info!(%error, "redis functions unavailable: scripts go by EVALSHA");
        }
        unsupported
    }
}

/// Whether `error` refuses a `FUNCTION LOAD` because the library is
/// there: named after its source, so the same.
pub(crate) fn is_already_loaded(error: &RedisError) -> bool {
    error.code() == Some("ERR")
        && error.detail().is_some_and(|detail| {
            detail.starts_with("Library") && detail.ends_with("already exists")
        })
}

/// Whether `error` is a call of a function the node does not have (never
/// loaded there, or gone with a restart without persistence or a
/// `FUNCTION FLUSH`): the call did not run.
pub(crate) fn is_function_missing(error: &RedisError) -> bool {
    error.code() == Some("ERR") && error.detail() == Some("Function not found")
}

/// A Lua script of ours: its `EVAL` source and SHA1, and the same script
/// as a function library.
pub(crate) struct LuaScript {
    source: String,
    sha: String,
    /// `tw_<sha>`: the library's name and its function's.
    function: String,
    library: String,
}

impl LuaScript {
    /// `definitions` run before each `EVAL` of `body`, or once per node
    /// where the script is a function.
    pub(crate) fn new(definitions: &'static str, body: &'static str) -> Self {
        let source = format!("{definitions}{body}");
        let sha = redis::Script::new(&source).get_hash().to_owned();
        let function = format!("tw_{sha}");
        // In a library, KEYS and ARGV are the function's arguments: the
        // body reads them from upvalues set on each call, as each `EVAL`
        // sets the globals.
        let library = format!(
            "#!lua name={function}\n\
             local KEYS, ARGV\n\
             {definitions}\
             local function main()\n{body}end\n\
             redis.register_function('{function}', function(keys, argv)\n  \
             KEYS, ARGV = keys, argv\n  return main()\nend)\n"
        );
        Self {
            source,
            sha,
            function,
            library,
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
        self.with_capacity(0, 0)
    }

    /// A call with room for `args` arguments of `bytes` in all (a batch of
    /// records: the call never grows).
    pub(crate) fn with_capacity(&'static self, args: usize, bytes: usize) -> ScriptCall {
        ScriptCall {
            script: self,
            keys: Vec::new(),
            args: Cmd::with_capacity(args, bytes),
        }
    }

    /// `SCRIPT LOAD` of the source.
    pub(crate) fn load_cmd(&self) -> Cmd {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(&self.source);
        cmd
    }

    /// `FUNCTION LOAD` of the library (without `REPLACE`: the name says
    /// what it holds, so "already exists" means loaded).
    pub(crate) fn function_load_cmd(&self) -> Cmd {
        let mut cmd = redis::cmd("FUNCTION");
        cmd.arg("LOAD").arg(&self.library);
        cmd
    }

    /// `FUNCTION LOAD REPLACE` of the library: never "already exists", but
    /// compiled again each time.
    pub(crate) fn function_replace_cmd(&self) -> Cmd {
        let mut cmd = redis::cmd("FUNCTION");
        cmd.arg("LOAD").arg("REPLACE").arg(&self.library);
        cmd
    }
}

/// One call of a [`LuaScript`]: its keys (`KEYS`) and arguments (`ARGV`).
pub(crate) struct ScriptCall {
    script: &'static LuaScript,
    keys: Vec<Vec<u8>>,
    /// The arguments in one buffer (a command without a name): no
    /// allocation per argument, which an audit batch has hundreds of.
    args: Cmd,
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

    /// The hash slot of the first key (0 without keys): the node a
    /// cluster sends the call to.
    pub(crate) fn slot(&self) -> u16 {
        self.keys.first().map_or(0, |key| key_slot(key))
    }

    pub(crate) fn script(&self) -> &'static LuaScript {
        self.script
    }

    pub(crate) fn fcall(&self) -> Cmd {
        self.command("FCALL", self.script.function.as_bytes())
    }

    pub(crate) fn evalsha(&self) -> Cmd {
        self.command("EVALSHA", self.script.sha.as_bytes())
    }

    pub(crate) fn eval(&self) -> Cmd {
        self.command("EVAL", self.script.source.as_bytes())
    }

    /// `<name> <script> <number of keys> <keys> <arguments>`, in a
    /// command sized once.
    fn command(&self, name: &str, script: &[u8]) -> Cmd {
        let args = self.args.args_iter();
        let bytes = args.clone().map(|arg| match arg {
            redis::Arg::Simple(bytes) => bytes.len(),
            _ => 0,
        });
        let size = name.len() + script.len() + 20 + bytes.sum::<usize>();
        let size = size + self.keys.iter().map(Vec::len).sum::<usize>();
        let mut cmd = Cmd::with_capacity(3 + self.keys.len() + args.len(), size);
        cmd.arg(name)
            .arg(script)
            .arg(self.keys.len())
            .arg(&*self.keys);
        for arg in args {
            if let redis::Arg::Simple(bytes) = arg {
                cmd.arg(bytes);
            }
        }
        cmd
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use std::sync::LazyLock;

    static ECHO: LazyLock<LuaScript> =
        LazyLock::new(|| LuaScript::new("local x = 1\n", "return ARGV[1]\n"));

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
            redis::Script::new("local x = 1\nreturn ARGV[1]\n").get_hash()
        );
        let function = format!("tw_{}", ECHO.sha());
        assert_eq!(
            words(&call.evalsha()),
            ["EVALSHA", ECHO.sha(), "2", "k1", "k2", "7", "x"]
        );
        assert_eq!(
            words(&call.eval()),
            [
                "EVAL",
                "local x = 1\nreturn ARGV[1]\n",
                "2",
                "k1",
                "k2",
                "7",
                "x"
            ]
        );
        assert_eq!(
            words(&call.fcall()),
            ["FCALL", &function, "2", "k1", "k2", "7", "x"]
        );
        assert_eq!(
            words(&ECHO.load_cmd()),
            ["SCRIPT", "LOAD", "local x = 1\nreturn ARGV[1]\n"]
        );
        assert_eq!(call.slot(), super::super::keys::key_slot(b"k1"));
    }

    /// A server error reply, as the client hands it over.
    fn server_error(reply: &str) -> RedisError {
        redis::parse_redis_value(format!("-{reply}\r\n").as_bytes())
            .unwrap()
            .extract_error()
            .unwrap_err()
    }

    #[test]
    fn refusals_are_told_apart() {
        let unsupported = [
            "ERR unknown command 'FCALL', with args beginning with: 'tw_1' '1' ",
            "ERR unknown command 'FUNCTION', with args beginning with: 'LOAD' ",
            "NOPERM this user has no permissions to run the 'fcall' command",
            "NOPERM this user has no permissions to run the 'function|load' command",
        ];
        for reply in unsupported {
            let functions = Functions::new(true);
            assert!(
                functions.off_if_unsupported(&server_error(reply)),
                "{reply}"
            );
            assert!(!functions.on(), "{reply}");
        }
        // Refusals from inside a script that ran: never a reason to switch.
        let others = [
            "ERR The user executing the script can't run this command or subcommand script: tw_1, on @user_function:13.",
            "NOPERM No permissions to access a key",
            "ERR Function not found",
        ];
        for reply in others {
            let functions = Functions::new(true);
            assert!(
                !functions.off_if_unsupported(&server_error(reply)),
                "{reply}"
            );
            assert!(functions.on(), "{reply}");
        }
        assert!(is_function_missing(&server_error("ERR Function not found")));
        assert!(!is_function_missing(&server_error(
            "NOSCRIPT No matching script."
        )));
        assert!(is_already_loaded(&server_error(
            "ERR Library 'tw_1' already exists"
        )));
        assert!(!is_already_loaded(&server_error(
            "ERR Error compiling function: x"
        )));
    }
}
