//! `_DummyClient`: what `MooncakeDistributedStore.setup_dummy` switches a store to (see
//! `mooncake/_cluster_ops.py`). It forwards to a standalone `mooncake_client` on this host
//! through `client::dummy` (a unix socket and a shared memory region); return values follow
//! the store methods of the same names.

use std::collections::BTreeMap;
use std::sync::Arc;

use client::dummy::DummyClient;
use dataplane::mem::{Dst, Src};
use parking_lot::Mutex;
use protocol::{ErrorCode, ReplicateConfig};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use crate::pybuf::Pinned;
use crate::store::{task_fields, TaskFields};
use crate::types::PyReplicateConfig;
use client::store::ranges::{Fragment, RangeSource};

const INVALID: i32 = ErrorCode::InvalidParams as i32;

fn config_of(config: Option<PyRef<'_, PyReplicateConfig>>) -> Result<ReplicateConfig, ErrorCode> {
    match config {
        None => Ok(ReplicateConfig::default()),
        Some(c) => c.to_protocol(),
    }
}

fn first_failure(codes: &[i32]) -> i32 {
    codes.iter().copied().find(|c| *c != 0).unwrap_or(0)
}

/// A dummy client; see the module docs.
#[pyclass(name = "_DummyClient", module = "mooncake._native", frozen)]
pub struct PyDummy {
    inner: Arc<DummyClient>,
    /// `register_buffer` ranges, start to length: the buffers `get_into_ranges` may fill
    /// besides the shared region.
    registered: Mutex<BTreeMap<u64, u64>>,
}

fn code_of(v: i64) -> ErrorCode {
    ErrorCode::from_i32(v as i32).unwrap_or(ErrorCode::InternalError)
}

impl RangeSource for PyDummy {
    /// The object's size.
    type Object = u64;

    fn objects(&self, keys: &[String]) -> Vec<Result<u64, ErrorCode>> {
        self.inner
            .get_sizes(keys)
            .into_iter()
            .map(|n| if n < 0 { Err(code_of(n)) } else { Ok(n as u64) })
            .collect()
    }

    fn object_size(&self, o: &u64) -> Result<u64, ErrorCode> {
        Ok(*o)
    }

    fn bounds(&self, addr: u64) -> Option<(u64, u64)> {
        if self.inner.in_region(addr, 1) {
            return Some(self.inner.region());
        }
        let reg = self.registered.lock();
        let (&base, &len) = reg.range(..=addr).next_back()?;
        (addr - base < len).then_some((base, len))
    }

    fn read(&self, frags: &[Fragment<'_, u64>]) -> Vec<Result<(), ErrorCode>> {
        let reads: Vec<(String, u64, u64, u64)> = frags
            .iter()
            .map(|f| (f.key.to_string(), f.src, f.dst, f.len))
            .collect();
        if reads
            .iter()
            .any(|&(_, _, dst, len)| !self.caller_ok(dst, len, true))
        {
            return vec![Err(ErrorCode::InvalidParams); reads.len()];
        }
        // SAFETY: every destination was checked mapped writable above; the caller owns it for
        // the call (the caller-memory contract of every `*_into` method).
        unsafe { self.inner.read_ranges(&reads) }
            .into_iter()
            .map(|n| if n < 0 { Err(code_of(n)) } else { Ok(()) })
            .collect()
    }
}

impl PyDummy {
    /// Caller memory `[ptr, ptr + size)`, when mapped (readable, and writable with `write`).
    fn caller_ok(&self, ptr: u64, size: u64, write: bool) -> bool {
        size == 0
            || self.inner.in_region(ptr, size)
            || client::store::mapped::is_mapped(ptr, size, write)
    }

    fn put_parts_impl(
        &self,
        py: Python<'_>,
        key: &str,
        parts: &[Src<'_>],
        config: Option<PyRef<'_, PyReplicateConfig>>,
        upsert: bool,
    ) -> i32 {
        let cfg = match config_of(config) {
            Ok(c) => c,
            Err(e) => return e.code(),
        };
        let d = self.inner.clone();
        py.detach(|| d.put(key, parts, &cfg, upsert))
    }

    /// `put_parts` / `upsert_parts`: the 1-D byte buffers `parts`, concatenated.
    fn put_py_parts(
        &self,
        py: Python<'_>,
        key: &str,
        parts: &[Bound<'_, PyAny>],
        config: Option<PyRef<'_, PyReplicateConfig>>,
        upsert: bool,
    ) -> PyResult<i32> {
        let pinned = pin_parts(parts)?;
        let slices: Vec<Src<'_>> = pinned.iter().map(Pinned::src).collect();
        Ok(self.put_parts_impl(py, key, &slices, config, upsert))
    }

    fn put_from_many(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        ptrs: Vec<u64>,
        sizes: Vec<u64>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
        upsert: bool,
    ) -> Vec<i32> {
        let n = keys.len();
        if ptrs.len() != n || sizes.len() != n {
            return vec![INVALID; n];
        }
        let values: Option<Vec<Src<'_>>> = ptrs
            .iter()
            .zip(&sizes)
            // SAFETY: the caller-memory contract holds every source for this call, which the
            // slices do not outlive.
            .map(|(&p, &s)| unsafe { self.caller_src(p, s) })
            .collect();
        let Some(values) = values else {
            return vec![INVALID; n];
        };
        let cfg = match config_of(config) {
            Ok(c) => c,
            Err(e) => return vec![e.code(); n],
        };
        let d = self.inner.clone();
        py.detach(|| d.put_many(&keys, &values, &cfg, upsert))
    }
}

#[pymethods]
impl PyDummy {
    /// `(client, 0)` connected to the standalone client at `server_address`, or `(None, code)`
    /// with the reason logged.
    #[staticmethod]
    fn connect(
        py: Python<'_>,
        mem_pool_size: u64,
        local_buffer_size: u64,
        server_address: String,
    ) -> (Option<PyDummy>, i32) {
        match py.detach(|| DummyClient::connect(mem_pool_size, local_buffer_size, &server_address))
        {
            Ok(d) => (
                Some(PyDummy {
                    inner: Arc::new(d),
                    registered: Mutex::new(BTreeMap::new()),
                }),
                0,
            ),
            Err((code, why)) => {
                tracing::error!("setup_dummy({server_address}): {why}");
                (None, code.code())
            }
        }
    }

    /// The `host:port` of the standalone client this one talks to.
    fn get_hostname(&self) -> String {
        self.inner.hostname().to_string()
    }

    /// 0 while the standalone client answers, else a negative code (as the store's).
    fn health_check(&self, py: Python<'_>) -> i32 {
        let d = self.inner.clone();
        py.detach(|| d.health())
    }

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
        Ok(self.put_parts_impl(py, key, &[v.src()], config, false))
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
        Ok(self.put_parts_impl(py, key, &[v.src()], config, true))
    }

    /// Stores the concatenation of `parts` (bytes-like) under `key`, without joining them
    /// first. 0, or a negative error code.
    #[pyo3(signature = (key, *parts, config=None))]
    fn put_parts(
        &self,
        py: Python<'_>,
        key: &str,
        parts: Vec<Bound<'_, PyAny>>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> PyResult<i32> {
        self.put_py_parts(py, key, &parts, config, false)
    }

    /// Like `put_parts`, but overwrites an existing key. 0, or a negative error code.
    #[pyo3(signature = (key, *parts, config=None))]
    fn upsert_parts(
        &self,
        py: Python<'_>,
        key: &str,
        parts: Vec<Bound<'_, PyAny>>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> PyResult<i32> {
        self.put_py_parts(py, key, &parts, config, true)
    }

    /// Internal (tensor layer), as the store's: batch put where each object is the
    /// concatenation of a list of 1-D byte buffers; one code per key.
    #[pyo3(signature = (keys, parts_list, config=None, upsert=false))]
    fn _put_parts_batch(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        parts_list: Vec<Vec<Bound<'_, PyAny>>>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
        upsert: bool,
    ) -> PyResult<Vec<i32>> {
        if parts_list.len() != keys.len() {
            return Ok(vec![INVALID; keys.len()]);
        }
        let cfg = match config_of(config) {
            Ok(c) => c,
            Err(e) => return Ok(vec![e.code(); keys.len()]),
        };
        let pinned: Vec<Vec<Pinned>> = parts_list
            .iter()
            .map(|parts| pin_parts(parts))
            .collect::<PyResult<_>>()?;
        let slices: Vec<Vec<Src<'_>>> = pinned
            .iter()
            .map(|ps| ps.iter().map(Pinned::src).collect())
            .collect();
        let objects: Vec<&[Src<'_>]> = slices.iter().map(Vec::as_slice).collect();
        let d = self.inner.clone();
        Ok(py.detach(|| d.put_many_parts(&keys, &objects, &cfg, upsert)))
    }

    /// One code for the whole batch (0, or the first failure), as the store's `put_batch`.
    #[pyo3(signature = (keys, values, config=None))]
    fn put_batch(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        values: Vec<Bound<'_, PyAny>>,
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
        values: Vec<Bound<'_, PyAny>>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> PyResult<i32> {
        self.put_batch_impl(py, keys, values, config, true)
    }

    /// The object's bytes; `b""` on a miss or any error.
    #[pyo3(signature = (key, /))]
    fn get<'py>(&self, py: Python<'py>, key: &str) -> PyResult<Bound<'py, PyBytes>> {
        let d = self.inner.clone();
        let keys = [key.to_string()];
        let r = py.detach(|| d.get_many(&keys));
        Ok(match r.into_iter().next() {
            Some(Ok(v)) => PyBytes::new(py, &v),
            _ => PyBytes::new(py, b""),
        })
    }

    /// `list[bytes]` with `b""` for misses; `[b""]` for no keys (as the store).
    #[pyo3(signature = (keys, /))]
    fn get_batch<'py>(&self, py: Python<'py>, keys: Vec<String>) -> PyResult<Bound<'py, PyList>> {
        if keys.is_empty() {
            return PyList::new(py, [PyBytes::new(py, b"")]);
        }
        let d = self.inner.clone();
        let r = py.detach(|| d.get_many(&keys));
        PyList::new(
            py,
            r.into_iter().map(|o| match o {
                Ok(v) => PyBytes::new(py, &v),
                Err(_) => PyBytes::new(py, b""),
            }),
        )
    }

    /// A `BufferHandle` holding the object's bytes, or `None` (as the store's).
    #[pyo3(signature = (key, /))]
    fn get_buffer<'py>(&self, py: Python<'py>, key: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
        Ok(self.buffers(py, &[key.to_string()])?.pop().flatten())
    }

    /// A `BufferHandle` or `None` per key; `[]` for no keys (as the store's).
    #[pyo3(signature = (keys, /))]
    fn batch_get_buffer<'py>(
        &self,
        py: Python<'py>,
        keys: Vec<String>,
    ) -> PyResult<Vec<Option<Bound<'py, PyAny>>>> {
        self.buffers(py, &keys)
    }

    /// The object's size in bytes, or a negative error code (`-704` for a missing key).
    #[pyo3(signature = (key, /))]
    fn get_size(&self, py: Python<'_>, key: &str) -> i64 {
        let d = self.inner.clone();
        py.detach(|| d.get_sizes(&[key.to_string()])[0])
    }

    /// 1 exists, 0 not, or a negative error code.
    #[pyo3(signature = (key, /))]
    fn is_exist(&self, py: Python<'_>, key: &str) -> i32 {
        let d = self.inner.clone();
        py.detach(|| d.is_exist(&[key.to_string()])[0] as i32)
    }

    /// Per key: 1 exists, 0 not, or a negative error code.
    #[pyo3(signature = (keys))]
    fn batch_is_exist(&self, py: Python<'_>, keys: Vec<String>) -> Vec<i32> {
        let d = self.inner.clone();
        py.detach(|| d.is_exist(&keys).into_iter().map(|c| c as i32).collect())
    }

    /// Removes `key` (`force` also removes it while a reader holds a lease). 0, or a negative
    /// error code (`-706` while leased).
    #[pyo3(signature = (key, force=false))]
    fn remove(&self, py: Python<'_>, key: &str, force: bool) -> i32 {
        let d = self.inner.clone();
        py.detach(|| d.remove(&[key.to_string()], force)[0] as i32)
    }

    /// Removes each key as `remove` does; 0 or a negative error code per key.
    #[pyo3(signature = (keys, force=false))]
    fn batch_remove(&self, py: Python<'_>, keys: Vec<String>, force: bool) -> Vec<i32> {
        if keys.is_empty() {
            return Vec::new();
        }
        let d = self.inner.clone();
        py.detach(|| {
            d.remove(&keys, force)
                .into_iter()
                .map(|c| c as i32)
                .collect()
        })
    }

    /// Removes the keys matching `regex_pattern`; the number removed, or a negative code
    /// (`-600` for an invalid pattern).
    #[pyo3(signature = (regex_pattern, force=false))]
    fn remove_by_regex(&self, py: Python<'_>, regex_pattern: &str, force: bool) -> i64 {
        let d = self.inner.clone();
        py.detach(|| d.remove_by_regex(regex_pattern, force))
    }

    /// Removes every object; the number removed, or a negative error code.
    #[pyo3(signature = (force=false))]
    fn remove_all(&self, py: Python<'_>, force: bool) -> i64 {
        let d = self.inner.clone();
        py.detach(|| d.remove_all(force))
    }

    /// Memory in the region shared with the standalone client (zero-copy puts and gets);
    /// 0 when it is full.
    #[pyo3(signature = (size, /))]
    fn alloc_from_mem_pool(&self, size: u64) -> u64 {
        self.inner.alloc(size)
    }

    /// 0 for mapped read-write memory (buffers outside the shared region are staged through
    /// it), -600 otherwise.
    #[pyo3(signature = (buffer_ptr, size))]
    fn register_buffer(&self, buffer_ptr: u64, size: u64) -> i32 {
        if size > 0 && !self.caller_ok(buffer_ptr, size, true) {
            return INVALID;
        }
        if size > 0 && !self.inner.in_region(buffer_ptr, size) {
            self.registered.lock().insert(buffer_ptr, size);
        }
        0
    }

    /// Forgets a range registered with `register_buffer` (by its start). 0, or a negative
    /// error code.
    #[pyo3(signature = (buffer_ptr))]
    fn unregister_buffer(&self, buffer_ptr: u64) -> i32 {
        self.registered.lock().remove(&buffer_ptr);
        0
    }

    /// Stores `size` bytes at `buffer_ptr` (the shared pool, or mapped memory staged
    /// through it) under `key`. 0, or a negative error code.
    #[pyo3(signature = (key, buffer_ptr, size, config=None))]
    fn put_from(
        &self,
        py: Python<'_>,
        key: String,
        buffer_ptr: u64,
        size: u64,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> i32 {
        self.put_from_many(py, vec![key], vec![buffer_ptr], vec![size], config, false)[0]
    }

    /// Like `put_from`, but overwrites an existing key. 0, or a negative error code.
    #[pyo3(signature = (key, buffer_ptr, size, config=None))]
    fn upsert_from(
        &self,
        py: Python<'_>,
        key: String,
        buffer_ptr: u64,
        size: u64,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> i32 {
        self.put_from_many(py, vec![key], vec![buffer_ptr], vec![size], config, true)[0]
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

    /// Bytes read, or a negative code (`-704` miss, `-600` too small / unmapped).
    #[pyo3(signature = (key, buffer_ptr, size))]
    fn get_into(&self, py: Python<'_>, key: String, buffer_ptr: u64, size: u64) -> i64 {
        self.batch_get_into(py, vec![key], vec![buffer_ptr], vec![size])[0]
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
        let n = keys.len();
        if buffer_ptrs.len() != n || sizes.len() != n {
            return vec![i64::from(INVALID); n];
        }
        if buffer_ptrs
            .iter()
            .zip(&sizes)
            .any(|(&p, &s)| !self.caller_ok(p, s, true))
        {
            return vec![i64::from(INVALID); n];
        }
        let reads: Vec<(String, u64, u64)> = keys
            .into_iter()
            .zip(buffer_ptrs)
            .zip(sizes)
            .map(|((k, p), s)| (k, p, s))
            .collect();
        let d = self.inner.clone();
        py.detach(|| d.get_into_many(&reads))
    }

    /// Each object is the concatenation of its buffers (the shared pool, or mapped memory
    /// staged through it); 0 or a negative code per key.
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
        if all_buffer_ptrs.len() != n || all_sizes.len() != n {
            return vec![INVALID; n];
        }
        let mut cfg = match config_of(config) {
            Ok(c) => c,
            Err(e) => return vec![e.code(); n],
        };
        // As on a store: the placement does not know the writer, so the flag is dropped.
        cfg.prefer_alloc_in_same_node = false;
        let parts = |i: usize| {
            crate::store::parts_of(&all_buffer_ptrs[i], &all_sizes[i], |p, l| {
                // SAFETY: the caller-memory contract holds every source for this call, which
                // the slices do not outlive.
                unsafe { self.caller_src(p, l) }.ok_or(ErrorCode::InvalidParams)
            })
        };
        let d = self.inner.clone();
        crate::store::put_accepted(&keys, parts, |at, ks, objects| {
            if ks.is_empty() {
                return Vec::new();
            }
            let cfg = cfg.for_items(n, at);
            let objects: Vec<&[Src<'_>]> = objects.iter().map(Vec::as_slice).collect();
            py.detach(|| d.put_many_parts(ks, &objects, &cfg, false))
        })
    }

    /// Scatters each object into its buffers in order (zero copy where they lie in the shared
    /// pool); bytes read per key, or a negative code (`-600` when the buffers are too small).
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
        let n = keys.len();
        if all_buffer_ptrs.len() != n || all_sizes.len() != n {
            return vec![i64::from(INVALID); n];
        }
        let d = self.inner.clone();
        py.detach(|| {
            let sizes = d.get_sizes(&keys);
            let mut out = sizes.clone();
            // (key index, key, offset in the object, destination, length)
            let mut pieces = Vec::new();
            for (i, &size) in sizes.iter().enumerate() {
                if size < 0 {
                    continue;
                }
                let planned =
                    client::store::scatter(size as u64, &all_buffer_ptrs[i], &all_sizes[i]);
                match planned {
                    Ok(p)
                        if p.iter()
                            .all(|&(_, ptr, len)| self.caller_ok(ptr, len, true)) =>
                    {
                        pieces.extend(
                            p.into_iter()
                                .map(|(at, ptr, take)| (i, (keys[i].clone(), at, ptr, take))),
                        );
                    }
                    _ => out[i] = i64::from(INVALID),
                }
            }
            let (owners, reads): (Vec<usize>, Vec<_>) = pieces.into_iter().unzip();
            // SAFETY: every destination was checked mapped writable above; the caller owns it
            // for the call (the caller-memory contract of every `*_into` method).
            for (i, g) in owners.into_iter().zip(unsafe { d.read_ranges(&reads) }) {
                if g < 0 && out[i] >= 0 {
                    out[i] = g;
                }
            }
            out
        })
    }

    /// Ranged reads into registered buffers (the shared pool, or `register_buffer` ranges), as
    /// the store's: `result[b][k][f]` is the bytes read or a negative code.
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
        py.detach(|| {
            client::store::ranges::get_into_ranges(
                Some(self),
                &buffer_ptrs,
                &all_keys,
                &all_dst_offsets,
                &all_src_offsets,
                &all_sizes,
            )
        })
    }

    /// Internal (`_cluster_ops`): a copy task (`source` `None`) or a move task, made by the
    /// standalone client: `((hi, lo), 0)` or `((0, 0), code)`.
    #[pyo3(signature = (key, targets, source, /))]
    fn _create_task(
        &self,
        py: Python<'_>,
        key: String,
        targets: Vec<String>,
        source: Option<String>,
    ) -> ((u64, u64), i32) {
        let d = self.inner.clone();
        match py.detach(|| d.create_task(&key, &targets, source.as_deref())) {
            Ok(id) => ((id.hi, id.lo), 0),
            Err(e) => ((0, 0), e.code()),
        }
    }

    /// Internal (`_cluster_ops.query_task`): as the store's.
    #[pyo3(signature = (hi, lo, /))]
    fn _query_task(&self, py: Python<'_>, hi: u64, lo: u64) -> (i32, Option<TaskFields>) {
        let d = self.inner.clone();
        match py.detach(|| d.query_task(protocol::Uuid::from_parts(hi, lo))) {
            Ok(t) => (0, Some(task_fields(t))),
            Err(e) => (e.code(), None),
        }
    }

    /// Stores caller memory (the shared pool, or mapped) that already holds a tensor object
    /// `[TensorMetadata][data]` (validated), as the store's.
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

    /// Internal (tensor layer), as the store's: a copy of `size` bytes of caller memory (the
    /// shared pool, or mapped readable), or `None` for a range that is neither.
    #[pyo3(signature = (buffer_ptr, size))]
    fn _read_registered<'py>(
        &self,
        py: Python<'py>,
        buffer_ptr: u64,
        size: u64,
    ) -> Option<Bound<'py, PyBytes>> {
        // SAFETY: the caller-memory contract holds the source for this call; the range is
        // copied into a new bytes object at once.
        let src = unsafe { self.caller_src(buffer_ptr, size) }?;
        PyBytes::new_with(py, src.len(), |b| {
            src.copy_to(&mut Dst::from(b));
            Ok(())
        })
        .ok()
    }

    /// Internal (parallel reads), as the store's: copies `data` to caller memory at
    /// `buffer_ptr` (the shared pool, or mapped writable); its length, or -600.
    #[pyo3(signature = (buffer_ptr, data))]
    fn _write_caller(&self, buffer_ptr: u64, data: &[u8]) -> i64 {
        let len = data.len() as u64;
        if !self.caller_ok(buffer_ptr, len, true) {
            return i64::from(INVALID);
        }
        if len > 0 {
            // SAFETY: checked mapped writable above; the caller-memory contract gives the
            // destination to this call, and `data` (a Python bytes object) cannot overlap it
            // while the caller keeps that contract.
            unsafe {
                std::ptr::copy_nonoverlapping(data.as_ptr(), buffer_ptr as *mut u8, data.len())
            };
        }
        len as i64
    }
}

impl PyDummy {
    /// Caller memory `[ptr, ptr + size)` as a range to read, when mapped readable (checked
    /// here).
    ///
    /// # Safety
    /// While the range is used the memory stays mapped and no Rust reference writes it: the
    /// caller-memory contract of every `*_from` method, which holds for the call that asked
    /// for it.
    unsafe fn caller_src(&self, ptr: u64, size: u64) -> Option<Src<'_>> {
        if !self.caller_ok(ptr, size, false) {
            return None;
        }
        // SAFETY: checked mapped readable above (an empty range is not dereferenced); that it
        // stays so for the range's life is this function's contract.
        Some(unsafe { Src::from_raw(ptr as *const u8, usize::try_from(size).ok()?) })
    }

    fn tensor_from_many(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        ptrs: Vec<u64>,
        sizes: Vec<u64>,
        upsert: bool,
    ) -> Vec<i32> {
        let n = keys.len();
        if ptrs.len() != n || sizes.len() != n {
            return vec![INVALID; n];
        }
        // SAFETY: the caller-memory contract holds every source for this call, which the
        // ranges do not outlive.
        let object = |i: usize| match unsafe { self.caller_src(ptrs[i], sizes[i]) } {
            Some(data) if crate::store::is_tensor_object(data, sizes[i]) => Ok(Some(vec![data])),
            _ => Err(ErrorCode::InvalidParams),
        };
        let cfg = ReplicateConfig::default();
        let d = self.inner.clone();
        crate::store::put_accepted(&keys, object, |_, ks, objects| {
            let objects: Vec<&[Src<'_>]> = objects.iter().map(Vec::as_slice).collect();
            py.detach(|| d.put_many_parts(ks, &objects, &cfg, upsert))
        })
    }

    /// A `BufferHandle` per key holding its bytes, `None` for a miss or an error.
    fn buffers<'py>(
        &self,
        py: Python<'py>,
        keys: &[String],
    ) -> PyResult<Vec<Option<Bound<'py, PyAny>>>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let d = self.inner.clone();
        let got = py.detach(|| d.get_many(keys));
        got.into_iter()
            .map(|r| {
                let Ok(bytes) = r else { return Ok(None) };
                let (handle, fresh) = crate::new_buffer_handle(py, bytes.len())?;
                // SAFETY: `handle` is alive until after the copy and is the only reference to
                // the new object; no Rust reference touches its bytes.
                Src::from(&bytes[..]).copy_to(&mut unsafe { fresh.into_dst() });
                Ok(Some(handle))
            })
            .collect()
    }

    fn put_batch_impl(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        values: Vec<Bound<'_, PyAny>>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
        upsert: bool,
    ) -> PyResult<i32> {
        if keys.len() != values.len() {
            return Ok(INVALID);
        }
        let pinned: Vec<Pinned> = values
            .iter()
            .map(|v| Pinned::bytes(v))
            .collect::<PyResult<_>>()?;
        let slices: Vec<Src<'_>> = pinned.iter().map(Pinned::src).collect();
        let cfg = match config_of(config) {
            Ok(c) => c,
            Err(e) => return Ok(e.code()),
        };
        let d = self.inner.clone();
        let codes = py.detach(|| d.put_many(&keys, &slices, &cfg, upsert));
        Ok(first_failure(&codes))
    }
}

fn pin_parts(parts: &[Bound<'_, PyAny>]) -> PyResult<Vec<Pinned>> {
    parts.iter().map(|p| Pinned::one_d_bytes(p)).collect()
}
