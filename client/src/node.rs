//! The storage node (`mooncake_client`): memory contributed to the pool by a process that
//! runs no application, served by shared-nothing shards.
//!
//! Each of the `--shards` shards owns one [`Segment`] (`--global_segment_size` split evenly,
//! rounded up to the page size), one [`ServedMemory`] table holding just that segment and one
//! data server on its own port. Each shard's segment is mounted at the master as its own
//! segment, so a replica lives in exactly one shard and a request reaches exactly one shard:
//!
//! | shard | segment name | `te_endpoint` | `host_id` |
//! |---|---|---|---|
//! | 0 | `host:port` | `ip:data_port_0` | `ip` |
//! | i > 0 | `host:port#i` | `ip:data_port_i` | `ip` |
//!
//! `host`/`port` are `--host`/`--port` (`--host=0.0.0.0` is advertised as the address that
//! routes outwards, else 127.0.0.1); `data_port_i` is `--data_port + i`, or an ephemeral port
//! when `--data_port=0` (the default). Store clients connect straight to the replica's
//! `transport_endpoint` (= the segment's `te_endpoint`). When `--metadata_server` is an HTTP or etcd
//! URL, each shard's descriptor is also published under `mooncake/ram/<segment name>`, so a
//! transfer engine can open a shard by name; failure to publish is reported and not fatal.
//!
//! Each shard's table keeps a catalog of the objects written into its segment (writers record
//! them with `CATALOG_PUT`). The node pings the master every second, dropping the catalog
//! entries of ranges the master says it freed; `NEED_REMOUNT` (the master restarted or
//! expired us) re-mounts every shard with `ReMountSegment`, reporting every catalogued object
//! so the master rebuilds its index (see [`crate::recovery`] and `docs/recovery.md`).
//! [`Node::shutdown`] unmounts every shard and removes the descriptors.
//!
//! Invariants: a shard's server serves only its own segment; the segments stay mapped until
//! the servers are dropped (the `ServedMemory` table holds them).

use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dataplane::mem::served::{ServedMemory, ServerConfig};
use dataplane::mem::{HugepagePolicy, SegmentKind, SegmentOptions};
use dataplane::metadata::desc::{BufferDesc, SegmentDesc};
use dataplane::metadata::{Keys, MetadataBackend, MetadataStore};
use dataplane::transport::{serve, Server};
use protocol::message::{MountSegment, UnmountSegment};
use protocol::{ClientStatus, Segment as SegmentDescriptor, Uuid};

use crate::master::{ClientError, MasterClient};
use crate::recovery;

/// How often the node pings the master.
pub const PING_INTERVAL: Duration = Duration::from_secs(1);
/// How long start-up keeps trying to reach the master.
pub const MASTER_CONNECT_PATIENCE: Duration = Duration::from_secs(10);
/// Most shards one node runs.
pub const SHARDS_MAX: usize = 256;

/// The node's flags (upstream's `mooncake_client` gflags plus `--shards`/`--cores`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeConfig {
    pub host: String,
    pub port: u16,
    pub global_segment_size: u64,
    pub local_buffer_size: u64,
    pub master_server_address: String,
    pub metadata_server: String,
    pub protocol: String,
    pub device_names: String,
    pub threads: usize,
    pub shards: usize,
    /// First data port (shard i uses `data_port + i`); 0 picks ephemeral ports.
    pub data_port: u16,
    /// `/metrics` and `/health` port (0: off).
    pub metrics_port: u16,
    /// Fault every segment page in at start-up.
    pub prefault: bool,
    /// `--cluster_id` (default `MC_STORE_CLUSTER_ID`, else `mooncake_cluster`): which HA
    /// leader an `etcd://` master address follows, and the namespace of published descriptors
    /// (see [`dataplane::metadata::Keys::for_store`]).
    pub cluster_id: String,
    /// `--auth_token_file`: the cluster secret's file (`None`: `MC_AUTH_TOKEN` /
    /// `MC_AUTH_TOKEN_FILE` decide; see `protocol::auth`).
    pub auth_token_file: Option<std::path::PathBuf>,
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            host: "0.0.0.0".into(),
            port: 50052,
            global_segment_size: 4 << 30,
            local_buffer_size: 0,
            master_server_address: "127.0.0.1:50051".into(),
            metadata_server: "http://127.0.0.1:8080/metadata".into(),
            protocol: "tcp".into(),
            device_names: String::new(),
            threads: 1,
            shards: 1,
            data_port: 0,
            metrics_port: 0,
            prefault: false,
            cluster_id: crate::store::cluster_id_from_env(),
            auth_token_file: None,
        }
    }
}

/// Upstream flags accepted and ignored (the features behind them are not built here).
const IGNORED_FLAGS: &[&str] = &[
    "tenant_id",
    "start_offload_rpc_server",
    "enable_http_server",
    "http_port",
];

/// Usage text for `--help`.
pub const USAGE: &str = "mooncake_client: a storage node contributing memory to a Mooncake store,
and the standalone client that dummy clients on this host (setup_dummy) put and get through

flags (--flag=value or --flag value):
  --host=0.0.0.0                 address to bind and advertise
  --port=50052                   port in segment names (host:port, host:port#i) and of the
                                 dummy-client socket @mooncake-rs-dummy/<port> that
                                 setup_dummy(..., \"host:port\") attaches to
  --global_segment_size=\"4 GB\"   memory contributed, split evenly over the shards (B/KB/MB/GB/TB)
  --local_buffer_size=0          accepted for compatibility
  --master_server_address=127.0.0.1:50051   (or etcd://h1:p1;h2:p2: follow the HA leader)
  --cluster_id=mooncake_cluster  HA cluster to follow and descriptor namespace
                                 (default: MC_STORE_CLUSTER_ID, else mooncake_cluster)
  --metadata_server=http://127.0.0.1:8080/metadata   (or etcd://h:p, a bare h:p for etcd,
                                 or P2PHANDSHAKE: publish nothing)
  --protocol=tcp
  --device_names=                accepted for compatibility
  --threads=1                    accepted for compatibility
  --shards=1 (alias --cores)     shards, each with its own segment and data port
  --data_port=0                  first data port (shard i: data_port+i); 0 = ephemeral
  --metrics_port=0               serve /metrics and /health on this port; 0 = off
  --prefault=false               fault segment pages in at start-up
  --enable_offload=false         upstream's SSD offload tier: not in this build, true is refused
  --auth_token_file=             file holding the cluster secret (default: env MC_AUTH_TOKEN,
                                 MC_AUTH_TOKEN_FILE); peers must prove it, see docs/security.md
";

pub use protocol::env::parse_size;

/// A gflags boolean: the words of [`protocol::env::parse_flag_bool`], or nothing (`--flag`).
fn parse_bool(v: &str) -> Result<bool, String> {
    if v.trim().is_empty() {
        return Ok(true);
    }
    protocol::env::parse_flag_bool(v).ok_or_else(|| format!("expected a boolean, got {v:?}"))
}

impl NodeConfig {
    /// Parses gflags-style arguments (without the program name). `Ok(None)` for `--help`.
    pub fn parse_args<I: IntoIterator<Item = String>>(
        args: I,
    ) -> Result<Option<NodeConfig>, String> {
        let mut c = NodeConfig::default();
        let mut shards_set = false;
        let mut it = args.into_iter().peekable();
        while let Some(arg) = it.next() {
            let flag = arg
                .strip_prefix("--")
                .or_else(|| arg.strip_prefix('-'))
                .ok_or_else(|| format!("unexpected argument {arg:?}"))?;
            if matches!(flag, "help" | "h" | "helpfull") {
                return Ok(None);
            }
            let (name, inline) = match flag.split_once('=') {
                Some((n, v)) => (n.to_string(), Some(v.to_string())),
                None => (flag.to_string(), None),
            };
            // Upstream's SSD offload tier: accepting it without one would drop what it asks for.
            if name == "enable_offload" || name == "noenable_offload" {
                let on = match inline {
                    Some(v) => parse_bool(&v)?,
                    None => name == "enable_offload",
                };
                if on {
                    return Err(
                        "--enable_offload: this build has no SSD offload tier (objects \
                                live in memory only); drop the flag"
                            .into(),
                    );
                }
                continue;
            }
            if name == "prefault" || name == "noprefault" {
                c.prefault = match inline {
                    Some(v) => parse_bool(&v)?,
                    None => name == "prefault",
                };
                continue;
            }
            let value = match inline {
                Some(v) => v,
                None => it.next().ok_or_else(|| format!("--{name} needs a value"))?,
            };
            let num = |v: &str| -> Result<u64, String> {
                v.trim()
                    .parse()
                    .map_err(|_| format!("--{name}: expected a number, got {v:?}"))
            };
            match name.as_str() {
                "host" => c.host = value,
                "port" => c.port = num(&value)?.try_into().map_err(|_| "--port out of range")?,
                "global_segment_size" => c.global_segment_size = parse_size(&value)?,
                "local_buffer_size" => c.local_buffer_size = parse_size(&value)?,
                "master_server_address" => c.master_server_address = value,
                "metadata_server" => c.metadata_server = value,
                "cluster_id" if value.trim().is_empty() => {
                    return Err("--cluster_id must not be empty".into())
                }
                "cluster_id" => c.cluster_id = value.trim().to_string(),
                "auth_token_file" if value.trim().is_empty() => c.auth_token_file = None,
                "auth_token_file" => c.auth_token_file = Some(value.into()),
                "protocol" => c.protocol = value,
                "device_names" | "device_name" => c.device_names = value,
                "threads" => c.threads = num(&value)? as usize,
                "shards" => {
                    c.shards = num(&value)? as usize;
                    shards_set = true;
                }
                "cores" if !shards_set => c.shards = num(&value)? as usize,
                "cores" => {}
                "metrics_port" => {
                    c.metrics_port = num(&value)?
                        .try_into()
                        .map_err(|_| "--metrics_port out of range")?
                }
                "data_port" => {
                    c.data_port = num(&value)?
                        .try_into()
                        .map_err(|_| "--data_port out of range")?
                }
                n if IGNORED_FLAGS.contains(&n) => {}
                n => return Err(format!("unknown flag --{n}")),
            }
        }
        if c.shards == 0 || c.shards > SHARDS_MAX {
            return Err(format!("--shards={} must be 1..={SHARDS_MAX}", c.shards));
        }
        if c.global_segment_size < c.shards as u64 {
            return Err(format!(
                "--global_segment_size={} leaves nothing for {} shards",
                c.global_segment_size, c.shards
            ));
        }
        if !matches!(
            c.protocol.to_ascii_lowercase().as_str(),
            "tcp" | "rdma" | ""
        ) {
            return Err(format!(
                "--protocol={}: this build serves tcp only",
                c.protocol
            ));
        }
        if c.data_port != 0 && u32::from(c.data_port) + c.shards as u32 > 65536 {
            return Err("--data_port + --shards exceeds 65535".into());
        }
        Ok(Some(c))
    }
}

/// Why the node could not start.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("bad configuration: {0}")]
    Config(String),
    #[error("cannot reach the master at {addr}: {why}")]
    Master { addr: String, why: String },
    #[error("the master refused to mount segment {name}: {why}")]
    Mount { name: String, why: String },
    #[error("shard {shard}: {why}")]
    Shard { shard: usize, why: String },
}

struct Shard {
    /// Dropped first: stops serving before anything else goes. An io_uring shard pinned to
    /// its core, or the blocking fallback when io_uring is refused (the reason is logged).
    server: Server,
    descriptor: SegmentDescriptor,
    /// What memory the segment got (hugetlb, thp, plain): logged and exported.
    kind: SegmentKind,
    /// The table the server serves; its catalog is re-reported on a re-mount.
    memory: Arc<ServedMemory>,
    /// The segment's memfd offered to same-host clients (`dataplane::mem::shm`).
    _shm: Option<dataplane::mem::ShmExport>,
}

/// A per-shard server counter: metric name and how to read it.
type StatCounter = (
    &'static str,
    fn(&dataplane::mem::served::ServerStats) -> u64,
);

/// A running storage node; see the module docs.
pub struct Node {
    shards: Vec<Shard>,
    client_id: Uuid,
    master: MasterClient,
    metadata: Option<(Box<dyn MetadataStore>, Keys)>,
    shut_down: AtomicBool,
}

/// The address to advertise for `host`: itself when it names one interface; for an
/// unspecified address (`0.0.0.0`) the address that routes outwards (no packet is sent),
/// else loopback.
fn advertised_ip(host: &str) -> Result<IpAddr, String> {
    let ip = (host, 0)
        .to_socket_addrs()
        .map_err(|e| format!("--host={host} does not resolve: {e}"))?
        .next()
        .map(|a| a.ip())
        .ok_or_else(|| format!("--host={host} resolves to nothing"))?;
    if !ip.is_unspecified() {
        return Ok(ip);
    }
    let routed = UdpSocket::bind("0.0.0.0:0")
        .and_then(|s| s.connect("192.0.2.1:9").map(|_| s))
        .and_then(|s| s.local_addr())
        .map(|a| a.ip())
        .ok()
        .filter(|ip| !ip.is_unspecified());
    Ok(routed.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)))
}

impl Node {
    /// Maps, serves and mounts every shard.
    pub fn start(cfg: &NodeConfig) -> Result<Node, NodeError> {
        let ip = advertised_ip(&cfg.host).map_err(NodeError::Config)?;
        let bind_ip: IpAddr = (cfg.host.as_str(), 0)
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .map(|a| a.ip())
            .unwrap_or(ip);
        let master = MasterClient::new_in_cluster(&cfg.master_server_address, &cfg.cluster_id)
            .map_err(|e| NodeError::Master {
                addr: cfg.master_server_address.clone(),
                why: e.to_string(),
            })?;
        let deadline = Instant::now() + MASTER_CONNECT_PATIENCE;
        while let Err(e) = master.connect() {
            // A refused secret will not be accepted by trying again.
            let refused = matches!(&e, ClientError::Connect { source, .. }
                if source.kind() == std::io::ErrorKind::PermissionDenied);
            if refused || Instant::now() > deadline {
                return Err(NodeError::Master {
                    addr: cfg.master_server_address.clone(),
                    why: e.to_string(),
                });
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let per_shard = cfg.global_segment_size.div_ceil(cfg.shards as u64) as usize;
        // Shards start in parallel, one thread each, so that prefaulting a large segment
        // (`--prefault`) costs the time of one shard, not the sum of all of them.
        let shards: Vec<Shard> = std::thread::scope(|scope| {
            let starting: Vec<_> = (0..cfg.shards)
                .map(|i| {
                    let name = match i {
                        0 => format!("{}:{}", cfg.host_for_names(ip), cfg.port),
                        i => format!("{}:{}#{i}", cfg.host_for_names(ip), cfg.port),
                    };
                    let port = if cfg.data_port == 0 {
                        0
                    } else {
                        cfg.data_port + i as u16
                    };
                    let bind = SocketAddr::new(bind_ip, port);
                    scope.spawn(move || start_shard(i, &name, per_shard, bind, ip, cfg))
                })
                .collect();
            starting
                .into_iter()
                .enumerate()
                .map(|(i, h)| {
                    h.join().unwrap_or_else(|_| {
                        Err(NodeError::Shard {
                            shard: i,
                            why: "start-up thread panicked".into(),
                        })
                    })
                })
                .collect::<Result<Vec<Shard>, NodeError>>()
        })?;
        let metadata = match MetadataBackend::parse(&cfg.metadata_server) {
            Ok(backend) => backend
                .open()
                .map(|store| (store, Keys::for_store(&cfg.cluster_id))),
            Err(e) => {
                eprintln!("mooncake_client: not publishing descriptors: {e}");
                None
            }
        };
        let node = Node {
            shards,
            client_id: Uuid::random(),
            master,
            metadata,
            shut_down: AtomicBool::new(false),
        };
        node.publish();
        for s in &node.shards {
            let mounted = node.master.call(&MountSegment {
                client_id: node.client_id,
                segment: s.descriptor.clone(),
            });
            let why = match mounted {
                Ok(Ok(())) => continue,
                Ok(Err(code)) => format!("{code:?}"),
                Err(e) => e.to_string(),
            };
            node.shutdown();
            return Err(NodeError::Mount {
                name: s.descriptor.name.clone(),
                why,
            });
        }
        Ok(node)
    }

    /// The segments mounted at the master, shard by shard.
    pub fn segments(&self) -> Vec<SegmentDescriptor> {
        self.shards.iter().map(|s| s.descriptor.clone()).collect()
    }

    pub fn client_id(&self) -> Uuid {
        self.client_id
    }

    /// Prometheus text of the node: per shard, its memory kind, server backend (and why it fell
    /// back), request and connection counters, and the event-loop stall detector.
    pub fn render_metrics(&self) -> String {
        use std::fmt::Write;
        use std::sync::atomic::Ordering::Relaxed;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# TYPE mooncake_node_shards gauge\nmooncake_node_shards {}",
            self.shards.len()
        );
        let _ = writeln!(out, "# TYPE mooncake_node_segment_bytes gauge");
        let _ = writeln!(out, "# TYPE mooncake_node_segment_memory_kind gauge");
        let _ = writeln!(out, "# TYPE mooncake_node_io_backend gauge");
        for (i, sh) in self.shards.iter().enumerate() {
            let seg = crate::node_metrics::label(&sh.descriptor.name);
            let _ = writeln!(
                out,
                "mooncake_node_segment_bytes{{shard=\"{i}\",segment=\"{seg}\"}} {}",
                sh.descriptor.size
            );
            let _ = writeln!(
                out,
                "mooncake_node_segment_memory_kind{{shard=\"{i}\",kind=\"{}\"}} 1",
                sh.kind.as_str()
            );
            let why = sh
                .server
                .fallback_reason()
                .map(crate::node_metrics::label)
                .unwrap_or_default();
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
            for (i, sh) in self.shards.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "mooncake_node_{name}{{shard=\"{i}\"}} {}",
                    read(sh.server.stats())
                );
            }
        }
        out
    }

    /// Each shard's server backend (`io_uring` or `blocking`) and why it fell back, if it did.
    pub fn backends(&self) -> Vec<(&'static str, Option<String>)> {
        self.shards
            .iter()
            .map(|s| {
                (
                    s.server.backend(),
                    s.server.fallback_reason().map(str::to_string),
                )
            })
            .collect()
    }

    fn publish(&self) {
        let Some((store, keys)) = &self.metadata else {
            return;
        };
        for s in &self.shards {
            let d = &s.descriptor;
            let port = s.server.local_addr().port();
            let buffers = vec![BufferDesc {
                addr: d.base,
                length: d.size,
                name: d.name.clone(),
            }];
            let json = SegmentDesc::tcp(&d.name, port, buffers).to_json();
            if let Err(e) = store.put(&keys.ram(&d.name), &json) {
                eprintln!(
                    "mooncake_client: cannot publish the descriptor of {}: {e}",
                    d.name
                );
            }
        }
    }

    /// One ping: drops catalog entries of freed ranges; on `NEED_REMOUNT` re-mounts every
    /// shard with every object it holds. Returns what the master said.
    pub fn ping(&self) -> Result<ClientStatus, String> {
        let served: Vec<recovery::Served<'_>> = self
            .shards
            .iter()
            .map(|s| recovery::Served {
                desc: &s.descriptor,
                catalog: s.memory.catalog(),
            })
            .collect();
        let out = recovery::ping(&self.master, self.client_id, &served)?;
        if out.status == ClientStatus::NeedRemount {
            eprintln!(
                "mooncake_client: the master asked for a re-mount; {} segments re-mounted, {} \
                 objects re-reported",
                self.shards.len(),
                out.reported
            );
        }
        Ok(out.status)
    }

    /// Objects in the shards' catalogs (what a re-mount would report).
    pub fn catalogued_objects(&self) -> usize {
        self.shards.iter().map(|s| s.memory.catalog().len()).sum()
    }

    /// Pings every [`PING_INTERVAL`] until `stop` is set. Failures are reported and retried.
    pub fn run(&self, stop: &AtomicBool) {
        let mut next = Instant::now();
        while !stop.load(Ordering::SeqCst) {
            if Instant::now() >= next {
                if let Err(e) = self.ping() {
                    eprintln!("mooncake_client: ping failed: {e}");
                }
                next = Instant::now() + PING_INTERVAL;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Unmounts every shard at the master and removes the published descriptors. Idempotent;
    /// the servers stop when the node is dropped.
    pub fn shutdown(&self) {
        if self.shut_down.swap(true, Ordering::SeqCst) {
            return;
        }
        for s in &self.shards {
            let r = self.master.call(&UnmountSegment {
                client_id: self.client_id,
                segment_id: s.descriptor.id,
            });
            if !matches!(r, Ok(Ok(()))) {
                eprintln!(
                    "mooncake_client: unmount of {} failed: {r:?}",
                    s.descriptor.name
                );
            }
        }
        if let Some((store, keys)) = &self.metadata {
            for s in &self.shards {
                let _ = store.remove(&keys.ram(&s.descriptor.name));
            }
        }
    }
}

impl NodeConfig {
    /// The host used in segment names: `--host`, or the advertised address when `--host` is
    /// unspecified (`0.0.0.0`), so names differ between machines.
    fn host_for_names(&self, advertised: IpAddr) -> String {
        match self.host.parse::<IpAddr>() {
            Ok(ip) if ip.is_unspecified() => advertised.to_string(),
            _ => self.host.clone(),
        }
    }
}

fn start_shard(
    index: usize,
    name: &str,
    len: usize,
    bind: SocketAddr,
    ip: IpAddr,
    cfg: &NodeConfig,
) -> Result<Shard, NodeError> {
    let fail = |why: String| NodeError::Shard { shard: index, why };
    let options = SegmentOptions {
        hugepages: HugepagePolicy::from_env(),
        prefault: cfg.prefault,
    };
    let segment = Arc::new(
        dataplane::mem::shm::serving_segment(len, options, dataplane::mem::shm::Owner::Node)
            .map_err(|e| fail(format!("cannot map {len} bytes: {e}")))?,
    );
    let memory = ServedMemory::new();
    memory
        .register_segment(segment.clone())
        .map_err(|e| fail(format!("cannot register the segment: {e}")))?;
    // Shard i on the i-th core the node may run on (its affinity mask, e.g. systemd's
    // CPUAffinity= or a Kubernetes cpuset), wrapping around.
    let server = serve(bind, memory.clone(), ServerConfig::default(), Some(index))
        .map_err(|e| fail(format!("cannot listen on {bind}: {e}")))?;
    let data_port = server.local_addr().port();
    let descriptor = SegmentDescriptor {
        id: Uuid::random(),
        name: name.to_string(),
        base: segment.addr() as u64,
        size: segment.len() as u64,
        te_endpoint: SocketAddr::new(ip, data_port).to_string(),
        protocol: "tcp".into(),
        host_id: ip.to_string(),
    };
    let shm = dataplane::mem::shm::export_segment(&descriptor.te_endpoint, &segment);
    tracing::info!(
        "shard {index}: {} segment of {len} bytes at {:#x}{}, {} server on {}",
        segment.kind().as_str(),
        segment.addr(),
        if shm.is_some() {
            " (shared with same-host clients)"
        } else {
            ""
        },
        server.backend(),
        server.local_addr()
    );
    Ok(Shard {
        server,
        descriptor,
        kind: segment.kind(),
        memory,
        _shm: shm,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Result<Option<NodeConfig>, String> {
        NodeConfig::parse_args(a.iter().map(|s| s.to_string()))
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4 GB").unwrap(), 4 << 30);
        assert_eq!(parse_size("4GB").unwrap(), 4 << 30);
        assert_eq!(parse_size("512 mb").unwrap(), 512 << 20);
        assert_eq!(parse_size("1.5 GiB").unwrap(), 3 << 29);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("2 TB").unwrap(), 2 << 40);
        assert_eq!(parse_size("7 KB").unwrap(), 7 << 10);
        assert_eq!(parse_size("0").unwrap(), 0);
        for bad in ["", "GB", "4 XB", "-1 GB", "1e99 TB", "4 G B"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn flags() {
        let c = args(&[
            "--host=127.0.0.1",
            "--port",
            "1234",
            "--global_segment_size=64 MB",
            "-shards=2",
            "--cores=8",
            "--metadata_server",
            "P2PHANDSHAKE",
            "--tenant_id=x",
            "--prefault",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(c.host, "127.0.0.1");
        assert_eq!(c.port, 1234);
        assert_eq!(c.global_segment_size, 64 << 20);
        assert_eq!(c.shards, 2, "--shards wins over --cores");
        assert!(c.prefault);
        assert_eq!(args(&["--cores", "3"]).unwrap().unwrap().shards, 3);
        assert_eq!(
            args(&["--cluster_id=prod-a"]).unwrap().unwrap().cluster_id,
            "prod-a"
        );
        assert_eq!(args(&[]).unwrap().unwrap(), NodeConfig::default());
        assert_eq!(args(&["--help"]).unwrap(), None);
        assert!(args(&["--enable_offload=false", "--noenable_offload"]).is_ok());
        for bad in [
            &["--nope=1"][..],
            &["--port"],
            &["--port=70000"],
            &["--shards=0"],
            &["--protocol=nvlink"],
            &["stray"],
            &["--global_segment_size=1", "--shards=2"],
            &["--cluster_id="],
            &["--enable_offload"],
            &["--enable_offload=true"],
        ] {
            assert!(args(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn advertised_addresses() {
        assert_eq!(
            advertised_ip("127.0.0.1").unwrap(),
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        );
        assert!(!advertised_ip("0.0.0.0").unwrap().is_unspecified());
        assert!(advertised_ip("no.such.host.invalid").is_err());
    }
}
