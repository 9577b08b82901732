//! The connection-cap [`Backend`] trait and its requests and replies.

use std::time::Duration;

use crate::store::{Guard, Op};
use crate::WindowKey;

/// One seat as the store knows it: whose, and its id (unique per holder).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct SeatRef<'a> {
    /// The subject (tenant and subject) holding the seat.
    pub key: &'a WindowKey,
    /// The seat's id, unique in the cluster.
    pub id: &'a [u8],
    /// Whether the seat also counts against a per-tenant cap (its keys
    /// then live in the tenant's slot).
    pub tenant_capped: bool,
}

impl<'a> SeatRef<'a> {
    /// A seat `id` of `key`.
    pub fn new(key: &'a WindowKey, id: &'a [u8], tenant_capped: bool) -> Self {
        Self {
            key,
            id,
            tenant_capped,
        }
    }
}

/// Asks a store to grant one seat.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct GrantRequest<'a> {
    /// The seat to grant.
    pub seat: SeatRef<'a>,
    /// How long the seat lives unless renewed, on the store's clock.
    pub ttl: Duration,
    /// The most live seats per subject (0: no cap).
    pub max_per_subject: u32,
    /// The most live seats per tenant (0: no cap; needs `tenant_capped`).
    pub max_per_tenant: u32,
    /// The fence must be larger than this: the highest token the caller
    /// was granted before (0: none), so that tokens survive a store that
    /// lost the subject's counter.
    pub fence_floor: u64,
}

impl<'a> GrantRequest<'a> {
    /// A grant of `seat` for `ttl` under the given caps (0: no cap).
    pub fn new(
        seat: SeatRef<'a>,
        ttl: Duration,
        max_per_subject: u32,
        max_per_tenant: u32,
    ) -> Self {
        Self {
            seat,
            ttl,
            max_per_subject,
            max_per_tenant,
            fence_floor: 0,
        }
    }

    /// Sets [`fence_floor`](Self::fence_floor).
    pub fn with_fence_floor(mut self, floor: u64) -> Self {
        self.fence_floor = floor;
        self
    }
}

/// Which cap refused a grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CapScope {
    /// The per-subject cap.
    Subject,
    /// The per-tenant cap.
    Tenant,
}

impl CapScope {
    /// `"subject"` or `"tenant"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Subject => "subject",
            Self::Tenant => "tenant",
        }
    }
}

/// A store's answer to a [`GrantRequest`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum GrantReply {
    /// Granted; expired seats were purged first.
    Granted {
        /// See [`ConnectionSeat::fence`](super::ConnectionSeat::fence).
        fence: u64,
        /// Live seats of the subject, this one included.
        count: u32,
    },
    /// Refused: the cap is reached by live seats.
    Denied {
        /// Which cap.
        scope: CapScope,
        /// Live seats counted against it.
        count: u32,
        /// Until the oldest of them expires unless renewed.
        retry_after: Duration,
    },
}

/// What a backend does for connection caps: per subject a set of seat
/// ids, each with an expiry on the backend's clock. Implemented by
/// [`MemoryStore`](crate::MemoryStore) and [`RedisStore`](crate::RedisStore).
pub trait Backend: Send + Sync + 'static {
    /// Purges the subject's expired seats, then grants `request.seat`
    /// if every cap admits it, atomically, with a fence larger than the
    /// subject's last one, than the backend's clock (µs) and than
    /// `request.fence_floor`. A subject's set (and counter) lives at least
    /// as long as its longest live seat, whatever TTLs the callers use.
    fn grant<'a>(&'a self, guard: &mut Guard<'a>, request: GrantRequest<'a>) -> Op<'a, GrantReply>;

    /// Extends each seat that is still live to `now + ttl` and answers,
    /// in order, whether it was live; an expired seat is removed, never
    /// revived. All seats share one [`seat_partition`](Self::seat_partition).
    fn renew<'a>(
        &'a self,
        guard: &mut Guard<'a>,
        seats: &'a [SeatRef<'a>],
        ttl: Duration,
    ) -> Op<'a, Vec<bool>>;

    /// Removes a seat; `true` if it was there.
    fn release<'a>(&'a self, guard: &mut Guard<'a>, seat: SeatRef<'a>) -> Op<'a, bool>;

    /// Live seats of `key`.
    fn presence<'a>(
        &'a self,
        guard: &mut Guard<'a>,
        key: &'a WindowKey,
        tenant_capped: bool,
    ) -> Op<'a, u32>;

    /// Seats of one partition (a Redis Cluster hash slot) may be renewed
    /// in one call. The default: all (0).
    fn seat_partition(&self, key: &WindowKey, tenant_capped: bool) -> u16 {
        let _ = (key, tenant_capped);
        0
    }

    /// The failure domain of a partition (a cluster primary), for the
    /// store's breakers.
    fn partition_failure_domain(&self, partition: u16) -> Option<u16> {
        let _ = partition;
        None
    }

    /// The most seats renewed in one call. The default, 1,000, keeps one
    /// Redis script (about 30 ms on a busy 2-core machine) or one
    /// cluster pipeline within the store's default time budget.
    fn max_renew_batch(&self) -> usize {
        1_000
    }

    /// Seats of partitions with the same `Some(route)` (on a Redis Cluster,
    /// the primary serving the slot) may be renewed together by
    /// [`renew_routed`](Self::renew_routed); `None`: one
    /// [`renew`](Self::renew) per partition.
    fn renew_route(&self, partition: u16) -> Option<u16> {
        let _ = partition;
        None
    }

    /// [`renew`](Self::renew) for seats of several partitions of one
    /// [`renew_route`](Self::renew_route), in one round trip. `None` for a
    /// seat this call could not renew (its slot moved): the caller renews
    /// it with [`renew`](Self::renew).
    fn renew_routed<'a>(
        &'a self,
        guard: &mut Guard<'a>,
        seats: &'a [SeatRef<'a>],
        ttl: Duration,
    ) -> Op<'a, Vec<Option<bool>>> {
        self.renew(guard, seats, ttl)
            .map(|result| result.map(|alive| alive.into_iter().map(Some).collect()))
    }
}

impl crate::store::Backend {
    /// With connection seats.
    pub fn with_connections(self, connections: impl Backend) -> Self {
        self.with_part::<dyn Backend>(std::sync::Arc::new(connections))
    }
}
