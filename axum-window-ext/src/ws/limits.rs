//! [`MessageLimits`]: what a [`GuardedSocket`](super::GuardedSocket) charges.

use std::fmt;
use std::sync::Arc;

use axum::extract::ws::WebSocketUpgrade;
use tower_window::{Limiter, Policy};

/// What happens to a message that exceeds a quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ExceedAction {
    /// Discard it and send the `rate_limited` notice (the default).
    #[default]
    Drop,
    /// Close the socket with 1008.
    Close,
    /// Stop reading until the retry-after, then charge it again: TCP
    /// backpressure reaches the client and nothing is lost.
    Pause,
}

/// The per-message and per-byte limits of guarded sockets; cheap to clone.
#[derive(Clone)]
pub struct MessageLimits {
    pub(super) inner: Arc<Inner>,
}

pub(super) struct Inner {
    pub(super) limiter: Limiter,
    pub(super) messages: Option<Policy>,
    pub(super) bytes: Option<Policy>,
    pub(super) on_exceed: ExceedAction,
    pub(super) close_after_drops: u32,
    pub(super) max_message_bytes: usize,
}

impl MessageLimits {
    /// The default size limit (64 KiB).
    pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 65_536;

    /// Limits charged to `limiter` (its store, resilience stack and
    /// fallback); add quotas with the builder.
    pub fn builder(limiter: Limiter) -> MessageLimitsBuilder {
        MessageLimitsBuilder {
            inner: Inner {
                limiter,
                messages: None,
                bytes: None,
                on_exceed: ExceedAction::default(),
                close_after_drops: 0,
                max_message_bytes: Self::DEFAULT_MAX_MESSAGE_BYTES,
            },
        }
    }

    /// The largest message payload accepted, in bytes.
    pub fn max_message_bytes(&self) -> usize {
        self.inner.max_message_bytes
    }

    /// The exceed action.
    pub fn on_exceed(&self) -> ExceedAction {
        self.inner.on_exceed
    }

    /// Sets the upgrade's frame and message size limits to
    /// [`max_message_bytes`](Self::max_message_bytes), so an oversized
    /// frame is refused by its header, before its payload is buffered (the
    /// guard then closes with 1009).
    pub fn configure<F>(&self, upgrade: WebSocketUpgrade<F>) -> WebSocketUpgrade<F> {
        upgrade
            .max_message_size(self.inner.max_message_bytes)
            .max_frame_size(self.inner.max_message_bytes)
    }
}

impl fmt::Debug for MessageLimits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = &*self.inner;
        f.debug_struct("MessageLimits")
            .field("messages", &inner.messages)
            .field("bytes", &inner.bytes)
            .field("on_exceed", &inner.on_exceed)
            .field("close_after_drops", &inner.close_after_drops)
            .field("max_message_bytes", &inner.max_message_bytes)
            .finish_non_exhaustive()
    }
}

/// Builds [`MessageLimits`].
#[must_use]
pub struct MessageLimitsBuilder {
    inner: Inner,
}

impl fmt::Debug for MessageLimitsBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MessageLimitsBuilder")
            .finish_non_exhaustive()
    }
}

impl MessageLimitsBuilder {
    /// The policy charged one unit per message (none by default).
    pub fn messages(mut self, policy: impl Into<Policy>) -> Self {
        self.inner.messages = Some(policy.into());
        self
    }

    /// The policy charged the payload's bytes per message (none by default).
    ///
    /// The message policy is charged first, then this one (their costs
    /// differ, so they are two store calls): a message the message quota
    /// admits and this quota refuses still counts as one message. An empty
    /// message charges no bytes.
    pub fn bytes(mut self, policy: impl Into<Policy>) -> Self {
        self.inner.bytes = Some(policy.into());
        self
    }

    /// What an exceeding message does (default [`ExceedAction::Drop`]).
    pub fn on_exceed(mut self, action: ExceedAction) -> Self {
        self.inner.on_exceed = action;
        self
    }

    /// With [`ExceedAction::Drop`], close with 1008 after this many
    /// consecutive drops (default 0: never).
    pub fn close_after_drops(mut self, drops: u32) -> Self {
        self.inner.close_after_drops = drops;
        self
    }

    /// The largest payload accepted (default
    /// [`MessageLimits::DEFAULT_MAX_MESSAGE_BYTES`]; at least 1): larger
    /// messages close the socket with 1009 before being charged.
    pub fn max_message_bytes(mut self, max: usize) -> Self {
        self.inner.max_message_bytes = max.max(1);
        self
    }

    /// Builds the limits.
    pub fn build(self) -> MessageLimits {
        MessageLimits {
            inner: Arc::new(self.inner),
        }
    }
}
