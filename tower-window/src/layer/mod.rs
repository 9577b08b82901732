//! The Tower middleware (placeholder until the layer lands).

pub(crate) mod headers;
mod rejection;

pub use rejection::{DefaultRejection, OnRejection, Rejection};

/// What to do with a request that has no key.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum MissingKey {
    /// Answer with this status.
    Reject(http::StatusCode),
    /// Let the request through unlimited.
    Skip,
}

/// Layer placeholder.
#[derive(Debug, Clone)]
pub struct SlidingWindowLayer<K> {
    _key: K,
}

/// Service placeholder.
#[derive(Debug, Clone)]
pub struct SlidingWindow<S> {
    _inner: S,
}
