//! The case loop shared by every capability: seeded cases, shrinking,
//! replay and the counts printed at the end.
//!
//! Each case has its own seed (derived from the run's base seed and the
//! case number), from which proptest's strategy draws the operation
//! sequence. A failing case is shrunk with proptest's value tree, then the
//! test panics with the case's seed, the shrunk sequence and what differed.
//! `TW_DIFF_SEED=<seed>` replays exactly that case (drawn again from the
//! same seed, then shrunk again the same way); `TW_DIFF_CASES=<n>` sets how
//! many cases a run draws. A capability's fixed cases (regressions) run
//! first in every run but a replay.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::future::Future;
use std::io::Write;
use std::time::{Duration, Instant};

use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

use super::backends::Backends;

/// What one case found: `Err` is a difference between the stores and the
/// model (or between the stores), described for a human.
pub type Outcome = Result<(), String>;

/// Counts a capability keeps while it runs (printed at the end).
#[derive(Debug, Default)]
pub struct Tally {
    /// Operations run on each store, by store name.
    pub ops: BTreeMap<&'static str, u64>,
    /// Capability-specific counts (outcomes seen), by name.
    pub seen: BTreeMap<&'static str, u64>,
}

impl Tally {
    /// One operation ran on `store`.
    pub fn op(&mut self, store: &'static str) {
        *self.ops.entry(store).or_default() += 1;
    }

    /// One more `what`.
    pub fn saw(&mut self, what: &'static str) {
        *self.seen.entry(what).or_default() += 1;
    }

    /// How many `what` were counted.
    pub fn count(&self, what: &str) -> u64 {
        self.seen.get(what).copied().unwrap_or(0)
    }
}

/// One capability under differential test.
pub trait Capability {
    /// A sequence of operations (and the case's configuration).
    type Case: Debug + Clone;

    /// The capability's name, for messages.
    const NAME: &'static str;

    /// Cases per CI run (`TW_DIFF_CASES` overrides it).
    const CI_CASES: u64;

    /// The cases.
    fn strategy() -> proptest::strategy::BoxedStrategy<Self::Case>;

    /// Fixed cases (regressions: failures a seed once found, kept as
    /// written), run on every store before the drawn cases of every run
    /// but a replay.
    fn fixed() -> Vec<Self::Case> {
        Vec::new()
    }

    /// Runs `case` on every store and the model; `run` is unique to this
    /// execution (a namespace for keys).
    fn run<'a>(
        case: &'a Self::Case,
        backends: &'a Backends,
        run: u64,
        tally: &'a mut Tally,
    ) -> impl Future<Output = Outcome> + 'a;

    /// Checks, after every case ran, that the sequences exercised what
    /// they are for (both outcomes of a decision, say): `Err` names what
    /// was never seen.
    fn coverage(tally: &Tally, cases: u64) -> Outcome;
}

/// The most shrink steps tried after a failure, and for how long.
const MAX_SHRINK_STEPS: u32 = 400;
const MAX_SHRINK_TIME: Duration = Duration::from_secs(90);

fn env_u64(name: &str) -> Option<u64> {
    let text = std::env::var(name).ok()?;
    let text = text.trim();
    let parsed = match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse(),
    };
    Some(parsed.unwrap_or_else(|_| panic!("{name}={text:?} is not a number")))
}

/// splitmix64: a case's seed from the base seed and its number.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn tree_of<S: Strategy>(strategy: &S, seed: u64) -> S::Tree {
    let mut bytes = [0u8; 32];
    for (i, chunk) in bytes.chunks_mut(8).enumerate() {
        chunk.copy_from_slice(&mix(seed ^ (i as u64)).to_le_bytes());
    }
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &bytes);
    let mut runner = TestRunner::new_with_rng(Config::default(), rng);
    strategy
        .new_tree(&mut runner)
        .unwrap_or_else(|e| panic!("the strategy cannot draw a case: {e}"))
}

/// Whether the checks of `family` are left out of this run: a comma list
/// in `TW_DIFF_SKIP`, for triage only (to see what else a run finds while a
/// known defect is open; see tests/README.md). CI never sets it.
pub fn skipped(family: &str) -> bool {
    skip_list().is_some_and(|list| list.split(',').any(|f| f.trim() == family))
}

/// `TW_DIFF_SKIP`, if set and not empty.
fn skip_list() -> Option<String> {
    std::env::var("TW_DIFF_SKIP")
        .ok()
        .filter(|list| !list.trim().is_empty())
}

/// Writes a line to stderr even when the test harness captures output
/// (the harness captures `print!`/`eprint!`, not writes to the handle), so
/// CI logs show the counts of passing runs too.
pub fn report(line: &str) {
    let mut stderr = std::io::stderr();
    let _ = writeln!(stderr, "{line}");
}

/// Runs capability `C`: `TW_DIFF_CASES` cases (default `C::CI_CASES`), or
/// the one case `TW_DIFF_SEED` names; panics with the shrunk failing case
/// and its seed.
pub fn run_capability<C: Capability>() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let started = Instant::now();
    let backends = Backends::start(&runtime);
    let startup = started.elapsed();
    let replay = env_u64("TW_DIFF_SEED");
    let cases = match replay {
        Some(_) => 1,
        None => env_u64("TW_DIFF_CASES").unwrap_or(C::CI_CASES),
    };
    let base = env_u64("TW_DIFF_BASE_SEED").unwrap_or_else(crate::redis_server::random);
    let strategy = C::strategy();
    let mut tally = Tally::default();
    let mut executions = 0u64;
    // The fixed cases count in neither the cases nor the coverage.
    let fixed = if replay.is_some() {
        Vec::new()
    } else {
        C::fixed()
    };
    for (n, case) in fixed.iter().enumerate() {
        executions += 1;
        let mut scratch = Tally::default();
        let outcome = runtime.block_on(C::run(case, &backends, executions, &mut scratch));
        if let Err(failure) = outcome {
            let message = format!(
                "differential {name}: fixed case {n} failed:\n{case:#?}\n{failure}",
                name = C::NAME,
            );
            report(&message);
            drop(backends);
            panic!("{message}");
        }
    }
    for case in 0..cases {
        let seed = replay.unwrap_or_else(|| mix(base.wrapping_add(case)));
        let mut tree = tree_of(&strategy, seed);
        executions += 1;
        let first = runtime.block_on(C::run(&tree.current(), &backends, executions, &mut tally));
        let Err(failure) = first else { continue };
        // Shrink: simplify while it still fails, complicate back when a
        // simplification passes (proptest's own search, on our loop).
        let mut best = (tree.current(), failure);
        let shrink_start = Instant::now();
        let mut steps = 0;
        if tree.simplify() {
            while steps < MAX_SHRINK_STEPS && shrink_start.elapsed() < MAX_SHRINK_TIME {
                steps += 1;
                executions += 1;
                let mut scratch = Tally::default();
                let outcome =
                    runtime.block_on(C::run(&tree.current(), &backends, executions, &mut scratch));
                let more = match outcome {
                    Err(failure) => {
                        best = (tree.current(), failure);
                        tree.simplify()
                    }
                    Ok(()) => tree.complicate(),
                };
                if !more {
                    break;
                }
            }
        }
        let (shrunk, failure) = best;
        let message = format!(
            "differential {name}: case {case} failed (seed {seed:#018x}; replay with \
             TW_DIFF_SEED={seed:#018x} cargo test -p tower-window-tests --test differential_{name}), \
             shrunk in {steps} steps to:\n{shrunk:#?}\n{failure}",
            name = C::NAME,
        );
        report(&message);
        drop(backends);
        panic!("{message}");
    }
    let per_store: Vec<String> = tally
        .ops
        .iter()
        .map(|(store, ops)| format!("{store} {cases} cases / {ops} ops"))
        .collect();
    let seen: Vec<String> = tally
        .seen
        .iter()
        .map(|(what, n)| format!("{what} {n}"))
        .collect();
    let skip = skip_list()
        .map(|s| format!(" (TW_DIFF_SKIP={s})"))
        .unwrap_or_default();
    report(&format!(
        "differential {}{skip}: {} fixed and {cases} cases passed on every store ({}) in {:.1?} \
         (+{:.1?} startup); base seed {base:#018x}; seen: {}",
        C::NAME,
        fixed.len(),
        per_store.join(", "),
        started.elapsed() - startup,
        startup,
        seen.join(", ")
    ));
    // A replay runs one case, and a triage run leaves checks out: neither
    // is expected to cover everything.
    if replay.is_none() && skip_list().is_none() {
        if let Err(missing) = C::coverage(&tally, cases) {
            panic!(
                "differential {}: the cases did not cover {missing}",
                C::NAME
            );
        }
    }
}
