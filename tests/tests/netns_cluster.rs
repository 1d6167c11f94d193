//! A multi-host cluster on one machine: every "host" is a network namespace with its own
//! address, and all traffic between them crosses real (virtual) interfaces.
//!
//! ```text
//!               namespace mcs<pid>: bridge br0 (its own netns, so the host's firewall and
//!               bridge-netfilter rules never see the traffic)
//!      ┌──────────────┬───────────────┼───────────────┬──────────────┐
//!   host .1        A  .2           B  .3           C  .4          D  .5      (10.233.N.0/24)
//!   (this test:    etcd,           storage node    storage node   store client (a thread of
//!    observes)     3 masters (HA)                                 this test, moved into D)
//! ```
//!
//! Each namespace has one veth into the bridge; the test process reaches the masters' admin
//! ports through a veth of its own (`.1`). `N` is derived from the pid (skipping a /24 the host
//! already uses).
//!
//! Checked, with `replica_num = 2`: a put from D lands one replica on B and one on C, and reads
//! back exactly. B's link goes down (its bridge port): every key still reads back from C's
//! replica; the master quarantines, then expires B (`--client_ttl=4`), and puts keep working,
//! on C alone. B's link comes back: B's node re-registers with the leader (its segment is
//! listed again) and re-reports what it holds, so the keys written before the cut have two
//! replicas again. Then the leader master is SIGKILLed: a standby takes over, both nodes
//! re-mount on it, every key written so far reads back exactly from D, and new puts land on B
//! and C again.
//!
//! The second test here, `a_leader_cut_off_from_etcd_stops_serving_before_another_is_elected`,
//! moves the first leader into D beside the client (its own doc says what it checks).
//!
//! Needs root, `ip netns` (iproute2) and bridge support, and Debian's etcd-server; otherwise
//! they print why and pass without running. Each takes ~15 s. Logs of etcd, the masters and
//! the nodes are kept under `/tmp/mooncake-netns-<pid>/` (`-cut-<pid>` for the second test)
//! when a test fails.

use std::io::{BufRead, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Sender};
use std::time::{Duration, Instant};

use client::{Store, StoreConfig};
use mooncake_tests::{bin_path, ip, program_in, wait_until, Etcd, ETCD_BIN};
use protocol::{ErrorCode, ReplicaList, ReplicateConfig};

/// Roles and their last address byte; the host (this test) is `.1`.
const HOSTS: [(char, u8); 4] = [('a', 2), ('b', 3), ('c', 4), ('d', 5)];
const MASTERS: usize = 3;
const MASTER_RPC_PORT: u16 = 50051;
const MASTER_ADMIN_PORT: u16 = 9003;
const NODE_PORT: u16 = 50052;
/// Seconds without a ping after which the masters expire a client (and its segments).
const CLIENT_TTL_S: u64 = 4;
/// `--ha_lease_ttl_sec` of the masters: a leader that cannot renew stops serving within it.
const HA_LEASE_TTL_S: u64 = 2;
/// `MC_TRANSFER_TIMEOUT` of the store client (seconds): a read from the cut host gives up
/// after this and goes to the other replica.
const TRANSFER_TIMEOUT_S: u64 = 2;
const VALUE: usize = 64 << 10;
const KEYS: usize = 12;

/// The namespaces, the bridge and the veths; all deleted on drop, whatever happened.
struct Net {
    pid: u32,
    /// `10.233.N`: the /24 of this run.
    net: String,
    switch: String,
    made: Vec<String>,
}

impl Net {
    fn ns(&self, role: char) -> String {
        format!("mc{role}{}", self.pid)
    }

    fn addr(&self, role: char) -> String {
        let last = HOSTS.iter().find(|h| h.0 == role).expect("known role").1;
        format!("{}.{last}", self.net)
    }

    /// The bridge port (in the switch namespace) of `role`'s link.
    fn port(&self, role: char) -> String {
        format!("p{role}{}", self.pid)
    }

    fn create() -> Result<Net, String> {
        // The pid and a count of the nets this process made, so that tests run as threads of
        // one process (`cargo test`) get names of their own.
        static MADE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let pid =
            std::process::id() * 10 + MADE.fetch_add(1, std::sync::atomic::Ordering::SeqCst) % 10;
        let used = Command::new("ip")
            .args(["-o", "-4", "addr"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let n = (0..254)
            .map(|i| (pid + i) % 254 + 1)
            .find(|n| !used.contains(&format!("10.233.{n}.")))
            .ok_or("every 10.233.N.0/24 is in use")?;
        let mut net = Net {
            pid,
            net: format!("10.233.{n}"),
            switch: format!("mcs{pid}"),
            made: Vec::new(),
        };
        let sw = net.switch.clone();
        ip(&["netns", "add", &sw])?;
        net.made.push(sw.clone());
        ip(&["-n", &sw, "link", "set", "lo", "up"])?;
        ip(&["-n", &sw, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &sw, "link", "set", "br0", "up"])?;
        for (role, _) in HOSTS {
            let ns = net.ns(role);
            ip(&["netns", "add", &ns])?;
            net.made.push(ns.clone());
            let (port, eth) = (net.port(role), format!("e{role}{pid}"));
            ip(&[
                "-n", &sw, "link", "add", &port, "type", "veth", "peer", "name", &eth, "netns", &ns,
            ])?;
            ip(&["-n", &sw, "link", "set", &port, "master", "br0"])?;
            ip(&["-n", &sw, "link", "set", &port, "up"])?;
            let cidr = format!("{}/24", net.addr(role));
            ip(&["-n", &ns, "addr", "add", &cidr, "dev", &eth])?;
            ip(&["-n", &ns, "link", "set", &eth, "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        // The test's own port on the bridge.
        let (host_if, port) = (format!("mch{pid}"), format!("ph{pid}"));
        ip(&[
            "link", "add", &host_if, "type", "veth", "peer", "name", &port, "netns", &sw,
        ])?;
        ip(&["-n", &sw, "link", "set", &port, "master", "br0"])?;
        ip(&["-n", &sw, "link", "set", &port, "up"])?;
        ip(&["addr", "add", &format!("{}.1/24", net.net), "dev", &host_if])?;
        ip(&["link", "set", &host_if, "up"])?;
        Ok(net)
    }

    /// Takes `role`'s link up or down (its bridge port: the host is cut off from every other).
    fn link(&self, role: char, up: bool) {
        let port = self.port(role);
        ip(&[
            "-n",
            &self.switch,
            "link",
            "set",
            &port,
            if up { "up" } else { "down" },
        ])
        .expect("toggle a bridge port");
    }

    /// A command run inside `role`'s namespace.
    fn command(&self, role: char, program: &std::path::Path) -> Command {
        program_in(Some(&self.ns(role)), program)
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        // Deleting a namespace deletes its veths and their peers.
        let _ = ip(&["link", "del", &format!("mch{}", self.pid)]);
        for ns in self.made.iter().rev() {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

/// Processes started in the namespaces, killed on drop; their logs go to `dir`, which is
/// removed unless the test is failing.
struct Procs {
    dir: PathBuf,
    etcd: Option<Etcd>,
    masters: Vec<Option<Child>>,
    nodes: Vec<Child>,
}

impl Procs {
    /// None yet; logs under the temporary directory `name`.
    fn new(name: &str) -> Procs {
        let dir = std::env::temp_dir().join(name);
        std::fs::create_dir_all(&dir).expect("log dir");
        Procs {
            dir,
            etcd: None,
            masters: Vec::new(),
            nodes: Vec::new(),
        }
    }

    fn log(&self, name: &str) -> Stdio {
        std::fs::File::create(self.dir.join(format!("{name}.log")))
            .expect("log file")
            .into()
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        // Etcd stops itself when dropped.
        self.etcd = None;
        let all = self
            .masters
            .iter_mut()
            .flatten()
            .chain(self.nodes.iter_mut());
        for c in all {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            eprintln!("netns_cluster: logs kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// One HTTP GET to `addr` (from the host side of the bridge): status and body.
fn get(addr: &str, path: &str) -> Option<(u16, String)> {
    let sa = addr.parse().ok()?;
    let mut s = TcpStream::connect_timeout(&sa, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_string()))
}

/// The namespaces for a test, or `None` (with the reason printed) where they cannot be made:
/// not root, no etcd, no `ip netns` or bridge support.
fn net_or_skip(test: &str) -> Option<Net> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("SKIPPED {test}: needs root (ip netns, veth, bridge)");
        return None;
    }
    if !std::path::Path::new(ETCD_BIN).exists() {
        println!("SKIPPED {test}: {ETCD_BIN} not found (install Debian's etcd-server)");
        return None;
    }
    match Net::create() {
        Ok(n) => Some(n),
        Err(e) => {
            println!("SKIPPED {test}: cannot set up the namespaces: {e}");
            None
        }
    }
}

/// Work for the client thread.
type Job = Box<dyn FnOnce(&Store) + Send>;

/// The store client, living on a thread that moved itself into namespace D before setting
/// the store up: its sockets, and those of every thread the store spawns, are D's.
struct RemoteClient {
    jobs: Option<Sender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RemoteClient {
    fn start(ns: &str, cfg: StoreConfig) -> RemoteClient {
        let path = format!("/var/run/netns/{ns}");
        let (jobs, rx) = channel::<Job>();
        let (ready_tx, ready_rx) = channel();
        let thread = std::thread::spawn(move || {
            let f = std::fs::File::open(&path).expect("open the namespace");
            use std::os::fd::AsRawFd;
            // SAFETY: setns(2) on a descriptor we own; it changes this thread's network
            // namespace only (a thread may switch its network namespace freely).
            let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns into {path}");
            let store = Store::setup(cfg);
            let store = match store {
                Ok(s) => {
                    ready_tx.send(Ok(())).unwrap();
                    s
                }
                Err(e) => {
                    ready_tx.send(Err(e)).unwrap();
                    return;
                }
            };
            for job in rx {
                job(&store);
            }
            store.close();
        });
        ready_rx
            .recv()
            .expect("client thread died")
            .expect("store setup in namespace D");
        RemoteClient {
            jobs: Some(jobs),
            thread: Some(thread),
        }
    }

    fn call<R: Send + 'static>(&self, f: impl FnOnce(&Store) -> R + Send + 'static) -> R {
        let (tx, rx) = channel();
        let job = Box::new(move |s: &Store| {
            let _ = tx.send(f(s));
        });
        self.jobs
            .as_ref()
            .unwrap()
            .send(job)
            .expect("client thread");
        rx.recv().expect("client thread died")
    }

    fn put(&self, key: &str) -> Result<(), ErrorCode> {
        self.put_n(key, 2)
    }

    /// Puts `key` with `replicas` replicas.
    fn put_n(&self, key: &str, replicas: u32) -> Result<(), ErrorCode> {
        let key = key.to_string();
        self.call(move |s| put_value(s, &key, replicas))
    }

    /// Reads `key` and checks its bytes.
    fn get(&self, key: &str) -> Result<(), String> {
        let key = key.to_string();
        self.call(move |s| match s.get(&key) {
            Ok(v) if v == value(&key) => Ok(()),
            Ok(v) => Err(format!("{key}: {} wrong bytes", v.len())),
            Err(e) => Err(format!("{key}: {e:?}")),
        })
    }

    fn replicas(&self, key: &str) -> Result<ReplicaList, ErrorCode> {
        let key = key.to_string();
        self.call(move |s| s.replicas(&key).map(|l| l.list).map_err(ErrorCode::from))
    }

    /// The segments holding `key`'s replicas, sorted.
    fn segments(&self, key: &str) -> Vec<String> {
        let mut v: Vec<String> = self
            .replicas(key)
            .map(|l| l.replicas.into_iter().map(|r| r.segment_name).collect())
            .unwrap_or_default();
        v.sort();
        v
    }
}

impl Drop for RemoteClient {
    fn drop(&mut self) {
        self.jobs.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Puts `key` with its [`value`] and `replicas` replicas, on the client's own thread.
fn put_value(s: &Store, key: &str, replicas: u32) -> Result<(), ErrorCode> {
    let cfg = ReplicateConfig {
        replica_num: replicas,
        ..ReplicateConfig::default()
    };
    s.put(key, &value(key), &cfg, false)
        .map_err(ErrorCode::from)
}

fn value(key: &str) -> Vec<u8> {
    let seed = key
        .bytes()
        .fold(7u8, |a, b| a.wrapping_mul(31).wrapping_add(b));
    (0..VALUE)
        .map(|i| seed.wrapping_add((i % 251) as u8))
        .collect()
}

/// Starts a process in `role`'s namespace with its output in `<dir>/<name>.log`.
fn spawn_in(
    net: &Net,
    procs: &Procs,
    role: char,
    name: &str,
    program: &str,
    args: &[String],
) -> Child {
    net.command(role, &bin_path(program))
        .args(args)
        .stdin(Stdio::null())
        .stdout(procs.log(&format!("{name}.out")))
        .stderr(procs.log(name))
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {name}: {e}"))
}

/// Starts etcd in namespace A and waits until it is healthy; returns its client address.
fn start_etcd(net: &Net, procs: &mut Procs) -> String {
    let etcd = Etcd::start_in(Some(&net.ns('a')), &net.addr('a'))
        .expect("etcd in namespace A (its binary was checked by net_or_skip)");
    let addr = etcd.addr();
    procs.etcd = Some(etcd);
    addr
}

/// A store client in `role`'s namespace, with no segment of its own, finding the leader
/// through `etcd`.
fn client_in(net: &Net, role: char, etcd: &str) -> RemoteClient {
    RemoteClient::start(
        &net.ns(role),
        StoreConfig {
            local_hostname: net.addr(role),
            metadata_server: format!("etcd://{etcd}"),
            global_segment_size: 0,
            local_buffer_size: 16 << 20,
            protocol: "tcp".into(),
            rdma_devices: String::new(),
            master_server_addr: format!("etcd://{etcd}"),
            tenant_id: String::new(),
            ssd_offload: None,
        },
    )
}

/// Starts HA master `i` in `role`'s namespace (RPC port `MASTER_RPC_PORT + 10 i`, admin port
/// `MASTER_ADMIN_PORT + 10 i`, on that host's address), with a 2 s etcd lease.
fn start_master(net: &Net, procs: &Procs, role: char, i: usize, etcd: &str) -> Child {
    let host = net.addr(role);
    let args = vec![
        "--enable_ha=true".to_string(),
        format!("--etcd_endpoints={etcd}"),
        format!("--rpc_address={host}"),
        format!("--rpc_port={}", MASTER_RPC_PORT + 10 * i as u16),
        format!("--metrics_host={host}"),
        format!("--metrics_port={}", MASTER_ADMIN_PORT + 10 * i as u16),
        format!("--ha_lease_ttl_sec={HA_LEASE_TTL_S}"),
        format!("--client_ttl={CLIENT_TTL_S}"),
        "--quarantine_grace=1500ms".to_string(),
    ];
    spawn_in(
        net,
        procs,
        role,
        &format!("master-{i}"),
        "mooncake_master",
        &args,
    )
}

/// Starts a storage node in `role`'s namespace and waits for its `ready` line; returns the
/// process and its segment name.
fn start_node(net: &Net, procs: &Procs, role: char, etcd: &str) -> (Child, String) {
    let args = [
        format!("--host={}", net.addr(role)),
        format!("--port={NODE_PORT}"),
        format!("--master_server_address=etcd://{etcd}"),
        format!("--metadata_server=etcd://{etcd}"),
        "--global_segment_size=64 MB".to_string(),
        "--shards=1".to_string(),
    ];
    let mut child = net
        .command(role, &bin_path("mooncake_client"))
        .args(&args)
        // Pings give up quickly, so one stuck on the cut link does not delay the next.
        .env("MC_RPC_TIMEOUT_MS", "1500")
        .env("MC_RPC_CONNECT_TIMEOUT_MS", "1000")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(procs.log(&format!("node-{role}")))
        .spawn()
        .expect("spawn mooncake_client");
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            // Keep reading after the test stopped listening, so the node never blocks.
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut segment = String::new();
    loop {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|_| panic!("node {role} never printed `ready`"));
        if line.trim() == "mooncake_client ready" {
            break;
        }
        let w: Vec<&str> = line.split_whitespace().collect();
        if w.len() >= 4 && w[0] == "shard" {
            segment = w[3].to_string();
        }
    }
    assert!(!segment.is_empty(), "node {role} printed no segment");
    (child, segment)
}

/// Index of the master that answers `/role` with `leader`.
fn leader(net: &Net, alive: &[bool]) -> Option<usize> {
    (0..MASTERS).filter(|&i| alive[i]).find(|&i| {
        get(&admin(net, i), "/role").is_some_and(|(s, b)| s == 200 && b.trim() == "leader")
    })
}

fn admin(net: &Net, i: usize) -> String {
    admin_at(net, 'a', i)
}

/// The admin address of master `i` running on `role`'s host.
fn admin_at(net: &Net, role: char, i: usize) -> String {
    format!("{}:{}", net.addr(role), MASTER_ADMIN_PORT + 10 * i as u16)
}

/// The segments the master `i` lists.
fn segments_of(net: &Net, i: usize) -> Vec<String> {
    get(&admin(net, i), "/get_all_segments")
        .filter(|(s, _)| *s == 200)
        .map(|(_, b)| {
            b.lines()
                .filter(|l| !l.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_cluster_across_namespaces_survives_a_cut_host_and_a_leader_kill() {
    let _env = mooncake_tests::env_lock();
    let Some(net) = net_or_skip("netns_cluster") else {
        return;
    };
    let t0 = Instant::now();
    // Read by `Store::setup`; set before any thread of this test binary starts.
    std::env::set_var("MC_TRANSFER_TIMEOUT", TRANSFER_TIMEOUT_S.to_string());
    let mut procs = Procs::new(&format!("mooncake-netns-{}", net.pid));

    // Host A: etcd and three masters.
    let etcd = start_etcd(&net, &mut procs);
    for i in 0..MASTERS {
        let m = start_master(&net, &procs, 'a', i, &etcd);
        procs.masters.push(Some(m));
    }
    let mut alive = [true; MASTERS];
    let mut lead = None;
    wait_until(Duration::from_secs(15), || {
        lead = leader(&net, &alive);
        lead.is_some()
    })
    .expect("no master became leader");
    let first_leader = lead.unwrap();

    // Hosts B and C: one storage node each.
    let (node_b, seg_b) = start_node(&net, &procs, 'b', &etcd);
    procs.nodes.push(node_b);
    let (node_c, seg_c) = start_node(&net, &procs, 'c', &etcd);
    procs.nodes.push(node_c);
    let both = {
        let mut v = vec![seg_b.clone(), seg_c.clone()];
        v.sort();
        v
    };
    wait_until(Duration::from_secs(10), || {
        let mut s = segments_of(&net, first_leader);
        s.sort();
        s == both
    })
    .expect("the leader never listed both nodes' segments");

    // Host D: the store client.
    let d = client_in(&net, 'd', &etcd);
    let t_up = t0.elapsed();

    // Puts from D land on both node hosts and read back.
    let before: Vec<String> = (0..KEYS).map(|i| format!("before/{i}")).collect();
    for k in &before {
        d.put(k).unwrap_or_else(|e| panic!("put {k}: {e:?}"));
        assert_eq!(d.segments(k), both, "{k} not on one segment per node host");
        d.get(k).expect("get across hosts");
    }

    // Cut host B.
    let t_cut = Instant::now();
    net.link('b', false);
    for k in &before {
        d.get(k)
            .unwrap_or_else(|e| panic!("get with host B cut off: {e}"));
    }
    let reads_during_cut = t_cut.elapsed();
    wait_until(Duration::from_secs(CLIENT_TTL_S + 10), || {
        segments_of(&net, first_leader) == [seg_c.clone()]
    })
    .expect("the leader never dropped the cut node's segment");
    let expired = t_cut.elapsed();
    let during: Vec<String> = (0..KEYS).map(|i| format!("during/{i}")).collect();
    for k in &during {
        d.put(k)
            .unwrap_or_else(|e| panic!("put {k} with host B cut off: {e:?}"));
        assert_eq!(
            d.segments(k),
            std::slice::from_ref(&seg_c),
            "{k} placed off host C"
        );
    }
    for k in before.iter().chain(&during) {
        d.get(k)
            .unwrap_or_else(|e| panic!("get with B expired: {e}"));
    }

    // Host B comes back: its node re-registers and re-reports what it holds.
    let t_back = Instant::now();
    net.link('b', true);
    let rejoined = wait_until(Duration::from_secs(15), || {
        let mut s = segments_of(&net, first_leader);
        s.sort();
        s == both
    })
    .expect("host B's node never re-registered after its link came back");
    let rereported = wait_until(Duration::from_secs(10), || {
        before.iter().all(|k| d.segments(k) == both)
    })
    .expect("keys written before the cut never had their replica on B back");

    // Kill the leader: a standby takes over, the nodes re-mount, D follows.
    let t_kill = Instant::now();
    if let Some(mut m) = procs.masters[first_leader].take() {
        let _ = m.kill();
        let _ = m.wait();
    }
    alive[first_leader] = false;
    let mut next = None;
    wait_until(Duration::from_secs(15), || {
        next = leader(&net, &alive);
        next.is_some()
    })
    .expect("no standby took over");
    let new_leader = next.unwrap();
    let failover = t_kill.elapsed();
    wait_until(Duration::from_secs(10), || {
        let mut s = segments_of(&net, new_leader);
        s.sort();
        s == both
    })
    .expect("the nodes never re-mounted on the new leader");
    for k in before.iter().chain(&during) {
        d.get(k)
            .unwrap_or_else(|e| panic!("get after the leader kill: {e}"));
    }
    let after: Vec<String> = (0..KEYS).map(|i| format!("after/{i}")).collect();
    for k in &after {
        d.put(k)
            .unwrap_or_else(|e| panic!("put {k} after the leader kill: {e:?}"));
        assert_eq!(d.segments(k), both, "{k} not on both node hosts");
        d.get(k).expect("get after the leader kill");
    }
    let recovered = t_kill.elapsed();
    println!(
        "netns cluster ({}.0/24): up in {t_up:?}; with B cut, {KEYS} reads took \
         {reads_during_cut:?}, B expired {expired:?} after the cut; B re-registered \
         {rejoined:?} after its link came back, its replicas re-reported {rereported:?} later \
         (link up {:?} ago); leader {first_leader} killed, master {new_leader} leads after \
         {failover:?}, all reads and new puts done {recovered:?} after the kill; total {:?}",
        net.net,
        t_back.elapsed(),
        t0.elapsed()
    );
    drop(d);
    drop(procs);
    drop(net);
}

/// Milliseconds since the Unix epoch on this host's clock (the masters stamp their terms with
/// the same clock).
fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// One call the client in D made to the leader it knew while D was cut off.
#[derive(Debug)]
struct Probe {
    what: String,
    /// Unix ms when the call returned: no later than any answer it carries was made.
    ended_ms: u64,
    result: Result<(), ErrorCode>,
}

/// A leader cut off from etcd but not from its clients stops answering before a standby is
/// elected, and what it acknowledged before it stopped survives the failover.
///
/// ```text
///   host A: etcd, masters 1 and 2 (standbys)      host D: master 0 (the leader), a storage
///                                                  node and the store client
/// ```
///
/// D's link goes down. D's client keeps calling master 0 (puts into D's node and replica
/// lookups), which cannot renew its lease: it must answer until its serving window closes,
/// then refuse (`-1010`), and never answer again while cut off. A master in A wins once etcd
/// expires the lease. Checked: every answer master 0 gave ended before the new leader's term
/// began (`term_started_unix_ms` of its `/health`, stamped before it could serve); after the
/// first refusal no call succeeds; once D's link is back, master 0 is a standby, D's node and
/// client follow the new leader, and every put master 0 acknowledged, before the cut or in
/// its last window, reads back exactly.
#[test]
fn a_leader_cut_off_from_etcd_stops_serving_before_another_is_elected() {
    let _env = mooncake_tests::env_lock();
    let Some(net) = net_or_skip("the cut-off leader") else {
        return;
    };
    let t0 = Instant::now();
    std::env::set_var("MC_TRANSFER_TIMEOUT", TRANSFER_TIMEOUT_S.to_string());
    // The client's calls to the cut leader, and its look-ups of etcd, give up quickly.
    std::env::set_var("MC_RPC_TIMEOUT_MS", "1000");
    std::env::set_var("MC_RPC_CONNECT_TIMEOUT_MS", "500");
    let mut procs = Procs::new(&format!("mooncake-netns-cut-{}", net.pid));
    let etcd = start_etcd(&net, &mut procs);
    // Master 0 starts alone in D, so it wins; then the standbys in A.
    procs
        .masters
        .push(Some(start_master(&net, &procs, 'd', 0, &etcd)));
    let role_of = |role: char, i: usize| {
        get(&admin_at(&net, role, i), "/role")
            .filter(|(s, _)| *s == 200)
            .map(|(_, b)| b.trim().to_string())
    };
    wait_until(Duration::from_secs(15), || {
        role_of('d', 0).as_deref() == Some("leader")
    })
    .expect("master 0 never became leader");
    for i in 1..MASTERS {
        let m = start_master(&net, &procs, 'a', i, &etcd);
        procs.masters.push(Some(m));
    }
    wait_until(Duration::from_secs(15), || {
        (1..MASTERS).all(|i| role_of('a', i).as_deref() == Some("standby"))
    })
    .expect("the masters in A never came up as standbys");
    let (node_d, seg_d) = start_node(&net, &procs, 'd', &etcd);
    procs.nodes.push(node_d);
    let d = client_in(&net, 'd', &etcd);
    let before: Vec<String> = (0..KEYS).map(|i| format!("before/{i}")).collect();
    for k in &before {
        d.put_n(k, 1).unwrap_or_else(|e| panic!("put {k}: {e:?}"));
    }
    // Reads wait for the new term's recovery fence (`docs/ha.md`) to pass.
    for k in &before {
        wait_until(Duration::from_secs(10), || d.segments(k) == [seg_d.clone()])
            .unwrap_or_else(|| panic!("{k} not on D's node: {:?}", d.replicas(k)));
    }

    // Cut D off: master 0 keeps its clients and loses etcd and the other masters.
    let cut_ms = unix_ms();
    net.link('d', false);
    let probe_for = Duration::from_secs(HA_LEASE_TTL_S + 5);
    let probes: Vec<Probe> = d.call(move |s| {
        let mut out = Vec::new();
        let end = Instant::now() + probe_for;
        let mut j = 0;
        while Instant::now() < end {
            let key = format!("cut/{j}");
            let put = put_value(s, &key, 1);
            out.push(Probe {
                what: format!("put {key}"),
                ended_ms: unix_ms(),
                result: put,
            });
            let look = s.replicas("before/0").map(|_| ()).map_err(ErrorCode::from);
            out.push(Probe {
                what: "replicas before/0".into(),
                ended_ms: unix_ms(),
                result: look,
            });
            j += 1;
            std::thread::sleep(Duration::from_millis(20));
        }
        out
    });
    // The new leader in A, elected while D was still cut off.
    let mut new_leader = None;
    wait_until(Duration::from_secs(10), || {
        new_leader = (1..MASTERS).find(|&i| role_of('a', i).as_deref() == Some("leader"));
        new_leader.is_some()
    })
    .expect("no master in A took over");
    let new_leader = new_leader.unwrap();
    let health = get(&admin(&net, new_leader), "/health").expect("the new leader's /health");
    let term_started_ms = serde_json::from_str::<serde_json::Value>(&health.1)
        .ok()
        .and_then(|h| h["term_started_unix_ms"].as_u64())
        .unwrap_or_else(|| panic!("no term_started_unix_ms in {}", health.1));
    let heal_ms = unix_ms();
    net.link('d', true);
    assert!(
        (cut_ms..heal_ms).contains(&term_started_ms),
        "the new term began at {term_started_ms}, not while D was cut off ({cut_ms}..{heal_ms})"
    );

    let answered: Vec<&Probe> = probes.iter().filter(|p| p.result.is_ok()).collect();
    let last_answer_ms = answered.iter().map(|p| p.ended_ms).max();
    if let Some(last) = last_answer_ms {
        assert!(
            last < term_started_ms,
            "master 0 answered {} {} ms after the new term began: {answered:?}",
            answered.last().map_or("", |p| p.what.as_str()),
            last - term_started_ms
        );
    }
    let first_refusal = probes
        .iter()
        .find(|p| p.result.is_err())
        .expect("master 0 never stopped answering while cut off");
    let answered_after_refusal: Vec<&Probe> = probes
        .iter()
        .skip_while(|p| p.result.is_ok())
        .filter(|p| p.result.is_ok())
        .collect();
    assert!(
        answered_after_refusal.is_empty(),
        "calls succeeded after master 0 first refused ({first_refusal:?}): \
         {answered_after_refusal:?}"
    );

    // D is back: master 0 learns its lease is gone, D's node and client follow the leader.
    wait_until(Duration::from_secs(15), || {
        role_of('d', 0).as_deref() == Some("standby")
    })
    .expect("master 0 never stepped down after its link came back");
    wait_until(Duration::from_secs(15), || {
        segments_of(&net, new_leader) == [seg_d.clone()]
    })
    .expect("D's node never re-mounted on the new leader");
    let acked: Vec<String> = answered
        .iter()
        .filter_map(|p| p.what.strip_prefix("put ").map(str::to_string))
        .collect();
    let mut read_back = 0;
    for k in before.iter().chain(&acked) {
        wait_until(Duration::from_secs(10), || d.get(k).is_ok()).unwrap_or_else(|| {
            panic!(
                "{k}, acknowledged by master 0, does not read back after the failover: {:?}",
                d.get(k)
            )
        });
        read_back += 1;
    }
    println!(
        "cut-off leader: D cut at +0 ms; master 0 answered {} calls, the last at +{} ms, and \
         first refused at +{} ms ({:?}); master {new_leader} in A began its term at +{} ms \
         ({} ms after master 0's last answer); D back at +{} ms; {read_back} acknowledged \
         keys read back ({} put in the last window); {} calls in all; total {:?}",
        answered.len(),
        last_answer_ms.map_or(0, |t| t - cut_ms),
        first_refusal.ended_ms - cut_ms,
        first_refusal.result,
        term_started_ms - cut_ms,
        last_answer_ms.map_or(0, |t| term_started_ms - t),
        heal_ms - cut_ms,
        acked.len(),
        probes.len(),
        t0.elapsed()
    );
    drop(d);
    drop(procs);
    drop(net);
}
