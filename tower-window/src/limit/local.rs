//! The local tier: a bounded per-node memory of recent store denials.
//!
//! After the store denies a key with `retry_after = T`, checks of that key
//! and policy of at least the same cost (in every quota) are denied locally
//! until `now + T`. It only repeats the store's denials, so it never admits
//! what the store would not. Expiry is inside the values: an expired denial
//! reads as a stale miss and is overwritten by the next denial or dropped
//! by the next admission.

use std::sync::Arc;
use std::time::{Duration, Instant};

use quick_cache::sync::{Cache, DefaultLifecycle};
use quick_cache::{DefaultHashBuilder, UnitWeighter};

use crate::clock::duration_micros;
use crate::key::state_key::{bounded_options, StateKey, StateKeyRef};
use crate::metrics::LimiterMetrics;
use crate::store::CheckRequest;
use crate::{Clock, Cost, Decision, DecisionSource, Policy, WindowKey};

/// Default number of keys the local tier remembers.
pub(crate) const DEFAULT_LOCAL_CAPACITY: u64 = 100_000;

#[derive(Debug)]
struct Denied {
    /// Until when (µs) requests of at least `cost` are denied.
    until_micros: u64,
    /// When (µs) the store denied.
    at_micros: u64,
    /// The cost denied (the largest, with `quota_costs`).
    cost: Cost,
    quota_costs: Option<Box<[Cost]>>,
    decision: Decision,
    /// `retry_after` after the denial in real time: past it the entry reads
    /// as absent even if the limiter's clock stepped back (`None`: beyond
    /// what `Instant` can represent).
    expires: Option<Instant>,
}

pub(crate) struct LocalTier {
    cache: Cache<StateKey, Arc<Denied>>,
    capacity: u64,
    clock: Arc<dyn Clock>,
    metrics: Option<Arc<LimiterMetrics>>,
}

#[allow(clippy::large_enum_variant)] // returned and matched at once; boxing would allocate per hit
pub(crate) enum Lookup {
    /// A remembered denial answers this check.
    Hit(Decision),
    /// Nothing applies; `stale`: an expired denial is held.
    Miss { stale: bool },
}

impl LocalTier {
    pub(crate) fn new(capacity: u64, clock: Arc<dyn Clock>) -> Self {
        Self {
            cache: Cache::with_options(
                bounded_options(capacity),
                UnitWeighter,
                DefaultHashBuilder::default(),
                DefaultLifecycle::default(),
            ),
            capacity,
            clock,
            metrics: None,
        }
    }

    /// Reports lookups and the tier's size to `metrics`.
    pub(crate) fn with_metrics(mut self, metrics: Arc<LimiterMetrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Answers a check locally if the store recently denied at most this
    /// cost (each quota's, with `quota_costs`), and counts the hit or miss.
    pub(crate) fn lookup(&self, request: CheckRequest<'_>) -> Lookup {
        let lookup = self.find(request);
        if let Some(metrics) = &self.metrics {
            metrics.local_lookup(request.policy.first(), matches!(lookup, Lookup::Hit(_)));
        }
        lookup
    }

    fn find(&self, request: CheckRequest<'_>) -> Lookup {
        let key = StateKeyRef::for_policy(request.key, request.policy);
        let Some(denied) = self.cache.get(&key) else {
            return Lookup::Miss { stale: false };
        };
        let now = self.clock.now_micros();
        if now >= denied.until_micros || denied.expires.is_some_and(|t| Instant::now() >= t) {
            return Lookup::Miss { stale: true };
        }
        if !denied.covers(request) {
            // A cheaper request may already fit: ask the store.
            return Lookup::Miss { stale: false };
        }
        let retry_after = Duration::from_micros(denied.until_micros - now);
        let elapsed = Duration::from_micros(now.saturating_sub(denied.at_micros));
        let decision = denied
            .decision
            .clone()
            .aged(elapsed, retry_after)
            .with_source(DecisionSource::LocalCache)
            .with_timestamp_micros(now);
        Lookup::Hit(decision)
    }

    /// Remembers a store denial of `request` that says when the same cost
    /// fits again.
    pub(crate) fn remember(&self, request: CheckRequest<'_>, decision: &Decision) {
        // `None`: the cost can never fit, there is nothing to wait for.
        let wait = decision
            .retry_after
            .filter(|r| !decision.allowed && !r.is_zero());
        let Some(retry_after) = wait else {
            return;
        };
        let now = self.clock.now_micros();
        let wait = duration_micros(retry_after);
        let denied = Denied {
            until_micros: now.saturating_add(wait),
            at_micros: now,
            cost: request.cost,
            quota_costs: request.quota_costs.map(Box::from),
            decision: decision.clone(),
            expires: Instant::now().checked_add(retry_after),
        };
        let key = StateKey::for_policy(request.key, request.policy);
        self.cache.insert(key, Arc::new(denied));
        self.report_size();
    }

    /// Forgets a key whose remembered denial is over.
    pub(crate) fn forget(&self, key: &WindowKey, policy: &Policy) {
        self.cache.remove(&StateKeyRef::for_policy(key, policy));
        self.report_size();
    }

    /// Sets the size gauge (after a store call, never on a local answer's
    /// path).
    fn report_size(&self) {
        if self.metrics.is_some() {
            self.len();
        }
    }

    /// Keys held, expired denials included (also sets the size gauge).
    pub(crate) fn len(&self) -> u64 {
        let entries = self.cache.len() as u64;
        if let Some(metrics) = &self.metrics {
            metrics.local_entries(entries);
        }
        entries
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.capacity
    }
}

impl Denied {
    /// Whether `request` asks at least as much in each quota as the denied
    /// one (then it is denied too, for at least as long).
    fn covers(&self, request: CheckRequest<'_>) -> bool {
        if self.quota_costs.is_none() && request.quota_costs.is_none() {
            return request.cost >= self.cost;
        }
        let denied = |i: usize| self.quota_costs.as_ref().and_then(|c| c.get(i).copied());
        (0..request.policy.len()).all(|i| request.cost_of(i) >= denied(i).unwrap_or(self.cost))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::{ManualClock, Quota};

    fn tier(capacity: u64) -> (LocalTier, ManualClock) {
        let clock = ManualClock::new(1_000_000_000);
        (LocalTier::new(capacity, Arc::new(clock.clone())), clock)
    }

    fn request<'a>(key: &'a WindowKey, policy: &'a Policy, cost: u32) -> CheckRequest<'a> {
        CheckRequest::new(key, policy, Cost::new(cost).unwrap())
    }

    fn denial(quota: &Quota, retry: Duration) -> Decision {
        Decision::deny(quota.clone(), 0, retry * 2, Some(retry))
    }

    #[test]
    fn remembers_until_retry_after() {
        let (tier, clock) = tier(10);
        let quota: Quota = "1/1s".parse().unwrap();
        let policy = Policy::from(quota.clone());
        let key = WindowKey::for_subject("a");
        tier.remember(
            request(&key, &policy, 1),
            &denial(&quota, Duration::from_secs(30)),
        );
        let Lookup::Hit(d) = tier.lookup(request(&key, &policy, 1)) else {
            panic!("expected a hit")
        };
        assert!(!d.allowed);
        assert_eq!(d.source, DecisionSource::LocalCache);
        assert_eq!(d.retry_after, Some(Duration::from_secs(30)));
        assert_eq!(d.timestamp_micros, 1_000_000_000);
        clock.advance(Duration::from_secs(10));
        let Lookup::Hit(d) = tier.lookup(request(&key, &policy, 5)) else {
            panic!("expected a hit")
        };
        assert_eq!(d.retry_after, Some(Duration::from_secs(20)));
        clock.advance(Duration::from_secs(20));
        assert!(matches!(
            tier.lookup(request(&key, &policy, 1)),
            Lookup::Miss { stale: true }
        ));
    }

    #[test]
    fn cheaper_requests_and_other_quotas_miss() {
        let (tier, _clock) = tier(10);
        let quota: Quota = "5/1s".parse().unwrap();
        let policy = Policy::from(quota.clone());
        let other = Policy::from("5/1s".parse::<Quota>().unwrap().named("other").unwrap());
        let key = WindowKey::for_subject("a");
        tier.remember(
            request(&key, &policy, 3),
            &denial(&quota, Duration::from_secs(30)),
        );
        assert!(matches!(
            tier.lookup(request(&key, &policy, 2)),
            Lookup::Miss { .. }
        ));
        assert!(matches!(
            tier.lookup(request(&key, &other, 3)),
            Lookup::Miss { .. }
        ));
        assert!(matches!(
            tier.lookup(request(&WindowKey::for_subject("b"), &policy, 3)),
            Lookup::Miss { .. }
        ));
        assert!(matches!(
            tier.lookup(request(&key, &policy, 3)),
            Lookup::Hit(_)
        ));
    }

    #[test]
    fn never_remembers_admissions_or_impossible_costs() {
        let (tier, _clock) = tier(10);
        let quota: Quota = "5/1s".parse().unwrap();
        let policy = Policy::from(quota.clone());
        let key = WindowKey::for_subject("a");
        tier.remember(
            request(&key, &policy, 1),
            &Decision::allow(quota.clone(), 4, Duration::from_secs(1)),
        );
        tier.remember(
            request(&key, &policy, 9),
            &Decision::deny(quota.clone(), 5, Duration::ZERO, None),
        );
        assert_eq!(tier.len(), 0);
    }
}
