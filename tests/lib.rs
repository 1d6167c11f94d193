//! Helpers for the multi-process integration tests in `tests/tests/`: find the built
//! binaries, pick free loopback ports, start a real `mooncake_master` and stop it, and speak
//! plain HTTP/1.1 to it.
//!
//! The binaries must be built first (`cargo build --workspace --bins`, which
//! `scripts/test.sh` does); a missing binary fails the test with that instruction.

pub mod checker;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Path of a workspace binary in the same target directory as the running test.
pub fn bin_path(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test-binary> -> target/<profile>/<name>
    let dir = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target profile dir");
    let p = dir.join(name);
    assert!(
        p.exists(),
        "{} not found: build the binaries first with `cargo build --workspace --bins`",
        p.display()
    );
    p
}

/// A command running the workspace binary `name`, inside network namespace `ns` when given
/// (`ip netns exec`, which execs it: the child's pid is the binary's).
pub fn command_in(ns: Option<&str>, name: &str) -> Command {
    program_in(ns, bin_path(name))
}

/// [`command_in`] for any program (a path).
pub fn program_in(ns: Option<&str>, program: impl AsRef<std::ffi::OsStr>) -> Command {
    match ns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).arg(program);
            c
        }
        None => Command::new(program),
    }
}

/// Runs `ip ARGS` (iproute2); the error names the command and its stderr.
pub fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// A loopback port nobody listens on right now, drawn from 20000-31999: below the kernel's
/// ephemeral range (32768+), so that the source ports of the many connections parallel tests
/// open cannot take it between this check and the server's bind. Each process starts at a
/// different point of the range.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const FIRST: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let seed = std::process::id().wrapping_mul(7919)
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
    let _ = NEXT.compare_exchange(u32::MAX, seed % SPAN, Ordering::SeqCst, Ordering::SeqCst);
    for _ in 0..SPAN {
        let port = (FIRST + NEXT.fetch_add(1, Ordering::SeqCst) % SPAN) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A running `mooncake_master` on loopback, killed when dropped.
pub struct Master {
    pub child: Child,
    /// Where its RPC and HTTP metadata listen (127.0.0.1 unless started with
    /// [`Master::start_host`] or [`Master::start_in`]).
    pub host: String,
    pub rpc_port: u16,
    pub metrics_port: u16,
    pub http_metadata_port: u16,
    /// Where its metrics listen: 127.0.0.1, or `host` for a master in a namespace.
    pub metrics_host: String,
    /// The network namespace it runs in ([`Master::start_in`]), if any.
    pub ns: Option<String>,
}

impl Master {
    /// Starts the master with the embedded HTTP metadata server and `extra` flags on free
    /// ports. If another process took a port in between (the master exits with a bind error),
    /// it tries again with new ports.
    pub fn start(extra: &[&str]) -> Master {
        Master::start_host("127.0.0.1", extra)
    }

    /// [`Master::start`] with its RPC and HTTP metadata on `host` (e.g. [`Netns::host_addr`],
    /// for nodes in a namespace to reach it).
    pub fn start_host(host: &str, extra: &[&str]) -> Master {
        Master::start_in(None, host, extra)
    }

    /// [`Master::start_host`] inside network namespace `ns` (`ip netns exec`), where `host`
    /// is its address: RPC, HTTP metadata and metrics all listen there (the namespace's
    /// loopback is its own).
    pub fn start_in(ns: Option<&str>, host: &str, extra: &[&str]) -> Master {
        for _ in 0..5 {
            let ports = (free_port(), free_port(), free_port());
            if let Some(m) = Master::try_start_on(ns, host, ports, extra) {
                return m;
            }
        }
        panic!("mooncake_master did not start on five sets of free ports");
    }

    /// A GET of `path` on its metrics port, `None` when the exchange fails.
    pub fn admin_get(&self, path: &str) -> Option<HttpReply> {
        try_http_at(&self.metrics_host, "GET", self.metrics_port, path, b"")
    }

    pub fn rpc_addr(&self) -> String {
        format!("{}:{}", self.host, self.rpc_port)
    }

    /// Sends a signal and waits for the exit status (at most `timeout`).
    pub fn signal_and_wait(&mut self, sig: i32, timeout: Duration) -> Option<ExitStatus> {
        // SAFETY: kill(2) on a child pid we own; no memory is touched.
        unsafe { libc::kill(self.child.id() as i32, sig) };
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(st)) = self.child.try_wait() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Master {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP answer: status code and body.
#[derive(Debug)]
pub struct HttpReply {
    pub status: u16,
    pub headers: String,
    pub body: Vec<u8>,
}

impl HttpReply {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// One HTTP/1.1 request with `Connection: close`, read to the end.
pub fn http(method: &str, port: u16, path: &str, body: &[u8]) -> HttpReply {
    try_http(method, port, path, body).expect("HTTP exchange with 127.0.0.1")
}

/// [`http`], or `None` when the connection or the exchange fails.
pub fn try_http(method: &str, port: u16, path: &str, body: &[u8]) -> Option<HttpReply> {
    try_http_at("127.0.0.1", method, port, path, body)
}

/// [`try_http`] to `host` instead of 127.0.0.1.
pub fn try_http_at(
    host: &str,
    method: &str,
    port: u16,
    path: &str,
    body: &[u8],
) -> Option<HttpReply> {
    // A bounded connect: `host` may sit behind a link that is down (a partition), where a
    // plain connect retries its SYN for two minutes.
    let addr = std::net::ToSocketAddrs::to_socket_addrs(&(host, port))
        .ok()?
        .next()?;
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).ok()?;
    s.write_all(body).ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let headers = String::from_utf8_lossy(&raw[..split]).into_owned();
    let status = headers
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())?;
    let mut body = raw[split + 4..].to_vec();
    if headers
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body = dechunk(&body);
    }
    Some(HttpReply {
        status,
        headers,
        body,
    })
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = b.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size =
            usize::from_str_radix(std::str::from_utf8(&b[..eol]).unwrap().trim(), 16).unwrap();
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + size]);
        b = &b[eol + 2 + size + 2..];
    }
}

impl Master {
    /// Starts the master on given ports (to restart it where its clients expect it).
    pub fn start_on(
        rpc_port: u16,
        metrics_port: u16,
        http_metadata_port: u16,
        extra: &[&str],
    ) -> Master {
        Master::try_start_on(
            None,
            "127.0.0.1",
            (rpc_port, metrics_port, http_metadata_port),
            extra,
        )
        .expect("mooncake_master exited before opening its ports")
    }

    /// Starts the master on the given ports; `None` if it exits before they open (a port was
    /// taken). Panics if it neither exits nor opens them within 10 s.
    /// `ports`: RPC, metrics, HTTP metadata.
    fn try_start_on(
        ns: Option<&str>,
        host: &str,
        ports: (u16, u16, u16),
        extra: &[&str],
    ) -> Option<Master> {
        let (rpc_port, metrics_port, http_metadata_port) = ports;
        let metrics_host = if ns.is_some() { host } else { "127.0.0.1" };
        let mut args = vec![
            format!("--rpc_port={rpc_port}"),
            format!("--rpc_address={host}"),
            format!("--metrics_port={metrics_port}"),
            format!("--metrics_host={metrics_host}"),
            "--enable_http_metadata_server=true".to_string(),
            format!("--http_metadata_server_host={host}"),
            format!("--http_metadata_server_port={http_metadata_port}"),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let child = command_in(ns, "mooncake_master")
            .args(&args)
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn mooncake_master");
        let mut m = Master {
            child,
            host: host.to_string(),
            rpc_port,
            metrics_port,
            http_metadata_port,
            metrics_host: metrics_host.to_string(),
            ns: ns.map(str::to_string),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(_)) = m.child.try_wait() {
                return None;
            }
            let open = |h: &str, p| TcpStream::connect((h, p)).is_ok();
            if open(host, rpc_port) && open(metrics_host, metrics_port) {
                return Some(m);
            }
            assert!(Instant::now() < deadline, "master ports never opened");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// One segment a storage node reported mounting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSegment {
    pub name: String,
    pub te_endpoint: String,
    /// `io_uring` or `blocking`.
    pub backend: String,
    pub base: u64,
    pub size: u64,
}

/// A running `mooncake_client` storage node, killed when dropped.
pub struct Node {
    pub child: Child,
    pub port: u16,
    /// The segments it mounted, shard by shard (from its start-up lines).
    pub segments: Vec<NodeSegment>,
}

impl Node {
    /// Starts a node on 127.0.0.1 against `master` (its RPC and HTTP metadata) with `extra`
    /// flags, and waits until it printed `mooncake_client ready`.
    pub fn start(master: &Master, extra: &[&str]) -> Node {
        Node::start_with_env(master, extra, &[])
    }

    /// [`Node::start`] with extra environment variables for the node process.
    pub fn start_with_env(master: &Master, extra: &[&str], env: &[(&str, &str)]) -> Node {
        Node::start_at(&master.rpc_addr(), &master.metadata_url(), extra, env)
    }

    /// Starts a node on 127.0.0.1 with the given master address (`host:port` or
    /// `etcd://...`) and metadata server, and waits until it printed `mooncake_client ready`.
    pub fn start_at(
        master_addr: &str,
        metadata: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Node {
        Node::start_in(None, "127.0.0.1", master_addr, metadata, extra, env)
    }

    /// [`Node::start_at`] on `host`, inside network namespace `ns` (`ip netns exec`) when
    /// given.
    pub fn start_in(
        ns: Option<&str>,
        host: &str,
        master_addr: &str,
        metadata: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Node {
        use std::io::BufRead;
        let port = free_port();
        let mut args = vec![
            format!("--host={host}"),
            format!("--port={port}"),
            format!("--master_server_address={master_addr}"),
            format!("--metadata_server={metadata}"),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut child = command_in(ns, "mooncake_client")
            .args(&args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn mooncake_client");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let mut segments = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = rx
                .recv_timeout(left)
                .expect("mooncake_client never printed `ready`");
            if line.trim() == "mooncake_client ready" {
                break;
            }
            // shard <i> segment <name> te_endpoint <ep> base <0x..> size <n> backend <b> [(why)]
            let w: Vec<&str> = line.split_whitespace().collect();
            if w.len() >= 12 && w[0] == "shard" {
                segments.push(NodeSegment {
                    name: w[3].to_string(),
                    te_endpoint: w[5].to_string(),
                    base: u64::from_str_radix(w[7].trim_start_matches("0x"), 16).expect("base"),
                    size: w[9].parse().expect("size"),
                    backend: w[11].to_string(),
                });
            }
        }
        Node {
            child,
            port,
            segments,
        }
    }

    /// Sends a signal and waits for the exit status (at most `timeout`).
    pub fn signal_and_wait(&mut self, sig: i32, timeout: Duration) -> Option<ExitStatus> {
        // SAFETY: kill(2) on a child pid we own; no memory is touched.
        unsafe { libc::kill(self.child.id() as i32, sig) };
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(st)) = self.child.try_wait() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---- helpers of the fault-injection tests (`tests/tests/fault_*.rs`) -----------------------

/// The value of an unlabelled sample `name` on the master's `/metrics` page, if present.
pub fn master_metric(m: &Master, name: &str) -> Option<f64> {
    let page = http("GET", m.metrics_port, "/metrics", b"").text();
    page.lines().find_map(|l| {
        let (n, v) = l.split_once(' ')?;
        (n == name).then(|| v.trim().parse().ok()).flatten()
    })
}

/// The segment names the master lists on `/get_all_segments`.
pub fn master_segments(m: &Master) -> Vec<String> {
    http("GET", m.metrics_port, "/get_all_segments", b"")
        .text()
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

/// Resident set size of process `pid` (`VmRSS` of `/proc/<pid>/status`), in bytes.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Polls `probe` every 20 ms until it holds or `timeout` passes; returns the time it took.
pub fn wait_until(timeout: Duration, mut probe: impl FnMut() -> bool) -> Option<Duration> {
    let t0 = Instant::now();
    loop {
        if probe() {
            return Some(t0.elapsed());
        }
        if t0.elapsed() >= timeout {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A fresh directory for the software verbs model's fabric (`MOONCAKE_RDMA_SIM`, shared by
/// every process of a test: `sim::scratch_fabric`); removed on drop.
pub struct SimFabric(PathBuf);

impl SimFabric {
    pub fn new() -> SimFabric {
        SimFabric(client::dataplane::transport::rdma::sim::scratch_fabric(
            "store",
        ))
    }

    pub fn path(&self) -> &str {
        self.0.to_str().expect("a UTF-8 path")
    }
}

impl Default for SimFabric {
    fn default() -> Self {
        SimFabric::new()
    }
}

impl Drop for SimFabric {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A second "host": a network namespace behind a veth pair (a private /30 of 10.231.0.0/16
/// picked from the pid; `.1` the host end, `.2` the namespace end), deleted on drop, whatever
/// happened. Services both sides must reach listen on [`Netns::host_addr`], which stays
/// reachable from the host while the link is down. An `unreachable` route for the /30 (a
/// higher metric than the veth's own) stands in for the cut link once the veth is down, so
/// that traffic for the namespace never falls through to the default route (in some sandboxes
/// a proxy there accepts every TCP connection). Needs root and iproute2.
pub struct Netns {
    /// The namespace's name, for `ip netns exec`.
    pub ns: String,
    host_if: String,
    /// The namespace's end of the veth.
    ns_if: String,
    pub host_addr: String,
    pub ns_addr: String,
    prefix: String,
    /// Whether the namespace's egress is shaped (tc tbf), so that a large batch read from
    /// the far node lasts long enough to be in flight when the link goes down.
    pub shaped: bool,
}

impl Netns {
    /// Creates the namespace and its link (up). With `shape`, the namespace's egress is
    /// limited to 400 Mbit/s (`tc tbf`, when available).
    /// `Err` (nothing made) when not root.
    pub fn create(shape: bool) -> Result<Netns, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("needs root (ip netns, veth)".into());
        }
        let pid = std::process::id();
        // A /30 in 10.231.0.0/16 chosen by the pid: .1 host end, .2 namespace end.
        let block = (pid % 16_384) * 4;
        let (b3, b4) = (block / 256, block % 256);
        let mut n = Netns {
            ns: format!("mcq{pid}"),
            host_if: format!("mqh{pid}"),
            ns_if: format!("mqn{pid}"),
            host_addr: format!("10.231.{b3}.{}", b4 + 1),
            ns_addr: format!("10.231.{b3}.{}", b4 + 2),
            prefix: format!("10.231.{b3}.{b4}/30"),
            shaped: false,
        };
        let peer = n.ns_if.clone();
        ip(&["netns", "add", &n.ns])?;
        // From here on, drop cleans up.
        ip(&[
            "link", "add", &n.host_if, "type", "veth", "peer", "name", &peer,
        ])?;
        ip(&["link", "set", &peer, "netns", &n.ns])?;
        ip(&[
            "addr",
            "add",
            &format!("{}/30", n.host_addr),
            "dev",
            &n.host_if,
        ])?;
        ip(&["link", "set", &n.host_if, "up"])?;
        ip(&["route", "add", "unreachable", &n.prefix, "metric", "4000"])?;
        let inside = |a: &[&str]| {
            let mut v = vec!["netns", "exec", &n.ns, "ip"];
            v.extend_from_slice(a);
            ip(&v)
        };
        inside(&["addr", "add", &format!("{}/30", n.ns_addr), "dev", &peer])?;
        inside(&["link", "set", &peer, "up"])?;
        inside(&["link", "set", "lo", "up"])?;
        // 400 Mbit/s out of the namespace: an 8 MiB batch read takes ~0.2 s. Optional.
        n.shaped = shape
            && Command::new("ip")
                .args([
                    "netns", "exec", &n.ns, "tc", "qdisc", "add", "dev", &peer, "root",
                ])
                .args([
                    "tbf", "rate", "400mbit", "burst", "256kb", "latency", "100ms",
                ])
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
        Ok(n)
    }

    /// Makes the namespace's address silent, as a host that lost power or a deleted pod's
    /// address is: the namespace's end of the veth goes down and the host keeps sending to it
    /// (its route and a permanent neighbour entry stay), so every packet is dropped and no
    /// reset or unreachable answer comes back.
    pub fn silence(&self) {
        let mac = Command::new("ip")
            .args(["netns", "exec", &self.ns, "cat"])
            .arg(format!("/sys/class/net/{}/address", self.ns_if))
            .output()
            .expect("read the namespace end's MAC address");
        let mac = String::from_utf8_lossy(&mac.stdout).trim().to_string();
        ip(&[
            "neigh",
            "replace",
            &self.ns_addr,
            "lladdr",
            &mac,
            "dev",
            &self.host_if,
            "nud",
            "permanent",
        ])
        .expect("pin the namespace end's neighbour entry");
        ip(&[
            "netns",
            "exec",
            &self.ns,
            "ip",
            "link",
            "set",
            &self.ns_if,
            "down",
        ])
        .expect("take the namespace end of the veth down");
    }

    /// Takes the host end of the veth down (`false`: the cut) or up again.
    pub fn link(&self, up: bool) {
        ip(&["link", "set", &self.host_if, if up { "up" } else { "down" }])
            .expect("toggle the host end of the veth");
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&[
            "route",
            "del",
            "unreachable",
            &self.prefix,
            "metric",
            "4000",
        ]);
        let _ = ip(&["link", "del", &self.host_if]);
        let _ = ip(&["netns", "del", &self.ns]);
    }
}

/// A throwaway single-member etcd (Debian's `etcd-server`, `/usr/bin/etcd`) on 127.0.0.1,
/// killed and its data removed when dropped. [`Etcd::stop`] and [`Etcd::restart`] take it
/// down and bring it back on the same ports with the same data.
pub struct Etcd {
    child: Option<Child>,
    /// The network namespace it runs in ([`Etcd::start_in`]), if any.
    ns: Option<String>,
    /// Where it listens: 127.0.0.1 unless started with [`Etcd::start_on`].
    pub host: String,
    pub port: u16,
    peer_port: u16,
    dir: PathBuf,
}

/// Where Debian's `etcd-server` puts the binary.
pub const ETCD_BIN: &str = "/usr/bin/etcd";

impl Etcd {
    /// Starts etcd and waits until it answers `/health`; `None` (with the reason printed) when
    /// the binary is missing.
    pub fn start() -> Option<Etcd> {
        Etcd::start_on("127.0.0.1")
    }

    /// [`Etcd::start`] listening on `host` (e.g. [`Netns::host_addr`]).
    pub fn start_on(host: &str) -> Option<Etcd> {
        Etcd::start_in(None, host)
    }

    /// [`Etcd::start_on`] inside network namespace `ns` (`ip netns exec`), where `host` is its
    /// address; restarts stay there.
    pub fn start_in(ns: Option<&str>, host: &str) -> Option<Etcd> {
        if !std::path::Path::new(ETCD_BIN).exists() {
            eprintln!("SKIP: {ETCD_BIN} not found (install Debian's etcd-server)");
            return None;
        }
        let dir = std::env::temp_dir().join(format!(
            "mooncake-etcd-{}-{}",
            std::process::id(),
            free_port()
        ));
        let mut e = Etcd {
            child: None,
            ns: ns.map(str::to_string),
            host: host.to_string(),
            port: free_port(),
            peer_port: free_port(),
            dir,
        };
        e.restart();
        Some(e)
    }

    /// `<host>:<client port>`.
    pub fn addr(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// The flags of a master in HA on this etcd under `cluster`, then `extra`.
    pub fn ha_master_flags(&self, cluster: &str, extra: &[&str]) -> Vec<String> {
        let mut flags = vec![
            "--enable_ha=true".to_string(),
            format!("--etcd_endpoints={}", self.addr()),
            format!("--cluster_id={cluster}"),
        ];
        flags.extend(extra.iter().map(|f| f.to_string()));
        flags
    }

    /// Kills etcd (SIGKILL): its clients see connections refused.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Whether etcd was started and has exited since (killed by something other than
    /// [`Etcd::stop`], such as the kernel's OOM killer).
    pub fn exited(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().is_ok_and(|st| st.is_some()))
    }

    /// (Re)starts etcd on the same ports and data directory and waits until it is healthy.
    pub fn restart(&mut self) {
        self.stop();
        let client_url = format!("http://{}:{}", self.host, self.port);
        let peer_url = format!("http://{}:{}", self.host, self.peer_port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("etcd log file");
        let child = program_in(self.ns.as_deref(), ETCD_BIN)
            .args([
                "--data-dir",
                &self.dir.join("data").to_string_lossy(),
                "--name",
                "default",
                "--listen-client-urls",
                &client_url,
                "--advertise-client-urls",
                &client_url,
                "--listen-peer-urls",
                &peer_url,
                "--initial-advertise-peer-urls",
                &peer_url,
                "--initial-cluster",
                &format!("default={peer_url}"),
            ])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn etcd");
        self.child = Some(child);
        let healthy = wait_until(Duration::from_secs(30), || {
            try_http_at(&self.host, "GET", self.port, "/health", b"")
                .is_some_and(|r| r.status == 200)
        });
        assert!(
            healthy.is_some(),
            "etcd on {} never became healthy",
            self.addr()
        );
    }
}

impl Etcd {
    fn log_path(&self) -> PathBuf {
        std::env::temp_dir().join(format!("mooncake-etcd-{}.log", self.port))
    }
}

impl Drop for Etcd {
    /// Stops etcd and removes its data; its log stays only for a test that failed.
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
        if std::thread::panicking() {
            eprintln!("etcd's log: {}", self.log_path().display());
        } else {
            let _ = std::fs::remove_file(self.log_path());
        }
    }
}

/// A store client on 127.0.0.1 that contributes no segment (every replica lives on storage
/// nodes), with a `local_buffer` staging buffer, against the master at `master_addr`
/// (`host:port` or `etcd://...`) and the transfer-engine metadata at `metadata`.
pub fn remote_store(
    master_addr: &str,
    metadata: &str,
    local_buffer: u64,
) -> Result<client::Store, protocol::ErrorCode> {
    remote_store_at("127.0.0.1", master_addr, metadata, local_buffer)
}

/// [`remote_store`] on `local_hostname` (e.g. [`Netns::host_addr`]).
pub fn remote_store_at(
    local_hostname: &str,
    master_addr: &str,
    metadata: &str,
    local_buffer: u64,
) -> Result<client::Store, protocol::ErrorCode> {
    client::Store::setup(client::StoreConfig {
        local_hostname: local_hostname.into(),
        metadata_server: metadata.to_string(),
        global_segment_size: 0,
        local_buffer_size: local_buffer,
        protocol: "tcp".into(),
        rdma_devices: String::new(),
        master_server_addr: master_addr.to_string(),
        tenant_id: String::new(),
        ssd_offload: None,
    })
}

impl Master {
    /// The HTTP metadata URL of this master's embedded metadata server.
    pub fn metadata_url(&self) -> String {
        format!("http://{}:{}/metadata", self.host, self.http_metadata_port)
    }
}

/// xorshift64*: a small seeded generator for the randomized tests (the same seed gives the
/// same schedule and the same calls).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// The environment variable `name` parsed as `T`, or `default` when unset or malformed (the
/// knobs of the randomized tests: seeds, durations, counts).
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The environment lock (`dataplane::test_env`): one copy for every test crate.
pub use dataplane::test_env::{env_lock, EnvGuard};
