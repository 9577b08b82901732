//! Which rule a request descriptor gets, as envoyproxy/ratelimit matches:
//! entry by entry down the domain's tree, each entry by the most specific
//! rule of its level — `key` + `value`, else `key` + the longest matching
//! `value*` prefix, else `key` alone —; the descriptor gets the rule of its
//! last entry, if that rule has a `rate_limit`. A descriptor with more
//! entries than the tree is deep, or whose entry matches nothing, gets no
//! rule (OK, nothing counted), and so does one without entries.

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
}

/// The rule of `entries` in `domain` (see the [module docs](self)).
pub fn match_descriptor(domain: &Domain, entries: &[Entry]) -> Option<Matched> {
    let mut node = &domain.root;
    let mut instance = String::new();
    let last = entries.len().checked_sub(1)?;
    for (i, entry) in entries.iter().enumerate() {
        let (child, shared) = find(node, entry)?;
        match shared {
            Some(prefix) => push_entry(&mut instance, &entry.key, '*', prefix),
            None => push_entry(&mut instance, &entry.key, '=', &entry.value),
        }
        if i == last {
            let rule = child.rule.clone()?;
            let mut identity = String::with_capacity(rule.path.len() + instance.len() + 8);
            push_part(&mut identity, &rule.path);
            identity.push_str(&instance);
            return Some(Matched {
                rule,
                instance: identity,
            });
        }
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

/// The child of `node` matching `entry`, and the prefix it shares its
/// window by (a `share_threshold` wildcard).
fn find<'a>(node: &'a super::config::Node, entry: &Entry) -> Option<(&'a Child, Option<&'a str>)> {
    if let Some(child) = node
        .exact
        .get(&entry.key)
        .and_then(|values| values.get(&entry.value))
    {
        return Some((child, None));
    }
    if let Some((_, prefix, child)) = node
        .wildcards
        .iter()
        .find(|(key, prefix, _)| *key == entry.key && entry.value.starts_with(prefix.as_str()))
    {
        return Some((child, child.share.then_some(prefix.as_str())));
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
