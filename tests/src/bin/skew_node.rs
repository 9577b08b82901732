//! One rate-limiting "node" for the clock-skew test (`tests/redis_clock_skew.rs`),
//! meant to run under libfaketime so its own clock is skewed.
//!
//! `skew_node [--caller-clock] <redis-url> <prefix> <quota>...` builds one bare
//! `Limiter::new(Store::bare(RedisStore::builder().url(url).prefix(prefix).build()?), quota)` per quota
//! DSL (index 0, 1, … in argument order). With `--caller-clock` the store is
//! built with `RedisStoreBuilder::clock(SystemClock)`, i.e. it decides on this process's clock
//! instead of Redis `TIME` (the anti-pattern the test shows failing).
//!
//! Commands, one per line on stdin:
//! - `now` prints `now <SystemTime::now in µs>`;
//! - `check <quota-index> <subject>` prints
//!   `decision <allowed> <remaining> <timestamp_micros> <SystemTime::now in µs>`;
//!
//! anything that fails prints `error <message>`. EOF ends the process.

use std::io::{self, BufRead, Write};
use std::time::{SystemTime, UNIX_EPOCH};

use tower_window::{Limiter, Quota, RedisStore, Store, SystemClock, WindowKey};

fn now_micros() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or(0)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let caller_clock = args.first().is_some_and(|a| a == "--caller-clock");
    if caller_clock {
        args.remove(0);
    }
    let [url, prefix, quotas @ ..] = args.as_slice() else {
        return Err("usage: skew_node [--caller-clock] <redis-url> <prefix> <quota>...".into());
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let limiters = runtime.block_on(async {
        quotas
            .iter()
            .map(|dsl| {
                let quota: Quota = dsl.parse()?;
                let store = RedisStore::builder().url(url).prefix(prefix.as_str());
                let store = if caller_clock {
                    store.clock(SystemClock)
                } else {
                    store
                };
                let store = store.build()?;
                // Bare: no time budget or breaker (their clocks would be
                // this process's skewed one).
                Ok(Limiter::new(Store::bare(store), quota))
            })
            .collect::<Result<Vec<_>, Box<dyn std::error::Error>>>()
    })?;

    let stdout = io::stdout();
    for line in io::stdin().lock().lines() {
        let line = line?;
        let words: Vec<&str> = line.split_whitespace().collect();
        let reply = match words.as_slice() {
            ["now"] => format!("now {}", now_micros()),
            ["check", index, subject] => {
                match index.parse::<usize>().ok().and_then(|i| limiters.get(i)) {
                    Some(limiter) => {
                        let key = WindowKey::for_subject(subject.as_bytes().to_vec());
                        match runtime.block_on(limiter.check(&key, 1)) {
                            Ok(d) => format!(
                                "decision {} {} {} {}",
                                d.allowed(),
                                d.remaining(),
                                d.timestamp_micros(),
                                now_micros()
                            ),
                            Err(error) => format!("error {error}"),
                        }
                    }
                    None => format!("error no quota {index}"),
                }
            }
            _ => format!("error unknown command {line:?}"),
        };
        let mut out = stdout.lock();
        writeln!(out, "{reply}")?;
        out.flush()?;
    }
    Ok(())
}
