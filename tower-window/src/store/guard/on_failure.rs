//! The one fallback vocabulary of the capabilities that answer yes or no.
//! It lives with the resilience stack because it says what that stack
//! answers when the store cannot, and every capability may name it.

/// What a yes-or-no capability answers while its store cannot: the
/// vocabulary of [`FallbackPolicy`](crate::FallbackPolicy)'s
/// [`FailOpen`](crate::fallback::FailOpen) and [`FailClosed`](crate::fallback::FailClosed), for
/// the capabilities whose answer is a yes or a no rather than a decision —
/// [`ConnectionLimiter`](crate::ConnectionLimiter) grants and
/// [`DedupWindow`](crate::DedupWindow) answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnFailure {
    /// Answer yes: a connection gets a degraded seat (not counted in the
    /// store, not renewed, never reported lost), a message id counts as
    /// first seen and is delivered (at-least-once: a duplicate may get
    /// through during an outage). The default.
    #[default]
    FailOpen,
    /// Answer no: the connection is refused, the message is dropped as a
    /// duplicate (at-most-once: a new message may be lost during an
    /// outage).
    FailClosed,
    /// Return the store's error and let the caller decide.
    Error,
}
