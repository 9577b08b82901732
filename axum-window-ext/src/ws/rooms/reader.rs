//! The node's one reader: fetches new events of every room with sockets
//! and hands them to the hub, until the hub is dropped.

use std::sync::Weak;
use std::time::Duration;

#[cfg(feature = "redis")]
use tower_window::events::EventTail;
use tower_window::events::{Epoch, EventId, EventWakeups, Position, Resume, ResyncReason, Wakeup};
use tower_window::StoreError;

use super::hub::{lock, window_key, Inner, Live, RoomHub};
use super::name::RoomName;
use super::{POLL_EVERY, READ_BLOCK};

/// Events per room per read.
const READ_COUNT: u32 = 1000;

type Cursors = Vec<(RoomName, Epoch, EventId)>;

pub(super) async fn run(hub: Weak<Inner>) {
    let mut failures: u32 = 0;
    loop {
        let Some(inner) = hub.upgrade() else { return };
        let hub = RoomHub { inner };
        let result = match &hub.inner.live {
            #[cfg(feature = "redis")]
            Live::Tail(tail) => read_tail(&hub, tail).await,
            Live::Push(wakeups) => read_pushed(&hub, wakeups).await,
            Live::Poll => read_poll(&hub).await,
        };
        match result {
            Ok(()) => failures = 0,
            Err(error) => {
                failures = failures.saturating_add(1);
                tracing::warn!(%error, "room reader failed; retrying");
                let backoff = Duration::from_millis(50u64 << failures.min(5));
                drop(hub);
                tokio::time::sleep(backoff).await;
            }
        }
    }
}

/// Every room with a cursor; with `only_dirty`, only those marked to be
/// read (unmarked).
fn cursors(hub: &RoomHub, only_dirty: bool) -> Cursors {
    let mut rooms = lock(&hub.inner.rooms);
    let mut cursors = Vec::new();
    for (name, room) in rooms.iter_mut() {
        let Some((epoch, id)) = &room.cursor else {
            continue;
        };
        if only_dirty && !std::mem::take(&mut room.dirty) {
            continue;
        }
        cursors.push((name.clone(), epoch.clone(), *id));
    }
    cursors
}

/// Waits for the hub's wake, at most `timeout`.
async fn woken_or(hub: &RoomHub, timeout: Duration) {
    tokio::select! {
        () = hub.inner.wake.notified() => {}
        () = tokio::time::sleep(timeout) => {}
    }
}

#[cfg(feature = "redis")]
async fn read_tail(hub: &RoomHub, tail: &tokio::sync::Mutex<EventTail>) -> Result<(), StoreError> {
    let rooms = cursors(hub, false);
    if rooms.is_empty() {
        woken_or(hub, READ_BLOCK).await;
        return Ok(());
    }
    let keys: Vec<String> = rooms.iter().map(|(name, _, _)| window_key(name)).collect();
    let windows: Vec<(&[u8], EventId)> = keys
        .iter()
        .zip(&rooms)
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

/// One round with pushed wake-ups: waits (at most [`READ_BLOCK`]) for a
/// wake-up or a join, then reads every room marked to be read.
async fn read_pushed(hub: &RoomHub, wakeups: &EventWakeups) -> Result<(), StoreError> {
    let mut rooms = woken_rooms(hub, wakeups, None);
    if rooms.is_empty() {
        let woken = tokio::select! {
            wakeup = wakeups.next() => wakeup,
            () = woken_or(hub, READ_BLOCK) => None,
        };
        rooms = woken_rooms(hub, wakeups, woken);
    }
    let mut result = Ok(());
    for (name, epoch, id) in rooms {
        if let Err(error) = read_room(hub, &name, epoch, id).await {
            if let Some(room) = lock(&hub.inner.rooms).get_mut(&name) {
                room.dirty = true;
            }
            result = Err(error);
        }
    }
    result
}

/// Marks the rooms of `first` and of the wake-ups already here, then takes
/// the rooms to read.
fn woken_rooms(hub: &RoomHub, wakeups: &EventWakeups, first: Option<Wakeup>) -> Cursors {
    for wakeup in first
        .into_iter()
        .chain(std::iter::from_fn(|| wakeups.try_next()))
    {
        hub.woken(&wakeup.key);
    }
    cursors(hub, true)
}

/// Reads `name` from its cursor (`epoch`, `id`) up to now and delivers
/// what came: in a new epoch from `id` if the events still follow it (a
/// failover that lost nothing), else from the window's start, delivering
/// what is after `id`; if even that cannot be recovered, the cursor moves
/// to the head and the room's sockets are dropped with a resync.
async fn read_room(
    hub: &RoomHub,
    name: &RoomName,
    epoch: Epoch,
    id: EventId,
) -> Result<(), StoreError> {
    let key = window_key(name);
    let mut from = Position::new(epoch, (id != EventId::ZERO).then_some(id));
    let mut epoch_checked = false;
    let mut from_start = false;
    loop {
        match hub.inner.events.since(&key, &from, READ_COUNT).await? {
            Resume::Recovered(events) => {
                let full = events.len() >= READ_COUNT as usize;
                let last = events.last().map(|event| event.id);
                let tagged = events
                    .into_iter()
                    .filter(|e| !from_start || e.id > id)
                    .map(|e| (from.epoch.clone(), e))
                    .collect();
                hub.deliver(name, tagged);
                if epoch_checked {
                    // So the next read needs one call.
                    hub.move_cursor(name, &from);
                }
                match last {
                    Some(last) if full => from.last_id = Some(last),
                    _ => return Ok(()),
                }
            }
            Resume::Resync(ResyncReason::EpochChanged) if !epoch_checked => {
                epoch_checked = true;
                let head = hub.inner.events.position(&key).await?;
                from = Position::new(head.epoch, from.last_id);
            }
            Resume::Resync(ResyncReason::Ahead | ResyncReason::TooOld) if !from_start => {
                // The events no longer follow the cursor (a restore, a
                // lost stream), but what was appended since has later ids.
                from_start = true;
                from.last_id = None;
            }
            Resume::Resync(reason) => {
                tracing::debug!(%reason, room = %name, "room reader resyncs to the head");
                let head = hub.inner.events.position(&key).await?;
                hub.restart_at(name, &head);
                return Ok(());
            }
        }
    }
}

async fn read_poll(hub: &RoomHub) -> Result<(), StoreError> {
    for (name, epoch, id) in cursors(hub, false) {
        read_room(hub, &name, epoch, id).await?;
    }
    woken_or(hub, POLL_EVERY).await;
    Ok(())
}
