//! The native half of `mooncake.mooncake_ep_buffer`: a thin face of
//! [`collective::ep`].
//!
//! `mooncake/mooncake_ep_buffer.py` owns everything torch-shaped (argument checks, output
//! allocation, events, hooks, the bootstrap over the process group) and hands this module
//! tensor addresses and shapes. Every call runs on the caller's thread with the GIL released.
//!
//! Invariant: the addresses come from CPU tensors whose dtype, shape and contiguity the
//! Python layer has checked against the shape passed alongside, and which it keeps
//! referenced until the call returns; that is the contract of the `unsafe` runtime calls.
//! Bad shapes, indices and protocol mismatches are Python exceptions, never a crash.

use std::sync::Arc;

use std::net::TcpListener;

use collective::ep::net::{EpNet, Remote};
use collective::ep::{
    dispatch::DispatchOut, size_hint, EpPeer, EpRuntime, EpSegment, LocalPeer, Shape,
};
use collective::net::LinkAuth;
use parking_lot::Mutex;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

fn shape(ranks: usize, tokens_max: usize, hidden: usize, experts: usize) -> Shape {
    Shape {
        tokens_max,
        hidden,
        experts,
        ranks,
    }
}

/// The id of an EP group: every rank's host, endpoint, size and buffer path (which holds a
/// random part), each field length-prefixed. Every rank gets the same lists from one
/// `all_gather`, and no two buffers share an endpoint and path.
fn group_id(paths: &[String], hosts: &[String], endpoints: &[String], sizes: &[usize]) -> Vec<u8> {
    let mut id = Vec::new();
    for (((p, h), e), s) in paths.iter().zip(hosts).zip(endpoints).zip(sizes) {
        let size = s.to_string();
        for f in [h.as_str(), e.as_str(), size.as_str(), p.as_str()] {
            id.extend_from_slice(&(f.len() as u64).to_le_bytes());
            id.extend_from_slice(f.as_bytes());
        }
    }
    id
}

fn err(e: String) -> PyErr {
    PyRuntimeError::new_err(format!("Mooncake EP: {e}"))
}

/// One rank's EP buffer: created with its segment and a TCP listener, connected once every
/// rank's host, path and endpoint are known.
#[pyclass(module = "mooncake._native", name = "EpBuffer", frozen)]
pub struct PyEpBuffer {
    rank: usize,
    ranks: usize,
    own: Mutex<Option<EpSegment>>,
    listener: Mutex<Option<TcpListener>>,
    endpoint: String,
    remote_ranks: Mutex<Vec<usize>>,
    rt: Mutex<Option<Arc<EpRuntime>>>,
}

impl PyEpBuffer {
    fn rt(&self) -> PyResult<Arc<EpRuntime>> {
        self.rt
            .lock()
            .clone()
            .ok_or_else(|| PyRuntimeError::new_err("the Mooncake EP buffer is not connected"))
    }
}

#[pymethods]
impl PyEpBuffer {
    /// Creates this rank's buffer at `path` with `data_bytes` bytes of data area, and a TCP
    /// listener on `host_ip` (an ephemeral port) for peers on other hosts.
    #[new]
    #[pyo3(signature = (path, rank, ranks, data_bytes, host_ip = "127.0.0.1"))]
    fn new(
        path: &str,
        rank: usize,
        ranks: usize,
        data_bytes: usize,
        host_ip: &str,
    ) -> PyResult<Self> {
        let seg = EpSegment::create(path, ranks, rank, data_bytes)
            .map_err(|e| PyRuntimeError::new_err(format!("Mooncake EP buffer {path}: {e}")))?;
        let listener = TcpListener::bind((host_ip, 0))
            .and_then(|l| l.local_addr().map(|a| (l, a)))
            .map_err(|e| {
                PyRuntimeError::new_err(format!("Mooncake EP: listening on {host_ip}: {e}"))
            })?;
        Ok(PyEpBuffer {
            rank,
            ranks,
            own: Mutex::new(Some(seg)),
            listener: Mutex::new(Some(listener.0)),
            endpoint: listener.1.to_string(),
            remote_ranks: Mutex::new(Vec::new()),
            rt: Mutex::new(None),
        })
    }

    /// `ip:port` peers on other hosts connect to.
    #[getter]
    fn endpoint(&self) -> String {
        self.endpoint.clone()
    }

    /// The ranks this buffer reaches over TCP (another host id), ascending.
    #[getter]
    fn remote_ranks(&self) -> Vec<usize> {
        self.remote_ranks.lock().clone()
    }

    /// Connects to every peer: `hosts[r]` equal to this rank's maps `paths[r]`, another host
    /// is linked over TCP to `endpoints[r]` (whose data area has `sizes[r]` bytes). Every rank
    /// passes the same lists, so they name the group: with a cluster secret, only peers that
    /// prove the secret and these lists link (docs/ep.md).
    fn connect(
        &self,
        py: Python<'_>,
        paths: Vec<String>,
        hosts: Vec<String>,
        endpoints: Vec<String>,
        sizes: Vec<usize>,
    ) -> PyResult<()> {
        let n = self.ranks;
        if paths.len() != n || hosts.len() != n || endpoints.len() != n || sizes.len() != n {
            return Err(PyValueError::new_err(
                "one EP buffer path, host, endpoint and size per rank is needed",
            ));
        }
        let mut peers: Vec<Option<Box<dyn EpPeer>>> = Vec::with_capacity(n);
        let mut remotes = Vec::new();
        for (r, p) in paths.iter().enumerate() {
            if r == self.rank {
                peers.push(None);
                continue;
            }
            if hosts[r] != hosts[self.rank] {
                peers.push(None);
                remotes.push(Remote {
                    rank: r,
                    endpoint: endpoints[r].clone(),
                    data_bytes: sizes[r],
                });
                continue;
            }
            let seg = EpSegment::open(p, self.ranks, r).map_err(|e| {
                PyRuntimeError::new_err(format!("Mooncake EP: mapping rank {r}'s buffer: {e}"))
            })?;
            peers.push(Some(Box::new(LocalPeer::new(seg))));
        }
        let own = Arc::new(
            self.own
                .lock()
                .take()
                .ok_or_else(|| PyRuntimeError::new_err("already connected"))?,
        );
        let listener = self
            .listener
            .lock()
            .take()
            .ok_or_else(|| PyRuntimeError::new_err("already connected"))?;
        let net = if remotes.is_empty() {
            None
        } else {
            let (rank, o) = (self.rank, own.clone());
            let auth = LinkAuth::process(b"ep", &group_id(&paths, &hosts, &endpoints, &sizes));
            let (net, remote_peers) = py
                .detach(|| EpNet::establish(listener, o, rank, n, &remotes, &auth))
                .map_err(|e| {
                    PyRuntimeError::new_err(format!("Mooncake EP: linking to other hosts: {e}"))
                })?;
            for (r, p) in remote_peers {
                peers[r] = Some(Box::new(p));
            }
            *self.remote_ranks.lock() = remotes.iter().map(|r| r.rank).collect();
            Some(net)
        };
        *self.rt.lock() = Some(Arc::new(EpRuntime::with_peers(own, self.rank, peers, net)));
        Ok(())
    }

    /// Bytes a call of this shape needs in every rank's buffer.
    #[staticmethod]
    fn need_bytes(
        ranks: usize,
        tokens_max: usize,
        hidden: usize,
        experts: usize,
    ) -> PyResult<usize> {
        let s = shape(ranks, tokens_max, hidden, experts);
        s.check().map_err(PyValueError::new_err)?;
        Ok(s.need_bytes())
    }

    /// Sends this rank's tokens; returns `(call, mask)`.
    #[allow(clippy::too_many_arguments)]
    fn dispatch_send(
        &self,
        py: Python<'_>,
        x: usize,
        tokens: usize,
        topk: usize,
        k: usize,
        tokens_max: usize,
        hidden: usize,
        experts: usize,
        fp8: bool,
        mask: u64,
        timeout_us: i64,
    ) -> PyResult<(u64, u64)> {
        let rt = self.rt()?;
        let s = shape(self.ranks, tokens_max, hidden, experts);
        // SAFETY: module invariant: x is [tokens, hidden] bf16 and topk [tokens, k] int64,
        // contiguous CPU tensors mooncake_ep_buffer.py holds during the call.
        py.detach(|| unsafe { rt.dispatch_send(x, tokens, topk, k, s, fp8, mask, timeout_us) })
            .map_err(err)
    }

    /// Receives dispatch call `call` into the given tensors; returns the mask.
    #[allow(clippy::too_many_arguments)]
    fn dispatch_recv(
        &self,
        py: Python<'_>,
        call: u64,
        recv_x: usize,
        scales: usize,
        count: usize,
        src_info: usize,
        layout: usize,
        tokens_max: usize,
        hidden: usize,
        experts: usize,
        fp8: bool,
        mask: u64,
        timeout_us: i64,
    ) -> PyResult<u64> {
        let rt = self.rt()?;
        let s = shape(self.ranks, tokens_max, hidden, experts);
        let out = DispatchOut {
            recv_x,
            scales,
            count,
            src_info,
            layout,
        };
        // SAFETY: module invariant: the outputs were allocated by mooncake_ep_buffer.py with
        // the shapes DispatchOut documents for this shape and are held during the call.
        py.detach(|| unsafe { rt.dispatch_recv(call, out, s, fp8, mask, timeout_us) })
            .map_err(err)
    }

    /// Sends expert outputs back; returns `(call, mask)`.
    #[allow(clippy::too_many_arguments)]
    fn combine_send(
        &self,
        py: Python<'_>,
        x: usize,
        src_info: usize,
        layout: usize,
        topk: usize,
        tokens: usize,
        k: usize,
        tokens_max: usize,
        hidden: usize,
        experts: usize,
        mask: u64,
        timeout_us: i64,
    ) -> PyResult<(u64, u64)> {
        let rt = self.rt()?;
        let s = shape(self.ranks, tokens_max, hidden, experts);
        // SAFETY: module invariant: x [L, N, H] bf16, src_info [L, N] int32, layout [L, R]
        // int64, topk [tokens, k] int64, all checked and held by the caller.
        py.detach(|| unsafe {
            rt.combine_send(x, src_info, layout, topk, tokens, k, s, mask, timeout_us)
        })
        .map_err(err)
    }

    /// Receives combine call `call` and reduces into `out`; returns the mask.
    #[allow(clippy::too_many_arguments)]
    fn combine_recv(
        &self,
        py: Python<'_>,
        call: u64,
        topk: usize,
        weights: usize,
        tokens: usize,
        k: usize,
        out: usize,
        tokens_max: usize,
        hidden: usize,
        experts: usize,
        mask: u64,
        timeout_us: i64,
    ) -> PyResult<u64> {
        let rt = self.rt()?;
        let s = shape(self.ranks, tokens_max, hidden, experts);
        // SAFETY: module invariant: topk [tokens, k] int64, weights [tokens, k] float32 and
        // out [tokens, H] bf16, checked and held by the caller.
        py.detach(|| unsafe {
            rt.combine_recv(call, topk, weights, tokens, k, out, s, mask, timeout_us)
        })
        .map_err(err)
    }
}

/// Upstream's `get_ep_buffer_size_hint` (the group size is unused, as upstream).
#[pyfunction]
fn ep_size_hint(
    num_max_dispatch_tokens_per_rank: u64,
    hidden: u64,
    _num_ranks: u64,
    num_experts: u64,
) -> PyResult<u64> {
    size_hint(num_max_dispatch_tokens_per_rank, hidden, num_experts)
        .ok_or_else(|| PyValueError::new_err("EP buffer size overflows 64 bits"))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyEpBuffer>()?;
    m.add_function(wrap_pyfunction!(ep_size_hint, m)?)?;
    Ok(())
}
