//! Loopback benchmark of the one-sided TCP data plane: the blocking server, the io_uring
//! shard with plain `sendmsg`, and the io_uring shard with `IORING_OP_SENDMSG_ZC` for READ
//! payloads, side by side in the same run.
//!
//! For each backend, size (4 KiB, 64 KiB, 1 MiB, 16 MiB) and direction it runs two passes
//! against a fresh server on a registered 64 MiB segment:
//! - `lat`: one lane, one request at a time; p50/p99 of the request latency;
//! - `tput`: `--lanes` lanes, batches of `--batch` requests; GB/s (10^9 bytes/s) and the
//!   p50/p99 of one batch.
//!
//! Usage: `tcp_transport_bench [--secs S] [--lanes N] [--batch N] [--sizes 4096,65536]`

use std::sync::Arc;
use std::time::{Duration, Instant};

use dataplane::mem::{HugepagePolicy, Segment, SegmentOptions};
use dataplane::transport::client::{ClientConfig, TcpClient, TransferOp};
use dataplane::transport::server::{ServedMemory, ServerConfig, TcpServer};
use dataplane::transport::uring;
use dataplane::transport::uring_server::{ShardOptions, UringServer};
use hdrhistogram::Histogram;

const SEGMENT_BYTES: usize = 64 << 20;

#[derive(Clone, Copy, PartialEq)]
enum Backend {
    Blocking,
    Uring,
    UringZc,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Blocking => "blocking",
            Backend::Uring => "uring",
            Backend::UringZc => "uring+zc",
        }
    }
}

enum Running {
    Blocking(TcpServer),
    Uring(UringServer),
}

impl Running {
    fn addr(&self) -> std::net::SocketAddr {
        match self {
            Running::Blocking(s) => s.local_addr(),
            Running::Uring(s) => s.local_addr(),
        }
    }
}

struct Args {
    secs: f64,
    lanes: usize,
    batch: usize,
    sizes: Vec<usize>,
}

fn parse_args() -> Args {
    let mut args = Args {
        secs: 1.0,
        lanes: 4,
        batch: 16,
        sizes: vec![4 << 10, 64 << 10, 1 << 20, 16 << 20],
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_default();
        match flag.as_str() {
            "--secs" => args.secs = value.parse().expect("--secs"),
            "--lanes" => args.lanes = value.parse().expect("--lanes"),
            "--batch" => args.batch = value.parse().expect("--batch"),
            "--sizes" => {
                args.sizes = value
                    .split(',')
                    .map(|v| v.parse().expect("--sizes"))
                    .collect()
            }
            other => panic!("unknown flag {other}"),
        }
    }
    args
}

fn start(backend: Backend, memory: Arc<ServedMemory>) -> Running {
    let addr = "127.0.0.1:0".parse().unwrap();
    let config = ServerConfig::default();
    match backend {
        Backend::Blocking => Running::Blocking(TcpServer::bind(addr, memory, config).unwrap()),
        Backend::Uring | Backend::UringZc => {
            let options = ShardOptions {
                send_zc_min_bytes: if backend == Backend::UringZc {
                    0
                } else {
                    u64::MAX
                },
                ..Default::default()
            };
            Running::Uring(UringServer::bind_with(addr, memory, config, options).unwrap())
        }
    }
}

fn human(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 => format!("{}MiB", b >> 20),
        b if b >= 1 << 10 => format!("{}KiB", b >> 10),
        b => format!("{b}B"),
    }
}

/// Runs `op` until `secs` pass; returns (requests done, histogram of op latency in ns).
fn timed(secs: f64, mut op: impl FnMut() -> usize) -> (usize, Duration, Histogram<u64>) {
    let mut hist = Histogram::<u64>::new(3).unwrap();
    let deadline = Duration::from_secs_f64(secs);
    let started = Instant::now();
    let mut done = 0;
    while started.elapsed() < deadline {
        let t = Instant::now();
        done += op();
        let _ = hist.record(t.elapsed().as_nanos() as u64);
    }
    (done, started.elapsed(), hist)
}

fn report(
    backend: Backend,
    pass: &str,
    write: bool,
    size: usize,
    n: usize,
    t: Duration,
    h: &Histogram<u64>,
) {
    let gbps = (n * size) as f64 / t.as_secs_f64() / 1e9;
    println!(
        "{:<9} {:<5} {:<5} {:>6} {:>8.2} GB/s  p50 {:>9.1} us  p99 {:>9.1} us  ({n} requests)",
        backend.name(),
        pass,
        if write { "write" } else { "read" },
        human(size),
        gbps,
        h.value_at_quantile(0.5) as f64 / 1e3,
        h.value_at_quantile(0.99) as f64 / 1e3,
    );
}

fn run_case(args: &Args, backend: Backend, base: u64, addr: std::net::SocketAddr, size: usize) {
    let slots = (SEGMENT_BYTES / size).max(1);
    for write in [false, true] {
        let mut buf = vec![0xA5u8; size];
        let lat_client = TcpClient::connect(
            addr,
            ClientConfig {
                lanes: 1,
                ..Default::default()
            },
        )
        .unwrap();
        let mut i = 0usize;
        let (n, t, h) = timed(args.secs, || {
            let remote = base + ((i % slots) * size) as u64;
            i += 1;
            if write {
                lat_client.write(remote, &buf).unwrap();
            } else {
                lat_client.read(remote, &mut buf).unwrap();
            }
            1
        });
        report(backend, "lat", write, size, n, t, &h);

        let client = TcpClient::connect(
            addr,
            ClientConfig {
                lanes: args.lanes,
                ..Default::default()
            },
        )
        .unwrap();
        let batch = args.batch.min(slots).max(1);
        let mut bufs: Vec<Vec<u8>> = (0..batch).map(|_| vec![0x5Au8; size]).collect();
        let (n, t, h) = timed(args.secs, || {
            let mut ops: Vec<TransferOp<'_>> = bufs
                .iter_mut()
                .enumerate()
                .map(|(k, b)| {
                    let remote_addr = base + ((k % slots) * size) as u64;
                    if write {
                        TransferOp::Write {
                            remote_addr,
                            src: b,
                        }
                    } else {
                        TransferOp::Read {
                            remote_addr,
                            dst: b,
                        }
                    }
                })
                .collect();
            let results = client.submit(&mut ops);
            assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
            batch
        });
        report(backend, "tput", write, size, n, t, &h);
    }
}

fn main() {
    let args = parse_args();
    let segment = Arc::new(
        Segment::new(
            SEGMENT_BYTES,
            SegmentOptions {
                hugepages: HugepagePolicy::from_env(),
                prefault: true,
            },
        )
        .expect("segment"),
    );
    let memory = ServedMemory::new();
    memory.register_segment(segment.clone()).unwrap();
    let base = segment.addr() as u64;
    let mut backends = vec![Backend::Blocking];
    let status = uring::probe_kernel();
    if status.is_available() {
        backends.extend([Backend::Uring, Backend::UringZc]);
    } else {
        println!("# io_uring unavailable ({status}); blocking only");
    }
    println!(
        "# tcp_transport_bench: {}s per pass, tput = {} lanes x batch {}; lat = 1 lane, 1 request",
        args.secs, args.lanes, args.batch
    );
    for &size in &args.sizes {
        for &backend in &backends {
            let server = start(backend, memory.clone());
            run_case(&args, backend, base, server.addr(), size);
            if let Running::Uring(s) = &server {
                let stats = s.stats();
                println!(
                    "#   {} stalls {} / {} iterations, longest {} us, zero-copy bytes {}",
                    backend.name(),
                    stats.loop_stalls.load(std::sync::atomic::Ordering::Relaxed),
                    stats
                        .loop_iterations
                        .load(std::sync::atomic::Ordering::Relaxed),
                    stats
                        .loop_stall_max_us
                        .load(std::sync::atomic::Ordering::Relaxed),
                    s.zero_copy_bytes()
                );
            }
        }
    }
    drop(memory);
}
