//! Master throughput: pipelined single operations and batched items per second from several
//! concurrent clients, each with its own connection.
//!
//! ```text
//! cargo run --release -p mooncake-bench --bin master_bench -- \
//!     [--master 127.0.0.1:50051] [--clients 4] [--seconds 5] [--window 64] [--batch 128]
//!     [--batch_window 8] [--keys 16384]
//! ```
//! Without `--master` it starts `target/release/mooncake_master` on a free loopback port.

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use client::MasterClient;
use mooncake_bench::{latency_histogram, record, summary};
use protocol::message::*;
use protocol::{ReplicateConfig, Segment, Uuid};

struct Args {
    master: Option<String>,
    clients: usize,
    seconds: u64,
    window: usize,
    batch: usize,
    keys: usize,
    batch_window: usize,
}

fn parse_args() -> Args {
    let mut a = Args {
        master: None,
        clients: 4,
        seconds: 5,
        window: 64,
        batch: 128,
        keys: 16384,
        batch_window: 8,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let (flag, val) = match argv[i].split_once('=') {
            Some((f, v)) => (f.to_string(), v.to_string()),
            None => {
                i += 1;
                (
                    argv[i - 1].clone(),
                    argv.get(i).cloned().unwrap_or_default(),
                )
            }
        };
        let num = || {
            val.parse::<usize>().unwrap_or_else(|_| {
                mooncake_bench::usage_error(format_args!("{flag} wants a number, got {val:?}"))
            })
        };
        match flag.as_str() {
            "--master" => a.master = Some(val.clone()),
            "--clients" => a.clients = num(),
            "--seconds" => a.seconds = num() as u64,
            "--window" => a.window = num(),
            "--batch" => a.batch = num(),
            "--keys" => a.keys = num(),
            "--batch_window" => a.batch_window = num(),
            other => mooncake_bench::usage_error(format_args!("unknown flag {other}")),
        }
        i += 1;
    }
    a
}

struct Spawned(Child);
impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_master() -> (String, Spawned) {
    let exe = std::env::current_exe().unwrap();
    let bin = exe.parent().unwrap().join("mooncake_master");
    assert!(
        bin.exists(),
        "{} missing: cargo build --release --bins",
        bin.display()
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mport = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(bin)
        .args([
            format!("--rpc_port={port}"),
            "--rpc_address=127.0.0.1".into(),
            format!("--metrics_port={mport}"),
            "--metrics_host=127.0.0.1".into(),
        ])
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn master");
    let addr = format!("127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(&addr).is_err() {
        assert!(Instant::now() < deadline, "master did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    (addr, Spawned(child))
}

fn key(i: usize) -> String {
    format!("bench-key-{i:08}")
}

fn populate(addr: &str, keys: usize) {
    let c = MasterClient::new(addr).unwrap();
    let me = Uuid::from_parts(0xbe7c, 1);
    let seg = Segment {
        id: Uuid::from_parts(0xbe7c, 2),
        name: "127.0.0.1:19999".into(),
        base: 1 << 40,
        size: 64 << 30,
        te_endpoint: "127.0.0.1:19999".into(),
        protocol: "tcp".into(),
        host_id: "127.0.0.1".into(),
        ..Default::default()
    };
    c.call(&MountSegment {
        client_id: me,
        segment: seg,
    })
    .unwrap()
    .unwrap();
    for chunk in (0..keys).collect::<Vec<_>>().chunks(1024) {
        let ks: Vec<String> = chunk.iter().map(|&i| key(i)).collect();
        let sizes = vec![4096; ks.len()];
        let cfg = ReplicateConfig::default();
        let r = c.call(&BatchPutStart {
            client_id: me,
            keys: ks.clone(),
            sizes,
            config: cfg,
        });
        assert!(r.unwrap().unwrap().iter().all(|x| x.is_ok()));
        let r = c
            .call(&BatchPutEnd {
                client_id: me,
                keys: ks,
            })
            .unwrap()
            .unwrap();
        assert!(r.iter().all(|x| x.is_ok()));
    }
    // Keep the segment's owner alive for the whole run.
    std::thread::spawn(move || loop {
        let _ = c.call(&Ping { client_id: me });
        std::thread::sleep(Duration::from_millis(500));
    });
}

/// Runs `clients` threads for `seconds`, each repeating `op`; returns (calls, items, histogram).
fn run_phase(
    a: &Args,
    addr: &str,
    items_per_call: usize,
    op: impl Fn(&MasterClient, usize) + Send + Sync + 'static,
) -> (u64, f64, hdrhistogram::Histogram<u64>) {
    let stop = Arc::new(AtomicBool::new(false));
    let op = Arc::new(op);
    let handles: Vec<_> = (0..a.clients)
        .map(|t| {
            let c = MasterClient::new(addr).unwrap();
            let stop = stop.clone();
            let op = op.clone();
            std::thread::spawn(move || {
                let mut h = latency_histogram();
                let mut calls = 0u64;
                let mut seq = t * 7919;
                while !stop.load(Ordering::Relaxed) {
                    let t0 = Instant::now();
                    op(&c, seq);
                    record(&mut h, t0.elapsed());
                    calls += 1;
                    seq += 1;
                }
                (calls, h)
            })
        })
        .collect();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(a.seconds));
    stop.store(true, Ordering::Relaxed);
    let mut total = latency_histogram();
    let mut calls = 0;
    for h in handles {
        let (n, hist) = h.join().unwrap();
        calls += n;
        total.add(&hist).unwrap();
    }
    let secs = t0.elapsed().as_secs_f64();
    (calls, (calls as f64 * items_per_call as f64) / secs, total)
}

/// `--help`.
const USAGE: &str = "master_bench: pipelined and batched RPC throughput of one master

master_bench [--master 127.0.0.1:50051] [--clients 4] [--seconds 5] [--window 64] [--batch 128]
             [--batch_window 8] [--keys 16384]

Without --master it starts target/release/mooncake_master on a free loopback port.";

fn main() {
    mooncake_bench::help(USAGE);
    let a = parse_args();
    let (addr, _guard) = match &a.master {
        Some(m) => (m.clone(), None),
        None => {
            let (addr, g) = spawn_master();
            (addr, Some(g))
        }
    };
    println!(
        "master_bench: master={addr} clients={} seconds={} window={} batch={} keys={}",
        a.clients, a.seconds, a.window, a.batch, a.keys
    );
    populate(&addr, a.keys);
    let nkeys = a.keys;

    // Requests are built once, as a real client has its keys at hand: the loop measures the
    // RPC (encode, send, serve, decode), not string formatting.
    let window = a.window;
    let windows: Arc<Vec<Vec<ExistKey>>> = Arc::new(
        (0..nkeys.div_ceil(window))
            .map(|w| {
                (0..window)
                    .map(|i| ExistKey {
                        key: key((w * window + i) % nkeys),
                    })
                    .collect()
            })
            .collect(),
    );
    let ws = windows.clone();
    let (_, rate, h) = run_phase(&a, &addr, window, move |c, seq| {
        let out = c.call_many(&ws[seq % ws.len()]).unwrap();
        assert!(out.iter().all(|r| *r == Ok(true)));
    });
    println!(
        "pipelined ExistKey: {:.0} ops/s (window {window}); per-window latency {}",
        rate,
        summary(&h)
    );

    let ws = windows.clone();
    let (_, rate, h) = run_phase(&a, &addr, 1, move |c, seq| {
        let w = &ws[seq % ws.len()];
        let r = c.call(&w[seq % w.len()]).unwrap();
        assert_eq!(r, Ok(true));
    });
    println!(
        "unpipelined ExistKey: {:.0} ops/s; latency {}",
        rate,
        summary(&h)
    );

    let batch = a.batch;
    let batches: Arc<Vec<Vec<String>>> = Arc::new(
        (0..nkeys.div_ceil(batch))
            .map(|b| (0..batch).map(|i| key((b * batch + i) % nkeys)).collect())
            .collect(),
    );
    let exist: Arc<Vec<BatchExistKey>> = Arc::new(
        batches
            .iter()
            .map(|k| BatchExistKey { keys: k.clone() })
            .collect(),
    );
    let ex = exist.clone();
    let (_, rate, h) = run_phase(&a, &addr, batch, move |c, seq| {
        let out = c.call(&ex[seq % ex.len()]).unwrap().unwrap();
        assert!(out.iter().all(|r| *r == Ok(true)));
    });
    println!(
        "BatchExistKey: {:.0} items/s (batch {batch}); per-batch latency {}",
        rate,
        summary(&h)
    );

    // Several batches in flight per connection, as a client with independent work does.
    let bw = a.batch_window;
    let ex = exist.clone();
    let (_, rate, h) = run_phase(&a, &addr, batch * bw, move |c, seq| {
        let start = (seq * bw) % ex.len();
        let reqs: &[BatchExistKey] = &ex[start..(start + bw).min(ex.len())];
        for out in c.call_many(reqs).unwrap() {
            assert!(out.unwrap().iter().all(|r| *r == Ok(true)));
        }
    });
    println!(
        "BatchExistKey pipelined: {:.0} items/s (batch {batch}, {bw} batches in flight); per-window latency {}",
        rate,
        summary(&h)
    );

    let get: Arc<Vec<BatchGetReplicaList>> = Arc::new(
        batches
            .iter()
            .map(|k| BatchGetReplicaList { keys: k.clone() })
            .collect(),
    );
    let (_, rate, h) = run_phase(&a, &addr, batch, move |c, seq| {
        let out = c.call(&get[seq % get.len()]).unwrap().unwrap();
        assert!(out.iter().all(|r| r.is_ok()));
    });
    println!(
        "BatchGetReplicaList: {:.0} items/s (batch {batch}); per-batch latency {}",
        rate,
        summary(&h)
    );
}
