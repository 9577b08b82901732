//! Per-tenant audit rules from the tenant registry: a tenant's rules reach
//! every node's audit log (the file, runtime changes, the control
//! channel), pick which decisions each node records, and admin changes are
//! recorded once, by the node where they were made. Real Redis (two
//! registries on two store handles: two nodes) and the embedded store.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use tower_window::audit::{AdminAction, AuditLog, AuditOutcome, AuditQuery, AuditRules};
use tower_window::tenant::{Resolution, TenantError, TenantRegistry, TenantSpec, TenantsConfig};
use tower_window::{Limiter, Quota, RedisStore, Store, WindowKey};
use tower_window_tests::redis_server::RedisServer;

/// A prefix no other test or run uses.
fn prefix(test: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("audit-tenants:{test}:{}:{nanos}:", std::process::id())
}

fn spec(dsl: &str, audit: Option<AuditRules>) -> TenantSpec {
    let builder = TenantSpec::builder().quota("minute", dsl).unwrap();
    match audit {
        Some(rules) => builder.audit(rules).build().unwrap(),
        None => builder.build().unwrap(),
    }
}

/// Polls `done` every 5 ms, at most 2000 times.
async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..2000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("never: {what}");
}

/// One node: its own store handle, registry, audit log and limiter.
struct Node {
    registry: TenantRegistry,
    audit: AuditLog,
    limiter: Limiter,
}

async fn node(url: &str, prefix: &str, id: &str, config: TenantsConfig) -> Node {
    let redis = Arc::new(
        RedisStore::builder()
            .url(url)
            .prefix(prefix)
            .build()
            .unwrap(),
    );
    // A generous budget: these tests count records, not time.
    let store = Store::builder(Arc::clone(&redis))
        .timeout(Duration::from_secs(5))
        .build();
    let audit = AuditLog::builder(store.clone()).node(id).build();
    let registry = TenantRegistry::redis(config, redis).with_audit(audit.clone());
    let limiter = Limiter::builder(store, "1000/1m".parse::<Quota>().unwrap())
        .audit(audit.clone())
        .build();
    tokio::time::timeout(Duration::from_secs(10), registry.loaded())
        .await
        .expect("the registry loads its state");
    Node {
        registry,
        audit,
        limiter,
    }
}

impl Node {
    /// Checks `tenant`'s subject `alice` `n` times: how many were admitted.
    async fn check(&self, tenant: &str, n: usize) -> usize {
        let key = WindowKey::new(tenant.to_owned(), "alice");
        let mut allowed = 0;
        for _ in 0..n {
            let Resolution::Limited(policy) = self.registry.resolve(tenant.as_bytes()) else {
                panic!("{tenant} is not limited");
            };
            let decision = self.limiter.check_policy(&key, &policy, 1).await.unwrap();
            allowed += usize::from(decision.allowed());
        }
        allowed
    }

    /// Every record of `tenant`'s log (fewer than a page), oldest first:
    /// by time decided (each node writes its records in batches of its
    /// own, so the log holds them in the order written), then as written.
    async fn records(&self, tenant: &str) -> Vec<(AuditOutcome, String)> {
        assert!(self.audit.flush().await);
        let page = self
            .audit
            .query(&AuditQuery::new(tenant).limit(AuditQuery::MAX_LIMIT))
            .await
            .unwrap();
        assert!(page.next.is_none());
        let mut records: Vec<_> = page.records.into_iter().rev().collect();
        records.sort_by_key(|r| r.at_micros);
        records.into_iter().map(|r| (r.outcome, r.node)).collect()
    }

    /// The outcomes of `tenant`'s decisions (admin changes left out).
    async fn decisions(&self, tenant: &str) -> Vec<AuditOutcome> {
        let records = self.records(tenant).await.into_iter();
        let decisions = records.filter(|(o, _)| !matches!(o, AuditOutcome::Admin(_)));
        decisions.map(|(o, _)| o).collect()
    }

    /// `tenant`'s admin changes, oldest first, with the recording node.
    async fn admin(&self, tenant: &str) -> Vec<(AuditOutcome, String)> {
        let records = self.records(tenant).await.into_iter();
        records
            .filter(|(o, _)| matches!(o, AuditOutcome::Admin(_)))
            .collect()
    }
}

fn admin(action: AdminAction, node: &str) -> (AuditOutcome, String) {
    (AuditOutcome::Admin(action), node.to_owned())
}

const FILE: &str = r#"
    [tenants.plain]
    quotas = { minute = "2/1m" }

    [tenants.filed]
    quotas = { minute = "2/1m" }
    audit = { denials = false, admission_sample = 1 }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_tenants_rules_reach_every_node_and_pick_its_records() {
    let redis = RedisServer::shared();
    let prefix = prefix("rules");
    let config = TenantsConfig::from_toml(FILE).unwrap();
    let a = node(&redis.url(), &prefix, "a", config.clone()).await;
    let b = node(&redis.url(), &prefix, "b", config).await;
    // From the file, on both nodes.
    for n in [&a, &b] {
        assert!(!n.audit.rules("filed").denials);
        assert_eq!(n.audit.rules("plain"), AuditRules::default());
    }
    // Put on A, heard by B through the control channel.
    let mut quiet = AuditRules::default();
    quiet.denials = false;
    let loud = AuditRules::default().sample_admissions(1);
    a.registry
        .init("quiet", spec("2/1m", Some(quiet)))
        .await
        .unwrap();
    a.registry
        .init("loud", spec("2/1m", Some(loud)))
        .await
        .unwrap();
    eventually("B hears of quiet and loud", || {
        b.registry.tenant("quiet").is_some() && b.registry.tenant("loud").is_some()
    })
    .await;
    assert_eq!(b.registry.tenant("loud").unwrap().spec.audit(), Some(loud));
    assert_eq!(
        (b.audit.rules("quiet"), b.audit.rules("loud")),
        (quiet, loud)
    );

    // B decides: 2 admitted, 3 denied, for every tenant.
    for tenant in ["quiet", "loud", "plain", "filed"] {
        assert_eq!(b.check(tenant, 5).await, 2, "{tenant}");
    }
    use AuditOutcome::{Allowed, Denied};
    assert_eq!(b.decisions("quiet").await, []);
    assert_eq!(
        b.decisions("loud").await,
        [Allowed, Allowed, Denied, Denied, Denied]
    );
    assert_eq!(b.decisions("plain").await, [Denied, Denied, Denied]);
    assert_eq!(b.decisions("filed").await, [Allowed, Allowed]);
    // Every one of them recorded by B.
    let records = b.records("loud").await.into_iter();
    let by: Vec<String> = records
        .filter(|(o, _)| !matches!(o, AuditOutcome::Admin(_)))
        .map(|(_, node)| node)
        .collect();
    assert_eq!(by, ["b"; 5]);

    // A new runtime definition without rules hands loud back to the log's.
    b.registry.init("loud", spec("2/1m", None)).await.unwrap();
    eventually("A hears loud lost its rules", || {
        a.audit.rules("loud") == AuditRules::default()
    })
    .await;
    assert_eq!(b.audit.rules("loud"), AuditRules::default());
    // A closed tenant (no default) keeps no rules; revert gives the file's
    // back (none for quiet: the log's).
    a.registry.close("quiet").await.unwrap();
    eventually("B hears quiet was closed", || {
        b.audit.rules("quiet") == AuditRules::default()
    })
    .await;
    assert_eq!(b.registry.resolve(b"quiet"), Resolution::Unknown);

    // A reload is this node's: A's log follows A's file only.
    let reloaded = FILE.replace("denials = false", "denials = true");
    a.registry
        .set_config(TenantsConfig::from_toml(&reloaded).unwrap());
    assert!(a.audit.rules("filed").denials);
    assert!(!b.audit.rules("filed").denials);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_changes_are_recorded_once_by_the_node_that_made_them() {
    let redis = RedisServer::shared();
    let prefix = prefix("admin");
    let config = TenantsConfig::from_toml(FILE).unwrap();
    let a = node(&redis.url(), &prefix, "a", config.clone()).await;
    let b = node(&redis.url(), &prefix, "b", config.clone()).await;

    a.registry.init("newco", spec("5/1m", None)).await.unwrap();
    eventually("B hears of newco", || b.registry.tenant("newco").is_some()).await;
    assert!(a.registry.reset("newco").await.unwrap());
    assert!(a.registry.close("newco").await.unwrap());
    // B reverts A's tombstone once it has heard of it (the stream is read
    // in order: newco gone means the close was applied).
    eventually("B hears newco was closed", || {
        b.registry.tenant("newco").is_none()
    })
    .await;
    assert!(b.registry.revert("newco").await.unwrap());

    // A tenant whose rules refuse admin changes: recorded only when the
    // rules before or after a change want it.
    let hush = AuditRules::none();
    a.registry
        .init("hush", spec("5/1m", Some(hush)))
        .await
        .unwrap();
    assert!(a.registry.reset("hush").await.unwrap());
    a.registry.init("hush", spec("5/1m", None)).await.unwrap();

    // A reload on A: filed changed, gamma added, plain removed.
    let reloaded = TenantsConfig::from_toml(
        r#"
        [tenants.filed]
        quotas = { minute = "3/1m" }
        [tenants.gamma]
        quotas = { minute = "1/1m" }
        "#,
    )
    .unwrap();
    a.registry.set_config(reloaded.clone());
    a.registry.set_config(reloaded); // no change: nothing recorded

    // Let both followers catch up with every change before counting.
    eventually("B hears hush's last put", || {
        b.registry
            .tenant("hush")
            .is_some_and(|t| t.spec.audit().is_none())
    })
    .await;
    eventually("A hears hush's last put", || {
        a.registry
            .effective("hush")
            .is_some_and(|t| t.generation == 1)
    })
    .await;
    assert!(b.audit.flush().await);
    assert!(a.audit.flush().await);

    use AdminAction::{Delete, Put, Reload, Reset};
    for n in [&a, &b] {
        assert_eq!(
            n.admin("newco").await,
            [
                admin(Put, "a"),
                admin(Reset, "a"),
                admin(Delete, "a"),
                admin(Reload, "b")
            ]
        );
        assert_eq!(n.admin("hush").await, [admin(Put, "a"), admin(Put, "a")]);
        assert_eq!(n.admin("filed").await, [admin(Reload, "a")]);
        assert_eq!(n.admin("gamma").await, [admin(Reload, "a")]);
        assert_eq!(n.admin("plain").await, [admin(Reload, "a")]);
    }
    assert_eq!(a.audit.stats().dropped_full, 0);
}

#[tokio::test]
async fn on_the_embedded_store_rules_and_admin_changes_follow_the_registry() {
    let store = Store::memory();
    let audit = AuditLog::builder(store.clone()).node("m").build();
    let config = TenantsConfig::from_toml(
        r#"
        [default]
        quotas = { minute = "2/1m" }
        audit = { admission_sample = 1 }
        [tenants.filed]
        quotas = { minute = "2/1m" }
        [tenants.filed.audit]
        denials = false
        admin = false
        "#,
    )
    .unwrap();
    // Rules set before the log joins are handed over at once.
    let registry = TenantRegistry::on_store(config, &store);
    registry.loaded().await;
    let registry = registry.with_audit(audit.clone());
    assert!(!audit.rules("filed").denials);
    // A tenant the registry never heard of gets the log's rules; once it
    // knows it by name (here: closed, still served by the default), the
    // default's.
    assert_eq!(audit.rules("walkin"), AuditRules::default());
    assert!(registry.close("walkin").await.unwrap());
    assert_eq!(audit.rules("walkin").admission_sample, 1);

    let limiter = Limiter::builder(store, "1000/1m".parse::<Quota>().unwrap())
        .audit(audit.clone())
        .build();
    let key = WindowKey::new("filed", "alice");
    for _ in 0..4 {
        let Resolution::Limited(policy) = registry.resolve(b"filed") else {
            panic!("filed is limited")
        };
        limiter.check_policy(&key, &policy, 1).await.unwrap();
    }
    assert!(registry.reset("filed").await.unwrap()); // not recorded: admin = false
    assert!(audit.flush().await);
    let filed = audit.query(&AuditQuery::new("filed")).await.unwrap();
    assert!(filed.records.is_empty(), "{:?}", filed.records);
    let walkin = audit.query(&AuditQuery::new("walkin")).await.unwrap();
    let outcomes: Vec<_> = walkin.records.iter().map(|r| r.outcome).collect();
    assert_eq!(outcomes, [AuditOutcome::Admin(AdminAction::Delete)]);

    // Bad audit tables are typed errors, and the registry keeps its file.
    for bad in [
        "[tenants.x]\nquotas = { a = \"1/s\" }\n[tenants.x.audit]\nverbose = true",
        "[tenants.x]\nquotas = { a = \"1/s\" }\n[tenants.x.audit]\nadmission_sample = -5",
        "[tenants.x]\nquotas = { a = \"1/s\" }\naudit = \"all\"",
        "[default]\nquotas = { a = \"1/s\" }\n[default.audit]\ndenials = 1",
    ] {
        let error = TenantsConfig::from_toml(bad).unwrap_err();
        assert!(
            matches!(error, TenantError::Syntax(_)) && error.is_invalid_input(),
            "{bad}: {error}"
        );
    }
    assert!(!audit.rules("filed").denials);
}
