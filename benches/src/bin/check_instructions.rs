//! Runs `Limiter::check` on the embedded `MemoryStore` a fixed number of
//! times, for counting instructions per decision under callgrind (issue 10):
//!
//! ```text
//! cargo build --release -p tower-window-benches --bin check_instructions
//! valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.out \
//!     target/release/check_instructions sliding_log 100000
//! callgrind_annotate --inclusive=yes /tmp/cg.out | head -40
//! ```
//!
//! Instruction counts repeat to the instruction on any machine load, where
//! nanoseconds on a shared VM do not. The first argument picks the quota
//! (`sliding_log`, `sliding_counter`, `fixed_window`, `gcra`, or `builder`
//! for a limiter with the local tier on a store with a breaker), the second
//! the number of checks; `SYNC=1` takes each answer with `Check::into_ready`
//! (which replaced `Limiter::check_sync`) instead of polling the `Check`
//! once.
//! It prints the checks it made; subtract a run of 0 checks to get the
//! per-decision cost. `KEYS=N` rotates over `N` present keys (`u0`,
//! `u1`, ...) instead of checking one hot key: the rotating case of
//! `benches/check`, where the cost is in cache misses (run it with
//! `--cache-sim=yes` to count them).

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::process::ExitCode;
use std::task::{Context, Poll, Waker};

use tower_window::{BreakerConfig, Limiter, MemoryStore, Quota, Store, WindowKey};

fn now<F: Future>(future: F) -> Option<F::Output> {
    let mut future = pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(output) => Some(output),
        Poll::Pending => None,
    }
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let case = args.next().unwrap_or_else(|| "sliding_log".to_owned());
    let count: u64 = match args.next().map(|n| n.parse()) {
        None => 100_000,
        Some(Ok(n)) => n,
        Some(Err(error)) => {
            eprintln!("check_instructions: the count: {error}");
            return ExitCode::FAILURE;
        }
    };
    let dsl = match case.as_str() {
        "sliding_log" | "builder" => "1000000000/1s",
        "sliding_counter" => "1000000000/1s sliding-counter(100ms)",
        "fixed_window" => "1000000000/1s fixed-window",
        "gcra" => "1000000000/1s gcra",
        other => {
            eprintln!("check_instructions: unknown case {other}");
            return ExitCode::FAILURE;
        }
    };
    let quota = match dsl.parse::<Quota>() {
        Ok(quota) => quota,
        Err(error) => {
            eprintln!("check_instructions: {error}");
            return ExitCode::FAILURE;
        }
    };
    let limiter = if case == "builder" {
        // The embedded store has no breaker by default: this case keeps one.
        let store = Store::builder(MemoryStore::new())
            .breaker(BreakerConfig::default())
            .build();
        Limiter::builder(store, quota).build()
    } else {
        Limiter::new(MemoryStore::new(), quota)
    };
    let keys: Vec<WindowKey> = match std::env::var("KEYS").ok().map(|n| n.parse::<usize>()) {
        None => vec![WindowKey::for_subject("alice")],
        Some(Ok(n)) if n > 0 => (0..n)
            .map(|i| WindowKey::for_subject(format!("u{i}")))
            .collect(),
        Some(_) => {
            eprintln!("check_instructions: KEYS must be a positive number");
            return ExitCode::FAILURE;
        }
    };
    // The keys are present before counting starts.
    for key in &keys {
        let _ = now(limiter.check(key, 1));
    }
    let sync = std::env::var_os("SYNC").is_some();
    let mut admitted = 0u64;
    for i in 0..count {
        let key = &keys[usize::try_from(i).unwrap_or(0) % keys.len()];
        let decided = if sync {
            limiter.check(black_box(key), 1).into_ready().ok()
        } else {
            now(limiter.check(black_box(key), 1))
        };
        match decided {
            Some(Ok(decision)) => admitted += u64::from(black_box(decision).allowed()),
            Some(Err(error)) => {
                eprintln!("check_instructions: {error}");
                return ExitCode::FAILURE;
            }
            None => {
                eprintln!("check_instructions: an in-process decision was pending");
                return ExitCode::FAILURE;
            }
        }
    }
    eprintln!("{case}: {count} checks, {admitted} admitted");
    ExitCode::SUCCESS
}
