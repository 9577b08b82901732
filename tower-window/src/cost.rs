//! [`Cost`]: what one request weighs, never zero.

use std::fmt;
use std::num::NonZeroU32;

/// The units one request consumes in every quota of its policy: at least 1,
/// so nothing past the API's edge ([`IntoCost`]) checks for zero.
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
#[derive(Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a request must cost at least 1 unit")]
pub struct ZeroCost;

crate::error_debug::debug_as_display!(ZeroCost);

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

/// A cost per quota: `costs[i]` units in quota `i` of a policy, for
/// [`Limiter::check_policy_per_quota`](crate::Limiter::check_policy_per_quota).
/// Not a slice, so a check holds it by one thin reference.
///
/// ```
/// use tower_window::{Cost, QuotaCosts};
///
/// let costs = QuotaCosts::from([Cost::ONE, Cost::new(60).expect("not zero")]);
/// assert_eq!(costs.len(), 2);
/// assert_eq!(costs[1].get(), 60);
/// let same: QuotaCosts = [1u32, 60].into_iter().filter_map(Cost::new).collect();
/// assert_eq!(same, costs);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct QuotaCosts(smallvec::SmallVec<[Cost; 4]>);

impl QuotaCosts {
    /// The costs, in policy order.
    pub fn as_slice(&self) -> &[Cost] {
        &self.0
    }
}

impl std::ops::Deref for QuotaCosts {
    type Target = [Cost];

    fn deref(&self) -> &[Cost] {
        &self.0
    }
}

impl FromIterator<Cost> for QuotaCosts {
    fn from_iter<I: IntoIterator<Item = Cost>>(costs: I) -> Self {
        QuotaCosts(costs.into_iter().collect())
    }
}

impl From<&[Cost]> for QuotaCosts {
    fn from(costs: &[Cost]) -> Self {
        costs.iter().copied().collect()
    }
}

impl From<Vec<Cost>> for QuotaCosts {
    fn from(costs: Vec<Cost>) -> Self {
        QuotaCosts(smallvec::SmallVec::from_vec(costs))
    }
}

impl<const N: usize> From<[Cost; N]> for QuotaCosts {
    fn from(costs: [Cost; N]) -> Self {
        costs.into_iter().collect()
    }
}
