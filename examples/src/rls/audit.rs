//! `--audit`: the rls's decisions in tower-window's audit trail
//! ([`tower_window::audit`]), on the rls's own store.
//!
//! With `--audit` (`TW_AUDIT`) the one limiter the rls builds hands each
//! of its checks to one [`AuditLog`] on the same store (Redis, Redis
//! Cluster or the embedded store), which keeps, off the request path, the
//! denials, the fallback's decisions and the shadow denials, and one
//! admission in `--audit-sample-admissions` (0: none). A reload of the
//! rules swaps the rules only: the limiter, and so the log, stay.
//!
//! What a record says, for the rls:
//!
//! - **tenant**: the request's `domain` (the tenant of the window key; on
//!   Redis the log is the stream `<prefix>{@<domain>}:#audit`, in the
//!   domain's slot);
//! - **subject**: empty (the rls's window key has no subject: a
//!   descriptor's values tell its window apart, and they are not recorded);
//! - **policy**: `rls`;
//! - **quota**: the quota that decided: the rule's `name`, else its path
//!   (`-2`, `-3`, ... after it for the second and later windows of one rule
//!   in one request), as the metrics name it;
//! - **outcome**: `denied`; `shadow_denied` for a window that counts on
//!   its own (a `shadow_mode` or `quota_mode` rule, `--shadow-mode`,
//!   `--quota-mode`), even when every quota group is over and the answer
//!   is `OVER_LIMIT`; `allowed` for a sampled admission or a fallback
//!   decision that admitted;
//! - **remaining**, **source** (`store`, `local_cache`, `lease`,
//!   `fallback(...)`), the deciding clock's time and the node.
//!
//! One record per check, so per request: a request whose descriptors are
//! all over is one record, naming one quota that denied it. Calls that only read (a descriptor's `hits_addend` of 0, a request
//! already denied by a `requests_per_unit: 0` rule) and usage reports are
//! not checks, and not recorded.
//!
//! On graceful shutdown, the servers ([`serve`](super::serve),
//! [`serve_with_tonic`](super::serve_with_tonic)) write what is still
//! buffered once the last call is answered, waiting at most ten times the
//! store's time budget (at least a second).

use std::sync::OnceLock;
use std::time::Duration;

use tower_window::audit::AuditRules;
use tower_window::{AuditLog, Store};

use crate::gateway::flags;

/// The most `--audit-buffer` takes (the buffer is this node's memory).
pub const MAX_BUFFER: u64 = 1_000_000;
/// The most `--audit-max-len` takes.
pub const MAX_LEN: u64 = 1_000_000_000;
/// The most `--audit-max-age` takes, in seconds: 10 years.
pub const MAX_AGE_SECS: u64 = 10 * 365 * 24 * 3600;

/// The audit flags (flattened into [`RlsArgs`](super::RlsArgs)).
#[derive(Debug, Clone, clap::Args)]
pub struct AuditArgs {
    /// Record the rls's decisions — denials, fallback decisions, shadow
    /// denials — in an audit trail on its store, per domain (on Redis the
    /// stream `<prefix>{@<domain>}:#audit`), off the request path.
    #[arg(long, env = "TW_AUDIT")]
    pub audit: bool,

    /// With `--audit`: also record one admission in N (0: none).
    #[arg(long, env = "TW_AUDIT_SAMPLE_ADMISSIONS", value_name = "N", default_value = "0", value_parser = flags::count)]
    pub audit_sample_admissions: u32,

    /// With `--audit`: records buffered on this node at most while the
    /// store is slow or down (1 to 1000000); past it new records are
    /// dropped and counted.
    #[arg(long, env = "TW_AUDIT_BUFFER", value_name = "N", default_value_t = AuditLog::DEFAULT_CAPACITY, value_parser = buffer)]
    pub audit_buffer: usize,

    /// With `--audit`: records kept per domain, about (1 to 1000000000); on
    /// the embedded store, over all domains.
    #[arg(long, env = "TW_AUDIT_MAX_LEN", value_name = "N", default_value_t = AuditLog::DEFAULT_RETENTION.max_len, value_parser = max_len)]
    pub audit_max_len: u64,

    /// With `--audit`: how long records are kept, in seconds (1 to
    /// 315360000, 10 years); a domain's log with nothing new for this long
    /// expires.
    #[arg(long, env = "TW_AUDIT_MAX_AGE", value_name = "SECS", default_value_t = AuditLog::DEFAULT_RETENTION.max_age.as_secs(), value_parser = max_age)]
    pub audit_max_age: u64,
}

impl AuditArgs {
    /// The audit trail asked for, if `--audit` is on.
    pub fn settings(&self) -> Option<AuditSettings> {
        self.audit.then(|| AuditSettings {
            rules: AuditRules::default().sample_admissions(self.audit_sample_admissions),
            capacity: self.audit_buffer,
            max_len: self.audit_max_len,
            max_age: Duration::from_secs(self.audit_max_age),
        })
    }
}

/// The audit trail of `--audit` and its flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct AuditSettings {
    /// What is recorded (every domain alike).
    pub rules: AuditRules,
    /// `--audit-buffer`.
    pub capacity: usize,
    /// `--audit-max-len`.
    pub max_len: u64,
    /// `--audit-max-age`.
    pub max_age: Duration,
}

impl AuditSettings {
    /// The log on `store`.
    pub fn log(&self, store: Store) -> AuditLog {
        AuditLog::builder(store)
            .rules(self.rules)
            .capacity(self.capacity)
            .retention(self.max_len, self.max_age)
            .build()
    }
}

/// The one log of a configuration, built on its store when first asked.
#[derive(Debug, Default)]
pub(crate) struct OneLog(OnceLock<AuditLog>);

impl OneLog {
    /// The log of `settings` on `store`: built the first time, the same
    /// log after.
    pub(crate) fn get(&self, settings: &AuditSettings, store: &Store) -> AuditLog {
        self.0.get_or_init(|| settings.log(store.clone())).clone()
    }
}

/// Writes what `audit` still buffers (at shutdown), and says how it went.
pub(crate) async fn flush(audit: Option<&AuditLog>) {
    let Some(audit) = audit else {
        return;
    };
    let written = audit.flush().await;
    let stats = audit.stats();
    if written {
        tracing::info!(
            written = stats.written,
            dropped = stats.dropped_full + stats.dropped_failed,
            "audit log flushed"
        );
    } else {
        tracing::warn!(
            unwritten = stats.buffered,
            "audit log: the store did not take the last records in time; they are lost"
        );
    }
}

/// `--audit-buffer`.
fn buffer(text: &str) -> Result<usize, String> {
    let n = whole(text, 1, MAX_BUFFER)?;
    Ok(usize::try_from(n).unwrap_or(usize::MAX))
}

/// `--audit-max-len`.
fn max_len(text: &str) -> Result<u64, String> {
    whole(text, 1, MAX_LEN)
}

/// `--audit-max-age`.
fn max_age(text: &str) -> Result<u64, String> {
    whole(text, 1, MAX_AGE_SECS)
}

/// A whole number from `min` to `max` (as the gateway's flags read them).
fn whole(text: &str, min: u64, max: u64) -> Result<u64, String> {
    let expected = format!("a whole number from {min} to {max}");
    let text = text.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("not a whole number: expected {expected}"));
    }
    match text.parse::<u64>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(format!("out of range: expected {expected}")),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use clap::Parser;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use tower_window::audit::{AuditOutcome, AuditQuery};

    use super::*;
    use crate::rls::RlsArgs;

    /// On the embedded store: the one log (the configuration's is the
    /// limiter's), each denial recorded under the domain, nothing else.
    #[tokio::test]
    async fn one_log_on_the_embedded_store() {
        let dir = tempfile::tempdir().unwrap();
        let rules = dir.path().join("d.yaml");
        std::fs::write(
            &rules,
            "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
        )
        .unwrap();
        let argv = ["rls", "--audit", "--config", rules.to_str().unwrap()];
        let config = RlsArgs::try_parse_from(argv)
            .unwrap()
            .into_config()
            .unwrap();
        let node = config.audit_log().unwrap().node().to_owned();
        assert_eq!(config.audit_log().unwrap().node(), node);
        let rls = crate::rls::build(config);
        let audit = rls.service.limiter().audit().unwrap().clone();
        assert_eq!(audit.node(), node);
        let request = RateLimitRequest {
            domain: "d".to_owned(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "user".to_owned(),
                    value: "alice".to_owned(),
                }],
                ..RateLimitDescriptor::default()
            }],
            hits_addend: 0,
        };
        let mut codes = Vec::new();
        for _ in 0..3 {
            codes.push(rls.service.decide(&request).await.unwrap().overall_code);
        }
        assert_eq!(codes, [1, 2, 2], "OK, then OVER_LIMIT");
        assert!(audit.flush().await);
        let page = audit.query(&AuditQuery::new("d")).await.unwrap();
        let records: Vec<_> = page
            .records
            .iter()
            .map(|r| (r.subject.as_str(), r.quota.as_str(), r.outcome))
            .collect();
        assert_eq!(records, [("", "user", AuditOutcome::Denied); 2]);
    }

    #[test]
    fn off_by_default_with_the_library_defaults() {
        let args = RlsArgs::try_parse_from(["rls"]).unwrap();
        assert!(args.audit.settings().is_none());
        let on = RlsArgs::try_parse_from(["rls", "--audit"]).unwrap();
        let settings = on.audit.settings().unwrap();
        assert_eq!(settings.rules, AuditRules::default());
        assert_eq!(settings.capacity, AuditLog::DEFAULT_CAPACITY);
        assert_eq!(settings.max_len, AuditLog::DEFAULT_RETENTION.max_len);
        assert_eq!(settings.max_age, AuditLog::DEFAULT_RETENTION.max_age);
    }

    #[test]
    fn flags_and_their_bounds() {
        let args = RlsArgs::try_parse_from([
            "rls",
            "--audit",
            "--audit-sample-admissions",
            "100",
            "--audit-buffer",
            "64",
            "--audit-max-len",
            "5000",
            "--audit-max-age",
            "3600",
        ])
        .unwrap();
        let settings = args.audit.settings().unwrap();
        assert_eq!(settings.rules.admission_sample, 100);
        assert_eq!(
            (settings.capacity, settings.max_len, settings.max_age),
            (64, 5000, Duration::from_secs(3600))
        );
        for (flag, value) in [
            ("--audit-buffer", "0"),
            ("--audit-buffer", "1000001"),
            ("--audit-max-len", "0"),
            ("--audit-max-age", "0"),
            ("--audit-max-age", "1h"),
            ("--audit-max-age", "315360001"),
            ("--audit-sample-admissions", "some"),
        ] {
            let error = RlsArgs::try_parse_from(["rls", "--audit", flag, value])
                .unwrap_err()
                .to_string();
            assert!(
                error.contains(flag) && error.contains("whole number"),
                "{error}"
            );
        }
    }
}
