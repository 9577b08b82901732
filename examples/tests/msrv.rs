//! The declared minimum supported Rust version holds for what can be
//! checked with one toolchain (issue 37): the published crates declare it,
//! and no crate they build with (normal and build dependencies, every
//! feature on) declares a newer one, so `cargo` would not refuse their
//! build on the MSRV toolchain. Their own code is held to it by clippy's
//! `incompatible_msrv` (in `clippy::all`, denied by `.ci/run`), which
//! reads the same `rust-version`. A build on the MSRV toolchain itself is
//! not run here: only one toolchain is installed.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use serde_json::Value;

/// `1.88` or `1.88.0` as comparable numbers.
fn version(text: &str) -> (u64, u64, u64) {
    let mut parts = text.split('.').map(|p| p.parse::<u64>().unwrap());
    (
        parts.next().unwrap(),
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
    )
}

#[test]
fn no_dependency_of_the_published_crates_needs_a_newer_rust_than_the_msrv() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--all-features",
            "--locked",
            "--offline",
        ])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let metadata: Value = serde_json::from_slice(&output.stdout).unwrap();
    let packages: BTreeMap<&str, &Value> = metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["id"].as_str().unwrap(), p))
        .collect();
    let nodes: BTreeMap<&str, &Value> = metadata["resolve"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["id"].as_str().unwrap(), n))
        .collect();

    let published: Vec<&str> = packages
        .iter()
        .filter(|(_, p)| ["tower-window", "axum-window-ext"].contains(&p["name"].as_str().unwrap()))
        .map(|(id, _)| *id)
        .collect();
    assert_eq!(published.len(), 2);
    let msrv = packages[published[0]]["rust_version"]
        .as_str()
        .expect("tower-window declares rust-version");
    for id in &published {
        assert_eq!(packages[id]["rust_version"].as_str(), Some(msrv));
    }

    // Every crate reachable through normal and build dependencies.
    let mut seen = BTreeSet::new();
    let mut todo = published.clone();
    while let Some(id) = todo.pop() {
        if !seen.insert(id) {
            continue;
        }
        for dep in nodes[id]["deps"].as_array().unwrap() {
            let used = dep["dep_kinds"]
                .as_array()
                .unwrap()
                .iter()
                .any(|k| k["kind"].is_null() || k["kind"] == "build");
            if used {
                todo.push(dep["pkg"].as_str().unwrap());
            }
        }
    }
    assert!(seen.len() > 20, "{seen:?}");
    let newer: Vec<String> = seen
        .iter()
        .filter_map(|id| {
            let package = packages[id];
            let needs = package["rust_version"].as_str()?;
            (version(needs) > version(msrv)).then(|| {
                format!(
                    "{} {} needs {needs}",
                    package["name"].as_str().unwrap(),
                    package["version"].as_str().unwrap()
                )
            })
        })
        .collect();
    assert!(
        newer.is_empty(),
        "rust-version {msrv} is declared, but: {newer:?}"
    );
}
