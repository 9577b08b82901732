//! envoyproxy/ratelimit's own tests, ported: its `test/config/config_test.go`
//! on its YAML fixtures (copied unchanged into
//! `examples/rls/envoyproxy-ratelimit/`), the sequences of its
//! `test/service/ratelimit_test.go` (its mocked cache answers replaced by
//! real windows brought to the same state) and of its `test/integration`,
//! answered by the rls's service on the embedded store, a real
//! `redis-server` and a real 3-primary Redis Cluster. The answers expected
//! are the reference's, except the documented improvements, each shown by
//! a test named `improvement_*`, and the deliberate differences, each
//! shown by a test named `different_*`. [`CASES`] lists every reference
//! case looked at, and the suite prints how many it covers.
#![allow(clippy::unwrap_used, clippy::print_stdout)]

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{Struct, UInt64Value};
use tower_window::{Limiter, MemoryStore, Quota, RedisStore, Store};
use tower_window_examples::rls::service::{HeaderNames, Headers, Modes};
use tower_window_examples::rls::{LoadOptions, RlsArgs, RlsConfig, RlsService};
use tower_window_tests::redis_cluster::RedisCluster;
use tower_window_tests::redis_server::{closed_port, RedisServer};

/// How this suite answers one case of envoyproxy/ratelimit's tests.
enum Coverage {
    /// The test of this file that answers it as the reference does.
    Same(&'static str),
    /// The test of this file that shows how, and why, ours differs.
    Different(&'static str),
    /// Not answered here, and why.
    Not(&'static str),
}

use Coverage::{Different, Not, Same};

/// Every case of envoyproxy/ratelimit's `config_test.go` and
/// `ratelimit_test.go` (its `Test*` functions) and of its integration test.
const CASES: &[(&str, Coverage)] = &[
    // test/config/config_test.go
    ("config: TestBasicConfig", Same("config_basic")),
    ("config: TestDomainMerge", Same("config_domain_merge")),
    (
        "config: TestConfigLimitOverride",
        Same("config_limit_override"),
    ),
    ("config: TestEmptyDomain", Same("config_refusals")),
    ("config: TestDuplicateDomain", Same("config_refusals")),
    ("config: TestEmptyKey", Same("config_refusals")),
    ("config: TestDuplicateKey", Same("config_refusals")),
    (
        "config: TestDuplicateKeyDomainMerge",
        Same("config_refusals"),
    ),
    ("config: TestBadLimitUnit", Same("config_refusals")),
    ("config: TestReplacesSelf", Same("config_refusals")),
    ("config: TestReplacesEmpty", Same("config_refusals")),
    (
        "config: TestBadYaml",
        Different("different_bad_yaml_names_our_parser"),
    ),
    ("config: TestMisspelledKey", Same("config_refusals")),
    ("config: TestNonStringKey", Same("config_refusals")),
    ("config: TestNonMapList", Same("config_refusals")),
    (
        "config: TestUnlimitedWithRateLimitUnit",
        Same("config_refusals"),
    ),
    ("config: TestShadowModeConfig", Same("config_shadow_mode")),
    ("config: TestWildcardConfig", Same("config_wildcards")),
    // test/service/ratelimit_test.go
    ("service: TestService", Same("service_sequence")),
    (
        "service: TestServiceGlobalShadowMode",
        Same("service_global_shadow_mode"),
    ),
    (
        "service: TestRuleShadowMode",
        Same("service_rule_shadow_mode"),
    ),
    (
        "service: TestMixedRuleShadowMode",
        Same("service_rule_shadow_mode"),
    ),
    ("service: TestEmptyDomain", Same("service_request_errors")),
    (
        "service: TestEmptyDescriptors",
        Same("service_request_errors"),
    ),
    (
        "service: TestCacheError",
        Different("different_a_store_failure_is_unavailable"),
    ),
    (
        "service: TestInitialLoadError",
        Different("different_a_broken_config_is_refused_at_start"),
    ),
    ("service: TestUnlimited", Same("service_unlimited")),
    (
        "service: TestServiceGlobalQuotaMode",
        Same("service_quota_mode"),
    ),
    (
        "service: TestServicePerDescriptorQuotaMode",
        Same("service_quota_mode"),
    ),
    (
        "service: TestServiceMixedPerDescriptorModes",
        Same("service_quota_mode"),
    ),
    (
        "service: TestServiceMixedPerDescriptorModesUnderLimit",
        Same("service_quota_mode"),
    ),
    (
        "service: TestServiceQuotaModeOnlyAllOverTheLimit",
        Same("service_quota_mode"),
    ),
    (
        "service: TestServiceQuotaModeOnlySomeOverTheLimit",
        Same("service_quota_mode"),
    ),
    (
        "service: TestServiceQuotaModeSameGroupTenantOverDefaultOk",
        Same("service_quota_groups"),
    ),
    (
        "service: TestServiceQuotaModeSameGroupDefaultOverTenantOk",
        Same("service_quota_groups"),
    ),
    (
        "service: TestServiceQuotaModeMultiModelFailover",
        Same("service_quota_groups"),
    ),
    (
        "service: TestServiceQuotaModeMultiModelAllOver",
        Same("service_quota_groups"),
    ),
    (
        "service: TestServiceQuotaModeWithShadowMode",
        Same("service_quota_mode_under_shadow_mode"),
    ),
    (
        "service: TestServiceMixedModeWithShadowMode",
        Same("service_quota_mode_under_shadow_mode"),
    ),
    (
        "service: TestNegativeHitsRejectedWhenFlagOff",
        Same("service_negative_hits"),
    ),
    (
        "service: TestNegativeHitsRejectedWhenFlagOffMixedBatch",
        Same("service_negative_hits"),
    ),
    (
        "service: TestNegativeHitsAllowedWhenFlagOn",
        Not("negative hits are not served: a window is only ever spent"),
    ),
    (
        "service: TestMetadataReturnedForPassedDescriptors",
        Same("service_dynamic_metadata"),
    ),
    (
        "service: TestMetadataReturnedForAllPassedDescriptors",
        Same("service_dynamic_metadata"),
    ),
    (
        "service: TestOverlappingMetadataReturnsTheFirstValue",
        Same("service_dynamic_metadata"),
    ),
    (
        "service: TestQuotaMetadataExcludesExhaustedGroup",
        Same("service_dynamic_metadata"),
    ),
    (
        "service: TestQuotaMetadataSameModelDifferentBackends",
        Same("service_dynamic_metadata"),
    ),
    (
        "service: TestRequestHeadersSettingsDefaults",
        Same("service_header_settings"),
    ),
    (
        "service: TestRequestHeadersDisabledByDefault",
        Same("service_rate_limit_headers"),
    ),
    (
        "service: TestRequestHeadersDisabledOnHotReload",
        Not("settings are read at start; a reload reloads the rules only"),
    ),
    (
        "service: TestServiceWithDefaultRequestHeaders",
        Same("service_rate_limit_headers"),
    ),
    (
        "service: TestServiceWithCustomRequestHeaders",
        Same("service_rate_limit_headers"),
    ),
    (
        "service: TestServiceWithRequestHeadersWithinLimit",
        Same("service_rate_limit_headers"),
    ),
    (
        "service: TestServiceWithBothRequestAndResponseHeaders",
        Same("service_rate_limit_headers"),
    ),
    (
        "service: TestServiceWithDefaultRatelimitHeaders",
        Same("service_rate_limit_headers"),
    ),
    (
        "service: TestServiceWithCustomRatelimitHeaders",
        Same("service_rate_limit_headers"),
    ),
    (
        "service: TestServiceWithPerUnitRatelimitHeaders",
        Same("service_per_unit_headers"),
    ),
    (
        "service: TestServiceWithPerUnitRatelimitHeadersSameUnit",
        Same("service_per_unit_headers"),
    ),
    (
        "service: TestServiceTracer",
        Not("no OpenTelemetry tracing"),
    ),
    (
        "service: TestServiceHealthStatus",
        Not("no gRPC health service here"),
    ),
    (
        "service: TestServiceHealthStatusAtLeastOneConfigLoaded",
        Not("no gRPC health service here"),
    ),
    // test/integration/integration_test.go, TestBasicConfig (its local-cache
    // variants expect the same answers)
    ("integration: unknown domain", Same("integration_sequences")),
    ("integration: basic key1", Same("integration_sequences")),
    (
        "integration: another key2, 25 calls",
        Same("integration_sequences"),
    ),
    (
        "integration: another key2 and key3, 15 calls",
        Different("improvement_a_denial_records_nothing_in_the_other_descriptors"),
    ),
];

#[test]
fn reference_cases_are_counted() {
    let source = include_str!("rls_conformance.rs");
    let mut covered = 0;
    for (case, coverage) in CASES {
        match coverage {
            Same(test) | Different(test) => {
                assert!(
                    source.contains(&format!("async fn {test}("))
                        || source.contains(&format!("fn {test}(")),
                    "{case}: no test {test} in this file"
                );
                covered += 1;
            }
            Not(why) => assert!(!why.is_empty(), "{case}: say why"),
        }
    }
    // Straight to stderr, past the test harness's capture: CI's log shows
    // the count on every run.
    let _ = writeln!(
        std::io::stderr(),
        "rls conformance: {covered} of {} reference cases",
        CASES.len()
    );
    assert!(
        covered * 2 > CASES.len(),
        "fewer than half the cases covered"
    );
}

// ---------------------------------------------------------------------------
// Harness

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/rls/envoyproxy-ratelimit");

fn fixture(path: &str) -> (PathBuf, String) {
    let path = PathBuf::from(FIXTURES).join(path);
    let text = std::fs::read_to_string(&path).unwrap();
    (path, text)
}

fn inline(name: &str, text: &str) -> (PathBuf, String) {
    (PathBuf::from(name), text.to_owned())
}

/// A value no earlier run wrote on a shared Redis.
fn fresh(tag: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{tag}-{nanos}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// The servers behind [`stores`], kept running while held.
type Servers = (Arc<RedisServer>, Arc<RedisCluster>);

/// The stores every sequence runs on, and their servers.
fn stores() -> (Vec<(&'static str, Store)>, Servers) {
    let redis = RedisServer::shared();
    let cluster = RedisCluster::shared();
    let budget = Duration::from_secs(5);
    let list = vec![
        ("embedded", Store::from(MemoryStore::new())),
        (
            "redis",
            Store::builder(RedisStore::from_url(&redis.url()).unwrap())
                .timeout(budget)
                .build(),
        ),
        (
            "cluster",
            Store::builder(RedisStore::cluster(cluster.urls()).unwrap())
                .timeout(budget)
                .build(),
        ),
    ];
    (list, (redis, cluster))
}

fn service(
    store: Store,
    texts: &[(PathBuf, String)],
    options: LoadOptions,
    modes: Modes,
) -> RlsService {
    let rules = RlsConfig::from_texts_with(texts, options).unwrap();
    let placeholder = Quota::per_second(1).unwrap().named("rls").unwrap();
    let limiter = Limiter::builder(store, placeholder).build();
    RlsService::new(Arc::new(ArcSwap::from_pointee(rules)), limiter, false).with_modes(modes)
}

fn memory(texts: &[(PathBuf, String)]) -> RlsService {
    service(
        Store::from(MemoryStore::new()),
        texts,
        LoadOptions::default(),
        Modes::default(),
    )
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(key, value)| Entry {
                key: (*key).to_owned(),
                value: (*value).to_owned(),
            })
            .collect(),
        ..RateLimitDescriptor::default()
    }
}

fn costing(hits: u64, entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        hits_addend: Some(UInt64Value { value: hits }),
        ..descriptor(entries)
    }
}

fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors,
        hits_addend: 1,
    }
}

async fn decide(
    service: &RlsService,
    domain: &str,
    descriptors: Vec<RateLimitDescriptor>,
) -> RateLimitResponse {
    service.decide(&request(domain, descriptors)).await.unwrap()
}

/// The answer's codes: overall, then each descriptor's.
fn codes(response: &RateLimitResponse) -> (Code, Vec<Code>) {
    (
        Code::try_from(response.overall_code).unwrap(),
        response
            .statuses
            .iter()
            .map(|s| Code::try_from(s.code).unwrap())
            .collect(),
    )
}

/// A descriptor's code, limit (`requests_per_unit`, unit) and remaining.
type Status = (Code, Option<(u32, Unit)>, u32);

/// Each descriptor's [`Status`].
fn statuses(response: &RateLimitResponse) -> Vec<Status> {
    response
        .statuses
        .iter()
        .map(|s| {
            (
                Code::try_from(s.code).unwrap(),
                s.current_limit
                    .as_ref()
                    .map(|l| (l.requests_per_unit, Unit::try_from(l.unit).unwrap())),
                s.limit_remaining,
            )
        })
        .collect()
}

/// The limit a lone descriptor gets (`None`: no limit), as envoyproxy/ratelimit's
/// `GetLimit` is asked in its config tests.
async fn limit_of(
    service: &RlsService,
    domain: &str,
    entries: &[(&str, &str)],
) -> Option<(u32, Unit)> {
    let response = decide(service, domain, vec![descriptor(entries)]).await;
    statuses(&response)[0].1
}

// ---------------------------------------------------------------------------
// test/config/config_test.go

#[tokio::test]
async fn config_basic() {
    let service = memory(&[fixture("test-config/basic_config.yaml")]);
    let none: Option<(u32, Unit)> = None;
    assert_eq!(limit_of(&service, "foo_domain", &[]).await, none);
    assert_eq!(limit_of(&service, "test-domain", &[]).await, none);
    assert_eq!(
        limit_of(&service, "test-domain", &[("key1", "something")]).await,
        none
    );
    assert_eq!(
        limit_of(&service, "test-domain", &[("key1", "value1")]).await,
        none
    );
    assert_eq!(
        limit_of(
            &service,
            "test-domain",
            &[("key2", "value2"), ("subkey", "subvalue")]
        )
        .await,
        none
    );
    assert_eq!(
        limit_of(
            &service,
            "test-domain",
            &[("key5", "value5"), ("subkey5", "subvalue")]
        )
        .await,
        none
    );
    for (entries, expected) in [
        (
            &[("key1", "value1"), ("subkey1", "something")][..],
            (5, Unit::Second),
        ),
        (
            &[("key1", "value1"), ("subkey1", "subvalue1")][..],
            (10, Unit::Second),
        ),
        (&[("key2", "something")][..], (20, Unit::Minute)),
        (&[("key2", "value2")][..], (30, Unit::Minute)),
        (&[("key3", "foo")][..], (1, Unit::Hour)),
        (&[("key4", "foo")][..], (1, Unit::Day)),
        (&[("key7", "unspecified_value")][..], (70, Unit::Minute)),
        (&[("key7", "another_value")][..], (70, Unit::Minute)),
    ] {
        assert_eq!(
            limit_of(&service, "test-domain", entries).await,
            Some(expected),
            "{entries:?}"
        );
    }
    // Whitelisted: no limit.
    assert_eq!(
        limit_of(&service, "test-domain", &[("key2", "value3")]).await,
        none
    );
    // Unlimited: OK, nothing counted, remaining u32::MAX.
    let unlimited = decide(
        &service,
        "test-domain",
        vec![descriptor(&[("key6", "foo")])],
    )
    .await;
    assert_eq!(statuses(&unlimited), [(Code::Ok, None, u32::MAX)]);
}

#[tokio::test]
async fn config_domain_merge() {
    let texts = [
        fixture("test-config/merge_domain_key1.yaml"),
        fixture("test-config/merge_domain_key2.yaml"),
    ];
    let service = service(
        Store::from(MemoryStore::new()),
        &texts,
        LoadOptions::merging(true),
        Modes::default(),
    );
    assert_eq!(limit_of(&service, "foo_domain", &[]).await, None);
    assert_eq!(
        limit_of(&service, "test-domain", &[("key1", "value1")]).await,
        Some((10, Unit::Minute))
    );
    assert_eq!(
        limit_of(&service, "test-domain", &[("key2", "value2")]).await,
        Some((20, Unit::Minute))
    );
}

#[tokio::test]
async fn config_limit_override() {
    let service = memory(&[fixture("test-config/basic_config.yaml")]);
    let with_override = |domain: &str, entries: &[(&str, &str)], limit: u32, unit: Unit| {
        request(
            domain,
            vec![RateLimitDescriptor {
                limit: Some(RateLimitOverride {
                    requests_per_unit: limit,
                    unit: unit as i32,
                }),
                ..descriptor(entries)
            }],
        )
    };
    // No matching domain: no limit, override or not.
    let r = service
        .decide(&with_override(
            "foo_domain",
            &[("key1", "value1")],
            10,
            Unit::Day,
        ))
        .await
        .unwrap();
    assert_eq!(statuses(&r)[0].1, None);
    let entries = [("key1", "value1"), ("subkey1", "something")];
    for (limit, unit) in [(10, Unit::Day), (42, Unit::Hour)] {
        let r = service
            .decide(&with_override("test-domain", &entries, limit, unit))
            .await
            .unwrap();
        assert_eq!(statuses(&r)[0].1, Some((limit, unit)));
    }
    let r = service
        .decide(&with_override(
            "test-domain",
            &[("key1", "value1"), ("subkey1", "something_else")],
            42,
            Unit::Hour,
        ))
        .await
        .unwrap();
    assert_eq!(statuses(&r)[0].1, Some((42, Unit::Hour)));
}

/// The reference's refusals, each with its message: equal, or (marked
/// `prefix`) the start of ours, which adds where and what is expected.
#[test]
fn config_refusals() {
    let refused = |texts: &[(PathBuf, String)], options: LoadOptions| {
        RlsConfig::from_texts_with(texts, options).unwrap_err()
    };
    type Case = (Vec<(PathBuf, String)>, bool, &'static str, bool);
    let cases: Vec<Case> = vec![
        // (files, merge, message, prefix)
        // The reference's empty_domain.yaml / empty_key.yaml /
        // bad_limit_unit.yaml / duplicate_domain.yaml are not in the stored
        // copy: written here as their tests describe them.
        (vec![inline("empty_domain.yaml", "descriptors: []")], false, "config file cannot have empty domain", false),
        (
            vec![fixture("test-config/basic_config.yaml"), inline("duplicate_domain.yaml", "domain: test-domain")],
            false,
            "duplicate domain 'test-domain' in config file",
            true,
        ),
        (
            vec![inline("empty_key.yaml", "domain: test-domain\ndescriptors:\n  - value: value1\n")],
            false,
            "descriptor has empty key",
            false,
        ),
        (vec![fixture("test-config/duplicate_key.yaml")], false, "duplicate descriptor composite key 'test-domain.key1_value1'", false),
        (
            vec![fixture("test-config/merge_domain_key1.yaml"), fixture("test-config/merge_domain_key1.yaml")],
            true,
            "duplicate descriptor composite key 'test-domain.key1_value1'",
            false,
        ),
        (
            vec![inline(
                "bad_limit_unit.yaml",
                "domain: test-domain\ndescriptors:\n  - key: key1\n    rate_limit:\n      unit: foo\n      requests_per_unit: 5\n",
            )],
            false,
            "invalid rate limit unit 'foo'",
            true,
        ),
        (vec![fixture("test-config/replaces_self.yaml")], false, "replaces should not contain name of same descriptor", false),
        (vec![fixture("test-config/replaces_empty.yaml")], false, "should not have an empty replaces entry", false),
        (vec![fixture("test-config/misspelled_key.yaml")], false, "config error, unknown key 'ratelimit'", false),
        (vec![fixture("test-config/misspelled_key2.yaml")], false, "config error, unknown key 'requestsperunit'", false),
        (vec![fixture("test-config/non_string_key.yaml")], false, "config error, key is not of type string: 0.25", false),
        (
            vec![fixture("test-config/non_map_list.yaml")],
            false,
            "config error, yaml file contains list of type other than map: a",
            false,
        ),
        (
            vec![fixture("test-config/unlimited_with_unit.yaml")],
            false,
            "should not specify rate limit unit when unlimited",
            false,
        ),
    ];
    for (texts, merge, message, prefix) in cases {
        let error = refused(&texts, LoadOptions::merging(merge));
        let last = &texts.last().unwrap().0;
        assert_eq!(&error.file, last, "{message}");
        if prefix {
            assert!(
                error.problem.starts_with(message),
                "{message}: {}",
                error.problem
            );
        } else {
            assert_eq!(error.problem, message);
        }
        // The whole message names the file first, as the reference's does.
        assert!(error
            .to_string()
            .starts_with(&format!("{}: ", last.display())));
    }
}

#[test]
fn different_bad_yaml_names_our_parser() {
    // The reference: "bad_yaml.yaml: error loading config file: yaml: line 2:
    // found unexpected end of stream" (Go's yaml.v2 words). Ours starts the
    // same way and gives our YAML parser's words after it.
    let error = RlsConfig::from_texts(&[inline(
        "bad_yaml.yaml",
        "domain: test-domain\ndescriptors: [\n",
    )])
    .unwrap_err();
    assert!(
        error.problem.starts_with("error loading config file: "),
        "{}",
        error.problem
    );
    assert!(!error.problem.contains("FileYaml"), "{}", error.problem);
}

#[tokio::test]
async fn config_shadow_mode() {
    let service = memory(&[fixture("test-config/shadowmode_config.yaml")]);
    // A cost above each limit: over the limit at once, answered OK when the
    // rule is in shadow mode.
    for (entries, limit, shadow) in [
        (
            &[("key1", "value1"), ("subkey1", "something")][..],
            5,
            false,
        ),
        (
            &[("key1", "value1"), ("subkey1", "subvalue1")][..],
            10,
            true,
        ),
        (&[("key2", "something")][..], 20, true),
        (&[("key2", "value2")][..], 30, false),
    ] {
        let r = decide(&service, "test-domain", vec![costing(limit + 1, entries)]).await;
        let expected = if shadow { Code::Ok } else { Code::OverLimit };
        assert_eq!(codes(&r), (expected, vec![expected]), "{entries:?}");
    }
}

#[tokio::test]
async fn config_wildcards() {
    let service = memory(&[fixture("test-config/wildcard.yaml")]);
    let twenty = Some((20, Unit::Minute));
    assert_eq!(
        limit_of(&service, "test-domain", &[("noVal", "foo1")]).await,
        twenty
    );
    assert_eq!(
        limit_of(&service, "test-domain", &[("noVal", "foo2")]).await,
        twenty
    );
    assert_eq!(
        limit_of(&service, "test-domain", &[("wild", "foo1")]).await,
        twenty
    );
    assert_eq!(
        limit_of(&service, "test-domain", &[("wild", "foo2")]).await,
        twenty
    );
    assert_eq!(
        limit_of(&service, "test-domain", &[("wild", "bar")]).await,
        None
    );
    assert_eq!(
        limit_of(&service, "test-domain", &[("noWild", "foo1")]).await,
        None
    );
    assert_eq!(
        limit_of(&service, "test-domain", &[("midWildcard", "barab")]).await,
        None
    );
    // Without share_threshold each value has its own window.
    // (one unit of each spent above)
    let spent = decide(
        &service,
        "test-domain",
        vec![costing(19, &[("wild", "foo1")])],
    )
    .await;
    assert_eq!(statuses(&spent)[0].2, 0);
    let other = decide(
        &service,
        "test-domain",
        vec![descriptor(&[("wild", "foo2")])],
    )
    .await;
    assert_eq!(statuses(&other)[0].2, 18);
}

/// The reference's newer `share_threshold.yaml`: a `*` anywhere, and every
/// value matching a `share_threshold` wildcard sharing one window.
#[tokio::test]
async fn config_share_threshold_and_wildcards_anywhere() {
    let service = memory(&[fixture("test-config/share_threshold.yaml")]);
    let remaining = |r: &RateLimitResponse| statuses(r)[0].2;
    for (first, second, limit) in [
        (("files", "files/a"), ("files", "files/b"), 100),
        (("midpath", "/api-x-v1"), ("midpath", "/api/y/v1"), 100),
        (
            ("multiroute", "svc1ep2rpc"),
            ("multiroute", "svcXepYrpc"),
            50,
        ),
        (("file", "test2"), ("file", "test3"), 100),
    ] {
        let r = decide(&service, "test-domain", vec![costing(limit - 1, &[first])]).await;
        assert_eq!(remaining(&r), 1, "{first:?}");
        let r = decide(&service, "test-domain", vec![descriptor(&[second])]).await;
        assert_eq!(
            (codes(&r).0, remaining(&r)),
            (Code::Ok, 0),
            "{second:?} shares {first:?}"
        );
    }
    // An explicit value wins over a wildcard.
    assert_eq!(
        limit_of(&service, "test-domain", &[("file", "test1")]).await,
        Some((50, Unit::Minute))
    );
    // A middle `*` needs both ends.
    assert_eq!(
        limit_of(&service, "test-domain", &[("midpath", "/api-v2")]).await,
        None
    );
    assert_eq!(
        limit_of(
            &service,
            "test-domain",
            &[("tenant", "t1prod"), ("resource", "res-a-v2")]
        )
        .await,
        Some((60, Unit::Minute))
    );
}

#[tokio::test]
async fn reference_example_configs_load_and_serve() {
    let texts = [
        fixture("examples/config.yaml"),
        fixture("examples/example.yaml"),
        fixture("examples/quota.yaml"),
        fixture("test-config/metadata.yaml"),
    ];
    // metadata.yaml's domain is also in basic_config: load it on its own.
    let service = memory(&texts[..3]);
    assert_eq!(
        limit_of(
            &service,
            "rl",
            &[("source_cluster", "proxy"), ("destination_cluster", "mock")]
        )
        .await,
        Some((1, Unit::Minute))
    );
    let banned = decide(
        &service,
        "rl",
        vec![descriptor(&[("foo", "x"), ("bar", "banned")])],
    )
    .await;
    assert_eq!(codes(&banned), (Code::OverLimit, vec![Code::OverLimit]));
    assert_eq!(
        limit_of(&service, "mongo_cps", &[("database", "users")]).await,
        Some((5, Unit::Minute))
    );
    // quota.yaml: service_1 (1 a minute) soft: alone, over it is a denial
    // (every quota group over), beside service_2 (still in quota) it is not.
    let first = decide(
        &service,
        "quota",
        vec![descriptor(&[("service", "service_1")])],
    )
    .await;
    assert_eq!(codes(&first), (Code::Ok, vec![Code::Ok]));
    let alone = decide(
        &service,
        "quota",
        vec![descriptor(&[("service", "service_1")])],
    )
    .await;
    assert_eq!(codes(&alone), (Code::OverLimit, vec![Code::OverLimit]));
    let beside = decide(
        &service,
        "quota",
        vec![
            descriptor(&[("service", "service_1")]),
            descriptor(&[("service", "service_2")]),
        ],
    )
    .await;
    assert_eq!(codes(&beside), (Code::Ok, vec![Code::OverLimit, Code::Ok]));
    let metadata = memory(&texts[3..]);
    assert_eq!(
        limit_of(&metadata, "test-domain", &[("key2", "x")]).await,
        Some((20, Unit::Minute))
    );
}

// ---------------------------------------------------------------------------
// test/service/ratelimit_test.go: its mocked cache answers are real windows
// here, brought to the same state first.

const SERVICE_RULES: &str = "
domain: different-domain
descriptors:
  - key: foo
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: shadowed
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: baz
    rate_limit: {unlimited: true}
";

fn service_rules() -> Vec<(PathBuf, String)> {
    vec![inline("service.yaml", SERVICE_RULES)]
}

#[tokio::test]
async fn service_sequence() {
    let (stores, _servers) = stores();
    for (store_name, store) in stores {
        let service = service(
            store,
            &service_rules(),
            LoadOptions::default(),
            Modes::default(),
        );
        // First request: no rule (here: unknown domain): OK, no limit.
        let r = decide(
            &service,
            "test-domain",
            vec![descriptor(&[("hello", "world")])],
        )
        .await;
        assert_eq!(statuses(&r), [(Code::Ok, None, 0)], "{store_name}");
        let foo = fresh("foo");
        let over = decide(
            &service,
            "different-domain",
            vec![costing(10, &[("foo", &foo)])],
        )
        .await;
        assert_eq!(codes(&over).0, Code::Ok, "{store_name}");
        let r = decide(
            &service,
            "different-domain",
            vec![
                descriptor(&[("foo", &foo)]),
                descriptor(&[("hello", "world")]),
            ],
        )
        .await;
        assert_eq!(codes(&r).0, Code::OverLimit, "{store_name}");
        assert_eq!(
            statuses(&r),
            [
                (Code::OverLimit, Some((10, Unit::Minute)), 0),
                (Code::Ok, None, 0)
            ],
            "{store_name}"
        );
        // Order does not matter.
        let r = decide(
            &service,
            "different-domain",
            vec![
                descriptor(&[("hello", "world")]),
                descriptor(&[("foo", &foo)]),
            ],
        )
        .await;
        assert_eq!(
            codes(&r),
            (Code::OverLimit, vec![Code::Ok, Code::OverLimit]),
            "{store_name}"
        );
    }
}

#[tokio::test]
async fn service_global_shadow_mode() {
    let (stores, _servers) = stores();
    for (store_name, store) in stores {
        let service = service(
            store,
            &service_rules(),
            LoadOptions::default(),
            Modes::new(true, false),
        );
        let foo = fresh("foo");
        decide(
            &service,
            "different-domain",
            vec![costing(10, &[("foo", &foo)])],
        )
        .await;
        let r = decide(
            &service,
            "different-domain",
            vec![
                descriptor(&[("foo", &foo)]),
                descriptor(&[("hello", "world")]),
            ],
        )
        .await;
        // OK overall, each descriptor keeping its code.
        assert_eq!(
            codes(&r),
            (Code::Ok, vec![Code::OverLimit, Code::Ok]),
            "{store_name}"
        );
    }
}

#[tokio::test]
async fn service_rule_shadow_mode() {
    let (stores, _servers) = stores();
    for (store_name, store) in stores {
        let service = service(
            store,
            &service_rules(),
            LoadOptions::default(),
            Modes::default(),
        );
        let (a, b, foo) = (fresh("a"), fresh("b"), fresh("foo"));
        // TestRuleShadowMode: two shadow rules over their limit: OK.
        let r = decide(
            &service,
            "different-domain",
            vec![
                costing(11, &[("shadowed", &a)]),
                costing(11, &[("shadowed", &b)]),
            ],
        )
        .await;
        assert_eq!(
            codes(&r),
            (Code::Ok, vec![Code::Ok, Code::Ok]),
            "{store_name}"
        );
        // TestMixedRuleShadowMode: a shadow one and an enforced one over.
        let r = decide(
            &service,
            "different-domain",
            vec![
                costing(11, &[("shadowed", &a)]),
                costing(11, &[("foo", &foo)]),
            ],
        )
        .await;
        assert_eq!(
            codes(&r),
            (Code::OverLimit, vec![Code::Ok, Code::OverLimit]),
            "{store_name}"
        );
    }
}

#[tokio::test]
async fn service_request_errors() {
    let service = memory(&service_rules());
    let error = service
        .decide(&request("", vec![descriptor(&[("hello", "world")])]))
        .await
        .unwrap_err();
    assert_eq!(
        (error.code(), error.message()),
        (tonic::Code::Unknown, "rate limit domain must not be empty")
    );
    let error = service
        .decide(&request("test-domain", vec![]))
        .await
        .unwrap_err();
    assert_eq!(
        (error.code(), error.message()),
        (
            tonic::Code::Unknown,
            "rate limit descriptor list must not be empty"
        )
    );
}

#[tokio::test]
async fn service_unlimited() {
    let (stores, _servers) = stores();
    for (store_name, store) in stores {
        let service = service(
            store,
            &service_rules(),
            LoadOptions::default(),
            Modes::default(),
        );
        let foo = fresh("bar");
        let r = decide(
            &service,
            "different-domain",
            vec![
                descriptor(&[("foo", &foo)]),
                descriptor(&[("hello", "world")]),
                descriptor(&[("baz", "qux")]),
            ],
        )
        .await;
        assert_eq!(
            statuses(&r),
            [
                (Code::Ok, Some((10, Unit::Minute)), 9),
                (Code::Ok, None, 0),
                (Code::Ok, None, u32::MAX)
            ],
            "{store_name}"
        );
    }
}

#[tokio::test]
async fn service_negative_hits() {
    let service = memory(&service_rules());
    let negative = |entries: &[(&str, &str)]| RateLimitDescriptor {
        is_negative_hits: true,
        ..costing(3, entries)
    };
    for descriptors in [
        vec![negative(&[("hello", "world")])],
        vec![
            descriptor(&[("foo", "bar")]),
            negative(&[("hello", "world")]),
        ],
    ] {
        let error = service
            .decide(&request("test-domain", descriptors))
            .await
            .unwrap_err();
        assert_eq!(error.code(), tonic::Code::Unimplemented);
    }
}

const QUOTA_RULES: &str = "
domain: quota-domain
descriptors:
  - key: regular
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: quota
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: quota1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: quota2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: plain1
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: plain2
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: backend_name
    descriptors:
      - key: model_name_override
        descriptors:
          - key: tenant
            quota_mode: true
            rate_limit: {unit: minute, requests_per_unit: 100}
          - key: default
            quota_mode: true
            rate_limit: {unit: minute, requests_per_unit: 150}
";

fn quota_rules() -> Vec<(PathBuf, String)> {
    vec![inline("quota.yaml", QUOTA_RULES)]
}

#[tokio::test]
async fn service_quota_mode() {
    let (stores, _servers) = stores();
    for (store_name, store) in stores {
        let service = service(
            store.clone(),
            &quota_rules(),
            LoadOptions::default(),
            Modes::default(),
        );
        let v = fresh("v");
        let (regular, quota) = ([("regular", v.as_str())], [("quota", v.as_str())]);
        let (quota1, quota2) = ([("quota1", v.as_str())], [("quota2", v.as_str())]);
        let d = |entries: &[(&str, &str)], hits| costing(hits, entries);
        // TestServicePerDescriptorQuotaMode: an enforced rule over decides.
        let r = decide(&service, "quota-domain", vec![d(&regular, 6), d(&quota, 1)]).await;
        assert_eq!(
            codes(&r),
            (Code::OverLimit, vec![Code::OverLimit, Code::Ok]),
            "{store_name}"
        );
        // TestServiceMixedPerDescriptorModes: the only quota group over.
        let r = decide(&service, "quota-domain", vec![d(&regular, 1), d(&quota, 4)]).await;
        assert_eq!(
            codes(&r),
            (Code::OverLimit, vec![Code::Ok, Code::OverLimit]),
            "{store_name}"
        );
        // ...UnderLimit: nothing over.
        let r = decide(&service, "quota-domain", vec![d(&regular, 1), d(&quota, 1)]).await;
        assert_eq!(
            codes(&r),
            (Code::Ok, vec![Code::Ok, Code::Ok]),
            "{store_name}"
        );
        // TestServiceQuotaModeOnlySomeOverTheLimit / ...AllOverTheLimit.
        let r = decide(&service, "quota-domain", vec![d(&quota1, 6), d(&quota2, 1)]).await;
        assert_eq!(
            codes(&r),
            (Code::Ok, vec![Code::OverLimit, Code::Ok]),
            "{store_name}"
        );
        let r = decide(&service, "quota-domain", vec![d(&quota1, 6), d(&quota2, 4)]).await;
        assert_eq!(
            codes(&r),
            (Code::OverLimit, vec![Code::OverLimit, Code::OverLimit]),
            "{store_name}"
        );
        // TestServiceGlobalQuotaMode: every rule soft, every group over.
        let global = service_with(store.clone(), Modes::new(false, true));
        let (plain1, plain2) = ([("plain1", v.as_str())], [("plain2", v.as_str())]);
        let r = decide(&global, "quota-domain", vec![d(&plain1, 11), d(&plain2, 6)]).await;
        assert_eq!(
            codes(&r),
            (Code::OverLimit, vec![Code::OverLimit, Code::OverLimit]),
            "{store_name}"
        );
        let r = decide(&global, "quota-domain", vec![d(&plain1, 11), d(&plain2, 1)]).await;
        assert_eq!(
            codes(&r),
            (Code::Ok, vec![Code::OverLimit, Code::Ok]),
            "{store_name}"
        );
    }
}

fn service_with(store: Store, modes: Modes) -> RlsService {
    service(store, &quota_rules(), LoadOptions::default(), modes)
}

#[tokio::test]
async fn service_quota_mode_under_shadow_mode() {
    let (stores, _servers) = stores();
    for (store_name, store) in stores {
        let service = service_with(store, Modes::new(true, false));
        let v = fresh("v");
        // TestServiceQuotaModeWithShadowMode: every quota group over.
        let r = decide(
            &service,
            "quota-domain",
            vec![costing(6, &[("quota1", &v)]), costing(4, &[("quota2", &v)])],
        )
        .await;
        assert_eq!(
            codes(&r),
            (Code::Ok, vec![Code::OverLimit, Code::OverLimit]),
            "{store_name}"
        );
        // TestServiceMixedModeWithShadowMode: an enforced one over too.
        let r = decide(
            &service,
            "quota-domain",
            vec![costing(6, &[("regular", &v)]), costing(4, &[("quota", &v)])],
        )
        .await;
        assert_eq!(
            codes(&r),
            (Code::Ok, vec![Code::OverLimit, Code::OverLimit]),
            "{store_name}"
        );
    }
}

#[tokio::test]
async fn service_quota_groups() {
    let (stores, _servers) = stores();
    for (store_name, store) in stores {
        let service = service_with(store, Modes::default());
        let backend = fresh("ns/be");
        let bucket = |model: &str, bucket: &str, hits| {
            costing(
                hits,
                &[
                    ("backend_name", &backend),
                    ("model_name_override", model),
                    (bucket, "x"),
                ],
            )
        };
        // TestServiceQuotaModeSameGroupTenantOverDefaultOk: one model, its
        // tenant bucket over: the group, and so the request, is over.
        let r = decide(
            &service,
            "quota-domain",
            vec![
                bucket("gpt-4o-mini", "tenant", 101),
                bucket("gpt-4o-mini", "default", 1),
            ],
        )
        .await;
        assert_eq!(
            codes(&r),
            (Code::OverLimit, vec![Code::OverLimit, Code::Ok]),
            "{store_name}"
        );
        // ...DefaultOverTenantOk.
        let r = decide(
            &service,
            "quota-domain",
            vec![
                bucket("gpt-4o-mini", "tenant", 1),
                bucket("gpt-4o-mini", "default", 151),
            ],
        )
        .await;
        assert_eq!(
            codes(&r),
            (Code::OverLimit, vec![Code::Ok, Code::OverLimit]),
            "{store_name}"
        );
        // TestServiceQuotaModeMultiModelFailover: model A over, B in quota.
        let r = decide(
            &service,
            "quota-domain",
            vec![
                bucket("gpt-4o-mini", "tenant", 101),
                bucket("gpt-4o-mini", "default", 151),
                bucket("gpt-5-mini", "default", 1),
            ],
        )
        .await;
        assert_eq!(codes(&r).0, Code::Ok, "{store_name}");
        // TestServiceQuotaModeMultiModelAllOver.
        let r = decide(
            &service,
            "quota-domain",
            vec![
                bucket("gpt-4o-mini", "tenant", 101),
                bucket("gpt-4o-mini", "default", 151),
                bucket("gpt-5-mini", "default", 151),
            ],
        )
        .await;
        assert_eq!(codes(&r).0, Code::OverLimit, "{store_name}");
    }
}

/// TestCacheError: the reference answers a cache failure with the error
/// (gRPC `UNKNOWN`, "cache error"); ours answers `UNAVAILABLE` (so Envoy's
/// `failure_mode_deny` applies as to any unreachable service) — or, with a
/// fallback policy (the binary's default on Redis), the fallback's answer.
#[tokio::test]
async fn different_a_store_failure_is_unavailable() {
    let url = format!("redis://127.0.0.1:{}", closed_port());
    let store = Store::builder(RedisStore::from_url(&url).unwrap())
        .timeout(Duration::from_millis(200))
        .build();
    let service = service(
        store,
        &service_rules(),
        LoadOptions::default(),
        Modes::default(),
    );
    let error = service
        .decide(&request(
            "different-domain",
            vec![descriptor(&[("foo", "bar")])],
        ))
        .await
        .unwrap_err();
    assert_eq!(error.code(), tonic::Code::Unavailable);
}

/// TestInitialLoadError: the reference starts without rules and answers
/// every call "no rate limit configuration loaded"; ours refuses to start
/// on rules it cannot load (and keeps the old rules on a broken reload),
/// so it never serves without rules.
#[test]
fn different_a_broken_config_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broken.yaml");
    std::fs::write(&path, "domain: d\ndescriptors: [a]\n").unwrap();
    let error = RlsConfig::load(std::slice::from_ref(&path), LoadOptions::default()).unwrap_err();
    assert_eq!(error.file, path);
}

const HEADER_RULES: &str = "
domain: different-domain
algorithm: fixed-window
descriptors:
  - key: foo
    rate_limit: {unit: minute, requests_per_unit: 10}
";

fn header_pairs(headers: &[HeaderValue]) -> Vec<(&str, &str)> {
    headers
        .iter()
        .map(|h| (h.key.as_str(), h.value.as_str()))
        .collect()
}

/// The reference's reset: the seconds left in the unit's aligned window.
fn seconds_to_the_minute_end() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    60 - now % 60
}

/// The reference's header tests, on fixed windows (its counting): the
/// binding descriptor's limit, remaining and the seconds to its window's
/// end, under its default names or the ones given, in the response, the
/// upstream request, both, or neither.
#[tokio::test]
async fn service_rate_limit_headers() {
    let custom = HeaderNames::new(
        "X-RateLimit-Limit",
        "X-RateLimit-Remaining",
        "X-RateLimit-Reset",
    );
    let cases = [
        // TestServiceWithDefaultRatelimitHeaders
        (Some(HeaderNames::default()), None),
        // TestServiceWithCustomRatelimitHeaders
        (Some(custom.clone()), None),
        // TestServiceWithDefaultRequestHeaders, ...CustomRequestHeaders
        (None, Some(HeaderNames::default())),
        (None, Some(custom.clone())),
        // TestServiceWithBothRequestAndResponseHeaders
        (
            Some(HeaderNames::new(
                "X-Downstream-Limit",
                "X-Downstream-Remaining",
                "X-Downstream-Reset",
            )),
            Some(HeaderNames::new(
                "X-Upstream-Limit",
                "X-Upstream-Remaining",
                "X-Upstream-Reset",
            )),
        ),
        // TestRequestHeadersDisabledByDefault
        (None, None),
    ];
    for (response, upstream) in cases {
        let mut headers = Headers::default();
        headers.response = response.clone();
        headers.request = upstream.clone();
        let service = memory(&[inline("headers.yaml", HEADER_RULES)]).with_headers(headers);
        let foo = fresh("bar");
        // TestServiceWithRequestHeadersWithinLimit: 10 a minute, 2 spent.
        decide(
            &service,
            "different-domain",
            vec![descriptor(&[("foo", &foo)])],
        )
        .await;
        let before = seconds_to_the_minute_end();
        let r = decide(
            &service,
            "different-domain",
            vec![descriptor(&[("foo", &foo)])],
        )
        .await;
        let after = seconds_to_the_minute_end();
        check_headers(
            &r,
            response.as_ref(),
            upstream.as_ref(),
            "8",
            (before, after),
        );
        // Over the limit, beside a descriptor without a rule.
        decide(
            &service,
            "different-domain",
            vec![costing(8, &[("foo", &foo)])],
        )
        .await;
        let before = seconds_to_the_minute_end();
        let r = decide(
            &service,
            "different-domain",
            vec![
                descriptor(&[("foo", &foo)]),
                descriptor(&[("hello", "world")]),
            ],
        )
        .await;
        let after = seconds_to_the_minute_end();
        assert_eq!(codes(&r).0, Code::OverLimit);
        check_headers(
            &r,
            response.as_ref(),
            upstream.as_ref(),
            "0",
            (before, after),
        );
    }
}

fn check_headers(
    r: &RateLimitResponse,
    response: Option<&HeaderNames>,
    upstream: Option<&HeaderNames>,
    remaining: &str,
    (before, after): (u64, u64),
) {
    for (names, got) in [
        (response, &r.response_headers_to_add),
        (upstream, &r.request_headers_to_add),
    ] {
        let got = header_pairs(got);
        let Some(names) = names else {
            assert!(got.is_empty(), "{got:?}");
            continue;
        };
        assert_eq!(
            got[..2],
            [
                (names.limit.as_str(), "10"),
                (names.remaining.as_str(), remaining)
            ],
            "{got:?}"
        );
        assert_eq!(got[2].0, names.reset);
        let reset: u64 = got[2].1.parse().unwrap();
        // The minute may turn between the two readings.
        assert!(
            reset == before || reset == after,
            "{reset} is neither {before} nor {after}"
        );
    }
}

const PER_UNIT_RULES: &str = "
domain: different-domain
descriptors:
  - key: second
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: minute
    rate_limit: {unit: minute, requests_per_unit: 1000}
  - key: ip
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: api_key
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: organization
    rate_limit: {unit: day, requests_per_unit: 100}
  - key: project
    rate_limit: {unit: day, requests_per_unit: 50}
  - key: unlimited
    rate_limit: {unlimited: true}
";

/// The reference's per-unit header tests: for each unit, the limit and
/// remaining of its descriptor with the least remaining, before the three
/// others when those are on too.
#[tokio::test]
async fn service_per_unit_headers() {
    let v = fresh("v");
    // TestServiceWithPerUnitRatelimitHeaders (with the response headers).
    let mut headers = Headers::default();
    headers.per_unit = Some(HeaderNames::default());
    headers.response = Some(HeaderNames::default());
    let service = memory(&[inline("per-unit.yaml", PER_UNIT_RULES)]).with_headers(headers);
    decide(
        &service,
        "different-domain",
        vec![costing(991, &[("minute", &v)])],
    )
    .await;
    let r = decide(
        &service,
        "different-domain",
        vec![
            descriptor(&[("second", &v)]),
            descriptor(&[("minute", &v)]),
            descriptor(&[("unlimited", "descriptor")]),
        ],
    )
    .await;
    let got = header_pairs(&r.response_headers_to_add);
    assert_eq!(
        got[..6],
        [
            ("RateLimit-Limit-Seconds", "10"),
            ("RateLimit-Remaining-Seconds", "9"),
            ("RateLimit-Limit-Minutes", "1000"),
            ("RateLimit-Remaining-Minutes", "8"),
            ("RateLimit-Limit", "1000"),
            ("RateLimit-Remaining", "8"),
        ]
    );
    assert_eq!(got[6].0, "RateLimit-Reset");
    // TestServiceWithPerUnitRatelimitHeadersSameUnit (per-unit alone).
    let mut headers = Headers::default();
    headers.per_unit = Some(HeaderNames::default());
    let service = memory(&[inline("per-unit.yaml", PER_UNIT_RULES)]).with_headers(headers);
    decide(
        &service,
        "different-domain",
        vec![costing(74, &[("organization", &v)])],
    )
    .await;
    decide(
        &service,
        "different-domain",
        vec![costing(39, &[("project", &v)])],
    )
    .await;
    let r = decide(
        &service,
        "different-domain",
        vec![
            descriptor(&[("ip", &v)]),
            descriptor(&[("api_key", &v)]),
            descriptor(&[("organization", &v)]),
            descriptor(&[("project", &v)]),
        ],
    )
    .await;
    assert_eq!(
        header_pairs(&r.response_headers_to_add),
        [
            ("RateLimit-Limit-Seconds", "5"),
            ("RateLimit-Remaining-Seconds", "4"),
            ("RateLimit-Limit-Days", "50"),
            ("RateLimit-Remaining-Days", "10"),
        ]
    );
}

/// TestRequestHeadersSettingsDefaults: off, named `RateLimit-Limit`,
/// `RateLimit-Remaining`, `RateLimit-Reset`.
#[test]
fn service_header_settings() {
    use clap::Parser;
    let args = RlsArgs::try_parse_from(["rls", "--config", "x.yaml"]).unwrap();
    assert!(!args.request_headers && !args.response_headers);
    for names in [
        [
            &args.limit_header,
            &args.remaining_header,
            &args.reset_header,
        ],
        [
            &args.request_limit_header,
            &args.request_remaining_header,
            &args.request_reset_header,
        ],
    ] {
        assert_eq!(
            names,
            ["RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"]
        );
    }
}

/// Under sliding windows (our default) there is no aligned window end: the
/// reset header is the seconds until the binding descriptor's cost fits
/// again (here, when the 10 units spent just now leave the minute), where
/// the reference's fixed windows answer the minute's end.
#[tokio::test]
async fn different_reset_under_sliding_windows() {
    let mut headers = Headers::default();
    headers.response = Some(HeaderNames::default());
    let service = memory(&service_rules()).with_headers(headers);
    decide(
        &service,
        "different-domain",
        vec![costing(10, &[("foo", "bar")])],
    )
    .await;
    let r = decide(
        &service,
        "different-domain",
        vec![descriptor(&[("foo", "bar")])],
    )
    .await;
    let headers = header_pairs(&r.response_headers_to_add);
    assert_eq!(
        headers[..2],
        [("RateLimit-Limit", "10"), ("RateLimit-Remaining", "0")]
    );
    let reset: u64 = headers[2].1.parse().unwrap();
    assert!((59..=60).contains(&reset), "{headers:?}");
}

const METADATA_RULES: &str = "
domain: quota-domain
descriptors:
  - key: regular
    metadata: {name: service_1}
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: quota
    metadata: {name: service_2}
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: other
    metadata: {some_other_name: service_2}
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: backend_name
    descriptors:
      - key: model_name_override
        value: model-a
        descriptors:
          - key: tenant
            metadata: {name: model_a_tenant}
            rate_limit: {unit: minute, requests_per_unit: 100}
          - key: default
            metadata: {name: model_a_default}
            rate_limit: {unit: minute, requests_per_unit: 150}
      - key: model_name_override
        value: model-b
        descriptors:
          - key: default
            metadata: {name: model_b}
            rate_limit: {unit: minute, requests_per_unit: 250}
      - key: model_name_override
        descriptors:
          - key: bucket
            rate_limit: {unit: minute, requests_per_unit: 100}
";

/// The string at `path` in `metadata` (a `Struct`).
fn metadata_text<'a>(metadata: &'a Struct, path: &[&str]) -> Option<&'a str> {
    let (last, parents) = path.split_last()?;
    let mut at = metadata;
    for key in parents {
        match &at.fields.get(*key)?.kind {
            Some(Kind::StructValue(inner)) => at = inner,
            _ => return None,
        }
    }
    match &at.fields.get(*last)?.kind {
        Some(Kind::StringValue(s)) => Some(s),
        _ => None,
    }
}

/// `passedBackends` as (backend, model) pairs, in order.
fn passed_backends(metadata: &Struct) -> Vec<(String, String)> {
    let Some(Some(Kind::ListValue(list))) = metadata.fields.get("passedBackends").map(|v| &v.kind)
    else {
        return Vec::new();
    };
    list.values
        .iter()
        .filter_map(|v| match &v.kind {
            Some(Kind::StructValue(pair)) => Some((
                metadata_text(pair, &["backend_name"])?.to_owned(),
                metadata_text(pair, &["model_name_override"])?.to_owned(),
            )),
            _ => None,
        })
        .collect()
}

/// The reference's `RESPONSE_DYNAMIC_METADATA` tests (with `QUOTA_MODE`):
/// the passed descriptors' rule `metadata`, merged, the first one winning;
/// an exhausted quota group never advertised.
#[tokio::test]
async fn service_dynamic_metadata() {
    let (stores, _servers) = stores();
    for (store_name, store) in stores {
        let modes = Modes::new(false, true).with_dynamic_metadata(true);
        let service = service(
            store,
            &[inline("metadata.yaml", METADATA_RULES)],
            LoadOptions::default(),
            modes,
        );
        let v = fresh("v");
        let metadata_of = |r: &RateLimitResponse| r.dynamic_metadata.clone().unwrap();
        // TestMetadataReturnedForPassedDescriptors: the quota one over.
        let r = decide(
            &service,
            "quota-domain",
            vec![costing(5, &[("regular", &v)]), costing(6, &[("quota", &v)])],
        )
        .await;
        assert_eq!(
            codes(&r),
            (Code::Ok, vec![Code::Ok, Code::OverLimit]),
            "{store_name}"
        );
        let metadata = metadata_of(&r);
        assert_eq!(
            metadata_text(&metadata, &["metadata", "name"]),
            Some("service_1")
        );
        assert_eq!(metadata_text(&metadata, &["domain"]), Some("quota-domain"));
        // TestMetadataReturnedForAllPassedDescriptors.
        let r = decide(
            &service,
            "quota-domain",
            vec![descriptor(&[("regular", &v)]), descriptor(&[("other", &v)])],
        )
        .await;
        let metadata = metadata_of(&r);
        assert_eq!(
            metadata_text(&metadata, &["metadata", "name"]),
            Some("service_1")
        );
        assert_eq!(
            metadata_text(&metadata, &["metadata", "some_other_name"]),
            Some("service_2")
        );
        // TestOverlappingMetadataReturnsTheFirstValue.
        let w = fresh("w");
        let r = decide(
            &service,
            "quota-domain",
            vec![descriptor(&[("regular", &w)]), descriptor(&[("quota", &w)])],
        )
        .await;
        assert_eq!(
            metadata_text(&metadata_of(&r), &["metadata", "name"]),
            Some("service_1")
        );
        // TestQuotaMetadataExcludesExhaustedGroup: model-a's tenant bucket
        // over, its default bucket passing, model-b passing.
        let backend = fresh("ns/be");
        let bucket = |model: &str, key: &str, hits| {
            costing(
                hits,
                &[
                    ("backend_name", &backend),
                    ("model_name_override", model),
                    (key, "x"),
                ],
            )
        };
        let r = decide(
            &service,
            "quota-domain",
            vec![
                bucket("model-a", "tenant", 101),
                bucket("model-a", "default", 1),
                bucket("model-b", "default", 1),
            ],
        )
        .await;
        assert_eq!(codes(&r).0, Code::Ok, "{store_name}");
        let metadata = metadata_of(&r);
        assert_eq!(
            metadata_text(&metadata, &["metadata", "name"]),
            Some("model_b")
        );
        assert_eq!(
            passed_backends(&metadata),
            [(backend.clone(), "model-b".to_owned())]
        );
        // TestQuotaMetadataSameModelDifferentBackends.
        let (a, b) = (fresh("ns/backend-a"), fresh("ns/backend-b"));
        let r = decide(
            &service,
            "quota-domain",
            vec![
                costing(
                    101,
                    &[
                        ("backend_name", &a),
                        ("model_name_override", "gpt-4o-mini"),
                        ("bucket", "x"),
                    ],
                ),
                costing(
                    1,
                    &[
                        ("backend_name", &b),
                        ("model_name_override", "gpt-4o-mini"),
                        ("bucket", "x"),
                    ],
                ),
            ],
        )
        .await;
        assert_eq!(codes(&r).0, Code::Ok, "{store_name}");
        assert_eq!(
            passed_backends(&metadata_of(&r)),
            [(b.clone(), "gpt-4o-mini".to_owned())]
        );
    }
    // Off by default.
    let r = decide(
        &memory(&service_rules()),
        "different-domain",
        vec![descriptor(&[("foo", "x")])],
    )
    .await;
    assert_eq!(r.dynamic_metadata, None);
}

// ---------------------------------------------------------------------------
// test/integration/integration_test.go, TestBasicConfig

fn integration_rules(algorithm: &str) -> Vec<(PathBuf, String)> {
    ["integration/basic.yaml", "integration/another.yaml"]
        .iter()
        .map(|file| {
            let (path, text) = fixture(file);
            // `algorithm` is ours; the rest is the reference's file.
            (path, format!("algorithm: {algorithm}\n{text}"))
        })
        .collect()
}

#[tokio::test]
async fn integration_sequences() {
    for algorithm in ["sliding-log", "fixed-window"] {
        let (stores, _servers) = stores();
        for (store_name, store) in stores {
            let at = format!("{store_name}, {algorithm}");
            let service = service(
                store,
                &integration_rules(algorithm),
                LoadOptions::default(),
                Modes::default(),
            );
            let r = decide(&service, "foo", vec![descriptor(&[("hello", "world")])]).await;
            assert_eq!(codes(&r), (Code::Ok, vec![Code::Ok]), "{at}");
            assert_eq!(statuses(&r)[0].1, None, "{at}");
            let r = decide(
                &service,
                "basic",
                vec![descriptor(&[("key1", &fresh("foo"))])],
            )
            .await;
            assert_eq!(
                statuses(&r),
                [(Code::Ok, Some((50, Unit::Second)), 49)],
                "{at}"
            );
            // Over a minute limit with a random value.
            let value = fresh("key2");
            for i in 0..25u32 {
                let r = decide(&service, "another", vec![descriptor(&[("key2", &value)])]).await;
                let (code, remaining) = if i >= 20 {
                    (Code::OverLimit, 0)
                } else {
                    (Code::Ok, 20 - (i + 1))
                };
                assert_eq!(codes(&r).0, code, "{at}: call {i}");
                assert_eq!(
                    statuses(&r),
                    [(code, Some((20, Unit::Minute)), remaining)],
                    "{at}: call {i}"
                );
            }
        }
    }
}

/// Two descriptors in one request, `key3` (10 an hour) running out before
/// `key2` (20 a minute). The reference counts `key2` on every call, also
/// on those denied by `key3` (its remaining goes 19, 18, ... 5); ours
/// decides the two together and a denied request records nothing, so
/// `key2` keeps the 10 units the denied calls did not use. Everything else
/// is the reference's answer.
#[tokio::test]
async fn improvement_a_denial_records_nothing_in_the_other_descriptors() {
    let (stores, _servers) = stores();
    for (store_name, store) in stores {
        let service = service(
            store,
            &integration_rules("sliding-log"),
            LoadOptions::default(),
            Modes::default(),
        );
        let value = fresh("two");
        for i in 0..15u32 {
            let r = decide(
                &service,
                "another",
                vec![
                    descriptor(&[("key2", &value)]),
                    descriptor(&[("key3", &value)]),
                ],
            )
            .await;
            let over = i >= 10;
            let reference_key2 = 20 - (i + 1);
            let ours_key2 = if over { 10 } else { reference_key2 };
            let key3 = if over { 0 } else { 10 - (i + 1) };
            let code = if over { Code::OverLimit } else { Code::Ok };
            assert_eq!(codes(&r).0, code, "{store_name}: call {i}");
            assert_eq!(
                statuses(&r),
                [
                    (Code::Ok, Some((20, Unit::Minute)), ours_key2),
                    (code, Some((10, Unit::Hour)), key3)
                ],
                "{store_name}: call {i}"
            );
            if over {
                assert!(ours_key2 > reference_key2);
            }
        }
    }
}

/// The reference tries a level's wildcards in file order and takes the
/// first that matches; ours takes the most specific (most literal
/// characters), so `foob*` decides `foobar` even when `foo*` comes first.
#[tokio::test]
async fn improvement_the_most_specific_wildcard_wins() {
    let rules = "
domain: d
descriptors:
  - key: k
    value: foo*
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: k
    value: foob*
    rate_limit: {unit: minute, requests_per_unit: 2}
";
    let service = memory(&[inline("d.yaml", rules)]);
    assert_eq!(
        limit_of(&service, "d", &[("k", "foobar")]).await,
        Some((2, Unit::Minute))
    );
    assert_eq!(
        limit_of(&service, "d", &[("k", "fooxar")]).await,
        Some((1, Unit::Minute))
    );
}

/// A cost that can never fit (above the limit) answers the window's reset,
/// never 0 ("retry at once").
#[tokio::test]
async fn a_never_fitting_cost_answers_the_window_reset() {
    let service = memory(&service_rules());
    let r = decide(
        &service,
        "different-domain",
        vec![costing(11, &[("foo", "never")])],
    )
    .await;
    assert_eq!(codes(&r).0, Code::OverLimit);
    let until = r.statuses[0].duration_until_reset.as_ref().unwrap();
    assert_eq!(until.seconds, 60);
}
