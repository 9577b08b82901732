//! [`Cost`]: what one request weighs, never zero.

use std::fmt;
use std::num::NonZeroU32;

/// The units one request consumes in every quota of its policy: at least 1.
///
/// A zero cost cannot be represented, so no store, script or algorithm
/// checks for one: the one check is where a plain number becomes a `Cost`
/// ([`IntoCost`]), at the API's edge.
///
/// ```
/// use tower_window::Cost;
///
/// assert_eq!(Cost::ONE.get(), 1);
/// assert_eq!(Cost::new(5).map(Cost::get), Some(5));
/// assert!(Cost::new(0).is_none());
/// assert!(Cost::try_from(0u32).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cost(NonZeroU32);

impl Cost {
    /// One unit.
    pub const ONE: Cost = Cost(NonZeroU32::MIN);

    /// `units`, or `None` for 0.
    pub const fn new(units: u32) -> Option<Self> {
        match NonZeroU32::new(units) {
            Some(units) => Some(Cost(units)),
            None => None,
        }
    }

    /// The units.
    pub const fn get(self) -> u32 {
        self.0.get()
    }
}

impl From<NonZeroU32> for Cost {
    fn from(units: NonZeroU32) -> Self {
        Cost(units)
    }
}

impl From<Cost> for u32 {
    fn from(cost: Cost) -> Self {
        cost.get()
    }
}

impl TryFrom<u32> for Cost {
    type Error = ZeroCost;

    fn try_from(units: u32) -> Result<Self, ZeroCost> {
        Cost::new(units).ok_or(ZeroCost)
    }
}

impl fmt::Display for Cost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A cost of 0 was given: a request must cost at least 1 unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a request must cost at least 1 unit")]
pub struct ZeroCost;

/// What a cost may be given as: a [`Cost`], a [`NonZeroU32`], or a `u32`
/// (checked: 0 is [`ZeroCost`]).
pub trait IntoCost {
    /// The cost, or [`ZeroCost`].
    fn into_cost(self) -> Result<Cost, ZeroCost>;
}

impl IntoCost for Cost {
    fn into_cost(self) -> Result<Cost, ZeroCost> {
        Ok(self)
    }
}

impl IntoCost for NonZeroU32 {
    fn into_cost(self) -> Result<Cost, ZeroCost> {
        Ok(Cost(self))
    }
}

impl IntoCost for u32 {
    fn into_cost(self) -> Result<Cost, ZeroCost> {
        Cost::try_from(self)
    }
}
