//! `--config`: the rule files' hot reload, as a whole.
//!
//! Every `--config` is watched (the `notify` crate: a file through its
//! directory, so editors and deploys that replace the file are seen; a
//! directory for its `*.yaml` / `*.yml` files, added and removed ones
//! included). A burst of events is one reload, read once they stop for
//! [`SETTLE`](crate::gateway::tenants::SETTLE) (at most
//! [`MAX_SETTLE`](crate::gateway::tenants::MAX_SETTLE) after the first), as
//! the gateway's tenants file.
//!
//! The set is judged as a whole: every file is read again, and if the texts
//! are those last judged nothing happens. A valid set is swapped in at once
//! (a request sees the old rules or the new ones, never a mix); a set with
//! one broken file — unreadable, not YAML, a rule envoyproxy/ratelimit would
//! refuse, a domain in two files — is refused with one warning naming the
//! file and the problem, and the old rules stay. Windows survive a reload
//! that changes only limits (the limit is not part of a window's identity).
//! Each judged set is counted in
//! `tower_window_config_reload_total{result="ok"|"error"}`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use notify::event::{AccessKind, AccessMode, EventKind, ModifyKind};
use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tower_window::metrics::CONFIG_RELOAD_TOTAL;

use super::config::{files_of, RlsConfig, RlsConfigError};

/// What a watch has done so far; clones share the counts.
#[derive(Debug, Clone, Default)]
pub struct RlsWatch {
    counts: Arc<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    reloaded: AtomicU64,
    refused: AtomicU64,
}

impl RlsWatch {
    /// How many new sets were swapped in.
    pub fn reloaded(&self) -> u64 {
        self.counts.reloaded.load(Ordering::Relaxed)
    }

    /// How many new sets were refused.
    pub fn refused(&self) -> u64 {
        self.counts.refused.load(Ordering::Relaxed)
    }
}

/// The texts of a set of files as last judged (or why they could not be
/// read).
pub type Snapshot = Result<Vec<(PathBuf, String)>, RlsConfigError>;

/// Reads every file `sources` stand for.
pub fn read(sources: &[PathBuf]) -> Snapshot {
    let files = files_of(sources)?;
    let mut texts = Vec::with_capacity(files.len());
    for file in files {
        let text = std::fs::read_to_string(&file).map_err(|e| RlsConfigError {
            file: file.clone(),
            problem: format!("cannot read it: {e}"),
        })?;
        texts.push((file, text));
    }
    Ok(texts)
}

/// What one [`reload`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// The files say what they said last time.
    Unchanged,
    /// A new, valid set is in force.
    Reloaded,
    /// A new set was refused; the old rules stay.
    Refused,
}

/// Reloads `config` from `sources` if their texts changed since `last`
/// (which they then become): see the [module docs](self).
pub fn reload(config: &ArcSwap<RlsConfig>, sources: &[PathBuf], last: &mut Snapshot) -> Outcome {
    let seen = read(sources);
    if *last == seen {
        return Outcome::Unchanged;
    }
    *last = seen.clone();
    let options = config.load().options;
    match seen.and_then(|texts| RlsConfig::from_texts_with(&texts, options)) {
        Ok(new) => {
            let names = new.quota_names();
            tracing::info!(
                domains = new.domains.len(),
                rules = new.rule_count(),
                "rate limit config reloaded"
            );
            config.store(Arc::new(new));
            super::metrics::register_at_zero(names.iter().map(String::as_str));
            count(true);
            Outcome::Reloaded
        }
        Err(error) => {
            tracing::warn!(%error, "rate limit config refused; keeping the old rules");
            count(false);
            Outcome::Refused
        }
    }
}

fn count(ok: bool) {
    let result = if ok { "ok" } else { "error" };
    metrics::counter!(CONFIG_RELOAD_TOTAL, "result" => result).increment(1);
}

/// Whether `event` can mean new content for the set: data written, a file
/// created, removed or renamed (in or out). Not: opened, read, metadata.
fn is_change(event: &notify::Event) -> bool {
    matches!(
        event.kind,
        EventKind::Create(_)
            | EventKind::Remove(_)
            | EventKind::Modify(
                ModifyKind::Data(_) | ModifyKind::Name(_) | ModifyKind::Any | ModifyKind::Other
            )
            | EventKind::Access(AccessKind::Close(AccessMode::Write))
    )
}

/// Whether `path` is one of the set's files, or could become one (a YAML
/// file in a watched directory).
fn concerns(path: &Path, sources: &[PathBuf]) -> bool {
    sources.iter().any(|source| {
        if source.is_dir() {
            path.parent() == Some(source.as_path())
                && path
                    .extension()
                    .is_some_and(|ext| ext == "yaml" || ext == "yml")
        } else {
            path.file_name() == source.file_name()
                && path.parent().map(Path::to_path_buf) == Some(dir_of(source))
        }
    })
}

fn dir_of(source: &Path) -> PathBuf {
    source
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .to_owned()
}

/// Watches `sources` and reloads `config` from them on every change (the
/// first judged against `first`, the set as loaded at start). Must run
/// inside a Tokio runtime. `None` (with a warning) when the platform cannot
/// watch them: hot reload is then off.
pub fn watch(
    config: Arc<ArcSwap<RlsConfig>>,
    sources: Vec<PathBuf>,
    first: Snapshot,
) -> Option<RlsWatch> {
    // Absolute paths: notify reports absolute ones.
    let sources: Vec<PathBuf> = sources
        .into_iter()
        .map(|s| std::path::absolute(&s).unwrap_or(s))
        .collect();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let filter = sources.clone();
    let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        match event {
            Ok(event) if is_change(&event) && event.paths.iter().any(|p| concerns(p, &filter)) => {
                let _ = tx.send(());
            }
            Ok(_) => {}
            // An overflowed queue, say: read the files, in case.
            Err(_) => {
                let _ = tx.send(());
            }
        }
    });
    let mut watcher = match watcher {
        Ok(watcher) => watcher,
        Err(error) => {
            tracing::warn!(%error, "cannot watch the config files; hot reload is off");
            return None;
        }
    };
    let mut dirs: Vec<PathBuf> = sources
        .iter()
        .map(|s| if s.is_dir() { s.clone() } else { dir_of(s) })
        .collect();
    dirs.sort();
    dirs.dedup();
    for dir in &dirs {
        if let Err(error) = watcher.watch(dir, RecursiveMode::NonRecursive) {
            tracing::warn!(%error, dir = %dir.display(), "cannot watch the config files; hot reload is off");
            return None;
        }
    }
    let handle = RlsWatch::default();
    let counts = Arc::clone(&handle.counts);
    // The texts as loaded, made absolute like the watched paths.
    let mut last = first.map(|texts| {
        texts
            .into_iter()
            .map(|(p, t)| (std::path::absolute(&p).unwrap_or(p), t))
            .collect()
    });
    tokio::spawn(async move {
        let _watcher = watcher; // watching as long as this task runs
        while rx.recv().await.is_some() {
            settle(&mut rx).await;
            match reload(&config, &sources, &mut last) {
                Outcome::Reloaded => counts.reloaded.fetch_add(1, Ordering::Relaxed),
                Outcome::Refused => counts.refused.fetch_add(1, Ordering::Relaxed),
                Outcome::Unchanged => 0,
            };
        }
    });
    Some(handle)
}

/// Waits until no event came for `SETTLE`, at most `MAX_SETTLE`.
async fn settle(rx: &mut mpsc::UnboundedReceiver<()>) {
    use crate::gateway::tenants::{MAX_SETTLE, SETTLE};
    let deadline = tokio::time::Instant::now() + MAX_SETTLE;
    loop {
        let quiet = tokio::time::Instant::now() + SETTLE;
        match tokio::time::timeout_at(quiet.min(deadline), rx.recv()).await {
            Ok(Some(())) if tokio::time::Instant::now() < deadline => continue,
            _ => return,
        }
    }
}
