//! `cargo run -p tower-window-benches --bin count_lines [-- WORKSPACE_DIR] [--files]`
//!
//! The size of the two library crates: lines of code and lines of comments
//! in the Rust files under `tower-window/src` and `axum-window-ext/src`,
//! per crate and in all. `WORKSPACE_DIR` defaults to this workspace; give
//! another checkout (a `git worktree` at an older commit) to count that one.
//! `--files` also prints each file's figures.
//!
//! The rule, line by line:
//! - a blank line is not counted;
//! - a comment line is one whose first non-blank characters are `//` (doc
//!   comments `///` and `//!` included) or that lies inside a `/* */`
//!   comment;
//! - every other line is a code line (a line of code ending in a comment is
//!   code);
//! - a test module is not counted at all: a `mod` item whose attributes
//!   include a `cfg` that requires `test` (`#[cfg(test)]`,
//!   `#[cfg(all(test, feature = "redis"))]`, but not `#[cfg(doctest)]`),
//!   from its first attribute to its closing brace, and the file of such a
//!   module declared out of line (`#[cfg(test)] mod tests;`).
//!
//! Other `#[cfg(test)]` items (a helper function, a `use`) are counted: they
//! are few, and telling where an arbitrary item ends needs a parser.
#![allow(clippy::print_stdout)]

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The library crates' source folders, relative to the workspace.
const ROOTS: [&str; 2] = ["tower-window/src", "axum-window-ext/src"];

/// Code and comment lines of a file, a crate or all of them.
#[derive(Debug, Default, Clone, Copy)]
struct Lines {
    code: usize,
    comments: usize,
}

impl std::ops::AddAssign for Lines {
    fn add_assign(&mut self, other: Self) {
        self.code += other.code;
        self.comments += other.comments;
    }
}

fn main() -> ExitCode {
    let mut workspace = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    let mut per_file = false;
    for argument in std::env::args().skip(1) {
        match argument.as_str() {
            "--files" => per_file = true,
            _ => workspace = PathBuf::from(argument),
        }
    }
    match run(&workspace, per_file) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("count_lines: {}: {error}", workspace.display());
            ExitCode::FAILURE
        }
    }
}

fn run(workspace: &Path, per_file: bool) -> io::Result<()> {
    let mut total = Lines::default();
    println!("{:>7} {:>9}  crate", "code", "comments");
    for root in ROOTS {
        let mut files = Vec::new();
        rust_files(&workspace.join(root), &mut files)?;
        files.sort();
        let sources = files
            .into_iter()
            .map(|path| fs::read_to_string(&path).map(|text| (path, text)))
            .collect::<io::Result<Vec<_>>>()?;
        let test_files: BTreeSet<PathBuf> = sources
            .iter()
            .flat_map(|(path, text)| out_of_line_test_modules(path, text))
            .collect();
        let mut crate_lines = Lines::default();
        for (path, text) in &sources {
            if test_files.contains(path) {
                continue;
            }
            let lines = count(text);
            if per_file {
                println!(
                    "{:>7} {:>9}  {}",
                    lines.code,
                    lines.comments,
                    path.display()
                );
            }
            crate_lines += lines;
        }
        println!(
            "{:>7} {:>9}  {root}",
            crate_lines.code, crate_lines.comments
        );
        total += crate_lines;
    }
    println!("{:>7} {:>9}  in all", total.code, total.comments);
    println!(
        "{:>7}            code + comments",
        total.code + total.comments
    );
    Ok(())
}

fn rust_files(dir: &Path, into: &mut Vec<PathBuf>) -> io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            rust_files(&path, into)?;
        } else if path.extension().is_some_and(|extension| extension == "rs") {
            into.push(path);
        }
    }
    Ok(())
}

/// Counts a file's lines, leaving test modules out.
fn count(text: &str) -> Lines {
    let lines: Vec<&str> = text.lines().collect();
    let mut counted = Lines::default();
    let mut in_block_comment = false;
    let mut index = 0;
    while index < lines.len() {
        if let Some(end) = test_module_end(&lines, index) {
            index = end + 1;
            continue;
        }
        let line = lines[index].trim();
        if in_block_comment || line.starts_with("/*") {
            counted.comments += 1;
            in_block_comment = !line.contains("*/");
        } else if line.starts_with("//") {
            counted.comments += 1;
        } else if !line.is_empty() {
            counted.code += 1;
        }
        index += 1;
    }
    counted
}

/// If the attributes starting at `start` gate a `mod` item on `test`, the
/// index of the item's last line.
fn test_module_end(lines: &[&str], start: usize) -> Option<usize> {
    let mut index = start;
    let mut gated = false;
    while index < lines.len() && lines[index].trim().starts_with("#[") {
        gated |= requires_test(lines[index].trim());
        index += 1;
    }
    if !gated || index >= lines.len() || module_name(lines[index]).is_none() {
        return None;
    }
    if lines[index].trim_end().ends_with(';') {
        return Some(index);
    }
    closing_brace(lines, index)
}

/// Whether an attribute line is a `cfg` that requires `test`.
fn requires_test(attribute: &str) -> bool {
    let Some(predicate) = attribute.strip_prefix("#[cfg(") else {
        return false;
    };
    let words: Vec<&str> = predicate
        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|word| !word.is_empty())
        .collect();
    words
        .iter()
        .enumerate()
        .any(|(i, word)| *word == "test" && (i == 0 || words[i - 1] != "not"))
}

/// The name of the module a line declares, if it declares one.
fn module_name(line: &str) -> Option<&str> {
    let mut rest = line.trim_start();
    if let Some(after) = rest.strip_prefix("pub") {
        rest = after.trim_start();
        if rest.starts_with('(') {
            rest = &rest[rest.find(')')? + 1..];
        }
        rest = rest.trim_start();
    }
    let rest = rest.strip_prefix("mod ")?.trim_start();
    let end = rest
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    (end > 0).then(|| &rest[..end])
}

/// The files of the test modules that `path` declares out of line.
fn out_of_line_test_modules(path: &Path, text: &str) -> Vec<PathBuf> {
    let lines: Vec<&str> = text.lines().collect();
    let dir = match path.file_stem().and_then(|stem| stem.to_str()) {
        Some("mod" | "lib" | "main") | None => path.parent().map(Path::to_path_buf),
        Some(stem) => path.parent().map(|parent| parent.join(stem)),
    };
    let Some(dir) = dir else {
        return Vec::new();
    };
    let mut files = Vec::new();
    for start in 0..lines.len() {
        let first_attribute = start == 0 || !lines[start - 1].trim().starts_with("#[");
        let Some(end) = test_module_end(&lines, start).filter(|_| first_attribute) else {
            continue;
        };
        if let Some(name) = module_name(lines[end]).filter(|_| lines[end].trim_end().ends_with(';'))
        {
            files.push(dir.join(format!("{name}.rs")));
            files.push(dir.join(name).join("mod.rs"));
        }
    }
    files
}

/// The index of the line holding the brace that closes the first `{` from
/// line `start` on, skipping braces in comments, strings and characters.
fn closing_brace(lines: &[&str], start: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut opened = false;
    let mut block_comments = 0usize;
    let mut string: Option<usize> = None; // the raw string's `#` count, or usize::MAX for "…"
    for (index, line) in lines.iter().enumerate().skip(start) {
        let chars: Vec<char> = line.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            let next = chars.get(i + 1).copied();
            if let Some(hashes) = string {
                if hashes == usize::MAX {
                    if c == '\\' {
                        i += 1;
                    } else if c == '"' {
                        string = None;
                    }
                } else if c == '"'
                    && chars[i + 1..]
                        .iter()
                        .take(hashes)
                        .filter(|&&h| h == '#')
                        .count()
                        == hashes
                {
                    string = None;
                    i += hashes;
                }
            } else if block_comments > 0 {
                if c == '*' && next == Some('/') {
                    block_comments -= 1;
                    i += 1;
                } else if c == '/' && next == Some('*') {
                    block_comments += 1;
                    i += 1;
                }
            } else if c == '/' && next == Some('/') {
                break;
            } else if c == '/' && next == Some('*') {
                block_comments += 1;
                i += 1;
            } else if c == '"' {
                string = Some(usize::MAX);
            } else if c == 'r'
                && (next == Some('"') || next == Some('#'))
                && (i == 0 || !chars[i - 1].is_alphanumeric())
            {
                let hashes = chars[i + 1..].iter().take_while(|&&h| h == '#').count();
                if chars.get(i + 1 + hashes) == Some(&'"') {
                    string = Some(hashes);
                    i += hashes + 1;
                }
            } else if c == '\'' {
                // A character literal ('x', '\n', '\u{7f}'), not a lifetime.
                if next == Some('\\') {
                    i += chars[i + 2..]
                        .iter()
                        .position(|&q| q == '\'')
                        .map_or(0, |p| p + 2);
                } else if chars.get(i + 2) == Some(&'\'') {
                    i += 2;
                }
            } else if c == '{' {
                depth += 1;
                opened = true;
            } else if c == '}' {
                depth = depth.saturating_sub(1);
                if opened && depth == 0 {
                    return Some(index);
                }
            }
            i += 1;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOURCE: &str = r####"//! A module.

/// A function.
fn f() -> char {
    // why
    let _ = "}"; // a brace in a string is code
    '{'
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    fn braces() -> (&'static str, char, &'static str) {
        ("{", '}', r#"}"#)
    }
    /* } */
}

#[cfg(not(test))]
mod counted {
    /* a block
       comment */
}

#[cfg(all(test, feature = "redis"))]
mod redis_tests {}

#[cfg(doctest)]
mod doc {}
"####;

    #[test]
    fn test_modules_blank_lines_and_comments() {
        let lines = count(SOURCE);
        // Code: `f`'s four lines, the `not(test)` module's attribute,
        // `mod` and closing brace, and the doctest module's two lines.
        assert_eq!(lines.code, 4 + 3 + 2, "{lines:?}");
        // Comments: //!, ///, // why, the two lines of the block comment.
        assert_eq!(lines.comments, 5, "{lines:?}");
    }

    #[test]
    fn only_cfgs_that_require_test() {
        assert!(requires_test("#[cfg(test)]"));
        assert!(requires_test("#[cfg(all(test, feature = \"http\"))]"));
        assert!(!requires_test("#[cfg(not(test))]"));
        assert!(!requires_test("#[cfg(doctest)]"));
        assert!(!requires_test("#[allow(test)]"));
    }

    #[test]
    fn out_of_line_test_modules_resolve_like_rustc() {
        let text = "#[cfg(test)]\nmod tests;\n";
        let in_mod = out_of_line_test_modules(Path::new("src/ws/rooms/mod.rs"), text);
        assert!(in_mod.contains(&PathBuf::from("src/ws/rooms/tests.rs")));
        let in_file = out_of_line_test_modules(Path::new("src/ws/guard.rs"), text);
        assert!(in_file.contains(&PathBuf::from("src/ws/guard/tests.rs")));
        assert!(out_of_line_test_modules(Path::new("src/lib.rs"), "mod tests;\n").is_empty());
    }
}
