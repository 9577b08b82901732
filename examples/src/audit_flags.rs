//! The audit trail's flags, the same in the gateway and the rls
//! (flattened into each one's arguments): `--audit` and how the trail is
//! kept ([`tower_window::audit`]).

use std::time::Duration;

use tower_window::audit::AuditRules;
use tower_window::{AuditLog, Store};

use crate::gateway::flags;

/// `--audit` and its settings. The settings are read without `--audit`
/// too and then do nothing, so one `TW_AUDIT=false` turns the trail off
/// while the rest of a deployment's `TW_AUDIT_*` stay in place.
#[derive(Debug, Clone, clap::Args)]
pub struct AuditArgs {
    /// Record decisions — denials, fallback decisions, shadow denials, and
    /// admin changes — in an audit trail on the store, per tenant (on Redis
    /// the stream `<prefix>{@<tenant>}:#audit`), off the request path.
    #[arg(long, env = "TW_AUDIT")]
    pub audit: bool,

    /// With `--audit`: also record one admission in N (0: none).
    #[arg(
        long,
        env = "TW_AUDIT_SAMPLE_ADMISSIONS",
        value_name = "N",
        default_value = "0",
        value_parser = flags::count,
        allow_negative_numbers = true
    )]
    pub audit_sample_admissions: u32,

    /// With `--audit`: records waiting to be written at most, from 1 to
    /// 10000000; past it (the store down for long) new records are dropped
    /// and counted in
    /// `tower_window_audit_records_total{outcome="dropped_full"}`.
    #[arg(
        long,
        env = "TW_AUDIT_BUFFER",
        value_name = "N",
        default_value_t = AuditLog::DEFAULT_CAPACITY as u64,
        value_parser = flags::audit_records,
        allow_negative_numbers = true
    )]
    pub audit_buffer: u64,

    /// With `--audit`: records kept per tenant (about: Redis trims in
    /// blocks), from 1 to 10000000; the embedded store keeps this many
    /// over all tenants.
    #[arg(
        long,
        env = "TW_AUDIT_MAX_LEN",
        value_name = "N",
        default_value_t = AuditLog::DEFAULT_RETENTION.max_len,
        value_parser = flags::audit_records,
        allow_negative_numbers = true
    )]
    pub audit_max_len: u64,

    /// With `--audit`: how long records are kept, in seconds (or in the
    /// quota DSL's units: `90s`, `12h`, `7d`), from 1s to 365d; a tenant's
    /// log with no new record for that long is deleted.
    #[arg(
        long,
        env = "TW_AUDIT_MAX_AGE",
        value_name = "SECS",
        default_value = "604800",
        value_parser = flags::audit_max_age,
        allow_hyphen_values = true
    )]
    pub audit_max_age: Duration,
}

impl AuditArgs {
    /// The audit trail asked for, if `--audit` is on.
    pub fn settings(&self) -> Option<AuditSettings> {
        self.audit.then(|| AuditSettings {
            rules: AuditRules::default().sample_admissions(self.audit_sample_admissions),
            capacity: usize::try_from(self.audit_buffer).unwrap_or(usize::MAX),
            max_len: self.audit_max_len,
            max_age: self.audit_max_age,
        })
    }
}

/// The audit trail of `--audit` and its flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct AuditSettings {
    /// What is recorded (tenants without rules of their own).
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

    /// The embedded store, bounded by `--audit-max-len` over all tenants.
    pub fn memory_store(&self) -> tower_window::MemoryStore {
        let max = usize::try_from(self.max_len).unwrap_or(usize::MAX);
        tower_window::MemoryStore::builder()
            .max_audit_records(max)
            .build()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Args {
        #[command(flatten)]
        audit: AuditArgs,
    }

    fn parse(argv: &[&str]) -> Result<AuditArgs, clap::Error> {
        let argv = std::iter::once("x").chain(argv.iter().copied());
        Args::try_parse_from(argv).map(|args| args.audit)
    }

    #[test]
    fn off_by_default_with_the_library_defaults() {
        assert!(parse(&[]).unwrap().settings().is_none());
        let settings = parse(&["--audit"]).unwrap().settings().unwrap();
        assert_eq!(settings.rules, AuditRules::default());
        assert_eq!(settings.capacity, AuditLog::DEFAULT_CAPACITY);
        assert_eq!(settings.max_len, AuditLog::DEFAULT_RETENTION.max_len);
        assert_eq!(settings.max_age, AuditLog::DEFAULT_RETENTION.max_age);
        // Settings without --audit are read, and do nothing.
        assert!(parse(&["--audit-buffer", "10"])
            .unwrap()
            .settings()
            .is_none());
    }

    #[test]
    fn flags_and_their_bounds() {
        let args = [
            "--audit",
            "--audit-sample-admissions",
            "100",
            "--audit-buffer",
            "64",
            "--audit-max-len",
            "5000",
            "--audit-max-age",
            "3600",
        ];
        let settings = parse(&args).unwrap().settings().unwrap();
        assert_eq!(settings.rules.admission_sample, 100);
        assert_eq!(
            (settings.capacity, settings.max_len, settings.max_age),
            (64, 5000, Duration::from_secs(3600))
        );
        let week = parse(&["--audit", "--audit-max-age", "7d"]).unwrap();
        assert_eq!(week.audit_max_age, Duration::from_secs(7 * 86_400));
        for (flag, value) in [
            ("--audit-buffer", "0"),
            ("--audit-buffer", "10000001"),
            ("--audit-max-len", "0"),
            ("--audit-max-age", "0"),
            ("--audit-max-age", "366d"),
            ("--audit-sample-admissions", "some"),
            ("--audit-sample-admissions", "-1"),
        ] {
            let error = parse(&["--audit", flag, value]).unwrap_err().to_string();
            assert!(error.contains(flag), "{error}");
        }
    }
}
