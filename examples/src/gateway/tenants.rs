//! `--tenants FILE`: the tenant registry, and the file's hot reload.
//!
//! The file is watched (the `notify` crate, on its directory, so editors
//! that replace the file are seen too). Only events that can mean a new
//! version count: data written to the file, the file created, or another
//! file renamed onto it (how editors and deploys save atomically). Opening
//! and reading it — by anyone, this watcher included — and metadata
//! changes (`touch`, `chmod`) do not. A burst of such events (an editor's
//! save is several) is one reload: the file is read once the events have
//! stopped for [`SETTLE`] (or [`MAX_SETTLE`] after the first, for a file
//! that is written without a pause).
//!
//! A version is judged once: its text is compared with the last one read,
//! and an unchanged text is neither reloaded nor warned about again. A
//! valid new version is swapped in atomically (requests see the old or the
//! new configuration, never a mix, and none is dropped); an invalid one is
//! refused with one warning naming the tenant, the quota and the problem,
//! and the old configuration stays. Every judged version is counted in
//! `tower_window_config_reload_total{result="ok"|"error"}`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use notify::event::{AccessKind, AccessMode, EventKind, ModifyKind, RenameMode};
use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tower_window::metrics::CONFIG_RELOAD_TOTAL;
use tower_window::tenant::{TenantRegistry, TenantSpec, TenantsConfig};
use tower_window::Policy;

use super::{ConfigError, GatewayConfig};

/// How long the file's events must pause before it is read.
pub const SETTLE: Duration = Duration::from_millis(100);
/// The longest a burst of events delays the read.
pub const MAX_SETTLE: Duration = Duration::from_secs(1);

/// A tenants file as loaded at start.
#[derive(Debug, Clone)]
pub struct TenantsFile {
    /// Where it is.
    pub path: PathBuf,
    /// What it said.
    pub config: TenantsConfig,
    /// Its text, the version the watch starts from.
    text: String,
}

impl TenantsFile {
    /// Reads and validates `path` (`--tenants`).
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|error| {
            let fix = match error.kind() {
                std::io::ErrorKind::NotFound => {
                    let cwd = std::env::current_dir()
                        .map(|d| format!(" (a relative path is from {})", d.display()))
                        .unwrap_or_default();
                    format!("check the path{cwd}, or leave --tenants out to give every tenant the --limit policy")
                }
                std::io::ErrorKind::PermissionDenied => {
                    "let the gateway's user read the file".to_owned()
                }
                _ => "give the path of a readable TOML file (see examples/tenants.toml)".to_owned(),
            };
            ConfigError::new("--tenants", shown.clone(), format!("cannot read it: {error}"), fix)
        })?;
        let config = TenantsConfig::from_toml(&text).map_err(|error| {
            ConfigError::new(
                "--tenants",
                shown.clone(),
                format!("not a valid tenants file:\n{error}"),
                "fix the file (its format: examples/tenants.toml and examples/README.md) and start again",
            )
        })?;
        Ok(Self {
            path: path.to_owned(),
            config,
            text,
        })
    }

    /// What the startup log says of the file: its tenants (at most 20 by
    /// name) and its `[default]`.
    pub fn summary(&self) -> (String, String) {
        const SHOWN: usize = 20;
        let mut tenants: Vec<String> = self
            .config
            .tenants
            .iter()
            .take(SHOWN)
            .map(|(name, spec)| format!("{name} ({})", describe(spec)))
            .collect();
        if self.config.tenants.len() > SHOWN {
            tenants.push(format!("and {} more", self.config.tenants.len() - SHOWN));
        }
        let tenants = if tenants.is_empty() {
            "none".to_owned()
        } else {
            tenants.join(", ")
        };
        let default = match &self.config.default {
            Some(spec) => describe(spec),
            None => "none: tenants not listed are refused (403)".to_owned(),
        };
        (tenants, default)
    }
}

/// A tenant's definition in one line: `burst=10/1s, minute=60/1m (shadow)`
/// or `unlimited`.
pub fn describe(spec: &TenantSpec) -> String {
    if spec.is_unlimited() {
        return "unlimited".to_owned();
    }
    spec.quotas()
        .iter()
        .map(|quota| {
            let mut text = format!("{}={quota}", quota.name());
            if quota.scope() == tower_window::Scope::Tenant {
                text.push_str(" per tenant");
            }
            if quota.is_shadow() {
                text.push_str(" (shadow)");
            }
            text
        })
        .collect::<Vec<_>>()
        .join(", ")
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
    Some(TenantRegistry::on_store(file, &config.store))
}

fn spec_of(policy: &Policy) -> Option<TenantSpec> {
    TenantSpec::new(policy.quotas().iter().cloned()).ok()
}

/// What a watch has done so far (shared with its task).
#[derive(Debug, Default)]
struct Counts {
    reads: AtomicU64,
    reloaded: AtomicU64,
    refused: AtomicU64,
}

/// A running watch of a tenants file ([`watch`]): what it has done, for
/// tests and operators. Clones share the counts.
#[derive(Debug, Clone, Default)]
pub struct TenantsWatch {
    counts: Arc<Counts>,
}

impl TenantsWatch {
    /// How many times the file was read after a change was signalled.
    pub fn reads(&self) -> u64 {
        self.counts.reads.load(Ordering::Relaxed)
    }

    /// How many new versions were swapped in.
    pub fn reloaded(&self) -> u64 {
        self.counts.reloaded.load(Ordering::Relaxed)
    }

    /// How many new versions were refused (invalid or unreadable), each
    /// with one warning.
    pub fn refused(&self) -> u64 {
        self.counts.refused.load(Ordering::Relaxed)
    }
}

/// Whether `event` can mean a new version of the file named `name`: data
/// written to it, it created, or a file renamed onto it. Not: opened or
/// read (this watcher's own read is such an event), metadata (`touch`,
/// `chmod`), removed or renamed away (the old configuration stays until a
/// new file is there).
fn is_new_version(event: &notify::Event, name: &std::ffi::OsStr) -> bool {
    let ours = |path: &PathBuf| path.file_name() == Some(name);
    match event.kind {
        EventKind::Create(_)
        | EventKind::Modify(ModifyKind::Data(_) | ModifyKind::Any | ModifyKind::Other)
        | EventKind::Access(AccessKind::Close(AccessMode::Write)) => event.paths.iter().any(ours),
        // `Both` lists the old path, then the new one.
        EventKind::Modify(ModifyKind::Name(RenameMode::To | RenameMode::Both)) => {
            event.paths.last().is_some_and(ours)
        }
        // Backends that cannot tell the side of a rename; an unchanged
        // text is ignored anyway.
        EventKind::Modify(ModifyKind::Name(RenameMode::Any | RenameMode::Other)) => {
            event.paths.iter().any(ours)
        }
        _ => false,
    }
}

/// Watches `file` and reloads `registry` from it on every new version
/// (the first is the one after `file` as loaded), until the registry is
/// dropped (see the [module docs](self)). Must run inside a Tokio runtime.
/// `None` (with a warning) when the platform cannot watch the file: hot
/// reload is then off.
pub fn watch(registry: TenantRegistry, file: &TenantsFile) -> Option<TenantsWatch> {
    let path = file.path.clone();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let Some(name) = path.file_name().map(ToOwned::to_owned) else {
        tracing::warn!(path = %path.display(), "the tenants file has no file name to watch; hot reload is off");
        return None;
    };
    let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        match event {
            Ok(event) if is_new_version(&event, &name) => {
                let _ = tx.send(());
            }
            Ok(_) => {}
            // An overflowed queue, say: read the file, in case.
            Err(_) => {
                let _ = tx.send(());
            }
        }
    });
    let mut watcher = match watcher {
        Ok(watcher) => watcher,
        Err(error) => {
            tracing::warn!(%error, "cannot watch the tenants file; hot reload is off");
            return None;
        }
    };
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .to_owned();
    if let Err(error) = watcher.watch(&dir, RecursiveMode::NonRecursive) {
        tracing::warn!(%error, "cannot watch the tenants file; hot reload is off");
        return None;
    }
    let handle = TenantsWatch::default();
    let counts = Arc::clone(&handle.counts);
    let mut last = Some(Seen::Text(file.text.clone()));
    tokio::spawn(async move {
        let _watcher = watcher; // watching as long as this task runs
        while rx.recv().await.is_some() {
            settle(&mut rx).await;
            counts.reads.fetch_add(1, Ordering::Relaxed);
            match reload(&registry, &path, &mut last) {
                Outcome::Reloaded => counts.reloaded.fetch_add(1, Ordering::Relaxed),
                Outcome::Refused => counts.refused.fetch_add(1, Ordering::Relaxed),
                Outcome::Unchanged => 0,
            };
        }
    });
    Some(handle)
}

/// Waits until no event came for [`SETTLE`], at most [`MAX_SETTLE`].
async fn settle(rx: &mut mpsc::UnboundedReceiver<()>) {
    let deadline = tokio::time::Instant::now() + MAX_SETTLE;
    loop {
        let quiet = tokio::time::Instant::now() + SETTLE;
        match tokio::time::timeout_at(quiet.min(deadline), rx.recv()).await {
            Ok(Some(())) if tokio::time::Instant::now() < deadline => continue,
            _ => return,
        }
    }
}

/// The last version of the file a reload judged.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Seen {
    /// Its text (valid or not).
    Text(String),
    /// It could not be read, for this reason.
    Unreadable(std::io::ErrorKind),
}

/// What one [`reload`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// The file says what it said last time: nothing done, nothing logged.
    Unchanged,
    /// A new, valid version is in force.
    Reloaded,
    /// A new version was refused (invalid or unreadable); the old
    /// configuration stays.
    Refused,
}

/// Reloads `registry` from the tenants file at `path` if it changed since
/// `last` (which it then becomes): a valid file is swapped in as a whole,
/// an unreadable or invalid one is refused with a warning and the old
/// configuration stays. A version equal to `last` is not judged again (no
/// second warning for the same broken text). Each judged version is
/// logged once and counted in
/// `tower_window_config_reload_total{result="ok"|"error"}`.
pub fn reload(registry: &TenantRegistry, path: &Path, last: &mut Option<Seen>) -> Outcome {
    let seen = match std::fs::read_to_string(path) {
        Ok(text) => Seen::Text(text),
        Err(error) => Seen::Unreadable(error.kind()),
    };
    if last.as_ref() == Some(&seen) {
        return Outcome::Unchanged;
    }
    *last = Some(seen.clone());
    let text = match seen {
        Seen::Text(text) => text,
        Seen::Unreadable(kind) => {
            reloaded(false);
            let error = std::io::Error::from(kind);
            tracing::warn!(%error, path = %path.display(), "tenants file unreadable; keeping the old configuration");
            return Outcome::Refused;
        }
    };
    match TenantsConfig::from_toml(&text) {
        Ok(config) => {
            registry.set_config(config);
            reloaded(true);
            // Quotas new in this file chart zero until their first decision.
            let names = quota_names(registry);
            super::metrics::register_at_zero(names.iter().map(String::as_str));
            tracing::info!(path = %path.display(), "tenants file reloaded");
            Outcome::Reloaded
        }
        Err(error) => {
            reloaded(false);
            tracing::warn!(%error, path = %path.display(), "invalid tenants file refused; keeping the old configuration");
            Outcome::Refused
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
