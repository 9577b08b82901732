//! The layer in `Typed` mode, for a service that is not HTTP. CI also runs
//! this file with `--no-default-features --features tower`: the mode, its
//! rejections and their statuses build without the `http` crate.
#![allow(clippy::unwrap_used)]

use tower::{service_fn, Layer, Service, ServiceExt};
use tower_window::layer::{BoxError, MissingKey, Rejection, Status};
use tower_window::tenant::{TenantRegistry, TenantSpec, TenantsConfig};
use tower_window::{key::Constant, Limiter, MemoryStore, Quota, SlidingWindowLayer, WindowKey};

/// A job: who sends it, and its payload.
#[derive(Clone)]
struct Job {
    tenant: &'static str,
    user: Option<&'static str>,
    payload: u64,
}

fn job(user: &'static str, payload: u64) -> Job {
    Job {
        tenant: "acme",
        user: Some(user),
        payload,
    }
}

fn by_user(job: &Job) -> Option<WindowKey> {
    job.user.map(|user| WindowKey::new(job.tenant, user))
}

fn rejection(error: &BoxError) -> &Rejection {
    error
        .downcast_ref::<Rejection>()
        .expect("a layer rejection, not the inner service's error")
}

async fn double(job: Job) -> Result<u64, std::io::Error> {
    Ok(job.payload * 2)
}

#[tokio::test]
async fn admits_up_to_the_quota_then_rejects_with_429() {
    let limiter = Limiter::new(MemoryStore::new(), "2/1h".parse::<Quota>().unwrap());
    let layer = SlidingWindowLayer::new(limiter, by_user).typed_errors();
    let service = layer.layer(service_fn(double));

    assert_eq!(service.clone().oneshot(job("ann", 1)).await.unwrap(), 2);
    assert_eq!(service.clone().oneshot(job("ann", 2)).await.unwrap(), 4);
    let error = service.clone().oneshot(job("ann", 3)).await.unwrap_err();
    let denied = rejection(&error);
    assert!(matches!(denied, Rejection::RateLimited(_)), "{denied:?}");
    assert_eq!(denied.status(), Status::TOO_MANY_REQUESTS);
    let decision = denied.decision().expect("a denial has a decision");
    assert!(!decision.allowed());
    assert_eq!(decision.remaining(), 0);
    // Another user's window is its own.
    assert_eq!(service.oneshot(job("bob", 5)).await.unwrap(), 10);
}

#[tokio::test]
async fn inner_errors_pass_boxed_and_unchanged() {
    let limiter = Limiter::new(MemoryStore::new(), "5/1h".parse::<Quota>().unwrap());
    let service = SlidingWindowLayer::new(limiter, Constant::new("jobs"))
        .typed_errors()
        .layer(service_fn(|_: Job| async {
            Err::<u64, _>(std::io::Error::other("disk full"))
        }));
    let error = service.oneshot(job("ann", 1)).await.unwrap_err();
    assert!(error.downcast_ref::<Rejection>().is_none());
    assert_eq!(error.to_string(), "disk full");
}

#[tokio::test]
async fn a_job_without_a_key_gets_the_configured_status_or_passes() {
    let limiter = Limiter::new(MemoryStore::new(), "1/1h".parse::<Quota>().unwrap());
    let anonymous = Job {
        user: None,
        ..job("ann", 7)
    };

    let reject = SlidingWindowLayer::new(limiter.clone(), by_user)
        .on_missing_key(MissingKey::Reject(Status::UNAUTHORIZED))
        .typed_errors()
        .layer(service_fn(double));
    let error = reject.oneshot(anonymous.clone()).await.unwrap_err();
    let missing = rejection(&error);
    assert!(
        matches!(missing, Rejection::MissingKey { .. }),
        "{missing:?}"
    );
    assert_eq!(missing.status(), 401);

    // Skipped jobs are neither checked nor counted: the one unit is still there.
    let skip = SlidingWindowLayer::new(limiter, by_user)
        .on_missing_key(MissingKey::Skip)
        .typed_errors()
        .layer(service_fn(double));
    for _ in 0..3 {
        assert_eq!(skip.clone().oneshot(anonymous.clone()).await.unwrap(), 14);
    }
    assert_eq!(skip.clone().oneshot(job("ann", 1)).await.unwrap(), 2);
    assert!(skip.oneshot(job("ann", 1)).await.is_err());
}

#[tokio::test]
async fn tenants_resolve_in_typed_mode_too() {
    let config = TenantsConfig::new()
        .with_tenant(
            "acme",
            TenantSpec::builder()
                .quota("jobs", "1/1h")
                .unwrap()
                .build()
                .unwrap(),
        )
        .unwrap();
    let limiter = Limiter::new(MemoryStore::new(), "100/1h".parse::<Quota>().unwrap());
    let mut service = SlidingWindowLayer::new(limiter, by_user)
        .tenants(TenantRegistry::new(config))
        .typed_errors()
        .layer(service_fn(double));

    assert_eq!(
        service
            .ready()
            .await
            .unwrap()
            .call(job("ann", 1))
            .await
            .unwrap(),
        2
    );
    let error = service
        .ready()
        .await
        .unwrap()
        .call(job("ann", 1))
        .await
        .unwrap_err();
    let denied = rejection(&error);
    assert_eq!(denied.status(), 429);
    assert_eq!(denied.decision().map(|d| d.quota().name()), Some("jobs"));

    let stranger = Job {
        tenant: "nobody",
        ..job("ann", 1)
    };
    let error = service.oneshot(stranger).await.unwrap_err();
    let unknown = rejection(&error);
    assert!(
        matches!(unknown, Rejection::UnknownTenant { .. }),
        "{unknown:?}"
    );
    assert_eq!(unknown.status(), Status::FORBIDDEN);
}
