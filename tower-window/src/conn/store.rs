//! [`ConnectionStore`]: the store operations behind connection leases.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;

use crate::store::StoreError;
use crate::WindowKey;

/// One lease as the store knows it: whose, and its id (unique per holder).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct LeaseRef<'a> {
    /// The subject (tenant and subject) holding the lease.
    pub key: &'a WindowKey,
    /// The lease's id, unique in the cluster (node id and a sequence).
    pub id: &'a [u8],
    /// Whether the lease also counts against a per-tenant cap: its keys
    /// then live with the tenant's (one slot per tenant on a cluster).
    pub tenant_form: bool,
}

impl<'a> LeaseRef<'a> {
    /// A lease `id` of `key`, in the subject form or (`tenant_form`) the
    /// tenant form.
    pub fn new(key: &'a WindowKey, id: &'a [u8], tenant_form: bool) -> Self {
        Self {
            key,
            id,
            tenant_form,
        }
    }
}

/// Asks a store to grant one lease.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct GrantRequest<'a> {
    /// The lease to grant.
    pub lease: LeaseRef<'a>,
    /// How long the lease lives unless renewed, on the store's clock.
    pub ttl: Duration,
    /// The most live leases per subject (0: no cap).
    pub max_per_subject: u32,
    /// The most live leases per tenant (0: no cap; needs `tenant_form`).
    pub max_per_tenant: u32,
    /// The fence must be larger than this: the highest token the caller
    /// (a node's [`ConnectionLimiter`](super::ConnectionLimiter)) was
    /// granted before, for any subject (0: none). It is kept by the caller,
    /// not by the store, so it survives a store that lost the subject's
    /// counter (a failover under asynchronous replication, a restart).
    pub fence_floor: u64,
}

impl<'a> GrantRequest<'a> {
    /// A grant of `lease` for `ttl` under the given caps (0 = no cap).
    pub fn new(
        lease: LeaseRef<'a>,
        ttl: Duration,
        max_per_subject: u32,
        max_per_tenant: u32,
    ) -> Self {
        Self {
            lease,
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
    /// Granted; expired leases were purged first.
    Granted {
        /// The fencing token: `max(the subject's last token + 1, the
        /// store's clock in µs, request.fence_floor + 1)`; see
        /// [`ConnectionLease::fence`](super::ConnectionLease::fence) for
        /// what that guarantees.
        fence: u64,
        /// Live leases of the subject, this one included.
        count: u32,
    },
    /// Refused: the cap is reached by live leases.
    Denied {
        /// Which cap.
        scope: CapScope,
        /// Live leases counted against it.
        count: u32,
        /// Until the oldest of them expires unless renewed (a release may
        /// free a place sooner).
        retry_after: Duration,
    },
}

/// A store that keeps connection leases: per subject a set of lease ids,
/// each with an expiry on the store's clock.
///
/// Implemented by [`MemoryStore`](crate::MemoryStore) and (feature `redis`)
/// [`RedisStore`](crate::RedisStore); the conformance suite in the
/// `tower-window-tests` package checks both give the same answers.
/// A [`ConnectionLimiter`](super::ConnectionLimiter) calls it through its
/// [`Limiter`](crate::Limiter)'s resilience stack.
pub trait ConnectionStore: Send + Sync + 'static {
    /// Purges the subject's expired leases, then grants `request.lease`
    /// if every cap admits it, atomically, with a fence larger than the
    /// subject's last one, than the store's clock (µs) and than
    /// `request.fence_floor`. Grants, renewals and releases only ever
    /// extend how long a subject's set (and its counter) is kept: it lives
    /// at least as long as its longest live lease, whatever TTLs the
    /// callers use.
    fn grant<'a>(
        &'a self,
        request: GrantRequest<'a>,
    ) -> BoxFuture<'a, Result<GrantReply, StoreError>>;

    /// Extends each lease that is still live to `now + ttl` and answers,
    /// in order, whether it was live. A lease found expired or gone is
    /// removed and answered `false`, never granted again. Every lease of
    /// one call has the same [`lease_partition`](Self::lease_partition).
    fn renew<'a>(
        &'a self,
        leases: &'a [LeaseRef<'a>],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Vec<bool>, StoreError>>;

    /// Removes a lease; `true` if it was there.
    fn release<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// Live (unexpired) leases of `key` (in the given form).
    fn presence<'a>(
        &'a self,
        key: &'a WindowKey,
        tenant_form: bool,
    ) -> BoxFuture<'a, Result<u32, StoreError>>;

    /// Decides in-process, without awaiting, when the store can (memory);
    /// `None` (the default) means "await the operation". The same holds for
    /// every `*_sync` method.
    fn grant_sync(&self, request: GrantRequest<'_>) -> Option<Result<GrantReply, StoreError>> {
        let _ = request;
        None
    }

    /// See [`grant_sync`](Self::grant_sync).
    fn renew_sync(
        &self,
        leases: &[LeaseRef<'_>],
        ttl: Duration,
    ) -> Option<Result<Vec<bool>, StoreError>> {
        let _ = (leases, ttl);
        None
    }

    /// See [`grant_sync`](Self::grant_sync).
    fn release_sync(&self, lease: LeaseRef<'_>) -> Option<Result<bool, StoreError>> {
        let _ = lease;
        None
    }

    /// See [`grant_sync`](Self::grant_sync).
    fn presence_sync(&self, key: &WindowKey, tenant_form: bool) -> Option<Result<u32, StoreError>> {
        let _ = (key, tenant_form);
        None
    }

    /// Which leases may be renewed in one call: leases of one partition
    /// (a Redis Cluster hash slot) may. The default: all (0).
    fn lease_partition(&self, key: &WindowKey, tenant_form: bool) -> u16 {
        let _ = (key, tenant_form);
        0
    }

    /// The failure domain of a partition (a cluster primary), for the
    /// limiter's per-domain breakers; `None` by default.
    fn partition_failure_domain(&self, partition: u16) -> Option<u16> {
        let _ = partition;
        None
    }

    /// The most leases renewed in one call (default 1000).
    fn max_renew_batch(&self) -> usize {
        1_000
    }
}

impl<S: ConnectionStore + ?Sized> ConnectionStore for Arc<S> {
    fn grant<'a>(
        &'a self,
        request: GrantRequest<'a>,
    ) -> BoxFuture<'a, Result<GrantReply, StoreError>> {
        (**self).grant(request)
    }
    fn renew<'a>(
        &'a self,
        leases: &'a [LeaseRef<'a>],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Vec<bool>, StoreError>> {
        (**self).renew(leases, ttl)
    }
    fn release<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<bool, StoreError>> {
        (**self).release(lease)
    }
    fn presence<'a>(
        &'a self,
        key: &'a WindowKey,
        tenant_form: bool,
    ) -> BoxFuture<'a, Result<u32, StoreError>> {
        (**self).presence(key, tenant_form)
    }
    fn grant_sync(&self, request: GrantRequest<'_>) -> Option<Result<GrantReply, StoreError>> {
        (**self).grant_sync(request)
    }
    fn renew_sync(
        &self,
        leases: &[LeaseRef<'_>],
        ttl: Duration,
    ) -> Option<Result<Vec<bool>, StoreError>> {
        (**self).renew_sync(leases, ttl)
    }
    fn release_sync(&self, lease: LeaseRef<'_>) -> Option<Result<bool, StoreError>> {
        (**self).release_sync(lease)
    }
    fn presence_sync(&self, key: &WindowKey, tenant_form: bool) -> Option<Result<u32, StoreError>> {
        (**self).presence_sync(key, tenant_form)
    }
    fn lease_partition(&self, key: &WindowKey, tenant_form: bool) -> u16 {
        (**self).lease_partition(key, tenant_form)
    }
    fn partition_failure_domain(&self, partition: u16) -> Option<u16> {
        (**self).partition_failure_domain(partition)
    }
    fn max_renew_batch(&self) -> usize {
        (**self).max_renew_batch()
    }
}
