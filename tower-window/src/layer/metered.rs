//! [`Metered`]: a mode whose cost is known only from the response (tokens
//! of a streamed answer): the check reserves an estimate, the response's
//! end settles the usage.

use http::header::HeaderName;
use http::response::Parts;

use super::metering::{Meter, Metering};
use super::{Admission, Http, Rejection, Respond};
use crate::limit::{Reserved, Settlement};
use crate::{Check, Limiter, Policy, WindowKey};

/// Counts one response's usage: from its head (a header, an extension),
/// from the data frames the client is sent, or both.
pub trait UsageCounter: Send + 'static {
    /// Reads the response's head, before its body is sent.
    fn on_head(&mut self, head: &Parts) {
        let _ = head;
    }

    /// Counts one data frame (its first contiguous chunk: all of it for
    /// [`Bytes`](bytes::Bytes)) as the client is sent it.
    fn on_frame(&mut self, data: &[u8]) {
        let _ = data;
    }

    /// The usage so far: what is settled when the response ends, however
    /// it ends (complete, failed, or dropped when the client went away).
    fn usage(&self) -> u32;
}

/// Makes the [`UsageCounter`] of each admitted request; closures
/// `Fn() -> impl UsageCounter` implement it.
pub trait MeterUsage: Send + Sync + 'static {
    /// The counter.
    type Counter: UsageCounter;

    /// A counter for one response.
    fn counter(&self) -> Self::Counter;
}

impl<F, C> MeterUsage for F
where
    F: Fn() -> C + Send + Sync + 'static,
    C: UsageCounter,
{
    type Counter = C;

    fn counter(&self) -> C {
        self()
    }
}

/// A response's usage, put in its extensions by the inner service (read by
/// [`HeadUsage`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage(pub u32);

/// The usage a response's head reports: its [`Usage`] extension, else the
/// decimal value of a header, else 0 (nothing known to be used).
#[derive(Debug, Clone, Default)]
pub struct HeadUsage {
    header: Option<HeaderName>,
}

impl HeadUsage {
    /// Reads the [`Usage`] extension only.
    pub fn extension() -> Self {
        Self::default()
    }

    /// Reads the [`Usage`] extension, else the header `name` (a response
    /// header such as `x-usage-tokens`).
    pub fn header(name: HeaderName) -> Self {
        Self { header: Some(name) }
    }
}

impl MeterUsage for HeadUsage {
    type Counter = HeadCount;

    fn counter(&self) -> HeadCount {
        HeadCount {
            header: self.header.clone(),
            usage: 0,
        }
    }
}

/// The [`UsageCounter`] of [`HeadUsage`].
#[derive(Debug)]
pub struct HeadCount {
    header: Option<HeaderName>,
    usage: u32,
}

impl UsageCounter for HeadCount {
    fn on_head(&mut self, head: &Parts) {
        let from_header = || {
            let value = head.headers.get(self.header.as_ref()?)?;
            value.to_str().ok()?.trim().parse().ok()
        };
        self.usage = match head.extensions.get::<Usage>() {
            Some(Usage(units)) => *units,
            None => from_header().unwrap_or(0),
        };
    }

    fn usage(&self) -> u32 {
        self.usage
    }
}

/// The layer's mode for costs known only from the response: around another
/// mode `M` ([`Http`] by default), made by
/// [`SlidingWindowLayer::metered`](super::SlidingWindowLayer::metered).
///
/// - The check [reserves](Limiter::reserve) the request's cost (its
///   [`RequestCost`](super::RequestCost)): an estimate, or the minimum that
///   must remain. It never spends from a lease, and a policy with a GCRA
///   quota is refused (503): see [`Limiter::reserve`].
/// - The response's body is wrapped in a [`Metering`] body that feeds a
///   [`UsageCounter`] and, when the body ends, fails or is dropped (the
///   client went away), settles the counted usage exactly once
///   ([`Limiter::settle`]): what the reservation did not use is given back,
///   usage past it is recorded as debt. A request whose inner service fails
///   or whose response is abandoned settles a usage of 0.
/// - With [`cut_off`](Self::cut_off), a response whose usage reaches what
///   was reserved plus what remained at the check ends after that frame.
/// - Settles that wait for the store run in tasks: await
///   [`Limiter::settled`] on shutdown.
#[derive(Debug, Clone)]
pub struct Metered<U, M = Http> {
    usage: U,
    inner: M,
    cut_off: bool,
}

impl<U, M> Metered<U, M> {
    /// Meters usage with `usage` around the mode `inner`.
    pub fn new(usage: U, inner: M) -> Self {
        Self {
            usage,
            inner,
            cut_off: false,
        }
    }

    /// Whether a response whose usage reaches its budget (what was reserved
    /// plus what remained at the check) ends at the next frame boundary
    /// (off by default: it finishes, and its usage past the budget is debt).
    pub fn cut_off(mut self, enabled: bool) -> Self {
        self.cut_off = enabled;
        self
    }
}

impl<B, ResB, E, U, M> Respond<http::Request<B>, http::Response<ResB>, E> for Metered<U, M>
where
    M: Respond<http::Request<B>, http::Response<ResB>, E, Response = http::Response<ResB>>,
    U: MeterUsage,
{
    type Error = M::Error;
    type Response = http::Response<Metering<ResB, U::Counter>>;
    type Admitted = (M::Admitted, Meter<U::Counter>);

    fn check<'a>(
        &self,
        limiter: &'a Limiter,
        key: &'a WindowKey,
        policy: &'a Policy,
        cost: u32,
    ) -> Check<'a> {
        limiter.reserve(key, policy, cost)
    }

    fn on_request(
        &self,
        request: &mut http::Request<B>,
        admission: Admission<'_>,
    ) -> Self::Admitted {
        let (decision, cost) = (&admission.decision, admission.cost);
        let reserved = Reserved::of(decision, cost);
        let budget = self
            .cut_off
            .then(|| u64::from(cost) + u64::from(decision.remaining));
        let settlement =
            Settlement::new(admission.limiter, admission.key, admission.policy, reserved);
        let meter = Meter::new(self.usage.counter(), settlement, budget);
        (self.inner.on_request(request, admission), meter)
    }

    fn on_response(
        admitted: Option<Self::Admitted>,
        response: http::Response<ResB>,
    ) -> Self::Response {
        let Some((admitted, mut meter)) = admitted else {
            return M::on_response(None, response).map(Metering::unmetered);
        };
        let (head, body) = M::on_response(Some(admitted), response).into_parts();
        meter.counter.on_head(&head);
        http::Response::from_parts(head, Metering::new(body, meter))
    }

    fn on_rejection(&self, rejection: Rejection) -> Result<Self::Response, Self::Error> {
        let response = self.inner.on_rejection(rejection)?;
        Ok(response.map(Metering::unmetered))
    }

    fn map_error(error: E) -> Self::Error {
        M::map_error(error)
    }
}
