//! The store and the storage node with `protocol="rdma"`, over the software verbs model
//! (`SimVerbs`, selected by `MOONCAKE_RDMA_SIM=<fabric dir>` in every process of the test):
//! a real master, a real `mooncake_client` node process, store clients in this process.
//!
//! - puts and gets of objects from 1 byte to several MiB (several staging chunks) move their
//!   bytes with RDMA WRITE and READ into the node's segments, and only catalog records go over
//!   TCP; a TCP-only client reads the same bytes from the node's own server;
//! - memory registered with `register_buffer` goes to the NIC without the staging copy;
//! - a store client's own segment is served over RDMA to another store client, and a
//!   segment served over TCP only is reached over TCP;
//! - a dead node fails reads with `TRANSFER_FAIL`, at once;
//! - no device runs TCP (counted, `MC_REQUIRE_RDMA=1` refuses instead, `MC_FORCE_TCP=1`
//!   asks for TCP), even with `P2PHANDSHAKE`;
//! - with a device and `P2PHANDSHAKE` (no metadata server) the same puts and gets run over
//!   RDMA, each segment's descriptor read from its owner's handshake server.
//!
//! The tests set process environment variables: each takes `mooncake_tests::env_lock()`, so
//! under `cargo test` (threads of one process) they run one at a time.

use client::store::{Dst, Src};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use client::{Store, StoreConfig};
use mooncake_tests::{bin_path, free_port, http, wait_until, Master, Node, SimFabric};
use protocol::{ErrorCode, ReplicateConfig};

/// Sets the process environment for an RDMA store on a fresh fabric (same-host shared
/// segments off, so that replicas on the node are not copied by memcpy instead).
fn rdma_env() -> SimFabric {
    let f = SimFabric::new();
    std::env::set_var("MOONCAKE_RDMA_SIM", f.path());
    std::env::set_var("MC_STORE_SHM", "0");
    std::env::set_var("MC_TRANSFER_TIMEOUT", "5");
    f
}

fn store(m: &Master, protocol: &str, segment: u64, metadata: &str) -> Result<Store, ErrorCode> {
    Store::setup(store_config(m, protocol, segment, metadata))
}

fn store_config(m: &Master, protocol: &str, segment: u64, metadata: &str) -> StoreConfig {
    StoreConfig {
        local_hostname: "127.0.0.1".into(),
        metadata_server: metadata.into(),
        global_segment_size: segment,
        local_buffer_size: 64 << 20,
        protocol: protocol.into(),
        rdma_devices: String::new(),
        master_server_addr: m.rpc_addr(),
        tenant_id: String::new(),
        ssd_offload: None,
    }
}

fn rdma_node(m: &Master, f: &SimFabric) -> Node {
    rdma_node_with(m, f, &[])
}

fn rdma_node_with(m: &Master, f: &SimFabric, extra: &[&str]) -> Node {
    let fab = f.path();
    let mut args = vec![
        "--protocol=rdma",
        "--shards=2",
        "--global_segment_size=256 MB",
    ];
    args.extend_from_slice(extra);
    Node::start_with_env(
        m,
        &args,
        &[("MOONCAKE_RDMA_SIM", fab), ("MC_STORE_SHM", "0")],
    )
}

fn value(i: usize) -> Vec<u8> {
    let len = [1, 4096, 100_000, (5 << 20) + 3, (9 << 20) + 17][i % 5];
    (0..len)
        .map(|k| (k as u8).wrapping_mul(31).wrapping_add(i as u8))
        .collect()
}

#[test]
fn puts_and_gets_move_over_rdma_into_a_storage_node() {
    let _env = mooncake_tests::env_lock();
    let f = rdma_env();
    let m = Master::start(&[]);
    let mut node = rdma_node(&m, &f);
    let s = store(&m, "rdma", 0, &m.metadata_url()).expect("rdma store setup");
    let cfg = ReplicateConfig::default();
    let n = 10;
    let total: u64 = (0..n).map(|i| value(i).len() as u64).sum();
    for i in 0..n {
        assert_eq!(
            s.put(&format!("r/{i}"), &value(i), &cfg, false),
            Ok(()),
            "put r/{i}"
        );
    }
    let after_puts = s.path_counts();
    assert_eq!(
        after_puts.rdma_bytes, total,
        "every byte written by RDMA: {after_puts:?}"
    );
    assert_eq!(after_puts.rdma_staged_bytes, total, "{after_puts:?}");
    assert!(
        after_puts.tcp_bytes < total / 100,
        "only catalog records over TCP: {after_puts:?}"
    );
    for i in 0..n {
        assert_eq!(s.get(&format!("r/{i}")), Ok(value(i)), "get r/{i}");
    }
    assert_eq!(s.path_counts().rdma_bytes, 2 * total);

    // A batch of several parts per key, across staging chunk boundaries.
    let keys: Vec<String> = (0..4).map(|i| format!("b/{i}")).collect();
    let vals: Vec<Vec<u8>> = (0..4).map(|i| value(i + 2)).collect();
    let parts: Vec<Vec<Src<'_>>> = vals
        .iter()
        .map(|v| {
            let (a, b) = v.split_at(v.len() / 3);
            vec![Src::from(a), Src::from(b)]
        })
        .collect();
    for r in s.put_many(&keys, &parts, &cfg, false) {
        assert_eq!(r, Ok(()));
    }
    for (k, v) in keys.iter().zip(&vals) {
        assert_eq!(s.get(k).as_ref(), Ok(v), "{k}");
    }

    // Registered memory goes to the NIC without the staging copy.
    let mut reg = vec![0u8; 6 << 20];
    let (addr, len) = (reg.as_mut_ptr() as u64, reg.len() as u64);
    // SAFETY: `reg` is not moved or freed before the `unregister_buffer` below.
    unsafe { s.register_buffer(addr, len) }.unwrap();
    for (k, x) in reg.iter_mut().enumerate() {
        *x = (k % 251) as u8;
    }
    let staged = s.path_counts().rdma_staged_bytes;
    assert_eq!(s.put("reg", &reg, &cfg, false), Ok(()));
    let want = reg.clone();
    reg.iter_mut().for_each(|x| *x = 0);
    let read = s.with_lookup("reg", |list| {
        s.read_from(list, 0, Dst::from(&mut reg[..]))?;
        Ok(())
    });
    assert_eq!(read, Ok(()));
    assert!(reg == want, "registered read-back differs");
    assert_eq!(
        s.path_counts().rdma_staged_bytes,
        staged,
        "registered memory was staged"
    );
    s.unregister_buffer(addr).unwrap();

    // The node's own server sees what RDMA wrote, and its catalog has every object.
    let tcp = store(&m, "tcp", 0, &m.metadata_url()).expect("tcp store");
    for i in 0..n {
        assert_eq!(tcp.get(&format!("r/{i}")), Ok(value(i)), "tcp get r/{i}");
    }
    assert!(tcp.path_counts().tcp_bytes >= total);
    assert_eq!(tcp.path_counts().rdma_bytes, 0);

    // A dead node: reads of its replicas fail at once rather than hang or return bytes.
    node.signal_and_wait(libc::SIGKILL, Duration::from_secs(5))
        .expect("node killed");
    // The first read meets the dead queue pairs; the next ones go to its TCP endpoint, which
    // is then in back-off.
    let t0 = Instant::now();
    for _ in 0..3 {
        assert_eq!(
            s.get("r/1").map_err(ErrorCode::from),
            Err(ErrorCode::TransferFail)
        );
    }
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "three reads from a dead node took {:?}",
        t0.elapsed()
    );
    s.close();
    tcp.close();
}

/// The node's TCP requests answered so far, over its shards.
/// The node's per-shard values of the metric family `name` (`mooncake_node_<name>{shard=..}`).
fn per_shard(metrics_port: u16, name: &str) -> Vec<u64> {
    let prefix = format!("mooncake_node_{name}{{");
    http("GET", metrics_port, "/metrics", b"")
        .text()
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .collect()
}

fn requests_ok(metrics_port: u16) -> u64 {
    per_shard(metrics_port, "requests_ok_total").iter().sum()
}

/// The owner's CPU sees none of an RDMA write's bytes, so before them the writer tells it
/// which key and version are about to go over the range (an intent over TCP, answered before
/// the first work request), as a TCP writer does in its WRITE's lane: a writer that dies
/// between its bytes and its record then leaves no older entry of another key naming them
/// (`docs/recovery.md`, invariant 8). Each RDMA put is two requests on the owner's data port,
/// its intent and its record; it was one, the record, before.
#[test]
fn rdma_puts_announce_each_write_to_its_owner_before_the_bytes() {
    let _env = mooncake_tests::env_lock();
    let f = rdma_env();
    let m = Master::start(&[]);
    let port = free_port();
    let _node = rdma_node_with(&m, &f, &[&format!("--metrics_port={port}")]);
    let s = store(&m, "rdma", 0, &m.metadata_url()).expect("rdma store setup");
    let cfg = ReplicateConfig::default();
    let puts = 6;
    // Warm up, the same sizes, until every data-plane connection the puts take (to both
    // shards, each lane declaring its term, one request) is open: placement picks the shard,
    // and six puts all landed on one in about one run in fifteen.
    let both_shards_connected = || {
        let accepted = per_shard(port, "connections_accepted_total");
        accepted.len() == 2 && accepted.iter().all(|&n| n > 0)
    };
    let mut warm = 0;
    while warm < puts || !both_shards_connected() {
        assert!(warm < 200, "200 warm-up puts did not reach both shards");
        let i = warm % puts;
        assert_eq!(
            s.put(&format!("warm/{warm}"), &value(i), &cfg, false),
            Ok(())
        );
        warm += 1;
    }
    let settled = || {
        let a = requests_ok(port);
        std::thread::sleep(Duration::from_millis(300));
        a == requests_ok(port)
    };
    wait_until(Duration::from_secs(5), settled).expect("the node's counters settle");
    let before = requests_ok(port);
    let before_rdma = s.path_counts().rdma_bytes;
    for i in 0..puts {
        assert_eq!(s.put(&format!("a/{i}"), &value(i), &cfg, false), Ok(()));
    }
    let moved: u64 = (0..puts).map(|i| value(i).len() as u64).sum();
    assert_eq!(
        s.path_counts().rdma_bytes - before_rdma,
        moved,
        "bytes by RDMA"
    );
    wait_until(Duration::from_secs(5), settled).expect("the node's counters settle");
    assert_eq!(
        requests_ok(port) - before,
        2 * puts as u64,
        "an intent and a record per RDMA put"
    );
    for i in 0..puts {
        assert_eq!(s.get(&format!("a/{i}")), Ok(value(i)), "get a/{i}");
    }
    s.close();
}

#[test]
fn a_store_clients_own_segment_is_served_over_rdma() {
    let _env = mooncake_tests::env_lock();
    let _f = rdma_env();
    let m = Master::start(&[]);
    let owner = store(&m, "rdma", 64 << 20, &m.metadata_url()).expect("owner setup");
    let other = store(&m, "rdma", 0, &m.metadata_url()).expect("other setup");
    let on_owner = ReplicateConfig {
        preferred_segment: owner.hostname().to_string(),
        ..ReplicateConfig::default()
    };
    let v = value(3);
    assert_eq!(other.put("o/1", &v, &on_owner, false), Ok(()));
    let list = other.replicas("o/1").unwrap();
    assert_eq!(list.replicas[0].segment_name, owner.hostname());
    assert_eq!(other.path_counts().rdma_bytes, v.len() as u64);
    // The owner reads it from its own memory; the other one over RDMA again.
    assert_eq!(owner.get("o/1"), Ok(v.clone()));
    assert_eq!(owner.path_counts().own_memcpy_bytes, v.len() as u64);
    assert_eq!(other.get("o/1"), Ok(v.clone()));
    assert_eq!(other.path_counts().rdma_bytes, 2 * v.len() as u64);

    // A segment served over TCP only is reached over TCP by the RDMA client.
    let tcp_owner = store(&m, "tcp", 64 << 20, &m.metadata_url()).expect("tcp owner");
    let on_tcp = ReplicateConfig {
        preferred_segment: tcp_owner.hostname().to_string(),
        ..ReplicateConfig::default()
    };
    let before = other.path_counts();
    assert_eq!(other.put("o/2", &v, &on_tcp, false), Ok(()));
    assert_eq!(other.get("o/2"), Ok(v.clone()));
    let after = other.path_counts();
    assert_eq!(after.rdma_bytes, before.rdma_bytes, "{after:?}");
    assert!(
        after.tcp_bytes >= before.tcp_bytes + 2 * v.len() as u64,
        "{after:?}"
    );
    tcp_owner.close();
    other.close();

    // Closing withdraws what the owner published (and deregisters its segment).
    let key = |k: &str| format!("/metadata?key=mooncake/{k}/{}", owner.hostname());
    let published = |k: &str| http("GET", m.http_metadata_port, &key(k), b"").status;
    assert_eq!((published("ram"), published("rpc_meta")), (200, 200));
    owner.close();
    assert_ne!(published("ram"), 200);
    assert_ne!(published("rpc_meta"), 200);
}

/// `mooncake_rdma_tcp_fallbacks_total` on a `/metrics` page.
fn fallbacks_metric(port: u16) -> Option<u64> {
    http("GET", port, "/metrics", b"")
        .text()
        .lines()
        .find(|l| l.starts_with("mooncake_rdma_tcp_fallbacks_total "))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// As upstream: `rdma` on a host without an RDMA device runs TCP (with a warning), even with
/// `P2PHANDSHAKE` (SGLang HiCache's defaults), and the fall-back is counted.
#[test]
fn rdma_without_a_device_falls_back_to_tcp() {
    let _env = mooncake_tests::env_lock();
    let f = rdma_env();
    let m = Master::start(&[]);
    // The model with no devices: as a host with libibverbs and no HCA.
    std::env::set_var("MOONCAKE_RDMA_SIM_DEVICES", "");
    let before = client::rdma::tcp_fallbacks();
    for (i, metadata) in ["P2PHANDSHAKE".to_string(), m.metadata_url()]
        .iter()
        .enumerate()
    {
        let s = store(&m, "rdma", 16 << 20, metadata).expect("rdma falls back to TCP");
        let key = format!("t/{i}");
        let cfg = ReplicateConfig::default();
        assert_eq!(s.put(&key, b"tcp", &cfg, false), Ok(()));
        assert_eq!(s.get(&key), Ok(b"tcp".to_vec()));
        assert_eq!(s.path_counts().rdma_bytes, 0);
        s.close();
    }
    assert_eq!(client::rdma::tcp_fallbacks(), before + 2);
    // Named devices that do not exist: TCP too.
    std::env::remove_var("MOONCAKE_RDMA_SIM_DEVICES");
    let mut cfg = store_config(&m, "rdma", 16 << 20, "P2PHANDSHAKE");
    cfg.rdma_devices = "mlx5_missing".into();
    Store::setup(cfg)
        .expect("missing named device falls back")
        .close();
    assert_eq!(client::rdma::tcp_fallbacks(), before + 3);
    // MC_FORCE_TCP asks for TCP: no fall-back to count.
    std::env::set_var("MC_FORCE_TCP", "1");
    store(&m, "rdma", 16 << 20, "P2PHANDSHAKE")
        .expect("forced TCP")
        .close();
    assert_eq!(client::rdma::tcp_fallbacks(), before + 3);
    std::env::remove_var("MC_FORCE_TCP");

    // The node starts over TCP and counts the fall-back on its /metrics.
    let port = free_port();
    let node = Node::start_with_env(
        &m,
        &[
            "--protocol=rdma",
            "--global_segment_size=16 MB",
            &format!("--metrics_port={port}"),
        ],
        &[
            ("MOONCAKE_RDMA_SIM", f.path()),
            ("MOONCAKE_RDMA_SIM_DEVICES", ""),
        ],
    );
    let counted = wait_until(Duration::from_secs(10), || {
        fallbacks_metric(port) == Some(1)
    });
    assert!(counted.is_some(), "metric: {:?}", fallbacks_metric(port));
    drop(node);
}

/// `MC_REQUIRE_RDMA=1` makes a missing device the error it was: the store's setup fails, the
/// node refuses to start, each naming the variable.
#[test]
fn rdma_required_without_a_device_is_refused() {
    let _env = mooncake_tests::env_lock();
    let f = rdma_env();
    let m = Master::start(&[]);
    std::env::set_var("MOONCAKE_RDMA_SIM_DEVICES", "");
    std::env::set_var("MC_REQUIRE_RDMA", "1");
    let before = client::rdma::tcp_fallbacks();
    for metadata in ["P2PHANDSHAKE".to_string(), m.metadata_url()] {
        assert_eq!(
            store(&m, "rdma", 16 << 20, &metadata).err(),
            Some(ErrorCode::InternalError)
        );
    }
    assert_eq!(client::rdma::tcp_fallbacks(), before);
    let err = client::rdma::rdma_or_fallback("rdma", "", "test").unwrap_err();
    assert!(err.contains("MC_REQUIRE_RDMA"), "{err}");
    std::env::remove_var("MC_REQUIRE_RDMA");
    std::env::remove_var("MOONCAKE_RDMA_SIM_DEVICES");

    // The node says why it cannot start, and exits.
    let out = Command::new(bin_path("mooncake_client"))
        .args([
            "--host=127.0.0.1",
            "--protocol=rdma",
            "--global_segment_size=16 MB",
            &format!("--master_server_address={}", m.rpc_addr()),
            &format!("--metadata_server={}", m.metadata_url()),
        ])
        .env("MOONCAKE_RDMA_SIM", f.path())
        .env("MOONCAKE_RDMA_SIM_DEVICES", "")
        .env("MC_REQUIRE_RDMA", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .expect("run mooncake_client");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("MC_REQUIRE_RDMA"), "{err}");
}

/// With a device, `rdma` runs RDMA (no fall-back counted), with a metadata server or with
/// `P2PHANDSHAKE` (SGLang HiCache's defaults): then nothing is published and a store client's
/// segment is named after its handshake server, which serves the descriptor.
#[test]
fn rdma_with_a_device_uses_it_with_or_without_a_metadata_server() {
    let _env = mooncake_tests::env_lock();
    let _f = rdma_env();
    let m = Master::start(&[]);
    let before = client::rdma::tcp_fallbacks();
    for metadata in [m.metadata_url(), "P2PHANDSHAKE".to_string()] {
        let a = store(&m, "rdma", 16 << 20, &metadata).expect("rdma store");
        let b = store(&m, "rdma", 0, &metadata).expect("rdma store");
        let to_a = ReplicateConfig {
            preferred_segment: a.hostname().to_string(),
            ..ReplicateConfig::default()
        };
        let key = format!("d/{}", metadata.len());
        assert_eq!(b.put(&key, &value(3), &to_a, false), Ok(()), "{metadata}");
        let list = b.replicas(&key).expect("listed").replicas.clone();
        assert_eq!(list[0].segment_name, a.hostname(), "{metadata}");
        assert_eq!(b.get(&key), Ok(value(3)));
        assert_eq!(
            b.path_counts().rdma_bytes,
            2 * value(3).len() as u64,
            "{metadata}: {:?}",
            b.path_counts()
        );
        assert_eq!(client::rdma::tcp_fallbacks(), before);
        let ram = format!("/metadata?key=mooncake/ram/{}", a.hostname());
        let published = http("GET", m.http_metadata_port, &ram, b"").status == 200;
        assert_eq!(published, metadata != "P2PHANDSHAKE", "{metadata}");
        b.close();
        a.close();
    }
}

/// `P2PHANDSHAKE` with a node: its shards (`host:port`, `host:port#1`) are served from the
/// handshake server on `--port`; a store client reads each descriptor there once and moves
/// every byte by RDMA; a TCP client reads what RDMA wrote; a store client's own segment is
/// served to another the same way; nothing is published in the master's metadata store.
#[test]
fn p2p_handshake_puts_and_gets_move_over_rdma() {
    let _env = mooncake_tests::env_lock();
    let f = rdma_env();
    let m = Master::start(&[]);
    let node = Node::start_at(
        &m.rpc_addr(),
        "P2PHANDSHAKE",
        &[
            "--protocol=rdma",
            "--shards=2",
            "--global_segment_size=256 MB",
        ],
        &[("MOONCAKE_RDMA_SIM", f.path()), ("MC_STORE_SHM", "0")],
    );
    let s = store(&m, "rdma", 0, "P2PHANDSHAKE").expect("rdma store setup");
    let cfg = ReplicateConfig::default();
    let n = 10;
    let total: u64 = (0..n).map(|i| value(i).len() as u64).sum();
    let mut segments = std::collections::BTreeSet::new();
    for i in 0..n {
        let key = format!("p2p/{i}");
        assert_eq!(s.put(&key, &value(i), &cfg, false), Ok(()), "put {key}");
        segments.insert(
            s.replicas(&key).expect("listed").replicas[0]
                .segment_name
                .clone(),
        );
    }
    assert_eq!(s.path_counts().rdma_bytes, total, "{:?}", s.path_counts());
    assert!(
        s.path_counts().tcp_bytes < total / 100,
        "{:?}",
        s.path_counts()
    );
    assert_eq!(segments.len(), 2, "both shards used: {segments:?}");
    for i in 0..n {
        assert_eq!(s.get(&format!("p2p/{i}")), Ok(value(i)), "get p2p/{i}");
    }
    assert_eq!(s.path_counts().rdma_bytes, 2 * total);
    let tcp = store(&m, "tcp", 0, "P2PHANDSHAKE").expect("tcp store");
    for i in 0..n {
        assert_eq!(
            tcp.get(&format!("p2p/{i}")),
            Ok(value(i)),
            "tcp get p2p/{i}"
        );
    }
    assert_eq!(tcp.path_counts().rdma_bytes, 0);
    for seg in &segments {
        let key = format!("/metadata?key=mooncake/ram/{seg}");
        assert_ne!(
            http("GET", m.http_metadata_port, &key, b"").status,
            200,
            "{seg}"
        );
    }
    // A store client's own segment, served over RDMA to another, named after its handshake
    // server; a TCP owner's segment is reached over TCP.
    let owner = store(&m, "rdma", 64 << 20, "P2PHANDSHAKE").expect("owner setup");
    let tcp_owner = store(&m, "tcp", 64 << 20, "P2PHANDSHAKE").expect("tcp owner");
    for (o, rdma) in [(&owner, true), (&tcp_owner, false)] {
        let to = ReplicateConfig {
            preferred_segment: o.hostname().to_string(),
            ..ReplicateConfig::default()
        };
        let key = format!("own/{rdma}");
        let before = s.path_counts();
        assert_eq!(s.put(&key, &value(4), &to, false), Ok(()));
        assert_eq!(s.get(&key), Ok(value(4)));
        let moved = s.path_counts().rdma_bytes - before.rdma_bytes;
        let want = if rdma { 2 * value(4).len() as u64 } else { 0 };
        assert_eq!(moved, want, "{key}: {:?}", s.path_counts());
    }
    tcp_owner.close();
    owner.close();
    tcp.close();
    s.close();
    drop(node);
}
