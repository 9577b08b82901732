//! Heap allocations per decision on the hot path, counted by a global
//! allocator (dhat) (issue 10: zero for an allowed request whose key is present).
//!
//! ```text
//! cargo run --release -p tower-window-benches --bin hot_allocs
//! ```
//!
//! Each case warms its key up (so the key's state exists), then counts the
//! allocations of `ROUNDS` allowed requests on one thread and prints them per
//! request as a Markdown table. The layer cases call the service directly
//! (`poll_ready` + `call` + polling the response future) around a minimal
//! inner service; the row for that service alone is the baseline to
//! subtract. No number is asserted: this is a measurement.
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use http::{HeaderValue, Request, Response};
use tower_service::Service;
use tower_window::key::Header;
use tower_window::{
    BreakerConfig, KeyExtractor, Limiter, MemoryStore, Quota, SlidingWindowLayer, Store, WindowKey,
};

/// Counts every allocation (dhat's heap profiler in testing mode: no
/// unsafe code here, no file written).
#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

fn allocations() -> u64 {
    dhat::HeapStats::get().total_blocks
}

const ROUNDS: u64 = 10_000;
const ADMIT_ALL: &str = "1000000000/1s";

/// Polls a future that must be ready at once (everything here is in-process).
fn now<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("an in-process decision was pending"),
    }
}

/// Allocations per call of `f`, after one warm-up call.
fn per_request(mut f: impl FnMut()) -> f64 {
    f();
    let before = allocations();
    for _ in 0..ROUNDS {
        f();
    }
    (allocations() - before) as f64 / ROUNDS as f64
}

/// The inner service: answers like axum's `"ok"` handler (one
/// `content-type` header, so its `HeaderMap` exists). Its own allocations
/// and the request's are the baseline row; the layer's are the difference.
#[derive(Clone)]
struct Ok200;

impl<B> Service<Request<B>> for Ok200 {
    type Response = Response<()>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response<()>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<B>) -> Self::Future {
        let mut response = Response::new(());
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        std::future::ready(Ok(response))
    }
}

fn serve<S: Service<Request<()>, Response = Response<()>>>(service: &mut S, user: &HeaderValue)
where
    S::Error: std::fmt::Debug,
{
    let mut request = Request::new(());
    request.headers_mut().insert("x-user-id", user.clone());
    let mut cx = Context::from_waker(Waker::noop());
    assert!(service.poll_ready(&mut cx).is_ready());
    let response = now(service.call(request)).unwrap();
    assert!(response.status().is_success());
}

fn quota() -> Quota {
    ADMIT_ALL.parse().unwrap()
}

fn main() {
    let _profiler = dhat::Profiler::builder().testing().build();
    let key = WindowKey::for_subject("alice");
    let mut rows: Vec<(&str, f64)> = Vec::new();

    let bare = Limiter::new(MemoryStore::new(), quota());
    rows.push((
        "`Limiter::check`, `Limiter::new(MemoryStore)`",
        per_request(|| assert!(now(bare.check(&key, 1)).unwrap().allowed())),
    ));
    // The embedded store has no breaker by default: this row keeps one.
    let store = Store::builder(MemoryStore::new())
        .breaker(BreakerConfig::default())
        .build();
    let built = Limiter::builder(store, quota()).build();
    rows.push((
        "`Limiter::check`, `Limiter::builder` on a `MemoryStore` store with a breaker (local tier, breaker)",
        per_request(|| assert!(now(built.check(&key, 1)).unwrap().allowed())),
    ));
    let gcra = Limiter::new(
        MemoryStore::new(),
        "1000000000/1s gcra".parse::<Quota>().unwrap(),
    );
    rows.push((
        "`Limiter::check`, `MemoryStore`, GCRA",
        per_request(|| assert!(now(gcra.check(&key, 1)).unwrap().allowed())),
    ));

    let user = HeaderValue::from_static("alice");
    let fixed = key.clone();
    let no_copy = move |_: &Request<()>| Some(fixed.clone());
    let layer =
        |extract| SlidingWindowLayer::new(Limiter::new(MemoryStore::new(), quota()), extract);
    let mut typed = tower_layer::Layer::layer(&layer(no_copy.clone()).typed_errors(), Ok200);
    rows.push((
        "layer, `Typed` mode (no headers, no extension), key cloned",
        per_request(|| serve(&mut typed, &user)),
    ));
    let mut http = tower_layer::Layer::layer(&layer(no_copy.clone()), Ok200);
    rows.push((
        "layer, HTTP mode (headers + `Decision` extension), key cloned",
        per_request(|| serve(&mut http, &user)),
    ));
    let mut headers_only =
        tower_layer::Layer::layer(&layer(no_copy).decision_extension(false), Ok200);
    rows.push((
        "layer, HTTP mode, headers only (`decision_extension(false)`), key cloned",
        per_request(|| serve(&mut headers_only, &user)),
    ));
    // The same, with a tenant registry resolving the key's tenant (the
    // default tenant "" gets the file's `[default]`, its own policy name).
    let spec = tower_window::tenant::TenantSpec::new([quota()]).unwrap();
    let registry = tower_window::tenant::TenantRegistry::new(
        tower_window::tenant::TenantsConfig::new().with_default(spec),
    );
    let fixed = key.clone();
    let tenanted = SlidingWindowLayer::new(
        Limiter::new(MemoryStore::new(), quota()),
        move |_: &Request<()>| Some(fixed.clone()),
    )
    .typed_errors()
    .tenants(registry);
    let mut tenanted = tower_layer::Layer::layer(&tenanted, Ok200);
    rows.push((
        "layer, `Typed` mode, key cloned, policy from a `TenantRegistry`",
        per_request(|| serve(&mut tenanted, &user)),
    ));
    let header = SlidingWindowLayer::new(
        Limiter::new(MemoryStore::new(), quota()),
        Header::new("x-user-id").unwrap(),
    );
    let mut header = tower_layer::Layer::layer(&header, Ok200);
    rows.push((
        "layer, HTTP mode, key from the `x-user-id` header (`Header`)",
        per_request(|| serve(&mut header, &user)),
    ));
    let mut inner = Ok200;
    rows.push((
        "the inner service alone (baseline, request building included)",
        per_request(|| serve(&mut inner, &user)),
    ));
    let extract = Header::new("x-user-id").unwrap();
    rows.push((
        "`Header::extract` alone",
        per_request(|| {
            let mut request = Request::new(());
            request.headers_mut().insert("x-user-id", user.clone());
            assert!(KeyExtractor::extract(&extract, &request).is_some());
        }),
    ));

    println!("| path ({ROUNDS} allowed requests, key present) | allocations per request |");
    println!("|---|---:|");
    for (name, n) in rows {
        println!("| {name} | {n:.2} |");
    }
}
