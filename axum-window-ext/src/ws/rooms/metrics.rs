//! What rooms record, through the [`metrics`](https://docs.rs/metrics)
//! facade. Every series is registered at zero when a
//! [`RoomHub`](super::RoomHub) is built (install the recorder first), so
//! `rate()` and `increase()` work from the first scrape on.

use metrics::{counter, describe_counter, describe_gauge, gauge, Unit};

/// Counter: room messages this node appended to their event window.
pub const ROOM_PUBLISHED_TOTAL: &str = "tower_window_room_published_total";
/// Counter: live room events this node queued to its sockets.
pub const ROOM_DELIVERED_TOTAL: &str = "tower_window_room_delivered_total";
/// Counter: room joins, by label `result` ([`JOIN_RESULTS`]).
pub const ROOM_JOINS_TOTAL: &str = "tower_window_room_joins_total";
/// Counter: sockets dropped from their room because their queue
/// overflowed.
pub const ROOM_OVERFLOWS_TOTAL: &str = "tower_window_room_overflows_total";
/// Gauge: sockets in a room on this node.
pub const ROOM_SOCKETS: &str = "tower_window_room_sockets";

/// Every room metric name.
pub const ROOM_ALL: &[&str] = &[
    ROOM_PUBLISHED_TOTAL,
    ROOM_DELIVERED_TOTAL,
    ROOM_JOINS_TOTAL,
    ROOM_OVERFLOWS_TOTAL,
    ROOM_SOCKETS,
];

/// Every `result` of [`ROOM_JOINS_TOTAL`]: `live` (no position given),
/// `recovered` (the gap was sent), and the resync reasons `too_old`,
/// `epoch_changed` and `ahead`.
pub const JOIN_RESULTS: [&str; 5] = ["live", "recovered", "too_old", "epoch_changed", "ahead"];

const ENABLED: bool = cfg!(feature = "metrics");

pub(super) fn register() {
    if !ENABLED {
        return;
    }
    let counters = [
        (
            ROOM_PUBLISHED_TOTAL,
            "Room messages appended to their event window by this node.",
        ),
        (
            ROOM_DELIVERED_TOTAL,
            "Live room events queued to this node's sockets.",
        ),
        (
            ROOM_OVERFLOWS_TOTAL,
            "Room sockets dropped because their queue overflowed.",
        ),
    ];
    for (name, help) in counters {
        describe_counter!(name, Unit::Count, help);
        counter!(name).increment(0);
    }
    describe_counter!(
        ROOM_JOINS_TOTAL,
        Unit::Count,
        "Room joins by result: live, recovered, too_old, epoch_changed, ahead."
    );
    describe_gauge!(ROOM_SOCKETS, Unit::Count, "Sockets in a room on this node.");
    for result in JOIN_RESULTS {
        counter!(ROOM_JOINS_TOTAL, "result" => result).increment(0);
    }
    gauge!(ROOM_SOCKETS).increment(0.0);
}

pub(super) fn published(count: u64) {
    if ENABLED {
        counter!(ROOM_PUBLISHED_TOTAL).increment(count);
    }
}

pub(super) fn delivered(n: u64) {
    if ENABLED {
        counter!(ROOM_DELIVERED_TOTAL).increment(n);
    }
}

pub(super) fn overflowed() {
    if ENABLED {
        counter!(ROOM_OVERFLOWS_TOTAL).increment(1);
    }
}

pub(super) fn joined(result: &'static str) {
    if ENABLED {
        counter!(ROOM_JOINS_TOTAL, "result" => result).increment(1);
    }
}

pub(super) fn sockets(delta: f64) {
    if ENABLED {
        gauge!(ROOM_SOCKETS).increment(delta);
    }
}
