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

use tower_window::{AuditLog, Store};

pub use crate::audit_flags::{AuditArgs, AuditSettings};

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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use clap::Parser;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use tower_window::audit::{AuditOutcome, AuditQuery};

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
}
