//! The cluster topology (hash slot → failure domain) a `RedisStore` loads
//! from a live 3-primary cluster agrees with the cluster's own
//! `CLUSTER NODES`: one failure domain per primary.
#![allow(clippy::unwrap_used)]

use std::collections::{HashMap, HashSet};

use tower_window::limit::Backend;
use tower_window::store::redis::{redis_key, DEFAULT_PREFIX};
use tower_window::{Policy, Quota, RedisStore, WindowKey};
use tower_window_tests::redis_cluster::{key_slot, RedisCluster};

/// The `host:port` of the primary serving each slot, from `CLUSTER NODES`.
fn owners(cluster: &RedisCluster) -> HashMap<u16, String> {
    let nodes: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query(&mut cluster.nodes()[0].connection())
        .unwrap();
    let mut owners = HashMap::new();
    for line in nodes.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if !fields[2].contains("master") {
            continue;
        }
        // "127.0.0.1:7000@17000" or with ",hostname".
        let addr = fields[1].split('@').next().unwrap().to_owned();
        for range in &fields[8..] {
            if range.starts_with('[') {
                continue; // a slot being migrated
            }
            let (start, end) = range.split_once('-').unwrap_or((range, range));
            for slot in start.parse::<u16>().unwrap()..=end.parse::<u16>().unwrap() {
                owners.insert(slot, addr.clone());
            }
        }
    }
    owners
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn domains_follow_the_primaries() {
    let cluster = RedisCluster::shared();
    let policy = Policy::from("10/1s".parse::<Quota>().unwrap());
    let store = RedisStore::cluster(cluster.urls()).unwrap();
    // Connecting loads the slot map.
    store.connect().await.unwrap();
    let keys: Vec<WindowKey> = (0..256)
        .map(|i| WindowKey::for_subject(format!("topology-{i}")))
        .collect();
    let owners = owners(&cluster);
    assert_eq!(owners.len(), 16_384, "every slot is served");

    // The same primary always has the same domain, and different primaries
    // have different ones.
    let mut by_owner: HashMap<&str, u16> = HashMap::new();
    let mut seen = HashSet::new();
    for key in &keys {
        let slot = key_slot(&redis_key(DEFAULT_PREFIX, key, &policy, policy.first()));
        let domain = Backend::failure_domain(&store, key, &policy)
            .unwrap_or_else(|| panic!("slot {slot} has no domain"));
        let owner = owners[&slot].as_str();
        let known = *by_owner.entry(owner).or_insert(domain);
        assert_eq!(known, domain, "slot {slot} of {owner}");
        seen.insert(domain);
    }
    assert_eq!(by_owner.len(), 3, "the keys reach every primary");
    assert_eq!(seen.len(), 3, "three distinct domains");
}
