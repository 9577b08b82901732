//! The inbound worker as real processes on a real `redis-server`: a worker
//! killed (SIGKILL) mid-batch leaves pending messages that another worker
//! reclaims and applies; a restarted worker finishes its own pending
//! messages first; with dedup every distinct message counts exactly once;
//! a poison message ends in the dead-letter stream after the configured
//! deliveries without blocking the others, and is counted in a metric.
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tower_window::store::redis::redis::{self, Commands, Value};
use tower_window_tests::redis_server::{reserve_port, RedisServer};

const STREAM: &str = "tw:inbound";
const ROOMS: [&str; 3] = ["r0", "r1", "r2"];
/// Every wait is bounded.
const WAIT: Duration = Duration::from_secs(60);

fn worker(url: &str, consumer: &str, extra: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_inbound-worker"))
        .args(["--redis-url", url, "--consumer", consumer])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .env("RUST_LOG", "info")
        .spawn()
        .unwrap()
}

fn enqueue(conn: &mut redis::Connection, id: &str, room: &str) {
    let _: String = redis::cmd("XADD")
        .arg(STREAM)
        .arg("*")
        .arg("id")
        .arg(id)
        .arg("room")
        .arg(room)
        .arg("data")
        .arg("hello")
        .query(conn)
        .unwrap();
}

fn counted(conn: &mut redis::Connection) -> u64 {
    ROOMS
        .iter()
        .map(|room| {
            conn.get::<_, Option<u64>>(format!("tw:room-count:{{{room}}}:count"))
                .unwrap()
                .unwrap_or(0)
        })
        .sum()
}

/// Pending entries of `consumer` in the group.
fn pending_of(conn: &mut redis::Connection, consumer: &str) -> u64 {
    let reply: Value = redis::cmd("XPENDING")
        .arg(STREAM)
        .arg("workers")
        .arg("-")
        .arg("+")
        .arg(10_000)
        .arg(consumer)
        .query(conn)
        .unwrap();
    match reply {
        Value::Array(rows) => rows.len() as u64,
        _ => 0,
    }
}

fn pending_total(conn: &mut redis::Connection) -> u64 {
    let reply: Value = redis::cmd("XPENDING")
        .arg(STREAM)
        .arg("workers")
        .query(conn)
        .unwrap();
    match reply {
        Value::Array(summary) => match summary.first() {
            Some(Value::Int(n)) => *n as u64,
            _ => 0,
        },
        _ => 0,
    }
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < WAIT, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_exit(child: &mut Child) -> String {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut stderr = String::new();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut stderr)
                .unwrap();
            assert!(status.success(), "worker failed: {stderr}");
            return stderr;
        }
        assert!(start.elapsed() < WAIT, "the worker did not finish");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn kill(child: &mut Child) {
    child.kill().unwrap(); // SIGKILL: no cleanup, no acks
    child.wait().unwrap();
}

fn scrape(port: u16) -> String {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut body = String::new();
    stream.read_to_string(&mut body).unwrap();
    body
}

#[test]
fn a_killed_workers_messages_are_reclaimed_and_applied_once() {
    let redis = RedisServer::start();
    let url = redis.url();
    let mut conn = redis.connection();
    for i in 0..100 {
        enqueue(&mut conn, &format!("m{i}"), ROOMS[i % 3]);
        if i == 50 {
            enqueue(&mut conn, "poison", "not a room!"); // fails every delivery
        }
    }
    for i in 0..20 {
        enqueue(&mut conn, &format!("m{i}"), ROOMS[i % 3]); // client retries
    }

    // w1 never reclaims (long idle timeout) and is slow: killed mid-batch.
    let mut w1 = worker(
        &url,
        "w1",
        &["--idle-timeout-ms", "60000", "--effect-delay-ms", "20"],
    );
    wait_for("w1 to apply some", || counted(&mut conn) >= 20);
    kill(&mut w1);
    let orphaned = pending_of(&mut conn, "w1");
    assert!(orphaned > 0, "w1 died with messages pending");
    let before = counted(&mut conn);
    assert!(before < 100, "w1 did not finish ({before})");

    // w2 reclaims what w1 left after 300 ms idle and does the rest.
    let metrics_port = reserve_port();
    let metrics = format!("127.0.0.1:{metrics_port}");
    let mut w2 = worker(
        &url,
        "w2",
        &[
            "--idle-timeout-ms",
            "300",
            "--max-deliveries",
            "3",
            "--metrics-listen",
            &metrics,
        ],
    );
    wait_for("every message to be acknowledged", || {
        pending_total(&mut conn) == 0
            && redis::cmd("XLEN")
                .arg("tw:inbound:dead")
                .query::<u64>(&mut conn)
                .unwrap()
                == 1
    });
    assert_eq!(
        pending_of(&mut conn, "w1"),
        0,
        "w1's messages were reclaimed"
    );
    // Dedup: 100 distinct messages, 120 valid entries, each counted once.
    assert_eq!(counted(&mut conn), 100);

    let dead: Value = redis::cmd("XRANGE")
        .arg("tw:inbound:dead")
        .arg("-")
        .arg("+")
        .query(&mut conn)
        .unwrap();
    let text = format!("{dead:?}");
    for needle in ["invalid room", "poison", "deliveries"] {
        assert!(text.contains(needle), "{needle} in {text}");
    }
    let Value::Array(rows) = &dead else { panic!() };
    let Value::Array(row) = &rows[0] else {
        panic!()
    };
    let Value::Array(fields) = &row[1] else {
        panic!()
    };
    let field = |name: &str| {
        let at = fields
            .iter()
            .position(|f| matches!(f, Value::BulkString(b) if b == name.as_bytes()))
            .unwrap();
        match &fields[at + 1] {
            Value::BulkString(b) => String::from_utf8(b.clone()).unwrap(),
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(field("deliveries"), "3");
    assert_eq!(field("reason"), "invalid room");
    assert_eq!(field("field:id"), "poison");

    let scraped = scrape(metrics_port);
    assert!(
        scraped
            .lines()
            .any(|l| l.starts_with("tower_window_inbound_dead_letters_total") && l.ends_with(" 1")),
        "{scraped}"
    );
    kill(&mut w2);
}

#[test]
fn a_restarted_worker_finishes_its_own_pending_messages_first() {
    let redis = RedisServer::start();
    let url = redis.url();
    let mut conn = redis.connection();
    for i in 0..60 {
        enqueue(&mut conn, &format!("m{i}"), ROOMS[i % 3]);
    }
    let slow = ["--idle-timeout-ms", "60000", "--effect-delay-ms", "20"];
    let mut first = worker(&url, "w1", &slow);
    wait_for("w1 to apply some", || counted(&mut conn) >= 5);
    kill(&mut first);
    let orphaned = pending_of(&mut conn, "w1");
    assert!(orphaned > 0, "w1 died with messages pending");

    // Same name, and no reclaiming (60 s idle timeout): only reading its
    // own history can finish those.
    let mut again = worker(
        &url,
        "w1",
        &["--idle-timeout-ms", "60000", "--exit-when-idle"],
    );
    let log = wait_exit(&mut again);
    assert!(log.contains("finishing own pending messages"), "{log}");
    assert_eq!(pending_total(&mut conn), 0);
    assert_eq!(counted(&mut conn), 60);
}
