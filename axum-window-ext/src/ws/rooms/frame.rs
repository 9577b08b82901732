//! The text frames of the room protocol (see the [module docs](super)).

use axum::extract::ws::Utf8Bytes;
use serde_json::json;
use tower_window::events::{Epoch, Event, Position};

use super::name::RoomName;

/// The event fields holding the sender and the message text.
const FROM: &str = "from";
const DATA: &str = "data";

/// The fields of a message `data` from `from`.
pub(super) fn fields<'a>(from: &'a str, data: &'a str) -> [(&'static str, &'a [u8]); 2] {
    [(FROM, from.as_bytes()), (DATA, data.as_bytes())]
}

pub(super) fn joined(room: &RoomName, head: &Position) -> Utf8Bytes {
    text(json!({
        "type": "joined",
        "room": room.as_str(),
        "epoch": head.epoch.as_str(),
        "last_event_id": head.last_id.map(|id| id.to_string()).unwrap_or_default(),
    }))
}

pub(super) fn event(room: &RoomName, epoch: &Epoch, event: &Event) -> Utf8Bytes {
    let field = |name: &str| {
        event
            .field(name)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .unwrap_or_default()
    };
    text(json!({
        "type": "event",
        "room": room.as_str(),
        "id": event.id.to_string(),
        "epoch": epoch.as_str(),
        "from": field(FROM),
        "data": field(DATA),
    }))
}

pub(super) fn recovered(room: &RoomName, count: u64) -> Utf8Bytes {
    text(json!({"type": "recovered", "room": room.as_str(), "count": count}))
}

pub(super) fn resync(room: &RoomName, reason: &str) -> Utf8Bytes {
    text(json!({"type": "resync", "room": room.as_str(), "reason": reason}))
}

pub(super) fn unavailable(room: &RoomName) -> Utf8Bytes {
    text(json!({"type": "error", "room": room.as_str(), "reason": "unavailable"}))
}

fn text(frame: serde_json::Value) -> Utf8Bytes {
    frame.to_string().into()
}
