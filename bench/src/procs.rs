//! The processes a benchmark starts for itself: a master and a storage node on 127.0.0.1 with
//! free ports, both killed when their handle is dropped (also when the benchmark panics).
//! The binaries are taken from the directory of the running benchmark (`target/release`).

use std::io::BufRead;
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a started process may take to open its ports or say it is ready.
const START_TIMEOUT: Duration = Duration::from_secs(20);

fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let path = exe.parent().expect("exe directory").join(name);
    assert!(
        path.exists(),
        "{} missing: cargo build --release --bins",
        path.display()
    );
    path
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

/// A child process killed and reaped on drop.
pub struct Spawned(pub Child);

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A `mooncake_master` with its RPC, metrics and HTTP metadata ports on 127.0.0.1.
pub struct LocalMaster {
    pub proc: Spawned,
    pub rpc_addr: String,
    pub metadata_url: String,
}

impl LocalMaster {
    pub fn start(extra: &[String]) -> LocalMaster {
        let (rpc, metrics, http) = (free_port(), free_port(), free_port());
        let mut args = vec![
            format!("--rpc_port={rpc}"),
            "--rpc_address=127.0.0.1".into(),
            format!("--metrics_port={metrics}"),
            "--metrics_host=127.0.0.1".into(),
            "--enable_http_metadata_server=true".into(),
            "--http_metadata_server_host=127.0.0.1".into(),
            format!("--http_metadata_server_port={http}"),
        ];
        args.extend(extra.iter().cloned());
        let child = Command::new(bin("mooncake_master"))
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn mooncake_master");
        let mut proc = Spawned(child);
        let deadline = Instant::now() + START_TIMEOUT;
        let open = |p| TcpStream::connect(("127.0.0.1", p)).is_ok();
        while !(open(rpc) && open(http)) {
            if let Ok(Some(status)) = proc.0.try_wait() {
                panic!("mooncake_master exited at start: {status}");
            }
            assert!(Instant::now() < deadline, "master ports never opened");
            std::thread::sleep(Duration::from_millis(20));
        }
        LocalMaster {
            proc,
            rpc_addr: format!("127.0.0.1:{rpc}"),
            metadata_url: format!("http://127.0.0.1:{http}/metadata"),
        }
    }

    pub fn pid(&self) -> u32 {
        self.proc.0.id()
    }
}

/// Starts a `mooncake_client` storage node contributing `segment_bytes` to `master` (and
/// `extra`, one more flag), and waits until it prints `mooncake_client ready`.
pub fn start_node(master: &LocalMaster, segment_bytes: u64, extra: &str) -> Spawned {
    let mut child = Command::new(bin("mooncake_client"))
        .args([
            "--host=127.0.0.1".to_string(),
            format!("--port={}", free_port()),
            format!("--master_server_address={}", master.rpc_addr),
            format!("--metadata_server={}", master.metadata_url),
            format!("--global_segment_size={segment_bytes}"),
            extra.to_string(),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn mooncake_client");
    let stdout = child.stdout.take().expect("piped stdout");
    let node = Spawned(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // Keeps draining the node's output after `ready`, so it never blocks on a full pipe.
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if line.trim() == "mooncake_client ready" {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(START_TIMEOUT)
        .expect("mooncake_client never printed `ready`");
    node
}

/// `/proc/loadavg`'s first three fields, for the report.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// `VmRSS` of `pid` in bytes.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Open file descriptors of `pid`.
pub fn fd_count(pid: u32) -> Option<usize> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count())
}

/// CPU time `pid` has used (user + system), from `/proc/PID/stat`.
pub fn cpu_time(pid: u32) -> Option<std::time::Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) start at state, field 3.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    // USER_HZ is 100 on every Linux this runs on (`getconf CLK_TCK`).
    Some(std::time::Duration::from_millis(ticks * 10))
}
