//! The tenants file's hot reload counts: one reload per new version, none
//! caused by the watcher's own read, one warning per broken version.
//!
//! Each test watches over a few seconds of wall time; what it asserts is a
//! count (of reads, reloads, refusals, log lines), never a duration.
#![allow(clippy::unwrap_used)]

mod support;

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use support::{http_get, GatewayProcess};
use tower_window::tenant::{Resolution, TenantRegistry};
use tower_window_examples::gateway::tenants::{self, TenantsFile, TenantsWatch};

const VALID: &str = "[tenants.acme]\nquotas = { burst = \"3/1m\" }\n";
const RAISED: &str = "[tenants.acme]\nquotas = { burst = \"5/1m\" }\n";
const BROKEN: &str = "[tenants.acme]\nquotas = { burst = \"0/1m\" }\n";
const FIXED: &str = "[tenants.acme]\nquotas = { burst = \"7/1m\" }\n";

/// Writes `text` to a temp file and renames it over `path`, as editors
/// that save atomically and deploys do.
fn save_by_rename(path: &Path, text: &str) {
    let tmp = path.with_extension("swp");
    let mut file = std::fs::File::create(&tmp).unwrap();
    file.write_all(text.as_bytes()).unwrap();
    file.sync_all().unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Reads the file and touches it (new mtime, same text): neither is a
/// new version.
fn read_and_touch(path: &Path) {
    let _ = std::fs::read_to_string(path).unwrap();
    let file = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    file.set_modified(std::time::SystemTime::now()).unwrap();
}

/// Polls `value` every 20 ms until it is at least `want`, for at most 10 s;
/// its last value.
fn wait_for(want: u64, value: impl Fn() -> u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = value();
        if now >= want || Instant::now() >= deadline {
            return now;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Lets the watcher run for `period` (several debounce periods), then
/// returns what it counted.
async fn after(period: Duration, watch: &TenantsWatch) -> (u64, u64, u64) {
    tokio::time::sleep(period).await;
    (watch.reads(), watch.reloaded(), watch.refused())
}

fn burst(registry: &TenantRegistry) -> u32 {
    match registry.resolve(b"acme") {
        Resolution::Limited(policy) => policy.first().limit(),
        other => panic!("acme: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watch_reads_once_per_new_version_and_never_for_its_own_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tenants.toml");
    save_by_rename(&path, VALID);
    let file = TenantsFile::load(&path).unwrap();
    let registry = TenantRegistry::new(file.config.clone());
    let watch = tenants::watch(registry.clone(), &file).unwrap();
    let quiet = Duration::from_secs(2);

    // Unchanged: nothing read, nothing reloaded.
    assert_eq!(after(quiet, &watch).await, (0, 0, 0), "an unchanged file");

    // One save by rename: one read, one reload, and no read after it.
    save_by_rename(&path, RAISED);
    let reloaded = tokio::task::spawn_blocking({
        let watch = watch.clone();
        move || wait_for(1, || watch.reloaded())
    });
    assert_eq!(reloaded.await.unwrap(), 1);
    assert_eq!(burst(&registry), 5);
    assert_eq!(after(quiet, &watch).await, (1, 1, 0), "after one save");

    // Reading or touching it is no new version.
    read_and_touch(&path);
    let (reads, reloaded, refused) = after(quiet, &watch).await;
    assert_eq!((reloaded, refused), (1, 0), "a read and a touch");
    assert!(
        reads <= 2,
        "a touch may be read once, our read never: {reads}"
    );

    // A write in place (truncate, write, close): one reload.
    std::fs::write(&path, FIXED).unwrap();
    let reloaded = tokio::task::spawn_blocking({
        let watch = watch.clone();
        move || wait_for(2, || watch.reloaded())
    });
    assert_eq!(reloaded.await.unwrap(), 2);
    assert_eq!(burst(&registry), 7);
    let (reads_now, reloaded, refused) = after(quiet, &watch).await;
    assert_eq!((reloaded, refused), (2, 0), "after a write in place");
    assert!(reads_now <= reads + 2, "{reads} then {reads_now}");
}

/// Counts the lines of `log` that contain `needle`.
fn lines_with(log: &str, needle: &str) -> usize {
    log.lines().filter(|l| l.contains(needle)).count()
}

/// `tower_window_config_reload_total{result}` of a gateway process.
fn reloads(gateway: &GatewayProcess, result: &str) -> u64 {
    let port = gateway.url().rsplit(':').next().unwrap().parse().unwrap();
    let scrape = http_get(port, "/metrics").unwrap();
    scrape
        .lines()
        .filter(|l| {
            l.starts_with("tower_window_config_reload_total{")
                && l.contains(&format!("result=\"{result}\""))
        })
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap() as u64)
        .sum()
}

#[test]
fn the_gateway_counts_one_reload_per_version_and_warns_once_per_broken_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tenants.toml");
    save_by_rename(&path, VALID);
    let gateway = GatewayProcess::start(&["--tenants", path.to_str().unwrap()]);
    let quiet = Duration::from_secs(2);
    let refused = "invalid tenants file refused";
    let counts = || (reloads(&gateway, "ok"), reloads(&gateway, "error"));

    std::thread::sleep(quiet);
    assert_eq!(counts(), (0, 0), "an unchanged file:\n{}", gateway.log());

    save_by_rename(&path, RAISED);
    assert_eq!(wait_for(1, || reloads(&gateway, "ok")), 1);
    std::thread::sleep(quiet);
    assert_eq!(counts(), (1, 0), "one save:\n{}", gateway.log());

    // A broken version: refused once, warned about once, however often the
    // file is read or touched afterwards.
    save_by_rename(&path, BROKEN);
    assert_eq!(wait_for(1, || reloads(&gateway, "error")), 1);
    for _ in 0..3 {
        read_and_touch(&path);
        std::thread::sleep(Duration::from_millis(300));
    }
    std::thread::sleep(quiet);
    assert_eq!(counts(), (1, 1), "a broken save:\n{}", gateway.log());
    assert_eq!(lines_with(&gateway.log(), refused), 1, "{}", gateway.log());

    // Fixed: one more reload, and the fixed limit is served.
    save_by_rename(&path, FIXED);
    assert_eq!(wait_for(2, || reloads(&gateway, "ok")), 2);
    std::thread::sleep(quiet);
    assert_eq!(counts(), (2, 1), "the fix:\n{}", gateway.log());
    assert_eq!(lines_with(&gateway.log(), refused), 1);
    assert_eq!(lines_with(&gateway.log(), "tenants file reloaded"), 2);
    let port = gateway.url().rsplit(':').next().unwrap().parse().unwrap();
    let answer = hello(port, "acme");
    assert!(answer.contains("\"burst\";q=7;w=60"), "{answer}");
}

/// `GET /api/hello` as user `probe` of `tenant`: the raw response.
fn hello(port: u16, tenant: &str) -> String {
    use std::io::Read;
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    write!(
        stream,
        "GET /api/hello HTTP/1.1\r\nhost: 127.0.0.1\r\nx-user-id: probe\r\nx-tenant-id: {tenant}\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}
