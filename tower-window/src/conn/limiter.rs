//! [`ConnectionLimiter`]: grants, presence and the live seats of a node.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use super::backend::{Backend, CapScope, GrantReply, GrantRequest, SeatRef};
use super::metrics;
use super::seat::{ConnectionSeat, SeatLost, SeatSource};
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
    /// Until the oldest seat expires unless renewed (a release frees a
    /// place sooner).
    pub retry_after: Duration,
    /// `Some` when [`OnFailure::FailClosed`] answered for the store.
    pub fallback: Option<FallbackReason>,
}

/// The answer of [`ConnectionLimiter::acquire`].
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
    /// The seat TTL is not between 30 ms and 1 hour.
    #[error("a connection seat ttl must be between 30ms and 1h")]
    InvalidTtl,
    /// The store failed (for a grant: with [`OnFailure::Error`]).
    #[error(transparent)]
    Store(#[from] StoreError),
}

crate::error_debug::debug_as_display!(ConnectionError { InvalidTtl, Store });

/// A cluster-wide cap on concurrent connections per subject; see the
/// [module docs](super). Clones share the live seats and heartbeat.
#[derive(Clone)]
pub struct ConnectionLimiter {
    pub(super) shared: Arc<Shared>,
}

#[derive(Debug, Clone, Copy)]
struct Settings {
    ttl: Duration,
    max_per_subject: u32,
    max_per_tenant: u32,
    fallback: OnFailure,
}

pub(super) struct Shared {
    store: Store,
    /// `None`: the store has no connection backend.
    pub(super) backend: Option<Arc<dyn Backend>>,
    metrics: Arc<LimiterMetrics>,
    settings: Settings,
    /// This node's random id: seat ids are `<node>:<sequence>`.
    node: String,
    seq: AtomicU64,
    /// The highest fencing token granted here: every grant asks for a
    /// larger one (see `ConnectionSeat::fence`).
    fence_floor: AtomicU64,
    /// The live seats this limiter last added to the gauge.
    pub(super) reported_live: AtomicI64,
    /// Seats granted by the store and not yet released or lost.
    live: Mutex<HashMap<u64, Live>>,
}

pub(super) struct Live {
    pub(super) key: WindowKey,
    pub(super) id: Vec<u8>,
    pub(super) lost: watch::Sender<bool>,
}

impl Shared {
    pub(super) fn tenant_capped(&self) -> bool {
        self.settings.max_per_tenant > 0
    }

    pub(super) fn live(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Live>> {
        crate::sync::lock(&self.live)
    }

    /// One call to the connection backend, in the partition of `key`'s
    /// seats, through the store's resilience stack.
    pub(super) fn call<'a, T: Send + 'a>(
        &'a self,
        key: &'a WindowKey,
        operation: impl FnOnce(&'a dyn Backend, &mut Guard<'a>) -> Op<'a, T>,
    ) -> Op<'a, T> {
        let tenant_capped = self.tenant_capped();
        self.store.call(
            self.backend.as_deref(),
            "connection caps",
            |backend| backend.partition_failure_domain(backend.seat_partition(key, tenant_capped)),
            Calls::to(&self.metrics, None),
            operation,
        )
    }

    pub(super) async fn release(&self, key: &WindowKey, id: &[u8]) -> Result<(), StoreError> {
        let seat = SeatRef::new(key, id, self.tenant_capped());
        self.call(key, |backend, guard| backend.release(guard, seat))
            .await?;
        metrics::released();
        Ok(())
    }
}

impl ConnectionLimiter {
    /// The default seat TTL (15 s).
    pub const DEFAULT_TTL: Duration = Duration::from_secs(15);

    /// A builder for a limiter keeping seats in `store` (its calls are
    /// recorded under the name `connections`).
    pub fn builder(store: impl Into<Store>) -> ConnectionLimiterBuilder {
        ConnectionLimiterBuilder {
            store: store.into(),
            settings: Settings {
                ttl: Self::DEFAULT_TTL,
                max_per_subject: 0,
                max_per_tenant: 0,
                fallback: OnFailure::default(),
            },
        }
    }

    /// The seat TTL.
    pub fn ttl(&self) -> Duration {
        self.shared.settings.ttl
    }

    /// The cap per subject (0: none).
    pub fn max_per_subject(&self) -> u32 {
        self.shared.settings.max_per_subject
    }

    /// The cap per tenant (0: none).
    pub fn max_per_tenant(&self) -> u32 {
        self.shared.settings.max_per_tenant
    }

    /// Seats this limiter holds in the store and renews (not degraded ones).
    pub fn live_seats(&self) -> usize {
        self.shared.live().len()
    }

    /// Grants a seat for one connection of `key`, or refuses it past a
    /// cap. Hold it while the connection lives; close the connection when
    /// [`ConnectionSeat::lost`] fires.
    pub async fn acquire(&self, key: &WindowKey) -> Result<Acquire, ConnectionError> {
        let shared = &*self.shared;
        let settings = shared.settings;
        let seq = shared.seq.fetch_add(1, Ordering::Relaxed);
        let id = format!("{}:{seq:x}", shared.node).into_bytes();
        let request = GrantRequest::new(
            SeatRef::new(key, &id, shared.tenant_capped()),
            settings.ttl,
            settings.max_per_subject,
            settings.max_per_tenant,
        )
        .with_fence_floor(shared.fence_floor.load(Ordering::Acquire));
        let result = shared
            .call(key, |backend, guard| backend.grant(guard, request))
            .await;
        let seat = |id, fence, source, receiver| {
            Ok(Acquire::Granted(ConnectionSeat {
                shared: Arc::clone(&self.shared),
                seq,
                key: key.clone(),
                id,
                fence,
                source,
                lost: SeatLost { receiver },
                released: matches!(source, SeatSource::Fallback(_)),
            }))
        };
        let denied = |scope, count, retry_after, fallback| {
            let cap = match scope {
                CapScope::Subject => settings.max_per_subject,
                CapScope::Tenant => settings.max_per_tenant,
            };
            Ok(Acquire::Denied(ConnectionDenied {
                scope,
                cap,
                count,
                retry_after,
                fallback,
            }))
        };
        let (outcome, answer) = match result {
            Ok(GrantReply::Granted { fence, .. }) => {
                shared.fence_floor.fetch_max(fence, Ordering::AcqRel);
                let (lost, receiver) = watch::channel(false);
                let answer = seat(id.clone(), fence, SeatSource::Store, receiver);
                let key = key.clone();
                shared.live().insert(seq, Live { key, id, lost });
                ("granted", answer)
            }
            Ok(GrantReply::Denied {
                scope,
                count,
                retry_after,
            }) => ("denied", denied(scope, count, retry_after, None)),
            Err(error) => {
                let reason = FallbackReason::for_error(&error);
                match settings.fallback {
                    OnFailure::FailOpen => {
                        let source = SeatSource::Fallback(reason);
                        let lost = watch::channel(false).1;
                        ("fallback_granted", seat(id, 0, source, lost))
                    }
                    OnFailure::FailClosed => {
                        let retry_after = Duration::from_secs(1);
                        let answer = denied(CapScope::Subject, 0, retry_after, Some(reason));
                        ("fallback_denied", answer)
                    }
                    OnFailure::Error => ("error", Err(ConnectionError::Store(error))),
                }
            }
        };
        metrics::grant(outcome);
        answer
    }

    /// How many live connections `key` has, cluster-wide.
    pub async fn presence(&self, key: &WindowKey) -> Result<Presence, ConnectionError> {
        let tenant_capped = self.shared.tenant_capped();
        let connections = self
            .shared
            .call(key, |backend, guard| {
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
        metrics::live_seats(-*self.reported_live.get_mut());
    }
}

impl fmt::Debug for ConnectionLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectionLimiter")
            .field("settings", &self.shared.settings)
            .field("live_seats", &self.live_seats())
            .finish_non_exhaustive()
    }
}

/// Builds a [`ConnectionLimiter`]; see [`ConnectionLimiter::builder`].
#[derive(Debug)]
#[must_use]
pub struct ConnectionLimiterBuilder {
    store: Store,
    settings: Settings,
}

impl ConnectionLimiterBuilder {
    /// The most concurrent connections per subject (default 0: no cap;
    /// seats are still kept, for presence).
    pub fn max_per_subject(mut self, max: u32) -> Self {
        self.settings.max_per_subject = max;
        self
    }

    /// The most concurrent connections per tenant (default 0: none). A
    /// tenant's seats then live in one Redis Cluster slot.
    pub fn max_per_tenant(mut self, max: u32) -> Self {
        self.settings.max_per_tenant = max;
        self
    }

    /// How long a seat lives without renewal (default
    /// [`ConnectionLimiter::DEFAULT_TTL`]; 30 ms to 1 h): a dead node's
    /// connections are freed within it.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.settings.ttl = ttl;
        self
    }

    /// What a grant means when the store cannot answer (default
    /// [`OnFailure::FailOpen`]).
    pub fn on_store_failure(mut self, fallback: OnFailure) -> Self {
        self.settings.fallback = fallback;
        self
    }

    /// Checks the TTL and builds. Start the heartbeat with
    /// [`ConnectionLimiter::start_heartbeat`].
    pub fn build(self) -> Result<ConnectionLimiter, ConnectionError> {
        let ttl = self.settings.ttl;
        if ttl < Duration::from_millis(30) || ttl > Duration::from_secs(3600) {
            return Err(ConnectionError::InvalidTtl);
        }
        Ok(ConnectionLimiter {
            shared: Arc::new(Shared {
                backend: crate::store::plugged!(self.store, dyn Backend),
                store: self.store,
                metrics: LimiterMetrics::named("connections"),
                settings: self.settings,
                node: format!("{:016x}", fastrand::u64(..)),
                seq: AtomicU64::new(0),
                fence_floor: AtomicU64::new(0),
                reported_live: AtomicI64::new(0),
                live: Mutex::new(HashMap::new()),
            }),
        })
    }
}
