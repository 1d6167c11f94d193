//! The storage node (`mooncake_client`): memory contributed to the pool by a process that
//! runs no application, served by shared-nothing shards.
//!
//! Each of the `--shards` shards owns one [`Segment`](dataplane::mem::Segment)
//! (`--global_segment_size` split evenly, rounded up to the page size), one [`ServedMemory`]
//! table holding just that segment and one data server on its own port. Each shard's segment is mounted at the master as its own
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
//! Each shard's segment is populated ([`dataplane::mem::Populator`], `--populate`, on by
//! default) from its base upwards, the order in which the master's allocator fills a fresh
//! segment, so that the first puts into a fresh node find their pages present (as transparent
//! hugepages where the kernel collapses them): the head during start-up, for at most
//! [`POPULATE_AT_START_PER_16_GIB`] per 16 GiB of `--global_segment_size`, the rest after
//! ready in a low-priority thread; `--prefault` does all of it before start-up ends.
//!
//! Invariants: a shard's server serves only its own segment; the segments stay mapped until
//! the servers are dropped (the `ServedMemory` table holds them).
//!
//! This file is the node's lifecycle: the advertised address, shard start-up, mounting, the
//! ping loop and shutdown. Its flags are parsed in `config` ([`NodeConfig`], [`USAGE`]), its
//! `/metrics` text is rendered and served by [`metrics`]; the program around it (signals,
//! logging, the dummy-client service) is [`crate::cli`].

use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dataplane::mem::served::{ServedMemory, ServerConfig};
use dataplane::mem::{HugepagePolicy, SegmentKind, SegmentOptions};
use dataplane::metadata::desc::{BufferDesc, SegmentDesc};
use dataplane::metadata::{Keys, MetadataBackend, MetadataStore};
use dataplane::server::{serve, Server};
use protocol::message::{GracefulUnmountSegment, MountSegment, UnmountSegment};
use protocol::{ClientStatus, ErrorCode, Segment as SegmentDescriptor, Uuid};

use crate::master::{ClientError, MasterClient};
use crate::recovery;

mod config;
pub mod metrics;

use crate::limits::{
    DRAIN_OVERRUN, DRAIN_POLL, MASTER_CONNECT_PATIENCE, PING_INTERVAL,
    POPULATE_AT_START_PER_16_GIB, SHARDS_MAX,
};
pub use config::{NodeConfig, USAGE};

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
    /// The segment's background populator (`--populate`; `None` with `--prefault` or when
    /// off). Dropped first: it stops after its current 2 MiB chunk.
    populator: Option<dataplane::mem::Populator>,
    /// Stops serving before anything else goes. An io_uring shard pinned to
    /// its core, or the blocking fallback when io_uring is refused (the reason is logged).
    server: Server,
    descriptor: SegmentDescriptor,
    /// What memory the segment got (hugetlb, thp, plain): logged and exported.
    kind: SegmentKind,
    /// `--prefault`: every page was faulted in before start-up ended.
    prefaulted: bool,
    /// The table the server serves; its catalog is re-reported on a re-mount.
    memory: Arc<ServedMemory>,
    /// The segment's memfd offered to same-host clients (`dataplane::mem::shm`).
    _shm: Option<dataplane::mem::ShmExport>,
}

/// A running storage node; see the module docs.
pub struct Node {
    /// `--protocol=rdma`: the devices and handshake server every shard's segment is
    /// registered with (dropped first: memory is deregistered while still mapped).
    rdma: Option<Arc<crate::rdma::RdmaSide>>,
    shards: Vec<Shard>,
    client_id: Uuid,
    master: MasterClient,
    metadata: Option<(Box<dyn MetadataStore>, Keys)>,
    shut_down: AtomicBool,
    /// The drains of our segments (`recovery::OwnerDrains`): kept going on a new master, and
    /// a drained segment never re-mounted.
    drains: recovery::OwnerDrains,
    /// The replica-task executor (`--replica_tasks`): its stop flag and thread.
    tasks: parking_lot::Mutex<Option<(Arc<AtomicBool>, std::thread::JoinHandle<()>)>>,
    /// `--enable_offload`: the disk tier under the shards' memory (`crate::tier`), mounted as
    /// one disk segment named after shard 0.
    disk: Option<Arc<crate::tier::OwnerDisk>>,
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
        let mut shards: Vec<Shard> = std::thread::scope(|scope| {
            let starting: Vec<_> = (0..cfg.shards)
                .map(|i| {
                    let name = match i {
                        0 => format!("{}:{}", cfg.host_for_names(ip), cfg.port),
                        i => format!("{}:{}#{i}", cfg.host_for_names(ip), cfg.port),
                    };
                    // `--data_port` 0: ephemeral ports.
                    let port = (cfg.data_port != 0).then(|| cfg.data_port + i as u16);
                    let bind = SocketAddr::new(bind_ip, port.unwrap_or(0));
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
        let rdma = serve_rdma(cfg, ip, &mut shards)?;
        let disk = cfg
            .enable_offload
            .then(|| start_disk(&shards[0].descriptor.name, bind_ip, ip))
            .transpose()
            .map_err(|e| NodeError::Config(format!("--enable_offload: {e}")))?
            .map(Arc::new);
        let node = Node {
            rdma,
            shards,
            client_id: Uuid::random(),
            master,
            metadata,
            shut_down: AtomicBool::new(false),
            drains: recovery::OwnerDrains::default(),
            tasks: parking_lot::Mutex::new(None),
            disk,
        };
        node.publish();
        if let Err(e) = node.mount() {
            node.shutdown();
            return Err(e);
        }
        if cfg.replica_tasks || node.disk.is_some() {
            // The disk tier's offloads and promotions are replica tasks: a node with a disk
            // carries them out whatever `--replica_tasks` says.
            node.start_tasks(cfg);
        }
        Ok(node)
    }

    /// Mounts every shard's segment, then the disk segment with what its files hold.
    fn mount(&self) -> Result<(), NodeError> {
        for s in &self.shards {
            let mounted = self.master.call(&MountSegment {
                client_id: self.client_id,
                segment: s.descriptor.clone(),
            });
            let why = match mounted {
                Ok(Ok(())) => continue,
                Ok(Err(code)) => format!("{code:?}"),
                Err(e) => e.to_string(),
            };
            return Err(NodeError::Mount {
                name: s.descriptor.name.clone(),
                why,
            });
        }
        if let Some(d) = &self.disk {
            d.mount(&self.master, self.client_id)
                .map_err(|why| NodeError::Mount {
                    name: d.desc.name.clone(),
                    why,
                })?;
        }
        Ok(())
    }

    /// Starts the replica-task executor: its own master connection, and the store's transfer
    /// paths (same-host shared segments by memcpy, else TCP; its own shards too, through
    /// their servers, which record each copy in the shard's catalog). A failure to start is
    /// logged; the node serves without it.
    fn start_tasks(&self, cfg: &NodeConfig) {
        let master = match MasterClient::new_in_cluster(&cfg.master_server_address, &cfg.cluster_id)
        {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!("replica tasks off: {e}");
                return;
            }
        };
        if let Err(e) = master.connect() {
            tracing::warn!("replica tasks off: {e}");
            return;
        }
        let mut peers =
            crate::store::Peers::new(None, None, crate::store::TransferSettings::from_env());
        if let Some(d) = &self.disk {
            peers = peers.with_disk(d.clone());
        }
        let stop = Arc::new(AtomicBool::new(false));
        let thread = crate::store::start_executor(
            Arc::new(master),
            Arc::new(peers),
            self.client_id,
            stop.clone(),
        );
        *self.tasks.lock() = Some((stop, thread));
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
        let mut text = metrics::render(&self.shards);
        if let Some(d) = &self.disk {
            text.push_str(&d.render_metrics());
        }
        text
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
        if self.rdma.is_some() {
            // `serve_rdma` published the RDMA descriptors (they name the TCP port too).
            return;
        }
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
        let out = recovery::ping(
            &self.master,
            self.client_id,
            &served,
            self.disk.as_deref(),
            self.rdma.as_deref(),
            &self.drains,
        )?;
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
        while !stop.load(Ordering::SeqCst) {
            let epoch = self.master.leader_epoch();
            if let Err(e) = self.ping() {
                eprintln!("mooncake_client: ping failed: {e}");
            }
            // At once, too, when calls moved to a new HA leader: it waits for our re-mount.
            self.master.wait_unless_moved(epoch, PING_INTERVAL, stop);
        }
    }

    /// Drains every shard's segment (`--drain_timeout_sec`, `docs/fleet.md`): asks the master
    /// for a graceful unmount with a deadline `timeout` from now, which stops new placements
    /// there at once and moves the objects only this node holds onto other segments (the
    /// other nodes' replica-task executors copy them out of our shards, which keep serving),
    /// then polls with the same call until the master has unmounted every segment (it
    /// answers `SEGMENT_NOT_FOUND`) or the deadline passed, pinging meanwhile so that the
    /// master does not expire us mid-drain. Returns whether every segment was drained; on a
    /// timeout the master logs how many objects it could not move. [`Node::shutdown`] then
    /// unmounts whatever is left.
    pub fn drain(&self, timeout: Duration) -> bool {
        if timeout.is_zero() || self.shut_down.load(Ordering::SeqCst) {
            return false;
        }
        let started = Instant::now();
        let grace_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        let mut left: Vec<&SegmentDescriptor> = self.shards.iter().map(|s| &s.descriptor).collect();
        eprintln!(
            "mooncake_client: draining {} segment(s) for at most {timeout:?}",
            left.len()
        );
        let mut next_ping = Instant::now();
        let mut unreachable = None;
        loop {
            left.retain(|d| {
                let r = self.master.call(&GracefulUnmountSegment {
                    client_id: self.client_id,
                    segment_id: d.id,
                    grace_ms,
                });
                if let Err(e) = &r {
                    unreachable = Some(e.to_string());
                }
                !matches!(r, Ok(Err(ErrorCode::SegmentNotFound)))
            });
            // Without a master nothing moves our objects: stop waiting.
            if let Some(why) = &unreachable {
                eprintln!("mooncake_client: drain abandoned, the master is unreachable: {why}");
                break;
            }
            if left.is_empty() || started.elapsed() >= timeout + DRAIN_OVERRUN {
                break;
            }
            if Instant::now() >= next_ping {
                if let Err(e) = self.ping() {
                    eprintln!("mooncake_client: ping failed while draining: {e}");
                }
                next_ping = Instant::now() + PING_INTERVAL;
            }
            std::thread::sleep(DRAIN_POLL);
        }
        let took = started.elapsed();
        if left.is_empty() {
            eprintln!("mooncake_client: drained in {took:?}");
        } else {
            eprintln!(
                "mooncake_client: drain of {} segment(s) not finished after {took:?} (the \
                 master logs what it could not move); unmounting",
                left.len()
            );
        }
        left.is_empty()
    }

    /// A stop on SIGTERM: [`Node::drain`] for at most `drain_timeout`, then [`Node::shutdown`].
    pub fn stop(&self, drain_timeout: Duration) {
        self.drain(drain_timeout);
        self.shutdown();
    }

    /// Unmounts every shard at the master and removes the published descriptors. Idempotent;
    /// the servers stop when the node is dropped.
    pub fn shutdown(&self) {
        if self.shut_down.swap(true, Ordering::SeqCst) {
            return;
        }
        if let Some((stop, thread)) = self.tasks.lock().take() {
            stop.store(true, Ordering::SeqCst);
            thread.thread().unpark();
            let _ = thread.join();
        }
        // The disk first (its files stay for the next start on the directory), then memory.
        let disk = self.disk.iter().map(|d| &d.desc);
        for d in disk.chain(self.shards.iter().map(|s| &s.descriptor)) {
            let r = self.master.call(&UnmountSegment {
                client_id: self.client_id,
                segment_id: d.id,
            });
            // A drained segment is already gone: SEGMENT_NOT_FOUND is the expected answer.
            if !matches!(r, Ok(Ok(()) | Err(ErrorCode::SegmentNotFound))) {
                eprintln!("mooncake_client: unmount of {} failed: {r:?}", d.name);
            }
        }
        if let Some(r) = &self.rdma {
            r.withdraw();
        }
        if let Some((store, keys)) = &self.metadata {
            for s in &self.shards {
                let _ = store.remove(&keys.ram(&s.descriptor.name));
            }
        }
    }
}

/// `--enable_offload`: the node's disk tier, in the directory and limits of the
/// `MOONCAKE_OFFLOAD_*` variables, named after shard 0's segment.
fn start_disk(shard0: &str, bind_ip: IpAddr, ip: IpAddr) -> Result<crate::tier::OwnerDisk, String> {
    let cfg = crate::disk::DiskConfig::from_env(None).map_err(|e| e.to_string())?;
    crate::tier::OwnerDisk::start(cfg, shard0, bind_ip, ip, &ip.to_string())
}

/// `--protocol=rdma`: opens the devices (`--device_names`, or auto-discovery), registers every
/// shard's segment, publishes their RDMA descriptors and handshake port, and marks the
/// segments `rdma` for the master. `None` for TCP: another protocol, or no RDMA device (then
/// with a warning, see `crate::rdma::rdma_or_fallback`; `MC_REQUIRE_RDMA=1` makes that an
/// error). With `P2PHANDSHAKE` nothing is published: the handshake server, on `--port`,
/// serves the descriptors.
fn serve_rdma(
    cfg: &NodeConfig,
    ip: IpAddr,
    shards: &mut [Shard],
) -> Result<Option<Arc<crate::rdma::RdmaSide>>, NodeError> {
    if !crate::rdma::rdma_or_fallback(&cfg.protocol, &cfg.device_names, "node")
        .map_err(NodeError::Config)?
    {
        return Ok(None);
    }
    // `MC_TRANSFER_TIMEOUT`, read as the store reads it.
    let timeout = crate::store::TransferSettings::from_env().timeout;
    let name = format!("{}:{}", cfg.host_for_names(ip), cfg.port);
    // With P2PHANDSHAKE peers ask for a shard's descriptor at the `host:port` its name is
    // made of, so the handshake server listens on `--port` (upstream's RPC port).
    let p2p = matches!(
        MetadataBackend::parse(&cfg.metadata_server),
        Ok(MetadataBackend::P2p)
    );
    let side = crate::rdma::RdmaSide::open(
        &name,
        &cfg.device_names,
        timeout,
        (ip, if p2p { cfg.port } else { 0 }),
        &cfg.metadata_server,
        Keys::for_store(&cfg.cluster_id),
    )
    .map_err(NodeError::Config)?;
    for (i, s) in shards.iter_mut().enumerate() {
        let d = &mut s.descriptor;
        // SAFETY: the segment stays mapped while the node lives (the shard's table holds it)
        // and the side is dropped before the shards; peers write into it as over TCP.
        let served = unsafe { side.serve(&d.name, d.base, d.size, s.server.local_addr().port()) };
        if let Err(why) = served {
            side.withdraw();
            return Err(NodeError::Shard { shard: i, why });
        }
        d.protocol = "rdma".into();
    }
    tracing::info!(
        "RDMA: {} segments registered, handshake server on {ip}:{}",
        shards.len(),
        side.rpc_port()
    );
    Ok(Some(side))
}

/// The shard's populator (`--populate` without `--prefault`; `--populate=eager` walks
/// whatever else runs): the segment's head now, within
/// [`POPULATE_AT_START_PER_16_GIB`] per 16 GiB of the node's segments (the shards start in
/// parallel, so every shard has the whole node's budget, and its share of the CPUs this
/// process may run on), the rest in the background. `None` when off, or when its thread
/// cannot start (logged: the node serves without it).
fn start_populator(
    index: usize,
    segment: &Arc<dataplane::mem::Segment>,
    cfg: &NodeConfig,
) -> Option<dataplane::mem::Populator> {
    if !cfg.populate || cfg.prefault {
        return None;
    }
    let share = cfg.global_segment_size as f64 / (16u64 << 30) as f64;
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let head = dataplane::mem::Head {
        until: Instant::now() + POPULATE_AT_START_PER_16_GIB.mul_f64(share),
        threads: (cpus / cfg.shards.max(1)).max(1),
    };
    let name = format!("populate-{index}");
    let pace = if cfg.populate_eager {
        dataplane::mem::Pace::Eager
    } else {
        dataplane::mem::Pace::Courteous
    };
    let started = Instant::now();
    let populator =
        dataplane::mem::Populator::start_paced(segment.clone(), &name, Some(head), pace)
            .inspect_err(|e| tracing::warn!("shard {index}: no background populator: {e}"))
            .ok()?;
    tracing::info!(
        "shard {index}: {} bytes of the segment populated before ready, in {:?} ({} threads)",
        populator.populated_bytes(),
        started.elapsed(),
        head.threads
    );
    Some(populator)
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
        ..Default::default()
    };
    let shm = dataplane::mem::shm::export_segment(&descriptor.te_endpoint, &segment, &memory);
    let populator = start_populator(index, &segment, cfg);
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
        populator,
        server,
        descriptor,
        kind: segment.kind(),
        prefaulted: cfg.prefault,
        memory,
        _shm: shm,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
