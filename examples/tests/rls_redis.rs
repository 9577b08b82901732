//! Two `rls` nodes on one real `redis-server`, and on the real 3-primary
//! Redis Cluster, enforce each descriptor's limit exactly: with and without
//! quota leases, sequentially and with concurrent calls spread over both
//! nodes, and with several descriptors decided together. On the cluster,
//! every key of a domain carries the domain's hash tag (one slot).
#![allow(clippy::unwrap_used)]

mod rls_support;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use rls_support::{codes, config_dir, costing, descriptor, overall, request, should, RlsProcess};
use tower_window_tests::redis_cluster::{query, RedisCluster};
use tower_window_tests::redis_server::RedisServer;

const RULES: &str = "
domain: exact
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 7}
  - key: org
    rate_limit: {unit: hour, requests_per_unit: 20}
  - key: fixed
    rate_limit: {unit: hour, requests_per_unit: 4, algorithm: fixed-window}
";

/// Two nodes on `store` (the flags naming it), the generous time budget
/// keeping a slow first call (connect, script load) on a loaded machine
/// from turning into a fallback decision.
fn two_nodes(store: &[&str], extra: &[&str]) -> (tempfile::TempDir, RlsProcess, RlsProcess) {
    let dir = config_dir(&[("exact.yaml", RULES)]);
    let path = dir.path().join("exact.yaml");
    let mut flags = vec![
        "--config",
        path.to_str().unwrap(),
        "--redis-timeout-ms",
        "5000",
        "--fallback",
        "fail-closed",
    ];
    flags.extend_from_slice(store);
    flags.extend_from_slice(extra);
    let a = RlsProcess::start(&flags);
    let b = RlsProcess::start(&flags);
    (dir, a, b)
}

/// Sends `total` calls for `entries`, alternating between the nodes, and
/// counts the admitted ones; then the same many again concurrently (8 at a
/// time per node) for another value, and counts those.
async fn admitted(a: &RlsProcess, b: &RlsProcess, key: &str, total: usize) -> (usize, usize) {
    let mut clients = [a.client().await, b.client().await];
    let mut sequential = 0;
    for i in 0..total {
        let r = should(
            &mut clients[i % 2],
            request("exact", vec![descriptor(&[(key, "seq")])]),
        )
        .await;
        if overall(&r) == Code::Ok {
            sequential += 1;
        }
    }
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..total {
        let mut client = clients[i % 2].clone();
        let key = key.to_owned();
        tasks.spawn(async move {
            let r = should(
                &mut client,
                request("exact", vec![descriptor(&[(&key, "par")])]),
            )
            .await;
            overall(&r) == Code::Ok
        });
    }
    let mut concurrent = 0;
    while let Some(ok) = tasks.join_next().await {
        concurrent += usize::from(ok.unwrap());
    }
    (sequential, concurrent)
}

/// Sends `calls` requests concurrently over both nodes, each spending 1 of
/// `user=<user>` and `org_cost` of `org=<org>` (descriptors' own
/// `hits_addend`s); returns how many were admitted and what each window
/// has left afterwards (read with a cost-0 call).
async fn mixed_costs(
    a: &RlsProcess,
    b: &RlsProcess,
    (user, org): (&str, &str),
    org_cost: u64,
    calls: usize,
) -> (usize, u32, u32) {
    let clients = [a.client().await, b.client().await];
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..calls {
        let mut client = clients[i % 2].clone();
        let both = vec![
            costing(&[("user", user)], 1),
            costing(&[("org", org)], org_cost),
        ];
        tasks.spawn(async move {
            let r = should(&mut client, request("exact", both)).await;
            overall(&r) == Code::Ok
        });
    }
    let mut admitted = 0;
    while let Some(ok) = tasks.join_next().await {
        admitted += usize::from(ok.unwrap());
    }
    let read = vec![costing(&[("user", user)], 0), costing(&[("org", org)], 0)];
    let r = should(&mut clients[0].clone(), request("exact", read)).await;
    (
        admitted,
        r.statuses[0].limit_remaining,
        r.statuses[1].limit_remaining,
    )
}

async fn exact_across_nodes(a: &RlsProcess, b: &RlsProcess) {
    // Costs 1 and 3 in one call: org (20) admits 6; user (7) is spent only
    // with them, never on the calls org denies.
    assert_eq!(
        mixed_costs(a, b, ("mixed", "mixed"), 3, 12).await,
        (6, 1, 2)
    );
    assert_eq!(admitted(a, b, "user", 30).await, (7, 7));
    assert_eq!(admitted(a, b, "fixed", 30).await, (4, 4));
    // Two descriptors together: org (20) is never spent past user's 7 on
    // the requests user denies.
    let mut clients = [a.client().await, b.client().await];
    let mut results = Vec::new();
    for i in 0..10 {
        let r = should(
            &mut clients[i % 2],
            request(
                "exact",
                vec![
                    descriptor(&[("user", "both")]),
                    descriptor(&[("org", "both")]),
                ],
            ),
        )
        .await;
        results.push(codes(&r));
    }
    assert_eq!(
        results
            .iter()
            .filter(|c| c[..] == [Code::Ok, Code::Ok])
            .count(),
        7
    );
    assert_eq!(
        results
            .iter()
            .filter(|c| c[..] == [Code::OverLimit, Code::Ok])
            .count(),
        3
    );
    let org = should(
        &mut clients[0],
        request("exact", vec![descriptor(&[("org", "both")])]),
    )
    .await;
    assert_eq!(
        org.statuses[0].limit_remaining, 12,
        "20 - 7 admitted - this one"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_on_one_redis_enforce_exact_limits() {
    let redis = RedisServer::start();
    let url = redis.url();
    let (_dir, a, b) = two_nodes(&["--redis-url", &url], &[]);
    exact_across_nodes(&a, &b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_with_leases_on_one_redis_enforce_exact_limits() {
    let redis = RedisServer::start();
    let url = redis.url();
    let (_dir, a, b) = two_nodes(&["--redis-url", &url], &["--lease", "3"]);
    // Never above the limit; a node's unspent lease (at most 3 units) may
    // leave the other short of it until the lease ends.
    for (key, limit) in [("user", 7), ("fixed", 4)] {
        let (sequential, concurrent) = admitted(&a, &b, key, 30).await;
        for n in [sequential, concurrent] {
            assert!(n <= limit && n + 3 >= limit, "{key}: {n} of {limit}");
        }
    }
    // Only a key checked `DEFAULT_HOT_CHECKS` times within a lease TTL
    // leases (the keys above turn cold once their denials are remembered
    // locally): 15 quick calls on one node make this one hot.
    let mut client = a.client().await;
    for i in 0..15 {
        let r = should(
            &mut client,
            request("exact", vec![descriptor(&[("org", "hot")])]),
        )
        .await;
        assert_eq!(overall(&r), Code::Ok, "org call {i} of 15 (limit 20)");
    }
    // The leases were used: units were granted and spent locally.
    let granted: f64 = [&a, &b]
        .iter()
        .flat_map(|node| {
            node.metrics()
                .lines()
                .filter(|l| {
                    l.starts_with("tower_window_lease_units_total{")
                        && l.contains("event=\"granted\"")
                })
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .collect::<Vec<_>>()
        })
        .sum();
    assert!(granted >= 2.0, "lease units granted: {granted}");
    // Calls whose descriptors cost differently skip the leases and go to
    // Redis, which counts the units node a holds: never past org's 20, and
    // user spent only with what org admitted.
    let (n, user_left, org_left) = mixed_costs(&a, &b, ("with-lease", "hot"), 2, 10).await;
    // (a's lease may hold all 5 units left: a sliding-log-only policy
    // leases its whole room.)
    assert!(n <= 2, "15 + 2 x {n} past 20");
    assert_eq!(user_left, 7 - n as u32, "user spent once per admitted call");
    assert!(org_left <= 5 - 2 * n as u32, "org left {org_left}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_on_the_cluster_enforce_exact_limits_in_one_slot() {
    let cluster = RedisCluster::shared();
    let urls = cluster.urls().join(",");
    let (_dir, a, b) = two_nodes(&["--redis-cluster", &urls], &[]);
    exact_across_nodes(&a, &b).await;
    // Every key the rls wrote for the domain carries its tag `{@exact}`.
    let mut keys: Vec<String> = Vec::new();
    for node in cluster.nodes() {
        let found: Vec<String> = query(node, &["KEYS", "*exact*"]).unwrap();
        keys.extend(found);
    }
    assert!(keys.len() >= 6, "{keys:?}");
    assert!(keys.iter().all(|k| k.contains("{@exact}")), "{keys:?}");
}

/// When Redis cannot decide, each node answers by its `--fallback`:
/// `fail-open` admits, `fail-closed` answers `OVER_LIMIT`, and `local`
/// admits up to its share of the limit (`limit / --expected-nodes`), then
/// `OVER_LIMIT`. Envoy's own `failure_mode_deny` only sees the error a
/// node could not answer at all, which none of these is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_failure_follows_the_fallback_policy() {
    let mut redis = RedisServer::start();
    let url = redis.url();
    let dir = config_dir(&[("exact.yaml", RULES)]);
    let path = dir.path().join("exact.yaml");
    let node = |fallback: &str| {
        RlsProcess::start(&[
            "--config",
            path.to_str().unwrap(),
            "--redis-url",
            &url,
            "--redis-timeout-ms",
            "500",
            "--fallback",
            fallback,
            "--expected-nodes",
            "2",
        ])
    };
    let nodes = [node("fail-open"), node("fail-closed"), node("local")];
    let mut clients = Vec::new();
    for rls in &nodes {
        let mut client = rls.client().await;
        // Redis decides while it is up.
        let r = should(
            &mut client,
            request("exact", vec![descriptor(&[("user", "up")])]),
        )
        .await;
        assert_eq!(overall(&r), Code::Ok);
        clients.push(client);
    }
    redis.stop();
    let mut admitted = Vec::new();
    for client in &mut clients {
        let mut ok = 0;
        for _ in 0..10 {
            let r = should(
                client,
                request("exact", vec![descriptor(&[("user", "down")])]),
            )
            .await;
            ok += usize::from(overall(&r) == Code::Ok);
        }
        admitted.push(ok);
    }
    // user: 7 an hour; the local share of one of 2 nodes is at most 4.
    assert_eq!((admitted[0], admitted[1]), (10, 0), "{admitted:?}");
    assert!((1..=4).contains(&admitted[2]), "local: {admitted:?}");
    // The degraded decisions are counted as such.
    let fallbacks = nodes[1]
        .metrics()
        .lines()
        .filter(|l| l.starts_with("tower_window_fallback_decisions_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>();
    assert!(fallbacks >= 10.0, "fail-closed fallbacks: {fallbacks}");
}
