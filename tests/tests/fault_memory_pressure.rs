//! Memory pressure: three times a node's capacity written through one store while readers
//! probe and read earlier keys.
//!
//! One `mooncake_client` node of 64 MiB, a master with default eviction settings (high
//! watermark 0.9, ratio 0.05), two writer threads putting 192 MiB in 256 KiB objects, two
//! reader threads alternating `is_exist` and `get` on random earlier keys. Checked: every put
//! returns `Ok` (eviction makes room), the node's RSS stays within its segment plus a bound,
//! the master's eviction metrics move, and every get returns either the exact bytes or a
//! clean `OBJECT_NOT_FOUND`, never other bytes.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mooncake_tests::{master_metric, rss_bytes, Master, Node};
use protocol::{ErrorCode, ReplicateConfig};

const SEGMENT_BYTES: u64 = 64 << 20;
const OBJECT_BYTES: usize = 256 << 10;
/// Three times the capacity.
const OBJECTS: usize = 3 * (SEGMENT_BYTES as usize) / OBJECT_BYTES;
const WRITERS: usize = 2;
const READERS: usize = 2;
/// The node's RSS may exceed its segment by this much (binary, heap, stacks, io_uring rings).
const RSS_OVERHEAD_MAX: u64 = 32 << 20;
/// The whole run must end well inside the 60 s budget of a fault test.
const RUN_MAX: Duration = Duration::from_secs(45);

/// Object `i`: its index in the first 8 bytes, then bytes that depend on `i` everywhere, so a
/// read of another object's (or a reused range's) bytes never compares equal.
fn value(i: usize) -> Vec<u8> {
    let mut v: Vec<u8> = (0..OBJECT_BYTES)
        .map(|k| {
            ((k as u64).wrapping_mul(0x9e37_79b9) ^ (i as u64).wrapping_mul(0x85eb_ca6b)) as u8
        })
        .collect();
    v[..8].copy_from_slice(&(i as u64).to_le_bytes());
    v
}

fn key(i: usize) -> String {
    format!("pressure/{i}")
}

#[derive(Default)]
struct ReadStats {
    probes: u64,
    probe_hits: u64,
    gets: u64,
    hits: u64,
    misses: u64,
    bad: Vec<String>,
}

#[test]
fn puts_keep_succeeding_through_eviction() {
    let t0 = Instant::now();
    let m = Master::start(&[]);
    let node = Node::start(&m, &["--global_segment_size=64 MB"]);
    let node_pid = node.child.id();
    let store = Arc::new(
        mooncake_tests::remote_store(&m.rpc_addr(), &m.metadata_url(), 16 << 20).expect("setup"),
    );
    let rss_start = rss_bytes(node_pid).expect("node RSS");

    let next = Arc::new(AtomicUsize::new(0));
    // Keys whose put returned: readers pick only among these (a key still in flight answers
    // `REPLICA_IS_NOT_READY`, which is right but not what this test probes).
    let done: Arc<Vec<AtomicBool>> =
        Arc::new((0..OBJECTS).map(|_| AtomicBool::new(false)).collect());
    let failed_puts = Arc::new(Mutex::new(Vec::<String>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(Mutex::new(ReadStats::default()));
    let mut writers = Vec::new();
    for _ in 0..WRITERS {
        let (store, next, done, failed) = (
            store.clone(),
            next.clone(),
            done.clone(),
            failed_puts.clone(),
        );
        writers.push(std::thread::spawn(move || loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= OBJECTS || t0.elapsed() > RUN_MAX {
                return;
            }
            match store.put(&key(i), &value(i), &ReplicateConfig::default(), false) {
                Ok(()) => done[i].store(true, Ordering::Release),
                Err(e) => failed.lock().unwrap().push(format!("{}: {e:?}", key(i))),
            }
        }));
    }
    let mut readers = Vec::new();
    for r in 0..READERS {
        let (store, next, done, stop, stats) = (
            store.clone(),
            next.clone(),
            done.clone(),
            stop.clone(),
            stats.clone(),
        );
        readers.push(std::thread::spawn(move || {
            let mut rng = 0x2545_f491_4f6c_dd1du64.wrapping_add(r as u64);
            let mut round = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let n = next.load(Ordering::Relaxed).min(OBJECTS);
                if n == 0 {
                    std::thread::yield_now();
                    continue;
                }
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let i = (rng % n as u64) as usize;
                if !done[i].load(Ordering::Acquire) {
                    continue;
                }
                round += 1;
                if round.is_multiple_of(2) {
                    let e = store.is_exist(&key(i));
                    let mut s = stats.lock().unwrap();
                    s.probes += 1;
                    match e {
                        Ok(true) => s.probe_hits += 1,
                        Ok(false) => {}
                        Err(e) => s.bad.push(format!("is_exist {}: {e:?}", key(i))),
                    }
                    continue;
                }
                let got = store.get(&key(i)).map_err(ErrorCode::from);
                let mut s = stats.lock().unwrap();
                s.gets += 1;
                match got {
                    Ok(b) if b == value(i) => s.hits += 1,
                    Ok(b) => s.bad.push(format!(
                        "{} read other bytes (object {} at its head)",
                        key(i),
                        u64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8]))
                    )),
                    Err(ErrorCode::ObjectNotFound) => s.misses += 1,
                    Err(e) => s.bad.push(format!("get {}: {e:?}", key(i))),
                }
            }
        }));
    }

    let mut rss_max = rss_start;
    while writers.iter().any(|w| !w.is_finished()) {
        rss_max = rss_max.max(rss_bytes(node_pid).expect("the node died"));
        std::thread::sleep(Duration::from_millis(50));
    }
    for w in writers {
        w.join().expect("writer panicked");
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().expect("reader panicked");
    }
    rss_max = rss_max.max(rss_bytes(node_pid).expect("the node died"));
    let write_time = t0.elapsed();

    // Whatever is still indexed reads back exactly; the rest is a clean miss. The master's
    // tick may still evict while this runs (a pass that read leases made futile during the
    // writes succeeds once they end), so a key probed present can be gone by its get: a
    // clean miss too, never other bytes.
    let keys: Vec<String> = (0..OBJECTS).map(key).collect();
    let exist = store.batch_is_exist(&keys);
    let mut live = 0;
    for (i, e) in exist.iter().enumerate() {
        if *e == Ok(true) {
            match store.get(&key(i)).map_err(ErrorCode::from) {
                Ok(b) => {
                    assert!(b == value(i), "{} read other bytes", key(i));
                    live += 1;
                }
                Err(ErrorCode::ObjectNotFound) => {}
                Err(e) => panic!("get {}: {e:?}", key(i)),
            }
        } else {
            assert_eq!(*e, Ok(false), "{}", key(i));
        }
    }
    let metric = |n: &str| master_metric(&m, n).unwrap_or(0.0) as u64;
    let evicted_keys = metric("master_evicted_key_count");
    let evictions = metric("master_successful_evictions_total");
    let attempts = metric("master_attempted_evictions_total");
    let allocated = metric("master_allocated_bytes");
    let failed_puts = failed_puts.lock().unwrap().clone();
    let s = stats.lock().unwrap();
    let issued = next.load(Ordering::Relaxed).min(OBJECTS);

    println!(
        "memory pressure: {issued} puts of {} KiB ({} MiB, {}x the {} MiB segment) in \
         {write_time:?}, {} failed; {evicted_keys} keys evicted in {evictions} passes \
         ({attempts} attempted); {live} keys live at the end ({} MiB allocated); readers: \
         {} probes ({} hits), {} gets ({} exact, {} clean misses, {} bad); node RSS {} MiB at \
         start, {} MiB at most (segment {} MiB + bound {} MiB)",
        OBJECT_BYTES >> 10,
        (issued * OBJECT_BYTES) >> 20,
        (issued * OBJECT_BYTES) as u64 / SEGMENT_BYTES,
        SEGMENT_BYTES >> 20,
        failed_puts.len(),
        allocated >> 20,
        s.probes,
        s.probe_hits,
        s.gets,
        s.hits,
        s.misses,
        s.bad.len(),
        rss_start >> 20,
        rss_max >> 20,
        SEGMENT_BYTES >> 20,
        RSS_OVERHEAD_MAX >> 20,
    );
    assert_eq!(issued, OBJECTS, "the writers ran out of time ({RUN_MAX:?})");
    assert!(failed_puts.is_empty(), "puts failed: {failed_puts:?}");
    assert!(s.bad.is_empty(), "bad reads: {:?}", s.bad);
    assert!(
        s.hits > 0 && s.misses > 0,
        "readers saw both hits and misses"
    );
    assert!(
        evicted_keys > 0 && evictions > 0,
        "eviction metrics did not move"
    );
    assert!(
        live > 0 && (live * OBJECT_BYTES) as u64 <= SEGMENT_BYTES,
        "{live} live keys"
    );
    assert!(
        rss_max <= SEGMENT_BYTES + RSS_OVERHEAD_MAX,
        "node RSS reached {} MiB",
        rss_max >> 20
    );
}
