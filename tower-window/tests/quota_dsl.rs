//! The quota DSL: valid and invalid inputs, `Display` round trips, serde.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use proptest::prelude::*;
use tower_window::{Algorithm, Quota, QuotaError};

fn parse(text: &str) -> Result<Quota, QuotaError> {
    text.parse()
}

#[test]
fn parses_the_documented_forms() {
    let cases: [(&str, u32, Duration, Algorithm); 8] = [
        (
            "100/1m",
            100,
            Duration::from_secs(60),
            Algorithm::SlidingLog,
        ),
        ("10/s", 10, Duration::from_secs(1), Algorithm::SlidingLog),
        (
            "5000/1h",
            5000,
            Duration::from_secs(3600),
            Algorithm::SlidingLog,
        ),
        (
            "250/500ms",
            250,
            Duration::from_millis(500),
            Algorithm::SlidingLog,
        ),
        (
            "7/2d",
            7,
            Duration::from_secs(2 * 86_400),
            Algorithm::SlidingLog,
        ),
        (
            "60/1m sliding-counter(1s)",
            60,
            Duration::from_secs(60),
            Algorithm::SlidingCounter {
                granularity: Duration::from_secs(1),
            },
        ),
        (
            "3/10s fixed-window",
            3,
            Duration::from_secs(10),
            Algorithm::FixedWindow,
        ),
        ("  10/s gcra  ", 10, Duration::from_secs(1), Algorithm::Gcra),
    ];
    for (text, limit, window, algorithm) in cases {
        let quota = parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(quota.limit(), limit, "{text}");
        assert_eq!(quota.window(), window, "{text}");
        assert_eq!(quota.algorithm(), algorithm, "{text}");
        assert_eq!(quota.name(), "default");
    }
}

#[test]
fn gcra_burst_sets_capacity() {
    let quota = parse("10/s gcra(burst=25)").unwrap();
    assert_eq!(quota.burst(), Some(25));
    assert_eq!(quota.capacity(), 25);
    assert_eq!(quota.emission_interval_micros(), 100_000);
    assert_eq!(parse("10/s gcra").unwrap().capacity(), 10);
    // ceil(W / L): 3 per second is one every 333_334 µs, never faster.
    assert_eq!(
        parse("3/s gcra").unwrap().emission_interval_micros(),
        333_334
    );
}

#[test]
fn sliding_counter_without_granularity_picks_a_divisor() {
    let quota = parse("100/1m sliding-counter").unwrap();
    assert_eq!(quota.granularity_micros(), Some(1_000_000));
    let odd = parse("100/7ms sliding-counter").unwrap();
    assert_eq!(odd.granularity_micros(), Some(1_000));
    let half = parse("100/500ms sliding-counter").unwrap();
    let g = half.granularity_micros().unwrap();
    assert_eq!(500_000 % g, 0);
    assert!(500_000 / g <= 60);
}

#[test]
fn rejects_invalid_input_with_a_typed_error() {
    type IsExpected = fn(&QuotaError) -> bool;
    let cases: Vec<(&str, IsExpected)> = vec![
        ("", |e| matches!(e, QuotaError::Syntax { .. })),
        ("   ", |e| matches!(e, QuotaError::Syntax { .. })),
        ("100", |e| matches!(e, QuotaError::Syntax { .. })),
        ("0/1m", |e| matches!(e, QuotaError::ZeroLimit)),
        ("-1/1m", |e| matches!(e, QuotaError::InvalidLimit(_))),
        ("abc/1m", |e| matches!(e, QuotaError::InvalidLimit(_))),
        ("/1m", |e| matches!(e, QuotaError::InvalidLimit(_))),
        ("4294967296/1m", |e| {
            matches!(e, QuotaError::InvalidLimit(_))
        }),
        ("10/0s", |e| matches!(e, QuotaError::ZeroWindow)),
        ("10/1w", |e| matches!(e, QuotaError::UnknownUnit(_))),
        ("10/1", |e| matches!(e, QuotaError::UnknownUnit(_))),
        ("10/", |e| matches!(e, QuotaError::UnknownUnit(_))),
        ("10/1.5s", |e| matches!(e, QuotaError::UnknownUnit(_))),
        ("10/367d", |e| matches!(e, QuotaError::WindowTooLong)),
        ("10/99999999999999999999d", |e| {
            matches!(e, QuotaError::WindowTooLong)
        }),
        ("10/18446744073709551615ms", |e| {
            matches!(e, QuotaError::WindowTooLong)
        }),
        ("10/1m sliding-counter(7s)", |e| {
            matches!(e, QuotaError::GranularityDoesNotDivide { .. })
        }),
        ("10/1m sliding-counter(0s)", |e| {
            matches!(e, QuotaError::ZeroGranularity)
        }),
        ("10/1h sliding-counter(1ms)", |e| {
            matches!(e, QuotaError::TooManyBuckets { .. })
        }),
        ("10/1m sliding-counter(1s", |e| {
            matches!(e, QuotaError::Syntax { .. })
        }),
        ("10/1m gcra(burst=0)", |e| {
            matches!(e, QuotaError::InvalidBurst(_))
        }),
        ("10/1m gcra(burst=x)", |e| {
            matches!(e, QuotaError::InvalidBurst(_))
        }),
        ("1/366d gcra(burst=2)", |e| {
            matches!(e, QuotaError::BurstTooLarge)
        }),
        ("10/1m gcra(rate=2)", |e| {
            matches!(e, QuotaError::Syntax { .. })
        }),
        ("10/1m token-bucket", |e| {
            matches!(e, QuotaError::UnknownAlgorithm(_))
        }),
        ("10/1m fixed-window(1s)", |e| {
            matches!(e, QuotaError::UnknownAlgorithm(_))
        }),
    ];
    for (text, is_expected) in cases {
        match parse(text) {
            Ok(q) => panic!("{text:?} parsed as {q}"),
            Err(e) => {
                assert!(is_expected(&e), "{text:?} gave unexpected error {e:?}");
                assert!(!e.to_string().is_empty());
            }
        }
    }
}

#[test]
fn error_messages_name_the_problem() {
    let e = parse("10/1m sliding-counter(7s)").unwrap_err().to_string();
    assert!(e.contains("does not divide"), "{e}");
    let e = parse("0/1m").unwrap_err().to_string();
    assert!(e.contains("at least 1"), "{e}");
    let e = parse("10/1w").unwrap_err().to_string();
    assert!(e.contains("\"w\"") && e.contains("ms, s, m, h or d"), "{e}");
}

#[test]
fn builder_validates_like_the_parser() {
    let q = Quota::builder()
        .limit(100)
        .window(Duration::from_secs(60))
        .build()
        .unwrap();
    assert_eq!(q, parse("100/1m").unwrap());
    assert_eq!(Quota::per_minute(100).unwrap(), q);
    assert_eq!(Quota::per_second(10).unwrap(), parse("10/1s").unwrap());
    assert_eq!(Quota::per_hour(5).unwrap(), parse("5/1h").unwrap());

    assert_eq!(
        Quota::builder().window(Duration::from_secs(1)).build(),
        Err(QuotaError::MissingLimit)
    );
    assert_eq!(
        Quota::builder().limit(1).build(),
        Err(QuotaError::MissingWindow)
    );
    assert_eq!(
        Quota::per(0, Duration::from_secs(1)),
        Err(QuotaError::ZeroLimit)
    );
    assert_eq!(Quota::per(1, Duration::ZERO), Err(QuotaError::ZeroWindow));
    assert!(matches!(
        Quota::per(1, Duration::from_micros(1500)),
        Err(QuotaError::Precision(_))
    ));
    assert!(matches!(
        Quota::per(1, Duration::MAX),
        Err(QuotaError::WindowTooLong)
    ));
    assert!(matches!(
        Quota::builder()
            .limit(1)
            .window(Duration::from_secs(1))
            .burst(3)
            .build(),
        Err(QuotaError::BurstWithoutGcra("sliding-log"))
    ));
    assert!(matches!(
        Quota::builder()
            .limit(1)
            .window(Duration::from_secs(1))
            .name("bad name")
            .build(),
        Err(QuotaError::InvalidName(_))
    ));
    assert!(matches!(
        Quota::per_second(1).unwrap().named(""),
        Err(QuotaError::InvalidName(_))
    ));
}

#[test]
fn names_separate_quotas() {
    let a = parse("10/s").unwrap();
    let b = a.clone().named("search").unwrap();
    assert_eq!(b.name(), "search");
    assert_ne!(a, b);
    assert_ne!(a.id(), b.id());
    assert_eq!(a.to_string(), b.to_string());
}

#[test]
fn display_uses_the_largest_exact_unit() {
    assert_eq!(parse("10/60s").unwrap().to_string(), "10/1m");
    assert_eq!(parse("10/90s").unwrap().to_string(), "10/90s");
    assert_eq!(parse("10/1000ms").unwrap().to_string(), "10/1s");
    assert_eq!(parse("10/24h").unwrap().to_string(), "10/1d");
    assert_eq!(
        parse("10/1m sliding-counter(1000ms)").unwrap().to_string(),
        "10/1m sliding-counter(1s)"
    );
    assert_eq!(
        parse("10/s gcra(burst=3)").unwrap().to_string(),
        "10/1s gcra(burst=3)"
    );
    assert_eq!(parse("10/s sliding-log").unwrap().to_string(), "10/1s");
}

#[cfg(feature = "serde")]
#[test]
fn serde_accepts_text_and_named_tables() {
    let q: Quota = serde_json::from_str("\"100/1m fixed-window\"").unwrap();
    assert_eq!(q.algorithm(), Algorithm::FixedWindow);
    assert_eq!(
        serde_json::to_string(&q).unwrap(),
        "\"100/1m fixed-window\""
    );

    let named: Quota = serde_json::from_str(r#"{"name":"search","quota":"5/s gcra"}"#).unwrap();
    assert_eq!(named.name(), "search");
    let back: Quota = serde_json::from_str(&serde_json::to_string(&named).unwrap()).unwrap();
    assert_eq!(back, named);

    let err = serde_json::from_str::<Quota>("\"0/1m\"")
        .unwrap_err()
        .to_string();
    assert!(err.contains("at least 1"), "{err}");
    assert!(serde_json::from_str::<Quota>("42").is_err());
}

fn arb_quota() -> impl Strategy<Value = Quota> {
    let units = prop::sample::select(vec![1u64, 1_000, 60_000, 3_600_000, 86_400_000]);
    (1u32.., 1u64..=400, units, 0u8..4, 1u32..1000, 1u64..=60).prop_filter_map(
        "valid quotas only",
        |(limit, count, unit_ms, algorithm, burst, buckets)| {
            let window = Duration::from_millis(count * unit_ms);
            let builder = Quota::builder().limit(limit).window(window);
            let builder = match algorithm {
                0 => builder,
                1 => builder.granularity(window / u32::try_from(buckets).ok()?),
                2 => builder.algorithm(Algorithm::FixedWindow),
                _ => builder.algorithm(Algorithm::Gcra).burst(burst),
            };
            builder.build().ok()
        },
    )
}

proptest! {
    #[test]
    fn display_round_trips(quota in arb_quota()) {
        let text = quota.to_string();
        let parsed: Quota = text.parse().unwrap();
        prop_assert_eq!(parsed, quota);
    }

    #[test]
    fn garbage_never_panics(text in ".{0,40}") {
        let _ = text.parse::<Quota>();
    }

    #[test]
    fn near_valid_garbage_never_panics(limit in "[0-9]{0,12}", count in "[0-9]{0,22}", unit in "(ms|s|m|h|d|x|)", rest in "( sliding-counter\\([0-9]{0,6}(ms|s|m)?\\)| gcra\\(burst=[0-9]{0,11}\\)| fixed-window|)") {
        let text = format!("{limit}/{count}{unit}{rest}");
        if let Ok(quota) = text.parse::<Quota>() {
            prop_assert!(quota.limit() >= 1);
            prop_assert!(quota.window() > Duration::ZERO);
            prop_assert!(quota.window() <= tower_window::quota::MAX_WINDOW);
        }
    }
}
