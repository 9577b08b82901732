//! The audit trail on a real Redis: records written once, in order, paged
//! and filtered; a batch sent again is not written twice.
#![allow(clippy::unwrap_used)]

use tower_window::audit::{AuditLog, AuditOutcome, AuditQuery, AuditRules};
use tower_window::{Limiter, Quota, RedisStore, Store, WindowKey};
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
