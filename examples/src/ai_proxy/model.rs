//! A fake model upstream in the OpenAI style, for the example to run with
//! no other service and for the tests: `POST /v1/chat/completions` answers
//! `max_tokens` tokens of `"tok"`.
//!
//! - `"stream": true`: `text/event-stream`, one `data:` event per token
//!   (`{"choices":[{"delta":{"content":"tok"}}]}`), then an event with an
//!   empty `choices` and the `usage` object, then `data: [DONE]`.
//! - Otherwise one JSON `chat.completion` with its `usage`.
//!
//! Test controls, as request headers (a proxy forwards them):
//! [`DELAY_MS`] between events, [`FAIL_AFTER`] (the stream breaks after
//! that many tokens and one more delay, the connection cut mid-body) and [`STALL_AFTER`] (it
//! sends nothing more after that many tokens, and never ends).

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::rejection::JsonRejection;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

/// Header: milliseconds between streamed events (default 0).
pub const DELAY_MS: &str = "x-fake-delay-ms";
/// Header: the stream fails (the connection is cut) after this many tokens.
pub const FAIL_AFTER: &str = "x-fake-fail-after";
/// Header: the stream stalls for good after this many tokens.
pub const STALL_AFTER: &str = "x-fake-stall-after";

/// The most tokens one answer may ask for.
pub const MAX_TOKENS: u32 = 100_000;

/// The fake model's routes.
pub fn fake_model() -> Router {
    Router::new().route("/v1/chat/completions", post(complete))
}

#[derive(Deserialize)]
struct ChatRequest {
    #[serde(default)]
    stream: bool,
    #[serde(default = "default_max_tokens")]
    max_tokens: u32,
    #[serde(default)]
    messages: Vec<Message>,
}

#[derive(Deserialize)]
struct Message {
    #[serde(default)]
    content: String,
}

fn default_max_tokens() -> u32 {
    16
}

/// How one stream goes.
#[derive(Clone, Copy)]
struct Script {
    tokens: u32,
    delay: Duration,
    fail_after: Option<u32>,
    stall_after: Option<u32>,
}

impl Script {
    /// The script the test headers ask for.
    fn of(headers: &HeaderMap, tokens: u32) -> Result<Self, String> {
        let control = |name: &str| match headers.get(name) {
            None => Ok(None),
            Some(value) => value
                .to_str()
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .map(Some)
                .ok_or_else(|| format!("{name}: expected a whole number")),
        };
        Ok(Self {
            tokens,
            delay: Duration::from_millis(control(DELAY_MS)?.unwrap_or(0).into()),
            fail_after: control(FAIL_AFTER)?,
            stall_after: control(STALL_AFTER)?,
        })
    }
}

async fn complete(headers: HeaderMap, body: Result<Json<ChatRequest>, JsonRejection>) -> Response {
    let request = match body {
        Ok(Json(request)) => request,
        Err(rejection) => return error(rejection.status(), &rejection.body_text()),
    };
    if request.max_tokens > MAX_TOKENS {
        return error(
            StatusCode::BAD_REQUEST,
            &format!("max_tokens is at most {MAX_TOKENS}"),
        );
    }
    let script = match Script::of(&headers, request.max_tokens) {
        Ok(script) => script,
        Err(message) => return error(StatusCode::BAD_REQUEST, &message),
    };
    let prompt = request
        .messages
        .iter()
        .map(|m| m.content.split_whitespace().count())
        .sum::<usize>();
    let usage = json!({
        "prompt_tokens": prompt,
        "completion_tokens": script.tokens,
        "total_tokens": prompt + script.tokens as usize,
    });
    if request.stream {
        let response = Response::builder()
            .header(header::CONTENT_TYPE, "text/event-stream")
            .header(header::CACHE_CONTROL, "no-cache")
            .body(Body::from_stream(events(script, usage)));
        return response.unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response());
    }
    let content = vec!["tok"; script.tokens as usize].join(" ");
    Json(json!({
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "model": "fake",
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": content},
            "finish_reason": "length",
        }],
        "usage": usage,
    }))
    .into_response()
}

/// The events of one streamed answer, as `script` says.
fn events(
    script: Script,
    usage: Value,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send {
    let event = |value: Value| Bytes::from(format!("data: {value}\n\n"));
    let delta = event(json!({
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "model": "fake",
        "choices": [{"index": 0, "delta": {"content": "tok"}}],
    }));
    let last = event(json!({
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "model": "fake",
        "choices": [],
        "usage": usage,
    }));
    futures_util::stream::unfold(0u32, move |sent| {
        let (delta, last) = (delta.clone(), last.clone());
        async move {
            // Between events, and before a failure: what came before it
            // has left.
            if sent > 0 && sent <= script.tokens && !script.delay.is_zero() {
                tokio::time::sleep(script.delay).await;
            }
            if script.fail_after == Some(sent) {
                let broken = std::io::Error::other("the fake model failed mid-stream");
                return Some((Err(broken), u32::MAX));
            }
            if script.stall_after == Some(sent) {
                std::future::pending::<()>().await;
            }
            match sent {
                n if n < script.tokens => Some((Ok(delta), n + 1)),
                n if n == script.tokens => Some((Ok(last), n + 1)),
                n if n == script.tokens + 1 => {
                    Some((Ok(Bytes::from_static(b"data: [DONE]\n\n")), n + 1))
                }
                _ => None,
            }
        }
    })
}

/// An OpenAI-style error answer.
fn error(status: StatusCode, message: &str) -> Response {
    let body = json!({"error": {"message": message, "type": "invalid_request_error"}});
    (status, Json(body)).into_response()
}
