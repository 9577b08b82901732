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
    /// Stop reading until the retry-after, then charge it again: TCP
    /// backpressure reaches the client and nothing is lost.
    Pause,
}

/// How far past the size limit a message is still read whole (see
/// [`MessageLimits::read_limit`]).
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

    /// Limits charged to `limiter` (its store, resilience stack, fallback
    /// and local tier); add quotas with the builder. They are checked as
    /// policies of their own (`check_policy`), never the limiter's own
    /// policy, so the limiter of an HTTP layer can be shared.
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

    /// The largest frame and message the socket reads at all
    /// ([`configure`](Self::configure) sets it): twice
    /// [`max_message_bytes`](Self::max_message_bytes), and at least 64 KiB
    /// more than it.
    ///
    /// A message over `max_message_bytes` but within this is read whole,
    /// then refused by the guard, which closes with 1009 and reads on
    /// (discarding) until the peer's close, so the close reaches a client
    /// that keeps sending. A frame over this is refused by its header,
    /// before its payload is buffered; the socket cannot be read after
    /// that, so the guard sends the 1009 and holds the connection for 1 s
    /// before dropping it.
    pub fn read_limit(&self) -> usize {
        let max = self.inner.max_message_bytes;
        max.saturating_add(max.max(READ_SLACK))
    }

    /// Sets the upgrade's frame and message size limits to
    /// [`read_limit`](Self::read_limit) (the guard itself closes with 1009
    /// past [`max_message_bytes`](Self::max_message_bytes)), and its read
    /// buffer to 4 KiB.
    ///
    /// The read buffer: tungstenite's default is 128 KiB, and tungstenite
    /// zero-fills the buffer's free part on every read attempt, including
    /// the ones that find nothing; a room socket tries a read after every
    /// frame it sends, so at 128 KiB that fill was a fifth of a gateway
    /// node's CPU in `benches/socketio`. Larger messages still arrive whole:
    /// the buffer grows to a frame's length.
    pub fn configure<F>(&self, upgrade: WebSocketUpgrade<F>) -> WebSocketUpgrade<F> {
        upgrade
            .max_message_size(self.read_limit())
            .max_frame_size(self.read_limit())
            .read_buffer_size(READ_BUFFER)
    }
}

/// The read buffer [`MessageLimits::configure`] sets (see there).
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
    /// A quota left with the default name (`default`, a quota parsed or
    /// built without [`named`](tower_window::Quota::named)) is named
    /// `messages`, as the `rate_limited` notice and the metrics show it
    /// (and a policy of that default name too); named quotas keep their
    /// names. The name is part of the quota's windows in the store.
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

    /// The policy charged the payload's bytes per message (none by default).
    /// A quota left with the default name is named `bytes` (see
    /// [`messages`](Self::messages)).
    ///
    /// The message policy is charged first, then this one (their costs
    /// differ, so they are two store calls): a message the message quota
    /// admits and this quota refuses still counts as one message. An empty
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
    /// [`MessageLimits::DEFAULT_MAX_MESSAGE_BYTES`]; at least 1): larger
    /// messages close the socket with 1009 before being charged.
    pub fn max_message_bytes(mut self, max: usize) -> Self {
        self.inner.max_message_bytes = max.max(1);
        self
    }

    /// How long a closing socket waits for the peer (default
    /// [`MessageLimits::DEFAULT_CLOSE_TIMEOUT`]): after the guard's close,
    /// for the peer's close, reading and discarding what the peer still
    /// sends (a connection dropped with unread data is reset, and the peer
    /// would see the reset instead of the close); after the peer's close,
    /// for the reply to be written. The connection is dropped when it ends
    /// or the peer's close arrives, whichever is first.
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

/// `policy` with its quota of the default name (and the policy itself, if
/// of the default name) named `name` instead; unchanged when it has no such
/// quota or already has one named `name`.
fn named_by_default(policy: Policy, name: &str) -> Policy {
    if policy.quota(DEFAULT_NAME).is_none() || policy.quota(name).is_some() {
        return policy;
    }
    let quotas = policy.quotas().iter().map(|quota| {
        if quota.name() == DEFAULT_NAME {
            quota.clone().named(name).unwrap_or_else(|_| quota.clone())
        } else {
            quota.clone()
        }
    });
    let policy_name = if policy.name() == DEFAULT_NAME {
        name
    } else {
        policy.name()
    };
    // Same quotas, one renamed to a valid name no other quota has.
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
