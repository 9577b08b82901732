//! The node's one reader: fetches new events of every room with sockets
//! and hands them to the hub, until the hub is dropped.

use std::sync::{Arc, Weak};
use std::time::Duration;

#[cfg(feature = "redis")]
use tower_window::events::EventTail;
use tower_window::events::{Epoch, EventId, Position, Resume};
use tower_window::StoreError;

use super::hub::{lock, window_key, Inner, Live, RoomHub};
use super::name::RoomName;
use super::{POLL_EVERY, READ_BLOCK};

/// Events per room per read.
const READ_COUNT: u32 = 1000;

/// Every room the reader follows, with its cursor.
type Cursors = Vec<(RoomName, Epoch, EventId)>;

pub(super) async fn run(hub: Weak<Inner>) {
    let mut failures: u32 = 0;
    loop {
        let Some(inner) = hub.upgrade() else { return };
        let hub_ref = RoomHub { inner };
        let rooms: Cursors = lock(&hub_ref.inner.rooms)
            .iter()
            .filter_map(|(name, room)| {
                room.cursor
                    .as_ref()
                    .map(|(epoch, id)| (name.clone(), epoch.clone(), *id))
            })
            .collect();
        if rooms.is_empty() {
            // Nothing to read: wait for a join (or look again soon),
            // holding no clone of the hub meanwhile.
            let inner = Arc::clone(&hub_ref.inner);
            drop(hub_ref);
            tokio::select! {
                () = inner.wake.notified() => {}
                () = tokio::time::sleep(READ_BLOCK) => {}
            }
            continue;
        }
        let result = match &hub_ref.inner.live {
            #[cfg(feature = "redis")]
            Live::Tail(tail) => read_tail(&hub_ref, tail, &rooms).await,
            Live::Poll => read_poll(&hub_ref, &rooms).await,
        };
        match result {
            Ok(()) => failures = 0,
            Err(error) => {
                failures = failures.saturating_add(1);
                tracing::warn!(%error, "room reader failed; retrying");
                let backoff = Duration::from_millis(50u64 << failures.min(5));
                drop(hub_ref);
                tokio::time::sleep(backoff).await;
            }
        }
    }
}

#[cfg(feature = "redis")]
async fn read_tail(
    hub: &RoomHub,
    tail: &tokio::sync::Mutex<EventTail>,
    rooms: &Cursors,
) -> Result<(), StoreError> {
    let keys: Vec<String> = rooms.iter().map(|(name, _, _)| window_key(name)).collect();
    let windows: Vec<(&[u8], EventId)> = keys
        .iter()
        .zip(rooms)
        .map(|(key, (_, _, id))| (key.as_bytes(), *id))
        .collect();
    let batches = tail
        .lock()
        .await
        .read(&windows, READ_BLOCK, READ_COUNT as usize)
        .await?;
    for batch in batches {
        if let Some((name, _, _)) = rooms.get(batch.index) {
            hub.deliver(name, batch.events);
            if let Some(last) = batch.last_id {
                hub.skip_to(name, last);
            }
        }
    }
    Ok(())
}

async fn read_poll(hub: &RoomHub, rooms: &Cursors) -> Result<(), StoreError> {
    for (name, epoch, id) in rooms {
        let from = Position::new(epoch.clone(), (*id != EventId::ZERO).then_some(*id));
        match hub
            .inner
            .events
            .since(window_key(name), &from, READ_COUNT)
            .await?
        {
            Resume::Recovered(events) => {
                let events = events.into_iter().map(|e| (epoch.clone(), e)).collect();
                hub.deliver(name, events);
            }
            Resume::Resync(_) => {
                // History moved on (a new epoch): follow the room from now.
                let head = hub.inner.events.position(window_key(name)).await?;
                if let Some(room) = lock(&hub.inner.rooms).get_mut(name) {
                    room.cursor = Some((head.epoch.clone(), head.after()));
                }
            }
        }
    }
    tokio::select! {
        () = hub.inner.wake.notified() => {}
        () = tokio::time::sleep(POLL_EVERY) => {}
    }
    Ok(())
}
