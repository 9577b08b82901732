//! Tenants: who gets which [`Policy`](crate::Policy), from a file and at
//! runtime, with a lifecycle every node sees.
//!
//! A [`TenantRegistry`] resolves the tenant of each request (the
//! [`WindowKey`](crate::WindowKey)'s tenant) to a [`Resolution`]: its
//! policy, [unlimited](TenantSpec::unlimited) (never reaches the store), or
//! unknown (`403` over HTTP). Tenants not listed get the file's
//! `[default]`, or are unknown without one. The layer consults it per
//! request ([`SlidingWindowLayer::tenants`](crate::SlidingWindowLayer::tenants)):
//! one atomic load and one hash lookup.
//!
//! # Sources, and which wins
//!
//! * The **file** ([`TenantsConfig`]), swapped in whole by
//!   [`TenantRegistry::set_config`]; an invalid file is refused as a whole.
//! * **Runtime** changes: [`init`](TenantRegistry::init),
//!   [`reset`](TenantRegistry::reset), [`close`](TenantRegistry::close) and
//!   [`revert`](TenantRegistry::revert). On Redis they persist (hash tag
//!   `{tw-tenants}`), so a node started later loads them.
//!
//! **A runtime record wins over the file until another runtime change
//! replaces it**: an `init`ed tenant keeps its runtime quotas and a
//! `close`d one stays closed (a tombstone) whatever the file says, so every
//! node agrees whichever file version it loaded, and a deploy never undoes
//! an operator's action. [`revert`](TenantRegistry::revert) hands a tenant
//! back to the file.
//!
//! # Reset and close: state generations
//!
//! On Redis Cluster a tenant's windows are spread over many primaries, so
//! no script can delete them. Instead every tenant has a **state
//! generation**, part of every window key
//! ([`Quota::with_generation`](crate::Quota::with_generation)). `reset` and
//! `close` increment it; every node then swaps in policies of the new
//! generation, so requests use new, empty windows (and no stale local-tier
//! entries), and the old windows expire by their own TTLs. Until a node has
//! read the change, it keeps using the old generation. A request admitted
//! before a reset settles its usage ([`Limiter::settle`](crate::Limiter::settle),
//! the layer's metered mode) in the windows it reserved in: the reset
//! forgives usage in flight as it forgives what was counted.
//!
//! # The control channel
//!
//! A registry made [`on_store`](TenantRegistry::on_store) records changes
//! through the store's resilience stack (time budget, retries, breakers).
//! On Redis, the recording script also appends the change to a stream
//! (`XADD ... MAXLEN ~`). Each registry runs a reader on a connection of
//! its own: it loads the whole state with the stream's last id, then
//! follows with `XREAD BLOCK`; after a disconnect it reads on from its last
//! id, and loads everything again if entries after it were trimmed.
//! Generations only grow, so a stale load never moves a tenant back. The
//! records, generations and stream carry a TTL
//! ([`ControlConfig::ttl`]) refreshed by every change and load.
//!
//! # Shadow quotas
//!
//! A quota listed in a tenant's `shadow` is checked and counted but never
//! denies; see [`Quota::shadowed`](crate::Quota::shadowed).

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
