//! The store client's own HTTP endpoint (`setup(enable_client_http_server=True,
//! client_http_port=P)`, upstream's client HTTP server): `GET /health`, `/metrics` and
//! `/metrics/summary`, answered from a weak reference, so the endpoint never keeps a closed
//! store alive (it answers 503 once the store is gone).
//!
//! `/health`: `{"status":"healthy","code":0}` (upstream's body) while the master answers, else
//! 503 `{"status":"unhealthy","code":N}` with [`Store::health`]'s code. `/metrics`: upstream's
//! `mooncake_transfer_read_bytes` / `mooncake_transfer_write_bytes` (label
//! `client_mode="real"`) and ours, `mooncake_client_path_bytes{path}` (bytes by transfer
//! path). Upstream's latency histograms and per-RPC counters are not kept here.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Weak};

use super::Store;
use crate::http_endpoint::{health_json, HttpEndpoint, Reply, PROMETHEUS};

/// Serves `store`'s endpoint on `addr` until the returned endpoint is dropped.
pub fn serve(store: Weak<Store>, addr: SocketAddr) -> std::io::Result<HttpEndpoint> {
    let routes = Arc::new(move |path: &str| {
        let store = store.upgrade();
        match path {
            "/health" => Some(health(store.as_deref())),
            "/metrics" => Some(match store {
                Some(s) => Reply::ok(PROMETHEUS, metrics(&s)),
                None => gone(),
            }),
            "/metrics/summary" => Some(match store {
                Some(s) => Reply::ok("text/plain", summary(&s)),
                None => gone(),
            }),
            _ => None,
        }
    });
    HttpEndpoint::start(addr, "mc-client-http", routes)
}

fn gone() -> Reply {
    Reply {
        status: 503,
        content_type: "text/plain",
        body: "store closed\n".into(),
    }
}

fn health(store: Option<&Store>) -> Reply {
    health_json(store.map_or(1, Store::health))
}

fn metrics(s: &Store) -> String {
    let c = s.path_counts();
    let mut out = String::new();
    for (name, help, v) in [
        (
            "mooncake_transfer_read_bytes",
            "Total bytes read",
            c.read_bytes,
        ),
        (
            "mooncake_transfer_write_bytes",
            "Total bytes written",
            c.write_bytes,
        ),
    ] {
        let _ = write!(
            out,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name}{{client_mode=\"real\"}} {v}\n"
        );
    }
    let name = "mooncake_client_path_bytes";
    let _ = write!(
        out,
        "# HELP {name} Bytes moved by each transfer path\n# TYPE {name} counter\n"
    );
    for (path, v) in [
        ("own_memcpy", c.own_memcpy_bytes),
        ("shm_memcpy", c.shm_memcpy_bytes),
        ("tcp", c.tcp_bytes),
        ("rdma", c.rdma_bytes),
    ] {
        let _ = writeln!(out, "{name}{{path=\"{path}\"}} {v}");
    }
    let name = "mooncake_client_disk_same_host_reads_total";
    let _ = write!(
        out,
        "# HELP {name} Disk replicas read from a same-host owner's files by this process\n\
         # TYPE {name} counter\n{name} {}\n",
        c.disk_same_host_reads
    );
    let name = "mooncake_rdma_tcp_fallbacks_total";
    let _ = write!(
        out,
        "# HELP {name} Setups that asked for rdma, found no RDMA device and ran TCP\n\
         # TYPE {name} counter\n{name} {}\n",
        crate::rdma::tcp_fallbacks()
    );
    out
}

fn summary(s: &Store) -> String {
    let c = s.path_counts();
    format!(
        "Client Metrics Summary\n=== Transfer Metrics Summary ===\nTotal Read: {} B\n\
         Total Write: {} B\n",
        c.read_bytes, c.write_bytes
    )
}
