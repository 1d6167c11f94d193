//! The real `mooncake_master` binary driven over its real RPC on loopback.

use std::time::Duration;

use client::MasterClient;
use mooncake_tests::Master;
use protocol::message::*;
use protocol::{ClientStatus, ErrorCode, ReplicateConfig, Segment, Uuid};

fn segment(client: Uuid, name: &str, base: u64, size: u64) -> Segment {
    Segment {
        id: Uuid::from_parts(client.hi ^ 0xabc, base),
        name: name.into(),
        base,
        size,
        te_endpoint: name.into(),
        protocol: "tcp".into(),
        host_id: name.split(':').next().unwrap_or("").into(),
        ..Default::default()
    }
}

fn mount(c: &MasterClient, client: Uuid, seg: &Segment) {
    let r = c
        .call(&MountSegment {
            client_id: client,
            segment: seg.clone(),
        })
        .unwrap();
    assert_eq!(r, Ok(()));
}

fn put(c: &MasterClient, client: Uuid, key: &str, size: u64) -> Result<(), ErrorCode> {
    let cfg = ReplicateConfig::default();
    c.call(&PutStart {
        client_id: client,
        key: key.into(),
        size,
        config: cfg,
    })
    .unwrap()?;
    c.call(&PutEnd {
        client_id: client,
        key: key.into(),
    })
    .unwrap()
}

#[test]
fn put_get_remove_round_trip_over_real_rpc() {
    let m = Master::start(&["--default_kv_lease_ttl=300"]);
    let c = MasterClient::new(&m.rpc_addr()).unwrap();
    let me = Uuid::from_parts(1, 1);
    let seg = segment(me, "127.0.0.1:13001", 0x10_0000_0000, 64 << 20);
    mount(&c, me, &seg);

    assert!(c
        .call(&ServiceReady {})
        .unwrap()
        .unwrap()
        .contains("mooncake-rs"));
    assert_eq!(c.call(&ExistKey { key: "k".into() }).unwrap(), Ok(false));
    put(&c, me, "k", 4096).unwrap();
    // First writer wins: a second put of the same key is refused with OBJECT_ALREADY_EXISTS.
    let again = c.call(&PutStart {
        client_id: me,
        key: "k".into(),
        size: 4096,
        config: ReplicateConfig::default(),
    });
    assert_eq!(again.unwrap(), Err(ErrorCode::ObjectAlreadyExists));

    let list = c
        .call(&GetReplicaList { key: "k".into() })
        .unwrap()
        .unwrap();
    assert_eq!(list.replicas.len(), 1);
    let r = &list.replicas[0];
    assert_eq!(r.size, 4096);
    assert_eq!(r.segment_name, seg.name);
    assert!(r.buffer_address >= seg.base && r.buffer_address + 4096 <= seg.base + seg.size);
    assert_eq!(
        list.lease_ttl_ms, 295,
        "the lease less the master's 5 ms slack (object.rs, read windows)"
    );

    // The read granted a lease: remove is refused until it lapses, force skips the check.
    assert_eq!(
        c.call(&Remove {
            key: "k".into(),
            force: false
        })
        .unwrap(),
        Err(ErrorCode::ObjectHasLease)
    );
    std::thread::sleep(Duration::from_millis(400));
    // The answer names the freed replicas, for the remover to bury in the owners' catalogs.
    let freed = c
        .call(&Remove {
            key: "k".into(),
            force: false,
        })
        .unwrap()
        .expect("removed once the lease ran out");
    assert!(
        freed.iter().all(|r| r.size > 0 && r.version.term > 0),
        "{freed:?}"
    );
    assert_eq!(
        c.call(&Remove {
            key: "k".into(),
            force: false
        })
        .unwrap(),
        Err(ErrorCode::ObjectNotFound)
    );
    assert_eq!(
        c.call(&GetReplicaList { key: "k".into() }).unwrap(),
        Err(ErrorCode::ObjectNotFound)
    );
}

#[test]
fn batches_answer_per_item() {
    let m = Master::start(&[]);
    let c = MasterClient::new(&m.rpc_addr()).unwrap();
    let me = Uuid::from_parts(2, 2);
    mount(&c, me, &segment(me, "127.0.0.1:13002", 1 << 40, 64 << 20));
    let keys: Vec<String> = (0..128).map(|i| format!("b{i}")).collect();
    let sizes = vec![1024u64; keys.len()];
    let starts = c
        .call(&BatchPutStart {
            client_id: me,
            keys: keys.clone(),
            sizes,
            config: ReplicateConfig::default(),
        })
        .unwrap()
        .unwrap();
    assert!(starts
        .iter()
        .all(|r| r.as_ref().is_ok_and(|v| v.len() == 1)));
    let ends = c
        .call(&BatchPutEnd {
            client_id: me,
            keys: keys.clone(),
        })
        .unwrap()
        .unwrap();
    assert!(ends.iter().all(|r| r.is_ok()));
    let mut probe = keys.clone();
    probe.push("missing".into());
    let exist = c.call(&BatchExistKey { keys: probe }).unwrap().unwrap();
    assert_eq!(exist.len(), 129);
    assert!(exist[..128].iter().all(|r| *r == Ok(true)));
    assert_eq!(exist[128], Ok(false));

    // Mismatched lengths fail every item with INVALID_PARAMS.
    let bad = c
        .call(&BatchPutStart {
            client_id: me,
            keys: vec!["x".into(), "y".into()],
            sizes: vec![1],
            config: ReplicateConfig::default(),
        })
        .unwrap()
        .unwrap();
    assert_eq!(bad.len(), 2);
    assert!(bad.iter().all(|r| *r == Err(ErrorCode::InvalidParams)));

    let removed = c
        .call(&RemoveByRegex {
            pattern: "^b1".into(),
            force: true,
        })
        .unwrap();
    // b1, b10..=b19 and b100..=b127 start with "b1".
    assert_eq!(removed, Ok(1 + 10 + 28));
}

#[test]
fn bad_regex_is_invalid_params_and_remove_all_counts() {
    let m = Master::start(&[]);
    let c = MasterClient::new(&m.rpc_addr()).unwrap();
    let me = Uuid::from_parts(3, 3);
    mount(&c, me, &segment(me, "127.0.0.1:13003", 1 << 40, 16 << 20));
    for i in 0..5 {
        put(&c, me, &format!("obj{i}"), 512).unwrap();
    }
    assert_eq!(
        c.call(&RemoveByRegex {
            pattern: "(".into(),
            force: false
        })
        .unwrap(),
        Err(ErrorCode::InvalidParams)
    );
    // Substring semantics: "bj3" matches "obj3".
    assert_eq!(
        c.call(&RemoveByRegex {
            pattern: "bj3".into(),
            force: false
        })
        .unwrap(),
        Ok(1)
    );
    assert_eq!(c.call(&RemoveAll { force: false }).unwrap(), Ok(4));
}

#[test]
fn unknown_client_is_told_to_remount_and_expired_client_loses_its_replicas() {
    let m = Master::start(&["--client_ttl=1"]);
    let c = MasterClient::new(&m.rpc_addr()).unwrap();
    let ghost = Uuid::from_parts(9, 9);
    let pong = c.call(&Ping { client_id: ghost }).unwrap().unwrap();
    assert_eq!(pong.status, ClientStatus::NeedRemount);

    let holder = Uuid::from_parts(4, 4);
    mount(
        &c,
        holder,
        &segment(holder, "127.0.0.1:13004", 1 << 40, 16 << 20),
    );
    put(&c, holder, "held", 100).unwrap();
    assert_eq!(
        c.call(&Ping { client_id: holder }).unwrap().unwrap().status,
        ClientStatus::Ok
    );
    // No more pings: after client_ttl the master drops the client, its segment and the object.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        if c.call(&ExistKey { key: "held".into() }).unwrap() == Ok(false) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "expired client's object still present"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        c.call(&Ping { client_id: holder }).unwrap().unwrap().status,
        ClientStatus::NeedRemount
    );
}

#[test]
fn pipelined_requests_from_many_threads_all_get_their_own_answers() {
    let m = Master::start(&[]);
    let c = std::sync::Arc::new(MasterClient::new(&m.rpc_addr()).unwrap());
    let me = Uuid::from_parts(5, 5);
    mount(&c, me, &segment(me, "127.0.0.1:13005", 1 << 40, 256 << 20));
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let c = c.clone();
            std::thread::spawn(move || {
                for i in 0..50 {
                    let key = format!("t{t}-{i}");
                    put(&c, me, &key, 64 + i).unwrap();
                    let l = c.call(&GetReplicaList { key }).unwrap().unwrap();
                    assert_eq!(l.replicas[0].size, 64 + i);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let keys: Vec<ExistKey> = (0..400)
        .map(|i| ExistKey {
            key: format!("t{}-{}", i % 8, i / 8),
        })
        .collect();
    let answers = c.call_many(&keys).unwrap();
    assert!(answers.iter().all(|a| *a == Ok(true)));
}

#[test]
fn sigterm_and_sigint_exit_cleanly() {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        let mut m = Master::start(&[]);
        let st = m
            .signal_and_wait(sig, Duration::from_secs(10))
            .expect("master did not exit");
        assert_eq!(st.code(), Some(0), "signal {sig}");
    }
}
