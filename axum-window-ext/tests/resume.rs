//! `ws::rooms::Resume`: the rooms' resume position from the upgrade's
//! query, with the example gateway's `400` rules, as an extractor.
#![allow(clippy::unwrap_used)]

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use axum_window_ext::ws::rooms::{InvalidResume, Resume};
use axum_window_ext::TYPE_INVALID_INPUT;
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

const EPOCH: &str = "65a1b2c3d4e5f0123456789abcdef";

#[test]
fn the_gateways_rules() {
    let resume = |query: &str| Resume::from_query(Some(query));
    // Neither: a fresh join; other parameters are not its business.
    assert_eq!(Resume::from_query(None), Ok(Resume(None)));
    assert_eq!(resume("room=lobby&user=ann"), Ok(Resume(None)));
    // An epoch alone (or with an empty id): from the start of that epoch.
    for query in [
        format!("epoch={EPOCH}"),
        format!("epoch={EPOCH}&last_event_id="),
    ] {
        let Resume(position) = resume(&query).unwrap();
        let position = position.unwrap();
        assert_eq!(position.epoch.as_str(), EPOCH);
        assert_eq!(position.last_id, None);
    }
    let Resume(position) = resume(&format!("last_event_id=1700000000000-3&epoch={EPOCH}")).unwrap();
    let after = position.unwrap().after();
    assert_eq!((after.millis(), after.seq()), (1_700_000_000_000, 3));

    assert_eq!(
        resume("last_event_id=1-0"),
        Err(InvalidResume::MissingEpoch)
    );
    for malformed in [
        "epoch=zz".to_owned(),
        "epoch=".to_owned(),
        format!("epoch={}", "a".repeat(65)),
        format!("epoch={EPOCH}&last_event_id=x"),
        format!("epoch={EPOCH}&last_event_id=9007199254740992-0"),
        format!("epoch={EPOCH}&last_event_id=-1-0"),
        // Not UTF-8: decoded with U+FFFD, as axum's `Query` does, so no epoch.
        "epoch=%ff".to_owned(),
    ] {
        assert_eq!(
            resume(&malformed),
            Err(InvalidResume::Malformed),
            "{malformed}"
        );
    }
    let twice = resume(&format!("epoch={EPOCH}&epoch={EPOCH}"));
    assert!(matches!(twice, Err(InvalidResume::Query(_))), "{twice:?}");
    // Not UTF-8: decoded with U+FFFD, as axum's `Query` does: no epoch.
    assert_eq!(resume("epoch=%ff"), Err(InvalidResume::Malformed));
    // The gateway's details, word for word.
    assert_eq!(
        InvalidResume::Malformed.to_string(),
        "epoch or last_event_id: malformed"
    );
    assert_eq!(
        InvalidResume::MissingEpoch.to_string(),
        "last_event_id needs its epoch"
    );
}

#[tokio::test]
async fn the_extractor_answers_400_problem_json_before_the_handler() {
    let app = Router::new().route(
        "/rooms",
        get(|Resume(position): Resume| async move {
            match position {
                Some(position) => format!("after {}", position.after()),
                None => "fresh".to_owned(),
            }
        }),
    );
    let get = |uri: String| {
        let app = app.clone();
        async move {
            let request = http::Request::get(uri).body(Body::empty()).unwrap();
            let response = app.oneshot(request).await.unwrap();
            let status = response.status();
            let content_type = response.headers().get("content-type").cloned();
            let body = response.into_body().collect().await.unwrap().to_bytes();
            (status, content_type, body)
        }
    };
    let (status, _, body) = get("/rooms".to_owned()).await;
    assert_eq!((status.as_u16(), &body[..]), (200, &b"fresh"[..]));
    let (status, _, body) = get(format!("/rooms?epoch={EPOCH}&last_event_id=5-1")).await;
    assert_eq!((status.as_u16(), &body[..]), (200, &b"after 5-1"[..]));

    let (status, content_type, body) = get("/rooms?last_event_id=5-1".to_owned()).await;
    assert_eq!(status, 400);
    assert_eq!(content_type.unwrap(), "application/problem+json");
    let problem: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        problem,
        serde_json::json!({
            "type": TYPE_INVALID_INPUT,
            "title": "Invalid input",
            "status": 400,
            "detail": "last_event_id needs its epoch",
        })
    );
}
