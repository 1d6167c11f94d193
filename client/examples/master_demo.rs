//! A short tour of the master through the Rust client: mount a segment, put two objects
//! (first writer wins), read their replica lists, watch a lease block a remove, remove them.
//!
//! `cargo run --release -p mooncake-client --example master_demo -- 127.0.0.1:50051`

use client::MasterClient;
use protocol::message::*;
use protocol::{ReplicateConfig, Segment, Uuid};

fn main() {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:50051".into());
    let c = MasterClient::new(&addr).expect("master address");
    c.connect().unwrap_or_else(|e| panic!("{e}"));
    println!(
        "master {addr}: {}",
        c.call(&ServiceReady {}).unwrap().unwrap()
    );

    let me = Uuid::from_parts(std::process::id() as u64, 1);
    let seg = Segment {
        id: Uuid::from_parts(std::process::id() as u64, 2),
        name: "127.0.0.1:12300".into(),
        base: 0x7f00_0000_0000,
        size: 64 << 20,
        te_endpoint: "127.0.0.1:12300".into(),
        protocol: "tcp".into(),
        host_id: "127.0.0.1".into(),
        ..Default::default()
    };
    c.call(&MountSegment {
        client_id: me,
        segment: seg.clone(),
    })
    .unwrap()
    .unwrap();
    println!("mounted segment {} ({} MiB)", seg.name, seg.size >> 20);

    for (key, size) in [("demo/config", 24u64), ("demo/kv-block-0", 4096)] {
        let cfg = ReplicateConfig::default();
        let replicas = c
            .call(&PutStart {
                client_id: me,
                key: key.into(),
                size,
                config: cfg.clone(),
            })
            .unwrap()
            .unwrap();
        c.call(&PutEnd {
            client_id: me,
            key: key.into(),
        })
        .unwrap()
        .unwrap();
        println!(
            "put {key:<16} {size:>5} B -> {:#x} on {}",
            replicas[0].buffer_address, replicas[0].segment_name
        );
        let again = c
            .call(&PutStart {
                client_id: me,
                key: key.into(),
                size,
                config: cfg,
            })
            .unwrap();
        println!(
            "  second put of {key}: {:?} (first writer wins)",
            again.err().map(|e| e.name())
        );
    }
    let keys = vec![
        "demo/config".to_string(),
        "demo/kv-block-0".into(),
        "demo/missing".into(),
    ];
    let exist = c.call(&BatchExistKey { keys }).unwrap().unwrap();
    println!(
        "batch_is_exist: {:?}",
        exist
            .iter()
            .map(|r| r.map(|b| b as i32))
            .collect::<Vec<_>>()
    );
    let list = c
        .call(&GetReplicaList {
            key: "demo/config".into(),
        })
        .unwrap()
        .unwrap();
    println!(
        "get_replica_list(demo/config): {} replica(s), lease {} ms",
        list.replicas.len(),
        list.lease_ttl_ms
    );
    let r = c
        .call(&Remove {
            key: "demo/config".into(),
            force: false,
        })
        .unwrap();
    println!(
        "remove while leased: {:?}",
        r.err().map(|e| (e.name(), e.code()))
    );
    let n = c.call(&RemoveAll { force: true }).unwrap().unwrap();
    println!("remove_all(force=True): {n} object(s)");
    c.call(&UnmountSegment {
        client_id: me,
        segment_id: seg.id,
    })
    .unwrap()
    .unwrap();
    println!("unmounted; demo done");
}
