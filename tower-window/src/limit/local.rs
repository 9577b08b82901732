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
    cost: u32,
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
    pub(crate) fn lookup(
        &self,
        key: &WindowKey,
        policy: &Policy,
        cost: u32,
        quota_costs: Option<&[Cost]>,
    ) -> Lookup {
        let lookup = self.find(key, policy, cost, quota_costs);
        if let Some(metrics) = &self.metrics {
            metrics.local_lookup(policy.first(), matches!(lookup, Lookup::Hit(_)));
        }
        lookup
    }

    fn find(
        &self,
        key: &WindowKey,
        policy: &Policy,
        cost: u32,
        quota_costs: Option<&[Cost]>,
    ) -> Lookup {
        let Some(denied) = self.cache.get(&StateKeyRef::for_policy(key, policy)) else {
            return Lookup::Miss { stale: false };
        };
        let now = self.clock.now_micros();
        if now >= denied.until_micros || denied.expires.is_some_and(|t| Instant::now() >= t) {
            return Lookup::Miss { stale: true };
        }
        if !denied.covers(cost, quota_costs, policy.len()) {
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

    /// Remembers a store denial that says when the same cost fits again.
    pub(crate) fn remember(
        &self,
        key: &WindowKey,
        policy: &Policy,
        cost: u32,
        quota_costs: Option<&[Cost]>,
        decision: &Decision,
    ) {
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
            cost,
            quota_costs: quota_costs.map(Box::from),
            decision: decision.clone(),
            expires: Instant::now().checked_add(retry_after),
        };
        self.cache
            .insert(StateKey::for_policy(key, policy), Arc::new(denied));
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
    /// Whether a check asks at least as much in each of the `quotas` as
    /// the denied one (then it is denied too, for at least as long).
    fn covers(&self, cost: u32, quota_costs: Option<&[Cost]>, quotas: usize) -> bool {
        if self.quota_costs.is_none() && quota_costs.is_none() {
            return cost >= self.cost;
        }
        let of = |costs: Option<&[Cost]>, all: u32, i: usize| {
            costs.and_then(|c| c.get(i)).map_or(all, |c| c.get())
        };
        (0..quotas)
            .all(|i| of(quota_costs, cost, i) >= of(self.quota_costs.as_deref(), self.cost, i))
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
            &key,
            &policy,
            1,
            None,
            &denial(&quota, Duration::from_secs(30)),
        );
        let Lookup::Hit(d) = tier.lookup(&key, &policy, 1, None) else {
            panic!("expected a hit")
        };
        assert!(!d.allowed);
        assert_eq!(d.source, DecisionSource::LocalCache);
        assert_eq!(d.retry_after, Some(Duration::from_secs(30)));
        assert_eq!(d.timestamp_micros, 1_000_000_000);
        clock.advance(Duration::from_secs(10));
        let Lookup::Hit(d) = tier.lookup(&key, &policy, 5, None) else {
            panic!("expected a hit")
        };
        assert_eq!(d.retry_after, Some(Duration::from_secs(20)));
        clock.advance(Duration::from_secs(20));
        assert!(matches!(
            tier.lookup(&key, &policy, 1, None),
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
            &key,
            &policy,
            3,
            None,
            &denial(&quota, Duration::from_secs(30)),
        );
        assert!(matches!(
            tier.lookup(&key, &policy, 2, None),
            Lookup::Miss { .. }
        ));
        assert!(matches!(
            tier.lookup(&key, &other, 3, None),
            Lookup::Miss { .. }
        ));
        assert!(matches!(
            tier.lookup(&WindowKey::for_subject("b"), &policy, 3, None),
            Lookup::Miss { .. }
        ));
        assert!(matches!(
            tier.lookup(&key, &policy, 3, None),
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
            &key,
            &policy,
            1,
            None,
            &Decision::allow(quota.clone(), 4, Duration::from_secs(1)),
        );
        tier.remember(
            &key,
            &policy,
            9,
            None,
            &Decision::deny(quota.clone(), 5, Duration::ZERO, None),
        );
        assert_eq!(tier.len(), 0);
    }
}
