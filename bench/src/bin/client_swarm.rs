//! Many simulated store clients against one master: does the master's memory and RPC p99 stay
//! flat while 1,000 clients stay connected?
//!
//! ```text
//! cargo build --release --bins
//! ./target/release/client_swarm [--clients 1000] [--seconds 60] [--sample_secs 5]
//!     [--idle_pct 20] [--bursty_pct 20] [--burst 32] [--burst_every_ms 5000] [--threads 2]
//!     [--master 127.0.0.1:50051 --master_pid PID]
//! ```
//! Without `--master` it starts `target/release/mooncake_master` on a free loopback port.
//!
//! Every client has its own TCP connection to the master and speaks the real control RPC
//! (`protocol::frame`), as `client::MasterClient` would, but all clients are tasks on a
//! `--threads` tokio runtime, so 1,000 of them fit on a 2-core machine. Three kinds:
//! - *pinging*: mounts a 16 MiB segment (a descriptor only: nothing serves it, nothing reads
//!   it) and pings every `PING_INTERVAL` (1 s, what `client::Store` does), phases spread over
//!   the interval;
//! - *bursty* (`--bursty_pct`): the same, plus every `--burst_every_ms` a burst of `--burst`
//!   rounds of `ExistKey`, `PutStart` (4 KiB, placed on some client's segment) and
//!   `PutRevoke`, back to back: metadata churn that leaves nothing behind;
//! - *idle* (`--idle_pct`): connects and sends nothing (a process that set up and waits).
//!
//! Every `--sample_secs` it prints the master's `VmRSS`, open fds and CPU time used in the
//! window (`/proc/PID`), the machine's 1-minute load, and the window's ping and metadata RPC
//! latencies (send to answer, HDR). A p99 that climbs while the master's CPU per call stays
//! the same is the machine's scheduling, not the master's work. At the end it compares the
//! first third of the windows with the last third (medians of RSS and of p99): "flat" is a
//! ratio near 1. After the clients disconnect (without unmounting, as killed processes do)
//! it looks at the master again, at once and once their TTL has expired.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use client::limits::DEFAULT_CONNECT_TIMEOUT;
use hdrhistogram::Histogram;
use mooncake_bench::procs::{cpu_time, fd_count, load_average, rss_bytes, LocalMaster};
use mooncake_bench::{latency_histogram, record};
use protocol::frame::{self, Kind};
use protocol::message::*;
use protocol::wire::Wire;
use protocol::{ClientStatus, ErrorCode, ReplicateConfig, Segment, Uuid};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The store client's ping interval (`client::limits::PING_INTERVAL`).
const PING_INTERVAL: Duration = Duration::from_secs(1);
/// Size of each simulated client's (unserved) segment.
const SEGMENT_BYTES: u64 = 16 << 20;
/// Size of a bursty client's `PutStart`.
const PUT_BYTES: u64 = 4096;
/// Distinct keys per bursty client.
const KEYS_PER_CLIENT: usize = 16;
/// When the master is looked at again after the clients disconnected: at once, and after
/// the master's default `--client_ttl` (10 s) has expired them.
const AFTER_LEAVING: [Duration; 2] = [Duration::from_secs(2), Duration::from_secs(15)];
/// Descriptors this process needs besides the clients' sockets.
const SPARE_FDS: u64 = 64;

struct Args {
    master: Option<String>,
    master_pid: Option<u32>,
    clients: usize,
    seconds: u64,
    sample_secs: u64,
    idle_pct: usize,
    bursty_pct: usize,
    burst: usize,
    burst_every_ms: u64,
    threads: usize,
}

fn parse_args() -> Args {
    let mut a = Args {
        master: None,
        master_pid: None,
        clients: 1000,
        seconds: 60,
        sample_secs: 5,
        idle_pct: 20,
        bursty_pct: 20,
        burst: 32,
        burst_every_ms: 5000,
        threads: 2,
    };
    for (flag, val) in mooncake_bench::flags(&[]) {
        let num = || -> u64 { mooncake_bench::number(&flag, &val) };
        match flag.as_str() {
            "--master" => a.master = Some(val.clone()),
            "--master_pid" => a.master_pid = Some(num() as u32),
            "--clients" => a.clients = num() as usize,
            "--seconds" => a.seconds = num(),
            "--sample_secs" => a.sample_secs = num().max(1),
            "--idle_pct" => a.idle_pct = num() as usize,
            "--bursty_pct" => a.bursty_pct = num() as usize,
            "--burst" => a.burst = num() as usize,
            "--burst_every_ms" => a.burst_every_ms = num().max(1),
            "--threads" => a.threads = num().max(1) as usize,
            other => mooncake_bench::usage_error(format_args!("unknown flag {other}")),
        }
    }
    assert!(a.idle_pct + a.bursty_pct <= 100, "idle + bursty > 100%");
    a
}

/// The soft `RLIMIT_NOFILE` of this process, from `/proc/self/limits`.
fn fd_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind3 {
    Pinging,
    Bursty,
    Idle,
}

/// What the clients measured since the last sample.
struct Window {
    ping: Histogram<u64>,
    meta: Histogram<u64>,
    /// Calls that failed (connection lost, undecodable answer, or an error code where none
    /// is expected).
    failures: u64,
    /// Pings the master answered with anything but `Ok` (it forgot the client).
    not_ok_pings: u64,
}

impl Window {
    fn new() -> Window {
        Window {
            ping: latency_histogram(),
            meta: latency_histogram(),
            failures: 0,
            not_ok_pings: 0,
        }
    }
}

/// One client's connection: one call at a time, answers in order.
struct Conn {
    sock: TcpStream,
    buf: Vec<u8>,
    next_id: u64,
}

impl Conn {
    async fn call<R: Rpc>(&mut self, req: &R) -> io::Result<Result<R::Reply, ErrorCode>> {
        let mut out = Vec::with_capacity(128);
        let id = self.next_id;
        self.next_id += 1;
        frame::encode_with(&mut out, Kind::Request, R::OP, id, |b| req.encode(b))
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        self.sock.write_all(&out).await?;
        loop {
            let split = frame::split_frame(&self.buf)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            if let Some((f, used)) = split {
                if f.header.request_id != id || f.header.opcode != R::OP {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("answer to {} op {}", f.header.request_id, f.header.opcode),
                    ));
                }
                let reply = Result::<R::Reply, ErrorCode>::from_bytes(f.body)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()));
                self.buf.drain(..used);
                return reply;
            }
            let mut chunk = [0u8; 4096];
            let n = self.sock.read(&mut chunk).await?;
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

/// Times one call into `hist` of the shared window; `ok` judges the answer.
async fn timed<R: Rpc>(
    conn: &mut Conn,
    req: &R,
    window: &Mutex<Window>,
    ping: bool,
    ok: impl FnOnce(&R::Reply) -> bool,
) -> bool {
    let t0 = Instant::now();
    let r = conn.call(req).await;
    let took = t0.elapsed();
    let mut w = window.lock().expect("window lock");
    record(if ping { &mut w.ping } else { &mut w.meta }, took);
    match r {
        Ok(Ok(reply)) if ok(&reply) => true,
        Ok(Ok(_)) if ping => {
            w.not_ok_pings += 1;
            true
        }
        Ok(_) => {
            w.failures += 1;
            true
        }
        Err(_) => {
            w.failures += 1;
            false
        }
    }
}

struct Sim {
    index: usize,
    kind: Kind3,
    id: Uuid,
    /// This client's first ping, as an offset into the interval.
    phase: Duration,
}

async fn run_client(
    sim: Sim,
    mut conn: Conn,
    a: Arc<Args>,
    window: Arc<Mutex<Window>>,
    stop: Arc<AtomicBool>,
) {
    if sim.kind == Kind3::Idle {
        // Hold the connection until the end; read nothing, send nothing.
        while !stop.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        return;
    }
    let start = tokio::time::Instant::now() + sim.phase;
    let mut pings = tokio::time::interval_at(start, PING_INTERVAL);
    pings.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let every = Duration::from_millis(a.burst_every_ms);
    let burst_phase = every.mul_f64((sim.index % 97) as f64 / 97.0);
    let mut bursts = tokio::time::interval_at(start + burst_phase, every);
    bursts.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let keys: Vec<String> = (0..KEYS_PER_CLIENT)
        .map(|k| format!("swarm-{}-{k}", sim.index))
        .collect();
    let mut round = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let burst = tokio::select! {
            _ = pings.tick() => false,
            _ = bursts.tick(), if sim.kind == Kind3::Bursty => true,
        };
        let alive = if !burst {
            timed(&mut conn, &Ping { client_id: sim.id }, &window, true, |r| {
                r.status == ClientStatus::Ok
            })
            .await
        } else {
            let mut alive = true;
            for _ in 0..a.burst {
                let key = keys[round % KEYS_PER_CLIENT].clone();
                round += 1;
                alive &= timed(
                    &mut conn,
                    &ExistKey { key: key.clone() },
                    &window,
                    false,
                    |_| true,
                )
                .await;
                let put = PutStart {
                    client_id: sim.id,
                    key: key.clone(),
                    size: PUT_BYTES,
                    config: ReplicateConfig::default(),
                };
                alive &= timed(&mut conn, &put, &window, false, |r| !r.is_empty()).await;
                let revoke = PutRevoke {
                    client_id: sim.id,
                    key,
                };
                alive &= timed(&mut conn, &revoke, &window, false, |_| true).await;
                if !alive || stop.load(Ordering::Relaxed) {
                    break;
                }
            }
            alive
        };
        if !alive {
            return; // Connection lost: counted in the window's failures.
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|x, y| x.total_cmp(y));
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

fn mib(b: u64) -> f64 {
    b as f64 / (1 << 20) as f64
}

/// `--help`.
const USAGE: &str = "client_swarm: many store clients against one master

client_swarm [--clients 1000] [--seconds 60] [--sample_secs 5] [--idle_pct 20] [--bursty_pct 20]
             [--burst 32] [--burst_every_ms 5000] [--threads 2]
             [--master 127.0.0.1:50051 --master_pid PID]

Without --master it starts target/release/mooncake_master on a free loopback port.";

fn main() {
    mooncake_bench::help(USAGE);
    let a = Arc::new(parse_args());
    let limit = fd_limit().unwrap_or(u64::MAX);
    assert!(
        a.clients as u64 + SPARE_FDS <= limit,
        "{} clients need {} descriptors, `ulimit -n` is {limit}",
        a.clients,
        a.clients as u64 + SPARE_FDS
    );
    let local = a.master.is_none().then(|| LocalMaster::start(&[]));
    let (addr, pid) = match &local {
        Some(m) => (m.rpc_addr.clone(), Some(m.pid())),
        None => (a.master.clone().expect("checked"), a.master_pid),
    };
    let rss = || pid.and_then(rss_bytes).map(mib).unwrap_or(f64::NAN);
    let fds = || pid.and_then(fd_count).unwrap_or(0);
    println!(
        "client_swarm: master={addr} pid={pid:?} clients={} idle={}% bursty={}% burst={}x3 \
         every {} ms, ping every {:?}, {} s, sample every {} s, {} threads, load {}",
        a.clients,
        a.idle_pct,
        a.bursty_pct,
        a.burst,
        a.burst_every_ms,
        PING_INTERVAL,
        a.seconds,
        a.sample_secs,
        a.threads,
        load_average()
    );
    let rss_empty = rss();
    println!(
        "before the clients: master rss {rss_empty:.1} MiB, {} fds",
        fds()
    );

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(a.threads)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let window = Arc::new(Mutex::new(Window::new()));
    let stop = Arc::new(AtomicBool::new(false));

    // Connect and mount, one client after another (as processes starting up would), before
    // the clock starts.
    let t_setup = Instant::now();
    let mut counts = [0usize; 3];
    let mut tasks = Vec::with_capacity(a.clients);
    for i in 0..a.clients {
        let kind = if i % 100 < a.idle_pct {
            Kind3::Idle
        } else if i % 100 >= 100 - a.bursty_pct {
            Kind3::Bursty
        } else {
            Kind3::Pinging
        };
        let sock = std::net::TcpStream::connect(&addr)
            .unwrap_or_else(|e| panic!("client {i}: connect to {addr}: {e}"));
        client::auth::handshake(&sock, DEFAULT_CONNECT_TIMEOUT)
            .unwrap_or_else(|e| panic!("client {i}: handshake: {e}"));
        sock.set_nodelay(true).expect("nodelay");
        sock.set_nonblocking(true).expect("nonblocking");
        counts[kind as usize] += 1;
        let id = Uuid::random();
        let mut conn = rt.block_on(async {
            Conn {
                sock: TcpStream::from_std(sock).expect("tokio socket"),
                buf: Vec::new(),
                next_id: 1,
            }
        });
        if kind != Kind3::Idle {
            let seg = Segment {
                id: Uuid::random(),
                name: format!("swarm-{i}"),
                base: 1 << 40,
                size: SEGMENT_BYTES,
                te_endpoint: "127.0.0.1:9".into(),
                protocol: "tcp".into(),
                host_id: "127.0.0.1".into(),
                ..Default::default()
            };
            let mounted = rt.block_on(conn.call(&MountSegment {
                client_id: id,
                segment: seg,
            }));
            assert!(
                matches!(mounted, Ok(Ok(()))),
                "client {i}: mount: {mounted:?}"
            );
        }
        let sim = Sim {
            index: i,
            kind,
            id,
            phase: PING_INTERVAL.mul_f64(i as f64 / a.clients as f64),
        };
        tasks.push(rt.spawn(run_client(
            sim,
            conn,
            a.clone(),
            window.clone(),
            stop.clone(),
        )));
    }
    println!(
        "{} clients connected in {:.2} s ({} pinging, {} idle, {} bursty): master rss \
         {:.1} MiB, {} fds",
        a.clients,
        t_setup.elapsed().as_secs_f64(),
        counts[Kind3::Pinging as usize],
        counts[Kind3::Idle as usize],
        counts[Kind3::Bursty as usize],
        rss(),
        fds()
    );
    // The setup's own mounts are not part of the first window.
    *window.lock().expect("window lock") = Window::new();

    println!(
        "   t_s  rss_MiB  fds  cpu_ms load1   pings  ping_p50  ping_p99  ping_max   meta  \
         meta_p50  meta_p99  meta_max  fail  not_ok (latencies in us)"
    );
    let cpu = || pid.and_then(cpu_time).unwrap_or_default();
    let mut cpu_before = cpu();
    let t0 = Instant::now();
    let mut series: Vec<(f64, f64, u64, u64)> = Vec::new();
    let windows = (a.seconds / a.sample_secs).max(1);
    for n in 1..=windows {
        let due = t0 + Duration::from_secs(n * a.sample_secs);
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
        let w = std::mem::replace(&mut *window.lock().expect("window lock"), Window::new());
        let r = rss();
        let cpu_now = cpu();
        let load1 = load_average();
        println!(
            "{:>6.1} {:>8.1} {:>4} {:>7} {:>5} {:>7} {:>9} {:>9} {:>9} {:>6} {:>9} {:>9} {:>9} \
             {:>5} {:>7}",
            t0.elapsed().as_secs_f64(),
            r,
            fds(),
            (cpu_now - cpu_before).as_millis(),
            load1.split_whitespace().next().unwrap_or("?"),
            w.ping.len(),
            w.ping.value_at_quantile(0.5),
            w.ping.value_at_quantile(0.99),
            w.ping.max(),
            w.meta.len(),
            w.meta.value_at_quantile(0.5),
            w.meta.value_at_quantile(0.99),
            w.meta.max(),
            w.failures,
            w.not_ok_pings
        );
        cpu_before = cpu_now;
        series.push((
            r,
            w.ping.value_at_quantile(0.99) as f64,
            w.meta.value_at_quantile(0.99),
            w.failures + w.not_ok_pings,
        ));
    }
    stop.store(true, Ordering::Relaxed);
    rt.block_on(async {
        for t in tasks {
            let _ = t.await;
        }
    });
    drop(rt); // closes every client's socket
    let left = Instant::now();
    // Clients that vanish without unmounting keep their segments until the master's
    // `--client_ttl` (10 s by default) expires them: look again after that.
    for after in AFTER_LEAVING {
        std::thread::sleep(after.saturating_sub(left.elapsed()));
        println!(
            "{} s after the clients left: master rss {:.1} MiB, {} fds, load {}",
            after.as_secs(),
            rss(),
            fds(),
            load_average()
        );
    }

    let third = (series.len() / 3).max(1);
    let first = &series[..third];
    let last = &series[series.len() - third..];
    let col = |s: &[(f64, f64, u64, u64)], f: fn(&(f64, f64, u64, u64)) -> f64| {
        median(s.iter().map(f).collect())
    };
    let (rss_a, rss_b) = (col(first, |x| x.0), col(last, |x| x.0));
    let (ping_a, ping_b) = (col(first, |x| x.1), col(last, |x| x.1));
    let (meta_a, meta_b) = (col(first, |x| x.2 as f64), col(last, |x| x.2 as f64));
    let bad: u64 = series.iter().map(|x| x.3).sum();
    println!(
        "first third vs last third (medians of {third} windows): rss {rss_a:.1} -> {rss_b:.1} \
         MiB ({:.2}x), ping p99 {ping_a} -> {ping_b} us ({:.2}x), meta p99 {meta_a} -> \
         {meta_b} us ({:.2}x); {bad} failed calls or refused pings",
        rss_b / rss_a,
        ping_b / ping_a,
        meta_b / meta_a
    );
}
