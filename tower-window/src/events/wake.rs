//! [`EventWakeups`] on Redis, by sharded pub/sub.
//!
//! Every append `SPUBLISH`es in its own script on the window's channel
//! (the stream's key ending in `w`: same slot), so no append goes without
//! its wake-up. Subscriptions live on RESP3 connections of their own, one
//! per primary, placed by the slot map rather than by redis-rs's cluster
//! client, which resubscribes without telling. Every confirmed
//! subscription is reported ([`WakeReason::Subscribed`]) so the reader
//! reads again; one lost (connection dropped, `SUNSUBSCRIBE` pushed, slot
//! moved as seen by the check every [`CHECK_EVERY`]) is subscribed again
//! where its slot is served now, with a backoff.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{
    AsyncConnectionConfig, ConnectionAddr, ConnectionInfo, ProtocolVersion, PushInfo, PushKind,
    Value,
};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::redis::{event_keys, event_slot, text};
use crate::store::redis::connection::{is_topology_change, map_error, Conn};
use crate::store::redis::topology::primary_ranges;
use crate::store::redis::RedisStore;
use crate::store::{StoreError, StoreErrorKind};
use crate::sync::lock;

/// How often the subscriber pings its connections and, on a cluster,
/// checks the slot map.
pub const CHECK_EVERY: Duration = Duration::from_secs(2);
/// The first backoff after a failure (doubling up to [`MAX_RETRY`]).
const FIRST_RETRY: Duration = Duration::from_millis(50);
const MAX_RETRY: Duration = Duration::from_secs(1);
/// How long one subscription command or check may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);

use super::wakeups::{EventWakeups, Source, WakeReason, Wakeup};

enum Command {
    Follow(Vec<u8>),
    Unfollow(Vec<u8>),
}

/// The Redis side of an [`EventWakeups`].
struct Subscription {
    commands: mpsc::UnboundedSender<Command>,
    /// The subscriber task, until it is started.
    idle: Mutex<Option<(Subscriber, mpsc::UnboundedReceiver<Command>)>>,
}

impl RedisStore {
    /// Live wake-ups of this store's event windows (Redis 7). A store not
    /// built from a URL or plain TCP cluster seeds is
    /// [`StoreErrorKind::InvalidRequest`].
    pub fn event_wakeups(self: &Arc<Self>) -> Result<EventWakeups, StoreError> {
        let seed = self.connection.node_info().ok_or_else(|| {
            StoreError::invalid(
                "event wake-ups need a store built from a redis url or cluster seeds",
            )
        })?;
        let cluster = self.connection.is_cluster();
        if cluster && !matches!(seed.addr(), ConnectionAddr::Tcp(..)) {
            // Another primary's address is made from the seed's: plain TCP.
            return Err(StoreError::invalid(
                "event wake-ups on a cluster need plain TCP seeds",
            ));
        }
        let resp3 = seed.redis_settings().clone();
        let seed = seed.set_redis_settings(resp3.set_protocol(ProtocolVersion::RESP3));
        let (commands, command_rx) = mpsc::unbounded_channel();
        let (out, wakeups) = mpsc::unbounded_channel();
        let (pushes_tx, pushes) = mpsc::unbounded_channel();
        let subscriber = Subscriber {
            store: Arc::clone(self),
            cluster,
            seed,
            followed: Arc::default(),
            pending: HashSet::new(),
            nodes: HashMap::new(),
            ranges: Vec::new(),
            stale: true,
            next_generation: 0,
            pushes_tx,
            pushes,
            out,
            failures: 0,
            retry_at: None,
        };
        let subscription = Subscription {
            commands,
            idle: Mutex::new(Some((subscriber, command_rx))),
        };
        Ok(EventWakeups::new(subscription, wakeups))
    }
}

impl Source for Subscription {
    fn follow(&self, key: Vec<u8>) {
        self.start();
        let _ = self.commands.send(Command::Follow(key));
    }

    fn unfollow(&self, key: &[u8]) {
        let _ = self.commands.send(Command::Unfollow(key.to_vec()));
    }

    /// Outside a runtime, waits for a call inside one (follows are kept).
    fn start(&self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let idle = lock(&self.idle).take();
        if let Some((subscriber, commands)) = idle {
            runtime.spawn(subscriber.run(commands));
        }
    }
}

/// One primary's subscription connection.
struct Node {
    conn: MultiplexedConnection,
    /// Tells its pushes from an older connection's to the same address.
    generation: u64,
    channels: HashSet<Vec<u8>>,
}

/// The task behind [`EventWakeups`].
struct Subscriber {
    store: Arc<RedisStore>,
    cluster: bool,
    /// How to reach a node (its address replaced per primary), in RESP3.
    seed: ConnectionInfo,
    /// Channel -> window key of every window followed; shared with the
    /// push senders, so a wake-up never waits behind this task's work.
    followed: Arc<Mutex<HashMap<Vec<u8>, Vec<u8>>>>,
    /// Followed channels not subscribed anywhere (new, or lost).
    pending: HashSet<Vec<u8>>,
    /// By primary address (`host:port`; `""` on a single Redis).
    nodes: HashMap<String, Node>,
    ranges: Vec<(u16, u16, String)>,
    /// `ranges` must be loaded again before use.
    stale: bool,
    next_generation: u64,
    pushes_tx: mpsc::UnboundedSender<(String, u64, PushInfo)>,
    pushes: mpsc::UnboundedReceiver<(String, u64, PushInfo)>,
    out: mpsc::UnboundedSender<Wakeup>,
    /// Failed subscription rounds in a row.
    failures: u32,
    /// When to subscribe the pending channels; `None`: nothing pending.
    retry_at: Option<Instant>,
}

fn channel_of(prefix: &str, key: &[u8]) -> Vec<u8> {
    let mut channel = event_keys(prefix, key).0;
    if let Some(last) = channel.last_mut() {
        *last = b'w';
    }
    channel
}

/// The channel a push is about.
fn channel(push: &PushInfo) -> Option<&[u8]> {
    text(push.data.first()?).ok()
}

/// In the background: a push for a channel no longer followed is ignored.
fn unsubscribe(mut conn: MultiplexedConnection, channel: Vec<u8>) {
    let unsubscribe = redis::cmd("SUNSUBSCRIBE").arg(channel).clone();
    tokio::spawn(async move { unsubscribe.query_async::<Value>(&mut conn).await });
}

impl Subscriber {
    async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) {
        let mut check = tokio::time::interval_at(Instant::now() + CHECK_EVERY, CHECK_EVERY);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let retry_at = self.retry_at;
            tokio::select! {
                command = commands.recv() => {
                    let Some(command) = command else { return };
                    self.command(command);
                    // A burst of joins becomes one subscription round.
                    while let Ok(command) = commands.try_recv() {
                        self.command(command);
                    }
                }
                Some((addr, generation, push)) = self.pushes.recv() => {
                    self.push(&addr, generation, push);
                }
                _ = check.tick() => self.check().await,
                () = tokio::time::sleep_until(retry_at.unwrap_or_else(Instant::now)),
                    if retry_at.is_some() => self.subscribe_pending().await,
            }
            if self.out.is_closed() {
                return;
            }
        }
    }

    fn command(&mut self, command: Command) {
        match command {
            Command::Follow(key) => {
                let channel = channel_of(&self.store.prefix, &key);
                lock(&self.followed).insert(channel.clone(), key);
                // Subscribed again even if it is, for `Subscribed`.
                for node in self.nodes.values_mut() {
                    node.channels.remove(&channel);
                }
                self.pending.insert(channel);
                self.schedule();
            }
            Command::Unfollow(key) => {
                let channel = channel_of(&self.store.prefix, &key);
                lock(&self.followed).remove(&channel);
                self.pending.remove(&channel);
                for node in self.nodes.values_mut() {
                    if node.channels.remove(&channel) {
                        unsubscribe(node.conn.clone(), channel.clone());
                    }
                }
            }
        }
    }

    /// Subscribes the pending channels now, or after a backoff.
    fn schedule(&mut self) {
        if self.pending.is_empty() {
            self.retry_at = None;
            return;
        }
        let backoff = FIRST_RETRY.saturating_mul(1 << self.failures.min(5));
        let wait = (self.failures > 0).then_some(backoff.min(MAX_RETRY));
        let at = Instant::now() + wait.unwrap_or_default();
        self.retry_at = Some(self.retry_at.map_or(at, |current| current.min(at)));
    }

    fn push(&mut self, addr: &str, generation: u64, push: PushInfo) {
        let node = self.nodes.get_mut(addr);
        let Some(node) = node.filter(|node| node.generation == generation) else {
            return;
        };
        if push.kind == PushKind::Disconnection {
            return self.lose(addr);
        }
        let Some(channel) = channel(&push) else {
            return;
        };
        let key = lock(&self.followed).get(channel).cloned();
        match push.kind {
            // An `SMessage` never comes here: the push sender delivers it.
            PushKind::SSubscribe => {
                let Some(key) = key else { return };
                let _ = self.out.send(Wakeup::new(key, WakeReason::Subscribed));
                self.pending.remove(channel);
                node.channels.insert(channel.to_vec());
            }
            // Dropped by the server (its slot left the node), or the answer
            // to our own unsubscribe (then no longer followed).
            PushKind::SUnsubscribe if node.channels.remove(channel) && key.is_some() => {
                tracing::debug!(addr, "a wake-up subscription was dropped by redis");
                self.pending.insert(channel.to_vec());
                self.stale = true;
                self.schedule();
            }
            _ => {}
        }
    }

    /// The connection to `addr` is gone: its channels are pending again.
    fn lose(&mut self, addr: &str) {
        if let Some(node) = self.nodes.remove(addr) {
            tracing::debug!(
                addr,
                channels = node.channels.len(),
                "a wake-up connection was lost; resubscribing"
            );
            let followed = lock(&self.followed);
            let channels = node.channels.into_iter();
            self.pending
                .extend(channels.filter(|c| followed.contains_key(c)));
        }
        self.stale = true;
        self.schedule();
    }

    /// The primary serving `channel` (`""` on a single Redis).
    fn target(&self, channel: &[u8]) -> Option<String> {
        if !self.cluster {
            return Some(String::new());
        }
        let slot = event_slot(lock(&self.followed).get(channel)?);
        self.ranges
            .iter()
            .find(|(start, end, _)| (*start..=*end).contains(&slot))
            .map(|(_, _, primary)| primary.clone())
    }

    /// Loads the slot map (cluster only).
    async fn load_ranges(&mut self) -> Result<(), StoreError> {
        if !self.cluster {
            self.stale = false;
            return Ok(());
        }
        let (conn, _) = self.store.connection.get().await?;
        let Conn::Cluster(mut conn) = conn else {
            return Err(StoreError::protocol(
                "a cluster store without a cluster connection",
            ));
        };
        let slots = redis::cmd("CLUSTER").arg("SLOTS").clone();
        let reply: Value = tokio::time::timeout(COMMAND_TIMEOUT, slots.query_async(&mut conn))
            .await
            .map_err(|_| StoreError::new(StoreErrorKind::Timeout, "CLUSTER SLOTS timed out"))?
            .map_err(map_error)?;
        self.ranges = primary_ranges(&reply).map_err(StoreError::protocol)?;
        self.stale = false;
        Ok(())
    }

    async fn node(&mut self, addr: &str) -> Result<MultiplexedConnection, StoreError> {
        if let Some(node) = self.nodes.get(addr) {
            return Ok(node.conn.clone());
        }
        let info = if addr.is_empty() {
            self.seed.clone()
        } else {
            let (host, port) = addr
                .rsplit_once(':')
                .and_then(|(host, port)| Some((host, port.parse::<u16>().ok()?)))
                .ok_or_else(|| {
                    StoreError::protocol(format!("a cluster node without a host and port: {addr}"))
                })?;
            let tcp = ConnectionAddr::Tcp(host.to_owned(), port);
            self.seed.clone().set_addr(tcp)
        };
        self.next_generation += 1;
        let generation = self.next_generation;
        let pushes = self.pushes_tx.clone();
        let (followed, out) = (Arc::clone(&self.followed), self.out.clone());
        let tag = addr.to_owned();
        let sender = move |push: PushInfo| {
            if push.kind == PushKind::SMessage {
                if let Some(key) = channel(&push).and_then(|c| lock(&followed).get(c).cloned()) {
                    let _ = out.send(Wakeup::new(key, WakeReason::Appended));
                }
                return Ok(());
            }
            pushes.send((tag.clone(), generation, push)).map_err(|_| ())
        };
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.store.connection.connect_timeout()))
            .set_response_timeout(Some(COMMAND_TIMEOUT))
            .set_push_sender(sender);
        let client = redis::Client::open(info).map_err(map_error)?;
        let conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(map_error)?;
        let node = Node {
            conn: conn.clone(),
            generation,
            channels: HashSet::new(),
        };
        self.nodes.insert(addr.to_owned(), node);
        Ok(conn)
    }

    /// Subscribes every pending channel on its primary; what fails stays
    /// pending.
    async fn subscribe_pending(&mut self) {
        self.retry_at = None;
        let mut failed = false;
        if self.stale {
            if let Err(error) = self.load_ranges().await {
                tracing::debug!(%error, "loading the slot map for wake-ups failed");
                self.failures = self.failures.saturating_add(1);
                self.schedule();
                return;
            }
        }
        let mut by_node: HashMap<String, Vec<Vec<u8>>> = HashMap::new();
        for channel in &self.pending {
            match self.target(channel) {
                Some(addr) => by_node.entry(addr).or_default().push(channel.clone()),
                None => failed = true,
            }
        }
        for (addr, channels) in by_node {
            let conn = match self.node(&addr).await {
                Ok(conn) => conn,
                Err(error) => {
                    tracing::debug!(%error, addr, "connecting for wake-ups failed");
                    failed = true;
                    continue;
                }
            };
            // One channel per command: redis-rs matches each
            // confirmation to one request.
            let results = futures_util::future::join_all(channels.iter().map(|channel| {
                let mut conn = conn.clone();
                async move {
                    redis::cmd("SSUBSCRIBE")
                        .arg(channel.as_slice())
                        .query_async::<Value>(&mut conn)
                        .await
                }
            }))
            .await;
            for (channel, result) in channels.into_iter().zip(results) {
                match result {
                    Ok(Value::Push {
                        kind: PushKind::SSubscribe,
                        data,
                    }) if data.first().and_then(|v| text(v).ok()) == Some(channel.as_slice()) => {
                        self.pending.remove(&channel);
                        if let Some(node) = self.nodes.get_mut(&addr) {
                            node.channels.insert(channel);
                        }
                    }
                    Ok(_) => failed = true,
                    Err(error) => {
                        failed = true;
                        self.stale |= is_topology_change(&error);
                        if error.is_connection_dropped() || error.is_io_error() {
                            self.lose(&addr);
                        }
                    }
                }
            }
        }
        if failed || !self.pending.is_empty() {
            self.failures = self.failures.saturating_add(1);
            self.stale = self.stale || self.cluster;
        } else {
            self.failures = 0;
        }
        self.schedule();
    }

    /// A connection that no longer answers is lost; channels whose slot
    /// moved are subscribed on its new primary.
    async fn check(&mut self) {
        let addrs: Vec<(String, MultiplexedConnection)> = self
            .nodes
            .iter()
            .map(|(addr, node)| (addr.clone(), node.conn.clone()))
            .collect();
        for (addr, mut conn) in addrs {
            let ping = redis::cmd("PING").query_async::<Value>(&mut conn).await;
            if ping.is_err() {
                self.lose(&addr);
            }
        }
        if !self.cluster || lock(&self.followed).is_empty() {
            return;
        }
        if let Err(error) = self.load_ranges().await {
            tracing::debug!(%error, "checking the slot map for wake-ups failed");
            self.stale = true;
            return;
        }
        let mut nodes = std::mem::take(&mut self.nodes);
        let mut moved = Vec::new();
        for (addr, node) in &mut nodes {
            node.channels.retain(|channel| {
                let stays = self.target(channel).as_deref() == Some(addr.as_str());
                if !stays {
                    unsubscribe(node.conn.clone(), channel.clone());
                    moved.push(channel.clone());
                }
                stays
            });
        }
        // Connections to primaries that serve none of our channels go.
        nodes.retain(|_, node| !node.channels.is_empty());
        self.nodes = nodes;
        self.pending.extend(moved);
        self.schedule();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_channel_shares_the_stream_key_hash_tag() {
        let (stream, _) = event_keys("tw:", b"room:{1}");
        let channel = channel_of("tw:", b"room:{1}");
        assert_eq!(channel, b"tw:ev:{room%3A%7B1%7D}:w".to_vec());
        assert_eq!(stream[..stream.len() - 1], channel[..channel.len() - 1]);
    }
}
