//! Moving bytes between local memory and replicas: the state the paths share.
//!
//! How a replica's bytes move is one of the paths of `super::paths` (own segment, same-host
//! mapping, RDMA, TCP), offered each item in preference order; what they share lives here:
//! our own segment, the same-host mappings found on this host (`dataplane::mem::shm`), the
//! RDMA peers (`super::rdma`), the pooled [`TcpClient`] per data-plane endpoint with its
//! back-off, the catalog writer (`super::catalog`) and the bytes each path moved.
//!
//! Transfers are batched: [`Peers::write_many`] and [`Peers::read_many`] take every transfer of
//! a call (all replicas of a put, all keys of a batch), group them by endpoint, cut requests
//! larger than [`crate::limits::TRANSFER_SLICE_BYTES`] into slices so that one large object spreads over the
//! client's lanes, and submit one batch per endpoint. Batches for different endpoints run on
//! scoped threads when there is enough data to make that worthwhile, so the replicas of a put
//! are written at the same time rather than one after another.
//!
//! A failed endpoint is not redialed by every call: after a connect failure, or a socket error
//! (reset, timeout) on an established connection, the endpoint is *down* for a back-off that
//! starts at [`REDIAL_BACKOFF_MIN`] and doubles with every consecutive failure up to
//! [`REDIAL_BACKOFF_MAX`]; calls in that window fail at once with `TRANSFER_FAIL`, and after it
//! one caller at a time dials again (the others wait for its outcome). A successful connect
//! clears the back-off. So an unreachable node costs each call at most one connect timeout,
//! and the node at most one dial per back-off, however many threads use the store.
//!
//! The caller's bytes travel as raw ranges ([`Src`], [`Dst`]) down to the memcpy, the socket
//! calls and the RDMA work requests; no Rust slice is formed over them on the way.
//!
//! Invariants: a transfer never touches bytes outside its replica (`offset + len <= size` is
//! checked first) nor, for the memcpy path, outside our own mapped segment; an item's result is
//! an error if any of its slices failed.

use std::collections::HashMap;
use std::net::ToSocketAddrs;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dataplane::mem::served::ServedMemory;
use dataplane::mem::{Dst, ShmMapping, Src};
use dataplane::transport::client::{
    ClientConfig, TcpClient, TransferError, TransferOp, TransferResult,
};
use parking_lot::Mutex;
use protocol::{ErrorCode, ReplicaDescriptor};

use super::rdma::{RdmaPeer, RdmaPeers};
use super::same_host::Shares;
use super::StoreError;
use crate::disk::share::SharedDir;

use super::catalog::CatalogWriter;
use crate::limits::{
    PARALLEL_ENDPOINTS_MIN_BYTES, REDIAL_BACKOFF_MAX, REDIAL_BACKOFF_MIN, SUBMIT_REQUESTS_MAX,
};

/// This process's own segment, for the memcpy path.
#[derive(Clone, Copy, Debug)]
pub struct OwnSegment {
    pub base: u64,
    pub len: u64,
}

impl OwnSegment {
    pub(super) fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.base
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= self.base + self.len)
    }
}

/// How the store moves bytes (from the environment; see `StoreConfig`).
#[derive(Clone, Copy, Debug)]
pub struct TransferSettings {
    /// Read and write replicas in our own segment with memcpy (`MC_STORE_MEMCPY`, default on).
    pub memcpy: bool,
    /// Map segments other processes on this host share, and memcpy their replicas
    /// (`MC_STORE_SHM`, default on; off when `memcpy` is).
    pub shm: bool,
    /// No-progress bound of one transfer (`MC_TRANSFER_TIMEOUT`, seconds, default 30).
    pub timeout: Duration,
}

impl Default for TransferSettings {
    fn default() -> Self {
        TransferSettings {
            memcpy: true,
            shm: true,
            timeout: dataplane::limits::IO_TIMEOUT_DEFAULT,
        }
    }
}

impl TransferSettings {
    /// `MC_STORE_MEMCPY` (a word of [`protocol::env::FALSE_WORDS`] disables it) and `MC_TRANSFER_TIMEOUT`
    /// (whole seconds, > 0; anything else keeps the default).
    pub fn from_env() -> TransferSettings {
        let mut s = TransferSettings::default();
        s.memcpy = protocol::env::flag("MC_STORE_MEMCPY", true);
        s.shm = s.memcpy && dataplane::mem::shm::shm_enabled();
        if let Some(secs) = std::env::var("MC_TRANSFER_TIMEOUT")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|s| *s > 0)
        {
            s.timeout = Duration::from_secs(secs);
        }
        s
    }
}

/// One write: `parts`, concatenated, to the start of `replica`, then recorded in the replica's
/// catalog as `key` (see `catalog.rs`).
pub struct WriteItem<'a> {
    pub replica: &'a ReplicaDescriptor,
    pub parts: &'a [Src<'a>],
    pub key: &'a str,
    pub hard_pin: bool,
    /// The soft pin recorded with it: the master's answer to an upsert, `catalog::soft_pin_of`
    /// of a put.
    pub soft_pin_ttl_ms: Option<u64>,
    /// Recorded as provisional: a reserved range whose commit comes after the bytes
    /// (`reserve.rs`).
    pub provisional: bool,
}

impl WriteItem<'_> {
    pub(super) fn pins(&self) -> (bool, Option<u64>) {
        (self.hard_pin, self.soft_pin_ttl_ms)
    }
}

/// One read: `dst.len()` bytes at `offset` of `replica`.
pub struct ReadItem<'a> {
    pub replica: &'a ReplicaDescriptor,
    pub offset: u64,
    pub dst: Dst<'a>,
}

/// An endpoint that failed: no dial before `until`.
struct Down {
    until: Instant,
    backoff: Duration,
}

pub struct Peers {
    own_endpoint: Option<String>,
    pub(super) own: Option<OwnSegment>,
    /// Pooled clients: (endpoint, the term their lanes declared, client), one per endpoint,
    /// the last one dialed (`recovery::fence`: a node refuses the WRITEs of an ended term).
    clients: Mutex<Vec<(String, u64, Arc<TcpClient>)>>,
    /// Endpoints in back-off, and per endpoint the lock one dialer holds.
    down: Mutex<HashMap<String, Down>>,
    dialing: Mutex<HashMap<String, Arc<Mutex<()>>>>,
    config: ClientConfig,
    settings: TransferSettings,
    pub(super) catalog: CatalogWriter,
    /// Same-host segments by endpoint (`super::same_host`).
    shared: Shares<ShmMapping>,
    /// Same-host owners' disk directories by their disk segment's endpoint.
    dirs: Shares<SharedDir>,
    pub(super) stats: PathStats,
    /// The RDMA path, when the store runs `protocol="rdma"`.
    rdma: Option<Arc<RdmaPeers>>,
    /// This process's disk tier, when it owns one (`crate::tier`).
    disk: Option<Arc<crate::tier::OwnerDisk>>,
}

/// Bytes moved by each path, for tests and metrics.
#[derive(Debug, Default)]
pub struct PathStats {
    pub own_memcpy_bytes: AtomicU64,
    pub shm_memcpy_bytes: AtomicU64,
    pub tcp_bytes: AtomicU64,
    /// Bytes of reads and of writes (each replica written counts) that succeeded, whatever
    /// their path.
    pub read_bytes: AtomicU64,
    pub write_bytes: AtomicU64,
    /// Reads of disk replicas that succeeded (items, on our disk or an owner's listener).
    pub disk_reads: AtomicU64,
    /// Of those, the ones read from a same-host owner's files by this process
    /// (`crate::disk::share`).
    pub disk_same_host_reads: AtomicU64,
}

impl PathStats {
    pub(super) fn add_own(&self, bytes: u64) {
        self.own_memcpy_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(super) fn add_shm(&self, bytes: u64) {
        self.shm_memcpy_bytes.fetch_add(bytes, Ordering::Relaxed);
    }
}

/// A snapshot of [`PathStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PathCounts {
    pub own_memcpy_bytes: u64,
    pub shm_memcpy_bytes: u64,
    pub tcp_bytes: u64,
    /// Bytes moved by RDMA work requests, and how many of them were staged (copied through
    /// the registered staging pool because the caller's memory was not registered).
    pub rdma_bytes: u64,
    pub rdma_staged_bytes: u64,
    /// Bytes read and written (per replica) by calls that succeeded.
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Reads of disk replicas that succeeded (upstream's offload read count).
    pub disk_reads: u64,
    /// Of those, the ones read from a same-host owner's files by this process.
    pub disk_same_host_reads: u64,
}

/// Requests for one endpoint, with the item each request belongs to.
pub(super) struct Group<'a, 'b> {
    endpoint: &'a str,
    /// The term the WRITEs belong to (their put's version), declared on the client's lanes;
    /// `None` for reads and catalog records, which any client of the endpoint carries.
    term: Option<u64>,
    ops: Vec<TransferOp<'b>>,
    owners: Vec<usize>,
    bytes: u64,
}

impl<'a, 'b> Group<'a, 'b> {
    pub(super) fn push(&mut self, owner: usize, op: TransferOp<'b>, len: usize) {
        self.ops.push(op);
        self.owners.push(owner);
        self.bytes += len as u64;
    }
}

pub(super) fn group_for<'a, 'b, 'g>(
    groups: &'g mut Vec<Group<'a, 'b>>,
    ep: &'a str,
    term: Option<u64>,
) -> &'g mut Group<'a, 'b> {
    let i = match groups
        .iter()
        .position(|g| g.endpoint == ep && g.term == term)
    {
        Some(i) => i,
        None => {
            groups.push(Group {
                endpoint: ep,
                term,
                ops: Vec::new(),
                owners: Vec::new(),
                bytes: 0,
            });
            groups.len() - 1
        }
    };
    &mut groups[i]
}

impl Peers {
    pub fn new(
        own_endpoint: Option<String>,
        own: Option<OwnSegment>,
        settings: TransferSettings,
    ) -> Peers {
        Peers {
            own_endpoint,
            own,
            clients: Mutex::new(Vec::new()),
            down: Mutex::new(HashMap::new()),
            dialing: Mutex::new(HashMap::new()),
            config: ClientConfig {
                io_timeout: settings.timeout,
                // A dial is bounded by the transfer timeout too, when that is shorter.
                connect_timeout: settings
                    .timeout
                    .min(dataplane::limits::CONNECT_TIMEOUT_DEFAULT),
                ..ClientConfig::default()
            },
            settings,
            catalog: CatalogWriter::default(),
            shared: Shares::default(),
            dirs: Shares::default(),
            stats: PathStats::default(),
            rdma: None,
            disk: None,
        }
    }

    /// Reads and writes the replicas on `disk`'s segment in its files directly (the `disk`
    /// replica path); other disk replicas are read from their owners' listeners.
    pub fn with_disk(mut self, disk: Arc<crate::tier::OwnerDisk>) -> Peers {
        self.disk = Some(disk);
        self
    }

    /// Whether this process owns a disk tier.
    pub fn has_disk(&self) -> bool {
        self.disk.is_some()
    }

    /// Our own disk tier, when `r` is one of its replicas.
    pub(super) fn own_disk(&self, r: &ReplicaDescriptor) -> Option<&crate::tier::OwnerDisk> {
        self.disk
            .as_deref()
            .filter(|d| d.desc.name == r.segment_name)
    }

    /// Reaches segments their owners serve over RDMA with `rdma` (after our own segment and
    /// same-host shared segments, which are copied with memcpy).
    pub fn with_rdma(mut self, rdma: Arc<RdmaPeers>) -> Peers {
        self.rdma = Some(rdma);
        self
    }

    pub fn rdma(&self) -> Option<&Arc<RdmaPeers>> {
        self.rdma.as_ref()
    }

    pub(super) fn rdma_peer(&self, r: &ReplicaDescriptor) -> Option<(&RdmaPeers, Arc<RdmaPeer>)> {
        let rd = self.rdma.as_deref()?;
        Some((rd, rd.peer(&r.segment_name)?))
    }

    /// Bytes moved so far by each path.
    pub fn path_counts(&self) -> PathCounts {
        PathCounts {
            own_memcpy_bytes: self.stats.own_memcpy_bytes.load(Ordering::Relaxed),
            shm_memcpy_bytes: self.stats.shm_memcpy_bytes.load(Ordering::Relaxed),
            tcp_bytes: self.stats.tcp_bytes.load(Ordering::Relaxed),
            rdma_bytes: self
                .rdma
                .as_ref()
                .map_or(0, |r| r.bytes.load(Ordering::Relaxed)),
            rdma_staged_bytes: self
                .rdma
                .as_ref()
                .map_or(0, |r| r.staged_bytes.load(Ordering::Relaxed)),
            read_bytes: self.stats.read_bytes.load(Ordering::Relaxed),
            write_bytes: self.stats.write_bytes.load(Ordering::Relaxed),
            disk_reads: self.stats.disk_reads.load(Ordering::Relaxed),
            disk_same_host_reads: self.stats.disk_same_host_reads.load(Ordering::Relaxed),
        }
    }

    /// The same-host mapping of `endpoint`'s segment, if another process here shares it and
    /// is alive (`super::same_host`).
    pub(super) fn shared_segment(&self, endpoint: &str) -> Option<Arc<ShmMapping>> {
        if !self.settings.shm {
            return None;
        }
        self.shared.get(endpoint)
    }

    /// [`Self::shared_segment`] without the owner's liveness looked at again when it is
    /// imported already: for a caller whose write call looked at it a moment ago
    /// (`super::reserve`'s commit record).
    pub(super) fn known_shared_segment(&self, endpoint: &str) -> Option<Arc<ShmMapping>> {
        if !self.settings.shm {
            return None;
        }
        self.shared.known(endpoint)
    }

    /// The directory of the disk segment served at `endpoint`, if its owner runs on this host
    /// and shares it (`crate::disk::share`), unless same-host sharing is off.
    pub(super) fn shared_dir(&self, endpoint: &str) -> Option<Arc<SharedDir>> {
        if !self.settings.shm {
            return None;
        }
        self.dirs.get(endpoint)
    }

    /// Records memcpy'd replicas in the catalog of the table serving our own segment.
    pub fn with_own_catalog(mut self, memory: Arc<ServedMemory>) -> Peers {
        self.catalog = CatalogWriter::new(Some(memory));
        self
    }

    /// Forgets `endpoint`'s same-host mapping (its owner could not take a write's intent):
    /// the next call looks again.
    pub(super) fn forget_shared(&self, endpoint: &str) {
        self.shared.forget(endpoint);
    }

    /// Whether this process may copy a replica in place at all: into its own segment, or a
    /// same-host owner's.
    pub(super) fn copies_in_place(&self) -> bool {
        self.settings.shm || (self.settings.memcpy && self.own_endpoint.is_some())
    }

    /// Whether `r` is read and written with memcpy.
    pub(super) fn is_local(&self, r: &ReplicaDescriptor) -> bool {
        self.settings.memcpy && self.own_endpoint.as_deref() == Some(r.transport_endpoint.as_str())
    }

    /// The pooled client of `endpoint` whose lanes declared `term` (`None`: any).
    fn pooled(&self, endpoint: &str, term: Option<u64>) -> Option<Arc<TcpClient>> {
        let clients = self.clients.lock();
        clients
            .iter()
            .find(|(e, t, _)| e == endpoint && term.is_none_or(|term| *t == term))
            .map(|(_, _, c)| c.clone())
    }

    /// Pools `c` (lanes of `term`) in place of the endpoint's other client: the last one
    /// dialed was dialed for the master of now (a node that serves a later term refuses to
    /// connect a writer of an ended one, so that one never gets here).
    fn pool(&self, endpoint: &str, term: u64, c: &Arc<TcpClient>) {
        let mut clients = self.clients.lock();
        clients.retain(|(e, _, _)| e != endpoint);
        clients.push((endpoint.to_string(), term, c.clone()));
    }

    fn in_backoff(&self, endpoint: &str) -> bool {
        self.down
            .lock()
            .get(endpoint)
            .is_some_and(|d| Instant::now() < d.until)
    }

    /// A client of `endpoint` whose lanes declared `term` (`None`: any, a new one declares
    /// nothing).
    fn client(&self, endpoint: &str, term: Option<u64>) -> Result<Arc<TcpClient>, StoreError> {
        if let Some(c) = self.pooled(endpoint, term) {
            return Ok(c);
        }
        if self.in_backoff(endpoint) {
            return Err(down(endpoint));
        }
        // One dialer per endpoint; the others wait and take its outcome.
        let gate = self
            .dialing
            .lock()
            .entry(endpoint.to_string())
            .or_default()
            .clone();
        let _dialer = gate.lock();
        if let Some(c) = self.pooled(endpoint, term) {
            return Ok(c);
        }
        if self.in_backoff(endpoint) {
            return Err(down(endpoint));
        }
        let connected = endpoint
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| {
                (
                    true,
                    StoreError::new(
                        ErrorCode::TransferFail,
                        format!("the node {endpoint} does not resolve to an address"),
                    ),
                )
            })
            .and_then(|addr| {
                let config = ClientConfig {
                    term: term.unwrap_or(0),
                    ..self.config
                };
                TcpClient::connect(addr, config).map_err(|e| {
                    // A refused FENCE: the node serves a later term than this write's. The
                    // node is fine; only this write is too late.
                    if let TransferError::Refused { status } = e {
                        return (
                            false,
                            StoreError::new(
                                ErrorCode::TransferFail,
                                format!(
                                    "the node {endpoint} refused writes of term {} ({}): a \
                                     later master took over",
                                    term.unwrap_or(0),
                                    dataplane::TeError::from_i32(status)
                                        .map_or("unknown", |c| c.name())
                                ),
                            ),
                        );
                    }
                    tracing::warn!("connecting to {endpoint} failed: {e}");
                    (
                        true,
                        StoreError::new(
                            ErrorCode::TransferFail,
                            format!("cannot connect to the node {endpoint}: {e}"),
                        ),
                    )
                })
            });
        let c = match connected {
            Ok(c) => Arc::new(c),
            Err((down, e)) => {
                if down {
                    self.mark_down(endpoint);
                }
                return Err(e);
            }
        };
        self.down.lock().remove(endpoint);
        self.pool(endpoint, term.unwrap_or(0), &c);
        Ok(c)
    }

    /// Starts or lengthens the endpoint's back-off.
    fn mark_down(&self, endpoint: &str) {
        let now = Instant::now();
        let mut down = self.down.lock();
        let d = down.entry(endpoint.to_string()).or_insert(Down {
            until: now,
            backoff: Duration::ZERO,
        });
        // Failures of calls that were already in flight together count once.
        if now < d.until {
            return;
        }
        d.backoff = (d.backoff * 2).clamp(REDIAL_BACKOFF_MIN, REDIAL_BACKOFF_MAX);
        d.until = now + d.backoff;
    }

    /// Drops the pooled client after a socket error and backs off before dialing again.
    fn forget(&self, endpoint: &str) {
        self.clients.lock().retain(|(e, _, _)| e != endpoint);
        self.mark_down(endpoint);
    }

    /// Writes `parts`, concatenated, to the start of replica `r`.
    #[cfg(test)]
    pub fn write(&self, r: &ReplicaDescriptor, parts: &[&[u8]]) -> Result<(), StoreError> {
        let parts: Vec<Src<'_>> = parts.iter().map(|p| Src::from(*p)).collect();
        self.write_many(&[WriteItem {
            replica: r,
            parts: &parts,
            key: "k",
            hard_pin: false,
            soft_pin_ttl_ms: None,
            provisional: false,
        }])
        .pop()
        .unwrap_or(Ok(()))
    }

    /// Reads `dst.len()` bytes from replica `r` at `offset`.
    pub fn read(&self, r: &ReplicaDescriptor, offset: u64, dst: Dst<'_>) -> Result<(), StoreError> {
        self.read_many(&mut [ReadItem {
            replica: r,
            offset,
            dst,
        }])
        .pop()
        .unwrap_or(Ok(()))
    }

    /// Runs every write (`super::paths`); one result per item, in order.
    pub fn write_many(&self, items: &[WriteItem<'_>]) -> Vec<Result<(), StoreError>> {
        let results = self.write_by_path(items);
        let bytes = items
            .iter()
            .zip(&results)
            .filter(|(_, r)| r.is_ok())
            .map(|(it, _)| it.parts.iter().map(|p| p.len() as u64).sum::<u64>())
            .sum::<u64>();
        self.stats.write_bytes.fetch_add(bytes, Ordering::Relaxed);
        results
    }

    /// Buries removed replicas in their owners' catalogs (a tombstone `CATALOG_PUT` each, or
    /// our own catalog directly), so that no later leader re-inserts what was removed
    /// (`docs/ha.md`). One result per item, in order; an owner that keeps no catalog counts
    /// as done.
    pub fn bury_many(&self, items: &[(&ReplicaDescriptor, &str)]) -> Vec<Result<(), StoreError>> {
        let mut results: Vec<Result<(), StoreError>> = vec![Ok(()); items.len()];
        let records: Vec<Vec<u8>> = items
            .iter()
            .map(|(r, key)| CatalogWriter::tombstone(r, key))
            .collect();
        let mut groups: Vec<Group<'_, '_>> = Vec::new();
        for (i, (r, key)) in items.iter().enumerate() {
            if self.is_local(r) {
                if let Err(e) = self.catalog.bury_local(r, key) {
                    results[i] = Err(super::paths::own_catalog_refused("tombstone", key, r, e));
                }
                continue;
            }
            if !self.catalog.enabled(&r.transport_endpoint) {
                continue;
            }
            let op = TransferOp::CatalogPut {
                remote_addr: r.buffer_address,
                record: Src::from(&records[i][..]),
            };
            group_for(&mut groups, &r.transport_endpoint, None).push(i, op, records[i].len());
        }
        if !groups.is_empty() {
            self.run_groups(groups, &mut results);
        }
        results
    }

    /// Commits, at `version`, the provisional replica `r` of `key` in its owner's catalog
    /// (a put committed in one round trip, `super::reserve`): our own catalog directly, a
    /// same-host owner in the ring that carried the provisional record, any other over TCP
    /// (which its owner applies after its ring, so the order holds whichever way it goes).
    /// An owner that keeps no catalog counts as done.
    pub(super) fn confirm(
        &self,
        r: &ReplicaDescriptor,
        key: &str,
        version: protocol::Version,
    ) -> Result<(), StoreError> {
        let pins = (false, None);
        if self.is_local(r) {
            return self
                .catalog
                .commit_local(r, key, pins, version)
                .map_err(|e| super::paths::own_catalog_refused("commit", key, r, e));
        }
        let record = CatalogWriter::commit(r, key, pins, version);
        let endpoint = &r.transport_endpoint;
        // The put's write call looked at the owner's liveness a moment ago; a commit record
        // published to an owner that died since goes with its catalog, as its object does.
        if let Some(m) = self
            .known_shared_segment(endpoint)
            .filter(|m| m.takes_commits())
        {
            match m.send_records(&[(r.buffer_address, &record)]) {
                Ok(()) => return Ok(()),
                Err((_, e)) => {
                    tracing::warn!("{endpoint}: same-host commit not published ({e}); over TCP");
                    self.forget_shared(endpoint);
                }
            }
        }
        if !self.catalog.enabled(endpoint) {
            return Ok(());
        }
        let op = TransferOp::CatalogPut {
            remote_addr: r.buffer_address,
            record: Src::from(&record[..]),
        };
        let mut groups: Vec<Group<'_, '_>> = Vec::new();
        group_for(&mut groups, endpoint, None).push(0, op, record.len());
        let mut results = vec![Ok(())];
        self.run_groups(groups, &mut results);
        results.pop().unwrap_or(Ok(()))
    }

    /// Runs every read (`super::paths`); one result per item, in order.
    pub fn read_many(&self, items: &mut [ReadItem<'_>]) -> Vec<Result<(), StoreError>> {
        let results = self.read_by_path(items);
        let bytes = items
            .iter()
            .zip(&results)
            .filter(|(_, r)| r.is_ok())
            .map(|(it, _)| it.dst.len() as u64)
            .sum::<u64>();
        self.stats.read_bytes.fetch_add(bytes, Ordering::Relaxed);
        results
    }

    /// Submits each endpoint's batch (in parallel when several endpoints carry enough bytes)
    /// and folds the per-request results into per-item ones.
    pub(super) fn run_groups(
        &self,
        mut groups: Vec<Group<'_, '_>>,
        results: &mut [Result<(), StoreError>],
    ) {
        let total: u64 = groups.iter().map(|g| g.bytes).sum();
        let outcomes: Vec<Vec<Result<(), StoreError>>> =
            if groups.len() > 1 && total >= PARALLEL_ENDPOINTS_MIN_BYTES {
                std::thread::scope(|scope| {
                    let handles: Vec<_> = groups
                        .iter_mut()
                        .map(|g| scope.spawn(move || self.run_group(g)))
                        .collect();
                    handles
                        .into_iter()
                        .map(|h| {
                            h.join().unwrap_or_else(|_| {
                                vec![Err(StoreError::new(
                                    ErrorCode::InternalError,
                                    "a transfer thread panicked",
                                ))]
                            })
                        })
                        .collect()
                })
            } else {
                groups.iter_mut().map(|g| self.run_group(g)).collect()
            };
        for (g, out) in groups.iter().zip(outcomes) {
            if out.len() != g.owners.len() {
                // The group's thread panicked: fail all its items.
                for &o in &g.owners {
                    results[o] = Err(StoreError::new(
                        ErrorCode::InternalError,
                        format!("the transfer thread for {} panicked", g.endpoint),
                    ));
                }
                continue;
            }
            for (&o, r) in g.owners.iter().zip(out) {
                if results[o].is_ok() {
                    results[o] = r;
                }
            }
        }
    }

    /// One endpoint's requests, in submissions of at most `SUBMIT_REQUESTS_MAX`.
    fn run_group(&self, g: &mut Group<'_, '_>) -> Vec<Result<(), StoreError>> {
        let client = match self.client(g.endpoint, g.term) {
            Ok(c) => c,
            Err(e) => return vec![Err(e); g.ops.len()],
        };
        self.stats.tcp_bytes.fetch_add(g.bytes, Ordering::Relaxed);
        let mut out = Vec::with_capacity(g.ops.len());
        let mut start = 0;
        while start < g.ops.len() {
            let end = CatalogWriter::chunk_end(&g.ops, start, SUBMIT_REQUESTS_MAX);
            let chunk = &mut g.ops[start..end];
            let rs = client.submit(chunk);
            for (op, r) in chunk.iter().zip(rs) {
                let r = self.catalog.settle(g.endpoint, op, r);
                out.push(self.outcome(g.endpoint, r));
            }
            start = end;
        }
        out
    }

    fn outcome(&self, endpoint: &str, r: TransferResult) -> Result<(), StoreError> {
        r.map_err(|e| {
            tracing::warn!("transfer with {endpoint} failed: {e}");
            if e.code() == dataplane::TeError::Socket.code() {
                self.forget(endpoint);
            }
            StoreError::new(
                ErrorCode::TransferFail,
                format!("transfer with the node {endpoint} failed: {e}"),
            )
        })
    }
}

/// The error of a transfer to a node that failed recently and is not retried yet.
fn down(endpoint: &str) -> StoreError {
    StoreError::new(
        ErrorCode::TransferFail,
        format!("the node {endpoint} failed recently and is in back-off"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A complete replica of `size` bytes at 4096 of a node nothing listens for.
    fn replica(medium: protocol::ReplicaMedium, size: u64) -> ReplicaDescriptor {
        ReplicaDescriptor {
            status: protocol::ReplicaStatus::Complete,
            medium,
            segment_name: "s".into(),
            transport_endpoint: "127.0.0.1:1".into(),
            buffer_address: 4096,
            size,
            version: protocol::Version::ZERO,
        }
    }

    #[test]
    fn settings_from_values() {
        let d = TransferSettings::default();
        assert!(d.memcpy);
        assert_eq!(d.timeout, dataplane::limits::IO_TIMEOUT_DEFAULT);
    }

    #[test]
    fn bad_ranges_fail_before_any_io() {
        let p = Peers::new(None, None, TransferSettings::default());
        let r = replica(protocol::ReplicaMedium::Memory, 10);
        let mut buf = [0u8; 8];
        let code = |r: Result<(), StoreError>| r.map_err(|e| e.code);
        assert_eq!(
            code(p.read(&r, 4, Dst::from(&mut buf[..]))),
            Err(ErrorCode::InvalidParams)
        );
        assert_eq!(code(p.write(&r, &[&buf])), Err(ErrorCode::InvalidParams));
        assert_eq!(p.read(&r, 2, Dst::from(&mut [][..])), Ok(()));
    }

    #[test]
    fn another_owners_disk_replica_is_read_from_its_listener_and_never_written() {
        let p = Peers::new(None, None, TransferSettings::default());
        let r = replica(protocol::ReplicaMedium::LocalDisk, 8);
        let mut buf = [0u8; 8];
        let why = |r: Result<(), StoreError>| r.map_err(|e| (e.code, e.to_string()));
        // Written by its owner only: refused before any I/O.
        let (code, text) = why(p.write(&r, &[&buf])).unwrap_err();
        assert_eq!(code, ErrorCode::TransferFail);
        assert!(text.contains("written by its owner only"), "{text}");
        assert_eq!(p.path_counts(), PathCounts::default());
        // Read from the owner's disk listener at the replica's endpoint (nothing listens on
        // port 1): never as memory.
        let (code, text) = why(p.read(&r, 0, Dst::from(&mut buf[..]))).unwrap_err();
        assert_eq!(code, ErrorCode::TransferFail);
        assert!(text.contains("127.0.0.1:1"), "{text}");
        assert_eq!(p.path_counts().own_memcpy_bytes, 0);
        assert_eq!(p.path_counts().shm_memcpy_bytes, 0);
    }
}
