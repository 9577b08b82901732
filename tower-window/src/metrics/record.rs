//! Recording: each capability instance's handles, and what it records.
//! Without the `metrics` feature every entry point returns at once.

use std::borrow::Cow;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use ::metrics::{Counter, Gauge, Histogram, Label, SharedString};

use super::ENABLED;
use super::*;
use crate::{BreakerState, Decision, DecisionSource, FallbackReason, Policy, Quota, WindowKey};
use crate::{StoreError, StoreErrorKind};

const SOURCES: [DecisionSource; 4] = [
    DecisionSource::Store,
    DecisionSource::LocalCache,
    DecisionSource::Lease,
    DecisionSource::Fallback(FallbackReason::Error),
];
const REASONS: [FallbackReason; 5] = FallbackReason::ALL;
/// The kinds of a failed store call (an open breaker calls nothing).
const KINDS: [StoreErrorKind; 6] = [
    StoreErrorKind::Unavailable,
    StoreErrorKind::Timeout,
    StoreErrorKind::Overloaded,
    StoreErrorKind::Protocol,
    StoreErrorKind::InvalidRequest,
    StoreErrorKind::Unsupported,
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

/// The index of `value` in `all`, else `other`'s (a fallback source by any
/// reason is `Fallback(Error)`'s).
fn index_of<T: PartialEq>(all: &[T], value: &T, other: usize) -> usize {
    all.iter().position(|v| v == value).unwrap_or(other)
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

    fn histogram(&self, name: &'static str, extra: &[(&'static str, &'static str)]) -> Histogram {
        ::metrics::histogram!(name, self.build(extra))
    }
}

struct FallbackHandles {
    /// `[reason][allowed]`.
    decisions: [[Counter; 2]; 5],
    admissions: [Counter; 5],
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

/// Every series of one quota's [`Parts`], registered together.
struct Handles {
    /// `[allowed][source]`.
    decisions: [[Counter; 4]; 2],
    near_limit: Counter,
    fallback: Option<FallbackHandles>,
    store_ok: Histogram,
    store_error: Histogram,
    store_errors: [Counter; 6],
    store_retries: Counter,
    breaker: Option<BreakerHandles>,
    local: Option<LocalHandles>,
}

impl Handles {
    fn new(labels: &Labels, parts: Parts) -> Self {
        let decisions = [false, true].map(|allowed| {
            SOURCES.map(|s| {
                labels.counter(
                    DECISIONS_TOTAL,
                    &[("outcome", outcome(allowed)), ("source", s.as_str())],
                )
            })
        });
        let fallback = parts.fallback.then(|| FallbackHandles {
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
            store_ok: labels.histogram(STORE_CALL_DURATION_SECONDS, &[("outcome", "ok")]),
            store_error: labels.histogram(STORE_CALL_DURATION_SECONDS, &[("outcome", "error")]),
            store_errors: KINDS
                .map(|k| labels.counter(STORE_ERRORS_TOTAL, &[("kind", k.as_str())])),
            store_retries: labels.counter(STORE_RETRIES_TOTAL, &[]),
            breaker: parts.breaker.then(|| BreakerHandles {
                state: labels.gauge(BREAKER_STATE),
                open_shards: labels.gauge(BREAKER_OPEN_SHARDS),
                transitions: STATES
                    .map(|s| labels.counter(BREAKER_TRANSITIONS_TOTAL, &[("to", s.as_str())])),
            }),
            local: parts.local.then(|| LocalHandles {
                entries: labels.gauge(LOCAL_CACHE_ENTRIES),
                hits: labels.counter(LOCAL_CACHE_HITS_TOTAL, &[]),
                misses: labels.counter(LOCAL_CACHE_MISSES_TOTAL, &[]),
            }),
        }
    }

    fn record(&self, decision: &Decision) {
        let allowed = usize::from(decision.allowed);
        self.decisions[allowed][index_of(&SOURCES, &decision.source, 3)].increment(1);
        if decision.allowed && is_near_limit(decision.remaining, decision.limit()) {
            self.near_limit.increment(1);
        }
        if let (DecisionSource::Fallback(reason), Some(fallback)) =
            (decision.source, &self.fallback)
        {
            let r = index_of(&REASONS, &reason, 4);
            fallback.decisions[r][allowed].increment(1);
            if decision.allowed {
                fallback.admissions[r].increment(1);
            }
        }
    }

    fn counters(&self) -> impl Iterator<Item = &Counter> {
        let fallback = self.fallback.iter();
        self.decisions
            .iter()
            .flatten()
            .chain([&self.near_limit, &self.store_retries])
            .chain(fallback.clone().flat_map(|f| f.decisions.iter().flatten()))
            .chain(fallback.flat_map(|f| f.admissions.iter()))
            .chain(&self.store_errors)
            .chain(self.breaker.iter().flat_map(|b| b.transitions.iter()))
            .chain(self.local.iter().flat_map(|l| [&l.hits, &l.misses]))
    }

    fn gauges(&self) -> impl Iterator<Item = &Gauge> {
        let breaker = self.breaker.iter();
        breaker
            .flat_map(|b| [&b.state, &b.open_shards])
            .chain(self.local.iter().map(|l| &l.entries))
    }
}

/// What a limiter has, which decides the series it registers.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Parts {
    pub(crate) fallback: bool,
    pub(crate) breaker: bool,
    pub(crate) local: bool,
}

/// The metrics of one limiter, or of another capability under its name.
pub(crate) struct LimiterMetrics {
    /// The limiter's own quota: its decisions use the cached handles.
    own: Option<Quota>,
    quota: SharedString,
    tenant_label: bool,
    parts: Parts,
    handles: OnceLock<Handles>,
    /// The own quota's `spent` lease units, looked up once (a spend is a
    /// memory-speed admission).
    lease_spent: OnceLock<Counter>,
    /// Counters of the other quotas this limiter decides (policies passed
    /// to each check), found without building labels or asking the
    /// recorder's registry.
    others: OnceLock<quick_cache::sync::Cache<OtherKey, Counter>>,
}

/// How many counters of other quotas a limiter keeps (~300 quotas).
const OTHERS: usize = 4_096;

/// A counter of another quota: its name, the series and the values of
/// its (at most two) extra labels.
#[derive(Hash, PartialEq, Eq)]
struct OtherKey {
    quota: Box<str>,
    series: &'static str,
    values: [&'static str; 2],
}

/// [`OtherKey`] borrowed, to look one up without allocating (same fields,
/// same hash).
#[derive(Hash)]
struct OtherKeyRef<'a> {
    quota: &'a str,
    series: &'static str,
    values: [&'static str; 2],
}

impl quick_cache::Equivalent<OtherKey> for OtherKeyRef<'_> {
    fn equivalent(&self, key: &OtherKey) -> bool {
        self.quota == &*key.quota && self.series == key.series && self.values == key.values
    }
}

impl LimiterMetrics {
    pub(crate) fn new(quota: &Quota, tenant_label: bool, parts: Parts) -> Self {
        Self {
            own: Some(quota.clone()),
            tenant_label,
            parts,
            ..Self::with_name(quota.name())
        }
    }

    /// The store-call metrics of a capability (`connections`, `dedup`, ...),
    /// labelled `quota = name`.
    pub(crate) fn named(name: &str) -> Arc<Self> {
        Arc::new(Self::with_name(name))
    }

    fn with_name(name: &str) -> Self {
        Self {
            own: None,
            quota: SharedString::from(String::from(name)),
            tenant_label: false,
            parts: Parts::default(),
            handles: OnceLock::new(),
            lease_spent: OnceLock::new(),
            others: OnceLock::new(),
        }
    }

    /// The handles of the limiter's own quota, registered (at zero) on
    /// first use.
    fn handles(&self) -> &Handles {
        self.handles.get_or_init(|| {
            let handles = Handles::new(&self.labels_for(None, None), self.parts);
            handles.gauges().for_each(|gauge| gauge.set(0.0));
            handles
        })
    }

    /// Whether `quota` is the limiter's own: its handles are cached.
    fn is_own(&self, quota: &Quota) -> bool {
        // The own policy's decisions share its quota's allocation.
        self.own
            .as_ref()
            .is_some_and(|own| quota.same_allocation(own))
            || quota.name() == &*self.quota
    }

    /// The labels of `quota` (`None`: the own name), with `key`'s tenant
    /// when the limiter labels tenants.
    fn labels_for(&self, quota: Option<&Quota>, key: Option<&WindowKey>) -> Labels {
        let quota = match quota {
            Some(quota) if !self.is_own(quota) => SharedString::from(String::from(quota.name())),
            _ => self.quota.clone(),
        };
        let tenant = key
            .filter(|_| self.tenant_label)
            .map(|key| SharedString::from(String::from_utf8_lossy(key.tenant()).into_owned()));
        Labels { quota, tenant }
    }

    /// The counter `series{extra, quota}` of `quota` (not the own one),
    /// from the cache when the labels are the quota's alone (no tenant).
    fn other_counter(
        &self,
        quota: &Quota,
        key: Option<&WindowKey>,
        series: &'static str,
        extra: &[(&'static str, &'static str)],
    ) -> Counter {
        if (self.tenant_label && key.is_some()) || extra.len() > 2 {
            return self.labels_for(Some(quota), key).counter(series, extra);
        }
        let mut values = [""; 2];
        for (value, (_, v)) in values.iter_mut().zip(extra) {
            *value = v;
        }
        let cache = self
            .others
            .get_or_init(|| quick_cache::sync::Cache::new(OTHERS));
        let probe = OtherKeyRef {
            quota: quota.name(),
            series,
            values,
        };
        if let Some(counter) = cache.get(&probe) {
            return counter;
        }
        let counter = self.labels_for(Some(quota), None).counter(series, extra);
        cache.insert(
            OtherKey {
                quota: quota.name().into(),
                series,
                values,
            },
            counter.clone(),
        );
        counter
    }

    /// Records a decision returned to the caller.
    pub(crate) fn decision(&self, key: &WindowKey, decision: &Decision) {
        if !ENABLED {
            return;
        }
        for shadow in decision.shadow_denials() {
            self.labels_for(Some(&shadow.quota), Some(key))
                .counter(SHADOW_DENIALS_TOTAL, &[])
                .increment(1);
        }
        if !self.tenant_label && self.is_own(decision.quota()) {
            self.handles().record(decision);
        } else {
            // Make sure the limiter-wide series exist too.
            let _ = self.handles();
            let count = |series: &'static str, extra: &[(&'static str, &'static str)]| {
                self.other_counter(decision.quota(), Some(key), series, extra)
                    .increment(1);
            };
            let outcome = outcome(decision.allowed);
            let source = decision.source.as_str();
            count(DECISIONS_TOTAL, &[("outcome", outcome), ("source", source)]);
            if decision.allowed && is_near_limit(decision.remaining, decision.limit()) {
                count(NEAR_LIMIT_TOTAL, &[]);
            }
            if let DecisionSource::Fallback(reason) = decision.source {
                let reason = reason.as_str();
                count(
                    FALLBACK_DECISIONS_TOTAL,
                    &[("reason", reason), ("outcome", outcome)],
                );
                if decision.allowed {
                    count(FALLBACK_ADMISSIONS_TOTAL, &[("reason", reason)]);
                }
            }
        }
    }

    /// Records a local-tier lookup.
    pub(crate) fn local_lookup(&self, quota: &Quota, hit: bool) {
        if !ENABLED {
            return;
        }
        if self.is_own(quota) {
            if let Some(local) = &self.handles().local {
                let counter = if hit { &local.hits } else { &local.misses };
                counter.increment(1);
            }
        } else {
            let name = if hit {
                LOCAL_CACHE_HITS_TOTAL
            } else {
                LOCAL_CACHE_MISSES_TOTAL
            };
            self.other_counter(quota, None, name, &[]).increment(1);
        }
    }

    /// Sets the local tier's size.
    pub(crate) fn local_entries(&self, entries: u64) {
        if !ENABLED {
            return;
        }
        if let Some(local) = &self.handles().local {
            // Precision loss only past 2^53 keys.
            #[allow(clippy::cast_precision_loss)]
            local.entries.set(entries as f64);
        }
    }

    /// Records one breaker's transition into `to`, then the state.
    pub(crate) fn breaker_transition(&self, to: BreakerState, worst: BreakerState, open: usize) {
        if !ENABLED {
            return;
        }
        self.breaker_state(worst, open);
        if let Some(breaker) = &self.handles().breaker {
            breaker.transitions[index_of(&STATES, &to, 2)].increment(1);
        }
    }

    /// Sets the breakers' state: `worst` over them, `open` of them open.
    pub(crate) fn breaker_state(&self, worst: BreakerState, open: usize) {
        if !ENABLED {
            return;
        }
        if let Some(breaker) = &self.handles().breaker {
            // Small integers: no precision loss.
            #[allow(clippy::cast_precision_loss)]
            {
                breaker.state.set(index_of(&STATES, &worst, 2) as f64);
                breaker.open_shards.set(open as f64);
            }
        }
    }

    /// Counts `units` of leases for `event` (see [`LEASE_UNITS_TOTAL`]).
    pub(crate) fn lease_units(&self, quota: &Quota, event: &'static str, units: u64) {
        if !ENABLED || units == 0 {
            return;
        }
        if event == "spent" && self.is_own(quota) {
            self.lease_spent
                .get_or_init(|| {
                    self.labels_for(None, None)
                        .counter(LEASE_UNITS_TOTAL, &[("event", "spent")])
                })
                .increment(units);
            return;
        }
        self.other_counter(quota, None, LEASE_UNITS_TOTAL, &[("event", event)])
            .increment(units);
    }

    fn store_retry(&self, quota: Option<&Quota>) {
        match quota.filter(|quota| !self.is_own(quota)) {
            Some(other) => self
                .other_counter(other, None, STORE_RETRIES_TOTAL, &[])
                .increment(1),
            None => self.handles().store_retries.increment(1),
        }
    }

    fn store_call(&self, quota: Option<&Quota>, seconds: Option<f64>, error: Option<&StoreError>) {
        if quota.is_none_or(|quota| self.is_own(quota)) {
            let handles = self.handles();
            if let Some(seconds) = seconds {
                let histogram = match error {
                    None => &handles.store_ok,
                    Some(_) => &handles.store_error,
                };
                histogram.record(seconds);
            }
            if let Some(error) = error {
                handles.store_errors[index_of(&KINDS, &error.kind(), 3)].increment(1);
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

/// Registers, at zero, every series (every label value, no tenant) a
/// limiter records for the quota named `quota`, so dashboards chart zero
/// rather than "No data" for quotas not yet checked. Harmless to repeat.
pub fn register_quota(quota: &str) {
    if !ENABLED {
        return;
    }
    let labels = Labels {
        quota: SharedString::from(String::from(quota)),
        tenant: None,
    };
    let all = Parts {
        fallback: true,
        breaker: true,
        local: true,
    };
    // Histograms are exported from their registration on.
    let handles = Handles::new(&labels, all);
    handles.counters().for_each(|counter| counter.increment(0));
    handles.gauges().for_each(|gauge| gauge.increment(0.0));
    labels.counter(SHADOW_DENIALS_TOTAL, &[]).increment(0);
    for event in LEASE_EVENTS {
        labels
            .counter(LEASE_UNITS_TOTAL, &[("event", event)])
            .increment(0);
    }
}

/// Where one store call's metrics go: a limiter's series under the call's
/// quota (`None`: its own name), or nowhere (the default).
#[derive(Clone, Default)]
pub(crate) struct Calls<'a> {
    metrics: Option<Cow<'a, Arc<LimiterMetrics>>>,
    quota: Option<Cow<'a, Quota>>,
    /// The policy the call is for, named in a failure's log line.
    policy: Option<Cow<'a, Policy>>,
}

impl<'a> Calls<'a> {
    /// Calls recorded in `metrics`, under `quota`.
    pub(crate) fn to(metrics: &'a Arc<LimiterMetrics>, quota: Option<&'a Quota>) -> Self {
        Self {
            metrics: Some(Cow::Borrowed(metrics)),
            quota: quota.map(Cow::Borrowed),
            policy: None,
        }
    }

    /// The same calls, for `policy`.
    pub(crate) fn for_policy(self, policy: &'a Policy) -> Self {
        Self {
            policy: Some(Cow::Borrowed(policy)),
            ..self
        }
    }

    /// The same calls, owning what they name (reference counts).
    pub(crate) fn to_owned(&self) -> Calls<'static> {
        fn own<T: Clone>(cow: &Option<Cow<'_, T>>) -> Option<Cow<'static, T>> {
            cow.as_deref().map(|value| Cow::Owned(value.clone()))
        }
        Calls {
            metrics: own(&self.metrics),
            quota: own(&self.quota),
            policy: own(&self.policy),
        }
    }

    /// What a failed call's log line names: the policy, else the capability.
    pub(crate) fn owner(&self) -> &str {
        match (&self.policy, &self.metrics) {
            (Some(policy), _) => policy.name(),
            (None, Some(metrics)) => &metrics.quota,
            (None, None) => "",
        }
    }

    /// Records a finished store call started at `timer`.
    #[inline]
    pub(crate) fn store_call(&self, timer: StoreTimer, error: Option<&StoreError>) {
        // An untimed success (an in-process store) records nothing.
        if !ENABLED || (timer.0.is_none() && error.is_none()) {
            return;
        }
        if let Some(metrics) = &self.metrics {
            let seconds = timer.0.map(|started| started.elapsed().as_secs_f64());
            metrics.store_call(self.quota.as_deref(), seconds, error);
        }
    }

    /// Records one retried store attempt.
    pub(crate) fn store_retry(&self) {
        if let Some(metrics) = self.metrics.as_ref().filter(|_| ENABLED) {
            metrics.store_retry(self.quota.as_deref());
        }
    }
}

/// When a store call started; `None` for a call that is not timed.
pub(crate) struct StoreTimer(Option<Instant>);

impl StoreTimer {
    /// Starts timing a store call, if `timed` (not for an in-process store,
    /// where two clock readings cost more than the call).
    pub(crate) fn start(timed: bool) -> Self {
        Self((timed && ENABLED).then(Instant::now))
    }
}

/// Whether an admission left less than 20 % of `limit`.
pub(crate) fn is_near_limit(remaining: u32, limit: u32) -> bool {
    u64::from(remaining) * 5 < u64::from(limit)
}
