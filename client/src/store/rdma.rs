//! Reaching replicas over RDMA (`protocol="rdma"`).
//!
//! A replica names its segment; the segment's owner published an RDMA descriptor and its
//! handshake port under that name (`crate::rdma`), or with `P2PHANDSHAKE` serves the
//! descriptor from the handshake server the name is made of (`host:port[#i]`).
//! [`RdmaPeers::peer`] reads them once per segment and keeps them; a segment published as TCP
//! (or not at all) is looked up again after [`NOT_RDMA_RECHECK`]. An RDMA peer towards which every device failed
//! (`ERR_ENDPOINT`: the owner died, is cut off, or restarted with new keys) is reached over
//! TCP for that long (the TCP path's endpoint back-off then bounds what a dead owner costs),
//! and its descriptor is read again after it. An owner that refuses our keys (it changed them
//! at a new term, `RdmaSide::rekey`) fails the transfer with [`RdmaFail::StaleKeys`] and its
//! descriptor is forgotten, so the next lookup reads the new keys: a read retries at once, a
//! write only after its caller announced it again (`super::peers`).
//!
//! Bytes move with one-sided RDMA WRITE (put) and READ (get) into the owner's segment; the
//! owner's CPU is not involved. The local side of a work request must lie in registered
//! memory: ranges inside this process's own segment or a buffer registered with
//! `register_buffer` go straight to the NIC; any other memory (a Python `bytes`, a numpy array)
//! is staged through a registered pool of [`STAGING_CHUNK`]-byte chunks, one copy.
//!
//! Invariants: a request never leaves the replica (`Peers` checked the range first, and the
//! transport checks the remote range against the owner's published buffer before posting);
//! a staging chunk is used by one transfer at a time.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dataplane::mem::{Dst, Src};
use dataplane::metadata::desc::{RpcMeta, SegmentDesc};
use dataplane::metadata::handshake::{self, FrameType};
use dataplane::metadata::rdma_desc::RdmaSegmentDesc;
use dataplane::metadata::MetadataError;
use dataplane::transport::rdma::transport::{Peer, Request};
use dataplane::transport::rdma::verbs::RdmaOp;
use parking_lot::{Condvar, Mutex};
use protocol::ErrorCode;

use super::StoreError;
use crate::rdma::RdmaSide;

/// Bytes of one staging chunk.
pub const STAGING_CHUNK: usize = 4 << 20;
/// Staging chunks: transfers from unregistered memory that may run at once.
pub const STAGING_CHUNKS: usize = 4;
/// How long a segment found not to be served over RDMA is not looked up again.
pub const NOT_RDMA_RECHECK: Duration = Duration::from_secs(5);

/// A segment served over RDMA: its descriptor and handshake endpoint.
pub struct RdmaPeer {
    pub name: String,
    pub rpc: String,
    pub desc: RdmaSegmentDesc,
}

enum PeerState {
    Rdma(Arc<RdmaPeer>),
    NotRdma(Instant),
}

/// The registered staging pool.
struct Staging {
    base: u64,
    _mem: Box<[u8]>,
    free: Mutex<Vec<usize>>,
    freed: Condvar,
}

impl Staging {
    fn take(&self) -> StagingChunk<'_> {
        let mut free = self.free.lock();
        loop {
            if let Some(i) = free.pop() {
                return StagingChunk {
                    pool: self,
                    index: i,
                };
            }
            self.freed.wait(&mut free);
        }
    }
}

struct StagingChunk<'a> {
    pool: &'a Staging,
    index: usize,
}

impl StagingChunk<'_> {
    fn addr(&self) -> u64 {
        self.pool.base + (self.index * STAGING_CHUNK) as u64
    }

    /// The chunk's first `len` bytes.
    fn bytes(&mut self, len: usize) -> Dst<'_> {
        assert!(len <= STAGING_CHUNK);
        // SAFETY: the chunk lies inside the pool's allocation, which lives as long as the
        // pool; this guard is its only user until dropped (taken from the free list), and
        // the `Dst` borrows the guard.
        unsafe { Dst::from_raw(self.addr() as *mut u8, len) }
    }
}

impl Drop for StagingChunk<'_> {
    fn drop(&mut self) {
        self.pool.free.lock().push(self.index);
        self.pool.freed.notify_one();
    }
}

/// A store's RDMA path; see the module docs.
pub struct RdmaPeers {
    side: Arc<RdmaSide>,
    peers: Mutex<HashMap<String, PeerState>>,
    staging: Staging,
    /// Bytes moved by RDMA work requests.
    pub bytes: AtomicU64,
    /// Bytes of those that went through staging.
    pub staged_bytes: AtomicU64,
}

impl RdmaPeers {
    /// The path over `side`, with its staging pool registered.
    pub fn new(side: Arc<RdmaSide>) -> Result<RdmaPeers, String> {
        let mem = vec![0u8; STAGING_CHUNK * STAGING_CHUNKS].into_boxed_slice();
        let base = mem.as_ptr() as u64;
        // SAFETY: the pool's memory is owned by the returned value and unregistered in its
        // Drop before it is freed; its keys are never published.
        unsafe { side.register(base, mem.len() as u64)? };
        Ok(RdmaPeers {
            side,
            peers: Mutex::new(HashMap::new()),
            staging: Staging {
                base,
                _mem: mem,
                free: Mutex::new((0..STAGING_CHUNKS).collect()),
                freed: Condvar::new(),
            },
            bytes: AtomicU64::new(0),
            staged_bytes: AtomicU64::new(0),
        })
    }

    pub fn side(&self) -> &Arc<RdmaSide> {
        &self.side
    }

    /// The RDMA view of `segment`, or `None` when its owner serves it over TCP only (or
    /// cannot be looked up now).
    pub fn peer(&self, segment: &str) -> Option<Arc<RdmaPeer>> {
        match self.peers.lock().get(segment) {
            Some(PeerState::Rdma(p)) => return Some(p.clone()),
            Some(PeerState::NotRdma(at)) if at.elapsed() < NOT_RDMA_RECHECK => return None,
            _ => {}
        }
        let found = self.look_up(segment);
        let state = match &found {
            Ok(Some(p)) => PeerState::Rdma(p.clone()),
            Ok(None) => PeerState::NotRdma(Instant::now()),
            Err(e) => {
                tracing::warn!("segment {segment}: RDMA lookup failed, using TCP: {e}");
                PeerState::NotRdma(Instant::now())
            }
        };
        self.peers.lock().insert(segment.to_string(), state);
        found.ok().flatten()
    }

    fn look_up(&self, segment: &str) -> Result<Option<Arc<RdmaPeer>>, String> {
        let Some(store) = self.side.metadata() else {
            return look_up_p2p(segment);
        };
        let keys = self.side.keys();
        let Some(raw) = store.get(&keys.ram(segment)).map_err(|e| e.to_string())? else {
            return Ok(None);
        };
        let Some(desc) = rdma_desc(&raw)? else {
            return Ok(None);
        };
        let meta = store
            .get(&keys.rpc_meta(segment))
            .map_err(|e| e.to_string())?
            .ok_or("no handshake endpoint published")?;
        let meta = RpcMeta::from_json(&meta).map_err(|e| format!("bad rpc_meta: {e}"))?;
        Ok(Some(Arc::new(RdmaPeer {
            name: segment.to_string(),
            rpc: format!("{}:{}", meta.ip_or_host_name, meta.rpc_port),
            desc,
        })))
    }

    /// After every device failed towards `segment`: reach it over TCP for
    /// [`NOT_RDMA_RECHECK`] (whose endpoint back-off keeps a dead or cut-off owner from
    /// costing every call a handshake timeout), then read its descriptor again (a restarted
    /// owner has new keys).
    fn set_aside(&self, segment: &str) {
        self.peers
            .lock()
            .insert(segment.to_string(), PeerState::NotRdma(Instant::now()));
    }

    /// Forgets what `segment` published, so that the next [`RdmaPeers::peer`] reads it again.
    fn forget(&self, segment: &str) {
        self.peers.lock().remove(segment);
    }

    /// Runs `reqs` against `peer`; the first failure.
    fn run(&self, peer: &RdmaPeer, reqs: &[Request]) -> Result<(), RdmaFail> {
        let p = Peer {
            name: &peer.name,
            rpc: &peer.rpc,
            desc: &peer.desc,
        };
        let results = self.side.transport().transfer(&p, reqs);
        let mut first = None;
        for (r, res) in reqs.iter().zip(results) {
            match res {
                Ok(()) => {
                    self.bytes.fetch_add(r.len, Ordering::Relaxed);
                }
                Err(code) => {
                    first.get_or_insert(code);
                }
            }
        }
        match first {
            None => Ok(()),
            Some(code) => {
                let e = StoreError::new(
                    ErrorCode::TransferFail,
                    format!(
                        "RDMA transfer with the segment {} failed (transfer engine code {code})",
                        peer.name
                    ),
                );
                if code == dataplane::TeError::AddressNotRegistered as i32 {
                    // Its keys changed (a new term) or the range is not in what we read.
                    tracing::info!("RDMA keys of {} refused; reading them again", peer.name);
                    self.forget(&peer.name);
                    return Err(RdmaFail::StaleKeys(e));
                }
                if code == dataplane::TeError::Endpoint as i32 {
                    self.set_aside(&peer.name);
                }
                tracing::warn!("RDMA transfer with {} failed: code {code}", peer.name);
                Err(RdmaFail::Other(e))
            }
        }
    }

    /// Writes `parts`, concatenated, at the peer's `remote`. Not retried here on
    /// [`RdmaFail::StaleKeys`]: the write must be announced again first (its intent is what
    /// refuses a writer of an ended term), which is the caller's.
    pub fn write(&self, peer: &RdmaPeer, remote: u64, parts: &[Src<'_>]) -> Result<(), RdmaFail> {
        let t = self.side.transport();
        if parts
            .iter()
            .all(|p| p.is_empty() || t.covers(p.addr(), p.len() as u64))
        {
            let mut reqs = Vec::with_capacity(parts.len());
            let mut at = remote;
            for p in parts.iter().filter(|p| !p.is_empty()) {
                reqs.push(Request {
                    op: RdmaOp::Write,
                    local: p.addr(),
                    remote: at,
                    len: p.len() as u64,
                });
                at += p.len() as u64;
            }
            return self.run(peer, &reqs);
        }
        // Staged: fill a chunk from the parts, write it, next chunk.
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let mut chunk = self.staging.take();
        let (mut part, mut in_part) = (0usize, 0usize);
        let mut done = 0usize;
        while done < total {
            let n = (total - done).min(STAGING_CHUNK);
            let mut buf = chunk.bytes(n);
            let mut filled = 0;
            while filled < n {
                let src = parts[part].tail(in_part);
                let k = src.len().min(n - filled);
                src.split_at(k).0.copy_to(&mut buf.tail(filled));
                filled += k;
                in_part += k;
                if in_part == parts[part].len() {
                    part += 1;
                    in_part = 0;
                }
            }
            let req = Request {
                op: RdmaOp::Write,
                local: chunk.addr(),
                remote: remote + done as u64,
                len: n as u64,
            };
            self.run(peer, &[req])?;
            self.staged_bytes.fetch_add(n as u64, Ordering::Relaxed);
            done += n;
        }
        Ok(())
    }

    /// Reads `dst.len()` bytes at the peer's `remote`; once more with the keys the owner
    /// publishes now if it refused the ones we had (it changed them at a new term).
    pub fn read(&self, peer: &RdmaPeer, remote: u64, mut dst: Dst<'_>) -> Result<(), StoreError> {
        match self.read_once(peer, remote, dst.reborrow()) {
            Err(RdmaFail::StaleKeys(e)) => match self.peer(&peer.name) {
                Some(fresh) => self
                    .read_once(&fresh, remote, dst)
                    .map_err(StoreError::from),
                None => Err(e),
            },
            r => r.map_err(StoreError::from),
        }
    }

    fn read_once(&self, peer: &RdmaPeer, remote: u64, dst: Dst<'_>) -> Result<(), RdmaFail> {
        let t = self.side.transport();
        if t.covers(dst.addr(), dst.len() as u64) {
            let req = Request {
                op: RdmaOp::Read,
                local: dst.addr(),
                remote,
                len: dst.len() as u64,
            };
            return self.run(peer, &[req]);
        }
        let mut chunk = self.staging.take();
        let mut done = 0usize;
        for mut d in dst.chunks(STAGING_CHUNK) {
            let n = d.len();
            let req = Request {
                op: RdmaOp::Read,
                local: chunk.addr(),
                remote: remote + done as u64,
                len: n as u64,
            };
            self.run(peer, &[req])?;
            chunk.bytes(n).as_src().copy_to(&mut d);
            self.staged_bytes.fetch_add(n as u64, Ordering::Relaxed);
            done += n;
        }
        Ok(())
    }
}

/// The RDMA descriptor in `raw`; `None` when it describes a segment served over TCP.
fn rdma_desc(raw: &[u8]) -> Result<Option<RdmaSegmentDesc>, String> {
    if !SegmentDesc::from_json(raw).is_ok_and(|d| d.protocol == "rdma") {
        return Ok(None);
    }
    RdmaSegmentDesc::from_json(raw)
        .map(Some)
        .map_err(|e| format!("bad descriptor: {e}"))
}

/// `P2PHANDSHAKE`: asks the handshake server the segment is named after (`host:port` of
/// `host:port` or `host:port#i`) for its descriptor. No handshake server there (a TCP owner's
/// data port answers with something else, or the segment is not served there): `None`; the
/// server unreachable: an error.
fn look_up_p2p(segment: &str) -> Result<Option<Arc<RdmaPeer>>, String> {
    let owner = segment.split_once('#').map_or(segment, |(o, _)| o);
    if dataplane::metadata::split_host_port(owner).is_none() {
        return Ok(None);
    }
    let raw = match handshake::call(
        owner,
        FrameType::Metadata,
        &handshake::segment_request(segment),
    ) {
        Ok(raw) => raw,
        Err(e @ MetadataError::Io { .. }) => return Err(e.to_string()),
        Err(e) => {
            tracing::debug!("segment {segment}: no RDMA descriptor from {owner}: {e}");
            return Ok(None);
        }
    };
    Ok(rdma_desc(&raw)?.map(|desc| {
        Arc::new(RdmaPeer {
            name: segment.to_string(),
            rpc: owner.to_string(),
            desc,
        })
    }))
}

/// A failed RDMA transfer.
#[derive(Debug)]
pub enum RdmaFail {
    /// The owner refused our memory keys (it changed them at a new term, `RdmaSide::rekey`),
    /// or the range is not in the descriptor we read: the descriptor is forgotten, so the next
    /// [`RdmaPeers::peer`] reads the one published now.
    StaleKeys(StoreError),
    Other(StoreError),
}

impl From<RdmaFail> for StoreError {
    fn from(f: RdmaFail) -> StoreError {
        match f {
            RdmaFail::StaleKeys(e) | RdmaFail::Other(e) => e,
        }
    }
}

impl Drop for RdmaPeers {
    fn drop(&mut self) {
        self.side.unregister(self.staging.base);
    }
}
