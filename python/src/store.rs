//! `MooncakeDistributedStore`: the Python face of [`client::Store`].
//!
//! The methods it shares with the dummy client (puts, sizes, existence, removal, zero-copy
//! and tensor calls, tasks) are written once in [`crate::api`] over `client::store::api::
//! StoreApi`; this file holds what only a store of its own does (set-up and close, reads into
//! new Python objects, replica descriptors, segments, sessions, registration).
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

use client::store::api::StoreApi;
use client::store::{Lookup, ObjectRead};
use client::Store;
use parking_lot::{Mutex, RwLock};
use protocol::ErrorCode;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyList, PyTuple};

use crate::api::{failed, rc, rc_i64, Backend, Cfg, INVALID};
use crate::mempool::MemPool;
use crate::pybuf::{self, Fresh};
use crate::setup_args::{self, Setup};
use crate::types::{PyReplicaDescriptor, PyReplicateConfig};

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

impl Backend for PyStore {
    fn api(&self) -> Option<Arc<dyn StoreApi>> {
        self.store().map(|s| s as Arc<dyn StoreApi>)
    }
}

impl PyStore {
    fn store(&self) -> Option<Arc<Store>> {
        self.inner.read().clone()
    }

    /// What `get_into_ranges` reads through (`upstream_methods!`).
    fn range_source(&self) -> Option<Arc<Store>> {
        self.store()
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
}

crate::api::upstream_methods!(PyStore, {
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

    // ---- bytes ---------------------------------------------------------------------------

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
});

impl PyStore {
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
