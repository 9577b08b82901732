//! The gateway binary refuses bad flags with one readable message each —
//! the flag, the value, what it expects and how to fix it — and a non-zero
//! exit; never Rust's `Debug` form. Durations take every unit of the quota
//! DSL, within each flag's bounds.
#![allow(clippy::unwrap_used)]

mod support;

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Duration;

use clap::Parser;
use support::run_bounded;
use tower_window_examples::gateway::Args;

/// Runs the gateway with `args` (and `env`) until it exits, at most 20 s.
fn gateway(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_gateway"));
    command.args(args).env("RUST_LOG", "warn");
    for (name, value) in env {
        command.env(name, value);
    }
    run_bounded(&mut command, Duration::from_secs(20))
}

/// Bits of `Debug` output that a message must never contain.
const DEBUG_MARKS: [&str; 8] = [
    "Error: ",
    "\\n",
    "InvalidUrl(",
    "StoreError",
    "Tenants(",
    "History(",
    "Lease(",
    "Some(",
];

/// Checks that `args` exit with `code` and print one `error:` message with
/// every needle, in readable lines.
fn refused(args: &[&str], env: &[(&str, &str)], code: i32, needles: &[&str]) -> String {
    let output = gateway(args, env);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(code), "{args:?}:\n{stderr}");
    let errors = stderr.lines().filter(|l| l.starts_with("error:")).count();
    assert_eq!(errors, 1, "{args:?}: one message:\n{stderr}");
    for needle in needles {
        assert!(stderr.contains(needle), "{args:?}: {needle:?} in\n{stderr}");
    }
    for mark in DEBUG_MARKS {
        assert!(
            !stderr.contains(mark),
            "{args:?}: Debug form {mark:?} in\n{stderr}"
        );
    }
    stderr
}

fn repo_file(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// The bad values of the issue, each refused with a message that says
/// what to write instead.
#[test]
fn the_first_hour_errors_say_what_to_do() {
    refused(
        &["--redis-url", "localhost:6500"],
        &[],
        2,
        &[
            "--redis-url localhost:6500",
            "redis://host:port[/db]",
            "fix: write --redis-url redis://localhost:6500",
        ],
    );
    refused(
        &["--history", "0s"],
        &[],
        2,
        &["--history", "'0s'", "from 1ms to 30d"],
    );
    refused(
        &["--lease", "100", "--limit", "1/1h gcra(burst=1)"],
        &[],
        2,
        &[
            "--lease 100",
            "quota \"default\" (1/1h gcra(burst=1))",
            "no lease can ever be granted",
            "fix: give the quota a burst of at least 2",
        ],
    );
    let readme = repo_file("README.md");
    let stderr = refused(
        &["--tenants", readme.to_str().unwrap()],
        &[],
        2,
        &[
            "--tenants",
            "README.md: not a valid tenants file",
            "TOML parse error at line 3, column 9",
            "fix: fix the file",
        ],
    );
    // The TOML error's own lines (the line and its caret) are lines.
    assert!(
        stderr.lines().any(|l| l.trim_start().starts_with("3 | ")),
        "{stderr}"
    );
    assert!(stderr.lines().count() >= 5, "{stderr}");
}

/// Every other flag that takes a value, with a bad one.
#[test]
fn every_flag_with_a_value_names_it_and_what_it_expects() {
    let dir = tempfile::tempdir().unwrap();
    let invalid = dir.path().join("invalid.toml");
    std::fs::write(&invalid, "[tenants.acme]\nquotas = { burst = \"0/1m\" }\n").unwrap();
    let missing = dir.path().join("missing.toml");
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        // Durations.
        (
            vec!["--dedup-window", "8d"],
            vec!["--dedup-window", "'8d'", "from 1ms to 7d"],
        ),
        (
            vec!["--dedup-window", "7x"],
            vec!["unknown unit \"x\"", "ms, s, m, h, d"],
        ),
        (
            vec!["--connection-seat-ttl", "10ms"],
            vec!["--connection-seat-ttl", "from 30ms to 1h"],
        ),
        (vec!["--connection-seat-ttl", "15"], vec!["not a duration"]),
        // The flag's name before seats were called seats is an alias.
        (
            vec!["--connection-lease-ttl", "10ms"],
            vec!["--connection-seat-ttl", "from 30ms to 1h"],
        ),
        (
            vec!["--lease-ttl", "0"],
            vec!["--lease-ttl", "from 1ms to 1h"],
        ),
        (vec!["--lease-ttl", "-1s"], vec!["'-1s'", "not a duration"]),
        (vec!["--lease-ttl", "2h"], vec!["from 1ms to 1h"]),
        (vec!["--history", "31d"], vec!["from 1ms to 30d"]),
        (vec!["--history", "1.5s"], vec!["not a duration"]),
        // Numbers.
        (
            vec!["--expected-nodes", "0"],
            vec!["--expected-nodes", "from 1 to 4294967295"],
        ),
        (
            vec!["--redis-timeout-ms", "0"],
            vec!["--redis-timeout-ms", "at least 1"],
        ),
        (
            vec!["--redis-timeout-ms", "-5"],
            vec!["'-5'", "not a whole number"],
        ),
        (
            vec!["--lease", "-1"],
            vec!["--lease", "from 0 to 4294967295"],
        ),
        (
            vec!["--history-max", "0"],
            vec!["--history-max", "from 1 to 10000000"],
        ),
        (
            vec!["--max-connections-per-user", "x"],
            vec!["--max-connections-per-user", "not a whole number"],
        ),
        (
            vec!["--close-after-drops", "1.5"],
            vec!["--close-after-drops", "not a whole number"],
        ),
        (
            vec!["--max-message-bytes", "0"],
            vec!["--max-message-bytes", "from 1 to 4294967295"],
        ),
        // Quotas, names, choices.
        (
            vec!["--limit", "0/1m"],
            vec!["--limit", "at least 1", "e.g. 100/1m"],
        ),
        (
            vec!["--limit", "a=5/1s", "--limit", "a=9/1m"],
            vec![
                "--limit",
                "\"a\"",
                "fix: give each --limit a name of its own",
            ],
        ),
        (
            vec!["--message-limit", "5/0s"],
            vec!["--message-limit", "longer than zero"],
        ),
        (
            vec!["--byte-limit", "lots"],
            vec!["--byte-limit", "<limit>/<window>"],
        ),
        (
            vec!["--algorithm", "leaky-bucket"],
            vec!["--algorithm", "possible values"],
        ),
        (
            vec!["--fallback", "sometimes"],
            vec!["--fallback", "fail-open"],
        ),
        (
            vec!["--on-message-limit", "explode"],
            vec!["--on-message-limit", "drop"],
        ),
        (
            vec!["--tenant-header", "x tenant"],
            vec!["--tenant-header", "not an HTTP header name"],
        ),
        (
            vec!["--user-header", ""],
            vec!["--user-header", "not an HTTP header name"],
        ),
        (
            vec!["--listen", "localhost:3000"],
            vec!["--listen", "IP:PORT", "127.0.0.1:3000"],
        ),
        // URLs.
        (
            vec!["--redis-url", ""],
            vec!["--redis-url ''", "fix: give a URL"],
        ),
        (
            vec!["--redis-url", "http://127.0.0.1:6379"],
            vec!["fix: write --redis-url redis://127.0.0.1:6379"],
        ),
        (
            vec!["--redis-url", "redis://127.0.0.1:6379/x"],
            vec!["Invalid database number", "redis://host:port[/db]"],
        ),
        (
            vec!["--redis-cluster", "redis://127.0.0.1:7000,nope"],
            vec![
                "--redis-cluster nope",
                "fix: write --redis-cluster redis://nope",
            ],
        ),
        (vec!["--inbound-stream", "tw:in"], vec!["--redis-url"]),
        (
            vec!["--redis-url", "redis://127.0.0.1:1", "--inbound-stream", ""],
            vec!["--inbound-stream ''", "fix:"],
        ),
        // Files and the token.
        (
            vec!["--tenants", missing.to_str().unwrap()],
            vec![
                "--tenants",
                "missing.toml: cannot read it",
                "fix: check the path",
            ],
        ),
        (
            vec!["--tenants", invalid.to_str().unwrap()],
            vec![
                "invalid.toml: not a valid tenants file",
                "tenant \"acme\": quota \"burst\"",
            ],
        ),
        (
            vec!["--admin-token", ""],
            vec!["--admin-token ''", "is empty", "fix: give a token"],
        ),
        (
            vec![
                "--lease",
                "4",
                "--limit",
                "5/1s",
                "--algorithm",
                "gcra",
                "--lease-ttl",
                "900ms",
            ],
            vec![
                "--lease-ttl 900ms",
                "fix: lower --lease-ttl to at most 800ms",
            ],
        ),
        (
            vec!["--lease", "4", "--limit", "100/1s gcra(burst=2)"],
            vec![
                "--lease 4",
                "a lease of 100ms (the default",
                "fix: lower --lease-ttl to at most 10ms",
            ],
        ),
    ];
    for (args, needles) in &cases {
        refused(args, &[], 2, needles);
    }
    // From the environment: the message names the flag and the variable's value.
    refused(
        &[],
        &[("TW_DEDUP_WINDOW", "8d")],
        2,
        &["--dedup-window", "'8d'", "7d"],
    );
    refused(&[], &[("TW_ADMIN_TOKEN", "")], 2, &["--admin-token ''"]);
    // The variable's name before seats were called seats still counts.
    refused(
        &[],
        &[("TW_CONNECTION_LEASE_TTL", "2h")],
        2,
        &["--connection-seat-ttl", "'2h'", "from 30ms to 1h"],
    );
}

#[test]
fn an_address_in_use_is_refused_with_the_flag() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    refused(
        &["--listen", &address],
        &[],
        1,
        &[
            &format!("--listen {address}: cannot listen there"),
            "fix: another process listens there",
        ],
    );
}

fn parse(args: &[&str]) -> Result<Args, clap::Error> {
    let mut argv = vec!["gateway"];
    argv.extend_from_slice(args);
    Args::try_parse_from(argv)
}

/// Durations are read by the quota DSL's parser: every unit it takes
/// (`ms`, `s`, `m`, `h`, `d`) on every duration flag, within the bounds
/// each flag documents.
#[test]
fn every_duration_flag_takes_every_dsl_unit() {
    let args = parse(&[
        "--dedup-window",
        "7d",
        "--history",
        "30d",
        "--connection-seat-ttl",
        "1h",
        "--lease-ttl",
        "1h",
    ])
    .unwrap();
    assert_eq!(args.ws.dedup_window, Duration::from_secs(7 * 86_400));
    assert_eq!(args.history, Duration::from_secs(30 * 86_400));
    assert_eq!(args.ws.connection_seat_ttl, Duration::from_secs(3600));
    assert_eq!(args.lease_ttl, Some(Duration::from_secs(3600)));
    for (flag, text, want) in [
        ("--dedup-window", "250ms", Duration::from_millis(250)),
        ("--dedup-window", "90s", Duration::from_secs(90)),
        ("--dedup-window", "2h", Duration::from_secs(7200)),
        ("--dedup-window", "1d", Duration::from_secs(86_400)),
        ("--history", "1d", Duration::from_secs(86_400)),
        ("--connection-seat-ttl", "30ms", Duration::from_millis(30)),
        ("--connection-lease-ttl", "45s", Duration::from_secs(45)),
        ("--lease-ttl", "1m", Duration::from_secs(60)),
        // `--lease-ttl` keeps its documented bare number of milliseconds.
        ("--lease-ttl", "40", Duration::from_millis(40)),
    ] {
        let args = parse(&[flag, text]).unwrap();
        let got = match flag {
            "--dedup-window" => args.ws.dedup_window,
            "--history" => args.history,
            "--connection-seat-ttl" | "--connection-lease-ttl" => args.ws.connection_seat_ttl,
            _ => args.lease_ttl.unwrap(),
        };
        assert_eq!(got, want, "{flag} {text}");
    }
    // A week of dedup and a month of history make a configuration.
    let config = parse(&["--dedup-window", "7d", "--history", "30d"])
        .unwrap()
        .into_config()
        .unwrap();
    assert_eq!(config.ws.dedup_window, Duration::from_secs(7 * 86_400));
    for (flag, bad) in [
        ("--dedup-window", "8d"),
        ("--dedup-window", "0ms"),
        ("--history", "31d"),
        ("--connection-seat-ttl", "29ms"),
        ("--connection-seat-ttl", "2h"),
        ("--connection-lease-ttl", "2h"),
        ("--lease-ttl", "61m"),
    ] {
        assert!(parse(&[flag, bad]).is_err(), "{flag} {bad}");
    }
}
