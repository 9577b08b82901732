//! Hostile input through every public surface of the gateway, black box:
//! every query parameter and header of `/ws` (identity, room, position and
//! the upgrade's own headers), `/presence`, `/api/quota`, `/api/hello` and
//! the admin routes, with values at and past 2^53, negative, empty, 10 KB,
//! non-UTF-8 (percent-encoded in a query, raw bytes in a header) and
//! non-ASCII, plus hostile WebSocket frames, on the embedded store and on a
//! throwaway Redis. Requests are written byte for byte on a raw TCP socket
//! (a client library would refuse or re-encode most of them).
//!
//! Every case asserts its status class (a `4xx`, a WebSocket close code, or
//! the ordinary answer for a value that is merely unusual, such as the user
//! `-1`), and after all of them: no `5xx` anywhere, no `panicked` in the
//! gateway's log, and the victims unchanged: the quotas left (`/api/quota`)
//! and the presence (`/presence`, read while every hostile socket is still
//! open) of identities no case names, a room's epoch and last id as a
//! fresh join sees them, and the admin API's tenant list and the tenant a
//! hostile `PUT` targets.
//!
//! Positions ahead of a room's head (issue 22 defect 3, fixed in the rooms
//! and the event store by another change) have their own test below.
#![allow(clippy::unwrap_used)]

mod support;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::GatewayProcess;
use tower_window_tests::redis_server::RedisServer;

const TOKEN: &str = "hostile-admin-token";

/// The tenants: a generous default (hostile cases must not hit 429), a
/// listed tenant, and the victim tenant hostile admin calls target.
const TENANTS: &str = r#"
[default]
quotas = { minute = "100000/1m" }

[tenants.acme]
quotas = { minute = "100000/1m" }

[tenants.victim-co]
quotas = { minute = "50/1m", burst = "5/1s" }
"#;

/// Every read waits at most this long (a bound, never asserted as a speed).
const PATIENCE: Duration = Duration::from_secs(10);

/// The value classes of the issue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum V {
    /// 2^53 - 1.
    Max53,
    /// 2^53.
    Past53,
    /// 2^64, past every integer type.
    Past64,
    Negative,
    Empty,
    /// 10 KB.
    Huge,
    /// Invalid UTF-8: `%ff%fe` in a query, the raw bytes in a header.
    BadUtf8,
    /// `é日本`.
    NonAscii,
}

const VALUES: [V; 8] = [
    V::Max53,
    V::Past53,
    V::Past64,
    V::Negative,
    V::Empty,
    V::Huge,
    V::BadUtf8,
    V::NonAscii,
];

impl V {
    /// The value in a query string (percent-encoded where needed).
    fn query(self) -> Vec<u8> {
        match self {
            V::Max53 => b"9007199254740991".to_vec(),
            V::Past53 => b"9007199254740992".to_vec(),
            V::Past64 => b"18446744073709551616".to_vec(),
            V::Negative => b"-1".to_vec(),
            V::Empty => Vec::new(),
            V::Huge => vec![b'a'; 10 * 1024],
            V::BadUtf8 => b"%ff%fe".to_vec(),
            V::NonAscii => b"%C3%A9%E6%97%A5%E6%9C%AC".to_vec(),
        }
    }

    /// The value as raw header bytes.
    fn header(self) -> Vec<u8> {
        match self {
            V::BadUtf8 => b"\xff\xfe".to_vec(),
            V::NonAscii => "é日本".as_bytes().to_vec(),
            other => other.query(),
        }
    }

    /// Whether it is a usable tenant or user name (any bytes, 1 to 1024 of
    /// them).
    fn usable_name(self) -> bool {
        !matches!(self, V::Empty | V::Huge)
    }
}

/// What a case must be answered with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// A `2xx` (the value is unusual, not invalid).
    Ok,
    /// `101`: the value is usable, the upgrade happens.
    Upgrade,
    /// A `4xx`.
    ClientError,
    /// `401`.
    Unauthorized,
    /// `400` with the `key-too-long` problem (not `missing-key`): a tenant
    /// or user longer than the route accepts.
    KeyTooLong,
    /// `101`, then a close frame with one of these codes in answer to the
    /// case's frame.
    Close(&'static [u16]),
}

struct Case {
    name: String,
    request: Vec<u8>,
    expect: Expect,
    /// A frame to send after the upgrade (for [`Expect::Close`]).
    frame: Option<Vec<u8>>,
}

fn case(name: impl Into<String>, request: Vec<u8>, expect: Expect) -> Case {
    Case {
        name: name.into(),
        request,
        expect,
        frame: None,
    }
}

/// A request line and headers, `connection: close` unless upgrading.
fn http(method: &str, target: &[u8], headers: &[(&str, &[u8])], body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(method.as_bytes());
    out.push(b' ');
    out.extend_from_slice(target);
    out.extend_from_slice(b" HTTP/1.1\r\nhost: 127.0.0.1\r\n");
    let upgrading = headers.iter().any(|(name, _)| *name == "upgrade");
    if !upgrading {
        out.extend_from_slice(b"connection: close\r\n");
    }
    for (name, value) in headers {
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    if !body.is_empty() {
        out.extend_from_slice(format!("content-length: {}\r\n", body.len()).as_bytes());
        out.extend_from_slice(b"content-type: application/json\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
    out
}

/// The upgrade headers of a valid handshake (RFC 6455's example key).
const UPGRADE: [(&str, &[u8]); 4] = [
    ("upgrade", b"websocket"),
    ("connection", b"upgrade"),
    ("sec-websocket-version", b"13"),
    ("sec-websocket-key", b"dGhlIHNhbXBsZSBub25jZQ=="),
];

fn ws_request(target: &[u8], extra: &[(&str, &[u8])]) -> Vec<u8> {
    let mut headers: Vec<(&str, &[u8])> = UPGRADE.to_vec();
    headers.extend_from_slice(extra);
    http("GET", target, &headers, b"")
}

fn target(path: &str, params: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = path.as_bytes().to_vec();
    for (i, (name, value)) in params.iter().enumerate() {
        out.push(if i == 0 { b'?' } else { b'&' });
        out.extend_from_slice(name.as_bytes());
        out.push(b'=');
        out.extend_from_slice(value);
    }
    out
}

/// A parsed answer; the socket stays open after a `101`.
struct Answer {
    status: u16,
    head: String,
    body: Vec<u8>,
    socket: Option<(TcpStream, Vec<u8>)>,
}

fn send(port: u16, request: &[u8]) -> Answer {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    stream.set_write_timeout(Some(PATIENCE)).unwrap();
    stream.write_all(request).unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    let head_end = loop {
        if let Some(end) = find(&buf, b"\r\n\r\n") {
            break end;
        }
        let n = stream.read(&mut chunk).unwrap_or(0);
        assert!(n > 0, "connection closed before a response head: {buf:?}");
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let status: u16 = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    let rest = buf[head_end + 4..].to_vec();
    if status == 101 {
        return Answer {
            status,
            head,
            body: Vec::new(),
            socket: Some((stream, rest)),
        };
    }
    // Upgrade requests keep the connection open: read what the head says.
    let length = head.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse::<usize>().ok())
            .flatten()
    });
    let mut body = rest;
    match length {
        Some(length) => {
            while body.len() < length {
                match stream.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => body.extend_from_slice(&chunk[..n]),
                }
            }
        }
        None => {
            let _ = stream.read_to_end(&mut body);
        }
    }
    Answer {
        status,
        head,
        body,
        socket: None,
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// A client frame (masked unless `masked` is false).
fn frame(first: u8, payload: &[u8], masked: bool) -> Vec<u8> {
    let mut out = vec![first];
    let mask_bit = if masked { 0x80 } else { 0 };
    match payload.len() {
        n if n < 126 => out.push(mask_bit | n as u8),
        n if n < 65_536 => {
            out.push(mask_bit | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(mask_bit | 127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    if masked {
        let key = [0x1f, 0x2e, 0x3d, 0x4c];
        out.extend_from_slice(&key);
        out.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
    } else {
        out.extend_from_slice(payload);
    }
    out
}

fn text(payload: &[u8]) -> Vec<u8> {
    frame(0x81, payload, true)
}

/// Reads one server frame: its opcode and payload (`None` at EOF).
fn read_frame(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<(u8, Vec<u8>)> {
    let mut chunk = [0u8; 16 * 1024];
    let mut fill = |buf: &mut Vec<u8>, want: usize| -> bool {
        while buf.len() < want {
            match stream.read(&mut chunk) {
                Ok(0) | Err(_) => return false,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        true
    };
    if !fill(buf, 2) {
        return None;
    }
    let opcode = buf[0] & 0x0f;
    let (len, offset) = match buf[1] & 0x7f {
        126 => {
            if !fill(buf, 4) {
                return None;
            }
            (usize::from(u16::from_be_bytes([buf[2], buf[3]])), 4)
        }
        127 => {
            if !fill(buf, 10) {
                return None;
            }
            let mut len = [0u8; 8];
            len.copy_from_slice(&buf[2..10]);
            (usize::try_from(u64::from_be_bytes(len)).unwrap(), 10)
        }
        n => (usize::from(n), 2),
    };
    if !fill(buf, offset + len) {
        return None;
    }
    let payload = buf[offset..offset + len].to_vec();
    buf.drain(..offset + len);
    Some((opcode, payload))
}

/// Reads frames until a close (its code) or EOF (`None`), at most 20.
fn close_code(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<u16> {
    for _ in 0..20 {
        let (opcode, payload) = read_frame(stream, buf)?;
        if opcode == 8 {
            return (payload.len() >= 2).then(|| u16::from_be_bytes([payload[0], payload[1]]));
        }
    }
    None
}

/// Reads text frames until one of `kind` (`"joined"`, `"event"`), at most 50.
fn frame_of(stream: &mut TcpStream, buf: &mut Vec<u8>, kind: &str) -> Value {
    for _ in 0..50 {
        let (opcode, payload) = read_frame(stream, buf).expect("socket ended");
        if opcode == 1 {
            let value: Value = serde_json::from_slice(&payload).unwrap();
            if value["type"] == kind {
                return value;
            }
        }
    }
    panic!("no {kind} frame in 50");
}

// ---------------------------------------------------------------------------
// The victims.
// ---------------------------------------------------------------------------

/// Identities no hostile case names, each one a request could be
/// mis-keyed to: the `public` and `acme` tenants of the users the cases
/// name, the query's user behind a hostile header (and the header's behind
/// a hostile query), and the U+FFFD aliases of `%ff%fe`.
const VICTIMS: [(&str, &str); 7] = [
    ("public", "mallory"),
    ("acme", "mallory"),
    ("public", "victim"),
    ("acme", "victim"),
    ("public", "\u{fffd}\u{fffd}"),
    ("\u{fffd}\u{fffd}", "mallory"),
    ("victim-co", "victim"),
];

/// The room whose epoch and head no case may change.
const ROOM: &str = "lobby";

fn pct(text: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.') {
            out.push(b);
        } else {
            out.extend_from_slice(format!("%{b:02X}").as_bytes());
        }
    }
    out
}

/// What the victims look like from outside.
#[derive(Debug, PartialEq)]
struct Victims {
    /// Per victim: every quota's remaining, and the live connections.
    users: BTreeMap<String, (BTreeMap<String, u64>, u64)>,
    /// The room's epoch and last id as a fresh join sees them.
    room: (String, String),
    /// `GET /admin/tenants` and `GET /admin/tenants/victim-co`.
    admin: (Value, Value),
}

fn json_of(port: u16, request: &[u8]) -> Value {
    let answer = send(port, request);
    assert_eq!(answer.status, 200, "{}", answer.head);
    serde_json::from_slice(&answer.body).unwrap()
}

fn observe(port: u16) -> Victims {
    let mut users = BTreeMap::new();
    for (tenant, user) in VICTIMS {
        let params = [("tenant", &pct(tenant)[..]), ("user", &pct(user)[..])];
        let quota = json_of(port, &http("GET", &target("/api/quota", &params), &[], b""));
        assert_eq!(quota["tenant"], tenant);
        assert_eq!(quota["user"], user);
        let remaining = quota["quotas"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(name, q)| (name.clone(), q["remaining"].as_u64().unwrap()))
            .collect::<BTreeMap<_, _>>();
        assert!(!remaining.is_empty(), "{quota}");
        let presence = json_of(port, &http("GET", &target("/presence", &params), &[], b""));
        let connections = presence["connections"].as_u64().unwrap();
        users.insert(format!("{tenant}/{user}"), (remaining, connections));
    }
    let auth = format!("Bearer {TOKEN}");
    let admin = [("authorization", auth.as_bytes())];
    Victims {
        users,
        room: room_head(port),
        admin: (
            json_of(port, &http("GET", b"/admin/tenants", &admin, b"")),
            json_of(port, &http("GET", b"/admin/tenants/victim-co", &admin, b"")),
        ),
    }
}

/// The room's epoch and last id as a fresh join sees them.
fn room_head(port: u16) -> (String, String) {
    let request = ws_request(
        &target("/ws", &[("room", ROOM.as_bytes()), ("user", b"observer")]),
        &[],
    );
    let answer = send(port, &request);
    assert_eq!(answer.status, 101, "{}", answer.head);
    let (mut stream, mut buf) = answer.socket.unwrap();
    let joined = frame_of(&mut stream, &mut buf, "joined");
    (
        joined["epoch"].as_str().unwrap().to_owned(),
        joined["last_event_id"].as_str().unwrap().to_owned(),
    )
}

/// Publishes one message to the room, so it has a head.
fn publish(port: u16) {
    let request = ws_request(
        &target("/ws", &[("room", ROOM.as_bytes()), ("user", b"host")]),
        &[],
    );
    let answer = send(port, &request);
    assert_eq!(answer.status, 101, "{}", answer.head);
    let (mut stream, mut buf) = answer.socket.unwrap();
    frame_of(&mut stream, &mut buf, "joined");
    stream.write_all(&text(b"hello")).unwrap();
    frame_of(&mut stream, &mut buf, "event");
}

// ---------------------------------------------------------------------------
// The cases.
// ---------------------------------------------------------------------------

/// Tenant and user values on every route that reads them.
fn identity_cases(cases: &mut Vec<Case>) {
    for v in VALUES {
        let user_expect = match v {
            V::Huge => Expect::KeyTooLong,
            v if v.usable_name() => Expect::Ok,
            _ => Expect::ClientError,
        };
        // An empty tenant names none: the tenant is `public`, as without it.
        let tenant_expect = if v == V::Huge {
            Expect::KeyTooLong
        } else {
            Expect::Ok
        };
        // `/presence` is not rate limited: its own `400` says what is wrong.
        let presence = |expect| match expect {
            Expect::KeyTooLong => Expect::ClientError,
            other => other,
        };
        // The user the tenant cases name; an empty tenant is `public`, so
        // it names a user of its own, not a victim.
        let tenant_user: &[u8] = if v == V::Empty {
            b"mallory-empty"
        } else {
            b"mallory"
        };
        let upgrade = |expect| match expect {
            Expect::Ok => Expect::Upgrade,
            other => other,
        };
        // A hostile header with the victim as the next source; an empty one
        // is absent, and then the next source rightly decides.
        let fallback_user: &[u8] = if v == V::Empty { b"" } else { b"victim" };

        // /api/hello: headers only (the query is never read).
        cases.push(case(
            format!("/api/hello x-user-id={v:?}"),
            http(
                "GET",
                &target("/api/hello", &[("user", b"victim")]),
                &[("x-user-id", &v.header())],
                b"",
            ),
            user_expect,
        ));
        cases.push(case(
            format!("/api/hello x-tenant-id={v:?}"),
            http(
                "GET",
                &target("/api/hello", &[("tenant", b"acme")]),
                &[("x-tenant-id", &v.header()), ("x-user-id", tenant_user)],
                b"",
            ),
            tenant_expect,
        ));

        // /ws: headers, then the query parameters.
        let mut ws_user_params: Vec<(&str, &[u8])> = vec![];
        if !fallback_user.is_empty() {
            ws_user_params.push(("user", fallback_user));
        }
        cases.push(case(
            format!("/ws x-user-id={v:?} ?user=victim"),
            ws_request(
                &target("/ws", &ws_user_params),
                &[("x-user-id", &v.header())],
            ),
            upgrade(user_expect),
        ));
        cases.push(case(
            format!("/ws ?user={v:?}"),
            ws_request(&target("/ws", &[("user", &v.query())]), &[]),
            upgrade(user_expect),
        ));
        cases.push(case(
            format!("/ws x-tenant-id={v:?} ?tenant=acme"),
            ws_request(
                &target("/ws", &[("tenant", b"acme")]),
                &[("x-tenant-id", &v.header()), ("x-user-id", tenant_user)],
            ),
            upgrade(tenant_expect),
        ));
        cases.push(case(
            format!("/ws ?tenant={v:?}"),
            ws_request(
                &target("/ws", &[("tenant", &v.query()), ("user", tenant_user)]),
                &[],
            ),
            upgrade(tenant_expect),
        ));
        cases.push(case(
            format!("/ws?room={ROOM} ?user={v:?}"),
            ws_request(
                &target("/ws", &[("room", ROOM.as_bytes()), ("user", &v.query())]),
                &[],
            ),
            upgrade(user_expect),
        ));

        // /presence: the query parameters only.
        cases.push(case(
            format!("/presence ?user={v:?}"),
            http(
                "GET",
                &target("/presence", &[("user", &v.query())]),
                &[("x-user-id", b"victim")],
                b"",
            ),
            presence(user_expect),
        ));
        cases.push(case(
            format!("/presence ?tenant={v:?}"),
            http(
                "GET",
                &target(
                    "/presence",
                    &[("tenant", &v.query()), ("user", tenant_user)],
                ),
                &[],
                b"",
            ),
            presence(tenant_expect),
        ));

        // /api/quota: the query parameters, then the headers (max 256 bytes).
        let mut quota_headers: Vec<(&str, &[u8])> = vec![];
        if !fallback_user.is_empty() {
            quota_headers.push(("x-user-id", fallback_user));
        }
        cases.push(case(
            format!("/api/quota ?user={v:?} x-user-id=victim"),
            http(
                "GET",
                &target("/api/quota", &[("user", &v.query())]),
                &quota_headers,
                b"",
            ),
            user_expect,
        ));
        cases.push(case(
            format!("/api/quota x-user-id={v:?}"),
            http("GET", b"/api/quota", &[("x-user-id", &v.header())], b""),
            user_expect,
        ));
        cases.push(case(
            format!("/api/quota ?tenant={v:?}"),
            http(
                "GET",
                &target(
                    "/api/quota",
                    &[("tenant", &v.query()), ("user", tenant_user)],
                ),
                &[],
                b"",
            ),
            tenant_expect,
        ));
        cases.push(case(
            format!("/api/quota x-tenant-id={v:?}"),
            http(
                "GET",
                &target("/api/quota", &[("user", tenant_user)]),
                &[("x-tenant-id", &v.header())],
                b"",
            ),
            tenant_expect,
        ));
    }
}

/// A tenant or user query parameter given twice is ambiguous.
fn repeated_cases(cases: &mut Vec<Case>) {
    for path in ["/ws", "/presence", "/api/quota"] {
        for params in [
            &[("user", &b"mallory"[..]), ("user", b"victim")][..],
            &[
                ("tenant", b"mallory-co"),
                ("user", b"victim"),
                ("tenant", b"acme"),
            ],
        ] {
            let request = if path == "/ws" {
                ws_request(&target(path, params), &[])
            } else {
                http("GET", &target(path, params), &[], b"")
            };
            cases.push(case(
                format!("{path} {}", String::from_utf8_lossy(&target("", params))),
                request,
                Expect::ClientError,
            ));
        }
    }
}

/// `room`, `epoch` and `last_event_id` (with an epoch that is not the
/// room's, and positions behind the room's head with its real epoch).
fn room_cases(cases: &mut Vec<Case>, epoch: &str) {
    let user: &[u8] = b"mallory-rooms";
    for v in VALUES {
        // A room name is 1 to 64 of [A-Za-z0-9_.-]: numbers and `-1` are names.
        let room_expect = match v {
            V::Max53 | V::Past53 | V::Past64 | V::Negative => Expect::Upgrade,
            _ => Expect::ClientError,
        };
        cases.push(case(
            format!("/ws ?room={v:?}"),
            ws_request(&target("/ws", &[("room", &v.query()), ("user", user)]), &[]),
            room_expect,
        ));
        // An epoch is 1 to 64 lowercase hex digits: an unknown one is a
        // resync for this client alone; anything else (`-1` too) a 400.
        let epoch_expect = match v {
            V::Max53 | V::Past53 | V::Past64 => Expect::Upgrade,
            _ => Expect::ClientError,
        };
        cases.push(case(
            format!("/ws?room={ROOM} ?epoch={v:?}"),
            ws_request(
                &target(
                    "/ws",
                    &[
                        ("room", ROOM.as_bytes()),
                        ("user", user),
                        ("epoch", &v.query()),
                    ],
                ),
                &[],
            ),
            epoch_expect,
        ));
        // Ids are <ms>-<seq>, each part at most 2^53 - 1.
        let raw = v.query();
        let ids: [(Vec<u8>, Expect); 3] = [
            // An empty id is a client that received nothing yet.
            (
                raw.clone(),
                if v == V::Empty {
                    Expect::Upgrade
                } else {
                    Expect::ClientError
                },
            ),
            (
                [&raw[..], b"-0"].concat(),
                if v == V::Max53 {
                    Expect::Upgrade
                } else {
                    Expect::ClientError
                },
            ),
            (
                [&b"0-"[..], &raw[..]].concat(),
                if v == V::Max53 {
                    Expect::Upgrade
                } else {
                    Expect::ClientError
                },
            ),
        ];
        for (id, expect) in ids {
            let shown = String::from_utf8_lossy(&id[..id.len().min(24)]).into_owned();
            // With an epoch that is not the room's: a resync, for this
            // client alone, whatever the position.
            cases.push(case(
                format!("/ws?room={ROOM} epoch=other last_event_id={v:?} ({shown})"),
                ws_request(
                    &target(
                        "/ws",
                        &[
                            ("room", ROOM.as_bytes()),
                            ("user", user),
                            ("epoch", b"0ff0ff"),
                            ("last_event_id", &id),
                        ],
                    ),
                    &[],
                ),
                expect,
            ));
            // With the room's epoch: only positions behind the head here
            // (`0-<n>`), or malformed ones; ahead of the head is tested below.
            if id.starts_with(b"0-") || id.is_empty() || expect == Expect::ClientError {
                cases.push(case(
                    format!("/ws?room={ROOM} epoch=<the room's> last_event_id={v:?} ({shown})"),
                    ws_request(
                        &target(
                            "/ws",
                            &[
                                ("room", ROOM.as_bytes()),
                                ("user", user),
                                ("epoch", epoch.as_bytes()),
                                ("last_event_id", &id),
                            ],
                        ),
                        &[],
                    ),
                    expect,
                ));
            }
        }
    }
    // `last_event_id` without its epoch.
    cases.push(case(
        "/ws last_event_id without epoch",
        ws_request(
            &target(
                "/ws",
                &[
                    ("room", ROOM.as_bytes()),
                    ("user", user),
                    ("last_event_id", b"1-0"),
                ],
            ),
            &[],
        ),
        Expect::ClientError,
    ));
    // Repeated parameters.
    cases.push(case(
        "/ws room twice",
        ws_request(
            &target(
                "/ws",
                &[
                    ("room", ROOM.as_bytes()),
                    ("room", b"other"),
                    ("user", user),
                ],
            ),
            &[],
        ),
        Expect::ClientError,
    ));
}

/// The upgrade's own headers, each replaced by every value class.
fn handshake_cases(cases: &mut Vec<Case>) {
    for (header, expect) in [
        // RFC 6455 4.2.1: a key that is not a base64-encoded 16-byte value
        // is answered 400.
        ("sec-websocket-key", Expect::ClientError),
        ("sec-websocket-version", Expect::ClientError),
        ("upgrade", Expect::ClientError),
        ("connection", Expect::ClientError),
        // Offered subprotocols and extensions the server does not select
        // are ignored (RFC 6455 4.2.2); so is the origin (no CORS on /ws).
        ("sec-websocket-protocol", Expect::Upgrade),
        ("sec-websocket-extensions", Expect::Upgrade),
        ("origin", Expect::Upgrade),
    ] {
        for v in VALUES {
            let value = v.header();
            let mut headers: Vec<(&str, &[u8])> = UPGRADE
                .iter()
                .filter(|(name, _)| *name != header)
                .copied()
                .collect();
            headers.push((header, &value));
            cases.push(case(
                format!("/ws {header}={v:?}"),
                http("GET", b"/ws?user=mallory-handshake", &headers, b""),
                expect,
            ));
        }
    }
    // Missing key.
    let headers: Vec<(&str, &[u8])> = UPGRADE[..3].to_vec();
    cases.push(case(
        "/ws without sec-websocket-key",
        http("GET", b"/ws?user=mallory-handshake", &headers, b""),
        Expect::ClientError,
    ));
}

/// Hostile frames after an upgrade, in the echo mode and in a room: each
/// is answered with a close code, never a dropped connection.
fn frame_cases(cases: &mut Vec<Case>) {
    let frames: [(&str, Vec<u8>, &'static [u16]); 8] = [
        ("invalid UTF-8 text", text(b"\xff\xfe"), &[1007]),
        // Past --max-message-bytes (4096 in these tests).
        ("text over the size limit", text(&[b'a'; 8192]), &[1009]),
        ("unmasked frame", frame(0x81, b"hi", false), &[1002]),
        ("reserved bits", frame(0xf1, b"hi", true), &[1002]),
        ("unknown opcode", frame(0x83, b"", true), &[1002]),
        (
            "ping over 125 bytes",
            frame(0x89, &[b'p'; 200], true),
            &[1002],
        ),
        ("close with code 0", frame(0x88, b"\x00\x00", true), &[1002]),
        (
            "close with a one-byte payload",
            frame(0x88, b"x", true),
            &[1002],
        ),
    ];
    for (mode, target) in [
        ("echo", &b"/ws?user=mallory-frames"[..]),
        ("room", &b"/ws?user=mallory-frames&room=frames"[..]),
    ] {
        for (name, frame, codes) in &frames {
            cases.push(Case {
                name: format!("/ws {mode}: {name}"),
                request: ws_request(target, &[]),
                expect: Expect::Close(codes),
                frame: Some(frame.clone()),
            });
        }
        // A normal close is answered with a close (RFC 6455 5.5.1).
        cases.push(Case {
            name: format!("/ws {mode}: close 1000"),
            request: ws_request(target, &[]),
            expect: Expect::Close(&[1000]),
            frame: Some(frame(0x88, b"\x03\xe8bye", true)),
        });
    }
    cases.push(Case {
        name: "/ws room: binary message".to_owned(),
        request: ws_request(b"/ws?user=mallory-frames&room=frames", &[]),
        expect: Expect::Close(&[1003]),
        frame: Some(frame(0x82, b"\x00\x01", true)),
    });
}

/// The admin routes: path segments, the bearer token and `PUT` bodies.
fn admin_cases(cases: &mut Vec<Case>) {
    let auth = format!("Bearer {TOKEN}");
    let auth: &[u8] = auth.as_bytes();
    for v in VALUES {
        let segment = v.query();
        // Tenant names are 1 to 128 bytes of UTF-8 without whitespace,
        // control characters or `/`: numbers, `-1` and `é日本` are names
        // (not listed: 404; their usage reads the default policy, and a
        // `DELETE` closes them like `reset` resets them: they stay on the
        // default, with fresh windows of their own).
        let (listed_expect, usage_expect) = match v {
            V::Empty | V::Huge | V::BadUtf8 => (Expect::ClientError, Expect::ClientError),
            _ => (Expect::ClientError, Expect::Ok),
        };
        for (method, path, expect) in [
            (
                "GET",
                [&b"/admin/tenants/"[..], &segment].concat(),
                listed_expect,
            ),
            (
                "DELETE",
                [&b"/admin/tenants/"[..], &segment].concat(),
                usage_expect,
            ),
            // Resets the named tenant's windows (served by the default).
            (
                "POST",
                [&b"/admin/tenants/"[..], &segment, b"/reset"].concat(),
                usage_expect,
            ),
        ] {
            cases.push(case(
                format!(
                    "{method} {}",
                    String::from_utf8_lossy(&path[..path.len().min(40)])
                ),
                http(method, &path, &[("authorization", auth)], b""),
                expect,
            ));
        }
        cases.push(case(
            format!("GET /admin/tenants/{v:?}/usage/victim"),
            http(
                "GET",
                &[&b"/admin/tenants/"[..], &segment, b"/usage/victim"].concat(),
                &[("authorization", auth)],
                b"",
            ),
            usage_expect,
        ));
        // Subjects are 1 to 1024 bytes of UTF-8.
        cases.push(case(
            format!("GET /admin/tenants/victim-co/usage/{v:?}"),
            http(
                "GET",
                &[&b"/admin/tenants/victim-co/usage/"[..], &segment].concat(),
                &[("authorization", auth)],
                b"",
            ),
            usage_expect,
        ));
        // A PUT whose body is hostile: the victim tenant stays as it was.
        cases.push(case(
            format!("PUT /admin/tenants/{v:?} (hostile body)"),
            http(
                "PUT",
                &[&b"/admin/tenants/"[..], &segment].concat(),
                &[("authorization", auth)],
                br#"{"quotas":{"q":"0/1s"}}"#,
            ),
            Expect::ClientError,
        ));
        // The token itself, and the scheme.
        let value = v.header();
        let mut tokens = vec![
            ("Bearer <v>", [&b"Bearer "[..], &value].concat()),
            ("<v>", value.clone()),
        ];
        if v != V::Empty {
            tokens.push(("Bearer <token><v>", [auth, &value].concat()));
        }
        for (name, header) in tokens {
            cases.push(case(
                format!("GET /admin/tenants authorization={name} v={v:?}"),
                http("GET", b"/admin/tenants", &[("authorization", &header)], b""),
                Expect::Unauthorized,
            ));
            cases.push(case(
                format!("PUT /admin/tenants/victim-co authorization={name} v={v:?}"),
                http(
                    "PUT",
                    b"/admin/tenants/victim-co",
                    &[("authorization", &header)],
                    br#"{"quotas":{"minute":"100000/1s"}}"#,
                ),
                Expect::Unauthorized,
            ));
        }
    }
    let huge = "a".repeat(10 * 1024);
    let many: Vec<String> = (0..1000).map(|i| format!("\"q{i}\":\"1/1s\"")).collect();
    let bodies: Vec<(String, Vec<u8>)> = [
        r#"{"quotas":{"minute":"9007199254740991/1m"}}"#.to_owned(),
        r#"{"quotas":{"minute":"9007199254740992/1m"}}"#.to_owned(),
        r#"{"quotas":{"minute":"18446744073709551616/1m"}}"#.to_owned(),
        r#"{"quotas":{"minute":"-1/1m"}}"#.to_owned(),
        r#"{"quotas":{"minute":"1/9007199254740993ms"}}"#.to_owned(),
        r#"{"quotas":{"minute":"1/-1s"}}"#.to_owned(),
        r#"{"quotas":{"minute":"10/s gcra(burst=9007199254740993)"}}"#.to_owned(),
        r#"{"quotas":{"minute":"100/1m sliding-counter(0ms)"}}"#.to_owned(),
        r#"{"quotas":{"minute":""}}"#.to_owned(),
        format!(r#"{{"quotas":{{"minute":"{huge}"}}}}"#),
        format!(r#"{{"quotas":{{"{huge}":"1/1s"}}}}"#),
        r#"{"quotas":{"é日本":"1/1s"}}"#.to_owned(),
        r#"{"quotas":{"minute":"\ud800"}}"#.to_owned(),
        r#"{"quotas":{}}"#.to_owned(),
        format!(r#"{{"quotas":{{"minute":{{"limit":"1/1s","scope":"{huge}"}}}}}}"#),
        r#"{"quotas":{"minute":"1/1s"},"shadow":["nope"]}"#.to_owned(),
        r#"{"unlimited":9007199254740993}"#.to_owned(),
        r#"{"quotas":{"minute":"1/1s"},"unlimited":true}"#.to_owned(),
        format!(r#"{{"quotas":{{{}}}}}"#, many.join(",")),
        "null".to_owned(),
        "[]".to_owned(),
        huge.clone(),
        String::new(),
    ]
    .into_iter()
    .map(|b| (b.chars().take(40).collect(), b.into_bytes()))
    .chain([
        (
            "invalid UTF-8 in a quota".to_owned(),
            b"{\"quotas\":{\"minute\":\"1/1s\xff\"}}".to_vec(),
        ),
        (
            "invalid UTF-8 in a name".to_owned(),
            b"{\"quotas\":{\"min\xffute\":\"1/1s\"}}".to_vec(),
        ),
        (
            "3 MB".to_owned(),
            [
                &br#"{"quotas":{"minute":"1/1s"},"x":""#[..],
                &vec![b'a'; 3 << 20],
                b"\"}",
            ]
            .concat(),
        ),
    ])
    .collect();
    for (name, body) in bodies {
        cases.push(case(
            format!("PUT /admin/tenants/victim-co body {name}"),
            http(
                "PUT",
                b"/admin/tenants/victim-co",
                &[("authorization", auth)],
                &body,
            ),
            Expect::ClientError,
        ));
    }
}

// ---------------------------------------------------------------------------
// The run.
// ---------------------------------------------------------------------------

fn start(store: &[&str], dir: &tempfile::TempDir) -> (GatewayProcess, u16) {
    let tenants = dir.path().join("tenants.toml");
    std::fs::write(&tenants, TENANTS).unwrap();
    let mut flags = vec![
        "--tenants",
        tenants.to_str().unwrap(),
        "--admin-token",
        TOKEN,
        "--message-limit",
        "100000/1m",
        "--byte-limit",
        "10000000/1m",
        "--max-message-bytes",
        "4096",
    ];
    flags.extend_from_slice(store);
    let gateway = GatewayProcess::start(&flags);
    let port = gateway.url().rsplit(':').next().unwrap().parse().unwrap();
    (gateway, port)
}

/// Sends every case; the failures (with what was sent and answered), and
/// the sockets left open by upgrades.
fn run(port: u16, cases: &[Case]) -> (Vec<String>, Vec<TcpStream>) {
    let mut failures = Vec::new();
    let mut open = Vec::new();
    for case in cases {
        let mut answer = send(port, &case.request);
        let ok = match case.expect {
            Expect::Ok => (200..300).contains(&answer.status),
            Expect::Upgrade => answer.status == 101,
            Expect::ClientError => (400..500).contains(&answer.status),
            Expect::Unauthorized => answer.status == 401,
            Expect::KeyTooLong => {
                answer.status == 400
                    && find(
                        &answer.body,
                        br#""type":"urn:tower-window:problem:key-too-long""#,
                    )
                    .is_some()
            }
            Expect::Close(codes) => {
                if answer.status == 101 {
                    let (mut stream, mut buf) = answer.socket.take().unwrap();
                    stream.write_all(case.frame.as_deref().unwrap()).unwrap();
                    match close_code(&mut stream, &mut buf) {
                        Some(code) if codes.contains(&code) => true,
                        other => {
                            failures.push(format!(
                                "{}: expected a close with {codes:?}, got {other:?}",
                                case.name
                            ));
                            continue;
                        }
                    }
                } else {
                    false
                }
            }
        };
        if answer.status >= 500 || !ok {
            let body =
                String::from_utf8_lossy(&answer.body[..answer.body.len().min(300)]).into_owned();
            let first = answer.head.lines().next().unwrap_or("").to_owned();
            failures.push(format!(
                "{}: expected {:?}, got {first} {body}",
                case.name, case.expect
            ));
        }
        if let Some((stream, _)) = answer.socket {
            open.push(stream);
        }
    }
    (failures, open)
}

fn every_surface(store: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let (gateway, port) = start(store, &dir);
    publish(port);
    let before = observe(port);
    let (epoch, _) = before.room.clone();

    let mut cases = Vec::new();
    identity_cases(&mut cases);
    repeated_cases(&mut cases);
    room_cases(&mut cases, &epoch);
    handshake_cases(&mut cases);
    frame_cases(&mut cases);
    admin_cases(&mut cases);
    let started = Instant::now();
    let (failures, open) = run(port, &cases);
    // Presence is read with every hostile socket still open.
    let after = observe(port);
    drop(open);
    eprintln!(
        "{} cases on {store:?} in {:?}",
        cases.len(),
        started.elapsed()
    );

    let log = gateway.log();
    let mut problems = failures;
    if log.contains("panicked") {
        problems.push(format!("the gateway panicked:\n{log}"));
    }
    if after != before {
        problems.push(format!(
            "a victim's state changed:\nbefore {before:#?}\nafter  {after:#?}"
        ));
    }
    assert!(
        problems.is_empty(),
        "{} of {} cases on {store:?} failed:\n{}",
        problems.len(),
        cases.len(),
        problems.join("\n")
    );
}

#[test]
fn every_surface_answers_hostile_input_with_4xx_or_a_close_code_on_the_embedded_store() {
    every_surface(&[]);
}

#[test]
fn every_surface_answers_hostile_input_with_4xx_or_a_close_code_on_redis() {
    let redis = RedisServer::start();
    let url = redis.url();
    every_surface(&["--redis-url", &url]);
}

/// Issue 22 defect 3: a position ahead of the room's head, with the room's
/// (public) epoch, is answered for that client alone (a `400`, or a
/// `resync` to it), and the room keeps its epoch and head for everyone.
fn ahead_of_the_head(store: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let (gateway, port) = start(store, &dir);
    publish(port);
    let (epoch, head) = room_head(port);
    let head_ms: u64 = head.split('-').next().unwrap().parse().unwrap();
    let mut answered = Vec::new();
    for id in [
        "9007199254740991-0".to_owned(),
        "9007199254740991-9007199254740991".to_owned(),
        format!("{}-0", head_ms + 1),
    ] {
        let request = ws_request(
            &target(
                "/ws",
                &[
                    ("room", ROOM.as_bytes()),
                    ("user", b"mallory-ahead"),
                    ("epoch", epoch.as_bytes()),
                    ("last_event_id", id.as_bytes()),
                ],
            ),
            &[],
        );
        let answer = send(port, &request);
        assert!(
            answer.status == 101 || (400..500).contains(&answer.status),
            "{id}: {}",
            answer.head
        );
        answered.push((id.clone(), answer.status));
        drop(answer);
        assert_eq!(
            room_head(port),
            (epoch.clone(), head.clone()),
            "the position {id} changed the room for everyone ({answered:?})"
        );
    }
    assert!(!gateway.log().contains("panicked"), "{}", gateway.log());
}

#[test]
fn a_position_ahead_of_the_head_changes_nothing_for_others_on_the_embedded_store() {
    ahead_of_the_head(&[]);
}

#[test]
fn a_position_ahead_of_the_head_changes_nothing_for_others_on_redis() {
    let redis = RedisServer::start();
    let url = redis.url();
    ahead_of_the_head(&["--redis-url", &url]);
}
