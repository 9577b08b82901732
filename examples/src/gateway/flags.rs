//! How the gateway reads flag values: durations (the quota DSL's own
//! parser, [`tower_window::quota::parse_duration`], so every flag accepts
//! what a quota accepts), whole numbers, addresses, header names and
//! quotas, each with its bounds.
//!
//! Each parser's error is what clap prints after `invalid value '<value>'
//! for '<flag>'`: it says what is wrong, what the flag expects and, where
//! there is one, the likely fix.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::time::Duration;

use axum::http::HeaderName;
use tower_window::dedup::DedupWindow;
use tower_window::events::Retention;
use tower_window::quota::{parse_duration, QuotaError};
use tower_window::Quota;

/// The bounds of `--lease-ttl`.
pub const LEASE_TTL: (Duration, Duration) = (Duration::from_millis(1), Duration::from_secs(3600));
/// The bounds of `--connection-seat-ttl` (those of
/// [`ConnectionLimiter`](tower_window::ConnectionLimiter)'s TTL).
pub const CONNECTION_SEAT_TTL: (Duration, Duration) =
    (Duration::from_millis(30), Duration::from_secs(3600));
/// The bounds of `--dedup-window`.
pub const DEDUP_WINDOW: (Duration, Duration) = (Duration::from_millis(1), DedupWindow::MAX_WINDOW);
/// The bounds of `--history`.
pub const HISTORY: (Duration, Duration) = (Duration::from_millis(1), Retention::MAX_WINDOW);
/// The bounds of `--audit-max-age`.
pub const AUDIT_MAX_AGE: (Duration, Duration) =
    (Duration::from_secs(1), Duration::from_secs(365 * 86_400));
/// The largest `--audit-buffer` and `--audit-max-len`, in records.
pub const AUDIT_MAX_RECORDS: u64 = 10_000_000;

/// `d` in the DSL's largest exact unit (`7d`, `90s`, `250ms`).
pub fn format_duration(d: Duration) -> String {
    let millis = d.as_millis();
    for (unit, size) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if millis >= size && millis.is_multiple_of(size) {
            return format!("{}{unit}", millis / size);
        }
    }
    if d.subsec_nanos().is_multiple_of(1_000_000) {
        format!("{millis}ms")
    } else {
        format!("{}us", d.as_micros())
    }
}

const DURATION_FORM: &str =
    "a whole number and a unit, one of ms, s, m, h, d (as in quotas: 250ms, 30s, 2m, 1h, 7d)";

/// What a bare number means to a duration flag.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Bare {
    /// Refused: a unit is needed.
    Refused,
    /// Milliseconds (`--lease-ttl`).
    Millis,
    /// Seconds (`--audit-max-age`).
    Secs,
}

/// A duration within `bounds`; a bare number as `bare` says.
fn duration_within(
    text: &str,
    (min, max): (Duration, Duration),
    bare: Bare,
) -> Result<Duration, String> {
    let text = text.trim();
    let range = format!("from {} to {}", format_duration(min), format_duration(max));
    let parsed =
        if bare != Bare::Refused && !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
            text.parse::<u64>()
                .map(|n| match bare {
                    Bare::Secs => Duration::from_secs(n),
                    _ => Duration::from_millis(n),
                })
                .map_err(|_| QuotaError::WindowTooLong)
        } else {
            parse_duration(text)
        };
    let duration = match parsed {
        Ok(duration) => duration,
        // A number and a word that is no unit (`2w`, `5sec`).
        Err(QuotaError::UnknownUnit(unit))
            if text.starts_with(|c: char| c.is_ascii_digit())
                && !unit.is_empty()
                && unit.bytes().all(|b| b.is_ascii_alphabetic()) =>
        {
            return Err(format!(
                "unknown unit {unit:?}: expected {DURATION_FORM}, {range}"
            ));
        }
        Err(QuotaError::UnknownUnit(_)) => {
            let bare = match bare {
                Bare::Refused => "",
                Bare::Millis => " (a bare number is milliseconds)",
                Bare::Secs => " (a bare number is seconds)",
            };
            return Err(format!(
                "not a duration: expected {DURATION_FORM}{bare}, {range}"
            ));
        }
        Err(_) => return Err(format!("too long: expected {range}")),
    };
    if duration < min || duration > max {
        return Err(format!(
            "out of range: expected {range} (in ms, s, m, h or d)"
        ));
    }
    Ok(duration)
}

/// `--lease-ttl`: 1ms to 1h; a bare number is milliseconds.
pub fn lease_ttl(text: &str) -> Result<Duration, String> {
    duration_within(text, LEASE_TTL, Bare::Millis)
}

/// `--connection-seat-ttl`: 30ms to 1h.
pub fn connection_seat_ttl(text: &str) -> Result<Duration, String> {
    duration_within(text, CONNECTION_SEAT_TTL, Bare::Refused)
}

/// `--dedup-window`: 1ms to 7d.
pub fn dedup_window(text: &str) -> Result<Duration, String> {
    duration_within(text, DEDUP_WINDOW, Bare::Refused)
}

/// `--history`: 1ms to 30d.
pub fn history(text: &str) -> Result<Duration, String> {
    duration_within(text, HISTORY, Bare::Refused)
}

/// `--audit-max-age`: 1s to 365d; a bare number is seconds.
pub fn audit_max_age(text: &str) -> Result<Duration, String> {
    duration_within(text, AUDIT_MAX_AGE, Bare::Secs)
}

/// `--audit-buffer`, `--audit-max-len`: 1 to [`AUDIT_MAX_RECORDS`]
/// records.
pub fn audit_records(text: &str) -> Result<u64, String> {
    whole(text, 1, AUDIT_MAX_RECORDS)
}

/// A whole number from `min` to `max`.
fn whole(text: &str, min: u64, max: u64) -> Result<u64, String> {
    let expected = if max == u64::MAX {
        format!("a whole number, at least {min}")
    } else {
        format!("a whole number from {min} to {max}")
    };
    let text = text.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("not a whole number: expected {expected}"));
    }
    match text.parse::<u64>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(format!("out of range: expected {expected}")),
    }
}

fn whole_u32(text: &str, min: u32) -> Result<u32, String> {
    let n = whole(text, u64::from(min), u64::from(u32::MAX))?;
    Ok(u32::try_from(n).unwrap_or(u32::MAX))
}

/// A count of 0 or more that fits in 32 bits (`--lease`,
/// `--max-connections-per-user`, `--close-after-drops`).
pub fn count(text: &str) -> Result<u32, String> {
    whole_u32(text, 0)
}

/// A count of 1 or more that fits in 32 bits (`--max-message-bytes`).
pub fn positive_count(text: &str) -> Result<u32, String> {
    whole_u32(text, 1)
}

/// `--expected-nodes`: 1 or more.
pub fn expected_nodes(text: &str) -> Result<NonZeroU32, String> {
    NonZeroU32::new(whole_u32(text, 1)?).ok_or_else(|| "must be at least 1".to_owned())
}

/// `--redis-timeout-ms`: 1 or more milliseconds.
pub fn redis_timeout_ms(text: &str) -> Result<u64, String> {
    whole(text, 1, u64::MAX)
}

/// `--history-max`: 1 to [`Retention::MAX_LEN`] events.
pub fn history_max(text: &str) -> Result<u64, String> {
    whole(text, 1, Retention::MAX_LEN)
}

/// `--listen`: an IP address and a port.
pub fn listen(text: &str) -> Result<SocketAddr, String> {
    text.trim().parse().map_err(|_| {
        let hint = match text.trim().rsplit_once(':') {
            Some(("localhost", port)) => format!("; for this machine write 127.0.0.1:{port}"),
            _ => String::new(),
        };
        format!(
            "not an address: expected IP:PORT, e.g. 127.0.0.1:3000, 0.0.0.0:3000 or [::1]:3000 (host names are not looked up){hint}"
        )
    })
}

/// `--tenant-header`, `--user-header`: an HTTP header name.
pub fn header_name(text: &str) -> Result<HeaderName, String> {
    HeaderName::try_from(text.trim()).map_err(|_| {
        "not an HTTP header name: expected letters, digits and -, e.g. x-user-id".to_owned()
    })
}

const QUOTA_FORM: &str = "a quota is <limit>/<window>[ <algorithm>], e.g. 100/1m, 5000/1h sliding-counter(1m), 10/s gcra(burst=20)";

/// A quota in the DSL (`--message-limit`, `--byte-limit`).
pub fn quota(text: &str) -> Result<Quota, String> {
    text.parse::<Quota>()
        .map_err(|error| format!("{error} ({QUOTA_FORM})"))
}

/// `--limit`: `NAME=DSL` or `DSL` (the quota is then named `default`).
pub fn named_quota(text: &str) -> Result<Quota, String> {
    let parsed = match text.split_once('=') {
        // `gcra(burst=20)` has a `=` too, but after a `(`.
        Some((name, dsl)) if !name.contains('(') => dsl
            .trim()
            .parse::<Quota>()
            .and_then(|quota| quota.named(name.trim())),
        _ => text.parse(),
    };
    parsed.map_err(|error| format!("{error} (NAME=QUOTA or QUOTA; {QUOTA_FORM})"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn durations_take_every_dsl_unit_within_their_bounds() {
        assert_eq!(dedup_window("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(dedup_window("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(history("30d"), Ok(Duration::from_secs(30 * 86_400)));
        assert_eq!(history("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(connection_seat_ttl("15s"), Ok(Duration::from_secs(15)));
        assert_eq!(connection_seat_ttl("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(lease_ttl("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(lease_ttl("250"), Ok(Duration::from_millis(250)));
        assert_eq!(lease_ttl(" 2s "), Ok(Duration::from_secs(2)));
        for (parse, bad) in [
            (dedup_window as fn(&str) -> Result<Duration, String>, "8d"),
            (dedup_window, "0s"),
            (dedup_window, "15"),
            (history, "31d"),
            (history, "0ms"),
            (connection_seat_ttl, "29ms"),
            (connection_seat_ttl, "2h"),
            (lease_ttl, "0"),
            (lease_ttl, "61m"),
            (lease_ttl, "-1s"),
            (lease_ttl, "1.5s"),
            (lease_ttl, "2w"),
            (lease_ttl, ""),
            (lease_ttl, "99999999999999999999999d"),
        ] {
            let error = parse(bad).unwrap_err();
            assert!(error.contains("from "), "{bad}: {error}");
        }
        assert!(dedup_window("8d").unwrap_err().contains("to 7d"));
        assert_eq!(audit_max_age("3600"), Ok(Duration::from_secs(3600)));
        assert_eq!(audit_max_age("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(audit_max_age("90s"), Ok(Duration::from_secs(90)));
        for bad in ["0", "500ms", "366d", "-1", "99999999999", "1.5", "x"] {
            let error = audit_max_age(bad).unwrap_err();
            assert!(error.contains("from 1s to 365d"), "{bad}: {error}");
        }
        assert!(audit_max_age("x")
            .unwrap_err()
            .contains("bare number is seconds"));
        assert!(lease_ttl("2w").unwrap_err().contains("unknown unit \"w\""));
    }

    #[test]
    fn numbers_say_what_they_expect() {
        assert_eq!(count("0"), Ok(0));
        assert_eq!(count("4294967295"), Ok(u32::MAX));
        assert!(count("4294967296").unwrap_err().contains("0 to 4294967295"));
        assert!(count("-1").unwrap_err().contains("not a whole number"));
        assert!(expected_nodes("0").unwrap_err().contains("1 to 4294967295"));
        assert!(redis_timeout_ms("0").unwrap_err().contains("at least 1"));
        assert!(history_max("10000001")
            .unwrap_err()
            .contains("1 to 10000000"));
        assert_eq!(audit_records("10000000"), Ok(10_000_000));
        assert!(audit_records("0").unwrap_err().contains("1 to 10000000"));
        assert!(audit_records("10000001")
            .unwrap_err()
            .contains("1 to 10000000"));
        assert!(positive_count("x")
            .unwrap_err()
            .contains("not a whole number"));
    }

    #[test]
    fn formats() {
        assert_eq!(format_duration(Duration::from_secs(7 * 86_400)), "7d");
        assert_eq!(format_duration(Duration::from_secs(90)), "90s");
        assert_eq!(format_duration(Duration::from_millis(30)), "30ms");
        assert_eq!(format_duration(Duration::from_micros(1500)), "1500us");
        assert!(listen("localhost:3000")
            .unwrap_err()
            .contains("127.0.0.1:3000"));
        assert!(header_name("x user").is_err());
        assert!(named_quota("x=0/1s").unwrap_err().contains("100/1m"));
    }
}
