//! [`ConnectionLimiter`]: grants, presence and the live seats of a node.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use super::backend::{Backend, CapScope, GrantReply, GrantRequest, SeatRef};
use super::seat::{ConnectionSeat, SeatSource};
use crate::metrics::{Calls, LimiterMetrics};
use crate::store::guard::OnFailure;
use crate::store::{Guard, Op, Store, StoreError};
use crate::{FallbackReason, WindowKey};

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConnectionDenied {
    /// Which cap refused it.
    pub scope: CapScope,
    /// The cap.
    pub cap: u32,
    /// Live seats counted against it.
    pub count: u32,
    /// Until the oldest seat would expire unless renewed: an upper bound
    /// on the wait when its holder died; a release frees a place sooner.
    pub retry_after: Duration,
    /// `Some` when the store could not answer and [`OnFailure::FailClosed`] did.
    pub fallback: Option<FallbackReason>,
}

/// The answer of [`ConnectionLimiter::acquire`] (exhaustive: a
/// connection is admitted or not).
#[derive(Debug)]
pub enum Acquire {
    /// Admitted: hold the seat for the connection's life.
    Granted(ConnectionSeat),
    /// Refused: a cap is reached.
    Denied(ConnectionDenied),
}

/// A subject's live connections, cluster-wide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Presence {
    /// At least one live connection.
    pub online: bool,
    /// Live seats (unexpired on the store's clock).
    pub connections: u32,
}

/// Why a [`ConnectionLimiter`] could not answer or be built.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum ConnectionError {
    /// The seat TTL must be between 30 ms and 1 hour (a heartbeat every
    /// ttl/3 must stay above 10 ms).
    #[error("a connection seat ttl must be between 30ms and 1h")]
    InvalidTtl,
    /// The store failed (and, for a grant, the fallback is
    /// [`OnFailure::Error`]).
    #[error(transparent)]
    Store(#[from] StoreError),
}

crate::error_debug::debug_as_display!(ConnectionError { InvalidTtl, Store });

/// A cluster-wide cap on concurrent connections per subject; see the
/// [module docs](super).
///
/// Cheap to clone; clones share the node's live seats and heartbeat.
#[derive(Clone)]
pub struct ConnectionLimiter {
    pub(super) shared: Arc<Shared>,
}

pub(super) struct Shared {
    pub(super) store: Store,
    /// The store's backend of connection seats (`None`: it has none).
    pub(super) backend: Option<Arc<dyn Backend>>,
    /// Its store calls, recorded under the name `connections`.
    metrics: Arc<LimiterMetrics>,
    pub(super) ttl: Duration,
    max_per_subject: u32,
    max_per_tenant: u32,
    fallback: OnFailure,
    /// This node's random id: seat ids are `<node>:<sequence>`.
    node: String,
    seq: AtomicU64,
    /// The highest fencing token this node was granted (any subject): every
    /// grant asks for a larger one, so this node's tokens never go back even
    /// when the store lost what it knew (see `ConnectionSeat::fence`).
    fence_floor: AtomicU64,
    /// The live seats this limiter last added to the node's gauge.
    pub(super) reported_live: std::sync::atomic::AtomicI64,
    /// Seats granted by the store and not yet released or lost.
    pub(super) live: Mutex<HashMap<u64, Live>>,
}

/// One live seat, as the heartbeat sees it.
pub(super) struct Live {
    pub(super) key: WindowKey,
    pub(super) id: Vec<u8>,
    pub(super) lost: watch::Sender<bool>,
}

impl Shared {
    pub(super) fn tenant_capped(&self) -> bool {
        self.max_per_tenant > 0
    }

    pub(super) fn live(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Live>> {
        crate::sync::lock(&self.live)
    }

    /// One operation on the store's connection backend in `partition`,
    /// through the store's resilience stack.
    pub(super) fn call<'a, T: Send + 'a>(
        &'a self,
        partition: impl FnOnce(&dyn Backend) -> u16,
        operation: impl FnOnce(&'a dyn Backend, &mut Guard<'a>) -> Op<'a, T>,
    ) -> Op<'a, T> {
        self.store.call(
            self.backend.as_deref(),
            "connection caps",
            |backend| backend.partition_failure_domain(partition(backend)),
            Calls::to(&self.metrics, None),
            operation,
        )
    }

    /// The partition of `key`'s seats.
    fn partition_of<'k>(&self, key: &'k WindowKey) -> impl FnOnce(&dyn Backend) -> u16 + 'k {
        let tenant_capped = self.tenant_capped();
        move |backend| backend.seat_partition(key, tenant_capped)
    }

    /// Releases a seat in the store through the resilience stack.
    pub(super) async fn release(&self, key: &WindowKey, id: &[u8]) -> Result<bool, StoreError> {
        let seat = SeatRef::new(key, id, self.tenant_capped());
        let released = self
            .call(self.partition_of(key), |backend, guard| {
                backend.release(guard, seat)
            })
            .await?;
        crate::metrics::connection_released();
        Ok(released)
    }
}

impl ConnectionLimiter {
    /// The default seat TTL (15 s).
    pub const DEFAULT_TTL: Duration = Duration::from_secs(15);

    /// A builder for a limiter keeping seats in `store`, whose calls run
    /// through the store's resilience stack (recorded under the name
    /// `connections`).
    pub fn builder(store: impl Into<Store>) -> ConnectionLimiterBuilder {
        ConnectionLimiterBuilder {
            store: store.into(),
            ttl: Self::DEFAULT_TTL,
            max_per_subject: 0,
            max_per_tenant: 0,
            fallback: OnFailure::default(),
        }
    }

    /// The seat TTL.
    pub fn ttl(&self) -> Duration {
        self.shared.ttl
    }

    /// The cap per subject (0: none).
    pub fn max_per_subject(&self) -> u32 {
        self.shared.max_per_subject
    }

    /// The cap per tenant (0: none).
    pub fn max_per_tenant(&self) -> u32 {
        self.shared.max_per_tenant
    }

    /// Seats this node holds in the store and renews (degraded seats not
    /// included).
    pub fn live_seats(&self) -> usize {
        self.shared.live().len()
    }

    /// Grants a seat for one connection of `key`, or refuses it past a
    /// cap. Hold the seat while the connection lives, and close the
    /// connection when [`ConnectionSeat::lost`] fires.
    pub async fn acquire(&self, key: &WindowKey) -> Result<Acquire, ConnectionError> {
        let shared = &*self.shared;
        let seq = shared.seq.fetch_add(1, Ordering::Relaxed);
        let id = format!("{}:{seq:x}", shared.node).into_bytes();
        let tenant_capped = shared.tenant_capped();
        let request = GrantRequest::new(
            SeatRef::new(key, &id, tenant_capped),
            shared.ttl,
            shared.max_per_subject,
            shared.max_per_tenant,
        )
        .with_fence_floor(shared.fence_floor.load(Ordering::Acquire));
        let result = shared
            .call(shared.partition_of(key), |backend, guard| {
                backend.grant(guard, request)
            })
            .await;
        match result {
            Ok(GrantReply::Granted { fence, .. }) => {
                shared.fence_floor.fetch_max(fence, Ordering::AcqRel);
                let (sender, receiver) = watch::channel(false);
                shared.live().insert(
                    seq,
                    Live {
                        key: key.clone(),
                        id: id.clone(),
                        lost: sender,
                    },
                );
                crate::metrics::connection_grant("granted");
                Ok(Acquire::Granted(ConnectionSeat::new(
                    Arc::clone(&self.shared),
                    seq,
                    key.clone(),
                    id,
                    fence,
                    SeatSource::Store,
                    receiver,
                )))
            }
            Ok(GrantReply::Denied {
                scope,
                count,
                retry_after,
            }) => {
                crate::metrics::connection_grant("denied");
                Ok(Acquire::Denied(ConnectionDenied {
                    scope,
                    cap: match scope {
                        CapScope::Subject => shared.max_per_subject,
                        CapScope::Tenant => shared.max_per_tenant,
                    },
                    count,
                    retry_after,
                    fallback: None,
                }))
            }
            Err(error) => match shared.fallback {
                OnFailure::FailOpen => {
                    crate::metrics::connection_grant("fallback_granted");
                    let (_sender, receiver) = watch::channel(false);
                    Ok(Acquire::Granted(ConnectionSeat::new(
                        Arc::clone(&self.shared),
                        seq,
                        key.clone(),
                        id,
                        0,
                        SeatSource::Fallback(FallbackReason::for_error(&error)),
                        receiver,
                    )))
                }
                OnFailure::FailClosed => {
                    crate::metrics::connection_grant("fallback_denied");
                    Ok(Acquire::Denied(ConnectionDenied {
                        scope: CapScope::Subject,
                        cap: shared.max_per_subject,
                        count: 0,
                        retry_after: Duration::from_secs(1),
                        fallback: Some(FallbackReason::for_error(&error)),
                    }))
                }
                OnFailure::Error => {
                    crate::metrics::connection_grant("error");
                    Err(ConnectionError::Store(error))
                }
            },
        }
    }

    /// Whether `key` has a live connection anywhere in the cluster, and
    /// how many (live seats on the store's clock).
    pub async fn presence(&self, key: &WindowKey) -> Result<Presence, ConnectionError> {
        let shared = &*self.shared;
        let tenant_capped = shared.tenant_capped();
        let connections = shared
            .call(shared.partition_of(key), |backend, guard| {
                backend.presence(guard, key, tenant_capped)
            })
            .await?;
        Ok(Presence {
            online: connections > 0,
            connections,
        })
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // This limiter's seats leave the node's gauge with it.
        crate::metrics::connection_live_change(-*self.reported_live.get_mut());
    }
}

impl fmt::Debug for ConnectionLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shared = &*self.shared;
        f.debug_struct("ConnectionLimiter")
            .field("ttl", &shared.ttl)
            .field("max_per_subject", &shared.max_per_subject)
            .field("max_per_tenant", &shared.max_per_tenant)
            .field("fallback", &shared.fallback)
            .field("live_seats", &self.live_seats())
            .finish_non_exhaustive()
    }
}

/// Builds a [`ConnectionLimiter`]; see [`ConnectionLimiter::builder`].
#[must_use]
pub struct ConnectionLimiterBuilder {
    store: Store,
    ttl: Duration,
    max_per_subject: u32,
    max_per_tenant: u32,
    fallback: OnFailure,
}

impl fmt::Debug for ConnectionLimiterBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectionLimiterBuilder")
            .field("ttl", &self.ttl)
            .field("max_per_subject", &self.max_per_subject)
            .field("max_per_tenant", &self.max_per_tenant)
            .field("fallback", &self.fallback)
            .finish_non_exhaustive()
    }
}

impl ConnectionLimiterBuilder {
    /// The most concurrent connections per subject (default 0: no cap;
    /// seats are still kept, for presence).
    pub fn max_per_subject(mut self, max: u32) -> Self {
        self.max_per_subject = max;
        self
    }

    /// The most concurrent connections per tenant (default 0: none). With
    /// a tenant cap, a tenant's seats live in one slot (one primary) of a
    /// Redis Cluster, beside the tenant's set.
    pub fn max_per_tenant(mut self, max: u32) -> Self {
        self.max_per_tenant = max;
        self
    }

    /// How long a seat lives without renewal (default
    /// [`ConnectionLimiter::DEFAULT_TTL`], 15 s; 30 ms to 1 h): a dead
    /// node's connections are freed within it, and the heartbeat renews
    /// every `ttl / 3`.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// What a grant means when the store cannot answer (default
    /// [`OnFailure::FailOpen`]).
    pub fn on_store_failure(mut self, fallback: OnFailure) -> Self {
        self.fallback = fallback;
        self
    }

    /// Checks the TTL and builds. Start the node's heartbeat with
    /// [`ConnectionLimiter::start_heartbeat`].
    pub fn build(self) -> Result<ConnectionLimiter, ConnectionError> {
        if self.ttl < Duration::from_millis(30) || self.ttl > Duration::from_secs(3600) {
            return Err(ConnectionError::InvalidTtl);
        }
        let node = format!("{:016x}", fastrand::u64(..));
        Ok(ConnectionLimiter {
            shared: Arc::new(Shared {
                backend: super::backend::of(&self.store),
                store: self.store,
                metrics: LimiterMetrics::named("connections"),
                ttl: self.ttl,
                max_per_subject: self.max_per_subject,
                max_per_tenant: self.max_per_tenant,
                fallback: self.fallback,
                node,
                seq: AtomicU64::new(0),
                fence_floor: AtomicU64::new(0),
                reported_live: std::sync::atomic::AtomicI64::new(0),
                live: Mutex::new(HashMap::new()),
            }),
        })
    }
}
