//! TLS and ACL to Redis (issue 37): a real `redis-server` serving only TLS
//! (`--tls-port`, client certificates required) with a throwaway CA made
//! by `openssl` in a temp dir, the default user off and one ACL user
//! allowed only the commands the client and the scripts of the limiter
//! need. The library, the gateway and the rls decide through it, and the
//! library and the gateway through a 3-primary cluster of such servers.
#![allow(clippy::unwrap_used)]

mod support;

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::GatewayProcess;
use tower_window::store::redis::{redis, RedisTls};
use tower_window::{DecisionSource, Limiter, Quota, RedisStore, WindowKey};
use tower_window_tests::redis_server::reserve_port;

/// What the ACL user may run: the connection (`HELLO`, `AUTH`, `PING`;
/// Redis 7.0 has no `CLIENT SETINFO`, whose refusal redis-rs ignores
/// anyway), the scripts (`EVALSHA`, `SCRIPT LOAD`) and the
/// commands the limiter's scripts call, on the `tw:` keys only.
const ACL: &str = "user app on >app-secret ~tw:* resetchannels -@all \
    +hello +auth +ping +evalsha +eval +script|load \
    +time +get +set +exists +del +pexpire +pttl \
    +zadd +zrange +zrangebyscore +zremrangebyscore \
    +hset +hmget +hgetall +hdel +hlen";

/// A TLS-only `redis-server` and its throwaway CA; killed on drop.
struct TlsRedis {
    node: TlsNode,
    dir: tempfile::TempDir,
}

/// One TLS-only `redis-server` process; killed on drop.
struct TlsNode {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl TlsNode {
    /// A node whose certificates are in `certs`, its files in a directory
    /// of its own there, its ACL user also allowed `acl_extra`, with
    /// `extra` configuration lines.
    fn start(certs: &Path, acl_extra: &str, extra: &str) -> Self {
        let port = reserve_port();
        let dir = certs.join(format!("node-{port}"));
        std::fs::create_dir(&dir).unwrap();
        let c = certs.display();
        let conf = format!(
            "port 0\ntls-port {port}\nbind 127.0.0.1\n\
             tls-cert-file {c}/server.crt\ntls-key-file {c}/server.key\n\
             tls-ca-cert-file {c}/ca.crt\ntls-auth-clients yes\n\
             save \"\"\nappendonly no\ndir {}\nlogfile redis.log\n\
             user default off\n{ACL} {acl_extra}\n{extra}\n",
            dir.display()
        );
        std::fs::write(dir.join("redis.conf"), conf).unwrap();
        let child = Command::new("redis-server")
            .arg(dir.join("redis.conf"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut node = Self { child, port, dir };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(status) = node.child.try_wait().unwrap() {
                panic!("redis-server exited with {status}:\n{}", node.log());
            }
            assert!(Instant::now() < deadline, "no TLS redis:\n{}", node.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        node
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default()
    }

    /// `rediss://app:app-secret@127.0.0.1:PORT`.
    fn url(&self) -> String {
        format!("rediss://app:app-secret@127.0.0.1:{}", self.port)
    }
}

impl Drop for TlsNode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl TlsRedis {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        make_certificates(dir.path());
        let node = TlsNode::start(dir.path(), "", "");
        Self { node, dir }
    }

    fn log(&self) -> String {
        self.node.log()
    }

    fn url(&self) -> String {
        self.node.url()
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn file_str(&self, name: &str) -> String {
        self.file(name).display().to_string()
    }

    /// The CA file and the client certificate.
    fn tls(&self) -> RedisTls {
        tls_of(self.dir.path())
    }
}

/// The CA file and the client certificate in `certs`.
fn tls_of(certs: &Path) -> RedisTls {
    RedisTls::new()
        .ca_file(certs.join("ca.crt"))
        .unwrap()
        .client_cert_files(certs.join("client.crt"), certs.join("client.key"))
        .unwrap()
}

/// Three TLS-only primaries in a Redis Cluster whose bus is TLS too
/// (`tls-cluster yes`), made by an admin user with `redis-cli --cluster
/// create`; the ACL user also gets what a cluster client needs.
struct TlsCluster {
    nodes: Vec<TlsNode>,
    dir: tempfile::TempDir,
}

impl TlsCluster {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        make_certificates(dir.path());
        let nodes: Vec<TlsNode> = (0..3)
            .map(|_| {
                let bus = reserve_port();
                TlsNode::start(
                    dir.path(),
                    CLUSTER_ACL,
                    &format!(
                        "cluster-enabled yes\ntls-cluster yes\ncluster-port {bus}\n\
                         cluster-config-file nodes.conf\ncluster-node-timeout 2000\n\
                         user admin on >admin-secret ~* &* +@all"
                    ),
                )
            })
            .collect();
        let cluster = Self { nodes, dir };
        let mut create = cluster.admin_cli();
        create.arg("--cluster").arg("create");
        for node in &cluster.nodes {
            create.arg(format!("127.0.0.1:{}", node.port));
        }
        create.args(["--cluster-replicas", "0", "--cluster-yes"]);
        let out = support::run_bounded(&mut create, Duration::from_secs(60));
        assert!(out.status.success(), "cluster create: {out:?}");
        let deadline = Instant::now() + Duration::from_secs(30);
        for node in &cluster.nodes {
            loop {
                let mut info = cluster.admin_cli();
                info.args(["-p", &node.port.to_string(), "cluster", "info"]);
                let out = support::run_bounded(&mut info, Duration::from_secs(10));
                if String::from_utf8_lossy(&out.stdout).contains("cluster_state:ok") {
                    break;
                }
                assert!(Instant::now() < deadline, "cluster not ok: {out:?}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        cluster
    }

    /// `redis-cli` over TLS as the admin user.
    fn admin_cli(&self) -> Command {
        let d = self.dir.path();
        let mut cli = Command::new("redis-cli");
        cli.arg("--tls")
            .arg("--cacert")
            .arg(d.join("ca.crt"))
            .arg("--cert")
            .arg(d.join("client.crt"))
            .arg("--key")
            .arg(d.join("client.key"))
            .args([
                "--user",
                "admin",
                "--pass",
                "admin-secret",
                "--no-auth-warning",
            ]);
        cli
    }

    fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(TlsNode::url).collect()
    }
}

/// What a cluster client needs beyond [`ACL`]: the slot map and the
/// `ASK` redirect.
const CLUSTER_ACL: &str = "+cluster|slots +cluster|shards +asking +readonly";

/// A CA, a server certificate for 127.0.0.1 and a client certificate (all
/// X.509 v3, as rustls requires), by `openssl`. The server certificate is
/// a client one too: cluster nodes present it to each other on the TLS bus.
fn make_certificates(dir: &Path) {
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n",
    )
    .unwrap();
    std::fs::write(dir.join("client.ext"), "extendedKeyUsage=clientAuth\n").unwrap();
    let steps: [&[&str]; 5] = [
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=tower-window test CA",
        ],
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=127.0.0.1",
        ],
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "2",
            "-extfile",
            "server.ext",
        ],
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "client.key",
            "-out",
            "client.csr",
            "-subj",
            "/CN=tower-window test client",
        ],
        &[
            "x509",
            "-req",
            "-in",
            "client.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "client.crt",
            "-days",
            "2",
            "-extfile",
            "client.ext",
        ],
    ];
    for args in steps {
        let out = support::run_bounded(
            Command::new("openssl").args(args).current_dir(dir),
            Duration::from_secs(30),
        );
        assert!(out.status.success(), "openssl {args:?}: {out:?}");
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn the_library_decides_over_tls_as_an_acl_user_with_a_client_certificate() {
    let redis = TlsRedis::start();
    runtime().block_on(async {
        let store = RedisStore::builder()
            .url(redis.url())
            .tls(redis.tls())
            .build()
            .unwrap();
        // Connect (TLS handshake, AUTH, SCRIPT LOAD) before the checks'
        // 50 ms budgets start.
        store.connect().await.unwrap();
        let limiter = Limiter::new(store, "2/1m".parse::<Quota>().unwrap());
        let key = WindowKey::new("acme", "alice");
        let mut allowed = Vec::new();
        for _ in 0..3 {
            let decision = limiter.check(&key, 1).await.unwrap();
            assert_eq!(decision.source(), DecisionSource::Store, "{}", redis.log());
            allowed.push(decision.allowed());
        }
        assert_eq!(allowed, [true, true, false]);

        // The system's roots do not know the throwaway CA: refused.
        let untrusted = RedisStore::builder()
            .url(redis.url())
            .tls(
                RedisTls::new()
                    .client_cert_files(redis.file("client.crt"), redis.file("client.key"))
                    .unwrap(),
            )
            .build()
            .unwrap();
        let error = untrusted.connect().await.unwrap_err();
        assert!(error.to_string().contains("certificate"), "{error}");
    });
}

#[test]
fn the_acl_user_may_run_nothing_else() {
    let redis = TlsRedis::start();
    let certificates = redis::TlsCertificates {
        client_tls: Some(redis::ClientTlsConfig {
            client_cert: std::fs::read(redis.file("client.crt")).unwrap(),
            client_key: std::fs::read(redis.file("client.key")).unwrap(),
        }),
        root_cert: Some(std::fs::read(redis.file("ca.crt")).unwrap()),
    };
    let client = redis::Client::build_with_tls(redis.url(), certificates).unwrap();
    let mut conn = client
        .get_connection_with_timeout(Duration::from_secs(5))
        .unwrap();
    let pong: String = redis::cmd("PING").query(&mut conn).unwrap();
    assert_eq!(pong, "PONG");
    for command in [&["FLUSHALL"][..], &["KEYS", "*"], &["CONFIG", "GET", "*"]] {
        let mut cmd = redis::cmd(command[0]);
        cmd.arg(&command[1..]);
        let error = cmd.query::<redis::Value>(&mut conn).unwrap_err();
        assert!(is_no_permission(&error), "{command:?}: {error}");
    }
    // Keys outside `tw:` are refused too.
    let error = redis::cmd("GET")
        .arg("other:key")
        .query::<redis::Value>(&mut conn)
        .unwrap_err();
    assert!(is_no_permission(&error), "{error}");
}

fn is_no_permission(error: &redis::RedisError) -> bool {
    error.to_string().to_ascii_lowercase().contains("noperm")
}

#[test]
fn the_gateway_decides_over_tls_and_is_ready() {
    let redis = TlsRedis::start();
    let (ca, cert, key) = (
        redis.file_str("ca.crt"),
        redis.file_str("client.crt"),
        redis.file_str("client.key"),
    );
    let url = redis.url();
    let gateway = GatewayProcess::start(&[
        "--redis-url",
        &url,
        "--redis-ca-file",
        &ca,
        "--redis-client-cert",
        &cert,
        "--redis-client-key",
        &key,
        "--limit",
        "2/1m",
        "--debug-headers",
    ]);
    let log = gateway.log();
    assert!(
        log.lines()
            .any(|l| l.contains("store reachable") && l.contains("rediss://app:***@127.0.0.1")),
        "{log}"
    );
    assert!(!log.contains("app-secret"), "{log}");
    let ready = support::http_get(gateway.port(), "/readyz").unwrap();
    assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
    let answers: Vec<(u16, String)> = (0..3)
        .map(|_| {
            let answer = support::get_as(gateway.port(), "/api/hello", "acme", "tls");
            (
                answer.status,
                answer.header("x-ratelimit-source").to_owned(),
            )
        })
        .collect();
    let store = |status: u16| (status, "store".to_owned());
    assert_eq!(
        answers,
        [store(200), store(200), store(429)],
        "{}",
        redis.log()
    );
}

#[test]
fn without_its_client_certificate_the_gateway_is_not_ready() {
    let redis = TlsRedis::start();
    let ca = redis.file_str("ca.crt");
    let url = redis.url();
    let gateway = GatewayProcess::start(&["--redis-url", &url, "--redis-ca-file", &ca]);
    let ready = support::http_get(gateway.port(), "/readyz").unwrap();
    assert!(ready.starts_with("HTTP/1.1 503"), "{ready}");
    assert!(
        gateway.log().contains("store unreachable"),
        "{}",
        gateway.log()
    );
}

#[test]
fn the_rls_reaches_the_store_over_tls() {
    let redis = TlsRedis::start();
    let rules = tempfile::tempdir().unwrap();
    let config = rules.path().join("api.yaml");
    std::fs::write(
        &config,
        "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n",
    )
    .unwrap();
    let (port, http_port) = (reserve_port(), reserve_port());
    let log = rules.path().join("rls.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_rls"))
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--metrics-listen")
        .arg(format!("127.0.0.1:{http_port}"))
        .arg("--config")
        .arg(&config)
        .args(["--redis-url", &redis.url(), "--require-store"])
        .arg("--redis-ca-file")
        .arg(redis.file("ca.crt"))
        .arg("--redis-client-cert")
        .arg(redis.file("client.crt"))
        .arg("--redis-client-key")
        .arg(redis.file("client.key"))
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(20);
    let ready = loop {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("rls exited with {status}:\n{}", read_log());
        }
        if let Some(response) = support::http_get(http_port, "/readyz") {
            break response;
        }
        assert!(
            Instant::now() < deadline,
            "rls did not serve:\n{}",
            read_log()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(ready.starts_with("HTTP/1.1 200"), "{ready}\n{}", read_log());
    assert!(read_log().contains("store reachable"), "{}", read_log());
}

#[test]
fn the_library_and_the_gateway_decide_on_a_tls_cluster() {
    let cluster = TlsCluster::start();
    runtime().block_on(async {
        let store = RedisStore::builder()
            .cluster(cluster.urls())
            .tls(tls_of(cluster.dir.path()))
            .build()
            .unwrap();
        store.connect().await.unwrap();
        let limiter = Limiter::new(store, "2/1m".parse::<Quota>().unwrap());
        // Keys spread over the three primaries' slots.
        for user in ["alice", "bob", "carol", "dave", "erin", "frank"] {
            let key = WindowKey::new("acme", user);
            let mut allowed = Vec::new();
            for _ in 0..3 {
                let decision = limiter.check(&key, 1).await.unwrap();
                assert_eq!(decision.source(), DecisionSource::Store, "{user}");
                allowed.push(decision.allowed());
            }
            assert_eq!(allowed, [true, true, false], "{user}");
        }
    });

    let d = cluster.dir.path();
    let (ca, cert, key) = (
        d.join("ca.crt").display().to_string(),
        d.join("client.crt").display().to_string(),
        d.join("client.key").display().to_string(),
    );
    let seeds = cluster.urls().join(",");
    let gateway = GatewayProcess::start(&[
        "--redis-cluster",
        &seeds,
        "--redis-ca-file",
        &ca,
        "--redis-client-cert",
        &cert,
        "--redis-client-key",
        &key,
        "--limit",
        "2/1m",
        "--debug-headers",
    ]);
    assert!(
        gateway.log().contains("store reachable"),
        "{}",
        gateway.log()
    );
    let ready = support::http_get(gateway.port(), "/readyz").unwrap();
    assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
    let answers: Vec<(u16, String)> = (0..3)
        .map(|_| {
            let answer = support::get_as(gateway.port(), "/api/hello", "acme", "tls");
            (
                answer.status,
                answer.header("x-ratelimit-source").to_owned(),
            )
        })
        .collect();
    let store = |status: u16| (status, "store".to_owned());
    assert_eq!(answers, [store(200), store(200), store(429)]);
}
