//! `mooncake.engine`: the Python face of [`dataplane::engine::TransferEngine`].
//!
//! Names, positional-only parameters, keyword names and return conventions follow upstream's
//! `transfer_engine_py.cpp` (upstream behaviour as written in `docs/` and `python/README.md`):
//!
//! - most calls return `0` or a negative code (`-1` where upstream collapses failures; the
//!   transfer-engine code where upstream passes it through: `register_memory` `-7` on overlap,
//!   `unregister_memory` `-3` for an unknown address);
//! - asynchronous submissions return a batch id, or `0` when the submission failed (never
//!   `-1`); `transfer_check_status` answers `1` done (batch freed), `0` running, `-1` failed
//!   (batch freed), `-2` timed out; `get_batch_transfer_status` waits and answers `0` / `-1`;
//! - `allocate_managed_buffer` and `get_first_buffer_address` answer an address or `0`;
//! - arguments of the wrong type raise `TypeError` (pyo3's argument extraction).
//!
//! Differences from upstream, all on the side of not crashing: `write_bytes_to_buffer`,
//! `read_bytes_from_buffer` and every transfer check that the local address range lies inside
//! memory registered with (or allocated by) this engine, and refuse it otherwise (`-1`, and
//! `read_bytes_from_buffer` returns `-1` instead of `bytes`); `register_memory` refuses a
//! range that is not mapped readable and writable in this process (`-1`);
//! `get_batch_transfer_status` also frees failed batches (upstream leaks them).
//!
//! `transport_hint` is accepted and ignored (upstream honours it only in TENT builds). Every
//! call that may wait on the network or move bytes releases the GIL. Failures are logged at
//! `error` level with the engine's explanation, since the return value carries only a number.

use std::sync::Arc;

use dataplane::engine::{
    EngineError, SegmentHandle, TransferEngine, TransferRequest, TransferStatus,
};
use dataplane::mem::Src;
use dataplane::transport::header::Opcode;
use dataplane::TeError;
use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString};

use crate::pybuf::{self, Pinned};

/// `TransferOpcode`: `Read = 0`, `Write = 1` (also `mooncake.engine.Read` / `.Write` and
/// `TransferEngine.TransferOpcode`).
#[pyclass(
    eq,
    eq_int,
    hash,
    frozen,
    from_py_object,
    module = "mooncake.engine",
    name = "TransferOpcode"
)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PyTransferOpcode {
    Read = 0,
    Write = 1,
}

impl PyTransferOpcode {
    fn wire(self) -> Opcode {
        match self {
            PyTransferOpcode::Read => Opcode::Read,
            PyTransferOpcode::Write => Opcode::Write,
        }
    }
}

#[pymethods]
impl PyTransferOpcode {
    #[getter]
    fn name(&self) -> &'static str {
        match self {
            PyTransferOpcode::Read => "Read",
            PyTransferOpcode::Write => "Write",
        }
    }
    #[getter]
    fn value(&self) -> i64 {
        *self as i64
    }
    fn __index__(&self) -> i64 {
        *self as i64
    }
}

/// `TransferNotify()` / `TransferNotify(name, msg)`: a message delivered to the peer's inbox
/// after a transfer (`get_notifies` there).
#[pyclass(
    get_all,
    set_all,
    from_py_object,
    module = "mooncake.engine",
    name = "TransferNotify"
)]
#[derive(Clone, Debug, Default)]
pub struct PyTransferNotify {
    name: String,
    msg: String,
}

#[pymethods]
impl PyTransferNotify {
    #[new]
    #[pyo3(signature = (name=String::new(), msg=String::new()))]
    fn new(name: String, msg: String) -> Self {
        PyTransferNotify { name, msg }
    }

    fn __repr__(&self) -> String {
        format!("TransferNotify(name={:?}, msg={:?})", self.name, self.msg)
    }
}

/// `InnerTransferEngine`: the shared engine behind a `TransferEngine` (`get_engine()`), which
/// `MooncakeDistributedStore.setup(..., engine=...)` accepts.
#[pyclass(frozen, module = "mooncake.engine", name = "InnerTransferEngine")]
pub struct PyInnerEngine {
    pub(crate) engine: Arc<TransferEngine>,
}

#[pymethods]
impl PyInnerEngine {
    fn __repr__(&self) -> String {
        match self.engine.local_segment_name() {
            Some(n) => format!("<InnerTransferEngine segment={n:?}>"),
            None => "<InnerTransferEngine (not initialized)>".to_string(),
        }
    }
}

/// The code a failed call returns, after logging why.
fn fail(what: &str, e: &EngineError) -> i32 {
    tracing::error!("TransferEngine.{what}: {e}");
    e.code().code()
}

/// `0` or `-1` (upstream's collapsed convention), logging the reason of a failure.
fn rc01(what: &str, r: Result<(), EngineError>) -> i32 {
    match r {
        Ok(()) => 0,
        Err(e) => {
            fail(what, &e);
            -1
        }
    }
}

/// `0` or the transfer-engine code, logging the reason of a failure.
fn rc_code(what: &str, r: Result<(), EngineError>) -> i32 {
    match r {
        Ok(()) => 0,
        Err(e) => fail(what, &e),
    }
}

fn env_true(name: &str) -> bool {
    protocol::env::flag(name, false)
}

/// True when `[addr, addr + len)` is mapped readable and writable in this process, by
/// `/proc/self/maps` (`client::store::mapped`; an empty range counts only at a mapped
/// address). Also guards `MooncakeDistributedStore.register_buffer`.
pub(crate) fn mapped_rw(addr: u64, len: u64) -> bool {
    client::store::mapped::is_mapped(addr, len.max(1), true)
}

/// `TransferEngine()`; see the module docs.
#[pyclass(subclass, module = "mooncake.engine", name = "TransferEngine")]
pub struct PyTransferEngine {
    engine: Arc<TransferEngine>,
    /// Finished batches whose free found a job still winding down; freed on a later call.
    deferred_free: Mutex<Vec<u64>>,
}

impl PyTransferEngine {
    /// Frees `batch`, or remembers it when its job has not quite finished yet.
    fn free_batch(&self, batch: u64) {
        if let Err(e) = self.engine.free_batch(batch) {
            if e.code() == TeError::BatchBusy {
                self.deferred_free.lock().push(batch);
            }
        }
    }

    /// Retries the deferred frees.
    fn sweep(&self) {
        let pending = std::mem::take(&mut *self.deferred_free.lock());
        for b in pending {
            self.free_batch(b);
        }
    }

    /// Opens `target`, allocates a batch and submits the requests; the batch id or 0.
    fn submit_async(
        &self,
        py: Python<'_>,
        what: &str,
        target: &str,
        items: Vec<(u64, u64, u64)>,
        opcode: Opcode,
    ) -> u64 {
        self.sweep();
        let engine = &self.engine;
        let r = py.detach(|| -> Result<u64, EngineError> {
            let handle = engine.open_segment(target)?;
            let batch = engine.allocate_batch(items.len())?;
            let reqs = requests(handle, opcode, &items);
            if let Err(e) = engine.submit(batch, reqs) {
                let _ = engine.free_batch(batch);
                return Err(e);
            }
            Ok(batch)
        });
        match r {
            Ok(b) => b,
            Err(e) => {
                fail(what, &e);
                0
            }
        }
    }

    fn sync_batch(
        &self,
        py: Python<'_>,
        what: &str,
        target: &str,
        items: Vec<(u64, u64, u64)>,
        opcode: Opcode,
        notify: Option<PyTransferNotify>,
    ) -> i32 {
        let engine = &self.engine;
        let r = py.detach(|| {
            engine.transfer_sync_batch(target, &items, opcode)?;
            if let Some(n) = &notify {
                engine.send_notify(target, &n.name, &n.msg)?;
            }
            Ok(())
        });
        rc01(what, r)
    }
}

fn requests(
    handle: SegmentHandle,
    opcode: Opcode,
    items: &[(u64, u64, u64)],
) -> Vec<TransferRequest> {
    items
        .iter()
        .map(|&(source, target_offset, length)| TransferRequest {
            opcode,
            source,
            target: handle,
            target_offset,
            length,
        })
        .collect()
}

/// Zips the three lists of a batch call; `None` when their lengths differ.
fn zip3(buffers: &[u64], peers: &[u64], lengths: &[u64]) -> Option<Vec<(u64, u64, u64)>> {
    if buffers.len() != peers.len() || buffers.len() != lengths.len() {
        return None;
    }
    Some(
        buffers
            .iter()
            .zip(peers)
            .zip(lengths)
            .map(|((&b, &p), &l)| (b, p, l))
            .collect(),
    )
}

/// Builds the metadata connection string of `initialize_ext`: `type://server` unless the
/// server already names a scheme or is `P2PHANDSHAKE`.
fn conn_string(server: &str, metadata_type: &str) -> String {
    let s = server.trim();
    if s.eq_ignore_ascii_case("P2PHANDSHAKE") || s.contains("://") || metadata_type.is_empty() {
        s.to_string()
    } else {
        format!("{metadata_type}://{s}")
    }
}

#[pymethods]
impl PyTransferEngine {
    #[new]
    fn new() -> Self {
        PyTransferEngine {
            engine: Arc::new(TransferEngine::new()),
            deferred_free: Mutex::new(Vec::new()),
        }
    }

    /// `TransferEngine.TransferOpcode`: the `Read`/`Write` enum, as upstream nests it.
    #[classattr]
    #[pyo3(name = "TransferOpcode")]
    fn transfer_opcode_type(py: Python<'_>) -> Py<pyo3::types::PyType> {
        py.get_type::<PyTransferOpcode>().unbind()
    }

    // ---- lifecycle ---------------------------------------------------------------------

    /// `initialize(local_hostname, metadata_server, protocol, device_name)`: 0 / -1.
    /// `metadata_server`: `P2PHANDSHAKE`, `http://host:port/metadata`, or etcd as
    /// `etcd://host:port[,host:port]` or a bare `host:port` (the seed's `"127.0.0.1:2379"`).
    #[pyo3(signature = (local_hostname, metadata_server, protocol, device_name, /))]
    fn initialize(
        &self,
        py: Python<'_>,
        local_hostname: &str,
        metadata_server: &str,
        protocol: &str,
        device_name: &str,
    ) -> i32 {
        self.initialize_ext(
            py,
            local_hostname,
            metadata_server,
            protocol,
            device_name,
            "",
        )
    }

    /// `initialize_ext(local_hostname, metadata_server, protocol, device_name,
    /// metadata_type)`: 0 / -1.
    #[pyo3(signature = (local_hostname, metadata_server, protocol, device_name, metadata_type, /))]
    fn initialize_ext(
        &self,
        py: Python<'_>,
        local_hostname: &str,
        metadata_server: &str,
        protocol: &str,
        device_name: &str,
        metadata_type: &str,
    ) -> i32 {
        let conn = conn_string(metadata_server, metadata_type);
        // "rdma" runs the RDMA transport; without a device TCP, warned, as upstream
        // (ERR_DEVICE_NOT_FOUND under MC_REQUIRE_RDMA; docs/rdma.md). MC_FORCE_TCP makes
        // every protocol TCP, as upstream's flag does.
        let protocol = if env_true("MC_FORCE_TCP") {
            "tcp"
        } else {
            protocol
        };
        let engine = &self.engine;
        let r = py.detach(|| engine.initialize(local_hostname, &conn, protocol, device_name));
        rc01("initialize", r)
    }

    /// The handshake (rpc) port; in P2PHANDSHAKE mode the segment name is `host:<this>`.
    #[pyo3(signature = (/))]
    fn get_rpc_port(&self) -> u16 {
        self.engine.rpc_port()
    }

    // ---- memory ------------------------------------------------------------------------

    /// Allocates and registers `length` bytes; the address or 0.
    #[pyo3(signature = (length, /))]
    fn allocate_managed_buffer(&self, py: Python<'_>, length: usize) -> u64 {
        let engine = &self.engine;
        match py.detach(|| engine.allocate_managed_buffer(length)) {
            Ok(a) => a,
            Err(e) => {
                fail("allocate_managed_buffer", &e);
                0
            }
        }
    }

    /// Frees a managed buffer: 0 (a negative code for an address that is not one).
    #[pyo3(signature = (buffer_addr, length, /))]
    fn free_managed_buffer(&self, py: Python<'_>, buffer_addr: u64, length: usize) -> i32 {
        let engine = &self.engine;
        let r = py.detach(|| engine.free_managed_buffer(buffer_addr, length));
        rc_code("free_managed_buffer", r)
    }

    /// Copies the first `length` bytes of `src` (bytes-like, or str as UTF-8) to
    /// `dest_address`, which must lie in memory registered with this engine: 0 / -1.
    #[pyo3(signature = (dest_address, src, length, /))]
    fn write_bytes_to_buffer(
        &self,
        py: Python<'_>,
        dest_address: u64,
        src: &Bound<'_, PyAny>,
        length: usize,
    ) -> PyResult<i32> {
        let pinned;
        let utf8;
        let data: Src<'_> = if let Ok(s) = src.cast::<PyString>() {
            utf8 = s.to_str()?.to_owned();
            Src::from(utf8.as_bytes())
        } else {
            pinned = Pinned::bytes(src)?;
            pinned.src()
        };
        let Some(data) = (length <= data.len()).then(|| data.split_at(length).0) else {
            tracing::error!(
                "TransferEngine.write_bytes_to_buffer: length {length} exceeds the {} bytes given",
                data.len()
            );
            return Ok(-1);
        };
        let engine = &self.engine;
        Ok(rc01(
            "write_bytes_to_buffer",
            py.detach(|| engine.write_local(dest_address, data)),
        ))
    }

    /// `length` bytes at `source_address` (registered with this engine) as `bytes`; `-1`
    /// when the range is not registered.
    #[pyo3(signature = (source_address, length, /))]
    fn read_bytes_from_buffer<'py>(
        &self,
        py: Python<'py>,
        source_address: u64,
        length: usize,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (obj, fresh) = pybuf::new_bytes(py, length)?;
        let engine = &self.engine;
        // SAFETY: `obj` (alive until after the read) is the only reference to the new bytes
        // object, and no Rust reference touches its bytes.
        let dst = unsafe { fresh.into_dst() };
        match py.detach(|| engine.read_local(source_address, dst)) {
            Ok(()) => Ok(obj.into_any()),
            Err(e) => {
                fail("read_bytes_from_buffer", &e);
                drop::<Bound<'_, PyBytes>>(obj);
                Ok((-1i32).into_pyobject(py)?.into_any())
            }
        }
    }

    /// Registers `[buffer_addr, buffer_addr + capacity)` for transfers: 0, `-7` when it
    /// overlaps a registered buffer, `-1` otherwise.
    #[pyo3(signature = (buffer_addr, capacity, location="*"))]
    fn register_memory(
        &self,
        py: Python<'_>,
        buffer_addr: u64,
        capacity: u64,
        location: &str,
    ) -> i32 {
        if !mapped_rw(buffer_addr, capacity) {
            tracing::error!(
                "TransferEngine.register_memory: {capacity} bytes at {buffer_addr:#x} are not \
                 mapped readable and writable in this process"
            );
            return -1;
        }
        let engine = &self.engine;
        // SAFETY: upstream's contract of register_memory, which this method documents: the
        // caller keeps the (just checked to be mapped) range alive and accepts that peers and
        // this engine read and write it until unregister_memory(buffer_addr) returns.
        let r = py.detach(|| unsafe { engine.register_memory(buffer_addr, capacity, location) });
        match r {
            Ok(()) => 0,
            Err(e) if e.code() == TeError::AddressOverlapped => fail("register_memory", &e),
            Err(e) => {
                fail("register_memory", &e);
                -1
            }
        }
    }

    /// Unregisters the buffer starting at `buffer_addr`: 0, `-3` when none does.
    #[pyo3(signature = (buffer_addr, /))]
    fn unregister_memory(&self, py: Python<'_>, buffer_addr: u64) -> i32 {
        let engine = &self.engine;
        rc_code(
            "unregister_memory",
            py.detach(|| engine.unregister_memory(buffer_addr)),
        )
    }

    /// Registers each buffer; 0, or the first failure's code (`-1` for mismatched lists).
    #[pyo3(signature = (buffer_addresses, capacities, location="*"))]
    fn batch_register_memory(
        &self,
        py: Python<'_>,
        buffer_addresses: Vec<u64>,
        capacities: Vec<u64>,
        location: &str,
    ) -> i32 {
        if buffer_addresses.len() != capacities.len() {
            tracing::error!("TransferEngine.batch_register_memory: lists of different lengths");
            return -1;
        }
        for (&a, &c) in buffer_addresses.iter().zip(&capacities) {
            let rc = self.register_memory(py, a, c, location);
            if rc != 0 {
                return rc;
            }
        }
        0
    }

    /// Unregisters each buffer; 0, or the first failure's code.
    #[pyo3(signature = (buffer_addresses, /))]
    fn batch_unregister_memory(&self, py: Python<'_>, buffer_addresses: Vec<u64>) -> i32 {
        let mut first = 0;
        for a in buffer_addresses {
            let rc = self.unregister_memory(py, a);
            if first == 0 {
                first = rc;
            }
        }
        first
    }

    // ---- synchronous transfers ---------------------------------------------------------

    /// Writes `length` bytes at local `buffer` to `peer_buffer_address` on `target_hostname`
    /// and waits. 0, or -1 on failure (logged). `transport_hint` is accepted and ignored.
    #[pyo3(signature = (target_hostname, buffer, peer_buffer_address, length, transport_hint=""))]
    fn transfer_sync_write(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffer: u64,
        peer_buffer_address: u64,
        length: u64,
        transport_hint: &str,
    ) -> i32 {
        let _ = transport_hint;
        let items = vec![(buffer, peer_buffer_address, length)];
        self.sync_batch(
            py,
            "transfer_sync_write",
            target_hostname,
            items,
            Opcode::Write,
            None,
        )
    }

    /// Reads `length` bytes at `peer_buffer_address` on `target_hostname` into local
    /// `buffer` and waits. 0, or -1 on failure (logged). `transport_hint` is ignored.
    #[pyo3(signature = (target_hostname, buffer, peer_buffer_address, length, transport_hint=""))]
    fn transfer_sync_read(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffer: u64,
        peer_buffer_address: u64,
        length: u64,
        transport_hint: &str,
    ) -> i32 {
        let _ = transport_hint;
        let items = vec![(buffer, peer_buffer_address, length)];
        self.sync_batch(
            py,
            "transfer_sync_read",
            target_hostname,
            items,
            Opcode::Read,
            None,
        )
    }

    /// One transfer with `opcode`; with `notify`, the peer then receives it (`get_notifies`).
    #[pyo3(signature = (target_hostname, buffer, peer_buffer_address, length, opcode, notify=None, transport_hint=""))]
    #[allow(clippy::too_many_arguments)]
    fn transfer_sync(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffer: u64,
        peer_buffer_address: u64,
        length: u64,
        opcode: PyTransferOpcode,
        notify: Option<PyTransferNotify>,
        transport_hint: &str,
    ) -> i32 {
        let _ = transport_hint;
        let items = vec![(buffer, peer_buffer_address, length)];
        self.sync_batch(
            py,
            "transfer_sync",
            target_hostname,
            items,
            opcode.wire(),
            notify,
        )
    }

    /// `transfer_sync_write` for several ranges to one peer, as one batch. 0, or -1 if any
    /// failed.
    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint=""))]
    fn batch_transfer_sync_write(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffers: Vec<u64>,
        peer_buffer_addresses: Vec<u64>,
        lengths: Vec<u64>,
        transport_hint: &str,
    ) -> i32 {
        self.batch_transfer_sync(
            py,
            target_hostname,
            buffers,
            peer_buffer_addresses,
            lengths,
            PyTransferOpcode::Write,
            None,
            transport_hint,
        )
    }

    /// `transfer_sync_read` for several ranges from one peer, as one batch. 0, or -1 if any
    /// failed.
    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint=""))]
    fn batch_transfer_sync_read(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffers: Vec<u64>,
        peer_buffer_addresses: Vec<u64>,
        lengths: Vec<u64>,
        transport_hint: &str,
    ) -> i32 {
        self.batch_transfer_sync(
            py,
            target_hostname,
            buffers,
            peer_buffer_addresses,
            lengths,
            PyTransferOpcode::Read,
            None,
            transport_hint,
        )
    }

    /// All transfers of the lists to one target, waited for: 0 / -1 (`-1` for mismatched
    /// lists); with `notify`, the peer then receives it.
    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, opcode, notify=None, transport_hint=""))]
    #[allow(clippy::too_many_arguments)]
    fn batch_transfer_sync(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffers: Vec<u64>,
        peer_buffer_addresses: Vec<u64>,
        lengths: Vec<u64>,
        opcode: PyTransferOpcode,
        notify: Option<PyTransferNotify>,
        transport_hint: &str,
    ) -> i32 {
        let _ = transport_hint;
        let Some(items) = zip3(&buffers, &peer_buffer_addresses, &lengths) else {
            tracing::error!("TransferEngine.batch_transfer_sync: lists of different lengths");
            return -1;
        };
        self.sync_batch(
            py,
            "batch_transfer_sync",
            target_hostname,
            items,
            opcode.wire(),
            notify,
        )
    }

    // ---- asynchronous transfers --------------------------------------------------------

    /// Submits the writes of `batch_transfer_sync_write` and returns at once: the batch id
    /// for `get_batch_transfer_status`, or 0 when the submission failed.
    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint=""))]
    fn batch_transfer_async_write(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffers: Vec<u64>,
        peer_buffer_addresses: Vec<u64>,
        lengths: Vec<u64>,
        transport_hint: &str,
    ) -> u64 {
        self.batch_transfer_async(
            py,
            target_hostname,
            buffers,
            peer_buffer_addresses,
            lengths,
            PyTransferOpcode::Write,
            transport_hint,
        )
    }

    /// Submits the reads of `batch_transfer_sync_read` and returns at once: the batch id
    /// for `get_batch_transfer_status`, or 0 when the submission failed.
    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint=""))]
    fn batch_transfer_async_read(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffers: Vec<u64>,
        peer_buffer_addresses: Vec<u64>,
        lengths: Vec<u64>,
        transport_hint: &str,
    ) -> u64 {
        self.batch_transfer_async(
            py,
            target_hostname,
            buffers,
            peer_buffer_addresses,
            lengths,
            PyTransferOpcode::Read,
            transport_hint,
        )
    }

    /// Submits the transfers and returns at once: the batch id, or 0 when the submission
    /// failed (unknown peer, mismatched or empty lists).
    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, opcode, transport_hint=""))]
    #[allow(clippy::too_many_arguments)]
    fn batch_transfer_async(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffers: Vec<u64>,
        peer_buffer_addresses: Vec<u64>,
        lengths: Vec<u64>,
        opcode: PyTransferOpcode,
        transport_hint: &str,
    ) -> u64 {
        let _ = transport_hint;
        let Some(items) = zip3(&buffers, &peer_buffer_addresses, &lengths) else {
            tracing::error!("TransferEngine.batch_transfer_async: lists of different lengths");
            return 0;
        };
        self.submit_async(
            py,
            "batch_transfer_async",
            target_hostname,
            items,
            opcode.wire(),
        )
    }

    /// One asynchronous write: the batch id or 0; poll it with `transfer_check_status`.
    #[pyo3(signature = (target_hostname, buffer, peer_buffer_address, length, transport_hint=""))]
    fn transfer_submit_write(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffer: u64,
        peer_buffer_address: u64,
        length: u64,
        transport_hint: &str,
    ) -> u64 {
        let _ = transport_hint;
        let items = vec![(buffer, peer_buffer_address, length)];
        self.submit_async(
            py,
            "transfer_submit_write",
            target_hostname,
            items,
            Opcode::Write,
        )
    }

    /// `1` completed (batch freed), `0` still running, `-1` failed or unknown (batch freed),
    /// `-2` past its deadline (`MC_TRANSFER_TIMEOUT` + 1 s per GiB) and still running.
    #[pyo3(signature = (batch_id, /))]
    fn transfer_check_status(&self, batch_id: u64) -> i32 {
        self.sweep();
        let report = match self.engine.batch_report(batch_id) {
            Ok(r) => r,
            Err(e) => {
                fail("transfer_check_status", &e);
                return -1;
            }
        };
        match report.status {
            TransferStatus::Completed => {
                self.free_batch(batch_id);
                1
            }
            TransferStatus::Failed => {
                tracing::error!(
                    "TransferEngine.transfer_check_status: batch {batch_id} failed with {}",
                    report.error_code.unwrap_or(-1)
                );
                self.free_batch(batch_id);
                -1
            }
            TransferStatus::Timeout => -2,
            TransferStatus::Waiting | TransferStatus::Pending => 0,
        }
    }

    /// Waits for every batch: 0 when all completed, -1 when any failed, timed out or is
    /// unknown. The batches are freed.
    #[pyo3(signature = (batch_ids, /))]
    fn get_batch_transfer_status(&self, py: Python<'_>, batch_ids: Vec<u64>) -> i32 {
        self.sweep();
        let engine = &self.engine;
        let reports: Vec<Result<_, EngineError>> =
            py.detach(|| batch_ids.iter().map(|&b| engine.wait_batch(b)).collect());
        let mut rc = 0;
        for (&b, r) in batch_ids.iter().zip(reports) {
            match r {
                Ok(r) if r.status == TransferStatus::Completed => self.free_batch(b),
                Ok(r) => {
                    tracing::error!(
                        "TransferEngine.get_batch_transfer_status: batch {b} ended {:?} ({})",
                        r.status,
                        r.error_code.unwrap_or(-1)
                    );
                    rc = -1;
                    self.free_batch(b);
                }
                Err(e) => {
                    fail("get_batch_transfer_status", &e);
                    rc = -1;
                }
            }
        }
        rc
    }

    // ---- peers -------------------------------------------------------------------------

    /// The address of the first buffer of segment `segment_name` (this engine's own name
    /// included), or 0.
    #[pyo3(signature = (segment_name, /))]
    fn get_first_buffer_address(&self, py: Python<'_>, segment_name: &str) -> u64 {
        let engine = &self.engine;
        match py.detach(|| engine.get_first_buffer_address(segment_name)) {
            Ok(a) => a,
            Err(e) => {
                fail("get_first_buffer_address", &e);
                0
            }
        }
    }

    /// The notifies received so far, oldest first, as `TransferNotify` objects.
    #[pyo3(signature = (/))]
    fn get_notifies<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let items = self
            .engine
            .get_notifies()
            .into_iter()
            .map(|(name, msg)| Py::new(py, PyTransferNotify { name, msg }))
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, items)
    }

    /// 0 when `peer_server_name` answers a probe; a negative code otherwise (`-200` for an
    /// unknown peer).
    #[pyo3(signature = (peer_server_name))]
    fn send_probe(&self, py: Python<'_>, peer_server_name: &str) -> i32 {
        let engine = &self.engine;
        rc_code(
            "send_probe",
            py.detach(|| engine.send_probe(peer_server_name)),
        )
    }

    /// 0: this build has no EFA transport.
    #[pyo3(signature = (segment_name))]
    fn warmup_efa_segment(&self, segment_name: &str) -> i32 {
        let _ = segment_name;
        0
    }

    /// The local topology as JSON: one entry per NUMA node, `"cpu:<n>": [[preferred NICs],
    /// [other NICs]]`; both lists are empty, as this build has no RDMA NICs.
    #[pyo3(signature = (device_name=None))]
    fn get_local_topology(&self, device_name: Option<&str>) -> String {
        let _ = device_name;
        let mut nodes: Vec<u32> = std::fs::read_dir("/sys/devices/system/node")
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter_map(|e| {
                        e.file_name()
                            .to_str()
                            .and_then(|n| n.strip_prefix("node"))
                            .and_then(|n| n.parse().ok())
                    })
                    .collect()
            })
            .unwrap_or_default();
        if nodes.is_empty() {
            nodes.push(0);
        }
        nodes.sort_unstable();
        let body: Vec<String> = nodes
            .iter()
            .map(|n| format!("\"cpu:{n}\":[[],[]]"))
            .collect();
        format!("{{{}}}", body.join(","))
    }

    /// The shared engine (`InnerTransferEngine`).
    #[pyo3(signature = (/))]
    fn get_engine(&self) -> PyInnerEngine {
        PyInnerEngine {
            engine: Arc::clone(&self.engine),
        }
    }

    /// The engine's address, as an int (an opaque handle).
    #[pyo3(signature = (/))]
    fn get_engine_ptr(&self) -> usize {
        Arc::as_ptr(&self.engine) as usize
    }

    fn __repr__(&self) -> String {
        match self.engine.local_segment_name() {
            Some(n) => format!("<TransferEngine segment={n:?}>"),
            None => "<TransferEngine (not initialized)>".to_string(),
        }
    }
}

/// Adds the classes and module attributes of `mooncake.engine` to the native module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyTransferEngine>()?;
    m.add_class::<PyTransferOpcode>()?;
    m.add_class::<PyTransferNotify>()?;
    m.add_class::<PyInnerEngine>()?;
    m.add("Read", PyTransferOpcode::Read)?;
    m.add("Write", PyTransferOpcode::Write)?;
    for flag in [
        "SUPPORT_EFA",
        "SUPPORT_HIP",
        "SUPPORT_MNNVL",
        "SUPPORT_MUSA",
        "SUPPORT_INTRA_NVLINK",
        "SUPPORT_CUDA",
    ] {
        m.add(flag, false)?;
    }
    Ok(())
}
