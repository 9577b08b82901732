//! What the built `gateway` says when it starts (issue 26): with a tenants
//! file, the file and its tenants (the `--limit` policy serves none of
//! them then); without one, the one policy and its quotas.
#![allow(clippy::unwrap_used)]

mod support;

use support::GatewayProcess;

const TENANTS: &str = r#"
[tenants.acme]
quotas = { burst = "3/1m" }

[tenants.trial]
quotas = { minute = "2/1m" }
shadow = ["minute"]

[tenants.internal]
unlimited = true
"#;

/// The first log line that says how the gateway was configured.
fn configured(gateway: &GatewayProcess) -> String {
    let log = gateway.log();
    log.lines()
        .find(|line| line.contains("configured"))
        .unwrap_or_else(|| panic!("no \"configured\" line in the log:\n{log}"))
        .to_owned()
}

#[test]
fn the_startup_log_names_the_tenants_file_and_its_tenants() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tenants.toml");
    std::fs::write(&file, TENANTS).unwrap();
    let gateway = GatewayProcess::start(&["--tenants", file.to_str().unwrap()]);
    let line = configured(&gateway);
    assert!(
        line.contains("per-tenant policies from the tenants file"),
        "{line}"
    );
    assert!(line.contains(&file.display().to_string()), "{line}");
    for tenant in [
        "acme (burst=3/1m)",
        "trial (minute=2/1m (shadow))",
        "internal (unlimited)",
    ] {
        assert!(line.contains(tenant), "{tenant:?} missing: {line}");
    }
    // No [default]: unknown tenants are refused, and the log says so.
    assert!(line.contains("refused (403)"), "{line}");
    // The unused `--limit` policy is not presented as the configuration.
    assert!(!line.contains("policy=default"), "{line}");
}

#[test]
fn without_a_tenants_file_the_startup_log_names_the_one_policy() {
    let gateway = GatewayProcess::start(&["--limit", "5/1m"]);
    let line = configured(&gateway);
    assert!(
        line.contains("one policy for every tenant and user"),
        "{line}"
    );
    assert!(line.contains("5/1m"), "{line}");
}
