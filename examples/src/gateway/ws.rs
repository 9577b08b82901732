//! `GET /ws` and `GET /presence`: the gateway's WebSocket protocol (see
//! `examples/README.md`).
//!
//! One socket is one connection seat (a cluster-wide cap per user), every
//! inbound message is charged to the message and byte quotas, and the
//! socket's *mode* decides what a message does. Today there is one mode,
//! `echo`: messages come back unchanged, except that a text message which
//! is a JSON object with a string `id` is deduplicated by
//! `(tenant, user, id)` across all nodes. With `?room=R` the socket is in
//! room R instead (`room`, on the library's [`RoomHub`]): every admitted,
//! non-duplicate text message is appended to the room and fanned out to
//! every socket in it on every node.

use std::fmt;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use axum::extract::ws::{Message, WebSocketUpgrade};
use axum::extract::{Query, State};
use axum::http::header::SEC_WEBSOCKET_KEY;
use axum::http::{HeaderMap, StatusCode, Uri, Version};
use axum::response::{IntoResponse, Response};
use axum::Json;
use axum_window_ext::ws::rooms::{self, Outgoing, Resume, RoomHub, RoomName};
use axum_window_ext::ws::{ConnectionRefused, ExceedAction, GuardedSocket, MessageLimits};
use clap::{Args as ClapArgs, ValueEnum};
use futures_util::FutureExt;
use serde::Deserialize;
use serde_json::{json, Value};
use tower_window::conn::{Acquire, ConnectionLimiter, ConnectionSeat, HeartbeatHandle};
use tower_window::dedup::DedupWindow;
use tower_window::events::Position;
use tower_window::fallback::OnFailure;
use tower_window::{Limiter, Policy, Quota, Store, WindowKey};

use super::flags;
use super::identity::{BadIdentity, Identity};
use super::inbound_stream::InboundStream;

/// The WebSocket flags (flattened into the gateway's `Args`).
#[derive(Debug, Clone, ClapArgs)]
pub struct WsArgs {
    /// Concurrent WebSocket connections per tenant and user across every
    /// gateway sharing the store (0 = no cap). Past it the upgrade is
    /// answered 429 with `Retry-After`.
    #[arg(long, env = "TW_MAX_CONNECTIONS_PER_USER", default_value = "0", value_parser = flags::count, allow_negative_numbers = true)]
    pub max_connections_per_user: u32,

    /// How long a connection seat lives without a heartbeat (renewed
    /// every third of it): a crashed gateway's connections are freed
    /// within it. From 30ms to 1h, in the quota DSL's units (`500ms`,
    /// `15s`, `1m`, `1h`). The older names `--connection-lease-ttl` and
    /// `TW_CONNECTION_LEASE_TTL` still work.
    #[arg(long, alias = "connection-lease-ttl", env = "TW_CONNECTION_SEAT_TTL", default_value = connection_seat_ttl_default(), value_name = "DURATION", value_parser = flags::connection_seat_ttl, allow_hyphen_values = true)]
    pub connection_seat_ttl: Duration,

    /// Inbound messages per tenant and user, all sockets on all nodes
    /// together, in the quota DSL (`5/10s`); none by default.
    #[arg(long, env = "TW_MESSAGE_LIMIT", value_parser = flags::quota)]
    pub message_limit: Option<Quota>,

    /// Inbound payload bytes per tenant and user (`65536/10s`; cost =
    /// payload bytes); none by default.
    #[arg(long, env = "TW_BYTE_LIMIT", value_parser = flags::quota)]
    pub byte_limit: Option<Quota>,

    /// What a message over `--message-limit` / `--byte-limit` does: `drop`
    /// (discarded, answered with a `rate_limited` notice), `close` (close
    /// 1008) or `pause` (reading stops until the retry-after; nothing lost).
    #[arg(long, env = "TW_ON_MESSAGE_LIMIT", value_enum, default_value_t = OnMessageLimit::Drop)]
    pub on_message_limit: OnMessageLimit,

    /// With `--on-message-limit drop`, close (1008) after this many
    /// consecutive drops (0 = never).
    #[arg(long, env = "TW_CLOSE_AFTER_DROPS", default_value = "0", value_parser = flags::count, allow_negative_numbers = true)]
    pub close_after_drops: u32,

    /// The largest inbound message payload; larger ones close the socket
    /// with 1009.
    #[arg(
        long,
        env = "TW_MAX_MESSAGE_BYTES",
        default_value = "65536",
        value_parser = flags::positive_count,
        allow_negative_numbers = true
    )]
    pub max_message_bytes: u32,

    /// How long a message `id` is remembered for deduplication, from 1ms
    /// to 7d, in the quota DSL's units (`500ms`, `30s`, `2m`, `1h`, `7d`).
    #[arg(long, env = "TW_DEDUP_WINDOW", default_value = "2m", value_name = "DURATION", value_parser = flags::dedup_window, allow_hyphen_values = true)]
    pub dedup_window: Duration,
}

/// `--connection-seat-ttl`'s default: `TW_CONNECTION_LEASE_TTL` (the
/// variable's name before seats were called seats) when it is set, so a
/// deployment that sets it keeps its TTL; `TW_CONNECTION_SEAT_TTL` and the
/// flag come first. Parsed and checked like the flag.
fn connection_seat_ttl_default() -> &'static str {
    static LEGACY: LazyLock<Option<String>> =
        LazyLock::new(|| std::env::var("TW_CONNECTION_LEASE_TTL").ok());
    LEGACY.as_deref().unwrap_or("15s")
}

/// `--on-message-limit` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum OnMessageLimit {
    /// Discard the message and send the notice.
    #[default]
    Drop,
    /// Close with 1008.
    Close,
    /// Stop reading until the retry-after.
    Pause,
}

/// The WebSocket part of a [`GatewayConfig`](super::GatewayConfig) (its
/// connection seats and dedup ids live in the gateway's store).
#[derive(Clone)]
#[non_exhaustive]
pub struct WsConfig {
    /// `--max-connections-per-user`.
    pub max_connections_per_user: u32,
    /// `--connection-seat-ttl`.
    pub connection_seat_ttl: Duration,
    /// `--message-limit`.
    pub message_limit: Option<Quota>,
    /// `--byte-limit`.
    pub byte_limit: Option<Quota>,
    /// `--on-message-limit`.
    pub on_message_limit: OnMessageLimit,
    /// `--close-after-drops`.
    pub close_after_drops: u32,
    /// `--max-message-bytes`.
    pub max_message_bytes: u32,
    /// `--dedup-window`.
    pub dedup_window: Duration,
}

impl Default for WsConfig {
    /// The flags' defaults.
    fn default() -> Self {
        Self::new()
    }
}

impl WsConfig {
    /// The flags' defaults.
    pub fn new() -> Self {
        Self {
            max_connections_per_user: 0,
            connection_seat_ttl: Duration::from_secs(15),
            message_limit: None,
            byte_limit: None,
            on_message_limit: OnMessageLimit::Drop,
            close_after_drops: 0,
            max_message_bytes: 65_536,
            dedup_window: Duration::from_secs(120),
        }
    }
}

impl WsArgs {
    /// The flags.
    pub(super) fn into_config(self) -> WsConfig {
        WsConfig {
            max_connections_per_user: self.max_connections_per_user,
            connection_seat_ttl: self.connection_seat_ttl,
            message_limit: self.message_limit,
            byte_limit: self.byte_limit,
            on_message_limit: self.on_message_limit,
            close_after_drops: self.close_after_drops,
            max_message_bytes: self.max_message_bytes,
            dedup_window: self.dedup_window,
        }
    }
}

impl fmt::Debug for WsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WsConfig")
            .field("max_connections_per_user", &self.max_connections_per_user)
            .field("connection_seat_ttl", &self.connection_seat_ttl)
            .field("message_limit", &self.message_limit)
            .field("byte_limit", &self.byte_limit)
            .field("on_message_limit", &self.on_message_limit)
            .field("close_after_drops", &self.close_after_drops)
            .field("max_message_bytes", &self.max_message_bytes)
            .field("dedup_window", &self.dedup_window)
            .finish_non_exhaustive()
    }
}

impl WsConfig {
    /// Checks the ranges the limiters accept: a seat TTL of 30 ms to 1 h,
    /// a dedup window of 1 ms to 7 days.
    pub fn validate(&self) -> Result<(), String> {
        let ttl = self.connection_seat_ttl;
        if ttl < Duration::from_millis(30) || ttl > Duration::from_secs(3600) {
            return Err(format!(
                "--connection-seat-ttl {ttl:?} is not within 30ms..=1h"
            ));
        }
        let window = self.dedup_window;
        if window > DedupWindow::MAX_WINDOW {
            return Err(format!("--dedup-window {window:?} is longer than 7 days"));
        }
        Ok(())
    }
}

/// What `/ws` and `/presence` share on one node.
pub(super) struct WsState {
    pub(super) connections: ConnectionLimiter,
    limits: MessageLimits,
    dedup: DedupWindow,
    /// The key rule of `/ws`: the one its rate-limit layer uses, so a
    /// socket's seat and dedup ids are the key the upgrade was limited by.
    identity: Identity,
    /// The key rule of `/presence`: the query parameters.
    presence: Identity,
    /// Rooms (`?room=R`), when the gateway serves them.
    rooms: Option<RoomHub>,
    /// `--inbound-stream`: where room messages also go.
    inbound: Option<InboundStream>,
}

/// The node's WebSocket machinery, for tests and operators.
#[derive(Debug, Clone)]
pub struct WsHandles {
    /// The node's connection limiter (presence, live seats).
    pub connections: ConnectionLimiter,
    /// The node's heartbeat, when a Tokio runtime was running at build time.
    pub heartbeat: Option<Arc<HeartbeatHandle>>,
}

impl WsState {
    /// Builds the state on `store` (the gateway's one store, and so its one
    /// resilience stack), charging messages to `limiter` (on that store).
    pub(super) fn new(
        config: &WsConfig,
        store: &Store,
        limiter: &Limiter,
        fallback_closed: bool,
        identity: Identity,
    ) -> (Self, WsHandles) {
        // `validate` refused out-of-range flags; a hand-built config is clamped.
        let ttl = config
            .connection_seat_ttl
            .clamp(Duration::from_millis(30), Duration::from_secs(3600));
        let window = config
            .dedup_window
            .clamp(Duration::from_millis(1), DedupWindow::MAX_WINDOW);
        let connections = ConnectionLimiter::builder(store.clone())
            .max_per_subject(config.max_connections_per_user)
            .ttl(ttl)
            .on_store_failure(if fallback_closed {
                OnFailure::FailClosed
            } else {
                OnFailure::FailOpen
            })
            .build()
            .expect("a clamped ttl is valid");
        let mut limits = MessageLimits::builder(limiter.clone())
            .on_exceed(match config.on_message_limit {
                OnMessageLimit::Drop => ExceedAction::Drop,
                OnMessageLimit::Close => ExceedAction::Close,
                OnMessageLimit::Pause => ExceedAction::Pause,
            })
            .close_after_drops(config.close_after_drops)
            .max_message_bytes(config.max_message_bytes as usize);
        let [messages, bytes] = message_policies(config);
        if let Some(policy) = messages {
            limits = limits.messages(policy);
        }
        if let Some(policy) = bytes {
            limits = limits.bytes(policy);
        }
        let dedup = DedupWindow::builder(store.clone())
            .window(window)
            .on_store_failure(OnFailure::FailOpen)
            .build()
            .expect("a clamped window is valid");
        let heartbeat = tokio::runtime::Handle::try_current()
            .ok()
            .map(|_| Arc::new(connections.start_heartbeat()));
        let handles = WsHandles {
            connections: connections.clone(),
            heartbeat,
        };
        (
            Self {
                connections,
                limits: limits.build(),
                dedup,
                presence: Identity::query_only(),
                identity,
                rooms: None,
                inbound: None,
            },
            handles,
        )
    }

    /// Serves `?room=R` on `rooms`, also appending every message to
    /// `inbound` if given.
    pub(super) fn with_rooms(mut self, rooms: RoomHub, inbound: Option<InboundStream>) -> Self {
        self.rooms = Some(rooms);
        self.inbound = inbound;
        self
    }
}

/// The room to join (`room`, with `epoch` and `last_event_id` to resume).
/// The tenant and user are read by [`Identity`], as raw bytes.
#[derive(Debug, Default, Deserialize)]
pub(super) struct Who {
    room: Option<String>,
    epoch: Option<String>,
    last_event_id: Option<String>,
}

/// A room to join: its name and the client's position, if it resumes.
#[derive(Debug)]
struct RoomJoin {
    room: RoomName,
    resume: Option<Position>,
}

impl Who {
    /// The room to join, checked: 1 to 64 characters of `[A-Za-z0-9_.-]`,
    /// and a well-formed position (the library's [`Resume`] rules:
    /// `last_event_id` needs its `epoch`).
    fn room(&self) -> Result<Option<RoomJoin>, String> {
        let Some(room) = &self.room else {
            return Ok(None);
        };
        let Ok(room) = RoomName::new(room.as_str()) else {
            return Err("room: 1 to 64 characters of [A-Za-z0-9_.-]".to_owned());
        };
        let Resume(resume) = Resume::parse(self.epoch.as_deref(), self.last_event_id.as_deref())
            .map_err(|invalid| invalid.to_string())?;
        Ok(Some(RoomJoin { room, resume }))
    }
}

/// A problem+json answer with a `type` for each status these routes use
/// (`detail` says what exactly).
fn problem(status: StatusCode, detail: &str) -> Response {
    let (kind, title) = match status {
        StatusCode::BAD_REQUEST => (axum_window_ext::admin::TYPE_INVALID_INPUT, "Invalid input"),
        StatusCode::NOT_FOUND => (axum_window_ext::admin::TYPE_NOT_FOUND, "Not found"),
        _ => (axum_window_ext::TYPE_UNAVAILABLE, "Unavailable"),
    };
    (
        status,
        [(
            axum::http::header::CONTENT_TYPE,
            axum_window_ext::PROBLEM_JSON,
        )],
        json!({ "type": kind, "title": title, "status": status.as_u16(), "detail": detail })
            .to_string(),
    )
        .into_response()
}

/// `GET /ws`: the upgrade, after the rate limit (the route's layer) and
/// the connection cap. axum's extractor has already refused anything that
/// is not a WebSocket upgrade (HTTP/1.1 `GET` + `Upgrade`, or HTTP/2
/// extended `CONNECT`), so no seat is taken for those.
pub(super) async fn handler(
    State(state): State<Arc<WsState>>,
    headers: HeaderMap,
    uri: Uri,
    version: Version,
    Query(who): Query<Who>,
    upgrade: WebSocketUpgrade,
) -> Response {
    let key = match state.identity.key(&headers, &uri) {
        Ok(key) => key,
        Err(error) => return problem(StatusCode::BAD_REQUEST, &error.detail()),
    };
    if !valid_handshake_key(version, &headers) {
        return problem(
            StatusCode::BAD_REQUEST,
            "sec-websocket-key: not a base64-encoded 16-byte value",
        );
    }
    // A bad room or position is refused before any seat is taken.
    let join = match who.room() {
        Ok(join) => join,
        Err(detail) => return problem(StatusCode::BAD_REQUEST, &detail),
    };
    if join.is_some() && state.rooms.is_none() {
        return problem(StatusCode::NOT_FOUND, "this gateway serves no rooms");
    }
    let seat = match state.connections.acquire(&key).await {
        Ok(Acquire::Granted(seat)) => seat,
        Ok(Acquire::Denied(denied)) => return ConnectionRefused::new(denied).into_response(),
        Err(error) => {
            tracing::warn!(%error, "connection seat grant failed");
            return problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "connection limiter unavailable",
            );
        }
    };
    let limits = state.limits.clone();
    limits
        .configure(upgrade)
        .on_upgrade(move |socket| async move {
            let socket =
                GuardedSocket::new(socket, state.limits.clone(), key.clone()).with_seat(&seat);
            serve(&state, socket, &key, seat, join).await;
        })
}

/// Runs one socket in its mode until it closes, then releases its seat.
async fn serve(
    state: &WsState,
    socket: GuardedSocket,
    key: &WindowKey,
    seat: ConnectionSeat,
    join: Option<RoomJoin>,
) {
    match (join, &state.rooms) {
        (Some(join), Some(rooms)) => room(state, rooms, socket, key, join).await,
        _ => echo(state, socket, key).await,
    }
    if let Err(error) = seat.release().await {
        tracing::debug!(%error, "connection seat release failed; it expires after its ttl");
    }
}

/// The echo mode: each admitted message back unchanged; a repeated `id`
/// inside the dedup window is answered `{"type":"duplicate","id":...}`.
async fn echo(state: &WsState, mut socket: GuardedSocket, key: &WindowKey) {
    while let Some(message) = socket.recv().await {
        if let Message::Text(text) = &message {
            if let Some(id) = message_id(text.as_str()) {
                match state.dedup.first_seen(key, id.as_bytes()).await {
                    Ok(true) => {}
                    Ok(false) => {
                        let notice = json!({ "type": "duplicate", "id": id });
                        if socket
                            .send(Message::Text(notice.to_string().into()))
                            .await
                            .is_err()
                        {
                            return;
                        }
                        continue;
                    }
                    // An id the window refuses (empty, too long) is not
                    // deduplicated; the message is echoed.
                    Err(error) => tracing::debug!(%error, "message id not deduplicated"),
                }
            }
        }
        if socket.send(message).await.is_err() {
            return;
        }
    }
}

/// The room mode: the session's frames (welcome, history, live events)
/// out; every admitted text message in, deduplicated by its JSON `id` like
/// the echo (a repeat is answered `{"type":"duplicate","id":...}` and not
/// published), then appended to the room as
/// `{"type":"event","room":R,"id":..,"epoch":..,"from":<user>,"data":<text>}`
/// for every socket in the room on every node, the sender included.
async fn room(
    state: &WsState,
    rooms: &RoomHub,
    mut socket: GuardedSocket,
    key: &WindowKey,
    join: RoomJoin,
) {
    let mut session = match rooms.join(&join.room, join.resume).await {
        Ok(session) => session,
        Err(error) => {
            tracing::warn!(%error, "joining a room failed");
            socket.close_with(CLOSE_ERROR, "store unavailable").await;
            return;
        }
    };
    let user = String::from_utf8_lossy(key.subject()).into_owned();
    // At most a quarter of what the room keeps: the node's live reader
    // reads on from its cursor with the resume's rules, so more events
    // than the room keeps appended between two of its reads are skipped
    // (the same happens with single appends quicker than the reader; a
    // batch must not make it certain).
    let max_batch = usize::try_from(rooms.events().retention().max_len() / 4)
        .unwrap_or(MAX_BATCH)
        .clamp(1, MAX_BATCH);
    loop {
        // `GuardedSocket::recv` is cancel-safe: a message read but not yet
        // admitted is kept for the next call.
        tokio::select! {
            frame = session.next() => match frame {
                Ok(Some(Outgoing::Text(text))) => {
                    if session.send_ready(socket.get_mut(), Some(text)).await.is_err() {
                        return;
                    }
                }
                Ok(Some(Outgoing::Overflow(text))) => {
                    // Too slow for the room: told to resync, and closed.
                    let _ = socket.send(Message::Text(text)).await;
                    socket.close_with(CLOSE_AGAIN, "too slow").await;
                    return;
                }
                Ok(None) => return,
                Err(error) => {
                    tracing::warn!(%error, "reading a room failed");
                    socket.close_with(CLOSE_ERROR, "store unavailable").await;
                    return;
                }
            },
            message = socket.recv() => match message {
                None => return,
                Some(Message::Text(text)) => {
                    // This message and every one already read and admitted
                    // (bounded), published in one store call, in order: one
                    // round trip per publish would cap a publisher at one
                    // message per round trip, and separate appends sent at
                    // once may overtake each other.
                    let mut batch = vec![text];
                    let mut bytes = batch[0].len();
                    let mut then = None;
                    while batch.len() < max_batch && bytes < MAX_BATCH_BYTES {
                        // A `recv` that is not ready is dropped: cancel-safe
                        // (a message read but not yet admitted is kept).
                        match socket.recv().now_or_never() {
                            Some(Some(Message::Text(text))) => {
                                bytes += text.len();
                                batch.push(text);
                            }
                            Some(other) => {
                                then = Some(other);
                                break;
                            }
                            None => break,
                        }
                    }
                    if publish_batch(state, &session, &mut socket, key, &user, batch).await.is_err() {
                        return;
                    }
                    // Out before in: what became ready meanwhile (this
                    // socket's own events among it) goes out now, so a
                    // publisher faster than its socket's reads is held back
                    // by its own connection instead of overflowing its queue.
                    if session.send_ready(socket.get_mut(), None).await.is_err() {
                        return;
                    }
                    match then {
                        Some(None) => return,
                        Some(Some(Message::Binary(_))) => {
                            socket.close_with(CLOSE_UNSUPPORTED, "rooms take text messages").await;
                            return;
                        }
                        _ => {}
                    }
                }
                Some(Message::Binary(_)) => {
                    socket.close_with(CLOSE_UNSUPPORTED, "rooms take text messages").await;
                    return;
                }
                Some(_) => {}
            },
        }
    }
}

/// The most messages one room publish takes from a socket at once (the
/// events' own bound), and the bytes after which it stops taking more.
const MAX_BATCH: usize = tower_window::events::MAX_BATCH;
const MAX_BATCH_BYTES: usize = 64 * 1024;

/// Publishes a socket's `batch` of admitted messages to the room, in
/// order, each deduplicated by its JSON `id` as a single message is (a
/// repeat is answered `duplicate` and left out); the rest go in one store
/// call. If it fails, each of them is answered `unavailable`, in order.
/// `Err` when the socket is gone.
async fn publish_batch(
    state: &WsState,
    session: &rooms::RoomSession,
    socket: &mut GuardedSocket,
    key: &WindowKey,
    user: &str,
    batch: Vec<axum::extract::ws::Utf8Bytes>,
) -> Result<(), ()> {
    let mut admitted = Vec::with_capacity(batch.len());
    for text in &batch {
        let id = message_id(text.as_str());
        if let Some(id) = &id {
            if let Ok(false) = state.dedup.first_seen(key, id.as_bytes()).await {
                let notice = json!({ "type": "duplicate", "id": id });
                socket
                    .send(Message::Text(notice.to_string().into()))
                    .await
                    .map_err(drop)?;
                continue;
            }
        }
        admitted.push((id, text.as_str()));
    }
    if admitted.is_empty() {
        return Ok(());
    }
    let data: Vec<&str> = admitted.iter().map(|(_, text)| *text).collect();
    match session.publish_many(user, &data).await {
        Ok(events) => {
            if let Some(inbound) = &state.inbound {
                let room = session.room().as_str();
                for ((id, text), event) in admitted.iter().zip(events) {
                    inbound
                        .forward(id.as_deref(), event, room, user, text)
                        .await;
                }
            }
        }
        Err(error) => {
            tracing::warn!(%error, messages = data.len(), "publishing to a room failed");
            for _ in &data {
                socket
                    .send(Message::Text(session.unavailable()))
                    .await
                    .map_err(drop)?;
            }
        }
    }
    Ok(())
}

/// Close codes of the room mode: the room protocol's (1003, 1011, 1013).
const CLOSE_UNSUPPORTED: u16 = rooms::CLOSE_UNSUPPORTED;
const CLOSE_ERROR: u16 = rooms::CLOSE_STORE_ERROR;
const CLOSE_AGAIN: u16 = rooms::CLOSE_OVERFLOW;

/// Whether an HTTP/1 upgrade's `Sec-WebSocket-Key` is what RFC 6455
/// (4.2.1) requires, a base64-encoded 16-byte value (24 characters, the
/// last two `=`), which axum does not check; a handshake without it is
/// answered `400` before any seat is taken. HTTP/2 extended `CONNECT`
/// (RFC 8441) has no key.
fn valid_handshake_key(version: Version, headers: &HeaderMap) -> bool {
    if version > Version::HTTP_11 {
        return true;
    }
    let Some(key) = headers.get(SEC_WEBSOCKET_KEY) else {
        return false;
    };
    let key = key.as_bytes();
    let base64 = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/');
    key.len() == 24 && key[..22].iter().all(base64) && &key[22..] == b"=="
}

/// The string `id` of a text message that is a JSON object.
fn message_id(text: &str) -> Option<String> {
    if !text.trim_start().starts_with('{') {
        return None;
    }
    match serde_json::from_str::<Value>(text).ok()? {
        Value::Object(mut object) => match object.remove("id")? {
            Value::String(id) => Some(id),
            _ => None,
        },
        _ => None,
    }
}

/// `GET /presence?tenant=T&user=U` → `{"online":true,"connections":2}`.
pub(super) async fn presence(State(state): State<Arc<WsState>>, uri: Uri) -> Response {
    let key = match state.presence.key(&HeaderMap::new(), &uri) {
        Ok(key) => key,
        Err(BadIdentity::MissingUser) => return problem(StatusCode::BAD_REQUEST, "missing ?user="),
        Err(error) => return problem(StatusCode::BAD_REQUEST, &error.detail()),
    };
    match state.connections.presence(&key).await {
        Ok(presence) => Json(json!({
            "online": presence.online,
            "connections": presence.connections,
        }))
        .into_response(),
        Err(error) => {
            tracing::warn!(%error, "presence failed");
            problem(StatusCode::SERVICE_UNAVAILABLE, "presence unavailable")
        }
    }
}

/// The per-message and per-byte policies of `/ws` (`--message-limit` named
/// `messages`, `--byte-limit` named `bytes`), as the guard charges them.
pub(super) fn message_policies(config: &WsConfig) -> [Option<Policy>; 2] {
    [
        (&config.message_limit, "messages"),
        (&config.byte_limit, "bytes"),
    ]
    .map(|(quota, name)| {
        quota.as_ref().map(|quota| {
            let named = quota.clone().named(name).unwrap_or_else(|_| quota.clone());
            Policy::from(named)
        })
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn handshake_keys() {
        let with = |key: &[u8]| {
            let mut headers = HeaderMap::new();
            headers.insert(
                SEC_WEBSOCKET_KEY,
                axum::http::HeaderValue::from_bytes(key).unwrap(),
            );
            headers
        };
        // RFC 6455's example key.
        let good = with(b"dGhlIHNhbXBsZSBub25jZQ==");
        assert!(valid_handshake_key(Version::HTTP_11, &good));
        for bad in [
            &b""[..],
            b"dGhlIHNhbXBsZSBub25jZQ",
            b"dGhlIHNhbXBsZSBub25jZQ=",
            b"dGhlIHNhbXBsZSBub25jZQ===",
            b"dGhlIHNhbXBsZSBub25jZ*==",
            b"\xff\xfeIHNhbXBsZSBub25jZQ==",
            b"-1",
        ] {
            assert!(
                !valid_handshake_key(Version::HTTP_11, &with(bad)),
                "{bad:?}"
            );
        }
        assert!(!valid_handshake_key(Version::HTTP_11, &HeaderMap::new()));
        // HTTP/2 extended CONNECT carries no key.
        assert!(valid_handshake_key(Version::HTTP_2, &HeaderMap::new()));
    }

    #[test]
    fn ids() {
        assert_eq!(message_id(r#"{"id":"a1","x":1}"#).as_deref(), Some("a1"));
        assert_eq!(message_id(r#"{"id":1}"#), None);
        assert_eq!(message_id(r#"["id"]"#), None);
        assert_eq!(message_id("hello"), None);
        assert_eq!(message_id("{broken"), None);
    }
}
