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
//!     value: /static/*          # prefix wildcard
//!     rate_limit: { unlimited: true }
//!   - key: tenant
//!     descriptors:              # nested: matched by a descriptor's next entry
//!       - key: user
//!         rate_limit: { unit: second, requests_per_unit: 10, algorithm: fixed-window }
//! ```
//!
//! The fields are envoyproxy/ratelimit's (`domain`; `descriptors` with
//! `key`, `value` — a trailing `*` makes it a prefix —, `rate_limit` with
//! `unit` (`second`, `minute`, `hour`, `day`, `week`, `month` = 30 days,
//! `year` = 365 days), `requests_per_unit`, `unlimited`, `name`, `replaces`;
//! `shadow_mode`, nested `descriptors`, `share_threshold`, and the
//! metrics-only `detailed_metric` and `value_to_metric`, accepted and
//! ignored), with its checks: an unknown field, an empty domain or key, a
//! domain in two files, a duplicate key/value at one level, an invalid
//! unit, a unit on an unlimited rule, an empty `replaces` or one naming the
//! rule itself are refused, naming the file. `algorithm` (per file, or per
//! `rate_limit`) is this service's own: `sliding-log` (the default: exact
//! over any window of the unit's length), `sliding-counter` (up to 60
//! buckets per window: constant memory per key, for large limits), or
//! `fixed-window` (windows aligned to the epoch: envoyproxy/ratelimit's own
//! counting, for an exact drop-in).
//!
//! A set of files ([`RlsConfig::load`]) is judged as a whole: one broken
//! file refuses the set.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use serde::Deserialize;
use tower_window::quota::default_granularity;
use tower_window::{Algorithm, Quota, QuotaError};

/// A file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
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
#[serde(deny_unknown_fields)]
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
    share_threshold: bool,
    // Metrics-only fields of envoyproxy/ratelimit: accepted, no effect here.
    #[serde(default)]
    #[allow(dead_code)]
    detailed_metric: bool,
    #[serde(default)]
    #[allow(dead_code)]
    value_to_metric: bool,
}

/// A `rate_limit` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
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
#[serde(deny_unknown_fields)]
struct ReplacesYaml {
    #[serde(default)]
    name: String,
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
    /// `key` + `value*` rules: (key, prefix), longest prefix first.
    pub(super) wildcards: Vec<(String, String, Child)>,
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

/// Every domain of a set of config files.
#[derive(Debug, Default)]
pub struct RlsConfig {
    /// By name.
    pub domains: HashMap<String, Domain>,
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
    pub fn load(sources: &[PathBuf]) -> Result<Self, RlsConfigError> {
        let files = files_of(sources)?;
        let mut texts = Vec::with_capacity(files.len());
        for file in files {
            let text = std::fs::read_to_string(&file)
                .map_err(|e| error(&file, format!("cannot read it: {e}")))?;
            texts.push((file, text));
        }
        Self::from_texts(&texts)
    }

    /// Checks a set of files given as `(path, text)`.
    pub fn from_texts(texts: &[(PathBuf, String)]) -> Result<Self, RlsConfigError> {
        let mut config = Self {
            domains: HashMap::new(),
            generation: GENERATION.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1,
        };
        for (file, text) in texts {
            let domain = parse_file(file, text)?;
            if let Some(other) = config.domains.get(&domain.name) {
                return Err(error(
                    file,
                    format!(
                        "duplicate domain '{}' (also in {})",
                        domain.name,
                        other.file.display()
                    ),
                ));
            }
            config.domains.insert(domain.name.clone(), domain);
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

fn parse_file(file: &Path, text: &str) -> Result<Domain, RlsConfigError> {
    let yaml: FileYaml = serde_norway::from_str(text)
        .map_err(|e| error(file, format!("not a valid config file: {e}")))?;
    if yaml.domain.is_empty() {
        return Err(error(file, "config file cannot have empty domain"));
    }
    let algorithm = yaml.algorithm.unwrap_or_default();
    let mut root = Node::default();
    load_level(
        file,
        &yaml.domain,
        "",
        yaml.descriptors.unwrap_or_default(),
        algorithm,
        &mut root,
    )?;
    Ok(Domain {
        name: yaml.domain,
        algorithm,
        root,
        file: file.to_owned(),
    })
}

fn load_level(
    file: &Path,
    domain: &str,
    parent: &str,
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
        let wildcard = descriptor.value.strip_suffix('*');
        let taken = match (&*descriptor.value, wildcard) {
            ("", _) => node.key_only.contains_key(&descriptor.key),
            (_, Some(prefix)) => node
                .wildcards
                .iter()
                .any(|(k, p, _)| *k == descriptor.key && p == prefix),
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
                format!("share_threshold can only be used with wildcard values (ending with '*'), but found key '{own}'"),
            ));
        }
        let rule = match descriptor.rate_limit {
            Some(rate_limit) => Some(Arc::new(rule(
                file,
                &path,
                rate_limit,
                descriptor.shadow_mode,
                algorithm,
            )?)),
            None => None,
        };
        let mut children = Node::default();
        load_level(
            file,
            domain,
            &path,
            descriptor.descriptors.unwrap_or_default(),
            algorithm,
            &mut children,
        )?;
        let child = Child {
            rule,
            share: descriptor.share_threshold,
            children,
        };
        match (descriptor.value.as_str(), wildcard) {
            ("", _) => {
                node.key_only.insert(descriptor.key, child);
            }
            (_, Some(prefix)) => {
                let prefix = prefix.to_owned();
                node.wildcards.push((descriptor.key, prefix, child));
                // The most specific (longest) prefix is tried first.
                node.wildcards
                    .sort_by(|a, b| b.1.len().cmp(&a.1.len()).then_with(|| a.1.cmp(&b.1)));
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

fn rule(
    file: &Path,
    path: &str,
    yaml: RateLimitYaml,
    shadow: bool,
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
            Limit::Quota(quota.shadowed(shadow))
        }
    };
    Ok(Rule {
        path: path.to_owned(),
        limit,
        requests_per_unit: yaml.requests_per_unit,
        unit: unit.map_or(Unit::Unknown, |(unit, _)| unit),
        shadow,
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
            ("domain: d\nfoo: 1", "unknown field"),
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
    fn quota_names_come_from_the_config() {
        assert_eq!(quota_name("", "path_/login.user"), "path__login.user");
        assert_eq!(quota_name("login", "x"), "login");
        assert_eq!(quota_name("", &"k".repeat(100)).len(), 64);
    }
}
