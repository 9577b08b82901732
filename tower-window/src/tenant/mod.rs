//! Tenants: who gets which [`Policy`](crate::Policy), from a file and at
//! runtime, with a lifecycle every node sees.
//!
//! A [`TenantRegistry`] resolves the tenant of each request (the
//! [`WindowKey`](crate::WindowKey)'s tenant, from the key extractor) to a
//! [`Resolution`]: its policy, [unlimited](TenantSpec::unlimited) (never
//! reaches the store), or unknown (a typed rejection; `403` with a problem
//! body over HTTP). Tenants not listed get the file's `[default]`, or are
//! unknown when there is none. The layer consults the registry for every
//! request ([`SlidingWindowLayer::tenants`](crate::SlidingWindowLayer::tenants)):
//! one atomic load ([`arc_swap`]) and one hash lookup.
//!
//! # Sources, and which wins
//!
//! * The **file** ([`TenantsConfig`], TOML with the `serde` feature), swapped
//!   in whole by [`TenantRegistry::set_config`] (a hot reload). A file is
//!   validated as a whole; an invalid one is refused and the old one stays.
//! * **Runtime** changes: [`init`](TenantRegistry::init) (define or replace
//!   a tenant), [`reset`](TenantRegistry::reset),
//!   [`close`](TenantRegistry::close) and [`revert`](TenantRegistry::revert)
//!   (hand the tenant back to the file). With Redis they persist there
//!   (under the hash tag `{tw-tenants}`), so a node started later loads them.
//!
//! **A runtime record wins over the file, always, until another runtime
//! change replaces it**: a tenant `init`ed at runtime keeps its runtime
//! quotas whatever the file later says about it, and a `close`d tenant stays
//! closed (a tombstone) even if the file lists it. Every node therefore
//! agrees on a tenant whatever file version each one has loaded, and an
//! operator's runtime action is never silently undone by a deploy. To change
//! such a tenant, `init` it again; to hand it back to the file (its entry,
//! or the default), [`revert`](TenantRegistry::revert) it, which drops the
//! runtime record on every node.
//!
//! # Reset and close on Redis Cluster: state generations
//!
//! A tenant's windows live under many keys, and on Redis Cluster on many
//! primaries (one slot per `{tenant:subject}`), so no single script can
//! delete them, and a scan-and-delete would race with requests. Instead
//! every tenant has a **state generation**, part of every window key
//! ([`Quota::with_generation`](crate::Quota::with_generation) mixes it into
//! the [state id](crate::Quota::state_id)). `reset` and `close` increment
//! the generation in Redis (one script, which also appends the change to
//! the control stream); every node swaps in policies of the new generation,
//! so from then on requests read and write new, empty windows on every
//! primary, and every node's local tier (keyed by the policy) no longer
//! matches its old entries. The old windows are never read again and expire
//! by their own TTLs (at most the quota's window): nothing is deleted,
//! nothing crosses slots, and a reset costs the same on one node or a
//! hundred primaries. The price: until a node has read the change (the
//! reset propagation time, see the `tenant_reset` bench), it keeps using
//! the old generation.
//!
//! # The control channel
//!
//! A registry made [`on_store`](TenantRegistry::on_store) records its
//! lifecycle changes through the store's tenant backend, as every
//! capability reaches its backend: through the store's resilience stack,
//! so a change is bounded by the store's time budget, retried only when
//! it certainly did not apply, and refused at once
//! ([`CircuitOpen`](crate::StoreErrorKind::CircuitOpen)) while the store's
//! breaker is open. On Redis,
//! changes are appended to a Redis Stream (`XADD ... MAXLEN ~ 1000`) in the
//! same script that records them. Each registry runs a background reader
//! on a connection of its own (it blocks in `XREAD`, longer than any
//! store budget): it loads the whole state atomically with the
//! stream's last id, then follows with `XREAD BLOCK` from that id. A reader
//! whose connection breaks reconnects with backoff and reads on from its
//! last id, so a node that was cut off catches up with exactly what it
//! missed. Before each read it checks whether entries after its position
//! were trimmed away (`MAXLEN` trims the oldest entries; with Redis 7's
//! `XINFO STREAM`, whether more were trimmed, `entries-added - length`,
//! than it had seen); if so it loads the whole state again. Generations
//! only grow, so a stale load never moves a tenant back. The records, the
//! generations and the stream carry a TTL (30 days by default) that every
//! change and every node's load refreshes. Without Redis
//! ([`TenantRegistry::new`]), changes apply in-process.
//!
//! # Shadow quotas
//!
//! A quota listed in a tenant's `shadow` is checked and counted but never
//! denies; see [`Quota::shadowed`](crate::Quota::shadowed) for the exact
//! semantics (its would-be denials admit, record nothing in the shadow
//! window, and are counted in `tower_window_shadow_denials_total`).

mod backend;
mod config;
mod control;
mod error;
mod memory;
mod name;
#[cfg(feature = "redis")]
mod redis;
mod registry;
mod spec;

pub use config::TenantsConfig;
pub use control::ControlConfig;
pub use error::TenantError;
pub use name::{validate_tenant_name, MAX_TENANT_NAME_LEN};
pub use registry::{Resolution, TenantInfo, TenantRegistry, TenantSource};
pub use spec::{TenantSpec, TenantSpecBuilder};
