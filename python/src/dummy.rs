//! `_DummyClient`: what `MooncakeDistributedStore.setup_dummy` switches a store to (see
//! `mooncake/_cluster_ops.py`). It forwards to a standalone `mooncake_client` on this host
//! through `client::dummy` (a unix socket and a shared memory region); return values follow
//! the store methods of the same names. The methods both classes share are written once, in
//! [`crate::api`], over the dummy client's `client::store::api::StoreApi`; this file holds
//! what only a dummy does: connecting, reads into new Python objects through the shared
//! region, and its own list of registered buffers.

use std::collections::BTreeMap;
use std::sync::Arc;

use client::dummy::DummyClient;
use client::store::api::StoreApi;
use dataplane::mem::Src;
use parking_lot::Mutex;
use protocol::ErrorCode;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use crate::api::{Backend, INVALID};
use client::store::ranges::{Fragment, RangeSource};

/// A dummy client; see the module docs.
#[pyclass(name = "_DummyClient", module = "mooncake._native", frozen)]
pub struct PyDummy {
    inner: Arc<DummyClient>,
    /// `register_buffer` ranges, start to length: the buffers `get_into_ranges` may fill
    /// besides the shared region.
    registered: Mutex<BTreeMap<u64, u64>>,
}

impl Backend for PyDummy {
    fn api(&self) -> Option<Arc<dyn StoreApi>> {
        Some(self.inner.clone())
    }
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
    /// What `get_into_ranges` reads through (`upstream_methods!`): the dummy itself, which
    /// knows its region and registered buffers.
    fn range_source(&self) -> Option<&PyDummy> {
        Some(self)
    }

    /// Caller memory `[ptr, ptr + size)`, when mapped (readable, and writable with `write`).
    fn caller_ok(&self, ptr: u64, size: u64, write: bool) -> bool {
        size == 0
            || self.inner.in_region(ptr, size)
            || client::store::mapped::is_mapped(ptr, size, write)
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
}

crate::api::upstream_methods!(PyDummy, {
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
});
