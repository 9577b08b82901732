//! The audit trail on a real Redis: records written once, in order, paged
//! and filtered; a batch sent again is not written twice.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;

use tower_window::audit::{AuditLog, AuditOutcome, AuditQuery, AuditRules};
use tower_window::{LeaseConfig, Limiter, Quota, RedisStore, Store, WindowKey};
use tower_window_tests::redis_server::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denials_are_written_once_and_read_back_in_pages() {
    let server = RedisServer::shared();
    let redis = RedisStore::builder()
        .url(server.url())
        .prefix("audit-basic:")
        .build()
        .unwrap();
    let store = Store::from(redis);
    let audit = AuditLog::builder(store.clone())
        .rules(AuditRules::default().sample_admissions(2))
        .max_batch(7)
        .node("n1")
        .build();
    let limiter = Limiter::builder(store, "3/1m".parse::<Quota>().unwrap())
        .audit(audit.clone())
        .build();
    let (mut denied, mut allowed) = (0, 0);
    for i in 0..60 {
        let key = WindowKey::new("acme", format!("user-{}", i % 4));
        let decision = limiter.check(&key, 1).await.unwrap();
        if decision.allowed() {
            allowed += 1;
        } else {
            denied += 1;
        }
    }
    assert_eq!((allowed, denied), (12, 48));
    assert!(audit.flush().await);
    let stats = audit.stats();
    assert_eq!(stats.written, 48 + 6, "{stats:?}");
    assert_eq!(
        (stats.dropped_full, stats.dropped_failed, stats.buffered),
        (0, 0, 0)
    );

    // Every record, newest first, three pages of 20.
    let mut all = Vec::new();
    let mut query = AuditQuery::new("acme").limit(20);
    loop {
        let page = audit.query(&query).await.unwrap();
        all.extend(page.records);
        match page.next {
            Some(next) => query = query.before(next),
            None => break,
        }
    }
    assert_eq!(all.len(), 54);
    let denials: Vec<_> = all
        .iter()
        .filter(|r| r.outcome == AuditOutcome::Denied)
        .collect();
    assert_eq!(denials.len(), 48);
    assert!(all.iter().all(|r| r.node == "n1" && r.policy == "default"));
    // Newest first, ids strictly decreasing; decision times never increasing.
    for pair in all.windows(2) {
        assert!(pair[0].at_micros >= pair[1].at_micros, "{pair:?}");
        assert_ne!(pair[0].id, pair[1].id);
    }
    // Filters: one subject's denials.
    let page = audit
        .query(
            &AuditQuery::new("acme")
                .subject("user-1")
                .outcome(AuditOutcome::Denied),
        )
        .await
        .unwrap();
    assert_eq!(page.records.len(), 12);
    assert!(page
        .records
        .iter()
        .all(|r| r.subject == "user-1" && r.remaining == 0));
    // Another tenant's log is empty.
    let other = audit.query(&AuditQuery::new("other")).await.unwrap();
    assert!(other.records.is_empty() && other.next.is_none());
}

/// With quota leases: admissions spent from a lease are recorded (sampled
/// 1 in 1) with the lease as their source, once each, beside the store's
/// decisions and the denials.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leased_admissions_are_recorded_with_their_source() {
    let server = RedisServer::shared();
    let redis = RedisStore::builder()
        .url(server.url())
        .prefix("audit-leases:")
        .build()
        .unwrap();
    let store = Store::from(redis);
    let audit = AuditLog::builder(store.clone())
        .rules(AuditRules::default().sample_admissions(1))
        .build();
    let limiter = Limiter::builder(store, "200/1m fixed-window".parse::<Quota>().unwrap())
        .leases(LeaseConfig::new(50).hot_after(1))
        .audit(audit.clone())
        .build();
    let key = WindowKey::new("leased", "hot");
    let mut decided: HashMap<(AuditOutcome, &'static str), usize> = HashMap::new();
    for _ in 0..300 {
        let d = limiter.check(&key, 1).await.unwrap();
        let outcome = if d.allowed() {
            AuditOutcome::Allowed
        } else {
            AuditOutcome::Denied
        };
        *decided.entry((outcome, d.source().as_str())).or_default() += 1;
    }
    let allowed: usize = decided
        .iter()
        .filter(|((o, _), _)| *o == AuditOutcome::Allowed)
        .map(|(_, n)| n)
        .sum();
    assert!(allowed <= 200, "{decided:?}");
    assert!(
        decided.contains_key(&(AuditOutcome::Allowed, "lease")),
        "{decided:?}"
    );
    assert!(audit.flush().await);
    let mut logged: HashMap<(AuditOutcome, &'static str), usize> = HashMap::new();
    let mut query = AuditQuery::new("leased").limit(AuditQuery::MAX_LIMIT);
    loop {
        let page = audit.query(&query).await.unwrap();
        for r in &page.records {
            *logged.entry((r.outcome, r.source.as_str())).or_default() += 1;
        }
        match page.next {
            Some(next) => query = query.before(next),
            None => break,
        }
    }
    assert_eq!(logged, decided, "every decision once, under its source");
}

mod two_nodes {
    //! Two nodes on one store, a scripted run with a store fault in the
    //! middle (an outage of a single Redis; a primary failover on a
    //! cluster): every recorded decision is in the log exactly once, each
    //! node's records of a subject in decision order, with the source that
    //! decided.

    use std::collections::HashMap;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use tower_window::audit::{AuditLog, AuditOutcome, AuditQuery, AuditRecord};
    use tower_window::fallback::FailClosed;
    use tower_window::{
        BreakerConfig, DecisionSource, Limiter, Quota, RedisStore, Store, WindowKey,
    };
    use tower_window_tests::fault_proxy::{FaultProxy, Mode};
    use tower_window_tests::redis_cluster::{key_slot, query, RedisCluster};
    use tower_window_tests::redis_server::RedisServer;

    const TENANT: &str = "acme";
    const SUBJECTS: usize = 5;
    const PREFIX: &str = "audit-nodes:";

    struct Node {
        name: &'static str,
        limiter: Limiter,
        audit: AuditLog,
    }

    fn node(name: &'static str, redis: RedisStore) -> Node {
        let store = Store::builder(redis)
            .timeout(Duration::from_millis(200))
            .breaker(BreakerConfig::default().cooldown(Duration::from_millis(200)))
            .build();
        let audit = AuditLog::builder(store.clone())
            .node(name)
            .flush_interval(Duration::from_millis(10))
            .max_batch(16)
            .build();
        let limiter = Limiter::builder(store, "3/1m".parse::<Quota>().unwrap())
            .fallback(FailClosed::new())
            .audit(audit.clone())
            .build();
        Node {
            name,
            limiter,
            audit,
        }
    }

    /// What a node decided that its log must hold.
    #[derive(Debug, Clone, PartialEq, Eq, Hash)]
    struct Expected {
        node: String,
        subject: String,
        at_micros: u64,
        source: DecisionSource,
        outcome: AuditOutcome,
    }

    impl From<&AuditRecord> for Expected {
        fn from(r: &AuditRecord) -> Self {
            Self {
                node: r.node.clone(),
                subject: r.subject.clone(),
                at_micros: r.at_micros,
                source: r.source,
                outcome: r.outcome,
            }
        }
    }

    /// `rounds` rounds over every subject, each subject's check going to
    /// the nodes in turn; the recorded decisions (denials and degraded
    /// ones), in order.
    async fn run(nodes: &[Node; 2], first_round: usize, rounds: usize) -> Vec<Expected> {
        run_for(nodes, first_round, rounds, 0..SUBJECTS).await
    }

    async fn run_for(
        nodes: &[Node; 2],
        first_round: usize,
        rounds: usize,
        subjects: std::ops::Range<usize>,
    ) -> Vec<Expected> {
        let mut expected = Vec::new();
        for round in first_round..first_round + rounds {
            for s in subjects.clone() {
                let node = &nodes[(round + s) % 2];
                let subject = format!("user-{s}");
                let key = WindowKey::new(TENANT, subject.clone());
                let decision = node.limiter.check(&key, 1).await.unwrap();
                if !decision.allowed() || decision.is_degraded() {
                    expected.push(Expected {
                        node: node.name.to_owned(),
                        subject,
                        at_micros: decision.timestamp_micros(),
                        source: decision.source(),
                        outcome: if decision.allowed() {
                            AuditOutcome::Allowed
                        } else {
                            AuditOutcome::Denied
                        },
                    });
                }
            }
        }
        expected
    }

    /// Every record of the tenant, oldest first, by pages of 7.
    async fn read_all(audit: &AuditLog) -> Vec<AuditRecord> {
        let mut all = Vec::new();
        let mut query = AuditQuery::new(TENANT).limit(7);
        loop {
            let page = audit.query(&query).await.unwrap();
            all.extend(page.records);
            match page.next {
                Some(next) => query = query.before(next),
                None => break,
            }
        }
        all.reverse();
        all
    }

    async fn flushed(nodes: &[Node; 2]) {
        let deadline = Instant::now() + Duration::from_secs(20);
        for node in nodes {
            while !node.audit.flush().await {
                assert!(Instant::now() < deadline, "{}: {:?}", node.name, node.audit);
            }
        }
    }

    /// The log holds `expected` exactly once each, each node's records of
    /// a subject in decision order, and nothing was dropped.
    fn check(nodes: &[Node; 2], expected: &[Expected], log: &[AuditRecord]) {
        for node in nodes {
            let stats = node.audit.stats();
            assert_eq!(
                (stats.dropped_full, stats.dropped_failed, stats.buffered),
                (0, 0, 0),
                "{stats:?}"
            );
        }
        let mut wanted: HashMap<&Expected, i32> = HashMap::new();
        for e in expected {
            *wanted.entry(e).or_default() += 1;
        }
        assert!(
            wanted.values().all(|&n| n == 1),
            "decision times are distinct"
        );
        let found: Vec<Expected> = log.iter().map(Expected::from).collect();
        for f in &found {
            let n = wanted
                .get_mut(f)
                .unwrap_or_else(|| panic!("not decided: {f:?}"));
            *n -= 1;
            assert_eq!(*n, 0, "recorded twice: {f:?}");
        }
        assert_eq!(
            found.len(),
            expected.len(),
            "every recorded decision is in the log"
        );
        for node in nodes {
            for s in 0..2 * SUBJECTS {
                let subject = format!("user-{s}");
                let mine = |e: &&Expected| e.node == node.name && e.subject == subject;
                let decided: Vec<&Expected> = expected.iter().filter(mine).collect();
                let logged: Vec<&Expected> = found.iter().filter(mine).collect();
                assert_eq!(
                    logged, decided,
                    "{} {subject}: in decision order",
                    node.name
                );
            }
        }
        // A subject's records in decision order across nodes by `at_micros`.
        for s in 0..2 * SUBJECTS {
            let subject = format!("user-{s}");
            let times: Vec<u64> = expected
                .iter()
                .filter(|e| e.subject == subject)
                .map(|e| e.at_micros)
                .collect();
            assert!(
                times.windows(2).all(|w| w[0] < w[1]),
                "{subject}: {times:?}"
            );
        }
    }

    fn sources(expected: &[Expected]) -> HashMap<&'static str, usize> {
        let mut by = HashMap::new();
        for e in expected {
            *by.entry(e.source.as_str()).or_default() += 1;
        }
        by
    }

    /// Two nodes on one Redis of their own, reached through a fault proxy.
    async fn proxied() -> (RedisServer, FaultProxy, [Node; 2]) {
        let server = RedisServer::start();
        let proxy = FaultProxy::start(server.addr().parse().unwrap())
            .await
            .unwrap();
        let make = || {
            RedisStore::builder()
                .url(proxy.redis_url())
                .prefix(PREFIX)
                .build()
                .unwrap()
        };
        let nodes = [node("a", make()), node("b", make())];
        (server, proxy, nodes)
    }

    /// A single Redis behind a proxy; in the middle of the run the proxy
    /// refuses every connection (a dead server), then lets them through.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_redis_outage_in_the_middle() {
        let (_server, proxy, nodes) = proxied().await;
        let mut expected = run(&nodes, 0, 6).await;
        proxy.set_mode(Mode::Refuse);
        // Subjects denied before: the local tier; new ones: the fallback.
        let mut outage = run(&nodes, 6, 2).await;
        assert!(outage
            .iter()
            .all(|e| e.source == DecisionSource::LocalCache));
        let fresh = run_for(&nodes, 6, 4, SUBJECTS..2 * SUBJECTS).await;
        assert_eq!(
            fresh.len(),
            4 * SUBJECTS,
            "fail-closed: every check degraded"
        );
        assert!(fresh
            .iter()
            .all(|e| matches!(e.source, DecisionSource::Fallback(_))));
        outage.extend(fresh);
        // Kept back meanwhile, not dropped.
        assert!(nodes.iter().map(|n| n.audit.stats().buffered).sum::<u64>() > 0);
        expected.extend(outage);
        proxy.set_mode(Mode::PassThrough);
        tokio::time::sleep(Duration::from_millis(300)).await; // the breakers' cooldown
        expected.extend(run_for(&nodes, 10, 6, 0..2 * SUBJECTS).await);
        flushed(&nodes).await;
        let log = read_all(&nodes[0].audit).await;
        check(&nodes, &expected, &log);
        let by_source = sources(&expected);
        assert!(
            by_source.get("store").copied().unwrap_or(0) > 0,
            "{by_source:?}"
        );
        assert!(
            by_source.get("local_cache").copied().unwrap_or(0) > 0,
            "{by_source:?}"
        );
        assert!(
            by_source.get("fallback").copied().unwrap_or(0) >= 4 * SUBJECTS,
            "{by_source:?}"
        );
    }

    /// Batches sent into a partition time out with their outcome unknown,
    /// and are sent again; when the partition heals the held batches land
    /// first, and their resends must add nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_batch_sent_again_after_a_lost_answer_is_written_once() {
        let (_server, proxy, nodes) = proxied().await;
        let mut expected = run(&nodes, 0, 4).await;
        // Denials (local tier, fallback): recorded, written into the void.
        proxy.set_mode(Mode::Blackhole);
        let held = run(&nodes, 4, 4).await;
        assert_eq!(held.len(), 4 * SUBJECTS);
        expected.extend(held);
        tokio::time::sleep(Duration::from_millis(800)).await; // batches time out, are resent
        proxy.set_mode(Mode::PassThrough);
        expected.extend(run(&nodes, 8, 4).await);
        flushed(&nodes).await;
        let log = read_all(&nodes[0].audit).await;
        check(&nodes, &expected, &log);
    }

    /// A Redis Cluster with replicas: the primary of the tenant's log
    /// fails over (`CLUSTER FAILOVER`) while both nodes go on deciding.
    #[test]
    fn a_primary_failover_on_a_cluster() {
        let cluster = Arc::new(RedisCluster::start_with_replicas());
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let make = || {
            let store = RedisStore::builder()
                .cluster(cluster.urls())
                .prefix(PREFIX)
                .build()
                .unwrap();
            runtime.block_on(store.connect()).unwrap();
            store
        };
        let nodes = Arc::new([node("a", make()), node("b", make())]);
        let slot = key_slot(format!("{{@{TENANT}}}").as_bytes());
        let (primary, replica) = cluster
            .pairs()
            .into_iter()
            .find(|&(primary, _)| cluster.owner(primary, slot) == primary)
            .unwrap();
        let mut expected = runtime.block_on(run(&nodes, 0, 6));
        // Deciding goes on (as fast as it can) while the primary fails over.
        let failover = {
            let cluster = Arc::clone(&cluster);
            std::thread::spawn(move || {
                let nodes = cluster.nodes();
                query::<String>(&nodes[replica], &["CLUSTER", "FAILOVER"]).unwrap();
                let all: Vec<usize> = (0..nodes.len()).collect();
                cluster.wait_until_whole("the failover", &all, || {
                    query::<String>(&nodes[primary], &["INFO", "replication"])
                        .is_ok_and(|info| info.contains("role:slave"))
                });
            })
        };
        let mut round = 6;
        while !failover.is_finished() {
            expected.extend(runtime.block_on(run(&nodes, round, 1)));
            round += 1;
            std::thread::sleep(Duration::from_millis(5));
        }
        failover.join().unwrap();
        expected.extend(runtime.block_on(run(&nodes, round, 6)));
        runtime.block_on(flushed(&nodes));
        let log = runtime.block_on(read_all(&nodes[0].audit));
        check(&nodes, &expected, &log);
        assert!(round > 6, "decisions were made during the failover");
    }
}
