//! Same-host replicas move by memcpy through the owner's shared segment
//! (`dataplane::mem::shm`): a store client and a storage node on one host, in two processes.
//!
//! - puts and gets of objects from 1 byte to several MiB move their bytes through the mapped
//!   segment, and only the catalog records go over TCP; the bytes read back are the ones
//!   written, and a second client on TCP only (`MC_STORE_SHM=0`) reads them too (so the node's
//!   own server sees what the memcpy wrote);
//! - when the node dies, the client notices on its next access (the kernel closed the node's
//!   end of the offer socket), unmaps its segment (the memory is not held) and reads fail with
//!   `TRANSFER_FAIL` instead of returning bytes of a dead node.

use std::time::Duration;

use client::Store;
use mooncake_tests::{Master, Node};
use protocol::{ErrorCode, ReplicateConfig};

fn store(m: &Master) -> Store {
    mooncake_tests::remote_store(&m.rpc_addr(), &m.metadata_url(), 64 << 20).expect("setup")
}

fn value(i: usize) -> Vec<u8> {
    let len = [1, 4096, 100_000, (1 << 20) + 3, (3 << 20) + 17][i % 5];
    (0..len)
        .map(|k| (k as u8).wrapping_mul(13).wrapping_add(i as u8))
        .collect()
}

/// Mappings of shared segments in this process.
fn shared_mappings() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| l.contains("memfd:mooncake-segment"))
        .count()
}

#[test]
fn same_host_replicas_move_by_memcpy_and_a_dead_owner_is_let_go() {
    let m = Master::start(&[]);
    let mut node = Node::start(&m, &["--shards=1", "--global_segment_size=256 MB"]);
    let s = store(&m);
    let cfg = ReplicateConfig::default();
    let n = 20;
    let total: u64 = (0..n).map(|i| value(i).len() as u64).sum();
    for i in 0..n {
        assert_eq!(s.put(&format!("shm/{i}"), &value(i), &cfg, false), Ok(()));
    }
    let after_puts = s.path_counts();
    assert_eq!(
        after_puts.shm_memcpy_bytes, total,
        "every byte written by memcpy: {after_puts:?}"
    );
    assert!(
        after_puts.tcp_bytes < total / 100,
        "only catalog records over TCP: {after_puts:?}"
    );
    for i in 0..n {
        assert_eq!(s.get(&format!("shm/{i}")), Ok(value(i)), "shm/{i}");
    }
    let after_gets = s.path_counts();
    assert_eq!(after_gets.shm_memcpy_bytes, 2 * total, "{after_gets:?}");
    assert_eq!(shared_mappings(), 1, "the node's segment is mapped once");

    // The node's owner process kept its catalog and serves the same bytes over TCP.
    std::env::set_var("MC_STORE_SHM", "0");
    let tcp_only = store(&m);
    std::env::remove_var("MC_STORE_SHM");
    for i in 0..n {
        assert_eq!(
            tcp_only.get(&format!("shm/{i}")),
            Ok(value(i)),
            "tcp shm/{i}"
        );
    }
    let t = tcp_only.path_counts();
    assert_eq!(t.shm_memcpy_bytes, 0, "{t:?}");
    assert!(t.tcp_bytes >= total, "{t:?}");

    node.signal_and_wait(libc::SIGKILL, Duration::from_secs(5))
        .expect("node killed");
    std::thread::sleep(Duration::from_millis(50));
    // The replica list may still name the dead node (until --client_ttl); the read must not
    // come from its memory.
    match s.get("shm/3").map_err(ErrorCode::from) {
        Err(ErrorCode::TransferFail) | Err(ErrorCode::ObjectNotFound) => {}
        other => panic!("read of a dead node's replica: {other:?}"),
    }
    assert_eq!(shared_mappings(), 0, "the dead node's segment is unmapped");
}
