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
    /// The store: the seat counts against the caps and is renewed.
    Store,
    /// The store could not answer and [`OnFailure::FailOpen`](super::OnFailure::FailOpen)
    /// admitted: not counted, not renewed, never lost.
    Fallback(FallbackReason),
}

/// Resolves when a seat is reported lost (cheap to clone; hand it to the
/// task serving the connection).
#[derive(Debug, Clone)]
pub struct SeatLost {
    pub(super) receiver: watch::Receiver<bool>,
}

impl SeatLost {
    /// Whether the seat was reported lost.
    pub fn is_lost(&self) -> bool {
        *self.receiver.borrow()
    }

    /// Waits until the seat is reported lost; pending forever for a seat
    /// that is released or degraded (those are never lost).
    pub async fn wait(&mut self) {
        loop {
            if *self.receiver.borrow_and_update() {
                return;
            }
            if self.receiver.changed().await.is_err() {
                // The sender is gone: released, or never renewed.
                if *self.receiver.borrow() {
                    return;
                }
                std::future::pending::<()>().await;
            }
        }
    }
}

/// One connection's seat: released explicitly with
/// [`release`](Self::release) or when dropped (a spawned release on the
/// current Tokio runtime; without one, the seat expires after its TTL).
///
/// Close the connection when [`lost`](Self::lost) fires: the store no
/// longer counts it, and it is never silently re-acquired.
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
    /// Marks the seat released and leaves this node's live seats: whether
    /// the store still holds it.
    fn take(&mut self) -> bool {
        let held = !std::mem::replace(&mut self.released, true);
        if held {
            self.shared.live().remove(&self.seq);
        }
        held
    }

    /// The fencing token (0 for a degraded seat): the store grants
    /// `max(the subject's last token + 1, its clock in µs, the highest
    /// token this limiter was granted + 1)`. What that guarantees:
    ///
    /// * **While the store keeps the subject's counter** (at least one
    ///   seat TTL + 1 s past the subject's last grant, the longest TTL any
    ///   node granted with counting): larger than every token granted earlier
    ///   to the subject, by any node, whatever the store's clock does
    ///   (steps back or forward by days).
    /// * **Per limiter (node), always**: larger than every token this
    ///   limiter was granted before, for any subject, also when the store
    ///   lost the counter (a failover that lost the last grants under
    ///   asynchronous replication, a restart without persistence) and its
    ///   clock is behind: the floor is kept by the node, not in the store.
    /// * **Across nodes, after the counter was lost**: at least the new
    ///   primary's clock, so larger than every lost token as long as that
    ///   clock reads later than the old primary's did at the lost grants —
    ///   true unless it is behind by more than the failover took (at
    ///   least `cluster-node-timeout`, or Sentinel's
    ///   `down-after-milliseconds`). A token another node was handed by the
    ///   lost primary cannot be known otherwise: that would need
    ///   synchronous replication (`WAIT`) on every grant.
    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// Who granted it.
    pub fn source(&self) -> SeatSource {
        self.source
    }

    /// Whether the store could not answer and the fallback admitted.
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

    /// Releases the seat now (through the store's resilience stack).
    /// On a store error the seat still expires after its TTL.
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
        // Without a runtime to release on, the seat expires after its TTL.
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
