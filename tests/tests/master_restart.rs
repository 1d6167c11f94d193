//! The master killed with SIGKILL and restarted on the same ports: storage nodes re-mount their
//! segments and re-report the objects their catalogs hold, so every object whose put returned
//! 0 and that was not removed is readable again through the same `Store` (no new `setup`),
//! byte for byte; removed objects stay gone; new puts avoid the re-reported ranges.
//! `docs/recovery.md` explains the mechanism and quotes the figures this test prints.

use std::time::{Duration, Instant};

use client::dataplane::recovery::{CatalogRecord, RecordKind};
use client::dataplane::transport::client::{ClientConfig, TcpClient, TransferError};
use mooncake_tests::{Master, Node, SimFabric};
use protocol::{ErrorCode, ReplicateConfig};

/// Objects with one replica, and with two.
const SINGLE: usize = 200;
const DOUBLE: usize = 50;
/// Single-replica objects removed before the kill.
const REMOVED: usize = 20;
/// How long the rebuilt index may take to cover every object.
const RECOVERY_BOUND: Duration = Duration::from_secs(10);
/// Longer than the owners' ping interval (1 s), so freed ranges reached them before the kill.
const SETTLE: Duration = Duration::from_millis(1500);

fn value(i: usize) -> Vec<u8> {
    // Mixed sizes: tiny, KV-block-like, just over a slice (two CATALOG_PUT paths), and a few
    // larger ones.
    let len = match i % 5 {
        0 => 1 + i,
        1 => 4096,
        2 => 100_000 + i,
        3 => (1 << 20) + 4096 + i,
        _ => (2 << 20) + 7 * i,
    };
    (0..len)
        .map(|k| (k as u8).wrapping_mul(29).wrapping_add(i as u8))
        .collect()
}

fn key(i: usize) -> String {
    format!("restart/obj-{i}")
}

fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.0 + b.1 && b.0 < a.0 + a.1
}

/// A master, a one-shard storage node (64 MB) and a store client with no segment of its own.
fn one_node_cluster() -> (Master, Node, client::Store) {
    let master = Master::start(&[]);
    let node = Node::start(&master, &["--shards=1", "--global_segment_size=64 MB"]);
    let store = mooncake_tests::remote_store(&master.rpc_addr(), &master.metadata_url(), 16 << 20)
        .expect("setup");
    (master, node, store)
}

/// SIGKILLs `master` and starts the next one on its ports.
fn restart(mut master: Master) -> Master {
    let (rpc, metrics, http) = (
        master.rpc_port,
        master.metrics_port,
        master.http_metadata_port,
    );
    assert!(master
        .signal_and_wait(libc::SIGKILL, Duration::from_secs(5))
        .is_some());
    drop(master);
    // Start times are the terms without HA: the next one must be later.
    std::thread::sleep(Duration::from_millis(5));
    Master::start_on(rpc, metrics, http, &[])
}

/// A one-lane data-plane client of `endpoint` whose WRITEs declare `term` (0: none).
fn data_client(endpoint: &str, term: u64) -> Result<TcpClient, TransferError> {
    TcpClient::connect(
        endpoint.parse().expect("ip:port"),
        ClientConfig {
            lanes: 1,
            io_timeout: Duration::from_secs(5),
            term,
            ..Default::default()
        },
    )
}

/// Waits until `key` is listed again: its owner re-mounted.
fn wait_listed(store: &client::Store, key: &str) {
    let t0 = Instant::now();
    while store.replicas(key).is_err() {
        assert!(t0.elapsed() < RECOVERY_BOUND, "{key} not re-reported");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn objects_survive_a_master_restart() {
    let _env = mooncake_tests::env_lock();
    let mut master = Master::start(&[]);
    let (rpc, metrics, http) = (
        master.rpc_port,
        master.metrics_port,
        master.http_metadata_port,
    );
    let _a = Node::start(&master, &["--shards=2", "--global_segment_size=256 MB"]);
    let _b = Node::start(&master, &["--shards=1", "--global_segment_size=128 MB"]);
    let store = mooncake_tests::remote_store(
        &master.rpc_addr(),
        &format!("http://127.0.0.1:{http}/metadata"),
        64 << 20,
    )
    .expect("setup");

    let one = ReplicateConfig::default();
    let two = ReplicateConfig {
        replica_num: 2,
        ..Default::default()
    };
    let mut live: Vec<usize> = Vec::new();
    for i in 0..SINGLE + DOUBLE {
        let cfg = if i < SINGLE { &one } else { &two };
        if store.put(&key(i), &value(i), cfg, false) == Ok(()) {
            live.push(i);
        }
    }
    assert_eq!(
        live.len(),
        SINGLE + DOUBLE,
        "every put succeeds on an idle cluster"
    );
    let removed: Vec<usize> = (0..REMOVED).map(|k| k * (SINGLE / REMOVED)).collect();
    for &i in &removed {
        assert_eq!(store.remove(&key(i), true), Ok(()), "{}", key(i));
    }
    live.retain(|i| !removed.contains(i));
    let bytes: u64 = live.iter().map(|&i| value(i).len() as u64).sum();
    std::thread::sleep(SETTLE);

    // SIGKILL: the index dies with the process.
    let t0 = Instant::now();
    assert!(master
        .signal_and_wait(libc::SIGKILL, Duration::from_secs(5))
        .is_some());
    drop(master);
    let master = Master::start_on(rpc, metrics, http, &[]);
    let restarted = t0.elapsed();

    // Same Store instance, no setup: poll the index (replica lists, cheap) until every live
    // object is listed again, then read every byte back.
    let mut pending: Vec<usize> = live.clone();
    let mut first_listed = None;
    while !pending.is_empty() {
        assert!(
            t0.elapsed() < RECOVERY_BOUND,
            "{} of {} objects still missing after {:?}, e.g. {}",
            pending.len(),
            live.len(),
            RECOVERY_BOUND,
            key(pending[0])
        );
        pending.retain(|&i| match store.replicas(&key(i)) {
            Ok(_) => {
                first_listed.get_or_insert_with(|| t0.elapsed());
                false
            }
            Err(_) => true,
        });
        if !pending.is_empty() {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let listed = t0.elapsed();
    for &i in &live {
        assert!(
            store.get(&key(i)).unwrap() == value(i),
            "{} came back with other bytes",
            key(i)
        );
    }
    let readable = t0.elapsed();
    println!(
        "master restart: {} objects ({} MiB, {} with 2 replicas); new master accepting {:?} \
         after the kill; first object indexed at {:?}, all at {:?}; every byte read back \
         and checked at {:?}",
        live.len(),
        bytes >> 20,
        DOUBLE,
        restarted,
        first_listed.unwrap_or_default(),
        listed,
        readable
    );

    // Both replicas of the double objects came back (two nodes report them).
    for i in SINGLE..SINGLE + DOUBLE {
        let list = store.replicas(&key(i)).unwrap();
        assert_eq!(list.replicas.len(), 2, "{}", key(i));
    }
    // Removed objects were dropped from the catalogs before the kill: they stay gone.
    for &i in &removed {
        assert_eq!(
            store.get(&key(i)).map_err(ErrorCode::from),
            Err(ErrorCode::ObjectNotFound),
            "{}",
            key(i)
        );
    }

    // New puts work and land outside every re-reported range.
    let mut taken: Vec<(String, u64, u64)> = Vec::new();
    for &i in &live {
        for r in store.replicas(&key(i)).unwrap().list.replicas {
            taken.push((r.segment_name, r.buffer_address, r.size));
        }
    }
    for n in 0..20 {
        let k = format!("restart/new-{n}");
        let v = value(1000 + n);
        assert_eq!(store.put(&k, &v, &two, false), Ok(()), "{k}");
        assert_eq!(store.get(&k).unwrap(), v);
        for r in store.replicas(&k).unwrap().list.replicas {
            for (seg, addr, size) in &taken {
                assert!(
                    seg != &r.segment_name || !overlaps((r.buffer_address, r.size), (*addr, *size)),
                    "{k} at {:#x} overlaps a re-reported object at {addr:#x} in {seg}",
                    r.buffer_address
                );
            }
        }
    }
    // And the old objects still read back unchanged after the new writes.
    for &i in &live {
        assert!(store.get(&key(i)).unwrap() == value(i), "{}", key(i));
    }
    drop(master);
}

/// The late record and bytes of a write whose term ended: the master restarts (a new term),
/// re-mounts the node, and places a new object; a CATALOG_PUT of the old term for that
/// object's range (a put the old master started, whose writer was slow) arrives at the node,
/// and a writer of the old term connects. The node fenced its memory at the new term before it
/// re-mounted, so both are refused with ERR_METADATA, and the next restart still finds the
/// new object, not the late key. Without
/// the fence the late record replaced the new object's entry: the next master listed the late
/// key over the new object's bytes (a read of other bytes) and lost the new object.
#[test]
fn a_late_record_of_an_ended_term_cannot_replace_a_newer_object() {
    let _env = mooncake_tests::env_lock();
    use client::dataplane::mem::Src;
    use client::dataplane::transport::client::TransferOp;

    let (mut master, _node, store) = one_node_cluster();
    let one = ReplicateConfig::default();
    assert_eq!(store.put("fence/old", &value(1), &one, false), Ok(()));
    let old = store.replicas("fence/old").unwrap().list.replicas.remove(0);

    master = restart(master);
    wait_listed(&store, "fence/old");

    let v = value(2);
    assert_eq!(store.put("fence/new", &v, &one, false), Ok(()));
    let new = store.replicas("fence/new").unwrap().list.replicas.remove(0);
    assert!(
        new.version.term > old.version.term,
        "terms {} then {}",
        old.version.term,
        new.version.term
    );

    // The old term's late record, naming the new object's range.
    let record = CatalogRecord {
        len: new.size,
        hard_pin: false,
        key: "fence/late",
        version: protocol::Version {
            term: old.version.term,
            seq: old.version.seq + 1,
        },
        kind: RecordKind::Object,
        soft_pin_ttl_ms: None,
    }
    .encode();
    let data = data_client(&new.transport_endpoint, 0).expect("connect to the node's data port");
    let mut ops = [TransferOp::CatalogPut {
        remote_addr: new.buffer_address,
        record: Src::from(&record[..]),
    }];
    assert_eq!(
        data.submit(&mut ops).pop().unwrap(),
        Err(TransferError::Refused {
            status: client::dataplane::TeError::Metadata.code()
        }),
        "a record of term {} after the node heard of term {}",
        old.version.term,
        new.version.term
    );

    // The old term's late bytes: a connection declaring that term is refused as it connects
    // (a WRITE already under way when the node heard of the new term is cut; see
    // dataplane/tests/tcp_fence.rs).
    match data_client(&new.transport_endpoint, old.version.term) {
        Err(TransferError::Refused { status }) => {
            assert_eq!(status, client::dataplane::TeError::Metadata.code())
        }
        Err(e) => panic!("expected ERR_METADATA, got {e}"),
        Ok(_) => panic!("a writer of term {} was let in", old.version.term),
    }

    // The next master rebuilds its index from the catalog: the new object, not the late key.
    master = restart(master);
    wait_listed(&store, "fence/new");
    wait_listed(&store, "fence/old");
    assert_eq!(store.get("fence/new").unwrap(), v);
    assert_eq!(store.get("fence/old").unwrap(), value(1));
    assert_eq!(
        store.get("fence/late").map_err(ErrorCode::from),
        Err(ErrorCode::ObjectNotFound)
    );
    drop(master);
}

/// A same-host writer stalled inside its memcpy through a master's death: the owner, hearing
/// of the new master, refuses copies of the ended term before their first byte and re-mounts
/// only once the copy under way has ended, so the new master cannot hand its range to a put
/// of its own while those late bytes may still land (`recovery::inflight`). Without the wait the
/// node re-mounts at once and the new put, given the same range, is written over by the late
/// copy.
#[test]
fn a_same_host_copy_of_an_ended_term_ends_before_the_owner_re_mounts() {
    let _env = mooncake_tests::env_lock();
    use client::dataplane::mem::shm::WriteRefused;
    use client::dataplane::mem::ShmMapping;
    use client::MasterClient;
    use protocol::message::PutStart;

    let (master, _node, store) = one_node_cluster();
    let one = ReplicateConfig::default();
    assert_eq!(store.put("stall/kept", &value(3), &one, false), Ok(()));
    let size = (3 << 20) / 2;
    let raw = MasterClient::new(&master.rpc_addr()).expect("master client");
    let r = raw
        .call(&PutStart {
            client_id: protocol::Uuid::from_parts(0x5a, 1),
            key: "stall/late".into(),
            size: size as u64,
            config: ReplicateConfig::default(),
        })
        .expect("rpc")
        .expect("put start")
        .remove(0);
    let m = ShmMapping::import(&r.transport_endpoint)
        .expect("import")
        .expect("the node shares its segment on this host");
    let p = m.translate(r.buffer_address, r.size).expect("inside");
    let intent = CatalogRecord::intent(r.size, "stall/late", r.version).encode();
    let claim = m
        .begin_write(r.buffer_address, r.version.term, &intent)
        .expect("the put's term is the node's");

    // The writer stalls, its copy begun, while the master dies and the next one starts.
    let _master = restart(master);
    let t0 = Instant::now();
    loop {
        match m.begin_write(r.buffer_address, r.version.term, &intent) {
            Err(WriteRefused::Fenced { fence }) => {
                assert!(fence > r.version.term);
                break;
            }
            Ok(_) => {}
            Err(WriteRefused::Unavailable(e)) => panic!("{e}"),
        }
        assert!(
            t0.elapsed() < RECOVERY_BOUND,
            "the node never heard of the new master"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The node knows the new term and refuses new copies of the old one; its re-mount waits.
    std::thread::sleep(SETTLE);
    assert!(
        store.replicas("stall/kept").is_err(),
        "the node re-mounted while a copy of the ended term was under way"
    );
    let late = vec![0x5au8; size];
    // SAFETY: `translate` checked the range lies in our mapping of the node's segment, which
    // the first master gave to this put; no reference is formed over it.
    unsafe { std::ptr::copy_nonoverlapping(late.as_ptr(), p, size) };
    drop(claim);

    wait_listed(&store, "stall/kept");
    let new: Vec<u8> = (0..size).map(|i| (i % 253) as u8).collect();
    assert_eq!(store.put("stall/new", &new, &one, false), Ok(()));
    let n = store.replicas("stall/new").unwrap().list.replicas.remove(0);
    assert!(
        overlaps((n.buffer_address, n.size), (r.buffer_address, r.size)),
        "the new master gave the new put another range: this test shows nothing"
    );
    assert_eq!(store.get("stall/new").unwrap(), new);
    assert_eq!(store.get("stall/kept").unwrap(), value(3));
    assert_eq!(
        store.get("stall/late").map_err(ErrorCode::from),
        Err(ErrorCode::ObjectNotFound)
    );
}

/// How the dying writers of [`written_over_then_restart`] and
/// [`upsert_cut_before_its_record_then_restart`] put their bytes into the range.
#[derive(Clone, Copy)]
enum DyingWriter {
    /// The store's intent and one WRITE over TCP to the node's data port.
    Tcp,
    /// A memcpy through the node's shared segment, announced first as the store does.
    SameHost,
    /// An RDMA WRITE (the software verbs model) after an intent over TCP, answered first, as
    /// the store does.
    Rdma,
}

impl DyingWriter {
    /// A master, a one-shard storage node (64 MB; serving over RDMA too for
    /// [`DyingWriter::Rdma`], on `fabric`) and a store client with no segment of its own.
    fn cluster(self, fabric: &SimFabric) -> (Master, Node, client::Store) {
        let DyingWriter::Rdma = self else {
            return one_node_cluster();
        };
        rdma_cluster(fabric, false)
    }

    /// Writes `bytes` as the put of `key` the master described with `r` would, and stops
    /// there: no record, no `PutEnd`. `metadata` is where the node published its segment.
    fn write_and_die(
        self,
        r: &protocol::ReplicaDescriptor,
        key: &str,
        bytes: &[u8],
        metadata: &str,
    ) {
        use client::dataplane::mem::{ShmMapping, Src};
        use client::dataplane::transport::client::TransferOp;

        assert_eq!(bytes.len() as u64, r.size);
        let intent = CatalogRecord::intent(r.size, key, r.version).encode();
        match self {
            DyingWriter::Tcp => {
                let data =
                    data_client(&r.transport_endpoint, 0).expect("connect to the node's data port");
                let mut ops = [
                    TransferOp::CatalogIntent {
                        remote_addr: r.buffer_address,
                        record: Src::from(&intent[..]),
                    },
                    TransferOp::Write {
                        remote_addr: r.buffer_address,
                        src: Src::from(bytes),
                    },
                ];
                assert_eq!(data.submit(&mut ops), [Ok(()), Ok(())]);
            }
            DyingWriter::SameHost => {
                let m = ShmMapping::import(&r.transport_endpoint)
                    .expect("import")
                    .expect("the node shares its segment on this host");
                let intent = CatalogRecord::intent(r.size, key, r.version).encode();
                m.announce_write(r.buffer_address, &intent).expect("intent");
                let p = m.translate(r.buffer_address, r.size).expect("inside");
                // SAFETY: `translate` checked the range lies in our mapping of the node's
                // segment, which the master gave to this put; no reference is formed over it.
                unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, bytes.len()) };
            }
            DyingWriter::Rdma => {
                let peers = rdma_writer("dying-writer", metadata);
                let peer = peers
                    .peer(&r.segment_name)
                    .expect("the node serves its segment over RDMA");
                announce(r, key);
                peers
                    .write(&peer, r.buffer_address, &[Src::from(bytes)])
                    .expect("RDMA write");
            }
        }
    }
}

/// A master, a one-shard storage node (64 MB) serving over RDMA on `fabric` too, publishing
/// its descriptor in the master's metadata store or, with `p2p`, serving it from its
/// handshake server (`P2PHANDSHAKE`), and a TCP store client with no segment of its own.
fn rdma_cluster(fabric: &SimFabric, p2p: bool) -> (Master, Node, client::Store) {
    let master = Master::start(&[]);
    let metadata = if p2p {
        "P2PHANDSHAKE".to_string()
    } else {
        master.metadata_url()
    };
    let node = Node::start_at(
        &master.rpc_addr(),
        &metadata,
        &[
            "--shards=1",
            "--global_segment_size=64 MB",
            "--protocol=rdma",
        ],
        &[("MOONCAKE_RDMA_SIM", fabric.path())],
    );
    let store =
        mooncake_tests::remote_store(&master.rpc_addr(), &metadata, 16 << 20).expect("setup");
    (master, node, store)
}

/// An RDMA writer in this process (on the software verbs model of `MOONCAKE_RDMA_SIM`), the
/// path a store uses, reading descriptors from `metadata`.
fn rdma_writer(name: &str, metadata: &str) -> client::store::rdma::RdmaPeers {
    let keys = client::dataplane::metadata::Keys::for_store(&client::store::cluster_id_from_env());
    let side = client::rdma::RdmaSide::open(
        name,
        "",
        Duration::from_secs(5),
        ("127.0.0.1".parse().unwrap(), 0),
        metadata,
        keys,
    )
    .expect("RDMA on the software verbs model");
    client::store::rdma::RdmaPeers::new(side).expect("staging")
}

/// A store client of `master` running `protocol="rdma"` (on the software verbs model of
/// `MOONCAKE_RDMA_SIM`), with no segment of its own, reading descriptors from `metadata`.
fn rdma_store(master: &Master, metadata: &str) -> client::Store {
    client::Store::setup(client::StoreConfig {
        local_hostname: "127.0.0.1".into(),
        metadata_server: metadata.into(),
        global_segment_size: 0,
        local_buffer_size: 16 << 20,
        protocol: "rdma".into(),
        rdma_devices: String::new(),
        master_server_addr: master.rpc_addr(),
        tenant_id: String::new(),
        ssd_offload: None,
    })
    .expect("RDMA store")
}

/// Sends the intent of `key`'s write to `r` to its owner and waits for the answer, as a store
/// does before its RDMA bytes.
fn announce(r: &protocol::ReplicaDescriptor, key: &str) {
    use client::dataplane::mem::Src;
    use client::dataplane::transport::client::TransferOp;

    let intent = CatalogRecord::intent(r.size, key, r.version).encode();
    let data = data_client(&r.transport_endpoint, r.version.term)
        .expect("connect to the node's data port");
    let mut ops = [TransferOp::CatalogIntent {
        remote_addr: r.buffer_address,
        record: Src::from(&intent[..]),
    }];
    assert_eq!(data.submit(&mut ops), [Ok(())], "intent of {key}");
}

/// A range the master freed and handed out again before its owner heard of the free keeps
/// the old key's catalog entry until the new writer's record replaces it. A writer that dies
/// between its bytes and its record (here: bytes, no record, no `PutEnd`) used to leave that
/// entry naming its bytes, and the next master listed the old key over them: a read of
/// another write's bytes right after the restart. The writer now announces its write first
/// (an intent: over TCP a CATALOG_PUT on the WRITE's lane, for a same-host memcpy on the
/// shared-memory socket), and the owner drops the other keys' entries it goes over
/// (`Catalog::overwrite`), so the old key stays gone.
fn written_over_then_restart(writer: DyingWriter) {
    use client::MasterClient;
    use protocol::message::{PutStart, Remove};

    let fabric = SimFabric::new();
    // This process's RDMA (the dying writer's) runs on the same model.
    std::env::set_var("MOONCAKE_RDMA_SIM", fabric.path());
    let (master, _node, store) = writer.cluster(&fabric);
    let one = ReplicateConfig::default();
    // Above the slab sizes: a best-fit extent, so the next allocation of its size reuses it.
    let size = (3 << 20) / 2;
    let old: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
    assert_eq!(store.put("over/old", &old, &one, false), Ok(()));
    assert_eq!(store.put("over/kept", &value(3), &one, false), Ok(()));

    // A remover that dies before burying (the master freed the range; the owner's entry
    // stays until its next ping), and at once a put that gets the same range and whose
    // writer dies after its bytes.
    let raw = MasterClient::new(&master.rpc_addr()).expect("master client");
    let freed = raw
        .call(&Remove {
            key: "over/old".into(),
            force: true,
        })
        .expect("rpc")
        .expect("remove");
    let reused = raw
        .call(&PutStart {
            client_id: protocol::Uuid::from_parts(0x0e, 1),
            key: "over/new".into(),
            size: size as u64,
            config: ReplicateConfig::default(),
        })
        .expect("rpc")
        .expect("put start");
    let r = &reused[0];
    assert_eq!(
        (r.segment_name.as_str(), r.buffer_address),
        (freed[0].segment_name.as_str(), freed[0].buffer_address),
        "the put was not given the removed object's range"
    );
    let foreign = vec![0xa5u8; size];
    writer.write_and_die(r, "over/new", &foreign, &master.metadata_url());

    let _master = restart(master);
    // The node re-mounted once the untouched key is listed again.
    wait_listed(&store, "over/kept");
    assert_eq!(store.get("over/kept").unwrap(), value(3));
    match store.get("over/old") {
        Err(e) => assert_eq!(ErrorCode::from(e), ErrorCode::ObjectNotFound),
        Ok(bytes) if bytes == foreign => {
            panic!("over/old came back over the bytes of another put")
        }
        Ok(bytes) => panic!("over/old came back with {} unexpected bytes", bytes.len()),
    }
    assert_eq!(
        store.get("over/new").map_err(ErrorCode::from),
        Err(ErrorCode::ObjectNotFound)
    );
}

#[test]
fn a_range_written_over_is_not_re_reported_under_its_old_key() {
    let _env = mooncake_tests::env_lock();
    written_over_then_restart(DyingWriter::Tcp);
}

#[test]
fn a_range_memcpyd_over_is_not_re_reported_under_its_old_key() {
    let _env = mooncake_tests::env_lock();
    written_over_then_restart(DyingWriter::SameHost);
}

#[test]
fn a_range_rdma_written_over_is_not_re_reported_under_its_old_key() {
    let _env = mooncake_tests::env_lock();
    written_over_then_restart(DyingWriter::Rdma);
}

/// An upsert of the same size rewrites its key's range in place. Cut between its bytes and
/// its record (its writer died, or a new term's fence refused the record), it leaves the
/// key's entry over its complete new bytes, and the next master lists the key with them (the
/// in-flight value, as a read during the upsert could see). The intent spares the key's own
/// entry: dropping it, as a drop by range alone did, lost the key.
fn upsert_cut_before_its_record_then_restart(writer: DyingWriter) {
    use client::MasterClient;
    use protocol::message::UpsertStart;

    let fabric = SimFabric::new();
    // This process's RDMA (the dying writer's) runs on the same model.
    std::env::set_var("MOONCAKE_RDMA_SIM", fabric.path());
    let (master, _node, store) = writer.cluster(&fabric);
    let one = ReplicateConfig::default();
    let size = 64 << 10;
    assert_eq!(store.put("up/k", &vec![1u8; size], &one, false), Ok(()));
    assert_eq!(store.put("up/kept", &value(4), &one, false), Ok(()));
    // (Not looked up before: a lookup's read lease would make the upsert move elsewhere.)

    let raw = MasterClient::new(&master.rpc_addr()).expect("master client");
    let started = raw
        .call(&UpsertStart {
            client_id: protocol::Uuid::from_parts(0x0e, 2),
            key: "up/k".into(),
            size: size as u64,
            config: ReplicateConfig::default(),
        })
        .expect("rpc")
        .expect("upsert start");
    let new = vec![2u8; size];
    writer.write_and_die(&started.replicas[0], "up/k", &new, &master.metadata_url());

    let _master = restart(master);
    wait_listed(&store, "up/kept");
    match store.get("up/k") {
        Ok(bytes) if bytes == new => {}
        Ok(bytes) if bytes == vec![1u8; size] => panic!("the upsert did not rewrite in place"),
        Ok(bytes) => panic!("up/k came back with {} unexpected bytes", bytes.len()),
        Err(e) => panic!("up/k lost: {e}"),
    }
}

#[test]
fn an_upsert_cut_before_its_record_keeps_its_key_over_tcp() {
    let _env = mooncake_tests::env_lock();
    upsert_cut_before_its_record_then_restart(DyingWriter::Tcp);
}

#[test]
fn an_upsert_cut_before_its_record_keeps_its_key_same_host() {
    let _env = mooncake_tests::env_lock();
    upsert_cut_before_its_record_then_restart(DyingWriter::SameHost);
}

#[test]
fn an_upsert_cut_before_its_record_keeps_its_key_over_rdma() {
    let _env = mooncake_tests::env_lock();
    upsert_cut_before_its_record_then_restart(DyingWriter::Rdma);
}

/// An RDMA WRITE passes no server: once its intent is answered, only its memory key can stop
/// it. A writer stalled between the answer (first term) and its WRITE while the master
/// restarted could land its bytes on a range the new master gave to another put. The node
/// now gives its segments new keys at every new term before it re-mounts
/// (`RdmaSide::rekey`): the late WRITE is refused and the new object keeps its bytes. A
/// store of the new term, whose keys went stale with it, reads the new ones and announces
/// its write again, still over RDMA.
fn rdma_write_of_an_ended_term_does_not_land(p2p: bool) {
    use client::dataplane::mem::Src;
    use client::store::rdma::RdmaFail;
    use client::MasterClient;
    use protocol::message::PutStart;

    let fabric = SimFabric::new();
    std::env::set_var("MOONCAKE_RDMA_SIM", fabric.path());
    std::env::set_var("MC_STORE_SHM", "0");
    let (master, _node, _tcp) = rdma_cluster(&fabric, p2p);
    let metadata = if p2p {
        "P2PHANDSHAKE".to_string()
    } else {
        master.metadata_url()
    };
    let rdma = rdma_store(&master, &metadata);
    let one = ReplicateConfig::default();
    // Above the slab sizes: a best-fit extent, as the next master's put of this size gets.
    let size = (3 << 20) / 2;
    assert_eq!(rdma.put("rk/kept", &value(3), &one, false), Ok(()));

    // The late writer: its put started and its intent answered in the first term.
    let raw = MasterClient::new(&master.rpc_addr()).expect("master client");
    let started = raw
        .call(&PutStart {
            client_id: protocol::Uuid::from_parts(0x0e, 3),
            key: "rk/late".into(),
            size: size as u64,
            config: ReplicateConfig::default(),
        })
        .expect("rpc")
        .expect("put start");
    let r = started[0].clone();
    let peers = rdma_writer("late-writer", &metadata);
    let peer = peers
        .peer(&r.segment_name)
        .expect("the node serves its segment over RDMA");
    announce(&r, "rk/late");

    let _master = restart(master);
    wait_listed(&rdma, "rk/kept");
    // The next master's put of the same size goes over the late writer's range (it never
    // heard of that put), by RDMA with the keys the node published at the new term.
    let before = rdma.path_counts().rdma_bytes;
    let new = vec![0x5au8; size];
    assert_eq!(rdma.put("rk/new", &new, &one, false), Ok(()));
    let now = rdma.replicas("rk/new").expect("listed").replicas.clone();
    assert!(
        now[0].segment_name == r.segment_name
            && overlaps(
                (now[0].buffer_address, now[0].size),
                (r.buffer_address, r.size)
            ),
        "the new put was not given the late writer's range: {now:?} vs {r:?}"
    );
    assert_eq!(
        rdma.path_counts().rdma_bytes - before,
        size as u64,
        "the new term's put went by RDMA"
    );

    // Now the late WRITE, with the keys it read in the first term.
    let late = vec![0xa5u8; size];
    match peers.write(&peer, r.buffer_address, &[Src::from(&late[..])]) {
        Err(RdmaFail::StaleKeys(_)) => {}
        other => panic!("a WRITE of the ended term with its old keys: {other:?}"),
    }
    assert!(
        rdma.get("rk/new") == Ok(new),
        "rk/new does not read back its own bytes"
    );
    assert_eq!(rdma.get("rk/kept"), Ok(value(3)));
    rdma.close();
}

#[test]
fn an_rdma_write_of_an_ended_term_does_not_land() {
    let _env = mooncake_tests::env_lock();
    rdma_write_of_an_ended_term_does_not_land(false);
}

/// The same with `P2PHANDSHAKE`: the new keys reach readers from the node's handshake server.
#[test]
fn an_rdma_write_of_an_ended_term_does_not_land_p2p() {
    let _env = mooncake_tests::env_lock();
    rdma_write_of_an_ended_term_does_not_land(true);
}

/// New memory keys that could not be published (the metadata store was down when the term
/// changed) are published at a later ping: RDMA to the segment comes back by itself instead
/// of failing on the old keys, which etcd still holds, until the next term.
#[test]
fn new_rdma_keys_are_published_once_the_metadata_store_is_back() {
    let _env = mooncake_tests::env_lock();
    let Some(mut etcd) = mooncake_tests::Etcd::start() else {
        return;
    };
    let fabric = SimFabric::new();
    std::env::set_var("MOONCAKE_RDMA_SIM", fabric.path());
    std::env::set_var("MC_STORE_SHM", "0");
    let meta = format!("etcd://{}", etcd.addr());
    let master = Master::start(&[]);
    let _node = Node::start_at(
        &master.rpc_addr(),
        &meta,
        &[
            "--shards=1",
            "--global_segment_size=64 MB",
            "--protocol=rdma",
        ],
        &[("MOONCAKE_RDMA_SIM", fabric.path()), ("MC_STORE_SHM", "0")],
    );
    let rdma = rdma_store(&master, &meta);
    let one = ReplicateConfig::default();
    assert_eq!(rdma.put("pub/a", &value(2), &one, false), Ok(()));
    assert!(rdma.path_counts().rdma_bytes > 0, "by RDMA");

    // The term changes while etcd is down: the node's new keys cannot be published.
    etcd.stop();
    let _master = restart(master);
    wait_listed(&rdma, "pub/a");
    etcd.restart();
    // Within a few pings the new keys are published and puts go by RDMA again.
    let mut n = 0;
    let back = mooncake_tests::wait_until(RECOVERY_BOUND, || {
        n += 1;
        let before = rdma.path_counts().rdma_bytes;
        rdma.put(&format!("pub/{n}"), &value(1), &one, false)
            .is_ok()
            && rdma.path_counts().rdma_bytes > before
    });
    assert!(back.is_some(), "RDMA puts never came back after etcd did");
    assert_eq!(rdma.get("pub/a"), Ok(value(2)));
    rdma.close();
}
