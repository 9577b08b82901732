//! The differential, model-based, randomized suite (issue 22): for each
//! capability, random operation sequences (proptest) with explicit times
//! run on a fresh `MemoryStore`, on a real Redis and on a real 3-primary
//! Redis Cluster, and every reply is compared with the other stores' and
//! with a reference model written from the invariants of `DESIGN.md` and
//! the capability's documented contract (not from the implementation).
//! Where stores may differ (a documented approximation), the model states
//! the allowed range and the comparison checks it.
//!
//! One test binary per capability (`tests/differential_*.rs`) shares one
//! Redis and one cluster for all its cases; see `tests/README.md` for the
//! seeds, replays and the long run.

// Stores are indexed 0..3 alongside per-store state (epoch maps, fences,
// lease ids): the index is the point, not an iterator's position.
#![allow(clippy::needless_range_loop)]

pub mod backends;
pub mod conn;
pub mod dedup;
pub mod events;
pub mod model;
pub mod quotas;
pub mod runner;

pub use runner::{run_capability, Capability, Outcome, Tally};
