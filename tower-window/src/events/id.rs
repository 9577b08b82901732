//! Positions in an event window: [`EventId`], [`Epoch`], [`Position`].

use std::fmt;
use std::str::FromStr;

/// The largest millisecond or sequence part an [`EventId`] may have: Lua
/// numbers (doubles) are exact up to 2^53.
pub const MAX_ID_PART: u64 = (1 << 53) - 1;

/// The id of one event, `<ms>-<seq>` (a Redis stream id): the store clock's
/// millisecond and a sequence number in it. Ids of one window only grow.
///
/// ```
/// use tower_window::events::EventId;
///
/// let id: EventId = "1700000000000-3".parse()?;
/// assert_eq!((id.millis(), id.seq()), (1_700_000_000_000, 3));
/// assert_eq!(id.to_string(), "1700000000000-3");
/// assert!(id > "1700000000000-2".parse()?);
/// assert!("12".parse::<EventId>().is_err());
/// # Ok::<(), tower_window::events::InvalidPosition>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct EventId {
    millis: u64,
    seq: u64,
}

impl EventId {
    /// The id before every event (`0-0`).
    pub const ZERO: EventId = EventId { millis: 0, seq: 0 };

    /// The id `<millis>-<seq>`; `None` if a part exceeds [`MAX_ID_PART`].
    pub fn new(millis: u64, seq: u64) -> Option<Self> {
        (millis <= MAX_ID_PART && seq <= MAX_ID_PART).then_some(Self { millis, seq })
    }

    /// The millisecond part.
    pub fn millis(&self) -> u64 {
        self.millis
    }

    /// The sequence number within [`millis`](Self::millis).
    pub fn seq(&self) -> u64 {
        self.seq
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.millis, self.seq)
    }
}

/// Digits only (`parse` alone takes a sign), at most 16 of them.
fn part(text: &str) -> Option<u64> {
    let digits = text.len() <= 16 && text.bytes().all(|b| b.is_ascii_digit());
    digits.then(|| text.parse().ok()).flatten()
}

impl FromStr for EventId {
    type Err = InvalidPosition;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        text.split_once('-')
            .and_then(|(millis, seq)| Self::new(part(millis)?, part(seq)?))
            .ok_or(InvalidPosition::EventId)
    }
}

/// The generation of an event window's history (see the [module](super)):
/// 1 to 64 lowercase hexadecimal digits, as every store makes them, so a
/// client sending anything else gets a refusal, not a resync.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Epoch(String);

impl Epoch {
    /// The most characters an epoch has.
    pub const MAX_LEN: usize = 64;

    /// An epoch a store made.
    pub(crate) fn made(text: String) -> Self {
        debug_assert!(text.parse::<Epoch>().is_ok(), "{text}");
        Self(text)
    }

    /// The epoch as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for Epoch {
    type Err = InvalidPosition;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let valid = (1..=Self::MAX_LEN).contains(&text.len())
            && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        valid
            .then(|| Self(text.to_owned()))
            .ok_or(InvalidPosition::Epoch)
    }
}

/// Where a reader stands: the epoch it read in and the last event it received.
///
/// ```
/// use tower_window::events::{EventId, Position};
///
/// let position = Position::parse("18c0f3a1", "")?; // never received an event
/// assert_eq!(position.last_id, None);
/// assert_eq!(position.after(), EventId::ZERO);
/// let position = Position::parse("18c0f3a1", "1700000000000-0")?;
/// assert_eq!(position.after().millis(), 1_700_000_000_000);
/// assert!(Position::parse("", "1-0").is_err());
/// # Ok::<(), tower_window::events::InvalidPosition>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Position {
    /// The epoch the reader read in.
    pub epoch: Epoch,
    /// The last event received.
    pub last_id: Option<EventId>,
}

impl Position {
    /// A position in `epoch` after `last_id`.
    pub fn new(epoch: Epoch, last_id: Option<EventId>) -> Self {
        Self { epoch, last_id }
    }

    /// A position from text: an epoch and an event id (empty: none yet).
    pub fn parse(epoch: &str, last_id: &str) -> Result<Self, InvalidPosition> {
        let last_id = (!last_id.is_empty()).then(|| last_id.parse()).transpose()?;
        Ok(Self::new(epoch.parse()?, last_id))
    }

    /// The id the reader's next event follows ([`EventId::ZERO`] if none).
    pub fn after(&self) -> EventId {
        self.last_id.unwrap_or(EventId::ZERO)
    }
}

/// A text that is not an [`EventId`] or an [`Epoch`].
#[derive(Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidPosition {
    /// Not `<ms>-<seq>` with each part at most [`MAX_ID_PART`].
    #[error("an event id is <ms>-<seq>, two numbers up to 2^53 - 1")]
    EventId,
    /// Not 1 to 64 lowercase hexadecimal digits.
    #[error("an epoch is 1 to 64 lowercase hexadecimal digits")]
    Epoch,
}

crate::error_debug::debug_as_display!(InvalidPosition { EventId, Epoch });

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn ids_parse_strictly_and_order_numerically() {
        for bad in [
            "",
            "-",
            "1-",
            "-1",
            "1",
            "1-2-3",
            "+1-2",
            "1 -2",
            "a-1",
            "1-0x1",
            "99999999999999999-0",
            "9007199254740992-0",
        ] {
            assert_eq!(
                bad.parse::<EventId>(),
                Err(InvalidPosition::EventId),
                "{bad:?}"
            );
        }
        let max: EventId = "9007199254740991-9007199254740991".parse().unwrap();
        assert_eq!(max.millis(), MAX_ID_PART);
        let a: EventId = "9-10".parse().unwrap();
        let b: EventId = "10-1".parse().unwrap();
        let c: EventId = "10-2".parse().unwrap();
        assert!(a < b && b < c);
        assert_eq!(b.to_string(), "10-1");
        assert!(EventId::ZERO < a);
    }

    #[test]
    fn epochs_are_bounded_and_plain() {
        assert!("abcdef0123456789".parse::<Epoch>().is_ok());
        assert!("f".repeat(64).parse::<Epoch>().is_ok());
        for bad in [
            "",
            "a b",
            "a:b",
            "é",
            "zz",
            "ABC",
            "a-1",
            "a_1",
            &"f".repeat(65),
        ] {
            assert_eq!(bad.parse::<Epoch>(), Err(InvalidPosition::Epoch), "{bad:?}");
        }
        assert!(Position::parse("e", "x").is_err());
        assert_eq!(Position::parse("e", "").unwrap().after(), EventId::ZERO);
    }
}
