//! Versions and tombstones (`docs/ha.md`): across leader failovers, a read returns
//! the value of the last acknowledged write of its key, or nothing after an acknowledged remove.
//!
//! `hot_keys_keep_their_last_acknowledged_write_across_failovers`: one etcd, three masters,
//! three storage nodes, one store client with three worker threads doing a seeded random mix
//! of upsert (sizes changing, so values move), remove, get and is_exist on 60 hot keys with
//! `replica_num = 2`. Each round the workload runs 4-6 s, the leader is SIGKILLed in the middle
//! of it, the workers stop, a fresh standby starts a second later; once a new leader serves
//! and a quiet pause has passed, every key is read once and compared with what the whole
//! history so far allows (so stale entries that survive several failovers are caught too):
//!
//! - every operation is logged with its start, its end and whether it was acknowledged;
//! - an operation is *superseded* when an acknowledged operation on the same key started after
//!   it ended (the later one is ordered after it by every master, and versions only grow);
//! - the final value must be the effect (a value, or nothing for a remove) of an operation
//!   that is not superseded. Failed operations count too: a write whose acknowledgement was
//!   lost in a failover may have taken effect, and nothing says it did not; only removes the
//!   master refused (`OBJECT_HAS_LEASE`, `REPLICA_IS_NOT_READY`) are known to have done nothing
//!   and are left out.
//!
//! Bounded: `MC_HA_KILLS` kills (default 4), at most `OPS_MAX` operations, every wait capped.
//! Seeded: `MC_HA_SEED` (default 20); the seed is printed first and in every failure message.
//! Skips (passes, printing why) when Debian's etcd-server is not installed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use client::Store;
use mooncake_tests::{env_or, try_http, wait_until, Etcd, Master, Node, Rng};
use protocol::{ErrorCode, ReplicateConfig};

const KEYS: usize = 60;
const WORKERS: usize = 3;
/// Upper bound on operations, whatever the machine's speed.
const OPS_MAX: usize = 200_000;
const KILLS_DEFAULT: usize = 4;
const SEED_DEFAULT: u64 = 20;
/// Bound on the wait for a leader after a kill (the failover itself takes about 2.5 s).
const LEADER_BOUND: Duration = Duration::from_secs(20);
/// Quiet time after an election before the keys are read: the owners' re-reports (one ping
/// interval) and the recovery fence (2 s), with margin.
const SETTLE: Duration = Duration::from_secs(3);
/// Bound on the final reads settling (no `UNAVAILABLE` or transfer errors).
const SETTLE_BOUND: Duration = Duration::from_secs(30);

/// What an operation would leave in its key: a write's id, or nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Effect {
    Value(u64),
    Gone,
}

#[derive(Clone, Copy, Debug)]
struct Op {
    key: usize,
    effect: Effect,
    start: Instant,
    end: Instant,
    acked: bool,
    /// The error code when not acknowledged.
    error: i32,
}

/// The bytes of write `id` to key `key`: `id` and `key` first, so a read says which write it
/// returned; sizes vary so that upserts move values to new ranges.
fn value(key: usize, id: u64) -> Vec<u8> {
    let len = [4096usize, 12_288, 30_000 + (id % 977) as usize][(id % 3) as usize];
    let mut v: Vec<u8> = (0..len)
        .map(|i| (i as u64).wrapping_mul(131).wrapping_add(id) as u8)
        .collect();
    v[..8].copy_from_slice(&id.to_le_bytes());
    v[8..16].copy_from_slice(&(key as u64).to_le_bytes());
    v
}

fn ha_status(m: &Master) -> String {
    try_http("GET", m.metrics_port, "/ha_status", b"")
        .map(|r| r.text())
        .unwrap_or_default()
}

fn serving(masters: &[Master]) -> Option<usize> {
    (0..masters.len()).find(|&i| ha_status(&masters[i]) == "leading")
}

/// One worker: random operations on random hot keys until `stop`.
fn worker(
    store: &Store,
    seed: u64,
    w: usize,
    stop: &AtomicBool,
    next_id: &AtomicUsize,
    log: &Mutex<Vec<Op>>,
) {
    let mut rng = Rng::new(seed ^ ((w as u64 + 1) << 32));
    let cfg = ReplicateConfig {
        replica_num: 2,
        ..Default::default()
    };
    while !stop.load(Ordering::Relaxed) {
        let key = rng.below(KEYS as u64) as usize;
        let name = format!("hot/{key}");
        let dice = rng.below(100);
        let start = Instant::now();
        let (effect, r) = if dice < 50 {
            let id = next_id.fetch_add(1, Ordering::Relaxed) as u64;
            if id as usize >= OPS_MAX {
                break;
            }
            let r = store
                .put(&name, &value(key, id), &cfg, true)
                .map_err(ErrorCode::from);
            (Some(Effect::Value(id)), r)
        } else if dice < 70 {
            let r = store
                .remove(&name, rng.below(2) == 0)
                .map_err(ErrorCode::from);
            (Some(Effect::Gone), r)
        } else if dice < 90 {
            // Reads grant leases, which make some upserts park the old buffers and some
            // non-forced removes fail: both paths are part of the mix.
            (None, store.get(&name).map(|_| ()).map_err(ErrorCode::from))
        } else {
            (
                None,
                store.is_exist(&name).map(|_| ()).map_err(ErrorCode::from),
            )
        };
        let end = Instant::now();
        // A remove the serving master refused for a lease or an in-flight put changed
        // nothing: it is not a possible outcome.
        let refused = matches!(
            r,
            Err(ErrorCode::ObjectHasLease | ErrorCode::ReplicaIsNotReady)
        ) && effect == Some(Effect::Gone);
        if let (Some(effect), false) = (effect, refused) {
            log.lock().unwrap().push(Op {
                key,
                effect,
                start,
                end,
                acked: r.is_ok(),
                error: r.err().map_or(0, |e| e.code()),
            });
        }
        if r.is_err() {
            // Not a busy loop while no leader serves.
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// The effects the final read of `key` may show (see the module docs).
fn allowed(ops: &[Op]) -> Vec<Effect> {
    let mut out: Vec<Effect> = ops
        .iter()
        .filter(|o| !ops.iter().any(|a| a.acked && a.start > o.end))
        .map(|o| o.effect)
        .collect();
    if ops.is_empty() {
        out.push(Effect::Gone);
    }
    out
}

/// Reads every hot key once it answers without an error other than `OBJECT_NOT_FOUND` (the
/// new leader's recovery fence answers `UNAVAILABLE` meanwhile); checks the bytes are whole.
fn read_all(store: &Store, seed: u64) -> HashMap<usize, Effect> {
    let mut finals: HashMap<usize, Effect> = HashMap::new();
    let t0 = Instant::now();
    while finals.len() < KEYS && t0.elapsed() < SETTLE_BOUND {
        for key in 0..KEYS {
            if finals.contains_key(&key) {
                continue;
            }
            match store.get(&format!("hot/{key}")).map_err(ErrorCode::from) {
                Ok(bytes) => {
                    let mut id = [0u8; 8];
                    id.copy_from_slice(&bytes[..8]);
                    let id = u64::from_le_bytes(id);
                    assert_eq!(
                        bytes,
                        value(key, id),
                        "seed {seed}: hot/{key} holds torn or foreign bytes"
                    );
                    finals.insert(key, Effect::Value(id));
                }
                Err(ErrorCode::ObjectNotFound) => {
                    finals.insert(key, Effect::Gone);
                }
                Err(_) => {}
            }
        }
        if finals.len() < KEYS {
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    assert_eq!(
        finals.len(),
        KEYS,
        "seed {seed}: some keys never read back without an error"
    );
    finals
}

#[test]
fn hot_keys_keep_their_last_acknowledged_write_across_failovers() {
    let seed: u64 = env_or("MC_HA_SEED", SEED_DEFAULT);
    let kills: usize = env_or("MC_HA_KILLS", KILLS_DEFAULT);
    println!("ha_versions: seed {seed} (MC_HA_SEED), {kills} kills (MC_HA_KILLS)");
    let Some(etcd) = Etcd::start() else { return };
    let cluster = "ha_versions";
    // Short read leases: removes and in-place upserts are not blocked for long.
    let flags = etcd.ha_master_flags(cluster, &["--default_kv_lease_ttl=500"]);
    let args: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut masters: Vec<Master> = (0..3).map(|_| Master::start(&args)).collect();
    wait_until(Duration::from_secs(10), || serving(&masters).is_some())
        .unwrap_or_else(|| panic!("seed {seed}: no master elected"));
    let addr = format!("etcd://{}", etcd.addr());
    let env = [("MC_STORE_CLUSTER_ID", cluster)];
    let node_flags = ["--shards=1", "--global_segment_size=256 MB"];
    let _nodes: Vec<Node> = (0..3)
        .map(|_| Node::start_at(&addr, &addr, &node_flags, &env))
        .collect();
    std::env::set_var("MC_STORE_CLUSTER_ID", cluster);
    let store = Arc::new(
        mooncake_tests::remote_store(&addr, &addr, 64 << 20).expect("store setup through etcd"),
    );
    // Every node mounted before the workload starts (replica_num = 2 needs two).
    let cfg = ReplicateConfig {
        replica_num: 2,
        ..Default::default()
    };
    wait_until(Duration::from_secs(20), || {
        store.put("warm-up", &value(0, 0), &cfg, true).is_ok()
    })
    .unwrap_or_else(|| panic!("seed {seed}: no put succeeded before the workload"));

    let next_id = Arc::new(AtomicUsize::new(1));
    let log: Arc<Mutex<Vec<Op>>> = Arc::default();
    let mut rng = Rng::new(seed);
    let mut wrong: Vec<(usize, usize, Effect, Vec<Effect>)> = Vec::new();
    let mut checked = 0;
    for round in 0..kills {
        // Work for 4-6 s, kill the leader in the middle of it, stop the work.
        let stop = Arc::new(AtomicBool::new(false));
        let workers: Vec<_> = (0..WORKERS)
            .map(|w| {
                let (store, stop, next_id, log) =
                    (store.clone(), stop.clone(), next_id.clone(), log.clone());
                let seed = seed ^ ((round as u64 + 1) << 40);
                std::thread::spawn(move || worker(&store, seed, w, &stop, &next_id, &log))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(4000 + rng.below(2000)));
        let Some(leader) = serving(&masters) else {
            panic!("seed {seed}: round {round}: no leader before the kill");
        };
        masters[leader].signal_and_wait(libc::SIGKILL, Duration::from_secs(5));
        masters.remove(leader);
        stop.store(true, Ordering::Relaxed);
        for w in workers {
            w.join().expect("worker thread");
        }
        std::thread::sleep(Duration::from_secs(1));
        masters.push(Master::start(&args));
        wait_until(LEADER_BOUND, || serving(&masters).is_some())
            .unwrap_or_else(|| panic!("seed {seed}: round {round}: no new leader"));
        // Quiet: past the owners' re-reports (a ping interval) and the recovery fence, every
        // key read once from the new leader and checked against the whole history.
        std::thread::sleep(SETTLE);
        let finals = read_all(&store, seed);
        let ops = log.lock().unwrap().clone();
        let mut by_key: HashMap<usize, Vec<Op>> = HashMap::new();
        for o in &ops {
            by_key.entry(o.key).or_default().push(*o);
        }
        for key in 0..KEYS {
            let history = by_key.get(&key).map(Vec::as_slice).unwrap_or(&[]);
            let ok = allowed(history);
            if !ok.contains(&finals[&key]) {
                wrong.push((round, key, finals[&key], ok));
            }
        }
        checked += KEYS;
        println!(
            "round {round}: {} operations so far, {} keys wrong so far",
            ops.len(),
            wrong.len()
        );
    }
    let ops = log.lock().unwrap().clone();
    let acked = |gone: bool| {
        ops.iter()
            .filter(|o| o.acked && (o.effect == Effect::Gone) == gone)
            .count()
    };
    let mut failed: std::collections::BTreeMap<(&str, i32), usize> = Default::default();
    for o in ops.iter().filter(|o| !o.acked) {
        let kind = if o.effect == Effect::Gone {
            "remove"
        } else {
            "upsert"
        };
        *failed.entry((kind, o.error)).or_default() += 1;
    }
    println!(
        "ha_versions figures: seed {seed}, {kills} failovers, {} upserts and {} removes \
         acknowledged, {} failed {failed:?}, {checked} key reads checked after failovers \
         ({KEYS} keys), {} wrong",
        acked(false),
        acked(true),
        ops.iter().filter(|o| !o.acked).count(),
        wrong.len()
    );
    for (round, key, got, ok) in wrong.iter().take(5) {
        println!("  round {round}: hot/{key} read {got:?}, history allows {ok:?}");
    }
    assert!(
        wrong.is_empty(),
        "seed {seed}: {} of {checked} key reads after a failover returned what the history \
         does not allow, e.g. round {} hot/{} read {:?}, allowed {:?}",
        wrong.len(),
        wrong[0].0,
        wrong[0].1,
        wrong[0].2,
        wrong[0].3
    );
}
