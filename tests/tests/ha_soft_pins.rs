//! Soft pins after a failover (`docs/ha.md`): soft pins survive a leader kill.
//!
//! `soft_pins_survive_a_leader_kill_and_eviction_pressure`: one etcd, two masters (eviction
//! of soft-pinned objects not allowed), one storage node with a 64 MB segment, one store
//! client. `PINS` keys are put soft-pinned (1 h ttl); `KEPT` more are put the same way, then
//! upserted with another value and `SoftPinAction::Preserve` (the default action: keep the
//! pin the master holds), half one by one (in place when the size is the same, into new
//! buffers when not), half in one batch. The leader is SIGKILLed; once the standby leads, its
//! `master_soft_pin_key_count` must reach `PINS + KEPT` (the node re-reports each object with
//! the soft pin its writer recorded). Then plain objects are written until twice the segment
//! has gone through it, so eviction must run (`master_evicted_key_count` moves), and every
//! pinned key must still read back whole, with its last value, and still count as pinned.
//!
//! Before the soft-pin fix the re-report carried no soft pin: the new leader counted 0 and
//! evicted the pinned keys first (they are the least recently read). Before the upsert answer
//! carried the master's pin, the writer of a `PRESERVE` upsert recorded none: the new leader
//! counted `PINS` and evicted the `KEPT` keys.
//!
//! Every wait is bounded. Skips (passes, printing why) when Debian's etcd-server is not
//! installed.

use client::store::Src;
use std::time::Duration;

use client::Store;
use mooncake_tests::{master_metric, try_http, wait_until, Etcd, Master, Node};
use protocol::{ErrorCode, ReplicateConfig, SoftPinAction};

const PINS: usize = 16;
/// Keys pinned, then upserted with `PRESERVE`.
const KEPT: usize = 16;
const OBJECT_BYTES: usize = 1 << 20;
/// The node's segment; the plain writes put twice this through it.
const SEGMENT_MB: usize = 64;
/// Bound on an election after the kill, and on the re-reports reaching the new leader.
const LEADER_BOUND: Duration = Duration::from_secs(20);

fn value(i: usize, salt: u8) -> Vec<u8> {
    (0..OBJECT_BYTES)
        .map(|b| (b as u64).wrapping_mul(131).wrapping_add(i as u64) as u8 ^ salt)
        .collect()
}

/// The value `kept/{i}` is upserted with: odd keys change size (new buffers), even ones not
/// (rewritten in place).
fn kept_value(i: usize) -> Vec<u8> {
    let mut v = value(i, 0x33);
    if i % 2 == 1 {
        v.truncate(OBJECT_BYTES / 2);
    }
    v
}

fn leading(m: &Master) -> bool {
    try_http("GET", m.metrics_port, "/ha_status", b"").is_some_and(|r| r.text() == "leading")
}

fn metric(m: &Master, name: &str) -> u64 {
    master_metric(m, name).unwrap_or(0.0) as u64
}

/// Puts `key` (retrying while no leader serves or its recovery fence holds).
fn put(store: &Store, key: &str, v: &[u8], cfg: &ReplicateConfig) -> bool {
    wait_until(LEADER_BOUND, || store.put(key, v, cfg, true).is_ok()).is_some()
}

#[test]
fn soft_pins_survive_a_leader_kill_and_eviction_pressure() {
    let Some(etcd) = Etcd::start() else { return };
    let cluster = "ha_soft_pins";
    let flags = etcd.ha_master_flags(
        cluster,
        &[
            "--default_kv_lease_ttl=200",
            // Pinned objects are never evicted: pressure shows whether the new leader knows them.
            "--allow_evict_soft_pinned_objects=false",
        ],
    );
    let args: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut masters: Vec<Master> = (0..2).map(|_| Master::start(&args)).collect();
    wait_until(Duration::from_secs(10), || masters.iter().any(leading)).expect("no leader");
    let addr = format!("etcd://{}", etcd.addr());
    let env = [("MC_STORE_CLUSTER_ID", cluster)];
    let seg = format!("--global_segment_size={SEGMENT_MB} MB");
    let _node = Node::start_at(&addr, &addr, &["--shards=1", seg.as_str()], &env);
    std::env::set_var("MC_STORE_CLUSTER_ID", cluster);
    let store = mooncake_tests::remote_store(&addr, &addr, 16 << 20).expect("store setup");

    let pinned = ReplicateConfig {
        soft_pin_action: SoftPinAction::Enable,
        soft_pin_ttl_ms: Some(3_600_000),
        ..Default::default()
    };
    for i in 0..PINS {
        assert!(
            put(&store, &format!("pin/{i}"), &value(i, 0), &pinned),
            "pin/{i}"
        );
    }
    let kept_keys: Vec<String> = (0..KEPT).map(|i| format!("kept/{i}")).collect();
    for (i, key) in kept_keys.iter().enumerate() {
        assert!(put(&store, key, &value(i, 0), &pinned), "{key}");
    }
    // Upserted with PRESERVE: the first half one by one, the rest in one batch.
    let preserve = ReplicateConfig::default();
    assert_eq!(preserve.soft_pin_action, SoftPinAction::Preserve);
    let (single, batch) = kept_keys.split_at(KEPT / 2);
    for (i, key) in single.iter().enumerate() {
        assert!(put(&store, key, &kept_value(i), &preserve), "{key}");
    }
    let values: Vec<Vec<u8>> = (single.len()..KEPT).map(kept_value).collect();
    let parts: Vec<Vec<Src<'_>>> = values.iter().map(|v| vec![Src::from(v)]).collect();
    let upserted = wait_until(LEADER_BOUND, || {
        let r = store.put_many(batch, &parts, &preserve, true);
        r.iter().all(Result::is_ok)
    });
    assert!(upserted.is_some(), "the batch upsert with PRESERVE failed");
    let old = masters.iter().position(leading).expect("a leader");
    assert_eq!(
        metric(&masters[old], "master_soft_pin_key_count"),
        (PINS + KEPT) as u64,
        "PRESERVE kept the pins at the leader"
    );

    masters[old].signal_and_wait(libc::SIGKILL, Duration::from_secs(5));
    masters.remove(old);
    let new = &masters[0];
    wait_until(LEADER_BOUND, || leading(new)).expect("the standby never led");
    // The node re-mounts on its next ping and re-reports every object with its pin.
    let restored = wait_until(LEADER_BOUND, || {
        metric(new, "master_soft_pin_key_count") == (PINS + KEPT) as u64
    });
    assert!(
        restored.is_some(),
        "the new leader counts {} soft-pinned keys of {} (keys: {})",
        metric(new, "master_soft_pin_key_count"),
        PINS + KEPT,
        metric(new, "master_key_count"),
    );

    // Eviction pressure: twice the segment of plain objects, each read lease short.
    let plain = ReplicateConfig::default();
    let n = 2 * SEGMENT_MB * (1 << 20) / OBJECT_BYTES;
    let written = (0..n)
        .filter(|&i| put(&store, &format!("plain/{i}"), &value(i, 0x5a), &plain))
        .count();
    let evicted = metric(new, "master_evicted_key_count");
    println!("ha_soft_pins: {written} of {n} plain objects written, {evicted} keys evicted");
    assert!(evicted > 0, "no eviction ran: the pressure proves nothing");
    assert_eq!(
        written, n,
        "plain puts failed although plain objects were evictable"
    );
    let pins = (0..PINS).map(|i| (format!("pin/{i}"), value(i, 0)));
    let kept = (0..KEPT).map(|i| (kept_keys[i].clone(), kept_value(i)));
    for (key, want) in pins.chain(kept) {
        // Retried only while the store cannot answer (never for `OBJECT_NOT_FOUND`).
        let mut got = None;
        wait_until(LEADER_BOUND, || match store.get(&key) {
            Ok(bytes) => {
                got = Some(bytes);
                true
            }
            Err(e) => e == ErrorCode::ObjectNotFound,
        });
        assert!(got == Some(want), "{key} was evicted or torn");
    }
    assert_eq!(
        metric(new, "master_soft_pin_key_count"),
        (PINS + KEPT) as u64
    );
}
