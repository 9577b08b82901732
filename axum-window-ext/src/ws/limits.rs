//! [`MessageLimits`]: what a [`GuardedSocket`](super::GuardedSocket) charges.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::WebSocketUpgrade;
use tower_window::{Limiter, Policy};

/// What happens to a message that exceeds a quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ExceedAction {
    /// Discard it and send the notice
    /// `{"type":"rate_limited","quota":"<name>","retry_after_ms":<n>}`
    /// (the default; see [`close_after_drops`](MessageLimitsBuilder::close_after_drops)).
    #[default]
    Drop,
    /// Close the socket with 1008.
    Close,
    /// Stop reading until the retry-after, then charge it again (TCP
    /// backpressure; nothing is lost).
    Pause,
}

/// See [`MessageLimits::read_limit`].
const READ_SLACK: usize = 64 * 1024;

/// The per-message and per-byte limits of guarded sockets; cheap to clone.
#[derive(Clone, Debug)]
pub struct MessageLimits {
    pub(super) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(super) struct Inner {
    pub(super) limiter: Limiter,
    pub(super) messages: Option<Policy>,
    pub(super) bytes: Option<Policy>,
    pub(super) on_exceed: ExceedAction,
    pub(super) close_after_drops: u32,
    pub(super) max_message_bytes: usize,
    pub(super) close_timeout: Duration,
}

impl MessageLimits {
    /// The default size limit (64 KiB).
    pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 65_536;

    /// The default [close timeout](MessageLimitsBuilder::close_timeout) (1 s).
    pub const DEFAULT_CLOSE_TIMEOUT: Duration = Duration::from_secs(1);

    /// Limits charged through `limiter` (its store, resilience stack,
    /// fallback and local tier) as policies of their own: the limiter's own
    /// policy is never charged, so an HTTP layer's limiter can be shared.
    pub fn builder(limiter: Limiter) -> MessageLimitsBuilder {
        MessageLimitsBuilder {
            inner: Inner {
                limiter,
                messages: None,
                bytes: None,
                on_exceed: ExceedAction::default(),
                close_after_drops: 0,
                max_message_bytes: Self::DEFAULT_MAX_MESSAGE_BYTES,
                close_timeout: Self::DEFAULT_CLOSE_TIMEOUT,
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

    /// The policy charged one unit per message, if any.
    pub fn messages_policy(&self) -> Option<&Policy> {
        self.inner.messages.as_ref()
    }

    /// The policy charged the payload's bytes, if any.
    pub fn bytes_policy(&self) -> Option<&Policy> {
        self.inner.bytes.as_ref()
    }

    /// The largest frame and message the socket reads at all: twice
    /// [`max_message_bytes`](Self::max_message_bytes), and at least 64 KiB
    /// more. Between the two the guard can still read on after its 1009,
    /// discarding until the peer's close; past this it cannot.
    pub fn read_limit(&self) -> usize {
        let max = self.inner.max_message_bytes;
        max.saturating_add(max.max(READ_SLACK))
    }

    /// Sets the upgrade's frame and message size limits to
    /// [`read_limit`](Self::read_limit), and its read buffer to 4 KiB.
    ///
    /// tungstenite zero-fills the buffer's free part on every read attempt,
    /// which at its default 128 KiB is expensive; the buffer still grows to
    /// a frame's length.
    pub fn configure<F>(&self, upgrade: WebSocketUpgrade<F>) -> WebSocketUpgrade<F> {
        upgrade
            .max_message_size(self.read_limit())
            .max_frame_size(self.read_limit())
            .read_buffer_size(READ_BUFFER)
    }
}

/// See [`MessageLimits::configure`].
const READ_BUFFER: usize = 4096;

/// Builds [`MessageLimits`].
#[must_use]
#[derive(Debug)]
pub struct MessageLimitsBuilder {
    inner: Inner,
}

impl MessageLimitsBuilder {
    /// The policy charged one unit per message (none by default).
    ///
    /// A quota (and a policy) of the default name `default` (not
    /// [`named`](tower_window::Quota::named)) is named `messages`, as the
    /// `rate_limited` notice and the store's windows show it.
    ///
    /// ```
    /// use axum_window_ext::ws::MessageLimits;
    /// use tower_window::{Limiter, MemoryStore, Quota};
    ///
    /// let limiter = Limiter::new(MemoryStore::new(), "100/1m".parse::<Quota>()?);
    /// let limits = MessageLimits::builder(limiter)
    ///     .messages("5/10s".parse::<Quota>()?)
    ///     .bytes("65536/10s".parse::<Quota>()?)
    ///     .build();
    /// assert_eq!(limits.messages_policy().unwrap().first().name(), "messages");
    /// assert_eq!(limits.bytes_policy().unwrap().first().name(), "bytes");
    /// # Ok::<(), tower_window::QuotaError>(())
    /// ```
    pub fn messages(mut self, policy: impl Into<Policy>) -> Self {
        self.inner.messages = Some(named_by_default(policy.into(), "messages"));
        self
    }

    /// The policy charged the payload's bytes per message (none by default);
    /// a quota of the default name is named `bytes`.
    ///
    /// Charged after the message policy, in a store call of its own: a
    /// message this policy refuses still counts as one message. An empty
    /// message charges no bytes.
    pub fn bytes(mut self, policy: impl Into<Policy>) -> Self {
        self.inner.bytes = Some(named_by_default(policy.into(), "bytes"));
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
    /// [`MessageLimits::DEFAULT_MAX_MESSAGE_BYTES`]; at least 1); larger
    /// messages close the socket with 1009.
    pub fn max_message_bytes(mut self, max: usize) -> Self {
        self.inner.max_message_bytes = max.max(1);
        self
    }

    /// How long a closed socket, once dropped, waits for the peer's close,
    /// discarding what the peer still sends, so the peer sees the close
    /// rather than a reset (default [`MessageLimits::DEFAULT_CLOSE_TIMEOUT`]).
    pub fn close_timeout(mut self, timeout: Duration) -> Self {
        self.inner.close_timeout = timeout;
        self
    }

    /// Builds the limits.
    pub fn build(self) -> MessageLimits {
        MessageLimits {
            inner: Arc::new(self.inner),
        }
    }
}

/// The name a quota (and a policy) gets when none was given.
const DEFAULT_NAME: &str = "default";

/// `policy` with its quota (and its own name) `default` renamed `name`,
/// unless it has no such quota or one named `name` already.
fn named_by_default(policy: Policy, name: &str) -> Policy {
    if policy.quota(DEFAULT_NAME).is_none() || policy.quota(name).is_some() {
        return policy;
    }
    let quotas = policy.quotas().iter().map(|quota| match quota.name() {
        DEFAULT_NAME => quota.clone().named(name).unwrap_or_else(|_| quota.clone()),
        _ => quota.clone(),
    });
    let policy_name = match policy.name() {
        DEFAULT_NAME => name,
        other => other,
    };
    Policy::new(policy_name, quotas).unwrap_or(policy)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use tower_window::{MemoryStore, Quota};

    #[test]
    fn unnamed_quotas_are_named_for_what_they_charge() {
        let quota = |dsl: &str| dsl.parse::<Quota>().unwrap();
        let renamed = named_by_default(quota("5/10s").into(), "messages");
        assert_eq!(
            (renamed.name(), renamed.first().name()),
            ("messages", "messages")
        );
        assert_eq!(renamed.first().to_string(), "5/10s");
        // Named quotas and policies keep their names.
        let named = named_by_default(quota("5/10s").named("chat").unwrap().into(), "messages");
        assert_eq!((named.name(), named.first().name()), ("chat", "chat"));
        let policy =
            Policy::new("p", [quota("1/s"), quota("9/m").named("messages").unwrap()]).unwrap();
        let kept = named_by_default(policy.clone(), "messages");
        assert_eq!(kept, policy);
        let policy = Policy::new("p", [quota("1/s"), quota("9/m").named("slow").unwrap()]).unwrap();
        let renamed = named_by_default(policy, "bytes");
        let names: Vec<&str> = renamed.quotas().iter().map(|q| q.name()).collect();
        assert_eq!((renamed.name(), names), ("p", vec!["bytes", "slow"]));
        let limits = MessageLimits::builder(Limiter::new(MemoryStore::new(), quota("1/s")))
            .bytes(quota("64/s"))
            .build();
        assert!(limits.messages_policy().is_none());
        assert_eq!(limits.bytes_policy().unwrap().first().name(), "bytes");
    }
}
