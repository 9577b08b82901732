//! `--inbound-stream`: every room message also goes to a Redis stream, for
//! `inbound-worker` (see `src/inbound.rs`).
//!
//! The rooms themselves are the library's
//! ([`axum_window_ext::ws::rooms`]); this is the gateway's own addition,
//! called by the room loop of `/ws` after each message it published.

use tower_window::events::EventId;
use tower_window::store::redis::redis;

/// The inbound stream of published room messages.
pub(super) struct InboundStream {
    client: redis::Client,
    stream: String,
    conn: tokio::sync::OnceCell<redis::aio::MultiplexedConnection>,
}

impl InboundStream {
    /// Appends to `stream` on the Redis of `client` (connected on first use).
    pub(super) fn new(client: redis::Client, stream: String) -> Self {
        Self {
            client,
            stream,
            conn: tokio::sync::OnceCell::new(),
        }
    }

    /// Appends the message `data` from `user` to `room`, published as the
    /// room's event `event`, with the fields `id` (the client's
    /// `message_id`, or else the event's id), `room`, `from` and `data`.
    /// A failure is logged: the message is in the room either way.
    pub(super) async fn forward(
        &self,
        message_id: Option<&str>,
        event: EventId,
        room: &str,
        user: &str,
        data: &str,
    ) {
        let id = message_id.map_or_else(|| event.to_string(), str::to_owned);
        if let Err(error) = self.send(&id, room, user, data).await {
            tracing::warn!(%error, "appending to the inbound stream failed");
        }
    }

    async fn send(&self, id: &str, room: &str, user: &str, data: &str) -> redis::RedisResult<()> {
        let conn = self
            .conn
            .get_or_try_init(|| self.client.get_multiplexed_async_connection())
            .await?;
        let mut conn = conn.clone();
        let _: String = redis::cmd("XADD")
            .arg(&self.stream)
            .arg("MAXLEN")
            .arg("~")
            .arg(1_000_000)
            .arg("*")
            .arg("id")
            .arg(id)
            .arg("room")
            .arg(room)
            .arg("from")
            .arg(user)
            .arg("data")
            .arg(data)
            .query_async(&mut conn)
            .await?;
        Ok(())
    }
}
