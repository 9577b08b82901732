//! [`Resume`]: where a client resumes a room, from the upgrade's query.

use std::fmt;

use axum::extract::{FromRequestParts, Query};
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use tower_window::events::Position;

/// Where a room socket resumes: the `epoch` and `last_event_id` query
/// parameters of its upgrade request.
///
/// - neither: `Resume(None)`, a fresh join;
/// - `epoch` alone (or with an empty `last_event_id`): from the start of
///   that epoch (the `joined` frame's, for a client that got no event);
/// - both: after that event of that epoch;
/// - anything else (an epoch not 1 to 64 lowercase hex digits, an id not
///   `<ms>-<seq>` within 2^53 - 1, `last_event_id` without `epoch`, a
///   parameter given twice or not UTF-8): [`InvalidResume`], a `400`
///   before the upgrade.
///
/// ```
/// use axum_window_ext::ws::rooms::{InvalidResume, Resume};
///
/// assert_eq!(Resume::from_query(None)?, Resume(None));
/// let Resume(position) = Resume::from_query(Some("room=lobby&epoch=18c0f3a1&last_event_id=1700000000000-0"))?;
/// assert_eq!(position.unwrap().after().millis(), 1_700_000_000_000);
/// assert_eq!(Resume::from_query(Some("last_event_id=1-0")), Err(InvalidResume::MissingEpoch));
/// assert_eq!(Resume::from_query(Some("epoch=zz")), Err(InvalidResume::Malformed));
/// # Ok::<(), InvalidResume>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resume(pub Option<Position>);

/// Any other parameters are ignored.
#[derive(Default, Deserialize)]
struct Params {
    epoch: Option<String>,
    last_event_id: Option<String>,
}

impl Resume {
    /// The position named by the query string `query` (without the `?`).
    pub fn from_query(query: Option<&str>) -> Result<Self, InvalidResume> {
        let params: Params = match query {
            None => Params::default(),
            Some(query) => {
                let uri = format!("/?{query}")
                    .parse()
                    .map_err(|_| InvalidResume::Query("not a query string".to_owned()))?;
                Query::try_from_uri(&uri)
                    .map_err(|rejection| InvalidResume::Query(rejection.body_text()))?
                    .0
            }
        };
        Self::parse(params.epoch.as_deref(), params.last_event_id.as_deref())
    }

    /// The position named by the decoded parameters.
    pub fn parse(epoch: Option<&str>, last_event_id: Option<&str>) -> Result<Self, InvalidResume> {
        match (epoch, last_event_id) {
            (Some(epoch), last) => Position::parse(epoch, last.unwrap_or(""))
                .map(|position| Self(Some(position)))
                .map_err(|_| InvalidResume::Malformed),
            (None, Some(_)) => Err(InvalidResume::MissingEpoch),
            (None, None) => Ok(Self(None)),
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Resume {
    type Rejection = InvalidResume;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Self::from_query(parts.uri.query())
    }
}

/// Why a [`Resume`] was refused: a `400` problem+json of
/// [`TYPE_INVALID_INPUT`](crate::TYPE_INVALID_INPUT).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum InvalidResume {
    /// The epoch or the event id is not well-formed.
    Malformed,
    /// `last_event_id` without the `epoch` it belongs to.
    MissingEpoch,
    /// The query cannot be read: axum's reason.
    Query(String),
}

impl fmt::Display for InvalidResume {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Malformed => f.write_str("epoch or last_event_id: malformed"),
            Self::MissingEpoch => f.write_str("last_event_id needs its epoch"),
            Self::Query(reason) => f.write_str(reason),
        }
    }
}

impl std::error::Error for InvalidResume {}

impl IntoResponse for InvalidResume {
    fn into_response(self) -> Response {
        crate::problem::invalid_input(self.to_string())
    }
}
