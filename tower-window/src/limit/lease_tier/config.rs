//! [`LeaseConfig`]: how a limiter leases.

use std::time::Duration;

use crate::Policy;

/// How a [`Limiter`](crate::Limiter) leases quota (see the
/// [lease module](crate::lease) for the guarantees).
///
/// ```
/// use std::time::Duration;
/// use tower_window::{LeaseConfig, Policy, Quota};
///
/// let policy = Policy::from("1000/1m".parse::<Quota>()?);
/// let config = LeaseConfig::new(100);
/// assert_eq!(config.max_units(), 100);
/// // By default a tenth of the shortest window, at most one second.
/// assert_eq!(config.ttl_for(&policy), Duration::from_secs(1));
/// let config = config.ttl(Duration::from_millis(200));
/// assert_eq!(config.ttl_for(&policy), Duration::from_millis(200));
/// // A key leases once it is checked 8 times within one lease TTL, and
/// // refills its lease when half of it is left.
/// assert_eq!(config.hot_checks(), LeaseConfig::DEFAULT_HOT_CHECKS);
/// assert!(config.refills_ahead());
/// # Ok::<(), tower_window::QuotaError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseConfig {
    pub(crate) max_units: u32,
    ttl: Option<Duration>,
    pub(crate) hot_checks: u32,
    pub(crate) refill_ahead: bool,
}

impl LeaseConfig {
    /// The longest default lease TTL.
    pub const MAX_DEFAULT_TTL: Duration = Duration::from_secs(1);

    /// How many checks within one lease TTL make a key hot enough to lease
    /// (see [`hot_after`](Self::hot_after)).
    pub const DEFAULT_HOT_CHECKS: u32 = 8;

    /// Leases of at most `max_units` units (0 turns leases off).
    pub fn new(max_units: u32) -> Self {
        Self {
            max_units,
            ttl: None,
            hot_checks: Self::DEFAULT_HOT_CHECKS,
            refill_ahead: true,
        }
    }

    /// How long a lease may be spent (default: a tenth of the policy's
    /// shortest window, at most [`MAX_DEFAULT_TTL`](Self::MAX_DEFAULT_TTL)).
    /// The store shortens it to the end of the window or bucket where the
    /// algorithm needs it.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// Leases only keys checked at least `checks` times within one lease
    /// TTL (default [`DEFAULT_HOT_CHECKS`](Self::DEFAULT_HOT_CHECKS)); the
    /// checks of other keys go to the store directly. `0` or `1`: every key
    /// leases from its first check.
    ///
    /// A lease costs a reservation and often a refund, which pay only for a
    /// key that spends it several times. Checks are counted per key and
    /// policy over the current and the previous TTL-long period, in a fixed
    /// table of about 32,000 keys: a key pushed out counts from zero again
    /// (more store calls, never less exactness). A leased key that cools
    /// gives back what its leases left.
    ///
    /// ```
    /// use tower_window::LeaseConfig;
    ///
    /// assert_eq!(LeaseConfig::new(100).hot_after(1).hot_checks(), 1);
    /// ```
    pub fn hot_after(mut self, checks: u32) -> Self {
        self.hot_checks = checks;
        self
    }

    /// Whether a hot key reserves its next lease ahead of need (default
    /// on): the check that leaves half of the lease or less starts the next
    /// reservation while others keep spending, so checks wait for the store
    /// only when the lease runs dry first. Off, a key reserves only when
    /// its lease is empty.
    pub fn refill_ahead(mut self, on: bool) -> Self {
        self.refill_ahead = on;
        self
    }

    /// The largest lease, in units.
    pub fn max_units(&self) -> u32 {
        self.max_units
    }

    /// See [`hot_after`](Self::hot_after).
    pub fn hot_checks(&self) -> u32 {
        self.hot_checks
    }

    /// See [`refill_ahead`](Self::refill_ahead).
    pub fn refills_ahead(&self) -> bool {
        self.refill_ahead
    }

    /// The TTL used for leases under `policy`.
    pub fn ttl_for(&self, policy: &Policy) -> Duration {
        if let Some(ttl) = self.ttl {
            return ttl;
        }
        (policy.shortest_window() / 10)
            .min(Self::MAX_DEFAULT_TTL)
            .max(Duration::from_micros(1))
    }

    /// [`ttl_for`](Self::ttl_for) in whole µs, without `Duration`
    /// arithmetic (on every leased check).
    pub(crate) fn ttl_micros_for(&self, policy: &Policy) -> u64 {
        match self.ttl {
            Some(ttl) => crate::clock::duration_micros(ttl),
            // Floored like `ttl_for` (nested floor divisions agree).
            None => (policy.shortest_window_micros() / 10).clamp(1, MAX_DEFAULT_TTL_MICROS),
        }
    }

    /// Checks that leases of this TTL can be granted under `policy`: a
    /// GCRA quota dates leased tokens at the deadline, so a TTL above
    /// `(burst - 1)` emission intervals never could.
    pub fn validate(&self, policy: &Policy) -> Result<(), crate::StoreError> {
        let ttl = crate::clock::duration_micros(self.ttl_for(policy));
        crate::algorithm::lease::check_ttl(policy, ttl)
    }
}

/// [`LeaseConfig::MAX_DEFAULT_TTL`] in µs.
const MAX_DEFAULT_TTL_MICROS: u64 = 1_000_000;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Quota;

    /// The µs TTL every leased check uses is `ttl_for`'s, floored alike.
    #[test]
    fn ttl_micros_agree_with_ttl_for() {
        assert_eq!(
            u128::from(MAX_DEFAULT_TTL_MICROS),
            LeaseConfig::MAX_DEFAULT_TTL.as_micros()
        );
        for dsl in [
            "10/1s", "10/1m", "10/1h", "10/7ms", "10/1ms", "10/3s", "10/1d",
        ] {
            let policy = Policy::from(dsl.parse::<Quota>().expect("a valid quota"));
            for config in [
                LeaseConfig::new(10),
                LeaseConfig::new(10).ttl(Duration::from_nanos(2_500_999)),
            ] {
                let ttl = u64::try_from(config.ttl_for(&policy).as_micros()).unwrap_or(u64::MAX);
                assert_eq!(config.ttl_micros_for(&policy), ttl, "{dsl} {config:?}");
            }
        }
    }
}
