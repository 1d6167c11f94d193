//! The storage node's observability endpoint: `GET /metrics` (Prometheus text 0.0.4) and
//! `GET /health` on `--metrics_port`, served by one small thread so the shards never see it.
//!
//! What it exports, per shard: the memory kind its segment got (`hugetlb`, `thp`, `plain`),
//! the server backend (`io_uring`, or `blocking` with the reason it fell back), the request
//! and connection counters, and the event-loop stall detector. `render` writes that text
//! from the node's shards ([`super::Node::render_metrics`]); [`MetricsServer`] serves whatever
//! text its [`Render`] callback returns, so it knows nothing of shards.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::Shard;

/// Bytes of request head read at most.
const REQUEST_HEAD_MAX_BYTES: usize = 8 * 1024;
/// A client that sends nothing for this long is dropped.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the accept loop checks for shutdown.
const ACCEPT_POLL: Duration = Duration::from_millis(50);

/// Renders the metrics text on demand.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Binds `addr` (port 0 picks one) and serves until dropped.
    pub fn start(addr: SocketAddr, render: Render) -> std::io::Result<MetricsServer> {
        let listener = TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("mc-node-metrics".into())
            .spawn(move || {
                while !s.load(Ordering::SeqCst) {
                    match listener.accept() {
                        Ok((sock, _)) => {
                            let _ = answer(sock, &render);
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            std::thread::sleep(ACCEPT_POLL)
                        }
                        Err(_) => std::thread::sleep(ACCEPT_POLL),
                    }
                }
            })?;
        Ok(MetricsServer {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Reads one request head and answers it; every connection is closed after one answer.
fn answer(mut sock: TcpStream, render: &Render) -> std::io::Result<()> {
    sock.set_nonblocking(false)?;
    sock.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    sock.set_write_timeout(Some(REQUEST_TIMEOUT))?;
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = sock.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
        if head.len() > REQUEST_HEAD_MAX_BYTES {
            return respond(&mut sock, 431, "text/plain", "request header too large\n");
        }
    }
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET", "/metrics") => respond(&mut sock, 200, "text/plain; version=0.0.4", &render()),
        ("GET", "/health") => respond(&mut sock, 200, "text/plain", "OK"),
        ("GET", _) => respond(&mut sock, 404, "text/plain", "not found\n"),
        _ => respond(&mut sock, 405, "text/plain", "method not allowed\n"),
    }
}

fn respond(sock: &mut TcpStream, status: u16, ctype: &str, body: &str) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Request Header Fields Too Large",
    };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    sock.write_all(head.as_bytes())?;
    sock.write_all(body.as_bytes())
}

/// Escapes a Prometheus label value.
pub fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A per-shard server counter: metric name and how to read it.
type StatCounter = (
    &'static str,
    fn(&dataplane::mem::served::ServerStats) -> u64,
);

/// The node's Prometheus text: per shard, its memory kind, server backend (and why it fell
/// back), request and connection counters, and the event-loop stall detector. Every family is
/// one group: its `# TYPE` line, then one sample per shard, labelled `shard="<index>"`.
pub(super) fn render(shards: &[Shard]) -> String {
    use std::fmt::Write;
    use std::sync::atomic::Ordering::Relaxed;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# TYPE mooncake_node_shards gauge\nmooncake_node_shards {}",
        shards.len()
    );
    // Each family is one group, its TYPE line first: the text format asks for it, and a
    // parser that reads family by family would otherwise split a family in two.
    let _ = writeln!(out, "# TYPE mooncake_node_segment_bytes gauge");
    for (i, sh) in shards.iter().enumerate() {
        let _ = writeln!(
            out,
            "mooncake_node_segment_bytes{{shard=\"{i}\",segment=\"{}\"}} {}",
            label(&sh.descriptor.name),
            sh.descriptor.size
        );
    }
    let _ = writeln!(out, "# TYPE mooncake_node_segment_memory_kind gauge");
    for (i, sh) in shards.iter().enumerate() {
        let _ = writeln!(
            out,
            "mooncake_node_segment_memory_kind{{shard=\"{i}\",kind=\"{}\"}} 1",
            sh.kind.as_str()
        );
    }
    let _ = writeln!(out, "# TYPE mooncake_node_io_backend gauge");
    for (i, sh) in shards.iter().enumerate() {
        let why = sh.server.fallback_reason().map(label).unwrap_or_default();
        let _ = writeln!(
            out,
            "mooncake_node_io_backend{{shard=\"{i}\",backend=\"{}\",fallback_reason=\"{why}\"}} 1",
            sh.server.backend()
        );
    }
    let counters: [StatCounter; 10] = [
        ("connections_accepted_total", |s| {
            s.connections_accepted.load(Relaxed)
        }),
        ("connections_refused_total", |s| {
            s.connections_refused.load(Relaxed)
        }),
        ("connections_aborted_total", |s| {
            s.connections_aborted.load(Relaxed)
        }),
        ("requests_ok_total", |s| s.requests_ok.load(Relaxed)),
        ("requests_rejected_total", |s| {
            s.requests_rejected.load(Relaxed)
        }),
        ("frames_malformed_total", |s| {
            s.frames_malformed.load(Relaxed)
        }),
        ("connections_unauthenticated_total", |s| {
            s.connections_unauthenticated.load(Relaxed)
        }),
        ("loop_iterations_total", |s| s.loop_iterations.load(Relaxed)),
        ("loop_stalls_total", |s| s.loop_stalls.load(Relaxed)),
        ("loop_stall_max_us", |s| s.loop_stall_max_us.load(Relaxed)),
    ];
    for (name, read) in counters {
        let kind = if name.ends_with("_total") {
            "counter"
        } else {
            "gauge"
        };
        let _ = writeln!(out, "# TYPE mooncake_node_{name} {kind}");
        for (i, sh) in shards.iter().enumerate() {
            let _ = writeln!(
                out,
                "mooncake_node_{name}{{shard=\"{i}\"}} {}",
                read(sh.server.stats())
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(addr: SocketAddr, req: &str) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(req.as_bytes()).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn serves_metrics_health_and_refuses_the_rest() {
        let render: Render = Arc::new(|| "x_total 1\n".to_string());
        let srv = MetricsServer::start("127.0.0.1:0".parse().unwrap(), render).unwrap();
        let a = srv.local_addr();
        let m = get(a, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(
            m.starts_with("HTTP/1.1 200") && m.ends_with("x_total 1\n"),
            "{m}"
        );
        assert!(get(a, "GET /health HTTP/1.1\r\n\r\n").ends_with("OK"));
        assert!(get(a, "GET /nope HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        assert!(get(a, "POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
        assert_eq!(label("a\"b\\c"), "a\\\"b\\\\c");
    }

    #[test]
    fn renders_each_family_as_one_group_with_one_sample_per_shard() {
        use std::net::{IpAddr, Ipv4Addr};
        let cfg = crate::node::NodeConfig::default();
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let shards: Vec<Shard> = ["h:1", "h:1#\"1\""]
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let bind = SocketAddr::new(ip, 0);
                crate::node::start_shard(i, name, 1 << 20, bind, ip, &cfg).unwrap()
            })
            .collect();
        let text = render(&shards);
        assert!(text.contains("\nmooncake_node_shards 2\n"), "{text}");
        // A quote in a segment name is escaped, not closing the label early.
        assert!(
            text.contains("segment=\"h:1#\\\"1\\\"\"} 1048576\n"),
            "{text}"
        );
        let mut typed: Vec<&str> = Vec::new();
        for line in text.lines() {
            if let Some(t) = line.strip_prefix("# TYPE ") {
                let (name, kind) = t.split_once(' ').unwrap();
                assert!(!typed.contains(&name), "second TYPE line for {name}");
                let counter = name.ends_with("_total");
                assert_eq!(kind, if counter { "counter" } else { "gauge" }, "{line}");
                typed.push(name);
                continue;
            }
            let name = line.split(['{', ' ']).next().unwrap();
            assert_eq!(
                typed.last(),
                Some(&name),
                "not in its family's group, after its TYPE line: {line}"
            );
        }
        assert_eq!(typed.len(), 14, "{text}");
        for family in &typed[1..] {
            for shard in 0..shards.len() {
                let sample = format!("{family}{{shard=\"{shard}\"");
                let n = text.lines().filter(|l| l.starts_with(&sample)).count();
                assert_eq!(n, 1, "{sample}: {n} samples\n{text}");
            }
        }
    }
}
