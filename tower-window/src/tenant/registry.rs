//! [`TenantRegistry`]: tenant → policy, hot-swappable, with a lifecycle.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use crate::sync::lock;

use arc_swap::ArcSwap;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::backend::{Backend, Recorded};
use super::{validate_tenant_name, ControlConfig, TenantError, TenantSpec, TenantsConfig};
use crate::metrics::{Calls, LimiterMetrics};
use crate::{Policy, Store};

/// What a registry says about one tenant.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Resolution {
    /// Check requests against this policy.
    Limited(Policy),
    /// Never limited: requests do not reach the store.
    Unlimited,
    /// Neither listed nor covered by a default: reject (403 over HTTP).
    Unknown,
}

/// Where a tenant's definition comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TenantSource {
    /// The tenants file.
    File,
    /// [`TenantRegistry::init`].
    Runtime,
    /// Not listed: the file's `[default]`.
    Default,
}

impl TenantSource {
    /// `file`, `runtime` or `default`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::File => "file",
            Self::Runtime => "runtime",
            Self::Default => "default",
        }
    }
}

/// One tenant as a registry knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TenantInfo {
    /// The tenant's name.
    pub name: String,
    /// Its definition.
    pub spec: TenantSpec,
    /// Where the definition comes from.
    pub source: TenantSource,
    /// How many times it was reset or closed (part of its window keys).
    pub generation: u64,
}

/// A lifecycle change.
#[derive(Debug, Clone)]
pub(crate) enum Change {
    Init(TenantSpec),
    Reset,
    Close,
    /// Drops the runtime record: the file decides again.
    Revert,
}

impl Change {
    pub(crate) fn bumps_generation(&self) -> bool {
        matches!(self, Self::Reset | Self::Close)
    }
}

#[derive(Default)]
struct Sources {
    file: TenantsConfig,
    /// Runtime records: `init`'s spec, or `close`'s tombstone (`None`).
    runtime: HashMap<String, Option<TenantSpec>>,
    generations: HashMap<String, u64>,
}

impl Sources {
    fn names(&self) -> BTreeSet<&String> {
        let file = self.file.tenants.keys();
        file.chain(self.runtime.keys())
            .chain(self.generations.keys())
            .collect()
    }

    /// Tenant `name` as listed (runtime record, else file), or else, when
    /// `or_default`, as the default serves it.
    fn info(&self, name: &str, or_default: bool) -> Option<TenantInfo> {
        let listed = match self.runtime.get(name) {
            Some(record) => record.as_ref().map(|spec| (spec, TenantSource::Runtime)),
            None => self
                .file
                .tenants
                .get(name)
                .map(|spec| (spec, TenantSource::File)),
        };
        let default = || Some((self.file.default.as_ref()?, TenantSource::Default));
        let (spec, source) = listed.or_else(|| default().filter(|_| or_default))?;
        Some(TenantInfo {
            name: name.to_owned(),
            spec: spec.clone(),
            source,
            generation: self.generations.get(name).copied().unwrap_or(0),
        })
    }

    /// Raises the generation of `name` to `generation`.
    fn bump(&mut self, name: &str, generation: u64) {
        let entry = self.generations.entry(name.to_owned()).or_insert(0);
        *entry = (*entry).max(generation);
    }
}

fn resolution(spec: &TenantSpec, name: &str, generation: u64) -> Resolution {
    spec.policy(name, generation)
        .map_or(Resolution::Unlimited, Resolution::Limited)
}

/// What the hot path reads, swapped whole on every change.
#[derive(Default)]
struct View {
    tenants: HashMap<Box<[u8]>, Resolution>,
    default: Option<Resolution>,
}

pub(crate) struct Inner {
    view: ArcSwap<View>,
    sources: Mutex<Sources>,
    /// Counts full loads from the store (0 until the first).
    pub(crate) loaded: watch::Sender<u64>,
    /// Counts view rebuilds.
    version: watch::Sender<u64>,
    /// `None`: changes apply in this process only.
    writer: Option<Writer>,
    follower: OnceLock<Follower>,
}

/// Where lifecycle changes are recorded, through the store's stack.
struct Writer {
    store: Store,
    backend: Arc<dyn Backend>,
    control: ControlConfig,
    metrics: Arc<LimiterMetrics>,
}

/// The task following other registries' changes, aborted with the registry.
struct Follower(JoinHandle<()>);

impl Drop for Follower {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Resolves tenants to their [`Policy`], and carries their lifecycle to
/// every node; see the [module docs](super). Clones share everything.
///
/// ```
/// use tower_window::tenant::{Resolution, TenantRegistry, TenantSpec, TenantsConfig};
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let config = TenantsConfig::new()
///     .with_tenant("acme", TenantSpec::builder().quota("burst", "10/1s")?.build()?)?;
/// let registry = TenantRegistry::new(config);
/// assert!(matches!(registry.resolve(b"acme"), Resolution::Limited(_)));
/// assert_eq!(registry.resolve(b"nobody"), Resolution::Unknown);
///
/// registry.init("nobody", TenantSpec::unlimited()).await?;
/// assert_eq!(registry.resolve(b"nobody"), Resolution::Unlimited);
/// registry.close("nobody").await?;
/// assert_eq!(registry.resolve(b"nobody"), Resolution::Unknown);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Clone)]
pub struct TenantRegistry {
    pub(crate) inner: Arc<Inner>,
}

impl TenantRegistry {
    /// The registry of `config`, recording lifecycle changes on `store`:
    /// on Redis they reach every registry on it (a background reader
    /// follows them, so this needs a Tokio runtime). A store without a
    /// tenant backend gives an in-process registry ([`new`](Self::new)).
    pub fn on_store(config: TenantsConfig, store: &Store) -> Self {
        Self::on_store_with(config, store, ControlConfig::default())
    }

    fn on_store_with(config: TenantsConfig, store: &Store, control: ControlConfig) -> Self {
        let writer = crate::store::plugged!(store, dyn Backend).map(|backend| Writer {
            store: store.clone(),
            backend,
            control,
            metrics: LimiterMetrics::named("tenants"),
        });
        Self::with_writer(config, writer)
    }

    /// [`on_store`](Self::on_store) on a [`Store`] of its own (its budget
    /// [`ControlConfig::timeout`], its own breakers).
    #[cfg(feature = "redis")]
    pub fn redis(config: TenantsConfig, store: Arc<crate::RedisStore>) -> Self {
        Self::redis_with(config, store, ControlConfig::default())
    }

    /// [`redis`](Self::redis) with explicit settings.
    #[cfg(feature = "redis")]
    pub fn redis_with(
        config: TenantsConfig,
        store: Arc<crate::RedisStore>,
        control: ControlConfig,
    ) -> Self {
        let store = Store::builder(store).timeout(control.timeout).build();
        Self::on_store_with(config, &store, control)
    }

    /// An in-process registry of `config`: lifecycle calls apply to this
    /// process only.
    pub fn new(config: TenantsConfig) -> Self {
        Self::with_writer(config, None)
    }

    fn with_writer(config: TenantsConfig, writer: Option<Writer>) -> Self {
        let registry = Self {
            inner: Arc::new(Inner {
                view: ArcSwap::from_pointee(View::default()),
                sources: Mutex::new(Sources {
                    file: config,
                    ..Sources::default()
                }),
                loaded: watch::channel(0).0,
                version: watch::channel(0).0,
                writer,
                follower: OnceLock::new(),
            }),
        };
        registry.rebuild(&lock(&registry.inner.sources));
        let follower = registry.inner.writer.as_ref().and_then(|writer| {
            let registry = Arc::downgrade(&registry.inner);
            Arc::clone(&writer.backend).follow(registry, writer.control.clone())
        });
        if let Some(task) = follower {
            let _ = registry.inner.follower.set(Follower(task));
        } else {
            registry.inner.loaded.send_replace(1);
        }
        registry
    }

    /// What `tenant` gets. Never blocks or allocates.
    pub fn resolve(&self, tenant: &[u8]) -> Resolution {
        let view = self.inner.view.load();
        view.tenants
            .get(tenant)
            .or(view.default.as_ref())
            .cloned()
            .unwrap_or(Resolution::Unknown)
    }

    /// Replaces the file's configuration (a hot reload), atomically.
    /// Runtime records keep winning over it. Windows are kept, also for a
    /// changed limit (they are keyed by name, window and algorithm).
    pub fn set_config(&self, config: TenantsConfig) {
        let mut sources = lock(&self.inner.sources);
        sources.file = config;
        self.rebuild(&sources);
    }

    /// The file's configuration now in force.
    pub fn config(&self) -> TenantsConfig {
        lock(&self.inner.sources).file.clone()
    }

    /// Every listed tenant (not closed ones), by name.
    pub fn tenants(&self) -> Vec<TenantInfo> {
        let sources = lock(&self.inner.sources);
        let names = sources.names().into_iter();
        names.filter_map(|name| sources.info(name, false)).collect()
    }

    /// The tenant `name`, if listed (and not closed).
    pub fn tenant(&self, name: &str) -> Option<TenantInfo> {
        lock(&self.inner.sources).info(name, false)
    }

    /// The definition `name` is served with (listed, or the default).
    pub fn effective(&self, name: &str) -> Option<TenantInfo> {
        lock(&self.inner.sources).info(name, true)
    }

    /// Defines (or replaces) tenant `name` at runtime, on every node.
    pub async fn init(&self, name: &str, spec: TenantSpec) -> Result<(), TenantError> {
        self.change(name, Change::Init(spec)).await.map(drop)
    }

    /// Starts every window of tenant `name` afresh, on every node, by
    /// moving it to a new state generation. `Ok(false)` for an unknown
    /// tenant.
    pub async fn reset(&self, name: &str) -> Result<bool, TenantError> {
        self.change(name, Change::Reset).await
    }

    /// Closes tenant `name` on every node: later requests get the default
    /// (with fresh windows) or a rejection, and the tombstone keeps a file
    /// entry from applying until [`revert`](Self::revert). `Ok(false)` for
    /// an unknown tenant.
    pub async fn close(&self, name: &str) -> Result<bool, TenantError> {
        self.change(name, Change::Close).await
    }

    /// Hands tenant `name` back to the file, on every node, by dropping
    /// its runtime record; the generation is kept. `Ok(false)` if it has
    /// none.
    ///
    /// ```
    /// use tower_window::tenant::{Resolution, TenantRegistry, TenantSource, TenantSpec, TenantsConfig};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let file = TenantsConfig::new()
    ///     .with_tenant("acme", TenantSpec::builder().quota("burst", "10/1s")?.build()?)?;
    /// let registry = TenantRegistry::new(file);
    /// registry.init("acme", TenantSpec::unlimited()).await?;
    /// assert_eq!(registry.resolve(b"acme"), Resolution::Unlimited);
    /// // The file would not win on a reload: hand it back explicitly.
    /// assert!(registry.revert("acme").await?);
    /// assert_eq!(registry.tenant("acme").unwrap().source, TenantSource::File);
    /// assert!(!registry.revert("acme").await?); // nothing left to revert
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub async fn revert(&self, name: &str) -> Result<bool, TenantError> {
        self.change(name, Change::Revert).await
    }

    /// Records and applies `change`; `Ok(false)` if it does not apply.
    async fn change(&self, name: &str, change: Change) -> Result<bool, TenantError> {
        validate_tenant_name(name)?;
        let applies = {
            let sources = lock(&self.inner.sources);
            match change {
                Change::Init(_) => true,
                Change::Reset | Change::Close => sources.info(name, true).is_some(),
                Change::Revert => sources.runtime.contains_key(name),
            }
        };
        if !applies {
            return Ok(false);
        }
        let generation = match &self.inner.writer {
            Some(writer) => {
                let recorded = Recorded {
                    tenant: name,
                    change: &change,
                    control: &writer.control,
                };
                let generation = writer.store.call(
                    Some(&*writer.backend),
                    "tenant lifecycle changes",
                    |backend| backend.failure_domain(),
                    Calls::to(&writer.metrics, None),
                    |backend, guard| backend.record(guard, recorded),
                );
                Some(generation.await.map_err(TenantError::Store)?)
            }
            None => None,
        };
        self.apply(name, change, generation);
        Ok(true)
    }

    /// Applies one change; `generation` is the store's (`None`: count here).
    pub(crate) fn apply(&self, name: &str, change: Change, generation: Option<u64>) {
        let mut sources = lock(&self.inner.sources);
        let current = sources.generations.get(name).copied().unwrap_or(0);
        let bumped = change.bumps_generation().then_some(current + 1);
        match change {
            Change::Init(spec) => {
                sources.runtime.insert(name.to_owned(), Some(spec));
            }
            Change::Close => {
                sources.runtime.insert(name.to_owned(), None);
            }
            Change::Revert => {
                sources.runtime.remove(name);
            }
            Change::Reset => {}
        }
        if let Some(generation) = generation.or(bumped) {
            sources.bump(name, generation);
        }
        self.rebuild(&sources);
    }

    /// Replaces the runtime records and generations with a full load.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn replace_runtime(
        &self,
        runtime: HashMap<String, Option<TenantSpec>>,
        generations: HashMap<String, u64>,
    ) {
        let mut sources = lock(&self.inner.sources);
        sources.runtime = runtime;
        // A load older than a change applied here must not move a tenant
        // back to windows it left.
        for (name, generation) in generations {
            sources.bump(&name, generation);
        }
        self.rebuild(&sources);
        self.inner.loaded.send_modify(|n| *n += 1);
    }

    /// Waits until the runtime state was loaded from the store once (at
    /// once for an in-process registry); until then the file applies.
    pub async fn loaded(&self) {
        let mut rx = self.inner.loaded.subscribe();
        let _ = rx.wait_for(|n| *n > 0).await;
    }

    /// How many full loads of the runtime state happened (start,
    /// reconnects, a trimmed control stream).
    pub fn loads(&self) -> u64 {
        *self.inner.loaded.borrow()
    }

    fn rebuild(&self, sources: &Sources) {
        let tenants = sources.names().into_iter().map(|name| {
            let resolved = sources
                .info(name, true)
                .map_or(Resolution::Unknown, |info| {
                    resolution(&info.spec, name, info.generation)
                });
            (Box::from(name.as_bytes()), resolved)
        });
        let tenants = tenants.collect();
        let default = sources.file.default.as_ref();
        let default = default.map(|spec| resolution(spec, "default", 0));
        self.inner.view.store(Arc::new(View { tenants, default }));
        self.inner.version.send_modify(|v| *v += 1);
    }

    /// A receiver that sees a new value after every change of what the
    /// registry resolves.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.inner.version.subscribe()
    }
}

impl fmt::Debug for TenantRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sources = lock(&self.inner.sources);
        f.debug_struct("TenantRegistry")
            .field("file_tenants", &sources.file.tenants.len())
            .field("runtime_records", &sources.runtime.len())
            .field("default", &sources.file.default.is_some())
            .field("on_store", &self.inner.writer.is_some())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::{Limiter, MemoryStore, Quota, WindowKey};

    fn spec(quotas: &[(&str, &str)]) -> TenantSpec {
        let mut builder = TenantSpec::builder();
        for (name, dsl) in quotas {
            builder = builder.quota(name, dsl).unwrap();
        }
        builder.build().unwrap()
    }

    fn policy(registry: &TenantRegistry, tenant: &str) -> Policy {
        match registry.resolve(tenant.as_bytes()) {
            Resolution::Limited(policy) => policy,
            other => panic!("{tenant}: {other:?}"),
        }
    }

    fn file() -> TenantsConfig {
        TenantsConfig::new()
            .with_tenant("acme", spec(&[("burst", "2/1m")]))
            .unwrap()
            .with_tenant("free", TenantSpec::unlimited())
            .unwrap()
    }

    #[tokio::test]
    async fn resolves_file_default_unlimited_and_unknown() {
        let registry = TenantRegistry::new(file());
        assert_eq!(policy(&registry, "acme").first().limit(), 2);
        assert_eq!(registry.resolve(b"free"), Resolution::Unlimited);
        assert_eq!(registry.resolve(b"other"), Resolution::Unknown);
        registry.set_config(file().with_default(spec(&[("minute", "60/1m")])));
        assert_eq!(policy(&registry, "other").first().name(), "minute");
        assert_eq!(registry.tenants().len(), 2);
        assert_eq!(
            registry.effective("other").unwrap().source,
            TenantSource::Default
        );
    }

    #[tokio::test]
    async fn runtime_records_win_over_the_file_until_replaced() {
        let registry = TenantRegistry::new(file());
        registry
            .init("acme", spec(&[("burst", "5/1m")]))
            .await
            .unwrap();
        let reloaded = TenantsConfig::new()
            .with_tenant("acme", spec(&[("burst", "7/1m")]))
            .unwrap();
        registry.set_config(reloaded);
        assert_eq!(policy(&registry, "acme").first().limit(), 5);
        assert_eq!(
            registry.tenant("acme").unwrap().source,
            TenantSource::Runtime
        );
        // A close is a tombstone: the file's entry does not come back.
        assert!(registry.close("acme").await.unwrap());
        registry.set_config(file());
        assert_eq!(registry.resolve(b"acme"), Resolution::Unknown);
        assert!(registry.tenant("acme").is_none());
        assert!(!registry.close("acme").await.unwrap());
        // Until another runtime change.
        registry
            .init("acme", spec(&[("burst", "3/1m")]))
            .await
            .unwrap();
        assert_eq!(policy(&registry, "acme").first().limit(), 3);
        assert!(matches!(
            registry.init("a/b", TenantSpec::unlimited()).await,
            Err(TenantError::InvalidName(_))
        ));
    }

    #[tokio::test]
    async fn close_takes_the_default_and_revert_hands_back_to_the_file() {
        let registry = TenantRegistry::new(file().with_default(spec(&[("minute", "60/1m")])));
        // Covered by the default: closed (a new generation), still on it.
        assert!(registry.close("other").await.unwrap());
        assert_eq!(policy(&registry, "other").first().name(), "minute");
        assert_eq!(registry.effective("other").unwrap().generation, 1);
        // The tombstone keeps a later file entry from applying...
        registry.set_config(
            file()
                .with_tenant("other", spec(&[("burst", "4/1m")]))
                .unwrap()
                .with_default(spec(&[("minute", "60/1m")])),
        );
        assert_eq!(policy(&registry, "other").first().name(), "minute");
        // ...until it is reverted: the file's entry, generation kept.
        assert!(registry.revert("other").await.unwrap());
        assert_eq!(policy(&registry, "other").first().limit(), 4);
        let info = registry.tenant("other").unwrap();
        assert_eq!((info.source, info.generation), (TenantSource::File, 1));
        assert!(!registry.revert("other").await.unwrap());
        // A runtime definition goes back to the file's too.
        registry
            .init("acme", spec(&[("burst", "9/1m")]))
            .await
            .unwrap();
        assert!(registry.revert("acme").await.unwrap());
        assert_eq!(policy(&registry, "acme").first().limit(), 2);
        // Without a default, an unknown tenant is not closed.
        let bare = TenantRegistry::new(file());
        assert!(!bare.close("other").await.unwrap());
        assert!(matches!(
            bare.revert("a b").await,
            Err(TenantError::InvalidName(_))
        ));
    }

    #[tokio::test]
    async fn on_an_embedded_store_changes_go_to_its_tenant_backend() {
        let store = crate::Store::memory();
        let a = TenantRegistry::on_store(file(), &store);
        let b = TenantRegistry::on_store(file(), &store);
        a.loaded().await;
        assert_eq!(a.loads(), 1);
        assert!(a.reset("acme").await.unwrap());
        assert_eq!(a.tenant("acme").unwrap().generation, 1);
        // The store keeps the generations: B's reset moves acme to one
        // neither registry used, so B never shares A's fresh windows.
        assert!(b.reset("acme").await.unwrap());
        assert_eq!(b.tenant("acme").unwrap().generation, 2);
        b.init("newco", TenantSpec::unlimited()).await.unwrap();
        assert_eq!(b.resolve(b"newco"), Resolution::Unlimited);
        assert_eq!(b.effective("newco").unwrap().generation, 0);
        // A registry of its own counts on its own.
        let alone = TenantRegistry::new(file());
        assert!(alone.reset("acme").await.unwrap());
        assert_eq!(alone.tenant("acme").unwrap().generation, 1);
    }

    #[tokio::test]
    async fn reset_starts_every_window_afresh_and_a_limit_change_keeps_them() {
        let registry = TenantRegistry::new(file());
        let limiter = Limiter::builder(MemoryStore::new(), "1/1m".parse::<Quota>().unwrap())
            .local_capacity(100)
            .build();
        let key = WindowKey::new("acme", "alice");
        let check = || async {
            let policy = policy(&registry, "acme");
            limiter.check_policy(&key, &policy, 1).await.unwrap()
        };
        assert!(check().await.allowed);
        assert!(check().await.allowed);
        // Denied, and remembered by the local tier.
        assert!(!check().await.allowed);
        assert!(!check().await.allowed);
        assert!(limiter.stats().local_cache > 0);
        assert!(registry.reset("acme").await.unwrap());
        assert_eq!(registry.tenant("acme").unwrap().generation, 1);
        assert!(check().await.allowed, "a reset tenant starts afresh");
        // A raised limit keeps the (new) window: 1 used of 3.
        registry.set_config(
            TenantsConfig::new()
                .with_tenant("acme", spec(&[("burst", "3/1m")]))
                .unwrap(),
        );
        assert_eq!(check().await.remaining, 1);
        assert!(!registry.reset("nobody").await.unwrap());
    }
}
