//! [`Metering`]: a response body that counts what the client is sent and
//! settles it exactly once, however the body ends.

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Buf;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::metered::UsageCounter;
use crate::limit::Settlement;

/// What a metered response settles: its counter, and the reservation's
/// settle, owed until the body ends or is dropped.
#[derive(Debug)]
pub struct Meter<C: UsageCounter> {
    pub(super) counter: C,
    settlement: Option<Settlement>,
    /// With cut-off: the usage at which the body ends.
    budget: Option<u64>,
}

impl<C: UsageCounter> Meter<C> {
    pub(super) fn new(counter: C, settlement: Settlement, budget: Option<u64>) -> Self {
        Self {
            counter,
            settlement: Some(settlement),
            budget,
        }
    }

    /// Settles what the counter holds now; later calls do nothing.
    fn settle(&mut self) {
        if let Some(settlement) = self.settlement.take() {
            settlement.settle(self.counter.usage());
        }
    }

    fn spent(&self) -> bool {
        self.budget
            .is_some_and(|budget| u64::from(self.counter.usage()) >= budget)
    }
}

impl<C: UsageCounter> Drop for Meter<C> {
    fn drop(&mut self) {
        // A body dropped before its end: the client went away, or the
        // server is shutting down. It is charged what it was sent.
        self.settle();
    }
}

pin_project! {
    /// The body of a [`Metered`](super::Metered) response: the inner body,
    /// whose data frames feed the request's [`UsageCounter`], settled when
    /// it ends, fails, or is dropped. Rejections and unchecked requests
    /// carry an unmetered one.
    pub struct Metering<B, C: UsageCounter> {
        #[pin]
        body: B,
        meter: Option<Meter<C>>,
        // Cut off: no frame after the one that spent the budget.
        ended: bool,
    }
}

impl<B, C: UsageCounter> Metering<B, C> {
    pub(super) fn new(body: B, meter: Meter<C>) -> Self {
        Self {
            meter: Some(meter),
            ..Self::unmetered(body)
        }
    }

    /// `body`, with nothing to count or settle.
    pub fn unmetered(body: B) -> Self {
        Self {
            body,
            meter: None,
            ended: false,
        }
    }

    /// The usage counted so far (`None` when unmetered or settled).
    pub fn usage(&self) -> Option<u32> {
        self.meter.as_ref().map(|meter| meter.counter.usage())
    }
}

impl<B, C> Body for Metering<B, C>
where
    B: Body,
    C: UsageCounter,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.project();
        if *this.ended {
            return Poll::Ready(None);
        }
        let frame = ready!(this.body.poll_frame(cx));
        match (&frame, this.meter.as_mut()) {
            (Some(Ok(frame)), Some(meter)) => {
                if let Some(data) = frame.data_ref() {
                    meter.counter.on_frame(data.chunk());
                    if meter.spent() {
                        *this.ended = true;
                        meter.settle();
                    }
                }
            }
            (_, Some(meter)) => meter.settle(),
            (_, None) => {}
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        if self.ended {
            SizeHint::with_exact(0)
        } else {
            self.body.size_hint()
        }
    }
}
