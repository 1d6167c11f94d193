//! A writer process SIGKILLed in the middle of a put: its half-written object never becomes
//! readable, the key is free again after `--put_start_discard_timeout_sec`, and the space it
//! held comes back after `--put_start_release_timeout_sec`.
//!
//! The writer is `tests/bin/fault_slow_writer.rs`: `PutStart`, half the bytes over the data
//! plane, then it hangs until killed (no `PutEnd`, no `CATALOG_PUT`).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use client::MasterClient;
use mooncake_tests::{master_metric, wait_until, Master, Node};
use protocol::message::{GetReplicaList, PutStart};
use protocol::{ErrorCode, ReplicateConfig, Uuid};

const DISCARD_S: u64 = 1;
const RELEASE_S: u64 = 2;
const CLIENT_TTL_S: u64 = 2;
/// The killed writer's object: 8 slices of 1 MiB.
const OBJECT_BYTES: u64 = 8 << 20;
/// Scheduling slack on top of each timeout (master tick, stale-put scan interval of 1 s).
const SLACK: Duration = Duration::from_secs(3);
const KEY: &str = "fault/half-written";

fn allocated(m: &Master) -> u64 {
    master_metric(m, "master_allocated_bytes").expect("master_allocated_bytes on /metrics") as u64
}

fn new_value() -> Vec<u8> {
    (0..OBJECT_BYTES as usize)
        .map(|i| (i as u8).wrapping_mul(7).wrapping_add(1))
        .collect()
}

#[test]
fn killed_writer_leaves_nothing_readable_and_its_space_returns() {
    let t_test = Instant::now();
    let discard = format!("--put_start_discard_timeout_sec={DISCARD_S}");
    let release = format!("--put_start_release_timeout_sec={RELEASE_S}");
    let ttl = format!("--client_ttl={CLIENT_TTL_S}");
    // The new writer's value is read (a read lease) and then force-removed: its buffer stays
    // parked until that lease ends (`docs/master.md`, Remove), so keep the lease short enough
    // that only the dead writer's span decides when the space comes back.
    let lease = "--default_kv_lease_ttl=300";
    let m = Master::start(&[&discard, &release, &ttl, lease]);
    let _node = Node::start(&m, &["--global_segment_size=64 MB"]);
    let store =
        mooncake_tests::remote_store(&m.rpc_addr(), &m.metadata_url(), 32 << 20).expect("setup");
    let raw = MasterClient::new(&m.rpc_addr()).unwrap();
    let before = allocated(&m);

    // The writer starts its put, writes half of it and hangs.
    let mut writer = Command::new(env!("CARGO_BIN_EXE_fault_slow_writer"))
        .args([m.rpc_addr(), KEY.to_string(), OBJECT_BYTES.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn fault_slow_writer");
    let mut line = String::new();
    BufReader::new(writer.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("half-written "), "writer said {line:?}");
    let t_put = Instant::now();
    assert_eq!(
        allocated(&m),
        before + OBJECT_BYTES,
        "the put holds its span"
    );

    writer.kill().unwrap(); // SIGKILL
    writer.wait().unwrap();
    let t_kill = Instant::now();

    // Never readable: not listed, no replica list, a get fails rather than returning bytes.
    assert_eq!(store.is_exist(KEY), Ok(false));
    let listed = raw.call(&GetReplicaList { key: KEY.into() }).unwrap();
    assert!(
        matches!(
            listed,
            Err(ErrorCode::ReplicaIsNotReady) | Err(ErrorCode::ObjectNotFound)
        ),
        "a half-written object must not be listed: {listed:?}"
    );
    assert!(store.get(KEY).is_err(), "a half-written object was read");
    // Within the discard timeout the key still belongs to the dead writer (asked only well
    // inside it, so that this probe cannot itself start a put once the timeout passed).
    if t_put.elapsed() < Duration::from_millis(DISCARD_S * 1000 / 2) {
        let early = raw
            .call(&PutStart {
                client_id: Uuid::from_parts(7, 7),
                key: KEY.into(),
                size: OBJECT_BYTES,
                config: ReplicateConfig::default(),
            })
            .unwrap();
        assert_eq!(early.err(), Some(ErrorCode::ObjectAlreadyExists));
    }

    // The master discards the stale put by itself (no new writer asks for the key).
    let discarded = wait_until(Duration::from_secs(DISCARD_S) + SLACK, || {
        master_metric(&m, "master_put_start_discard_cnt").unwrap_or(0.0) >= 1.0
    })
    .expect("the stale put was never discarded");
    let discarded_after_put = t_put.elapsed();
    let parked = allocated(&m); // the discarded span waits for the release timeout
    assert_eq!(store.is_exist(KEY), Ok(false));
    assert!(store.get(KEY).is_err());

    // A new writer gets the key, and readers see exactly its bytes.
    let v = new_value();
    let one = ReplicateConfig::default();
    assert_eq!(store.put(KEY, &v, &one, false), Ok(()));
    assert!(store.get(KEY).unwrap() == v, "the new value reads back");
    assert_eq!(store.remove(KEY, true), Ok(()));

    // The dead writer's span comes back at put start + release timeout.
    let released = wait_until(Duration::from_secs(RELEASE_S) + SLACK, || {
        allocated(&m) == before
    });
    let released_after_put = t_put.elapsed();
    assert!(
        released.is_some(),
        "allocated bytes stayed at {} (before the put: {before}) {:?} after the put",
        allocated(&m),
        released_after_put
    );
    assert!(master_metric(&m, "master_put_start_release_cnt").unwrap_or(0.0) >= 1.0);
    // The space is usable: the whole segment can be filled again.
    let big: Vec<u8> = vec![0xab; 24 << 20];
    assert_eq!(store.put("fault/after", &big, &one, false), Ok(()));
    assert!(store.get("fault/after").unwrap() == big);

    println!(
        "client kill: writer of {} MiB SIGKILLed after writing half, {:?} after its PutStart; \
         never readable; discarded {:?} after PutStart (waited {discarded:?} after the kill, \
         discard timeout {DISCARD_S} s); new put of the key readable; allocated bytes \
         {before} -> {} (killed put) -> {parked} (at discard) -> {before} again \
         {:?} after PutStart (release timeout {RELEASE_S} s); test took {:?}",
        OBJECT_BYTES >> 20,
        t_kill - t_put,
        discarded_after_put,
        before + OBJECT_BYTES,
        released_after_put,
        t_test.elapsed()
    );
}
