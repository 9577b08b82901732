//! The rls's rules: envoyproxy/ratelimit's YAML format, plus `algorithm`.
//!
//! One file is one domain:
//!
//! ```yaml
//! domain: edge
//! algorithm: sliding-log        # optional: sliding-log (default), sliding-counter, fixed-window
//! descriptors:
//!   - key: remote_address
//!     rate_limit: { unit: minute, requests_per_unit: 60 }
//!   - key: path
//!     value: /login
//!     rate_limit: { unit: minute, requests_per_unit: 5, name: login }
//!     shadow_mode: true
//!   - key: path
//!     value: /static/*          # wildcard: `*` anywhere in the value
//!     rate_limit: { unlimited: true }
//!   - key: tenant
//!     descriptors:              # nested: matched by a descriptor's next entry
//!       - key: user
//!         rate_limit: { unit: second, requests_per_unit: 10, algorithm: fixed-window }
//! ```
//!
//! The keys are envoyproxy/ratelimit's: `domain`; `descriptors` with
//! `key`, `value` (a `*` anywhere in it matches any run of characters:
//! `/static/*`, `foo*bar`, `svc*ep*rpc`), `rate_limit` with `unit`
//! (`second`, `minute`, `hour`, `day`, `week` = 7 days, `month` = 30 days,
//! `year` = 365 days, any case), `requests_per_unit`, `unlimited`, `name`,
//! `replaces`; `shadow_mode` (counted, answered OK), `quota_mode` (a soft
//! limit: see [`service`](super::service)), `share_threshold` (every value
//! matching a wildcard shares one window), `metadata` (any YAML, kept with
//! the rule), nested `descriptors`, and the metrics keys `detailed_metric`
//! and `value_to_metric`. They are checked as envoyproxy/ratelimit checks
//! them, with its messages: an unknown key ("config error, unknown key
//! 'x'"), an empty domain or key, a domain in two files (unless
//! [`LoadOptions::merge_domains`]), a duplicate key/value at one level, an
//! invalid unit, a unit on an unlimited rule, an empty `replaces` or one
//! naming the rule itself, `share_threshold` on a value without `*`; every
//! message names the file. `algorithm` (per file, or per `rate_limit`) is
//! this service's own: `sliding-log` (the default: exact over any window of
//! the unit's length), `sliding-counter` (up to 60 buckets per window:
//! constant memory per key, for large limits), or `fixed-window` (windows
//! aligned to the epoch: envoyproxy/ratelimit's own counting, for an exact
//! drop-in).
//!
//! `usage_report: true` on an entry is this service's own too: a descriptor
//! whose last entry is that entry is a *usage report* (Envoy's
//! `apply_on_stream_done` call, whose answer Envoy ignores) of the window
//! its entries before that one get. Its `hits_addend` is recorded there in
//! full, past the limit too, and it is answered `OK` (see
//! [`service`](super::service)). Such an entry has no `rate_limit` and no
//! nested `descriptors` of its own, and its parent entry has a limited
//! `rate_limit` (not `unlimited`, not 0): anything else is refused.
//!
//! A set of files ([`RlsConfig::load`]) is judged as a whole: one broken
//! file refuses the set.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use serde::Deserialize;
use tower_window::quota::default_granularity;
use tower_window::{Algorithm, Quota, QuotaError};

use super::matching::Wildcard;

/// A file as written (its keys checked first by [`check_keys`]).
#[derive(Debug, Deserialize)]
#[serde(expecting = "a mapping with `domain` and `descriptors`")]
struct FileYaml {
    #[serde(default)]
    domain: String,
    #[serde(default)]
    algorithm: Option<AlgorithmName>,
    #[serde(default)]
    descriptors: Option<Vec<DescriptorYaml>>,
}

/// A descriptor rule as written.
#[derive(Debug, Deserialize)]
#[serde(expecting = "a descriptor: a mapping with `key`, `value`, `rate_limit`...")]
struct DescriptorYaml {
    #[serde(default)]
    key: String,
    #[serde(default)]
    value: String,
    #[serde(default)]
    rate_limit: Option<RateLimitYaml>,
    #[serde(default)]
    descriptors: Option<Vec<DescriptorYaml>>,
    #[serde(default)]
    shadow_mode: bool,
    #[serde(default)]
    quota_mode: bool,
    #[serde(default)]
    share_threshold: bool,
    #[serde(default)]
    detailed_metric: bool,
    #[serde(default)]
    value_to_metric: bool,
    #[serde(default)]
    metadata: Option<serde_norway::Value>,
    #[serde(default)]
    usage_report: bool,
}

/// A `rate_limit` as written.
#[derive(Debug, Deserialize)]
#[serde(expecting = "a rate_limit: a mapping with `unit` and `requests_per_unit`, or `unlimited`")]
struct RateLimitYaml {
    #[serde(default)]
    requests_per_unit: u32,
    #[serde(default)]
    unit: String,
    #[serde(default)]
    unlimited: bool,
    #[serde(default)]
    name: String,
    #[serde(default)]
    replaces: Vec<ReplacesYaml>,
    #[serde(default)]
    algorithm: Option<AlgorithmName>,
}

#[derive(Debug, Deserialize)]
#[serde(expecting = "a replaces entry: a mapping with `name`")]
struct ReplacesYaml {
    #[serde(default)]
    name: String,
}

/// Every key a rules file may hold: envoyproxy/ratelimit's, `algorithm`
/// and `usage_report`. `metadata`'s own contents are free.
const VALID_KEYS: &[&str] = &[
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "quota_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
    "algorithm",
    "usage_report",
];

/// Checks every key of `map` (and of the maps below it) as
/// envoyproxy/ratelimit does, with its messages: keys are strings and
/// known, lists hold maps.
fn check_keys(map: &serde_norway::Mapping) -> Result<(), String> {
    use serde_norway::Value;
    for (key, value) in map {
        let key = match key {
            Value::String(key) => key,
            other => {
                return Err(format!(
                    "config error, key is not of type string: {}",
                    scalar_text(other)
                ))
            }
        };
        if !VALID_KEYS.contains(&key.as_str()) {
            return Err(format!("config error, unknown key '{key}'"));
        }
        if key == "metadata" {
            continue;
        }
        match value {
            Value::Sequence(items) => {
                for item in items {
                    let Value::Mapping(item) = item else {
                        return Err(format!(
                            "config error, yaml file contains list of type other than map: {}",
                            scalar_text(item)
                        ));
                    };
                    check_keys(item)?;
                }
            }
            Value::Mapping(inner) => check_keys(inner)?,
            _ => {}
        }
    }
    Ok(())
}

/// A YAML value as envoyproxy/ratelimit prints one in its messages.
fn scalar_text(value: &serde_norway::Value) -> String {
    use serde_norway::Value;
    match value {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Null => "<nil>".to_owned(),
        Value::Sequence(_) => "a list".to_owned(),
        Value::Mapping(_) => "a map".to_owned(),
        Value::Tagged(tagged) => scalar_text(&tagged.value),
    }
}

/// Removes every empty (`null`) value of a mapping, at any depth.
fn drop_nulls(value: &mut serde_norway::Value) {
    use serde_norway::Value;
    match value {
        Value::Mapping(map) => {
            map.retain(|_, v| !v.is_null());
            map.values_mut().for_each(drop_nulls);
        }
        Value::Sequence(items) => items.iter_mut().for_each(drop_nulls),
        Value::Tagged(tagged) => drop_nulls(&mut tagged.value),
        _ => {}
    }
}

/// What a YAML value is, for a message.
fn kind_of(value: &serde_norway::Value) -> &'static str {
    use serde_norway::Value;
    match value {
        Value::String(_) => "text",
        Value::Number(_) => "a number",
        Value::Bool(_) => "a boolean",
        Value::Null => "nothing",
        Value::Sequence(_) => "a list",
        Value::Mapping(_) => "a mapping",
        Value::Tagged(_) => "a tagged value",
    }
}

/// The `algorithm` field's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum AlgorithmName {
    /// Exact: every window of the unit's length.
    #[default]
    SlidingLog,
    /// Up to 60 buckets per window.
    SlidingCounter,
    /// Windows aligned to the epoch (envoyproxy/ratelimit's counting).
    FixedWindow,
}

/// What a matched rule does.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Limit {
    /// `unlimited: true`: always OK, no store call.
    Unlimited,
    /// `requests_per_unit: 0`: always over the limit, no store call.
    Zero,
    /// A quota (tenant-scoped, named after the rule) to decide in the store.
    Quota(Quota),
}

/// One rule with a `rate_limit`.
#[derive(Debug)]
#[non_exhaustive]
pub struct Rule {
    /// Where it is: `key_value` parts joined by `.` (`path_/login`,
    /// `tenant.user`), as envoyproxy/ratelimit names its stats keys.
    pub path: String,
    /// What it does.
    pub limit: Limit,
    /// `requests_per_unit` as written.
    pub requests_per_unit: u32,
    /// `unit` (`Unknown` for an unlimited rule).
    pub unit: Unit,
    /// `shadow_mode`: counted, never enforced.
    pub shadow: bool,
    /// `quota_mode`: a soft limit (see [`service`](super::service)).
    pub quota_mode: bool,
    /// `detailed_metric`: its series carry the descriptor's values.
    pub detailed_metric: bool,
    /// `metadata` as written (kept with the rule).
    pub metadata: Option<serde_norway::Value>,
    /// `rate_limit.name` (empty: none).
    pub name: String,
    /// `rate_limit.replaces[].name`.
    pub replaces: Vec<String>,
}

/// One level of a domain's rule tree.
#[derive(Debug, Default)]
pub struct Node {
    /// `key` + `value` rules, by key then value.
    pub(super) exact: HashMap<String, HashMap<String, Child>>,
    /// `key` + a `value` with `*`: the most literal characters first, then
    /// in file order.
    pub(super) wildcards: Vec<(String, Wildcard, Child)>,
    /// `key`-only rules.
    pub(super) key_only: HashMap<String, Child>,
}

/// A rule tree entry: its rule (if it has a `rate_limit`) and its nested
/// level.
#[derive(Debug)]
pub struct Child {
    /// The rule of this entry, if it has a `rate_limit`.
    pub rule: Option<Arc<Rule>>,
    /// `share_threshold`: every value matching this wildcard shares one
    /// window.
    pub share: bool,
    /// `usage_report`: a descriptor ending here reports usage of its
    /// parent entry's window.
    pub usage_report: bool,
    /// The nested `descriptors`.
    pub children: Node,
}

/// One domain's rules.
#[derive(Debug)]
pub struct Domain {
    /// `domain`.
    pub name: String,
    /// The file's `algorithm` (for descriptor limit overrides).
    pub algorithm: AlgorithmName,
    /// The top level.
    pub root: Node,
    /// The file it came from.
    pub file: PathBuf,
}

/// How a set of files is loaded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LoadOptions {
    /// `MERGE_DOMAIN_CONFIG`: a domain in several files is one domain
    /// holding every file's rules (a key/value in two of them is still
    /// refused); without it, a domain in two files refuses the set.
    pub merge_domains: bool,
}

impl LoadOptions {
    /// Options with `merge_domains` as given.
    pub fn merging(merge_domains: bool) -> Self {
        Self { merge_domains }
    }
}

/// Every domain of a set of config files.
#[derive(Debug, Default)]
pub struct RlsConfig {
    /// By name.
    pub domains: HashMap<String, Domain>,
    /// How the set was loaded (a reload loads the same way).
    pub options: LoadOptions,
    /// Which set this is: every loaded set has a number of its own, so
    /// what was derived from one set (prepared requests) is never taken
    /// for another's.
    pub generation: u64,
}

/// The last generation handed out.
static GENERATION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Why a set of files was refused: the file and the problem.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RlsConfigError {
    /// The file at fault (or the directory / argument).
    pub file: PathBuf,
    /// What is wrong.
    pub problem: String,
}

impl fmt::Display for RlsConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.file.display(), self.problem)
    }
}

impl std::error::Error for RlsConfigError {}

fn error(file: &Path, problem: impl Into<String>) -> RlsConfigError {
    RlsConfigError {
        file: file.to_owned(),
        problem: problem.into(),
    }
}

/// A unit's window, and the unit (`second` ... `year`, any case).
pub fn unit_window(unit: &str) -> Option<(Unit, Duration)> {
    let unit = Unit::from_str_name(&unit.to_ascii_uppercase())?;
    let seconds = match unit {
        Unit::Second => 1,
        Unit::Minute => 60,
        Unit::Hour => 3_600,
        Unit::Day => 86_400,
        Unit::Week => 7 * 86_400,
        Unit::Month => 30 * 86_400,
        Unit::Year => 365 * 86_400,
        Unit::Unknown => return None,
    };
    Some((unit, Duration::from_secs(seconds)))
}

/// The window of a proto unit (a descriptor's limit override).
pub fn window_of(unit: Unit) -> Option<Duration> {
    unit_window(unit.as_str_name())
        .map(|(_, window)| window)
        .filter(|_| unit != Unit::Unknown)
}

/// `limit` per `window` counted by `algorithm`, tenant-scoped (the domain
/// is the tenant), named `name`.
pub fn quota(
    name: &str,
    limit: u32,
    window: Duration,
    algorithm: AlgorithmName,
) -> Result<Quota, QuotaError> {
    let builder = Quota::builder()
        .name(name)
        .limit(limit)
        .window(window)
        .scope(tower_window::Scope::Tenant);
    match algorithm {
        AlgorithmName::SlidingLog => builder.algorithm(Algorithm::SlidingLog),
        AlgorithmName::SlidingCounter => builder.granularity(default_granularity(window)),
        AlgorithmName::FixedWindow => builder.algorithm(Algorithm::FixedWindow),
    }
    .build()
}

/// A quota name for a rule: its `name` when that is a valid quota name,
/// else its path with every other character as `_`, at most 64 characters.
/// Names label metrics, so they come from the config (bounded), never from
/// a request.
pub fn quota_name(rule_name: &str, path: &str) -> String {
    let source = if rule_name.is_empty() {
        path
    } else {
        rule_name
    };
    let mut name: String = source
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    if name.is_empty() {
        name.push_str("rule");
    }
    name
}

impl RlsConfig {
    /// Reads and checks every file of `sources`: a directory stands for its
    /// `*.yaml` / `*.yml` files (not recursive, in name order). The set is
    /// judged as a whole: any error refuses it.
    pub fn load(sources: &[PathBuf], options: LoadOptions) -> Result<Self, RlsConfigError> {
        let files = files_of(sources)?;
        let mut texts = Vec::with_capacity(files.len());
        for file in files {
            let text = std::fs::read_to_string(&file)
                .map_err(|e| error(&file, format!("cannot read it: {e}")))?;
            texts.push((file, text));
        }
        Self::from_texts_with(&texts, options)
    }

    /// Checks a set of files given as `(path, text)`, a domain in two files
    /// refused.
    pub fn from_texts(texts: &[(PathBuf, String)]) -> Result<Self, RlsConfigError> {
        Self::from_texts_with(texts, LoadOptions::default())
    }

    /// Checks a set of files given as `(path, text)`, loaded as `options`
    /// say.
    pub fn from_texts_with(
        texts: &[(PathBuf, String)],
        options: LoadOptions,
    ) -> Result<Self, RlsConfigError> {
        let mut config = Self {
            domains: HashMap::new(),
            options,
            generation: GENERATION.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1,
        };
        for (file, text) in texts {
            let yaml = parse_yaml(file, text)?;
            if yaml.domain.is_empty() {
                return Err(error(file, "config file cannot have empty domain"));
            }
            let algorithm = yaml.algorithm.unwrap_or_default();
            let descriptors = yaml.descriptors.unwrap_or_default();
            let domain = match config.domains.entry(yaml.domain.clone()) {
                Entry::Occupied(merged) if options.merge_domains => merged.into_mut(),
                Entry::Occupied(first) => {
                    return Err(error(
                        file,
                        format!(
                            "duplicate domain '{}' in config file (also in {}; MERGE_DOMAIN_CONFIG=true merges them)",
                            yaml.domain,
                            first.get().file.display()
                        ),
                    ));
                }
                Entry::Vacant(new) => new.insert(Domain {
                    name: yaml.domain.clone(),
                    algorithm,
                    root: Node::default(),
                    file: file.to_owned(),
                }),
            };
            load_level(
                file,
                &yaml.domain,
                ("", None),
                descriptors,
                algorithm,
                &mut domain.root,
            )?;
        }
        Ok(config)
    }

    /// How many rules with a `rate_limit` the domains hold.
    pub fn rule_count(&self) -> usize {
        fn count(node: &Node) -> usize {
            let children = node
                .exact
                .values()
                .flat_map(HashMap::values)
                .chain(node.wildcards.iter().map(|(_, _, c)| c))
                .chain(node.key_only.values());
            children
                .map(|c| usize::from(c.rule.is_some()) + count(&c.children))
                .sum()
        }
        self.domains.values().map(|d| count(&d.root)).sum()
    }

    /// Every quota name the rules may check (for the metrics).
    pub fn quota_names(&self) -> Vec<String> {
        fn walk(node: &Node, out: &mut Vec<String>) {
            let children = node
                .exact
                .values()
                .flat_map(HashMap::values)
                .chain(node.wildcards.iter().map(|(_, _, c)| c))
                .chain(node.key_only.values());
            for child in children {
                if let Some(Limit::Quota(quota)) = child.rule.as_ref().map(|r| &r.limit) {
                    out.push(quota.name().to_owned());
                }
                walk(&child.children, out);
            }
        }
        let mut out = Vec::new();
        for domain in self.domains.values() {
            walk(&domain.root, &mut out);
        }
        out.sort();
        out.dedup();
        out
    }
}

/// The files `sources` stand for, in order.
pub fn files_of(sources: &[PathBuf]) -> Result<Vec<PathBuf>, RlsConfigError> {
    let mut files = Vec::new();
    for source in sources {
        if source.is_dir() {
            let entries = std::fs::read_dir(source)
                .map_err(|e| error(source, format!("cannot list the directory: {e}")))?;
            let mut found: Vec<PathBuf> = entries
                .filter_map(Result::ok)
                .map(|entry| entry.path())
                .filter(|path| {
                    path.is_file()
                        && path
                            .extension()
                            .is_some_and(|ext| ext == "yaml" || ext == "yml")
                })
                .collect();
            found.sort();
            files.extend(found);
        } else {
            files.push(source.clone());
        }
    }
    if files.is_empty() {
        let shown = sources.first().cloned().unwrap_or_default();
        return Err(error(
            &shown,
            "no config file: give --config FILE or a directory holding *.yaml files",
        ));
    }
    Ok(files)
}

/// The file's YAML, its keys checked first (envoyproxy/ratelimit's
/// messages), then read into the rules' shape.
fn parse_yaml(file: &Path, text: &str) -> Result<FileYaml, RlsConfigError> {
    use serde_norway::Value;
    let value: Value = serde_norway::from_str(text)
        .map_err(|e| error(file, format!("error loading config file: {e}")))?;
    let map = match value {
        // An empty file: no domain (refused as such).
        Value::Null => serde_norway::Mapping::new(),
        Value::Mapping(map) => map,
        other => {
            return Err(error(
                file,
                format!(
                    "error loading config file: a rules file is a YAML mapping with `domain` and `descriptors`, this one is {}",
                    kind_of(&other)
                ),
            ))
        }
    };
    check_keys(&map).map_err(|problem| error(file, problem))?;
    // An empty value (`name:`) is an absent one, as envoyproxy/ratelimit
    // reads it.
    let mut value = Value::Mapping(map);
    drop_nulls(&mut value);
    serde_norway::from_value(value)
        .map_err(|e| error(file, format!("error loading config file: {e}")))
}

/// Loads one level of rules into `node`; `parent` is the path of the entry
/// above and its rule (none at the top).
fn load_level(
    file: &Path,
    domain: &str,
    (parent, parent_rule): (&str, Option<&Rule>),
    descriptors: Vec<DescriptorYaml>,
    algorithm: AlgorithmName,
    node: &mut Node,
) -> Result<(), RlsConfigError> {
    for descriptor in descriptors {
        if descriptor.key.is_empty() {
            return Err(error(file, "descriptor has empty key"));
        }
        let own = if descriptor.value.is_empty() {
            descriptor.key.clone()
        } else {
            format!("{}_{}", descriptor.key, descriptor.value)
        };
        let path = if parent.is_empty() {
            own.clone()
        } else {
            format!("{parent}.{own}")
        };
        let wildcard = Wildcard::parse(&descriptor.value);
        let taken = match (&*descriptor.value, &wildcard) {
            ("", _) => node.key_only.contains_key(&descriptor.key),
            (_, Some(pattern)) => node
                .wildcards
                .iter()
                .any(|(k, p, _)| *k == descriptor.key && p.text() == pattern.text()),
            (value, None) => node
                .exact
                .get(&descriptor.key)
                .is_some_and(|values| values.contains_key(value)),
        };
        if taken {
            return Err(error(
                file,
                format!("duplicate descriptor composite key '{domain}.{path}'"),
            ));
        }
        if descriptor.share_threshold && wildcard.is_none() {
            return Err(error(
                file,
                format!("share_threshold can only be used with wildcard values (with a '*'), but found key '{own}'"),
            ));
        }
        check_usage_report(&descriptor, parent_rule).map_err(|problem| {
            error(file, format!("usage_report at '{domain}.{path}' {problem}"))
        })?;
        let rule = match descriptor.rate_limit {
            Some(rate_limit) => Some(Arc::new(rule(
                file,
                &path,
                rate_limit,
                Modes {
                    shadow: descriptor.shadow_mode,
                    quota: descriptor.quota_mode,
                    detailed_metric: descriptor.detailed_metric || descriptor.value_to_metric,
                },
                descriptor.metadata,
                algorithm,
            )?)),
            None => None,
        };
        let mut children = Node::default();
        load_level(
            file,
            domain,
            (&path, rule.as_deref()),
            descriptor.descriptors.unwrap_or_default(),
            algorithm,
            &mut children,
        )?;
        let child = Child {
            rule,
            share: descriptor.share_threshold,
            usage_report: descriptor.usage_report,
            children,
        };
        match (descriptor.value.as_str(), wildcard) {
            ("", _) => {
                node.key_only.insert(descriptor.key, child);
            }
            (_, Some(pattern)) => {
                node.wildcards.push((descriptor.key, pattern, child));
                // The most specific pattern (most literal characters) is
                // tried first; a stable sort keeps the file order of ties.
                node.wildcards
                    .sort_by_key(|(_, pattern, _)| std::cmp::Reverse(pattern.literal_len()));
            }
            (value, None) => {
                let value = value.to_owned();
                node.exact
                    .entry(descriptor.key)
                    .or_default()
                    .insert(value, child);
            }
        }
    }
    Ok(())
}

/// Why a `usage_report` entry under `parent` (its parent entry's rule) has
/// no window to count in, if it has none.
fn check_usage_report(descriptor: &DescriptorYaml, parent: Option<&Rule>) -> Result<(), String> {
    if !descriptor.usage_report {
        return Ok(());
    }
    let problem = if descriptor.rate_limit.is_some() {
        "has a rate_limit of its own"
    } else if descriptor
        .descriptors
        .as_ref()
        .is_some_and(|d| !d.is_empty())
    {
        "has nested descriptors (it is a descriptor's last entry)"
    } else {
        match parent.map(|rule| &rule.limit) {
            None => "has no parent entry with a rate_limit",
            Some(Limit::Unlimited) => "is under an unlimited rule",
            Some(Limit::Zero) => "is under a rule of requests_per_unit 0",
            Some(Limit::Quota(_)) => return Ok(()),
        }
    };
    Err(format!(
        "{problem}: a usage report counts in the window of its parent entry's rate_limit"
    ))
}

/// A rule's modes, as its descriptor writes them.
#[derive(Debug, Clone, Copy)]
struct Modes {
    shadow: bool,
    quota: bool,
    detailed_metric: bool,
}

fn rule(
    file: &Path,
    path: &str,
    yaml: RateLimitYaml,
    modes: Modes,
    metadata: Option<serde_norway::Value>,
    algorithm: AlgorithmName,
) -> Result<Rule, RlsConfigError> {
    let unit = unit_window(&yaml.unit);
    let replaces: Vec<String> = yaml.replaces.into_iter().map(|r| r.name).collect();
    if replaces.iter().any(String::is_empty) {
        return Err(error(file, "should not have an empty replaces entry"));
    }
    if !yaml.name.is_empty() && replaces.contains(&yaml.name) {
        return Err(error(
            file,
            "replaces should not contain name of same descriptor",
        ));
    }
    let limit = if yaml.unlimited {
        if unit.is_some() {
            return Err(error(
                file,
                "should not specify rate limit unit when unlimited",
            ));
        }
        Limit::Unlimited
    } else {
        let Some((_, window)) = unit else {
            return Err(error(
                file,
                format!(
                    "invalid rate limit unit '{}' at '{path}': expected second, minute, hour, day, week, month or year",
                    yaml.unit
                ),
            ));
        };
        if yaml.requests_per_unit == 0 {
            Limit::Zero
        } else {
            let name = quota_name(&yaml.name, path);
            let algorithm = yaml.algorithm.unwrap_or(algorithm);
            let quota = quota(&name, yaml.requests_per_unit, window, algorithm)
                .map_err(|e| error(file, format!("rate_limit at '{path}': {e}")))?;
            // A shadow or quota-mode window never stops the others of its
            // request from counting: it is a shadow quota of the policy.
            Limit::Quota(quota.shadowed(modes.shadow || modes.quota))
        }
    };
    Ok(Rule {
        path: path.to_owned(),
        limit,
        requests_per_unit: yaml.requests_per_unit,
        unit: unit.map_or(Unit::Unknown, |(unit, _)| unit),
        shadow: modes.shadow,
        quota_mode: modes.quota,
        detailed_metric: modes.detailed_metric,
        metadata,
        name: yaml.name,
        replaces,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn load(text: &str) -> Result<RlsConfig, RlsConfigError> {
        RlsConfig::from_texts(&[(PathBuf::from("a.yaml"), text.to_owned())])
    }

    #[test]
    fn refuses_what_envoyproxy_ratelimit_refuses() {
        for (text, problem) in [
            ("descriptors: []", "empty domain"),
            ("domain: d\nfoo: 1", "config error, unknown key 'foo'"),
            ("- a\n- b", "a YAML mapping with `domain` and `descriptors`, this one is a list"),
            ("# a README\nSome *text*.", "this one is text"),
            ("domain: d\ndescriptors: [a]", "list of type other than map: a"),
            ("domain: d\n0.25: x", "key is not of type string: 0.25"),
            ("domain: d\ndescriptors:\n  - value: x", "empty key"),
            (
                "domain: d\ndescriptors:\n  - key: k\n  - key: k",
                "duplicate descriptor composite key 'd.k'",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}",
                "invalid rate limit unit 'fortnight'",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, unlimited: true}",
                "should not specify rate limit unit when unlimited",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: ''}]}",
                "empty replaces entry",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, name: a, replaces: [{name: a}]}",
                "name of same descriptor",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true",
                "share_threshold can only be used with wildcard",
            ),
            (
                "domain: d\nalgorithm: gcra",
                "unknown variant",
            ),
        ] {
            let error = load(text).unwrap_err();
            assert!(error.problem.contains(problem), "{text}: {error}");
            assert_eq!(error.file, PathBuf::from("a.yaml"));
        }
    }

    #[test]
    fn a_domain_in_two_files_is_refused() {
        let texts = [
            (PathBuf::from("a.yaml"), "domain: d".to_owned()),
            (PathBuf::from("b.yaml"), "domain: d".to_owned()),
        ];
        let error = RlsConfig::from_texts(&texts).unwrap_err();
        assert_eq!(error.file, PathBuf::from("b.yaml"));
        assert!(error.problem.contains("duplicate domain 'd'"));
    }

    #[test]
    fn rules_load_with_their_algorithm() {
        let config = load(
            "domain: d\nalgorithm: fixed-window\ndescriptors:\n  - key: a\n    rate_limit: {unit: Minute, requests_per_unit: 5}\n  - key: b\n    rate_limit: {unit: hour, requests_per_unit: 7, algorithm: sliding-counter, name: bee}\n  - key: c\n    rate_limit: {unit: day, requests_per_unit: 0}\n  - key: e\n    rate_limit: {unlimited: true}\n",
        )
        .unwrap();
        let root = &config.domains["d"].root;
        let Limit::Quota(a) = &root.key_only["a"].rule.as_ref().unwrap().limit else {
            panic!("a quota");
        };
        assert_eq!(a.to_string(), "5/1m fixed-window");
        assert_eq!(a.scope(), tower_window::Scope::Tenant);
        let Limit::Quota(b) = &root.key_only["b"].rule.as_ref().unwrap().limit else {
            panic!("a quota");
        };
        assert_eq!(
            (b.name(), b.to_string().as_str()),
            ("bee", "7/1h sliding-counter(1m)")
        );
        assert!(matches!(
            root.key_only["c"].rule.as_ref().unwrap().limit,
            Limit::Zero
        ));
        assert!(matches!(
            root.key_only["e"].rule.as_ref().unwrap().limit,
            Limit::Unlimited
        ));
        assert_eq!(config.rule_count(), 4);
        assert_eq!(config.quota_names(), ["a", "bee"]);
    }

    #[test]
    fn every_key_of_envoyproxy_ratelimit_loads() {
        let config = load(
            "domain: d\ndescriptors:\n  - key: k\n    value: a*b*c\n    share_threshold: true\n    quota_mode: true\n    detailed_metric: true\n    value_to_metric: true\n    metadata: {service_with_quota: {name: s}, anything: [1, 2]}\n    rate_limit: {unit: week, requests_per_unit: 3}\n",
        )
        .unwrap();
        let (_, pattern, child) = &config.domains["d"].root.wildcards[0];
        assert_eq!(pattern.text(), "a*b*c");
        let rule = child.rule.as_ref().unwrap();
        assert!(rule.quota_mode && rule.detailed_metric && child.share);
        assert!(rule.metadata.is_some());
        let Limit::Quota(quota) = &rule.limit else {
            panic!("a quota");
        };
        // A soft limit never stops the request's other windows counting.
        assert!(quota.is_shadow());
        assert_eq!(rule.unit, Unit::Week);
    }

    #[test]
    fn a_usage_report_entry_needs_its_parents_window() {
        let config = load(
            "domain: d\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 100}\n    descriptors:\n      - key: stream_done\n        usage_report: true\n",
        )
        .unwrap();
        let tenant = &config.domains["d"].root.key_only["tenant"];
        let report = &tenant.children.key_only["stream_done"];
        assert!(report.usage_report && report.rule.is_none());
        assert_eq!(config.rule_count(), 1);
        let under = |parent: &str, entry: &str| {
            format!("domain: d\ndescriptors:\n  - key: t\n{parent}    descriptors:\n      - key: s\n        usage_report: true\n{entry}")
        };
        for (text, problem) in [
            (
                "domain: d\ndescriptors:\n  - key: s\n    usage_report: true".to_owned(),
                "usage_report at 'd.s' has no parent entry with a rate_limit",
            ),
            (under("", ""), "usage_report at 'd.t.s' has no parent entry"),
            (
                under("    rate_limit: {unlimited: true}\n", ""),
                "is under an unlimited rule",
            ),
            (
                under("    rate_limit: {unit: hour, requests_per_unit: 0}\n", ""),
                "is under a rule of requests_per_unit 0",
            ),
            (
                under(
                    "    rate_limit: {unit: hour, requests_per_unit: 5}\n",
                    "        rate_limit: {unit: hour, requests_per_unit: 5}\n",
                ),
                "has a rate_limit of its own",
            ),
            (
                under(
                    "    rate_limit: {unit: hour, requests_per_unit: 5}\n",
                    "        descriptors: [{key: x}]\n",
                ),
                "has nested descriptors",
            ),
        ] {
            let error = load(&text).unwrap_err();
            assert!(error.problem.contains(problem), "{text}: {error}");
            assert!(
                error
                    .problem
                    .ends_with("counts in the window of its parent entry's rate_limit"),
                "{error}"
            );
        }
    }

    #[test]
    fn merge_domain_config_merges_a_domain_across_files() {
        let texts = [
            (
                PathBuf::from("a.yaml"),
                "domain: d\ndescriptors: [{key: a, rate_limit: {unit: second, requests_per_unit: 1}}]".to_owned(),
            ),
            (
                PathBuf::from("b.yaml"),
                "domain: d\ndescriptors: [{key: b, rate_limit: {unit: second, requests_per_unit: 1}}]".to_owned(),
            ),
        ];
        let merged = RlsConfig::from_texts_with(&texts, LoadOptions::merging(true)).unwrap();
        assert_eq!(merged.rule_count(), 2);
        let twice = [texts[0].clone(), texts[0].clone()];
        let error = RlsConfig::from_texts_with(&twice, LoadOptions::merging(true)).unwrap_err();
        assert!(error
            .problem
            .contains("duplicate descriptor composite key 'd.a'"));
    }

    #[test]
    fn quota_names_come_from_the_config() {
        assert_eq!(quota_name("", "path_/login.user"), "path__login.user");
        assert_eq!(quota_name("login", "x"), "login");
        assert_eq!(quota_name("", &"k".repeat(100)).len(), 64);
    }
}
