//! [`Status`]: a rejection's status code, without the `http` crate.

use std::fmt;

/// The HTTP status (`100..=999`) a [`Rejection`](super::Rejection) answers
/// with, also without the `http` feature; with it, converts to and from
/// and compares with [`http::StatusCode`].
///
/// ```
/// use tower_window::layer::Status;
///
/// assert_eq!(Status::TOO_MANY_REQUESTS, 429);
/// assert_eq!(Status::new(401), Some(Status::UNAUTHORIZED));
/// assert_eq!(Status::new(42), None);
/// assert_eq!(Status::SERVICE_UNAVAILABLE.to_string(), "503");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Status(u16);

impl Status {
    /// `400 Bad Request`: the default for a request without a key.
    pub const BAD_REQUEST: Self = Self(400);
    /// `401 Unauthorized`.
    pub const UNAUTHORIZED: Self = Self(401);
    /// `403 Forbidden`: an unknown tenant.
    pub const FORBIDDEN: Self = Self(403);
    /// `429 Too Many Requests`: an exhausted quota.
    pub const TOO_MANY_REQUESTS: Self = Self(429);
    /// `503 Service Unavailable`: degraded or undecided.
    pub const SERVICE_UNAVAILABLE: Self = Self(503);

    /// The status `code`, or `None` outside `100..=999`.
    #[must_use]
    pub const fn new(code: u16) -> Option<Self> {
        if code >= 100 && code <= 999 {
            Some(Self(code))
        } else {
            None
        }
    }

    /// The numeric code.
    #[must_use]
    pub const fn as_u16(self) -> u16 {
        self.0
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl PartialEq<u16> for Status {
    fn eq(&self, other: &u16) -> bool {
        self.0 == *other
    }
}

#[cfg(feature = "http")]
impl From<http::StatusCode> for Status {
    fn from(status: http::StatusCode) -> Self {
        Self(status.as_u16())
    }
}

#[cfg(feature = "http")]
impl From<Status> for http::StatusCode {
    fn from(status: Status) -> Self {
        // Every `Status` is in `100..=999`, which `http` accepts.
        Self::from_u16(status.0).unwrap_or(Self::INTERNAL_SERVER_ERROR)
    }
}

#[cfg(feature = "http")]
impl PartialEq<http::StatusCode> for Status {
    fn eq(&self, other: &http::StatusCode) -> bool {
        self.0 == other.as_u16()
    }
}

#[cfg(test)]
mod tests {
    use super::Status;

    #[test]
    fn only_codes_http_allows_are_statuses() {
        assert_eq!(Status::new(99), None);
        assert_eq!(Status::new(1000), None);
        assert_eq!(Status::new(100).map(Status::as_u16), Some(100));
        assert_eq!(Status::new(999).map(Status::as_u16), Some(999));
    }

    #[cfg(feature = "http")]
    #[test]
    fn converts_to_and_from_http_both_ways() {
        for code in [100, 400, 418, 429, 503, 599, 999] {
            let status = Status::new(code).expect("valid");
            let http: http::StatusCode = status.into();
            assert_eq!(http.as_u16(), code);
            assert_eq!(Status::from(http), status);
            assert_eq!(status, http);
        }
    }
}
