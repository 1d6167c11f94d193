//! Loopback benchmark of the one-sided TCP data plane against the physical limit, in the same
//! run: a plain loopback TCP stream (a thread pair over one socket), the blocking server, the
//! io_uring shard with plain `sendmsg`, and the io_uring shard with `IORING_OP_SENDMSG_ZC`
//! for READ payloads.
//!
//! For each size and direction it runs two passes:
//! - `lat`: one lane, one request at a time; p50/p99 of the request latency. The plain
//!   stream does the same exchange by hand: READ = a 32-byte request answered by `size`
//!   bytes, WRITE = `size` bytes answered by a 24-byte ack.
//! - `tput`: `--lanes` lanes, batches of `--batch` requests; GB/s (10^9 bytes/s) and the
//!   p50/p99 of one batch. The plain stream is one thread writing `size`-byte blocks and one
//!   reading them; its p50/p99 are those of `--batch` blocks arriving at the reader.
//!
//! Each measurement runs `--runs` times; the run with the median GB/s is printed, with the
//! GB/s range over all runs. `% plain` compares with the plain stream's median of the same
//! size, direction and pass.
//!
//! Usage: `tcp_transport_bench [--secs S] [--runs R] [--lanes N] [--batch N]
//! [--sizes 4096,65536] [--backends plain,blocking,uring,uring+zc]`

use dataplane::mem::{Dst, Src};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dataplane::mem::served::{ServedMemory, ServerConfig};
use dataplane::mem::{HugepagePolicy, Segment, SegmentOptions};
use dataplane::server::blocking::TcpServer;
use dataplane::server::probe;
use dataplane::server::uring::{ShardOptions, UringServer};
use dataplane::transport::client::{ClientConfig, TcpClient, TransferOp};
use hdrhistogram::Histogram;

const SEGMENT_BYTES: usize = 64 << 20;
/// Request and response header sizes of the data-plane frames, mimicked by the plain pass.
const PLAIN_REQUEST_BYTES: usize = 32;
const PLAIN_ACK_BYTES: usize = 24;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Backend {
    Plain,
    Blocking,
    Uring,
    UringZc,
}

impl Backend {
    const ALL: [Backend; 4] = [
        Backend::Plain,
        Backend::Blocking,
        Backend::Uring,
        Backend::UringZc,
    ];

    fn name(self) -> &'static str {
        match self {
            Backend::Plain => "plain",
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
    fn addr(&self) -> SocketAddr {
        match self {
            Running::Blocking(s) => s.local_addr(),
            Running::Uring(s) => s.local_addr(),
        }
    }
}

struct Args {
    secs: f64,
    runs: usize,
    lanes: usize,
    batch: usize,
    sizes: Vec<usize>,
    backends: Vec<Backend>,
}

fn usage(problem: &str) -> ! {
    eprintln!(
        "{problem}\nusage: tcp_transport_bench [--secs S] [--runs R] [--lanes N] [--batch N] \
         [--sizes 4096,65536] [--backends plain,blocking,uring,uring+zc]"
    );
    std::process::exit(2)
}

fn number<T: std::str::FromStr>(flag: &str, value: &str) -> T {
    value
        .parse()
        .unwrap_or_else(|_| usage(&format!("{flag}: not a number: {value:?}")))
}

fn parse_args() -> Args {
    let mut args = Args {
        secs: 1.0,
        runs: 3,
        lanes: 4,
        batch: 16,
        sizes: vec![4 << 10, 64 << 10, 1 << 20, 16 << 20],
        backends: Backend::ALL.to_vec(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .unwrap_or_else(|| usage(&format!("{flag} needs a value")));
        match flag.as_str() {
            "--secs" => args.secs = number(&flag, &value),
            "--runs" => args.runs = number::<usize>(&flag, &value).max(1),
            "--lanes" => args.lanes = number(&flag, &value),
            "--batch" => args.batch = number::<usize>(&flag, &value).max(1),
            "--sizes" => args.sizes = value.split(',').map(|v| number(&flag, v)).collect(),
            "--backends" => {
                args.backends = value
                    .split(',')
                    .map(|v| {
                        Backend::ALL
                            .into_iter()
                            .find(|b| b.name() == v)
                            .unwrap_or_else(|| usage(&format!("unknown backend {v:?}")))
                    })
                    .collect()
            }
            other => usage(&format!("unknown flag {other}")),
        }
    }
    args
}

fn start(backend: Backend, memory: Arc<ServedMemory>) -> Running {
    let addr = "127.0.0.1:0".parse().expect("literal address");
    let config = ServerConfig::default();
    match backend {
        Backend::Blocking | Backend::Plain => {
            Running::Blocking(TcpServer::bind(addr, memory, config).expect("bind"))
        }
        Backend::Uring | Backend::UringZc => {
            let options = ShardOptions {
                send_zc_min_bytes: if backend == Backend::UringZc {
                    0
                } else {
                    u64::MAX
                },
                ..Default::default()
            };
            Running::Uring(UringServer::bind_with(addr, memory, config, options).expect("bind"))
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

/// One run of one pass: bytes moved, elapsed time, latency histogram (ns).
struct Measured {
    bytes: u64,
    elapsed: Duration,
    hist: Histogram<u64>,
}

impl Measured {
    fn gbps(&self) -> f64 {
        self.bytes as f64 / self.elapsed.as_secs_f64() / 1e9
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::<u64>::new(3).expect("3 significant figures is valid")
}

/// Runs `op` (which returns the bytes it moved) until `secs` pass.
fn timed(secs: f64, mut op: impl FnMut() -> usize) -> Measured {
    let mut hist = histogram();
    let deadline = Duration::from_secs_f64(secs);
    let started = Instant::now();
    let mut bytes = 0u64;
    while started.elapsed() < deadline {
        let t = Instant::now();
        bytes += op() as u64;
        let _ = hist.record(t.elapsed().as_nanos() as u64);
    }
    Measured {
        bytes,
        elapsed: started.elapsed(),
        hist,
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Pass {
    Lat,
    Tput,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Dir {
    Read,
    Write,
}

/// A connected loopback socket pair with `TCP_NODELAY` and the kernel's default buffers
/// (autotuned), as an application would open it.
fn plain_pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let client = TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
    let (server, _) = listener.accept().expect("accept");
    for s in [&client, &server] {
        s.set_nodelay(true).expect("nodelay");
    }
    (client, server)
}

/// The plain-stream pass: the physical limit the data plane is compared with.
fn plain_run(args: &Args, pass: Pass, dir: Dir, size: usize) -> Measured {
    let (mut client, mut server) = plain_pair();
    let stop = Arc::new(AtomicBool::new(false));
    let peer_stop = Arc::clone(&stop);
    // The peer thread: echoes the exchange's other half (lat) or sends/absorbs the stream.
    let peer = std::thread::spawn(move || {
        let mut block = vec![0x5Au8; size];
        let mut small = [0u8; PLAIN_REQUEST_BYTES];
        let ok = |r: std::io::Result<()>| r.is_ok() && !peer_stop.load(Ordering::Relaxed);
        match (pass, dir) {
            (Pass::Lat, Dir::Read) => {
                while ok(server.read_exact(&mut small)) && ok(server.write_all(&block)) {}
            }
            (Pass::Lat, Dir::Write) => {
                let ack = [0u8; PLAIN_ACK_BYTES];
                while ok(server.read_exact(&mut block)) && ok(server.write_all(&ack)) {}
            }
            (Pass::Tput, Dir::Read) => while ok(server.write_all(&block)) {},
            (Pass::Tput, Dir::Write) => while ok(server.read_exact(&mut block)) {},
        }
    });
    let mut block = vec![0xA5u8; size];
    let request = [1u8; PLAIN_REQUEST_BYTES];
    let mut ack = [0u8; PLAIN_ACK_BYTES];
    let batch = args.batch;
    let m = match (pass, dir) {
        (Pass::Lat, Dir::Read) => timed(args.secs, || {
            client.write_all(&request).expect("plain request");
            client.read_exact(&mut block).expect("plain response");
            size
        }),
        (Pass::Lat, Dir::Write) => timed(args.secs, || {
            client.write_all(&block).expect("plain payload");
            client.read_exact(&mut ack).expect("plain ack");
            size
        }),
        (Pass::Tput, Dir::Read) => timed(args.secs, || {
            for _ in 0..batch {
                client.read_exact(&mut block).expect("plain stream");
            }
            size * batch
        }),
        (Pass::Tput, Dir::Write) => timed(args.secs, || {
            for _ in 0..batch {
                client.write_all(&block).expect("plain stream");
            }
            size * batch
        }),
    };
    stop.store(true, Ordering::Relaxed);
    // Unblocks the peer wherever it waits.
    let _ = client.shutdown(std::net::Shutdown::Both);
    let _ = peer.join();
    m
}

/// One pass against a data-plane server.
fn server_run(
    args: &Args,
    pass: Pass,
    dir: Dir,
    size: usize,
    addr: SocketAddr,
    base: u64,
) -> Measured {
    let slots = (SEGMENT_BYTES / size).max(1);
    let lanes = if pass == Pass::Lat { 1 } else { args.lanes };
    let config = ClientConfig {
        lanes,
        ..Default::default()
    };
    let client = TcpClient::connect(addr, config).expect("connect");
    if pass == Pass::Lat {
        let mut buf = vec![0xA5u8; size];
        let mut i = 0usize;
        return timed(args.secs, || {
            let remote = base + ((i % slots) * size) as u64;
            i += 1;
            match dir {
                Dir::Write => client.write(remote, &buf).expect("write"),
                Dir::Read => client.read(remote, &mut buf).expect("read"),
            }
            size
        });
    }
    let batch = args.batch.min(slots);
    let mut bufs: Vec<Vec<u8>> = (0..batch).map(|_| vec![0x5Au8; size]).collect();
    timed(args.secs, || {
        let mut ops: Vec<TransferOp<'_>> = bufs
            .iter_mut()
            .enumerate()
            .map(|(k, b)| {
                let remote_addr = base + ((k % slots) * size) as u64;
                match dir {
                    Dir::Write => TransferOp::Write {
                        remote_addr,
                        src: Src::from(&b[..]),
                    },
                    Dir::Read => TransferOp::Read {
                        remote_addr,
                        dst: Dst::from(&mut b[..]),
                    },
                }
            })
            .collect();
        let results = client.submit(&mut ops);
        assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
        size * batch
    })
}

/// The median run by GB/s, and the GB/s range over all runs.
fn median(mut runs: Vec<Measured>) -> (Measured, f64, f64) {
    runs.sort_by(|a, b| a.gbps().total_cmp(&b.gbps()));
    let lo = runs.first().map_or(0.0, Measured::gbps);
    let hi = runs.last().map_or(0.0, Measured::gbps);
    let mid = runs.swap_remove(runs.len() / 2);
    (mid, lo, hi)
}

fn report(backend: Backend, pass: Pass, dir: Dir, size: usize, runs: Vec<Measured>, plain: f64) {
    let (m, lo, hi) = median(runs);
    let pct = if plain > 0.0 {
        format!("{:>5.0}%", m.gbps() / plain * 100.0)
    } else {
        "     -".to_string()
    };
    println!(
        "{:>6} {:<5} {:<4} {:<9} {:>6.2} GB/s ({:.2}-{:.2}) {pct} plain  p50 {:>9.1} us  p99 {:>9.1} us",
        human(size),
        match dir {
            Dir::Read => "read",
            Dir::Write => "write",
        },
        match pass {
            Pass::Lat => "lat",
            Pass::Tput => "tput",
        },
        backend.name(),
        m.gbps(),
        lo,
        hi,
        m.hist.value_at_quantile(0.5) as f64 / 1e3,
        m.hist.value_at_quantile(0.99) as f64 / 1e3,
    );
}

/// `--help`.
const USAGE: &str = "tcp_transport_bench: the TCP data plane against a plain loopback stream

tcp_transport_bench [--secs S] [--runs R] [--lanes N] [--batch N] [--sizes 4096,65536]
                    [--backends plain,blocking,uring,uring+zc]";

fn main() {
    mooncake_bench::help(USAGE);
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
    memory
        .register_segment(segment.clone())
        .expect("register the segment");
    let base = segment.addr() as u64;
    let mut backends = args.backends.clone();
    // The plain stream first: the other backends are reported as a share of it.
    backends.sort_by_key(|b| Backend::ALL.iter().position(|a| a == b));
    backends.dedup();
    let status = probe::probe_kernel();
    if !status.is_available() {
        println!("# io_uring unavailable ({status}); skipping the io_uring backends");
        backends.retain(|b| !matches!(b, Backend::Uring | Backend::UringZc));
    }
    println!(
        "# tcp_transport_bench: {} run(s) of {}s per pass, median run shown (GB/s range in \
         parentheses); tput = {} lanes x batch {}, lat = 1 lane x 1 request",
        args.runs, args.secs, args.lanes, args.batch
    );
    println!("#  size op    pass backend     GB/s  (min-max)  vs plain    latency");
    for &size in &args.sizes {
        // Plain-stream medians of this size, by (pass, dir), for the `% plain` column.
        let mut plain = [[0.0f64; 2]; 2];
        for &backend in &backends {
            let server = (backend != Backend::Plain).then(|| start(backend, memory.clone()));
            for pass in [Pass::Lat, Pass::Tput] {
                for dir in [Dir::Read, Dir::Write] {
                    let runs: Vec<Measured> = (0..args.runs)
                        .map(|_| match &server {
                            None => plain_run(&args, pass, dir, size),
                            Some(s) => server_run(&args, pass, dir, size, s.addr(), base),
                        })
                        .collect();
                    let slot = &mut plain[pass as usize][dir as usize];
                    if backend == Backend::Plain {
                        *slot = median_gbps(&runs);
                    }
                    report(backend, pass, dir, size, runs, *slot);
                }
            }
            if let Some(Running::Uring(s)) = &server {
                let stats = s.stats();
                println!(
                    "#   {} stalls {} / {} iterations, longest {} us, zero-copy bytes {}",
                    backend.name(),
                    stats.loop_stalls.load(Ordering::Relaxed),
                    stats.loop_iterations.load(Ordering::Relaxed),
                    stats.loop_stall_max_us.load(Ordering::Relaxed),
                    s.zero_copy_bytes()
                );
            }
        }
    }
    drop(memory);
}

fn median_gbps(runs: &[Measured]) -> f64 {
    let mut v: Vec<f64> = runs.iter().map(Measured::gbps).collect();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}
