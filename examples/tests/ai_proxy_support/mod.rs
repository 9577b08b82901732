//! The ai-proxy tests' parts: the fake model and proxy nodes served on
//! loopback ports, a streaming client that counts what it was sent, and a
//! reading of a tenant's recorded tokens.
#![allow(dead_code)] // each test crate uses part of it

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tower_window::{Limiter, Quota, WindowKey};
use tower_window_examples::ai_proxy::{fake_model, Args, Proxy};

/// Every wait is bounded by this (a bound, never asserted as a speed).
pub(crate) const PATIENCE: Duration = Duration::from_secs(60);

/// `router` served on a loopback port, in a task.
pub(crate) async fn serve(router: axum::Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    address
}

/// The fake model on a loopback port.
pub(crate) async fn model() -> SocketAddr {
    serve(fake_model()).await
}

/// A proxy node served on a loopback port by [`Proxy::serve`].
pub(crate) struct Node {
    pub(crate) address: SocketAddr,
    pub(crate) limiter: Limiter,
    shutdown: Option<oneshot::Sender<()>>,
    served: Option<JoinHandle<std::io::Result<()>>>,
}

impl Node {
    /// `ai-proxy --upstream <model> <flags>`, with a shutdown grace of
    /// `grace`.
    pub(crate) async fn start(model: SocketAddr, flags: &[&str], grace: Duration) -> Self {
        let upstream = format!("http://{model}");
        let args = [&["ai-proxy", "--upstream", &upstream], flags].concat();
        let config = Args::try_parse_from(args).unwrap().into_config().unwrap();
        let proxy = Proxy::new(config);
        let limiter = proxy.limiter().clone();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        let stop = async move {
            let _ = rx.await;
        };
        let served = tokio::spawn(proxy.serve(listener, stop, grace));
        Self {
            address,
            limiter,
            shutdown: Some(tx),
            served: Some(served),
        }
    }

    /// Shuts it down as the binary does on a signal, and waits until
    /// [`Proxy::serve`] returned (every connection closed, every usage
    /// settled).
    pub(crate) async fn shut_down(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(served) = self.served.take() {
            let result = tokio::time::timeout(PATIENCE, served).await;
            result.expect("serve returns").unwrap().unwrap();
        }
    }

    /// Tokens recorded for `tenant` in the window (see [`recorded`]).
    pub(crate) async fn recorded(&self, tenant: &str) -> u64 {
        recorded(&self.limiter, tenant).await
    }
}

/// The tokens recorded in `tenant`'s window, debt included: a peek through
/// the same quota with a limit no test reaches (a quota's window is kept
/// whatever its limit), so `remaining` does not stop at 0.
pub(crate) async fn recorded(limiter: &Limiter, tenant: &str) -> u64 {
    const HUGE: u32 = 1_000_000_000;
    let budget = limiter.policy().quotas()[0].clone();
    let unbounded: Quota = format!("{HUGE}/{}", budget.to_string().split_once('/').unwrap().1)
        .parse::<Quota>()
        .unwrap();
    assert_eq!(unbounded.state_id(), budget.state_id());
    let peek = Limiter::new(limiter.store().clone(), unbounded);
    let key = WindowKey::for_subject(tenant.to_owned());
    let left = peek.peek_policy(&key, peek.policy(), 1).await.unwrap();
    u64::from(HUGE - left.remaining())
}

/// An HTTP/1.1 client; one connection per request in flight.
pub(crate) type HttpClient = Client<HttpConnector, Full<Bytes>>;

pub(crate) fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// `POST /v1/chat/completions` on `node` for `tenant`, streamed, asking
/// for `tokens` tokens, with the fake model's control `headers`.
pub(crate) fn chat(
    node: SocketAddr,
    tenant: &str,
    tokens: u32,
    headers: &[(&str, &str)],
) -> http::Request<Full<Bytes>> {
    let body = serde_json::json!({
        "model": "fake",
        "stream": true,
        "max_tokens": tokens,
        "messages": [{"role": "user", "content": "count to a thousand"}],
    });
    let mut request = http::Request::post(format!("http://{node}/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("x-tenant", tenant);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

/// What a client was sent of one streamed answer, counted from its events.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Received {
    /// Content deltas.
    pub(crate) deltas: u32,
    /// The `usage` object's `completion_tokens`.
    pub(crate) usage: Option<u32>,
    /// The `error` event's `type` (the proxy ended the stream).
    pub(crate) error: Option<String>,
    /// `data: [DONE]` came.
    pub(crate) done: bool,
    /// The HTTP body ended cleanly.
    pub(crate) ended: bool,
}

impl Received {
    fn on_event(&mut self, event: &str) {
        let Some(data) = event.trim().strip_prefix("data:") else {
            return;
        };
        if data.trim() == "[DONE]" {
            self.done = true;
            return;
        }
        let value: Value = serde_json::from_str(data).unwrap();
        let choices = value["choices"].as_array().map_or(&[][..], Vec::as_slice);
        let deltas = choices
            .iter()
            .filter(|c| {
                c["delta"]["content"]
                    .as_str()
                    .is_some_and(|s| !s.is_empty())
            })
            .count();
        self.deltas += u32::try_from(deltas).unwrap();
        if let Some(tokens) = value["usage"]["completion_tokens"].as_u64() {
            self.usage = Some(u32::try_from(tokens).unwrap());
        }
        if let Some(kind) = value["error"]["type"].as_str() {
            self.error = Some(kind.to_owned());
        }
    }
}

/// A streamed answer being read: dropping it is the client going away.
pub(crate) struct Events {
    body: Body,
    /// An event not yet whole.
    pending: String,
    /// What was read so far.
    pub(crate) received: Received,
}

impl Events {
    pub(crate) fn new<B>(response: http::Response<B>) -> Self
    where
        B: HttpBody<Data = Bytes> + Send + 'static,
        B::Error: Into<axum::BoxError>,
    {
        Self {
            body: Body::new(response.into_body()),
            pending: String::new(),
            received: Received::default(),
        }
    }

    /// Reads events until the body ends or fails, or (with `deltas`) until
    /// that many deltas came in all.
    pub(crate) async fn read(&mut self, deltas: Option<u32>) {
        while deltas.is_none_or(|k| self.received.deltas < k) {
            let frame = tokio::time::timeout(PATIENCE, self.body.frame()).await;
            match frame.expect("the stream goes on or ends") {
                Some(Ok(frame)) => {
                    let Ok(data) = frame.into_data() else {
                        continue;
                    };
                    self.pending.push_str(std::str::from_utf8(&data).unwrap());
                    while let Some(end) = self.pending.find("\n\n") {
                        let event: String = self.pending.drain(..end + 2).collect();
                        self.received.on_event(&event);
                    }
                }
                Some(Err(_)) => return,
                None => {
                    self.received.ended = true;
                    return;
                }
            }
        }
    }
}

/// Sends `request`: its status and its answer, unread.
pub(crate) async fn send(
    client: &HttpClient,
    request: http::Request<Full<Bytes>>,
) -> (u16, Events) {
    let response = tokio::time::timeout(PATIENCE, client.request(request))
        .await
        .expect("an answer")
        .unwrap();
    (response.status().as_u16(), Events::new(response))
}

/// Sends `request` and reads the whole answer: its status and, if it was
/// admitted, what the client was sent.
pub(crate) async fn stream(
    client: &HttpClient,
    request: http::Request<Full<Bytes>>,
) -> (u16, Received) {
    let (status, mut events) = send(client, request).await;
    events.read(None).await;
    (status, events.received)
}
