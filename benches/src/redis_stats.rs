//! What Redis itself says it spent: `INFO commandstats` per command and
//! `INFO cpu` for the process, between `CONFIG RESETSTAT`s (used by
//! `script_cost` and `redis_cost`).

use std::time::Duration;

/// A blocking admin connection to `url` (5 s connect timeout).
pub fn admin(url: &str) -> redis::Connection {
    redis::Client::open(url)
        .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(5)))
        .expect("admin connection")
}

/// `CONFIG RESETSTAT`: zeroes `INFO commandstats` (not `INFO cpu`).
pub fn reset_stats(conn: &mut redis::Connection) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(conn)
        .expect("CONFIG RESETSTAT");
}

/// One command's line of `INFO commandstats` since the last reset.
#[derive(Clone, Copy, Debug)]
pub struct CommandStats {
    /// Calls that ran.
    pub calls: u64,
    /// Microseconds per call, as Redis measures it.
    pub usec_per_call: f64,
    /// Calls that ran and replied with an error.
    pub failed_calls: u64,
}

/// Every command's stats since the last reset, by lower-case name
/// (`evalsha`, `hmget`, `config|get`; a script's own commands count too).
pub fn all_command_stats(conn: &mut redis::Connection) -> Vec<(String, CommandStats)> {
    info(conn, "commandstats")
        .lines()
        .filter_map(|l| l.strip_prefix("cmdstat_")?.split_once(':'))
        .map(|(name, line)| {
            let field = |name: &str| -> &str {
                line.split(',')
                    .find_map(|f| f.strip_prefix(name))
                    .unwrap_or_else(|| panic!("no {name} in {line}"))
            };
            let stats = CommandStats {
                calls: field("calls=").parse().expect("calls"),
                usec_per_call: field("usec_per_call=").parse().expect("usec_per_call"),
                failed_calls: field("failed_calls=").parse().expect("failed_calls"),
            };
            (name.to_owned(), stats)
        })
        .collect()
}

/// `command`'s stats (lower case, e.g. `evalsha`) since the last reset.
pub fn command_stats(conn: &mut redis::Connection, command: &str) -> CommandStats {
    all_command_stats(conn)
        .into_iter()
        .find_map(|(name, stats)| (name == command).then_some(stats))
        .unwrap_or_else(|| panic!("no {command} in INFO commandstats"))
}

/// The server process's CPU time so far (`used_cpu_sys + used_cpu_user` of
/// `INFO cpu`), in seconds.
pub fn cpu_seconds(conn: &mut redis::Connection) -> f64 {
    info(conn, "cpu")
        .lines()
        .filter_map(|l| {
            l.strip_prefix("used_cpu_sys:")
                .or_else(|| l.strip_prefix("used_cpu_user:"))
        })
        .map(|v| v.trim().parse::<f64>().expect("a cpu time"))
        .sum()
}

fn info(conn: &mut redis::Connection, section: &str) -> String {
    redis::cmd("INFO")
        .arg(section)
        .query(conn)
        .unwrap_or_else(|e| panic!("INFO {section}: {e}"))
}
