//! Upstream's store methods, written once for both Python classes that serve them:
//! `MooncakeDistributedStore` ([`crate::store::PyStore`], over a `client::Store`) and
//! `_DummyClient` ([`crate::dummy::PyDummy`], over a `client::dummy::DummyClient`). Both reach
//! their backend as a [`client::store::api::StoreApi`] through [`Backend`], and
//! [`upstream_methods!`] generates the same `#[pymethods]` for each, so the argument checks,
//! batch splitting and return codes of the two cannot drift apart. What differs between them
//! (set-up, reads into new Python objects, registration, sessions) stays in each class's own
//! file.
//!
//! A store that is not set up has no backend: each method then answers its failure value
//! (`-600`, `None`, `[]`), as upstream's does. Caller addresses follow the caller-memory
//! contract of `store.rs`'s module doc, which every `unsafe` here cites.

use std::sync::Arc;

use client::store::api::{is_tensor_object, parts_of, put_accepted, Staging, StoreApi};
use client::store::{Src, StoreError};
use protocol::{ErrorCode, ReplicateConfig};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyList;

use crate::pybuf::Pinned;
use crate::types::PyReplicateConfig;

pub(crate) const INVALID: i32 = ErrorCode::InvalidParams as i32;

/// A class that serves upstream's store methods through a [`StoreApi`].
pub(crate) trait Backend {
    /// The backend, or `None` when there is none (a store not set up).
    fn api(&self) -> Option<Arc<dyn StoreApi>>;
}

/// The number Python gets for a result: 0, or the failure's code after [`failed`] logged it.
pub(crate) fn rc(r: Result<(), impl Into<StoreError>>) -> i32 {
    match r {
        Ok(()) => 0,
        Err(e) => failed(e.into()),
    }
}

/// The code of `e`, after logging why it happened, so a `-800` in Python has its reason on
/// stderr: an error line, as upstream logs a failed put or remove, except for a missing key
/// (debug: a get or lookup of one is how callers test for it). A bare code from a path that
/// gives no cause yet is not logged, since the line would say no more than the number.
pub(crate) fn failed(e: StoreError) -> i32 {
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
pub(crate) fn rc_i64(r: Result<u64, impl Into<StoreError>>) -> i64 {
    match r {
        Ok(n) => i64::try_from(n).unwrap_or(i64::MAX),
        Err(e) => i64::from(failed(e.into())),
    }
}

/// A replicate config argument, resolved before the GIL is released.
pub(crate) struct Cfg {
    pub(crate) wire: Result<ReplicateConfig, ErrorCode>,
    group_ids: Option<usize>,
}

impl Cfg {
    pub(crate) fn of(config: Option<PyRef<'_, PyReplicateConfig>>) -> Cfg {
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
    pub(crate) fn for_batch(&self, n: usize) -> Result<&ReplicateConfig, ErrorCode> {
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
    pub(crate) fn single(&self) -> Result<&ReplicateConfig, ErrorCode> {
        if self.group_ids.is_some_and(|g| g != 1) {
            return Err(ErrorCode::InvalidParams);
        }
        self.wire.as_ref().map_err(|e| *e)
    }
}

/// One object from bytes-like `parts`, bounded by the local buffer.
pub(crate) fn put_one(
    api: Option<Arc<dyn StoreApi>>,
    py: Python<'_>,
    key: &str,
    parts: &[Pinned],
    config: Option<PyRef<'_, PyReplicateConfig>>,
    upsert: bool,
) -> i32 {
    let Some(s) = api else {
        return INVALID;
    };
    let cfg = Cfg::of(config);
    let slices: Vec<Src<'_>> = parts.iter().map(Pinned::src).collect();
    rc(py.detach(|| s.api_put(key, &slices, cfg.single()?, upsert, Staging::Budgeted)))
}

/// Batch put of objects given as lists of parts; one result per key. `keys` are the items
/// at indices `at` of the caller's batch of `n` keys (`None`: all of them, in order), so
/// that `cfg`'s `group_ids`, one per key of the batch, follow their keys.
#[allow(clippy::too_many_arguments)]
pub(crate) fn put_many(
    s: &dyn StoreApi,
    py: Python<'_>,
    (n, at): (usize, Option<&[usize]>),
    keys: &[String],
    parts: &[Vec<Src<'_>>],
    cfg: &Cfg,
    upsert: bool,
    staging: Staging,
) -> Vec<i32> {
    if keys.len() != parts.len() {
        return vec![INVALID; keys.len()];
    }
    if keys.is_empty() {
        return Vec::new();
    }
    py.detach(|| {
        let cfg = match at {
            Some(at) => cfg.for_items(n, at),
            None => cfg.for_batch(n).cloned(),
        };
        match cfg {
            Ok(cfg) => s
                .api_put_many(keys, parts, &cfg, upsert, staging)
                .into_iter()
                .map(rc)
                .collect(),
            Err(e) => vec![e.code(); keys.len()],
        }
    })
}

/// `put_batch` / `upsert_batch`: one code for the batch, the first failure's.
pub(crate) fn put_values(
    api: Option<Arc<dyn StoreApi>>,
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
    let Some(s) = api else {
        return Ok(INVALID);
    };
    let pinned = pin_all(values.as_any(), false)?;
    let parts: Vec<Vec<Src<'_>>> = pinned.iter().map(|p| vec![p.src()]).collect();
    let n = keys.len();
    let cfg = Cfg::of(config);
    let r = put_many(
        &*s,
        py,
        (n, None),
        &keys,
        &parts,
        &cfg,
        upsert,
        Staging::Budgeted,
    );
    Ok(r.into_iter().find(|c| *c != 0).unwrap_or(0))
}

/// `_put_parts_batch`: each object the concatenation of a list of 1-D byte buffers.
pub(crate) fn put_parts_batch(
    api: Option<Arc<dyn StoreApi>>,
    py: Python<'_>,
    keys: Vec<String>,
    parts_list: &Bound<'_, PyAny>,
    config: Option<PyRef<'_, PyReplicateConfig>>,
    upsert: bool,
) -> PyResult<Vec<i32>> {
    let objects = list_of_values(parts_list)?;
    let Some(s) = api.filter(|_| objects.len() == keys.len()) else {
        return Ok(vec![INVALID; keys.len()]);
    };
    let pinned: Vec<Vec<Pinned>> = objects
        .iter()
        .map(|o| pin_all(&o, true))
        .collect::<PyResult<_>>()?;
    let parts: Vec<Vec<Src<'_>>> = pinned
        .iter()
        .map(|ps| ps.iter().map(Pinned::src).collect())
        .collect();
    let (n, cfg) = (keys.len(), Cfg::of(config));
    Ok(put_many(
        &*s,
        py,
        (n, None),
        &keys,
        &parts,
        &cfg,
        upsert,
        Staging::Budgeted,
    ))
}

/// `put_from` / `upsert_from`: `size` bytes of caller memory; an empty one is not put (0, as
/// upstream).
pub(crate) fn put_from(
    api: Option<Arc<dyn StoreApi>>,
    py: Python<'_>,
    key: &str,
    (ptr, size): (u64, u64),
    config: Option<PyRef<'_, PyReplicateConfig>>,
    upsert: bool,
) -> i32 {
    let Some(s) = api else {
        return INVALID;
    };
    if size == 0 {
        return 0;
    }
    let cfg = Cfg::of(config);
    rc(py.detach(|| {
        let data = s.api_caller_range(ptr, size, false)?;
        // SAFETY: the caller-memory contract holds the source until the put returns; the
        // range dies with it.
        let parts = [unsafe { data.src() }];
        s.api_put(key, &parts, cfg.single()?, upsert, Staging::Direct)
    }))
}

/// Zero-copy batch put from caller memory: unchecked ranges fail their own key only; an empty
/// one is not put (0, as upstream).
pub(crate) fn put_from_many(
    api: Option<Arc<dyn StoreApi>>,
    py: Python<'_>,
    keys: Vec<String>,
    (ptrs, sizes): (Vec<u64>, Vec<u64>),
    config: Option<PyRef<'_, PyReplicateConfig>>,
    upsert: bool,
) -> Vec<i32> {
    let n = keys.len();
    let Some(s) = api.filter(|_| ptrs.len() == n && sizes.len() == n) else {
        return vec![INVALID; n];
    };
    let cfg = Cfg::of(config);
    if let Err(e) = cfg.for_batch(n) {
        return vec![e.code(); n];
    }
    let object = |i: usize| {
        if sizes[i] == 0 {
            return Ok(None);
        }
        let r = s.api_caller_range(ptrs[i], sizes[i], false)?;
        // SAFETY: the caller-memory contract holds the source for this call, which the
        // objects do not outlive.
        Ok(Some(vec![unsafe { r.into_src() }]))
    };
    put_accepted(&keys, object, |at, ks, ps| {
        put_many(
            &*s,
            py,
            (n, Some(at)),
            ks,
            ps,
            &cfg,
            upsert,
            Staging::Direct,
        )
    })
}

/// `batch_put_from_multi_buffers`: each object the concatenation of its buffers.
pub(crate) fn put_from_multi_buffers(
    s: &dyn StoreApi,
    py: Python<'_>,
    keys: Vec<String>,
    (all_ptrs, all_sizes): (Vec<Vec<u64>>, Vec<Vec<u64>>),
    config: Option<PyRef<'_, PyReplicateConfig>>,
) -> Vec<i32> {
    let n = keys.len();
    if all_ptrs.len() != n || all_sizes.len() != n {
        return vec![INVALID; n];
    }
    let mut cfg = Cfg::of(config);
    // This call is the one that honours `prefer_alloc_in_same_node` upstream. Our allocator
    // does not know the writer (`State::place` chooses by free space and strategy only), and
    // the master refuses the flag on the single-key forms, so it is dropped here rather than
    // refused: the put still succeeds, placed as any other.
    if let Ok(c) = cfg.wire.as_mut() {
        c.prefer_alloc_in_same_node = false;
    }
    let parts = |i: usize| {
        parts_of(&all_ptrs[i], &all_sizes[i], |p, l| {
            let r = s.api_caller_range(p, l, false)?;
            // SAFETY: the caller-memory contract holds every source for this call, which the
            // objects do not outlive.
            Ok(unsafe { r.into_src() })
        })
    };
    put_accepted(&keys, parts, |at, ks, ps| {
        put_many(s, py, (n, Some(at)), ks, ps, &cfg, false, Staging::Direct)
    })
}

/// `put_tensor_from` and its forms: caller memory that holds `[TensorMetadata][data]`
/// (validated).
pub(crate) fn tensor_from_many(
    api: Option<Arc<dyn StoreApi>>,
    py: Python<'_>,
    keys: Vec<String>,
    (ptrs, sizes): (Vec<u64>, Vec<u64>),
    upsert: bool,
) -> Vec<i32> {
    let n = keys.len();
    let Some(s) = api.filter(|_| ptrs.len() == n && sizes.len() == n) else {
        return vec![INVALID; n];
    };
    let object = |i: usize| {
        let r = s.api_caller_range(ptrs[i], sizes[i], false)?;
        // SAFETY: the caller-memory contract holds every source for this call, which the
        // objects do not outlive.
        let data = unsafe { r.into_src() };
        if !is_tensor_object(data, sizes[i]) {
            return Err(ErrorCode::InvalidParams);
        }
        Ok(Some(vec![data]))
    };
    let cfg = Cfg::of(None);
    put_accepted(&keys, object, |at, ks, ps| {
        put_many(
            &*s,
            py,
            (n, Some(at)),
            ks,
            ps,
            &cfg,
            upsert,
            Staging::Direct,
        )
    })
}

pub(crate) fn pin_all(values: &Bound<'_, PyAny>, one_d: bool) -> PyResult<Vec<Pinned>> {
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

/// The `#[pymethods]` of a class that implements [`Backend`]: its own methods (`$own`, what
/// only it has) and the ones both classes share, written here once. Each shared method's doc
/// is the Python docstring of both. (pyo3 takes one `#[pymethods]` block per class, hence
/// one macro around both halves.)
macro_rules! upstream_methods {
    ($class:ty, { $($own:tt)* }) => {
        #[pyo3::pymethods]
        impl $class {
            $($own)*

            /// 0 healthy, 1 not set up or closed, 2 master unreachable (a dummy: its
            /// standalone client's answer).
            #[pyo3(signature = (/))]
            fn health_check(&self, py: Python<'_>) -> i32 {
                match $crate::api::Backend::api(self) {
                    None => 1,
                    Some(s) => py.detach(|| s.api_health()),
                }
            }

            /// The `host:port` this client is known by (its segment's name; a dummy's
            /// standalone client's); `""` before `setup`.
            #[pyo3(signature = (/))]
            fn get_hostname(&self) -> String {
                $crate::api::Backend::api(self)
                    .map(|s| s.api_hostname())
                    .unwrap_or_default()
            }

            /// Stores `value` (bytes-like) under `key`; an existing key is success and stays
            /// unchanged. 0, or a negative error code (`ErrorCode`); the reason of a failure
            /// is logged.
            #[pyo3(signature = (key, value, config=None))]
            fn put(
                &self,
                py: Python<'_>,
                key: &str,
                value: &Bound<'_, PyAny>,
                config: Option<PyRef<'_, $crate::types::PyReplicateConfig>>,
            ) -> PyResult<i32> {
                let v = [$crate::pybuf::Pinned::bytes(value)?];
                let api = $crate::api::Backend::api(self);
                Ok($crate::api::put_one(api, py, key, &v, config, false))
            }

            /// Like `put`, but overwrites an existing key. 0, or a negative error code.
            #[pyo3(signature = (key, value, config=None))]
            fn upsert(
                &self,
                py: Python<'_>,
                key: &str,
                value: &Bound<'_, PyAny>,
                config: Option<PyRef<'_, $crate::types::PyReplicateConfig>>,
            ) -> PyResult<i32> {
                let v = [$crate::pybuf::Pinned::bytes(value)?];
                let api = $crate::api::Backend::api(self);
                Ok($crate::api::put_one(api, py, key, &v, config, true))
            }

            /// Stores the concatenation of `parts` (1-D bytes-like) under `key`, without
            /// joining them first. 0, or a negative error code.
            #[pyo3(signature = (key, *parts, config=None))]
            fn put_parts(
                &self,
                py: Python<'_>,
                key: &str,
                parts: &Bound<'_, pyo3::types::PyTuple>,
                config: Option<PyRef<'_, $crate::types::PyReplicateConfig>>,
            ) -> PyResult<i32> {
                let pinned = $crate::api::pin_all(parts.as_any(), true)?;
                let api = $crate::api::Backend::api(self);
                Ok($crate::api::put_one(api, py, key, &pinned, config, false))
            }

            /// Like `put_parts`, but overwrites an existing key. 0, or a negative error code.
            #[pyo3(signature = (key, *parts, config=None))]
            fn upsert_parts(
                &self,
                py: Python<'_>,
                key: &str,
                parts: &Bound<'_, pyo3::types::PyTuple>,
                config: Option<PyRef<'_, $crate::types::PyReplicateConfig>>,
            ) -> PyResult<i32> {
                let pinned = $crate::api::pin_all(parts.as_any(), true)?;
                let api = $crate::api::Backend::api(self);
                Ok($crate::api::put_one(api, py, key, &pinned, config, true))
            }

            /// One return code for the whole batch (0, or the first failure).
            #[pyo3(signature = (keys, values, config=None))]
            fn put_batch(
                &self,
                py: Python<'_>,
                keys: Vec<String>,
                values: &Bound<'_, PyAny>,
                config: Option<PyRef<'_, $crate::types::PyReplicateConfig>>,
            ) -> PyResult<i32> {
                let api = $crate::api::Backend::api(self);
                $crate::api::put_values(api, py, keys, values, config, false)
            }

            /// Like `put_batch`, but overwrites existing keys. 0, or the first failure's code.
            #[pyo3(signature = (keys, values, config=None))]
            fn upsert_batch(
                &self,
                py: Python<'_>,
                keys: Vec<String>,
                values: &Bound<'_, PyAny>,
                config: Option<PyRef<'_, $crate::types::PyReplicateConfig>>,
            ) -> PyResult<i32> {
                let api = $crate::api::Backend::api(self);
                $crate::api::put_values(api, py, keys, values, config, true)
            }

            /// Internal (tensor layer): batch put where each object is the concatenation of a
            /// list of 1-D byte buffers; one return code per key.
            #[pyo3(signature = (keys, parts_list, config=None, upsert=false))]
            fn _put_parts_batch(
                &self,
                py: Python<'_>,
                keys: Vec<String>,
                parts_list: &Bound<'_, PyAny>,
                config: Option<PyRef<'_, $crate::types::PyReplicateConfig>>,
                upsert: bool,
            ) -> PyResult<Vec<i32>> {
                let api = $crate::api::Backend::api(self);
                $crate::api::put_parts_batch(api, py, keys, parts_list, config, upsert)
            }

            /// The object's size in bytes, or a negative error code (`-704` for a missing key).
            #[pyo3(signature = (key, /))]
            fn get_size(&self, py: Python<'_>, key: &str) -> i64 {
                let Some(s) = $crate::api::Backend::api(self) else {
                    return i64::from($crate::api::INVALID);
                };
                let keys = [key.to_string()];
                let r = py.detach(|| s.api_sizes(&keys).pop());
                $crate::api::rc_i64(r.unwrap_or(Err(protocol::ErrorCode::InternalError.into())))
            }

            /// 1 exists, 0 not, or a negative error code.
            #[pyo3(signature = (key, /))]
            fn is_exist(&self, py: Python<'_>, key: &str) -> i32 {
                self.batch_is_exist(py, vec![key.to_string()])[0]
            }

            /// Per key: 1 exists, 0 not, or a negative error code.
            #[pyo3(signature = (keys))]
            fn batch_is_exist(&self, py: Python<'_>, keys: Vec<String>) -> Vec<i32> {
                let Some(s) = $crate::api::Backend::api(self) else {
                    return vec![$crate::api::INVALID; keys.len()];
                };
                let found = |r: Result<bool, _>| match r {
                    Ok(b) => i32::from(b),
                    Err(e) => $crate::api::failed(e),
                };
                py.detach(|| s.api_exist(&keys).into_iter().map(found).collect())
            }

            /// Removes `key` (`force` also removes it while a reader holds a lease). 0, or a
            /// negative error code (`-706` while leased).
            #[pyo3(signature = (key, force=false))]
            fn remove(&self, py: Python<'_>, key: &str, force: bool) -> i32 {
                match $crate::api::Backend::api(self) {
                    None => $crate::api::INVALID,
                    Some(s) => $crate::api::rc(py.detach(|| s.api_remove_one(key, force))),
                }
            }

            /// Removes each key as `remove` does; 0 or a negative error code per key.
            #[pyo3(signature = (keys, force=false))]
            fn batch_remove(&self, py: Python<'_>, keys: Vec<String>, force: bool) -> Vec<i32> {
                let Some(s) = $crate::api::Backend::api(self) else {
                    return vec![$crate::api::INVALID; keys.len()];
                };
                py.detach(|| {
                    let r = s.api_remove(&keys, force);
                    r.into_iter().map($crate::api::rc).collect()
                })
            }

            /// Removes the keys matching `regex_pattern`; the number removed, or a negative
            /// code (`-600` for an invalid pattern).
            #[pyo3(signature = (regex_pattern, force=false))]
            fn remove_by_regex(&self, py: Python<'_>, regex_pattern: &str, force: bool) -> i64 {
                match $crate::api::Backend::api(self) {
                    None => i64::from($crate::api::INVALID),
                    Some(s) => {
                        $crate::api::rc_i64(py.detach(|| s.api_remove_by_regex(regex_pattern, force)))
                    }
                }
            }

            /// Removes every object; the number removed, or a negative error code.
            #[pyo3(signature = (force=false))]
            fn remove_all(&self, py: Python<'_>, force: bool) -> i64 {
                match $crate::api::Backend::api(self) {
                    None => i64::from($crate::api::INVALID),
                    Some(s) => $crate::api::rc_i64(py.detach(|| s.api_remove_all(force))),
                }
            }

            /// Stores `size` bytes at `buffer_ptr` (registered memory, or mapped readable; a
            /// dummy stages it through its shared pool) under `key`, with no copy through
            /// Python. 0 (also for `size == 0`, which stores nothing), or a negative error code.
            #[pyo3(signature = (key, buffer_ptr, size, config=None))]
            fn put_from(
                &self,
                py: Python<'_>,
                key: &str,
                buffer_ptr: u64,
                size: u64,
                config: Option<PyRef<'_, $crate::types::PyReplicateConfig>>,
            ) -> i32 {
                let api = $crate::api::Backend::api(self);
                $crate::api::put_from(api, py, key, (buffer_ptr, size), config, false)
            }

            /// Like `put_from`, but overwrites an existing key. 0, or a negative error code.
            #[pyo3(signature = (key, buffer_ptr, size, config=None))]
            fn upsert_from(
                &self,
                py: Python<'_>,
                key: &str,
                buffer_ptr: u64,
                size: u64,
                config: Option<PyRef<'_, $crate::types::PyReplicateConfig>>,
            ) -> i32 {
                let api = $crate::api::Backend::api(self);
                $crate::api::put_from(api, py, key, (buffer_ptr, size), config, true)
            }

            /// `put_from` for many keys in one batch; 0 or a negative error code per key.
            #[pyo3(signature = (keys, buffer_ptrs, sizes, config=None))]
            fn batch_put_from(
                &self,
                py: Python<'_>,
                keys: Vec<String>,
                buffer_ptrs: Vec<u64>,
                sizes: Vec<u64>,
                config: Option<PyRef<'_, $crate::types::PyReplicateConfig>>,
            ) -> Vec<i32> {
                let api = $crate::api::Backend::api(self);
                $crate::api::put_from_many(api, py, keys, (buffer_ptrs, sizes), config, false)
            }

            /// `upsert_from` for many keys in one batch; 0 or a negative error code per key.
            #[pyo3(signature = (keys, buffer_ptrs, sizes, config=None))]
            fn batch_upsert_from(
                &self,
                py: Python<'_>,
                keys: Vec<String>,
                buffer_ptrs: Vec<u64>,
                sizes: Vec<u64>,
                config: Option<PyRef<'_, $crate::types::PyReplicateConfig>>,
            ) -> Vec<i32> {
                let api = $crate::api::Backend::api(self);
                $crate::api::put_from_many(api, py, keys, (buffer_ptrs, sizes), config, true)
            }

            /// Each object is the concatenation of its buffers; 0 or a negative code per key
            /// (`[]` when not set up).
            #[pyo3(signature = (keys, all_buffer_ptrs, all_sizes, config=None))]
            fn batch_put_from_multi_buffers(
                &self,
                py: Python<'_>,
                keys: Vec<String>,
                all_buffer_ptrs: Vec<Vec<u64>>,
                all_sizes: Vec<Vec<u64>>,
                config: Option<PyRef<'_, $crate::types::PyReplicateConfig>>,
            ) -> Vec<i32> {
                let Some(s) = $crate::api::Backend::api(self) else {
                    return Vec::new();
                };
                let buffers = (all_buffer_ptrs, all_sizes);
                $crate::api::put_from_multi_buffers(&*s, py, keys, buffers, config)
            }

            /// Bytes read, or a negative code (`-704` miss, `-600` too small / not caller
            /// memory).
            #[pyo3(signature = (key, buffer_ptr, size))]
            fn get_into(&self, py: Python<'_>, key: String, buffer_ptr: u64, size: u64) -> i64 {
                let Some(s) = $crate::api::Backend::api(self) else {
                    return i64::from($crate::api::INVALID);
                };
                // SAFETY: the caller-memory contract covers the destination.
                $crate::api::rc_i64(py.detach(|| unsafe { s.api_get_into(&key, buffer_ptr, size) }))
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
                let Some(s) = $crate::api::Backend::api(self) else {
                    return vec![i64::from($crate::api::INVALID); keys.len()];
                };
                py.detach(|| {
                    // SAFETY: the caller-memory contract covers every destination.
                    let r = unsafe { s.api_get_into_many(&keys, &buffer_ptrs, &sizes) };
                    r.into_iter().map($crate::api::rc_i64).collect()
                })
            }

            /// Scatters each object into its buffers in order; bytes read per key, or a
            /// negative code (`-600` when the buffers are too small).
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
                let Some(s) = $crate::api::Backend::api(self) else {
                    return vec![i64::from($crate::api::INVALID); keys.len()];
                };
                py.detach(|| {
                    // SAFETY: the caller-memory contract covers every destination.
                    let r = unsafe {
                        s.api_get_into_multi_buffers(&keys, &all_buffer_ptrs, &all_sizes)
                    };
                    r.into_iter().map($crate::api::rc_i64).collect()
                })
            }

            /// Ranged reads into registered memory: `result[b][k][f]` is the bytes read for
            /// fragment `f` of key `k` into buffer `b`, or a negative code. A key's fragments
            /// fail together when its offset and size lists disagree in length; a missing key
            /// fails only its own fragments.
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
                let source = self.range_source();
                py.detach(|| {
                    client::store::ranges::get_into_ranges(
                        source.as_deref(),
                        &buffer_ptrs,
                        &all_keys,
                        &all_dst_offsets,
                        &all_src_offsets,
                        &all_sizes,
                    )
                })
            }

            /// Internal (`_cluster_ops.create_copy_task` / `create_move_task`): `((hi, lo), 0)`
            /// or `((0, 0), code)`; a move when `source` is given. See `client::store::tasks`.
            #[pyo3(signature = (key, targets, source, /))]
            fn _create_task(
                &self,
                py: Python<'_>,
                key: String,
                targets: Vec<String>,
                source: Option<String>,
            ) -> ((u64, u64), i32) {
                let Some(s) = $crate::api::Backend::api(self) else {
                    return ((0, 0), $crate::api::INVALID);
                };
                match py.detach(|| s.api_create_task(&key, &targets, source.as_deref())) {
                    Ok(id) => ((id.hi, id.lo), 0),
                    Err(e) => ((0, 0), $crate::api::failed(e)),
                }
            }

            /// Internal (`_cluster_ops.query_task`): `(0, (id, type, status,
            /// created_at_ms_epoch, last_updated_at_ms_epoch, assigned_client, message))`, or
            /// `(code, None)`.
            #[pyo3(signature = (hi, lo, /))]
            fn _query_task(
                &self,
                py: Python<'_>,
                hi: u64,
                lo: u64,
            ) -> (i32, Option<$crate::store::TaskFields>) {
                let Some(s) = $crate::api::Backend::api(self) else {
                    return ($crate::api::INVALID, None);
                };
                match py.detach(|| s.api_query_task(protocol::Uuid::from_parts(hi, lo))) {
                    Ok(t) => (0, Some($crate::store::task_fields(t))),
                    Err(e) => ($crate::api::failed(e), None),
                }
            }

            /// Stores caller memory that already holds `[TensorMetadata][data]` (validated).
            #[pyo3(signature = (key, buffer_ptr, size))]
            fn put_tensor_from(&self, py: Python<'_>, key: String, buffer_ptr: u64, size: u64) -> i32 {
                let api = $crate::api::Backend::api(self);
                $crate::api::tensor_from_many(api, py, vec![key], (vec![buffer_ptr], vec![size]), false)[0]
            }

            /// Like `put_tensor_from`, but overwrites an existing key. 0, or a negative error
            /// code.
            #[pyo3(signature = (key, buffer_ptr, size))]
            fn upsert_tensor_from(
                &self,
                py: Python<'_>,
                key: String,
                buffer_ptr: u64,
                size: u64,
            ) -> i32 {
                let api = $crate::api::Backend::api(self);
                $crate::api::tensor_from_many(api, py, vec![key], (vec![buffer_ptr], vec![size]), true)[0]
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
                let api = $crate::api::Backend::api(self);
                $crate::api::tensor_from_many(api, py, keys, (buffer_ptrs, sizes), false)
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
                let api = $crate::api::Backend::api(self);
                $crate::api::tensor_from_many(api, py, keys, (buffer_ptrs, sizes), true)
            }

            /// Internal (parallel reads): copies `data` to caller memory at `buffer_ptr`
            /// (registered, or mapped writable); its length, or -600 for a range that is
            /// neither.
            #[pyo3(signature = (buffer_ptr, data))]
            fn _write_caller(&self, py: Python<'_>, buffer_ptr: u64, data: &[u8]) -> i64 {
                let Some(s) = $crate::api::Backend::api(self) else {
                    return i64::from($crate::api::INVALID);
                };
                $crate::api::rc_i64(py.detach(|| {
                    let dst = s.api_caller_range(buffer_ptr, data.len() as u64, true)?;
                    // SAFETY: the caller-memory contract gives us the destination for this
                    // call; the range lives for this one copy.
                    client::store::Src::from(data).copy_to(&mut unsafe { dst.into_dst() });
                    Ok::<_, protocol::ErrorCode>(data.len() as u64)
                }))
            }

            /// Internal (tensor layer): a copy of `size` bytes of caller memory at
            /// `buffer_ptr`, or `None` when the range is neither registered nor mapped.
            #[pyo3(signature = (buffer_ptr, size))]
            fn _read_registered<'py>(
                &self,
                py: Python<'py>,
                buffer_ptr: u64,
                size: u64,
            ) -> Option<Bound<'py, pyo3::types::PyBytes>> {
                let s = $crate::api::Backend::api(self)?;
                let src = s.api_caller_range(buffer_ptr, size, false).ok()?;
                // SAFETY: the caller-memory contract holds the source while we copy it.
                let src = unsafe { src.src() };
                pyo3::types::PyBytes::new_with(py, src.len(), |b| {
                    src.copy_to(&mut client::store::Dst::from(b));
                    Ok(())
                })
                .ok()
            }
        }
    };
}

pub(crate) use upstream_methods;
