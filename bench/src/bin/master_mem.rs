//! Master memory per object: the master's RSS against the number of objects it holds, and
//! how fast it finds one at each size.
//!
//! ```text
//! cargo build --release -p mooncake-bench --bin master_mem -p mooncake-controlplane --bin mooncake_master
//! target/release/master_mem [--objects 10000000] [--key_bytes 40] [--value_bytes 64]
//!     [--points 100000,1000000,...] [--lookups 20000] [--json out.json]
//! ```
//!
//! It starts `mooncake_master` from its own directory on free loopback ports, mounts one
//! 64 GiB segment (address space only: the master never touches object bytes), reads the
//! master's `VmRSS`, then puts `--objects` keys of `--key_bytes` bytes (hex, unique) with
//! `--value_bytes`-byte values over the real RPC (BatchPutStart + BatchPutEnd of 1,024 keys,
//! as a client's batch put does; the p99 and longest batch are printed, as a batch that
//! waited behind the index growing shows there). At each of `--points` object counts it reads
//! the RSS again and prints the growth per object, then times `--lookups` single
//! `GetReplicaList` calls
//! and as many `BatchExistKey` calls of 128 keys, on keys drawn at random from those held
//! (one connection, one call at a time: the latency of a lookup, not the master's rate).

use std::time::{Duration, Instant};

use client::MasterClient;
use hdrhistogram::Histogram;
use mooncake_bench::procs::{rss_bytes, LocalMaster};
use mooncake_bench::{latency_histogram, record};
use protocol::message::*;
use protocol::{ReplicateConfig, Segment, Uuid};

struct Args {
    objects: u64,
    key_bytes: usize,
    value_bytes: u64,
    points: Vec<u64>,
    lookups: usize,
    json: Option<String>,
}

const USAGE: &str = "master_mem: master RSS per object and lookup latency against object count

master_mem [--objects 10000000] [--key_bytes 40] [--value_bytes 64]
           [--points 100000,250000,500000,1000000,2000000,5000000,10000000]
           [--lookups 20000] [--json out.json]

Starts target/release/mooncake_master (from this binary's directory) on free ports.";

const BATCH_KEYS: u64 = 1024;
const EXIST_BATCH_KEYS: usize = 128;

fn parse_args() -> Args {
    let mut a = Args {
        objects: 10_000_000,
        key_bytes: 40,
        value_bytes: 64,
        points: vec![],
        lookups: 20_000,
        json: None,
    };
    for (flag, val) in mooncake_bench::flags(&[]) {
        let num = |v: &str| -> u64 { mooncake_bench::number(&flag, v) };
        match flag.as_str() {
            "--objects" => a.objects = num(&val),
            "--key_bytes" => a.key_bytes = num(&val) as usize,
            "--value_bytes" => a.value_bytes = num(&val),
            "--points" => a.points = val.split(',').map(num).collect(),
            "--lookups" => a.lookups = num(&val) as usize,
            "--json" => a.json = Some(val),
            other => mooncake_bench::usage_error(format_args!("unknown flag {other}")),
        }
    }
    if a.key_bytes < 16 {
        mooncake_bench::usage_error("--key_bytes must be at least 16 (keys are unique hex)");
    }
    if a.points.is_empty() {
        a.points = [
            100_000, 250_000, 500_000, 1_000_000, 2_000_000, 5_000_000, 10_000_000,
        ]
        .into_iter()
        .filter(|&p| p <= a.objects)
        .collect();
    }
    a.points.retain(|&p| p <= a.objects);
    if a.points.last() != Some(&a.objects) {
        a.points.push(a.objects);
    }
    a
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Key `i`: `len` hex digits, unique per `i` (its last 16 digits are `i` scrambled by a
/// bijection), looking like the page hashes a KV cache keys by.
fn key(i: u64, len: usize) -> String {
    let mut s = String::with_capacity(len + 16);
    let mut n = 0u64;
    while s.len() < len - 16 {
        s.push_str(&format!("{:016x}", splitmix(i ^ (n << 56) ^ 0x5a5a)));
        n += 1;
    }
    s.truncate(len - 16);
    s.push_str(&format!("{:016x}", splitmix(i)));
    s
}

fn mount(c: &MasterClient, me: Uuid) {
    let seg = Segment {
        id: Uuid::from_parts(0x3e3, 2),
        name: "127.0.0.1:19998".into(),
        base: 1 << 40,
        size: 64 << 30,
        te_endpoint: "127.0.0.1:19998".into(),
        protocol: "tcp".into(),
        host_id: "127.0.0.1".into(),
        ..Default::default()
    };
    c.call(&MountSegment {
        client_id: me,
        segment: seg,
    })
    .expect("rpc")
    .expect("mount");
}

/// Puts keys `from..to`, in batches; records each batch's start + end time in `h`.
fn put_range(c: &MasterClient, me: Uuid, a: &Args, from: u64, to: u64, h: &mut Histogram<u64>) {
    let mut i = from;
    while i < to {
        let n = BATCH_KEYS.min(to - i);
        let keys: Vec<String> = (i..i + n).map(|j| key(j, a.key_bytes)).collect();
        let start = BatchPutStart {
            client_id: me,
            keys: keys.clone(),
            sizes: vec![a.value_bytes; keys.len()],
            config: ReplicateConfig::default(),
        };
        let t0 = Instant::now();
        let r = c.call(&start).expect("rpc").expect("batch put start");
        assert!(r.iter().all(|x| x.is_ok()), "a put start failed");
        let r = c
            .call(&BatchPutEnd {
                client_id: me,
                keys,
            })
            .expect("rpc")
            .expect("batch put end");
        assert!(r.iter().all(|x| x.is_ok()), "a put end failed");
        record(h, t0.elapsed());
        i += n;
    }
}

/// (p50, p99) in microseconds of single GetReplicaList and of BatchExistKey of 128 keys,
/// over random held keys.
fn lookups(c: &MasterClient, a: &Args, held: u64, seed: u64) -> [(u64, u64); 2] {
    let mut rng = seed;
    let mut next = || {
        rng = splitmix(rng);
        rng % held
    };
    let gets: Vec<GetReplicaList> = (0..a.lookups)
        .map(|_| GetReplicaList {
            key: key(next(), a.key_bytes),
        })
        .collect();
    let mut h = latency_histogram();
    for g in &gets {
        let t0 = Instant::now();
        c.call(g).expect("rpc").expect("held key");
        record(&mut h, t0.elapsed());
    }
    let get = (h.value_at_quantile(0.5), h.value_at_quantile(0.99));
    let exists: Vec<BatchExistKey> = (0..a.lookups / 16)
        .map(|_| BatchExistKey {
            keys: (0..EXIST_BATCH_KEYS)
                .map(|_| key(next(), a.key_bytes))
                .collect(),
        })
        .collect();
    let mut h = latency_histogram();
    for e in &exists {
        let t0 = Instant::now();
        let r = c.call(e).expect("rpc").expect("batch exist");
        assert!(r.iter().all(|x| *x == Ok(true)));
        record(&mut h, t0.elapsed());
    }
    [get, (h.value_at_quantile(0.5), h.value_at_quantile(0.99))]
}

fn main() {
    mooncake_bench::help(USAGE);
    let a = parse_args();
    let master = LocalMaster::start(&[]);
    let pid = master.pid();
    // Growing the index rehashes every key under the master's lock: on a loaded 2-core
    // machine a batch behind it has waited over the client's default 10 s.
    let c = MasterClient::new(&master.rpc_addr)
        .expect("connect")
        .with_timeout(Duration::from_secs(120));
    let me = Uuid::from_parts(0x3e3, 1);
    mount(&c, me);
    // Keep the segment's owner alive for the whole run.
    let pinger = MasterClient::new(&master.rpc_addr).expect("connect");
    std::thread::spawn(move || loop {
        let _ = pinger.call(&Ping { client_id: me });
        std::thread::sleep(Duration::from_millis(500));
    });
    std::thread::sleep(Duration::from_millis(200));
    let base = rss_bytes(pid).expect("master RSS");
    println!(
        "master_mem: objects={} key_bytes={} value_bytes={} load={} master RSS empty {:.1} MiB",
        a.objects,
        a.key_bytes,
        a.value_bytes,
        mooncake_bench::procs::load_average(),
        base as f64 / (1 << 20) as f64
    );
    println!(
        "objects,rss_bytes,bytes_per_object,put_s,put1024_p99_us,put1024_max_us,\
         get_p50_us,get_p99_us,exist128_p50_us,exist128_p99_us"
    );
    let mut rows = Vec::new();
    let mut held = 0;
    for &p in &a.points {
        let t0 = Instant::now();
        let mut h = latency_histogram();
        put_range(&c, me, &a, held, p, &mut h);
        let put_s = t0.elapsed().as_secs_f64();
        let (put_p99, put_max) = (h.value_at_quantile(0.99), h.max());
        held = p;
        let rss = rss_bytes(pid).expect("master RSS");
        let per = rss.saturating_sub(base) as f64 / p as f64;
        let [get, ex] = lookups(&c, &a, held, p);
        println!(
            "{p},{rss},{per:.1},{put_s:.1},{put_p99},{put_max},{},{},{},{}",
            get.0, get.1, ex.0, ex.1
        );
        rows.push(format!(
            "{{\"objects\":{p},\"rss_bytes\":{rss},\"bytes_per_object\":{per:.1},\
             \"put_s\":{put_s:.2},\"put1024_p99_us\":{put_p99},\"put1024_max_us\":{put_max},\
             \"get_p50_us\":{},\"get_p99_us\":{},\"exist128_p50_us\":{},\"exist128_p99_us\":{}}}",
            get.0, get.1, ex.0, ex.1
        ));
    }
    if let Some(path) = &a.json {
        let body = format!(
            "{{\"key_bytes\":{},\"value_bytes\":{},\"base_rss_bytes\":{base},\"rows\":[{}]}}\n",
            a.key_bytes,
            a.value_bytes,
            rows.join(",")
        );
        std::fs::write(path, body).expect("write --json");
    }
}
