//! Cluster-wide connection caps on server-clock leases, batched heartbeats
//! and presence.
//!
//! A [`ConnectionLimiter`] grants a [`ConnectionLease`] per connection
//! (a WebSocket, a stream) of a subject, refusing one past the cap
//! ([`max_per_subject`](ConnectionLimiterBuilder::max_per_subject), and
//! optionally [`max_per_tenant`](ConnectionLimiterBuilder::max_per_tenant)),
//! counted across every node sharing the store:
//!
//! * **Leases on the store's clock.** Each subject has one set of lease
//!   ids scored by expiry on Redis `TIME`; a grant purges expired leases in
//!   the same script and admits below the cap. Node clocks play no part.
//! * **Fencing.** A grant returns a token larger than every earlier one of
//!   the subject while the store keeps its counter, and larger than every
//!   token the same limiter was granted before even when the store lost it
//!   (a failover under asynchronous replication, a clock behind); exactly
//!   what holds across nodes is in [`ConnectionLease::fence`].
//! * **Mixed TTLs.** Nodes may use different TTLs on one store (a rolling
//!   change of the setting): a subject's set lives at least as long as its
//!   longest live lease, whichever node wrote it last.
//! * **Batched heartbeats.** One task per node
//!   ([`ConnectionLimiter::start_heartbeat`]) renews all of the node's live
//!   leases every `ttl / 3`, in one call per store partition (one per
//!   Redis Cluster hash slot, at most
//!   [`max_renew_batch`](ConnectionStore::max_renew_batch) leases each): on
//!   one Redis, 10,000 connections cost 10 calls per tick. On a Redis
//!   Cluster it is one call per hash slot holding leases of the node
//!   (thousands for 10,000 users; 10 when a per-tenant cap puts a tenant's
//!   leases in one slot): see `benches/README.md`.
//! * **Lost means lost.** A renewal that finds its lease gone (expired
//!   while the node was partitioned, or reset by an operator) reports it to
//!   the lease ([`ConnectionLease::lost`]); the lease is never re-acquired.
//!   The holder should close the connection (the WebSocket guard closes
//!   with 1008).
//! * **Dead nodes free their leases** within one TTL: nothing renews them.
//! * **Release** is explicit ([`ConnectionLease::release`]) and on drop (a
//!   spawned release; drop never blocks).
//! * **Presence**: [`ConnectionLimiter::presence`] counts a subject's live
//!   leases cluster-wide.
//!
//! Every store call goes through the [`Limiter`](crate::Limiter)'s one
//! resilience stack (breakers per failure domain, in-flight bound, time
//! budget, retries). When the store cannot answer a grant, the
//! [`GrantFallback`] decides: admit (a *degraded* lease, not counted and not
//! renewed; [`ConnectionLease::is_degraded`]) or refuse. A grant that timed
//! out may still have been applied by the store: that lease is renewed by
//! nobody and expires within one TTL. A failed renewal
//! call declares nothing lost: if the store stays away past the TTL, the
//! leases expire there and the first renewal after it reports them lost.
//!
//! ```
//! use std::time::Duration;
//! use tower_window::conn::{Acquire, ConnectionLimiter};
//! use tower_window::{Limiter, MemoryStore, Quota, WindowKey};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! let store = MemoryStore::new();
//! let limiter = Limiter::new(store.clone(), "100/1m".parse::<Quota>()?);
//! let connections = ConnectionLimiter::builder(limiter, store)
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

mod heartbeat;
mod lease;
mod limiter;
mod store;

pub use heartbeat::{HeartbeatHandle, HeartbeatReport};
pub use lease::{ConnectionLease, LeaseLost, LeaseSource};
pub use limiter::{
    Acquire, ConnectionDenied, ConnectionError, ConnectionLimiter, ConnectionLimiterBuilder,
    GrantFallback, Presence,
};
pub use store::{CapScope, ConnectionStore, GrantReply, GrantRequest, LeaseRef};
