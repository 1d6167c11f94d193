//! Two transfer engines in P2PHANDSHAKE mode on loopback: no metadata store, each engine
//! answers for its own descriptor on its rpc port, and its segment is named `host:rpc_port`.

use std::time::Duration;

use dataplane::engine::{EngineOptions, TransferEngine, TransferRequest, TransferStatus};
use dataplane::mem::{HugepagePolicy, Segment, SegmentOptions};
use dataplane::transport::header::Opcode;
use dataplane::TeError;
use rand::{Rng, RngCore, SeedableRng};

fn p2p() -> TransferEngine {
    let e = TransferEngine::with_options(EngineOptions {
        transfer_timeout: Duration::from_secs(10),
        ..EngineOptions::default()
    });
    // The port in the given name is replaced by the rpc port.
    e.initialize("127.0.0.1:12345", "P2PHANDSHAKE", "tcp", "")
        .unwrap();
    e
}

/// A mapped buffer; Rust never holds a reference into it (see [`put`] and [`get`]).
fn buf(len: usize) -> Segment {
    let opts = SegmentOptions {
        hugepages: HugepagePolicy::Never,
        prefault: false,
    };
    Segment::new(len, opts).unwrap()
}

fn register(e: &TransferEngine, seg: &Segment) -> u64 {
    // SAFETY: every test drops its engines before the segments they registered.
    unsafe { e.register_memory(seg.addr() as u64, seg.len() as u64, "*") }.unwrap();
    seg.addr() as u64
}

/// Copies `data` into `seg` at `off` (only between transfers).
fn put(seg: &Segment, off: usize, data: &[u8]) {
    assert!(off + data.len() <= seg.len());
    // SAFETY: inside the live mapping, checked above.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), seg.as_ptr().add(off), data.len()) };
}

/// A copy of `len` bytes of `seg` at `off` (only between transfers).
fn get(seg: &Segment, off: usize, len: usize) -> Vec<u8> {
    assert!(off + len <= seg.len());
    let mut v = vec![0u8; len];
    // SAFETY: inside the live mapping, checked above.
    unsafe { std::ptr::copy_nonoverlapping(seg.as_ptr().add(off), v.as_mut_ptr(), len) };
    v
}

#[test]
fn engine_p2p_round_trips_batches_notify_probe() {
    let a = p2p();
    let b = p2p();
    let nb = b.local_segment_name().unwrap();
    assert_eq!(nb, format!("127.0.0.1:{}", b.rpc_port()));
    let local = buf(8 << 20);
    let remote = buf(8 << 20);
    let la = register(&a, &local);
    let rb = register(&b, &remote);
    assert_eq!(a.get_first_buffer_address(&nb).unwrap(), rb);

    let seed = rand::thread_rng().gen();
    println!("seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut pat = vec![0u8; 4 << 20];
    rng.fill_bytes(&mut pat);
    put(&local, 0, &pat);
    for _ in 0..50 {
        let len = rng.gen_range(1..=300_000usize);
        let off = rng.gen_range(0..=(4 << 20) - len);
        a.transfer_sync(
            &nb,
            la + off as u64,
            rb + off as u64,
            len as u64,
            Opcode::Write,
        )
        .unwrap();
        assert!(get(&remote, off, len) == pat[off..off + len]);
    }

    // An asynchronous batch of reads: the whole first half back into the second half.
    let h = a.open_segment(&nb).unwrap();
    let batch = a.allocate_batch(64).unwrap();
    let chunk = 64 << 10;
    let reqs: Vec<TransferRequest> = (0..64)
        .map(|i| TransferRequest {
            opcode: Opcode::Read,
            source: la + (4 << 20) + i * chunk,
            target: h,
            target_offset: rb + i * chunk,
            length: chunk,
        })
        .collect();
    a.submit(batch, reqs).unwrap();
    let r = a.wait_batch(batch).unwrap();
    assert_eq!(r.status, TransferStatus::Completed);
    assert_eq!(r.transferred_bytes, 64 * chunk);
    for i in 0..64 {
        assert_eq!(a.status(batch, i).unwrap(), TransferStatus::Completed);
    }
    a.free_batch(batch).unwrap();
    assert!(get(&local, 4 << 20, 4 << 20) == get(&remote, 0, 4 << 20));

    a.send_probe(&nb).unwrap();
    a.send_notify(&nb, "req-1", "done").unwrap();
    assert_eq!(
        b.get_notifies(),
        vec![("req-1".to_string(), "done".to_string())]
    );
    b.send_notify(&a.local_segment_name().unwrap(), "back", "")
        .unwrap();
    assert_eq!(a.get_notifies(), vec![("back".to_string(), String::new())]);
    drop(a);
    drop(b);
}

#[test]
fn engine_p2p_unknown_and_vanished_peers() {
    let a = p2p();
    let local = buf(4096);
    let la = register(&a, &local);
    // Nobody listens on this port: the peer is unknown.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let ghost = format!("127.0.0.1:{port}");
    assert_eq!(
        a.open_segment(&ghost).unwrap_err().code(),
        TeError::Metadata
    );
    assert_eq!(a.send_probe(&ghost).unwrap_err().code(), TeError::Metadata);
    assert_eq!(
        a.send_notify(&ghost, "x", "y").unwrap_err().code(),
        TeError::Metadata
    );
    assert_eq!(
        a.open_segment("no-port").unwrap_err().code(),
        TeError::Metadata
    );
    let e = a
        .transfer_sync(&ghost, la, 0, 1, Opcode::Write)
        .unwrap_err();
    assert_eq!(e.code(), TeError::Metadata);

    // A peer that goes away: the next transfer fails with a negative code, in time.
    let b = p2p();
    let nb = b.local_segment_name().unwrap();
    let remote = buf(4096);
    let rb = register(&b, &remote);
    a.transfer_sync(&nb, la, rb, 4096, Opcode::Write).unwrap();
    let h = a.open_segment(&nb).unwrap();
    drop(b);
    let started = std::time::Instant::now();
    let e = a
        .transfer_sync(&nb, la, rb, 4096, Opcode::Write)
        .unwrap_err();
    assert!(e.code().code() < 0, "{e}");
    let batch = a.allocate_batch(1).unwrap();
    let req = TransferRequest {
        opcode: Opcode::Read,
        source: la,
        target: h,
        target_offset: rb,
        length: 8,
    };
    a.submit(batch, vec![req]).unwrap();
    assert_eq!(a.wait_batch(batch).unwrap().status, TransferStatus::Failed);
    assert!(started.elapsed() < Duration::from_secs(10));
    a.free_batch(batch).unwrap();

    // The initiator stays usable.
    let c = p2p();
    let nc = c.local_segment_name().unwrap();
    let rc = register(&c, &remote);
    a.transfer_sync(&nc, la, rc, 4096, Opcode::Read).unwrap();
    drop(c);
}

/// A quick throughput and latency reading of `transfer_sync` on loopback (not a benchmark:
/// `bench/` owns those). Run with `cargo test --release -p mooncake-dataplane --test
/// engine_p2p -- --ignored --nocapture`.
#[test]
#[ignore]
fn engine_p2p_sync_speed_reading() {
    let a = p2p();
    let b = p2p();
    let nb = b.local_segment_name().unwrap();
    let local = buf(16 << 20);
    let remote = buf(16 << 20);
    let la = register(&a, &local);
    let rb = register(&b, &remote);
    let mut lat = Vec::new();
    for _ in 0..2000 {
        let t = std::time::Instant::now();
        a.transfer_sync(&nb, la, rb, 4096, Opcode::Write).unwrap();
        lat.push(t.elapsed());
    }
    lat.sort();
    println!(
        "4 KiB write p50 {:?} p99 {:?}",
        lat[lat.len() / 2],
        lat[lat.len() * 99 / 100]
    );
    for (len, iters) in [(64usize << 10, 2000), (1 << 20, 300), (16 << 20, 30)] {
        for op in [Opcode::Write, Opcode::Read] {
            let t = std::time::Instant::now();
            for _ in 0..iters {
                a.transfer_sync(&nb, la, rb, len as u64, op).unwrap();
            }
            let gbs = (len * iters) as f64 / t.elapsed().as_secs_f64() / 1e9;
            println!("{op:?} {} KiB: {gbs:.2} GB/s", len >> 10);
        }
    }
}
