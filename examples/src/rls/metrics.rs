//! The rls's own series, beside tower-window's (decisions, store calls,
//! breakers, leases, reloads — labelled by quota, i.e. by rule):
//!
//! - `tower_window_rls_requests_total{code="ok"|"over_limit"|"error"|"usage_report"}`:
//!   `ShouldRateLimit` calls by `overall_code` (`error`: a gRPC error,
//!   a bad request or the store unavailable without a fallback;
//!   `usage_report`: a call whose descriptors with a rule are all usage
//!   reports, answered `OK` but no admission);
//! - `tower_window_rls_descriptors_total{result="ok"|"over_limit"|"shadow_over_limit"|"unlimited"|"no_rule"|"usage_report"}`:
//!   descriptors by what they got;
//! - `tower_window_rls_detailed_total{rule, value, result}`: the
//!   descriptors of rules with `detailed_metric: true` (or
//!   `value_to_metric: true`), by rule (its path in the config), the
//!   descriptor's last value and result (`ok`, `over_limit`, `usage_report`), as envoyproxy/ratelimit's
//!   `detailed_metric` stats name the value.
//!
//! The labels are fixed words, except the opt-in detailed series: its
//! `value` comes from requests, so at most [`DETAILED_SERIES`] (rule,
//! value) pairs get a series of their own (values cut at 64 characters),
//! every later one is counted under `value="_other"`.

/// `ShouldRateLimit` calls by overall code.
pub const RLS_REQUESTS_TOTAL: &str = "tower_window_rls_requests_total";
/// Descriptors by result.
pub const RLS_DESCRIPTORS_TOTAL: &str = "tower_window_rls_descriptors_total";
/// Descriptors of `detailed_metric` rules by rule, value and result.
pub const RLS_DETAILED_TOTAL: &str = "tower_window_rls_detailed_total";
/// How many (rule, value) pairs the detailed series keeps apart.
pub const DETAILED_SERIES: usize = 1_000;

const CODES: [&str; 4] = ["ok", "over_limit", "error", "usage_report"];
const RESULTS: [&str; 6] = [
    "ok",
    "over_limit",
    "shadow_over_limit",
    "unlimited",
    "no_rule",
    "usage_report",
];

/// The rls's counters, made once (after the recorder is installed, see
/// [`install_recorder`](crate::gateway::metrics::install_recorder)): a
/// call is counted with an atomic add, without building a labelled key
/// and looking it up in the recorder's registry each time.
#[derive(Clone)]
pub(super) struct Counters {
    requests: [metrics::Counter; CODES.len()],
    descriptors: [metrics::Counter; RESULTS.len()],
    /// The (rule, value) pairs of the detailed series so far.
    detailed: std::sync::Arc<std::sync::Mutex<std::collections::HashSet<(String, String)>>>,
}

impl Counters {
    pub(super) fn new() -> Self {
        Self {
            requests: CODES.map(|code| metrics::counter!(RLS_REQUESTS_TOTAL, "code" => code)),
            descriptors: RESULTS
                .map(|result| metrics::counter!(RLS_DESCRIPTORS_TOTAL, "result" => result)),
            detailed: std::sync::Arc::default(),
        }
    }

    /// Counts one call (`code`: one of [`CODES`]).
    pub(super) fn request(&self, code: &'static str) {
        Self::count(&self.requests, &CODES, code);
    }

    /// Counts one descriptor (`result`: one of [`RESULTS`]).
    pub(super) fn descriptor(&self, result: &'static str) {
        Self::count(&self.descriptors, &RESULTS, result);
    }

    /// Counts one descriptor of a `detailed_metric` rule.
    pub(super) fn detailed(&self, rule: &str, value: &str, result: &'static str) {
        let value: String = value.chars().take(64).collect();
        let value = if self.admit(rule, &value) {
            value
        } else {
            "_other".to_owned()
        };
        metrics::counter!(
            RLS_DETAILED_TOTAL,
            "rule" => rule.to_owned(),
            "value" => value,
            "result" => result
        )
        .increment(1);
    }

    /// Whether (`rule`, `value`) has, or may get, a series of its own.
    fn admit(&self, rule: &str, value: &str) -> bool {
        let mut seen = self.detailed.lock().unwrap_or_else(|e| e.into_inner());
        let pair = (rule.to_owned(), value.to_owned());
        if seen.contains(&pair) {
            return true;
        }
        if seen.len() >= DETAILED_SERIES {
            return false;
        }
        seen.insert(pair);
        true
    }

    fn count(counters: &[metrics::Counter], labels: &[&str], label: &str) {
        let at = labels.iter().position(|l| *l == label);
        debug_assert!(at.is_some(), "{label} is not a label of this series");
        if let Some(counter) = at.and_then(|at| counters.get(at)) {
            counter.increment(1);
        }
    }
}

/// Describes the rls's series and registers each at zero, with every
/// quota in `quotas` (tower-window's per-quota series) and the reload
/// counter, so the dashboard charts them from the start. Call it after
/// [`install_recorder`](crate::gateway::metrics::install_recorder); adding
/// zero changes nothing, so calling it again after a reload is harmless.
pub fn register_at_zero<'a>(quotas: impl IntoIterator<Item = &'a str>) {
    metrics::describe_counter!(
        RLS_REQUESTS_TOTAL,
        "ShouldRateLimit calls by overall code (ok, over_limit, error), usage reports apart (usage_report)"
    );
    metrics::describe_counter!(
        RLS_DESCRIPTORS_TOTAL,
        "Rate limit descriptors by result (ok, over_limit, shadow_over_limit, unlimited, no_rule, usage_report)"
    );
    for code in CODES {
        metrics::counter!(RLS_REQUESTS_TOTAL, "code" => code).increment(0);
    }
    for result in RESULTS {
        metrics::counter!(RLS_DESCRIPTORS_TOTAL, "result" => result).increment(0);
    }
    for quota in quotas {
        tower_window::metrics::register_quota(quota);
    }
    for result in ["ok", "error"] {
        metrics::counter!(tower_window::metrics::CONFIG_RELOAD_TOTAL, "result" => result)
            .increment(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detailed_series_are_bounded() {
        let counters = Counters::new();
        for i in 0..DETAILED_SERIES {
            assert!(counters.admit("rule", &i.to_string()));
        }
        assert!(!counters.admit("rule", "one more"));
        // A pair already seen keeps its series.
        assert!(counters.admit("rule", "0"));
    }
}
