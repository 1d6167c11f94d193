//! Bringing a store client up: naming, the own segment, mounting, and the liveness pinger.

use std::net::{IpAddr, SocketAddr, TcpListener, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use dataplane::mem::served::{ServedMemory, ServerConfig};
use dataplane::mem::{Registry, Segment, SegmentOptions};
use dataplane::server::blocking::TcpServer;
use parking_lot::{Mutex, RwLock};
use protocol::message::MountSegment;
use protocol::{ClientStatus, ErrorCode, Segment as SegmentDesc, Uuid};

use super::peers::{OwnSegment, Peers, TransferSettings};
use super::{LocalBudget, Store};
use crate::master::MasterClient;
use crate::recovery;

/// Attempts at finding a free port (upstream's `MC_STORE_CLIENT_SETUP_RETRIES`).
const CLIENT_PORT_ATTEMPTS: usize = 20;

/// `setup(...)` arguments.
#[derive(Clone, Debug, Default)]
pub struct StoreConfig {
    pub local_hostname: String,
    pub metadata_server: String,
    pub global_segment_size: u64,
    pub local_buffer_size: u64,
    pub protocol: String,
    pub rdma_devices: String,
    pub master_server_addr: String,
    /// `tenant_id`: the key space this client works in (`tenant.rs`); empty or `"default"`
    /// is the default tenant.
    pub tenant_id: String,
    /// `enable_ssd_offload` (with `ssd_offload_path`, empty: `MOONCAKE_OFFLOAD_FILE_STORAGE_PATH`
    /// or its default): a disk tier under this client's own segment (`docs/tiering.md`).
    pub ssd_offload: Option<String>,
}

/// The segment this client contributes, and the server that serves it.
pub struct OwnSegmentState {
    pub segment_id: Uuid,
    pub endpoint: String,
    pub desc: SegmentDesc,
    server: Mutex<Option<TcpServer>>,
    /// The segment's memfd offered to same-host clients (`dataplane::mem::shm`).
    shm: Mutex<Option<dataplane::mem::ShmExport>>,
    _segment: Arc<Segment>,
}

impl OwnSegmentState {
    pub fn stop_serving(&self) {
        self.shm.lock().take();
        self.server.lock().take();
    }
}

pub struct Pinger {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
    /// The replica-task executor (`super::tasks`), on a store with its own segment.
    executor: Option<JoinHandle<()>>,
}

impl Pinger {
    pub fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.thread().unpark();
        if let Some(e) = &self.executor {
            e.thread().unpark();
        }
        let _ = self.thread.join();
        if let Some(e) = self.executor {
            let _ = e.join();
        }
    }
}

fn split_host_port(s: &str) -> (String, Option<u16>) {
    if let Some(rest) = s.strip_prefix('[') {
        if let Some((h, p)) = rest.split_once("]:") {
            return (h.to_string(), p.parse().ok());
        }
        return (rest.trim_end_matches(']').to_string(), None);
    }
    match s.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => match p.parse() {
            Ok(port) => (h.to_string(), Some(port)),
            Err(_) => (s.to_string(), None),
        },
        _ => (s.to_string(), None),
    }
}

fn resolve_ip(host: &str) -> Result<IpAddr, ErrorCode> {
    if let Ok(ip) = std::env::var("MC_TCP_BIND_ADDRESS")
        .unwrap_or_default()
        .parse()
    {
        return Ok(ip);
    }
    (host, 0)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .map(|a| a.ip())
        .ok_or(ErrorCode::InvalidParams)
}

/// Binds the data-plane server: on `port` if given, else on a free port in upstream's range.
fn bind_server(
    ip: IpAddr,
    port: Option<u16>,
    memory: Arc<ServedMemory>,
) -> Result<TcpServer, ErrorCode> {
    let cfg = ServerConfig::default();
    let candidates: Vec<u16> = match port {
        Some(p) => vec![p, 0],
        None => {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u32(std::process::id());
            let start = h.finish();
            let span = (CLIENT_PORT_MAX - CLIENT_PORT_MIN + 1) as u64;
            (0..CLIENT_PORT_ATTEMPTS as u64)
                .map(|i| CLIENT_PORT_MIN + ((start.wrapping_add(i * 7919)) % span) as u16)
                .collect()
        }
    };
    for p in candidates {
        // Probe first so a busy port is skipped quickly.
        if p != 0 && TcpListener::bind((ip, p)).is_err() {
            continue;
        }
        if let Ok(s) = TcpServer::bind(SocketAddr::new(ip, p), memory.clone(), cfg) {
            return Ok(s);
        }
    }
    Err(ErrorCode::InvalidParams)
}

impl Store {
    /// Connects to the master, maps and mounts this client's segment, starts pinging.
    pub fn setup(cfg: StoreConfig) -> Result<Store, ErrorCode> {
        if cfg.local_hostname.is_empty() || cfg.master_server_addr.is_empty() {
            return Err(ErrorCode::InvalidParams);
        }
        if cfg.protocol != "tcp" && !cfg.protocol.is_empty() && cfg.protocol != "rdma" {
            return Err(ErrorCode::InvalidParams);
        }
        // The cluster secret (MC_AUTH_TOKEN / MC_AUTH_TOKEN_FILE): a broken setting fails the
        // setup rather than leaving this client's segment open to anyone.
        if let Err(e) = protocol::auth::process_token() {
            tracing::error!("{e}");
            return Err(ErrorCode::InvalidParams);
        }
        let master = Arc::new(MasterClient::new(&cfg.master_server_addr).map_err(|e| e.code())?);
        master.connect().map_err(|e| {
            // Say why (e.g. a refused cluster secret): the caller only sees the code.
            tracing::error!("{e}");
            e.code()
        })?;
        let client_id = Uuid::random();
        let (host, port) = split_host_port(&cfg.local_hostname);
        let ip = resolve_ip(&host)?;
        let memory = ServedMemory::new();
        let server = bind_server(ip, port, memory.clone())?;
        let data_port = server.local_addr().port();
        let name = match port {
            Some(_) => cfg.local_hostname.clone(),
            None => format!("{host}:{data_port}"),
        };
        let endpoint = SocketAddr::new(ip, data_port).to_string();
        let settings = TransferSettings::from_env();
        let (rdma, name) = open_rdma(&cfg, name, &host, &settings, ip)?;
        let own = if cfg.global_segment_size > 0 {
            // `MC_STORE_USE_HUGEPAGE` (read by `SegmentOptions::default`) backs the segment with
            // 2 MiB hugetlb pages when the pool has enough free, else transparent hugepages.
            let options = SegmentOptions::default();
            let seg = Arc::new(
                dataplane::mem::shm::serving_segment(
                    cfg.global_segment_size as usize,
                    options,
                    dataplane::mem::shm::Owner::Client,
                )
                .map_err(|_| ErrorCode::InvalidParams)?,
            );
            memory
                .register_segment(seg.clone())
                .map_err(|_| ErrorCode::InternalError)?;
            if let Some((side, _)) = &rdma {
                // SAFETY: the segment stays mapped while the store lives (`OwnSegmentState`
                // holds it, and the side is withdrawn at close); peers write into it over RDMA
                // as they do over TCP.
                let served =
                    unsafe { side.serve(&name, seg.addr() as u64, seg.len() as u64, data_port) };
                if let Err(e) = served {
                    tracing::error!("setup: {e}");
                    side.withdraw();
                    return Err(ErrorCode::InternalError);
                }
            }
            let desc = SegmentDesc {
                id: Uuid::random(),
                name: name.clone(),
                base: seg.addr() as u64,
                size: seg.len() as u64,
                te_endpoint: endpoint.clone(),
                protocol: if rdma.is_some() { "rdma" } else { "tcp" }.into(),
                host_id: ip.to_string(),
                ..Default::default()
            };
            super::rpc(master.call(&MountSegment {
                client_id,
                segment: desc.clone(),
            }))
            .inspect_err(|_| {
                // Published for nothing: take the keys back.
                if let Some((side, _)) = &rdma {
                    side.withdraw();
                }
            })?;
            Some(OwnSegmentState {
                segment_id: desc.id,
                endpoint: endpoint.clone(),
                desc,
                server: Mutex::new(Some(server)),
                shm: Mutex::new(dataplane::mem::shm::export_segment(
                    &endpoint, &seg, &memory,
                )),
                _segment: seg,
            })
        } else {
            drop(server);
            None
        };
        let disk = match start_own_disk(&cfg, own.as_ref(), ip, &master, client_id) {
            Ok(d) => d,
            Err(code) => {
                if let Some(o) = &own {
                    let _ = master.call(&protocol::message::UnmountSegment {
                        client_id,
                        segment_id: o.desc.id,
                    });
                }
                return Err(code);
            }
        };
        let own_seg = own.as_ref().map(|o| OwnSegment {
            base: o.desc.base,
            len: o.desc.size,
        });
        let mounted: super::extra::Mounted = Arc::new(RwLock::new(
            own.as_ref()
                .map(|o| (o.desc.clone(), memory.clone()))
                .into_iter()
                .collect(),
        ));
        let mut peers = Peers::new(own.as_ref().map(|o| o.endpoint.clone()), own_seg, settings);
        if own.is_some() {
            peers = peers.with_own_catalog(memory);
        }
        let side = rdma.as_ref().map(|(side, _)| side.clone());
        if let Some((_, path)) = rdma {
            peers = peers.with_rdma(path);
        }
        if let Some(d) = &disk {
            peers = peers.with_disk(d.clone());
        }
        let peers = Arc::new(peers);
        let mut pinger = start_pinger(
            master.clone(),
            client_id,
            mounted.clone(),
            disk.clone(),
            side,
        );
        if own.is_some() {
            // A store that holds replicas also carries out replica tasks (`super::tasks`).
            pinger.executor = Some(super::tasks::start_executor(
                master.clone(),
                peers.clone(),
                client_id,
                pinger.stop.clone(),
            ));
        }
        Ok(Store {
            name,
            client_id,
            master: super::tenant::TenantMaster::new(master, &cfg.tenant_id),
            peers,
            cluster_id: cluster_id_from_env(),
            budget: LocalBudget::new(cfg.local_buffer_size),
            buffers: RwLock::new(Registry::new()),
            require_registered: protocol::env::flag("MC_STORE_REQUIRE_REGISTERED", false),
            own,
            disk,
            ip,
            extra: Mutex::new(Vec::new()),
            mounted,
            pinger: Mutex::new(Some(pinger)),
            closed: AtomicBool::new(false),
            writing: Default::default(),
            sessions: Default::default(),
            reservations: Default::default(),
        })
    }
}

/// The side serving our segment over RDMA, and the RDMA path to peers.
type RdmaParts = (Arc<crate::rdma::RdmaSide>, Arc<super::rdma::RdmaPeers>);

/// `protocol="rdma"` (unless MC_FORCE_TCP): the devices, a handshake server, the metadata
/// store our segment is published in (none with `P2PHANDSHAKE`: the handshake server serves
/// it, `crate::rdma`) and the RDMA path, with our segment's name (`name`, or with
/// `P2PHANDSHAKE` `host:<handshake port>`). No RDMA device runs TCP with a warning, as
/// upstream; an error under `MC_REQUIRE_RDMA`.
fn open_rdma(
    cfg: &StoreConfig,
    name: String,
    host: &str,
    settings: &TransferSettings,
    ip: IpAddr,
) -> Result<(Option<RdmaParts>, String), ErrorCode> {
    match crate::rdma::rdma_or_fallback(&cfg.protocol, &cfg.rdma_devices, "store setup") {
        Ok(true) => {}
        Ok(false) => return Ok((None, name)),
        Err(e) => {
            tracing::error!("setup: {e}");
            return Err(ErrorCode::InternalError);
        }
    }
    let keys = dataplane::metadata::Keys::for_store(&cluster_id_from_env());
    let side = crate::rdma::RdmaSide::open(
        &name,
        &cfg.rdma_devices,
        settings.timeout,
        (ip, 0),
        &cfg.metadata_server,
        keys,
    )
    .and_then(|side| {
        super::rdma::RdmaPeers::new(side.clone())
            .map(|p| (side, Arc::new(p)))
            .map_err(|e| format!("registering the RDMA staging pool: {e}"))
    });
    let parts = side.map_err(|e| {
        tracing::error!("setup: {e}");
        ErrorCode::InternalError
    })?;
    // P2PHANDSHAKE: peers ask for our segment's descriptor at the endpoint its name is made
    // of, `host:<handshake port>` (upstream's P2P naming, `crate::rdma`).
    let name = match parts.0.metadata() {
        None => format!("{host}:{}", parts.0.rpc_port()),
        Some(_) => name,
    };
    Ok((Some(parts), name))
}

/// `enable_ssd_offload`: a disk tier under our own segment, mounted with what its directory
/// already holds (`crate::tier`). Needs a segment to offload from; a directory that cannot
/// serve fails the setup, with the reason logged.
fn start_own_disk(
    cfg: &StoreConfig,
    own: Option<&OwnSegmentState>,
    ip: IpAddr,
    master: &MasterClient,
    client_id: Uuid,
) -> Result<Option<Arc<crate::tier::OwnerDisk>>, ErrorCode> {
    let Some(path) = &cfg.ssd_offload else {
        return Ok(None);
    };
    let Some(own) = own else {
        tracing::error!(
            "setup refused: enable_ssd_offload needs a segment to offload from \
             (global_segment_size > 0)"
        );
        return Err(ErrorCode::InvalidParams);
    };
    crate::disk::DiskConfig::from_env(Some(path.as_str()).filter(|p| !p.is_empty()))
        .map_err(|e| e.to_string())
        .and_then(|dc| crate::tier::OwnerDisk::start(dc, &own.desc.name, ip, ip, &ip.to_string()))
        .and_then(|d| d.mount(master, client_id).map(|_| Some(Arc::new(d))))
        .map_err(|e| {
            tracing::error!("setup: the SSD offload tier: {e}");
            ErrorCode::InvalidParams
        })
}

use crate::limits::{CLIENT_PORT_MAX, CLIENT_PORT_MIN, PING_INTERVAL};
/// Upstream's default cluster id (`MC_STORE_CLUSTER_ID`).
pub use protocol::DEFAULT_CLUSTER_ID;

/// `MC_STORE_CLUSTER_ID`, or upstream's default: the HA cluster whose leader an `etcd://`
/// `master_server_addr` follows (etcd key `mooncake-store/<cluster_id>/master_view`, see
/// `crate::master`), reported by `Store::cluster_id`.
pub fn cluster_id_from_env() -> String {
    std::env::var("MC_STORE_CLUSTER_ID")
        .ok()
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| DEFAULT_CLUSTER_ID.to_string())
}

/// Pings every second: drops our catalogs' entries for ranges the master freed, and when the
/// master does not know us (it restarted, or we were expired) re-mounts every segment mounted
/// now (the own one and the extra ones, `super::extra`) with every object their catalogs hold
/// (see `crate::recovery`; `rdma`, the side serving our segment over RDMA, changes its keys
/// at a new term).
fn start_pinger(
    master: Arc<MasterClient>,
    client_id: Uuid,
    mounted: super::extra::Mounted,
    disk: Option<Arc<crate::tier::OwnerDisk>>,
    rdma: Option<Arc<crate::rdma::RdmaSide>>,
) -> Pinger {
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let thread = std::thread::Builder::new()
        .name("mc-store-ping".into())
        .spawn(move || {
            let drains = recovery::OwnerDrains::default();
            while !s.load(Ordering::SeqCst) {
                let seg = mounted.read().clone();
                let served: Vec<recovery::Served<'_>> = seg
                    .iter()
                    .map(|(desc, memory)| recovery::Served {
                        desc,
                        catalog: memory.catalog(),
                    })
                    .collect();
                match recovery::ping(
                    &master,
                    client_id,
                    &served,
                    disk.as_deref(),
                    rdma.as_deref(),
                    &drains,
                ) {
                    Ok(out) if out.status == ClientStatus::NeedRemount => tracing::info!(
                        "master asked for a re-mount: {} objects re-reported",
                        out.reported
                    ),
                    Ok(_) => {}
                    Err(e) => tracing::debug!("ping failed: {e}"),
                }
                // The next ping after the interval, or at once when calls moved to a new
                // HA leader, which serves only once its owners re-mounted.
                master.wait_unless_moved(master.leader_epoch(), PING_INTERVAL, &s);
            }
        })
        .expect("spawn pinger thread");
    Pinger {
        stop,
        thread,
        executor: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_splitting() {
        assert_eq!(split_host_port("localhost"), ("localhost".into(), None));
        assert_eq!(
            split_host_port("127.0.0.1:12345"),
            ("127.0.0.1".into(), Some(12345))
        );
        assert_eq!(split_host_port("[::1]:5"), ("::1".into(), Some(5)));
        assert_eq!(split_host_port("::1"), ("::1".into(), None));
        assert_eq!(split_host_port("h:notaport"), ("h:notaport".into(), None));
    }

    #[test]
    fn uuids_differ() {
        assert_ne!(Uuid::random(), Uuid::random());
    }
}
