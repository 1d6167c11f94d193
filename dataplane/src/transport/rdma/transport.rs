//! The RDMA transport on top of [`Verbs`]: devices, memory regions, per-shard completion
//! queues and RC queue pairs per peer, batched one-sided READ/WRITE with selective
//! signalling, QP error handling with reconnection and failover to another device.
//!
//! Ownership:
//! - one protection domain per device, shared by every shard; each registered buffer has one
//!   memory region per device (its `lkey`/`rkey` go in the descriptor, index = device);
//! - a *shard* owns, per device, a completion queue, and per `(peer, device)` an endpoint
//!   (one RC QP + its [`SendQueue`]). A transfer runs on one shard, chosen round-robin, under
//!   that shard's lock: it posts, then polls the shard's CQ itself (run to completion; the
//!   calling thread is the shard's loop while it holds the lock);
//! - QPs created for peers' `Connection` requests (the passive side of one-sided traffic)
//!   live on a per-device passive CQ; at most [`PASSIVE_QPS_MAX`], the oldest destroyed first.
//!
//! A request is cut into slices of `slice_bytes`, one WR each, posted in batches of at most
//! [`POST_BATCH`] as free send-queue slots allow. When a completion reports an error the QP is
//! in the error state: the endpoint is torn down (QP destroyed), WRs flushed with it go back
//! to the queue, and the transfer reconnects, on the next device after a transport error
//! (`RETRY_EXC_ERR`, flush, peer gone, connect failure) or on the same device after an
//! access error, which fails only its own request with `-3`. After every device was tried,
//! the remaining requests fail with `ERR_ENDPOINT` (-201).
//!
//! Invariants: a WR is posted only for a local range inside one of this transport's memory
//! regions and a remote range inside one buffer of the peer's descriptor; each WR id is
//! unique per shard, so completions of a destroyed QP cannot be mistaken for live ones.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::discovery::{priority_matrix, HcaInfo};
use super::ibv::mtu_enum;
use super::sq::{slices, SendQueue};
use super::verbs::{
    Access, Completion, Cq, Ctx, Gid, Mr, Pd, QpCaps, QpInfo, RdmaOp, RemoteEnd, SendWr,
    Transition, Verbs, VerbsError, WcStatus,
};
use crate::metadata::handshake::{self, FrameType};
use crate::metadata::rdma_desc::{
    split_nic_path, ConnectBody, DeviceDesc, RdmaBufferDesc, RdmaSegmentDesc,
};
use crate::TeError;

/// WRs handed to one `post_send`.
pub const POST_BATCH: usize = 32;
/// Passive QPs kept for peers; the oldest is destroyed beyond this.
pub const PASSIVE_QPS_MAX: usize = 1024;
/// Completions read per `poll_cq`.
const POLL_BATCH: usize = 64;

const ENDPOINT: i32 = TeError::Endpoint as i32;
const NOT_REGISTERED: i32 = TeError::AddressNotRegistered as i32;

/// Transport settings; [`RdmaConfig::from_env`] reads upstream's variables.
///
/// | variable | meaning | default |
/// |---|---|---|
/// | `MC_SLICE_SIZE` | bytes per work request | 65536 |
/// | `MC_MAX_WR` | send-queue depth per QP | 256 |
/// | `MC_MAX_CQE_PER_CTX` | completion-queue depth | 4096 |
/// | `MC_WORKERS_PER_CTX` | shards (each its CQs and QPs) | 2 |
/// | `MC_IB_PORT` | device port | 1 |
/// | `MC_GID_INDEX` (`NCCL_IB_GID_INDEX`) | GID index | 0, or a RoCE v2 IPv4 GID from sysfs |
/// | `MC_MTU` | path MTU bytes (capped by the port's) | 4096 |
#[derive(Clone, Debug)]
pub struct RdmaConfig {
    pub slice_bytes: u64,
    pub max_wr: u32,
    pub cq_depth: u32,
    pub shards: usize,
    pub port: u8,
    pub gid_index: Option<u8>,
    pub mtu_bytes: u32,
    /// Signal at least every this many WRs.
    pub signal_every: usize,
    /// A transfer gives up after this long.
    pub timeout: Duration,
}

impl Default for RdmaConfig {
    fn default() -> Self {
        RdmaConfig {
            slice_bytes: 65536,
            max_wr: 256,
            cq_depth: 4096,
            shards: 2,
            port: 1,
            gid_index: None,
            mtu_bytes: 4096,
            signal_every: 16,
            timeout: Duration::from_secs(30),
        }
    }
}

fn env_num<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

impl RdmaConfig {
    /// Settings from the environment (table above); `timeout` from the engine.
    pub fn from_env(timeout: Duration) -> RdmaConfig {
        let d = RdmaConfig::default();
        RdmaConfig {
            slice_bytes: env_num::<u64>("MC_SLICE_SIZE")
                .filter(|&v| v > 0)
                .unwrap_or(d.slice_bytes)
                .min(1 << 30),
            max_wr: env_num::<u32>("MC_MAX_WR")
                .filter(|&v| v > 0)
                .unwrap_or(d.max_wr),
            cq_depth: env_num::<u32>("MC_MAX_CQE_PER_CTX")
                .filter(|&v| v > 0)
                .unwrap_or(d.cq_depth),
            shards: env_num::<usize>("MC_WORKERS_PER_CTX")
                .filter(|&v| (1..=64).contains(&v))
                .unwrap_or(d.shards),
            port: env_num::<u8>("MC_IB_PORT")
                .filter(|&v| v > 0)
                .unwrap_or(d.port),
            gid_index: env_num::<u8>("MC_GID_INDEX").or_else(|| env_num("NCCL_IB_GID_INDEX")),
            mtu_bytes: env_num::<u32>("MC_MTU").unwrap_or(d.mtu_bytes),
            timeout,
            ..d
        }
    }
}

/// An opened device.
pub struct Device {
    pub name: String,
    pub lid: u16,
    pub gid: Gid,
    pub numa_node: Option<u32>,
    ctx: Ctx,
    pd: Pd,
    gid_index: u8,
    mtu: u32,
    passive_cq: Cq,
}

struct LocalBuf {
    addr: u64,
    len: u64,
    location: String,
    mrs: Vec<Mr>,
    /// What peers may do through its keys: read and write for served memory
    /// ([`RdmaTransport::register`]), nothing for private memory
    /// ([`RdmaTransport::register_private`]), which descriptors never list either.
    access: Access,
}

struct Endpoint {
    qp: QpInfo,
    sq: SendQueue,
}

struct Shard {
    cqs: Vec<Cq>,
    eps: HashMap<(String, usize), Endpoint>,
    next_wr: u64,
}

/// A peer as a transfer sees it.
pub struct Peer<'a> {
    /// Its segment name (NIC paths are `<name>@<device>`).
    pub name: &'a str,
    /// `host:port` of its handshake server.
    pub rpc: &'a str,
    pub desc: &'a RdmaSegmentDesc,
}

/// One one-sided request: `len` bytes between local `local` and the peer's `remote`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub op: RdmaOp,
    pub local: u64,
    pub remote: u64,
    pub len: u64,
}

#[derive(Clone, Copy, Debug)]
struct Slice {
    req: usize,
    op: RdmaOp,
    local: u64,
    remote: u64,
    len: u32,
}

/// Counters for tests, logs and metrics.
#[derive(Debug, Default)]
pub struct RdmaStats {
    pub wrs_posted: AtomicU64,
    pub qp_errors: AtomicU64,
    pub reconnects: AtomicU64,
    pub failovers: AtomicU64,
    pub passive_qps: AtomicU64,
}

/// The transport; see the module docs.
pub struct RdmaTransport {
    verbs: Arc<dyn Verbs>,
    cfg: RdmaConfig,
    name: String,
    devices: Vec<Device>,
    bufs: Mutex<Vec<LocalBuf>>,
    shards: Vec<Mutex<Shard>>,
    next_shard: AtomicUsize,
    passive: Mutex<VecDeque<QpInfo>>,
    stats: RdmaStats,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

enum DriveEnd {
    /// Every slice completed (or failed permanently).
    Done,
    /// The QP failed; `transport` says whether the device/peer path is suspect.
    QpFailed {
        transport: bool,
    },
    TimedOut,
}

impl RdmaTransport {
    /// Opens `chosen` devices with `verbs` and sets up every shard. `name` is the local
    /// segment name. Errors name the device and the verbs call that failed.
    pub fn open(
        verbs: Arc<dyn Verbs>,
        chosen: &[HcaInfo],
        name: &str,
        cfg: RdmaConfig,
        gid_index_of: &dyn Fn(&str, u8) -> Option<u8>,
    ) -> Result<RdmaTransport, String> {
        if chosen.is_empty() {
            return Err("no RDMA device to open".into());
        }
        let mut devices = Vec::new();
        let fail = |d: &str, e: VerbsError| format!("RDMA device {d}: {e}");
        for h in chosen {
            let ctx = verbs.open_device(&h.name).map_err(|e| fail(&h.name, e))?;
            let port = verbs
                .query_port(ctx, cfg.port)
                .map_err(|e| fail(&h.name, e))?;
            let gid_index = cfg
                .gid_index
                .or_else(|| gid_index_of(&h.name, cfg.port))
                .unwrap_or(0);
            let gid = verbs
                .query_gid(ctx, cfg.port, gid_index)
                .map_err(|e| fail(&h.name, e))?;
            let pd = verbs.alloc_pd(ctx).map_err(|e| fail(&h.name, e))?;
            let passive_cq = verbs.create_cq(ctx, 16).map_err(|e| fail(&h.name, e))?;
            devices.push(Device {
                name: h.name.clone(),
                lid: port.lid,
                gid,
                numa_node: h.numa_node,
                ctx,
                pd,
                gid_index,
                mtu: mtu_enum(cfg.mtu_bytes).min(port.active_mtu.max(1)),
                passive_cq,
            });
        }
        let mut shards = Vec::new();
        for _ in 0..cfg.shards.max(1) {
            let mut cqs = Vec::new();
            for d in &devices {
                cqs.push(
                    verbs
                        .create_cq(d.ctx, cfg.cq_depth)
                        .map_err(|e| fail(&d.name, e))?,
                );
            }
            shards.push(Mutex::new(Shard {
                cqs,
                eps: HashMap::new(),
                next_wr: 1,
            }));
        }
        Ok(RdmaTransport {
            verbs,
            cfg,
            name: name.to_string(),
            devices,
            bufs: Mutex::new(Vec::new()),
            shards,
            next_shard: AtomicUsize::new(0),
            passive: Mutex::new(VecDeque::new()),
            stats: RdmaStats::default(),
        })
    }

    /// Implementation name of the verbs in use (`libibverbs`, `sim`).
    pub fn verbs_kind(&self) -> &'static str {
        self.verbs.kind()
    }

    pub fn stats(&self) -> &RdmaStats {
        &self.stats
    }

    /// The devices as the descriptor lists them.
    pub fn device_descs(&self) -> Vec<DeviceDesc> {
        self.devices
            .iter()
            .map(|d| DeviceDesc {
                gid: d.gid.to_text(),
                lid: d.lid,
                name: d.name.clone(),
            })
            .collect()
    }

    /// Registers `[addr, addr + len)` with every device, served: peers holding its keys may
    /// read and write it, and descriptors list it.
    ///
    /// # Safety
    /// As [`Verbs::reg_mr`]: mapped until [`RdmaTransport::unregister`], and peers may read
    /// and write it at any time.
    pub unsafe fn register(&self, addr: u64, len: u64, location: &str) -> Result<(), String> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.register_with(addr, len, location, Access::ALL_RDMA) }
    }

    /// Registers `[addr, addr + len)` with every device for this process's own transfers only
    /// (staging memory, a caller's buffer): local write access, no remote access, so a peer
    /// that learns its keys still cannot read or write it; descriptors do not list it.
    ///
    /// # Safety
    /// Mapped until [`RdmaTransport::unregister`]; the device writes into it for this
    /// process's reads.
    pub unsafe fn register_private(
        &self,
        addr: u64,
        len: u64,
        location: &str,
    ) -> Result<(), String> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.register_with(addr, len, location, Access::LOCAL_WRITE) }
    }

    /// # Safety
    /// As [`RdmaTransport::register`].
    unsafe fn register_with(
        &self,
        addr: u64,
        len: u64,
        location: &str,
        access: Access,
    ) -> Result<(), String> {
        // SAFETY: forwarded from this function's contract.
        let mrs = unsafe { self.reg_on_every_device(addr, len, access)? };
        lock(&self.bufs).push(LocalBuf {
            addr,
            len,
            location: location.to_string(),
            mrs,
            access,
        });
        Ok(())
    }

    /// One memory region of `[addr, addr + len)` per device, in device order; none (those
    /// made deregistered again) if a device refuses.
    ///
    /// # Safety
    /// As [`RdmaTransport::register`].
    unsafe fn reg_on_every_device(
        &self,
        addr: u64,
        len: u64,
        access: Access,
    ) -> Result<Vec<Mr>, String> {
        let mut mrs = Vec::with_capacity(self.devices.len());
        for d in &self.devices {
            // SAFETY: forwarded from this function's contract.
            match unsafe { self.verbs.reg_mr(d.pd, addr, len, access) } {
                Ok(m) => mrs.push(m),
                Err(e) => {
                    for m in mrs {
                        let _ = self.verbs.dereg_mr(m);
                    }
                    return Err(format!(
                        "registering {len} bytes at {addr:#x} on {}: {e}",
                        d.name
                    ));
                }
            }
        }
        Ok(mrs)
    }

    /// Deregisters the buffer starting at `addr`; false if none does. The caller ensures no
    /// transfer uses it (the engine's transfer guard).
    pub fn unregister(&self, addr: u64) -> bool {
        let mut bufs = lock(&self.bufs);
        let Some(i) = bufs.iter().position(|b| b.addr == addr) else {
            return false;
        };
        for m in bufs.remove(i).mrs {
            let _ = self.verbs.dereg_mr(m);
        }
        true
    }

    /// Registers the buffer starting at `addr` again with every device and deregisters its
    /// old memory regions, so that its published `rkey`s change: a peer's work request that
    /// still names an old key fails with `REM_ACCESS_ERR` (`-3` for its request) from the
    /// moment this returns, and none of its bytes land after that. A storage node does this
    /// at every change of the master's term, before it re-mounts (`docs/ha.md`, "The bytes,
    /// by RDMA"). `between` runs once the new keys are in place and before the old ones go:
    /// the owner publishes them there, so that a peer refused the old keys finds the new
    /// ones. `None` if no buffer starts at `addr`; an error (the old keys kept, `between` not
    /// run) if a device refuses the new registration.
    pub fn rekey<R>(&self, addr: u64, between: impl FnOnce() -> R) -> Result<Option<R>, String> {
        let mut bufs = lock(&self.bufs);
        let Some(b) = bufs.iter_mut().find(|b| b.addr == addr) else {
            return Ok(None);
        };
        // SAFETY: the range is already registered under `register`'s contract (mapped until
        // `unregister`, which deregisters these regions too); registering it again adds
        // nothing to that contract.
        let fresh = unsafe { self.reg_on_every_device(b.addr, b.len, b.access)? };
        let old = std::mem::replace(&mut b.mrs, fresh);
        drop(bufs);
        let r = between();
        for m in old {
            if let Err(e) = self.verbs.dereg_mr(m) {
                tracing::error!(addr, error = %e, "deregistering a replaced memory region");
            }
        }
        Ok(Some(r))
    }

    /// The descriptor of this engine with its registered buffers.
    pub fn segment_desc(&self, name: &str, data_port: u16, timestamp: String) -> RdmaSegmentDesc {
        self.segment_desc_where(name, data_port, timestamp, |_| true)
    }

    /// The descriptor of one segment of a process serving several under their own names (a
    /// storage node's shards): only the registered buffer starting at `addr` is listed.
    pub fn segment_desc_of(
        &self,
        name: &str,
        data_port: u16,
        timestamp: String,
        addr: u64,
    ) -> RdmaSegmentDesc {
        self.segment_desc_where(name, data_port, timestamp, |b| b.addr == addr)
    }

    /// Whether `[addr, addr + len)` lies inside one registered buffer (a request from there
    /// needs no staging copy).
    pub fn covers(&self, addr: u64, len: u64) -> bool {
        !self.devices.is_empty() && self.lkey(0, addr, len).is_some()
    }

    fn segment_desc_where(
        &self,
        name: &str,
        data_port: u16,
        timestamp: String,
        keep: impl Fn(&LocalBuf) -> bool,
    ) -> RdmaSegmentDesc {
        let infos: Vec<HcaInfo> = self
            .devices
            .iter()
            .map(|d| HcaInfo {
                name: d.name.clone(),
                numa_node: d.numa_node,
                ports: Vec::new(),
            })
            .collect();
        RdmaSegmentDesc {
            buffers: lock(&self.bufs)
                .iter()
                .filter(|b| b.access.contains(Access::REMOTE_READ) && keep(b))
                .map(|b| RdmaBufferDesc {
                    addr: b.addr,
                    length: b.len,
                    lkey: b.mrs.iter().map(|m| m.lkey).collect(),
                    name: b.location.clone(),
                    rkey: b.mrs.iter().map(|m| m.rkey).collect(),
                })
                .collect(),
            devices: self.device_descs(),
            mooncake_rs_data_port: Some(data_port),
            name: name.to_string(),
            priority_matrix: priority_matrix(&infos),
            protocol: "rdma".into(),
            tcp_data_port: data_port,
            tcp_proto_version: 2,
            timestamp,
        }
    }

    fn lkey(&self, dev: usize, addr: u64, len: u64) -> Option<u32> {
        let end = addr.checked_add(len)?;
        lock(&self.bufs)
            .iter()
            .find(|b| addr >= b.addr && end <= b.addr + b.len)
            .map(|b| b.mrs[dev].lkey)
    }

    /// Device indexes on the NUMA node of the local buffer holding `addr` (its registration
    /// location `cpu:<n>`, else the node the kernel reports for the page), or every device
    /// when none is local or the node is unknown. Never empty.
    fn near_devices(&self, addr: u64) -> Vec<usize> {
        let loc = lock(&self.bufs)
            .iter()
            .find(|b| addr >= b.addr && addr - b.addr < b.len)
            .map(|b| b.location.clone());
        let node = loc
            .as_deref()
            .and_then(|l| l.strip_prefix("cpu:"))
            .and_then(|n| n.parse::<u32>().ok())
            .or_else(|| super::discovery::numa_node_of(addr));
        near_of(
            &self.devices.iter().map(|d| d.numa_node).collect::<Vec<_>>(),
            node,
        )
    }

    fn refuse(msg: String) -> Vec<u8> {
        ConnectBody {
            local_gid: String::new(),
            local_lid: 0,
            local_nic_path: String::new(),
            peer_nic_path: String::new(),
            qp_num: Vec::new(),
            reply_msg: msg,
        }
        .to_json()
    }

    /// Answers a peer's `Connection` request: a QP of ours connected to the peer's.
    pub fn handle_connect(&self, body: &[u8]) -> Vec<u8> {
        let req = match ConnectBody::from_json(body) {
            Ok(r) if r.reply_msg.is_empty() => r,
            Ok(r) => return Self::refuse(format!("unexpected reply_msg {:?}", r.reply_msg)),
            Err(e) => return Self::refuse(format!("bad connection request: {e}")),
        };
        let Some((_, dev_name)) = split_nic_path(&req.peer_nic_path) else {
            return Self::refuse("bad peer_nic_path".into());
        };
        let Some(d) = self.devices.iter().find(|d| d.name == dev_name) else {
            return Self::refuse(format!("no local device {dev_name:?}"));
        };
        let remote = RemoteEnd {
            qp_num: req.qp_num[0],
            lid: req.local_lid,
            gid: Gid::parse(&req.local_gid).unwrap_or_default(),
            psn: 0,
        };
        match self.make_qp(d, d.passive_cq, remote) {
            Ok(qp) => {
                let mut p = lock(&self.passive);
                p.push_back(qp);
                self.stats.passive_qps.fetch_add(1, Ordering::Relaxed);
                while p.len() > PASSIVE_QPS_MAX {
                    if let Some(old) = p.pop_front() {
                        let _ = self.verbs.destroy_qp(old.qp);
                    }
                }
                ConnectBody {
                    local_gid: d.gid.to_text(),
                    local_lid: d.lid,
                    local_nic_path: req.peer_nic_path.clone(),
                    peer_nic_path: req.local_nic_path.clone(),
                    qp_num: vec![qp.qp_num],
                    reply_msg: String::new(),
                }
                .to_json()
            }
            Err(e) => Self::refuse(format!("cannot create a QP on {dev_name}: {e}")),
        }
    }

    fn caps(&self) -> QpCaps {
        QpCaps {
            max_send_wr: self.cfg.max_wr,
            max_recv_wr: 1,
            max_sge: 1,
            max_inline: 0,
        }
    }

    /// A QP on `cq` taken through INIT, RTR (towards `remote`) and RTS.
    fn make_qp(&self, d: &Device, cq: Cq, remote: RemoteEnd) -> Result<QpInfo, VerbsError> {
        let qp = self.verbs.create_qp(d.pd, cq, self.caps())?;
        let steps = [
            Transition::Init {
                port: self.cfg.port,
            },
            Transition::Rtr {
                remote,
                mtu: d.mtu,
                gid_index: d.gid_index,
                port: self.cfg.port,
            },
            Transition::Rts { psn: 0 },
        ];
        for s in steps {
            if let Err(e) = self.verbs.modify_qp(qp.qp, s) {
                let _ = self.verbs.destroy_qp(qp.qp);
                return Err(e);
            }
        }
        Ok(qp)
    }

    /// Connects endpoint `(peer, dev)` of `shard` through the peer's handshake server.
    fn connect(&self, shard: &mut Shard, peer: &Peer, dev: usize) -> Result<(), String> {
        let d = &self.devices[dev];
        let peer_dev = &peer.desc.devices[dev % peer.desc.devices.len()];
        let qp = self
            .verbs
            .create_qp(d.pd, shard.cqs[dev], self.caps())
            .map_err(|e| e.to_string())?;
        let result = (|| {
            self.verbs
                .modify_qp(
                    qp.qp,
                    Transition::Init {
                        port: self.cfg.port,
                    },
                )
                .map_err(|e| e.to_string())?;
            let body = ConnectBody {
                local_gid: d.gid.to_text(),
                local_lid: d.lid,
                local_nic_path: format!("{}@{}", self.name, d.name),
                peer_nic_path: format!("{}@{}", peer.name, peer_dev.name),
                qp_num: vec![qp.qp_num],
                reply_msg: String::new(),
            };
            let raw = handshake::call(peer.rpc, FrameType::Connection, &body.to_json())
                .map_err(|e| format!("handshake with {}: {e}", peer.rpc))?;
            let reply = ConnectBody::from_json(&raw)?;
            if !reply.reply_msg.is_empty() {
                return Err(format!("peer refused the connection: {}", reply.reply_msg));
            }
            let remote = RemoteEnd {
                qp_num: reply.qp_num[0],
                lid: reply.local_lid,
                gid: Gid::parse(&reply.local_gid)?,
                psn: 0,
            };
            let rtr = Transition::Rtr {
                remote,
                mtu: d.mtu,
                gid_index: d.gid_index,
                port: self.cfg.port,
            };
            self.verbs
                .modify_qp(qp.qp, rtr)
                .map_err(|e| e.to_string())?;
            self.verbs
                .modify_qp(qp.qp, Transition::Rts { psn: 0 })
                .map_err(|e| e.to_string())
        })();
        match result {
            Ok(()) => {
                let sq = SendQueue::new(self.cfg.max_wr as usize, self.cfg.signal_every);
                shard
                    .eps
                    .insert((peer.name.to_string(), dev), Endpoint { qp, sq });
                Ok(())
            }
            Err(e) => {
                let _ = self.verbs.destroy_qp(qp.qp);
                Err(e)
            }
        }
    }

    fn teardown(&self, shard: &mut Shard, key: &(String, usize)) {
        if let Some(ep) = shard.eps.remove(key) {
            let _ = self.verbs.modify_qp(ep.qp.qp, Transition::Err);
            let _ = self.verbs.destroy_qp(ep.qp.qp);
        }
    }

    /// Runs `reqs` against `peer`; one outcome per request (`Err` holds a TE code).
    pub fn transfer(&self, peer: &Peer, reqs: &[Request]) -> Vec<Result<(), i32>> {
        let mut out: Vec<Result<(), i32>> = vec![Ok(()); reqs.len()];
        let mut pending: VecDeque<Slice> = VecDeque::new();
        for (i, r) in reqs.iter().enumerate() {
            if r.len == 0 {
                continue;
            }
            if peer.desc.buffer_covering(r.remote, r.len).is_none()
                || self.lkey(0, r.local, r.len).is_none()
            {
                out[i] = Err(NOT_REGISTERED);
                continue;
            }
            for (off, len) in slices(r.len, self.cfg.slice_bytes) {
                pending.push_back(Slice {
                    req: i,
                    op: r.op,
                    local: r.local + off,
                    remote: r.remote + off,
                    len,
                });
            }
        }
        if pending.is_empty() {
            return out;
        }
        if peer.desc.devices.is_empty() {
            for o in out.iter_mut().filter(|o| o.is_ok()) {
                *o = Err(ENDPOINT);
            }
            return out;
        }
        let si = self.next_shard.fetch_add(1, Ordering::Relaxed) % self.shards.len();
        let mut shard = lock(&self.shards[si]);
        let ndev = self.devices.len();
        let near = self.near_devices(reqs[pending[0].req].local);
        let mut dev = near[si % near.len()];
        let mut failures = 0usize;
        let deadline = Instant::now() + self.cfg.timeout;
        while !pending.is_empty() {
            if failures > ndev {
                break;
            }
            let key = (peer.name.to_string(), dev);
            if !shard.eps.contains_key(&key) {
                if let Err(e) = self.connect(&mut shard, peer, dev) {
                    tracing::warn!(peer = peer.name, device = %self.devices[dev].name, error = %e, "RDMA connect failed");
                    failures += 1;
                    dev = (dev + 1) % ndev;
                    self.stats.failovers.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                self.stats.reconnects.fetch_add(1, Ordering::Relaxed);
            }
            match self.drive(&mut shard, &key, peer, &mut pending, &mut out, deadline) {
                DriveEnd::Done => {}
                DriveEnd::QpFailed { transport } => {
                    self.stats.qp_errors.fetch_add(1, Ordering::Relaxed);
                    self.teardown(&mut shard, &key);
                    if transport {
                        failures += 1;
                        dev = (dev + 1) % ndev;
                        self.stats.failovers.fetch_add(1, Ordering::Relaxed);
                    }
                }
                DriveEnd::TimedOut => {
                    self.teardown(&mut shard, &key);
                    break;
                }
            }
        }
        for s in pending {
            if out[s.req].is_ok() {
                out[s.req] = Err(ENDPOINT);
            }
        }
        out
    }

    /// Posts and polls on endpoint `key` until `pending` is empty, the QP fails or the
    /// deadline passes. Slices in flight on a failed QP go back to `pending`.
    fn drive(
        &self,
        shard: &mut Shard,
        key: &(String, usize),
        peer: &Peer,
        pending: &mut VecDeque<Slice>,
        out: &mut [Result<(), i32>],
        deadline: Instant,
    ) -> DriveEnd {
        let dev = key.1;
        let peer_dev = dev % peer.desc.devices.len();
        let cq = shard.cqs[dev];
        let mut inflight: HashMap<u64, Slice> = HashMap::new();
        let mut comps: Vec<Completion> = Vec::with_capacity(POLL_BATCH);
        let requeue = |inflight: &mut HashMap<u64, Slice>, pending: &mut VecDeque<Slice>| {
            let mut v: Vec<(u64, Slice)> = inflight.drain().collect();
            v.sort_by_key(|(id, _)| std::cmp::Reverse(*id));
            for (_, s) in v {
                pending.push_front(s);
            }
        };
        loop {
            // Post what fits.
            let Some(ep) = shard.eps.get_mut(key) else {
                requeue(&mut inflight, pending);
                return DriveEnd::QpFailed { transport: true };
            };
            let mut batch: Vec<(u64, Slice, u32, u32)> = Vec::new();
            while batch.len() < POST_BATCH.min(ep.sq.free()) {
                let Some(s) = pending.pop_front() else { break };
                if out[s.req].is_err() {
                    continue; // another slice of this request already failed
                }
                let lkey = self.lkey(dev, s.local, u64::from(s.len));
                let rkey = peer
                    .desc
                    .buffer_covering(s.remote, u64::from(s.len))
                    .and_then(|b| b.rkey.get(peer_dev).copied());
                match (lkey, rkey) {
                    (Some(l), Some(r)) => {
                        let id = shard.next_wr;
                        shard.next_wr += 1;
                        batch.push((id, s, l, r));
                    }
                    _ => out[s.req] = Err(NOT_REGISTERED),
                }
            }
            if !batch.is_empty() {
                let ids: Vec<u64> = batch.iter().map(|b| b.0).collect();
                let flags = ep.sq.plan(&ids);
                let wrs: Vec<SendWr> = batch
                    .iter()
                    .zip(&flags)
                    .map(|(&(id, s, l, r), &sig)| SendWr {
                        wr_id: id,
                        op: s.op,
                        local_addr: s.local,
                        len: s.len,
                        lkey: l,
                        remote_addr: s.remote,
                        rkey: r,
                        signaled: sig,
                    })
                    .collect();
                // SAFETY: every local range was found inside one of our memory regions
                // (lkey above); the engine's transfer guard keeps it registered until this
                // transfer returns, and we return only after the WR completed or its QP was
                // destroyed.
                let posted = match unsafe { self.verbs.post_send(ep.qp.qp, &wrs) } {
                    Ok(()) => wrs.len(),
                    Err(VerbsError::Post { index, .. }) => index,
                    Err(_) => 0,
                };
                ep.sq.unpost(wrs.len() - posted);
                for (k, &(id, s, _, _)) in batch.iter().enumerate() {
                    if k < posted {
                        inflight.insert(id, s);
                    }
                }
                for &(_, s, _, _) in batch[posted..].iter().rev() {
                    pending.push_front(s);
                }
                self.stats
                    .wrs_posted
                    .fetch_add(posted as u64, Ordering::Relaxed);
                if posted == 0 && ep.sq.outstanding() == 0 {
                    requeue(&mut inflight, pending);
                    return DriveEnd::QpFailed { transport: true };
                }
            }
            if inflight.is_empty() && pending.iter().all(|s| out[s.req].is_err()) {
                pending.clear();
                return DriveEnd::Done;
            }
            // Poll.
            comps.clear();
            if self.verbs.poll_cq(cq, POLL_BATCH, &mut comps).is_err() {
                requeue(&mut inflight, pending);
                return DriveEnd::QpFailed { transport: true };
            }
            if comps.is_empty() {
                if Instant::now() > deadline {
                    requeue(&mut inflight, pending);
                    return DriveEnd::TimedOut;
                }
                std::hint::spin_loop();
                continue;
            }
            let mut failed: Option<bool> = None;
            let ep_qpn = shard.eps.get(key).map(|e| e.qp.qp_num);
            for c in &comps {
                if Some(c.qp_num) != ep_qpn {
                    continue; // a completion of a QP torn down earlier
                }
                let Some(ep) = shard.eps.get_mut(key) else {
                    break;
                };
                let Some(retired) = ep.sq.retire(c.wr_id) else {
                    continue;
                };
                for id in retired.ids {
                    let Some(s) = inflight.remove(&id) else {
                        continue;
                    };
                    // Before the first error of this poll, WRs retired ahead of a completion
                    // succeeded (in-order completion); after it they were flushed.
                    let ok = if id == c.wr_id {
                        c.status.is_ok()
                    } else {
                        failed.is_none()
                    };
                    if ok {
                        continue;
                    }
                    if id != c.wr_id || c.status == WcStatus::WR_FLUSH_ERR {
                        pending.push_front(s);
                        failed.get_or_insert(false);
                    } else if is_access_error(c.status) {
                        out[s.req] = Err(NOT_REGISTERED);
                        failed.get_or_insert(false);
                    } else {
                        tracing::warn!(status = %c.status, "RDMA work request failed");
                        pending.push_front(s);
                        failed = Some(true);
                    }
                }
            }
            if let Some(transport) = failed {
                requeue(&mut inflight, pending);
                return DriveEnd::QpFailed { transport };
            }
        }
    }
}

/// Indexes of `nodes` (each device's NUMA node) equal to `node`; all when none is or the
/// node is unknown.
fn near_of(nodes: &[Option<u32>], node: Option<u32>) -> Vec<usize> {
    let near: Vec<usize> = (0..nodes.len())
        .filter(|&i| node.is_some() && nodes[i] == node)
        .collect();
    if near.is_empty() {
        (0..nodes.len()).collect()
    } else {
        near
    }
}

/// Statuses that blame the request (its addresses or keys), not the path.
fn is_access_error(s: WcStatus) -> bool {
    matches!(
        s,
        WcStatus::REM_ACCESS_ERR
            | WcStatus::LOC_PROT_ERR
            | WcStatus::LOC_ACCESS_ERR
            | WcStatus::REM_INV_REQ_ERR
            | WcStatus::LOC_LEN_ERR
    )
}

impl Drop for RdmaTransport {
    fn drop(&mut self) {
        let v = &self.verbs;
        for s in &self.shards {
            let mut s = lock(s);
            for (_, ep) in s.eps.drain() {
                let _ = v.destroy_qp(ep.qp.qp);
            }
            for &cq in &s.cqs {
                let _ = v.destroy_cq(cq);
            }
        }
        for qp in lock(&self.passive).drain(..) {
            let _ = v.destroy_qp(qp.qp);
        }
        for b in lock(&self.bufs).drain(..) {
            for m in b.mrs {
                let _ = v.dereg_mr(m);
            }
        }
        for d in &self.devices {
            let _ = v.destroy_cq(d.passive_cq);
            let _ = v.dealloc_pd(d.pd);
            let _ = v.close_device(d.ctx);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::handshake::{ConnectionHandler, HandshakeServer, HandshakeState};
    use crate::transport::rdma::sim::tests::fabric;
    use crate::transport::rdma::sim::SimVerbs;
    use std::net::TcpListener;

    struct Side {
        sim: Arc<SimVerbs>,
        t: Arc<RdmaTransport>,
        _hs: HandshakeServer,
        rpc: String,
        mem: Vec<u8>,
    }

    fn side(f: &Path, name: &str, cfg: RdmaConfig) -> Side {
        side_with_auth(f, name, cfg, None)
    }

    /// A side whose handshake port asks for `auth`'s proof (`None`: open).
    fn side_with_auth(
        f: &Path,
        name: &str,
        cfg: RdmaConfig,
        auth: Option<&'static protocol::auth::Token>,
    ) -> Side {
        let sim = Arc::new(SimVerbs::new(f, &["sim0", "sim1"]).unwrap());
        let chosen: Vec<HcaInfo> = ["sim0", "sim1"]
            .iter()
            .map(|n| HcaInfo {
                name: n.to_string(),
                numa_node: None,
                ports: Vec::new(),
            })
            .collect();
        let t =
            Arc::new(RdmaTransport::open(sim.clone(), &chosen, name, cfg, &|_, _| None).unwrap());
        let state = HandshakeState::new();
        let tw = Arc::downgrade(&t);
        state.set_connection_handler(Some(ConnectionHandler(Arc::new(move |b| {
            tw.upgrade()
                .map(|t| t.handle_connect(b))
                .unwrap_or_default()
        }))));
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let rpc = l.local_addr().unwrap().to_string();
        let hs = HandshakeServer::start_with_auth(l, state, auth).unwrap();
        let mut mem = vec![0u8; 1 << 20];
        // SAFETY: `mem` is never reallocated and outlives the transport in every test
        // (fields drop in order: `t` before `mem`).
        unsafe { t.register(mem.as_mut_ptr() as u64, mem.len() as u64, "cpu:0") }.unwrap();
        Side {
            sim,
            t,
            _hs: hs,
            rpc,
            mem,
        }
    }

    use std::path::Path;

    fn cfg() -> RdmaConfig {
        RdmaConfig {
            slice_bytes: 4096,
            max_wr: 8,
            signal_every: 4,
            shards: 1,
            timeout: Duration::from_secs(5),
            ..RdmaConfig::default()
        }
    }

    fn desc(s: &Side) -> RdmaSegmentDesc {
        let d = s.t.segment_desc("b", 1, "t".into());
        RdmaSegmentDesc::from_json(&d.to_json()).unwrap()
    }

    fn pattern(m: &mut [u8], seed: u8) {
        for (i, x) in m.iter_mut().enumerate() {
            *x = (i as u8).wrapping_mul(31).wrapping_add(seed);
        }
    }

    #[test]
    fn devices_near_the_buffer_come_first() {
        let nodes = [Some(0), Some(1), Some(1), None];
        assert_eq!(near_of(&nodes, Some(1)), vec![1, 2]);
        assert_eq!(near_of(&nodes, Some(0)), vec![0]);
        assert_eq!(near_of(&nodes, Some(5)), vec![0, 1, 2, 3]);
        assert_eq!(near_of(&nodes, None), vec![0, 1, 2, 3]);
    }

    #[test]
    fn batched_write_and_read_over_many_slices() {
        let f = fabric("tr-rw");
        let mut a = side(&f, "a", cfg());
        let mut b = side(&f, "b", cfg());
        pattern(&mut a.mem, 1);
        let d = desc(&b);
        let peer = Peer {
            name: "b",
            rpc: &b.rpc,
            desc: &d,
        };
        let (la, lb) = (a.mem.as_ptr() as u64, b.mem.as_ptr() as u64);
        // 3 requests of 100 KiB = 75 WRs through an 8-deep send queue.
        let reqs: Vec<Request> = (0..3u64)
            .map(|i| Request {
                op: RdmaOp::Write,
                local: la + i * 102400,
                remote: lb + i * 102400,
                len: 102400,
            })
            .collect();
        assert!(a.t.transfer(&peer, &reqs).iter().all(|r| r.is_ok()));
        assert!(a.mem[..307200] == b.mem[..307200]);
        assert!(a.t.stats().wrs_posted.load(Ordering::Relaxed) >= 75);
        pattern(&mut b.mem, 9);
        let r = Request {
            op: RdmaOp::Read,
            local: la,
            remote: lb + 4096,
            len: 65536 + 7,
        };
        assert_eq!(a.t.transfer(&peer, &[r]), vec![Ok(())]);
        assert!(a.mem[..65543] == b.mem[4096..4096 + 65543]);
        assert_eq!(b.t.stats().passive_qps.load(Ordering::Relaxed), 1);
        drop((a, b));
        let _ = std::fs::remove_dir_all(&f);
    }

    #[test]
    fn a_rekeyed_buffer_refuses_its_old_keys_and_serves_its_new_ones() {
        let f = fabric("tr-rekey");
        let mut a = side(&f, "a", cfg());
        let b = side(&f, "b", cfg());
        pattern(&mut a.mem, 5);
        let old = desc(&b);
        let (la, lb) = (a.mem.as_ptr() as u64, b.mem.as_ptr() as u64);
        let w = Request {
            op: RdmaOp::Write,
            local: la,
            remote: lb,
            len: 8192,
        };
        let with = |d: &RdmaSegmentDesc| {
            let peer = Peer {
                name: "b",
                rpc: &b.rpc,
                desc: d,
            };
            a.t.transfer(&peer, &[w])
        };
        assert_eq!(with(&old), vec![Ok(())]);
        // Between the new keys and the old ones' end both serve (an owner publishes there).
        let between = b.t.rekey(lb, || (desc(&b), with(&old))).unwrap().unwrap();
        assert_eq!(
            between.1,
            vec![Ok(())],
            "the old keys still serve until they go"
        );
        let new = between.0;
        assert_eq!(b.t.rekey(lb + 1, || ()), Ok(None), "no buffer starts there");
        assert_ne!(
            new.buffers[0].rkey, old.buffers[0].rkey,
            "new keys published"
        );
        // A writer still holding the old keys: refused, and nothing of it lands.
        pattern(&mut a.mem, 6);
        assert_eq!(with(&old), vec![Err(NOT_REGISTERED)]);
        let landed = b.mem[..8192].to_vec();
        pattern(&mut a.mem, 5);
        assert!(landed == a.mem[..8192], "the refused write left its bytes");
        // One with the new keys writes as before.
        pattern(&mut a.mem, 7);
        assert_eq!(with(&new), vec![Ok(())]);
        assert!(a.mem[..8192] == b.mem[..8192]);
        drop((a, b));
        let _ = std::fs::remove_dir_all(&f);
    }

    /// A 4 KiB write and a 4 KiB read from `local` of `a` to `remote` of `peer` both fail.
    fn refused_both_ways(a: &Side, peer: &Peer<'_>, local: u64, remote: u64) {
        for op in [RdmaOp::Write, RdmaOp::Read] {
            let r = Request {
                op,
                local,
                remote,
                len: 4096,
            };
            assert!(a.t.transfer(peer, &[r])[0].is_err(), "{op:?} went through");
        }
    }

    /// Memory registered privately (a caller's buffer, staging) is not in descriptors, and a
    /// peer that learns its keys anyway can neither write nor read it; its own process still
    /// reads into it.
    #[test]
    fn private_memory_refuses_peers_that_know_its_keys() {
        let f = fabric("tr-private");
        let mut a = side(&f, "a", cfg());
        let b = side(&f, "b", cfg());
        let mut private = vec![0x11u8; 8192];
        let lp = private.as_mut_ptr() as u64;
        // SAFETY: `private` outlives `b` (dropped explicitly below, before it).
        unsafe { b.t.register_private(lp, 8192, "cpu:0") }.unwrap();
        assert_eq!(
            desc(&b).buffers.len(),
            1,
            "only the served buffer is listed"
        );
        // A descriptor forged with the private buffer's real keys.
        let mut forged = desc(&b);
        {
            let bufs = lock(&b.t.bufs);
            let p = bufs.iter().find(|x| x.addr == lp).unwrap();
            forged.buffers[0].addr = lp;
            forged.buffers[0].length = 8192;
            forged.buffers[0].rkey = p.mrs.iter().map(|m| m.rkey).collect();
        }
        pattern(&mut a.mem, 3);
        let la = a.mem.as_ptr() as u64;
        let peer = Peer {
            name: "b",
            rpc: &b.rpc,
            desc: &forged,
        };
        refused_both_ways(&a, &peer, la, lp);
        assert!(
            private.iter().all(|&x| x == 0x11),
            "a peer wrote private memory"
        );
        // b itself reads a's served memory into its private buffer.
        let mine = Peer {
            name: "a",
            rpc: &a.rpc,
            desc: &desc(&a),
        };
        let r = Request {
            op: RdmaOp::Read,
            local: lp,
            remote: la,
            len: 4096,
        };
        assert_eq!(b.t.transfer(&mine, &[r]), vec![Ok(())]);
        assert!(private[..4096] == a.mem[..4096]);
        drop((a, b));
        drop(private);
        let _ = std::fs::remove_dir_all(&f);
    }

    /// With a cluster secret on the owner's handshake port, a peer that cannot prove it gets
    /// no queue pair: its writes and reads fail, nothing lands, and the owner made no QP.
    #[test]
    fn a_connect_without_the_proof_gets_no_queue_pair() {
        let f = fabric("tr-auth");
        let mut a = side(&f, "a", cfg());
        let secret = protocol::auth::Token::new(b"rdma-handshake-secret").unwrap();
        let b = side_with_auth(&f, "b", cfg(), Some(Box::leak(Box::new(secret))));
        pattern(&mut a.mem, 4);
        let d = desc(&b);
        let peer = Peer {
            name: "b",
            rpc: &b.rpc,
            desc: &d,
        };
        let (la, lb) = (a.mem.as_ptr() as u64, b.mem.as_ptr() as u64);
        refused_both_ways(&a, &peer, la, lb);
        assert!(b.mem.iter().all(|&x| x == 0), "a stranger's write landed");
        assert_eq!(b.t.stats().passive_qps.load(Ordering::Relaxed), 0);
        drop((a, b));
        let _ = std::fs::remove_dir_all(&f);
    }

    #[test]
    fn bad_addresses_fail_only_their_request() {
        let f = fabric("tr-bad");
        let mut a = side(&f, "a", cfg());
        let b = side(&f, "b", cfg());
        pattern(&mut a.mem, 3);
        let mut d = desc(&b);
        let (la, lb) = (a.mem.as_ptr() as u64, b.mem.as_ptr() as u64);
        let ok = Request {
            op: RdmaOp::Write,
            local: la,
            remote: lb,
            len: 10000,
        };
        // Outside the peer's descriptor, and outside our registration: refused before posting.
        let out_remote = Request {
            remote: lb + (1 << 20) - 10,
            ..ok
        };
        let out_local = Request {
            local: la + (1 << 20),
            ..ok
        };
        {
            let peer = Peer {
                name: "b",
                rpc: &b.rpc,
                desc: &d,
            };
            let r = a.t.transfer(&peer, &[out_remote, ok, out_local]);
            assert_eq!(r, vec![Err(NOT_REGISTERED), Ok(()), Err(NOT_REGISTERED)]);
        }
        // A stale rkey (peer re-registered): REM_ACCESS_ERR from the "NIC", -3 for it; the
        // transport reconnects and the next transfer works.
        d.buffers[0].rkey = vec![1, 2];
        let peer = Peer {
            name: "b",
            rpc: &b.rpc,
            desc: &d,
        };
        assert_eq!(a.t.transfer(&peer, &[ok]), vec![Err(NOT_REGISTERED)]);
        assert_eq!(a.t.stats().qp_errors.load(Ordering::Relaxed), 1);
        let good = desc(&b);
        let peer = Peer {
            name: "b",
            rpc: &b.rpc,
            desc: &good,
        };
        assert_eq!(a.t.transfer(&peer, &[ok]), vec![Ok(())]);
        assert!(a.mem[..10000] == b.mem[..10000]);
        drop((a, b));
        let _ = std::fs::remove_dir_all(&f);
    }

    #[test]
    fn a_failed_qp_is_torn_down_and_the_transfer_fails_over() {
        let f = fabric("tr-fo");
        let mut a = side(&f, "a", cfg());
        let b = side(&f, "b", cfg());
        pattern(&mut a.mem, 5);
        let d = desc(&b);
        let peer = Peer {
            name: "b",
            rpc: &b.rpc,
            desc: &d,
        };
        let (la, lb) = (a.mem.as_ptr() as u64, b.mem.as_ptr() as u64);
        let r = Request {
            op: RdmaOp::Write,
            local: la,
            remote: lb,
            len: 40000,
        };
        // The third WR fails as if the link dropped: the rest flush, everything is retried
        // on the other device, and the data arrives whole.
        a.sim.fail_next(WcStatus::SUCCESS);
        a.sim.fail_next(WcStatus::SUCCESS);
        a.sim.fail_next(WcStatus::RETRY_EXC_ERR);
        assert_eq!(a.t.transfer(&peer, &[r]), vec![Ok(())]);
        assert!(a.mem[..40000] == b.mem[..40000]);
        let s = a.t.stats();
        assert_eq!(s.qp_errors.load(Ordering::Relaxed), 1);
        assert_eq!(s.failovers.load(Ordering::Relaxed), 1);
        assert_eq!(s.reconnects.load(Ordering::Relaxed), 2);
        // Every path failing: a clear error, not a hang.
        for _ in 0..8 {
            a.sim.fail_next(WcStatus::RETRY_EXC_ERR);
        }
        assert_eq!(a.t.transfer(&peer, &[r]), vec![Err(ENDPOINT)]);
        drop((a, b));
        let _ = std::fs::remove_dir_all(&f);
    }

    #[test]
    fn a_restarted_peer_is_reconnected() {
        let f = fabric("tr-restart");
        let mut a = side(&f, "a", cfg());
        let b = side(&f, "b", cfg());
        pattern(&mut a.mem, 7);
        let d = desc(&b);
        let (la, lb) = (a.mem.as_ptr() as u64, b.mem.as_ptr() as u64);
        let r = Request {
            op: RdmaOp::Write,
            local: la,
            remote: lb,
            len: 5000,
        };
        {
            let peer = Peer {
                name: "b",
                rpc: &b.rpc,
                desc: &d,
            };
            assert_eq!(a.t.transfer(&peer, &[r]), vec![Ok(())]);
        }
        // The peer's QPs vanish (its passive side restarted): RETRY_EXC_ERR on the next
        // transfer, then a new connection on the other device.
        for qp in lock(&b.t.passive).drain(..) {
            b.sim.destroy_qp(qp.qp).unwrap();
        }
        pattern(&mut a.mem, 8);
        let peer = Peer {
            name: "b",
            rpc: &b.rpc,
            desc: &d,
        };
        assert_eq!(a.t.transfer(&peer, &[r]), vec![Ok(())]);
        assert!(a.mem[..5000] == b.mem[..5000]);
        assert!(a.t.stats().failovers.load(Ordering::Relaxed) >= 1);
        // A peer whose handshake port is gone: connect fails on every device -> ERR_ENDPOINT.
        let dead = Peer {
            name: "b",
            rpc: "127.0.0.1:1",
            desc: &d,
        };
        let fresh = side(&f, "c", cfg());
        let rc = Request {
            local: fresh.mem.as_ptr() as u64,
            ..r
        };
        assert_eq!(fresh.t.transfer(&dead, &[rc]), vec![Err(ENDPOINT)]);
        drop((a, b, fresh));
        let _ = std::fs::remove_dir_all(&f);
    }
}
