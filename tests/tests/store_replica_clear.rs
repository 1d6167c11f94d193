//! `batch_replica_clear` through the real master: only the writer's idle objects are cleared;
//! a named segment loses its replica while the others stay readable; and a whole-object clear
//! is buried in the owners' catalogs, so a master killed at once and restarted (which rebuilds
//! its index from the owners' re-reports) does not bring the key back.

use std::time::{Duration, Instant};

use mooncake_tests::{remote_store, Master, Node};
use protocol::{ErrorCode, ReplicateConfig};

/// Longer than the master's read lease in this test (`--default_kv_lease_ttl=200`).
const LEASE_PASSED: Duration = Duration::from_millis(250);
/// Longer than the owners' ping interval (1 s): ranges freed before it reached the owners.
const SETTLE: Duration = Duration::from_millis(1500);
/// How long the restarted master may take to list a re-reported object.
const RECOVERY_BOUND: Duration = Duration::from_secs(10);

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn replica_clear_is_owner_checked_and_stays_cleared_across_a_master_restart() {
    let mut master = Master::start(&["--default_kv_lease_ttl=200"]);
    let (rpc, metrics, http) = (
        master.rpc_port,
        master.metrics_port,
        master.http_metadata_port,
    );
    let _x = Node::start(&master, &["--global_segment_size=64 MB"]);
    let _y = Node::start(&master, &["--global_segment_size=64 MB"]);
    let meta = master.metadata_url();
    let a = remote_store(&master.rpc_addr(), &meta, 16 << 20).expect("setup a");
    let b = remote_store(&master.rpc_addr(), &meta, 16 << 20).expect("setup b");
    let two = ReplicateConfig {
        replica_num: 2,
        ..Default::default()
    };
    a.put("mine", b"written by a", &two, false).unwrap();
    a.put("pair", b"two replicas", &two, false).unwrap();
    b.put("theirs", b"written by b", &two, false).unwrap();

    assert_eq!(a.batch_replica_clear(&[], ""), Ok(vec![]));
    // Not the writer, or missing: skipped.
    assert_eq!(b.batch_replica_clear(&strings(&["mine"]), ""), Ok(vec![]));
    assert_eq!(
        a.batch_replica_clear(&strings(&["theirs", "missing"]), ""),
        Ok(vec![])
    );
    // A reader's lease holds it until it ends.
    let segs: Vec<String> = a
        .replicas("pair")
        .unwrap()
        .replicas
        .iter()
        .map(|r| r.segment_name.clone())
        .collect();
    assert_eq!(segs.len(), 2);
    assert_eq!(
        a.batch_replica_clear(&strings(&["pair"]), &segs[0]),
        Ok(vec![])
    );
    std::thread::sleep(LEASE_PASSED);

    // One segment's replica: the other stays readable.
    assert_eq!(
        a.batch_replica_clear(&strings(&["pair", "theirs"]), &segs[0]),
        Ok(strings(&["pair"]))
    );
    let left = b.replicas("pair").unwrap();
    assert_eq!(left.replicas.len(), 1);
    assert_eq!(left.replicas[0].segment_name, segs[1]);
    assert_eq!(b.get("pair").unwrap(), b"two replicas");
    assert_eq!(b.get("theirs").unwrap(), b"written by b");
    std::thread::sleep(SETTLE.max(LEASE_PASSED));

    // The whole object, then the master dies before any owner pings: only the burial keeps
    // "mine" from coming back.
    assert_eq!(
        a.batch_replica_clear(&strings(&["mine"]), ""),
        Ok(strings(&["mine"]))
    );
    assert_eq!(
        a.get("mine").map_err(ErrorCode::from),
        Err(ErrorCode::ObjectNotFound)
    );
    assert!(master
        .signal_and_wait(libc::SIGKILL, Duration::from_secs(5))
        .is_some());
    drop(master);
    let _master = Master::start_on(rpc, metrics, http, &["--default_kv_lease_ttl=200"]);
    let t0 = Instant::now();
    while b.replicas("theirs").is_err() || b.replicas("pair").is_err() {
        assert!(t0.elapsed() < RECOVERY_BOUND, "objects not re-reported");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        b.get("mine").map_err(ErrorCode::from),
        Err(ErrorCode::ObjectNotFound)
    );
    assert_eq!(b.get("pair").unwrap(), b"two replicas");
    assert_eq!(b.get("theirs").unwrap(), b"written by b");
    // The cleared replica reached its owner's catalog before the kill: only one came back.
    let back = b.replicas("pair").unwrap();
    assert_eq!(back.replicas.len(), 1);
    assert_eq!(back.replicas[0].segment_name, segs[1]);
}

#[test]
fn a_tenant_clears_its_own_key_only() {
    let m = Master::start(&["--enable_multi_tenants"]);
    let _node = Node::start(&m, &["--global_segment_size=64 MB"]);
    let tenant = |t: &str| {
        client::Store::setup(client::StoreConfig {
            local_hostname: "127.0.0.1".into(),
            metadata_server: m.metadata_url(),
            global_segment_size: 0,
            local_buffer_size: 16 << 20,
            protocol: "tcp".into(),
            rdma_devices: String::new(),
            master_server_addr: m.rpc_addr(),
            tenant_id: t.into(),
            ssd_offload: None,
        })
        .expect("setup")
    };
    let (a, b) = (tenant("default"), tenant("ta"));
    let cfg = ReplicateConfig::default();
    a.put("k", b"default's", &cfg, false).unwrap();
    b.put("k", b"ta's", &cfg, false).unwrap();
    // The answer names the caller's plain key; the other tenant's "k" is another object.
    assert_eq!(
        b.batch_replica_clear(&strings(&["k"]), ""),
        Ok(strings(&["k"]))
    );
    assert_eq!(
        b.get("k").map_err(ErrorCode::from),
        Err(ErrorCode::ObjectNotFound)
    );
    assert_eq!(a.get("k").unwrap(), b"default's");
}
