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
    /// The seat's id, unique in the cluster (node id and a sequence).
    pub id: &'a [u8],
    /// Whether the seat also counts against a per-tenant cap: its keys
    /// then live with the tenant's (one slot per tenant on a cluster).
    pub tenant_capped: bool,
}

impl<'a> SeatRef<'a> {
    /// A seat `id` of `key`, in the subject form or (`tenant_capped`) the
    /// tenant form.
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
    /// was granted before, for any subject (0: none), kept by the caller so
    /// that it survives a store that lost the subject's counter.
    pub fence_floor: u64,
}

impl<'a> GrantRequest<'a> {
    /// A grant of `seat` for `ttl` under the given caps (0 = no cap).
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

    /// The same grant, with a fence above `floor` (see
    /// [`fence_floor`](Self::fence_floor)).
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
        /// The fencing token; see
        /// [`ConnectionSeat::fence`](super::ConnectionSeat::fence).
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
        /// Until the oldest of them expires unless renewed (a release may
        /// free a place sooner).
        retry_after: Duration,
    },
}

/// What a backend does for connection caps: per subject a set of seat
/// ids, each with an expiry on the backend's clock.
///
/// Implemented by [`MemoryStore`](crate::MemoryStore) and (feature `redis`)
/// [`RedisStore`](crate::RedisStore); the differential suite checks both. A
/// [`ConnectionLimiter`](super::ConnectionLimiter) calls it through its
/// store's resilience stack.
pub trait Backend: Send + Sync + 'static {
    /// Purges the subject's expired seats, then grants `request.seat`
    /// if every cap admits it, atomically, with a fence larger than the
    /// subject's last one, than the backend's clock (µs) and than
    /// `request.fence_floor`. Grants, renewals and releases only ever
    /// extend how long a subject's set (and its counter) is kept: it lives
    /// at least as long as its longest live seat, whatever TTLs the
    /// callers use.
    fn grant<'a>(&'a self, guard: &mut Guard<'a>, request: GrantRequest<'a>) -> Op<'a, GrantReply>;

    /// Extends each seat that is still live to `now + ttl` and answers,
    /// in order, whether it was live. A seat found expired or gone is
    /// removed and answered `false`, never granted again. Every seat of
    /// one call has the same [`seat_partition`](Self::seat_partition).
    fn renew<'a>(
        &'a self,
        guard: &mut Guard<'a>,
        seats: &'a [SeatRef<'a>],
        ttl: Duration,
    ) -> Op<'a, Vec<bool>>;

    /// Removes a seat; `true` if it was there.
    fn release<'a>(&'a self, guard: &mut Guard<'a>, seat: SeatRef<'a>) -> Op<'a, bool>;

    /// Live (unexpired) seats of `key` (in the given form).
    fn presence<'a>(
        &'a self,
        guard: &mut Guard<'a>,
        key: &'a WindowKey,
        tenant_capped: bool,
    ) -> Op<'a, u32>;

    /// Which seats may be renewed in one call: seats of one partition
    /// (a Redis Cluster hash slot) may. The default: all (0).
    fn seat_partition(&self, key: &WindowKey, tenant_capped: bool) -> u16 {
        let _ = (key, tenant_capped);
        0
    }

    /// The failure domain of a partition (a cluster primary), for the
    /// store's per-domain breakers; `None` by default.
    fn partition_failure_domain(&self, partition: u16) -> Option<u16> {
        let _ = partition;
        None
    }

    /// The most seats renewed in one call (default 1000), by
    /// [`renew`](Self::renew) or [`renew_routed`](Self::renew_routed).
    fn max_renew_batch(&self) -> usize {
        1_000
    }

    /// Which partitions share one round trip: seats of partitions with
    /// the same `Some(route)` may be renewed together by
    /// [`renew_routed`](Self::renew_routed) (on a Redis Cluster, the
    /// primary serving the hash slot). `None` (the default): one
    /// [`renew`](Self::renew) per partition.
    fn renew_route(&self, partition: u16) -> Option<u16> {
        let _ = partition;
        None
    }

    /// Like [`renew`](Self::renew) for seats of several partitions of one
    /// [`renew_route`](Self::renew_route), in one round trip. Answers per
    /// seat, in order, `Some(live)`, or `None` when this call could not
    /// renew it (its partition is no longer where the route led, e.g. a
    /// hash slot moved): the caller renews those with
    /// [`renew`](Self::renew), per partition. A `None` seat was not
    /// found gone. The default calls [`renew`](Self::renew).
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
