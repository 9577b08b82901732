//! Cluster-wide connection caps on server-clock seats, batched heartbeats
//! and presence.
//!
//! A [`ConnectionLimiter`] grants a [`ConnectionSeat`] per connection (a
//! WebSocket, a stream) of a subject, refusing one past
//! [`max_per_subject`](ConnectionLimiterBuilder::max_per_subject) (and
//! [`max_per_tenant`](ConnectionLimiterBuilder::max_per_tenant)), counted
//! across every node sharing the store. A *seat* is an expiring grant on
//! the store's clock, renewed by its node's heartbeat (a *lease* is a
//! quota lease, [`crate::lease`], never a seat).
//!
//! * Each subject has one set of seat ids scored by expiry on the store's
//!   clock; a grant purges expired seats and admits below the cap. Nodes
//!   may use different TTLs on one store: a set lives as long as its
//!   longest live seat.
//! * A grant carries a fencing token ([`ConnectionSeat::fence`]).
//! * One heartbeat per node ([`ConnectionLimiter::start_heartbeat`])
//!   renews all its seats every `ttl / 3`, batched
//!   ([`ConnectionLimiter::heartbeat`]). A dead node's seats expire
//!   within one TTL.
//! * A renewal that finds its seat gone reports it
//!   ([`ConnectionSeat::lost`]); the seat is never re-acquired, and the
//!   holder should close the connection.
//! * Release is explicit ([`ConnectionSeat::release`]) or on drop.
//!
//! Store calls go through the [`Store`](crate::Store)'s resilience stack.
//! When a grant cannot be answered, [`OnFailure`] admits (a *degraded*
//! seat, not counted or renewed) or refuses. A failed renewal declares
//! nothing lost; seats that expire meanwhile are reported by the next one.
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

/// What a grant answers while the store cannot.
pub use crate::store::guard::OnFailure;
pub use backend::{Backend, CapScope, GrantReply, GrantRequest, SeatRef};
pub use heartbeat::{HeartbeatHandle, HeartbeatReport};
pub use limiter::{
    Acquire, ConnectionDenied, ConnectionError, ConnectionLimiter, ConnectionLimiterBuilder,
    Presence,
};
pub use seat::{ConnectionSeat, SeatLost, SeatSource};
