//! [`ConnectionSeat`]: the guard one connection holds.

use std::fmt;
use std::sync::Arc;

use tokio::sync::watch;

use super::limiter::{ConnectionError, Shared};
use crate::{FallbackReason, WindowKey};

/// Who granted a seat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SeatSource {
    /// The store: the seat counts and is renewed.
    Store,
    /// [`OnFailure::FailOpen`](super::OnFailure::FailOpen) admitted while
    /// the store could not answer: not counted, renewed or lost.
    Fallback(FallbackReason),
}

/// Resolves when a seat is reported lost (cheap to clone).
#[derive(Debug, Clone)]
pub struct SeatLost {
    pub(super) receiver: watch::Receiver<bool>,
}

impl SeatLost {
    /// Whether the seat was reported lost.
    pub fn is_lost(&self) -> bool {
        *self.receiver.borrow()
    }

    /// Waits until the seat is reported lost; forever for a released or
    /// degraded seat.
    pub async fn wait(&mut self) {
        if self.receiver.wait_for(|lost| *lost).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// One connection's seat: released by [`release`](Self::release) or on
/// drop (spawned on the current Tokio runtime; without one, the seat
/// expires after its TTL). Close the connection when [`lost`](Self::lost)
/// fires: the seat is never re-acquired.
pub struct ConnectionSeat {
    pub(super) shared: Arc<Shared>,
    pub(super) seq: u64,
    pub(super) key: WindowKey,
    pub(super) id: Vec<u8>,
    pub(super) fence: u64,
    pub(super) source: SeatSource,
    pub(super) lost: SeatLost,
    /// Released, or degraded (nothing to release).
    pub(super) released: bool,
}

impl ConnectionSeat {
    /// Marks the seat released; whether the store still holds it.
    fn take(&mut self) -> bool {
        let held = !std::mem::replace(&mut self.released, true);
        if held {
            self.shared.live().remove(&self.seq);
        }
        held
    }

    /// The fencing token (0 for a degraded seat): `max(the subject's last
    /// token + 1, the store's clock in µs, this limiter's highest token + 1)`.
    ///
    /// * **While the store keeps the subject's counter** (the longest seat
    ///   TTL + 1 s past its last grant): larger than every earlier token of
    ///   the subject, from any node, whatever the store's clock does.
    /// * **Per limiter, always**: larger than every token it was granted
    ///   before, also when the store lost the counter (a failover under
    ///   asynchronous replication, a restart without persistence).
    /// * **Across nodes, after the counter was lost**: at least the new
    ///   primary's clock, so larger than the lost tokens unless that clock
    ///   is behind by more than the failover took. Anything stronger needs
    ///   `WAIT` on every grant.
    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// Who granted it.
    pub fn source(&self) -> SeatSource {
        self.source
    }

    /// Whether the fallback admitted it ([`SeatSource::Fallback`]).
    pub fn is_degraded(&self) -> bool {
        matches!(self.source, SeatSource::Fallback(_))
    }

    /// The subject holding it.
    pub fn key(&self) -> &WindowKey {
        &self.key
    }

    /// The seat's id in the store (`<node>:<sequence>`).
    pub fn id(&self) -> &[u8] {
        &self.id
    }

    /// Whether a renewal found the seat gone.
    pub fn is_lost(&self) -> bool {
        self.lost.is_lost()
    }

    /// A handle that resolves when the seat is lost.
    pub fn lost(&self) -> SeatLost {
        self.lost.clone()
    }

    /// Releases the seat now; on a store error it expires after its TTL.
    pub async fn release(mut self) -> Result<(), ConnectionError> {
        if self.take() {
            self.shared.release(&self.key, &self.id).await?;
        }
        Ok(())
    }
}

impl Drop for ConnectionSeat {
    fn drop(&mut self) {
        if !self.take() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let shared = Arc::clone(&self.shared);
        let (key, id) = (self.key.clone(), std::mem::take(&mut self.id));
        runtime.spawn(async move {
            if let Err(error) = shared.release(&key, &id).await {
                tracing::debug!(%error, "connection seat release failed; it expires after its ttl");
            }
        });
    }
}

impl fmt::Debug for ConnectionSeat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The key names a user: keep it out of debug output.
        f.debug_struct("ConnectionSeat")
            .field("fence", &self.fence)
            .field("source", &self.source)
            .field("lost", &self.is_lost())
            .finish_non_exhaustive()
    }
}
