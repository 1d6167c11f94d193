//! Tenants (`tenant_id`) against the real master and storage node: with
//! `--enable_multi_tenants` each tenant has its own key space (the same key under two tenants
//! is two objects; pattern removals and `remove_all` touch the caller's tenant only; the HTTP
//! key views show the default tenant, the key count covers all), and a master restart puts
//! every tenant's objects back in their own key space. Without the flag every tenant shares
//! the default key space, as upstream's master does. Expected values are what upstream's
//! 0.3.13 master answered to the same calls (`python/tests/test_dropin_tenants.py`).

use std::time::{Duration, Instant};

use client::{Store, StoreConfig};
use mooncake_tests::{http, master_metric, Master, Node};
use protocol::{ErrorCode, ReplicateConfig};

fn store(m: &Master, tenant: &str) -> Store {
    Store::setup(StoreConfig {
        local_hostname: "127.0.0.1".into(),
        metadata_server: format!("http://127.0.0.1:{}/metadata", m.http_metadata_port),
        global_segment_size: 0,
        local_buffer_size: 16 << 20,
        protocol: "tcp".into(),
        rdma_devices: String::new(),
        master_server_addr: m.rpc_addr(),
        tenant_id: tenant.into(),
        ssd_offload: None,
    })
    .expect("setup")
}

fn all_keys(m: &Master) -> Vec<String> {
    let mut keys: Vec<String> = http("GET", m.metrics_port, "/get_all_keys", b"")
        .text()
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    keys.sort();
    keys
}

#[test]
fn tenants_have_separate_key_spaces() {
    let m = Master::start(&["--enable_multi_tenants", "--default_kv_lease_ttl=100"]);
    let _node = Node::start(&m, &["--global_segment_size=64 MB"]);
    let cfg = ReplicateConfig::default();
    let a = store(&m, "default");
    let b = store(&m, "ta");
    let c = store(&m, "tb");

    a.put("k1", b"AAA", &cfg, false).unwrap();
    b.put("k1", b"BBBB", &cfg, false).unwrap();
    assert_eq!(a.get("k1").unwrap(), b"AAA");
    assert_eq!(b.get("k1").unwrap(), b"BBBB");
    assert_eq!(
        c.get("k1").map_err(ErrorCode::from),
        Err(ErrorCode::ObjectNotFound)
    );
    assert_eq!(c.is_exist("k1"), Ok(false));
    assert_eq!(b.get_size("k1"), Ok(4));
    b.put("k2", b"x", &cfg, false).unwrap();
    c.put("k3", b"y", &cfg, false).unwrap();

    // Views list the default tenant; the key count covers every tenant.
    assert_eq!(all_keys(&m), ["k1"]);
    assert_eq!(master_metric(&m, "master_key_count"), Some(4.0));
    let q = http("GET", m.metrics_port, "/query_key?key=k2", b"");
    assert_ne!(q.status, 200, "{}", q.text());

    std::thread::sleep(Duration::from_millis(200));
    // A pattern removal matches the caller's tenant's plain keys only.
    assert_eq!(a.remove_by_regex("k", false), Ok(1));
    assert_eq!(b.is_exist("k2"), Ok(true));
    std::thread::sleep(Duration::from_millis(200)); // the read lease is_exist granted
    assert_eq!(b.remove_by_regex("^k2$", false), Ok(1));
    assert_eq!(b.is_exist("k1"), Ok(true));
    // remove_all is per tenant.
    assert_eq!(c.remove_all(false), Ok(1));
    assert_eq!(b.is_exist("k1"), Ok(true));
    assert_eq!(c.is_exist("k3"), Ok(false));
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        a.remove("k1", false).map_err(ErrorCode::from),
        Err(ErrorCode::ObjectNotFound)
    );
    assert_eq!(b.remove("k1", false), Ok(()));
    assert_eq!(b.remove_all(false), Ok(0));
    assert_eq!(master_metric(&m, "master_key_count"), Some(0.0));
}

#[test]
fn without_the_flag_every_tenant_shares_one_key_space() {
    let m = Master::start(&["--default_kv_lease_ttl=100"]);
    let _node = Node::start(&m, &["--global_segment_size=64 MB"]);
    let cfg = ReplicateConfig::default();
    let a = store(&m, "default");
    let b = store(&m, "ta");
    a.put("k1", b"AAA", &cfg, false).unwrap();
    // First writer wins, as for any second put of a key.
    b.put("k1", b"BBBB", &cfg, false).unwrap();
    assert_eq!(b.get("k1").unwrap(), b"AAA");
    assert_eq!(all_keys(&m), ["k1"]);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(b.remove_all(false), Ok(1));
    assert_eq!(a.is_exist("k1"), Ok(false));
}

#[test]
fn a_restarted_master_puts_objects_back_in_their_tenant() {
    let flags = ["--enable_multi_tenants", "--default_kv_lease_ttl=100"];
    let mut m = Master::start(&flags);
    let (rpc, metrics, meta) = (m.rpc_port, m.metrics_port, m.http_metadata_port);
    let _node = Node::start(&m, &["--global_segment_size=64 MB"]);
    let cfg = ReplicateConfig::default();
    let a = store(&m, "default");
    let b = store(&m, "ta");
    a.put("same", b"from-default", &cfg, false).unwrap();
    b.put("same", b"from-ta", &cfg, false).unwrap();
    b.put("only-ta", b"t", &cfg, false).unwrap();
    b.put("gone", b"g", &cfg, false).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    b.remove("gone", false).unwrap();

    assert!(m
        .signal_and_wait(libc::SIGKILL, Duration::from_secs(5))
        .is_some());
    drop(m);
    let m = Master::start_on(rpc, metrics, meta, &flags);
    let t0 = Instant::now();
    while b.is_exist("only-ta") != Ok(true) || a.is_exist("same") != Ok(true) {
        assert!(t0.elapsed() < Duration::from_secs(10), "not re-reported");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(a.get("same").unwrap(), b"from-default");
    assert_eq!(b.get("same").unwrap(), b"from-ta");
    assert_eq!(a.is_exist("only-ta"), Ok(false));
    assert_eq!(b.is_exist("gone"), Ok(false), "a tenant's tombstone holds");
    assert_eq!(all_keys(&m), ["same"]);
}
