//! Positions in an event window: [`EventId`], [`Epoch`], [`Position`].

use std::fmt;
use std::str::FromStr;

/// The largest millisecond or sequence part an [`EventId`] may have: the
/// store's scripts compute with Lua numbers (doubles), exact up to 2^53.
pub const MAX_ID_PART: u64 = (1 << 53) - 1;

/// The id of one event: milliseconds of the store's clock when it was
/// appended, and a sequence number within that millisecond (a Redis
/// stream id, written `<ms>-<seq>`).
///
/// Ids of one window only grow: they order its events.
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

    /// The store clock's milliseconds when the event was appended.
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

fn part(text: &str) -> Option<u64> {
    // Digits only (no sign, no spaces), at most 16 of them.
    if text.is_empty() || text.len() > 16 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

impl FromStr for EventId {
    type Err = InvalidPosition;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (millis, seq) = text.split_once('-').ok_or(InvalidPosition::EventId)?;
        let millis = part(millis).ok_or(InvalidPosition::EventId)?;
        let seq = part(seq).ok_or(InvalidPosition::EventId)?;
        Self::new(millis, seq).ok_or(InvalidPosition::EventId)
    }
}

/// The generation of an event window's history.
///
/// A new epoch starts whenever the history may have been lost (see the
/// [module](super)); an [`EventId`] means something only together with
/// its epoch (a [`Position`]).
///
/// Epochs are 1 to 64 lowercase hexadecimal digits (`[0-9a-f]`), which is
/// what every store makes: anything else is malformed, so a client that
/// sends one gets a clear refusal instead of a resync.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Epoch(String);

impl Epoch {
    /// The most characters an epoch has.
    pub const MAX_LEN: usize = 64;

    /// An epoch a store made (already in the alphabet above).
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
        let valid = !text.is_empty()
            && text.len() <= Self::MAX_LEN
            && text
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if valid {
            Ok(Self(text.to_owned()))
        } else {
            Err(InvalidPosition::Epoch)
        }
    }
}

/// Where a reader stands in an event window: the epoch it read in and the
/// last event it received (`None`: none yet in that epoch).
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
    /// The epoch of the window when the reader read it.
    pub epoch: Epoch,
    /// The last event received, if any.
    pub last_id: Option<EventId>,
}

impl Position {
    /// A position in `epoch` after `last_id`.
    pub fn new(epoch: Epoch, last_id: Option<EventId>) -> Self {
        Self { epoch, last_id }
    }

    /// A position from its text form: an epoch and an event id, or an
    /// empty id for "no event received yet".
    pub fn parse(epoch: &str, last_id: &str) -> Result<Self, InvalidPosition> {
        let last_id = if last_id.is_empty() {
            None
        } else {
            Some(last_id.parse()?)
        };
        Ok(Self {
            epoch: epoch.parse()?,
            last_id,
        })
    }

    /// The id after which the reader's next event comes
    /// ([`EventId::ZERO`] when it received none).
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
