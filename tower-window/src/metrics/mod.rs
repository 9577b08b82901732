//! Metric names, units and labels, recorded through the [`metrics`] facade.
//!
//! With the `metrics` cargo feature (on by default) every [`Limiter`]
//! records the series below into whatever recorder the application installs
//! (for example `metrics-exporter-prometheus`); without a recorder each
//! record is a no-op. With the feature off nothing is recorded and nothing
//! is compiled in; the names stay available here.
//!
//! Call [`describe`] once after installing a recorder to give each series
//! its unit and help text.
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
//! A shadow denial is a [shadow quota](crate::Quota::shadowed)'s would-be
//! denial of a request that was admitted anyway (labelled with the shadow
//! quota). Config reloads (`result` = `ok` or `error`) are recorded by
//! whoever reloads a tenants file (see [`crate::tenant`]).
//!
//! Recorded by [`DedupWindow`](crate::dedup::DedupWindow)s and
//! [`ConnectionLimiter`](crate::conn::ConnectionLimiter)s (not in [`ALL`],
//! which lists a limiter's own series; see [`WS_ALL`]):
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
//! - `quota`: the checked quota's [name](crate::Quota::name); for the breaker
//!   and the local-tier size, the limiter's own quota.
//! - `tenant`: only with
//!   [`LimiterBuilder::metrics_tenant_label`](crate::LimiterBuilder::metrics_tenant_label)
//!   (off by default: one series per tenant). The subject (user, IP, ...)
//!   is never a label.
//!
//! A near-limit decision is an admission that left less than 20 % of the
//! limit (`5 × remaining < limit`). A fallback admission is a request let
//! through without the store: the possible over-admission while the store
//! is away. Store errors count failed store calls after retries; an open
//! breaker or a full in-flight bound calls nothing and shows up as
//! fallback decisions with reason `circuit_open` or `overloaded`.
//!
//! A store of several failure domains
//! ([`limit::Backend::failure_domain`](crate::limit::Backend::failure_domain),
//! for example a Redis Cluster: one domain per primary) has one breaker per
//! domain. The state gauge is then the worst state over them (open if
//! any is open, else half-open if any is), the open-shards gauge counts the
//! open ones, and the transitions counter counts every breaker's
//! transitions.
//!
//! Every series of a limiter is registered at zero when it first records,
//! so dashboards see each name before the first error or transition. For a
//! limiter's own quota (and no tenant label) the handles are resolved once
//! and recording allocates nothing; install the recorder before the first
//! check. Other quotas and tenant labels resolve their series per record.
//!
//! [`Limiter`]: crate::Limiter
//! [`metrics`]: https://docs.rs/metrics

mod names;
mod record;

pub use names::*;
pub(crate) use record::{Calls, LimiterMetrics, Parts as MetricParts, StoreTimer};

/// Whether anything is recorded: the `metrics` feature. Off, every record
/// returns at once and the recorder sees nothing.
pub(crate) const ENABLED: bool = cfg!(feature = "metrics");

/// Describes every metric (unit and help text) to the installed recorder.
///
/// Call it after installing the recorder; calling it again is harmless.
pub fn describe() {
    if !ENABLED {
        return;
    }
    use ::metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        DECISIONS_TOTAL,
        Unit::Count,
        "Rate-limit decisions by outcome (allowed, denied) and source (store, local_cache, lease, fallback)."
    );
    describe_counter!(
        NEAR_LIMIT_TOTAL,
        Unit::Count,
        "Admitted decisions that left less than 20% of the limit."
    );
    describe_counter!(
        FALLBACK_DECISIONS_TOTAL,
        Unit::Count,
        "Decisions made by the fallback policy because the store could not decide, by reason and outcome."
    );
    describe_counter!(
        FALLBACK_ADMISSIONS_TOTAL,
        Unit::Count,
        "Requests admitted without the store (possible over-admission), by reason."
    );
    describe_histogram!(
        STORE_CALL_DURATION_SECONDS,
        Unit::Seconds,
        "Duration of one decision's store call, retries included, by outcome (ok, error)."
    );
    describe_counter!(
        STORE_ERRORS_TOTAL,
        Unit::Count,
        "Failed store calls by error kind."
    );
    describe_counter!(
        STORE_RETRIES_TOTAL,
        Unit::Count,
        "Store attempts retried after a retryable error."
    );
    describe_gauge!(
        BREAKER_STATE,
        "Circuit breaker state: 0 closed, 1 half-open, 2 open; with one breaker per shard (Redis Cluster hash slot), the worst over them."
    );
    describe_gauge!(
        BREAKER_OPEN_SHARDS,
        Unit::Count,
        "Circuit breakers currently open: one per shard (Redis Cluster hash slot) of a sharded store, at most 1 otherwise."
    );
    describe_counter!(
        BREAKER_TRANSITIONS_TOTAL,
        Unit::Count,
        "Circuit breaker state changes, by the state entered."
    );
    describe_gauge!(
        LOCAL_CACHE_ENTRIES,
        Unit::Count,
        "Keys held by the local tier of recent denials."
    );
    describe_counter!(
        LOCAL_CACHE_HITS_TOTAL,
        Unit::Count,
        "Local-tier lookups answered without the store."
    );
    describe_counter!(
        SHADOW_DENIALS_TOTAL,
        Unit::Count,
        "Requests a shadow quota would have denied (admitted anyway), by the shadow quota."
    );
    describe_counter!(
        CONFIG_RELOAD_TOTAL,
        Unit::Count,
        "Tenants-file reloads by result (ok, error: the old configuration stays)."
    );
    describe_counter!(
        LOCAL_CACHE_MISSES_TOTAL,
        Unit::Count,
        "Local-tier lookups that went on to the store."
    );
    describe_counter!(
        LEASE_UNITS_TOTAL,
        Unit::Count,
        "Units of quota leases: granted, spent, refunded, expired unspent."
    );
    describe_counter!(
        DEDUP_CHECKS_TOTAL,
        Unit::Count,
        "Dedup-window answers by outcome."
    );
    describe_counter!(
        CONNECTION_GRANTS_TOTAL,
        Unit::Count,
        "Connection seat grants by outcome."
    );
    describe_counter!(
        CONNECTION_RELEASES_TOTAL,
        Unit::Count,
        "Connection seats released."
    );
    describe_counter!(
        CONNECTION_SEATS_LOST_TOTAL,
        Unit::Count,
        "Connection seats a heartbeat found gone (expired or reset) and reported lost."
    );
    describe_counter!(
        CONNECTION_RENEW_FAILURES_TOTAL,
        Unit::Count,
        "Connection seats whose heartbeat renewal call failed."
    );
    describe_counter!(
        CONNECTION_HEARTBEAT_CALLS_TOTAL,
        Unit::Count,
        "Store calls made by connection heartbeats."
    );
    describe_gauge!(
        CONNECTION_LIVE_SEATS,
        Unit::Count,
        "Connection seats this node holds and renews."
    );
}

/// Registers, at zero, every series a limiter records for the quota named
/// `quota` (without a tenant label): decisions by every outcome and source,
/// fallback decisions and admissions by every reason, store-call durations
/// and errors by every kind, retries, the breaker and local-tier series,
/// shadow denials and lease units by every event.
///
/// A limiter registers its own quota's series on its first record, and
/// other quotas' series when they first occur; call this after installing
/// the recorder, for every quota an application knows it will check, so a
/// dashboard charts zero rather than "No data" before the first decision
/// (and `rate()` sees the start). Adding zero never changes a value, so
/// calling it again, or after records, is harmless.
pub fn register_quota(quota: &str) {
    if !ENABLED {
        return;
    }
    record::register_quota(quota);
}

/// Registers, at zero, every series dedup windows and connection limiters
/// record (every `outcome`; see the second table above). Harmless to call
/// again.
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
