//! The transfer engine: one-sided READ and WRITE between registered memory of processes,
//! named by segment, with upstream Mooncake's API shape (`TransferEngine`,
//! `transfer_engine.h`) so that `mooncake.engine` and the store client can wrap it.
//!
//! Lifecycle: [`TransferEngine::new`] then [`TransferEngine::initialize`] with a server name,
//! a metadata connection string (`http://host:port/metadata`; `etcd://host:port[,host:port]`
//! or a bare `host:port` for etcd; `P2PHANDSHAKE`), a protocol (`tcp`, or `rdma`: see
//! [`rdma`] for device choice, the TCP fall-back, `MC_FORCE_TCP` and the software model) and a device list
//! (`rdma` only). Initialisation
//!
//! 1. binds the handshake server on the rpc port (random in `[MC_MIN_RPC_PORT,
//!    MC_MAX_RPC_PORT]` unless set) and the data server ([`TcpServer`]) on an ephemeral port;
//! 2. names the local segment: `local_server_name` as given, or `host:rpc_port` in P2P mode;
//! 3. with a metadata store, publishes `mooncake/rpc_meta/<name>` and `mooncake/ram/<name>`.
//!
//! Registered memory is served to peers by the data server; the descriptor is re-published
//! on every (un)registration and both keys are removed on shutdown (drop).
//!
//! Transfers address peer memory by absolute address. [`TransferEngine::transfer_sync`] runs
//! on the calling thread; [`TransferEngine::submit`] queues a job on the worker pool and
//! [`TransferEngine::status`] polls it. A transfer to the engine's own segment is a memcpy
//! after both ranges are checked against the registration table.
//!
//! Which path a transfer to a peer takes, decided when its descriptor is fetched: RDMA when
//! both run it; else, when the peer's descriptor names a registration table on this host and
//! this process may attach to it ([`samehost`]: same boot id, same user, cross-memory attach
//! permitted, `MC_TE_SAME_HOST` not off), one kernel copy (`process_vm_readv`/`writev`) per
//! request, checked against the peer's live table; else the TCP client.
//!
//! Invariants:
//! - no byte moves before its local range was found inside one registered buffer (and, for
//!   the local segment, its target range too); peers' ranges are checked by the peer, or for
//!   a same-host peer against the table the peer keeps of its registrations;
//! - `unregister_memory` returns only when no request of this engine (nor of a peer, through
//!   the data server) is using the buffer;
//! - nothing arriving from the network (descriptors, handshake frames, data responses)
//!   causes a panic; it fails the request with a negative code.
//!
//! Sub-modules: [`config`] (limits and environment), [`error`], [`batch`] (batch table and
//! statuses), `segments` (descriptor lookup and the cache of opened peers), `managed`
//! (managed buffers), `exec` (running requests, worker pool), [`rdma`] (the RDMA transport's
//! selection and data path).

pub mod batch;
pub mod config;
pub mod error;
mod exec;
mod managed;
pub mod rdma;
pub mod samehost;
mod segments;

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock};
use std::time::{Duration, Instant};

pub use batch::{TaskReport, TransferRequest, TransferStatus};
pub use config::EngineOptions;
pub use error::EngineError;

use crate::limits::CONNECT_TIMEOUT_DEFAULT;
use crate::mem::served::{ServedMemory, ServerConfig};
use crate::mem::{Dst, Segment, SegmentOptions, Src};
use crate::metadata::desc::{timestamp_now, BufferDesc, SegmentDesc};
use crate::metadata::handshake::{
    self, ConnectionHandler, FrameType, HandshakeServer, HandshakeState, NotifyMsg,
};
use crate::metadata::rdma_desc::RdmaSegmentDesc;
use crate::metadata::{host_of, split_host_port, Keys, MetadataBackend};
use crate::server::blocking::TcpServer;
use crate::transport::client::ClientConfig;
use crate::transport::header::Opcode;
use crate::transport::rdma::transport::RdmaTransport;
use crate::TeError;
use batch::BatchTable;
use exec::Workers;
use managed::{Freed, Managed};
use segments::{Directory, RemoteSegment, SegmentCache};

/// A segment as the engine knows it: 0 is the engine's own segment, peers get 1, 2, ...
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SegmentHandle(pub u64);

impl SegmentHandle {
    /// The engine's own segment (upstream's `LOCAL_SEGMENT_ID`).
    pub const LOCAL: SegmentHandle = SegmentHandle(0);
}

/// A transfer engine; see the module docs. All methods take `&self` and may be called from
/// any thread.
pub struct TransferEngine {
    options: EngineOptions,
    running: OnceLock<Arc<Running>>,
    init_lock: Mutex<()>,
}

/// State of an initialized engine. Jobs in flight hold an `Arc` to it, so memory it owns
/// (managed buffers) outlives them.
pub(crate) struct Running {
    options: EngineOptions,
    name: String,
    advertise_host: String,
    rpc_port: u16,
    data_port: u16,
    keys: Keys,
    directory: Directory,
    memory: Arc<ServedMemory>,
    data_server: Mutex<Option<TcpServer>>,
    handshake: Mutex<Option<HandshakeServer>>,
    hs_state: Arc<HandshakeState>,
    /// The RDMA transport when `protocol="rdma"` found a device (else TCP only).
    rdma: Option<Arc<RdmaTransport>>,
    /// The registration table same-host readers check (TCP engines; `None` if it could not
    /// be made, then same-host peers use TCP).
    table: Option<samehost::Table>,
    /// Registered buffers in registration order; its lock also orders publications.
    buffers: Mutex<Vec<BufferDesc>>,
    /// Held for reading by every running request, for writing by unregistration.
    guard: RwLock<()>,
    segments: SegmentCache,
    batches: BatchTable,
    managed: Mutex<Managed>,
    workers: Workers,
    shut_down: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

// The Python layer shares one engine between threads.
const _: fn() = || {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<TransferEngine>();
};

impl Default for TransferEngine {
    fn default() -> Self {
        TransferEngine::new()
    }
}

impl TransferEngine {
    /// An uninitialized engine with settings from the environment.
    pub fn new() -> TransferEngine {
        TransferEngine::with_options(EngineOptions::from_env())
    }

    /// An uninitialized engine with explicit settings.
    pub fn with_options(options: EngineOptions) -> TransferEngine {
        TransferEngine {
            options,
            running: OnceLock::new(),
            init_lock: Mutex::new(()),
        }
    }

    /// Starts the engine; see the module docs. `protocol` is `tcp` (or `""`) or `rdma`;
    /// `device` is the comma-separated RDMA device list (empty: auto-discovery).
    ///
    /// `rdma` without libibverbs or a usable device runs TCP, with a WARNING (as upstream);
    /// with `MC_REQUIRE_RDMA` set it fails with `ERR_DEVICE_NOT_FOUND` (-6). `MC_FORCE_TCP`
    /// runs TCP without a warning.
    pub fn initialize(
        &self,
        local_server_name: &str,
        metadata_conn: &str,
        protocol: &str,
        device: &str,
    ) -> Result<(), EngineError> {
        let _init = lock(&self.init_lock);
        if self.running.get().is_some() {
            return Err(EngineError::new(
                TeError::InvalidArgument,
                "the engine is already initialized",
            ));
        }
        if !matches!(
            protocol.trim().to_ascii_lowercase().as_str(),
            "tcp" | "" | "rdma"
        ) {
            return Err(EngineError::new(
                TeError::NotImplemented,
                format!("protocol {protocol:?}: this build supports tcp and rdma"),
            ));
        }
        // The cluster secret (MC_AUTH_TOKEN / MC_AUTH_TOKEN_FILE): a broken setting must fail
        // here, not leave the data port open to anyone.
        protocol::auth::process_token()
            .map_err(|e| EngineError::new(TeError::InvalidArgument, e.to_string()))?;
        // No RDMA device is TCP (warned, counted), or an error under MC_REQUIRE_RDMA.
        let rdma_device = rdma::rdma_or_fallback(protocol, device, "transfer engine")
            .map_err(|e| EngineError::new(TeError::DeviceNotFound, e))?
            .then_some(device);
        if protocol.trim().eq_ignore_ascii_case("rdma") && rdma::force_tcp() {
            tracing::info!("protocol rdma: MC_FORCE_TCP is set, running TCP");
        }
        let running = Running::start(
            self.options.clone(),
            local_server_name,
            metadata_conn,
            rdma_device,
        )?;
        // Set under init_lock after the check above, so this cannot fail.
        let _ = self.running.set(Arc::new(running));
        Ok(())
    }

    fn running(&self) -> Result<&Arc<Running>, EngineError> {
        self.running.get().ok_or_else(EngineError::not_initialized)
    }

    /// The local segment name (`None` before initialize).
    pub fn local_segment_name(&self) -> Option<String> {
        self.running.get().map(|r| r.name.clone())
    }

    /// The handshake port (0 before initialize).
    pub fn rpc_port(&self) -> u16 {
        self.running.get().map_or(0, |r| r.rpc_port)
    }

    /// `libibverbs` or `sim` when the engine runs the RDMA transport, else `None` (TCP).
    pub fn rdma_verbs(&self) -> Option<&'static str> {
        self.running
            .get()
            .and_then(|r| r.rdma.as_ref().map(|t| t.verbs_kind()))
    }

    /// The RDMA transport, for its counters (`None` when running TCP).
    pub fn rdma_transport(&self) -> Option<Arc<RdmaTransport>> {
        self.running.get().and_then(|r| r.rdma.clone())
    }

    /// The data port peers send READ/WRITE frames to (0 before initialize).
    pub fn data_port(&self) -> u16 {
        self.running.get().map_or(0, |r| r.data_port)
    }

    /// Registers `[addr, addr + len)` for local transfers and remote access by peers.
    /// `location` (`"cpu:0"`, `"*"`) is written to the RDMA descriptor's buffer name.
    ///
    /// Errors: `-7` when it overlaps a registered buffer, `-1` for `len == 0` or a range that
    /// wraps, a metadata error when the descriptor cannot be published (then nothing stays
    /// registered).
    ///
    /// # Safety
    /// Until [`TransferEngine::unregister_memory`] of `addr` returns, the range must stay
    /// mapped, readable and writable, and the caller accepts that peers and this engine's
    /// transfers read and write it at any time.
    pub unsafe fn register_memory(
        &self,
        addr: u64,
        len: u64,
        location: &str,
    ) -> Result<(), EngineError> {
        let run = self.running()?;
        let mut bufs = lock(&run.buffers);
        // SAFETY: forwarded from this function's contract.
        unsafe { run.memory.register(addr, len) }?;
        if let Some(t) = &run.rdma {
            // SAFETY: forwarded from this function's contract; `unregister` deregisters it.
            if let Err(e) = unsafe { t.register(addr, len, location) } {
                let _ = run.memory.unregister(addr);
                return Err(EngineError::new(TeError::Memory, e));
            }
        }
        bufs.push(BufferDesc {
            addr,
            length: len,
            name: run.name.clone(),
        });
        if let Err(e) = run.publish(&bufs) {
            bufs.pop();
            let _ = run.memory.unregister(addr);
            if let Some(t) = &run.rdma {
                t.unregister(addr);
            }
            return Err(e);
        }
        if let Some(t) = &run.table {
            t.publish(&bufs);
        }
        Ok(())
    }

    /// Unregisters the buffer starting at `addr` (`-3` when none does). Waits until no
    /// request uses it. The new descriptor is published; a publication error is returned but
    /// the buffer stays unregistered.
    pub fn unregister_memory(&self, addr: u64) -> Result<(), EngineError> {
        self.running()?.unregister(addr)
    }

    /// Allocates and registers `len` bytes; returns the address.
    pub fn allocate_managed_buffer(&self, len: usize) -> Result<u64, EngineError> {
        let run = self.running()?;
        if len == 0 {
            return Err(EngineError::new(
                TeError::InvalidArgument,
                "managed buffer of 0 bytes",
            ));
        }
        let mut managed = lock(&run.managed);
        if Managed::is_small(len) {
            if let Some(a) = managed.alloc_small(len) {
                return Ok(a);
            }
            if !managed.can_grow() {
                return Err(EngineError::new(
                    TeError::Memory,
                    "every managed-buffer pool is full",
                ));
            }
            let pool = run.new_segment(config::MANAGED_POOL_BYTES)?;
            managed.add_pool(pool);
            return managed.alloc_small(len).ok_or_else(|| {
                EngineError::new(
                    TeError::Memory,
                    "a fresh managed pool refused an allocation",
                )
            });
        }
        let seg = run.new_segment(len)?;
        Ok(managed.add_dedicated(seg))
    }

    /// Frees a managed buffer (`-3` when `addr` is not one). `len` is accepted for
    /// compatibility.
    pub fn free_managed_buffer(&self, addr: u64, len: usize) -> Result<(), EngineError> {
        let _ = len;
        let run = self.running()?;
        let mut managed = lock(&run.managed);
        match managed.free(addr) {
            Some(Freed::Block) => Ok(()),
            Some(Freed::Dedicated(seg)) => {
                run.unregister(seg.addr() as u64)?;
                drop(seg); // unmapped now: nothing uses or serves it any more
                Ok(())
            }
            None => Err(EngineError::new(
                TeError::AddressNotRegistered,
                format!("{addr:#x} is not a managed buffer"),
            )),
        }
    }

    /// Copies `data` to `addr` in this process. The whole range must lie inside one buffer
    /// registered with (or allocated by) this engine, else `-3` and nothing is written (upstream's
    /// Python `write_bytes_to_buffer` is an unchecked memcpy). Unregistration waits for the copy.
    pub fn write_local(&self, addr: u64, data: Src<'_>) -> Result<(), EngineError> {
        let run = self.running()?;
        let _guard = run.guard.read().unwrap_or_else(|e| e.into_inner());
        run.check_local(addr, data.len())?;
        if !data.is_empty() {
            // SAFETY: `[addr, addr + len)` lies inside one registered buffer (just checked),
            // which register_memory's contract keeps mapped and writable while registered; the
            // transfer guard keeps it registered until the copy ends. `copy` allows overlap.
            unsafe { std::ptr::copy(data.as_ptr(), addr as *mut u8, data.len()) };
        }
        Ok(())
    }

    /// Copies `out.len()` bytes from `addr` in this process into `out`; the range is checked as
    /// in [`TransferEngine::write_local`] (`-3` and `out` untouched when it is not registered).
    pub fn read_local(&self, addr: u64, mut out: Dst<'_>) -> Result<(), EngineError> {
        let run = self.running()?;
        let _guard = run.guard.read().unwrap_or_else(|e| e.into_inner());
        run.check_local(addr, out.len())?;
        if !out.is_empty() {
            // SAFETY: as in `write_local`: the source range is registered, hence mapped and
            // readable, until the guard drops; `out` is writable for the call, and `copy`
            // tolerates the two overlapping (the caller may have registered `out` itself).
            unsafe { std::ptr::copy(addr as *const u8, out.as_mut_ptr(), out.len()) };
        }
        Ok(())
    }

    /// Opens (and caches) segment `name`. The engine's own name gives
    /// [`SegmentHandle::LOCAL`]. An unknown peer is `ERR_METADATA` (-200).
    pub fn open_segment(&self, name: &str) -> Result<SegmentHandle, EngineError> {
        let run = self.running()?;
        if name == run.name {
            return Ok(SegmentHandle::LOCAL);
        }
        if let Some(h) = run.segments.handle_of(name) {
            return Ok(SegmentHandle(h));
        }
        let seg = run.fetch_segment(name)?;
        Ok(SegmentHandle(run.segments.insert(Arc::new(seg))))
    }

    /// Forgets an opened segment (`-1` for an unknown handle).
    pub fn close_segment(&self, handle: SegmentHandle) -> Result<(), EngineError> {
        let run = self.running()?;
        if handle == SegmentHandle::LOCAL || run.segments.close(handle.0) {
            Ok(())
        } else {
            Err(EngineError::new(
                TeError::InvalidArgument,
                format!("no segment {}", handle.0),
            ))
        }
    }

    /// The address of the first buffer registered in segment `name`, from a freshly fetched
    /// descriptor (the cached one may predate the peer's registration).
    pub fn get_first_buffer_address(&self, name: &str) -> Result<u64, EngineError> {
        let run = self.running()?;
        let first = if name == run.name {
            lock(&run.buffers).first().map(|b| b.addr)
        } else {
            let seg = Arc::new(run.fetch_segment(name)?);
            let first = seg.desc.buffers.first().map(|b| b.addr);
            run.segments.insert(seg);
            first
        };
        first.ok_or_else(|| {
            EngineError::new(
                TeError::AddressNotRegistered,
                format!("segment {name:?} has no registered buffer"),
            )
        })
    }

    /// A new batch that can hold `capacity` requests; the id is never 0.
    pub fn allocate_batch(&self, capacity: usize) -> Result<u64, EngineError> {
        self.running()?.batches.allocate(capacity)
    }

    /// Queues `requests` in `batch`; they run on the worker pool. Errors for the whole
    /// submission: unknown batch or handle (`-1`), capacity exceeded (`-2`). A request whose
    /// local range is not registered fails on its own with `-3`.
    pub fn submit(&self, batch: u64, requests: Vec<TransferRequest>) -> Result<(), EngineError> {
        let run = self.running()?;
        let b = run.batches.get(batch)?;
        for r in &requests {
            if r.target != SegmentHandle::LOCAL && run.segments.get(r.target.0).is_none() {
                return Err(EngineError::new(
                    TeError::InvalidArgument,
                    format!("segment handle {} was never opened", r.target.0),
                ));
            }
        }
        let now = Instant::now();
        let first = b.append(
            requests
                .iter()
                .map(|r| (r.length, now + run.options.timeout_for(r.length))),
        )?;
        b.job_started();
        let run2 = Arc::clone(run);
        run.workers.spawn(Box::new(move || {
            run2.run_batch_job(&b, first, &requests);
            b.job_finished();
        }));
        Ok(())
    }

    /// Status of request `index` of `batch`.
    pub fn status(&self, batch: u64, index: usize) -> Result<TransferStatus, EngineError> {
        Ok(self.report(batch, index)?.status)
    }

    /// Status, bytes moved and error code of request `index` of `batch`.
    pub fn report(&self, batch: u64, index: usize) -> Result<TaskReport, EngineError> {
        self.running()?.batches.get(batch)?.report(index)
    }

    /// Status of the whole batch: Failed if any request failed, else Timeout if any timed
    /// out, else Completed if all completed, else Pending or Waiting.
    pub fn batch_status(&self, batch: u64) -> Result<TransferStatus, EngineError> {
        Ok(self.batch_report(batch)?.status)
    }

    /// [`TransferEngine::batch_status`] with bytes moved and the first error code.
    pub fn batch_report(&self, batch: u64) -> Result<TaskReport, EngineError> {
        Ok(self.running()?.batches.get(batch)?.overall())
    }

    /// Polls `batch` until it is no longer Waiting or Pending; returns its final report.
    pub fn wait_batch(&self, batch: u64) -> Result<TaskReport, EngineError> {
        let b = self.running()?.batches.get(batch)?;
        let mut pause = Duration::from_micros(5);
        loop {
            let r = b.overall();
            if !matches!(r.status, TransferStatus::Waiting | TransferStatus::Pending) {
                return Ok(r);
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }

    /// Frees `batch`; `-4` (ERR_BATCH_BUSY) while a submission is still running.
    pub fn free_batch(&self, batch: u64) -> Result<(), EngineError> {
        self.running()?.batches.free(batch)
    }

    /// One request, run on the calling thread: `len` bytes between local `local` and the
    /// absolute address `remote` of segment `target`.
    pub fn transfer_sync(
        &self,
        target: &str,
        local: u64,
        remote: u64,
        len: u64,
        opcode: Opcode,
    ) -> Result<(), EngineError> {
        self.transfer_sync_batch(target, &[(local, remote, len)], opcode)
    }

    /// Several requests to one target, run on the calling thread (they proceed in parallel
    /// over the peer's lanes). Fails with the first failed request's code.
    pub fn transfer_sync_batch(
        &self,
        target: &str,
        items: &[(u64, u64, u64)],
        opcode: Opcode,
    ) -> Result<(), EngineError> {
        let run = self.running()?;
        let handle = self.open_segment(target)?;
        let reqs: Vec<TransferRequest> = items
            .iter()
            .map(|&(source, target_offset, length)| TransferRequest {
                opcode,
                source,
                target: handle,
                target_offset,
                length,
            })
            .collect();
        let outcomes = run.execute(handle, &reqs);
        for (o, r) in outcomes.iter().zip(&reqs) {
            if let Err(code) = o {
                return Err(error::from_code(
                    *code,
                    &format!(
                        "{opcode:?} of {} bytes at {:#x} of segment {target:?}",
                        r.length, r.target_offset
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Delivers `(name, msg)` to the inbox of segment `target` (upstream's Notify).
    pub fn send_notify(&self, target: &str, name: &str, msg: &str) -> Result<(), EngineError> {
        let run = self.running()?;
        let endpoint = run.directory.rpc_endpoint(&run.keys, target)?;
        let body = serde_json::to_vec(&NotifyMsg {
            name: name.to_string(),
            notify_msg: msg.to_string(),
        })
        .unwrap_or_default();
        handshake::call(&endpoint, FrameType::Notify, &body)
            .map(|_| ())
            .map_err(|e| run.peer_error(target, e))
    }

    /// Drains the notifies received so far, oldest first, as `(name, msg)`.
    pub fn get_notifies(&self) -> Vec<(String, String)> {
        self.running
            .get()
            .map(|r| {
                r.hs_state
                    .drain_notifies()
                    .into_iter()
                    .map(|n| (n.name, n.notify_msg))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Checks that `peer` answers on its handshake port. An unknown peer is `-200`.
    pub fn send_probe(&self, peer: &str) -> Result<(), EngineError> {
        let run = self.running()?;
        let endpoint = run.directory.rpc_endpoint(&run.keys, peer)?;
        let reply = handshake::call(&endpoint, FrameType::Probe, b"{}")
            .map_err(|e| run.peer_error(peer, e))?;
        let ok = serde_json::from_slice::<serde_json::Value>(&reply)
            .ok()
            .and_then(|v| {
                v.get("status")
                    .and_then(|s| s.as_str().map(|s| s == "success"))
            })
            .unwrap_or(false);
        if ok {
            Ok(())
        } else {
            Err(EngineError::new(
                TeError::RejectHandshake,
                format!(
                    "peer {peer:?} answered the probe with {}",
                    String::from_utf8_lossy(&reply)
                ),
            ))
        }
    }

    /// Removes the metadata keys and stops the servers. Also done on drop; idempotent.
    pub fn shutdown(&self) {
        if let Some(r) = self.running.get() {
            r.shutdown();
        }
    }
}

impl Drop for TransferEngine {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Binds the handshake listener: a given port, or a random one in `range`.
fn bind_rpc(ip: IpAddr, port: u16, range: (u16, u16)) -> Result<TcpListener, EngineError> {
    let fail = |what: String| EngineError::new(TeError::Socket, what);
    if port != 0 {
        return TcpListener::bind((ip, port))
            .map_err(|e| fail(format!("cannot bind the rpc port {ip}:{port}: {e}")));
    }
    let span = u64::from(range.1 - range.0) + 1;
    let mut seed = protocol::Uuid::random().lo | 1; // xorshift needs a non-zero state
    for _ in 0..config::RPC_PORT_ATTEMPTS {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let p = range.0 + (seed % span) as u16;
        if let Ok(l) = TcpListener::bind((ip, p)) {
            return Ok(l);
        }
    }
    Err(fail(format!(
        "no free rpc port in {}..={} after {} attempts",
        range.0,
        range.1,
        config::RPC_PORT_ATTEMPTS
    )))
}

impl Running {
    fn start(
        options: EngineOptions,
        local_server_name: &str,
        metadata_conn: &str,
        rdma_device: Option<&str>,
    ) -> Result<Running, EngineError> {
        let conn = MetadataBackend::parse(metadata_conn)?;
        let name_in = local_server_name.trim();
        let host = host_of(name_in).to_string();
        let name_port = split_host_port(name_in).map(|(_, p)| p);
        if host.is_empty() {
            return Err(EngineError::new(
                TeError::InvalidArgument,
                format!("local server name {local_server_name:?}: expected host or host:port"),
            ));
        }
        let advertise_host = options.bind_address.clone().unwrap_or_else(|| host.clone());
        let bind_ip: IpAddr = match &options.bind_address {
            Some(a) => (a.as_str(), 0)
                .to_socket_addrs()
                .ok()
                .and_then(|mut i| i.next())
                .map(|s| s.ip())
                .ok_or_else(|| {
                    EngineError::new(
                        TeError::Dns,
                        format!("MC_TCP_BIND_ADDRESS {a:?} does not resolve"),
                    )
                })?,
            None => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        };
        let wanted_rpc_port = match (options.rpc_port, options.legacy_rpc_port_binding, name_port) {
            (p, _, _) if p != 0 => p,
            (0, true, Some(p)) => p,
            _ => 0,
        };
        let listener = bind_rpc(bind_ip, wanted_rpc_port, options.rpc_port_range)?;
        let rpc_port = listener
            .local_addr()
            .map_err(|e| EngineError::new(TeError::Socket, e.to_string()))?
            .port();
        let (name, directory) = match conn.open() {
            None => (format!("{host}:{rpc_port}"), Directory::P2p),
            Some(store) => (name_in.to_string(), Directory::Store(store)),
        };
        let memory = ServedMemory::new();
        let server_config = ServerConfig {
            io_timeout: options.transfer_timeout,
            ..Default::default()
        };
        let data_server =
            TcpServer::bind(SocketAddr::new(bind_ip, 0), memory.clone(), server_config).map_err(
                |e| EngineError::new(TeError::Socket, format!("cannot bind the data port: {e}")),
            )?;
        let data_port = data_server.local_addr().port();
        let rdma = match rdma_device {
            Some(dev) => Some(rdma::open_transport(&options, &name, dev)?),
            None => None,
        };
        let hs_state = HandshakeState::new();
        if let Some(t) = &rdma {
            let weak = Arc::downgrade(t);
            hs_state.set_connection_handler(Some(ConnectionHandler(Arc::new(
                move |body| match weak.upgrade() {
                    Some(t) => t.handle_connect(body),
                    None => b"{\"reply_msg\":\"engine shut down\"}".to_vec(),
                },
            ))));
        }
        let workers = Workers::start().map_err(|e| {
            EngineError::new(TeError::Context, format!("cannot start workers: {e}"))
        })?;
        let keys = Keys::with_cluster(options.cluster_id.as_deref());
        let running = Running {
            options,
            name,
            advertise_host,
            rpc_port,
            data_port,
            keys,
            directory,
            memory,
            data_server: Mutex::new(Some(data_server)),
            handshake: Mutex::new(None),
            hs_state: hs_state.clone(),
            table: samehost::Table::for_engine(rdma.is_some()),
            rdma,
            buffers: Mutex::new(Vec::new()),
            guard: RwLock::new(()),
            segments: SegmentCache::default(),
            batches: BatchTable::new(),
            managed: Mutex::new(Managed::default()),
            workers,
            shut_down: AtomicBool::new(false),
        };
        running.publish(&[])?;
        let hs = HandshakeServer::start(listener, hs_state).map_err(|e| {
            EngineError::new(
                TeError::Socket,
                format!("cannot start the handshake server: {e}"),
            )
        })?;
        *lock(&running.handshake) = Some(hs);
        if let Directory::Store(store) = &running.directory {
            let meta = crate::metadata::desc::RpcMeta {
                ip_or_host_name: running.advertise_host.clone(),
                rpc_port,
            };
            if let Err(e) = store.put(&running.keys.rpc_meta(&running.name), &meta.to_json()) {
                running.shutdown();
                return Err(e.into());
            }
        }
        Ok(running)
    }

    fn client_config(&self) -> ClientConfig {
        ClientConfig {
            lanes: self.options.lanes,
            connect_timeout: CONNECT_TIMEOUT_DEFAULT,
            io_timeout: self.options.transfer_timeout,
            ..Default::default()
        }
    }

    /// Publishes the descriptor with `buffers`: to the handshake server always, to the
    /// metadata store when there is one.
    fn publish(&self, buffers: &[BufferDesc]) -> Result<(), EngineError> {
        let json = match &self.rdma {
            Some(t) => t
                .segment_desc(&self.name, self.data_port, timestamp_now())
                .to_json(),
            None => SegmentDesc {
                mooncake_rs_same_host: self.table.as_ref().map(samehost::Table::desc),
                ..SegmentDesc::tcp(&self.name, self.data_port, buffers.to_vec())
            }
            .to_json(),
        };
        self.hs_state.set_descriptor(json.clone());
        if let Directory::Store(store) = &self.directory {
            store.put(&self.keys.ram(&self.name), &json)?;
        }
        Ok(())
    }

    /// `[addr, addr + len)` lies inside one buffer registered with this engine (`-3` if not,
    /// `-1` if it wraps). Callers hold the transfer guard while they use the range.
    fn check_local(&self, addr: u64, len: usize) -> Result<(), EngineError> {
        let len64 = len as u64;
        if addr.checked_add(len64).is_none() {
            return Err(EngineError::new(
                TeError::InvalidArgument,
                format!("{len} bytes at {addr:#x} wrap the address space"),
            ));
        }
        if len > 0 && !self.memory.check(addr, len64) {
            return Err(EngineError::new(
                TeError::AddressNotRegistered,
                format!(
                    "{len} bytes at {addr:#x} are not inside memory registered with this engine"
                ),
            ));
        }
        Ok(())
    }

    fn unregister(&self, addr: u64) -> Result<(), EngineError> {
        let _guard = self.guard.write().unwrap_or_else(|e| e.into_inner());
        let mut bufs = lock(&self.buffers);
        self.memory.unregister(addr).map_err(|e| {
            EngineError::new(e, format!("no registered buffer starts at {addr:#x}"))
        })?;
        bufs.retain(|b| b.addr != addr);
        if let Some(t) = &self.table {
            // Same-host readers: no copy checked against the old table is left running.
            t.publish(&bufs);
            t.wait_readers(self.options.transfer_timeout);
        }
        if let Some(t) = &self.rdma {
            t.unregister(addr);
        }
        self.publish(&bufs)
    }

    /// A fresh segment of `len` bytes, registered and published.
    fn new_segment(&self, len: usize) -> Result<Arc<Segment>, EngineError> {
        let seg = Segment::new(len, SegmentOptions::default())
            .map(Arc::new)
            .map_err(|e| {
                EngineError::new(TeError::Memory, format!("cannot map {len} bytes: {e}"))
            })?;
        let mut bufs = lock(&self.buffers);
        self.memory.register_segment(seg.clone())?;
        if let Some(t) = &self.rdma {
            // SAFETY: the segment is mapped while `seg` lives; it is unregistered (and so
            // deregistered here) before the managed allocator drops it.
            if let Err(e) = unsafe { t.register(seg.addr() as u64, seg.len() as u64, "*") } {
                let _ = self.memory.unregister(seg.addr() as u64);
                return Err(EngineError::new(TeError::Memory, e));
            }
        }
        bufs.push(BufferDesc {
            addr: seg.addr() as u64,
            length: seg.len() as u64,
            name: self.name.clone(),
        });
        if let Err(e) = self.publish(&bufs) {
            bufs.pop();
            let _ = self.memory.unregister(seg.addr() as u64);
            if let Some(t) = &self.rdma {
                t.unregister(seg.addr() as u64);
            }
            return Err(e);
        }
        if let Some(t) = &self.table {
            t.publish(&bufs);
        }
        Ok(seg)
    }

    fn fetch_segment(&self, name: &str) -> Result<RemoteSegment, EngineError> {
        let mine = self.hs_state.descriptor();
        let (desc, host, raw) = self.directory.fetch(&self.keys, name, &mine)?;
        let rdma = if desc.protocol.as_str() == Some("rdma") {
            Some(RdmaSegmentDesc::from_json(&raw).map_err(|e| {
                EngineError::new(
                    TeError::Metadata,
                    format!("segment {name:?}: bad RDMA descriptor: {e}"),
                )
            })?)
        } else {
            None
        };
        let same_host = match &desc.mooncake_rs_same_host {
            Some(d) if rdma.is_none() && self.rdma.is_none() && self.options.same_host => {
                samehost::Peer::attach(d)
                    .inspect_err(|why| tracing::info!("segment {name:?} over TCP: {why}"))
                    .ok()
            }
            _ => None,
        };
        let mut seg = RemoteSegment::new(name, desc, &host, rdma)?;
        seg.same_host = same_host;
        Ok(seg)
    }

    /// The cached peer of `handle`, fetched again if it was invalidated.
    fn remote(&self, handle: SegmentHandle) -> Result<Arc<RemoteSegment>, EngineError> {
        let (name, cached) = self.segments.get(handle.0).ok_or_else(|| {
            EngineError::new(TeError::InvalidArgument, format!("no segment {}", handle.0))
        })?;
        if let Some(seg) = cached {
            return Ok(seg);
        }
        let seg = Arc::new(self.fetch_segment(&name)?);
        self.segments.insert(seg.clone());
        Ok(seg)
    }

    /// Runs one submission of a batch: requests grouped by target, each group in order.
    fn run_batch_job(&self, b: &batch::Batch, first: usize, reqs: &[TransferRequest]) {
        let mut groups: Vec<(SegmentHandle, Vec<usize>)> = Vec::new();
        for (i, r) in reqs.iter().enumerate() {
            match groups.iter_mut().find(|(h, _)| *h == r.target) {
                Some((_, v)) => v.push(i),
                None => groups.push((r.target, vec![i])),
            }
        }
        for (handle, idx) in groups {
            let group: Vec<TransferRequest> = idx.iter().map(|&i| reqs[i]).collect();
            for &i in &idx {
                b.set_pending(first + i);
            }
            let outcomes = self.execute(handle, &group);
            for (&i, o) in idx.iter().zip(outcomes) {
                b.finish(first + i, o);
            }
        }
    }

    /// A failed handshake call to a peer: unknown (cannot connect) in P2P mode is a
    /// metadata error, as the peer is its own metadata store.
    fn peer_error(&self, peer: &str, e: crate::metadata::MetadataError) -> EngineError {
        match (&self.directory, &e) {
            (Directory::P2p, crate::metadata::MetadataError::Io { .. }) => {
                EngineError::new(TeError::Metadata, format!("peer {peer:?} unreachable: {e}"))
            }
            _ => EngineError::new(e.code(), format!("peer {peer:?}: {e}")),
        }
    }

    fn shutdown(&self) {
        if self.shut_down.swap(true, Ordering::SeqCst) {
            return;
        }
        if let Directory::Store(store) = &self.directory {
            let _ = store.remove(&self.keys.ram(&self.name));
            let _ = store.remove(&self.keys.rpc_meta(&self.name));
        }
        if let Some(t) = &self.table {
            t.close(self.options.transfer_timeout);
        }
        drop(lock(&self.handshake).take());
        self.hs_state.set_connection_handler(None);
        drop(lock(&self.data_server).take());
    }
}
