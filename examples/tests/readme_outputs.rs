//! Every output the READMEs show is a real one (issue 26: the README's
//! `/api/hello` body lacked the real body's `"degraded":false`).
//!
//! Each shown output is a fenced block after a `<!-- output: NAME -->`
//! line, in `README.md`, `examples/README.md` and `axum-window-ext/README.md`.
//! A block is a sequence of `$ command` lines, each followed by what it
//! printed (a block without commands is one output). For every NAME this
//! test runs the scenario the block shows — the built `gateway` binary with
//! the block's flags, requests written byte for byte on loopback (Redis
//! where the block uses it: a throwaway `redis-server`), or the library in
//! process for the axum-window-ext README — and compares, per command:
//!
//! - the command line, verbatim (a trailing `  # comment` left out);
//! - an HTTP answer (`curl -i`): the status line, every header in order
//!   (with its value; only `date` and `content-length` are left out, as the
//!   READMEs say), and the body (as JSON when it is JSON);
//! - other output: line by line (JSON lines as JSON).
//!
//! Values that change from run to run (`reset_after_ms`, a notice's
//! `retry_after_ms`) are compared as "a number" only; the scenario names
//! them. A fenced block that shows an HTTP status line or a `$ curl`
//! command without a marker fails the test, as does a marker without a
//! scenario or a scenario whose block is gone, so the READMEs cannot drift
//! from the code again.
#![allow(clippy::unwrap_used)]

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::Value;
use support::GatewayProcess;
use tower_window_tests::redis_server::RedisServer;

/// The READMEs with shown outputs, relative to this package.
const READMES: [&str; 3] = ["../README.md", "README.md", "../axum-window-ext/README.md"];

/// Every read waits at most this long (a bound, never asserted as a speed).
const PATIENCE: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------- the READMEs

/// One marked block: where it is, its name, its lines.
struct Block {
    at: String,
    name: String,
    lines: Vec<String>,
}

/// The marked blocks of `file`, and the unmarked blocks that look like
/// shown outputs (an HTTP status line or a `$ curl` command).
fn blocks(file: &str) -> (Vec<Block>, Vec<String>) {
    let path = format!("{}/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let (mut marked, mut unmarked) = (Vec::new(), Vec::new());
    let mut pending: Option<String> = None;
    let mut lines = text.lines().enumerate();
    while let Some((n, line)) = lines.next() {
        if let Some(rest) = line.strip_prefix("<!-- output:") {
            let name = rest.trim_end_matches("-->").split_whitespace().next();
            pending = Some(name.expect("a marker names its output").to_owned());
            continue;
        }
        if !line.starts_with("```") {
            if !line.trim().is_empty() {
                pending = None; // a marker belongs to the block right after it
            }
            continue;
        }
        let body: Vec<String> = lines
            .by_ref()
            .map(|(_, l)| l)
            .take_while(|l| !l.starts_with("```"))
            .map(str::to_owned)
            .collect();
        let shown_as = match file.strip_prefix("../") {
            Some(outside) => outside.to_owned(),
            None => format!("examples/{file}"),
        };
        let at = format!("{shown_as}:{}", n + 1);
        match pending.take() {
            Some(name) => marked.push(Block {
                at,
                name,
                lines: body,
            }),
            None => {
                let looks_shown = body
                    .iter()
                    .any(|l| l.starts_with("HTTP/1.1 ") || l.starts_with("$ curl"));
                if looks_shown {
                    unmarked.push(at);
                }
            }
        }
    }
    (marked, unmarked)
}

/// `line` without a trailing `  # comment` and trailing whitespace.
fn uncommented(line: &str) -> &str {
    line.find("  #").map_or(line, |i| &line[..i]).trim_end()
}

/// A block as (command, output lines) pairs; `None` for a block without
/// commands.
fn segments(lines: &[String]) -> Vec<(Option<String>, Vec<String>)> {
    let mut out: Vec<(Option<String>, Vec<String>)> = Vec::new();
    for line in lines {
        if let Some(command) = line.strip_prefix("$ ") {
            out.push((Some(uncommented(command).to_owned()), Vec::new()));
            continue;
        }
        if out.is_empty() {
            out.push((None, Vec::new()));
        }
        out.last_mut().unwrap().1.push(line.clone());
    }
    // Blank lines between a command's output and the next command.
    for (_, output) in &mut out {
        while output.last().is_some_and(|l| l.trim().is_empty()) {
            output.pop();
        }
    }
    out
}

// ---------------------------------------------------------------- real answers

/// An HTTP answer: status line, headers (lower-case names), body.
#[derive(Debug)]
struct Answer {
    status: String,
    headers: Vec<(String, String)>,
    body: String,
}

/// What a command really printed.
#[derive(Debug)]
enum Out {
    /// Nothing (`gateway ... &`, `kill`).
    Nothing,
    /// `curl -i`.
    Http(Answer),
    /// Any other output, line by line.
    Lines(Vec<String>),
}

/// One shown command and its real output.
struct Shown {
    command: Option<&'static str>,
    out: Out,
}

fn shown(command: &'static str, out: Out) -> Shown {
    Shown {
        command: Some(command),
        out,
    }
}

/// Reads one HTTP/1.1 response (a `content-length` body) from `stream`.
fn read_answer(stream: &mut TcpStream) -> Answer {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert!(head.len() < 16_384, "an endless response head");
        stream.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    let mut lines = head.trim_end().split("\r\n");
    let status = lines.next().unwrap().to_owned();
    let headers: Vec<(String, String)> = lines
        .map(|line| {
            let (name, value) = line.split_once(':').unwrap();
            (name.trim().to_ascii_lowercase(), value.trim().to_owned())
        })
        .collect();
    let length = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .map_or(0, |(_, v)| v.parse().unwrap());
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).unwrap();
    Answer {
        status,
        headers,
        body: String::from_utf8(body).unwrap(),
    }
}

fn connect(gateway: &GatewayProcess) -> TcpStream {
    let addr = gateway.url().trim_start_matches("http://").to_owned();
    let stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    stream.set_write_timeout(Some(PATIENCE)).unwrap();
    stream
}

/// `method path` with `headers` and `body` (`curl` sends a form type with `-d`).
fn call(
    gateway: &GatewayProcess,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    let mut stream = connect(gateway);
    let mut request = format!("{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    if !body.is_empty() {
        request.push_str(&format!(
            "content-type: application/x-www-form-urlencoded\r\ncontent-length: {}\r\n",
            body.len()
        ));
    }
    // No `connection: close`: the answer is read by its length, and its
    // headers are the ones `curl` gets.
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).unwrap();
    read_answer(&mut stream)
}

fn get(gateway: &GatewayProcess, path: &str, headers: &[(&str, &str)]) -> Answer {
    call(gateway, "GET", path, headers, "")
}

/// `curl -si ... | grep -i -e ^a -e ^b`: the answer's lines that start
/// with one of `prefixes`, ignoring case.
fn grep(answer: &Answer, prefixes: &[&str]) -> Vec<String> {
    std::iter::once(answer.status.clone())
        .chain(answer.headers.iter().map(|(n, v)| format!("{n}: {v}")))
        .filter(|line| {
            let lower = line.to_ascii_lowercase();
            prefixes.iter().any(|p| lower.starts_with(p))
        })
        .collect()
}

/// An upgraded `/ws` socket (or the refusal of one).
fn upgrade(gateway: &GatewayProcess, user: &str) -> Result<TcpStream, Answer> {
    let mut stream = connect(gateway);
    write!(
        stream,
        "GET /ws HTTP/1.1\r\nhost: 127.0.0.1\r\nx-user-id: {user}\r\nupgrade: websocket\r\n\
         connection: upgrade\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
         sec-websocket-version: 13\r\n\r\n"
    )
    .unwrap();
    let answer = read_answer(&mut stream);
    if answer.status.starts_with("HTTP/1.1 101") {
        Ok(stream)
    } else {
        Err(answer)
    }
}

/// A masked client text frame.
fn text_frame(text: &str) -> Vec<u8> {
    let payload = text.as_bytes();
    let mut frame = vec![0x81, 0x80 | u8::try_from(payload.len()).unwrap()];
    let mask = [1u8, 2, 3, 4];
    frame.extend_from_slice(&mask);
    frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    frame
}

/// The next server text frame.
fn read_text(stream: &mut TcpStream) -> String {
    let mut head = [0u8; 2];
    stream.read_exact(&mut head).unwrap();
    assert_eq!(head[0], 0x81, "a text frame");
    let len = match head[1] {
        126 => {
            let mut n = [0u8; 2];
            stream.read_exact(&mut n).unwrap();
            usize::from(u16::from_be_bytes(n))
        }
        n => usize::from(n),
    };
    let mut payload = vec![0u8; len];
    stream.read_exact(&mut payload).unwrap();
    String::from_utf8(payload).unwrap()
}

// ---------------------------------------------------------------- scenarios

/// The real outputs of block `name`, and the JSON members whose numbers
/// vary between runs.
fn scenario(name: &str) -> (Vec<Shown>, &'static [&'static str]) {
    match name {
        "run-it" => {
            let gateway = GatewayProcess::start(&[]);
            let answer = get(&gateway, "/api/hello", &[("x-user-id", "alice")]);
            (
                vec![Shown {
                    command: None,
                    out: Out::Http(answer),
                }],
                &[],
            )
        }
        "hello" => {
            let gateway = GatewayProcess::start(&[]);
            let acme = get(
                &gateway,
                "/api/hello",
                &[("x-user-id", "alice"), ("x-tenant-id", "acme")],
            );
            let anonymous = get(&gateway, "/api/hello", &[]);
            (
                vec![
                    shown(
                        "curl -i -H 'x-user-id: alice' -H 'x-tenant-id: acme' http://127.0.0.1:3000/api/hello",
                        Out::Http(acme),
                    ),
                    shown("curl -i http://127.0.0.1:3000/api/hello", Out::Http(anonymous)),
                ],
                &[],
            )
        }
        "several-limits" => {
            let gateway =
                GatewayProcess::start(&["--limit", "burst=2/1s", "--limit", "sustained=100/1m"]);
            let answer = get(&gateway, "/api/hello", &[("x-user-id", "ann")]);
            (
                vec![
                    shown(
                        "gateway --limit burst=2/1s --limit sustained=100/1m &",
                        Out::Nothing,
                    ),
                    shown(
                        "curl -si -H 'x-user-id: ann' localhost:3000/api/hello | grep -i ^ratelimit",
                        Out::Lines(grep(&answer, &["ratelimit"])),
                    ),
                ],
                &[],
            )
        }
        "debug-headers" => {
            let mut redis = RedisServer::start();
            let url = redis.url();
            let gateway = GatewayProcess::start(&[
                "--limit",
                "1/1h",
                "--redis-url",
                &url,
                "--redis-timeout-ms",
                "1000",
                "--fallback",
                "fail-closed",
                "--debug-headers",
            ]);
            let lines = |user: &str, n: usize| -> Vec<String> {
                (0..n)
                    .flat_map(|_| {
                        let answer = get(&gateway, "/api/hello", &[("x-user-id", user)]);
                        grep(&answer, &["http", "x-ratelimit-source"])
                    })
                    .collect()
            };
            let al = lines("al", 3);
            redis.stop();
            let bo = lines("bo", 7);
            (
                vec![
                    shown(
                        "gateway --limit 1/1h --redis-url redis://127.0.0.1:46391 --redis-timeout-ms 1000 --fallback fail-closed --debug-headers &",
                        Out::Nothing,
                    ),
                    shown(
                        "for i in 1 2 3; do curl -si -H 'x-user-id: al' localhost:3000/api/hello | grep -i -e ^http -e ^x-ratelimit-source; done",
                        Out::Lines(al),
                    ),
                    shown("kill <redis-server>", Out::Nothing),
                    shown(
                        "for i in $(seq 7); do curl -si -H 'x-user-id: bo' localhost:3000/api/hello | grep -i -e ^http -e ^x-ratelimit-source; done",
                        Out::Lines(bo),
                    ),
                ],
                &[],
            )
        }
        "admin" => {
            let tenants = format!("{}/tenants.toml", env!("CARGO_MANIFEST_DIR"));
            let gateway =
                GatewayProcess::start(&["--tenants", &tenants, "--admin-token", "readme-token"]);
            let auth = ("authorization", "Bearer readme-token");
            let acme = get(&gateway, "/admin/tenants/acme", &[auth]);
            let newco = call(
                &gateway,
                "PUT",
                "/admin/tenants/newco",
                &[auth],
                r#"{"quotas":{"burst":"5/10s"}}"#,
            );
            (
                vec![
                    shown(
                        r#"curl -s -H "authorization: Bearer $TOKEN" localhost:3000/admin/tenants/acme"#,
                        Out::Lines(vec![acme.body]),
                    ),
                    shown(
                        r#"curl -s -X PUT -H "authorization: Bearer $TOKEN" -d '{"quotas":{"burst":"5/10s"}}' localhost:3000/admin/tenants/newco"#,
                        Out::Lines(vec![newco.body]),
                    ),
                ],
                &[],
            )
        }
        "connection-refused" => {
            let gateway = GatewayProcess::start(&["--max-connections-per-user", "3"]);
            let held: Vec<TcpStream> = (0..3)
                .map(|i| upgrade(&gateway, "ann").unwrap_or_else(|a| panic!("socket {i}: {a:?}")))
                .collect();
            let refused = upgrade(&gateway, "ann").expect_err("the 4th is refused");
            drop(held);
            (
                vec![Shown {
                    command: None,
                    out: Out::Http(refused),
                }],
                &[],
            )
        }
        "ws-rate-limited" => {
            let gateway = GatewayProcess::start(&["--message-limit", "1/1500ms"]);
            let mut socket = upgrade(&gateway, "ann").unwrap();
            socket.write_all(&text_frame("one")).unwrap();
            socket.write_all(&text_frame("two")).unwrap();
            assert_eq!(read_text(&mut socket), "one");
            let notice = read_text(&mut socket);
            (
                vec![Shown {
                    command: None,
                    out: Out::Lines(vec![notice]),
                }],
                &["retry_after_ms"],
            )
        }
        "api-quota" => {
            let gateway = GatewayProcess::start(&["--limit", "5/1m"]);
            let hello = get(
                &gateway,
                "/api/hello",
                &[("x-user-id", "al"), ("x-tenant-id", "acme")],
            );
            assert!(hello.status.starts_with("HTTP/1.1 200"), "{hello:?}");
            let quota = get(&gateway, "/api/quota?tenant=acme&user=al", &[]);
            (
                vec![shown(
                    "curl -si 'http://127.0.0.1:3000/api/quota?tenant=acme&user=al'",
                    Out::Http(quota),
                )],
                &["reset_after_ms"],
            )
        }
        "problem-429" => (
            vec![Shown {
                command: None,
                out: Out::Http(problem_429()),
            }],
            &[],
        ),
        other => panic!("no scenario for the output {other:?}"),
    }
}

/// The axum-window-ext README's 429: `axum_window_ext::layer` with a
/// `100/1m` quota, 43 s after its 100 requests (on a `ManualClock`).
fn problem_429() -> Answer {
    use axum::body::Body;
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    use tower_window::key::Header;
    use tower_window::{Limiter, ManualClock, MemoryStore, Quota};

    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
        let clock = ManualClock::new(1_700_000_000_000_000);
        let store = MemoryStore::builder().clock(clock.clone()).build();
        let limiter = Limiter::new(store, "100/1m".parse::<Quota>().unwrap());
        let app = axum::Router::new()
            .route("/", axum::routing::get(|| async { "ok" }))
            .route_layer(axum_window_ext::layer(
                limiter,
                Header::new("x-user-id").unwrap(),
            ));
        let request = || {
            axum::http::Request::get("/")
                .header("x-user-id", "ann")
                .body(Body::empty())
                .unwrap()
        };
        for _ in 0..100 {
            assert_eq!(app.clone().oneshot(request()).await.unwrap().status(), 200);
        }
        clock.advance(Duration::from_secs(43));
        let response = app.oneshot(request()).await.unwrap();
        let status = response.status();
        let headers = response
            .headers()
            .iter()
            .map(|(n, v)| (n.as_str().to_owned(), v.to_str().unwrap().to_owned()))
            .collect();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        Answer {
            status: format!(
                "HTTP/1.1 {} {}",
                status.as_u16(),
                status.canonical_reason().unwrap()
            ),
            headers,
            body: String::from_utf8(body.to_vec()).unwrap(),
        }
    })
}

// ---------------------------------------------------------------- comparison

/// Whether `shown` (from a README) matches `real`, numbers under
/// `volatile` keys being any number.
fn same_json(shown: &Value, real: &Value, volatile: &[&str]) -> bool {
    match (shown, real) {
        (Value::Object(a), Value::Object(b)) => {
            a.len() == b.len()
                && a.iter().all(|(key, value)| match b.get(key) {
                    Some(other) if volatile.contains(&key.as_str()) => {
                        value.is_number() && other.is_number()
                    }
                    Some(other) => same_json(value, other, volatile),
                    None => false,
                })
        }
        (Value::Array(a), Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same_json(x, y, volatile))
        }
        _ => shown == real,
    }
}

/// Compares a shown text (a body, a line) with the real one: as JSON when
/// the shown one is JSON.
fn compare_text(at: &str, what: &str, shown: &str, real: &str, volatile: &[&str]) {
    match serde_json::from_str::<Value>(shown) {
        Ok(shown_json) => {
            let real_json: Value = serde_json::from_str(real).unwrap_or_else(|e| {
                panic!("{at}: {what}: the real output is not JSON ({e}): {real}")
            });
            assert!(
                same_json(&shown_json, &real_json, volatile),
                "{at}: {what} differs\n  shown: {shown}\n  real:  {real}"
            );
        }
        Err(_) => assert_eq!(shown.trim(), real.trim(), "{at}: {what}"),
    }
}

fn compare(block: &Block, shown_out: &[String], real: &Out, volatile: &[&str], command: &str) {
    let at = &block.at;
    let lines: Vec<&str> = shown_out.iter().map(|l| uncommented(l)).collect();
    match real {
        Out::Nothing => assert!(
            lines.iter().all(|l| l.is_empty()),
            "{at}: `{command}` prints nothing, the block shows {lines:?}"
        ),
        Out::Lines(real) => {
            assert_eq!(
                lines.len(),
                real.len(),
                "{at}: `{command}`: {} lines shown, {} real:\n  shown: {lines:#?}\n  real:  {real:#?}",
                lines.len(),
                real.len()
            );
            for (i, (shown, real)) in lines.iter().zip(real).enumerate() {
                compare_text(
                    at,
                    &format!("`{command}` line {}", i + 1),
                    shown,
                    real,
                    volatile,
                );
            }
        }
        Out::Http(answer) => {
            let blank = lines
                .iter()
                .position(|l| l.is_empty())
                .unwrap_or(lines.len());
            let (head, body) = lines.split_at(blank);
            let body = body.get(1..).unwrap_or_default();
            assert_eq!(head[0], answer.status, "{at}: `{command}`: the status line");
            // Every header, in order, but `date` and `content-length`
            // (they vary, and the READMEs say so).
            let shown_headers: Vec<String> = head[1..]
                .iter()
                .map(|header| {
                    let (name, value) = header
                        .split_once(':')
                        .unwrap_or_else(|| panic!("{at}: not a header: {header}"));
                    format!("{}: {}", name.trim().to_ascii_lowercase(), value.trim())
                })
                .collect();
            let real_headers: Vec<String> = answer
                .headers
                .iter()
                .filter(|(name, _)| name != "date" && name != "content-length")
                .map(|(name, value)| format!("{name}: {value}"))
                .collect();
            assert_eq!(
                shown_headers, real_headers,
                "{at}: `{command}`: the headers (all of them but date and content-length)"
            );
            let shown_body = body.join("\n");
            compare_text(
                at,
                &format!("`{command}` body"),
                &shown_body,
                &answer.body,
                volatile,
            );
        }
    }
}

#[test]
fn every_shown_output_is_a_real_one() {
    let mut names = Vec::new();
    let mut unmarked = Vec::new();
    for file in READMES {
        let (blocks, loose) = blocks(file);
        unmarked.extend(loose);
        for block in blocks {
            let (real, volatile) = scenario(&block.name);
            let segments = segments(&block.lines);
            assert_eq!(
                segments.len(),
                real.len(),
                "{}: {} commands shown, the scenario runs {}",
                block.at,
                segments.len(),
                real.len()
            );
            for ((command, output), real) in segments.iter().zip(&real) {
                assert_eq!(
                    command.as_deref(),
                    real.command,
                    "{}: the command",
                    block.at
                );
                let command = command.as_deref().unwrap_or("(no command)");
                compare(&block, output, &real.out, volatile, command);
            }
            names.push(block.name);
        }
    }
    assert!(
        unmarked.is_empty(),
        "blocks that show an output without an `<!-- output: NAME -->` marker: {unmarked:?}"
    );
    names.sort();
    let mut expected = vec![
        "admin",
        "api-quota",
        "connection-refused",
        "debug-headers",
        "hello",
        "problem-429",
        "run-it",
        "several-limits",
        "ws-rate-limited",
    ];
    expected.sort_unstable();
    assert_eq!(names, expected, "every scenario's block, once");
}
