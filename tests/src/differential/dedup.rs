//! Dedup windows (`tower_window::dedup`): random asks of hostile and long
//! ids by several subjects, from two "nodes" with different windows,
//! concurrent bursts of one id, and clock steps either way.
//!
//! The model is the contract itself: an id of a subject is remembered
//! until `now + window` of the ask that found it new; an ask is "first
//! seen" exactly when no remembered deadline is later than now; of any
//! number of concurrent asks exactly one is first.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use tower_window::dedup::{self, DedupRequest};
use tower_window::store::Guard;
use tower_window::{Clock, WindowKey};

use super::backends::{Backends, STORES};
use super::runner::{Capability, Outcome, Tally};

/// Ids: plain, ones that differ only in escaped bytes, binary, and long
/// ones (hashed by Redis) that differ only at the end.
fn ids() -> Vec<Vec<u8>> {
    let mut long_a = vec![b'z'; 300];
    let mut long_b = long_a.clone();
    long_a[299] = b'a';
    long_b[299] = b'b';
    vec![
        b"m-1".to_vec(),
        b"m-2".to_vec(),
        b"a:b".to_vec(),
        b"a%3Ab".to_vec(),
        b"{x}".to_vec(),
        b"#dedup".to_vec(),
        b"\xff\x00".to_vec(),
        long_a,
        long_b,
    ]
}

/// Windows (ms) the two nodes may use.
const WINDOWS_MS: [u64; 5] = [1, 50, 1_000, 10_000, 120_000];

/// One step of a dedup case.
#[derive(Clone)]
pub enum Op {
    /// The clock moves by this many µs (negative: back).
    Step(i64),
    /// `node` asks whether `id` of `subject` is new.
    Ask {
        /// The node (its window).
        node: usize,
        /// The subject.
        subject: u8,
        /// The id (index in the hostile list).
        id: usize,
    },
    /// `count` concurrent asks of one id.
    Burst {
        /// The node (its window).
        node: usize,
        /// The subject.
        subject: u8,
        /// The id (index in the hostile list).
        id: usize,
        /// How many at once.
        count: usize,
    },
}

impl fmt::Debug for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Step(us) => write!(f, "Step({us} µs)"),
            Self::Ask { node, subject, id } => write!(f, "Ask(node {node}, s{subject}, id #{id})"),
            Self::Burst {
                node,
                subject,
                id,
                count,
            } => write!(f, "Burst(node {node}, s{subject}, id #{id}, x{count})"),
        }
    }
}

/// A dedup case: the two nodes' windows and the steps.
#[derive(Debug, Clone)]
pub struct Case {
    /// Window of node 0 and node 1, in ms.
    pub windows_ms: [u64; 2],
    /// What happens.
    pub ops: Vec<Op>,
}

fn op() -> impl Strategy<Value = Op> {
    let n = ids().len();
    prop_oneof![
        3 => prop_oneof![
            0i64..2_000,
            0i64..60_000,
            1_000i64..130_000_000,
            -200_000i64..0,
        ]
        .prop_map(Op::Step),
        6 => (0..2usize, 0..3u8, 0..n).prop_map(|(node, subject, id)| Op::Ask { node, subject, id }),
        1 => (0..2usize, 0..3u8, 0..n, 2..8usize).prop_map(|(node, subject, id, count)| Op::Burst {
            node,
            subject,
            id,
            count
        }),
    ]
}

/// The capability.
pub struct Dedup;

async fn ask(
    store: &dyn dedup::Backend,
    key: &WindowKey,
    id: &[u8],
    window: Duration,
) -> Result<bool, String> {
    store
        .first_seen(&mut Guard::bare(), DedupRequest::new(key, id, window))
        .await
        .map_err(|e| format!("error: {e}"))
}

async fn burst(
    store: Arc<dyn dedup::Backend>,
    key: &WindowKey,
    id: &[u8],
    window: Duration,
    count: usize,
) -> Result<usize, String> {
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..count {
        let (store, key, id) = (Arc::clone(&store), key.clone(), id.to_vec());
        tasks.spawn(async move { ask(&*store, &key, &id, window).await });
    }
    let mut firsts = 0;
    while let Some(joined) = tasks.join_next().await {
        if joined.map_err(|e| format!("task: {e}"))?? {
            firsts += 1;
        }
    }
    Ok(firsts)
}

impl Capability for Dedup {
    type Case = Case;
    const NAME: &'static str = "dedup";
    const CI_CASES: u64 = 96;

    fn strategy() -> BoxedStrategy<Case> {
        (
            0..WINDOWS_MS.len(),
            0..WINDOWS_MS.len(),
            proptest::collection::vec(op(), 1..60),
        )
            .prop_map(|(a, b, ops)| Case {
                windows_ms: [WINDOWS_MS[a], WINDOWS_MS[b]],
                ops,
            })
            .boxed()
    }

    async fn run(case: &Case, backends: &Backends, run: u64, tally: &mut Tally) -> Outcome {
        let clock = &backends.clock;
        clock.set(crate::conformance::START);
        let stores: [Arc<dyn dedup::Backend>; 3] = [
            Arc::new(backends.memory()),
            backends.redis.clone(),
            backends.cluster.clone(),
        ];
        let ids = ids();
        let tenant = backends.namespace(run);
        let key = |subject: u8| WindowKey::new(tenant.clone(), format!("s{subject}"));
        // The model: (subject, id) -> remembered until (µs).
        let mut remembered: HashMap<(u8, usize), u64> = HashMap::new();
        for (i, op) in case.ops.iter().enumerate() {
            let now = clock.now_micros();
            let fail = |what: String| {
                Err(format!(
                    "op {i} {op:?} at START + {} µs: {what}",
                    now - crate::conformance::START
                ))
            };
            match *op {
                Op::Step(us) => clock.set(now.saturating_add_signed(us)),
                Op::Ask { node, subject, id } => {
                    let window = Duration::from_millis(case.windows_ms[node]);
                    let want = remembered
                        .get(&(subject, id))
                        .is_none_or(|&until| until <= now);
                    let k = key(subject);
                    for (store, name) in stores.iter().zip(STORES) {
                        tally.op(name);
                        let got = ask(&**store, &k, &ids[id], window).await;
                        if got != Ok(want) {
                            return fail(format!("{name} answered {got:?}, the model {want}"));
                        }
                    }
                    tally.saw(if want { "first" } else { "repeat" });
                    if want {
                        remembered.insert((subject, id), now + window.as_micros() as u64);
                    }
                }
                Op::Burst {
                    node,
                    subject,
                    id,
                    count,
                } => {
                    let window = Duration::from_millis(case.windows_ms[node]);
                    let new = remembered
                        .get(&(subject, id))
                        .is_none_or(|&until| until <= now);
                    let want = usize::from(new);
                    let k = key(subject);
                    for (store, name) in stores.iter().zip(STORES) {
                        tally.op(name);
                        let got = burst(Arc::clone(store), &k, &ids[id], window, count).await;
                        if got != Ok(want) {
                            return fail(format!(
                                "{name}: {got:?} of {count} concurrent asks were first, the model {want}"
                            ));
                        }
                    }
                    tally.saw("burst");
                    if new {
                        remembered.insert((subject, id), now + window.as_micros() as u64);
                    }
                }
            }
        }
        Ok(())
    }

    fn coverage(tally: &Tally, _cases: u64) -> Outcome {
        for what in ["first", "repeat", "burst"] {
            if tally.count(what) < 10 {
                return Err(format!("{what} (seen {} times)", tally.count(what)));
            }
        }
        Ok(())
    }
}
