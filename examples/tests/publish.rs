//! The published crates' packages (issue 37): each carries its README,
//! CHANGELOG and both license files, and none of the repository's tests;
//! docs.rs builds them with every feature and `--cfg docsrs`, so each
//! feature-gated item shows its feature. (`.ci/run` also runs
//! `cargo publish --workspace --dry-run`, which builds them as packaged.)
#![allow(clippy::unwrap_used)]

use std::process::Command;

const WORKSPACE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

#[test]
fn each_published_crate_packages_its_readme_changelog_and_licenses() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    for krate in ["tower-window", "axum-window-ext"] {
        let output = Command::new(&cargo)
            .args([
                "package",
                "--list",
                "--allow-dirty",
                "--offline",
                "-p",
                krate,
            ])
            .current_dir(WORKSPACE)
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        let files = String::from_utf8(output.stdout).unwrap();
        let files: Vec<&str> = files.lines().collect();
        for file in [
            "Cargo.toml",
            "README.md",
            "CHANGELOG.md",
            "LICENSE-MIT",
            "LICENSE-APACHE",
            "src/lib.rs",
        ] {
            assert!(files.contains(&file), "{krate} lacks {file}: {files:?}");
        }
        assert!(
            !files.iter().any(|f| f.starts_with("tests/")),
            "{krate}: {files:?}"
        );

        let manifest = std::fs::read_to_string(format!("{WORKSPACE}/{krate}/Cargo.toml")).unwrap();
        assert!(
            manifest.contains("[package.metadata.docs.rs]")
                && manifest.contains("all-features = true")
                && manifest.contains(r#"rustdoc-args = ["--cfg", "docsrs"]"#),
            "{krate}'s docs.rs settings"
        );
        let lib = std::fs::read_to_string(format!("{WORKSPACE}/{krate}/src/lib.rs")).unwrap();
        assert!(
            lib.contains("#![cfg_attr(docsrs, feature(doc_cfg))]"),
            "{krate}'s lib.rs"
        );
    }
}
