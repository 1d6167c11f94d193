//! Transfer engines whose metadata lives in a real etcd (Debian's `etcd-server`, started
//! here on free loopback ports, one per test, and killed at the end). Every byte is checked;
//! keys are read back through the crate's own etcd client.
//!
//! `/usr/bin/etcd` missing is a failure, not a skip: `scripts/setup.sh` installs it (CI
//! runs it).

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{rng, Buf};
use dataplane::engine::{EngineOptions, TransferEngine};
use dataplane::metadata::etcd::{parse_endpoints, EtcdStore};
use dataplane::metadata::{http, MetadataStore};
use dataplane::transport::header::Opcode;
use dataplane::TeError;
use rand::{Rng, RngCore};

const ETCD_BIN: &str = "/usr/bin/etcd";
const ETCD_START_TIMEOUT: Duration = Duration::from_secs(30);

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A throwaway single-member etcd on 127.0.0.1.
struct Etcd {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl Etcd {
    fn start() -> Etcd {
        assert!(
            Path::new(ETCD_BIN).exists(),
            "{ETCD_BIN} is missing: run scripts/setup.sh as root (it installs Debian's \
             etcd-server); these tests need a real etcd"
        );
        static N: AtomicUsize = AtomicUsize::new(0);
        // A free port may be taken again before etcd binds it: retry a few times.
        let mut last_log = String::new();
        for _ in 0..3 {
            let dir = std::env::temp_dir().join(format!(
                "mooncake-etcd-test-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let (port, peer) = (free_port(), free_port());
            let log = std::fs::File::create(dir.join("etcd.log")).unwrap();
            let client_url = format!("http://127.0.0.1:{port}");
            let peer_url = format!("http://127.0.0.1:{peer}");
            let child = Command::new(ETCD_BIN)
                .arg("--data-dir")
                .arg(dir.join("data"))
                .args(["--name", "default"])
                .args(["--listen-client-urls", &client_url])
                .args(["--advertise-client-urls", &client_url])
                .args(["--listen-peer-urls", &peer_url])
                .args(["--initial-advertise-peer-urls", &peer_url])
                .args(["--initial-cluster", &format!("default={peer_url}")])
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap_or_else(|e| panic!("cannot run {ETCD_BIN}: {e}"));
            let mut etcd = Etcd { child, dir, port };
            if etcd.wait_healthy() {
                return etcd;
            }
            last_log = std::fs::read_to_string(etcd.dir.join("etcd.log")).unwrap_or_default();
        }
        panic!("etcd did not become healthy; its log:\n{last_log}");
    }

    /// Polls `/health` until it says true; false if etcd exits or takes too long.
    fn wait_healthy(&mut self) -> bool {
        let deadline = Instant::now() + ETCD_START_TIMEOUT;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            if let Ok(r) = http::exchange("127.0.0.1", self.port, "GET", "/health", b"") {
                if r.status == 200 && String::from_utf8_lossy(&r.body).contains("true") {
                    return true;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// `127.0.0.1:<client port>`: the bare form of the connection string.
    fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn client(&self) -> EtcdStore {
        EtcdStore::new(parse_endpoints(&self.addr()).unwrap())
    }

    /// Every key under `prefix`.
    fn keys(&self, prefix: &str) -> Vec<String> {
        let mut k: Vec<String> = self
            .client()
            .list_prefix(prefix, 1000)
            .unwrap()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        k.sort();
        k
    }

    fn json(&self, key: &str) -> Option<serde_json::Value> {
        self.client()
            .get(key)
            .unwrap()
            .map(|v| serde_json::from_slice(&v).unwrap())
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn options(cluster: Option<&str>) -> EngineOptions {
    EngineOptions {
        transfer_timeout: Duration::from_secs(10),
        cluster_id: cluster.map(str::to_string),
        ..EngineOptions::default()
    }
}

fn engine(conn: &str, name: &str, cluster: Option<&str>) -> TransferEngine {
    let e = TransferEngine::with_options(options(cluster));
    e.initialize(name, conn, "tcp", "")
        .unwrap_or_else(|err| panic!("initialize {name} with {conn}: {err}"));
    e
}

#[test]
fn engine_etcd_round_trips_keys_and_shutdown() {
    let etcd = Etcd::start();
    let (na, nb) = ("127.0.0.1:12345", "127.0.0.1:12346");
    // Both spellings of an etcd connection string.
    let a = engine(&format!("etcd://{}", etcd.addr()), na, None);
    let b = engine(&etcd.addr(), nb, None);
    const LEN: usize = 16 << 20;
    let local = Buf::new(LEN, 0);
    let remote = Buf::new(LEN, 0);
    local.register(&a);
    remote.register(&b);

    // Upstream's keys, upstream's shapes, readable by any etcd client.
    assert_eq!(
        etcd.keys("mooncake/"),
        [
            format!("mooncake/ram/{na}"),
            format!("mooncake/ram/{nb}"),
            format!("mooncake/rpc_meta/{na}"),
            format!("mooncake/rpc_meta/{nb}"),
        ]
    );
    let d = etcd.json(&format!("mooncake/ram/{nb}")).unwrap();
    assert_eq!(d["name"], nb);
    assert_eq!(d["protocol"], "tcp");
    assert_eq!(d["tcp_data_port"], b.data_port());
    assert_eq!(d["buffers"][0]["addr"], remote.addr());
    assert_eq!(d["buffers"][0]["length"], LEN as u64);
    let r = etcd.json(&format!("mooncake/rpc_meta/{nb}")).unwrap();
    assert_eq!(r["ip_or_host_name"], "127.0.0.1");
    assert_eq!(r["rpc_port"], b.rpc_port());
    assert_eq!(a.get_first_buffer_address(nb).unwrap(), remote.addr());
    assert_eq!(b.get_first_buffer_address(na).unwrap(), local.addr());

    let mut rng = rng();
    let mut sizes = vec![1usize, 4096, 65537, (4 << 20) + 3];
    sizes.extend((0..20).map(|_| rng.gen_range(1..=256 * 1024)));
    for len in sizes {
        let lo = rng.gen_range(0..=LEN / 2 - len);
        let ro = rng.gen_range(0..=LEN - len);
        let mut data = vec![0u8; len];
        rng.fill_bytes(&mut data);
        local.fill(lo, &data);
        a.transfer_sync(
            nb,
            local.addr() + lo as u64,
            remote.addr() + ro as u64,
            len as u64,
            Opcode::Write,
        )
        .unwrap();
        assert!(remote.bytes()[ro..ro + len] == data[..], "write of {len}");
        let back = LEN / 2 + rng.gen_range(0..=LEN / 2 - len);
        a.transfer_sync(
            nb,
            local.addr() + back as u64,
            remote.addr() + ro as u64,
            len as u64,
            Opcode::Read,
        )
        .unwrap();
        assert!(local.bytes()[back..back + len] == data[..], "read of {len}");
    }
    // The other direction, found by name the same way.
    let data = b"from b, through etcd";
    remote.fill(0, data);
    b.transfer_sync(
        na,
        remote.addr(),
        local.addr() + 7,
        data.len() as u64,
        Opcode::Write,
    )
    .unwrap();
    assert_eq!(&local.bytes()[7..7 + data.len()], data);
    a.send_notify(nb, "kv", "done").unwrap();
    assert_eq!(b.get_notifies(), [("kv".to_string(), "done".to_string())]);

    // Unregistering re-publishes; shutdown removes both keys of the engine.
    b.unregister_memory(remote.addr()).unwrap();
    let d = etcd.json(&format!("mooncake/ram/{nb}")).unwrap();
    assert_eq!(d["buffers"].as_array().unwrap().len(), 0);
    drop(b);
    assert_eq!(
        etcd.keys("mooncake/"),
        [
            format!("mooncake/ram/{na}"),
            format!("mooncake/rpc_meta/{na}")
        ]
    );
    assert_eq!(a.send_probe(nb).unwrap_err().code(), TeError::Metadata);
    drop(a);
    assert!(etcd.keys("mooncake/").is_empty());
}

#[test]
fn engine_etcd_cluster_ids_do_not_see_each_other() {
    let etcd = Etcd::start();
    let conn = format!("etcd://{}", etcd.addr());
    // The same segment name in two clusters sharing one etcd.
    let shared = "127.0.0.1:13001";
    let a1 = engine(&conn, "127.0.0.1:13000", Some("c1"));
    let b1 = engine(&conn, shared, Some("c1"));
    let a2 = engine(&conn, "127.0.0.1:13002", Some("c2"));
    let b2 = engine(&conn, shared, Some("c2"));
    let only1 = engine(&conn, "127.0.0.1:13003", Some("c1"));
    let (l1, r1, l2, r2) = (
        Buf::new(4096, 1),
        Buf::new(4096, 0),
        Buf::new(4096, 2),
        Buf::new(4096, 0),
    );
    l1.register(&a1);
    r1.register(&b1);
    l2.register(&a2);
    r2.register(&b2);

    assert_eq!(
        etcd.keys("mooncake/c1/"),
        [
            "mooncake/c1/ram/127.0.0.1:13000",
            "mooncake/c1/ram/127.0.0.1:13001",
            "mooncake/c1/ram/127.0.0.1:13003",
            "mooncake/c1/rpc_meta/127.0.0.1:13000",
            "mooncake/c1/rpc_meta/127.0.0.1:13001",
            "mooncake/c1/rpc_meta/127.0.0.1:13003",
        ]
    );
    assert_eq!(etcd.keys("mooncake/c2/").len(), 4);
    assert!(etcd.keys("mooncake/ram/").is_empty());

    // Each cluster resolves the shared name to its own engine.
    assert_eq!(a1.get_first_buffer_address(shared).unwrap(), r1.addr());
    assert_eq!(a2.get_first_buffer_address(shared).unwrap(), r2.addr());
    a1.transfer_sync(shared, l1.addr(), r1.addr(), 4096, Opcode::Write)
        .unwrap();
    a2.transfer_sync(shared, l2.addr(), r2.addr(), 4096, Opcode::Write)
        .unwrap();
    assert!(r1.bytes().iter().all(|&x| x == 1));
    assert!(r2.bytes().iter().all(|&x| x == 2));
    // A name published only in c1 is unknown in c2.
    a1.open_segment("127.0.0.1:13003").unwrap();
    assert_eq!(
        a2.open_segment("127.0.0.1:13003").unwrap_err().code(),
        TeError::Metadata
    );
    let e = a2
        .transfer_sync("127.0.0.1:13003", l2.addr(), 0, 1, Opcode::Write)
        .unwrap_err();
    assert_eq!(e.code(), TeError::Metadata, "{e}");
    assert_eq!(
        a2.send_probe("127.0.0.1:13003").unwrap_err().code(),
        TeError::Metadata
    );

    // Shutting down one cluster's engine leaves the other's key of the same name.
    drop(b1);
    assert!(etcd.json("mooncake/c1/ram/127.0.0.1:13001").is_none());
    assert!(etcd.json("mooncake/c2/ram/127.0.0.1:13001").is_some());
    drop((a1, a2, b2, only1));
    assert!(etcd.keys("mooncake/").is_empty());
}

#[test]
fn engine_etcd_down_or_failing_over() {
    // Nothing listening: initialize fails with a socket error naming etcd and the endpoint.
    let dead = free_port();
    let e = TransferEngine::with_options(options(None));
    let err = e
        .initialize(
            "127.0.0.1:1",
            &format!("etcd://127.0.0.1:{dead}"),
            "tcp",
            "",
        )
        .unwrap_err();
    assert_eq!(err.code(), TeError::Socket, "{err}");
    let text = err.to_string();
    assert!(
        text.contains("etcd") && text.contains(&format!("127.0.0.1:{dead}")),
        "{text}"
    );
    assert_eq!(e.rpc_port(), 0, "not initialized");

    // A dead first endpoint: the live second one takes the calls.
    let mut etcd = Etcd::start();
    let conn = format!("etcd://127.0.0.1:{dead};{}", etcd.addr());
    let a = engine(&conn, "127.0.0.1:14000", None);
    let b = engine(&conn, "127.0.0.1:14001", None);
    let (la, rb) = (Buf::new(8192, 5), Buf::new(8192, 0));
    la.register(&a);
    rb.register(&b);
    a.transfer_sync("127.0.0.1:14001", la.addr(), rb.addr(), 8192, Opcode::Write)
        .unwrap();
    assert!(rb.bytes().iter().all(|&x| x == 5));

    // etcd stops: an opened peer keeps working (the data plane does not ask etcd again),
    // a new name fails cleanly, and shutdown does not hang.
    etcd.kill();
    la.fill(0, &[9; 100]);
    a.transfer_sync("127.0.0.1:14001", la.addr(), rb.addr(), 100, Opcode::Write)
        .unwrap();
    assert_eq!(&rb.bytes()[..100], &[9; 100]);
    let err = a.open_segment("127.0.0.1:14999").unwrap_err();
    assert_eq!(err.code(), TeError::Metadata, "{err}");
    let t = Instant::now();
    drop(b);
    drop(a);
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
}

/// Reads one request (head and `Content-Length` body) so that closing does not reset it.
fn read_request(s: &mut std::net::TcpStream) {
    let mut raw = Vec::new();
    let mut buf = [0u8; 8192];
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    while let Ok(n) = s.read(&mut buf) {
        if n == 0 {
            return;
        }
        raw.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&raw).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let len: usize = text[..end]
                .lines()
                .find_map(|l| l.strip_prefix("Content-Length: "))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if raw.len() >= end + 4 + len {
                return;
            }
        }
    }
}

/// A server that answers every request with `response` and closes.
fn fake_gateway(response: &'static [u8]) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            read_request(&mut s);
            let _ = s.write_all(response);
        }
    });
    port
}

#[test]
fn engine_etcd_malformed_gateway_is_an_error_not_a_panic() {
    let cases: [&'static [u8]; 4] = [
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n{{{{{",
        b"HTTP/1.1 200 OK\r\nContent-Length: 35\r\n\r\n{\"kvs\":[{\"key\":\"***\",\"value\":7}]}  ",
        b"HTTP/1.1 200 OK\r\nContent-Length: 999\r\n\r\n{}",
        b"\x00\x01garbage\r\n\r\n",
    ];
    for c in cases {
        let port = fake_gateway(c);
        let e = TransferEngine::with_options(options(None));
        let err = e
            .initialize("127.0.0.1:1", &format!("127.0.0.1:{port}"), "tcp", "")
            .unwrap_err();
        assert_eq!(err.code(), TeError::MalformedJson, "{err}");
    }
}
