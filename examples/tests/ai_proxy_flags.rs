//! The ai-proxy's bad flags and bad requests: a typed error naming the
//! flag, or a 4xx answer that charges nothing; never a panic.
#![allow(clippy::unwrap_used)]

mod ai_proxy_support;

use std::time::Duration;

use clap::Parser;
use tower_window_examples::ai_proxy::{Args, DELAY_MS};

use ai_proxy_support::{chat, client, model, stream, Node};

fn refused(flags: &[&str]) -> String {
    let args = Args::try_parse_from([&["ai-proxy"], flags].concat()).unwrap();
    let error = args.into_config().unwrap_err();
    format!("{} {}", error.flag, error)
}

#[test]
fn bad_flags_are_typed_errors_naming_the_flag() {
    let gcra = refused(&[
        "--upstream",
        "http://127.0.0.1:9",
        "--budget",
        "100/1m gcra",
    ]);
    assert!(
        gcra.starts_with("--budget ") && gcra.contains("gcra"),
        "{gcra}"
    );
    for upstream in [
        "https://api.example",
        "127.0.0.1:8000",
        "http://",
        "not a url",
    ] {
        let error = refused(&["--upstream", upstream]);
        assert!(error.starts_with("--upstream "), "{upstream}: {error}");
    }
    assert!(refused(&[]).starts_with("--upstream "));
    let error = refused(&["--upstream", "http://127.0.0.1:9", "--redis-url", "nope"]);
    assert!(error.starts_with("--redis-url "), "{error}");
    for flags in [
        &["--upstream", "http://a:1", "--fake-upstream"][..],
        &["--estimate", "0"],
        &["--budget", "0/1m"],
        &["--idle-timeout", "soon"],
    ] {
        let parsed = Args::try_parse_from([&["ai-proxy"], flags].concat());
        assert!(parsed.is_err(), "{flags:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_answered_4xx_and_charge_nothing() {
    let node = Node::start(model().await, &["--budget", "1000/1h"], Duration::ZERO).await;
    let client = client();
    // No tenant: the proxy's 400, nothing reserved.
    let mut request = chat(node.address, "acme", 5, &[]);
    request.headers_mut().remove("x-tenant");
    assert_eq!(stream(&client, request).await.0, 400);
    // The model refuses the body, or the test header: its 4xx passes
    // through, the reservation comes back whole.
    let mut request = chat(node.address, "acme", 5, &[]);
    *request.body_mut() = r#"{"max_tokens":"many"}"#.into();
    assert_eq!(stream(&client, request).await.0, 422);
    let request = chat(node.address, "acme", 5, &[(DELAY_MS, "-1")]);
    assert_eq!(stream(&client, request).await.0, 400);
    let request = chat(node.address, "acme", 100_001, &[]);
    assert_eq!(stream(&client, request).await.0, 400);
    node.limiter.settled().await;
    assert_eq!(node.limiter.stats().settled, 3);
    assert_eq!(node.recorded("acme").await, 0);
}
