//! Which rule a request descriptor gets, as envoyproxy/ratelimit matches:
//! entry by entry down the domain's tree, each entry by the most specific
//! rule of its level — `key` + `value`, else `key` + a matching wildcard
//! value (a `*` anywhere matches any run of characters; the pattern with
//! the most literal characters first, ties in file order), else `key`
//! alone —; the descriptor gets the rule of its
//! last entry, if that rule has a `rate_limit`. A descriptor with more
//! entries than the tree is deep, or whose entry matches nothing, gets no
//! rule (OK, nothing counted), and so does one without entries. A
//! descriptor whose last entry matches a `usage_report` entry is a usage
//! report of the window its entries before that one get: that window's
//! rule and identity, marked as a report.

use std::fmt::Write as _;
use std::sync::Arc;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;

use super::config::{Child, Domain, Rule};

/// A descriptor's rule, and the identity of its window.
#[derive(Debug, Clone)]
pub struct Matched {
    /// The rule.
    pub rule: Arc<Rule>,
    /// The window's identity within the domain: the rule's path and the
    /// descriptor's entries (a `share_threshold` wildcard's entries by its
    /// pattern, so every matching value shares one window), each part
    /// length-prefixed so that no two descriptors write the same text.
    pub instance: String,
    /// A usage report (its last entry is a `usage_report` entry): the rule
    /// and window are those of the entries before it.
    pub usage_report: bool,
}

/// The rule of `entries` in `domain` (see the [module docs](self)).
pub fn match_descriptor(domain: &Domain, entries: &[Entry]) -> Option<Matched> {
    let mut node = &domain.root;
    let mut instance = String::new();
    let mut parent: Option<&Child> = None;
    let last = entries.len().checked_sub(1)?;
    for (i, entry) in entries.iter().enumerate() {
        let (child, shared) = find(node, entry)?;
        // A usage report: the window of the entries before this one.
        let (owner, usage_report) = match parent {
            Some(parent) if i == last && child.usage_report => (parent, true),
            _ => {
                match shared {
                    Some(pattern) => push_entry(&mut instance, &entry.key, '*', pattern),
                    None => push_entry(&mut instance, &entry.key, '=', &entry.value),
                }
                (child, false)
            }
        };
        if i == last {
            let rule = owner.rule.clone()?;
            let mut identity = String::with_capacity(rule.path.len() + instance.len() + 8);
            push_part(&mut identity, &rule.path);
            identity.push_str(&instance);
            return Some(Matched {
                rule,
                instance: identity,
                usage_report,
            });
        }
        parent = Some(child);
        node = &child.children;
    }
    None
}

/// The identity of a descriptor whose `limit` override replaces the rules:
/// its entries, marked apart from every rule's.
pub fn override_instance(entries: &[Entry]) -> String {
    let mut instance = String::from("override;");
    for entry in entries {
        push_entry(&mut instance, &entry.key, '=', &entry.value);
    }
    instance
}

/// A `value` with a `*`: each `*` matches any run of characters (none
/// included), everything else itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wildcard {
    /// The value as written.
    text: String,
    /// The literal runs between the `*`s (first and last may be empty).
    parts: Vec<String>,
}

impl Wildcard {
    /// The pattern `value` writes, if it has a `*`.
    pub fn parse(value: &str) -> Option<Self> {
        value.contains('*').then(|| Self {
            text: value.to_owned(),
            parts: value.split('*').map(str::to_owned).collect(),
        })
    }

    /// The value as written.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// How many characters it matches literally (its specificity).
    pub fn literal_len(&self) -> usize {
        self.parts.iter().map(String::len).sum()
    }

    /// Whether `value` matches: the first part is a prefix, the last a
    /// suffix, and the parts between appear in order, apart. Greedy-free:
    /// each middle part at its first place after the previous one, which is
    /// exact for `*`-only patterns and linear in the value.
    pub fn matches(&self, value: &str) -> bool {
        let (Some(first), Some(last)) = (self.parts.first(), self.parts.last()) else {
            return false;
        };
        let Some(mut rest) = value.strip_prefix(first.as_str()) else {
            return false;
        };
        let middle = &self.parts[1..self.parts.len() - 1];
        for part in middle {
            match rest.find(part.as_str()) {
                Some(at) => rest = &rest[at + part.len()..],
                None => return false,
            }
        }
        rest.len() >= last.len() && rest.ends_with(last.as_str())
    }
}

/// The child of `node` matching `entry`, and the pattern it shares its
/// window by (a `share_threshold` wildcard).
fn find<'a>(node: &'a super::config::Node, entry: &Entry) -> Option<(&'a Child, Option<&'a str>)> {
    if let Some(child) = node
        .exact
        .get(&entry.key)
        .and_then(|values| values.get(&entry.value))
    {
        return Some((child, None));
    }
    if let Some((_, pattern, child)) = node
        .wildcards
        .iter()
        .find(|(key, pattern, _)| *key == entry.key && pattern.matches(&entry.value))
    {
        return Some((child, child.share.then_some(pattern.text())));
    }
    node.key_only.get(&entry.key).map(|child| (child, None))
}

fn push_part(out: &mut String, part: &str) {
    let _ = write!(out, "{}:{part}", part.len());
}

fn push_entry(out: &mut String, key: &str, mark: char, value: &str) {
    push_part(out, key);
    out.push(mark);
    push_part(out, value);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::path::PathBuf;

    use super::*;
    use crate::rls::config::RlsConfig;

    fn entries(pairs: &[(&str, &str)]) -> Vec<Entry> {
        pairs
            .iter()
            .map(|(key, value)| Entry {
                key: (*key).to_owned(),
                value: (*value).to_owned(),
            })
            .collect()
    }

    const RULES: &str = "
domain: d
descriptors:
  - key: path
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: path
    value: /login
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: path
    value: /api/*
    rate_limit: {unit: minute, requests_per_unit: 50}
  - key: path
    value: /api/v2/*
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: file
    value: f*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: tenant
    descriptors:
      - key: user
        rate_limit: {unit: second, requests_per_unit: 10}
";

    fn path_of(pairs: &[(&str, &str)]) -> Option<String> {
        let config = RlsConfig::from_texts(&[(PathBuf::from("r.yaml"), RULES.to_owned())]).unwrap();
        match_descriptor(&config.domains["d"], &entries(pairs)).map(|m| m.rule.path.clone())
    }

    #[test]
    fn the_most_specific_rule_wins() {
        assert_eq!(path_of(&[("path", "/login")]).unwrap(), "path_/login");
        assert_eq!(path_of(&[("path", "/api/v2/x")]).unwrap(), "path_/api/v2/*");
        assert_eq!(path_of(&[("path", "/api/v1")]).unwrap(), "path_/api/*");
        assert_eq!(path_of(&[("path", "/other")]).unwrap(), "path");
        assert_eq!(
            path_of(&[("tenant", "t"), ("user", "u")]).unwrap(),
            "tenant.user"
        );
        // No rate_limit on `tenant` alone; deeper than the tree; no entries.
        assert_eq!(path_of(&[("tenant", "t")]), None);
        assert_eq!(path_of(&[("path", "/login"), ("user", "u")]), None);
        assert_eq!(path_of(&[]), None);
        assert_eq!(path_of(&[("nothing", "x")]), None);
    }

    #[test]
    fn a_usage_report_gets_its_parents_window() {
        let rules = "
domain: d
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 100}
    descriptors:
      - key: stream_done
        usage_report: true
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 10}
";
        let config = RlsConfig::from_texts(&[(PathBuf::from("r.yaml"), rules.to_owned())]).unwrap();
        let domain = &config.domains["d"];
        let of = |pairs: &[(&str, &str)]| match_descriptor(domain, &entries(pairs)).unwrap();
        let check = of(&[("tenant", "t")]);
        let report = of(&[("tenant", "t"), ("stream_done", "1")]);
        assert!(report.usage_report && !check.usage_report);
        assert_eq!(report.rule.path, "tenant");
        assert_eq!(report.instance, check.instance);
        assert_ne!(
            report.instance,
            of(&[("tenant", "u"), ("stream_done", "1")]).instance
        );
        assert!(!of(&[("tenant", "t"), ("user", "u")]).usage_report);
        // Only as the last entry.
        assert!(match_descriptor(
            domain,
            &entries(&[("tenant", "t"), ("stream_done", "1"), ("x", "y")])
        )
        .is_none());
    }

    #[test]
    fn a_star_matches_anywhere_in_a_value() {
        let glob = |p: &str| Wildcard::parse(p).unwrap();
        assert!(glob("foo*bar").matches("foobar"));
        assert!(glob("foo*bar").matches("foo-x-bar"));
        assert!(!glob("foo*bar").matches("foobarx"));
        assert!(!glob("aa*aa").matches("aaa"));
        assert!(glob("svc*ep*rpc").matches("svc1ep2rpc"));
        assert!(!glob("svc*ep*rpc").matches("svc1rpc"));
        assert!(glob("*").matches(""));
        assert!(glob("*x").matches("yyx"));
        assert_eq!(Wildcard::parse("plain"), None);
        assert_eq!(glob("a*bc*").literal_len(), 3);
    }

    #[test]
    fn instances_tell_values_apart_unless_shared() {
        let config = RlsConfig::from_texts(&[(PathBuf::from("r.yaml"), RULES.to_owned())]).unwrap();
        let domain = &config.domains["d"];
        let of =
            |pairs: &[(&str, &str)]| match_descriptor(domain, &entries(pairs)).unwrap().instance;
        assert_ne!(of(&[("path", "/a")]), of(&[("path", "/b")]));
        assert_eq!(of(&[("file", "f1")]), of(&[("file", "f2")]));
        // Length prefixes: `a=b` parts can't be forged by a value.
        assert_ne!(
            of(&[("tenant", "1:x"), ("user", "u")]),
            of(&[("tenant", "1"), ("user", "x")]),
        );
        assert_ne!(
            override_instance(&entries(&[("path", "/a")])),
            of(&[("path", "/a")])
        );
    }
}
