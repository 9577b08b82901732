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
use crate::audit::{AdminAction, AuditLog, AuditRules};
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

    /// How an audit log records it.
    fn action(&self) -> AdminAction {
        match self {
            Self::Init(_) => AdminAction::Put,
            Self::Reset => AdminAction::Reset,
            Self::Close => AdminAction::Delete,
            Self::Revert => AdminAction::Reload,
        }
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
    /// The audit log following the tenants' rules (locked after `sources`).
    audit: Mutex<Option<Audited>>,
    /// Held by a lifecycle call made here (with an audit log) from before
    /// it reads the tenant's rules until it applied the change, and by the
    /// control-stream reader while it applies what it read: so a change
    /// made here is applied here first, and its admin record sees the
    /// rules before it.
    pub(crate) applying: tokio::sync::Mutex<()>,
}

/// An audit log, and the rules this registry gave it, by tenant.
struct Audited {
    log: AuditLog,
    given: HashMap<String, AuditRules>,
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
        Self::build(config, Some(store), ControlConfig::default())
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
        Self::build(config, Some(&store), control)
    }

    /// An in-process registry of `config`: lifecycle calls apply to this
    /// process only.
    pub fn new(config: TenantsConfig) -> Self {
        Self::build(config, None, ControlConfig::default())
    }

    /// A registry recording lifecycle changes on `store`'s tenant backend,
    /// if it has one.
    fn build(config: TenantsConfig, store: Option<&Store>, control: ControlConfig) -> Self {
        let writer = store.and_then(|store| {
            Some(Writer {
                backend: crate::store::plugged!(store, dyn Backend)?,
                store: store.clone(),
                control,
                metrics: LimiterMetrics::named("tenants"),
            })
        });
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
                audit: Mutex::new(None),
                applying: tokio::sync::Mutex::new(()),
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
    ///
    /// With an [audit log](Self::with_audit), every tenant whose entry in
    /// the file was added, changed or removed gets an
    /// [`AdminAction::Reload`] record (by this node: each node records
    /// its own reload), whether or not a runtime record overrides the
    /// entry; a changed `[default]` is recorded for no tenant.
    pub fn set_config(&self, config: TenantsConfig) {
        let mut sources = lock(&self.inner.sources);
        let log = self.audit_log();
        let changed: Vec<String> = match &log {
            Some(_) => {
                let (old, new) = (&sources.file.tenants, &config.tenants);
                let names: BTreeSet<&String> = old.keys().chain(new.keys()).collect();
                let names = names.into_iter().filter(|n| old.get(*n) != new.get(*n));
                names.cloned().collect()
            }
            None => Vec::new(),
        };
        let after = Self::record_change(log.as_ref(), &changed, AdminAction::Reload);
        sources.file = config;
        self.rebuild(&sources);
        after();
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
        let _applying = match self.audit_log() {
            Some(_) => Some(self.inner.applying.lock().await),
            None => None,
        };
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
        self.apply(name, change, generation, true);
        Ok(true)
    }

    /// Applies one change; `generation` is the store's (`None`: count
    /// here). An `admin` change (this node's operator's) gets its record
    /// in the audit log.
    pub(crate) fn apply(&self, name: &str, change: Change, generation: Option<u64>, admin: bool) {
        let mut sources = lock(&self.inner.sources);
        let log = self.audit_log().filter(|_| admin);
        let names = [name.to_owned()];
        let after = Self::record_change(log.as_ref(), &names, change.action());
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
        after();
    }

    /// The audit log, if any.
    fn audit_log(&self) -> Option<AuditLog> {
        let audited = lock(&self.inner.audit);
        audited.as_ref().map(|audited| audited.log.clone())
    }

    /// Records `action` for each of `tenants` whose rules, before the
    /// change, want admin changes; what it returns records it, after the
    /// change, for the others if their rules want them then. Called with
    /// `sources` locked, so no other change moves the rules meanwhile.
    fn record_change<'a>(
        log: Option<&'a AuditLog>,
        tenants: &'a [String],
        action: AdminAction,
    ) -> impl FnOnce() + 'a {
        let (before, after): (Vec<_>, Vec<_>) = log
            .into_iter()
            .flat_map(|log| tenants.iter().map(move |tenant| (log, tenant)))
            .partition(|(log, tenant)| log.rules(tenant).admin);
        for (log, tenant) in before {
            log.admin_change(tenant, action);
        }
        move || {
            for (log, tenant) in after {
                log.admin_change(tenant, action);
            }
        }
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
        self.sync_audit(sources);
        self.inner.version.send_modify(|v| *v += 1);
    }

    /// Gives the audit log each tenant's rules as `sources` define them
    /// (only those that changed since last time).
    fn sync_audit(&self, sources: &Sources) {
        let mut audited = lock(&self.inner.audit);
        let Some(Audited { log, given }) = audited.as_mut() else {
            return;
        };
        let rules = sources.names().into_iter().filter_map(|name| {
            let rules = sources.info(name, true)?.spec.audit()?;
            Some((name.clone(), rules))
        });
        let rules: HashMap<String, AuditRules> = rules.collect();
        for (name, rules) in &rules {
            if given.get(name) != Some(rules) {
                log.set_tenant_rules(name, Some(*rules));
            }
        }
        for name in given.keys().filter(|name| !rules.contains_key(*name)) {
            log.set_tenant_rules(name, None);
        }
        *given = rules;
    }

    /// Hands `audit` each tenant's audit rules ([`TenantSpec::audit`]),
    /// now and whenever a tenant's definition changes on this node (file
    /// loads, runtime changes made here or heard from other nodes), and
    /// records this node's operators' changes in it. Clones of the
    /// registry share it; a later call replaces it.
    ///
    /// A tenant without rules of its own gets the log's (its
    /// [default](crate::audit::AuditLogBuilder::rules), or what was
    /// [set](AuditLog::set_tenant_rules) on it directly). The `[default]`
    /// spec's rules go to the tenants the registry knows by name that it
    /// serves (closed or reset ones); tenants it never heard of get the
    /// log's.
    ///
    /// Admin changes are recorded by the node where they are made, once:
    /// [`init`](Self::init) as [`AdminAction::Put`], [`reset`](Self::reset)
    /// as [`AdminAction::Reset`], [`close`](Self::close) as
    /// [`AdminAction::Delete`], [`revert`](Self::revert) (the file decides
    /// again) and [`set_config`](Self::set_config) as
    /// [`AdminAction::Reload`]; each if the tenant's rules before or after
    /// the change want admin changes, so a change that turns them off or
    /// on is itself recorded. To see the rules before, a lifecycle call
    /// made here holds off applying changes heard from other nodes until
    /// it has applied its own (at most its time budget).
    ///
    /// ```
    /// use tower_window::audit::{AuditLog, AuditOutcome, AuditQuery, AuditRules};
    /// use tower_window::tenant::{TenantRegistry, TenantSpec, TenantsConfig};
    /// use tower_window::Store;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let store = Store::memory();
    /// let audit = AuditLog::builder(store.clone()).build();
    /// let registry = TenantRegistry::on_store(TenantsConfig::new(), &store).with_audit(audit.clone());
    /// let quiet = TenantSpec::unlimited().with_audit(Some(AuditRules::none()));
    /// registry.init("acme", quiet).await?; // recorded: the rules before wanted it
    /// assert!(!audit.rules("acme").denials);
    /// audit.flush().await;
    /// let page = audit.query(&AuditQuery::new("acme")).await?;
    /// assert_eq!(page.records[0].outcome.as_str(), "admin_put");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    #[must_use]
    pub fn with_audit(self, audit: AuditLog) -> Self {
        {
            let sources = lock(&self.inner.sources);
            *lock(&self.inner.audit) = Some(Audited {
                log: audit,
                given: HashMap::new(),
            });
            self.sync_audit(&sources);
        }
        self
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
