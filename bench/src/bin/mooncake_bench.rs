//! Open-loop latency of the store: put, get, exist or a mix at a fixed rate, through the Rust
//! store client (`client::Store`, what the Python package wraps).
//!
//! ```text
//! cargo build --release --bins
//! ./target/release/mooncake_bench --local --op get --rate 2000 --seconds 10 --threads 2 --pin \
//!     [--value_size 4096] [--keys 1024] [--json out.json] [--csv out.csv]
//! ./target/release/mooncake_bench --master 127.0.0.1:50051 \
//!     --metadata http://127.0.0.1:8080/metadata --op mixed --rate 5000
//! ```
//! `--local` starts a master and one storage node (`--segment_size`, default 1 GiB) on
//! 127.0.0.1 with free ports and stops them at the end. Every request has an intended start
//! on a fixed schedule (`mooncake_bench::openloop`); latency is measured from it, so a stall
//! counts for every request it delayed, and service time (from the actual start) is printed
//! beside it: the difference is queueing. `--threads` workers (each one request at a time,
//! all sharing one store client) split the rate; `--pin` pins worker `i` to core `i mod
//! cores`. Ops: `put` (upsert: every request writes `--value_size` bytes), `get` and `exist`
//! (on `--keys` keys put before the clock starts), `mixed` (50% get, 30% exist, 20% put).
//! `--csv` writes the percentile spectrum (quantile, 1/(1-q), latency, service) for plots;
//! `--json` the summary. `--protocol rdma` (with `--local`: the node serves RDMA too) moves
//! the bytes with one-sided RDMA; without an RDMA NIC, run it on the software verbs model
//! with `MOONCAKE_RDMA_SIM=<empty dir> MC_STORE_SHM=0` (the model's numbers measure the TCP
//! requests an RDMA put still makes, its intent and record, not a NIC).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use client::{Store, StoreConfig};
use hdrhistogram::Histogram;
use mooncake_bench::latency_histogram;
use mooncake_bench::openloop::{
    percentiles, run_worker, spectrum_quantiles, RealClock, Schedule, REPORTED,
};
use mooncake_bench::procs::{load_average, start_node, LocalMaster};
use protocol::{ErrorCode, ReplicateConfig};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    Put,
    Get,
    Exist,
    Mixed,
}

struct Args {
    master: Option<String>,
    metadata: Option<String>,
    local: bool,
    op: Op,
    value_size: usize,
    keys: u64,
    rate: f64,
    seconds: f64,
    threads: usize,
    pin: bool,
    segment_size: u64,
    json: Option<String>,
    csv: Option<String>,
    protocol: String,
}

/// `--op`'s value.
fn parse_op(val: &str) -> Op {
    match val {
        "put" => Op::Put,
        "get" => Op::Get,
        "exist" => Op::Exist,
        "mixed" => Op::Mixed,
        other => mooncake_bench::usage_error(format_args!(
            "--op is put, get, exist or mixed, not {other:?}"
        )),
    }
}

fn parse_args() -> Args {
    let mut a = Args {
        master: None,
        metadata: None,
        local: false,
        op: Op::Get,
        value_size: 4096,
        keys: 1024,
        rate: 1000.0,
        seconds: 10.0,
        threads: 2,
        pin: false,
        segment_size: 1 << 30,
        json: None,
        csv: None,
        protocol: "tcp".into(),
    };
    for (flag, val) in mooncake_bench::flags(&["--local", "--pin"]) {
        let num = || -> f64 { mooncake_bench::number(&flag, &val) };
        match flag.as_str() {
            "--local" => a.local = true,
            "--pin" => a.pin = true,
            "--master" => a.master = Some(val.clone()),
            "--metadata" => a.metadata = Some(val.clone()),
            "--op" => a.op = parse_op(&val),
            "--value_size" => a.value_size = num() as usize,
            "--keys" => a.keys = num() as u64,
            "--rate" => a.rate = num(),
            "--seconds" => a.seconds = num(),
            "--threads" => a.threads = num() as usize,
            "--segment_size" => a.segment_size = num() as u64,
            "--json" => a.json = Some(val.clone()),
            "--csv" => a.csv = Some(val.clone()),
            "--protocol" => a.protocol = val.clone(),
            other => mooncake_bench::usage_error(format_args!("unknown flag {other}")),
        }
    }
    assert!(a.rate > 0.0 && a.seconds > 0.0, "--rate and --seconds > 0");
    assert!(a.threads > 0 && a.keys > 0, "--threads and --keys > 0");
    assert!(
        a.local != a.master.is_some(),
        "give either --local or --master ADDR (with --metadata URL)"
    );
    a
}

fn key(i: u64) -> String {
    format!("mcbench-{i:010}")
}

/// SplitMix64: spreads request numbers over the key space and the op mix.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The op request `slot` (numbered over all workers) runs.
fn op_of(op: Op, slot: u64) -> Op {
    match op {
        Op::Mixed => match mix(slot ^ 0x5eed) % 10 {
            0..=4 => Op::Get,
            5..=7 => Op::Exist,
            _ => Op::Put,
        },
        other => other,
    }
}

/// Runs one request; a failure is described as `op: ERROR_CODE` for the report.
fn one(
    store: &Store,
    op: Op,
    key: &str,
    value: &[u8],
    cfg: &ReplicateConfig,
) -> Result<(), String> {
    let r = match op {
        Op::Put => store.put(key, value, cfg, true).map_err(ErrorCode::from),
        Op::Get => store.get(key).map_err(ErrorCode::from).and_then(|v| {
            // A short or long value is as wrong as an error.
            (v.len() == value.len())
                .then_some(())
                .ok_or(ErrorCode::InvalidReplica)
        }),
        Op::Exist => store
            .is_exist(key)
            .map_err(ErrorCode::from)
            .and_then(|e| e.then_some(()).ok_or(ErrorCode::ObjectNotFound)),
        Op::Mixed => unreachable!("op_of resolves mixed"),
    };
    r.map_err(|e| format!("{op:?}: {e:?}"))
}

/// `s` as a JSON string.
fn json_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn json_percentiles(h: &Histogram<u64>) -> String {
    let mut fields: Vec<String> = REPORTED
        .iter()
        .map(|(label, q)| format!("\"{label}\": {}", h.value_at_quantile(*q)))
        .collect();
    fields.push(format!("\"max\": {}", h.max()));
    fields.push(format!("\"mean\": {:.1}", h.mean()));
    format!("{{{}}}", fields.join(", "))
}

/// `--help`.
const USAGE: &str = "mooncake_bench: open-loop store latency at a fixed request rate

mooncake_bench --local --op get|put|exist|mixed --rate 2000 --seconds 10 --threads 2 [--pin]
               [--value_size 4096] [--keys 1024] [--segment_size BYTES] [--protocol tcp|rdma]
               [--json out.json] [--csv out.csv]
mooncake_bench --master 127.0.0.1:50051 --metadata http://127.0.0.1:8080/metadata --op mixed ...

--local starts a master and one storage node on free loopback ports.";

fn main() {
    mooncake_bench::help(USAGE);
    let a = parse_args();
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let (_master, _node, master_addr, metadata) = if a.local {
        let m = LocalMaster::start(&[]);
        let n = start_node(&m, a.segment_size, &format!("--protocol={}", a.protocol));
        let (addr, meta) = (m.rpc_addr.clone(), m.metadata_url.clone());
        (Some(m), Some(n), addr, meta)
    } else {
        let addr = a.master.clone().expect("checked in parse_args");
        let meta = a.metadata.clone().unwrap_or_else(|| "P2PHANDSHAKE".into());
        (None, None, addr, meta)
    };
    let store = Arc::new(
        Store::setup(StoreConfig {
            local_hostname: "127.0.0.1".into(),
            metadata_server: metadata,
            global_segment_size: 0,
            // Every worker holds at most one value at a time.
            local_buffer_size: (a.threads as u64 * a.value_size as u64 * 2).max(64 << 20),
            protocol: a.protocol.clone(),
            rdma_devices: String::new(),
            master_server_addr: master_addr.clone(),
            ..Default::default()
        })
        .unwrap_or_else(|e| panic!("store setup against {master_addr}: {e:?}")),
    );
    let value: Arc<Vec<u8>> = Arc::new((0..a.value_size).map(|i| i as u8).collect());
    let cfg = ReplicateConfig::default();
    if a.op != Op::Put {
        for k in 0..a.keys {
            store
                .put(&key(k), &value, &cfg, true)
                .unwrap_or_else(|e| panic!("populating {}: {e:?}", key(k)));
        }
    }
    let load_before = load_average();
    println!(
        "mooncake_bench: master={master_addr} op={:?} value_size={} keys={} rate={} ops/s \
         seconds={} threads={} pin={} load={load_before}",
        a.op, a.value_size, a.keys, a.rate, a.seconds, a.threads, a.pin
    );

    let cores = core_affinity::get_core_ids().unwrap_or_default();
    // The clock starts once every worker exists, so no request is late because of set-up.
    let start = Instant::now() + Duration::from_millis(100);
    let duration = Duration::from_secs_f64(a.seconds);
    let workers: Vec<_> = (0..a.threads)
        .map(|w| {
            let store = store.clone();
            let value = value.clone();
            let cfg = cfg.clone();
            let core = (a.pin && !cores.is_empty()).then(|| cores[w % cores.len()]);
            let schedule = Schedule {
                rate: a.rate,
                workers: a.threads,
                worker: w,
                duration,
            };
            let (op, keys) = (a.op, a.keys);
            std::thread::Builder::new()
                .name(format!("mcbench-{w}"))
                .spawn(move || {
                    if let Some(c) = core {
                        assert!(core_affinity::set_for_current(c), "pinning to {c:?}");
                    }
                    // Keys as strings up front: the clock measures the store, not formatting.
                    let names: Vec<String> = (0..keys).map(key).collect();
                    std::thread::sleep(start.saturating_duration_since(Instant::now()));
                    let clock = RealClock::starting_at(start);
                    let mut failures: BTreeMap<String, u64> = BTreeMap::new();
                    let r = run_worker(&clock, schedule, |k| {
                        let slot = k * schedule.workers as u64 + schedule.worker as u64;
                        let name = &names[(mix(slot) % keys) as usize];
                        one(&store, op_of(op, slot), name, &value, &cfg)
                            .map_err(|why| *failures.entry(why).or_default() += 1)
                            .is_ok()
                    });
                    (r, failures)
                })
                .expect("spawn worker")
        })
        .collect();
    let mut latency = latency_histogram();
    let mut service = latency_histogram();
    let (mut issued, mut errors) = (0, 0);
    let mut failures: BTreeMap<String, u64> = BTreeMap::new();
    let mut finished = Duration::ZERO;
    for w in workers {
        let (r, f) = w.join().expect("worker panicked");
        for (why, n) in f {
            *failures.entry(why).or_default() += n;
        }
        latency.add(&r.latency).expect("same bounds");
        service.add(&r.service).expect("same bounds");
        issued += r.issued;
        errors += r.errors;
        finished = finished.max(r.finished);
    }
    let achieved = issued as f64 / finished.as_secs_f64();
    let load_after = load_average();
    println!(
        "issued {issued} in {:.2} s: achieved {achieved:.0} ops/s of {} asked, {errors} errors, \
         load after {load_after}",
        finished.as_secs_f64(),
        a.rate
    );
    for (why, n) in &failures {
        println!("  failed {n}x {why}");
    }
    println!("latency (from intended start): {}", percentiles(&latency));
    println!("service (from actual start):   {}", percentiles(&service));
    // Which path the bytes took (a same-host node is reached by memcpy unless MC_STORE_SHM=0).
    let c = store.path_counts();
    println!(
        "paths (bytes): own_memcpy={} shm_memcpy={} tcp={} rdma={}",
        c.own_memcpy_bytes, c.shm_memcpy_bytes, c.tcp_bytes, c.rdma_bytes
    );

    if let Some(path) = &a.csv {
        let mut out = String::from("quantile,one_over_one_minus_q,latency_us,service_us\n");
        for q in spectrum_quantiles() {
            out.push_str(&format!(
                "{q:.6},{:.1},{},{}\n",
                1.0 / (1.0 - q),
                latency.value_at_quantile(q),
                service.value_at_quantile(q)
            ));
        }
        std::fs::write(path, out).unwrap_or_else(|e| panic!("writing {path}: {e}"));
    }
    if let Some(path) = &a.json {
        let out = format!(
            "{{\"command\": {}, \"op\": \"{:?}\", \"value_size\": {}, \"keys\": {}, \
             \"rate\": {}, \"seconds\": {}, \"threads\": {}, \"pin\": {}, \"issued\": {issued}, \
             \"errors\": {errors}, \"achieved_ops_s\": {achieved:.1}, \
             \"load_before\": {}, \"load_after\": {}, \
             \"latency_us\": {}, \"service_us\": {}}}\n",
            json_str(&command),
            a.op,
            a.value_size,
            a.keys,
            a.rate,
            a.seconds,
            a.threads,
            a.pin,
            json_str(&load_before),
            json_str(&load_after),
            json_percentiles(&latency),
            json_percentiles(&service)
        );
        std::fs::write(path, out).unwrap_or_else(|e| panic!("writing {path}: {e}"));
    }
    // Stop pinging and serving before the local master and node go away.
    store.close();
}
