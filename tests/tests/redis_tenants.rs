//! The tenant registry on real Redis: lifecycle changes seen by every node
//! (each registry with its own connections), late and cut-off nodes,
//! atomicity of a tenant's policy across nodes, and tenant isolation.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use tower_window::tenant::{
    ControlConfig, Resolution, TenantError, TenantRegistry, TenantSource, TenantSpec, TenantsConfig,
};
use tower_window::{
    BreakerConfig, BreakerState, Limiter, Policy, RedisStore, Store, StoreErrorKind, WindowKey,
};
use tower_window_tests::fault_proxy::{FaultProxy, Mode};
use tower_window_tests::redis_server::RedisServer;

/// A store on the single server at `url`, under `prefix`.
fn single(url: &str, prefix: &str) -> Arc<RedisStore> {
    Arc::new(
        RedisStore::builder()
            .url(url)
            .prefix(prefix)
            .build()
            .unwrap(),
    )
}

/// A prefix no other test or run uses.
fn prefix(test: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("tenants:{test}:{}:{nanos}:", std::process::id())
}

fn spec(quotas: &[(&str, &str)]) -> TenantSpec {
    let mut builder = TenantSpec::builder();
    for (name, dsl) in quotas {
        builder = builder.quota(name, dsl).unwrap();
    }
    builder.build().unwrap()
}

fn file() -> TenantsConfig {
    TenantsConfig::new()
        .with_tenant("acme", spec(&[("burst", "2/1m")]))
        .unwrap()
        .with_tenant("trial", spec(&[("minute", "5/1m")]))
        .unwrap()
}

/// One node: its own store (own connections) and its registry on it.
struct Node {
    registry: TenantRegistry,
    limiter: Limiter,
}

async fn node(url: &str, prefix: &str, config: TenantsConfig) -> Node {
    let store = single(url, prefix);
    let registry = TenantRegistry::redis(config, Arc::clone(&store));
    let limiter = Limiter::builder(store, "1000/1m".parse::<tower_window::Quota>().unwrap())
        .local_capacity(1000)
        .build();
    tokio::time::timeout(Duration::from_secs(10), registry.loaded())
        .await
        .expect("the registry loads its state");
    Node { registry, limiter }
}

impl Node {
    fn policy(&self, tenant: &str) -> Policy {
        match self.registry.resolve(tenant.as_bytes()) {
            Resolution::Limited(policy) => policy,
            other => panic!("{tenant}: {other:?}"),
        }
    }

    async fn check(&self, tenant: &str, subject: &str) -> bool {
        let key = WindowKey::new(tenant.to_owned(), subject.to_owned());
        let policy = self.policy(tenant);
        self.limiter
            .check_policy(&key, &policy, 1)
            .await
            .unwrap()
            .allowed()
    }
}

/// Polls `done` every 5 ms, at most 2000 times (bounded; how fast a
/// change propagates is measured by the `tenant_reset` bench, not here).
async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..2000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("never: {what}");
}

fn generation(node: &Node, tenant: &str) -> Option<u64> {
    node.registry.effective(tenant).map(|t| t.generation)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_and_close_on_one_node_reach_the_other() {
    let redis = RedisServer::shared();
    let prefix = prefix("reach");
    let a = node(&redis.url(), &prefix, file()).await;
    let b = node(&redis.url(), &prefix, file()).await;
    // acme's window fills up, on B (and its local tier remembers the denial).
    assert!(b.check("acme", "alice").await);
    assert!(b.check("acme", "alice").await);
    assert!(!b.check("acme", "alice").await);
    assert!(!b.check("acme", "alice").await);
    assert!(!a.check("acme", "alice").await, "one window for both nodes");

    assert!(a.registry.reset("acme").await.unwrap());
    assert_eq!(generation(&a, "acme"), Some(1));
    eventually("B sees the reset", || generation(&b, "acme") == Some(1)).await;
    assert!(b.check("acme", "alice").await, "every window starts afresh");
    assert!(a.check("acme", "alice").await);
    assert!(!b.check("acme", "alice").await);

    assert!(a.registry.close("acme").await.unwrap());
    eventually("B sees the close", || {
        b.registry.resolve(b"acme") == Resolution::Unknown
    })
    .await;
    assert!(b.registry.tenant("acme").is_none());

    a.registry
        .init("newco", spec(&[("burst", "3/1m")]))
        .await
        .unwrap();
    eventually("B sees the init", || b.registry.tenant("newco").is_some()).await;
    let newco = b.registry.tenant("newco").unwrap();
    assert_eq!(newco.source, TenantSource::Runtime);
    assert_eq!(newco.spec, spec(&[("burst", "3/1m")]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_started_later_sees_the_changes() {
    let redis = RedisServer::shared();
    let prefix = prefix("later");
    let a = node(&redis.url(), &prefix, file()).await;
    a.registry
        .init("newco", spec(&[("burst", "3/1m")]))
        .await
        .unwrap();
    a.registry.reset("acme").await.unwrap();
    a.registry.reset("acme").await.unwrap();
    a.registry.close("trial").await.unwrap();
    // Runtime wins over the file, whatever the later node's file says.
    let other_file = file()
        .with_tenant("newco", spec(&[("burst", "99/1m")]))
        .unwrap();
    let c = node(&redis.url(), &prefix, other_file).await;
    assert_eq!(
        c.registry.tenant("newco").unwrap().spec,
        spec(&[("burst", "3/1m")])
    );
    assert_eq!(generation(&c, "acme"), Some(2));
    assert_eq!(c.registry.resolve(b"trial"), Resolution::Unknown);
    assert_eq!(c.policy("acme"), a.policy("acme"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_node_catches_up_and_a_trimmed_one_reloads() {
    let redis = RedisServer::shared();
    let prefix = prefix("cut");
    let proxy = FaultProxy::start(redis.addr().parse().unwrap())
        .await
        .unwrap();
    let a = node(&redis.url(), &prefix, file()).await;
    let b = node(&proxy.redis_url(), &prefix, file()).await;
    assert_eq!(b.registry.loads(), 1);

    // Cut B off; A changes things meanwhile.
    proxy.set_mode(Mode::Refuse);
    a.registry.reset("acme").await.unwrap();
    a.registry.close("trial").await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(generation(&b, "acme"), Some(0), "B cannot have heard");
    assert!(b.registry.tenant("trial").is_some());
    proxy.set_mode(Mode::PassThrough);
    eventually("B catches up", || {
        generation(&b, "acme") == Some(1) && b.registry.tenant("trial").is_none()
    })
    .await;
    assert_eq!(
        b.registry.loads(),
        1,
        "caught up from the stream, no reload"
    );

    // Cut off again while the stream is trimmed far past B's position.
    let small = ControlConfig::default().max_len(1);
    let store = single(&redis.url(), &prefix);
    let trimmer = TenantRegistry::redis_with(file(), store, small);
    trimmer.loaded().await;
    proxy.set_mode(Mode::Refuse);
    for _ in 0..250 {
        trimmer.reset("acme").await.unwrap();
    }
    proxy.set_mode(Mode::PassThrough);
    eventually("B reloads the trimmed state", || {
        generation(&b, "acme") == Some(251)
    })
    .await;
    assert_eq!(
        b.registry.loads(),
        2,
        "a trimmed position reloads everything"
    );
}

/// A lifecycle write goes through its store's resilience stack, like
/// every other capability's calls: while Redis hangs each write ends with
/// the store's budget and counts as a failure of the store's breaker, and
/// once that is open the writes fail at once with `CircuitOpen`, changing
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_writes_go_through_the_stores_budget_and_breakers() {
    const TRIP: u32 = 3;
    let redis = RedisServer::shared();
    let prefix = prefix("breaker");
    let proxy = FaultProxy::start(redis.addr().parse().unwrap())
        .await
        .unwrap();
    let redis_store = RedisStore::builder()
        .url(proxy.redis_url())
        .prefix(&prefix)
        .connect_timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let store = Store::builder(redis_store)
        .timeout(Duration::from_millis(100))
        .breaker(
            BreakerConfig::default()
                .consecutive_failures(TRIP)
                .without_failure_ratio()
                .cooldown(Duration::from_secs(600)),
        )
        .build();
    let registry = TenantRegistry::on_store(file(), &store);
    tokio::time::timeout(Duration::from_secs(10), registry.loaded())
        .await
        .expect("the registry loads its state");
    assert!(registry.reset("acme").await.unwrap());
    assert_eq!(registry.tenant("acme").unwrap().generation, 1);

    proxy.set_mode(Mode::Blackhole);
    let mut failures = 0;
    while store.breaker_state() != Some(BreakerState::Open) {
        let error = tokio::time::timeout(Duration::from_secs(10), registry.reset("acme"))
            .await
            .expect("a write is bounded by the store's budget")
            .unwrap_err();
        assert!(
            matches!(&error, TenantError::Store(e) if e.kind() == StoreErrorKind::Timeout),
            "{error}"
        );
        failures += 1;
        assert!(failures <= TRIP, "the store's breaker did not open");
    }

    for _ in 0..5 {
        let error = registry
            .init("newco", spec(&[("burst", "3/1m")]))
            .await
            .unwrap_err();
        assert!(
            matches!(&error, TenantError::Store(e) if e.kind() == StoreErrorKind::CircuitOpen),
            "{error}"
        );
        let error = registry.close("acme").await.unwrap_err();
        assert!(
            matches!(&error, TenantError::Store(e) if e.kind() == StoreErrorKind::CircuitOpen),
            "{error}"
        );
    }
    assert!(registry.tenant("newco").is_none(), "nothing was recorded");
    assert_eq!(registry.tenant("acme").unwrap().generation, 1);
    proxy.set_mode(Mode::PassThrough);
}

/// Point 2: one decision per policy, all-or-nothing, across two nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_stay_atomic_and_bounded_across_two_nodes() {
    let redis = RedisServer::shared();
    let prefix = prefix("atomic");
    let config = TenantsConfig::new()
        .with_tenant(
            "burst-binds",
            spec(&[("burst", "3/1m"), ("sustained", "5/1h sliding-counter(1m)")]),
        )
        .unwrap()
        .with_tenant(
            "sustained-binds",
            spec(&[
                ("burst", "10/1m"),
                ("sustained", "4/1h sliding-counter(1m)"),
            ]),
        )
        .unwrap()
        .with_tenant(
            "org",
            TenantSpec::builder()
                .quota("user", "100/1m")
                .unwrap()
                .tenant_quota("org", "6/1m")
                .unwrap()
                .build()
                .unwrap(),
        )
        .unwrap();
    let a = Arc::new(node(&redis.url(), &prefix, config.clone()).await);
    let b = Arc::new(node(&redis.url(), &prefix, config).await);
    let flood = |tenant: &'static str, subjects: usize, per: usize| {
        let (a, b) = (Arc::clone(&a), Arc::clone(&b));
        async move {
            let mut tasks = Vec::new();
            for i in 0..subjects * per {
                let node = if i % 2 == 0 {
                    Arc::clone(&a)
                } else {
                    Arc::clone(&b)
                };
                let subject = format!("s{}", i % subjects);
                tasks.push(tokio::spawn(
                    async move { node.check(tenant, &subject).await },
                ));
            }
            let mut admitted = 0;
            for task in tasks {
                admitted += usize::from(task.await.unwrap());
            }
            admitted
        }
    };
    let usage = |tenant: &'static str, subject: &'static str| {
        let a = Arc::clone(&a);
        async move {
            let key = WindowKey::new(tenant, subject);
            let d = a
                .limiter
                .peek_policy(&key, &a.policy(tenant), 1)
                .await
                .unwrap();
            d.quotas().iter().map(|q| q.remaining()).collect::<Vec<_>>()
        }
    };
    assert_eq!(flood("burst-binds", 1, 20).await, 3);
    assert_eq!(
        usage("burst-binds", "s0").await,
        [0, 2],
        "burst's denials took nothing from sustained"
    );
    assert_eq!(flood("sustained-binds", 1, 20).await, 4);
    assert_eq!(
        usage("sustained-binds", "s0").await,
        [6, 0],
        "sustained's denials took nothing from burst"
    );
    assert_eq!(
        flood("org", 10, 3).await,
        6,
        "the tenant's bound holds across nodes"
    );
    assert_eq!(usage("org", "s0").await[1], 0);
}

/// Reset on Redis Cluster: the tenant's subjects live on every primary;
/// one reset on A starts all of their windows afresh on B, without a
/// cross-slot delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_works_on_redis_cluster() {
    let cluster = tower_window_tests::redis_cluster::RedisCluster::shared();
    let prefix = prefix("cluster");
    let cluster_node = |config: TenantsConfig| {
        let urls = cluster.urls();
        let prefix = prefix.clone();
        async move {
            let store = Arc::new(
                RedisStore::builder()
                    .cluster(&urls)
                    .prefix(&prefix)
                    .build()
                    .unwrap(),
            );
            let registry = TenantRegistry::redis(config, Arc::clone(&store));
            let limiter =
                Limiter::builder(store, "1000/1m".parse::<tower_window::Quota>().unwrap()).build();
            tokio::time::timeout(Duration::from_secs(10), registry.loaded())
                .await
                .expect("the registry loads its state");
            Node { registry, limiter }
        }
    };
    let a = cluster_node(file()).await;
    let b = cluster_node(file()).await;
    let subjects: Vec<String> = (0..24).map(|i| format!("user-{i}")).collect();
    let slots: std::collections::BTreeSet<usize> = subjects
        .iter()
        .map(|s| {
            let key = WindowKey::new("acme", s.clone());
            let redis_key = tower_window::store::redis_key(
                &prefix,
                &key,
                &a.policy("acme"),
                a.policy("acme").first(),
            );
            tower_window_tests::redis_cluster::primary_of(
                tower_window_tests::redis_cluster::key_slot(&redis_key),
            )
        })
        .collect();
    assert!(slots.len() > 1, "the subjects live on several primaries");
    for subject in &subjects {
        assert!(b.check("acme", subject).await);
        assert!(b.check("acme", subject).await);
        assert!(!b.check("acme", subject).await);
    }
    a.registry.reset("acme").await.unwrap();
    eventually("B sees the reset", || generation(&b, "acme") == Some(1)).await;
    for subject in &subjects {
        assert!(b.check("acme", subject).await, "{subject} starts afresh");
    }
}

/// Point 3: a tenant flooding at 100 times its limit never changes another
/// tenant's admissions, whatever the names (separators, braces, unicode).
#[test]
fn tenants_are_isolated_whatever_their_names() {
    use proptest::prelude::*;

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let redis = RedisServer::shared();
    let prefix = prefix("isolation");
    let store = single(&redis.url(), &prefix);
    let limiter = Limiter::new(
        Store::bare(Arc::clone(&store)),
        "1/1m".parse::<tower_window::Quota>().unwrap(),
    );
    let name = proptest::collection::vec(
        prop_oneof![
            Just(':'),
            Just('{'),
            Just('}'),
            Just('|'),
            Just('%'),
            Just('#'),
            Just('@'),
            Just('a'),
            Just('b'),
            Just('é'),
            Just('テ'),
            Just('\u{1F600}'),
        ],
        1..10,
    )
    .prop_map(|chars| chars.into_iter().collect::<String>());
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 24,
        ..ProptestConfig::default()
    });
    let case = std::sync::atomic::AtomicU64::new(0);
    runner
        .run(&(name.clone(), name), |(a, b)| {
            prop_assume!(a != b);
            // Fresh names per case (a case may repeat a pair).
            let n = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let (a, b) = (format!("{a}{n}"), format!("{b}{n}"));
            let config = TenantsConfig::new()
                .with_tenant(&a, spec(&[("burst", "2/1m")]))
                .unwrap()
                .with_tenant(
                    &b,
                    TenantSpec::builder()
                        .quota("burst", "3/1m")
                        .unwrap()
                        .tenant_quota("org", "4/1m")
                        .unwrap()
                        .build()
                        .unwrap(),
                )
                .unwrap();
            let registry = TenantRegistry::new(config);
            let seen = runtime.block_on(async {
                let check = |tenant: &str, subject: &str| {
                    let policy = match registry.resolve(tenant.as_bytes()) {
                        Resolution::Limited(policy) => policy,
                        other => panic!("{other:?}"),
                    };
                    let key = WindowKey::new(tenant.to_owned(), subject.to_owned());
                    let limiter = limiter.clone();
                    async move {
                        limiter
                            .check_policy(&key, &policy, 1)
                            .await
                            .unwrap()
                            .allowed()
                    }
                };
                let mut seen = Vec::new();
                seen.push(check(&b, "u").await);
                seen.push(check(&b, "u").await);
                // A floods at 100x its limit, with B's subject names too.
                for i in 0..200 {
                    check(&a, if i % 2 == 0 { "u" } else { "v" }).await;
                }
                for _ in 0..2 {
                    seen.push(check(&b, "u").await);
                }
                seen.push(check(&b, "v").await);
                seen.push(check(&b, "v").await);
                seen
            });
            // burst 3 per subject, org 4 per tenant: exactly as if A had
            // never sent a thing.
            prop_assert_eq!(seen, vec![true, true, true, false, true, false]);
            Ok(())
        })
        .unwrap();
}
