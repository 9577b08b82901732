//! The metered mode (`SlidingWindowLayer::metered`): each request reserves
//! its cost, and the usage counted from its response is settled exactly
//! once, however the response ends: complete, client gone, upstream error,
//! timeout. (Shutdown, where settles wait in tasks, is tested against Redis
//! in the tests package.)
//!
//! Every store here is the embedded one, whose settles answer at once, so
//! the windows can be read right after each step.

#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream;
use http::{Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, StreamBody};
use tokio::sync::mpsc;
use tower::{service_fn, ServiceBuilder, ServiceExt};
use tower_window::key::Constant;
use tower_window::layer::{HeadUsage, Metering, SlidingWindowLayer, Usage, UsageCounter};
use tower_window::{LeaseConfig, Limiter, ManualClock, MemoryStore, Policy, Quota, WindowKey};

type Frame = Result<http_body::Frame<Bytes>, std::io::Error>;
/// A streamed body (with an empty default, for rejections).
type Streamed = UnsyncBoxBody<Bytes, std::io::Error>;

/// One token per word of each frame.
#[derive(Default)]
struct Words(u32);

impl UsageCounter for Words {
    fn on_frame(&mut self, data: &[u8]) {
        let words = data
            .split(|b| b.is_ascii_whitespace())
            .filter(|w| !w.is_empty());
        self.0 += u32::try_from(words.count()).unwrap();
    }

    fn usage(&self) -> u32 {
        self.0
    }
}

fn limiter(quota: &str) -> Limiter {
    let store = MemoryStore::builder()
        .clock(ManualClock::new(1_700_000_000_000_000))
        .build();
    Limiter::new(store, quota.parse::<Quota>().unwrap())
}

/// Units left in the limiter's one key.
async fn remaining(limiter: &Limiter) -> u32 {
    let key = WindowKey::for_subject("all");
    limiter
        .peek_policy(&key, limiter.policy(), 1)
        .await
        .unwrap()
        .remaining()
}

/// A body fed by the returned sender, frame by frame.
fn streamed() -> (mpsc::UnboundedSender<Frame>, Streamed) {
    let (tx, rx) = mpsc::unbounded_channel();
    let frames = stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|f| (f, rx)) });
    (tx, StreamBody::new(frames).boxed_unsync())
}

fn data(text: &str) -> Frame {
    Ok(http_body::Frame::data(Bytes::from(text.to_owned())))
}

/// A service answering once with `body`.
fn answering(
    body: Streamed,
) -> impl tower::Service<Request<()>, Response = Response<Streamed>, Error = Infallible, Future: Send>
       + Clone {
    let body = Arc::new(Mutex::new(Some(body)));
    service_fn(move |_req| {
        let body = body.lock().unwrap().take().unwrap_or_default();
        async move { Ok::<_, Infallible>(Response::new(body)) }
    })
}

/// `body` answered behind a metered layer reserving `estimate` tokens and
/// counting words.
async fn call(
    limiter: &Limiter,
    estimate: u32,
    body: Streamed,
) -> Response<Metering<Streamed, Words>> {
    let layer = SlidingWindowLayer::new(limiter.clone(), Constant::new("all"))
        .cost(move |_: &Request<()>| estimate)
        .metered(Words::default);
    let service = ServiceBuilder::new().layer(layer).service(answering(body));
    service.oneshot(Request::new(())).await.unwrap()
}

#[tokio::test]
async fn a_complete_stream_settles_what_it_sent() {
    let limiter = limiter("1000/1m");
    let (tx, body) = streamed();
    let response = call(&limiter, 300, body).await;
    assert_eq!(response.status(), StatusCode::OK);
    // Reserved while the stream runs.
    assert_eq!(remaining(&limiter).await, 700);
    for text in ["one two", "three", "four five six"] {
        tx.send(data(text)).unwrap();
    }
    drop(tx);
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(bytes, "one twothreefour five six");
    assert_eq!(remaining(&limiter).await, 994);
    assert_eq!(
        (limiter.stats().settled, limiter.stats().settle_errors),
        (1, 0)
    );
}

#[tokio::test]
async fn a_client_gone_mid_stream_is_charged_what_it_was_sent() {
    let limiter = limiter("1000/1m");
    let (tx, body) = streamed();
    let mut body = call(&limiter, 300, body).await.into_body();
    tx.send(data("a b c d")).unwrap();
    tx.send(data("e f")).unwrap();
    for _ in 0..2 {
        body.frame().await.unwrap().unwrap();
    }
    // Never sent: the client is gone before this frame is read.
    tx.send(data("g h i")).unwrap();
    assert_eq!(body.usage(), Some(6));
    drop(body);
    assert_eq!(remaining(&limiter).await, 994);
    assert_eq!(limiter.stats().settled, 1);
}

#[tokio::test]
async fn an_upstream_error_settles_once_what_was_sent_before_it() {
    let limiter = limiter("1000/1m");
    let (tx, body) = streamed();
    let mut body = call(&limiter, 300, body).await.into_body();
    tx.send(data("a b c")).unwrap();
    tx.send(Err(std::io::Error::other("model crashed")))
        .unwrap();
    body.frame().await.unwrap().unwrap();
    assert!(body.frame().await.unwrap().is_err());
    assert_eq!(remaining(&limiter).await, 997);
    // Dropping the failed body settles nothing more.
    drop(body);
    assert_eq!(remaining(&limiter).await, 997);
    assert_eq!(limiter.stats().settled, 1);
}

#[tokio::test]
async fn an_inner_service_that_fails_gives_the_whole_reservation_back() {
    let limiter = limiter("1000/1m");
    let layer = SlidingWindowLayer::new(limiter.clone(), Constant::new("all"))
        .cost(|_: &Request<()>| 300)
        .metered(Words::default);
    let service = ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(|_req| async {
            Err::<Response<Streamed>, _>(std::io::Error::other("upstream refused"))
        }));
    assert!(service.oneshot(Request::new(())).await.is_err());
    assert_eq!(remaining(&limiter).await, 1000);
    assert_eq!(limiter.stats().settled, 1);
}

#[tokio::test(start_paused = true)]
async fn a_timeout_settles_what_was_sent_before_it() {
    let limiter = limiter("1000/1m");
    // Before the response: the timeout drops the request's future.
    let layer = SlidingWindowLayer::new(limiter.clone(), Constant::new("all"))
        .cost(|_: &Request<()>| 300)
        .metered(Words::default);
    let slow = ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(|_req| async {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok::<_, Infallible>(Response::new(streamed().1))
        }));
    let pending = slow.oneshot(Request::new(()));
    assert!(tokio::time::timeout(Duration::from_secs(30), pending)
        .await
        .is_err());
    assert_eq!(remaining(&limiter).await, 1000);
    // Mid-stream: a body timeout gives up on a stalled stream.
    let (tx, body) = streamed();
    let mut body = call(&limiter, 300, body).await.into_body();
    tx.send(data("a b")).unwrap();
    body.frame().await.unwrap().unwrap();
    let stalled = tokio::time::timeout(Duration::from_secs(30), body.frame()).await;
    assert!(stalled.is_err());
    drop(body);
    assert_eq!(remaining(&limiter).await, 998);
    assert_eq!(limiter.stats().settled, 2);
    drop(tx);
}

#[tokio::test]
async fn usage_past_the_budget_is_debt_and_denies_until_it_slides_out() {
    let limiter = limiter("100/1m");
    let (tx, body) = streamed();
    let response = call(&limiter, 50, body).await;
    tx.send(data(&"w ".repeat(130))).unwrap();
    drop(tx);
    response.into_body().collect().await.unwrap();
    assert_eq!(remaining(&limiter).await, 0);
    let (_tx, body) = streamed();
    let denied = call(&limiter, 1, body).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    // A rejection settles nothing.
    assert_eq!(denied.into_body().usage(), None);
    assert_eq!(limiter.stats().settled, 1);
}

#[tokio::test]
async fn cut_off_ends_the_stream_at_the_frame_that_spends_the_budget() {
    let limiter = limiter("100/1m");
    let layer = SlidingWindowLayer::new(limiter.clone(), Constant::new("all"))
        .cost(|_: &Request<()>| 40)
        .metered(Words::default)
        .cut_off(true);
    let (tx, body) = streamed();
    let service = ServiceBuilder::new().layer(layer).service(answering(body));
    let response = service.oneshot(Request::new(())).await.unwrap();
    // Budget: 40 reserved + 60 remaining. The third frame reaches it.
    for _ in 0..5 {
        tx.send(data(&"w ".repeat(45))).unwrap();
    }
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(bytes.len(), 3 * 90);
    // 135 recorded: 35 of debt, never more than one frame past the budget.
    assert_eq!(remaining(&limiter).await, 0);
    assert_eq!(limiter.stats().settled, 1);
}

#[tokio::test]
async fn a_usage_header_or_extension_settles_a_response_that_is_not_streamed() {
    let limiter = limiter("1000/1m");
    let layer = SlidingWindowLayer::new(limiter.clone(), Constant::new("all"))
        .cost(|_: &Request<String>| 100)
        .metered(HeadUsage::header(http::HeaderName::from_static(
            "x-usage-tokens",
        )));
    let service =
        ServiceBuilder::new()
            .layer(layer)
            .service(service_fn(|req: Request<String>| async move {
                let mut response = Response::builder().header("x-usage-tokens", "42");
                if req.body() == "extension" {
                    response = response.extension(Usage(7));
                }
                Ok::<_, Infallible>(response.body(String::from("done")).unwrap())
            }));
    let response = service
        .clone()
        .oneshot(Request::new(String::new()))
        .await
        .unwrap();
    assert_eq!(response.headers()["ratelimit"], r#""default";r=900;t=60"#);
    drop(response);
    assert_eq!(remaining(&limiter).await, 958);
    let response = service
        .oneshot(Request::new("extension".into()))
        .await
        .unwrap();
    response.into_body().collect().await.unwrap();
    assert_eq!(remaining(&limiter).await, 951);
    assert_eq!(limiter.stats().settled, 2);
}

#[tokio::test]
async fn a_gcra_policy_cannot_reserve() {
    let limiter = limiter("1000/1m gcra");
    let (_tx, body) = streamed();
    let response = call(&limiter, 10, body).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(limiter.stats().settled, 0);
}

/// Each quota's remaining in the limiter's one key, in policy order.
async fn remaining_each(limiter: &Limiter) -> Vec<u32> {
    let key = WindowKey::for_subject("all");
    let decision = limiter.peek_policy(&key, limiter.policy(), 1).await;
    let decision = decision.unwrap();
    decision.quotas().iter().map(|q| q.remaining()).collect()
}

#[tokio::test]
async fn reservations_skip_leases_and_shadow_quotas_count_what_was_used() {
    let store = MemoryStore::builder()
        .clock(ManualClock::new(1_700_000_000_000_000))
        .build();
    let quota = |text: &str, name: &str| text.parse::<Quota>().unwrap().named(name).unwrap();
    let policy = Policy::new(
        "tokens",
        [
            quota("1000/1m", "minute"),
            quota("100/1m", "trial").shadowed(true),
        ],
    )
    .unwrap();
    let limiter = Limiter::builder(store, policy)
        .leases(LeaseConfig::new(50).hot_after(1))
        .build();
    // Plain checks of the same key take a lease: the store counts all of
    // its units, the shadow quota as many as fit.
    let key = WindowKey::for_subject("all");
    for _ in 0..4 {
        assert!(limiter.check(&key, 1).await.unwrap().allowed());
    }
    assert!(limiter.stats().lease > 0, "{:?}", limiter.stats());
    let [minute, trial] = remaining_each(&limiter).await[..] else {
        panic!("two quotas")
    };
    // A reservation of 80 reaches the store whatever the leases hold, and
    // fits the shadow quota only if 80 units are left in it.
    let store_calls = limiter.stats().store;
    let (tx, body) = streamed();
    let response = call(&limiter, 80, body).await;
    assert_eq!(limiter.stats().store, store_calls + 1);
    tx.send(data(&"w ".repeat(30))).unwrap();
    drop(tx);
    response.into_body().collect().await.unwrap();
    assert_eq!(remaining_each(&limiter).await, [minute - 30, trial - 30]);
    // A second one, after the shadow quota is too full for its estimate:
    // it records nothing there, and the settle records the usage in full.
    let (tx, body) = streamed();
    let response = call(&limiter, trial - 30 + 1, body).await;
    tx.send(data(&"w ".repeat(20))).unwrap();
    drop(tx);
    response.into_body().collect().await.unwrap();
    assert_eq!(remaining_each(&limiter).await, [minute - 50, trial - 50]);
    assert_eq!(limiter.stats().settled, 2);
}
