//! The built `rls` started as a team running envoyproxy/ratelimit starts
//! it: its settings by their own names (the runtime directory layout, the
//! gRPC port, shadow mode, headers), its own example files; the messages a
//! wrong `--config` gets; the `detailed_metric` series.
#![allow(clippy::unwrap_used)]

mod rls_support;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use rls_support::{codes, config_dir, costing, descriptor, overall, request, should, RlsProcess};
use tower_window_tests::redis_server::reserve_port;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/rls/envoyproxy-ratelimit");

/// envoyproxy/ratelimit's integration layout: `RUNTIME_ROOT`,
/// `RUNTIME_SUBDIRECTORY`, the `config` directory under them, `GRPC_PORT`,
/// and its settings for shadow mode and response headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_runtime_layout_and_settings_serve() {
    let root = tempfile::tempdir().unwrap();
    let config = root.path().join("ratelimit").join("config");
    std::fs::create_dir_all(&config).unwrap();
    for file in ["basic.yaml", "another.yaml"] {
        std::fs::copy(format!("{FIXTURES}/integration/{file}"), config.join(file)).unwrap();
    }
    let port = reserve_port().to_string();
    let rls = RlsProcess::start_with_env(
        &[],
        &[
            ("RUNTIME_ROOT", root.path().to_str().unwrap()),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("GRPC_HOST", "127.0.0.1"),
            ("GRPC_PORT", &port),
            ("SHADOW_MODE", "true"),
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
        ],
    );
    assert_eq!(rls.port().to_string(), port);
    let mut client = rls.client().await;
    let r = should(
        &mut client,
        request("basic", vec![descriptor(&[("key1", "foo")])]),
    )
    .await;
    assert_eq!(r.statuses[0].limit_remaining, 49);
    assert_eq!(r.response_headers_to_add[0].key, "RateLimit-Limit");
    assert_eq!(r.response_headers_to_add[0].value, "50");
    // Over the limit, yet OK overall: shadow mode.
    let r = should(
        &mut client,
        request("another", vec![costing(&[("key2", "x")], 21)]),
    )
    .await;
    assert_eq!((overall(&r), codes(&r)), (Code::Ok, vec![Code::OverLimit]));
}

/// envoyproxy/ratelimit's `examples/ratelimit/config` directory, as it is,
/// serves (one of its files uses `quota_mode`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_example_configs_serve_unchanged() {
    let examples = format!("{FIXTURES}/examples");
    let rls = RlsProcess::start(&["--config", &examples]);
    let mut client = rls.client().await;
    let r = should(
        &mut client,
        request(
            "rl",
            vec![descriptor(&[
                ("source_cluster", "proxy"),
                ("destination_cluster", "mock"),
            ])],
        ),
    )
    .await;
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        1
    );
    let r = should(
        &mut client,
        request("quota", vec![descriptor(&[("service", "service_2")])]),
    )
    .await;
    assert_eq!(overall(&r), Code::Ok);
}

fn refused(config: &str) -> String {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_rls"))
        .args(["--listen", "127.0.0.1:0", "--config", config])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A file that is not a rules file, or no file at all: a message that
/// says what is wrong and what to do, in the user's words.
#[test]
fn a_wrong_config_gets_a_readable_message() {
    let readme = concat!(env!("CARGO_MANIFEST_DIR"), "/README.md");
    let stderr = refused(readme);
    assert!(
        stderr.contains("README.md: error loading config file"),
        "{stderr}"
    );
    for leak in ["FileYaml", "struct", "fix the file"] {
        assert!(!stderr.contains(leak), "{leak} in {stderr}");
    }
    let stderr = refused("/nonexistent.yaml");
    assert!(
        stderr.contains("/nonexistent.yaml: cannot read it: No such file or directory"),
        "{stderr}"
    );
    assert!(
        stderr.contains("fix: give the path of a rules file"),
        "{stderr}"
    );
    assert!(!stderr.contains("fix the file"), "{stderr}");
    let dir = config_dir(&[("a.yaml", "domain: d\nratelimit: {unit: day}\n")]);
    let stderr = refused(dir.path().join("a.yaml").to_str().unwrap());
    assert!(
        stderr.contains("config error, unknown key 'ratelimit'"),
        "{stderr}"
    );
    assert!(stderr.contains("fix: correct "), "{stderr}");
}

/// `detailed_metric: true`: a series per value of the rule, on `/metrics`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detailed_metric_labels_each_value() {
    let dir = config_dir(&[(
        "d.yaml",
        "domain: d\ndescriptors:\n  - key: user\n    detailed_metric: true\n    rate_limit: {unit: minute, requests_per_unit: 1}\n  - key: plain\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
    )]);
    let path = dir.path().join("d.yaml");
    let rls = RlsProcess::start(&["--config", path.to_str().unwrap()]);
    let mut client = rls.client().await;
    for (key, value) in [
        ("user", "alice"),
        ("user", "alice"),
        ("user", "bob"),
        ("plain", "carol"),
    ] {
        should(&mut client, request("d", vec![descriptor(&[(key, value)])])).await;
    }
    let series = |value: &str, result: &str| {
        rls.counter(&format!(
            "tower_window_rls_detailed_total{{rule=\"user\",value=\"{value}\",result=\"{result}\"}}"
        ))
    };
    assert_eq!(
        (
            series("alice", "ok"),
            series("alice", "over_limit"),
            series("bob", "ok")
        ),
        (1, 1, 1),
        "{}",
        rls.metrics()
    );
    // A rule without detailed_metric puts no value in a label.
    assert!(!rls.metrics().contains("carol"));
}
