//! What connection caps record (the names are in [`crate::metrics`]);
//! nothing without the `metrics` feature.

use super::HeartbeatReport;
use crate::metrics::{
    CONNECTION_GRANTS_TOTAL, CONNECTION_HEARTBEAT_CALLS_TOTAL, CONNECTION_LIVE_SEATS,
    CONNECTION_RELEASES_TOTAL, CONNECTION_RENEW_FAILURES_TOTAL, CONNECTION_SEATS_LOST_TOTAL,
    ENABLED,
};

/// Counts one grant (`outcome`: `granted`, `denied`, `fallback_granted`,
/// `fallback_denied`, `error`).
pub(super) fn grant(outcome: &'static str) {
    if ENABLED {
        ::metrics::counter!(CONNECTION_GRANTS_TOTAL, "outcome" => outcome).increment(1);
    }
}

/// Counts one release.
pub(super) fn released() {
    if ENABLED {
        ::metrics::counter!(CONNECTION_RELEASES_TOTAL).increment(1);
    }
}

/// Records one heartbeat tick, which moved this limiter's live seats by
/// `live_change`.
pub(super) fn heartbeat(report: &HeartbeatReport, live_change: i64) {
    if !ENABLED {
        return;
    }
    ::metrics::counter!(CONNECTION_SEATS_LOST_TOTAL).increment(report.lost as u64);
    ::metrics::counter!(CONNECTION_RENEW_FAILURES_TOTAL).increment(report.failed as u64);
    ::metrics::counter!(CONNECTION_HEARTBEAT_CALLS_TOTAL).increment(report.calls as u64);
    live_seats(live_change);
}

/// Moves the node's live-seat gauge by one limiter's change: every
/// `ConnectionLimiter` adds its own, so two limiters of one node add up
/// instead of overwriting each other.
pub(super) fn live_seats(change: i64) {
    if ENABLED && change != 0 {
        // Seat counts are far below 2^53.
        #[allow(clippy::cast_precision_loss)]
        ::metrics::gauge!(CONNECTION_LIVE_SEATS).increment(change as f64);
    }
}
