//! The event-window conformance suite on `RedisStore` (a real
//! `redis-server` and a real 3-primary Redis Cluster), and what only Redis
//! can show: keys that vanish start a new epoch, every key has a TTL, and
//! both keys of a window share one slot.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use redis::AsyncCommands;
use tower_window::events::{EventWindow, Resume, ResyncReason, Retention};
use tower_window::{Limiter, ManualClock, Quota, RedisStore};
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
    let quota: Quota = "1000/1s".parse().expect("a quota");
    let limiter = Limiter::new(Arc::clone(&store), quota);
    let retention = Retention::new(Duration::from_secs(600), 10_000).expect("a retention");
    EventWindow::new(limiter, store, retention)
}

/// Deleting the stream (as a failover that lost the data or a flush
/// would): the next resume is `epoch_changed`, never `recovered`, even
/// once the window has events again; the meta key alone going is the same.
#[tokio::test]
async fn a_vanished_stream_changes_the_epoch() {
    let server = RedisServer::shared();
    let store = Arc::new(
        RedisStore::from_url(&server.url())
            .expect("url")
            .prefix("evdel:"),
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
        RedisStore::from_url(&server.url())
            .expect("url")
            .prefix("evttl:"),
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
