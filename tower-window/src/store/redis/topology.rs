//! Which Redis Cluster primary serves a hash slot: the failure domains of
//! the store's breakers.
//!
//! A [`Topology`] maps each hash slot to the id of its primary, from one
//! `CLUSTER SLOTS` reply. Ids are interned per primary address in a table
//! that outlives each reply, so a primary keeps its id (and its breaker)
//! across refreshes, and a range that moves in a failover takes the new
//! primary's id.
//!
//! [`TopologyCache`] refreshes the map after a topology change is seen (at
//! most once per [`MIN_REFRESH_INTERVAL`]) and otherwise once it is
//! [`MAX_AGE`] old: a failover is often seen by no error of ours (the dead
//! primary's keys skip Redis while its breaker is open, and the promoted
//! replica answers without a redirect), so only a fresh `CLUSTER SLOTS`
//! moves those slots to a new, closed breaker.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use redis::cluster_async::ClusterConnection;
use redis::{ErrorKind, RedisError, Value};
use tokio::time::Instant;

/// The number of Redis Cluster hash slots.
pub(crate) const SLOTS: usize = 16_384;
/// Domain ids are below this: as many as the store keeps breakers for
/// (`breaker::MAX_SHARDS`).
const MAX_DOMAINS: usize = SLOTS;
/// A slot no primary serves.
const UNASSIGNED: u16 = u16::MAX;
/// The least time between two `CLUSTER SLOTS` queries of one cache.
pub(crate) const MIN_REFRESH_INTERVAL: Duration = Duration::from_millis(250);
/// The age at which a call refreshes the map in the background.
pub(crate) const MAX_AGE: Duration = Duration::from_secs(1);

/// Hash slot → failure-domain id, from one `CLUSTER SLOTS` reply.
#[derive(Debug, Clone)]
pub(crate) struct Topology {
    /// The domain id of each slot, or `UNASSIGNED`.
    table: Box<[u16]>,
}

/// Domain ids by primary address, kept across refreshes.
#[derive(Debug, Default)]
pub(crate) struct Interner {
    ids: HashMap<String, u16>,
    /// The next id never handed out.
    next: u16,
    /// Ids of forgotten primaries, to hand out again.
    free: Vec<u16>,
}

impl Interner {
    /// The id of `primary`. Once `MAX_DOMAINS` ids are out, the primaries
    /// not in `current` are forgotten and their ids reused.
    fn intern(&mut self, primary: &str, current: &HashSet<&str>) -> Result<u16, String> {
        if let Some(&id) = self.ids.get(primary) {
            return Ok(id);
        }
        let id = if usize::from(self.next) < MAX_DOMAINS {
            self.next += 1;
            self.next - 1
        } else {
            if self.free.is_empty() {
                let free = &mut self.free;
                self.ids.retain(|addr, id| {
                    let keep = current.contains(addr.as_str());
                    if !keep {
                        free.push(*id);
                    }
                    keep
                });
            }
            self.free
                .pop()
                .ok_or_else(|| format!("more than {MAX_DOMAINS} primaries"))?
        };
        self.ids.insert(primary.to_owned(), id);
        Ok(id)
    }
}

impl Topology {
    /// Parses a `CLUSTER SLOTS` reply, taking the primaries' ids from
    /// `interner`, which an error leaves unchanged.
    pub(crate) fn parse_with(value: &Value, interner: &mut Interner) -> Result<Topology, String> {
        let ranges = primary_ranges(value)?;
        let current: HashSet<&str> = ranges.iter().map(|(_, _, p)| p.as_str()).collect();
        // Overlaps are checked before interning, so a bad reply adds nothing.
        let mut spans: Vec<(u16, u16)> = ranges.iter().map(|&(s, e, _)| (s, e)).collect();
        spans.sort_unstable();
        if let Some(pair) = spans.windows(2).find(|pair| pair[1].0 <= pair[0].1) {
            let slot = pair[1].0;
            return Err(format!("slot {slot} is served by two primaries"));
        }
        let mut table = vec![UNASSIGNED; SLOTS].into_boxed_slice();
        for (start, end, primary) in &ranges {
            let id = interner.intern(primary, &current)?;
            table[usize::from(*start)..=usize::from(*end)].fill(id);
        }
        Ok(Topology { table })
    }

    /// The failure domain serving `slot`, if any.
    pub(crate) fn domain_of(&self, slot: u16) -> Option<u16> {
        match self.table.get(usize::from(slot)) {
            Some(&UNASSIGNED) | None => None,
            Some(&id) => Some(id),
        }
    }
}

/// The slot ranges of a `CLUSTER SLOTS` reply with each one's primary
/// (`host:port`); ranges of an unknown node (`?`) are left out.
pub(crate) fn primary_ranges(value: &Value) -> Result<Vec<(u16, u16, String)>, String> {
    let Value::Array(entries) = value else {
        return Err("CLUSTER SLOTS: not an array".to_owned());
    };
    let mut ranges = Vec::with_capacity(entries.len());
    for entry in entries {
        let Value::Array(items) = entry else {
            return Err("CLUSTER SLOTS: an entry is not an array".to_owned());
        };
        let [start, end, primary, ..] = items.as_slice() else {
            return Err("CLUSTER SLOTS: an entry has fewer than 3 items".to_owned());
        };
        let (start, end) = (slot(start)?, slot(end)?);
        if start > end {
            return Err(format!("CLUSTER SLOTS: range {start}-{end} is reversed"));
        }
        if let Some(primary) = address(primary)? {
            ranges.push((start, end, primary));
        }
    }
    Ok(ranges)
}

fn slot(value: &Value) -> Result<u16, String> {
    match value {
        Value::Int(n) => u16::try_from(*n)
            .ok()
            .filter(|&n| usize::from(n) < SLOTS)
            .ok_or_else(|| format!("CLUSTER SLOTS: {n} is not a hash slot")),
        _ => Err("CLUSTER SLOTS: a slot is not an integer".to_owned()),
    }
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

/// A node `[host, port, id?, ...]` as `host:port`; `None` for an unknown
/// node (`?`). An empty or null host ("the node that answered", which a
/// routed query cannot name) is replaced by the node id.
fn address(value: &Value) -> Result<Option<String>, String> {
    let Value::Array(node) = value else {
        return Err("CLUSTER SLOTS: a node is not an array".to_owned());
    };
    let [host, port, rest @ ..] = node.as_slice() else {
        return Err("CLUSTER SLOTS: a node has fewer than 2 items".to_owned());
    };
    let Value::Int(port) = port else {
        return Err("CLUSTER SLOTS: a port is not an integer".to_owned());
    };
    let host = match host {
        Value::Nil => String::new(),
        other => text(other).ok_or("CLUSTER SLOTS: a host is not a string")?,
    };
    if host == "?" {
        return Ok(None);
    }
    if host.is_empty() {
        let id = rest
            .first()
            .and_then(text)
            .filter(|id| !id.is_empty())
            .ok_or("CLUSTER SLOTS: a node has neither a host nor an id")?;
        return Ok(Some(format!("id:{id}")));
    }
    Ok(Some(format!("{host}:{port}")))
}

/// The current topology of one cluster, refreshed on demand.
pub(crate) struct TopologyCache {
    current: ArcSwapOption<Topology>,
    /// Locked only while a reply is parsed.
    interner: Mutex<Interner>,
    /// Set by [`mark_stale`](Self::mark_stale) and by failed refreshes.
    stale: AtomicBool,
    /// When the last refresh started: milliseconds since `epoch` plus one
    /// (0: never).
    last_attempt: AtomicU64,
    epoch: Instant,
}

impl TopologyCache {
    pub(crate) fn new() -> Self {
        Self {
            current: ArcSwapOption::empty(),
            interner: Mutex::new(Interner::default()),
            stale: AtomicBool::new(false),
            last_attempt: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    /// The failure domain serving `slot`; `None` before the first load or
    /// for a slot no primary serves.
    pub(crate) fn domain_of(&self, slot: u16) -> Option<u16> {
        self.current
            .load()
            .as_ref()
            .and_then(|topology| topology.domain_of(slot))
    }

    /// Notes a topology change (see `connection::is_topology_change`).
    pub(crate) fn mark_stale(&self) {
        self.stale.store(true, Ordering::Relaxed);
    }

    /// Whether a refresh is due: stale or never loaded and the last one
    /// started at least [`MIN_REFRESH_INTERVAL`] ago, or at least
    /// [`MAX_AGE`] ago.
    pub(crate) fn needs_refresh(&self) -> bool {
        self.due(self.last_attempt.load(Ordering::Relaxed), Instant::now())
    }

    fn due(&self, last: u64, now: Instant) -> bool {
        if last == 0 {
            return true;
        }
        let wanted = self.stale.load(Ordering::Relaxed) || self.current.load().is_none();
        let wait = if wanted {
            MIN_REFRESH_INTERVAL
        } else {
            MAX_AGE
        };
        let wait = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        self.stamp(now).saturating_sub(last) >= wait
    }

    fn stamp(&self, now: Instant) -> u64 {
        u64::try_from(now.saturating_duration_since(self.epoch).as_millis())
            .unwrap_or(u64::MAX - 1)
            .saturating_add(1)
    }

    /// Claims the refresh due at `now` (one caller wins) and clears the
    /// stale flag, so a change seen while the query runs marks it again.
    fn claim(&self, now: Instant) -> bool {
        let last = self.last_attempt.load(Ordering::Relaxed);
        if !self.due(last, now) {
            return false;
        }
        let won = self
            .last_attempt
            .compare_exchange(last, self.stamp(now), Ordering::AcqRel, Ordering::Relaxed)
            .is_ok();
        if won {
            self.stale.store(false, Ordering::Relaxed);
        }
        won
    }

    /// Loads the map with `CLUSTER SLOTS` and swaps it in, if a refresh is
    /// due and no other caller claimed it (else `Ok` at once). On an error
    /// the old map stays and the cache is stale again.
    pub(crate) async fn refresh(&self, conn: &mut ClusterConnection) -> Result<(), RedisError> {
        if !self.claim(Instant::now()) {
            return Ok(());
        }
        let reply = redis::cmd("CLUSTER").arg("SLOTS").query_async(conn).await;
        let result = reply.and_then(|reply: Value| self.install(&reply));
        if result.is_err() {
            self.mark_stale();
        }
        result
    }

    fn install(&self, reply: &Value) -> Result<(), RedisError> {
        let mut interner = crate::sync::lock(&self.interner);
        let topology = Topology::parse_with(reply, &mut interner).map_err(|message| {
            RedisError::from((
                ErrorKind::UnexpectedReturnType,
                "unexpected CLUSTER SLOTS reply",
                message,
            ))
        })?;
        self.current.store(Some(Arc::new(topology)));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    impl Topology {
        /// Parses a reply, numbering its primaries from 0 in order of
        /// first appearance.
        pub(crate) fn parse(value: &Value) -> Result<Topology, String> {
            Self::parse_with(value, &mut Interner::default())
        }

        /// How many distinct primaries serve slots.
        fn domains(&self) -> usize {
            let mut seen: Vec<u16> = self
                .table
                .iter()
                .copied()
                .filter(|d| *d != UNASSIGNED)
                .collect();
            seen.sort_unstable();
            seen.dedup();
            seen.len()
        }
    }

    impl TopologyCache {
        fn current(&self) -> Option<Arc<Topology>> {
            self.current.load_full()
        }
    }

    fn node(host: &str, port: i64, id: &str) -> Value {
        Value::Array(vec![
            Value::BulkString(host.as_bytes().to_vec()),
            Value::Int(port),
            Value::BulkString(id.as_bytes().to_vec()),
        ])
    }

    fn range(start: i64, end: i64, nodes: Vec<Value>) -> Value {
        let mut items = vec![Value::Int(start), Value::Int(end)];
        items.extend(nodes);
        Value::Array(items)
    }

    /// Three primaries with one replica each, ranges out of order.
    fn three_primaries() -> Value {
        Value::Array(vec![
            range(
                5461,
                10922,
                vec![node("10.0.0.2", 6379, "b"), node("10.0.0.5", 6379, "e")],
            ),
            range(
                0,
                5460,
                vec![node("10.0.0.1", 6379, "a"), node("10.0.0.4", 6379, "d")],
            ),
            range(
                10923,
                16383,
                vec![node("10.0.0.3", 6379, "c"), node("10.0.0.6", 6379, "f")],
            ),
        ])
    }

    #[test]
    fn three_primaries_three_domains() {
        let t = Topology::parse(&three_primaries()).unwrap();
        assert_eq!(t.domains(), 3);
        // Numbered in order of appearance.
        assert_eq!(t.domain_of(5461), Some(0));
        assert_eq!(t.domain_of(10922), Some(0));
        assert_eq!(t.domain_of(0), Some(1));
        assert_eq!(t.domain_of(5460), Some(1));
        assert_eq!(t.domain_of(10923), Some(2));
        assert_eq!(t.domain_of(16383), Some(2));
        assert_eq!(t.domain_of(16384), None, "not a slot");
        assert_eq!(t.domain_of(u16::MAX), None);
    }

    #[test]
    fn a_failover_moves_a_range_and_known_primaries_keep_their_ids() {
        let mut interner = Interner::default();
        let before = Topology::parse_with(&three_primaries(), &mut interner).unwrap();
        // 10.0.0.1 died: its replica 10.0.0.4 serves 0-5460 now, and a
        // resharding moved 16000-16383 to 10.0.0.2. The reply lists the
        // primaries in another order.
        let after = Value::Array(vec![
            range(10923, 15999, vec![node("10.0.0.3", 6379, "c")]),
            range(16000, 16383, vec![node("10.0.0.2", 6379, "b")]),
            range(0, 5460, vec![node("10.0.0.4", 6379, "d")]),
            range(5461, 10922, vec![node("10.0.0.2", 6379, "b")]),
        ]);
        let after = Topology::parse_with(&after, &mut interner).unwrap();
        assert_eq!(after.domains(), 3);
        assert_eq!(after.domain_of(5461), before.domain_of(5461), "b kept 0");
        assert_eq!(after.domain_of(10923), before.domain_of(10923), "c kept 2");
        assert_eq!(after.domain_of(16000), before.domain_of(5461), "moved to b");
        assert_eq!(after.domain_of(15999), Some(2));
        // The new primary gets a new id, not the dead one's.
        assert_eq!(after.domain_of(0), Some(3));
        // The dead primary coming back as a primary gets its old id again.
        let back = Value::Array(vec![range(0, 16383, vec![node("10.0.0.1", 6379, "a")])]);
        let back = Topology::parse_with(&back, &mut interner).unwrap();
        assert_eq!(back.domain_of(0), before.domain_of(0));
    }

    #[test]
    fn unassigned_and_unknown_slots() {
        let reply = Value::Array(vec![
            range(0, 99, vec![node("10.0.0.1", 6379, "a")]),
            // An unknown node: its range stays unassigned.
            range(200, 299, vec![node("?", 6379, "x")]),
            // A null host: the node id names the primary.
            range(
                300,
                399,
                vec![Value::Array(vec![
                    Value::Nil,
                    Value::Int(7000),
                    Value::BulkString(b"n1".to_vec()),
                ])],
            ),
        ]);
        let t = Topology::parse(&reply).unwrap();
        assert_eq!(t.domains(), 2);
        assert_eq!(t.domain_of(99), Some(0));
        assert_eq!(t.domain_of(100), None, "served by nobody");
        assert_eq!(t.domain_of(250), None, "unknown node");
        assert_eq!(t.domain_of(300), Some(1));
        assert_eq!(t.domain_of(16383), None);
        let empty = Topology::parse(&Value::Array(vec![])).unwrap();
        assert_eq!((empty.domains(), empty.domain_of(0)), (0, None));
    }

    #[test]
    fn same_host_other_port_is_another_primary() {
        let reply = Value::Array(vec![
            range(0, 8191, vec![node("127.0.0.1", 7000, "a")]),
            range(8192, 16383, vec![node("127.0.0.1", 7001, "b")]),
        ]);
        let t = Topology::parse(&reply).unwrap();
        assert_eq!((t.domain_of(0), t.domain_of(8192)), (Some(0), Some(1)));
    }

    #[test]
    fn malformed_replies_are_errors_and_intern_nothing() {
        let bad = [
            Value::Okay,
            Value::Array(vec![Value::Int(1)]),
            Value::Array(vec![Value::Array(vec![Value::Int(0), Value::Int(1)])]),
            Value::Array(vec![range(0, 16384, vec![node("h", 1, "a")])]),
            Value::Array(vec![range(-1, 5, vec![node("h", 1, "a")])]),
            Value::Array(vec![range(9, 5, vec![node("h", 1, "a")])]),
            Value::Array(vec![range(0, 5, vec![Value::Int(3)])]),
            Value::Array(vec![range(
                0,
                5,
                vec![Value::Array(vec![
                    Value::BulkString(b"h".to_vec()),
                    Value::BulkString(b"1".to_vec()),
                ])],
            )]),
            Value::Array(vec![range(
                0,
                5,
                vec![Value::Array(vec![Value::Nil, Value::Int(1)])],
            )]),
            Value::Array(vec![
                range(0, 10, vec![node("new", 1, "a")]),
                range(10, 20, vec![node("h", 2, "b")]),
            ]),
        ];
        let mut interner = Interner::default();
        for reply in &bad {
            assert!(
                Topology::parse_with(reply, &mut interner).is_err(),
                "{reply:?}"
            );
        }
        assert!(interner.ids.is_empty());
    }

    #[test]
    fn ids_stay_bounded_under_churn() {
        let mut interner = Interner::default();
        for i in 0..(MAX_DOMAINS + 10) {
            let host = format!("10.1.{}.{}", i / 256, i % 256);
            let reply = Value::Array(vec![range(0, 0, vec![node(&host, 6379, "x")])]);
            let t = Topology::parse_with(&reply, &mut interner).unwrap();
            let id = t.domain_of(0).unwrap();
            assert!(usize::from(id) < MAX_DOMAINS);
        }
        assert!(interner.ids.len() <= MAX_DOMAINS);
    }

    #[tokio::test(start_paused = true)]
    async fn refreshes_at_most_once_per_interval() {
        let cache = TopologyCache::new();
        assert_eq!(cache.domain_of(0), None, "unknown before the first load");
        assert!(cache.needs_refresh(), "never loaded");
        let now = Instant::now();
        assert!(cache.claim(now));
        assert!(!cache.claim(now), "one caller wins");
        cache.install(&three_primaries()).unwrap();
        assert_eq!(cache.domain_of(0), Some(1));
        assert!(!cache.needs_refresh(), "loaded and fresh");
        // A storm of MOVED replies.
        for _ in 0..100 {
            cache.mark_stale();
        }
        assert!(!cache.needs_refresh(), "within the interval");
        tokio::time::advance(MIN_REFRESH_INTERVAL - Duration::from_millis(1)).await;
        assert!(!cache.needs_refresh());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(cache.needs_refresh());
        assert!(cache.claim(Instant::now()));
        assert!(!cache.claim(Instant::now()));
        assert!(!cache.needs_refresh(), "claimed: the stale flag is cleared");
        // Fresh, it still refreshes once it is MAX_AGE old, never sooner.
        tokio::time::advance(MAX_AGE - Duration::from_millis(1)).await;
        assert!(!cache.needs_refresh(), "not stale and younger than MAX_AGE");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(cache.needs_refresh(), "MAX_AGE old");
        assert!(cache.claim(Instant::now()));
        assert!(!cache.needs_refresh());
        // A bad reply keeps the old map.
        assert!(cache.install(&Value::Okay).is_err());
        assert_eq!(cache.domain_of(0), Some(1));
        assert_eq!(cache.current().unwrap().domains(), 3);
    }
}
