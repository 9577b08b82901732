//! [`OnFailure`], here so every capability may name it.

/// What a yes-or-no capability ([`ConnectionLimiter`](crate::ConnectionLimiter),
/// [`DedupWindow`](crate::DedupWindow)) answers while its store cannot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnFailure {
    /// Answer yes: a connection gets a degraded seat (not counted, renewed
    /// or reported lost); a message is delivered (at-least-once).
    #[default]
    FailOpen,
    /// Answer no: the connection is refused; the message is dropped as a
    /// duplicate (at-most-once).
    FailClosed,
    /// Return the store's error and let the caller decide.
    Error,
}
