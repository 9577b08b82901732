//! The text frames of the room protocol (see the [module docs](super)).
//!
//! Each is one JSON object with a `type`; a live event is serialised once
//! and the same bytes go to every socket in the room.

use axum::extract::ws::Utf8Bytes;
use serde_json::json;
use tower_window::events::{Epoch, Event, Position};

use super::name::RoomName;

/// The event field holding the sender.
pub(super) const FROM: &str = "from";
/// The event field holding the message text.
pub(super) const DATA: &str = "data";

/// `{"type":"joined","room":R,"epoch":E,"last_event_id":ID}` (`ID` empty
/// when the room has no event yet).
pub(super) fn joined(room: &RoomName, head: &Position) -> Utf8Bytes {
    text(json!({
        "type": "joined",
        "room": room.as_str(),
        "epoch": head.epoch.as_str(),
        "last_event_id": head.last_id.map(|id| id.to_string()).unwrap_or_default(),
    }))
}

/// `{"type":"event","room":R,"id":ID,"epoch":E,"from":F,"data":D}` for
/// `event` of `room` in `epoch`.
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

/// `{"type":"recovered","room":R,"count":N}`.
pub(super) fn recovered(room: &RoomName, count: u64) -> Utf8Bytes {
    text(json!({"type": "recovered", "room": room.as_str(), "count": count}))
}

/// `{"type":"resync","room":R,"reason":REASON}`.
pub(super) fn resync(room: &RoomName, reason: &str) -> Utf8Bytes {
    text(json!({"type": "resync", "room": room.as_str(), "reason": reason}))
}

/// `{"type":"error","room":R,"reason":"unavailable"}`: a message could
/// not be appended.
pub(super) fn unavailable(room: &RoomName) -> Utf8Bytes {
    text(json!({"type": "error", "room": room.as_str(), "reason": "unavailable"}))
}

fn text(frame: serde_json::Value) -> Utf8Bytes {
    frame.to_string().into()
}
