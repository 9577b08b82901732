//! Envoy's end-of-stream usage reports (issue 34): a descriptor whose last
//! entry matches a `usage_report: true` entry of the rules reports usage of
//! the window its entries before that one get. Through the real gRPC
//! server, on the embedded store, a real `redis-server` and the real
//! 3-primary Redis Cluster: a report is recorded in full, past the limit
//! too, and answered `OK`; the next request-time checks are denied until
//! the debt slides out; a request-time denial still records nothing;
//! a request-time check of `hits_addend` 0 is denied while the window has
//! no unit left, counting nothing, nor in the other windows of its call;
//! per-descriptor `hits_addend`s; the series count reports apart; shadow
//! quotas, `--shadow-mode` and a rules reload compose with them; rules
//! that give a report no window are refused. Counts and values only: time
//! moves by a manual clock, or (on Redis, whose clock it is) within a
//! bounded wait.
#![allow(clippy::unwrap_used)]

mod rls_support;

use std::time::{Duration, Instant};

use clap::Parser as _;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use rls_support::{
    codes, config_dir, costing, descriptor, overall, request, should, write_atomically, RlsProcess,
};
use tonic::transport::Channel;
use tower_window::{ManualClock, MemoryStore, Store};
use tower_window_examples::rls::RlsArgs;
use tower_window_tests::redis_cluster::RedisCluster;
use tower_window_tests::redis_server::RedisServer;

type Client = RateLimitServiceClient<Channel>;

/// Domain `ai`: a tenant's budget of `limit` an hour, a model's of half
/// that, a shadowed trial budget of 10 an hour and a burst budget of 10 a
/// second, each with a usage-report entry `stream_done`.
fn rules(limit: u32) -> String {
    let mut text = String::from("domain: ai\ndescriptors:\n");
    for (key, rate_limit, shadow) in [
        (
            "tenant",
            format!("{{unit: hour, requests_per_unit: {limit}, name: tokens}}"),
            false,
        ),
        (
            "model",
            format!("{{unit: hour, requests_per_unit: {}}}", limit / 2),
            false,
        ),
        (
            "trial",
            "{unit: hour, requests_per_unit: 10}".to_owned(),
            true,
        ),
        (
            "burst",
            "{unit: second, requests_per_unit: 10}".to_owned(),
            false,
        ),
    ] {
        text.push_str(&format!(
            "  - key: {key}\n    shadow_mode: {shadow}\n    rate_limit: {rate_limit}\n    descriptors:\n      - key: stream_done\n        usage_report: true\n"
        ));
    }
    text
}

/// Envoy's end-of-stream descriptor: `key=value`, then `stream_done`, with
/// the tokens used as its `hits_addend`.
fn report(key: &str, value: &str, tokens: u64) -> RateLimitDescriptor {
    costing(&[(key, value), ("stream_done", "1")], tokens)
}

/// A request-time check of `key=value` of `hits_addend` 0 (Envoy AI
/// Gateway's "cost 0 now, charged at the stream's end"), which counts
/// nothing.
async fn zero_hit(client: &mut Client, key: &str, value: &str) -> RateLimitResponse {
    should(client, request("ai", vec![costing(&[(key, value)], 0)])).await
}

/// What `key=value`'s window has left (a [`zero_hit`] check).
async fn remaining(client: &mut Client, key: &str, value: &str) -> u32 {
    zero_hit(client, key, value).await.statuses[0].limit_remaining
}

/// A [`zero_hit`] check's overall code and its descriptor's remaining.
async fn zero_hit_answer(client: &mut Client, key: &str, value: &str) -> (Code, u32) {
    let r = zero_hit(client, key, value).await;
    (overall(&r), r.statuses[0].limit_remaining)
}

/// One call of `descriptors`: its overall code and each descriptor's.
async fn answer(client: &mut Client, descriptors: Vec<RateLimitDescriptor>) -> (Code, Vec<Code>) {
    let r = should(client, request("ai", descriptors)).await;
    (overall(&r), codes(&r))
}

/// The code of one request-time check of `key=value` (cost 1).
async fn check(client: &mut Client, key: &str, value: &str) -> Code {
    overall(&should(client, request("ai", vec![descriptor(&[(key, value)])])).await)
}

/// The sequence every store runs: `a` serves [`rules`]`(100)`, `wide` the
/// same windows under `rules(1000)` (a change of limit keeps a window), so
/// `wide` reads what `a` recorded past its limit.
async fn reports_count_in_full(a: &mut Client, wide: &mut Client, tenant: &str) {
    let r = should(a, request("ai", vec![descriptor(&[("tenant", tenant)])])).await;
    assert_eq!((overall(&r), r.statuses[0].limit_remaining), (Code::Ok, 99));
    // A check of hits_addend 0 is admitted while a unit is left, and
    // counts nothing.
    for _ in 0..2 {
        assert_eq!(zero_hit_answer(a, "tenant", tenant).await, (Code::Ok, 99));
    }
    // The answer used 130 tokens: recorded in full, 31 past the budget,
    // answered OK with the window's state.
    let r = should(a, request("ai", vec![report("tenant", tenant, 130)])).await;
    assert_eq!((overall(&r), codes(&r)), (Code::Ok, vec![Code::Ok]));
    let status = &r.statuses[0];
    assert_eq!(status.limit_remaining, 0);
    assert_eq!(
        status.current_limit.as_ref().unwrap().requests_per_unit,
        100
    );
    assert_eq!(remaining(wide, "tenant", tenant).await, 1000 - 131);
    // Debt: the next request-time checks are denied, and a denial records
    // nothing.
    for _ in 0..3 {
        assert_eq!(check(a, "tenant", tenant).await, Code::OverLimit);
    }
    assert_eq!(remaining(wide, "tenant", tenant).await, 869);
    // A check of hits_addend 0 is denied too, with the usual answer (the
    // limit, nothing left, how long until a unit fits); beside a
    // descriptor that fits, the call is denied and counts in no window.
    let r = zero_hit(a, "tenant", tenant).await;
    assert_eq!(
        (overall(&r), codes(&r)),
        (Code::OverLimit, vec![Code::OverLimit])
    );
    let status = &r.statuses[0];
    assert_eq!(status.limit_remaining, 0);
    assert_eq!(
        status.current_limit.as_ref().unwrap().requests_per_unit,
        100
    );
    let until = status.duration_until_reset.unwrap();
    assert!((1..=3600).contains(&until.seconds), "{until:?}");
    let model = format!("{tenant}-model");
    let zero_and_model = vec![
        costing(&[("tenant", tenant)], 0),
        descriptor(&[("model", &model)]),
    ];
    assert_eq!(
        answer(a, zero_and_model).await,
        (Code::OverLimit, vec![Code::OverLimit, Code::Ok])
    );
    assert_eq!(remaining(wide, "model", &model).await, 500);
    assert_eq!(remaining(wide, "tenant", tenant).await, 869);
    // Per-descriptor hits_addend, in one call: each report its own usage,
    // two reports of one window add up.
    let r = should(
        a,
        request(
            "ai",
            vec![
                report("tenant", tenant, 7),
                report("model", &model, 11),
                costing(&[("tenant", tenant), ("stream_done", "again")], 2),
            ],
        ),
    )
    .await;
    assert_eq!((overall(&r), codes(&r)), (Code::Ok, vec![Code::Ok; 3]));
    assert_eq!(remaining(wide, "tenant", tenant).await, 869 - 9);
    assert_eq!(remaining(wide, "model", &model).await, 500 - 11);
    // A report of 0 records nothing; one without its own hits_addend
    // records the request's.
    let r = should(a, request("ai", vec![report("model", &model, 0)])).await;
    assert_eq!(
        (overall(&r), r.statuses[0].limit_remaining),
        (Code::Ok, 50 - 11)
    );
    let mut by_request = request(
        "ai",
        vec![descriptor(&[("model", &model), ("stream_done", "1")])],
    );
    by_request.hits_addend = 4;
    assert_eq!(overall(&should(a, by_request).await), Code::Ok);
    assert_eq!(remaining(wide, "model", &model).await, 500 - 15);
    // A report and a check in one call: the report is recorded first, and
    // the check that no longer fits records nothing.
    let mixed = format!("{tenant}-mixed");
    let report_and_check = vec![
        report("tenant", &mixed, 100),
        descriptor(&[("tenant", &mixed)]),
    ];
    assert_eq!(
        answer(a, report_and_check).await,
        (Code::OverLimit, vec![Code::Ok, Code::OverLimit])
    );
    assert_eq!(remaining(wide, "tenant", &mixed).await, 900);
}

/// An rls serving `rules` on `store` in this process — the binary's own
/// service ([`build`](tower_window_examples::rls::build) of its flags) on
/// its HTTP/2 server, on a loopback port —, and a client of it.
async fn in_process(store: Store, rules: &str) -> (tempfile::TempDir, Client) {
    let dir = config_dir(&[("ai.yaml", rules)]);
    let path = dir.path().join("ai.yaml");
    let mut config = RlsArgs::try_parse_from(["rls", "--config", path.to_str().unwrap()])
        .unwrap()
        .into_config()
        .unwrap();
    config.store = store;
    let rls = tower_window_examples::rls::build(config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(tower_window_examples::rls::serve(
        listener,
        rls.service,
        std::future::pending(),
    ));
    let client = RateLimitServiceClient::connect(format!("http://127.0.0.1:{port}"))
        .await
        .unwrap();
    (dir, client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_embedded_store_reports_count_in_full_until_they_slide_out() {
    let clock = ManualClock::new(1_700_000_000_000_000);
    let store = Store::from(MemoryStore::builder().clock(clock.clone()).build());
    let (_a_dir, mut a) = in_process(store.clone(), &rules(100)).await;
    let (_wide_dir, mut wide) = in_process(store, &rules(1000)).await;
    reports_count_in_full(&mut a, &mut wide, "acme").await;
    // The debt counts for the whole window after the report, then slides
    // out with it.
    clock.advance(Duration::from_secs(59 * 60));
    assert_eq!(check(&mut a, "tenant", "acme").await, Code::OverLimit);
    // A check of hits_addend 0 is told when a unit is back: when the
    // report, a whole window ago by then, slides out.
    let r = zero_hit(&mut a, "tenant", "acme").await;
    assert_eq!(overall(&r), Code::OverLimit);
    assert_eq!(
        r.statuses[0].duration_until_reset,
        Some(ProtoDuration {
            seconds: 60,
            nanos: 0
        })
    );
    clock.advance(Duration::from_secs(2 * 60));
    assert_eq!(
        zero_hit_answer(&mut a, "tenant", "acme").await,
        (Code::Ok, 100)
    );
    let r = should(
        &mut a,
        request("ai", vec![descriptor(&[("tenant", "acme")])]),
    )
    .await;
    assert_eq!((overall(&r), r.statuses[0].limit_remaining), (Code::Ok, 99));
    // A limit override: the report counts in the override's window of the
    // entries before `stream_done`, not in the rule's.
    let limited = |mut d: RateLimitDescriptor| {
        d.limit = Some(RateLimitOverride {
            requests_per_unit: 10,
            unit: Unit::Hour as i32,
        });
        d
    };
    let r = should(
        &mut a,
        request("ai", vec![limited(report("tenant", "o", 12))]),
    )
    .await;
    assert_eq!((overall(&r), r.statuses[0].limit_remaining), (Code::Ok, 0));
    let r = should(
        &mut a,
        request("ai", vec![limited(descriptor(&[("tenant", "o")]))]),
    )
    .await;
    assert_eq!(codes(&r), [Code::OverLimit]);
    assert_eq!(remaining(&mut a, "tenant", "o").await, 100);
}

/// A process serving [`rules`]`(limit)` with `extra` flags.
fn start(limit: u32, extra: &[&str]) -> (tempfile::TempDir, RlsProcess) {
    let dir = config_dir(&[("ai.yaml", &rules(limit))]);
    let path = dir.path().join("ai.yaml");
    let mut flags = vec!["--config", path.to_str().unwrap()];
    flags.extend_from_slice(extra);
    let rls = RlsProcess::start(&flags);
    (dir, rls)
}

/// [`reports_count_in_full`] across two nodes on a Redis store (`a` under
/// `rules(100)`, `wide` under `rules(1000)`), then a report past a
/// one-second budget: recorded (nothing left), checks of `hits_addend` 0
/// denied, and the debt slides out on Redis's clock within a bounded wait.
async fn on_redis(store: &[&str]) {
    // A generous time budget: a slow first call (connect, script load) on
    // a loaded machine is not a fallback decision.
    let flags = [
        &["--redis-timeout-ms", "5000", "--fallback", "fail-closed"],
        store,
    ]
    .concat();
    let ((_a_dir, a), (_wide_dir, wide)) = (start(100, &flags), start(1000, &flags));
    let (mut a, mut wide) = (a.client().await, wide.client().await);
    reports_count_in_full(&mut a, &mut wide, "acme").await;
    let r = should(&mut a, request("ai", vec![report("burst", "b", 25)])).await;
    assert_eq!((overall(&r), r.statuses[0].limit_remaining), (Code::Ok, 0));
    assert_eq!(
        zero_hit_answer(&mut a, "burst", "b").await,
        (Code::OverLimit, 0)
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while zero_hit_answer(&mut wide, "burst", "b").await.0 == Code::OverLimit {
        assert!(Instant::now() < deadline, "the debt slides out within 10 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(zero_hit_answer(&mut a, "burst", "b").await, (Code::Ok, 10));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_reports_count_in_full_until_they_slide_out() {
    let redis = RedisServer::start();
    on_redis(&["--redis-url", &redis.url()]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_cluster_reports_count_in_full_until_they_slide_out() {
    let cluster = RedisCluster::shared();
    on_redis(&["--redis-cluster", &cluster.urls().join(",")]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_are_counted_apart_and_compose_with_shadow_quotas() {
    let (_dir, rls) = start(100, &[]);
    let mut client = rls.client().await;
    let series = |name: &str| rls.counter(name);
    let r = should(&mut client, request("ai", vec![report("tenant", "t", 5)])).await;
    assert_eq!(overall(&r), Code::Ok);
    // A report is no admission: its own code and result.
    assert_eq!(
        series("tower_window_rls_requests_total{code=\"usage_report\"}"),
        1
    );
    assert_eq!(
        series("tower_window_rls_descriptors_total{result=\"usage_report\"}"),
        1
    );
    assert_eq!(series("tower_window_rls_requests_total{code=\"ok\"}"), 0);
    assert_eq!(
        series("tower_window_rls_descriptors_total{result=\"ok\"}"),
        0
    );
    // A shadowed budget: the report is recorded past it, its checks are
    // answered OK (counted as shadow denials), and it never stops the
    // request's other windows from counting.
    let r = should(&mut client, request("ai", vec![report("trial", "t", 30)])).await;
    assert_eq!((overall(&r), codes(&r)), (Code::Ok, vec![Code::Ok]));
    let trial_and_tenant = |trial_cost| {
        vec![
            costing(&[("trial", "t")], trial_cost),
            descriptor(&[("tenant", "t")]),
        ]
    };
    // A check of hits_addend 0 on it too: its would-be denial counted, the
    // call admitted, its other window counted.
    for trial_cost in [1, 1, 0] {
        assert_eq!(
            answer(&mut client, trial_and_tenant(trial_cost)).await,
            (Code::Ok, vec![Code::Ok; 2])
        );
    }
    assert_eq!(
        series("tower_window_rls_descriptors_total{result=\"shadow_over_limit\"}"),
        3
    );
    assert_eq!(remaining(&mut client, "tenant", "t").await, 100 - 5 - 3);
    assert_eq!(
        series("tower_window_rls_requests_total{code=\"usage_report\"}"),
        2
    );
    assert_eq!(series("tower_window_rls_requests_total{code=\"ok\"}"), 4);
    // On a spent enforced budget it is a denial in the series too.
    let r = should(&mut client, request("ai", vec![report("tenant", "t", 100)])).await;
    assert_eq!(overall(&r), Code::Ok);
    assert_eq!(
        zero_hit_answer(&mut client, "tenant", "t").await,
        (Code::OverLimit, 0)
    );
    assert_eq!(
        series("tower_window_rls_requests_total{code=\"over_limit\"}"),
        1
    );
    assert_eq!(
        series("tower_window_rls_descriptors_total{result=\"over_limit\"}"),
        1
    );

    // Under --shadow-mode a report is recorded just the same; the check it
    // exhausts keeps its descriptor's code, the overall code is OK.
    let (_dir, shadowed) = start(100, &["--shadow-mode"]);
    let mut client = shadowed.client().await;
    let r = should(&mut client, request("ai", vec![report("tenant", "t", 130)])).await;
    assert_eq!(overall(&r), Code::Ok);
    let r = should(
        &mut client,
        request("ai", vec![descriptor(&[("tenant", "t")])]),
    )
    .await;
    assert_eq!((overall(&r), codes(&r)), (Code::Ok, vec![Code::OverLimit]));
    let r = zero_hit(&mut client, "tenant", "t").await;
    assert_eq!((overall(&r), codes(&r)), (Code::Ok, vec![Code::OverLimit]));
}

/// Waits (at most 15 s) until `rls` counts `n` reloads with `result`.
fn wait_for_reloads(rls: &RlsProcess, result: &str, n: u64) {
    let series = format!("tower_window_config_reload_total{{result=\"{result}\"}}");
    let deadline = Instant::now() + Duration::from_secs(15);
    while rls.counter(&series) < n {
        assert!(
            Instant::now() < deadline,
            "{series} = {n} within 15 s:\n{}",
            rls.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_and_their_debt_survive_a_rules_reload() {
    let (dir, rls) = start(100, &[]);
    let path = dir.path().join("ai.yaml");
    let mut client = rls.client().await;
    let r = should(&mut client, request("ai", vec![report("tenant", "t", 125)])).await;
    assert_eq!(overall(&r), Code::Ok);
    assert_eq!(check(&mut client, "tenant", "t").await, Code::OverLimit);
    // A larger budget: the window, debt included, is kept.
    write_atomically(&path, &rules(200));
    wait_for_reloads(&rls, "ok", 1);
    let r = should(
        &mut client,
        request("ai", vec![descriptor(&[("tenant", "t")])]),
    )
    .await;
    assert_eq!(
        (overall(&r), r.statuses[0].limit_remaining),
        (Code::Ok, 200 - 126)
    );
    // Without the report entry, the same request matches no rule: OK
    // without a limit, nothing recorded.
    write_atomically(
        &path,
        "domain: ai\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 200, name: tokens}\n",
    );
    wait_for_reloads(&rls, "ok", 2);
    let r = should(&mut client, request("ai", vec![report("tenant", "t", 50)])).await;
    assert_eq!(
        (overall(&r), r.statuses[0].current_limit.clone()),
        (Code::Ok, None)
    );
    assert_eq!(remaining(&mut client, "tenant", "t").await, 200 - 126);
    // A report entry with no window to count in refuses the set; the
    // rules in force stay.
    write_atomically(
        &path,
        "domain: ai\ndescriptors:\n  - key: tenant\n    rate_limit: {unlimited: true}\n    descriptors:\n      - key: stream_done\n        usage_report: true\n",
    );
    wait_for_reloads(&rls, "error", 1);
    assert!(
        rls.log()
            .contains("usage_report at 'ai.tenant.stream_done' is under an unlimited rule"),
        "{}",
        rls.log()
    );
    assert_eq!(remaining(&mut client, "tenant", "t").await, 200 - 126);
}

/// The descriptor entries a route's `rate_limit` (envoy.yaml) makes of a
/// request with `x-tenant-id: acme`.
fn entries_of(rate_limit: &serde_norway::Value) -> Vec<(String, String)> {
    let text = |v: &serde_norway::Value| v.as_str().unwrap().to_owned();
    rate_limit["actions"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|action| {
            if let Some(header) = action.get("request_headers") {
                (text(&header["descriptor_key"]), "acme".to_owned())
            } else {
                let generic = &action["generic_key"];
                (
                    text(&generic["descriptor_key"]),
                    text(&generic["descriptor_value"]),
                )
            }
        })
        .collect()
}

/// The checked-in envoy.yaml's token route and config.yaml fit together:
/// its request-time descriptor is checked, its end-of-stream descriptor
/// (tokens from dynamic metadata) is a usage report of the same window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_token_route_reports_into_its_budget() {
    let dir = env!("CARGO_MANIFEST_DIR");
    let envoy: serde_norway::Value =
        serde_norway::from_str(&std::fs::read_to_string(format!("{dir}/rls/envoy.yaml")).unwrap())
            .unwrap();
    let routes = &envoy["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        ["typed_config"]["route_config"]["virtual_hosts"][0]["routes"];
    let route = routes
        .as_sequence()
        .unwrap()
        .iter()
        .find(|r| r["match"]["prefix"].as_str() == Some("/v1/"))
        .unwrap();
    let rate_limits = route["route"]["rate_limits"].as_sequence().unwrap();
    let (done, at_request): (Vec<_>, Vec<_>) = rate_limits
        .iter()
        .partition(|r| r["apply_on_stream_done"].as_bool() == Some(true));
    assert_eq!((done.len(), at_request.len()), (1, 1));
    assert_eq!(
        done[0]["hits_addend"]["format"].as_str(),
        Some("%DYNAMIC_METADATA(io.example.usage:total_tokens)%")
    );
    let cost = at_request[0]["hits_addend"]["number"].as_u64().unwrap();
    let as_descriptor = |rate_limit: &serde_norway::Value, hits: u64| {
        let entries = entries_of(rate_limit);
        let entries: Vec<(&str, &str)> = entries
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        costing(&entries, hits)
    };

    let rls = RlsProcess::start(&["--config", &format!("{dir}/rls/config.yaml")]);
    let mut client = rls.client().await;
    let ask = |hits| request("edge", vec![as_descriptor(at_request[0], hits)]);
    let r = should(&mut client, ask(cost)).await;
    assert_eq!(overall(&r), Code::Ok);
    let budget = r.statuses[0]
        .current_limit
        .as_ref()
        .unwrap()
        .requests_per_unit;
    // The answer used the whole budget and more: recorded, answered OK.
    let tokens = u64::from(budget) + 500;
    let r = should(
        &mut client,
        request("edge", vec![as_descriptor(done[0], tokens)]),
    )
    .await;
    assert_eq!((overall(&r), r.statuses[0].limit_remaining), (Code::Ok, 0));
    assert_eq!(
        rls.counter("tower_window_rls_requests_total{code=\"usage_report\"}"),
        1
    );
    // The next request is denied.
    let r = should(&mut client, ask(cost)).await;
    assert_eq!(codes(&r), [Code::OverLimit]);
}
