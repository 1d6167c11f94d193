//! The real `mooncake_client` storage node with 2 shards against the real `mooncake_master`:
//! each shard's segment is mounted on its own, a data-plane client reaches a replica on the
//! shard that holds it (and only there), the node re-mounts after a master restart, and
//! SIGTERM unmounts everything and exits 0.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use client::dataplane::transport::client::{ClientConfig, TcpClient, TransferError};
use client::MasterClient;
use mooncake_tests::{http, Master, Node};
use protocol::message::*;
use protocol::{ErrorCode, ReplicaDescriptor, ReplicateConfig, Uuid};

fn put_start(c: &MasterClient, key: &str, size: u64) -> Result<Vec<ReplicaDescriptor>, ErrorCode> {
    let config = ReplicateConfig {
        replica_num: 2,
        ..ReplicateConfig::default()
    };
    c.call(&PutStart {
        client_id: Uuid::from_parts(9, 9),
        key: key.into(),
        size,
        config,
    })
    .unwrap()
}

fn data_client(endpoint: &str) -> TcpClient {
    let addr: SocketAddr = endpoint.parse().expect("te_endpoint is ip:port");
    let config = ClientConfig {
        lanes: 1,
        io_timeout: Duration::from_secs(5),
        ..Default::default()
    };
    TcpClient::connect(addr, config).expect("connect to the shard's data port")
}

fn escape(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[test]
fn node_mounts_each_shard_and_serves_its_replicas() {
    let m = Master::start(&[]);
    let mut node = Node::start(&m, &["--global_segment_size=64 MB", "--shards=2"]);
    assert_eq!(node.segments.len(), 2, "{:?}", node.segments);
    // Each shard is an io_uring shard where the kernel allows it (and the environment does
    // not disable it), else the blocking fallback.
    let expected = match client::dataplane::server::probe::probe() {
        client::dataplane::server::probe::UringStatus::Available => "io_uring",
        _ => "blocking",
    };
    assert!(
        node.segments.iter().all(|s| s.backend == expected),
        "{:?}",
        node.segments
    );
    let names: BTreeSet<String> = node.segments.iter().map(|s| s.name.clone()).collect();
    assert_eq!(
        names,
        BTreeSet::from([
            format!("127.0.0.1:{}", node.port),
            format!("127.0.0.1:{}#1", node.port)
        ])
    );
    assert_ne!(node.segments[0].te_endpoint, node.segments[1].te_endpoint);
    assert!(node.segments.iter().all(|s| s.size == 32 << 20));

    // Each shard's descriptor is published for transfer engines.
    for s in &node.segments {
        let r = http(
            "GET",
            m.http_metadata_port,
            &format!(
                "/metadata?key={}",
                escape(&format!("mooncake/ram/{}", s.name))
            ),
            b"",
        );
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(
            r.text().contains("\"mooncake_rs_data_port\""),
            "{}",
            r.text()
        );
    }

    let c = MasterClient::new(&m.rpc_addr()).unwrap();
    let mut seen = BTreeSet::new();
    for (k, key) in ["k1", "k2"].iter().enumerate() {
        let replicas = put_start(&c, key, 64 << 10).unwrap();
        assert_eq!(replicas.len(), 2);
        assert_ne!(
            replicas[0].segment_name, replicas[1].segment_name,
            "replicas on distinct shards"
        );
        for r in &replicas {
            seen.insert(r.segment_name.clone());
            let shard = node
                .segments
                .iter()
                .find(|s| s.name == r.segment_name)
                .expect("a node segment");
            assert_eq!(r.transport_endpoint, shard.te_endpoint);
            assert!(
                r.buffer_address >= shard.base
                    && r.buffer_address + r.size <= shard.base + shard.size
            );
            let data: Vec<u8> = (0..r.size as usize)
                .map(|i| (i * 7 + k * 13) as u8)
                .collect();
            let tc = data_client(&r.transport_endpoint);
            tc.write(r.buffer_address, &data).unwrap();
            let mut back = vec![0u8; data.len()];
            tc.read(r.buffer_address, &mut back).unwrap();
            assert!(back == data, "read back from {}", r.segment_name);
            // The other shard does not serve this address: shards share nothing.
            let other = node
                .segments
                .iter()
                .find(|s| s.name != r.segment_name)
                .unwrap();
            let err = data_client(&other.te_endpoint)
                .read(r.buffer_address, &mut back)
                .unwrap_err();
            assert_eq!(err, TransferError::Refused { status: -3 });
        }
        c.call(&PutEnd {
            client_id: Uuid::from_parts(9, 9),
            key: key.to_string(),
        })
        .unwrap()
        .unwrap();
    }
    assert_eq!(seen, names);

    let status = node
        .signal_and_wait(libc::SIGTERM, Duration::from_secs(10))
        .expect("node exits on SIGTERM");
    assert_eq!(status.code(), Some(0));
    // Unmounted: the objects held there are gone and nothing can be placed any more.
    assert_eq!(
        c.call(&GetReplicaList { key: "k1".into() }).unwrap(),
        Err(ErrorCode::ObjectNotFound)
    );
    assert!(put_start(&c, "k3", 4096).is_err());
    for s in &node.segments {
        let r = http(
            "GET",
            m.http_metadata_port,
            &format!(
                "/metadata?key={}",
                escape(&format!("mooncake/ram/{}", s.name))
            ),
            b"",
        );
        assert_eq!(r.status, 404, "descriptor of {} removed", s.name);
    }
}

#[test]
fn node_remounts_after_master_restart_and_stops_on_sigint() {
    let mut m = Master::start(&[]);
    let (rpc, metrics, meta) = (m.rpc_port, m.metrics_port, m.http_metadata_port);
    let mut node = Node::start(&m, &["--global_segment_size=16MB", "--cores=2"]);
    assert_eq!(node.segments.len(), 2);
    let _ = m.child.kill();
    let _ = m.child.wait();
    drop(m);
    let m = Master::start_on(rpc, metrics, meta, &[]);
    let c = MasterClient::new(&m.rpc_addr()).unwrap();
    // A fresh master knows no segments until the node's ping is answered NEED_REMOUNT.
    let deadline = Instant::now() + Duration::from_secs(15);
    let replicas = loop {
        match put_start(&c, "after-restart", 4096) {
            Ok(r) => break r,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => panic!("the node never re-mounted: {e:?}"),
        }
    };
    let got: BTreeSet<String> = replicas.iter().map(|r| r.segment_name.clone()).collect();
    let want: BTreeSet<String> = node.segments.iter().map(|s| s.name.clone()).collect();
    assert_eq!(got, want);
    let status = node
        .signal_and_wait(libc::SIGINT, Duration::from_secs(10))
        .expect("node exits on SIGINT");
    assert_eq!(status.code(), Some(0));
}

#[test]
fn node_falls_back_to_the_blocking_server_when_io_uring_is_disabled() {
    let m = Master::start(&[]);
    let node = Node::start_with_env(
        &m,
        &["--global_segment_size=16 MB", "--shards=1"],
        &[("MC_DISABLE_IO_URING", "1")],
    );
    assert_eq!(node.segments.len(), 1);
    assert_eq!(node.segments[0].backend, "blocking", "{:?}", node.segments);
    // The fallback serves the same protocol: a write and a read of the segment round-trip.
    let seg = &node.segments[0];
    let c = data_client(&seg.te_endpoint);
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
    c.write(seg.base + 4096, &data).expect("write");
    let mut back = vec![0u8; data.len()];
    c.read(seg.base + 4096, &mut back).expect("read");
    assert_eq!(back, data);
}

#[test]
fn node_exports_memory_kind_backend_and_counters_on_metrics_port() {
    let m = Master::start(&[]);
    let port = mooncake_tests::free_port();
    let node = Node::start(
        &m,
        &[
            "--global_segment_size=16 MB",
            "--shards=2",
            &format!("--metrics_port={port}"),
        ],
    );
    let seg = &node.segments[1];
    data_client(&seg.te_endpoint)
        .write(seg.base, b"hello")
        .expect("write");
    // The shard counts a request after its reply is on the wire: poll briefly.
    let ok = "mooncake_node_requests_ok_total{shard=\"1\"} 1";
    let metrics = || http("GET", port, "/metrics", b"").text();
    mooncake_tests::wait_until(Duration::from_secs(5), || metrics().contains(ok));
    let text = metrics();
    for shard in ["0", "1"] {
        let kind = format!("mooncake_node_segment_memory_kind{{shard=\"{shard}\",kind=");
        assert!(text.contains(&kind), "{kind} missing:\n{text}");
        let backend = format!(
            "mooncake_node_io_backend{{shard=\"{shard}\",backend=\"{}\"",
            node.segments[0].backend
        );
        assert!(text.contains(&backend), "{backend} missing:\n{text}");
    }
    assert!(text.contains(ok), "{text}");
    assert!(
        text.contains("mooncake_node_loop_stalls_total{shard=\"0\"}"),
        "{text}"
    );
    assert_eq!(http("GET", port, "/health", b"").status, 200);
}
