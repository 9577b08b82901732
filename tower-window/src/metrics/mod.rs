//! Metric names, units and labels, recorded through the [`metrics`] facade.
//!
//! With the `metrics` feature (default) every [`Limiter`] records the series
//! below into the installed recorder; with it off nothing is recorded, and
//! the names stay available. [`describe`] gives each series its unit and help.
//!
//! | name | type | unit | labels |
//! |------|------|------|--------|
//! | `tower_window_decisions_total` | counter | decisions | `outcome`, `source`, `quota`, (`tenant`) |
//! | `tower_window_near_limit_total` | counter | decisions | `quota`, (`tenant`) |
//! | `tower_window_fallback_decisions_total` | counter | decisions | `reason`, `outcome`, `quota`, (`tenant`) |
//! | `tower_window_fallback_admissions_total` | counter | decisions | `reason`, `quota`, (`tenant`) |
//! | `tower_window_store_call_duration_seconds` | histogram | seconds | `outcome`, `quota` |
//! | `tower_window_store_errors_total` | counter | errors | `kind`, `quota` |
//! | `tower_window_store_retries_total` | counter | retries | `quota` |
//! | `tower_window_breaker_state` | gauge | 0, 1, 2 | `quota` |
//! | `tower_window_breaker_open_shards` | gauge | breakers | `quota` |
//! | `tower_window_breaker_transitions_total` | counter | transitions | `to`, `quota` |
//! | `tower_window_local_cache_entries` | gauge | keys | `quota` |
//! | `tower_window_local_cache_hits_total` | counter | lookups | `quota` |
//! | `tower_window_local_cache_misses_total` | counter | lookups | `quota` |
//! | `tower_window_shadow_denials_total` | counter | decisions | `quota`, (`tenant`) |
//! | `tower_window_config_reload_total` | counter | reloads | `result` |
//!
//! Config reloads are recorded by whoever reloads a tenants file (see
//! [`crate::tenant`]). Recorded by [`DedupWindow`](crate::dedup::DedupWindow)s
//! and [`ConnectionLimiter`](crate::conn::ConnectionLimiter)s ([`WS_ALL`]):
//!
//! | name | type | unit | labels |
//! |------|------|------|--------|
//! | `tower_window_dedup_checks_total` | counter | checks | `outcome`: `first_seen`, `duplicate`, `fallback_first_seen`, `fallback_duplicate`, `error` |
//! | `tower_window_connection_grants_total` | counter | grants | `outcome`: `granted`, `denied`, `fallback_granted`, `fallback_denied`, `error` |
//! | `tower_window_connection_releases_total` | counter | releases | |
//! | `tower_window_connection_seats_lost_total` | counter | seats | |
//! | `tower_window_connection_renew_failures_total` | counter | seats | |
//! | `tower_window_connection_heartbeat_calls_total` | counter | store calls | |
//! | `tower_window_connection_live_seats` | gauge | seats | |
//!
//! Recorded by [`AuditLog`](crate::audit::AuditLog)s:
//!
//! | name | type | unit | labels |
//! |------|------|------|--------|
//! | `tower_window_audit_records_total` | counter | records | `outcome`: `written`, `dropped_full`, `dropped_failed` |
//! | `tower_window_audit_buffered` | gauge | records | |
//!
//! Label values:
//! - `outcome`: `allowed`, `denied` (decisions); `ok`, `error` (store calls).
//! - `source`: `store`, `local_cache`, `lease`, `fallback`
//!   ([`DecisionSource::as_str`](crate::DecisionSource::as_str)).
//! - `reason`: `unavailable`, `timeout`, `overloaded`, `circuit_open`, `error`
//!   ([`FallbackReason::as_str`](crate::FallbackReason::as_str)).
//! - `kind`: `unavailable`, `timeout`, `overloaded`, `protocol`,
//!   `invalid_request`, `unsupported` ([`StoreErrorKind::as_str`](crate::StoreErrorKind::as_str)).
//! - `to`: `closed`, `half_open`, `open`; the state gauge is 0 closed,
//!   1 half-open, 2 open.
//! - `quota`: the checked quota's [name](crate::Quota::name) (the shadow
//!   quota's for shadow denials); the limiter's own for the breaker and
//!   local-tier size.
//! - `tenant`: only with
//!   [`LimiterBuilder::metrics_tenant_label`](crate::LimiterBuilder::metrics_tenant_label).
//!   The subject is never a label.
//!
//! Near limit: `5 × remaining < limit`. Store errors count failed calls
//! after retries; an open breaker or full in-flight bound shows up as
//! fallback decisions (`circuit_open`, `overloaded`). With one breaker per
//! [failure domain](crate::limit::Backend::failure_domain), the state gauge
//! is the worst state and the open-shards gauge counts the open ones.
//!
//! A limiter registers its series at zero on its first record, so install
//! the recorder before the first check; its own quota's handles are
//! resolved once (recording allocates nothing).
//!
//! [`Limiter`]: crate::Limiter
//! [`metrics`]: https://docs.rs/metrics

mod names;
mod record;

pub use names::*;
pub use record::register_quota;
pub(crate) use record::{Calls, LimiterMetrics, Parts as MetricParts, StoreTimer};

/// Whether anything is recorded: the `metrics` feature.
pub(crate) const ENABLED: bool = cfg!(feature = "metrics");

/// Describes every metric (unit and help text) to the installed recorder.
///
/// Call it after installing the recorder; calling it again is harmless.
pub fn describe() {
    if !ENABLED {
        return;
    }
    use ::metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    let counters = [
        (
            DECISIONS_TOTAL,
            "Rate-limit decisions by outcome (allowed, denied) and source (store, local_cache, lease, fallback).",
        ),
        (
            NEAR_LIMIT_TOTAL,
            "Admitted decisions that left less than 20% of the limit.",
        ),
        (
            FALLBACK_DECISIONS_TOTAL,
            "Decisions made by the fallback policy because the store could not decide, by reason and outcome.",
        ),
        (
            FALLBACK_ADMISSIONS_TOTAL,
            "Requests admitted without the store (possible over-admission), by reason.",
        ),
        (STORE_ERRORS_TOTAL, "Failed store calls by error kind."),
        (
            STORE_RETRIES_TOTAL,
            "Store attempts retried after a retryable error.",
        ),
        (
            BREAKER_TRANSITIONS_TOTAL,
            "Circuit breaker state changes, by the state entered.",
        ),
        (
            LOCAL_CACHE_HITS_TOTAL,
            "Local-tier lookups answered without the store.",
        ),
        (
            SHADOW_DENIALS_TOTAL,
            "Requests a shadow quota would have denied (admitted anyway), by the shadow quota.",
        ),
        (
            CONFIG_RELOAD_TOTAL,
            "Tenants-file reloads by result (ok, error: the old configuration stays).",
        ),
        (
            LOCAL_CACHE_MISSES_TOTAL,
            "Local-tier lookups that went on to the store.",
        ),
        (
            LEASE_UNITS_TOTAL,
            "Units of quota leases: granted, spent, refunded, expired unspent.",
        ),
        (DEDUP_CHECKS_TOTAL, "Dedup-window answers by outcome."),
        (
            AUDIT_RECORDS_TOTAL,
            "Audit records written to the log, or dropped (buffer full, log refused them).",
        ),
        (CONNECTION_GRANTS_TOTAL, "Connection seat grants by outcome."),
        (CONNECTION_RELEASES_TOTAL, "Connection seats released."),
        (
            CONNECTION_SEATS_LOST_TOTAL,
            "Connection seats a heartbeat found gone (expired or reset) and reported lost.",
        ),
        (
            CONNECTION_RENEW_FAILURES_TOTAL,
            "Connection seats whose heartbeat renewal call failed.",
        ),
        (
            CONNECTION_HEARTBEAT_CALLS_TOTAL,
            "Store calls made by connection heartbeats.",
        ),
    ];
    for (name, help) in counters {
        describe_counter!(name, Unit::Count, help);
    }
    let gauges = [
        (
            BREAKER_OPEN_SHARDS,
            "Circuit breakers currently open: one per shard (Redis Cluster hash slot) of a sharded store, at most 1 otherwise.",
        ),
        (
            LOCAL_CACHE_ENTRIES,
            "Keys held by the local tier of recent denials.",
        ),
        (
            CONNECTION_LIVE_SEATS,
            "Connection seats this node holds and renews.",
        ),
        (AUDIT_BUFFERED, "Audit records waiting to be written."),
    ];
    for (name, help) in gauges {
        describe_gauge!(name, Unit::Count, help);
    }
    describe_gauge!(
        BREAKER_STATE,
        "Circuit breaker state: 0 closed, 1 half-open, 2 open; with one breaker per shard (Redis Cluster hash slot), the worst over them."
    );
    describe_histogram!(
        STORE_CALL_DURATION_SECONDS,
        Unit::Seconds,
        "Duration of one decision's store call, retries included, by outcome (ok, error)."
    );
}

/// Registers, at zero, every series of [`WS_ALL`] (every `outcome`).
pub fn register_ws() {
    if !ENABLED {
        return;
    }
    for outcome in DEDUP_OUTCOMES {
        ::metrics::counter!(DEDUP_CHECKS_TOTAL, "outcome" => outcome).increment(0);
    }
    for outcome in CONNECTION_GRANT_OUTCOMES {
        ::metrics::counter!(CONNECTION_GRANTS_TOTAL, "outcome" => outcome).increment(0);
    }
    for name in [
        CONNECTION_RELEASES_TOTAL,
        CONNECTION_SEATS_LOST_TOTAL,
        CONNECTION_RENEW_FAILURES_TOTAL,
        CONNECTION_HEARTBEAT_CALLS_TOTAL,
    ] {
        ::metrics::counter!(name).increment(0);
    }
    ::metrics::gauge!(CONNECTION_LIVE_SEATS).increment(0.0);
}

/// Every `event` of [`LEASE_UNITS_TOTAL`].
const LEASE_EVENTS: [&str; 4] = ["granted", "spent", "refunded", "expired"];
/// Every `outcome` of [`DEDUP_CHECKS_TOTAL`].
const DEDUP_OUTCOMES: [&str; 5] = [
    "first_seen",
    "duplicate",
    "fallback_first_seen",
    "fallback_duplicate",
    "error",
];
/// Every `outcome` of [`CONNECTION_GRANTS_TOTAL`].
const CONNECTION_GRANT_OUTCOMES: [&str; 5] = [
    "granted",
    "denied",
    "fallback_granted",
    "fallback_denied",
    "error",
];
