//! How many units a request consumes.

/// The quota units a request consumes; closures `Fn(&Req) -> u32`
/// implement it. A cost of `0` passes the request unchecked, uncounted and
/// without rate-limit headers.
pub trait RequestCost<Req>: Send + Sync {
    /// The cost of `request`.
    fn cost(&self, request: &Req) -> u32;
}

impl<F, Req> RequestCost<Req> for F
where
    F: Fn(&Req) -> u32 + Send + Sync,
{
    fn cost(&self, request: &Req) -> u32 {
        self(request)
    }
}

/// Every request costs one unit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UnitCost;

impl<Req> RequestCost<Req> for UnitCost {
    fn cost(&self, _request: &Req) -> u32 {
        1
    }
}
