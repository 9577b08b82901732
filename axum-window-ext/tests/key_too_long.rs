//! A rate-limit key longer than its extractor accepts, over HTTP
//! (problem+json) and on a WebSocket upgrade (refused before the `101`),
//! each with its own `type` and `detail`, distinct from a missing key.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use axum::body::Body;
use axum::extract::ws::WebSocketUpgrade;
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use axum_window_ext::{RejectionResponse, TYPE_KEY_TOO_LONG, TYPE_MISSING_KEY};
use http_body_util::BodyExt;
use serde_json::Value;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Error as WsError;
use tower::ServiceExt;
use tower_window::key::{Header, DEFAULT_MAX_LEN};
use tower_window::layer::Rejection;
use tower_window::{Limiter, MemoryStore, Quota};

const DETAIL: &str =
    "the value that identifies who is calling is longer than 1024 bytes (rate-limit key too long)";

fn app() -> Router {
    let limiter = Limiter::new(MemoryStore::new(), "100/1m".parse::<Quota>().unwrap());
    let layer = axum_window_ext::layer(limiter, Header::new("x-user-id").unwrap());
    let ws = get(|upgrade: WebSocketUpgrade| async move { upgrade.on_upgrade(|_socket| async {}) });
    Router::new()
        .route(
            "/hello",
            get(|| async { "hello" }).route_layer(layer.clone()),
        )
        .route("/ws", ws.route_layer(layer))
}

async fn problem(response: Response) -> Value {
    let body = response.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&body).unwrap()
}

#[tokio::test]
async fn http_answers_400_key_too_long_with_its_own_type_and_detail() {
    let request = |user: Option<&[u8]>| {
        let mut request = http::Request::get("/hello");
        if let Some(user) = user {
            request = request.header("x-user-id", user);
        }
        request.body(Body::empty()).unwrap()
    };
    let too_long = app()
        .oneshot(request(Some(&[b'a'; DEFAULT_MAX_LEN + 1])))
        .await
        .unwrap();
    assert_eq!(too_long.status(), 400);
    assert_eq!(
        too_long.headers()["content-type"],
        "application/problem+json"
    );
    assert_eq!(
        problem(too_long).await,
        serde_json::json!({
            "type": TYPE_KEY_TOO_LONG,
            "title": "Rate-limit key too long",
            "status": 400,
            "detail": DETAIL,
        })
    );

    let missing = problem(app().oneshot(request(None)).await.unwrap()).await;
    assert_eq!(missing["type"], TYPE_MISSING_KEY);
    assert_ne!(missing["detail"], DETAIL);

    // A handler can answer the same way.
    let response: Response =
        axum::response::IntoResponse::into_response(RejectionResponse(Rejection::KeyTooLong {
            max_len: 1024,
        }));
    assert_eq!(response.status(), 400);
    assert_eq!(problem(response).await["type"], TYPE_KEY_TOO_LONG);
}

#[tokio::test]
async fn a_websocket_upgrade_with_a_key_too_long_is_refused_before_the_101() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, app()).await.unwrap() });
    let connect = |user: Vec<u8>| async move {
        let mut request = format!("ws://{addr}/ws").into_client_request().unwrap();
        request
            .headers_mut()
            .insert("x-user-id", http::HeaderValue::from_bytes(&user).unwrap());
        tokio::time::timeout(
            Duration::from_secs(10),
            tokio_tungstenite::connect_async(request),
        )
        .await
        .expect("answered within the bound")
    };

    match connect(vec![b'a'; DEFAULT_MAX_LEN + 1]).await {
        Err(WsError::Http(response)) => {
            assert_eq!(response.status(), 400);
            let body: Value = serde_json::from_slice(response.body().as_ref().unwrap()).unwrap();
            assert_eq!(body["type"], TYPE_KEY_TOO_LONG);
            assert_eq!(body["detail"], DETAIL);
        }
        other => panic!("expected a 400 instead of the upgrade, got {other:?}"),
    }
    let (socket, response) = connect(b"ann".to_vec()).await.unwrap();
    assert_eq!(response.status(), 101);
    drop(socket);
    server.abort();
}
