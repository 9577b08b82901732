//! Every metric's name (units and help texts: [`describe`](super::describe)).

/// Decisions by `outcome` and `source`.
pub const DECISIONS_TOTAL: &str = "tower_window_decisions_total";
/// Admissions that left less than 20 % of the limit.
pub const NEAR_LIMIT_TOTAL: &str = "tower_window_near_limit_total";
/// Decisions made by the fallback policy, by `reason` and `outcome`.
pub const FALLBACK_DECISIONS_TOTAL: &str = "tower_window_fallback_decisions_total";
/// Admissions made without the store, by `reason`.
pub const FALLBACK_ADMISSIONS_TOTAL: &str = "tower_window_fallback_admissions_total";
/// Duration of one decision's store call (retries included), by `outcome`
/// (not for [`MemoryStore`](crate::MemoryStore)).
pub const STORE_CALL_DURATION_SECONDS: &str = "tower_window_store_call_duration_seconds";
/// Failed store calls by error `kind`.
pub const STORE_ERRORS_TOTAL: &str = "tower_window_store_errors_total";
/// Retried store attempts.
pub const STORE_RETRIES_TOTAL: &str = "tower_window_store_retries_total";
/// Circuit breaker state: 0 closed, 1 half-open, 2 open (the worst shard's).
pub const BREAKER_STATE: &str = "tower_window_breaker_state";
/// Circuit breakers currently open (one per shard of a sharded store).
pub const BREAKER_OPEN_SHARDS: &str = "tower_window_breaker_open_shards";
/// Circuit breaker transitions, by the state entered (`to`).
pub const BREAKER_TRANSITIONS_TOTAL: &str = "tower_window_breaker_transitions_total";
/// Keys held by the local tier.
pub const LOCAL_CACHE_ENTRIES: &str = "tower_window_local_cache_entries";
/// Local-tier lookups answered locally.
pub const LOCAL_CACHE_HITS_TOTAL: &str = "tower_window_local_cache_hits_total";
/// Local-tier lookups that went on to the store.
pub const LOCAL_CACHE_MISSES_TOTAL: &str = "tower_window_local_cache_misses_total";
/// Units of quota leases, by `event` (`granted`, `spent`, `refunded`, `expired`).
pub const LEASE_UNITS_TOTAL: &str = "tower_window_lease_units_total";

/// Would-be denials of shadow quotas, by `quota`.
pub const SHADOW_DENIALS_TOTAL: &str = "tower_window_shadow_denials_total";
/// Tenants-file reloads, by `result` (`ok`, `error`).
pub const CONFIG_RELOAD_TOTAL: &str = "tower_window_config_reload_total";

/// Every metric name above (a limiter's series).
pub const ALL: &[&str] = &[
    DECISIONS_TOTAL,
    NEAR_LIMIT_TOTAL,
    FALLBACK_DECISIONS_TOTAL,
    FALLBACK_ADMISSIONS_TOTAL,
    STORE_CALL_DURATION_SECONDS,
    STORE_ERRORS_TOTAL,
    STORE_RETRIES_TOTAL,
    BREAKER_STATE,
    BREAKER_OPEN_SHARDS,
    BREAKER_TRANSITIONS_TOTAL,
    LOCAL_CACHE_ENTRIES,
    LOCAL_CACHE_HITS_TOTAL,
    LOCAL_CACHE_MISSES_TOTAL,
    SHADOW_DENIALS_TOTAL,
    CONFIG_RELOAD_TOTAL,
    LEASE_UNITS_TOTAL,
];

/// Suggested histogram buckets (seconds) for
/// [`STORE_CALL_DURATION_SECONDS`]: 100 µs to 1 s.
pub const STORE_CALL_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// Dedup-window answers, by `outcome`.
pub const DEDUP_CHECKS_TOTAL: &str = "tower_window_dedup_checks_total";

/// Every dedup and connection-seat metric name.
pub const WS_ALL: &[&str] = &[
    DEDUP_CHECKS_TOTAL,
    CONNECTION_GRANTS_TOTAL,
    CONNECTION_RELEASES_TOTAL,
    CONNECTION_SEATS_LOST_TOTAL,
    CONNECTION_RENEW_FAILURES_TOTAL,
    CONNECTION_HEARTBEAT_CALLS_TOTAL,
    CONNECTION_LIVE_SEATS,
];

/// Connection seat grants, by `outcome`.
pub const CONNECTION_GRANTS_TOTAL: &str = "tower_window_connection_grants_total";
/// Connection seats released.
pub const CONNECTION_RELEASES_TOTAL: &str = "tower_window_connection_releases_total";
/// Seats a heartbeat found gone (expired or reset) and reported lost.
pub const CONNECTION_SEATS_LOST_TOTAL: &str = "tower_window_connection_seats_lost_total";
/// Seats whose heartbeat renewal call failed.
pub const CONNECTION_RENEW_FAILURES_TOTAL: &str = "tower_window_connection_renew_failures_total";
/// Store calls made by heartbeats.
pub const CONNECTION_HEARTBEAT_CALLS_TOTAL: &str = "tower_window_connection_heartbeat_calls_total";
/// Live seats this node renews.
pub const CONNECTION_LIVE_SEATS: &str = "tower_window_connection_live_seats";

/// Audit records, by `outcome`: `written` to the log, `dropped_full` (the
/// buffer was full), `dropped_failed` (the log refused them).
pub const AUDIT_RECORDS_TOTAL: &str = "tower_window_audit_records_total";
/// Audit records waiting to be written.
pub const AUDIT_BUFFERED: &str = "tower_window_audit_buffered";
