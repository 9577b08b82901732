//! The Envoy rate limit service (`--bin rls`, issue 25) on the embedded
//! store, driven by a real tonic client over loopback HTTP/2, built from
//! the same `envoy-types`: rule matching, all-or-nothing decisions, costs,
//! response headers, bad requests as envoyproxy/ratelimit answers them, and
//! the checked-in example config. Counts and values only, never timings.
#![allow(clippy::unwrap_used)]

mod rls_support;

use bytes::{BufMut, Bytes, BytesMut};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use prost::Message as _;
use rls_support::{codes, config_dir, costing, descriptor, overall, request, should, RlsProcess};

const RULES: &str = "
domain: shop
descriptors:
  - key: path
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: path
    value: /login
    rate_limit: {unit: minute, requests_per_unit: 2, name: login}
  - key: path
    value: /api/*
    rate_limit: {unit: minute, requests_per_unit: 50}
  - key: path
    value: /static/*
    rate_limit: {unlimited: true}
  - key: tenant
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 3, name: per-user}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: premium
    rate_limit: {unit: second, requests_per_unit: 1000, replaces: [{name: per-user}]}
  - key: blocked
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 1}
";

fn start(extra: &[&str]) -> (tempfile::TempDir, RlsProcess) {
    let dir = config_dir(&[("shop.yaml", RULES)]);
    let path = dir.path().join("shop.yaml");
    let mut flags = vec!["--config", path.to_str().unwrap()];
    flags.extend_from_slice(extra);
    let rls = RlsProcess::start(&flags);
    (dir, rls)
}

/// `requests_per_unit` of each status' `current_limit` (0: none).
fn limits(
    response: &envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse,
) -> Vec<u32> {
    response
        .statuses
        .iter()
        .map(|s| s.current_limit.as_ref().map_or(0, |l| l.requests_per_unit))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_descriptor_gets_its_most_specific_rule() {
    let (_dir, rls) = start(&[]);
    let mut client = rls.client().await;
    let response = should(
        &mut client,
        request(
            "shop",
            vec![
                descriptor(&[("path", "/login")]),
                descriptor(&[("path", "/api/v1/items")]),
                descriptor(&[("path", "/other")]),
                descriptor(&[("tenant", "acme"), ("user", "ann")]),
                descriptor(&[("tenant", "acme")]),
                descriptor(&[("unknown", "x")]),
            ],
        ),
    )
    .await;
    // Value over wildcard over key-only; nested; no rate_limit on the
    // parent alone; no rule at all.
    assert_eq!(limits(&response), [2, 50, 100, 3, 0, 0]);
    assert_eq!(codes(&response), [Code::Ok; 6]);
    let login = &response.statuses[0];
    let limit = login.current_limit.as_ref().unwrap();
    assert_eq!(
        (limit.name.as_str(), limit.unit),
        ("login", Unit::Minute as i32)
    );
    assert_eq!(login.limit_remaining, 1);
    let reset = login.duration_until_reset.as_ref().unwrap();
    assert!((1..=60).contains(&reset.seconds), "{reset:?}");
    assert_eq!(response.statuses[3].limit_remaining, 2);
    assert_eq!(overall(&response), Code::Ok);

    // Values have windows of their own: bob is untouched by ann.
    let bob = should(
        &mut client,
        request(
            "shop",
            vec![descriptor(&[("tenant", "acme"), ("user", "bob")])],
        ),
    )
    .await;
    assert_eq!(bob.statuses[0].limit_remaining, 2);
    // The login window: one more, then over.
    let mut seen = Vec::new();
    for _ in 0..2 {
        let r = should(
            &mut client,
            request("shop", vec![descriptor(&[("path", "/login")])]),
        )
        .await;
        seen.push((overall(&r), r.statuses[0].limit_remaining));
    }
    assert_eq!(seen, [(Code::Ok, 0), (Code::OverLimit, 0)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlimited_shadow_replaces_and_zero() {
    let (_dir, rls) = start(&[]);
    let mut client = rls.client().await;
    // Unlimited: always OK, u32::MAX remaining, no limit reported.
    for _ in 0..5 {
        let r = should(
            &mut client,
            request("shop", vec![descriptor(&[("path", "/static/app.js")])]),
        )
        .await;
        assert_eq!(codes(&r), [Code::Ok]);
        assert_eq!(r.statuses[0].limit_remaining, u32::MAX);
        assert!(r.statuses[0].current_limit.is_none());
    }
    // Shadow: counted (remaining drops to 0) but never over the limit.
    let mut remaining = Vec::new();
    for _ in 0..3 {
        let r = should(
            &mut client,
            request("shop", vec![descriptor(&[("trial", "t1")])]),
        )
        .await;
        assert_eq!(overall(&r), Code::Ok);
        remaining.push(r.statuses[0].limit_remaining);
    }
    assert_eq!(remaining, [0, 0, 0]);
    assert!(rls.counter("tower_window_rls_descriptors_total{result=\"shadow_over_limit\"}") >= 2);
    // Replaces: premium's rule replaces per-user (no limit, not counted).
    for _ in 0..5 {
        let r = should(
            &mut client,
            request(
                "shop",
                vec![
                    descriptor(&[("tenant", "acme"), ("user", "carl")]),
                    descriptor(&[("premium", "yes")]),
                ],
            ),
        )
        .await;
        assert_eq!(overall(&r), Code::Ok);
        assert_eq!(limits(&r), [0, 1000]);
    }
    let carl = should(
        &mut client,
        request(
            "shop",
            vec![descriptor(&[("tenant", "acme"), ("user", "carl")])],
        ),
    )
    .await;
    assert_eq!(
        carl.statuses[0].limit_remaining, 2,
        "replaced calls were not counted"
    );
    // requests_per_unit 0: always over, and nothing else is counted.
    let r = should(
        &mut client,
        request(
            "shop",
            vec![descriptor(&[("blocked", "x")]), descriptor(&[("a", "z")])],
        ),
    )
    .await;
    assert_eq!(codes(&r), [Code::OverLimit, Code::Ok]);
    assert_eq!(
        r.statuses[1].limit_remaining, 5,
        "a denied request consumes nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn descriptors_are_decided_together() {
    let (_dir, rls) = start(&[]);
    let mut client = rls.client().await;
    let both = || {
        request(
            "shop",
            vec![descriptor(&[("a", "k")]), descriptor(&[("b", "k")])],
        )
    };
    let first = should(&mut client, both()).await;
    assert_eq!(codes(&first), [Code::Ok, Code::Ok]);
    assert_eq!(
        first
            .statuses
            .iter()
            .map(|s| s.limit_remaining)
            .collect::<Vec<_>>(),
        [4, 0]
    );
    // b is full: the request is over the limit and a's window is untouched.
    for _ in 0..3 {
        let r = should(&mut client, both()).await;
        assert_eq!(overall(&r), Code::OverLimit);
        assert_eq!(codes(&r), [Code::Ok, Code::OverLimit]);
        assert_eq!(r.statuses[0].limit_remaining, 4);
    }
    let a = should(
        &mut client,
        request("shop", vec![descriptor(&[("a", "k")])]),
    )
    .await;
    assert_eq!(a.statuses[0].limit_remaining, 3);
    // hits_addend is the cost; a descriptor's own overrides it, 0 counts
    // nothing (admitted while a unit is left).
    let mut costly = request("shop", vec![descriptor(&[("a", "j")])]);
    costly.hits_addend = 3;
    let r = should(&mut client, costly.clone()).await;
    assert_eq!((overall(&r), r.statuses[0].limit_remaining), (Code::Ok, 2));
    let r = should(&mut client, costly).await;
    assert_eq!(
        (overall(&r), r.statuses[0].limit_remaining),
        (Code::OverLimit, 2)
    );
    let read = costing(&[("a", "j")], 0);
    let r = should(&mut client, request("shop", vec![read])).await;
    assert_eq!((overall(&r), r.statuses[0].limit_remaining), (Code::Ok, 2));
}

/// Descriptors with their own, different `hits_addend`s are still decided
/// in one store call: a window that cannot take its cost leaves every
/// other window of the request untouched, which envoyproxy/ratelimit (one
/// counter increment per descriptor) does not do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn descriptors_of_different_costs_are_decided_together() {
    let (_dir, rls) = start(&[]);
    let mut client = rls.client().await;
    let remaining = |r: &RateLimitResponse| {
        r.statuses
            .iter()
            .map(|s| s.limit_remaining)
            .collect::<Vec<_>>()
    };
    // a: 5 a minute, one per request; /api/*: 50 a minute, 30 per request.
    let both = |api_cost| {
        request(
            "shop",
            vec![
                costing(&[("a", "mixed")], 1),
                costing(&[("path", "/api/v")], api_cost),
            ],
        )
    };
    let r = should(&mut client, both(30)).await;
    assert_eq!((overall(&r), remaining(&r)), (Code::Ok, vec![4, 20]));
    // 30 more do not fit the 20 left: over the limit, and a is not counted.
    for _ in 0..3 {
        let r = should(&mut client, both(30)).await;
        assert_eq!(codes(&r), [Code::Ok, Code::OverLimit]);
        assert_eq!(remaining(&r), [4, 20], "a denial counts in no window");
    }
    let r = should(&mut client, both(20)).await;
    assert_eq!((overall(&r), remaining(&r)), (Code::Ok, vec![3, 0]));
    // One window named twice is counted once, at the larger cost; a
    // descriptor of cost 0 beside them counts nothing in its window.
    let r = should(
        &mut client,
        request(
            "shop",
            vec![
                costing(&[("a", "twice")], 2),
                costing(&[("a", "twice")], 4),
                costing(&[("a", "mixed")], 0),
            ],
        ),
    )
    .await;
    assert_eq!((overall(&r), remaining(&r)), (Code::Ok, vec![1, 1, 3]));
}

/// `--grpc-server tonic` serves the same service with tonic's server:
/// the same sequence of calls (admissions, denials, costs, bad requests)
/// gets the same answers from both servers, each on its own store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tonic_server_answers_as_the_default_one() {
    let (_dir, h2) = start(&[]);
    let (_dir2, tonic) = start(&["--grpc-server", "tonic"]);
    assert!(h2.log().contains("server=H2"), "{}", h2.log());
    assert!(tonic.log().contains("server=Tonic"), "{}", tonic.log());
    let mut clients = [h2.client().await, tonic.client().await];
    let calls = vec![
        request("shop", vec![descriptor(&[("path", "/login")])]),
        request("shop", vec![descriptor(&[("path", "/login")])]),
        request("shop", vec![descriptor(&[("path", "/login")])]),
        request(
            "shop",
            vec![
                costing(&[("a", "t")], 2),
                costing(&[("path", "/api/t")], 49),
            ],
        ),
        request(
            "shop",
            vec![costing(&[("a", "t")], 2), costing(&[("path", "/api/t")], 2)],
        ),
        request("shop", vec![descriptor(&[("path", "/static/x")])]),
        request("nowhere", vec![descriptor(&[("a", "t")])]),
        request("", vec![descriptor(&[("a", "t")])]),
        request("shop", vec![]),
    ];
    let mut over = 0;
    for (i, call) in calls.into_iter().enumerate() {
        let mut answers = Vec::new();
        for client in &mut clients {
            let answer = client
                .should_rate_limit(call.clone())
                .await
                .map(|r| {
                    let r = r.into_inner();
                    let statuses: Vec<(i32, u32)> = r
                        .statuses
                        .iter()
                        .map(|s| (s.code, s.limit_remaining))
                        .collect();
                    (r.overall_code, statuses)
                })
                .map_err(|status| (status.code(), status.message().to_owned()));
            answers.push(answer);
        }
        assert_eq!(answers[0], answers[1], "call {i}: h2, then tonic");
        over +=
            usize::from(matches!(&answers[0], Ok((code, _)) if *code == Code::OverLimit as i32));
    }
    assert_eq!(
        over, 2,
        "the third /login call and the 2 + 2 after 49 of 50"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_headers_name_the_binding_descriptor() {
    let (_dir, rls) = start(&["--response-headers"]);
    let mut client = rls.client().await;
    let r = should(
        &mut client,
        request(
            "shop",
            vec![descriptor(&[("a", "h")]), descriptor(&[("path", "/login")])],
        ),
    )
    .await;
    let headers: Vec<(String, String)> = r
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.clone(), h.value.clone()))
        .collect();
    assert_eq!(headers[0], ("RateLimit-Limit".to_owned(), "2".to_owned()));
    assert_eq!(
        headers[1],
        ("RateLimit-Remaining".to_owned(), "1".to_owned())
    );
    assert_eq!(headers[2].0, "RateLimit-Reset");
    assert!(r.request_headers_to_add.is_empty());
    let reset: u64 = headers[2].1.parse().unwrap();
    assert!((1..=60).contains(&reset), "{reset}");
    // Without the flag: none.
    let (_dir2, plain) = start(&[]);
    let mut client = plain.client().await;
    let r = should(
        &mut client,
        request("shop", vec![descriptor(&[("a", "h")])]),
    )
    .await;
    assert!(r.response_headers_to_add.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_answered_as_envoyproxy_ratelimit_answers_them() {
    let (_dir, rls) = start(&[]);
    let mut client = rls.client().await;
    let empty_domain = client
        .should_rate_limit(request("", vec![descriptor(&[("a", "x")])]))
        .await
        .unwrap_err();
    assert_eq!(empty_domain.code(), tonic::Code::Unknown);
    assert_eq!(
        empty_domain.message(),
        "rate limit domain must not be empty"
    );
    let no_descriptors = client
        .should_rate_limit(request("shop", Vec::new()))
        .await
        .unwrap_err();
    assert_eq!(no_descriptors.code(), tonic::Code::Unknown);
    assert_eq!(
        no_descriptors.message(),
        "rate limit descriptor list must not be empty"
    );
    // Unknown domain: OK, no limit. An empty descriptor: OK, no limit.
    let r = should(
        &mut client,
        request("nowhere", vec![descriptor(&[("a", "x")])]),
    )
    .await;
    assert_eq!((overall(&r), limits(&r)), (Code::Ok, vec![0]));
    let r = should(
        &mut client,
        request("shop", vec![descriptor(&[]), descriptor(&[("a", "e")])]),
    )
    .await;
    assert_eq!((overall(&r), limits(&r)), (Code::Ok, vec![0, 5]));
    assert_eq!(
        rls.counter("tower_window_rls_requests_total{code=\"error\"}"),
        2
    );
    // The service still answers.
    let r = should(
        &mut client,
        request("shop", vec![descriptor(&[("a", "x")])]),
    )
    .await;
    assert_eq!(overall(&r), Code::Ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checked_in_example_config_serves() {
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/rls/config.yaml");
    let rls = RlsProcess::start(&["--config", config]);
    let mut client = rls.client().await;
    let r = should(
        &mut client,
        request(
            "edge",
            vec![
                descriptor(&[("remote_address", "10.0.0.1")]),
                descriptor(&[("path", "/login")]),
                descriptor(&[("path", "/static/a.css")]),
                descriptor(&[("tenant", "acme"), ("user", "ann")]),
                descriptor(&[("tenant", "acme"), ("plan", "trial")]),
                descriptor(&[("api_key", "premium")]),
            ],
        ),
    )
    .await;
    assert_eq!(overall(&r), Code::Ok);
    // per-user is replaced by the premium key's rule.
    assert_eq!(limits(&r), [60, 5, 0, 0, 1000, 1000]);
}

#[test]
fn a_broken_config_is_refused_at_start() {
    let dir = config_dir(&[("bad.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")]);
    let path = dir.path().join("bad.yaml");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_rls"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--config",
            path.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("bad.yaml: invalid rate limit unit 'fortnight'"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_rls_exports_its_dashboard_row_at_zero() {
    let (_dir, rls) = start(&[]);
    let body = rls.metrics();
    // Every `tower_window_rls_*` selector of the dashboard, with its
    // labels, has a series before any call, at zero.
    let dashboard = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/grafana/tower-window.json"
    ))
    .unwrap();
    let mut selectors = 0;
    for (i, _) in dashboard.match_indices("tower_window_rls_") {
        let tail = &dashboard[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap();
        let name = &tail[..end];
        let label = tail[end..]
            .strip_prefix("{")
            .and_then(|rest| rest.split('}').next())
            .map(|l| l.replace("\\\"", "\""));
        // `label="v"` needs that series; `label!="v"` one of the others.
        let matches = |line: &str, l: &str| match l.split_once("!=") {
            Some((label, value)) => !line.contains(&format!("{label}={value}")),
            None => line.contains(l),
        };
        let found = body.lines().any(|line| {
            line.starts_with(&format!("{name}{{"))
                && label.as_deref().is_none_or(|l| matches(line, l))
                && line.ends_with(" 0")
        });
        assert!(found, "{name} {label:?} not at zero in:\n{body}");
        selectors += 1;
    }
    assert!(selectors >= 4, "{selectors}");
    // Each rule's quota is registered for the rows above (by quota).
    assert!(body.contains("quota=\"login\""), "{body}");
    // Then a call counts.
    let mut client = rls.client().await;
    let _ = should(
        &mut client,
        request("shop", vec![descriptor(&[("a", "m")])]),
    )
    .await;
    assert_eq!(
        rls.counter("tower_window_rls_requests_total{code=\"ok\"}"),
        1
    );
    assert_eq!(
        rls.counter("tower_window_rls_descriptors_total{result=\"ok\"}"),
        1
    );
}

#[test]
fn the_example_envoy_config_fits_the_example_rules() {
    use clap::Parser as _;
    use serde_norway::Value;
    let dir = env!("CARGO_MANIFEST_DIR");
    let envoy: Value =
        serde_norway::from_str(&std::fs::read_to_string(format!("{dir}/rls/envoy.yaml")).unwrap())
            .unwrap();
    let rules: Value =
        serde_norway::from_str(&std::fs::read_to_string(format!("{dir}/rls/config.yaml")).unwrap())
            .unwrap();
    // Every value of `field` anywhere in `value`.
    fn all<'a>(value: &'a Value, field: &str, out: &mut Vec<&'a Value>) {
        match value {
            Value::Mapping(map) => {
                for (k, v) in map {
                    if k.as_str() == Some(field) {
                        out.push(v);
                    }
                    all(v, field, out);
                }
            }
            Value::Sequence(items) => items.iter().for_each(|v| all(v, field, out)),
            _ => {}
        }
    }
    let mut domains = Vec::new();
    all(&envoy, "domain", &mut domains);
    assert_eq!(domains, [&rules["domain"]]);
    // The rls cluster points at the rls's default --listen.
    let default =
        tower_window_examples::rls::RlsArgs::try_parse_from(["rls", "--config", "x"]).unwrap();
    let mut ports = Vec::new();
    all(&envoy, "port_value", &mut ports);
    assert_eq!(
        ports.last().unwrap().as_u64(),
        Some(u64::from(default.listen.port()))
    );
    // Every descriptor key the routes send has a rule key in config.yaml.
    let mut sent = Vec::new();
    all(&envoy, "descriptor_key", &mut sent);
    let mut sent: Vec<&str> = sent.iter().filter_map(|v| v.as_str()).collect();
    let mut actions = Vec::new();
    all(&envoy, "remote_address", &mut actions);
    if !actions.is_empty() {
        sent.push("remote_address");
    }
    let mut keys = Vec::new();
    all(&rules, "key", &mut keys);
    let keys: Vec<&str> = keys.iter().filter_map(|v| v.as_str()).collect();
    assert!(sent.len() >= 5, "{sent:?}");
    for key in sent {
        assert!(
            keys.contains(&key),
            "envoy.yaml sends {key}, config.yaml has no rule for it"
        );
    }
}

/// One call as raw HTTP/2 (the `h2` client): `body` sent in the given
/// pieces, each its own DATA frame. Returns the response's headers, its
/// data and its trailers (`None`: a trailers-only answer).
async fn raw_call(
    port: u16,
    path: &str,
    extra: &[(&str, &str)],
    pieces: &[&[u8]],
) -> (http::HeaderMap, Bytes, Option<http::HeaderMap>) {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut client = client.ready().await.unwrap();
    let mut request = http::Request::post(format!("http://127.0.0.1:{port}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (name, value) in extra {
        request = request.header(*name, *value);
    }
    let (response, mut send) = client
        .send_request(request.body(()).unwrap(), false)
        .unwrap();
    // The server may answer an error before it reads the body (a wrong
    // path, an encoding it does not offer): the stream is then closed and
    // the rest of the body has nowhere to go, which is not this test's
    // concern; the answer below is.
    for (i, piece) in pieces.iter().enumerate() {
        if send
            .send_data(Bytes::copy_from_slice(piece), i + 1 == pieces.len())
            .is_err()
        {
            break;
        }
    }
    if pieces.is_empty() {
        let _ = send.send_data(Bytes::new(), true);
    }
    let response = tokio::time::timeout(std::time::Duration::from_secs(10), response)
        .await
        .expect("an answer within 10 s")
        .unwrap();
    let (head, mut body) = response.into_parts();
    assert_eq!(head.status, http::StatusCode::OK);
    let mut data = BytesMut::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        let _ = body.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(&chunk);
    }
    let trailers = body.trailers().await.unwrap();
    (head.headers, data.freeze(), trailers)
}

/// A message in its gRPC frame.
fn framed(message: &[u8]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(5 + message.len());
    frame.put_u8(0);
    frame.put_u32(u32::try_from(message.len()).unwrap());
    frame.extend_from_slice(message);
    frame
}

fn grpc_status(headers: &http::HeaderMap) -> &str {
    headers.get("grpc-status").unwrap().to_str().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grpc_server_answers_raw_http2_calls_as_tonic_did() {
    let (_dir, rls) = start(&[]);
    let port = rls.port();
    let method = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
    let good = framed(&request("shop", vec![descriptor(&[("a", "raw")])]).encode_to_vec());

    // A good call, its message in one DATA frame, then split over three.
    for pieces in [vec![&good[..]], vec![&good[..2], &good[2..7], &good[7..]]] {
        let (headers, data, trailers) = raw_call(port, method, &[], &pieces).await;
        assert_eq!(headers.get("content-type").unwrap(), "application/grpc");
        assert_eq!(grpc_status(&trailers.unwrap()), "0");
        assert_eq!(data[0], 0);
        let length = u32::from_be_bytes([data[1], data[2], data[3], data[4]]) as usize;
        assert_eq!(data.len(), 5 + length);
        let response = RateLimitResponse::decode(data.slice(5..)).unwrap();
        assert_eq!(overall(&response), Code::Ok);
        assert_eq!(limits(&response), vec![5]);
    }
    // Errors come trailers-only: the status in the headers, no data.
    // (path, extra headers, body, grpc-status)
    type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a [u8], &'a str);
    let cases: [Case<'_>; 6] = [
        // Another method of the service, or of another service.
        (
            "/envoy.service.ratelimit.v3.RateLimitService/Other",
            &[],
            &good,
            "12",
        ),
        ("/grpc.health.v1.Health/Check", &[], b"\0\0\0\0\0", "12"),
        // Compression is not offered.
        (method, &[("grpc-encoding", "gzip")], &good, "12"),
        // The compressed flag without an encoding; a cut frame; not protobuf.
        (method, &[], b"\x01\0\0\0\0", "13"),
        (method, &[], b"\0\0\0\0\x09abc", "13"),
        (method, &[], b"\0\0\0\0\x02\xff\xff", "13"),
    ];
    for (path, extra, body, status) in cases {
        let (headers, data, trailers) = raw_call(port, path, extra, &[body]).await;
        assert_eq!(grpc_status(&headers), status, "{path} {extra:?} {body:?}");
        assert!(data.is_empty() && trailers.is_none(), "{path} {body:?}");
    }
    // No body at all.
    let (headers, _, _) = raw_call(port, method, &[], &[]).await;
    assert_eq!(grpc_status(&headers), "13");

    // Many calls in flight on one connection (tonic multiplexes them).
    let client = rls.client().await;
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..300 {
        let mut client = client.clone();
        calls.spawn(async move {
            let value = format!("many-{}", i % 7);
            should(
                &mut client,
                request("nowhere", vec![descriptor(&[("a", &value)])]),
            )
            .await
        });
    }
    let mut answered = 0;
    while let Some(response) = calls.join_next().await {
        assert_eq!(overall(&response.unwrap()), Code::Ok);
        answered += 1;
    }
    assert_eq!(answered, 300);
}
