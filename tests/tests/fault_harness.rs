//! Randomized fault schedules under a mixed workload, with the history checked
//! mechanically (`tests/checker.rs`; rules and runs in `docs/reliability.md`, "Randomized
//! faults").
//!
//! One etcd, three HA masters (`--enable_offload=true`), two storage nodes (`--enable_offload=true`,
//! each with a disk directory of its own under `$TMPDIR/mooncake-faults-<seed>-<pid>/`, or
//! `/var/tmp` when the temporary directory is a tmpfs; a node replaced by a fault starts on the
//! same directory and re-reports its files), so every completed object is copied to its
//! owner's disk (eager offload, `docs/tiering.md`), two store clients (`client::Store`, what the
//! Python layer wraps) with two worker threads each doing a seeded mix of upsert, put, remove
//! (forced or not), get and is_exist on 48 overlapping hot keys (`replica_num = 2`). Values
//! carry their key and a unique id in their first 16 bytes and are a function of both, so a
//! read says which write it saw and torn or foreign bytes are caught. Eight soft-pinned keys
//! are written at the start (and again after a node restart or memory pressure).
//!
//! Meanwhile the main thread injects faults from a seeded schedule, one every 2-5 s (every
//! kind once in a seeded order first, then drawn at random), until the duration is over: a storage node SIGKILLed and a fresh one started 1-3 s later; the HA
//! leader SIGKILLed (a fresh standby a second later; once a new leader serves, its soft-pin
//! count is recorded); etcd SIGKILLed and restarted 1-3 s later; a client process SIGKILLed in
//! the middle of a put (`fault_slow_writer`, on a key of its own: its half-written bytes must
//! never be readable, which a get and a probe right after the kill check); memory pressure (large objects written until the store holds 1.25 times its
//! capacity, so eviction runs, then removed); kernel memory pressure (`kmem`: the
//! `fault_memory_hog` process takes anonymous memory until the kernel's `MemAvailable` is under
//! 384 MiB, holds it 1-3 s and exits; it is the OOM killer's first choice, and a node, master
//! or etcd the kernel kills instead is recorded as killed and replaced); a partition (as root: storage node 1 and the
//! third master run in a network namespace, `mooncake_tests::Netns`, a second "host" whose
//! link goes down for 1-3 s; etcd and the other masters listen on the veth's host end so both
//! sides reach them; a master killed there is replaced there). A partition may cut off the
//! leader itself: it loses etcd, a master on the other side takes over, and the cut one, still
//! reachable by the node beside it, must not act as leader; a stall (a storage node SIGSTOPped,
//! the leader killed, the node resumed 2.5-3.5 s after the new leader serves: past the
//! recovery fence, within `client_ttl`); a disk fault (`disk`: on a random node, one object file
//! whose copy the master lists, if any, has a data byte flipped, or is cut to half its length,
//! or is deleted; the mark `disk-damage <key> ...` names the key; the damaged copy is then read
//! alone and the key read with an ordinary get: a copy destroyed on disk may be lost, like an
//! evicted one, but no read may return bytes that were not written). A thread polls every master's
//! `master_evicted_key_count` and records when the sum moves.
//!
//! At the end the workers stop, a leader is awaited, and every hot key is read once more.
//! Every call and fault goes to a JSON-lines history (`MC_FAULT_HISTORY`, default
//! `$TMPDIR/mooncake-faults-<seed>-<pid>.jsonl`, removed after a passing run unless named),
//! which the checker then judges; the test fails with the first violations, the seed and the
//! history's path.
//!
//! Soft pins lost in an election are a violation like any other (`tests/checker.rs`); the
//! masters run with `--allow_evict_soft_pinned_objects=false` so that memory pressure cannot
//! take a pinned key either. `MC_FAULT_STRICT=1` also fails the run on known open windows
//! (none is listed today).
//!
//! Settings: `MC_FAULT_SEED` (default 19), `MC_FAULT_SECONDS` (default 60, the CI run; the
//! issue's long run is 600), `MC_FAULT_KINDS` (comma-separated subset of `node`, `leader`,
//! `etcd`, `client`, `memory`, `kmem`, `partition`, `stall`, `disk`; default all but `kmem`, which
//! takes a minute or more per fault on a VM whose memory the hypervisor backs lazily, and
//! `stall`, added after the CI run's schedule was fixed), `MC_FAULT_FAR_MASTER` (default 1; 0
//! keeps all three masters on the first host), `MC_FAULT_ETCD_FAR` (default 0; 1 runs etcd on
//! the second host, so that a partition cuts the first host's masters and the clients beside
//! them from etcd). The seed fixes the schedule (which faults, when)
//! and each worker's choice of calls; thread interleaving is the machine's. Skips (passes,
//! printing why) when Debian's etcd-server is not installed.

use std::collections::BTreeMap;
use std::io::{BufRead, BufWriter, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use client::store::Dst;
use client::Store;
use mooncake_tests::checker::{check, History, Kind, Mark, Op, Outcome};
use mooncake_tests::{bin_path, env_or, try_http_at, wait_until, Etcd, Master, Netns, Node, Rng};
use protocol::{ErrorCode, ReplicaMedium, ReplicateConfig, SoftPinAction};

const KEYS: usize = 48;
const PINS: usize = 8;
const CLIENTS: usize = 2;
const THREADS: usize = 2;
const SEED_DEFAULT: u64 = 19;
const SECONDS_DEFAULT: u64 = 60;
/// `kmem` faults take memory until the kernel's `MemAvailable` is under this (MiB).
const KMEM_FLOOR_MIB: u64 = 384;
/// Each storage node's segment: small enough that the memory-pressure fault fills it fast.
const SEGMENT: u64 = 96 << 20;
const FILL_OBJECT: usize = 4 << 20;
const LEADER_BOUND: Duration = Duration::from_secs(20);
/// After an election: the owners' re-reports (a ping interval) and the recovery fence (2 s).
const SETTLE: Duration = Duration::from_secs(3);
/// How long the final read-back waits for one hot key: past the master's 30 s discard
/// timeout, since a put whose commit could not be settled (an etcd outage longer than the
/// client's 10 s settle window, `client::master::SETTLE_WINDOW`) leaves the key in flight
/// (`REPLICA_IS_NOT_READY`) until then.
const READ_BACK_BOUND: Duration = Duration::from_secs(40);

/// The bytes of write `id` to hot key `key`.
fn value(key: usize, id: u64) -> Vec<u8> {
    let len = [4096usize, 12_288, 30_000 + (id % 977) as usize][(id % 3) as usize];
    let mut v: Vec<u8> = (0..len)
        .map(|i| (i as u64).wrapping_mul(131).wrapping_add(id) as u8)
        .collect();
    v[..8].copy_from_slice(&id.to_le_bytes());
    v[8..16].copy_from_slice(&(key as u64).to_le_bytes());
    v
}

/// Which write `bytes` are, if they are exactly one write's bytes for `key`.
fn decode(key: usize, bytes: &[u8]) -> Outcome {
    if bytes.len() < 16 {
        return Outcome::Foreign;
    }
    let id = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    let k = u64::from_le_bytes(bytes[8..16].try_into().unwrap());
    if k == key as u64 && id < u64::MAX / 2 && bytes == value(key, id).as_slice() {
        Outcome::Value(id)
    } else {
        Outcome::Foreign
    }
}

/// Prints what foreign bytes are (whose write they start like) and where the key's replicas
/// are now, for the one who has to explain the violation.
fn explain_foreign(store: &Store, name: &str, bytes: &[u8]) {
    let lookup = store.replicas(name);
    let replicas = lookup.as_ref().map(|l| {
        l.replicas
            .iter()
            .map(|r| format!("{r:?}"))
            .collect::<Vec<_>>()
    });
    println!(
        "FOREIGN {name}: {} bytes, {}; replicas now {replicas:?}",
        bytes.len(),
        whose(bytes),
    );
    // Each replica of the key as it is now, read alone: which of them holds the foreign bytes.
    let Ok(lookup) = lookup else {
        return;
    };
    for r in &lookup.replicas {
        let mut one = lookup.clone();
        one.list.replicas = vec![r.clone()];
        let mut b = vec![0u8; r.size as usize];
        let read = store.read_from(&one, 0, Dst::from(&mut b[..]));
        println!(
            "FOREIGN {name} at {} {:#x}: {}",
            r.segment_name,
            r.buffer_address,
            match read {
                Ok(()) => whose(&b),
                Err(e) => format!("read failed: {e}"),
            }
        );
    }
}

/// Whose bytes these are, as far as their pattern tells: a write of this harness (its id and
/// key, or the inside of one), a `fault_slow_writer`'s half-written object, or unknown.
fn whose(bytes: &[u8]) -> String {
    let word = |i: usize| {
        bytes
            .get(i..i + 8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
    };
    let steps_by = |d: u8| {
        let n = bytes.len().min(64);
        n > 1 && bytes[..n].windows(2).all(|w| w[1].wrapping_sub(w[0]) == d)
    };
    if steps_by(13) {
        // fault_slow_writer's byte i is i * 13 + 0x5a; 197 is 13's inverse mod 256.
        let at = bytes[0].wrapping_sub(0x5a).wrapping_mul(197);
        return format!("a fault_slow_writer's bytes (from its offset {at} mod 256)");
    }
    if steps_by(131) {
        return "the inside of a write's value (not its start)".into();
    }
    format!("starting like write {:?} of hot/{:?}", word(0), word(8))
}

/// Where the nodes' disk directories go: the temporary directory, unless it is a tmpfs (the disk
/// tier is meant for a real disk, and a tmpfs may refuse `O_DIRECT`), then `/var/tmp`.
fn scratch_dir() -> std::path::PathBuf {
    let tmp = std::env::temp_dir();
    let Ok(c) = std::ffi::CString::new(tmp.to_string_lossy().as_bytes()) else {
        return tmp;
    };
    // SAFETY: `statfs` is plain data, for which all zeros is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: statfs(2) on a NUL-terminated path into a struct we own.
    let ok = unsafe { libc::statfs(c.as_ptr(), &mut st) } == 0;
    let tmpfs = ok && st.f_type == libc::TMPFS_MAGIC;
    if tmpfs {
        "/var/tmp".into()
    } else {
        tmp
    }
}

/// The `disk` fault: one object file of a node's disk directory (`<dir>/<worker>/<addr>.mco`,
/// `docs/tiering.md`, "Files"), picked by the seed, has one byte of its data flipped, or is cut
/// to half its length, or is deleted. Hot keys are rewritten many times a second, so most files
/// there are copies of superseded versions waiting for the owner to hear their ranges were
/// freed: the pick starts at a seeded file and takes the first one whose copy the master lists
/// now (`listed(key, addr)`), else the seeded one. Says what it did and to which key (read from
/// the file's header), for the history, and the damaged copy's key and disk address when there
/// was one.
fn damage_disk(
    dir: &str,
    rng: &mut Rng,
    listed: impl Fn(&str, u64) -> bool,
) -> (String, Option<(String, u64)>) {
    use std::io::{Read, Seek, SeekFrom};
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().is_dir())
        .flat_map(|w| std::fs::read_dir(w.path()).into_iter().flatten().flatten())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "mco"))
        .collect();
    files.sort();
    let how = rng.below(3);
    if files.is_empty() {
        return ("(no object file to damage)".into(), None);
    }
    let addr_of = |f: &std::path::Path| {
        f.file_stem()
            .and_then(|s| u64::from_str_radix(&s.to_string_lossy(), 16).ok())
            .unwrap_or(0)
    };
    // The header: hdr_len (u32 at 8), key_len (u32 at 12), size (u64 at 32), the key at 64.
    let header = |f: &std::path::Path| -> Option<(u64, u64, String)> {
        let mut head = vec![0u8; 4096];
        let got = std::fs::File::open(f)
            .and_then(|mut f| f.read(&mut head))
            .ok()?;
        if got < 64 {
            return None;
        }
        let u32_at = |o: usize| u32::from_le_bytes(head[o..o + 4].try_into().unwrap()) as u64;
        let (hdr_len, key_len) = (u32_at(8), u32_at(12) as usize);
        let size = u64::from_le_bytes(head[32..40].try_into().unwrap());
        let key = String::from_utf8_lossy(&head[64..(64 + key_len).min(got)]).into_owned();
        Some((hdr_len, size, key))
    };
    let first = rng.below(files.len() as u64) as usize;
    let file = (0..files.len())
        .map(|j| &files[(first + j) % files.len()])
        .find(|f| header(f).is_some_and(|(_, _, key)| listed(&key, addr_of(f))))
        .unwrap_or(&files[first])
        .clone();
    let name = file
        .strip_prefix(dir)
        .map_or_else(|_| file.display().to_string(), |p| p.display().to_string());
    let Some((hdr_len, size, key)) = header(&file) else {
        return (
            format!("(file {name} gone or unreadable before the fault)"),
            None,
        );
    };
    let done = match how {
        0 if size > 0 => {
            let at = hdr_len + rng.below(size);
            let mask = 1 + rng.below(255) as u8;
            let flip = || -> std::io::Result<()> {
                let mut f = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&file)?;
                let mut b = [0u8; 1];
                f.seek(SeekFrom::Start(at))?;
                f.read_exact(&mut b)?;
                f.seek(SeekFrom::Start(at))?;
                f.write_all(&[b[0] ^ mask])
            };
            flip().map(|()| format!("flip byte {at} (data byte {}) ^{mask:#04x}", at - hdr_len))
        }
        0 | 1 => {
            let cut = || -> std::io::Result<u64> {
                let f = std::fs::OpenOptions::new().write(true).open(&file)?;
                let len = f.metadata()?.len();
                f.set_len(len / 2)?;
                Ok(len)
            };
            cut().map(|len| format!("truncate {len} -> {} bytes", len / 2))
        }
        _ => std::fs::remove_file(&file).map(|()| "delete".to_string()),
    };
    let addr = addr_of(&file);
    match done {
        Ok(what) => (
            format!("{key} {what} of {name}, {size} bytes"),
            Some((key, addr)),
        ),
        Err(e) => (format!("(file {name}, key {key:?}: {e})"), None),
    }
}

/// The history being recorded: kept in memory for the checker and written line by line.
struct Rec {
    t0: Instant,
    out: Mutex<BufWriter<std::fs::File>>,
    hist: Mutex<History>,
}

impl Rec {
    fn now(&self) -> u64 {
        self.t0.elapsed().as_nanos() as u64
    }
    fn op(&self, op: Op) {
        let _ = writeln!(self.out.lock().unwrap(), "{}", op.to_json());
        self.hist.lock().unwrap().ops.push(op);
    }
    fn mark(&self, m: Mark) {
        let _ = writeln!(self.out.lock().unwrap(), "{}", m.to_json());
        self.hist.lock().unwrap().marks.push(m);
    }
    fn fault(&self, what: &str) {
        println!("{:8.2} s  {what}", self.now() as f64 / 1e9);
        self.mark(Mark::Fault {
            at: self.now(),
            what: what.into(),
        });
    }
}

fn outcome<T>(r: &Result<T, ErrorCode>) -> Outcome {
    match r {
        Ok(_) => Outcome::Ok,
        Err(ErrorCode::ObjectNotFound) => Outcome::NotFound,
        Err(e) => Outcome::Err(e.code()),
    }
}

/// One call on hot key `key`, recorded.
fn call(store: &Store, rec: &Rec, client: u32, kind: Kind, key: usize, id: u64, force: bool) {
    let name = format!("hot/{key}");
    let cfg = ReplicateConfig {
        replica_num: 2,
        ..Default::default()
    };
    let invoke = rec.now();
    let (value_id, out) = match kind {
        Kind::Upsert | Kind::Put => (
            Some(id),
            outcome(
                &store
                    .put(&name, &value(key, id), &cfg, kind == Kind::Upsert)
                    .map_err(ErrorCode::from),
            ),
        ),
        Kind::Remove => (
            None,
            outcome(&store.remove(&name, force).map_err(ErrorCode::from)),
        ),
        Kind::Get => (
            None,
            match store.get(&name).map_err(ErrorCode::from) {
                Ok(bytes) => {
                    let o = decode(key, &bytes);
                    if o == Outcome::Foreign {
                        explain_foreign(store, &name, &bytes);
                    }
                    o
                }
                Err(e) => outcome::<()>(&Err(e)),
            },
        ),
        Kind::Exist => (
            None,
            match store.is_exist(&name) {
                Ok(b) => Outcome::Exists(b),
                Err(e) => outcome::<()>(&Err(e.code)),
            },
        ),
    };
    let failed = matches!(out, Outcome::Err(_));
    rec.op(Op {
        client,
        kind,
        key: name,
        value: value_id,
        force: kind == Kind::Remove && force,
        invoke,
        complete: rec.now(),
        outcome: out,
    });
    if failed {
        // Not a busy loop while no leader serves.
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn worker(store: &Store, rec: &Rec, seed: u64, client: u32, stop: &AtomicBool, ids: &AtomicU64) {
    let mut rng = Rng::new(seed ^ ((u64::from(client) + 1) << 32));
    while !stop.load(Ordering::Relaxed) {
        let key = rng.below(KEYS as u64) as usize;
        let dice = rng.below(100);
        let kind = match dice {
            0..35 => Kind::Upsert,
            35..45 => Kind::Put,
            45..60 => Kind::Remove,
            60..85 => Kind::Get,
            _ => Kind::Exist,
        };
        let id = ids.fetch_add(1, Ordering::Relaxed);
        call(store, rec, client, kind, key, id, rng.below(2) == 0);
    }
}

fn ha_status(m: &Master) -> String {
    m.admin_get("/ha_status")
        .map(|r| r.text())
        .unwrap_or_default()
}

fn leader(masters: &[Master]) -> Option<usize> {
    (0..masters.len()).find(|&i| ha_status(&masters[i]) == "leading")
}

/// A master's metrics endpoint: host and port.
type Admin = (String, u16);

fn admin(m: &Master) -> Admin {
    (m.metrics_host.clone(), m.metrics_port)
}

fn metric(at: &Admin, name: &str) -> Option<u64> {
    let page = try_http_at(&at.0, "GET", at.1, "/metrics", b"")?.text();
    page.lines().find_map(|l| {
        let (n, v) = l.split_once(' ')?;
        (n == name).then(|| v.trim().parse::<f64>().ok().map(|f| f as u64))?
    })
}

/// Writes (or rewrites) the soft-pinned keys; how many succeeded.
fn pin(store: &Store) -> usize {
    let cfg = ReplicateConfig {
        replica_num: 2,
        soft_pin_action: SoftPinAction::Enable,
        soft_pin_ttl_ms: Some(3_600_000),
        ..Default::default()
    };
    (0..PINS)
        .filter(|i| {
            let name = format!("pin/{i}");
            wait_until(Duration::from_secs(10), || {
                store.put(&name, &value(1000 + i, 0), &cfg, true).is_ok()
            })
            .is_some()
        })
        .count()
}

#[test]
fn randomized_faults_keep_the_history_consistent() {
    let _env = mooncake_tests::env_lock();
    let seed: u64 = env_or("MC_FAULT_SEED", SEED_DEFAULT);
    let seconds: u64 = env_or("MC_FAULT_SECONDS", SECONDS_DEFAULT);
    let kinds: String = env_or(
        "MC_FAULT_KINDS",
        "node,leader,etcd,client,memory,partition,disk".to_string(),
    );
    let mut kinds: Vec<&str> = kinds.split(',').map(str::trim).collect();
    // Partitions need a second "host": storage node 1 runs in a network namespace.
    let net = if kinds.contains(&"partition") {
        match Netns::create(false) {
            Ok(n) => Some(n),
            Err(e) => {
                println!("fault_harness: no partition faults: {e}");
                kinds.retain(|k| *k != "partition");
                None
            }
        }
    } else {
        None
    };
    // etcd and the masters listen where both hosts reach them.
    let host = net.as_ref().map_or("127.0.0.1", |n| n.host_addr.as_str());
    let named = std::env::var("MC_FAULT_HISTORY").ok();
    let path = named.clone().unwrap_or_else(|| {
        std::env::temp_dir()
            .join(format!(
                "mooncake-faults-{seed}-{}.jsonl",
                std::process::id()
            ))
            .to_string_lossy()
            .into_owned()
    });
    println!(
        "fault_harness: seed {seed} (MC_FAULT_SEED), {seconds} s (MC_FAULT_SECONDS), faults \
         {kinds:?}, history {path}"
    );
    // `MC_FAULT_ETCD_FAR=1`: etcd lives on the second host, so a partition cuts the first
    // host's masters (and the clients beside them) from etcd instead.
    let etcd_far = net.is_some() && env_or("MC_FAULT_ETCD_FAR", 0u8) != 0;
    let started = match &net {
        Some(n) if etcd_far => Etcd::start_in(Some(&n.ns), &n.ns_addr),
        _ => Etcd::start_on(host),
    };
    let Some(mut etcd) = started else {
        return;
    };
    let cluster = format!("faults{}", std::process::id());
    let flags = etcd.ha_master_flags(
        &cluster,
        &[
            "--default_kv_lease_ttl=500",
            "--client_ttl=4",
            // Pinned keys are never evicted, so a new leader must count every one of them.
            "--allow_evict_soft_pinned_objects=false",
            // The disk tier: every completed object is copied to its owner's disk (eager offload).
            "--enable_offload=true",
        ],
    );
    let args: Vec<&str> = flags.iter().map(String::as_str).collect();
    // With a second host, the third master lives there too (`MC_FAULT_FAR_MASTER`, default
    // on), so a partition cuts a master, perhaps the leader, from etcd and the other side.
    let far_master = net.is_some() && env_or("MC_FAULT_FAR_MASTER", 1u8) != 0;
    let mut masters: Vec<Master> = (0..3)
        .map(|i| match &net {
            Some(n) if far_master && i == 2 => Master::start_in(Some(&n.ns), &n.ns_addr, &args),
            _ => Master::start_host(host, &args),
        })
        .collect();
    // Every master ever started, for the eviction poller.
    let ever: Arc<Mutex<Vec<Admin>>> = Arc::new(Mutex::new(masters.iter().map(admin).collect()));
    wait_until(LEADER_BOUND, || leader(&masters).is_some())
        .unwrap_or_else(|| panic!("seed {seed}: no master elected"));
    let addr = format!("etcd://{}", etcd.addr());
    let env = [("MC_STORE_CLUSTER_ID", cluster.as_str())];
    let seg = format!("--global_segment_size={SEGMENT}");
    let node_flags = ["--shards=1", seg.as_str(), "--enable_offload=true"];
    // Each node's disk directory, on a real filesystem (not tmpfs), kept across its restarts:
    // a node replaced by the `node` fault starts on the same directory and re-reports its files.
    let scratch = scratch_dir().join(format!("mooncake-faults-{seed}-{}", std::process::id()));
    let disks: Vec<String> = (0..2)
        .map(|i| {
            let d = scratch.join(format!("node{i}-disk"));
            std::fs::create_dir_all(&d).expect("node disk directory");
            d.to_string_lossy().into_owned()
        })
        .collect();
    println!("fault_harness: node disks {disks:?}");
    // Node 1 lives in the namespace when there is one. Its pings give up quickly, so a ping
    // stuck on the cut link does not delay the next one past the client TTL.
    let far_env = [
        ("MC_STORE_CLUSTER_ID", cluster.as_str()),
        ("MC_RPC_TIMEOUT_MS", "1500"),
        ("MC_RPC_CONNECT_TIMEOUT_MS", "1000"),
    ];
    let start_node = |i: usize| {
        let disk = ("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", disks[i].as_str());
        match (&net, i) {
            (Some(n), 1) => {
                let env: Vec<_> = far_env.iter().copied().chain([disk]).collect();
                Node::start_in(Some(&n.ns), &n.ns_addr, &addr, &addr, &node_flags, &env)
            }
            _ => {
                let env: Vec<_> = env.iter().copied().chain([disk]).collect();
                Node::start_at(&addr, &addr, &node_flags, &env)
            }
        }
    };
    let mut nodes: Vec<Node> = (0..2).map(start_node).collect();
    std::env::set_var("MC_STORE_CLUSTER_ID", &cluster);
    if net.is_some() {
        // A read of the cut node fails after 2 s instead of the default I/O timeout (read by
        // `Store::setup`, below).
        std::env::set_var("MC_TRANSFER_TIMEOUT", "2");
    }
    let stores: Vec<Arc<Store>> = (0..CLIENTS)
        .map(|_| Arc::new(mooncake_tests::remote_store(&addr, &addr, 64 << 20).expect("store")))
        .collect();
    let pinned = pin(&stores[0]);
    assert_eq!(pinned, PINS, "seed {seed}: soft-pinned keys not written");

    let rec = Arc::new(Rec {
        t0: Instant::now(),
        out: Mutex::new(BufWriter::new(
            std::fs::File::create(&path).expect("history file"),
        )),
        hist: Mutex::default(),
    });
    let stop = Arc::new(AtomicBool::new(false));
    let ids = Arc::new(AtomicU64::new(1));
    let mut threads = Vec::new();
    for (c, s) in stores.iter().enumerate() {
        for t in 0..THREADS {
            let (store, rec, stop, ids) = (s.clone(), rec.clone(), stop.clone(), ids.clone());
            let client = (c * THREADS + t) as u32;
            threads.push(std::thread::spawn(move || {
                worker(&store, &rec, seed, client, &stop, &ids)
            }));
        }
    }
    // Eviction poller: the sum of every master's evicted-key counter (a dead master keeps its
    // last value).
    let poller = {
        let (rec, stop, ever) = (rec.clone(), stop.clone(), ever.clone());
        std::thread::spawn(move || {
            let mut last: BTreeMap<Admin, u64> = BTreeMap::new();
            let mut total = 0;
            // An eviction that this round sees happened after the previous round read the
            // counters, so the previous round's start is when it may have happened: marking
            // it with this round's time would flag reads of the keys it took in between.
            let mut since = 0;
            while !stop.load(Ordering::Relaxed) {
                let round = rec.now();
                let admins = ever.lock().unwrap().clone();
                for p in admins {
                    if let Some(v) = metric(&p, "master_evicted_key_count") {
                        let e = last.entry(p).or_default();
                        *e = (*e).max(v);
                    }
                }
                let sum: u64 = last.values().sum();
                if sum > total {
                    total = sum;
                    rec.mark(Mark::Evictions { at: since, total });
                }
                since = round;
                std::thread::sleep(Duration::from_millis(250));
            }
        })
    };

    let mut rng = Rng::new(seed);
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut fill_id = 0usize;
    let mut first = kinds.clone();
    for i in (1..first.len()).rev() {
        first.swap(i, rng.below(i as u64 + 1) as usize);
    }
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2000 + rng.below(3000)));
        if Instant::now() >= deadline {
            break;
        }
        // The first rounds take every kind once, in a seeded order, so that even the short
        // CI run injects each; after that the kinds are drawn at random.
        let round: usize = counts.values().sum();
        let kind = if round < first.len() {
            first[round]
        } else {
            kinds[rng.below(kinds.len() as u64) as usize]
        };
        *counts.entry(kind).or_default() += 1;
        match kind {
            "node" => {
                let i = rng.below(nodes.len() as u64) as usize;
                nodes[i].signal_and_wait(libc::SIGKILL, Duration::from_secs(5));
                rec.fault("node-kill");
                std::thread::sleep(Duration::from_millis(1000 + rng.below(2000)));
                nodes[i] = start_node(i);
                rec.fault("node-restart");
                pin(&stores[0]);
            }
            "leader" | "stall" => {
                let Some(l) = leader(&masters) else {
                    // etcd or an election in progress: nothing to kill this time.
                    continue;
                };
                // `stall`: a storage node stopped across the election, resumed past the
                // recovery fence but within `client_ttl`: the new leader must wait for its
                // late re-report (the owners' registry), not answer its keys missing.
                let stalled = (kind == "stall").then(|| rng.below(nodes.len() as u64) as usize);
                if let Some(i) = stalled {
                    // SAFETY: kill(2) on a child pid the harness owns.
                    unsafe { libc::kill(nodes[i].child.id() as i32, libc::SIGSTOP) };
                    rec.fault("node-stop");
                }
                masters[l].signal_and_wait(libc::SIGKILL, Duration::from_secs(5));
                rec.fault("leader-kill");
                // Its successor starts on the same host.
                let (ns, at) = (masters[l].ns.clone(), masters[l].host.clone());
                masters.remove(l);
                std::thread::sleep(Duration::from_secs(1));
                let m = Master::start_in(ns.as_deref(), &at, &args);
                ever.lock().unwrap().push(admin(&m));
                masters.push(m);
                let Some(_) = wait_until(LEADER_BOUND, || leader(&masters).is_some()) else {
                    panic!("seed {seed}: no leader {LEADER_BOUND:?} after a leader kill");
                };
                rec.fault("leader-elected");
                let at = rec.now();
                if let Some(i) = stalled {
                    std::thread::sleep(Duration::from_millis(2500 + rng.below(1000)));
                    // SAFETY: as above.
                    unsafe { libc::kill(nodes[i].child.id() as i32, libc::SIGCONT) };
                    rec.fault("node-resume");
                }
                std::thread::sleep(SETTLE);
                if let Some(l) = leader(&masters) {
                    if let Some(seen) = metric(&admin(&masters[l]), "master_soft_pin_key_count") {
                        rec.mark(Mark::SoftPins {
                            at,
                            expected: PINS as u64,
                            seen,
                        });
                    }
                }
            }
            "etcd" => {
                etcd.stop();
                rec.fault("etcd-kill");
                std::thread::sleep(Duration::from_millis(1000 + rng.below(2000)));
                etcd.restart();
                rec.fault("etcd-restart");
            }
            "client" => {
                let Some(l) = leader(&masters) else { continue };
                // A key of its own (a hot key exists most of the time, and `PutStart` of an
                // existing key is refused): its half-written bytes must never be readable.
                let n = counts["client"];
                let key = format!("cli/{n}");
                let mut child = Command::new(bin_path("fault_slow_writer"))
                    .args([masters[l].rpc_addr(), key.clone(), (1u64 << 20).to_string()])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("spawn fault_slow_writer");
                let invoke = rec.now();
                let out = child.stdout.take().expect("stdout");
                let (tx, rx) = std::sync::mpsc::channel();
                std::thread::spawn(move || {
                    for line in std::io::BufReader::new(out).lines() {
                        let Ok(line) = line else { return };
                        let _ = tx.send(line);
                    }
                });
                let mid = rx.recv_timeout(Duration::from_secs(5)).is_ok_and(|l| {
                    // Where its bytes are, to match a foreign read to them.
                    println!("  {key}: {l}");
                    l.starts_with("half-written")
                });
                let _ = child.kill();
                let _ = child.wait();
                rec.fault(if mid {
                    "client-kill"
                } else {
                    "client-kill (no put started)"
                });
                // Its put has no value id, so a read of its bytes is foreign.
                rec.op(Op {
                    client: 99,
                    kind: Kind::Put,
                    key: key.clone(),
                    value: None,
                    force: false,
                    invoke,
                    complete: rec.now(),
                    outcome: Outcome::Err(-1),
                });
                for kind in [Kind::Get, Kind::Exist] {
                    let invoke = rec.now();
                    let outcome = match kind {
                        Kind::Get => match stores[0].get(&key).map_err(ErrorCode::from) {
                            Ok(_) => Outcome::Foreign,
                            Err(e) => outcome::<()>(&Err(e)),
                        },
                        _ => match stores[0].is_exist(&key) {
                            Ok(b) => Outcome::Exists(b),
                            Err(e) => outcome::<()>(&Err(e.code)),
                        },
                    };
                    rec.op(Op {
                        client: 98,
                        kind,
                        key: key.clone(),
                        value: None,
                        force: false,
                        invoke,
                        complete: rec.now(),
                        outcome,
                    });
                }
            }
            "memory" => {
                rec.fault("memory-pressure");
                let cfg = ReplicateConfig {
                    replica_num: 1,
                    ..Default::default()
                };
                let n = (2 * SEGMENT as usize * 5 / 4) / FILL_OBJECT;
                let bytes = vec![0xeeu8; FILL_OBJECT];
                let first = fill_id;
                for _ in 0..n {
                    let _ = stores[1].put(&format!("fill/{fill_id}"), &bytes, &cfg, true);
                    fill_id += 1;
                }
                for i in first..fill_id {
                    let _ = stores[1].remove(&format!("fill/{i}"), true);
                }
                rec.fault("memory-pressure-end");
                pin(&stores[0]);
            }
            "kmem" => {
                rec.fault("kernel-memory-pressure");
                let hold = 1000 + rng.below(2000);
                let out = Command::new(bin_path("fault_memory_hog"))
                    .args([KMEM_FLOOR_MIB.to_string(), hold.to_string()])
                    .stderr(Stdio::null())
                    .output();
                let said = out.map_or_else(
                    |e| format!("not run: {e}"),
                    |o| {
                        let text = String::from_utf8_lossy(&o.stdout).into_owned();
                        let first = text.lines().next().unwrap_or("").to_string();
                        if text.contains("released") {
                            first
                        } else {
                            format!("{first}; killed before releasing ({})", o.status)
                        }
                    },
                );
                rec.fault(&format!("kernel-memory-pressure-end ({said})"));
                // A process the kernel killed instead of the hog is a kill like any other:
                // recorded as one and replaced.
                for (i, node) in nodes.iter_mut().enumerate() {
                    if node.child.try_wait().is_ok_and(|st| st.is_some()) {
                        rec.fault("node-kill");
                        rec.fault("(node killed under kernel memory pressure)");
                        *node = start_node(i);
                        rec.fault("node-restart");
                        pin(&stores[0]);
                    }
                }
                if etcd.exited() {
                    rec.fault("(etcd killed under kernel memory pressure)");
                    etcd.restart();
                    rec.fault("etcd-restart");
                }
                for m in &mut masters {
                    if m.child.try_wait().is_ok_and(|st| st.is_some()) {
                        rec.fault("(master killed under kernel memory pressure)");
                        *m = Master::start_in(m.ns.clone().as_deref(), &m.host.clone(), &args);
                        ever.lock().unwrap().push(admin(m));
                    }
                }
            }
            "partition" => {
                let Some(n) = &net else { continue };
                let far_leads = leader(&masters).is_some_and(|l| masters[l].ns.is_some());
                n.link(false);
                rec.fault(if far_leads != etcd_far {
                    "partition (the leader cut off from etcd)"
                } else {
                    "partition"
                });
                std::thread::sleep(Duration::from_millis(1000 + rng.below(2000)));
                n.link(true);
                rec.fault("partition-end");
            }
            "disk" => {
                let i = rng.below(nodes.len() as u64) as usize;
                let listed = |key: &str, addr: u64| {
                    stores[0].replicas(key).is_ok_and(|l| {
                        l.list.replicas.iter().any(|r| {
                            r.medium == ReplicaMedium::LocalDisk && r.buffer_address == addr
                        })
                    })
                };
                let (what, hit) = damage_disk(&disks[i], &mut rng, listed);
                match &hit {
                    // `disk-damage <key> ...`: the checker accepts that key's loss after it.
                    Some(_) => rec.fault(&format!("disk-damage {what} (node{i})")),
                    None => rec.fault(&format!("disk node{i} {what}")),
                }
                // The damaged copy read alone, if the master still lists it (its owner drops
                // it on the failed read), then an ordinary get: neither may return bytes that
                // were not written.
                // A pinned key's value is `value(1000 + i, 0)` (`pin`), a hot key's a write's.
                let probe = hit.as_ref().and_then(|(k, a)| {
                    let (n, base) = match k.strip_prefix("hot/") {
                        Some(n) => (n, 0),
                        None => (k.strip_prefix("pin/")?, 1000),
                    };
                    Some((base + n.parse::<usize>().ok()?, k.clone(), *a))
                });
                if let Some((k, key, addr)) = probe {
                    let invoke = rec.now();
                    let read = stores[0].replicas(&key).map(|l| {
                        let r = l.list.replicas.iter().find(|r| {
                            r.medium == ReplicaMedium::LocalDisk && r.buffer_address == addr
                        });
                        r.map(|r| {
                            let mut one = l.clone();
                            one.list.replicas = vec![r.clone()];
                            let mut b = vec![0u8; r.size as usize];
                            match stores[0].read_from(&one, 0, Dst::from(&mut b[..])) {
                                Ok(()) => decode(k, &b),
                                Err(e) => Outcome::Err(ErrorCode::from(e).code()),
                            }
                        })
                    });
                    match read {
                        // A pinned key is not in the checker's registers: its bytes are known.
                        Ok(Some(outcome)) if k >= 1000 => {
                            println!("  {key}: the damaged copy read alone: {outcome:?}");
                            assert!(
                                matches!(outcome, Outcome::Value(0) | Outcome::Err(_)),
                                "seed {seed}: {key}'s damaged disk copy read as {outcome:?}"
                            );
                        }
                        Ok(Some(outcome)) => {
                            println!("  {key}: the damaged copy read alone: {outcome:?}");
                            rec.op(Op {
                                client: 97,
                                kind: Kind::Get,
                                key: key.clone(),
                                value: None,
                                force: false,
                                invoke,
                                complete: rec.now(),
                                outcome,
                            });
                        }
                        Ok(None) => println!("  {key}: the damaged copy is not listed"),
                        Err(e) => println!("  {key}: lookup failed: {e}"),
                    }
                    if k < 1000 {
                        call(&stores[0], &rec, 97, Kind::Get, k, 0, false);
                    }
                }
            }
            other => panic!("unknown fault kind {other:?} in MC_FAULT_KINDS"),
        }
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().expect("worker");
    }
    poller.join().expect("poller");

    // Every hot key read once more, after the dust settled.
    wait_until(LEADER_BOUND, || leader(&masters).is_some())
        .unwrap_or_else(|| panic!("seed {seed}: no leader at the end"));
    std::thread::sleep(SETTLE);
    for key in 0..KEYS {
        let ok = wait_until(READ_BACK_BOUND, || {
            call(&stores[0], &rec, 100, Kind::Get, key, 0, false);
            !matches!(
                rec.hist.lock().unwrap().ops.last().map(|o| &o.outcome),
                Some(Outcome::Err(_))
            )
        });
        assert!(ok.is_some(), "seed {seed}: hot/{key} never read back");
    }
    rec.out.lock().unwrap().flush().expect("history flush");

    let hist = rec.hist.lock().unwrap().clone();
    let report = check(&hist);
    let mut by: BTreeMap<String, usize> = BTreeMap::new();
    for o in &hist.ops {
        let r = match &o.outcome {
            Outcome::Ok => "ok".to_string(),
            Outcome::Value(_) => "value".into(),
            Outcome::Foreign => "FOREIGN".into(),
            Outcome::NotFound => "not_found".into(),
            Outcome::Exists(b) => format!("exists={b}"),
            Outcome::Err(c) => format!("err{c}"),
        };
        *by.entry(format!("{:?} {r}", o.kind)).or_default() += 1;
    }
    let faults = hist
        .marks
        .iter()
        .filter(|m| matches!(m, Mark::Fault { .. }))
        .count();
    let evicted = hist
        .marks
        .iter()
        .filter_map(|m| match m {
            Mark::Evictions { total, .. } => Some(*total),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    println!(
        "fault_harness figures: seed {seed}, {seconds} s, {} operations, fault rounds \
         {counts:?} ({faults} fault events), {} reads checked, {evicted} keys evicted, \
         {} vanished values accepted (node killed), {} (evictions), {} (disk copy destroyed), \
         {} violations, {} in known open windows; history {path}",
        hist.ops.len(),
        report.reads_checked,
        report.lost_with_node,
        report.lost_to_eviction,
        report.lost_to_disk_fault,
        report.violations.len(),
        report.known.len()
    );
    println!("  outcomes: {by:?}");
    let mut rules: BTreeMap<String, usize> = BTreeMap::new();
    for v in &report.violations {
        let kind = hist
            .ops
            .get(v.op)
            .map_or("mark".into(), |o| format!("{:?}", o.kind));
        *rules.entry(format!("{} {kind}", v.rule)).or_default() += 1;
    }
    println!("  violations by rule: {rules:?}");
    for v in report.known.iter().take(10) {
        println!("  KNOWN OPEN WINDOW {}: {}", v.rule, v.detail);
    }
    for v in report.violations.iter().take(10) {
        let at = hist.ops.get(v.op).map_or(String::new(), |o| {
            format!(
                " (read {:.3}-{:.3} s)",
                o.invoke as f64 / 1e9,
                o.complete as f64 / 1e9
            )
        });
        println!("  VIOLATION {} {}{at}: {}", v.rule, v.key, v.detail);
    }
    // `MC_FAULT_STRICT=1`: the known open windows fail the run too.
    let strict = env_or("MC_FAULT_STRICT", 0u8) == 1;
    assert!(
        !strict || report.known.is_empty(),
        "seed {seed}: {} known-window violations, first: {}; history {path}",
        report.known.len(),
        report.known.first().map_or("", |v| v.detail.as_str())
    );
    assert!(
        report.ok(),
        "seed {seed}: {} violations, first: {} {}: {}; history {path}",
        report.violations.len(),
        report.violations[0].rule,
        report.violations[0].key,
        report.violations[0].detail
    );
    // A passing run's history goes unless it was asked for by name (CI's runs would
    // otherwise leave 16 MB each in the temporary directory).
    if named.is_none() {
        let _ = std::fs::remove_file(&path);
        println!("  the run passed: history removed (MC_FAULT_HISTORY=<path> keeps it)");
    }
    // The nodes' disk directories go after a passing run (a failed one keeps them).
    drop(nodes);
    let _ = std::fs::remove_dir_all(&scratch);
}

/// Checks a recorded history again: `MC_FAULT_CHECK=<history.jsonl>`; passes (printing why)
/// when the variable is unset.
#[test]
fn recheck_a_recorded_history() {
    let _env = mooncake_tests::env_lock();
    let Ok(path) = std::env::var("MC_FAULT_CHECK") else {
        println!("SKIP: set MC_FAULT_CHECK=<history.jsonl> to check a recorded history");
        return;
    };
    let text = std::fs::read_to_string(&path).expect("history file");
    let hist = History::from_jsonl(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
    let report = check(&hist);
    for v in &report.violations {
        println!("VIOLATION {} {} op {}: {}", v.rule, v.key, v.op, v.detail);
    }
    println!(
        "{path}: {} operations, {} reads checked, {} violations",
        hist.ops.len(),
        report.reads_checked,
        report.violations.len()
    );
    assert!(
        report.ok(),
        "{path}: {} violations",
        report.violations.len()
    );
}

/// The foreign-read diagnostic names what it sees: the seed-1 reproduction of violation 2 on
/// the code of its run read `fault_slow_writer` bytes (`docs/reliability.md`).
#[test]
fn foreign_bytes_are_told_apart() {
    let _env = mooncake_tests::env_lock();
    let slow: Vec<u8> = (0..4096usize)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(0x5a))
        .collect();
    assert_eq!(
        whose(&slow[512..]),
        "a fault_slow_writer's bytes (from its offset 0 mod 256)"
    );
    assert_eq!(
        whose(&slow[3..]),
        "a fault_slow_writer's bytes (from its offset 3 mod 256)"
    );
    let v = value(7, 42);
    assert_eq!(whose(&v), "starting like write Some(42) of hot/Some(7)");
    assert_eq!(
        whose(&v[100..]),
        "the inside of a write's value (not its start)"
    );
}
