//! Cluster-wide connection caps on server-clock seats, batched heartbeats
//! and presence.
//!
//! A [`ConnectionLimiter`] grants a [`ConnectionSeat`] per connection
//! (a WebSocket, a stream) of a subject, refusing one past the cap
//! ([`max_per_subject`](ConnectionLimiterBuilder::max_per_subject), and
//! optionally [`max_per_tenant`](ConnectionLimiterBuilder::max_per_tenant)),
//! counted across every node sharing the store. A *seat* is a
//! connection's place under the cap: an expiring grant on the store's
//! clock, renewed by its node's heartbeat. (In this crate *lease* means a
//! quota lease, [`crate::lease`], never a seat.)
//!
//! * **Seats on the store's clock.** Each subject has one set of seat
//!   ids scored by expiry on Redis `TIME`; a grant purges expired seats in
//!   the same script and admits below the cap. Node clocks play no part.
//! * **Fencing.** A grant returns a token larger than every earlier one of
//!   the subject while the store keeps its counter, and larger than every
//!   token the same limiter was granted before even when the store lost it
//!   (a failover under asynchronous replication, a clock behind); exactly
//!   what holds across nodes is in [`ConnectionSeat::fence`].
//! * **Mixed TTLs.** Nodes may use different TTLs on one store (a rolling
//!   change of the setting): a subject's set lives at least as long as its
//!   longest live seat, whichever node wrote it last.
//! * **Batched heartbeats.** One task per node
//!   ([`ConnectionLimiter::start_heartbeat`]) renews all of the node's live
//!   seats every `ttl / 3`: one round trip per batch of 1,000 seats on one
//!   Redis, and per primary and batch on a Redis Cluster (see
//!   [`ConnectionLimiter::heartbeat`] and `benches/README.md`).
//! * **Lost means lost.** A renewal that finds its seat gone (expired
//!   while the node was partitioned, or reset by an operator) reports it to
//!   the seat ([`ConnectionSeat::lost`]); the seat is never re-acquired.
//!   The holder should close the connection (the WebSocket guard closes
//!   with 1008).
//! * **Dead nodes free their seats** within one TTL: nothing renews them.
//! * **Release** is explicit ([`ConnectionSeat::release`]) and on drop (a
//!   spawned release; drop never blocks).
//! * **Presence**: [`ConnectionLimiter::presence`] counts a subject's live
//!   seats cluster-wide.
//!
//! Every store call goes through the [`Store`](crate::Store)'s one
//! resilience stack (breakers per failure domain, in-flight bound, time
//! budget, retries). When the store cannot answer a grant, the
//! [`OnFailure`] decides: admit (a *degraded* seat, not counted and not
//! renewed; [`ConnectionSeat::is_degraded`]) or refuse. A grant that timed
//! out may still have been applied by the store: that seat is renewed by
//! nobody and expires within one TTL. A failed renewal
//! call declares nothing lost: if the store stays away past the TTL, the
//! seats expire there and the first renewal after it reports them lost.
//!
//! ```
//! use std::time::Duration;
//! use tower_window::conn::{Acquire, ConnectionLimiter};
//! use tower_window::{Store, WindowKey};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! let connections = ConnectionLimiter::builder(Store::memory())
//!     .max_per_subject(2)
//!     .ttl(Duration::from_secs(15))
//!     .build()?;
//! let alice = WindowKey::new("acme", "alice");
//! let Acquire::Granted(first) = connections.acquire(&alice).await? else { panic!() };
//! let Acquire::Granted(second) = connections.acquire(&alice).await? else { panic!() };
//! assert!(second.fence() > first.fence());
//! assert!(matches!(connections.acquire(&alice).await?, Acquire::Denied(_)));
//! assert_eq!(connections.presence(&alice).await?.connections, 2);
//! first.release().await?;
//! assert!(matches!(connections.acquire(&alice).await?, Acquire::Granted(_)));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

mod backend;
mod heartbeat;
mod limiter;
mod memory;
mod metrics;
#[cfg(feature = "redis")]
mod redis;
mod seat;

/// What a grant answers while the store cannot (the crate's one vocabulary
/// for yes-or-no fallbacks).
pub use crate::store::guard::OnFailure;
pub use backend::{Backend, CapScope, GrantReply, GrantRequest, SeatRef};
pub use heartbeat::{HeartbeatHandle, HeartbeatReport};
pub use limiter::{
    Acquire, ConnectionDenied, ConnectionError, ConnectionLimiter, ConnectionLimiterBuilder,
    Presence,
};
pub use seat::{ConnectionSeat, SeatLost, SeatSource};
