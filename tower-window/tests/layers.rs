//! The module layering of `tower-window/src` (DESIGN.md, "Target layout"),
//! checked on the source so that CI fails when it erodes:
//!
//! * the shared parts (`quota`, `algorithm`, `decision`, `cost`, `key`,
//!   `clock`, `metrics`, `store/` with its guard, operation type and Redis
//!   client) never name a capability or the layer;
//! * a capability folder (`limit`, `lease`, `tenant`, `conn`, `dedup`,
//!   `events`) names another capability only by the items at that
//!   capability's root (`crate::conn::ConnectionLimiter`, never
//!   `crate::conn::memory::…`); `lease/` is `limit/`'s, so those two may
//!   share internals;
//! * nothing but `lib.rs` names the layer, which sits above everything.
//!
//! The composition roots wire capabilities together and are exempt:
//! `lib.rs`, the store handle (`store/handle.rs`) and the two backend types
//! (`store/memory/mod.rs`, `store/redis/mod.rs`), which hold each
//! capability's state. Comments, string literals and `#[cfg(test)]` modules
//! are not imports and are ignored.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

const CAPABILITIES: &[&str] = &["limit", "lease", "tenant", "conn", "dedup", "events"];
const LAYER: &str = "layer";
const ROOTS: &[&str] = &[
    "lib.rs",
    "store/handle.rs",
    "store/memory/mod.rs",
    "store/redis/mod.rs",
];

/// Where a file or a path belongs.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Shared,
    Capability(&'static str),
    Layer,
}

fn part_of_module(module: &str) -> Part {
    if module == LAYER {
        return Part::Layer;
    }
    match CAPABILITIES.iter().find(|name| **name == module) {
        Some(name) => Part::Capability(name),
        None => Part::Shared,
    }
}

/// The part a source file (relative to `src/`) belongs to.
fn part_of_file(relative: &str) -> Part {
    let top = relative.split('/').next().unwrap_or(relative);
    part_of_module(top.trim_end_matches(".rs"))
}

fn same_family(a: &str, b: &str) -> bool {
    a == b || matches!((a, b), ("limit", "lease") | ("lease", "limit"))
}

/// The source with comments, string and char literals blanked out.
fn code_only(source: &str) -> String {
    let bytes = source.as_bytes();
    let mut out = String::with_capacity(source.len());
    let mut i = 0;
    while i < bytes.len() {
        let rest = &source[i..];
        if rest.starts_with("//") {
            let end = rest.find('\n').map_or(bytes.len(), |n| i + n);
            i = end;
        } else if rest.starts_with("/*") {
            let end = rest.find("*/").map_or(bytes.len(), |n| i + n + 2);
            i = end;
        } else if let Some(raw) = rest.strip_prefix("r#\"") {
            let end = raw.find("\"#").map_or(bytes.len(), |n| i + 3 + n + 2);
            out.push_str("\"\"");
            i = end;
        } else if bytes[i] == b'"' {
            let mut j = i + 1;
            while j < bytes.len() && bytes[j] != b'"' {
                j += if bytes[j] == b'\\' { 2 } else { 1 };
            }
            out.push_str("\"\"");
            i = j + 1;
        } else {
            let c = rest.chars().next().unwrap_or(' ');
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// The code with every `#[cfg(test)]`-gated item (a test module, a test
/// helper) removed.
fn without_test_items(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let item = &rest[at..];
        // The item ends at the `;` or the brace closing its first `{`,
        // whichever comes first.
        let mut depth = 0usize;
        let mut end = item.len();
        for (n, c) in item.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        end = n + 1;
                        break;
                    }
                }
                ';' if depth == 0 => {
                    end = n + 1;
                    break;
                }
                _ => {}
            }
        }
        rest = &item[end..];
    }
    out.push_str(rest);
    out
}

/// Every path the code names from `crate::`, with `use` groups expanded:
/// `crate::{a::B, c::{D, E}}` gives `a::B`, `c::D`, `c::E`.
fn crate_paths(code: &str) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let preceded_by_ident = rest[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_');
        rest = &rest[at + "crate::".len()..];
        if preceded_by_ident {
            continue;
        }
        let mut tree = rest;
        expand(&mut tree, Vec::new(), &mut paths);
    }
    paths
}

/// Parses one path tree at the start of `input`, pushing its paths.
fn expand(input: &mut &str, prefix: Vec<String>, paths: &mut Vec<Vec<String>>) {
    let mut path = prefix;
    loop {
        *input = input.trim_start();
        if let Some(group) = input.strip_prefix('{') {
            *input = group;
            loop {
                *input = input.trim_start();
                if let Some(after) = input.strip_prefix('}') {
                    *input = after;
                    return;
                }
                if let Some(after) = input.strip_prefix(',') {
                    *input = after;
                    continue;
                }
                let before = input.len();
                expand(input, path.clone(), paths);
                if input.len() == before {
                    return; // not a path: stop rather than loop
                }
            }
        }
        let ident_len = input
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(input.len());
        if ident_len == 0 {
            if !path.is_empty() {
                paths.push(path);
            }
            return;
        }
        path.push(input[..ident_len].to_owned());
        *input = &input[ident_len..];
        match input.strip_prefix("::") {
            Some(after) => *input = after,
            None => {
                paths.push(path);
                return;
            }
        }
    }
}

/// What `lib.rs` re-exports at the crate root: a name to the module it
/// comes from (`Limiter` → `limit`, `fallback` → `limit`).
fn root_exports(lib: &str) -> HashMap<String, String> {
    let mut exports = HashMap::new();
    for statement in code_only(lib).split(';') {
        let statement = statement.trim();
        let Some(tree) = statement.strip_prefix("pub use ") else {
            continue;
        };
        let mut input = tree;
        let mut paths = Vec::new();
        expand(&mut input, Vec::new(), &mut paths);
        for path in paths {
            if let (Some(module), Some(name)) = (path.first(), path.last()) {
                exports.insert(name.clone(), module.clone());
            }
        }
    }
    exports
}

/// One layering violation: the file, the path it names, and why.
#[derive(Debug)]
struct Violation {
    file: String,
    path: String,
    rule: &'static str,
}

/// Checks one file's code against the layering rules.
fn check_file(
    relative: &str,
    code: &str,
    exports: &HashMap<String, String>,
    out: &mut Vec<Violation>,
) {
    if ROOTS.contains(&relative) {
        return;
    }
    let from = part_of_file(relative);
    for path in crate_paths(&without_test_items(&code_only(code))) {
        let Some(first) = path.first() else { continue };
        // A root re-export names its module's item: resolve it.
        let (module, depth) = match exports.get(first) {
            Some(module) if first.chars().next().is_some_and(char::is_uppercase) => {
                (module.clone(), 1)
            }
            Some(module) => (module.clone(), path.len() + 1),
            None => (first.clone(), path.len()),
        };
        let to = part_of_module(&module);
        let rule = match (&from, &to) {
            (_, Part::Shared) => None,
            (Part::Layer, _) => None,
            (_, Part::Layer) => Some("only lib.rs names the layer, which sits above everything"),
            (Part::Shared, Part::Capability(_)) => {
                Some("a shared part never names a capability (nothing imports from above)")
            }
            (Part::Capability(a), Part::Capability(b)) if !same_family(a, b) && depth > 2 => {
                Some("a capability names another capability only by its root items")
            }
            (Part::Capability(_), Part::Capability(_)) => None,
        };
        if let Some(rule) = rule {
            out.push(Violation {
                file: relative.to_owned(),
                path: format!("crate::{}", path.join("::")),
                rule,
            });
        }
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn tower_window_src_keeps_its_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = fs::read_to_string(src.join("lib.rs")).expect("lib.rs");
    let exports = root_exports(&lib);
    assert_eq!(exports.get("Limiter").map(String::as_str), Some("limit"));
    assert_eq!(
        exports.get("ConnectionLimiter").map(String::as_str),
        Some("conn")
    );

    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(files.len() > 40, "found only {} source files", files.len());
    let mut violations = Vec::new();
    let mut checked = 0;
    for file in &files {
        let relative = file
            .strip_prefix(&src)
            .expect("under src")
            .to_string_lossy()
            .replace('\\', "/");
        let code = fs::read_to_string(file).expect("source file");
        check_file(&relative, &code, &exports, &mut violations);
        checked += 1;
    }
    assert_eq!(checked, files.len());
    assert!(
        violations.is_empty(),
        "layering violations (see tests/layers.rs for the rules):\n{}",
        violations
            .iter()
            .map(|v| format!("  {}: {} ({})", v.file, v.path, v.rule))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

fn violations_of(relative: &str, code: &str) -> Vec<String> {
    let mut exports = HashMap::new();
    exports.insert("Limiter".to_owned(), "limit".to_owned());
    exports.insert("ConnectionLimiter".to_owned(), "conn".to_owned());
    exports.insert("Quota".to_owned(), "quota".to_owned());
    exports.insert("fallback".to_owned(), "limit".to_owned());
    let mut out = Vec::new();
    check_file(relative, code, &exports, &mut out);
    out.into_iter().map(|v| v.path).collect()
}

#[test]
fn the_check_catches_each_kind_of_violation() {
    // A shared part naming a capability, directly or by a root re-export.
    assert_eq!(
        violations_of("metrics/record.rs", "use crate::conn::HeartbeatReport;"),
        ["crate::conn::HeartbeatReport"]
    );
    assert_eq!(
        violations_of("store/redis/call.rs", "use crate::{Quota, Limiter};"),
        ["crate::Limiter"]
    );
    assert_eq!(
        violations_of(
            "quota/mod.rs",
            "let x = crate::fallback::FallbackPolicy::FailOpen;"
        ),
        ["crate::fallback::FallbackPolicy::FailOpen"]
    );
    // A capability reaching into another's internals, in a use group.
    assert_eq!(
        violations_of(
            "dedup/redis.rs",
            "use crate::{conn::{memory::Seats, ConnectionLimiter}};"
        ),
        ["crate::conn::memory::Seats"]
    );
    // Anything below naming the layer.
    assert_eq!(
        violations_of("limit/mod.rs", "crate::layer::SlidingWindowLayer::new(l)"),
        ["crate::layer::SlidingWindowLayer::new"]
    );
}

#[test]
fn the_check_allows_what_the_layout_allows() {
    let allowed = [
        ("dedup/redis.rs", "use crate::conn::ConnectionLimiter;"),
        ("dedup/redis.rs", "use crate::{ConnectionLimiter, Quota};"),
        (
            "lease/redis.rs",
            "use crate::limit::redis::{lay_out, Parts};",
        ),
        ("limit/mod.rs", "use crate::lease::memory::Records;"),
        ("layer/service.rs", "use crate::limit::check::Check;"),
        ("store/handle.rs", "use crate::conn::memory::ConnSeats;"),
        ("metrics/record.rs", "// see crate::conn::HeartbeatReport"),
        ("metrics/record.rs", "let s = \"crate::conn::x\";"),
        (
            "metrics/record.rs",
            "#[cfg(test)]\nmod tests { use crate::conn::heartbeat::X; }\nfn f() {}",
        ),
        (
            "conn/limiter.rs",
            "use crate::store::redis::keys::redis_key;",
        ),
    ];
    for (file, code) in allowed {
        assert_eq!(
            violations_of(file, code),
            Vec::<String>::new(),
            "{file}: {code}"
        );
    }
}
