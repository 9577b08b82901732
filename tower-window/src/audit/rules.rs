//! [`AuditRules`]: which decisions a tenant's audit trail records.

use std::sync::atomic::{AtomicU64, Ordering};

use super::record::AuditOutcome;
use crate::Decision;

/// Which decisions are recorded, per tenant (see
/// [`AuditLog::set_tenant_rules`](super::AuditLog::set_tenant_rules)).
///
/// The default records denials, degraded (fallback) decisions, shadow
/// denials and admin changes, and no plain admissions.
///
/// ```
/// use tower_window::audit::AuditRules;
///
/// let rules = AuditRules::default().sample_admissions(100); // and 1 admission in 100
/// assert!(rules.denials && rules.admin);
/// assert_eq!(rules.admission_sample, 100);
/// assert!(!AuditRules::none().denials);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default, deny_unknown_fields))]
#[non_exhaustive]
pub struct AuditRules {
    /// Denials by an enforced quota.
    pub denials: bool,
    /// Decisions of the fallback policy (admitted or denied).
    pub degraded: bool,
    /// Admissions a shadow quota would have denied.
    pub shadow_denials: bool,
    /// Admin changes to the tenant (put, reset, delete, reload).
    pub admin: bool,
    /// Records one admission in this many (0: none).
    pub admission_sample: u32,
}

impl Default for AuditRules {
    fn default() -> Self {
        Self {
            denials: true,
            degraded: true,
            shadow_denials: true,
            admin: true,
            admission_sample: 0,
        }
    }
}

impl AuditRules {
    /// Records nothing.
    pub const fn none() -> Self {
        Self {
            denials: false,
            degraded: false,
            shadow_denials: false,
            admin: false,
            admission_sample: 0,
        }
    }

    /// Also records one admission in `n` (0: none).
    pub const fn sample_admissions(mut self, n: u32) -> Self {
        self.admission_sample = n;
        self
    }

    /// The outcome to record `decision` under, if these rules record it;
    /// `admissions` counts admissions for sampling.
    pub(crate) fn outcome(
        &self,
        decision: &Decision,
        admissions: &AtomicU64,
    ) -> Option<AuditOutcome> {
        let shadow = decision.shadow_denials().next().is_some();
        let outcome = if !decision.allowed() {
            AuditOutcome::Denied
        } else if shadow && self.shadow_denials {
            AuditOutcome::ShadowDenied
        } else {
            AuditOutcome::Allowed
        };
        let sampled = || {
            let n = u64::from(self.admission_sample);
            n != 0 && admissions.fetch_add(1, Ordering::Relaxed).is_multiple_of(n)
        };
        let wanted = (decision.is_degraded() && self.degraded)
            || match outcome {
                AuditOutcome::Denied => self.denials,
                AuditOutcome::Allowed => sampled(),
                _ => true,
            };
        wanted.then_some(outcome)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{DecisionSource, FallbackReason, Quota};

    fn quota(dsl: &str) -> Quota {
        dsl.parse().unwrap_or_else(|_| unreachable!("valid quota"))
    }

    #[test]
    fn each_rule_picks_its_decisions() {
        let n = AtomicU64::new(0);
        let allowed = Decision::allow(quota("10/1m"), 9, Duration::from_secs(60));
        let denied = Decision::deny(quota("10/1m"), 0, Duration::from_secs(60), None);
        let degraded = allowed
            .clone()
            .with_source(DecisionSource::Fallback(FallbackReason::Timeout));
        let all = AuditRules::default();
        assert_eq!(all.outcome(&denied, &n), Some(AuditOutcome::Denied));
        assert_eq!(all.outcome(&allowed, &n), None);
        assert_eq!(all.outcome(&degraded, &n), Some(AuditOutcome::Allowed));
        let none = AuditRules::none();
        assert_eq!(
            (none.outcome(&denied, &n), none.outcome(&degraded, &n)),
            (None, None)
        );
        let sampled = AuditRules::none().sample_admissions(4);
        let recorded = (0..100)
            .filter(|_| sampled.outcome(&allowed, &n).is_some())
            .count();
        assert_eq!(recorded, 25);
        assert_eq!(sampled.outcome(&denied, &n), None);
    }
}
