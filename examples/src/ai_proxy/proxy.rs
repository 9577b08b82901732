//! Forwarding to the model upstream, and how a forwarded stream ends.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderName, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::json;
use tokio::sync::watch;
use tower_window::layer::Usage;

use super::tokens::Chunk;

/// The largest JSON (not streamed) answer read to find its usage.
const MAX_JSON: usize = 16 << 20;

/// Headers of one hop only, never forwarded (RFC 9110, 7.6.1).
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// What the forwarding handler shares.
pub(super) struct Upstream {
    client: Client<HttpConnector, Body>,
    /// `http://host:port`, without a path.
    base: Uri,
    idle_timeout: Duration,
    /// Set when the proxy cuts the streams still running at shutdown.
    cut: watch::Sender<bool>,
}

impl Upstream {
    pub(super) fn new(base: Uri, idle_timeout: Duration) -> Arc<Self> {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        Arc::new(Self {
            client: Client::builder(TokioExecutor::new()).build(connector),
            base,
            idle_timeout,
            cut: watch::channel(false).0,
        })
    }

    /// Ends every stream in flight, now and from now on.
    pub(super) fn cut_streams(&self) {
        self.cut.send_replace(true);
    }
}

/// How a forwarded stream ended before the model finished it: sent to the
/// client as a last `data: {"error":...}` event, so it gets a complete
/// HTTP answer that says why.
#[derive(Debug, Clone, Copy)]
enum Cut {
    Upstream,
    Stalled,
    ShuttingDown,
}

impl Cut {
    fn event(self, idle: Duration) -> Bytes {
        let (kind, message) = match self {
            Self::Upstream => ("upstream_error", "the model's stream failed".to_owned()),
            Self::Stalled => (
                "upstream_timeout",
                format!("the model sent nothing for {} ms", idle.as_millis()),
            ),
            Self::ShuttingDown => ("shutting_down", "the proxy is shutting down".to_owned()),
        };
        let body = json!({"error": {"type": kind, "message": message}});
        Bytes::from(format!("data: {body}\n\n"))
    }
}

/// Forwards the request to the upstream, its body and the answer's
/// streamed, and ends a stream that fails, stalls or outlives a shutdown
/// with an error event.
pub(super) async fn forward(State(upstream): State<Arc<Upstream>>, request: Request) -> Response {
    let (mut parts, body) = request.into_parts();
    let mut uri = upstream.base.clone().into_parts();
    uri.path_and_query = parts.uri.path_and_query().cloned();
    parts.uri = match Uri::from_parts(uri) {
        Ok(uri) => uri,
        Err(_) => return error(StatusCode::BAD_REQUEST, "bad request target"),
    };
    parts.headers.remove(header::HOST);
    for name in &HOP_BY_HOP {
        parts.headers.remove(name);
    }
    let idle = upstream.idle_timeout;
    let sent = upstream.client.request(Request::from_parts(parts, body));
    let response = match tokio::time::timeout(idle, sent).await {
        Ok(Ok(response)) => response,
        Ok(Err(e)) => return error(StatusCode::BAD_GATEWAY, &format!("upstream: {e}")),
        Err(_) => return error(StatusCode::GATEWAY_TIMEOUT, "upstream did not answer"),
    };
    let (mut head, body) = response.into_parts();
    for name in &HOP_BY_HOP {
        head.headers.remove(name);
    }
    let streamed = head
        .headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|t| t.as_bytes().starts_with(b"text/event-stream"));
    if streamed {
        let body = watched(Body::new(body), idle, upstream.cut.subscribe());
        return Response::from_parts(head, body);
    }
    // A JSON answer: read whole, its usage put where the counter reads it.
    let bytes =
        match tokio::time::timeout(idle, axum::body::to_bytes(Body::new(body), MAX_JSON)).await {
            Ok(Ok(bytes)) => bytes,
            Ok(Err(_)) => return error(StatusCode::BAD_GATEWAY, "upstream answer failed"),
            Err(_) => return error(StatusCode::GATEWAY_TIMEOUT, "upstream answer stalled"),
        };
    if let Ok(Chunk {
        usage: Some(usage), ..
    }) = serde_json::from_slice(&bytes)
    {
        head.extensions.insert(Usage(usage.completion_tokens));
    }
    Response::from_parts(head, Body::from(bytes))
}

/// The upstream's stream, ended with a [`Cut`] event when it fails, sends
/// nothing for `idle`, or `cut` is set.
fn watched(body: Body, idle: Duration, cut: watch::Receiver<bool>) -> Body {
    let frames = futures_util::stream::unfold(
        Some((body.into_data_stream(), cut)),
        move |state| async move {
            let (mut data, mut cut) = state?;
            let cut_set = async {
                // A sender gone (the router dropped) never cuts.
                if cut.wait_for(|&cut| cut).await.is_err() {
                    std::future::pending::<()>().await;
                }
            };
            let next = tokio::select! {
                next = tokio::time::timeout(idle, data.next()) => Some(next),
                () = cut_set => None,
            };
            let end = match next {
                Some(Ok(Some(Ok(bytes)))) => return Some((Ok(bytes), Some((data, cut)))),
                Some(Ok(None)) => return None,
                Some(Ok(Some(Err(_)))) => Cut::Upstream,
                Some(Err(_)) => Cut::Stalled,
                None => Cut::ShuttingDown,
            };
            Some((Ok::<_, std::convert::Infallible>(end.event(idle)), None))
        },
    );
    Body::from_stream(frames)
}

/// An OpenAI-style error answer.
fn error(status: StatusCode, message: &str) -> Response {
    let body = json!({"error": {"message": message, "type": "proxy_error"}});
    (status, Json(body)).into_response()
}
