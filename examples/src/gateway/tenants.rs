//! `--tenants FILE`: the tenant registry, and the file's hot reload.
//!
//! The file is watched (the `notify` crate, on its directory, so editors
//! that replace the file are seen too). On a change it is read and
//! validated as a whole: a valid file is swapped in atomically (requests
//! see the old or the new configuration, never a mix, and none is dropped);
//! an invalid one is refused with a warning naming the tenant, the quota
//! and the problem, and the old configuration stays. Every attempt is
//! counted in `tower_window_config_reload_total{result="ok"|"error"}`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tower_window::metrics::CONFIG_RELOAD_TOTAL;
use tower_window::tenant::{TenantRegistry, TenantSpec, TenantsConfig};
use tower_window::Policy;

use super::GatewayConfig;

/// A tenants file as loaded at start.
#[derive(Debug, Clone)]
pub struct TenantsFile {
    /// Where it is.
    pub path: PathBuf,
    /// What it said.
    pub config: TenantsConfig,
}

impl TenantsFile {
    /// Reads and validates `path`.
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let config = TenantsConfig::from_toml(&text).map_err(|e| e.to_string())?;
        Ok(Self {
            path: path.to_owned(),
            config,
        })
    }
}

/// The gateway's registry: from `--tenants`, or (with only `--admin-token`)
/// an empty file whose default is the `--limit` policy; on Redis when the
/// gateway uses Redis. `None` without either flag.
pub fn registry(config: &GatewayConfig) -> Option<TenantRegistry> {
    let file = match (&config.tenants, &config.admin_token) {
        (Some(file), _) => file.config.clone(),
        (None, Some(_)) => TenantsConfig::new().with_default(spec_of(&config.policy)?),
        (None, None) => return None,
    };
    Some(match &config.redis {
        Some(redis) => TenantRegistry::redis(file, Arc::clone(redis)),
        None => TenantRegistry::new(file),
    })
}

fn spec_of(policy: &Policy) -> Option<TenantSpec> {
    TenantSpec::new(policy.quotas().iter().cloned()).ok()
}

/// Watches `path` and reloads `registry` from it on every change, until the
/// registry is dropped. Must run inside a Tokio runtime.
pub fn watch(registry: TenantRegistry, path: PathBuf) {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let name = path.file_name().map(ToOwned::to_owned);
    let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if let Ok(event) = event {
            if event.paths.iter().any(|p| p.file_name() == name.as_deref()) {
                let _ = tx.send(());
            }
        }
    });
    let mut watcher = match watcher {
        Ok(watcher) => watcher,
        Err(error) => {
            tracing::warn!(%error, "cannot watch the tenants file; hot reload is off");
            return;
        }
    };
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .to_owned();
    if let Err(error) = watcher.watch(&dir, RecursiveMode::NonRecursive) {
        tracing::warn!(%error, "cannot watch the tenants file; hot reload is off");
        return;
    }
    let mut last = std::fs::read_to_string(&path).ok();
    tokio::spawn(async move {
        let _watcher = watcher; // watching as long as this task runs
        while rx.recv().await.is_some() {
            // Let a burst of events (write, rename, chmod) settle.
            tokio::time::sleep(Duration::from_millis(50)).await;
            while rx.try_recv().is_ok() {}
            reload(&registry, &path, &mut last);
        }
    });
}

/// Reloads `registry` from the tenants file at `path` if its text changed
/// since `last` (which it then becomes): a valid file is swapped in as a
/// whole, an unreadable or invalid one is refused and the old configuration
/// stays. Each attempt is logged and counted in
/// `tower_window_config_reload_total{result="ok"|"error"}`.
pub fn reload(registry: &TenantRegistry, path: &Path, last: &mut Option<String>) {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) => {
            reloaded(false);
            tracing::warn!(%error, path = %path.display(), "tenants file unreadable; keeping the old configuration");
            return;
        }
    };
    if last.as_deref() == Some(text.as_str()) {
        return;
    }
    match TenantsConfig::from_toml(&text) {
        Ok(config) => {
            registry.set_config(config);
            *last = Some(text);
            reloaded(true);
            // Quotas new in this file chart zero until their first decision.
            let names = quota_names(registry);
            super::metrics::register_at_zero(names.iter().map(String::as_str));
            tracing::info!(path = %path.display(), "tenants file reloaded");
        }
        Err(error) => {
            reloaded(false);
            tracing::warn!(%error, path = %path.display(), "invalid tenants file refused; keeping the old configuration");
        }
    }
}

fn reloaded(ok: bool) {
    let result = if ok { "ok" } else { "error" };
    metrics::counter!(CONFIG_RELOAD_TOTAL, "result" => result).increment(1);
}

/// Registers both `result`s of the reload counter at zero.
pub(super) fn register_reloads() {
    for result in ["ok", "error"] {
        metrics::counter!(CONFIG_RELOAD_TOTAL, "result" => result).increment(0);
    }
}

/// The names of every quota `registry` may check: its default's and every
/// listed tenant's (from the file or defined at runtime).
pub(super) fn quota_names(registry: &TenantRegistry) -> Vec<String> {
    let default = registry.config().default;
    let tenants = registry.tenants();
    default
        .iter()
        .chain(tenants.iter().map(|info| &info.spec))
        .flat_map(TenantSpec::quotas)
        .map(|quota| quota.name().to_owned())
        .collect()
}
