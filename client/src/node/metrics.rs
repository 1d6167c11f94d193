//! The storage node's observability endpoint: `GET /metrics` (Prometheus text 0.0.4) and
//! `GET /health` on `--metrics_port`, served by one small thread so the shards never see it.
//!
//! What it exports, per shard: the memory kind its segment got (`hugetlb`, `thp`, `plain`),
//! how many bytes of it are populated from its base (`segment_populated_bytes`, see
//! `dataplane::mem::populate`),
//! the server backend (`io_uring`, or `blocking` with the reason it fell back), the request
//! and connection counters, and the event-loop stall detector. `render` writes that text
//! from the node's shards ([`super::Node::render_metrics`]); [`MetricsServer`] serves whatever
//! text its [`Render`] callback returns, so it knows nothing of shards.

use std::sync::Arc;

use super::Shard;
use crate::http_endpoint::{HttpEndpoint, Reply};

/// Renders the metrics text on demand.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// The node's endpoint: `/metrics` from `render`, `/health` answering `OK`.
pub struct MetricsServer(HttpEndpoint);

impl MetricsServer {
    /// Binds `addr` (port 0 picks one) and serves until dropped.
    pub fn start(addr: std::net::SocketAddr, render: Render) -> std::io::Result<MetricsServer> {
        let routes = Arc::new(move |path: &str| match path {
            "/metrics" => Some(Reply::ok(crate::http_endpoint::PROMETHEUS, render())),
            "/health" => Some(Reply::ok("text/plain", "OK".into())),
            _ => None,
        });
        HttpEndpoint::start(addr, "mc-node-metrics", routes).map(MetricsServer)
    }

    pub fn local_addr(&self) -> std::net::SocketAddr {
        self.0.local_addr()
    }
}

/// Upstream's client HTTP server on a storage node (`--enable_http_server`, `--http_port`):
/// `/health` as upstream's JSON (`{"status":"healthy","code":0}`), `/metrics` (the node's
/// text, as on `--metrics_port`) and `/metrics/summary` (one line per shard).
pub fn serve_client_http(
    addr: std::net::SocketAddr,
    node: Arc<super::Node>,
) -> std::io::Result<HttpEndpoint> {
    let routes = Arc::new(move |path: &str| match path {
        "/health" => Some(crate::http_endpoint::health_json(0)),
        "/metrics" => Some(Reply::ok(
            crate::http_endpoint::PROMETHEUS,
            node.render_metrics(),
        )),
        "/metrics/summary" => {
            let mut out = String::from("Client Metrics Summary\n");
            for s in node.segments() {
                out.push_str(&format!("segment {} size {} B\n", s.name, s.size));
            }
            Some(Reply::ok("text/plain", out))
        }
        _ => None,
    });
    HttpEndpoint::start(addr, "mc-client-http", routes)
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

/// `segment_populated_bytes`: per shard, how far from its segment's base the populator's walk
/// got (each chunk below is populated, being populated, or was touched by puts first; with
/// `--prefault` the whole segment; else none).
fn render_populated(out: &mut String, shards: &[Shard]) {
    use std::fmt::Write;
    let _ = writeln!(out, "# TYPE mooncake_node_segment_populated_bytes gauge");
    for (i, sh) in shards.iter().enumerate() {
        // With `--prefault`, or no populator, the bytes faulted in before ready (or none).
        let populated = match &sh.populator {
            Some(p) => p.populated_bytes() as u64,
            None if sh.prefaulted => sh.descriptor.size,
            None => 0,
        };
        let _ = writeln!(
            out,
            "mooncake_node_segment_populated_bytes{{shard=\"{i}\"}} {populated}"
        );
    }
}

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
    let _ = writeln!(
        out,
        "# TYPE mooncake_rdma_tcp_fallbacks_total counter\nmooncake_rdma_tcp_fallbacks_total {}",
        crate::rdma::tcp_fallbacks()
    );
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
    render_populated(&mut out, shards);
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
    write_counters(&mut out, shards, &counters);
    out
}

/// Each counter as one family, one sample per shard.
fn write_counters(out: &mut String, shards: &[Shard], counters: &[StatCounter]) {
    use std::fmt::Write;
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpStream};

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

    /// A shard started with the default `--populate` has its whole segment populated in
    /// the background, and says so in `segment_populated_bytes`; `--populate=false` leaves it
    /// to the puts.
    #[test]
    fn a_shard_populates_its_segment_in_the_background_unless_told_not_to() {
        use std::net::{IpAddr, Ipv4Addr};
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let bind = SocketAddr::new(ip, 0);
        let mut cfg = crate::node::NodeConfig::default();
        let len = 8 << 20;
        let on = crate::node::start_shard(0, "h:1", len, bind, ip, &cfg).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let want = format!("mooncake_node_segment_populated_bytes{{shard=\"0\"}} {len}\n");
        while !render(std::slice::from_ref(&on)).contains(&want) {
            assert!(
                std::time::Instant::now() < deadline,
                "not populated in 60 s"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        cfg.populate = false;
        let off = crate::node::start_shard(0, "h:2", len, bind, ip, &cfg).unwrap();
        assert!(off.populator.is_none());
        let text = render(std::slice::from_ref(&off));
        assert!(
            text.contains("mooncake_node_segment_populated_bytes{shard=\"0\"} 0\n"),
            "{text}"
        );
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
        assert_eq!(typed.len(), 16, "{text}");
        assert!(
            text.contains("\nmooncake_rdma_tcp_fallbacks_total "),
            "{text}"
        );
        // The first two (shards, RDMA fall-backs) are the process's; the others per shard.
        for family in &typed[2..] {
            for shard in 0..shards.len() {
                let sample = format!("{family}{{shard=\"{shard}\"");
                let n = text.lines().filter(|l| l.starts_with(&sample)).count();
                assert_eq!(n, 1, "{sample}: {n} samples\n{text}");
            }
        }
    }
}
