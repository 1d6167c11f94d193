//! A storage node SIGKILLed in the middle of a put/get workload with `replica_num = 2`.
//!
//! Three `mooncake_client` nodes, a master with `--client_ttl=2`, one `Store` without a
//! segment of its own driven by writer and reader threads; node 0 is killed mid-workload.
//! Checked: every key whose put returned `Ok` reads back byte for byte (from the surviving
//! replica), no read takes longer than `MC_TRANSFER_TIMEOUT`, the master stops listing the
//! dead node's segment within `client_ttl` (+ slack), and every put started after that
//! succeeds on the two nodes left.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mooncake_tests::{master_segments, wait_until, Master, Node};
use protocol::ReplicateConfig;

const CLIENT_TTL_S: u64 = 2;
/// `MC_TRANSFER_TIMEOUT` given to the store (seconds): the bound on every read.
const TRANSFER_TIMEOUT_S: u64 = 2;
/// Slack on top of `client_ttl` for the master to drop the dead node (tick, last ping).
const DROP_SLACK: Duration = Duration::from_secs(2);
const WRITERS: usize = 3;
const READERS: usize = 2;
/// Workload before the kill, and after the dead node was dropped.
const BEFORE_KILL: Duration = Duration::from_millis(1500);
const AFTER_DROP: Duration = Duration::from_secs(2);
/// Each writer starts at most one put per interval: about 40 puts (14 MiB) a second in all, so
/// even a fast build stays under the two surviving nodes' eviction watermark and no
/// acknowledged key is evicted (which would count as lost).
const PUT_INTERVAL: Duration = Duration::from_millis(70);
/// Object sizes cycled by the writers: one slice, a few slices, tiny.
const SIZES: [usize; 4] = [4096, 64 << 10, 300 << 10, (1 << 20) + 4096];

/// The shared log, whose lock a panicking thread must not take down with it.
#[derive(Default)]
struct Shared<T>(Mutex<T>);

impl<T> Shared<T> {
    fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        f(&mut self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

fn value(writer: usize, n: usize) -> Vec<u8> {
    let len = SIZES[n % SIZES.len()];
    let seed = (writer * 7919 + n) as u32;
    (0..len)
        .map(|i| ((i as u32).wrapping_mul(2_654_435_761) ^ seed.wrapping_mul(40_503)) as u8)
        .collect()
}

fn key(writer: usize, n: usize) -> String {
    format!("nodekill/w{writer}-{n}")
}

struct PutRecord {
    started: Instant,
    took: Duration,
    ok: bool,
}

#[derive(Default)]
struct Log {
    /// Keys whose put returned `Ok`: (writer, n).
    acked: Vec<(usize, usize)>,
    puts: Vec<PutRecord>,
    /// Reads of acknowledged keys during the workload: count, slowest, failures.
    reads: u64,
    slowest_read: Duration,
    read_failures: Vec<String>,
}

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

#[test]
fn replicas_survive_a_node_killed_mid_workload() {
    // Read by `Store::setup`; set before any thread of this test binary starts.
    std::env::set_var("MC_TRANSFER_TIMEOUT", TRANSFER_TIMEOUT_S.to_string());
    let transfer_timeout = Duration::from_secs(TRANSFER_TIMEOUT_S);
    let ttl = format!("--client_ttl={CLIENT_TTL_S}");
    let m = Master::start(&[&ttl]);
    let mut nodes: Vec<Node> = (0..3)
        .map(|_| Node::start(&m, &["--global_segment_size=128 MB"]))
        .collect();
    let store = Arc::new(
        mooncake_tests::remote_store(&m.rpc_addr(), &m.metadata_url(), 64 << 20).expect("setup"),
    );
    let dead_segments: HashSet<String> = nodes[0].segments.iter().map(|s| s.name.clone()).collect();
    assert!(!dead_segments.is_empty());
    assert_eq!(master_segments(&m).len(), 3);

    let log = Arc::new(Shared::<Log>::default());
    let stop = Arc::new(AtomicBool::new(false));
    let two = ReplicateConfig {
        replica_num: 2,
        ..Default::default()
    };
    let mut threads = Vec::new();
    for w in 0..WRITERS {
        let (store, log, stop, cfg) = (store.clone(), log.clone(), stop.clone(), two.clone());
        threads.push(std::thread::spawn(move || {
            let mut n = 0;
            let t0 = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                let due = t0 + PUT_INTERVAL * n as u32;
                std::thread::sleep(due.saturating_duration_since(Instant::now()));
                let v = value(w, n);
                let started = Instant::now();
                let ok = store.put(&key(w, n), &v, &cfg, false).is_ok();
                let took = started.elapsed();
                log.with(|l| {
                    l.puts.push(PutRecord { started, took, ok });
                    if ok {
                        l.acked.push((w, n));
                    }
                });
                n += 1;
            }
        }));
    }
    for r in 0..READERS {
        let (store, log, stop) = (store.clone(), log.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (r as u64 + 1);
            while !stop.load(Ordering::Relaxed) {
                let pick = log.with(|l| {
                    (!l.acked.is_empty())
                        .then(|| l.acked[(xorshift(&mut rng) % l.acked.len() as u64) as usize])
                });
                let Some((w, n)) = pick else {
                    std::thread::yield_now();
                    continue;
                };
                let t0 = Instant::now();
                let got = store.get(&key(w, n));
                let took = t0.elapsed();
                log.with(|l| {
                    l.reads += 1;
                    l.slowest_read = l.slowest_read.max(took);
                    match got {
                        Ok(b) if b == value(w, n) => {}
                        Ok(_) => l.read_failures.push(format!("{}: other bytes", key(w, n))),
                        Err(e) => l.read_failures.push(format!("{}: {e:?}", key(w, n))),
                    }
                });
            }
        }));
    }

    std::thread::sleep(BEFORE_KILL);
    let acked_at_kill = log.with(|l| l.acked.len());
    let t_kill = Instant::now();
    assert!(
        nodes[0]
            .signal_and_wait(libc::SIGKILL, Duration::from_secs(5))
            .is_some(),
        "node 0 did not die"
    );
    let drop_bound = Duration::from_secs(CLIENT_TTL_S) + DROP_SLACK;
    let dropped_in = wait_until(drop_bound + Duration::from_secs(5), || {
        master_segments(&m)
            .iter()
            .all(|s| !dead_segments.contains(s))
    });
    let t_dropped = Instant::now();
    std::thread::sleep(AFTER_DROP);
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().expect("workload thread panicked");
    }
    let dropped_in = dropped_in.expect("the master never dropped the dead node's segment");

    // Every acknowledged key, read back after the dust settled.
    let (acked, puts, reads, slowest_workload_read, read_failures) = log.with(|l| {
        (
            std::mem::take(&mut l.acked),
            std::mem::take(&mut l.puts),
            l.reads,
            l.slowest_read,
            std::mem::take(&mut l.read_failures),
        )
    });
    let mut lost = Vec::new();
    let mut slowest_final_read = Duration::ZERO;
    let mut on_dead = 0;
    for &(w, n) in &acked {
        let t0 = Instant::now();
        match store.get(&key(w, n)) {
            Ok(b) if b == value(w, n) => {}
            Ok(_) => lost.push(format!("{}: other bytes", key(w, n))),
            Err(e) => lost.push(format!("{}: {e:?}", key(w, n))),
        }
        slowest_final_read = slowest_final_read.max(t0.elapsed());
        if let Ok(list) = store.replicas(&key(w, n)) {
            on_dead += list
                .replicas
                .iter()
                .filter(|r| dead_segments.contains(&r.segment_name))
                .count();
        }
    }
    let failed_puts = puts.iter().filter(|p| !p.ok).count();
    let after_drop: Vec<&PutRecord> = puts.iter().filter(|p| p.started >= t_dropped).collect();
    let failed_after_drop = after_drop.iter().filter(|p| !p.ok).count();
    let slowest_put = puts.iter().map(|p| p.took).max().unwrap_or_default();
    let bytes: usize = acked.iter().map(|&(w, n)| value(w, n).len()).sum();

    println!(
        "node kill: {} keys written ({} MiB, 2 replicas; {acked_at_kill} before the kill), \
         {} keys lost; {} puts failed ({} of {} started after the drop); dead node's segment \
         dropped {dropped_in:?} after SIGKILL (client_ttl {CLIENT_TTL_S} s); {reads} reads \
         during the workload, {} failed, slowest {slowest_workload_read:?}; slowest read \
         afterwards {slowest_final_read:?}, slowest put {slowest_put:?} \
         (MC_TRANSFER_TIMEOUT={TRANSFER_TIMEOUT_S} s); replicas still naming the dead \
         segment {on_dead}; kill-to-end {:?}",
        acked.len(),
        bytes >> 20,
        lost.len(),
        failed_puts,
        failed_after_drop,
        after_drop.len(),
        read_failures.len(),
        t_kill.elapsed(),
    );
    assert!(lost.is_empty(), "acknowledged keys lost: {lost:?}");
    assert!(
        read_failures.is_empty(),
        "reads of acknowledged keys failed during the workload: {read_failures:?}"
    );
    assert!(
        dropped_in <= drop_bound,
        "dead node dropped after {dropped_in:?}, bound {drop_bound:?}"
    );
    assert_eq!(on_dead, 0, "replicas on the dead segment are still listed");
    assert!(
        !after_drop.is_empty(),
        "no put started after the drop to check"
    );
    assert_eq!(
        failed_after_drop, 0,
        "puts started after the dead node was dropped must succeed"
    );
    assert!(
        slowest_workload_read < transfer_timeout && slowest_final_read < transfer_timeout,
        "a read took {:?} (MC_TRANSFER_TIMEOUT {transfer_timeout:?})",
        slowest_workload_read.max(slowest_final_read)
    );
    assert!(acked_at_kill > 0 && acked.len() > acked_at_kill);
}
