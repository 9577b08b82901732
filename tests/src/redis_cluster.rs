//! A throwaway 3-primary Redis Cluster on loopback, killed on drop.

use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use crate::redis_server::{require, RedisServer};

const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Three primaries owning all 16384 slots ([`start`](RedisCluster::start)),
/// or three primaries with one replica each
/// ([`start_with_replicas`](RedisCluster::start_with_replicas)).
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts three cluster-enabled servers, joins them with
    /// `redis-cli --cluster create`, and waits until every node reports
    /// `cluster_state:ok` and a routed `EVAL` succeeds on every primary.
    pub fn start() -> Self {
        Self::create(3, 0, &[])
    }

    /// Starts six cluster-enabled servers, joins them with
    /// `redis-cli --cluster create ... --cluster-replicas 1` (three
    /// primaries, one replica each), and waits until every node reports
    /// `cluster_state:ok`, a routed `EVAL` succeeds on every primary and
    /// every replica's link to its primary is up
    /// (`master_link_status:up`). Which node replicates which primary is
    /// `redis-cli`'s choice: ask `ROLE` or `CLUSTER NODES`.
    pub fn start_with_replicas() -> Self {
        Self::create(6, 1, &[])
    }

    /// Like [`start_with_replicas`](Self::start_with_replicas), with extra
    /// `redis-server` arguments for every node (kept across restarts), e.g.
    /// `["--cluster-require-full-coverage", "no"]`.
    pub fn start_with_replicas_and(extra: &[&str]) -> Self {
        Self::create(6, 1, extra)
    }

    fn create(count: usize, replicas: u8, extra: &[&str]) -> Self {
        require("redis-server");
        require("redis-cli");
        let nodes: Vec<RedisServer> = (0..count)
            .map(|_| {
                let mut args = vec![
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                ];
                args.extend_from_slice(extra);
                RedisServer::start_with(&args, true)
            })
            .collect();
        let cluster = Self { nodes };
        let output = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(cluster.nodes.iter().map(RedisServer::addr))
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        cluster.wait_ready();
        cluster
    }

    /// One cluster shared by every caller holding it (see [`RedisServer::shared`]).
    pub fn shared() -> Arc<Self> {
        static SHARED: Mutex<Weak<RedisCluster>> = Mutex::new(Weak::new());
        let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(cluster) = shared.upgrade() {
            return cluster;
        }
        let cluster = Arc::new(Self::start());
        *shared = Arc::downgrade(&cluster);
        cluster
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let ok = self.nodes.iter().all(|node| {
                let info: redis::RedisResult<String> = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query(&mut node.connection());
                info.is_ok_and(|info| info.contains("cluster_state:ok"))
            });
            if ok && self.replicas_linked() && self.routed_eval_works() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "redis cluster did not become ready within {READY_TIMEOUT:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Whether every node that is a replica has its link to its primary up.
    fn replicas_linked(&self) -> bool {
        self.nodes.iter().all(|node| {
            let info: redis::RedisResult<String> = redis::cmd("INFO")
                .arg("replication")
                .query(&mut node.connection());
            info.is_ok_and(|info| {
                !info.contains("role:slave") || info.contains("master_link_status:up")
            })
        })
    }

    /// An `EVAL` through a cluster client on a key in each primary's slots.
    fn routed_eval_works(&self) -> bool {
        let Ok(client) = redis::cluster::ClusterClient::new(self.urls()) else {
            return false;
        };
        let Ok(mut conn) = client.get_connection() else {
            return false;
        };
        // Hash tags in slots 15495, 3300 and 7365: one on each primary.
        ["{a}", "{b}", "{c}"].iter().all(|key| {
            redis::cmd("EVAL")
                .arg("return redis.call('SET', KEYS[1], 'x', 'PX', 1000)")
                .arg(1)
                .arg(*key)
                .query::<String>(&mut conn)
                .is_ok()
        })
    }

    /// The nodes' URLs.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The nodes.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The nodes, to stop and restart them.
    pub fn nodes_mut(&mut self) -> &mut [RedisServer] {
        &mut self.nodes
    }

    /// Waits (bounded) until every node says `cluster_state:ok` again, a
    /// routed `EVAL` works on every primary and every replica is linked,
    /// e.g. after restarting a node (a stopped node must be restarted first).
    pub fn wait_until_ok(&self) {
        self.wait_ready();
    }

    /// `(primary, replica)` node indices, from each replica's
    /// `INFO replication`, sorted; panics unless every primary has exactly
    /// one replica (a cluster from [`start_with_replicas`](Self::start_with_replicas)).
    pub fn pairs(&self) -> Vec<(usize, usize)> {
        let nodes = &self.nodes;
        let mut pairs = Vec::new();
        for (replica, node) in nodes.iter().enumerate() {
            let info: String = query(node, &["INFO", "replication"]).expect("INFO replication");
            if !info.contains("role:slave") {
                continue;
            }
            let port: u16 = info
                .lines()
                .find_map(|l| l.strip_prefix("master_port:"))
                .and_then(|port| port.trim().parse().ok())
                .expect("a replica names its primary's port");
            let primary = nodes
                .iter()
                .position(|n| n.port() == port)
                .expect("the primary is one of the cluster's nodes");
            pairs.push((primary, replica));
        }
        pairs.sort_unstable();
        assert_eq!(pairs.len(), 3, "one replica per primary: {pairs:?}");
        pairs
    }

    /// `(start, end, port of the primary)` of every slot range, as node
    /// `ask` sees it (`CLUSTER SLOTS`; empty when it does not answer).
    pub fn slot_ranges(&self, ask: usize) -> Vec<(u16, u16, u16)> {
        let reply: Vec<Vec<redis::Value>> =
            query(&self.nodes[ask], &["CLUSTER", "SLOTS"]).unwrap_or_default();
        reply
            .into_iter()
            .filter_map(|range| {
                let start = redis::from_redis_value::<u16>(range.first()?.clone()).ok()?;
                let end = redis::from_redis_value::<u16>(range.get(1)?.clone()).ok()?;
                let primary: Vec<redis::Value> =
                    redis::from_redis_value(range.get(2)?.clone()).ok()?;
                let port = redis::from_redis_value::<u16>(primary.get(1)?.clone()).ok()?;
                Some((start, end, port))
            })
            .collect()
    }

    /// The index of the node serving `slot`, as node `ask` sees it.
    pub fn owner(&self, ask: usize, slot: u16) -> usize {
        let ranges = self.slot_ranges(ask);
        let port = ranges
            .iter()
            .find(|(start, end, _)| (*start..=*end).contains(&slot))
            .map(|(_, _, port)| *port)
            .unwrap_or_else(|| panic!("slot {slot} unserved: {ranges:?}"));
        self.nodes
            .iter()
            .position(|n| n.port() == port)
            .expect("the owner is one of the cluster's nodes")
    }

    /// Whether every node in `live` reports `cluster_state:ok` with every
    /// slot served, and every slot's primary (as each of them sees it) is
    /// in `live`: the cluster is whole again after a fault.
    pub fn whole(&self, live: &[usize]) -> bool {
        live.iter().all(|&i| {
            let Ok(info) = query::<String>(&self.nodes[i], &["CLUSTER", "INFO"]) else {
                return false;
            };
            if !(info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384")) {
                return false;
            }
            let ranges = self.slot_ranges(i);
            let served: u32 = ranges.iter().map(|(s, e, _)| u32::from(e - s) + 1).sum();
            served == 16_384
                && ranges
                    .iter()
                    .all(|(_, _, port)| live.iter().any(|&j| self.nodes[j].port() == *port))
        })
    }

    /// Waits (at most [`WHOLE_TIMEOUT`]) until [`whole`](Self::whole)
    /// holds for `live` and `also` is true; panics naming `what` otherwise.
    pub fn wait_until_whole(&self, what: &str, live: &[usize], mut also: impl FnMut() -> bool) {
        let deadline = Instant::now() + WHOLE_TIMEOUT;
        while !(self.whole(live) && also()) {
            assert!(
                Instant::now() < deadline,
                "{what}: not within {WHOLE_TIMEOUT:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The longest [`RedisCluster::wait_until_whole`] waits.
pub const WHOLE_TIMEOUT: Duration = Duration::from_secs(40);

/// `args` sent to `node` on a fresh connection, bounded by 2 s to connect
/// and 5 s to answer (a node being killed or promoted may not answer).
pub fn query<T: redis::FromRedisValue>(node: &RedisServer, args: &[&str]) -> redis::RedisResult<T> {
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    let client = redis::Client::open(node.url())?;
    let mut conn = client.get_connection_with_timeout(Duration::from_secs(2))?;
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    cmd.query(&mut conn)
}

impl std::fmt::Debug for RedisCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisCluster")
            .field("nodes", &self.nodes)
            .finish()
    }
}

/// The cluster hash slot of `key`, as Redis computes it (CRC16/XMODEM of the
/// hash tag, or of the whole key without one, mod 16384).
pub fn key_slot(key: &[u8]) -> u16 {
    let mut hashed = key;
    if let Some(open) = key.iter().position(|&b| b == b'{') {
        if let Some(len) = key[open + 1..].iter().position(|&b| b == b'}') {
            if len > 0 {
                hashed = &key[open + 1..open + 1 + len];
            }
        }
    }
    crc16::State::<crc16::XMODEM>::calculate(hashed) % 16384
}

/// Which of the three primaries created by [`RedisCluster::start`] owns
/// `slot` (`redis-cli --cluster create` splits the slots evenly in order).
pub fn primary_of(slot: u16) -> usize {
    match slot {
        0..=5460 => 0,
        5461..=10922 => 1,
        _ => 2,
    }
}
