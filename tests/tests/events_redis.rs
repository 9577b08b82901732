//! The event-window conformance suite on `RedisStore` (a real
//! `redis-server` and a real 3-primary Redis Cluster), and what only Redis
//! can show: keys that vanish start a new epoch, every key has a TTL, both
//! keys of a window share one slot, and history lost while the epoch stayed
//! (a restore, a rollback) is never `recovered` and changes nothing for
//! other readers (issue 22, defects 3 and 4).

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::aio::ConnectionLike;
use redis::AsyncCommands;
use tower_window::events::{EventId, EventWindow, Position, Resume, ResyncReason, Retention};
use tower_window::{ManualClock, RedisStore, Store};
use tower_window_tests::conformance::START;
use tower_window_tests::event_conformance::EventStoreFactory;
use tower_window_tests::redis_cluster::{key_slot, RedisCluster};
use tower_window_tests::redis_server::RedisServer;

struct SingleRedis(Arc<RedisServer>);

impl EventStoreFactory for SingleRedis {
    type Store = RedisStore;

    fn make(&self, clock: ManualClock) -> impl Future<Output = RedisStore> + Send {
        let store = RedisStore::builder()
            .url(self.0.url())
            .prefix("evconf:")
            .clock(clock)
            .build()
            .expect("valid url");
        std::future::ready(store)
    }
}

struct ClusterRedis(Arc<RedisCluster>);

impl EventStoreFactory for ClusterRedis {
    type Store = RedisStore;

    fn make(&self, clock: ManualClock) -> impl Future<Output = RedisStore> + Send {
        let store = RedisStore::builder()
            .cluster(self.0.urls())
            .prefix("evconf:")
            .clock(clock)
            .build()
            .expect("valid urls");
        std::future::ready(store)
    }
}

mod single {
    tower_window_tests::event_conformance_tests!(super::SingleRedis(
        tower_window_tests::redis_server::RedisServer::shared()
    ));
}

mod cluster {
    tower_window_tests::event_conformance_tests!(super::ClusterRedis(
        tower_window_tests::redis_cluster::RedisCluster::shared()
    ));
}

fn window(store: Arc<RedisStore>) -> EventWindow {
    let retention = Retention::new(Duration::from_secs(600), 10_000).expect("a retention");
    EventWindow::new(Store::bare(store), retention)
}

/// Deleting the stream (as a failover that lost the data or a flush
/// would): the next resume is `epoch_changed`, never `recovered`, even
/// once the window has events again; the meta key alone going is the same.
#[tokio::test]
async fn a_vanished_stream_changes_the_epoch() {
    let server = RedisServer::shared();
    let store = Arc::new(
        RedisStore::builder()
            .url(server.url())
            .prefix("evdel:")
            .build()
            .expect("url"),
    );
    let events = window(store);
    let mut conn = server.async_connection().await;
    for (what, victim) in [
        ("stream", "evdel:ev:{room}:s"),
        ("meta", "evdel:ev:{room}:m"),
    ] {
        let joined = events.position("room").await.expect("position");
        events
            .append("room", &[("data", b"1")])
            .await
            .expect("append");
        let got = events.resume("room", &joined, 10).await.expect("resume");
        assert!(
            matches!(got, Resume::Recovered(ref e) if e.len() == 1),
            "{got:?}"
        );

        let _: i64 = conn.del(victim).await.expect("DEL");
        let after_loss = events.resume("room", &joined, 10).await.expect("resume");
        assert_eq!(
            after_loss,
            Resume::Resync(ResyncReason::EpochChanged),
            "{what}"
        );
        // New events in the new epoch do not make the old position good.
        let appended = events
            .append("room", &[("data", b"2")])
            .await
            .expect("append");
        assert_ne!(appended.epoch, joined.epoch, "{what}");
        let again = events.resume("room", &joined, 10).await.expect("resume");
        assert_eq!(again, Resume::Resync(ResyncReason::EpochChanged), "{what}");
    }
}

/// Both keys of a window get the TTL of the window plus the grace, on
/// every append and join, and live in one slot.
#[tokio::test]
async fn both_keys_carry_a_ttl_and_share_a_slot() {
    let server = RedisServer::shared();
    let store = Arc::new(
        RedisStore::builder()
            .url(server.url())
            .prefix("evttl:")
            .build()
            .expect("url"),
    );
    let events = window(store);
    let mut conn = server.async_connection().await;
    events.position("r:{x}").await.expect("position");
    let keys = ["evttl:ev:{r%3A%7Bx%7D}:s", "evttl:ev:{r%3A%7Bx%7D}:m"];
    let expected = 600_000 + 60_000;
    for key in keys {
        let ttl: i64 = conn.pttl(key).await.expect("PTTL");
        assert!((expected - 5_000..=expected).contains(&ttl), "{key}: {ttl}");
    }
    let _: () = redis::cmd("PEXPIRE")
        .arg(keys[0])
        .arg(100_000)
        .query_async(&mut conn)
        .await
        .expect("PEXPIRE");
    events
        .append("r:{x}", &[("data", b"1")])
        .await
        .expect("append");
    for key in keys {
        let ttl: i64 = conn.pttl(key).await.expect("PTTL");
        assert!(ttl > 100_000, "{key}: the append refreshed the ttl ({ttl})");
    }
    assert_eq!(key_slot(keys[0].as_bytes()), key_slot(keys[1].as_bytes()));
}

/// How a test takes history away from a window while its epoch stays: a
/// real restore (`DUMP` both keys after the first event, `RESTORE` them
/// over the window later, as restoring a backup or rolling a replica back
/// would), or the stream's newest entries deleted and the meta rolled
/// back to match.
#[derive(Debug, Clone, Copy)]
enum Loss {
    Restore,
    Rollback,
}

/// What a loss leaves: the window holds `a` (and its epoch, on the same
/// primary) but not `b` and `c`, which a reader received.
struct Lost {
    events: EventWindow,
    clock: ManualClock,
    key: String,
    head: Position,
    a: EventId,
    b: EventId,
    c: EventId,
}

fn unique_key(name: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{name}-{}-{nanos}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Appends `a`, `b`, `c` to a fresh window (10 ms apart on `clock`) and
/// takes `b` and `c` away by `loss`, keeping the epoch; `conn` reaches the
/// window's keys (a plain or a cluster connection).
async fn lose_history<C: ConnectionLike + Send>(
    store: Arc<RedisStore>,
    clock: ManualClock,
    conn: &mut C,
    loss: Loss,
) -> Lost {
    let key = unique_key("loss");
    let events = window(store);
    let stream = format!("evloss:ev:{{{key}}}:s");
    let meta = format!("evloss:ev:{{{key}}}:m");
    let head = events.position(&key).await.expect("position");
    let a = events
        .append(&key, &[("data", b"a")])
        .await
        .expect("append");
    let dump = |k: &str| redis::cmd("DUMP").arg(k).to_owned();
    let snapshot: (Vec<u8>, Vec<u8>) = (
        dump(&stream).query_async(conn).await.expect("DUMP"),
        dump(&meta).query_async(conn).await.expect("DUMP"),
    );
    clock.advance(Duration::from_millis(10));
    let b = events
        .append(&key, &[("data", b"b")])
        .await
        .expect("append");
    clock.advance(Duration::from_millis(10));
    let c = events
        .append(&key, &[("data", b"c")])
        .await
        .expect("append");
    assert_eq!(
        (b.epoch.clone(), c.epoch.clone()),
        (a.epoch.clone(), a.epoch.clone())
    );
    match loss {
        Loss::Restore => {
            for (k, payload) in [(&stream, snapshot.0), (&meta, snapshot.1)] {
                let _: () = redis::cmd("RESTORE")
                    .arg(k)
                    .arg(600_000)
                    .arg(payload)
                    .arg("REPLACE")
                    .query_async(conn)
                    .await
                    .expect("RESTORE");
            }
        }
        Loss::Rollback => {
            let deleted: i64 = redis::cmd("XDEL")
                .arg(&stream)
                .arg(b.id.to_string())
                .arg(c.id.to_string())
                .query_async(conn)
                .await
                .expect("XDEL");
            assert_eq!(deleted, 2);
            let _: () = redis::cmd("HSET")
                .arg(&meta)
                .arg("l")
                .arg(a.id.to_string())
                .arg("n")
                .arg(1)
                .query_async(conn)
                .await
                .expect("HSET");
        }
    }
    let now = events.position(&key).await.expect("position");
    assert_eq!(
        (now.epoch.clone(), now.last_id),
        (head.epoch.clone(), Some(a.id)),
        "{loss:?} kept the epoch and took b and c away"
    );
    clock.advance(Duration::from_millis(10));
    Lost {
        events,
        clock,
        key,
        head,
        a: a.id,
        b: b.id,
        c: c.id,
    }
}

fn at(position: &Position, id: EventId) -> Position {
    Position::new(position.epoch.clone(), Some(id))
}

fn data(resume: Resume) -> Vec<String> {
    match resume {
        Resume::Recovered(events) => events
            .iter()
            .map(|e| String::from_utf8_lossy(e.field("data").expect("data")).into_owned())
            .collect(),
        Resume::Resync(reason) => panic!("expected recovered, got resync {reason}"),
    }
}

/// Issue 22, defect 4: after a loss that kept the epoch, the window goes
/// on (`d` follows `a`). A reader that had received `c` (or `b`) lost
/// what came after it and must resync, never `recovered` with `d`; a
/// reader at `a` misses nothing and recovers `d`.
async fn lost_events_are_never_recovered<C: ConnectionLike + Send>(
    store: Arc<RedisStore>,
    clock: ManualClock,
    conn: &mut C,
) {
    for loss in [Loss::Restore, Loss::Rollback] {
        let lost = lose_history(Arc::clone(&store), clock.clone(), conn, loss).await;
        let (events, key) = (&lost.events, &lost.key);
        let d = events.append(key, &[("data", b"d")]).await.expect("append");
        assert_eq!(d.epoch, lost.head.epoch, "{loss:?}: the epoch stayed");
        for reader in [lost.c, lost.b] {
            let got = events
                .resume(key, &at(&lost.head, reader), 10)
                .await
                .expect("resume");
            assert_eq!(
                got,
                Resume::Resync(ResyncReason::TooOld),
                "{loss:?}: a reader at {reader} lost events after it"
            );
        }
        let honest = events
            .resume(key, &at(&lost.head, lost.a), 10)
            .await
            .expect("resume");
        assert_eq!(data(honest), ["d"], "{loss:?}");
        assert_eq!(
            events.position(key).await.expect("position"),
            Position::new(lost.head.epoch.clone(), Some(d.id))
        );
    }
}

/// Issue 22, defect 3 with a real loss: the reader at `c` is ahead of the
/// window's head; it is told `ahead`, however often it asks, and the
/// window keeps its epoch, so the others' resumes still recover.
async fn a_reader_ahead_after_a_loss_changes_nothing<C: ConnectionLike + Send>(
    store: Arc<RedisStore>,
    clock: ManualClock,
    conn: &mut C,
) {
    for loss in [Loss::Restore, Loss::Rollback] {
        let lost = lose_history(Arc::clone(&store), clock.clone(), conn, loss).await;
        let (events, key) = (&lost.events, &lost.key);
        for _ in 0..3 {
            let got = events
                .resume(key, &at(&lost.head, lost.c), 10)
                .await
                .expect("resume");
            assert_eq!(got, Resume::Resync(ResyncReason::Ahead), "{loss:?}");
        }
        assert_eq!(
            events.position(key).await.expect("position"),
            Position::new(lost.head.epoch.clone(), Some(lost.a)),
            "{loss:?}: the window is as the loss left it"
        );
        lost.clock.advance(Duration::from_millis(10));
        events.append(key, &[("data", b"d")]).await.expect("append");
        let honest = events
            .resume(key, &at(&lost.head, lost.a), 10)
            .await
            .expect("resume");
        assert_eq!(data(honest), ["d"], "{loss:?}");
        let fresh = events.resume(key, &lost.head, 10).await.expect("resume");
        assert_eq!(data(fresh), ["a", "d"], "{loss:?}");
    }
}

/// An entry deleted from the middle of the stream (by hand: the stores
/// only ever trim from the front): a page that spans the hole is never
/// `recovered`, though its first event followed the position. The memory
/// store cannot have such a hole (its entries leave only from the front).
async fn a_hole_inside_a_page_is_never_recovered<C: ConnectionLike + Send>(
    store: Arc<RedisStore>,
    clock: ManualClock,
    conn: &mut C,
) {
    let key = unique_key("hole");
    let events = window(store);
    let head = events.position(&key).await.expect("position");
    let mut ids = Vec::new();
    for data in ["a", "b", "c", "d"] {
        clock.advance(Duration::from_millis(1));
        let appended = events.append(&key, &[("data", data.as_bytes())]).await;
        ids.push(appended.expect("append").id);
    }
    let deleted: i64 = redis::cmd("XDEL")
        .arg(format!("evloss:ev:{{{key}}}:s"))
        .arg(ids[2].to_string())
        .query_async(conn)
        .await
        .expect("XDEL");
    assert_eq!(deleted, 1);
    for from in [head.clone(), at(&head, ids[0])] {
        assert_eq!(
            events.since(&key, &from, 10).await.expect("since"),
            Resume::Resync(ResyncReason::TooOld),
            "{from:?}: c is missing between b and d"
        );
    }
    let after_hole = events.since(&key, &at(&head, ids[2]), 10).await;
    assert_eq!(
        data(after_hole.expect("since")),
        ["d"],
        "nothing after c is lost"
    );
    let before_hole = events.since(&key, &at(&head, ids[0]), 1).await;
    assert_eq!(
        data(before_hole.expect("since")),
        ["b"],
        "a page that ends before it"
    );
}

fn single_store(server: &RedisServer, clock: ManualClock) -> Arc<RedisStore> {
    Arc::new(
        RedisStore::builder()
            .url(server.url())
            .prefix("evloss:")
            .clock(clock)
            .build()
            .expect("valid url"),
    )
}

fn cluster_store(cluster: &RedisCluster, clock: ManualClock) -> Arc<RedisStore> {
    Arc::new(
        RedisStore::builder()
            .cluster(cluster.urls())
            .prefix("evloss:")
            .clock(clock)
            .build()
            .expect("valid urls"),
    )
}

async fn cluster_connection(cluster: &RedisCluster) -> redis::cluster_async::ClusterConnection {
    redis::cluster::ClusterClient::new(cluster.urls())
        .expect("cluster client")
        .get_async_connection()
        .await
        .expect("cluster connection")
}

#[tokio::test]
async fn lost_events_are_never_recovered_single() {
    let server = RedisServer::shared();
    let clock = ManualClock::new(START);
    let mut conn = server.async_connection().await;
    lost_events_are_never_recovered(single_store(&server, clock.clone()), clock, &mut conn).await;
}

#[tokio::test]
async fn lost_events_are_never_recovered_cluster() {
    let cluster = RedisCluster::shared();
    let clock = ManualClock::new(START);
    let mut conn = cluster_connection(&cluster).await;
    lost_events_are_never_recovered(cluster_store(&cluster, clock.clone()), clock, &mut conn).await;
}

#[tokio::test]
async fn a_reader_ahead_after_a_loss_changes_nothing_single() {
    let server = RedisServer::shared();
    let clock = ManualClock::new(START);
    let mut conn = server.async_connection().await;
    a_reader_ahead_after_a_loss_changes_nothing(
        single_store(&server, clock.clone()),
        clock,
        &mut conn,
    )
    .await;
}

#[tokio::test]
async fn a_reader_ahead_after_a_loss_changes_nothing_cluster() {
    let cluster = RedisCluster::shared();
    let clock = ManualClock::new(START);
    let mut conn = cluster_connection(&cluster).await;
    a_reader_ahead_after_a_loss_changes_nothing(
        cluster_store(&cluster, clock.clone()),
        clock,
        &mut conn,
    )
    .await;
}

#[tokio::test]
async fn a_hole_inside_a_page_is_never_recovered_single() {
    let server = RedisServer::shared();
    let clock = ManualClock::new(START);
    let mut conn = server.async_connection().await;
    a_hole_inside_a_page_is_never_recovered(single_store(&server, clock.clone()), clock, &mut conn)
        .await;
}

#[tokio::test]
async fn a_hole_inside_a_page_is_never_recovered_cluster() {
    let cluster = RedisCluster::shared();
    let clock = ManualClock::new(START);
    let mut conn = cluster_connection(&cluster).await;
    a_hole_inside_a_page_is_never_recovered(
        cluster_store(&cluster, clock.clone()),
        clock,
        &mut conn,
    )
    .await;
}

/// Waits (bounded) for the next wake-up.
async fn next_wakeup(wakeups: &tower_window::events::EventWakeups) -> tower_window::events::Wakeup {
    tokio::time::timeout(Duration::from_secs(10), wakeups.next())
        .await
        .expect("a wake-up within 10 s")
        .expect("the subscriber is running")
}

/// Follows `keys` and waits until each subscription holds.
async fn follow_all(wakeups: &tower_window::events::EventWakeups, keys: &[&str]) {
    for key in keys {
        wakeups.follow(key);
    }
    let mut pending: Vec<&str> = keys.to_vec();
    while !pending.is_empty() {
        let wakeup = next_wakeup(wakeups).await;
        if wakeup.reason == tower_window::events::WakeReason::Subscribed {
            pending.retain(|k| k.as_bytes() != wakeup.key.as_slice());
        }
    }
}

/// A batch publishes one wake-up, and reading from the last id on it
/// gets the whole batch in order; the keys it wrote carry the TTL.
async fn one_wakeup_delivers_a_batch(store: Arc<RedisStore>, single: bool) {
    let wakeups = store.event_wakeups().expect("wake-ups");
    let events = window(Arc::clone(&store));
    let (room, other) = ("batch:{w}", "batch:{w}:other");
    follow_all(&wakeups, &[room, other]).await;
    let from = events.position(room).await.expect("position");
    let values: Vec<String> = (0..20).map(|i| format!("v{i}")).collect();
    let fields: Vec<[(&str, &[u8]); 1]> = values.iter().map(|v| [("data", v.as_bytes())]).collect();
    let batch: Vec<&[(&str, &[u8])]> = fields.iter().map(|f| &f[..]).collect();
    let appended = events.append_many(room, &batch).await.expect("append_many");
    let wakeup = next_wakeup(&wakeups).await;
    assert_eq!(wakeup.key, room.as_bytes());
    assert_eq!(wakeup.reason, tower_window::events::WakeReason::Appended);
    let Resume::Recovered(got) = events.since(room, &from, 100).await.expect("since") else {
        panic!("the batch is recovered");
    };
    let got_values: Vec<&[u8]> = got
        .iter()
        .map(|e| &e.field("data").expect("data")[..])
        .collect();
    let want_values: Vec<&[u8]> = values.iter().map(|v| v.as_bytes()).collect();
    assert_eq!(got_values, want_values);
    assert_eq!(
        got.iter().map(|e| e.id).collect::<Vec<_>>(),
        appended.iter().map(|a| a.id).collect::<Vec<_>>()
    );
    if single {
        // One connection carries both channels, in publish order: a
        // wake-up of `other` after the batch means every wake-up the
        // batch published has arrived, and there was one.
        events
            .append(other, &[("data", b"x")])
            .await
            .expect("append");
        let mut of_room = 0;
        loop {
            let wakeup = next_wakeup(&wakeups).await;
            if wakeup.key == other.as_bytes() {
                break;
            }
            of_room += 1;
        }
        assert_eq!(of_room, 0, "the batch published more than one wake-up");
        let mut conn = RedisServer::shared().async_connection().await;
        let expected = 600_000 + 60_000;
        for key in [
            "evbatch:ev:{batch%3A%7Bw%7D}:s",
            "evbatch:ev:{batch%3A%7Bw%7D}:m",
        ] {
            let ttl: i64 = conn.pttl(key).await.expect("PTTL");
            assert!((expected - 5_000..=expected).contains(&ttl), "{key}: {ttl}");
        }
    }
}

#[tokio::test]
async fn one_wakeup_delivers_a_batch_single() {
    let server = RedisServer::shared();
    let store = RedisStore::builder()
        .url(server.url())
        .prefix("evbatch:")
        .build()
        .expect("url");
    one_wakeup_delivers_a_batch(Arc::new(store), true).await;
}

#[tokio::test]
async fn one_wakeup_delivers_a_batch_cluster() {
    let cluster = RedisCluster::shared();
    let store = RedisStore::builder()
        .cluster(cluster.urls())
        .prefix("evbatch:")
        .build()
        .expect("valid urls");
    one_wakeup_delivers_a_batch(Arc::new(store), false).await;
}

/// The script bounds a batch itself (for any caller that bypasses the
/// stores' checks): more than 64 events, or a layout that does not add
/// up, is an error reply and appends nothing.
#[tokio::test]
async fn the_script_refuses_a_batch_out_of_bounds() {
    let server = RedisServer::shared();
    let mut conn = server.async_connection().await;
    let script = redis::Script::new(include_str!("../../tower-window/src/events/events.lua"));
    let keys = ["evraw:ev:{b}:s", "evraw:ev:{b}:m"];
    let common = ["b", "", "600000", "1000", "660000", "00000000000000aa"];
    let run = |batch: Vec<String>| {
        let mut invocation = script.prepare_invoke();
        invocation.key(keys[0]).key(keys[1]);
        for arg in common.iter() {
            invocation.arg(*arg);
        }
        for arg in batch {
            invocation.arg(arg);
        }
        invocation
    };
    let event = ["2", "data", "x"].map(String::from);
    let mut too_many = vec!["65".to_owned()];
    for _ in 0..65 {
        too_many.extend(event.iter().cloned());
    }
    let bad: Vec<Vec<String>> = vec![
        too_many,
        vec!["0".to_owned()],
        vec![
            "2".to_owned(),
            "2".to_owned(),
            "data".to_owned(),
            "x".to_owned(),
        ],
        vec![
            "1".to_owned(),
            "4".to_owned(),
            "data".to_owned(),
            "x".to_owned(),
        ],
        vec![
            "1".to_owned(),
            "3".to_owned(),
            "data".to_owned(),
            "x".to_owned(),
            "y".to_owned(),
        ],
        vec![
            "1".to_owned(),
            "2".to_owned(),
            "data".to_owned(),
            "x".to_owned(),
            "extra".to_owned(),
        ],
    ];
    for batch in bad {
        let shown = batch.iter().take(6).cloned().collect::<Vec<_>>().join(" ");
        let reply: redis::RedisResult<redis::Value> = run(batch).invoke_async(&mut conn).await;
        assert!(reply.is_err(), "{shown}: {reply:?}");
    }
    let len: u64 = redis::cmd("XLEN")
        .arg(keys[0])
        .query_async(&mut conn)
        .await
        .expect("XLEN");
    assert_eq!(len, 0, "nothing was appended");
    let mut ok = vec!["64".to_owned()];
    for _ in 0..64 {
        ok.extend(event.iter().cloned());
    }
    let reply: redis::Value = run(ok).invoke_async(&mut conn).await.expect("64 events");
    let redis::Value::Array(items) = reply else {
        panic!("an array")
    };
    assert_eq!(items.len(), 65, "the epoch and 64 ids");
    let len: u64 = redis::cmd("XLEN")
        .arg(keys[0])
        .query_async(&mut conn)
        .await
        .expect("XLEN");
    assert_eq!(len, 64);
}
