//! Keys hashed over several master groups: the design past one master (`docs/scale.md`),
//! run with real masters on loopback.
//!
//! ```text
//! cargo build --release -p mooncake-bench --bin group_swarm -p mooncake-controlplane --bin mooncake_master
//! ./target/release/group_swarm [--groups 4 | --masters HOST:PORT,... --master_pids PID,...]
//!     [--nodes 100] [--clients 4] [--objects 2000000] [--seconds 10] [--batch 128]
//!     [--fill_batch 1024]
//! ```
//! Without `--masters` it starts `--groups` `target/release/mooncake_master` processes on free
//! loopback ports (each one group; HA does not change the load a group takes, `docs/ha.md`).
//!
//! A key's group is `table[fnv1a(key) % SLOTS]`: a fixed table of `SLOTS` slots, each owned
//! by one group, which every client holds (`docs/scale.md`, "Finding a key's group"). The
//! table for `g + 1` groups is the one for `g` with a fair share of slots handed from every
//! old group to the new one, so adding a group moves only the keys of the slots it takes.
//!
//! Three kinds of simulated processes, every one speaking the real control RPC:
//! - *storage nodes* (`--nodes`): each splits one 64 GiB segment (address space, nothing
//!   serves it) into one slice per group and mounts slice `g` on group `g`, under its own id;
//!   one pinger thread per group pings every node every second, the nodes' pings pipelined on
//!   one connection (a node's ping costs the master the same on any connection);
//! - *clients* (`--clients` threads, each with one connection to every group): first they put
//!   `--objects` 40-byte keys with 64-byte values between them (BatchPutStart + BatchPutEnd,
//!   `--fill_batch` keys split by group), then for `--seconds` each asks BatchExistKey for
//!   `--batch` random held keys split by group, one group after the other.
//!
//! It prints, per group: slots, objects held, the master's RSS growth over the fill and bytes
//! per object, items served in the read phase, the master's CPU time per million items, ping
//! rounds and failures; then the aggregate rate and the balance (largest over mean).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use client::MasterClient;
use mooncake_bench::procs::{cpu_time, load_average, rss_bytes, LocalMaster};
use mooncake_bench::{latency_histogram, record};
use protocol::message::*;
use protocol::{ClientStatus, ReplicateConfig, Segment, Uuid};

/// Slots of the key-to-group table: enough that groups get equal shares to 1/SLOTS.
const SLOTS: usize = 4096;
/// A node's whole segment, split between the groups.
const NODE_SEGMENT_BYTES: u64 = 64 << 30;
/// Ping interval of a store client (`client::limits::PING_INTERVAL`).
const PING_INTERVAL: Duration = Duration::from_secs(1);
/// Value size of every object put.
const VALUE_BYTES: u64 = 64;
/// Calls in flight on one connection when mounting and pinging many nodes.
const PIPELINE: usize = 256;
/// Single puts timed at each step of `--segment_ladder`.
const PROBE_PUTS: usize = 500;
/// How long a ladder step watches the master's CPU under pings alone: longer than the
/// master's default `--admission_ramp_sec` (5 s), so the puts after it see no ramp.
const LADDER_QUIET: Duration = Duration::from_secs(6);
/// RPC timeout: a fill batch can wait behind a table resize (`bench/README.md`).
const CALL_TIMEOUT: Duration = Duration::from_secs(120);

struct Args {
    groups: usize,
    masters: Vec<String>,
    pids: Vec<u32>,
    nodes: usize,
    clients: usize,
    objects: usize,
    seconds: u64,
    batch: usize,
    fill_batch: usize,
    ladder: Vec<usize>,
}

fn parse_args() -> Args {
    let mut a = Args {
        groups: 4,
        masters: Vec::new(),
        pids: Vec::new(),
        nodes: 100,
        clients: 4,
        objects: 2_000_000,
        seconds: 10,
        batch: 128,
        fill_batch: 1024,
        ladder: Vec::new(),
    };
    for (flag, val) in mooncake_bench::flags(&[]) {
        let num = |v: &str| -> u64 { mooncake_bench::number(&flag, v) };
        match flag.as_str() {
            "--groups" => a.groups = num(&val).max(1) as usize,
            "--masters" => a.masters = val.split(',').map(str::to_string).collect(),
            "--master_pids" => a.pids = val.split(',').map(|p| num(p) as u32).collect(),
            "--nodes" => a.nodes = num(&val) as usize,
            "--clients" => a.clients = num(&val).max(1) as usize,
            "--objects" => a.objects = num(&val) as usize,
            "--seconds" => a.seconds = num(&val),
            "--batch" => a.batch = num(&val).max(1) as usize,
            "--fill_batch" => a.fill_batch = num(&val).max(1) as usize,
            "--segment_ladder" => a.ladder = val.split(',').map(|s| num(s) as usize).collect(),
            other => mooncake_bench::usage_error(format_args!("unknown flag {other}")),
        }
    }
    if !a.masters.is_empty() {
        a.groups = a.masters.len();
    }
    a
}

/// FNV-1a, 64 bits: stable across processes and versions, which a key-to-group map must be
/// (every client and every tool computes the same group for a key).
fn fnv1a(key: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in key {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The slot table for `groups` groups, grown one group at a time: when group `g` joins,
/// every old group keeps `SLOTS / (g + 1)` slots (one more for the first `SLOTS % (g + 1)`)
/// and hands its other slots to `g`; no slot moves between old groups.
fn slot_table(groups: usize) -> Vec<u16> {
    let mut table = vec![0u16; SLOTS];
    let mut owned = vec![SLOTS];
    for g in 1..groups {
        owned.push(0);
        let keep = |o: usize| SLOTS / (g + 1) + usize::from(o < SLOTS % (g + 1));
        for slot in table.iter_mut() {
            let from = *slot as usize;
            if from != g && owned[from] > keep(from) {
                *slot = g as u16;
                owned[from] -= 1;
                owned[g] += 1;
            }
        }
    }
    table
}

fn group_of(table: &[u16], key: &str) -> usize {
    table[(fnv1a(key.as_bytes()) % SLOTS as u64) as usize] as usize
}

/// The 40-byte key of object `i` (hex of a mixed index, as `master_mem` uses).
fn key(i: usize) -> String {
    let x = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    format!("{x:016x}{:024x}", i)
}

/// Per-group counters the threads add to.
struct Counters {
    objects: Vec<AtomicU64>,
    items: Vec<AtomicU64>,
    calls: Vec<AtomicU64>,
    failures: Vec<AtomicU64>,
    ping_rounds: Vec<AtomicU64>,
    pings: Vec<AtomicU64>,
    ping_not_ok: Vec<AtomicU64>,
    ping_round_max_us: Vec<AtomicU64>,
}

impl Counters {
    fn new(groups: usize) -> Counters {
        let v = || (0..groups).map(|_| AtomicU64::new(0)).collect();
        Counters {
            objects: v(),
            items: v(),
            calls: v(),
            failures: v(),
            ping_rounds: v(),
            pings: v(),
            ping_not_ok: v(),
            ping_round_max_us: v(),
        }
    }
}

fn connect(addr: &str) -> MasterClient {
    MasterClient::new(addr)
        .unwrap_or_else(|e| panic!("connect {addr}: {e}"))
        .with_timeout(CALL_TIMEOUT)
}

/// Node `k`'s id (the same at every group: one process).
fn node_id(k: usize) -> Uuid {
    Uuid::from_parts(0x6e0d_e000 + k as u64, 1)
}

/// Node `k`'s slice for group `g` of `groups`: the same endpoint, its own range and id.
fn mount_req(k: usize, g: usize, groups: usize) -> MountSegment {
    let slice = NODE_SEGMENT_BYTES / groups as u64;
    MountSegment {
        client_id: node_id(k),
        segment: Segment {
            id: Uuid::from_parts(0x5e90_0000 + k as u64, g as u64 + 1),
            name: format!("node-{k}/g{g}"),
            base: (1 << 44) + (k as u64) * NODE_SEGMENT_BYTES + g as u64 * slice,
            size: slice,
            te_endpoint: format!("10.0.{}.{}:17777", k / 250, k % 250),
            protocol: "tcp".into(),
            host_id: format!("node-{k}"),
            ..Default::default()
        },
    }
}

/// Mounts the slices `g` of nodes `nodes` on `c`, `PIPELINE` calls in flight.
fn mount_range(c: &MasterClient, g: usize, groups: usize, nodes: std::ops::Range<usize>) {
    let reqs: Vec<MountSegment> = nodes.map(|k| mount_req(k, g, groups)).collect();
    for chunk in reqs.chunks(PIPELINE) {
        for r in c.call_many(chunk).expect("mount") {
            r.unwrap_or_else(|e| panic!("group {g}: mount: {e:?}"));
        }
    }
}

/// Mounts every node's slice `g` on group `g`; returns the seconds it took per group.
fn mount_nodes(a: &Args, addrs: &[String]) -> Vec<f64> {
    let mut took = Vec::new();
    for (g, addr) in addrs.iter().enumerate() {
        let t0 = Instant::now();
        mount_range(&connect(addr), g, addrs.len(), 0..a.nodes);
        took.push(t0.elapsed().as_secs_f64());
    }
    took
}

/// Pings nodes `0..nodes` once, pipelined; returns how many were not answered `Ok`.
fn ping_round(c: &MasterClient, nodes: usize) -> u64 {
    let pings: Vec<Ping> = (0..nodes)
        .map(|k| Ping {
            client_id: node_id(k),
        })
        .collect();
    let mut not_ok = 0;
    for chunk in pings.chunks(PIPELINE) {
        match c.call_many(chunk) {
            Ok(out) => {
                not_ok += out
                    .iter()
                    .filter(|r| !matches!(r, Ok(p) if p.status == ClientStatus::Ok))
                    .count() as u64
            }
            Err(_) => not_ok += chunk.len() as u64,
        }
    }
    not_ok
}

/// One group's pinger: every mounted node (`nodes` of them now) pings once per interval,
/// pipelined on one connection (a ping costs the master the same on any connection).
fn pinger(
    g: usize,
    addr: String,
    nodes: Arc<AtomicUsize>,
    n: Arc<Counters>,
    stop: Arc<AtomicBool>,
) {
    let c = connect(&addr);
    let mut next = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let t0 = Instant::now();
        let count = nodes.load(Ordering::Relaxed);
        let not_ok = ping_round(&c, count);
        let us = t0.elapsed().as_micros() as u64;
        n.ping_round_max_us[g].fetch_max(us, Ordering::Relaxed);
        n.ping_rounds[g].fetch_add(1, Ordering::Relaxed);
        n.pings[g].fetch_add(count as u64, Ordering::Relaxed);
        n.ping_not_ok[g].fetch_add(not_ok, Ordering::Relaxed);
        next += PING_INTERVAL;
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
}

/// Client `t`'s share of the fill: objects `t, t + clients, ...`, `fill_batch` at a time.
fn fill(a: &Args, t: usize, conns: &[MasterClient], table: &[u16], n: &Counters) {
    let me = Uuid::from_parts(0xc11e_0000 + t as u64, 1);
    let mine: Vec<usize> = (t..a.objects).step_by(a.clients).collect();
    for chunk in mine.chunks(a.fill_batch) {
        let mut split: Vec<Vec<String>> = vec![Vec::new(); conns.len()];
        for &i in chunk {
            let k = key(i);
            split[group_of(table, &k)].push(k);
        }
        for (g, keys) in split.into_iter().enumerate() {
            if keys.is_empty() {
                continue;
            }
            let count = keys.len() as u64;
            let start = BatchPutStart {
                client_id: me,
                keys: keys.clone(),
                sizes: vec![VALUE_BYTES; keys.len()],
                config: ReplicateConfig::default(),
            };
            let ok = conns[g]
                .call(&start)
                .expect("put start")
                .expect("put start");
            assert!(ok.iter().all(|r| r.is_ok()), "group {g}: put start refused");
            let end = BatchPutEnd {
                client_id: me,
                keys,
            };
            conns[g].call(&end).expect("put end").expect("put end");
            n.objects[g].fetch_add(count, Ordering::Relaxed);
        }
    }
}

/// Client `t`'s read phase: BatchExistKey of `batch` random held keys, split by group.
fn read(
    a: &Args,
    t: usize,
    conns: &[MasterClient],
    table: &[u16],
    n: &Counters,
    stop: &AtomicBool,
) {
    let mut rng = 0x2545_f491_4f6c_dd1d_u64 ^ (t as u64 + 1);
    while !stop.load(Ordering::Relaxed) {
        let mut split: Vec<Vec<String>> = vec![Vec::new(); conns.len()];
        for _ in 0..a.batch {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let k = key((rng % a.objects.max(1) as u64) as usize);
            split[group_of(table, &k)].push(k);
        }
        for (g, keys) in split.into_iter().enumerate() {
            if keys.is_empty() {
                continue;
            }
            let count = keys.len() as u64;
            match conns[g].call(&BatchExistKey { keys }) {
                Ok(Ok(out)) if out.iter().all(|r| *r == Ok(true)) => {
                    n.items[g].fetch_add(count, Ordering::Relaxed);
                }
                _ => {
                    n.failures[g].fetch_add(1, Ordering::Relaxed);
                }
            }
            n.calls[g].fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn mib(b: u64) -> f64 {
    b as f64 / (1 << 20) as f64
}

/// Largest over mean of `v`: 1.00 is a perfect balance.
fn imbalance(v: &[f64]) -> f64 {
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    v.iter().cloned().fold(0.0, f64::max) / mean
}

/// What fraction of the keys moves when a group is added to `groups`.
fn moved_when_adding(groups: usize) -> f64 {
    let (before, after) = (slot_table(groups), slot_table(groups + 1));
    before.iter().zip(&after).filter(|(x, y)| x != y).count() as f64 / SLOTS as f64
}

/// The masters: started here (kept alive by the returned guards) or given.
fn masters(a: &Args) -> (Vec<String>, Vec<Option<u32>>, Vec<LocalMaster>) {
    if !a.masters.is_empty() {
        let pids = (0..a.masters.len())
            .map(|g| a.pids.get(g).copied())
            .collect();
        return (a.masters.clone(), pids, Vec::new());
    }
    let local: Vec<LocalMaster> = (0..a.groups).map(|_| LocalMaster::start(&[])).collect();
    let addrs = local.iter().map(|m| m.rpc_addr.clone()).collect();
    let pids = local.iter().map(|m| Some(m.pid())).collect();
    (addrs, pids, local)
}

/// 4 KiB PutStart + PutRevoke `PROBE_PUTS` times, one at a time; PutStart's p50 and p99 in µs.
fn put_probe(c: &MasterClient) -> (u64, u64) {
    let me = Uuid::from_parts(0x9b0b_e000, 1);
    let mut h = latency_histogram();
    for i in 0..PROBE_PUTS {
        let key = format!("probe-{i}");
        let t0 = Instant::now();
        let put = PutStart {
            client_id: me,
            key: key.clone(),
            size: 4096,
            config: ReplicateConfig::default(),
        };
        c.call(&put).expect("put start").expect("put start");
        record(&mut h, t0.elapsed());
        let revoke = PutRevoke { client_id: me, key };
        c.call(&revoke).expect("revoke").expect("revoke");
    }
    (h.value_at_quantile(0.5), h.value_at_quantile(0.99))
}

/// `--segment_ladder A,B,..`: one master; nodes mounted up to A, then B, ...; at each step
/// the mounts' cost, PutStart latency while the new segments' admission ramp runs and after
/// it, the master's CPU per ping over a quiet window, and its RSS.
fn ladder(a: &Args, addr: &str, pid: Option<u32>) {
    let c = connect(addr);
    let (n, stop) = (Arc::new(Counters::new(1)), Arc::new(AtomicBool::new(false)));
    let nodes = Arc::new(AtomicUsize::new(0));
    let p = {
        let (addr, n, stop, nodes) = (addr.to_string(), n.clone(), stop.clone(), nodes.clone());
        std::thread::spawn(move || pinger(0, addr, nodes, n, stop))
    };
    let cpu = || pid.and_then(cpu_time).unwrap_or_default();
    // The master's own CPU with nothing mounted (its periodic tick), taken off the pings'.
    let idle0 = cpu();
    std::thread::sleep(LADDER_QUIET);
    let idle = cpu() - idle0;
    println!(
        "master CPU with no client: {} ms per {LADDER_QUIET:?}",
        idle.as_millis()
    );
    println!(
        "segments  mount_us_each  put_p50/p99_us_ramping  put_p50/p99_us_after  \
         ping_round_ms  cpu_us_per_ping  rss_MiB  pings_not_ok"
    );
    let mut done = 0;
    for &target in &a.ladder {
        let t0 = Instant::now();
        mount_range(&c, 0, 1, done..target.max(done));
        let each_us = t0.elapsed().as_micros() as f64 / (target.max(done + 1) - done) as f64;
        done = target.max(done);
        nodes.store(done, Ordering::Relaxed);
        let ramping = put_probe(&c);
        let (cpu0, pings0) = (cpu(), n.pings[0].load(Ordering::Relaxed));
        std::thread::sleep(LADDER_QUIET);
        let pings = n.pings[0].load(Ordering::Relaxed) - pings0;
        let busy = (cpu() - cpu0).saturating_sub(idle);
        let per_ping = busy.as_micros() as f64 / pings.max(1) as f64;
        let after = put_probe(&c);
        let t = Instant::now();
        ping_round(&c, done);
        println!(
            "{done:>8} {each_us:>14.1} {:>12}/{:<10} {:>10}/{:<10} {:>14.1} {per_ping:>16.2} \
             {:>8.1} {:>12}",
            ramping.0,
            ramping.1,
            after.0,
            after.1,
            t.elapsed().as_secs_f64() * 1e3,
            mib(pid.and_then(rss_bytes).unwrap_or(0)),
            n.ping_not_ok[0].load(Ordering::Relaxed)
        );
    }
    stop.store(true, Ordering::Relaxed);
    p.join().expect("pinger");
}

/// `--help`.
const USAGE: &str = "group_swarm: keys hashed over several master groups, real masters on loopback

group_swarm [--groups 4 | --masters HOST:PORT,... --master_pids PID,...] [--nodes 100]
            [--clients 4] [--objects 2000000] [--seconds 10] [--batch 128] [--fill_batch 1024]
group_swarm --groups 1 --segment_ladder 1000,5000,10000,20000

Without --masters it starts --groups target/release/mooncake_master processes on free ports.
--segment_ladder: one master, storage nodes mounted up to each count in turn; mount cost, put
latency during and after the admission ramp, master CPU per ping, RSS at each step.";

fn main() {
    mooncake_bench::help(USAGE);
    let a = Arc::new(parse_args());
    let (addrs, pids, _local) = masters(&a);
    if !a.ladder.is_empty() {
        return ladder(&a, &addrs[0], pids[0]);
    }
    let groups = addrs.len();
    let table: Arc<Vec<u16>> = Arc::new(slot_table(groups));
    println!(
        "group_swarm: groups={groups} nodes={} clients={} objects={} seconds={} batch={} \
         fill_batch={}, load {}",
        a.nodes,
        a.clients,
        a.objects,
        a.seconds,
        a.batch,
        a.fill_batch,
        load_average()
    );
    let rss = |g: usize| pids[g].and_then(rss_bytes).unwrap_or(0);
    let cpu = |g: usize| pids[g].and_then(cpu_time).unwrap_or_default();
    let rss_empty: Vec<u64> = (0..groups).map(rss).collect();
    let mount_s = mount_nodes(&a, &addrs);
    let n = Arc::new(Counters::new(groups));
    let stop = Arc::new(AtomicBool::new(false));
    let pingers: Vec<_> = (0..groups)
        .map(|g| {
            let (addr, n, stop) = (addrs[g].clone(), n.clone(), stop.clone());
            let nodes = Arc::new(AtomicUsize::new(a.nodes));
            std::thread::spawn(move || pinger(g, addr, nodes, n, stop))
        })
        .collect();
    let (fill_s, read_s, cpu_read) = run_clients(&a, &addrs, &table, &n, &cpu);
    stop.store(true, Ordering::Relaxed);
    for p in pingers {
        p.join().expect("pinger");
    }
    let rss_full: Vec<u64> = (0..groups).map(rss).collect();
    report(
        &a,
        &table,
        &n,
        &mount_s,
        (&rss_empty, &rss_full),
        &cpu_read,
        (fill_s, read_s),
    );
}

/// The fill, then the read phase, on `--clients` threads; returns the fill's and the read
/// phase's seconds and each master's CPU time over the read phase.
fn run_clients(
    a: &Arc<Args>,
    addrs: &[String],
    table: &Arc<Vec<u16>>,
    n: &Arc<Counters>,
    cpu: &dyn Fn(usize) -> Duration,
) -> (f64, f64, Vec<Duration>) {
    let filled = Arc::new(std::sync::Barrier::new(a.clients + 1));
    let go = Arc::new(std::sync::Barrier::new(a.clients + 1));
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..a.clients)
        .map(|t| {
            let (a, table, n) = (a.clone(), table.clone(), n.clone());
            let (filled, go, stop) = (filled.clone(), go.clone(), stop.clone());
            let conns: Vec<MasterClient> = addrs.iter().map(|m| connect(m)).collect();
            std::thread::spawn(move || {
                fill(&a, t, &conns, &table, &n);
                filled.wait();
                go.wait();
                read(&a, t, &conns, &table, &n, &stop);
            })
        })
        .collect();
    let t0 = Instant::now();
    filled.wait();
    let fill_s = t0.elapsed().as_secs_f64();
    let cpu0: Vec<Duration> = (0..addrs.len()).map(cpu).collect();
    go.wait();
    let t1 = Instant::now();
    std::thread::sleep(Duration::from_secs(a.seconds));
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().expect("client thread");
    }
    let read_s = t1.elapsed().as_secs_f64();
    let cpu_read = (0..addrs.len()).map(|g| cpu(g) - cpu0[g]).collect();
    (fill_s, read_s, cpu_read)
}

/// Prints the per-group table and the aggregate.
fn report(
    a: &Args,
    table: &[u16],
    n: &Counters,
    mount_s: &[f64],
    (rss_empty, rss_full): (&[u64], &[u64]),
    cpu_read: &[Duration],
    (fill_s, read_s): (f64, f64),
) {
    let groups = mount_s.len();
    let get = |v: &[AtomicU64], g: usize| v[g].load(Ordering::Relaxed);
    println!(
        "group slots  objects  mount_ms  rss_empty_MiB  rss_growth_MiB  B/obj  items/s  \
         calls/s  cpu_ms  cpu_us/1k_items  pings_ok  ping_round_max_ms  failures"
    );
    for g in 0..groups {
        let slots = table.iter().filter(|&&x| x as usize == g).count();
        let objects = get(&n.objects, g);
        let growth = rss_full[g].saturating_sub(rss_empty[g]);
        let items = get(&n.items, g);
        let cpu_ms = cpu_read[g].as_millis();
        println!(
            "{g:>5} {slots:>5} {objects:>8} {:>9.1} {:>14.1} {:>15.1} {:>6.0} {:>8.0} {:>8.0} \
             {cpu_ms:>7} {:>16.1} {:>9} {:>18.1} {:>9}",
            mount_s[g] * 1e3,
            mib(rss_empty[g]),
            mib(growth),
            growth as f64 / objects.max(1) as f64,
            items as f64 / read_s,
            get(&n.calls, g) as f64 / read_s,
            cpu_read[g].as_micros() as f64 / (items.max(1) as f64 / 1e3),
            get(&n.pings, g) - get(&n.ping_not_ok, g),
            get(&n.ping_round_max_us, g) as f64 / 1e3,
            get(&n.failures, g) + get(&n.ping_not_ok, g),
        );
    }
    let col = |v: &[AtomicU64]| (0..groups).map(|g| get(v, g) as f64).collect::<Vec<_>>();
    let (objects, items) = (col(&n.objects), col(&n.items));
    let total_growth: u64 = (0..groups)
        .map(|g| rss_full[g].saturating_sub(rss_empty[g]))
        .sum();
    println!(
        "fill: {} objects in {fill_s:.1} s ({:.0}/s); all masters' RSS growth {:.1} MiB; \
         largest master's growth {:.1} MiB",
        a.objects,
        a.objects as f64 / fill_s,
        mib(total_growth),
        mib((0..groups)
            .map(|g| rss_full[g].saturating_sub(rss_empty[g]))
            .max()
            .unwrap_or(0))
    );
    println!(
        "read: {:.0} items/s over all groups in {read_s:.1} s; balance (largest / mean): \
         objects {:.3}, items {:.3}; adding a group would move {:.1}% of the keys; load {}",
        items.iter().sum::<f64>() / read_s,
        imbalance(&objects),
        imbalance(&items),
        100.0 * moved_when_adding(groups),
        load_average()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_fair_and_growing_it_moves_only_the_new_groups_share() {
        for groups in 1..=16 {
            let t = slot_table(groups);
            let counts: Vec<usize> = (0..groups)
                .map(|g| t.iter().filter(|&&x| x as usize == g).count())
                .collect();
            let (lo, hi) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
            assert!(hi - lo <= 1, "{groups} groups: {counts:?}");
            let next = slot_table(groups + 1);
            for (x, y) in t.iter().zip(&next) {
                assert!(
                    x == y || *y as usize == groups,
                    "a slot moved between old groups"
                );
            }
        }
    }
}
