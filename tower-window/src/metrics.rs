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
//! | `tower_window_connection_leases_lost_total` | counter | leases | |
//! | `tower_window_connection_renew_failures_total` | counter | leases | |
//! | `tower_window_connection_heartbeat_calls_total` | counter | store calls | |
//! | `tower_window_connection_live_leases` | gauge | leases | |
//!
//! Label values:
//! - `outcome`: `allowed`, `denied` (decisions); `ok`, `error` (store calls).
//! - `source`: `store`, `local_cache`, `lease`, `fallback`
//!   ([`DecisionSource::as_str`](crate::DecisionSource::as_str)).
//! - `reason`: `unavailable`, `timeout`, `overloaded`, `circuit_open`, `error`
//!   ([`FallbackReason::as_str`](crate::FallbackReason::as_str)).
//! - `kind`: `unavailable`, `timeout`, `overloaded`, `protocol`,
//!   `invalid_request` ([`StoreErrorKind::as_str`](crate::StoreErrorKind::as_str)).
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
//! A limiter over a store of several failure domains
//! ([`Store::failure_domain`](crate::Store::failure_domain), for example a
//! Redis Cluster: one domain per primary) has one breaker per domain. The state gauge is then the worst state over them (open if
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

/// Decisions by `outcome` and `source`.
pub const DECISIONS_TOTAL: &str = "tower_window_decisions_total";
/// Admissions that left less than 20 % of the limit.
pub const NEAR_LIMIT_TOTAL: &str = "tower_window_near_limit_total";
/// Decisions made by the fallback policy, by `reason` and `outcome`.
pub const FALLBACK_DECISIONS_TOTAL: &str = "tower_window_fallback_decisions_total";
/// Admissions made without the store, by `reason`.
pub const FALLBACK_ADMISSIONS_TOTAL: &str = "tower_window_fallback_admissions_total";
/// Duration of one decision's store call (retries included), by `outcome`.
/// Recorded for stores that do I/O (Redis); a store that decides in process
/// ([`Store::decides_in_process`](crate::Store::decides_in_process), the
/// embedded `MemoryStore`) is not timed: its call takes well under the
/// smallest bucket, and timing it would cost more than the call.
pub const STORE_CALL_DURATION_SECONDS: &str = "tower_window_store_call_duration_seconds";
/// Failed store calls by error `kind`.
pub const STORE_ERRORS_TOTAL: &str = "tower_window_store_errors_total";
/// Retried store attempts.
pub const STORE_RETRIES_TOTAL: &str = "tower_window_store_retries_total";
/// Circuit breaker state: 0 closed, 1 half-open, 2 open; with one breaker
/// per shard, the worst state over them.
pub const BREAKER_STATE: &str = "tower_window_breaker_state";
/// Circuit breakers currently open (one per shard of a sharded store, such
/// as a Redis Cluster hash slot; at most 1 for an unsharded store).
pub const BREAKER_OPEN_SHARDS: &str = "tower_window_breaker_open_shards";
/// Circuit breaker transitions, by the state entered (`to`).
pub const BREAKER_TRANSITIONS_TOTAL: &str = "tower_window_breaker_transitions_total";
/// Keys held by the local tier.
pub const LOCAL_CACHE_ENTRIES: &str = "tower_window_local_cache_entries";
/// Local-tier lookups answered locally.
pub const LOCAL_CACHE_HITS_TOTAL: &str = "tower_window_local_cache_hits_total";
/// Local-tier lookups that went on to the store.
pub const LOCAL_CACHE_MISSES_TOTAL: &str = "tower_window_local_cache_misses_total";
/// Counter: units of quota leases, by `event`: `granted` (taken from the
/// store), `spent` (admitted locally or with the reservation), `refunded`
/// (given back before the deadline), `expired` (left unspent at the
/// deadline; given back then where the store still counts them).
pub const LEASE_UNITS_TOTAL: &str = "tower_window_lease_units_total";

/// Would-be denials of shadow quotas, by `quota`.
pub const SHADOW_DENIALS_TOTAL: &str = "tower_window_shadow_denials_total";
/// Tenants-file reloads, by `result` (`ok`, `error`).
pub const CONFIG_RELOAD_TOTAL: &str = "tower_window_config_reload_total";

/// Every metric name above.
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

/// Whether an admission left less than 20 % of `limit`.
#[cfg(feature = "metrics")]
pub(crate) fn is_near_limit(remaining: u32, limit: u32) -> bool {
    u64::from(remaining) * 5 < u64::from(limit)
}

/// Describes every metric (unit and help text) to the installed recorder.
///
/// Call it after installing the recorder; calling it again is harmless.
#[cfg(feature = "metrics")]
pub fn describe() {
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
        "Connection lease grants by outcome."
    );
    describe_counter!(
        CONNECTION_RELEASES_TOTAL,
        Unit::Count,
        "Connection leases released."
    );
    describe_counter!(
        CONNECTION_LEASES_LOST_TOTAL,
        Unit::Count,
        "Connection leases a heartbeat found gone (expired or reset) and reported lost."
    );
    describe_counter!(
        CONNECTION_RENEW_FAILURES_TOTAL,
        Unit::Count,
        "Connection leases whose heartbeat renewal call failed."
    );
    describe_counter!(
        CONNECTION_HEARTBEAT_CALLS_TOTAL,
        Unit::Count,
        "Store calls made by connection heartbeats."
    );
    describe_gauge!(
        CONNECTION_LIVE_LEASES,
        Unit::Count,
        "Connection leases this node holds and renews."
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
#[cfg(feature = "metrics")]
pub fn register_quota(quota: &str) {
    imp::register_quota(quota);
}

/// Registers, at zero, every series dedup windows and connection limiters
/// record (every `outcome`; see the second table above). Harmless to call
/// again.
#[cfg(feature = "metrics")]
pub fn register_ws() {
    for outcome in DEDUP_OUTCOMES {
        ::metrics::counter!(DEDUP_CHECKS_TOTAL, "outcome" => outcome).increment(0);
    }
    for outcome in CONNECTION_GRANT_OUTCOMES {
        ::metrics::counter!(CONNECTION_GRANTS_TOTAL, "outcome" => outcome).increment(0);
    }
    for name in [
        CONNECTION_RELEASES_TOTAL,
        CONNECTION_LEASES_LOST_TOTAL,
        CONNECTION_RENEW_FAILURES_TOTAL,
        CONNECTION_HEARTBEAT_CALLS_TOTAL,
    ] {
        ::metrics::counter!(name).increment(0);
    }
    ::metrics::gauge!(CONNECTION_LIVE_LEASES).increment(0.0);
}

/// Every `event` of [`LEASE_UNITS_TOTAL`].
#[cfg(feature = "metrics")]
const LEASE_EVENTS: [&str; 4] = ["granted", "spent", "refunded", "expired"];
/// Every `outcome` of [`DEDUP_CHECKS_TOTAL`].
#[cfg(feature = "metrics")]
const DEDUP_OUTCOMES: [&str; 5] = [
    "first_seen",
    "duplicate",
    "fallback_first_seen",
    "fallback_duplicate",
    "error",
];
/// Every `outcome` of [`CONNECTION_GRANTS_TOTAL`].
#[cfg(feature = "metrics")]
const CONNECTION_GRANT_OUTCOMES: [&str; 5] = [
    "granted",
    "denied",
    "fallback_granted",
    "fallback_denied",
    "error",
];

pub(crate) use imp::{LimiterMetrics, Parts as MetricParts, StoreTimer};

#[cfg(feature = "metrics")]
mod imp {
    use std::sync::OnceLock;
    use std::time::Instant;

    use ::metrics::{Counter, Gauge, Histogram, Label, SharedString};

    use super::*;
    use crate::{BreakerState, Decision, DecisionSource, FallbackReason, Quota, WindowKey};
    use crate::{StoreError, StoreErrorKind};

    const SOURCES: [DecisionSource; 4] = [
        DecisionSource::Store,
        DecisionSource::LocalCache,
        DecisionSource::Lease,
        DecisionSource::Fallback(FallbackReason::Error),
    ];
    const REASONS: [FallbackReason; 5] = FallbackReason::ALL;
    const KINDS: [StoreErrorKind; 5] = [
        StoreErrorKind::Unavailable,
        StoreErrorKind::Timeout,
        StoreErrorKind::Overloaded,
        StoreErrorKind::Protocol,
        StoreErrorKind::InvalidRequest,
    ];
    const STATES: [BreakerState; 3] = [
        BreakerState::Closed,
        BreakerState::HalfOpen,
        BreakerState::Open,
    ];

    fn outcome(allowed: bool) -> &'static str {
        if allowed {
            "allowed"
        } else {
            "denied"
        }
    }

    fn source_index(source: DecisionSource) -> usize {
        match source {
            DecisionSource::Store => 0,
            DecisionSource::LocalCache => 1,
            DecisionSource::Lease => 2,
            _ => 3,
        }
    }

    fn reason_index(reason: FallbackReason) -> usize {
        REASONS.iter().position(|r| *r == reason).unwrap_or(4)
    }

    fn kind_index(kind: StoreErrorKind) -> usize {
        KINDS.iter().position(|k| *k == kind).unwrap_or(3)
    }

    fn state_index(state: BreakerState) -> usize {
        STATES.iter().position(|s| *s == state).unwrap_or(2)
    }

    /// The labels every series of one record carries.
    struct Labels {
        quota: SharedString,
        tenant: Option<SharedString>,
    }

    impl Labels {
        fn build(&self, extra: &[(&'static str, &'static str)]) -> Vec<Label> {
            let mut labels = Vec::with_capacity(extra.len() + 2);
            labels.extend(extra.iter().map(|(k, v)| Label::from_static_parts(k, v)));
            labels.push(Label::new("quota", self.quota.clone()));
            if let Some(tenant) = &self.tenant {
                labels.push(Label::new("tenant", tenant.clone()));
            }
            labels
        }

        fn counter(&self, name: &'static str, extra: &[(&'static str, &'static str)]) -> Counter {
            ::metrics::counter!(name, self.build(extra))
        }

        fn gauge(&self, name: &'static str) -> Gauge {
            ::metrics::gauge!(name, self.build(&[]))
        }

        fn histogram(
            &self,
            name: &'static str,
            extra: &[(&'static str, &'static str)],
        ) -> Histogram {
            ::metrics::histogram!(name, self.build(extra))
        }
    }

    /// Decision-level series of one (quota, tenant).
    struct DecisionHandles {
        /// `[allowed][source]`.
        decisions: [[Counter; 4]; 2],
        near_limit: Counter,
        /// `[reason][allowed]`; `None` without a fallback policy.
        fallback: Option<FallbackHandles>,
    }

    struct FallbackHandles {
        decisions: [[Counter; 2]; 5],
        admissions: [Counter; 5],
    }

    impl DecisionHandles {
        fn new(labels: &Labels, fallback: bool) -> Self {
            let decisions = [false, true].map(|allowed| {
                SOURCES.map(|s| {
                    labels.counter(
                        DECISIONS_TOTAL,
                        &[("outcome", outcome(allowed)), ("source", s.as_str())],
                    )
                })
            });
            let fallback = fallback.then(|| FallbackHandles {
                decisions: REASONS.map(|r| {
                    [false, true].map(|allowed| {
                        labels.counter(
                            FALLBACK_DECISIONS_TOTAL,
                            &[("reason", r.as_str()), ("outcome", outcome(allowed))],
                        )
                    })
                }),
                admissions: REASONS
                    .map(|r| labels.counter(FALLBACK_ADMISSIONS_TOTAL, &[("reason", r.as_str())])),
            });
            Self {
                decisions,
                near_limit: labels.counter(NEAR_LIMIT_TOTAL, &[]),
                fallback,
            }
        }

        fn record(&self, decision: &Decision) {
            let allowed = usize::from(decision.allowed);
            self.decisions[allowed][source_index(decision.source)].increment(1);
            if decision.allowed && is_near_limit(decision.remaining, decision.limit()) {
                self.near_limit.increment(1);
            }
            if let (DecisionSource::Fallback(reason), Some(fallback)) =
                (decision.source, &self.fallback)
            {
                let r = reason_index(reason);
                fallback.decisions[r][allowed].increment(1);
                if decision.allowed {
                    fallback.admissions[r].increment(1);
                }
            }
        }
    }

    /// Store-call series of one quota.
    struct StoreHandles {
        ok: Histogram,
        error: Histogram,
        errors: [Counter; 5],
        retries: Counter,
    }

    impl StoreHandles {
        fn new(labels: &Labels) -> Self {
            Self {
                ok: labels.histogram(STORE_CALL_DURATION_SECONDS, &[("outcome", "ok")]),
                error: labels.histogram(STORE_CALL_DURATION_SECONDS, &[("outcome", "error")]),
                errors: KINDS.map(|k| labels.counter(STORE_ERRORS_TOTAL, &[("kind", k.as_str())])),
                retries: labels.counter(STORE_RETRIES_TOTAL, &[]),
            }
        }
    }

    struct BreakerHandles {
        state: Gauge,
        open_shards: Gauge,
        transitions: [Counter; 3],
    }

    struct LocalHandles {
        entries: Gauge,
        hits: Counter,
        misses: Counter,
    }

    /// Every series of the limiter's own quota, registered together.
    struct Handles {
        decisions: DecisionHandles,
        store: StoreHandles,
        breaker: Option<BreakerHandles>,
        local: Option<LocalHandles>,
    }

    /// What a limiter has, which decides the series it registers.
    #[derive(Debug, Clone, Copy, Default)]
    pub(crate) struct Parts {
        pub(crate) fallback: bool,
        pub(crate) breaker: bool,
        pub(crate) local: bool,
    }

    /// The metrics of one limiter.
    pub(crate) struct LimiterMetrics {
        /// The limiter's own quota: its decisions use the cached handles.
        own: Quota,
        quota: SharedString,
        tenant_label: bool,
        parts: Parts,
        handles: OnceLock<Handles>,
    }

    impl LimiterMetrics {
        pub(crate) fn new(quota: &Quota, tenant_label: bool, parts: Parts) -> Self {
            Self {
                own: quota.clone(),
                quota: SharedString::from(String::from(quota.name())),
                tenant_label,
                parts,
                handles: OnceLock::new(),
            }
        }

        fn own_labels(&self) -> Labels {
            Labels {
                quota: self.quota.clone(),
                tenant: None,
            }
        }

        /// The handles of the limiter's own quota, registered (at zero) on
        /// first use.
        fn handles(&self) -> &Handles {
            self.handles.get_or_init(|| {
                let labels = self.own_labels();
                let breaker = self.parts.breaker.then(|| {
                    let state = labels.gauge(BREAKER_STATE);
                    state.set(0.0);
                    let open_shards = labels.gauge(BREAKER_OPEN_SHARDS);
                    open_shards.set(0.0);
                    BreakerHandles {
                        state,
                        open_shards,
                        transitions: STATES.map(|s| {
                            labels.counter(BREAKER_TRANSITIONS_TOTAL, &[("to", s.as_str())])
                        }),
                    }
                });
                let local = self.parts.local.then(|| {
                    let entries = labels.gauge(LOCAL_CACHE_ENTRIES);
                    entries.set(0.0);
                    LocalHandles {
                        entries,
                        hits: labels.counter(LOCAL_CACHE_HITS_TOTAL, &[]),
                        misses: labels.counter(LOCAL_CACHE_MISSES_TOTAL, &[]),
                    }
                });
                Handles {
                    decisions: DecisionHandles::new(&labels, self.parts.fallback),
                    store: StoreHandles::new(&labels),
                    breaker,
                    local,
                }
            })
        }

        /// Whether `quota` is the limiter's own: its handles are cached.
        fn is_own(&self, quota: &Quota) -> bool {
            // Decisions of the limiter's own policy share its quota's
            // allocation: no text compared on the hot path.
            quota.same_allocation(&self.own) || quota.name() == &*self.quota
        }

        fn labels_for(&self, quota: &Quota, key: Option<&WindowKey>) -> Labels {
            let quota = if self.is_own(quota) {
                self.quota.clone()
            } else {
                SharedString::from(String::from(quota.name()))
            };
            let tenant = key
                .filter(|_| self.tenant_label)
                .map(|key| SharedString::from(String::from_utf8_lossy(key.tenant()).into_owned()));
            Labels { quota, tenant }
        }

        /// Records a decision returned to the caller.
        pub(crate) fn decision(&self, key: &WindowKey, decision: &Decision) {
            for shadow in decision.shadow_denials() {
                self.labels_for(&shadow.quota, Some(key))
                    .counter(SHADOW_DENIALS_TOTAL, &[])
                    .increment(1);
            }
            if !self.tenant_label && self.is_own(decision.quota()) {
                self.handles().decisions.record(decision);
            } else {
                // Make sure the limiter-wide series exist too.
                let _ = self.handles();
                let labels = self.labels_for(decision.quota(), Some(key));
                let outcome = outcome(decision.allowed);
                labels
                    .counter(
                        DECISIONS_TOTAL,
                        &[("outcome", outcome), ("source", decision.source.as_str())],
                    )
                    .increment(1);
                if decision.allowed && is_near_limit(decision.remaining, decision.limit()) {
                    labels.counter(NEAR_LIMIT_TOTAL, &[]).increment(1);
                }
                if let DecisionSource::Fallback(reason) = decision.source {
                    let reason = reason.as_str();
                    labels
                        .counter(
                            FALLBACK_DECISIONS_TOTAL,
                            &[("reason", reason), ("outcome", outcome)],
                        )
                        .increment(1);
                    if decision.allowed {
                        labels
                            .counter(FALLBACK_ADMISSIONS_TOTAL, &[("reason", reason)])
                            .increment(1);
                    }
                }
            }
        }

        /// Records a local-tier lookup.
        pub(crate) fn local_lookup(&self, quota: &Quota, hit: bool) {
            if self.is_own(quota) {
                if let Some(local) = &self.handles().local {
                    if hit {
                        local.hits.increment(1);
                    } else {
                        local.misses.increment(1);
                    }
                }
            } else {
                let name = if hit {
                    LOCAL_CACHE_HITS_TOTAL
                } else {
                    LOCAL_CACHE_MISSES_TOTAL
                };
                self.labels_for(quota, None).counter(name, &[]).increment(1);
            }
        }

        /// Sets the local tier's size.
        pub(crate) fn local_entries(&self, entries: u64) {
            if let Some(local) = &self.handles().local {
                // Precision loss only past 2^53 keys.
                #[allow(clippy::cast_precision_loss)]
                local.entries.set(entries as f64);
            }
        }

        /// Records one breaker's transition into `to`; after it, `worst`
        /// is the worst state over the limiter's breakers and `open` of
        /// them are open.
        pub(crate) fn breaker_transition(
            &self,
            to: BreakerState,
            worst: BreakerState,
            open: usize,
        ) {
            if let Some(breaker) = &self.handles().breaker {
                // Small integers: no precision loss.
                #[allow(clippy::cast_precision_loss)]
                {
                    breaker.state.set(state_index(worst) as f64);
                    breaker.open_shards.set(open as f64);
                }
                breaker.transitions[state_index(to)].increment(1);
            }
        }

        /// Records one retried store attempt.
        /// Counts `units` of leases of the limiter's policy for `event`
        /// (`granted`, `spent`, `refunded`, `expired`); off the hot path of
        /// a check without leases.
        pub(crate) fn lease_units(&self, quota: &Quota, event: &'static str, units: u64) {
            if units > 0 {
                self.labels_for(quota, None)
                    .counter(LEASE_UNITS_TOTAL, &[("event", event)])
                    .increment(units);
            }
        }

        pub(crate) fn store_retry(&self, quota: &Quota) {
            if self.is_own(quota) {
                self.handles().store.retries.increment(1);
            } else {
                self.labels_for(quota, None)
                    .counter(STORE_RETRIES_TOTAL, &[])
                    .increment(1);
            }
        }

        /// Records a finished store call started at `timer`.
        pub(crate) fn store_call(
            &self,
            quota: &Quota,
            timer: StoreTimer,
            error: Option<&StoreError>,
        ) {
            if timer.0.is_none() && error.is_none() {
                // An untimed success records nothing.
                return;
            }
            let seconds = timer.0.map(|started| started.elapsed().as_secs_f64());
            if self.is_own(quota) {
                let store = &self.handles().store;
                match error {
                    None => {
                        if let Some(seconds) = seconds {
                            store.ok.record(seconds);
                        }
                    }
                    Some(error) => {
                        if let Some(seconds) = seconds {
                            store.error.record(seconds);
                        }
                        store.errors[kind_index(error.kind())].increment(1);
                    }
                }
            } else {
                let labels = self.labels_for(quota, None);
                let outcome = if error.is_some() { "error" } else { "ok" };
                if let Some(seconds) = seconds {
                    labels
                        .histogram(STORE_CALL_DURATION_SECONDS, &[("outcome", outcome)])
                        .record(seconds);
                }
                if let Some(error) = error {
                    labels
                        .counter(STORE_ERRORS_TOTAL, &[("kind", error.kind().as_str())])
                        .increment(1);
                }
            }
        }
    }

    /// See [`super::register_quota`]: the same label sets the records use
    /// (built by the same handles), each incremented by zero.
    pub(crate) fn register_quota(quota: &str) {
        let labels = Labels {
            quota: SharedString::from(String::from(quota)),
            tenant: None,
        };
        let decisions = DecisionHandles::new(&labels, true);
        let fallback = decisions.fallback.iter();
        let counters = decisions
            .decisions
            .iter()
            .flatten()
            .chain(std::iter::once(&decisions.near_limit))
            .chain(fallback.clone().flat_map(|f| f.decisions.iter().flatten()))
            .chain(fallback.flat_map(|f| f.admissions.iter()));
        counters.for_each(|c| c.increment(0));
        // Histograms are exported from their registration on.
        let store = StoreHandles::new(&labels);
        store.errors.iter().for_each(|c| c.increment(0));
        store.retries.increment(0);
        for gauge in [BREAKER_STATE, BREAKER_OPEN_SHARDS, LOCAL_CACHE_ENTRIES] {
            labels.gauge(gauge).increment(0.0);
        }
        for state in STATES {
            labels
                .counter(BREAKER_TRANSITIONS_TOTAL, &[("to", state.as_str())])
                .increment(0);
        }
        for name in [
            LOCAL_CACHE_HITS_TOTAL,
            LOCAL_CACHE_MISSES_TOTAL,
            SHADOW_DENIALS_TOTAL,
        ] {
            labels.counter(name, &[]).increment(0);
        }
        for event in LEASE_EVENTS {
            labels
                .counter(LEASE_UNITS_TOTAL, &[("event", event)])
                .increment(0);
        }
    }

    /// When a store call started; `None` for a call that is not timed.
    pub(crate) struct StoreTimer(Option<Instant>);

    impl StoreTimer {
        /// Starts timing a store call, if `timed`. An in-process store
        /// decides in well under the histogram's smallest bucket; two clock
        /// readings would cost more than its whole call, so it is not timed.
        pub(crate) fn start(timed: bool) -> Self {
            Self(timed.then(Instant::now))
        }
    }
}

#[cfg(not(feature = "metrics"))]
mod imp {
    use crate::{BreakerState, Decision, Quota, StoreError, WindowKey};

    /// What a limiter has (unused without the feature).
    #[derive(Debug, Clone, Copy, Default)]
    #[allow(dead_code)]
    pub(crate) struct Parts {
        pub(crate) fallback: bool,
        pub(crate) breaker: bool,
        pub(crate) local: bool,
    }

    /// No metrics: every method is an empty inline function.
    pub(crate) struct LimiterMetrics;

    impl LimiterMetrics {
        #[inline(always)]
        pub(crate) fn new(_: &Quota, _: bool, _: Parts) -> Self {
            Self
        }
        #[inline(always)]
        pub(crate) fn decision(&self, _: &WindowKey, _: &Decision) {}
        #[inline(always)]
        pub(crate) fn local_lookup(&self, _: &Quota, _: bool) {}
        #[inline(always)]
        pub(crate) fn local_entries(&self, _: u64) {}
        #[inline(always)]
        pub(crate) fn breaker_transition(&self, _: BreakerState, _: BreakerState, _: usize) {}
        #[inline(always)]
        pub(crate) fn store_retry(&self, _: &Quota) {}

        pub(crate) fn lease_units(&self, _: &Quota, _: &'static str, _: u64) {}
        #[inline(always)]
        pub(crate) fn store_call(&self, _: &Quota, _: StoreTimer, _: Option<&StoreError>) {}
    }

    /// No timer without the feature.
    pub(crate) struct StoreTimer;

    impl StoreTimer {
        #[inline(always)]
        pub(crate) fn start(_: bool) -> Self {
            Self
        }
    }
}

// Dedup windows (`crate::dedup`): recorded by every `DedupWindow`.

/// Dedup answers by `outcome`: `first_seen`, `duplicate`, `fallback_first_seen`,
/// `fallback_duplicate`, `error`.
pub const DEDUP_CHECKS_TOTAL: &str = "tower_window_dedup_checks_total";

/// Every dedup and connection-lease metric name.
pub const WS_ALL: &[&str] = &[
    DEDUP_CHECKS_TOTAL,
    CONNECTION_GRANTS_TOTAL,
    CONNECTION_RELEASES_TOTAL,
    CONNECTION_LEASES_LOST_TOTAL,
    CONNECTION_RENEW_FAILURES_TOTAL,
    CONNECTION_HEARTBEAT_CALLS_TOTAL,
    CONNECTION_LIVE_LEASES,
];

/// Counts one dedup answer.
pub(crate) fn dedup_outcome(outcome: &'static str) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!(DEDUP_CHECKS_TOTAL, "outcome" => outcome).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = outcome;
}

// Connection leases (`crate::conn`): recorded by every `ConnectionLimiter`.

/// Connection grants by `outcome`: `granted`, `denied`, `fallback_granted`,
/// `fallback_denied`, `error`.
pub const CONNECTION_GRANTS_TOTAL: &str = "tower_window_connection_grants_total";
/// Connection leases released.
pub const CONNECTION_RELEASES_TOTAL: &str = "tower_window_connection_releases_total";
/// Leases a heartbeat found gone (expired or reset) and reported lost.
pub const CONNECTION_LEASES_LOST_TOTAL: &str = "tower_window_connection_leases_lost_total";
/// Leases whose heartbeat renewal call failed.
pub const CONNECTION_RENEW_FAILURES_TOTAL: &str = "tower_window_connection_renew_failures_total";
/// Store calls made by heartbeats.
pub const CONNECTION_HEARTBEAT_CALLS_TOTAL: &str = "tower_window_connection_heartbeat_calls_total";
/// Live leases this node renews.
pub const CONNECTION_LIVE_LEASES: &str = "tower_window_connection_live_leases";

/// Counts one grant.
pub(crate) fn connection_grant(outcome: &'static str) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!(CONNECTION_GRANTS_TOTAL, "outcome" => outcome).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = outcome;
}

/// Counts one release.
pub(crate) fn connection_released() {
    #[cfg(feature = "metrics")]
    ::metrics::counter!(CONNECTION_RELEASES_TOTAL).increment(1);
}

/// Records one heartbeat tick.
pub(crate) fn connection_heartbeat(report: &crate::conn::HeartbeatReport, live: usize) {
    #[cfg(feature = "metrics")]
    {
        ::metrics::counter!(CONNECTION_LEASES_LOST_TOTAL).increment(report.lost as u64);
        ::metrics::counter!(CONNECTION_RENEW_FAILURES_TOTAL).increment(report.failed as u64);
        ::metrics::counter!(CONNECTION_HEARTBEAT_CALLS_TOTAL).increment(report.calls as u64);
        ::metrics::gauge!(CONNECTION_LIVE_LEASES).set(live as f64);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (report, live);
}
