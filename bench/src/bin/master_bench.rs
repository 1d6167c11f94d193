//! Master throughput: pipelined single operations and batched items per second from several
//! concurrent clients, each with its own connection.
//!
//! ```text
//! cargo run --release -p mooncake-bench --bin master_bench -- \
//!     [--master 127.0.0.1:50051] [--clients 4] [--seconds 5] [--window 64] [--batch 128]
//!     [--batch_window 8] [--keys 16384] [--kv_events_ab ROUNDS]
//! ```
//! Without `--master` it starts `target/release/mooncake_master` on a free loopback port.
//!
//! `--kv_events_ab ROUNDS` measures only the put path with KV-cache events off and on
//! (`docs/kv-events.md`): two masters side by side, one with `--enable_kv_events`, and
//! ROUNDS rounds alternating between them of `--seconds` each, every client repeating
//! BatchPutStart + BatchPutEnd + BatchRemove of `--batch` keys of its own (decimal hashes,
//! 4 KiB objects): each item is announced stored, then removed.

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
    kv_events_ab: usize,
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
        kv_events_ab: 0,
    };
    for (flag, val) in mooncake_bench::flags(&[]) {
        let num = || -> usize { mooncake_bench::number(&flag, &val) };
        match flag.as_str() {
            "--master" => a.master = Some(val.clone()),
            "--clients" => a.clients = num(),
            "--seconds" => a.seconds = num() as u64,
            "--window" => a.window = num(),
            "--batch" => a.batch = num(),
            "--keys" => a.keys = num(),
            "--batch_window" => a.batch_window = num(),
            "--kv_events_ab" => a.kv_events_ab = num(),
            other => mooncake_bench::usage_error(format_args!("unknown flag {other}")),
        }
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

fn spawn_master(extra: &[String]) -> (String, Spawned) {
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
        .args(extra)
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

/// One put-path phase: every client puts, completes and removes `batch` keys of its own in a
/// loop for `seconds`; returns (items/s, per-loop latency histogram).
fn put_phase(a: &Args, addr: &str) -> (f64, hdrhistogram::Histogram<u64>) {
    let stop = Arc::new(AtomicBool::new(false));
    let me = Uuid::from_parts(0xbe7c, 1);
    let handles: Vec<_> = (0..a.clients)
        .map(|t| {
            let c = MasterClient::new(addr).unwrap();
            let stop = stop.clone();
            let keys: Vec<String> = (0..a.batch)
                .map(|i| (((t as u64 + 1) << 32) | i as u64).to_string())
                .collect();
            std::thread::spawn(move || {
                let start = BatchPutStart {
                    client_id: me,
                    keys: keys.clone(),
                    sizes: vec![4096; keys.len()],
                    config: ReplicateConfig::default(),
                };
                let end = BatchPutEnd {
                    client_id: me,
                    keys: keys.clone(),
                };
                let remove = BatchRemove { keys, force: false };
                let mut h = latency_histogram();
                let mut loops = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let t0 = Instant::now();
                    let ok = c.call(&start).unwrap().unwrap();
                    assert!(ok.iter().all(|x| x.is_ok()), "put start");
                    c.call(&end).unwrap().unwrap();
                    c.call(&remove).unwrap().unwrap();
                    record(&mut h, t0.elapsed());
                    loops += 1;
                }
                (loops, h)
            })
        })
        .collect();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(a.seconds));
    stop.store(true, Ordering::Relaxed);
    let mut total = latency_histogram();
    let mut loops = 0;
    for h in handles {
        let (n, hist) = h.join().unwrap();
        loops += n;
        total.add(&hist).unwrap();
    }
    let items = loops as f64 * a.batch as f64;
    (items / t0.elapsed().as_secs_f64(), total)
}

/// `--kv_events_ab`: the put path against a master without and one with KV-cache events, in
/// alternating rounds of the same run.
fn kv_events_ab(a: &Args) {
    let endpoint = format!("--kv_events_bind_endpoint=tcp://127.0.0.1:{}", free_port());
    let sides = [
        ("off", spawn_master(&[])),
        ("on", spawn_master(&["--enable_kv_events".into(), endpoint])),
    ];
    for (_, (addr, _)) in &sides {
        populate(addr, 1);
    }
    println!(
        "master_bench --kv_events_ab: clients={} seconds={} batch={} rounds={}",
        a.clients, a.seconds, a.batch, a.kv_events_ab
    );
    let mut rates = [Vec::new(), Vec::new()];
    let mut hists = [latency_histogram(), latency_histogram()];
    for round in 0..a.kv_events_ab {
        for i in [round % 2, 1 - round % 2] {
            let (rate, h) = put_phase(a, &sides[i].1 .0);
            println!("round {round} events {}: {rate:.0} items/s", sides[i].0);
            rates[i].push(rate);
            hists[i].add(&h).unwrap();
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (off, on) = (median(&mut rates[0]), median(&mut rates[1]));
    for (i, rate) in [off, on].into_iter().enumerate() {
        println!(
            "events {}: median {rate:.0} items/s; per-loop latency {}",
            sides[i].0,
            summary(&hists[i])
        );
    }
    println!("on / off: {:.3}", on / off);
}

/// `--master`, or a master started here (and killed when the guard drops).
fn master_for(a: &Args) -> (String, Option<Spawned>) {
    match &a.master {
        Some(m) => (m.clone(), None),
        None => {
            let (addr, g) = spawn_master(&[]);
            (addr, Some(g))
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `--help`.
const USAGE: &str = "master_bench: pipelined and batched RPC throughput of one master

master_bench [--master 127.0.0.1:50051] [--clients 4] [--seconds 5] [--window 64] [--batch 128]
             [--batch_window 8] [--keys 16384] [--kv_events_ab ROUNDS]

Without --master it starts target/release/mooncake_master on a free loopback port.
--kv_events_ab ROUNDS: only the put path, KV-cache events off and on, in alternating rounds.";

fn main() {
    mooncake_bench::help(USAGE);
    let a = parse_args();
    if a.kv_events_ab > 0 {
        return kv_events_ab(&a);
    }
    let (addr, _guard) = master_for(&a);
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
