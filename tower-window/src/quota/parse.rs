//! The quota DSL, `<limit>/<window>[ <algorithm>]`: read by [`Quota`]'s
//! `FromStr`, written by its `Display`.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use super::{default_granularity, Quota, QuotaBuilder, QuotaError};
use crate::clock::duration_micros;
use crate::Algorithm;

/// DSL units and their size in microseconds, smallest first.
const UNITS: [(&str, u64); 5] = [
    ("ms", 1_000),
    ("s", 1_000_000),
    ("m", 60_000_000),
    ("h", 3_600_000_000),
    ("d", 86_400_000_000),
];

/// Parses a duration as the quota DSL writes it: `<n><unit>`, or `<unit>`
/// meaning 1, with the units `ms`, `s`, `m`, `h` and `d`. It checks the
/// form and that the result fits in `u64` microseconds; other bounds are
/// the caller's.
///
/// ```
/// use std::time::Duration;
/// use tower_window::quota::{parse_duration, QuotaError};
///
/// assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
/// assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
/// assert_eq!(parse_duration("m"), Ok(Duration::from_secs(60)));
/// assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
/// assert!(matches!(parse_duration("15"), Err(QuotaError::UnknownUnit(_))));
/// assert!(matches!(parse_duration("1.5s"), Err(QuotaError::UnknownUnit(_))));
/// ```
pub fn parse_duration(text: &str) -> Result<Duration, QuotaError> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let size = UNITS
        .iter()
        .find(|(name, _)| *name == unit)
        .map(|(_, size)| *size)
        .ok_or_else(|| QuotaError::UnknownUnit(unit.chars().take(16).collect()))?;
    let count: u64 = if number.is_empty() {
        1
    } else {
        number.parse().map_err(|_| QuotaError::WindowTooLong)?
    };
    let micros = count.checked_mul(size).ok_or(QuotaError::WindowTooLong)?;
    Ok(Duration::from_micros(micros))
}

fn syntax(input: &str, reason: &str) -> QuotaError {
    QuotaError::Syntax {
        input: input.chars().take(80).collect(),
        reason: reason.to_owned(),
    }
}

impl FromStr for Quota {
    type Err = QuotaError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let text = input.trim();
        if text.is_empty() {
            return Err(syntax(
                input,
                "empty; expected <limit>/<window>, e.g. 100/1m",
            ));
        }
        let (rate, algorithm) = match text.split_once(char::is_whitespace) {
            Some((rate, rest)) => (rate, Some(rest.trim())),
            None => (text, None),
        };
        let (limit, window) = rate
            .split_once('/')
            .ok_or_else(|| syntax(input, "expected <limit>/<window>, e.g. 100/1m"))?;
        // `u32`'s parser would also take a sign.
        let limit: u32 = Some(limit)
            .filter(|l| l.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|l| l.parse().ok())
            .ok_or_else(|| QuotaError::InvalidLimit(limit.chars().take(32).collect()))?;
        let mut builder = Quota::builder()
            .limit(limit)
            .window(parse_duration(window)?);
        if let Some(algorithm) = algorithm {
            builder = apply_algorithm(builder, algorithm)?;
        }
        builder.build()
    }
}

fn apply_algorithm(builder: QuotaBuilder, text: &str) -> Result<QuotaBuilder, QuotaError> {
    let (name, argument) = match text.split_once('(') {
        Some((name, rest)) => {
            let argument = rest
                .strip_suffix(')')
                .ok_or_else(|| syntax(text, "missing ')' after the algorithm's argument"))?;
            (name, Some(argument.trim()))
        }
        None => (text, None),
    };
    match (name, argument) {
        ("sliding-log", None) => Ok(builder.algorithm(Algorithm::SlidingLog)),
        ("fixed-window", None) => Ok(builder.algorithm(Algorithm::FixedWindow)),
        ("gcra", None) => Ok(builder.algorithm(Algorithm::Gcra)),
        ("gcra", Some(argument)) => {
            let burst = argument
                .strip_prefix("burst=")
                .ok_or_else(|| syntax(text, "expected gcra(burst=<n>)"))?;
            let value: u32 = burst
                .parse()
                .map_err(|_| QuotaError::InvalidBurst(burst.chars().take(32).collect()))?;
            Ok(builder.algorithm(Algorithm::Gcra).burst(value))
        }
        ("sliding-counter", Some(argument)) => Ok(builder.granularity(parse_duration(argument)?)),
        ("sliding-counter", None) => {
            let window = builder.window.unwrap_or(Duration::ZERO);
            Ok(builder.granularity(default_granularity(window)))
        }
        _ => Err(QuotaError::UnknownAlgorithm(
            text.chars().take(64).collect(),
        )),
    }
}

impl fmt::Display for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.0.limit, FormatDuration(self.window()))?;
        match (self.0.algorithm, self.0.burst) {
            (Algorithm::SlidingLog, _) => Ok(()),
            (Algorithm::Gcra, Some(burst)) => write!(f, " gcra(burst={burst})"),
            (algorithm, _) => write!(f, " {algorithm}"),
        }
    }
}

/// Writes a duration in the DSL's largest exact unit (`1m`, `90s`, `500ms`).
pub(crate) struct FormatDuration(pub(crate) Duration);

impl fmt::Display for FormatDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let micros = duration_micros(self.0);
        for (unit, size) in UNITS.iter().rev() {
            if micros.is_multiple_of(*size) {
                return write!(f, "{}{unit}", micros / size);
            }
        }
        write!(f, "{micros}us")
    }
}
