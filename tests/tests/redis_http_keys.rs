//! Hostile keys through the real layer to a real Redis (single server and
//! the 3-primary cluster): braces, `:`, `%`, non-UTF-8 bytes and header
//! values of the maximum size (and beyond) never cause a 5xx, and no two
//! (tenant, subject) pairs share a window (DESIGN.md invariant 5), with and
//! without a tenant-scoped quota in the policy.
//!
//! Requests go through `SlidingWindowLayer` with `tower::ServiceExt::oneshot`
//! over a `service_fn`; no HTTP server is needed. Every limit is 1 and the
//! local tier is off, so every decision is the store's.
#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Request, Response, StatusCode};
use tower::{service_fn, Layer, ServiceExt};
use tower_window::key::{Header, DEFAULT_MAX_LEN};
use tower_window::{
    KeyExtractorExt, Limiter, Policy, Quota, RedisStore, Scope, SlidingWindowLayer, Store,
};
use tower_window_tests::redis_cluster::RedisCluster;
use tower_window_tests::redis_server::RedisServer;

/// Two (tenant, subject) keys: `(tenant1, subject1, tenant2, subject2)`.
type Pair = (Vec<u8>, Vec<u8>, Vec<u8>, Vec<u8>);

/// Pairs that a naive `tenant:subject` join, a lossy UTF-8 conversion, an
/// escape that is not injective or a hash tag taken from user bytes would
/// map to one window (or one slot chosen by the client).
fn hostile_pairs() -> Vec<Pair> {
    let b = |s: &[u8]| s.to_vec();
    let max = DEFAULT_MAX_LEN;
    vec![
        // The example.
        (b(b"a:b"), b(b"c"), b(b"a"), b(b"b:c")),
        (b(b"a:"), b(b"b"), b(b"a"), b(b":b")),
        // Braces: a user-chosen hash tag, or one split across the parts.
        (b(b"{x}:y"), b(b"z"), b(b"{x}"), b(b"y:z")),
        (b(b"a}"), b(b"{b"), b(b"a"), b(b"}{b")),
        (b(b"{"), b(b"}"), b(b"{}"), b(b"{}")),
        // Percent: the escape's own alphabet sent literally.
        (b(b"a%3Ab"), b(b"c"), b(b"a:b"), b(b"c")),
        (b(b"%7Ba%7D"), b(b"x"), b(b"{a}"), b(b"x")),
        (b(b"a%"), b(b"3Ac"), b(b"a%3A"), b(b"c")),
        // Non-UTF-8: a Latin-1 byte vs its UTF-8 encoding, and a lossy `?`.
        (b(b"\xff"), b(b"u"), b("\u{ff}".as_bytes()), b(b"u")),
        (b(b"\xfe\xff:"), b(b"x"), b(b"\xfe\xff"), b(b":x")),
        (b(b"t"), b(b"\x80"), b(b"t"), b("\u{fffd}".as_bytes())),
        // The `@` of the tenant form and the `#` of the hashed form.
        (b(b"@a"), b(b"b"), b(b"a"), b(b"b")),
        (b(b"#a"), b(b"b"), b(b"%23a"), b(b"b")),
        // Maximum-size values: escaped far beyond the hashed form's length,
        // differing in one byte at the very end or at the split.
        (
            [b"{:%".repeat(max / 3), b(b"a")].concat(),
            b(b":").repeat(max),
            [b"{:%".repeat(max / 3), b(b"b")].concat(),
            b(b":").repeat(max),
        ),
        (
            b(b"\xff").repeat(max),
            [b(b"}").repeat(max - 1), b(b"x")].concat(),
            b(b"\xff").repeat(max),
            [b(b"}").repeat(max - 1), b(b"y")].concat(),
        ),
    ]
}

fn limiter(store: Arc<RedisStore>, policy: impl Into<Policy>) -> Limiter {
    // Generous: this test is about keys, not budgets.
    let store = Store::builder(store)
        .timeout(Duration::from_secs(10))
        .build();
    Limiter::builder(store, policy).local_capacity(0).build()
}

/// The layer keyed by `x-user-id` within the tenant `x-tenant-id`, over a
/// handler that always answers 200.
fn layer(
    store: Arc<RedisStore>,
    policy: impl Into<Policy>,
) -> impl tower::Service<Request<String>, Response = Response<String>, Error = Infallible> + Clone {
    let key = Header::new("x-user-id")
        .unwrap()
        .with_tenant(Header::new("x-tenant-id").unwrap());
    SlidingWindowLayer::new(limiter(store, policy), key).layer(service_fn(ok))
}

async fn ok(_request: Request<String>) -> Result<Response<String>, Infallible> {
    Ok(Response::new(String::new()))
}

fn request(tenant: &[u8], user: &[u8]) -> Request<String> {
    Request::builder()
        .uri("/api")
        .header("x-tenant-id", HeaderValue::from_bytes(tenant).unwrap())
        .header("x-user-id", HeaderValue::from_bytes(user).unwrap())
        .body(String::new())
        .unwrap()
}

/// Sends one request through a fresh clone of `service`; panics on a 5xx.
async fn status<S>(service: &S, tenant: &[u8], user: &[u8]) -> StatusCode
where
    S: tower::Service<Request<String>, Response = Response<String>, Error = Infallible> + Clone,
{
    let response = service
        .clone()
        .oneshot(request(tenant, user))
        .await
        .unwrap();
    assert!(
        !response.status().is_server_error(),
        "5xx for tenant {} bytes / user {} bytes: {:?}",
        tenant.len(),
        user.len(),
        response
    );
    response.status()
}

/// With a per-subject limit of 1, each side of every hostile pair has its
/// own window: both are admitted once, then both are denied.
async fn pairs_have_separate_subject_windows(store: RedisStore) {
    let store = Arc::new(store);
    // A quota of its own per pair (its own windows): pairs share members.
    for (i, (t1, s1, t2, s2)) in hostile_pairs().into_iter().enumerate() {
        let quota = "1/1m"
            .parse::<Quota>()
            .unwrap()
            .named(&format!("user-{i}"))
            .unwrap();
        let service = layer(store.clone(), quota);
        assert_eq!(
            status(&service, &t1, &s1).await,
            StatusCode::OK,
            "pair {i} first"
        );
        assert_eq!(
            status(&service, &t2, &s2).await,
            StatusCode::OK,
            "pair {i} second"
        );
        assert_eq!(
            status(&service, &t1, &s1).await,
            StatusCode::TOO_MANY_REQUESTS,
            "pair {i} first again"
        );
        assert_eq!(
            status(&service, &t2, &s2).await,
            StatusCode::TOO_MANY_REQUESTS,
            "pair {i} second again"
        );
    }
}

/// With a tenant-scoped quota of 1 in the policy (and a roomy subject
/// quota), the tenants of every pair whose tenants differ have separate
/// tenant windows: each tenant admits one request, then denies any other
/// subject of it. Pairs with equal tenants share the tenant window (the
/// second is denied by the tenant quota, not let through).
async fn pairs_have_separate_tenant_windows(store: RedisStore) {
    let store = Arc::new(store);
    // A policy of its own per pair (its own windows): pairs share tenants.
    for (i, (t1, s1, t2, s2)) in hostile_pairs().into_iter().enumerate() {
        let policy = Policy::new(
            "hostile",
            [
                "10/1m"
                    .parse::<Quota>()
                    .unwrap()
                    .named(&format!("user-{i}"))
                    .unwrap(),
                "1/1m"
                    .parse::<Quota>()
                    .unwrap()
                    .named(&format!("org-{i}"))
                    .unwrap()
                    .scoped(Scope::Tenant),
            ],
        )
        .unwrap();
        let service = layer(store.clone(), policy);
        assert_eq!(
            status(&service, &t1, &s1).await,
            StatusCode::OK,
            "pair {i} first"
        );
        let second = status(&service, &t2, &s2).await;
        if t1 == t2 {
            assert_eq!(
                second,
                StatusCode::TOO_MANY_REQUESTS,
                "pair {i}: same tenant"
            );
        } else {
            assert_eq!(second, StatusCode::OK, "pair {i} second");
            assert_eq!(
                status(&service, &t2, b"another-user").await,
                StatusCode::TOO_MANY_REQUESTS,
                "pair {i}: second tenant's window used"
            );
        }
        assert_eq!(
            status(&service, &t1, b"another-user").await,
            StatusCode::TOO_MANY_REQUESTS,
            "pair {i}: first tenant's window used"
        );
    }
}

/// Values one byte beyond `DEFAULT_MAX_LEN` give no key: a 400, never a
/// 5xx, and nothing is counted: a second layer with a larger `max_len` on
/// the same windows then admits each of those values once (and 64 KiB
/// values, differing only in their last byte, once each), then denies them.
async fn oversized_values(store: RedisStore) {
    let store = Store::builder(store)
        .timeout(Duration::from_secs(10))
        .build();
    let quota = "1/1m".parse::<Quota>().unwrap().named("user").unwrap();
    let default = SlidingWindowLayer::new(
        Limiter::builder(store.clone(), quota.clone())
            .local_capacity(0)
            .build(),
        Header::new("x-user-id")
            .unwrap()
            .with_tenant(Header::new("x-tenant-id").unwrap()),
    )
    .layer(service_fn(ok));
    let over = b"{:%\xff".repeat(DEFAULT_MAX_LEN / 4 + 1);
    assert!(over.len() > DEFAULT_MAX_LEN);
    for _ in 0..3 {
        assert_eq!(status(&default, &over, b"u").await, StatusCode::BAD_REQUEST);
        assert_eq!(status(&default, b"t", &over).await, StatusCode::BAD_REQUEST);
    }

    let big = 64 * 1024;
    let roomy = SlidingWindowLayer::new(
        Limiter::builder(store, quota).local_capacity(0).build(),
        Header::new("x-user-id")
            .unwrap()
            .max_len(big)
            .with_tenant(Header::new("x-tenant-id").unwrap().max_len(big)),
    )
    .layer(service_fn(ok));
    let huge_a = b"{:%\xff".repeat(big / 4);
    let mut huge_b = huge_a.clone();
    *huge_b.last_mut().unwrap() = b'}';
    let (t, u) = (b"t".to_vec(), b"u".to_vec());
    let sent = [
        (&over, &u),
        (&t, &over),
        (&over, &huge_a),
        (&over, &huge_b),
        (&huge_a, &over),
    ];
    for (i, (tenant, user)) in sent.iter().enumerate() {
        assert_eq!(status(&roomy, tenant, user).await, StatusCode::OK, "{i}");
    }
    for (i, (tenant, user)) in sent.iter().enumerate() {
        assert_eq!(
            status(&roomy, tenant, user).await,
            StatusCode::TOO_MANY_REQUESTS,
            "{i}"
        );
    }
}

/// A per-run namespace, so that reruns and other tests on the shared
/// server never meet these windows.
fn run_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher.finish()
}

fn single(server: &RedisServer, name: &str) -> RedisStore {
    RedisStore::builder()
        .url(server.url())
        .prefix(format!("hostile-{name}-{:x}:", run_id()))
        .build()
        .unwrap()
}

fn cluster(cluster: &RedisCluster, name: &str) -> RedisStore {
    RedisStore::builder()
        .cluster(cluster.urls())
        .prefix(format!("hostile-{name}-{:x}:", run_id()))
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_server_subject_windows_never_collide() {
    let server = RedisServer::shared();
    pairs_have_separate_subject_windows(single(&server, "subject")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_server_tenant_windows_never_collide() {
    let server = RedisServer::shared();
    pairs_have_separate_tenant_windows(single(&server, "tenant")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_server_oversized_values() {
    let server = RedisServer::shared();
    oversized_values(single(&server, "oversized")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_subject_windows_never_collide() {
    let nodes = RedisCluster::shared();
    pairs_have_separate_subject_windows(cluster(&nodes, "subject")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_tenant_windows_never_collide() {
    let nodes = RedisCluster::shared();
    pairs_have_separate_tenant_windows(cluster(&nodes, "tenant")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_oversized_values() {
    let nodes = RedisCluster::shared();
    oversized_values(cluster(&nodes, "oversized")).await;
}
