//! What `?` in `main` prints: every public error's `Debug` is its variant
//! (or type) name and its readable `Display` text, because std prints a
//! `main`'s error as `Error: {:?}`.

#![allow(clippy::unwrap_used)]

use std::error::Error;
use std::process::Command;
use std::time::Duration;

use tower_window::conn::{ConnectionError, ConnectionLimiter};
use tower_window::dedup::{DedupError, DedupWindow};
use tower_window::events::{EventId, InvalidPosition, Retention};
use tower_window::fallback::LocalWindow;
use tower_window::tenant::TenantError;
use tower_window::{IntoCost, LimitError, MemoryStore, Policy, Quota, StoreError, StoreErrorKind};

/// Set in the child process that plays the README's `main`.
const CHILD: &str = "TOWER_WINDOW_READABLE_ERRORS_CHILD";

/// The README's pattern, `"…".parse::<Quota>()?` in a function returning
/// `Box<dyn Error>`, whose error std's `Termination` reports: the same
/// implementation (`Result<T, E: Debug>::report`, `Error: {err:?}` on
/// stderr) that reports a `main`'s. Does nothing unless run as the child.
#[test]
fn readme_main() -> Result<(), Box<dyn Error>> {
    if std::env::var_os(CHILD).is_none() {
        return Ok(());
    }
    let _quota: Quota = "100/1x".parse()?;
    Ok(())
}

#[test]
fn question_mark_in_main_prints_the_readable_message() {
    let output = Command::new(std::env::current_exe().unwrap())
        .args(["readme_main", "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "the child must fail: {stderr}");
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("Error: "))
        .collect();
    assert_eq!(
        errors,
        [r#"Error: UnknownUnit: unknown duration unit "x": expected ms, s, m, h or d"#],
        "stderr: {stderr}"
    );
}

/// `{:?}` is `<name>: <Display>`.
fn assert_readable(error: &(impl Error + ?Sized), name: &str) {
    assert_eq!(format!("{error:?}"), format!("{name}: {error}"));
}

#[test]
fn quota_and_policy_errors() {
    let unit = "100/1x".parse::<Quota>().unwrap_err();
    assert_eq!(
        format!("{unit:?}"),
        r#"UnknownUnit: unknown duration unit "x": expected ms, s, m, h or d"#
    );
    assert_readable(
        &"100/1m sliding-counter(7s)".parse::<Quota>().unwrap_err(),
        "GranularityDoesNotDivide",
    );
    assert_readable(&"/1m".parse::<Quota>().unwrap_err(), "InvalidLimit");
    assert_readable(&"".parse::<Quota>().unwrap_err(), "Syntax");
    assert_readable(
        &Quota::builder()
            .window(Duration::from_secs(1))
            .build()
            .unwrap_err(),
        "MissingLimit",
    );
    let quota: Quota = "1/s".parse().unwrap();
    assert_readable(
        &Policy::new("no spaces", [quota.clone()]).unwrap_err(),
        "InvalidName",
    );
    assert_readable(
        &Policy::new("api", [quota.clone(), quota]).unwrap_err(),
        "DuplicateName",
    );
    // Boxed, as `?` in `main` keeps it.
    let boxed: Box<dyn Error> = "0/1m".parse::<Quota>().unwrap_err().into();
    assert_eq!(
        format!("{boxed:?}"),
        "ZeroLimit: quota limit must be at least 1"
    );
}

#[test]
fn store_and_limit_errors() {
    let cause = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
    let store = StoreError::new(StoreErrorKind::Unavailable, "no connection").with_source(cause);
    assert_eq!(
        format!("{store:?}"),
        "store unavailable: no connection (caused by: connection refused)"
    );
    let plain = StoreError::circuit_open();
    assert_eq!(format!("{plain:?}"), format!("{plain}"));
    assert_readable(&LimitError::Store(StoreError::circuit_open()), "Store");
    assert_readable(&LimitError::from(0u32.into_cost().unwrap_err()), "ZeroCost");
    assert_readable(&0u32.into_cost().unwrap_err(), "ZeroCost");
    assert_readable(&LocalWindow::new(2.0).unwrap_err(), "InvalidShare");
}

#[test]
fn capability_errors() {
    let store = MemoryStore::new();
    let conn = ConnectionLimiter::builder(store.clone())
        .ttl(Duration::from_millis(1))
        .build()
        .unwrap_err();
    assert!(matches!(conn, ConnectionError::InvalidTtl));
    assert_readable(&conn, "InvalidTtl");
    let dedup = DedupWindow::builder(store)
        .window(Duration::ZERO)
        .build()
        .unwrap_err();
    assert!(matches!(dedup, DedupError::InvalidWindow));
    assert_readable(&dedup, "InvalidWindow");
    assert_readable(&"1-x".parse::<EventId>().unwrap_err(), "EventId");
    assert!(matches!(
        "1-x".parse::<EventId>(),
        Err(InvalidPosition::EventId)
    ));
    assert_readable(&Retention::new(Duration::ZERO, 10).unwrap_err(), "Window");
}

#[test]
fn tenant_errors() {
    let error = TenantError::Quota {
        tenant: Some("acme".to_owned()),
        quota: "burst".to_owned(),
        error: "100/1x".parse::<Quota>().unwrap_err(),
    };
    assert_eq!(
        format!("{error:?}"),
        r#"Quota: tenant "acme": quota "burst": unknown duration unit "x": expected ms, s, m, h or d"#
    );
    assert_readable(&TenantError::InvalidName(String::new()), "InvalidName");
}

#[cfg(feature = "http")]
#[test]
fn key_errors() {
    use tower_window::key::{Header, TrustedProxies};
    assert_readable(&Header::new("no spaces").unwrap_err(), "InvalidHeaderName");
    assert_readable(
        &"10.0.0.0/99".parse::<TrustedProxies>().unwrap_err(),
        "InvalidNetwork",
    );
}

#[cfg(feature = "grpc")]
#[test]
fn metadata_key_errors() {
    use tower_window::key::Metadata;
    assert_readable(
        &Metadata::new("no spaces").unwrap_err(),
        "InvalidMetadataKey",
    );
}

#[cfg(feature = "redis")]
#[test]
fn redis_config_errors() {
    use tower_window::RedisStore;
    let error = RedisStore::builder().url("not a url").build().unwrap_err();
    assert_readable(&error, "InvalidUrl");
}
