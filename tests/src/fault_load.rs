//! Concurrent load through [`Limiter`]s while a test breaks the store under
//! it, and what each decision was: for the failover, resharding and restart
//! tests (`tests/tests/redis_fault_recovery.rs`).
//!
//! Several tasks per node check keys in turn, each decision recorded with
//! when it started (relative to the run's start), how long it took and who
//! decided. The test moves the store through a fault meanwhile, notes when
//! the store is whole again, and then asks the [`Run`] what happened around
//! those instants. Loops are bounded by a deadline and a count.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tower_window::{DecisionSource, FallbackReason, Limiter, Policy, WindowKey};

/// One decision.
#[derive(Debug, Clone)]
pub struct Record {
    /// When the check started, since the run's start.
    pub started: Duration,
    /// How long the check took.
    pub latency: Duration,
    /// Which node (index into the limiters).
    pub node: usize,
    /// Which key (index into the keys).
    pub key: usize,
    /// Who decided.
    pub source: DecisionSource,
    /// Admitted?
    pub allowed: bool,
    /// What the decision said remained.
    pub remaining: u32,
}

/// A key under load and the policy it is checked against.
#[derive(Debug, Clone)]
pub struct Target {
    /// The key.
    pub key: WindowKey,
    /// Its policy.
    pub policy: Policy,
    /// What the test calls its group (e.g. the primary serving it).
    pub group: usize,
}

/// A running load; [`stop`](Self::stop) it to get the [`Run`].
pub struct Load {
    start: Instant,
    stop: Arc<std::sync::atomic::AtomicBool>,
    records: Arc<Mutex<Vec<Record>>>,
    handles: Vec<tokio::task::JoinHandle<()>>,
    runtime: tokio::runtime::Runtime,
}

/// The most decisions one task makes (a bound beside the deadline).
const MAX_PER_TASK: usize = 200_000;
/// The pause between two checks of one task: the load is steady, not a
/// saturation of the machine's two cores.
const PAUSE: Duration = Duration::from_millis(5);

impl Load {
    /// Starts `tasks_per_node` tasks for each of `nodes` (limiters on the
    /// same store), each checking every target in turn (from its own
    /// offset), until [`stop`](Self::stop) or `max_run`.
    pub fn start(
        nodes: Vec<Limiter>,
        targets: Vec<Target>,
        tasks_per_node: usize,
        max_run: Duration,
    ) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime for the load");
        let start = Instant::now();
        let deadline = start + max_run;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let records = Arc::new(Mutex::new(Vec::new()));
        let targets = Arc::new(targets);
        let mut handles = Vec::new();
        for (node, limiter) in nodes.into_iter().enumerate() {
            for task in 0..tasks_per_node {
                let limiter = limiter.clone();
                let targets = Arc::clone(&targets);
                let stop = Arc::clone(&stop);
                let records = Arc::clone(&records);
                let offset = (node * tasks_per_node + task) * 7;
                handles.push(runtime.spawn(async move {
                    let mut mine = Vec::new();
                    for i in 0..MAX_PER_TASK {
                        if stop.load(std::sync::atomic::Ordering::Relaxed)
                            || Instant::now() >= deadline
                        {
                            break;
                        }
                        let index = (offset + i) % targets.len();
                        let target = &targets[index];
                        let began = Instant::now();
                        let decision = limiter
                            .check_policy(&target.key, &target.policy, 1)
                            .await
                            .unwrap_or_else(|e| panic!("a check errored (a fallback is set): {e}"));
                        mine.push(Record {
                            started: began - start,
                            latency: began.elapsed(),
                            node,
                            key: index,
                            source: decision.source(),
                            allowed: decision.allowed(),
                            remaining: decision.remaining(),
                        });
                        tokio::time::sleep(PAUSE).await;
                    }
                    records
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .extend(mine);
                }));
            }
        }
        Self {
            start,
            stop,
            records,
            handles,
            runtime,
        }
    }

    /// Time since the load started.
    pub fn now(&self) -> Duration {
        self.start.elapsed()
    }

    /// Stops every task and returns what they decided.
    pub fn stop(self, targets: &[Target]) -> Run {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for handle in self.handles {
            self.runtime.block_on(handle).expect("a load task panicked");
        }
        let mut records =
            std::mem::take(&mut *self.records.lock().unwrap_or_else(|e| e.into_inner()));
        records.sort_by_key(|r| r.started);
        Run {
            records,
            groups: targets.iter().map(|t| t.group).collect(),
        }
    }
}

/// What a load decided.
pub struct Run {
    /// Every decision, by start time.
    pub records: Vec<Record>,
    groups: Vec<usize>,
}

impl Run {
    /// The group of key `key`.
    pub fn group(&self, key: usize) -> usize {
        self.groups[key]
    }

    /// Decisions the fallback made.
    pub fn fallbacks(&self) -> impl Iterator<Item = &Record> {
        self.records
            .iter()
            .filter(|r| matches!(r.source, DecisionSource::Fallback(_)))
    }

    /// Fallback decisions that started at or after `after`.
    pub fn fallbacks_after(&self, after: Duration) -> Vec<&Record> {
        self.fallbacks().filter(|r| r.started >= after).collect()
    }

    /// Fallback decisions of keys in `groups`.
    pub fn fallbacks_of(&self, groups: &[usize]) -> Vec<&Record> {
        self.fallbacks()
            .filter(|r| groups.contains(&self.group(r.key)))
            .collect()
    }

    /// The slowest decision.
    pub fn max_latency(&self) -> Duration {
        self.records
            .iter()
            .map(|r| r.latency)
            .max()
            .unwrap_or_default()
    }

    /// Admissions the store decided, for key `key`.
    pub fn admitted(&self, key: usize) -> u64 {
        self.records
            .iter()
            .filter(|r| r.key == key && r.allowed && r.source == DecisionSource::Store)
            .count() as u64
    }

    /// Fallback decisions for key `key` after the time budget ran out (the
    /// call may still have run in the store).
    pub fn timed_out(&self, key: usize) -> u64 {
        self.records
            .iter()
            .filter(|r| {
                r.key == key && r.source == DecisionSource::Fallback(FallbackReason::Timeout)
            })
            .count() as u64
    }

    /// The global bound of key `key` under a quota of `limit` units over a
    /// window longer than the run: `(over, forgotten)`, the admissions the
    /// store made beyond `limit`, and how many of its admissions reported a
    /// `remaining` that another admission of the key also reported. A store
    /// that counts every admission reports each count once (`limit - 1`,
    /// `limit - 2`, ..., in whatever order the calls ran); only a store
    /// that forgot admissions reports one twice (a promoted replica missing
    /// writes its primary acknowledged but had not replicated yet, a
    /// restarted server without persistence). The bound holds when
    /// `over <= forgotten`; on a store that forgets nothing both are 0.
    pub fn bound(&self, key: usize, limit: u32) -> (u64, u64) {
        let mut seen = std::collections::BTreeSet::new();
        let (mut admitted, mut forgotten) = (0u64, 0u64);
        for r in self
            .records
            .iter()
            .filter(|r| r.key == key && r.allowed && r.source == DecisionSource::Store)
        {
            admitted += 1;
            if !seen.insert(r.remaining) {
                forgotten += 1;
            }
        }
        (admitted.saturating_sub(u64::from(limit)), forgotten)
    }

    /// Units the store charged key `key` (under a quota of `limit` over a
    /// window longer than the run) that no admission we saw reports: the
    /// count after the last admission (`limit - lowest remaining`) minus
    /// the admissions. A call that timed out may have been charged without
    /// our seeing it, so on a store that forgets nothing this is at most
    /// [`timed_out`](Self::timed_out); more would be a charge applied
    /// twice (a retry of a call that had run).
    pub fn unseen_charges(&self, key: usize, limit: u32) -> u64 {
        let admitted: Vec<u32> = self
            .records
            .iter()
            .filter(|r| r.key == key && r.allowed && r.source == DecisionSource::Store)
            .map(|r| r.remaining)
            .collect();
        let Some(lowest) = admitted.iter().min() else {
            return 0;
        };
        u64::from(limit - lowest).saturating_sub(admitted.len() as u64)
    }

    /// Decisions that started in `[from, to)`, by source name.
    pub fn sources_between(&self, from: Duration, to: Duration) -> Vec<(String, usize)> {
        let mut counts: std::collections::BTreeMap<String, usize> = Default::default();
        for r in self
            .records
            .iter()
            .filter(|r| r.started >= from && r.started < to)
        {
            *counts.entry(r.source.to_string()).or_default() += 1;
        }
        counts.into_iter().collect()
    }

    /// A one-line summary per second of the run, for failure messages.
    pub fn timeline(&self) -> String {
        let end = self.records.last().map_or(0, |r| r.started.as_secs());
        (0..=end)
            .map(|s| {
                let from = Duration::from_secs(s);
                format!(
                    "{s:>3}s {:?}",
                    self.sources_between(from, from + Duration::from_secs(1))
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}
