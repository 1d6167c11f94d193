//! Nodes that join and leave gently (`docs/fleet.md`): the admission ramp of a node that
//! restarts empty, and the drain of a node stopped with SIGTERM, under a steady put/get load.
//!
//! Three `mooncake_client` nodes, a master placing by free ratio (the strategy under which an
//! empty node would draw every new put at once) with a 4 s admission ramp, one `Store` without
//! a segment of its own driven by writer and reader threads, `replica_num = 1` (every object
//! is an only copy, so a drain that moved nothing would lose everything on the node).
//!
//! 1. Node 2 is SIGKILLed, dropped by the master (`client_ttl`), and started again empty.
//!    Checked, counting from the master's mount: over the first half of the ramp its share of
//!    the puts is at most the ramp's cap (half its fair share, plus slack), over the whole
//!    window at most its fair share (plus slack), and it does take puts once the window is
//!    over (a ramp never shuts out).
//! 2. Node 0 gets SIGTERM. Checked: it exits 0 within its drain deadline, no put started after
//!    the drain began lands on it, the master counts one completed drain and no object lost,
//!    and every acknowledged key (but those that were on the killed node) reads back byte
//!    for byte after node 0 is gone.
//!
//! Two more drain a segment with the admin call and replace the master mid-drain (the drain
//! is soft state): restarted without HA, or a leader killed under HA on etcd (skipped when
//! Debian's etcd-server is not installed). The new master drains it again because its owner
//! keeps the drain going, nothing is lost, and once drained the segment is not re-mounted by
//! a later master.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mooncake_tests::{http, master_metric, master_segments, wait_until, Master, Node};
use protocol::ReplicateConfig;

const CLIENT_TTL_S: u64 = 2;
const RAMP_S: u64 = 4;
const DRAIN_TIMEOUT_S: u64 = 20;
const WRITERS: usize = 2;
/// Each writer starts one put per interval: about 60 puts (2 MiB) a second in all.
const PUT_INTERVAL: Duration = Duration::from_millis(33);
const VALUE_BYTES: usize = 32 << 10;

#[derive(Default)]
struct Log {
    /// Acknowledged puts: key, when the put started, the segment the master placed it on.
    acked: Vec<(String, Instant, String)>,
    /// Keys whose read under the load failed or returned other bytes.
    read_failures: Vec<String>,
    reads: u64,
}

type Shared = Arc<Mutex<Log>>;

fn with<R>(log: &Shared, f: impl FnOnce(&mut Log) -> R) -> R {
    f(&mut log.lock().unwrap_or_else(|e| e.into_inner()))
}

fn value(key: &str) -> Vec<u8> {
    let seed = key
        .bytes()
        .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(b as u32));
    (0..VALUE_BYTES)
        .map(|i| ((i as u32).wrapping_mul(2_654_435_761) ^ seed) as u8)
        .collect()
}

/// The segment holding `key`'s replica, from the master's `/query_key`.
fn segment_of(admin_port: u16, key: &str) -> Option<String> {
    let r = http("GET", admin_port, &format!("/query_key?key={key}"), b"");
    let doc: serde_json::Value = serde_json::from_slice(&r.body).ok()?;
    doc["data"][0]["segment_name"].as_str().map(str::to_string)
}

fn start_load(
    m: &Master,
    store: &Arc<client::Store>,
    log: &Shared,
    stop: &Arc<AtomicBool>,
) -> Vec<std::thread::JoinHandle<()>> {
    let one = ReplicateConfig {
        replica_num: 1,
        ..Default::default()
    };
    let mut threads = Vec::new();
    for w in 0..WRITERS {
        let (store, log, stop, cfg) = (store.clone(), log.clone(), stop.clone(), one.clone());
        let admin = m.metrics_port;
        threads.push(std::thread::spawn(move || {
            let t0 = Instant::now();
            let mut n = 0u32;
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(
                    (t0 + PUT_INTERVAL * n).saturating_duration_since(Instant::now()),
                );
                let key = format!("fleet-w{w}-{n}");
                let started = Instant::now();
                if store.put(&key, &value(&key), &cfg, false).is_ok() {
                    if let Some(seg) = segment_of(admin, &key) {
                        with(&log, |l| l.acked.push((key, started, seg)));
                    }
                }
                n += 1;
            }
        }));
    }
    let (store, log, stop) = (store.clone(), log.clone(), stop.clone());
    threads.push(std::thread::spawn(move || {
        let mut i = 0usize;
        while !stop.load(Ordering::Relaxed) {
            let pick = with(&log, |l| {
                (!l.acked.is_empty()).then(|| l.acked[i % l.acked.len()].0.clone())
            });
            i = i.wrapping_mul(7).wrapping_add(13);
            let Some(key) = pick else {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            };
            let ok = store.get(&key).is_ok_and(|v| v == value(&key));
            with(&log, |l| {
                l.reads += 1;
                if !ok {
                    l.read_failures.push(key);
                }
            });
            std::thread::sleep(Duration::from_millis(5));
        }
    }));
    threads
}

/// Of the puts acknowledged that started in `[from, to)`, (how many, how many on `segment`).
fn share(log: &Shared, from: Instant, to: Instant, segment: &str) -> (usize, usize) {
    with(log, |l| {
        let window: Vec<_> = l
            .acked
            .iter()
            .filter(|(_, t, _)| *t >= from && *t < to)
            .collect();
        let on = window.iter().filter(|(_, _, s)| s == segment).count();
        (window.len(), on)
    })
}

#[test]
fn a_restarted_node_ramps_up_and_a_drained_node_loses_nothing() {
    let ttl = format!("--client_ttl={CLIENT_TTL_S}");
    let ramp = format!("--admission_ramp_sec={RAMP_S}");
    let m = Master::start(&[&ttl, &ramp, "--allocation_strategy=free_ratio_first"]);
    let drain = format!("--drain_timeout_sec={DRAIN_TIMEOUT_S}");
    let node_flags = ["--global_segment_size=64 MB", drain.as_str()];
    let mut nodes: Vec<Node> = (0..3).map(|_| Node::start(&m, &node_flags)).collect();
    let store = Arc::new(
        mooncake_tests::remote_store(&m.rpc_addr(), &m.metadata_url(), 16 << 20).expect("setup"),
    );
    // The three nodes were mounted together at the start: let their ramps end before the load.
    std::thread::sleep(Duration::from_secs(RAMP_S));
    let log: Shared = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let load_start = Instant::now();
    let threads = start_load(&m, &store, &log, &stop);
    std::thread::sleep(Duration::from_millis(1500));

    // 1. Node 2 killed, dropped, restarted empty.
    let killed = nodes[2].segments[0].name.clone();
    let _ = nodes[2].signal_and_wait(libc::SIGKILL, Duration::from_secs(5));
    let dropped = wait_until(Duration::from_secs(CLIENT_TTL_S + 5), || {
        !master_segments(&m).contains(&killed)
    });
    assert!(
        dropped.is_some(),
        "the killed node's segment was never dropped"
    );
    // The ramp runs from the master's mount, which comes a while before the node says it is
    // ready (on a loaded machine, up to seconds): watch for it from another thread.
    let before = master_segments(&m);
    let (node, joined) = std::thread::scope(|scope| {
        let watch = scope.spawn(|| loop {
            if master_segments(&m).iter().any(|s| !before.contains(s)) {
                break Instant::now();
            }
            std::thread::sleep(Duration::from_millis(10));
        });
        let node = Node::start(&m, &node_flags);
        (node, watch.join().expect("mount watcher"))
    });
    nodes[2] = node;
    let fresh = nodes[2].segments[0].name.clone();
    let ramp = Duration::from_secs(RAMP_S);
    if joined.elapsed() < ramp / 2 {
        assert_eq!(master_metric(&m, "master_ramping_segments"), Some(1.0));
    }
    std::thread::sleep(
        (joined + ramp + Duration::from_secs(2)).saturating_duration_since(Instant::now()),
    );
    let (n_half, on_half) = share(&log, joined, joined + ramp / 2, &fresh);
    let (n_all, on_all) = share(&log, joined, joined + ramp, &fresh);
    let (n_after, on_after) = share(&log, joined + ramp, Instant::now(), &fresh);
    eprintln!(
        "fresh node share: first half of the ramp {on_half}/{n_half}, whole ramp \
         {on_all}/{n_all}, after it {on_after}/{n_after}"
    );
    assert!(
        n_half >= 20 && n_all >= 40,
        "too few puts to judge: {n_half}, {n_all}"
    );
    // Cap at time t: (t / ramp) of a fair third; by half the window at most a sixth.
    assert!(
        on_half as f64 <= 0.25 * n_half as f64,
        "over the first half of the ramp the fresh node took {on_half} of {n_half} puts"
    );
    assert!(
        on_all as f64 <= 0.40 * n_all as f64,
        "over the ramp the fresh node took {on_all} of {n_all} puts"
    );
    assert!(on_after > 0, "the fresh node took no put after its ramp");
    assert_eq!(master_metric(&m, "master_ramping_segments"), Some(0.0));

    // 2. Node 0 drained by SIGTERM under the load.
    let drained = nodes[0].segments[0].name.clone();
    let on_drained = share(&log, load_start, Instant::now(), &drained).1;
    assert!(
        on_drained > 0,
        "node 0 holds nothing: the drain would prove nothing"
    );
    let term = Instant::now();
    let exit = nodes[0].signal_and_wait(libc::SIGTERM, Duration::from_secs(DRAIN_TIMEOUT_S + 5));
    let took = term.elapsed();
    eprintln!("node 0 drained and exited in {took:?} ({on_drained} objects were on it)");
    assert!(
        exit.is_some_and(|s| s.success()),
        "node 0 did not exit cleanly: {exit:?}"
    );
    assert!(!master_segments(&m).contains(&drained));
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().expect("load thread");
    }
    assert_eq!(
        master_metric(&m, "master_drains_completed_total"),
        Some(1.0)
    );
    assert_eq!(
        master_metric(&m, "master_drain_objects_lost_total"),
        Some(0.0)
    );
    // A put that started once the node had asked for its drain never landed there.
    let (_, late) = share(
        &log,
        term + Duration::from_millis(500),
        Instant::now(),
        &drained,
    );
    assert_eq!(late, 0, "puts placed on the draining node");

    // Every acknowledged key reads back, but those that were on the killed node.
    let acked = with(&log, |l| l.acked.clone());
    let mut checked = 0;
    for (key, _, seg) in acked.iter().filter(|(_, _, s)| *s != killed) {
        let got = store.get(key);
        assert!(
            got.as_ref().is_ok_and(|v| *v == value(key)),
            "acknowledged key {key} (placed on {seg}) lost: {:?}",
            got.map(|v| v.len())
        );
        checked += 1;
    }
    // Reads under the load failed only for keys of the killed node: never during the ramp or
    // the drain.
    let placed: std::collections::HashMap<&str, &str> = acked
        .iter()
        .map(|(k, _, seg)| (k.as_str(), seg.as_str()))
        .collect();
    let (reads, failed) = with(&log, |l| (l.reads, l.read_failures.clone()));
    let elsewhere: Vec<&String> = failed
        .iter()
        .filter(|k| placed.get(k.as_str()) != Some(&killed.as_str()))
        .collect();
    eprintln!(
        "{checked} acknowledged keys read back; {reads} reads under load, {} failed (keys of the \
         killed node)",
        failed.len()
    );
    assert!(
        elsewhere.is_empty(),
        "reads failed under load: {elsewhere:?}"
    );
}

/// The masters of a drain test: one restarted in place, or an HA pair on etcd.
trait Masters {
    /// The master serving now.
    fn serving(&self) -> &Master;
    /// SIGKILLs the serving master; returns once a new one serves.
    fn replace(&mut self);
}

/// One master without HA, restarted on its ports.
struct Restarted(Option<Master>);

impl Masters for Restarted {
    fn serving(&self) -> &Master {
        self.0.as_ref().expect("a master")
    }

    fn replace(&mut self) {
        let mut m = self.0.take().expect("a master");
        let ports = (m.rpc_port, m.metrics_port, m.http_metadata_port);
        assert!(m
            .signal_and_wait(libc::SIGKILL, Duration::from_secs(5))
            .is_some());
        drop(m);
        // Start times are the terms without HA: the next one must be later.
        std::thread::sleep(Duration::from_millis(5));
        self.0 = Some(Master::start_on(
            ports.0,
            ports.1,
            ports.2,
            &RESTARTED_FLAGS,
        ));
    }
}

/// Short read leases and client_ttl: the re-reported objects' conservative leases, and the
/// time a restarted master gives its owners to re-mount, are what the drain waits for.
const RESTARTED_FLAGS: [&str; 3] = [
    "--admission_ramp_sec=0",
    "--default_kv_lease_ttl=500",
    "--client_ttl=3",
];

/// Two masters on etcd; the one killed is replaced by a fresh standby.
struct Elected {
    masters: Vec<Master>,
    flags: Vec<String>,
}

impl Elected {
    fn leader(&self) -> Option<usize> {
        self.masters.iter().position(|m| {
            mooncake_tests::try_http("GET", m.metrics_port, "/ha_status", b"")
                .is_some_and(|r| r.text() == "leading")
        })
    }
}

impl Masters for Elected {
    fn serving(&self) -> &Master {
        &self.masters[self.leader().expect("a leader")]
    }

    fn replace(&mut self) {
        let old = self.leader().expect("a leader");
        let mut dead = self.masters.remove(old);
        assert!(dead
            .signal_and_wait(libc::SIGKILL, Duration::from_secs(5))
            .is_some());
        let elected = wait_until(Duration::from_secs(20), || self.leader().is_some());
        assert!(elected.is_some(), "no new leader");
        let flags: Vec<&str> = self.flags.iter().map(String::as_str).collect();
        self.masters.push(Master::start(&flags));
    }
}

/// The body of the admin-drain tests (module docs): A holds eight 1 MiB objects, B (16 MB)
/// is filled so that the first master can book no move; A is drained with the admin call, the
/// master replaced once A heard of it, and the next master must drain A with nothing lost.
/// A second replacement must not bring A back.
fn admin_drain_outlives_a_new_master(
    c: &mut impl Masters,
    store: &client::Store,
    sa: &str,
    sb: &str,
) {
    const MIB: usize = 1 << 20;
    let on = |seg: &str| ReplicateConfig {
        replica_num: 1,
        preferred_segment: seg.into(),
        ..Default::default()
    };
    let big = |key: &str| value(key).repeat(MIB / VALUE_BYTES);
    let mut fillers = Vec::new();
    for i in 0..40 {
        let key = format!("filler-{i}");
        store.put(&key, &big(&key), &on(sb), false).expect("filler");
        let seg = segment_of(c.serving().metrics_port, &key);
        fillers.push(key);
        if seg.as_deref() != Some(sb) {
            break;
        }
    }
    assert!(fillers.len() < 40, "B never filled");
    let keys: Vec<String> = (0..8).map(|i| format!("drained-{i}")).collect();
    for key in &keys {
        store.put(key, &big(key), &on(sa), false).expect("put");
        let seg = segment_of(c.serving().metrics_port, key);
        assert_eq!(seg.as_deref(), Some(sa));
    }
    let drain = format!("/api/v1/drain?segment={sa}&deadline_sec=120");
    let r = http("POST", c.serving().metrics_port, &drain, b"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        master_metric(c.serving(), "master_draining_segments"),
        Some(1.0)
    );
    // A hears of its drain at its next ping (every second).
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        master_segments(c.serving()).iter().any(|s| s == sa),
        "the drain ended early"
    );

    c.replace();
    let resumed = wait_until(Duration::from_secs(15), || {
        master_metric(c.serving(), "master_draining_segments") == Some(1.0)
    });
    assert!(resumed.is_some(), "the new master never drained A again");
    // Room on B, once it re-mounted (a remove waits out a new leader's recovery fence): the
    // new master's drain moves A's objects there and unmounts A.
    let b_back = wait_until(Duration::from_secs(15), || {
        master_segments(c.serving()).iter().any(|s| s == sb)
    });
    assert!(b_back.is_some(), "B never re-mounted");
    for key in &fillers {
        let gone = wait_until(Duration::from_secs(15), || store.remove(key, true).is_ok());
        assert!(gone.is_some(), "{key} could not be removed");
    }
    let drained = wait_until(Duration::from_secs(30), || {
        !master_segments(c.serving()).iter().any(|s| s == sa)
    });
    assert!(drained.is_some(), "A was never drained");
    let m = c.serving();
    assert_eq!(master_metric(m, "master_drains_completed_total"), Some(1.0));
    assert_eq!(
        master_metric(m, "master_drain_objects_lost_total"),
        Some(0.0)
    );
    for key in &keys {
        assert_eq!(segment_of(m.metrics_port, key).as_deref(), Some(sb));
        assert!(store.get(key).is_ok_and(|v| v == big(key)), "{key} lost");
    }

    // A later master: A's owner, still running (and told at a ping since), re-mounts nothing
    // of A.
    std::thread::sleep(Duration::from_millis(2500));
    c.replace();
    let back = wait_until(Duration::from_secs(15), || {
        master_segments(c.serving()).iter().any(|s| s == sb)
    });
    assert!(back.is_some(), "B never re-mounted");
    std::thread::sleep(Duration::from_secs(3));
    let listed = master_segments(c.serving());
    assert_eq!(listed, [sb.to_string()], "a drained segment came back");
    for key in &keys {
        let read = wait_until(Duration::from_secs(15), || {
            store.get(key).is_ok_and(|v| v == big(key))
        });
        assert!(read.is_some(), "{key} lost");
    }
}

#[test]
fn an_admin_drain_outlives_a_master_restart_and_its_segment_never_returns() {
    let mut c = Restarted(Some(Master::start(&RESTARTED_FLAGS)));
    let m = c.serving();
    let a = Node::start(m, &["--shards=1", "--global_segment_size=64 MB"]);
    let b = Node::start(m, &["--shards=1", "--global_segment_size=16 MB"]);
    let store =
        mooncake_tests::remote_store(&m.rpc_addr(), &m.metadata_url(), 4 << 20).expect("setup");
    admin_drain_outlives_a_new_master(&mut c, &store, &a.segments[0].name, &b.segments[0].name);
}

#[test]
fn an_admin_drain_outlives_a_leader_failover_and_its_segment_never_returns() {
    let Some(etcd) = mooncake_tests::Etcd::start() else {
        return;
    };
    let cluster = "fleet_admin_drain";
    let flags = etcd.ha_master_flags(
        cluster,
        &["--admission_ramp_sec=0", "--default_kv_lease_ttl=500"],
    );
    let args: Vec<&str> = flags.iter().map(String::as_str).collect();
    let masters: Vec<Master> = (0..2).map(|_| Master::start(&args)).collect();
    let mut c = Elected { masters, flags };
    wait_until(Duration::from_secs(10), || c.leader().is_some()).expect("no leader");
    let addr = format!("etcd://{}", etcd.addr());
    let env = [("MC_STORE_CLUSTER_ID", cluster)];
    let a = Node::start_at(
        &addr,
        &addr,
        &["--shards=1", "--global_segment_size=64 MB"],
        &env,
    );
    let b = Node::start_at(
        &addr,
        &addr,
        &["--shards=1", "--global_segment_size=16 MB"],
        &env,
    );
    std::env::set_var("MC_STORE_CLUSTER_ID", cluster);
    let store = mooncake_tests::remote_store(&addr, &addr, 4 << 20).expect("store setup");
    admin_drain_outlives_a_new_master(&mut c, &store, &a.segments[0].name, &b.segments[0].name);
}
