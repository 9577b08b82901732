//! One backend value reached both directly and through a
//! [`Store`](tower_window::Store) handle.
//!
//! The conformance and differential harnesses call a backend directly
//! (through its capability traits, with [`Guard::bare`]) and also through
//! the capability types made from a store handle (`Limiter`,
//! `ConnectionLimiter`, `DedupWindow`, `EventWindow`). [`Shared`] holds the
//! backend in an [`Arc`] and implements every capability trait the backend
//! implements by delegation, so both paths reach the same state — the
//! generic harnesses cannot build a store handle from `Arc<S>` otherwise.

use std::sync::Arc;
use std::time::Duration;

use tower_window::conn::{self, GrantReply, GrantRequest, SeatRef};
use tower_window::dedup::{self, DedupRequest};
use tower_window::events::{self, Appended, EventRequest, Position, Resume};
use tower_window::lease::{self, RefundRequest, Reservation, ReserveRequest};
use tower_window::limit;
use tower_window::store::{Guard, Op};
use tower_window::{CheckRequest, Decision, Policy, WindowKey};

/// A backend of windows and quota leases: what the quota suites call
/// directly (`Arc<dyn Quotas>` holds a memory or a Redis backend).
pub trait Quotas: limit::Backend + lease::Backend {}

impl<T: limit::Backend + lease::Backend> Quotas for T {}

/// A backend shared by reference count; see the [module docs](self).
#[derive(Debug)]
pub struct Shared<S>(pub Arc<S>);

impl<S> Clone for Shared<S> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

impl<S> Shared<S> {
    /// Another handle on the backend in `backend`.
    pub fn of(backend: &Arc<S>) -> Self {
        Self(Arc::clone(backend))
    }
}

impl<S: limit::Backend> limit::Backend for Shared<S> {
    fn check<'a>(
        &'a self,
        guard: &mut Guard<'a>,
        request: CheckRequest<'a>,
    ) -> Op<'static, Decision> {
        self.0.check(guard, request)
    }

    fn peek<'a>(
        &'a self,
        guard: &mut Guard<'a>,
        request: CheckRequest<'a>,
    ) -> Op<'static, Decision> {
        self.0.peek(guard, request)
    }

    fn failure_domain(&self, key: &WindowKey, policy: &Policy) -> Option<u16> {
        self.0.failure_domain(key, policy)
    }
}

impl<S: lease::Backend> lease::Backend for Shared<S> {
    fn reserve<'a>(
        &'a self,
        guard: &mut Guard<'a>,
        request: ReserveRequest<'a>,
    ) -> Op<'a, Reservation> {
        self.0.reserve(guard, request)
    }

    fn refund<'a>(&'a self, guard: &mut Guard<'a>, request: RefundRequest<'a>) -> Op<'a, u32> {
        self.0.refund(guard, request)
    }
}

impl<S: conn::Backend> conn::Backend for Shared<S> {
    fn grant<'a>(&'a self, guard: &mut Guard<'a>, request: GrantRequest<'a>) -> Op<'a, GrantReply> {
        self.0.grant(guard, request)
    }

    fn renew<'a>(
        &'a self,
        guard: &mut Guard<'a>,
        seats: &'a [SeatRef<'a>],
        ttl: Duration,
    ) -> Op<'a, Vec<bool>> {
        self.0.renew(guard, seats, ttl)
    }

    fn release<'a>(&'a self, guard: &mut Guard<'a>, seat: SeatRef<'a>) -> Op<'a, bool> {
        self.0.release(guard, seat)
    }

    fn presence<'a>(
        &'a self,
        guard: &mut Guard<'a>,
        key: &'a WindowKey,
        tenant_capped: bool,
    ) -> Op<'a, u32> {
        self.0.presence(guard, key, tenant_capped)
    }

    fn seat_partition(&self, key: &WindowKey, tenant_capped: bool) -> u16 {
        self.0.seat_partition(key, tenant_capped)
    }

    fn partition_failure_domain(&self, partition: u16) -> Option<u16> {
        self.0.partition_failure_domain(partition)
    }

    fn max_renew_batch(&self) -> usize {
        self.0.max_renew_batch()
    }

    fn renew_route(&self, partition: u16) -> Option<u16> {
        self.0.renew_route(partition)
    }

    fn renew_routed<'a>(
        &'a self,
        guard: &mut Guard<'a>,
        seats: &'a [SeatRef<'a>],
        ttl: Duration,
    ) -> Op<'a, Vec<Option<bool>>> {
        self.0.renew_routed(guard, seats, ttl)
    }
}

impl<S: dedup::Backend> dedup::Backend for Shared<S> {
    fn first_seen<'a>(&'a self, guard: &mut Guard<'a>, request: DedupRequest<'a>) -> Op<'a, bool> {
        self.0.first_seen(guard, request)
    }

    fn failure_domain(&self, key: &WindowKey) -> Option<u16> {
        self.0.failure_domain(key)
    }
}

impl<S: events::Backend> events::Backend for Shared<S> {
    fn append<'a>(
        &'a self,
        guard: &mut Guard<'a>,
        request: EventRequest<'a>,
        fields: &'a [(&'a str, &'a [u8])],
    ) -> Op<'a, Appended> {
        self.0.append(guard, request, fields)
    }

    fn append_many<'a>(
        &'a self,
        guard: &mut Guard<'a>,
        request: EventRequest<'a>,
        events: &'a [&'a [(&'a str, &'a [u8])]],
    ) -> Op<'a, Vec<Appended>> {
        self.0.append_many(guard, request, events)
    }

    fn head<'a>(&'a self, guard: &mut Guard<'a>, request: EventRequest<'a>) -> Op<'a, Position> {
        self.0.head(guard, request)
    }

    fn read<'a>(
        &'a self,
        guard: &mut Guard<'a>,
        request: EventRequest<'a>,
        from: &'a Position,
        limit: u32,
    ) -> Op<'a, Resume> {
        self.0.read(guard, request, from, limit)
    }

    fn len<'a>(&'a self, guard: &mut Guard<'a>, request: EventRequest<'a>) -> Op<'a, u64> {
        self.0.len(guard, request)
    }

    fn failure_domain(&self, key: &[u8]) -> Option<u16> {
        self.0.failure_domain(key)
    }
}
