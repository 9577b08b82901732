//! [`RoomName`]: a room's name, checked once.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A room's name: 1 to [`MAX_LEN`](Self::MAX_LEN) characters of
/// `[A-Za-z0-9_.-]`.
///
/// The narrow alphabet keeps each room's event-window key its own. It
/// deserializes only from a valid string, so `Path<RoomName>` answers a
/// bad name with `400` before any upgrade.
///
/// ```
/// use axum_window_ext::ws::rooms::RoomName;
///
/// assert_eq!("lobby".parse::<RoomName>()?.as_str(), "lobby");
/// assert!(RoomName::new("a b").is_err());
/// assert!(RoomName::new("x".repeat(65)).is_err());
/// # Ok::<(), axum_window_ext::ws::rooms::InvalidRoomName>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct RoomName(String);

impl RoomName {
    /// The longest name, in characters (all ASCII, so also in bytes).
    pub const MAX_LEN: usize = 64;

    /// `name`, if it is valid.
    pub fn new(name: impl Into<String>) -> Result<Self, InvalidRoomName> {
        let name = name.into();
        if Self::is_valid(&name) {
            Ok(Self(name))
        } else {
            Err(InvalidRoomName(()))
        }
    }

    /// Whether `name` is a valid room name.
    pub fn is_valid(name: &str) -> bool {
        (1..=Self::MAX_LEN).contains(&name.len())
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RoomName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for RoomName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl FromStr for RoomName {
    type Err = InvalidRoomName;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Self::new(name)
    }
}

impl TryFrom<String> for RoomName {
    type Error = InvalidRoomName;

    fn try_from(name: String) -> Result<Self, Self::Error> {
        Self::new(name)
    }
}

impl From<RoomName> for String {
    fn from(name: RoomName) -> Self {
        name.0
    }
}

/// A string that is not a [`RoomName`].
#[derive(Clone, PartialEq, Eq)]
pub struct InvalidRoomName(());

/// The readable message, for `?` in `main`.
impl fmt::Debug for InvalidRoomName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "InvalidRoomName: {self}")
    }
}

impl fmt::Display for InvalidRoomName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a room name is 1 to 64 characters of [A-Za-z0-9_.-]")
    }
}

impl std::error::Error for InvalidRoomName {}

#[cfg(test)]
mod tests {
    use super::RoomName;

    #[test]
    fn room_names() {
        for good in ["a", "A-z_0.9", &"x".repeat(64)] {
            assert!(RoomName::is_valid(good), "{good}");
            assert_eq!(RoomName::new(good).as_ref().map(RoomName::as_str), Ok(good));
        }
        for bad in ["", "a b", "a/b", "é", "a:b", &"x".repeat(65)] {
            assert!(!RoomName::is_valid(bad), "{bad}");
            assert!(RoomName::new(bad).is_err(), "{bad}");
        }
    }

    #[test]
    #[allow(clippy::unwrap_used)]
    fn the_error_reads_the_same_through_debug() {
        let error = "a/b".parse::<RoomName>().unwrap_err();
        assert_eq!(
            format!("{error:?}"),
            "InvalidRoomName: a room name is 1 to 64 characters of [A-Za-z0-9_.-]"
        );
    }

    #[test]
    fn deserializing_refuses_a_bad_name() {
        let good: Result<RoomName, _> = serde_json::from_str(r#""lobby""#);
        assert_eq!(good.ok().as_ref().map(RoomName::as_str), Some("lobby"));
        let bad: Result<RoomName, _> = serde_json::from_str(r#""a/b""#);
        assert!(bad.is_err());
    }
}
