//! [`Outcome`]: what one algorithm step decided, shared by all four.

use std::time::Duration;

use crate::{Decision, Policy, Quota, QuotaDecision};

/// What one check decided, in integer microseconds (all four algorithms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Outcome {
    /// Whether the cost was admitted (and recorded).
    pub(crate) allowed: bool,
    /// Units left after this decision.
    pub(crate) remaining: u32,
    /// Microseconds until everything counted now has stopped counting.
    pub(crate) reset_after: u64,
    /// `Some(0)` for an admission; for a denial the wait until the same cost
    /// fits, or `None` when it never can.
    pub(crate) retry_after: Option<u64>,
}

impl Outcome {
    /// An admission. Its state matters for `reset_after` microseconds, which
    /// is also the TTL a store gives it.
    pub(crate) fn allow(remaining: u32, reset_after: u64) -> Self {
        Self {
            allowed: true,
            remaining,
            reset_after,
            retry_after: Some(0),
        }
    }

    /// A denial; it never writes state.
    pub(crate) fn deny(remaining: u32, reset_after: u64, retry_after: Option<u64>) -> Self {
        Self {
            allowed: false,
            remaining,
            reset_after,
            retry_after,
        }
    }
}

/// One quota's evaluation of a cost, before anything is recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Evaluation {
    /// If the cost fits: the admission as it will read once committed.
    /// Otherwise the denial.
    pub(crate) outcome: Outcome,
    /// `remaining` and `reset_after` if nothing is recorded (what a quota
    /// that fits reports when another quota of its policy denies).
    pub(crate) unchanged: (u32, u64),
}

impl Evaluation {
    /// Whether the cost fits this quota.
    pub(crate) fn fits(&self) -> bool {
        self.outcome.allowed
    }

    /// An admission of `remaining` and `reset_after` once committed, and
    /// `unchanged` if not.
    pub(crate) fn admitted(remaining: u32, reset_after: u64, unchanged: (u32, u64)) -> Self {
        let outcome = Outcome::allow(remaining, reset_after);
        Self { outcome, unchanged }
    }

    /// A denial: nothing would change either way.
    pub(crate) fn denied(outcome: Outcome) -> Self {
        Self {
            unchanged: (outcome.remaining, outcome.reset_after),
            outcome,
        }
    }
}

/// Whether `policy` admits a request whose quotas evaluated to
/// `evaluations`: every enforced quota's cost fits. A store then commits
/// the cost to every quota it fits, so a shadow quota that would deny
/// records nothing.
pub(crate) fn policy_admits(policy: &Policy, evaluations: &[Evaluation]) -> bool {
    policy
        .quotas()
        .iter()
        .zip(evaluations)
        .all(|(quota, e)| e.fits() || quota.is_shadow())
}

/// The [`Decision`] of `policy` at `now` from each quota's evaluation (see
/// [`policy_admits`]): a quota that fits while another denies reports its
/// state unchanged; a shadow quota that does not fit, its would-be denial.
pub(crate) fn policy_decision(
    policy: &Policy,
    evaluations: &[Evaluation],
    now: u64,
) -> Option<Decision> {
    let micros = Duration::from_micros;
    let state = |quota: &Quota, o: Outcome| QuotaDecision {
        quota: quota.clone(),
        allowed: o.allowed,
        remaining: o.remaining,
        reset_after: micros(o.reset_after),
        retry_after: o.retry_after.map(micros),
    };
    if let ([quota], [e]) = (policy.quotas(), evaluations) {
        // One quota (the common case): its own outcome, without collecting.
        return Some(Decision::single_at(state(quota, e.outcome), now));
    }
    let admitted = policy_admits(policy, evaluations);
    let states = policy.quotas().iter().zip(evaluations).map(|(quota, e)| {
        if admitted || !e.fits() {
            state(quota, e.outcome)
        } else {
            QuotaDecision::allow(quota.clone(), e.unchanged.0, micros(e.unchanged.1))
        }
    });
    Decision::from_quotas(states).map(|d| d.with_timestamp_micros(now))
}

/// `x` as a `u32`, clamped.
pub(crate) fn saturate_u32(x: u64) -> u32 {
    u32::try_from(x).unwrap_or(u32::MAX)
}
