//! [`ConnectionLimiter`]: grants, presence and the live leases of a node.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;

use super::lease::{ConnectionLease, LeaseSource};
use super::store::{CapScope, ConnectionStore, GrantReply, GrantRequest, LeaseRef};
use crate::store::StoreError;
use crate::{FallbackReason, Limiter, WindowKey};

/// What a grant means when the store cannot answer (down, breaker open,
/// over the time budget).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum GrantFallback {
    /// Admit with a degraded lease: not counted in the store, not renewed,
    /// never reported lost (fail open: the cap does not hold while the
    /// store is away). The default.
    #[default]
    Admit,
    /// Refuse the connection (fail closed).
    Deny,
    /// Return [`ConnectionError::Store`].
    Error,
}

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConnectionDenied {
    /// Which cap refused it.
    pub scope: CapScope,
    /// The cap.
    pub cap: u32,
    /// Live leases counted against it.
    pub count: u32,
    /// Until the oldest lease would expire unless renewed: an upper bound
    /// on the wait when its holder died; a release frees a place sooner.
    pub retry_after: Duration,
    /// `Some` when the store could not answer and [`GrantFallback::Deny`] did.
    pub fallback: Option<FallbackReason>,
}

/// The answer of [`ConnectionLimiter::acquire`] (exhaustive: a
/// connection is admitted or not).
#[derive(Debug)]
pub enum Acquire {
    /// Admitted: hold the lease for the connection's life.
    Granted(ConnectionLease),
    /// Refused: a cap is reached.
    Denied(ConnectionDenied),
}

/// A subject's live connections, cluster-wide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Presence {
    /// At least one live connection.
    pub online: bool,
    /// Live leases (unexpired on the store's clock).
    pub connections: u32,
}

/// Why a [`ConnectionLimiter`] could not answer or be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectionError {
    /// The lease TTL must be between 30 ms and 1 hour (a heartbeat every
    /// ttl/3 must stay above 10 ms).
    #[error("a connection lease ttl must be between 30ms and 1h")]
    InvalidTtl,
    /// The store failed (and, for a grant, the fallback is
    /// [`GrantFallback::Error`]).
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A cluster-wide cap on concurrent connections per subject; see the
/// [module docs](super).
///
/// Cheap to clone; clones share the node's live leases and heartbeat.
#[derive(Clone)]
pub struct ConnectionLimiter {
    pub(super) shared: Arc<Shared>,
}

pub(super) struct Shared {
    pub(super) limiter: Limiter,
    pub(super) store: Arc<dyn ConnectionStore>,
    pub(super) ttl: Duration,
    max_per_subject: u32,
    max_per_tenant: u32,
    fallback: GrantFallback,
    /// This node's random id: lease ids are `<node>:<sequence>`.
    node: String,
    seq: AtomicU64,
    /// The highest fencing token this node was granted (any subject): every
    /// grant asks for a larger one, so this node's tokens never go back even
    /// when the store lost what it knew (see `ConnectionLease::fence`).
    fence_floor: AtomicU64,
    /// Leases granted by the store and not yet released or lost.
    pub(super) live: Mutex<HashMap<u64, Live>>,
}

/// One live lease, as the heartbeat sees it.
pub(super) struct Live {
    pub(super) key: WindowKey,
    pub(super) id: Vec<u8>,
    pub(super) lost: watch::Sender<bool>,
}

impl Shared {
    pub(super) fn tenant_form(&self) -> bool {
        self.max_per_tenant > 0
    }

    pub(super) fn live(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Live>> {
        self.live.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Releases a lease in the store through the resilience stack.
    pub(super) async fn release(&self, key: &WindowKey, id: &[u8]) -> Result<bool, StoreError> {
        let lease = LeaseRef::new(key, id, self.tenant_form());
        let store = &*self.store;
        let domain = store.partition_failure_domain(store.lease_partition(key, self.tenant_form()));
        let released = self
            .limiter
            .run(
                domain,
                self.limiter.policy(),
                || store.release_sync(lease),
                move || store.release(lease),
            )
            .await
            .map_err(crate::limiter::Failure::into_error)?;
        crate::metrics::connection_released();
        Ok(released)
    }
}

impl ConnectionLimiter {
    /// The default lease TTL (15 s).
    pub const DEFAULT_TTL: Duration = Duration::from_secs(15);

    /// A builder for a limiter keeping leases in `store`, whose calls run
    /// through `limiter`'s resilience stack (pass the limiter on the same
    /// store, so one set of breakers describes it).
    pub fn builder(limiter: Limiter, store: impl ConnectionStore) -> ConnectionLimiterBuilder {
        ConnectionLimiterBuilder {
            limiter,
            store: Arc::new(store),
            ttl: Self::DEFAULT_TTL,
            max_per_subject: 0,
            max_per_tenant: 0,
            fallback: GrantFallback::default(),
        }
    }

    /// The lease TTL.
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

    /// Leases this node holds in the store and renews (degraded leases not
    /// included).
    pub fn live_leases(&self) -> usize {
        self.shared.live().len()
    }

    /// Grants a lease for one connection of `key`, or refuses it past a
    /// cap. Hold the lease while the connection lives, and close the
    /// connection when [`ConnectionLease::lost`] fires.
    pub async fn acquire(&self, key: &WindowKey) -> Result<Acquire, ConnectionError> {
        let shared = &*self.shared;
        let seq = shared.seq.fetch_add(1, Ordering::Relaxed);
        let id = format!("{}:{seq:x}", shared.node).into_bytes();
        let tenant_form = shared.tenant_form();
        let request = GrantRequest::new(
            LeaseRef::new(key, &id, tenant_form),
            shared.ttl,
            shared.max_per_subject,
            shared.max_per_tenant,
        )
        .with_fence_floor(shared.fence_floor.load(Ordering::Acquire));
        let store = &*shared.store;
        let domain = store.partition_failure_domain(store.lease_partition(key, tenant_form));
        let result = shared
            .limiter
            .run(
                domain,
                shared.limiter.policy(),
                || store.grant_sync(request),
                move || store.grant(request),
            )
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
                Ok(Acquire::Granted(ConnectionLease::new(
                    Arc::clone(&self.shared),
                    seq,
                    key.clone(),
                    id,
                    fence,
                    LeaseSource::Store,
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
            Err(failure) => match shared.fallback {
                GrantFallback::Admit => {
                    crate::metrics::connection_grant("fallback_granted");
                    let (_sender, receiver) = watch::channel(false);
                    Ok(Acquire::Granted(ConnectionLease::new(
                        Arc::clone(&self.shared),
                        seq,
                        key.clone(),
                        id,
                        0,
                        LeaseSource::Fallback(failure.reason),
                        receiver,
                    )))
                }
                GrantFallback::Deny => {
                    crate::metrics::connection_grant("fallback_denied");
                    Ok(Acquire::Denied(ConnectionDenied {
                        scope: CapScope::Subject,
                        cap: shared.max_per_subject,
                        count: 0,
                        retry_after: Duration::from_secs(1),
                        fallback: Some(failure.reason),
                    }))
                }
                GrantFallback::Error => {
                    crate::metrics::connection_grant("error");
                    Err(ConnectionError::Store(failure.into_error()))
                }
            },
        }
    }

    /// Whether `key` has a live connection anywhere in the cluster, and
    /// how many (live leases on the store's clock).
    pub async fn presence(&self, key: &WindowKey) -> Result<Presence, ConnectionError> {
        let shared = &*self.shared;
        let tenant_form = shared.tenant_form();
        let store = &*shared.store;
        let domain = store.partition_failure_domain(store.lease_partition(key, tenant_form));
        let connections = shared
            .limiter
            .run(
                domain,
                shared.limiter.policy(),
                || store.presence_sync(key, tenant_form),
                move || store.presence(key, tenant_form),
            )
            .await
            .map_err(|failure| ConnectionError::Store(failure.into_error()))?;
        Ok(Presence {
            online: connections > 0,
            connections,
        })
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
            .field("live_leases", &self.live_leases())
            .finish_non_exhaustive()
    }
}

/// Builds a [`ConnectionLimiter`]; see [`ConnectionLimiter::builder`].
#[must_use]
pub struct ConnectionLimiterBuilder {
    limiter: Limiter,
    store: Arc<dyn ConnectionStore>,
    ttl: Duration,
    max_per_subject: u32,
    max_per_tenant: u32,
    fallback: GrantFallback,
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
    /// leases are still kept, for presence).
    pub fn max_per_subject(mut self, max: u32) -> Self {
        self.max_per_subject = max;
        self
    }

    /// The most concurrent connections per tenant (default 0: none). With
    /// a tenant cap, a tenant's leases live in one slot (one primary) of a
    /// Redis Cluster, beside the tenant's set.
    pub fn max_per_tenant(mut self, max: u32) -> Self {
        self.max_per_tenant = max;
        self
    }

    /// How long a lease lives without renewal (default
    /// [`ConnectionLimiter::DEFAULT_TTL`], 15 s; 30 ms to 1 h): a dead
    /// node's connections are freed within it, and the heartbeat renews
    /// every `ttl / 3`.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// What a grant means when the store cannot answer (default
    /// [`GrantFallback::Admit`]).
    pub fn on_store_failure(mut self, fallback: GrantFallback) -> Self {
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
                limiter: self.limiter,
                store: self.store,
                ttl: self.ttl,
                max_per_subject: self.max_per_subject,
                max_per_tenant: self.max_per_tenant,
                fallback: self.fallback,
                node,
                seq: AtomicU64::new(0),
                fence_floor: AtomicU64::new(0),
                live: Mutex::new(HashMap::new()),
            }),
        })
    }
}
