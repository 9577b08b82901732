//! [`EventWakeups`]: "read this window again", pushed by Redis (see
//! `wake.rs`) or sent in process by the embedded store's appends.

use std::collections::HashSet;
use std::fmt;
use std::sync::{Arc, Mutex, Weak};

use crate::sync::lock;

use tokio::sync::mpsc;

/// Why a window should be read again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WakeReason {
    /// An event was appended.
    Appended,
    /// The subscription was (re)confirmed: wake-ups sent before were lost.
    Subscribed,
}

/// "Read the window `key` from your last id", from [`EventWakeups::next`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Wakeup {
    /// The window's key, as given to [`EventWakeups::follow`].
    pub key: Vec<u8>,
    /// Why.
    pub reason: WakeReason,
}

impl Wakeup {
    pub(crate) fn new(key: Vec<u8>, reason: WakeReason) -> Self {
        Self { key, reason }
    }
}

/// Wake-ups of the event windows a reader follows
/// ([`EventWindow::wakeups`](crate::events::EventWindow::wakeups)): pushed
/// by Redis 7 (see [`wake`](crate::events::wake)), or sent in process by
/// the embedded store's appends.
///
/// [`follow`](Self::follow) a window before reading where it stands, then
/// read it from the last id seen on every [`Wakeup`].
pub struct EventWakeups {
    source: Box<dyn Source>,
    wakeups: tokio::sync::Mutex<mpsc::UnboundedReceiver<Wakeup>>,
}

/// Where wake-ups come from: the embedded store's appends, or Redis.
pub(crate) trait Source: Send + Sync + 'static {
    fn follow(&self, key: Vec<u8>);
    fn unfollow(&self, key: &[u8]);
    /// Called by every [`EventWakeups::next`], to start a task on its runtime.
    fn start(&self) {}
}

impl fmt::Debug for EventWakeups {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventWakeups").finish_non_exhaustive()
    }
}

impl EventWakeups {
    pub(crate) fn new(source: impl Source, wakeups: mpsc::UnboundedReceiver<Wakeup>) -> Self {
        Self {
            source: Box::new(source),
            wakeups: tokio::sync::Mutex::new(wakeups),
        }
    }

    /// Subscribes to the window `key`'s wake-ups (again, if it was
    /// followed: a [`WakeReason::Subscribed`] follows either way).
    pub fn follow(&self, key: impl AsRef<[u8]>) {
        self.source.follow(key.as_ref().to_vec());
    }

    /// Stops following the window `key`.
    pub fn unfollow(&self, key: impl AsRef<[u8]>) {
        self.source.unfollow(key.as_ref());
    }

    /// The next wake-up; `None` once the source is gone (Redis's
    /// subscriber task, with its runtime). Cancel-safe.
    pub async fn next(&self) -> Option<Wakeup> {
        self.source.start();
        self.wakeups.lock().await.recv().await
    }

    /// A wake-up already here, without waiting (`None` also while another
    /// caller waits in [`next`](Self::next)).
    pub fn try_next(&self) -> Option<Wakeup> {
        self.wakeups.try_lock().ok()?.try_recv().ok()
    }
}

/// The local notify of one embedded store.
#[derive(Default)]
pub(crate) struct LocalWakeups {
    followers: Mutex<Vec<Weak<Follower>>>,
}

/// One [`EventWakeups`] on an embedded store.
pub(crate) struct Follower {
    keys: Mutex<HashSet<Vec<u8>>>,
    out: mpsc::UnboundedSender<Wakeup>,
}

impl Source for Arc<Follower> {
    fn follow(&self, key: Vec<u8>) {
        lock(&self.keys).insert(key.clone());
        // Nothing to subscribe in process: it holds at once.
        let _ = self.out.send(Wakeup::new(key, WakeReason::Subscribed));
    }

    fn unfollow(&self, key: &[u8]) {
        lock(&self.keys).remove(key);
    }
}

impl LocalWakeups {
    pub(crate) fn wakeups(&self) -> EventWakeups {
        let (out, wakeups) = mpsc::unbounded_channel();
        let follower = Arc::new(Follower {
            keys: Mutex::default(),
            out,
        });
        let mut followers = lock(&self.followers);
        followers.retain(|follower| follower.strong_count() > 0);
        followers.push(Arc::downgrade(&follower));
        EventWakeups::new(follower, wakeups)
    }

    /// Tells every reader following the window `key` that it grew.
    pub(crate) fn appended(&self, key: &[u8]) {
        let followers = lock(&self.followers);
        let wakeup = || Wakeup::new(key.to_vec(), WakeReason::Appended);
        for follower in followers.iter().filter_map(Weak::upgrade) {
            if lock(&follower.keys).contains(key) {
                let _ = follower.out.send(wakeup());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use super::*;
    use crate::events::{EventWindow, Retention};
    use crate::{MemoryStore, Store};

    fn wakeup(key: &str, reason: WakeReason) -> Option<Wakeup> {
        Some(Wakeup::new(key.as_bytes().to_vec(), reason))
    }

    #[tokio::test]
    async fn the_embedded_stores_appends_wake_the_readers_following_their_window() {
        let memory = MemoryStore::new();
        let retention = Retention::new(Duration::from_secs(60), 100).unwrap();
        let events = EventWindow::new(Store::from(memory.clone()), retention);
        // Another handle on the same embedded store: its appends wake too.
        let writer = EventWindow::new(Store::from(memory), retention);
        let wakeups = events.wakeups().unwrap();
        let other = events.wakeups().unwrap();
        assert_eq!(wakeups.try_next(), None);

        wakeups.follow("room-1");
        assert_eq!(wakeups.try_next(), wakeup("room-1", WakeReason::Subscribed));
        writer.append("room-1", &[("data", b"a")]).await.unwrap();
        writer.append("room-2", &[("data", b"b")]).await.unwrap();
        let batch: &[&[(&str, &[u8])]] = &[&[("data", b"c")], &[("data", b"d")]];
        events.append_many("room-1", batch).await.unwrap();
        assert_eq!(wakeups.next().await, wakeup("room-1", WakeReason::Appended));
        assert_eq!(wakeups.try_next(), wakeup("room-1", WakeReason::Appended));
        assert_eq!(wakeups.try_next(), None, "room-2 is not followed");
        assert_eq!(other.try_next(), None, "each reader hears its own windows");

        wakeups.unfollow("room-1");
        events.append("room-1", &[("data", b"e")]).await.unwrap();
        assert_eq!(wakeups.try_next(), None);
        // A refused append wakes nobody.
        wakeups.follow("room-1");
        assert!(wakeups.try_next().is_some());
        assert!(events.append("room-1", &[]).await.is_err());
        assert_eq!(wakeups.try_next(), None);
    }

    #[tokio::test]
    async fn a_store_without_an_events_backend_has_no_wakeups() {
        let store = Store::from(crate::store::Backend::windows(MemoryStore::new()));
        let events = EventWindow::new(store, Retention::new(Duration::from_secs(60), 10).unwrap());
        assert_eq!(
            events.wakeups().unwrap_err().kind(),
            crate::StoreErrorKind::Unsupported
        );
    }
}
