//! `MooncakeDistributedStore`: the Python face of [`client::Store`].
//!
//! Every method follows upstream's names, keyword names, positional-only parameters, return
//! conventions and quirks (listed in `python/README.md`). Each one releases the GIL while it
//! talks to the master or moves bytes. A store that is not set up (or was closed) answers with the
//! method's failure value (`-600`, `b""`, `None`, `[]`) instead of crashing.
//!
//! Bytes never take a detour through a staging buffer: `put` sends straight from the caller's
//! buffer, `get` receives straight into the `bytes` object it returns. The local-buffer size
//! still bounds those calls (see `client::store::budget`), as upstream's staging buffer does.
//!
//! Caller addresses (`put_from`, `get_into`, their batch and range forms, the tensor calls)
//! carry the Python caller's promise, as upstream's do: the memory stays allocated for the
//! call, nothing writes a source and nothing else touches a destination until the call
//! returns, and the destinations of one call do not overlap. Rust cannot check that; the
//! store checks what it can (`client::store::CallerRange`: registered, or mapped with the
//! needed permissions, else `-600`), and every `unsafe` that turns an address into a range
//! cites this paragraph as "the caller-memory contract". The bytes then travel as raw ranges
//! (`client::store::{Src, Dst}`), never as slices, so a caller who breaks the "nothing else
//! touches it" half of the promise gets garbled bytes, not undefined behaviour; the half Rust
//! relies on is that the memory stays mapped.

use std::sync::Arc;

use client::store::{Dst, Lookup, ObjectRead, Src, StoreError};
use client::Store;
use parking_lot::{Mutex, RwLock};
use protocol::tensor::{TensorMetadata, TENSOR_METADATA_BYTES};
use protocol::{ErrorCode, ReplicateConfig};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyList, PyTuple};

use crate::mempool::MemPool;
use crate::pybuf::{self, Fresh, Pinned};
use crate::setup_args::{self, Setup};
use crate::types::{PyReplicaDescriptor, PyReplicateConfig};

/// The number Python gets for a store result: 0, or the failure's code after [`failed`] logged
/// it.
fn rc(r: Result<(), impl Into<StoreError>>) -> i32 {
    match r {
        Ok(()) => 0,
        Err(e) => failed(e.into()),
    }
}

/// The code of `e`, after logging why it happened, so a `-800` in Python has its reason on
/// stderr: an error line, as upstream logs a failed put or remove, except for a missing key
/// (debug: a get or lookup of one is how callers test for it). A bare code from a path that
/// gives no cause yet is not logged, since the line would say no more than the number.
fn failed(e: StoreError) -> i32 {
    if !e.cause.is_empty() {
        if e.is_miss() {
            tracing::debug!("{e}");
        } else {
            tracing::error!("{e}");
        }
    }
    e.code.code()
}

/// [`rc`] for results that carry a count (bytes read).
fn rc_i64(r: Result<u64, impl Into<StoreError>>) -> i64 {
    match r {
        Ok(n) => i64::try_from(n).unwrap_or(i64::MAX),
        Err(e) => i64::from(failed(e.into())),
    }
}

const INVALID: i32 = ErrorCode::InvalidParams as i32;

/// A replicate config argument, resolved before the GIL is released.
struct Cfg {
    wire: Result<ReplicateConfig, ErrorCode>,
    group_ids: Option<usize>,
}

impl Cfg {
    fn of(config: Option<PyRef<'_, PyReplicateConfig>>) -> Cfg {
        match config {
            None => Cfg {
                wire: Ok(ReplicateConfig::default()),
                group_ids: None,
            },
            Some(c) => Cfg {
                wire: c.to_protocol(),
                group_ids: c.group_ids.as_ref().map(Vec::len),
            },
        }
    }

    /// The config for a batch of `n` keys: `group_ids`, when given, must name one group per key.
    fn for_batch(&self, n: usize) -> Result<&ReplicateConfig, ErrorCode> {
        if self.group_ids.is_some_and(|g| g != n) {
            return Err(ErrorCode::InvalidParams);
        }
        self.wire.as_ref().map_err(|e| *e)
    }

    /// The config for the items at indices `at` of the caller's batch of `n` keys (their
    /// groups, when `group_ids` names one per key).
    fn for_items(&self, n: usize, at: &[usize]) -> Result<ReplicateConfig, ErrorCode> {
        Ok(self.for_batch(n)?.for_items(n, at))
    }

    /// The config of a single put: `group_ids`, when given, must name one group.
    fn single(&self) -> Result<&ReplicateConfig, ErrorCode> {
        if self.group_ids.is_some_and(|g| g != 1) {
            return Err(ErrorCode::InvalidParams);
        }
        self.wire.as_ref().map_err(|e| *e)
    }
}

/// Reads `key` whole into a new Python object that `make` creates for its size; `None` on a
/// miss or any error (a failure's cause logged, see [`failed`]). Once more with a fresh lookup
/// when the first read ended after its window (`LEASE_EXPIRED`: the bytes may not be the
/// object's).
fn read_whole<'py, T>(
    py: Python<'py>,
    s: &Store,
    key: &str,
    make: impl Fn(Python<'py>, usize) -> PyResult<(T, Fresh)>,
) -> PyResult<Option<T>> {
    for _ in 0..2 {
        // The object's size, reserved from the local buffer until the copy is done.
        let (list, budget) = match py.detach(|| s.locate_copy(key)) {
            Ok(loc) => loc,
            Err(e) => {
                failed(e);
                return Ok(None);
            }
        };
        let (obj, fresh) = make(py, usize_of(budget.bytes())?)?;
        // SAFETY: `obj` (alive until after the read) is the only reference to the new object,
        // and no Rust reference touches its bytes meanwhile.
        let dst = unsafe { fresh.into_dst() };
        match py.detach(|| s.read_from(&list, 0, dst)) {
            Ok(()) => return Ok(Some(obj)),
            Err(e) if e.code == ErrorCode::LeaseExpired => continue,
            Err(e) => {
                failed(e.context(format_args!("get {key}")));
                return Ok(None);
            }
        }
    }
    Ok(None)
}

fn usize_of(n: u64) -> PyResult<usize> {
    usize::try_from(n).map_err(|_| pyo3::exceptions::PyOverflowError::new_err("object too large"))
}

/// `MooncakeDistributedStore()`; see the module docs.
#[pyclass(
    subclass,
    dict,
    module = "mooncake.store",
    name = "MooncakeDistributedStore"
)]
pub struct PyStore {
    inner: RwLock<Option<Arc<Store>>>,
    /// The client HTTP server (`enable_client_http_server`), while set up.
    http: Mutex<Option<client::http_endpoint::HttpEndpoint>>,
    /// Serialises `setup` / `init_all` / `close` against each other.
    lifecycle: Mutex<()>,
    pool: MemPool,
}

impl PyStore {
    fn store(&self) -> Option<Arc<Store>> {
        self.inner.read().clone()
    }

    /// Starts the client HTTP server on this client's address and `port`
    /// (`client::store::http`): 0, or -1 after closing the store again when it cannot listen
    /// (the setup asked for it, so running without it would hide the failure).
    fn serve_http(&self, py: Python<'_>, port: u16) -> i32 {
        let Some(s) = self.store() else {
            return -1;
        };
        let host = s
            .hostname()
            .rsplit_once(':')
            .map_or("", |(h, _)| h)
            .to_string();
        let served = std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), port))
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| std::io::Error::other(format!("cannot resolve {host}")))
            .and_then(|addr| client::store::http::serve(Arc::downgrade(&s), addr));
        match served {
            Ok(h) => {
                *self.http.lock() = Some(h);
                0
            }
            Err(e) => {
                tracing::error!("setup: the client HTTP server on {host}:{port}: {e}");
                // `close` waits until no one else holds the store: this call lets go first.
                drop(s);
                self.close(py);
                -1
            }
        }
    }

    fn do_setup(&self, py: Python<'_>, cfg: client::StoreConfig) -> i32 {
        let _l = self.lifecycle.lock();
        if self.inner.read().is_some() {
            return INVALID;
        }
        match py.detach(|| Store::setup(cfg)) {
            Ok(s) => {
                self.pool.reset(s.budget().capacity());
                *self.inner.write() = Some(Arc::new(s));
                0
            }
            Err(e) => e.code(),
        }
    }

    fn put_one(
        &self,
        py: Python<'_>,
        key: &str,
        parts: &[Pinned],
        config: Option<PyRef<'_, PyReplicateConfig>>,
        upsert: bool,
    ) -> i32 {
        let Some(s) = self.store() else {
            return INVALID;
        };
        let cfg = Cfg::of(config);
        let slices: Vec<Src<'_>> = parts.iter().map(Pinned::src).collect();
        rc(py.detach(|| s.put_copied(key, &slices, cfg.single()?, upsert)))
    }

    /// Batch put of objects given as lists of parts; one result per key. `keys` are the items
    /// at indices `at` of the caller's batch of `n` keys (`None`: all of them, in order), so
    /// that `cfg`'s `group_ids`, one per key of the batch, follow their keys.
    #[allow(clippy::too_many_arguments)]
    fn put_many(
        &self,
        py: Python<'_>,
        (n, at): (usize, Option<&[usize]>),
        keys: &[String],
        parts: &[Vec<Src<'_>>],
        cfg: &Cfg,
        upsert: bool,
        budgeted: bool,
    ) -> Vec<i32> {
        let Some(s) = self.store() else {
            return vec![INVALID; keys.len()];
        };
        if keys.len() != parts.len() {
            return vec![INVALID; keys.len()];
        }
        if keys.is_empty() {
            return Vec::new();
        }
        py.detach(|| {
            let run = || -> Result<Vec<Result<(), StoreError>>, ErrorCode> {
                let cfg = &match at {
                    Some(at) => cfg.for_items(n, at)?,
                    None => cfg.for_batch(n)?.clone(),
                };
                Ok(if budgeted {
                    s.put_many_copied(keys, parts, cfg, upsert)
                } else {
                    s.put_many(keys, parts, cfg, upsert)
                })
            };
            match run() {
                Ok(v) => v.into_iter().map(rc).collect(),
                Err(e) => vec![e.code(); keys.len()],
            }
        })
    }

    /// Zero-copy batch put from registered memory.
    fn put_from_many(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        buffer_ptrs: Vec<u64>,
        sizes: Vec<u64>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
        upsert: bool,
    ) -> Vec<i32> {
        let n = keys.len();
        if buffer_ptrs.len() != n || sizes.len() != n {
            return vec![INVALID; n];
        }
        let Some(s) = self.store() else {
            return vec![INVALID; n];
        };
        let cfg = Cfg::of(config);
        if let Err(e) = cfg.for_batch(n) {
            return vec![e.code(); n];
        }
        // Unregistered ranges fail their own key only; an empty one is not put (0, as upstream).
        let object = |i: usize| {
            if sizes[i] == 0 {
                return Ok(None);
            }
            let r = s.caller_range(buffer_ptrs[i], sizes[i])?;
            // SAFETY: the caller-memory contract (module doc) holds the source for this call,
            // which the objects do not outlive.
            Ok(Some(vec![unsafe { r.into_src() }]))
        };
        put_accepted(&keys, object, |at, ks, ps| {
            self.put_many(py, (n, Some(at)), ks, ps, &cfg, upsert, false)
        })
    }

    fn get_into_many(
        &self,
        py: Python<'_>,
        keys: &[String],
        buffer_ptrs: &[u64],
        sizes: &[u64],
    ) -> Vec<i64> {
        let Some(s) = self.store() else {
            return vec![INVALID as i64; keys.len()];
        };
        py.detach(|| {
            // SAFETY: the caller-memory contract (module doc) covers every destination.
            unsafe { s.get_into_many(keys, buffer_ptrs, sizes) }
                .into_iter()
                .map(rc_i64)
                .collect()
        })
    }

    fn tensor_from_many(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        buffer_ptrs: Vec<u64>,
        sizes: Vec<u64>,
        upsert: bool,
    ) -> Vec<i32> {
        let n = keys.len();
        if buffer_ptrs.len() != n || sizes.len() != n {
            return vec![INVALID; n];
        }
        let Some(s) = self.store() else {
            return vec![INVALID; n];
        };
        put_accepted(
            &keys,
            // SAFETY: the caller-memory contract (module doc) holds every source for this
            // call, which the objects do not outlive.
            |i| unsafe { tensor_object(&s, buffer_ptrs[i], sizes[i]) }.map(|sl| Some(vec![sl])),
            |at, ks, ps| self.put_many(py, (n, Some(at)), ks, ps, &Cfg::of(None), upsert, false),
        )
    }
}

/// A batch put of the keys whose objects `object` yields: a refused key gets its code, a key
/// with nothing to put (`Ok(None)`) gets 0, the rest go to `put` together, in order (with
/// their indices in `keys`), and each gets its code back. The one subset-and-scatter of the
/// per-key batch calls (the store's and the dummy client's).
pub(crate) fn put_accepted<'a>(
    keys: &[String],
    mut object: impl FnMut(usize) -> Result<Option<Vec<Src<'a>>>, ErrorCode>,
    put: impl FnOnce(&[usize], &[String], &[Vec<Src<'a>>]) -> Vec<i32>,
) -> Vec<i32> {
    let mut out = vec![0i32; keys.len()];
    let (mut idx, mut ks, mut ps) = (Vec::new(), Vec::new(), Vec::new());
    for (i, key) in keys.iter().enumerate() {
        match object(i) {
            Ok(None) => {}
            Ok(Some(parts)) => {
                idx.push(i);
                ks.push(key.clone());
                ps.push(parts);
            }
            Err(e) => out[i] = e.code(),
        }
    }
    for (i, r) in idx.iter().copied().zip(put(&idx, &ks, &ps)) {
        out[i] = r;
    }
    out
}

/// One key's object for the multi-buffer puts: the `ptrs[j]` of `lens[j]` bytes in order,
/// each through `range` (the caller's check of its memory); the two lists must agree in length.
pub(crate) fn parts_of<'a>(
    ptrs: &[u64],
    lens: &[u64],
    mut range: impl FnMut(u64, u64) -> Result<Src<'a>, ErrorCode>,
) -> Result<Option<Vec<Src<'a>>>, ErrorCode> {
    if ptrs.len() != lens.len() {
        return Err(ErrorCode::InvalidParams);
    }
    ptrs.iter()
        .zip(lens)
        .map(|(&p, &l)| range(p, l))
        .collect::<Result<_, _>>()
        .map(Some)
}

/// Whether `data` (`size` bytes of caller memory) is a valid `[TensorMetadata][data]` object:
/// its header, copied out, decodes.
pub(crate) fn is_tensor_object(data: Src<'_>, size: u64) -> bool {
    let mut head = [0u8; TENSOR_METADATA_BYTES];
    let n = data.len().min(TENSOR_METADATA_BYTES);
    data.split_at(n).0.copy_to(&mut Dst::from(&mut head[..n]));
    TensorMetadata::decode(&head[..n], size).is_ok()
}

/// Registered memory holding a valid `[TensorMetadata][data]` object.
///
/// # Safety
/// The caller-memory contract (module doc) holds `[ptr, ptr + size)` for all of `'a`.
unsafe fn tensor_object<'a>(s: &Store, ptr: u64, size: u64) -> Result<Src<'a>, ErrorCode> {
    // SAFETY: this function's contract.
    let data = unsafe { s.caller_range(ptr, size)?.into_src() };
    if !is_tensor_object(data, size) {
        return Err(ErrorCode::InvalidParams);
    }
    Ok(data)
}

fn pin_all(values: &Bound<'_, PyAny>, one_d: bool) -> PyResult<Vec<Pinned>> {
    let mut out = Vec::new();
    for v in values.try_iter()? {
        let v = v?;
        out.push(if one_d {
            Pinned::one_d_bytes(&v)?
        } else {
            Pinned::bytes(&v)?
        });
    }
    Ok(out)
}

fn list_of_values<'py>(values: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyList>> {
    if values.is_instance_of::<pyo3::types::PyString>() {
        return Err(PyTypeError::new_err(
            "values must be a list of bytes-like objects",
        ));
    }
    values
        .try_iter()?
        .collect::<PyResult<Vec<_>>>()
        .and_then(|v| PyList::new(values.py(), v))
}

#[pymethods]
impl PyStore {
    /// An unconnected store; `setup` or `init_all` connects it (arguments are ignored, as
    /// upstream).
    #[new]
    #[pyo3(signature = (*_args, **_kwargs))]
    fn new(_args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyDict>>) -> Self {
        PyStore {
            inner: RwLock::new(None),
            http: Mutex::new(None),
            lifecycle: Mutex::new(()),
            pool: MemPool::default(),
        }
    }

    // ---- lifecycle ---------------------------------------------------------------------

    /// `setup(local_hostname, metadata_server, global_segment_size, local_buffer_size,
    /// protocol, rdma_devices, master_server_addr, engine=None, ...)` or `setup(dict)`.
    #[pyo3(signature = (*args, **kwargs))]
    fn setup(
        &self,
        py: Python<'_>,
        args: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<i32> {
        match setup_args::parse(args, kwargs)? {
            Setup::Reject(e) => Ok(e.code()),
            Setup::Config(cfg, http) => {
                let rc = self.do_setup(py, cfg);
                match http {
                    Some(port) if rc == 0 => Ok(self.serve_http(py, port)),
                    _ => Ok(rc),
                }
            }
        }
    }

    /// `init_all(protocol, device_name, mount_segment_size)`: upstream's fixed-address setup.
    #[pyo3(signature = (protocol, device_name, mount_segment_size, /))]
    fn init_all(
        &self,
        py: Python<'_>,
        protocol: String,
        device_name: String,
        mount_segment_size: u64,
    ) -> i32 {
        self.do_setup(
            py,
            client::StoreConfig {
                local_hostname: "localhost:12345".into(),
                metadata_server: "127.0.0.1:2379".into(),
                global_segment_size: mount_segment_size,
                local_buffer_size: 1 << 30,
                protocol,
                rdma_devices: device_name,
                master_server_addr: "127.0.0.1:50051".into(),
                ..Default::default()
            },
        )
    }

    /// Unmounts this client's segment and drops the connection; 0, and idempotent.
    #[pyo3(signature = (/))]
    fn close(&self, py: Python<'_>) -> i32 {
        let _l = self.lifecycle.lock();
        drop(self.http.lock().take());
        let s = self.inner.write().take();
        if let Some(s) = s {
            py.detach(|| {
                s.close();
                wait_for_calls_in_flight(&s);
            });
        }
        // No call holds the store now, so none still reads or writes a pool block.
        self.pool.reset(0);
        0
    }

    /// 0 healthy, 1 not set up or closed, 2 master unreachable.
    #[pyo3(signature = (/))]
    fn health_check(&self, py: Python<'_>) -> i32 {
        match self.store() {
            None => 1,
            Some(s) => py.detach(|| s.health()),
        }
    }

    /// The `host:port` this client is known by (its segment's name); `""` before `setup`.
    #[pyo3(signature = (/))]
    fn get_hostname(&self) -> String {
        self.store()
            .map(|s| s.hostname().to_string())
            .unwrap_or_default()
    }

    // ---- bytes ---------------------------------------------------------------------------

    /// Stores `value` (bytes-like) under `key`; an existing key is success and stays unchanged.
    /// 0, or a negative error code (`ErrorCode`); the reason of a failure is logged.
    #[pyo3(signature = (key, value, config=None))]
    fn put(
        &self,
        py: Python<'_>,
        key: &str,
        value: &Bound<'_, PyAny>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> PyResult<i32> {
        let v = Pinned::bytes(value)?;
        Ok(self.put_one(py, key, std::slice::from_ref(&v), config, false))
    }

    /// Like `put`, but overwrites an existing key. 0, or a negative error code.
    #[pyo3(signature = (key, value, config=None))]
    fn upsert(
        &self,
        py: Python<'_>,
        key: &str,
        value: &Bound<'_, PyAny>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> PyResult<i32> {
        let v = Pinned::bytes(value)?;
        Ok(self.put_one(py, key, std::slice::from_ref(&v), config, true))
    }

    /// Stores the concatenation of `parts` (bytes-like) under `key`, without joining them
    /// first. 0, or a negative error code.
    #[pyo3(signature = (key, *parts, config=None))]
    fn put_parts(
        &self,
        py: Python<'_>,
        key: &str,
        parts: &Bound<'_, PyTuple>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> PyResult<i32> {
        let pinned = pin_all(parts.as_any(), true)?;
        Ok(self.put_one(py, key, &pinned, config, false))
    }

    /// Like `put_parts`, but overwrites an existing key. 0, or a negative error code.
    #[pyo3(signature = (key, *parts, config=None))]
    fn upsert_parts(
        &self,
        py: Python<'_>,
        key: &str,
        parts: &Bound<'_, PyTuple>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> PyResult<i32> {
        let pinned = pin_all(parts.as_any(), true)?;
        Ok(self.put_one(py, key, &pinned, config, true))
    }

    /// One return code for the whole batch (0, or the first failure).
    #[pyo3(signature = (keys, values, config=None))]
    fn put_batch(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        values: &Bound<'_, PyAny>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> PyResult<i32> {
        self.put_batch_impl(py, keys, values, config, false)
    }

    /// Like `put_batch`, but overwrites existing keys. 0, or the first failure's code.
    #[pyo3(signature = (keys, values, config=None))]
    fn upsert_batch(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        values: &Bound<'_, PyAny>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> PyResult<i32> {
        self.put_batch_impl(py, keys, values, config, true)
    }

    /// Internal (tensor layer): batch put where each object is the concatenation of a list
    /// of 1-D byte buffers; one return code per key.
    #[pyo3(signature = (keys, parts_list, config=None, upsert=false))]
    fn _put_parts_batch(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        parts_list: &Bound<'_, PyAny>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
        upsert: bool,
    ) -> PyResult<Vec<i32>> {
        let objects = list_of_values(parts_list)?;
        if objects.len() != keys.len() {
            return Ok(vec![INVALID; keys.len()]);
        }
        let pinned: Vec<Vec<Pinned>> = objects
            .iter()
            .map(|o| pin_all(&o, true))
            .collect::<PyResult<_>>()?;
        let parts: Vec<Vec<Src<'_>>> = pinned
            .iter()
            .map(|ps| ps.iter().map(Pinned::src).collect())
            .collect();
        let n = keys.len();
        Ok(self.put_many(py, (n, None), &keys, &parts, &Cfg::of(config), upsert, true))
    }

    /// The object's bytes; `b""` on a miss or any error.
    #[pyo3(signature = (key, /))]
    fn get<'py>(&self, py: Python<'py>, key: &str) -> PyResult<Bound<'py, PyBytes>> {
        let empty = PyBytes::new(py, b"");
        let Some(s) = self.store() else {
            return Ok(empty);
        };
        let obj = read_whole(py, &s, key, |py, n| pybuf::new_bytes(py, n))?;
        Ok(obj.unwrap_or(empty))
    }

    /// `list[bytes]` with `b""` for misses; `[b""]` when not set up or for no keys (upstream).
    #[pyo3(signature = (keys, /))]
    fn get_batch<'py>(&self, py: Python<'py>, keys: Vec<String>) -> PyResult<Bound<'py, PyList>> {
        let empty = || PyBytes::new(py, b"");
        let Some(s) = self.store() else {
            return PyList::new(py, [empty()]);
        };
        if keys.is_empty() {
            return PyList::new(py, [empty()]);
        }
        let objs = self.read_many(py, &s, &keys, |py, n| {
            let (b, f) = pybuf::new_bytes(py, n)?;
            Ok((b.into_any(), f))
        })?;
        PyList::new(
            py,
            objs.into_iter()
                .map(|o| o.unwrap_or_else(|| empty().into_any())),
        )
    }

    /// A `BufferHandle` (buffer protocol, `ptr()`, `size()`) or `None`.
    #[pyo3(signature = (key, /))]
    fn get_buffer<'py>(&self, py: Python<'py>, key: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Some(s) = self.store() else {
            return Ok(None);
        };
        read_whole(py, &s, key, crate::new_buffer_handle)
    }

    /// A `BufferHandle` per key, `None` for a key that is missing or failed.
    #[pyo3(signature = (keys, /))]
    fn batch_get_buffer<'py>(
        &self,
        py: Python<'py>,
        keys: Vec<String>,
    ) -> PyResult<Vec<Option<Bound<'py, PyAny>>>> {
        let Some(s) = self.store() else {
            return Ok(vec![None; keys.len()]);
        };
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        self.read_many(py, &s, &keys, crate::new_buffer_handle)
    }

    /// The object's size in bytes, or a negative error code (`-704` for a missing key).
    #[pyo3(signature = (key, /))]
    fn get_size(&self, py: Python<'_>, key: &str) -> i64 {
        match self.store() {
            None => INVALID as i64,
            Some(s) => rc_i64(py.detach(|| s.get_size(key))),
        }
    }

    /// 1 exists, 0 not, negative error code.
    #[pyo3(signature = (key, /))]
    fn is_exist(&self, py: Python<'_>, key: &str) -> i32 {
        match self.store() {
            None => INVALID,
            Some(s) => match py.detach(|| s.is_exist(key)) {
                Ok(true) => 1,
                Ok(false) => 0,
                Err(e) => failed(e),
            },
        }
    }

    /// Per key: 1 exists, 0 not, or a negative error code.
    #[pyo3(signature = (keys))]
    fn batch_is_exist(&self, py: Python<'_>, keys: Vec<String>) -> Vec<i32> {
        let Some(s) = self.store() else {
            return vec![INVALID; keys.len()];
        };
        py.detach(|| {
            s.batch_is_exist(&keys)
                .into_iter()
                .map(|r| match r {
                    Ok(true) => 1,
                    Ok(false) => 0,
                    Err(e) => failed(e),
                })
                .collect()
        })
    }

    /// Removes `key` (`force` also removes it while a reader holds a lease). 0, or a negative
    /// error code (`-706` while leased).
    #[pyo3(signature = (key, force=false))]
    fn remove(&self, py: Python<'_>, key: &str, force: bool) -> i32 {
        match self.store() {
            None => INVALID,
            Some(s) => rc(py.detach(|| s.remove(key, force))),
        }
    }

    /// Number of objects removed, or a negative code (`-600` for an invalid regex).
    #[pyo3(signature = (regex_pattern, force=false))]
    fn remove_by_regex(&self, py: Python<'_>, regex_pattern: &str, force: bool) -> i64 {
        match self.store() {
            None => INVALID as i64,
            Some(s) => rc_i64(py.detach(|| s.remove_by_regex(regex_pattern, force))),
        }
    }

    /// Removes every object; the number removed, or a negative error code.
    #[pyo3(signature = (force=false))]
    fn remove_all(&self, py: Python<'_>, force: bool) -> i64 {
        match self.store() {
            None => INVALID as i64,
            Some(s) => rc_i64(py.detach(|| s.remove_all(force))),
        }
    }

    /// Removes each key as `remove` does; 0 or a negative error code per key.
    #[pyo3(signature = (keys, force=false))]
    fn batch_remove(&self, py: Python<'_>, keys: Vec<String>, force: bool) -> Vec<i32> {
        let Some(s) = self.store() else {
            return vec![INVALID; keys.len()];
        };
        py.detach(|| s.batch_remove(&keys, force).into_iter().map(rc).collect())
    }

    /// The `ReplicaDescriptor`s of `key`; `[]` when it is missing or not set up.
    #[pyo3(signature = (key))]
    fn get_replica_desc(&self, py: Python<'_>, key: &str) -> Vec<PyReplicaDescriptor> {
        let Some(s) = self.store() else {
            return Vec::new();
        };
        match py.detach(|| s.replicas(key)) {
            Ok(l) => l.replicas.iter().map(PyReplicaDescriptor::from).collect(),
            Err(_) => Vec::new(),
        }
    }

    /// `{key: [ReplicaDescriptor, ...]}` for the keys that were found.
    #[pyo3(signature = (keys))]
    fn batch_get_replica_desc<'py>(
        &self,
        py: Python<'py>,
        keys: Vec<String>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        let Some(s) = self.store() else {
            return Ok(d);
        };
        let lists = py.detach(|| s.batch_replicas(&keys));
        for (k, l) in keys.iter().zip(lists) {
            if let Ok(l) = l {
                let v: Vec<PyReplicaDescriptor> =
                    l.replicas.iter().map(PyReplicaDescriptor::from).collect();
                d.set_item(k, v)?;
            }
        }
        Ok(d)
    }

    /// Memory from this client's pool (bounded by `local_buffer_size`, freed by `close`);
    /// 0 on failure.
    #[pyo3(signature = (size, /))]
    fn alloc_from_mem_pool(&self, size: u64) -> u64 {
        let Some(s) = self.store() else {
            return 0;
        };
        let addr = self.pool.alloc(size);
        if addr == 0 {
            return 0;
        }
        // Registered, so a call given more bytes than the block holds is refused as for any
        // registered buffer (rather than writing past it into the heap).
        // SAFETY: the block stays allocated until `close`, which frees the pool only after
        // every call holding this store has returned and the store (and its registry) is gone.
        match unsafe { s.register_buffer(addr, size) } {
            Ok(()) => addr,
            Err(e) => {
                tracing::warn!("alloc_from_mem_pool: {e}");
                0
            }
        }
    }

    /// Internal (`_cluster_ops.allocate_and_mount_segment`): `(ret, segment_id, size)`; see
    /// `client::store::extra`.
    #[pyo3(signature = (size, /))]
    fn _allocate_and_mount_segment(&self, py: Python<'_>, size: u64) -> (i32, String, u64) {
        let Some(s) = self.store() else {
            return (-1, String::new(), 0);
        };
        match py.detach(|| s.allocate_and_mount_segment(size)) {
            Ok((id, len)) => (0, id, len),
            Err(e) => (failed(e), String::new(), 0),
        }
    }

    /// Internal (`_cluster_ops.mount_segment`): `(ret, segment_id, size)` for `size` bytes of
    /// the file at `path` from `offset`; see `client::store::extra`.
    #[pyo3(signature = (path, size, offset, /))]
    fn _mount_segment(
        &self,
        py: Python<'_>,
        path: String,
        size: u64,
        offset: u64,
    ) -> (i32, String, u64) {
        let Some(s) = self.store() else {
            return (-1, String::new(), 0);
        };
        match py.detach(|| s.mount_file_segment(&path, size, offset)) {
            Ok((id, len)) => (0, id, len),
            Err(e) => (failed(e), String::new(), 0),
        }
    }

    /// Internal (`_cluster_ops.batch_replica_clear`): `(0, keys cleared)`, or `(code, [])` when
    /// the call failed; see `Store::batch_replica_clear`.
    #[pyo3(signature = (keys, segment_name, /))]
    fn _batch_replica_clear(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        segment_name: String,
    ) -> (i32, Vec<String>) {
        let Some(s) = self.store() else {
            return (INVALID, Vec::new());
        };
        match py.detach(|| s.batch_replica_clear(&keys, &segment_name)) {
            Ok(cleared) => (0, cleared),
            Err(e) => (e.code(), Vec::new()),
        }
    }

    /// Internal (`_cluster_ops.create_copy_task` / `create_move_task`): `((hi, lo), 0)` or
    /// `((0, 0), code)`; a move when `source` is given. See `client::store::tasks`.
    #[pyo3(signature = (key, targets, source, /))]
    fn _create_task(
        &self,
        py: Python<'_>,
        key: String,
        targets: Vec<String>,
        source: Option<String>,
    ) -> ((u64, u64), i32) {
        let Some(s) = self.store() else {
            return ((0, 0), INVALID);
        };
        let r = py.detach(|| match (&source, targets.as_slice()) {
            (Some(src), [target]) => s.create_move_task(&key, src, target),
            (Some(_), _) => Err(protocol::ErrorCode::InvalidParams.into()),
            (None, _) => s.create_copy_task(&key, &targets),
        });
        match r {
            Ok(id) => ((id.hi, id.lo), 0),
            Err(e) => ((0, 0), failed(e)),
        }
    }

    /// Internal (`_cluster_ops.query_task`): `(0, (id, type, status, created_at_ms_epoch,
    /// last_updated_at_ms_epoch, assigned_client, message))`, or `(code, None)`.
    #[pyo3(signature = (hi, lo, /))]
    fn _query_task(&self, py: Python<'_>, hi: u64, lo: u64) -> (i32, Option<TaskFields>) {
        let Some(s) = self.store() else {
            return (INVALID, None);
        };
        match py.detach(|| s.query_task(protocol::Uuid::from_parts(hi, lo))) {
            Ok(t) => (0, Some(task_fields(t))),
            Err(e) => (failed(e), None),
        }
    }

    /// Internal (`_cluster_ops.unmount_segment`): 0 or a code; see `client::store::extra`.
    #[pyo3(signature = (segment_ids, grace_period_seconds, /))]
    fn _unmount_segments(
        &self,
        py: Python<'_>,
        segment_ids: Vec<String>,
        grace_period_seconds: f64,
    ) -> i32 {
        let Some(s) = self.store() else {
            return -1;
        };
        let grace = std::time::Duration::try_from_secs_f64(grace_period_seconds.max(0.0))
            .unwrap_or_default();
        rc(py.detach(|| s.unmount_segments(&segment_ids, grace)))
    }

    /// Internal: ids of the segments mounted after setup.
    #[pyo3(signature = ())]
    fn _extra_segment_ids(&self) -> Vec<String> {
        self.store()
            .map(|s| s.extra_segment_ids())
            .unwrap_or_default()
    }

    /// Internal (`mooncake.buffer_pool`): this client's `local_buffer_size`, 0 when not set up.
    #[pyo3(signature = ())]
    fn _local_buffer_capacity(&self) -> u64 {
        self.store().map_or(0, |s| s.budget().capacity())
    }

    /// Internal: the cluster id this client was set up with (`MC_STORE_CLUSTER_ID`), or `None`
    /// when not set up.
    #[pyo3(signature = ())]
    fn _cluster_id(&self) -> Option<String> {
        self.store().map(|s| s.cluster_id().to_string())
    }

    /// Upstream's count of reads served from offloaded storage: our disk-replica reads.
    #[pyo3(signature = ())]
    fn get_offload_rpc_read_count(&self) -> i64 {
        self.store()
            .map_or(0, |s| s.path_counts().disk_reads as i64)
    }

    // ---- zero copy -------------------------------------------------------------------------

    /// 0, or `-600` when not set up or when `[buffer_ptr, buffer_ptr + size)` is not mapped
    /// readable and writable here: a registered range is later read and written through raw
    /// pointers, so an unmapped one would turn a bad argument into a segfault.
    #[pyo3(signature = (buffer_ptr, size))]
    fn register_buffer(&self, buffer_ptr: u64, size: u64) -> i32 {
        match self.store() {
            None => INVALID,
            Some(_) if size > 0 && !crate::engine::mapped_rw(buffer_ptr, size) => INVALID,
            // SAFETY: just checked mapped readable and writable; that it stays so until
            // `unregister_buffer` is the caller's promise in registering, as upstream's.
            Some(s) => rc(unsafe { s.register_buffer(buffer_ptr, size) }),
        }
    }

    /// Forgets a range registered with `register_buffer` (by its start). 0, or a negative
    /// error code.
    #[pyo3(signature = (buffer_ptr))]
    fn unregister_buffer(&self, buffer_ptr: u64) -> i32 {
        match self.store() {
            None => INVALID,
            Some(s) => rc(s.unregister_buffer(buffer_ptr)),
        }
    }

    /// Stores `size` bytes at `buffer_ptr` under `key`, with no copy through Python. The
    /// memory must stay valid for the call. 0, or a negative error code.
    #[pyo3(signature = (key, buffer_ptr, size, config=None))]
    fn put_from(
        &self,
        py: Python<'_>,
        key: &str,
        buffer_ptr: u64,
        size: u64,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> i32 {
        self.put_from_impl(py, key, buffer_ptr, size, config, false)
    }

    /// Like `put_from`, but overwrites an existing key. 0, or a negative error code.
    #[pyo3(signature = (key, buffer_ptr, size, config=None))]
    fn upsert_from(
        &self,
        py: Python<'_>,
        key: &str,
        buffer_ptr: u64,
        size: u64,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> i32 {
        self.put_from_impl(py, key, buffer_ptr, size, config, true)
    }

    /// Stores metadata bytes followed by data bytes. Upstream's quirks: 0 without storing
    /// for `size == 0`; -1 when not set up or with `prefer_alloc_in_same_node`; and the
    /// *negated* (positive) error code when the put fails.
    #[pyo3(signature = (key, buffer_ptr, metadata_buffer_ptr, size, metadata_size, config=None))]
    #[allow(clippy::too_many_arguments)]
    fn put_from_with_metadata(
        &self,
        py: Python<'_>,
        key: &str,
        buffer_ptr: u64,
        metadata_buffer_ptr: u64,
        size: u64,
        metadata_size: u64,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> i32 {
        if size == 0 {
            return 0;
        }
        let Some(s) = self.store() else {
            return -1;
        };
        let cfg = Cfg::of(config);
        if cfg.wire.as_ref().is_ok_and(|c| c.prefer_alloc_in_same_node) {
            return -1;
        }
        let r = py.detach(|| {
            let (meta, data) = (
                s.caller_range(metadata_buffer_ptr, metadata_size)?,
                s.caller_range(buffer_ptr, size)?,
            );
            // SAFETY: the caller-memory contract (module doc) holds both sources until the
            // put returns; the ranges die with it.
            let parts = unsafe { [meta.src(), data.src()] };
            s.put_parts(key, &parts, cfg.single()?, false)
        });
        -rc(r)
    }

    /// `put_from` for many keys in one batch; 0 or a negative error code per key.
    #[pyo3(signature = (keys, buffer_ptrs, sizes, config=None))]
    fn batch_put_from(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        buffer_ptrs: Vec<u64>,
        sizes: Vec<u64>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> Vec<i32> {
        self.put_from_many(py, keys, buffer_ptrs, sizes, config, false)
    }

    /// `upsert_from` for many keys in one batch; 0 or a negative error code per key.
    #[pyo3(signature = (keys, buffer_ptrs, sizes, config=None))]
    fn batch_upsert_from(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        buffer_ptrs: Vec<u64>,
        sizes: Vec<u64>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> Vec<i32> {
        self.put_from_many(py, keys, buffer_ptrs, sizes, config, true)
    }

    /// Each object is the concatenation of its buffers.
    #[pyo3(signature = (keys, all_buffer_ptrs, all_sizes, config=None))]
    fn batch_put_from_multi_buffers(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        all_buffer_ptrs: Vec<Vec<u64>>,
        all_sizes: Vec<Vec<u64>>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> Vec<i32> {
        let n = keys.len();
        let Some(s) = self.store() else {
            return Vec::new();
        };
        if all_buffer_ptrs.len() != n || all_sizes.len() != n {
            return vec![INVALID; n];
        }
        let mut cfg = Cfg::of(config);
        // This call is the one that honours `prefer_alloc_in_same_node` upstream. Our
        // allocator does not know the writer (`State::place` chooses by free space and
        // strategy only), and the master refuses the flag on the single-key forms, so it is
        // dropped here rather than refused: the put still succeeds, placed as any other.
        if let Ok(c) = cfg.wire.as_mut() {
            c.prefer_alloc_in_same_node = false;
        }
        let parts = |i: usize| {
            parts_of(&all_buffer_ptrs[i], &all_sizes[i], |p, l| {
                let r = s.caller_range(p, l)?;
                // SAFETY: the caller-memory contract (module doc) holds every source for this
                // call, which the objects do not outlive.
                Ok(unsafe { r.into_src() })
            })
        };
        put_accepted(&keys, parts, |at, ks, ps| {
            self.put_many(py, (n, Some(at)), ks, ps, &cfg, false, false)
        })
    }

    /// Bytes read, or a negative code (`-704` miss, `-600` too small / unregistered).
    #[pyo3(signature = (key, buffer_ptr, size))]
    fn get_into(&self, py: Python<'_>, key: &str, buffer_ptr: u64, size: u64) -> i64 {
        match self.store() {
            None => INVALID as i64,
            // SAFETY: the caller-memory contract (module doc) covers the destination.
            Some(s) => rc_i64(py.detach(|| unsafe { s.get_into(key, buffer_ptr, size) })),
        }
    }

    /// Reads each key into its buffer (`buffer_ptrs[i]`, `sizes[i]` bytes); per key the
    /// bytes read or a negative error code.
    #[pyo3(signature = (keys, buffer_ptrs, sizes))]
    fn batch_get_into(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        buffer_ptrs: Vec<u64>,
        sizes: Vec<u64>,
    ) -> Vec<i64> {
        self.get_into_many(py, &keys, &buffer_ptrs, &sizes)
    }

    /// Scatters each object into its buffers in order; bytes read per key or a negative code.
    #[pyo3(signature = (keys, all_buffer_ptrs, all_sizes, prefer_alloc_in_same_node=false))]
    fn batch_get_into_multi_buffers(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        all_buffer_ptrs: Vec<Vec<u64>>,
        all_sizes: Vec<Vec<u64>>,
        prefer_alloc_in_same_node: bool,
    ) -> Vec<i64> {
        let _ = prefer_alloc_in_same_node;
        let Some(s) = self.store() else {
            return vec![INVALID as i64; keys.len()];
        };
        py.detach(|| {
            // SAFETY: the caller-memory contract (module doc) covers every destination.
            unsafe { s.get_into_multi_buffers(&keys, &all_buffer_ptrs, &all_sizes) }
                .into_iter()
                .map(rc_i64)
                .collect()
        })
    }

    /// Ranged reads: `result[b][k][f]` is the bytes read for fragment `f` of key `k` into
    /// buffer `b`, or a negative code. A key's fragments fail together when its offset and size
    /// lists disagree in length; a missing key fails only its own fragments.
    #[pyo3(signature = (buffer_ptrs, all_keys, all_dst_offsets, all_src_offsets, all_sizes))]
    fn get_into_ranges(
        &self,
        py: Python<'_>,
        buffer_ptrs: Vec<u64>,
        all_keys: Vec<Vec<String>>,
        all_dst_offsets: Vec<Vec<Vec<u64>>>,
        all_src_offsets: Vec<Vec<Vec<u64>>>,
        all_sizes: Vec<Vec<Vec<u64>>>,
    ) -> Vec<Vec<Vec<i64>>> {
        let s = self.store();
        py.detach(|| {
            client::store::ranges::get_into_ranges(
                s.as_deref(),
                &buffer_ptrs,
                &all_keys,
                &all_dst_offsets,
                &all_src_offsets,
                &all_sizes,
            )
        })
    }

    // ---- sessions (`client::store::session`) ---------------------------------------------------
    // Upstream's convention when not set up: `[]` (and -1 for `batch_get_session_end`).

    /// Reserves the objects without moving bytes; 0 or a negative code per key.
    #[pyo3(signature = (keys, sizes, config=None))]
    fn batch_put_session_start(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        sizes: Vec<u64>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> Vec<i32> {
        let Some(s) = self.store() else {
            return Vec::new();
        };
        let cfg = Cfg::of(config);
        py.detach(|| match cfg.for_batch(keys.len()) {
            Ok(c) => s
                .put_session_start(&keys, &sizes, c)
                .into_iter()
                .map(rc)
                .collect(),
            Err(e) => vec![e.code(); keys.len()],
        })
    }

    /// Fills byte ranges of objects in a put session; bytes copied per key or a negative code.
    #[pyo3(signature = (keys, all_buffer_ptrs, all_sizes, all_dst_offsets))]
    fn batch_put_from_multi_buffer_ranges(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        all_buffer_ptrs: Vec<Vec<u64>>,
        all_sizes: Vec<Vec<u64>>,
        all_dst_offsets: Vec<Vec<u64>>,
    ) -> Vec<i64> {
        let Some(s) = self.store() else {
            return Vec::new();
        };
        py.detach(|| {
            // SAFETY: the caller-memory contract (module doc) covers every source range.
            unsafe { s.put_ranges(&keys, &all_buffer_ptrs, &all_sizes, &all_dst_offsets) }
                .into_iter()
                .map(rc_i64)
                .collect()
        })
    }

    /// Writes and commits the objects of a put session; 0 or a negative code per key.
    #[pyo3(signature = (keys))]
    fn batch_put_session_end(&self, py: Python<'_>, keys: Vec<String>) -> Vec<i32> {
        let Some(s) = self.store() else {
            return Vec::new();
        };
        py.detach(|| s.put_session_end(&keys).into_iter().map(rc).collect())
    }

    /// Gives back the reservations of `batch_put_session_start`; 0 or a negative error
    /// code per key (`-600` for a key without a session).
    #[pyo3(signature = (keys))]
    fn batch_put_session_revoke(&self, py: Python<'_>, keys: Vec<String>) -> Vec<i32> {
        let Some(s) = self.store() else {
            return Vec::new();
        };
        py.detach(|| s.put_session_revoke(&keys).into_iter().map(rc).collect())
    }

    /// Caches the replica lists of `keys`; 0 or a negative code (`-704` miss) per key.
    #[pyo3(signature = (keys))]
    fn batch_get_session_start(&self, py: Python<'_>, keys: Vec<String>) -> Vec<i32> {
        let Some(s) = self.store() else {
            return Vec::new();
        };
        py.detach(|| s.get_session_start(&keys).into_iter().map(rc).collect())
    }

    /// Ranged reads of objects in a get session; bytes read per key or a negative code.
    #[pyo3(signature = (keys, all_buffer_ptrs, all_sizes, all_src_offsets))]
    fn batch_get_into_multi_buffer_ranges(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        all_buffer_ptrs: Vec<Vec<u64>>,
        all_sizes: Vec<Vec<u64>>,
        all_src_offsets: Vec<Vec<u64>>,
    ) -> Vec<i64> {
        let Some(s) = self.store() else {
            return Vec::new();
        };
        py.detach(|| {
            // SAFETY: the caller-memory contract (module doc) covers every destination range.
            unsafe { s.get_ranges(&keys, &all_buffer_ptrs, &all_sizes, &all_src_offsets) }
                .into_iter()
                .map(rc_i64)
                .collect()
        })
    }

    /// Drops the cached replica lists; 0 (-1 when not set up, as upstream).
    #[pyo3(signature = (keys))]
    fn batch_get_session_end(&self, keys: Vec<String>) -> i32 {
        match self.store() {
            None => -1,
            Some(s) => {
                s.get_session_end(&keys);
                0
            }
        }
    }

    // ---- tensors from registered memory ------------------------------------------------------

    /// Stores registered memory that already holds `[TensorMetadata][data]` (validated).
    #[pyo3(signature = (key, buffer_ptr, size))]
    fn put_tensor_from(&self, py: Python<'_>, key: String, buffer_ptr: u64, size: u64) -> i32 {
        self.tensor_from_many(py, vec![key], vec![buffer_ptr], vec![size], false)[0]
    }

    /// Like `put_tensor_from`, but overwrites an existing key. 0, or a negative error code.
    #[pyo3(signature = (key, buffer_ptr, size))]
    fn upsert_tensor_from(&self, py: Python<'_>, key: String, buffer_ptr: u64, size: u64) -> i32 {
        self.tensor_from_many(py, vec![key], vec![buffer_ptr], vec![size], true)[0]
    }

    /// `put_tensor_from` for many keys; 0 or a negative error code per key.
    #[pyo3(signature = (keys, buffer_ptrs, sizes))]
    fn batch_put_tensor_from(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        buffer_ptrs: Vec<u64>,
        sizes: Vec<u64>,
    ) -> Vec<i32> {
        self.tensor_from_many(py, keys, buffer_ptrs, sizes, false)
    }

    /// `upsert_tensor_from` for many keys; 0 or a negative error code per key.
    #[pyo3(signature = (keys, buffer_ptrs, sizes))]
    fn batch_upsert_tensor_from(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        buffer_ptrs: Vec<u64>,
        sizes: Vec<u64>,
    ) -> Vec<i32> {
        self.tensor_from_many(py, keys, buffer_ptrs, sizes, true)
    }

    /// Internal (parallel reads): copies `data` to caller memory at `buffer_ptr` (registered,
    /// or mapped writable); its length, or -600 for a range that is neither.
    #[pyo3(signature = (buffer_ptr, data))]
    fn _write_caller(&self, py: Python<'_>, buffer_ptr: u64, data: &[u8]) -> i64 {
        let Some(s) = self.store() else {
            return INVALID as i64;
        };
        rc_i64(py.detach(|| {
            let dst = s.caller_range_mut(buffer_ptr, data.len() as u64)?;
            // SAFETY: the caller-memory contract (module doc) gives us the destination for
            // this call; the range lives for this one copy.
            Src::from(data).copy_to(&mut unsafe { dst.into_dst() });
            Ok::<_, ErrorCode>(data.len() as u64)
        }))
    }

    /// Internal (tensor layer): a copy of `size` bytes of caller memory at `buffer_ptr`, or
    /// `None` when the range is neither registered nor mapped.
    #[pyo3(signature = (buffer_ptr, size))]
    fn _read_registered<'py>(
        &self,
        py: Python<'py>,
        buffer_ptr: u64,
        size: u64,
    ) -> Option<Bound<'py, PyBytes>> {
        let s = self.store()?;
        let src = s.caller_range(buffer_ptr, size).ok()?;
        // SAFETY: the caller-memory contract (module doc) holds the source while we copy it.
        let src = unsafe { src.src() };
        PyBytes::new_with(py, src.len(), |b| {
            src.copy_to(&mut Dst::from(b));
            Ok(())
        })
        .ok()
    }
}

impl PyStore {
    fn put_batch_impl(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        values: &Bound<'_, PyAny>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
        upsert: bool,
    ) -> PyResult<i32> {
        let values = list_of_values(values)?;
        if values.len() != keys.len() {
            return Ok(INVALID);
        }
        let pinned = pin_all(values.as_any(), false)?;
        let parts: Vec<Vec<Src<'_>>> = pinned.iter().map(|p| vec![p.src()]).collect();
        let n = keys.len();
        let r = self.put_many(py, (n, None), &keys, &parts, &Cfg::of(config), upsert, true);
        Ok(r.into_iter().find(|c| *c != 0).unwrap_or(0))
    }

    fn put_from_impl(
        &self,
        py: Python<'_>,
        key: &str,
        buffer_ptr: u64,
        size: u64,
        config: Option<PyRef<'_, PyReplicateConfig>>,
        upsert: bool,
    ) -> i32 {
        if size == 0 {
            return if self.store().is_some() { 0 } else { INVALID };
        }
        let Some(s) = self.store() else {
            return INVALID;
        };
        let cfg = Cfg::of(config);
        rc(py.detach(|| {
            let data = s.caller_range(buffer_ptr, size)?;
            // SAFETY: the caller-memory contract (module doc) holds the source until the put
            // returns; the range dies with it.
            s.put_parts(key, &[unsafe { data.src() }], cfg.single()?, upsert)
        }))
    }

    /// Reads many objects into fresh Python objects made by `make`; `None` for failures.
    fn read_many<'py, F>(
        &self,
        py: Python<'py>,
        s: &Store,
        keys: &[String],
        make: F,
    ) -> PyResult<Vec<Option<Bound<'py, PyAny>>>>
    where
        F: Fn(Python<'py>, usize) -> PyResult<(Bound<'py, PyAny>, Fresh)>,
    {
        let lists = py.detach(|| s.batch_replicas(keys));
        let mut objs: Vec<Option<Bound<'py, PyAny>>> = Vec::with_capacity(keys.len());
        let mut plans: Vec<Option<(Lookup, Fresh)>> = Vec::with_capacity(keys.len());
        for l in lists {
            match l.and_then(|l| Ok((l.object_size()?, l))) {
                Ok((n, l)) => {
                    let (o, f) = make(py, usize_of(n)?)?;
                    objs.push(Some(o));
                    plans.push(Some((l, f)));
                }
                Err(_) => {
                    objs.push(None);
                    plans.push(None);
                }
            }
        }
        let ok: Vec<bool> = py.detach(|| {
            let mut ok = vec![false; plans.len()];
            let mut owners = Vec::with_capacity(plans.len());
            let mut lists = Vec::with_capacity(plans.len());
            let mut dsts = Vec::with_capacity(plans.len());
            for (i, p) in plans.into_iter().enumerate() {
                if let Some((list, fresh)) = p {
                    owners.push(i);
                    lists.push(list);
                    // SAFETY: `objs` holds the only reference to each new object until after
                    // the reads, and no Rust reference touches its bytes meanwhile.
                    dsts.push(unsafe { fresh.into_dst() });
                }
            }
            let reads = lists
                .iter()
                .zip(dsts)
                .map(|(list, dst)| ObjectRead {
                    list,
                    offset: 0,
                    dst,
                })
                .collect();
            for (i, r) in owners.into_iter().zip(s.read_many_copied(reads)) {
                match r {
                    Ok(()) => ok[i] = true,
                    Err(e) => _ = failed(e.context(format_args!("read of {}", keys[i]))),
                }
            }
            ok
        });
        Ok(objs
            .into_iter()
            .zip(ok)
            .map(|(o, ok)| o.filter(|_| ok))
            .collect())
    }
}

/// `BufferHandle.ptr()` helper.
#[pyfunction]
pub fn _bytearray_address(obj: &Bound<'_, PyByteArray>) -> u64 {
    pybuf::bytearray_address(obj)
}

/// `(id, type, status, created_at_ms_epoch, last_updated_at_ms_epoch, assigned_client,
/// message)`.
pub(crate) type TaskFields = ((u64, u64), u8, u8, u64, u64, (u64, u64), String);

/// A task's state as `_query_task` hands it to Python.
pub(crate) fn task_fields(t: protocol::TaskInfo) -> TaskFields {
    (
        (t.id.hi, t.id.lo),
        t.task_type as u8,
        t.status as u8,
        t.created_at_ms_epoch,
        t.last_updated_at_ms_epoch,
        (t.assigned_client.hi, t.assigned_client.lo),
        t.message,
    )
}

/// Waits until `s` is held here only: every call that took the store before `close` took it
/// away has returned (each holds a clone while it runs, the GIL released), so nothing writes
/// into memory `close` frees next. Says so when that takes a while.
fn wait_for_calls_in_flight(s: &Arc<Store>) {
    let start = std::time::Instant::now();
    let mut told = false;
    while Arc::strong_count(s) > 1 {
        if !told && start.elapsed() > std::time::Duration::from_secs(1) {
            tracing::info!("close: waiting for calls in flight on other threads to return");
            told = true;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}
