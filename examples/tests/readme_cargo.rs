//! The top-level README's "Use it" is a complete program (issue 26: it had
//! no `Cargo.toml` snippet): a crate whose `[dependencies]` are exactly the
//! README's `toml` block and whose `src/main.rs` is the README's Rust block
//! type-checks (`cargo check --offline`), its paths to a clone pointing at
//! this workspace's `tower-window` and `axum-window-ext`, with this
//! workspace's `Cargo.lock` (so nothing is downloaded).
//!
//! Built alone, outside the workspace, so no feature of another workspace
//! member can make up for one the snippet lacks. The crate's target
//! directory is kept in `CARGO_TARGET_TMPDIR`: the first run compiles its
//! dependencies (~30 s on a quiet 2-core machine), later runs take seconds.
#![allow(clippy::unwrap_used)]

mod support;

use std::process::Command;
use std::time::Duration;

/// The body of the first fenced block of kind `kind` after `## Use it`.
fn use_it_block(readme: &str, kind: &str) -> String {
    let section = &readme[readme.find("## Use it").expect("a Use it section")..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |i| i + 3)];
    let fence = format!("```{kind}\n");
    let start = section
        .find(&fence)
        .unwrap_or_else(|| panic!("a ```{kind} block in Use it"))
        + fence.len();
    let end = start + section[start..].find("```").expect("the block ends");
    section[start..end].to_owned()
}

#[test]
fn the_use_it_snippet_builds_with_exactly_its_dependencies() {
    let workspace = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let readme = std::fs::read_to_string(format!("{workspace}/README.md")).unwrap();
    let dependencies = use_it_block(&readme, "toml");
    assert!(
        dependencies.trim_start().starts_with("[dependencies]"),
        "{dependencies}"
    );
    // Unreleased: the crates come from a clone beside the user's project
    // (issue 37), here this checkout.
    for krate in ["tower-window", "axum-window-ext"] {
        let path = format!("{krate} = {{ path = \"../tower-window/{krate}\" }}");
        assert!(
            dependencies.contains(&path),
            "{path} in the README's dependencies:\n{dependencies}"
        );
    }
    let dependencies = dependencies.replace("\"../tower-window/", &format!("\"{workspace}/"));
    let program = use_it_block(&readme, "rust,no_run");

    let dir = tempfile::tempdir().unwrap();
    let manifest = format!(
        "[package]\nname = \"readme-use-it\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\
         publish = false\n\n{dependencies}\n\
         [workspace]\n"
    );
    std::fs::write(dir.path().join("Cargo.toml"), manifest).unwrap();
    std::fs::create_dir(dir.path().join("src")).unwrap();
    std::fs::write(dir.path().join("src/main.rs"), program).unwrap();
    std::fs::copy(
        format!("{workspace}/Cargo.lock"),
        dir.path().join("Cargo.lock"),
    )
    .unwrap();

    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let target = concat!(env!("CARGO_TARGET_TMPDIR"), "/readme-use-it");
    let output = support::run_bounded(
        Command::new(cargo)
            .args(["check", "--offline", "--quiet"])
            .current_dir(dir.path())
            .env("CARGO_TARGET_DIR", target)
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS"),
        Duration::from_secs(900),
    );
    assert!(
        output.status.success(),
        "the README's Use it does not build with its dependencies ({}):\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
}
