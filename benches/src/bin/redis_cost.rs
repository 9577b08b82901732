//! Where a decision's time goes inside Redis (issue 36): each step of the
//! library's Lua under `redis-benchmark -c 8`, called both ways the store
//! calls it — `EVALSHA` of the `EVAL` source (servers without functions)
//! and `FCALL` of the function library — priced by Redis's own
//! `usec_per_call` (`INFO commandstats`) against a script (a function) that
//! only reads `TIME`, and by the server's CPU time per call (`INFO cpu`).
//!
//! ```text
//! cargo run --release -p tower-window-benches --bin redis_cost [-- --mode evalsha|fcall|both] [--requests N] [--rounds N] [--url URL]
//! ```
//!
//! The scripts are assembled from the library's own fragment files in the
//! library's order, as `store/redis/script.rs` builds them: `EVAL` source
//! = definitions + body, library = the definitions, then the body as the
//! one function `tw_<sha1 of the source>` (the policy and lease sources are
//! checked against [`RedisStore::script_sha`] and
//! [`RedisStore::lease_script_sha`], and the policy library against the one
//! a [`RedisStore`] loads itself). Sources go in by `SCRIPT LOAD`,
//! libraries by `FUNCTION LOAD REPLACE`; every step is one command that
//! `redis-benchmark` repeats N times between `CONFIG RESETSTAT` and `INFO
//! commandstats`. `__rand_int__` in a key spreads it over 10,000 keys
//! (each occurrence draws its own number). Without `--url` it spawns its
//! own `redis-server` on a free loopback port and kills it on exit. Rounds
//! interleave the steps and, within a step, the two ways (in turn first);
//! the table gives each column's range over rounds.
#![allow(clippy::print_stdout)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use redis::{ConnectionAddr, IntoConnectionInfo};
use tower_window::{Algorithm, Limiter, Quota, RedisStore, WindowKey};
use tower_window_benches::redis_stats::{admin, all_command_stats, cpu_seconds, reset_stats};
use tower_window_tests::redis_server::RedisServer;

/// A Lua file of the library, by its path under `tower-window/src`.
macro_rules! lua {
    ($path:literal) => {
        include_str!(concat!("../../../tower-window/src/", $path))
    };
}

/// The definitions of every deciding script, in `with_algorithms!`'s order.
const ALGORITHMS: [&str; 5] = [
    lua!("algorithm/prelude.lua"),
    lua!("algorithm/sliding_log.lua"),
    lua!("algorithm/sliding_counter.lua"),
    lua!("algorithm/fixed_window.lua"),
    lua!("algorithm/gcra.lua"),
];

/// Keys a `__rand_int__` spreads over (`redis-benchmark -r`).
const SPREAD: u32 = 10_000;

/// A seat's TTL (µs) and its set's key TTL (ms) in the renewal steps:
/// longer than a run, so every renewal finds its seat live.
const SEAT_TTL_US: u64 = 600_000_000;
const SEAT_KEY_TTL_MS: u64 = 1_200_000;
/// The expiry (µs) a seat is set up with: far beyond any renewal's.
const SEAT_UNTIL: u64 = 4_000_000_000_000_000;

/// How a step is called.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Mode {
    /// `EVALSHA` of the `EVAL` source.
    Evalsha,
    /// `FCALL` of the library's function.
    Fcall,
    /// Both, in turn.
    Both,
}

impl Mode {
    /// The command, as `INFO commandstats` names it.
    fn command(self) -> &'static str {
        match self {
            Self::Evalsha => "evalsha",
            Self::Fcall | Self::Both => "fcall",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Self::Evalsha => "EVALSHA",
            Self::Fcall | Self::Both => "FCALL",
        }
    }
}

#[derive(Parser)]
#[command(about = "usec_per_call of each step of the library's Lua, by EVALSHA and FCALL")]
struct Args {
    /// Which way to call each step.
    #[arg(long, value_enum, default_value_t = Mode::Both)]
    mode: Mode,
    /// Calls per step, way and round (`redis-benchmark -n`).
    #[arg(long, default_value_t = 25_000)]
    requests: u64,
    /// Rounds, each running every step once each way.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// A running server to measure (its stats are reset, its functions
    /// replaced) instead of a spawned one.
    #[arg(long)]
    url: Option<String>,
    /// Longest one step may run before it is killed (seconds).
    #[arg(long, default_value_t = 120)]
    timeout: u64,
}

/// A script as `LuaScript::new` builds it: the `EVAL` source's SHA1, and
/// the library whose one function `tw_<sha1>` runs the body.
struct Script {
    source: String,
    sha: String,
    function: String,
    library: String,
}

impl Script {
    /// The library text is `LuaScript::new`'s, character for character.
    fn new(definitions: &str, body: &str) -> Self {
        let source = format!("{definitions}{body}");
        let sha = redis::Script::new(&source).get_hash().to_owned();
        let function = format!("tw_{sha}");
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

    /// `SCRIPT LOAD` and `FUNCTION LOAD REPLACE`, each checked against the
    /// name computed here.
    fn load(&self, conn: &mut redis::Connection) {
        let sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(&self.source)
            .query(conn)
            .expect("SCRIPT LOAD");
        assert_eq!(sha, self.sha, "SCRIPT LOAD's SHA1");
        let name: String = redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg("REPLACE")
            .arg(&self.library)
            .query(conn)
            .unwrap_or_else(|e| panic!("FUNCTION LOAD of {}: {e}", self.function));
        assert_eq!(name, self.function, "FUNCTION LOAD's library name");
    }

    /// What `mode` names: the SHA1 or the function.
    fn name(&self, mode: Mode) -> &str {
        match mode {
            Mode::Evalsha => &self.sha,
            Mode::Fcall | Mode::Both => &self.function,
        }
    }
}

/// One call that `redis-benchmark` repeats: `scripts[script]`'s, with
/// these keys and arguments.
struct Step {
    name: String,
    script: usize,
    keys: Vec<String>,
    args: Vec<String>,
}

/// The keys and ARGV of a check of `cost` against a policy of `quotas`
/// (DSL) on `key`, laid out as `lay_out` in `algorithm/redis.rs` does.
fn policy(quotas: &[&str], key: &str, cost: u32) -> (Vec<String>, Vec<String>) {
    let mut keys = Vec::new();
    let mut args = vec![
        String::new(),
        cost.to_string(),
        "0".into(),
        quotas.len().to_string(),
    ];
    for (i, dsl) in quotas.iter().enumerate() {
        let q: Quota = dsl.parse().expect("a quota");
        keys.push(format!("{key}:{i}"));
        let (window, limit) = (q.window_micros(), u64::from(q.limit()));
        let slots = match q.algorithm() {
            Algorithm::SlidingLog => {
                keys.push(format!("{key}:{i}:m"));
                [1, window, limit, 0]
            }
            Algorithm::SlidingCounter { .. } => {
                [2, window, limit, q.granularity_micros().unwrap_or(window)]
            }
            Algorithm::FixedWindow => [3, window, limit, 0],
            Algorithm::Gcra => [4, q.emission_interval_micros(), u64::from(q.capacity()), 0],
            other => panic!("no Lua code for {other:?}"),
        };
        args.extend(slots.map(|v| v.to_string()));
    }
    (keys, args)
}

/// Every script and every step, in the table's order.
fn steps() -> (Vec<Script>, Vec<Step>) {
    let with = |tail: &[&str]| ALGORITHMS.concat() + &tail.concat();
    let take_back = lua!("algorithm/take_back.lua");
    let scripts = vec![
        Script::new("", "return redis.call('TIME')\n"),
        Script::new(&with(&[]), "return 0\n"),
        Script::new(&with(&[]), lua!("limit/policy.lua")),
        Script::new(&with(&[]), lua!("limit/peek.lua")),
        Script::new(&with(&[take_back]), lua!("limit/settle.lua")),
        Script::new(&with(&[take_back]), lua!("lease/lease.lua")),
        Script::new(
            "",
            &[lua!("conn/conn_now.lua"), lua!("conn/conn_renew.lua")].concat(),
        ),
    ];
    let [time, top, decide, peek, settle, lease, renew] = [0, 1, 2, 3, 4, 5, 6];
    assert_eq!(
        scripts[decide].sha,
        RedisStore::script_sha(),
        "policy script"
    );
    assert_eq!(
        scripts[lease].sha,
        RedisStore::lease_script_sha(),
        "lease script"
    );

    let step = |name: String, script: usize, (keys, args): (Vec<String>, Vec<String>)| Step {
        name,
        script,
        keys,
        args,
    };
    let strings = |args: &[&str]| args.iter().map(|a| a.to_string()).collect::<Vec<_>>();
    let no_keys = |args: &[&str]| (Vec::new(), strings(args));
    let with_args = |(keys, mut args): (Vec<String>, Vec<String>), extra: &[&str]| {
        args.extend(strings(extra));
        (keys, args)
    };
    let fixed = ["100/1s fixed-window"];
    let three = [
        "100/1s fixed-window",
        "100/1s gcra",
        "100/1s sliding-counter(100ms)",
    ];
    let mut steps = vec![
        step("`TIME` only".into(), time, no_keys(&[])),
        step(
            "top level: prelude + 4 algorithms, `return 0`".into(),
            top,
            no_keys(&["", "1", "0", "0"]),
        ),
    ];
    let one_quota = [
        ("fixed window", "fw", three[0]),
        ("GCRA", "gcra", three[1]),
        ("sliding counter (10 buckets)", "sc", three[2]),
        ("sliding log", "sl", "100/1s sliding-log"),
    ];
    let spread = [("hot key", ""), ("10,000 keys", ":__rand_int__")];
    for (keys, suffix) in spread {
        for (name, tag, quota) in one_quota {
            let key = format!("{tag}{suffix}");
            steps.push(step(
                format!("{name}, {keys}"),
                decide,
                policy(&[quota], &key, 1),
            ));
        }
    }
    for (keys, suffix) in spread {
        steps.push(step(
            format!("three quotas (the first three above), {keys}"),
            decide,
            policy(&three, &format!("three{suffix}"), 1),
        ));
    }
    let spread_key = |tag: &str| format!("{tag}:__rand_int__");
    steps.push(step(
        "peek, fixed window, 10,000 keys".into(),
        peek,
        policy(&fixed, &spread_key("peek"), 1),
    ));
    // Reserved::NONE, 1 unit used: `Limiter::record`.
    steps.push(step(
        "settle (record 1 unit), fixed window, 10,000 keys".into(),
        settle,
        with_args(policy(&fixed, &spread_key("settle"), 1), &["0", "0", "0"]),
    ));
    // 10 units, at least 1, a 1 s lease, deciding, no refunds; then LR, LX.
    let (mut keys, args) = policy(&fixed, &spread_key("lease"), 10);
    keys.extend([spread_key("lease:lr"), spread_key("lease:lx")]);
    steps.push(step(
        "lease reservation (10 units), fixed window, 10,000 keys".into(),
        lease,
        with_args((keys, args), &["reserve", "1000000", "1", "0", "1", "0"]),
    ));
    // KEYS = one seat set, ARGV = now (''), seat TTL, key TTL, the seat.
    let renewal = [
        "",
        &SEAT_TTL_US.to_string(),
        &SEAT_KEY_TTL_MS.to_string(),
        "s",
    ];
    for (keys, suffix) in spread {
        let seat = vec![format!("seat{suffix}")];
        steps.push(step(
            format!("seat renewal, {keys}"),
            renew,
            (seat, strings(&renewal)),
        ));
    }
    (scripts, steps)
}

/// Lets a [`RedisStore`] load the policy library itself (one check), and
/// checks that it is `expected`, character for character: this tool calls
/// what the library calls.
fn check_policy_library(url: &str, conn: &mut redis::Connection, expected: &Script) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async {
        let store = RedisStore::from_url(url).expect("a redis url");
        let quota: Quota = "100/1s fixed-window".parse().expect("a quota");
        let key = WindowKey::new("redis-cost".to_owned(), "library".to_owned());
        Limiter::new(store, quota)
            .check(&key, 1)
            .await
            .expect("one decision by the store");
    });
    let libraries: redis::Value = redis::cmd("FUNCTION")
        .arg("LIST")
        .arg("LIBRARYNAME")
        .arg(&expected.function)
        .arg("WITHCODE")
        .query(conn)
        .expect("FUNCTION LIST");
    let loaded = library_code(&libraries)
        .unwrap_or_else(|| panic!("the store loaded no library {}", expected.function));
    assert!(
        loaded == expected.library,
        "the store's library {} differs from this tool's",
        expected.function
    );
}

/// `library_code` of the first library in a `FUNCTION LIST` reply.
fn library_code(reply: &redis::Value) -> Option<String> {
    use redis::Value;
    let Value::Array(libraries) = reply else {
        return None;
    };
    let fields: Vec<(&Value, &Value)> = match libraries.first()? {
        Value::Array(flat) => flat
            .chunks(2)
            .filter_map(|p| Some((p.first()?, p.get(1)?)))
            .collect(),
        Value::Map(pairs) => pairs.iter().map(|(k, v)| (k, v)).collect(),
        _ => return None,
    };
    fields.into_iter().find_map(|(key, value)| {
        let text = |v: &Value| match v {
            Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
            Value::SimpleString(s) => Some(s.clone()),
            _ => None,
        };
        (text(key)? == "library_code").then(|| text(value))?
    })
}

/// Seats for the renewal steps to find live: `seat` and the 10,000 keys
/// `__rand_int__` names (12 digits, zero-padded).
fn seat_up(conn: &mut redis::Connection) {
    let mut pipe = redis::pipe();
    for key in
        std::iter::once("seat".to_owned()).chain((0..SPREAD).map(|i| format!("seat:{i:012}")))
    {
        pipe.cmd("ZADD").arg(key).arg(SEAT_UNTIL).arg("s").ignore();
    }
    let _: () = pipe.query(conn).expect("seats");
}

/// `redis-benchmark` on `step` called as `mode` names `script`, killed
/// past `--timeout`.
fn bench((host, port): (&str, u16), step: &Step, script: &Script, mode: Mode, args: &Args) {
    let (requests, timeout) = (args.requests, Duration::from_secs(args.timeout));
    let mut child = Command::new("redis-benchmark")
        .args(["-h", host, "-p", &port.to_string(), "-c", "8"])
        .args(["-n", &requests.to_string(), "-r", &SPREAD.to_string()])
        .args([
            mode.label(),
            script.name(mode),
            &step.keys.len().to_string(),
        ])
        .args(&step.keys)
        .args(&step.args)
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-benchmark on PATH");
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().expect("redis-benchmark") {
            assert!(status.success(), "{}: redis-benchmark {status}", step.name);
            return;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{}: still running after {timeout:?}", step.name);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One step run one way: [usec_per_call, its excess over `TIME`'s, the
/// commands inside per call, Redis CPU per call] (µs).
type Cells = [f64; 4];

/// Runs `step` as `mode` once; its cells (the excess left at 0).
fn measure(
    conn: &mut redis::Connection,
    addr: (&str, u16),
    (step, script): (&Step, &Script),
    mode: Mode,
    args: &Args,
) -> Cells {
    reset_stats(conn);
    let cpu = cpu_seconds(conn);
    bench(addr, step, script, mode, args);
    let cpu = cpu_seconds(conn) - cpu;
    let all = all_command_stats(conn);
    let stats = all
        .iter()
        .find_map(|(name, stats)| (name == mode.command()).then_some(stats))
        .unwrap_or_else(|| panic!("{}: no {} in INFO commandstats", step.name, mode.command()));
    assert_eq!(
        (stats.calls, stats.failed_calls),
        (args.requests, 0),
        "{} by {}: calls and failed calls",
        step.name,
        mode.label()
    );
    // What the scripts' own commands took (the admin's and
    // redis-benchmark's CONFIG and INFO aside).
    let inside: f64 = all
        .iter()
        .filter(|(name, _)| {
            !["evalsha", "fcall", "config", "info"]
                .contains(&name.split('|').next().unwrap_or_default())
        })
        .map(|(_, c)| c.calls as f64 * c.usec_per_call)
        // An empty sum of f64 is -0.0.
        .fold(0.0, |sum, v| sum + v);
    let per_call = |total: f64| total / args.requests as f64;
    [
        stats.usec_per_call,
        0.0,
        per_call(inside),
        per_call(cpu * 1e6),
    ]
}

fn main() {
    let args = Args::parse();
    let modes = match args.mode {
        Mode::Both => vec![Mode::Evalsha, Mode::Fcall],
        one => vec![one],
    };
    let server = args.url.is_none().then(RedisServer::start);
    let url = args
        .url
        .clone()
        .unwrap_or_else(|| server.as_ref().map(RedisServer::url).expect("a server"));
    let info = url.as_str().into_connection_info().expect("a redis url");
    let ConnectionAddr::Tcp(host, port) = info.addr().clone() else {
        panic!("--url must name a TCP server");
    };
    let mut conn = admin(&url);
    let (scripts, steps) = steps();
    if modes.contains(&Mode::Fcall) {
        let decide = scripts
            .iter()
            .find(|script| script.sha == RedisStore::script_sha())
            .expect("the policy script");
        check_policy_library(&url, &mut conn, decide);
    }
    scripts.iter().for_each(|script| script.load(&mut conn));
    // [round][step][mode]
    let mut rounds: Vec<Vec<Vec<Cells>>> = Vec::new();
    for r in 0..args.rounds {
        seat_up(&mut conn);
        let mut round = Vec::new();
        for step in &steps {
            let mut cells = vec![[0.0; 4]; modes.len()];
            // Each way first in turn, so neither always runs warmer.
            for k in 0..modes.len() {
                let m = (k + r) % modes.len();
                let script = &scripts[step.script];
                cells[m] = measure(&mut conn, (&host, port), (step, script), modes[m], &args);
            }
            round.push(cells);
        }
        for m in 0..modes.len() {
            let time = round[0][m][0];
            round
                .iter_mut()
                .for_each(|step| step[m][1] = step[m][0] - time);
        }
        // The hot seat was renewed (its expiry moved to now + TTL), not found gone.
        let until: f64 = redis::cmd("ZSCORE")
            .arg("seat")
            .arg("s")
            .query(&mut conn)
            .expect("the hot seat");
        assert!(until < SEAT_UNTIL as f64, "the hot seat was never renewed");
        rounds.push(round);
    }
    let range = |i: usize, m: usize, j: usize| {
        let (lo, hi) = rounds
            .iter()
            .map(|round| round[i][m][j])
            .fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
        if hi - lo < 0.005 {
            format!("{lo:.2}")
        } else {
            format!("{lo:.2}–{hi:.2}")
        }
    };
    println!(
        "redis-benchmark -c 8 -n {} per step and way, {} rounds interleaved; min–max over rounds; \
         − `TIME`: over the `TIME`-only script (function) called the same way",
        args.requests, args.rounds
    );
    println!();
    let mut head = vec!["step".to_owned()];
    for mode in &modes {
        head.push(format!("{} `usec_per_call` µs", mode.label()));
        head.push(format!("{} − `TIME` µs", mode.label()));
    }
    head.push("its commands µs".to_owned());
    for mode in &modes {
        head.push(format!("{} Redis CPU µs / call", mode.label()));
    }
    println!("| {} |", head.join(" | "));
    println!("|---|{}", "---:|".repeat(head.len() - 1));
    for (i, step) in steps.iter().enumerate() {
        let mut row = vec![step.name.clone()];
        for m in 0..modes.len() {
            row.push(range(i, m, 0));
            row.push(range(i, m, 1));
        }
        // The same commands run either way: the last way's.
        row.push(range(i, modes.len() - 1, 2));
        for m in 0..modes.len() {
            row.push(range(i, m, 3));
        }
        println!("| {} |", row.join(" | "));
    }
}
