//! The transfer engine with `protocol="rdma"` over the software verbs model (`SimVerbs`,
//! selected by `MOONCAKE_RDMA_SIM=<fabric dir>`), between two processes: the target is this
//! test binary re-executed with `MC_RDMA_CHILD` set. Also the protocol choice without a
//! device (TCP, counted; `MC_FORCE_TCP`; the clear error under `MC_REQUIRE_RDMA`).
//!
//! The tests set process environment variables: each takes `common::env_lock()`, so under
//! `cargo test` (threads of one process) they run one at a time.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use dataplane::engine::{EngineOptions, TransferEngine, TransferRequest, TransferStatus};
use dataplane::mem::{HugepagePolicy, Segment, SegmentOptions};
use dataplane::transport::header::Opcode;
use dataplane::TeError;

const BUF: usize = 4 << 20;

fn engine(protocol: &str) -> Result<TransferEngine, dataplane::engine::EngineError> {
    let e = TransferEngine::with_options(EngineOptions {
        transfer_timeout: Duration::from_secs(5),
        ..EngineOptions::default()
    });
    e.initialize("127.0.0.1:12345", "P2PHANDSHAKE", protocol, "")?;
    Ok(e)
}

fn buf(len: usize) -> Segment {
    let opts = SegmentOptions {
        hugepages: HugepagePolicy::Never,
        prefault: false,
    };
    Segment::new(len, opts).unwrap()
}

fn fill(seg: &Segment, seed: u8) {
    // SAFETY: the whole live mapping, between transfers.
    let s = unsafe { std::slice::from_raw_parts_mut(seg.as_ptr(), seg.len()) };
    for (i, x) in s.iter_mut().enumerate() {
        *x = (i as u8).wrapping_mul(13).wrapping_add(seed);
    }
}

fn bytes(seg: &Segment, off: usize, len: usize) -> Vec<u8> {
    // SAFETY: inside the live mapping (callers stay in bounds), between transfers.
    unsafe { std::slice::from_raw_parts(seg.as_ptr().add(off), len) }.to_vec()
}

fn wait_file(p: &Path) -> String {
    let t0 = Instant::now();
    loop {
        if let Ok(s) = std::fs::read_to_string(p) {
            if !s.is_empty() {
                return s;
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "timed out waiting for {p:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn fabric() -> PathBuf {
    dataplane::transport::rdma::sim::scratch_fabric("engine")
}

/// The target process of [`engine_rdma_sim_between_processes`]; a no-op unless re-executed.
#[test]
fn engine_rdma_child() {
    let _env = common::env_lock();
    let Ok(dir) = std::env::var("MC_RDMA_CHILD") else {
        return;
    };
    let dir = PathBuf::from(dir);
    let e = engine("rdma").unwrap();
    assert_eq!(e.rdma_verbs(), Some("sim"));
    let seg = buf(BUF);
    fill(&seg, 7);
    // SAFETY: `seg` outlives the engine (dropped after it at the end of this function).
    unsafe { e.register_memory(seg.addr() as u64, BUF as u64, "cpu:0") }.unwrap();
    let info = format!("{} {}", e.local_segment_name().unwrap(), seg.addr());
    std::fs::write(dir.join("child.tmp"), info).unwrap();
    std::fs::rename(dir.join("child.tmp"), dir.join("child.info")).unwrap();
    wait_file(&dir.join("parent.done"));
    // The parent wrote its pattern (seed 99) over [1 MiB, 2 MiB).
    let want: Vec<u8> = (0..1usize << 20)
        .map(|i| ((i + (1 << 20)) as u8).wrapping_mul(13).wrapping_add(99))
        .collect();
    assert!(
        bytes(&seg, 1 << 20, 1 << 20) == want,
        "the RDMA WRITE did not land"
    );
    std::fs::write(dir.join("child.ok"), "ok").unwrap();
    drop(e);
    drop(seg);
}

#[test]
fn engine_rdma_sim_between_processes() {
    let _env = common::env_lock();
    let dir = fabric();
    std::env::set_var("MOONCAKE_RDMA_SIM", &dir);
    std::env::remove_var("MC_FORCE_TCP");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "engine_rdma_child", "--nocapture"])
        .env("MC_RDMA_CHILD", &dir)
        .spawn()
        .unwrap();
    let info = wait_file(&dir.join("child.info"));
    let (peer, raddr) = info.split_once(' ').unwrap();
    let raddr: u64 = raddr.parse().unwrap();

    let e = engine("rdma").unwrap();
    assert_eq!(e.rdma_verbs(), Some("sim"));
    let local = buf(BUF);
    // SAFETY: `local` outlives the engine (dropped after it).
    unsafe { e.register_memory(local.addr() as u64, BUF as u64, "cpu:0") }.unwrap();
    let la = local.addr() as u64;
    assert_eq!(e.get_first_buffer_address(peer).unwrap(), raddr);

    // READ 1 MiB + 5 from the child: its pattern (seed 7).
    e.transfer_sync(peer, la, raddr, (1 << 20) + 5, Opcode::Read)
        .unwrap();
    let want: Vec<u8> = (0..(1usize << 20) + 5)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(7))
        .collect();
    assert!(bytes(&local, 0, want.len()) == want);

    // A batch of 8 asynchronous WRITEs of 128 KiB each: our pattern (seed 99) into
    // the child's [1 MiB, 2 MiB).
    fill(&local, 99);
    let h = e.open_segment(peer).unwrap();
    let batch = e.allocate_batch(8).unwrap();
    let reqs: Vec<TransferRequest> = (0..8u64)
        .map(|i| TransferRequest {
            opcode: Opcode::Write,
            source: la + (1 << 20) + i * (128 << 10),
            target: h,
            target_offset: raddr + (1 << 20) + i * (128 << 10),
            length: 128 << 10,
        })
        .collect();
    e.submit(batch, reqs).unwrap();
    assert_eq!(
        e.wait_batch(batch).unwrap().status,
        TransferStatus::Completed
    );
    e.free_batch(batch).unwrap();

    // Outside the child's registration: -3, nothing sent.
    let err = e
        .transfer_sync(peer, la, raddr + BUF as u64 - 8, 16, Opcode::Write)
        .unwrap_err();
    assert_eq!(err.code(), TeError::AddressNotRegistered);
    let t = e.rdma_transport().unwrap();
    let posted = t
        .stats()
        .wrs_posted
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        posted >= 16 + 16,
        "the bytes went over RDMA work requests: {posted}"
    );

    std::fs::write(dir.join("parent.done"), "done").unwrap();
    assert!(child.wait().unwrap().success());
    assert_eq!(std::fs::read_to_string(dir.join("child.ok")).unwrap(), "ok");

    // The peer is gone: a transfer fails promptly with an error, never hangs.
    let t0 = Instant::now();
    let err = e
        .transfer_sync(peer, la, raddr, 4096, Opcode::Read)
        .unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(10));
    assert!(
        matches!(err.code(), TeError::Endpoint | TeError::Metadata),
        "{err:?}"
    );
    drop(e);
    drop(local);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn rdma_without_a_device_runs_tcp_unless_mc_require_rdma() {
    let _env = common::env_lock();
    std::env::remove_var("MOONCAKE_RDMA_SIM");
    let real_devices = dataplane::transport::rdma::ibv::IbVerbs::load()
        .ok()
        .and_then(|v| {
            use dataplane::transport::rdma::verbs::Verbs;
            v.device_names().ok()
        })
        .is_some_and(|d| !d.is_empty());
    if !real_devices {
        std::env::remove_var("MC_FORCE_TCP");
        // As upstream: TCP, warned and counted.
        let before = dataplane::engine::rdma::tcp_fallbacks();
        let e = engine("rdma").expect("rdma without a device runs TCP");
        assert_eq!(e.rdma_verbs(), None);
        drop(e);
        // A device list naming a device that does not exist runs TCP the same way.
        let e = TransferEngine::new();
        e.initialize("127.0.0.1:1", "P2PHANDSHAKE", "rdma", "mlx5_404")
            .expect("a missing named device runs TCP");
        drop(e);
        assert_eq!(dataplane::engine::rdma::tcp_fallbacks(), before + 2);
        // MC_REQUIRE_RDMA: the clear error, naming the variable.
        std::env::set_var("MC_REQUIRE_RDMA", "1");
        let err = engine("rdma")
            .err()
            .expect("MC_REQUIRE_RDMA without a device must fail");
        assert_eq!(err.code(), TeError::DeviceNotFound);
        assert!(
            err.message().contains("MC_REQUIRE_RDMA"),
            "{}",
            err.message()
        );
        std::env::remove_var("MC_REQUIRE_RDMA");
        assert_eq!(dataplane::engine::rdma::tcp_fallbacks(), before + 2);
    }
    // MC_FORCE_TCP: rdma runs TCP, and transfers work.
    std::env::set_var("MC_FORCE_TCP", "1");
    let a = engine("rdma").unwrap();
    let b = engine("rdma").unwrap();
    assert_eq!(a.rdma_verbs(), None);
    let (sa, sb) = (buf(1 << 16), buf(1 << 16));
    fill(&sa, 3);
    // SAFETY: both segments outlive the engines (dropped after them).
    unsafe {
        a.register_memory(sa.addr() as u64, 1 << 16, "*").unwrap();
        b.register_memory(sb.addr() as u64, 1 << 16, "*").unwrap();
    }
    let nb = b.local_segment_name().unwrap();
    a.transfer_sync(
        &nb,
        sa.addr() as u64,
        sb.addr() as u64,
        1 << 16,
        Opcode::Write,
    )
    .unwrap();
    assert!(bytes(&sa, 0, 1 << 16) == bytes(&sb, 0, 1 << 16));
    drop((a, b));
    drop((sa, sb));
    std::env::remove_var("MC_FORCE_TCP");
}
