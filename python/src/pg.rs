//! The native half of `mooncake.pg`: a thin face of [`collective`].
//!
//! `mooncake/pg.py` owns everything torch-shaped (the `ProcessGroup` subclass, options,
//! argument checks, contiguous copies) and hands this module tensor addresses, byte counts
//! and dtype/op codes. Every op returns a [`PyPgWork`] at once; waiting releases the GIL.
//!
//! Invariant: addresses passed here come from tensors that `pg.py` keeps referenced by the
//! Python work object until the op has completed, which is the contract of
//! [`Comm::submit`] / [`Comm::p2p`]. Bad codes, ranks and list lengths are Python exceptions.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use collective::{
    membership,
    net::{LinkAuth, Net},
    seg::Segment,
    CollOp, Comm, Completion, DType, ReduceOp, COLLECTIVE_TIMEOUT_US, P2P_TIMEOUT_US,
    RECONCILIATION_WINDOW_US,
};
use parking_lot::Mutex;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use std::net::TcpListener;

fn dtype(code: u32) -> PyResult<DType> {
    DType::from_code(code)
        .ok_or_else(|| PyValueError::new_err(format!("unsupported Mooncake PG datatype {code}")))
}

fn rop(code: u32) -> PyResult<ReduceOp> {
    ReduceOp::from_code(code)
        .ok_or_else(|| PyValueError::new_err(format!("unsupported Mooncake PG op {code}")))
}

/// The outcome of one op, waitable without the GIL.
#[pyclass(module = "mooncake._native", name = "PgWork", frozen)]
pub struct PyPgWork {
    done: Arc<Completion>,
}

#[pymethods]
impl PyPgWork {
    /// Waits for the op (`timeout_s` `None` = forever); True once it has ended.
    #[pyo3(signature = (timeout_s=None))]
    fn wait(&self, py: Python<'_>, timeout_s: Option<f64>) -> bool {
        let t = timeout_s
            .filter(|t| *t > 0.0)
            .map(|t| Duration::from_secs_f64(t.min(1.0e9)));
        let done = self.done.clone();
        py.detach(move || done.wait(t)).is_some()
    }

    /// Whether the op has ended.
    fn poll(&self) -> bool {
        self.done.poll().is_some()
    }

    /// Failed ranks seen by the op (bit mask), 0 while running.
    fn failed(&self) -> u64 {
        self.done.poll().map_or(0, |o| o.failed)
    }

    /// Why the op failed as a whole, if it did.
    fn error(&self) -> Option<String> {
        self.done.poll().and_then(|o| o.error)
    }
}

/// `Net::establish` or `Net::join`: links made on a listener for rank `me` of `n`.
type NetMaker = fn(
    TcpListener,
    usize,
    usize,
    &[(usize, String)],
    Vec<(usize, Segment)>,
    &LinkAuth,
) -> std::io::Result<Net>;

/// Who may link to this group: peers that prove this process's cluster secret (if one is
/// set) and the group's id (`group`, which every rank reads from the torch store).
fn auth(group: Option<&str>) -> LinkAuth {
    LinkAuth::process(b"pg", group.unwrap_or("").as_bytes())
}

/// One rank's communicator: created with its segment, connected once every rank's segment
/// path is known.
#[pyclass(module = "mooncake._native", name = "PgComm", frozen)]
pub struct PyPgComm {
    rank: usize,
    ranks: usize,
    own: Mutex<Option<Segment>>,
    comm: Mutex<Option<Arc<Comm>>>,
    /// Where the ranks on other hosts connect (see `listen`).
    listener: Mutex<Option<TcpListener>>,
}

impl PyPgComm {
    fn comm(&self) -> PyResult<Arc<Comm>> {
        self.comm
            .lock()
            .clone()
            .ok_or_else(|| PyRuntimeError::new_err("the Mooncake PG communicator is not connected"))
    }

    fn work(done: Arc<Completion>) -> PyPgWork {
        PyPgWork { done }
    }

    fn check_list(&self, what: &str, v: &[usize]) -> PyResult<()> {
        if v.len() != self.ranks {
            return Err(PyValueError::new_err(format!(
                "{what} has {} tensors, the group has {} ranks",
                v.len(),
                self.ranks
            )));
        }
        Ok(())
    }

    fn check_rank(&self, what: &str, r: usize) -> PyResult<()> {
        if r >= self.ranks {
            return Err(PyValueError::new_err(format!(
                "{what} rank {r} is outside this group of {} ranks",
                self.ranks
            )));
        }
        Ok(())
    }

    /// The links to the ranks on other hosts (`remotes`, with their replicas' receive
    /// sides), made by `make` (`Net::establish` for a founder, `Net::join` for a process
    /// joining later) on the listener `listen()` made, with the GIL released, every link
    /// passing `auth`. `None` without a listener when no rank is remote. `who` / `doing` word
    /// the errors.
    #[allow(clippy::too_many_arguments)]
    fn link(
        &self,
        py: Python<'_>,
        make: NetMaker,
        remotes: Vec<(usize, String)>,
        replicas: Vec<(usize, Segment)>,
        auth: LinkAuth,
        who: &str,
        doing: &str,
    ) -> PyResult<Option<Net>> {
        let Some(l) = self.listener.lock().take() else {
            if remotes.is_empty() {
                return Ok(None);
            }
            return Err(PyRuntimeError::new_err(format!(
                "Mooncake PG: {who} on other hosts need listen() first"
            )));
        };
        let (me, n) = (self.rank, self.ranks);
        py.detach(move || make(l, me, n, &remotes, replicas, &auth))
            .map(Some)
            .map_err(|e| PyRuntimeError::new_err(format!("Mooncake PG: {doing} other hosts: {e}")))
    }

    fn submit(&self, op: CollOp) -> PyResult<PyPgWork> {
        let comm = self.comm()?;
        // SAFETY: pg.py keeps every tensor behind these addresses referenced by the Python
        // work object until the completion fires (module invariant).
        Ok(Self::work(unsafe { comm.submit(op) }))
    }
}

#[pymethods]
impl PyPgComm {
    /// Creates this rank's segment at `path`.
    #[new]
    fn new(path: &str, rank: usize, ranks: usize) -> PyResult<Self> {
        let seg = Segment::create(path, ranks, rank)
            .map_err(|e| PyRuntimeError::new_err(format!("Mooncake PG segment {path}: {e}")))?;
        Ok(PyPgComm {
            rank,
            ranks,
            own: Mutex::new(Some(seg)),
            comm: Mutex::new(None),
            listener: Mutex::new(None),
        })
    }

    /// Listens for the ranks on other hosts on `host` (an ephemeral port); returns the port.
    fn listen(&self, host: &str) -> PyResult<u16> {
        let l = TcpListener::bind((host, 0)).map_err(|e| {
            PyRuntimeError::new_err(format!("Mooncake PG: listening on {host}: {e}"))
        })?;
        let port = l
            .local_addr()
            .map_err(|e| PyRuntimeError::new_err(format!("Mooncake PG: {e}")))?
            .port();
        *self.listener.lock() = Some(l);
        Ok(port)
    }

    /// Maps every same-host peer's segment (`paths[r]` for rank `r`), links to the ranks on
    /// other hosts (`endpoints[r]` = `host:port` non-empty; `paths[r]` unused) and starts
    /// the workers. Releases the GIL while it connects. `founders` (default: every slot) is
    /// how many slots the group starts with: slots from `founders` on are empty, inactive
    /// places a process may later join by extension (`max_group_size` > group size; their
    /// `paths` entries are unused). `group` is the group's id, the same on every rank: with a
    /// cluster secret, only peers that prove the secret and this id link (docs/pg.md).
    #[pyo3(signature = (paths, auto_deactivate, endpoints=None, founders=None, group=None))]
    fn connect(
        &self,
        py: Python<'_>,
        paths: Vec<String>,
        auto_deactivate: bool,
        endpoints: Option<Vec<String>>,
        founders: Option<usize>,
        group: Option<&str>,
    ) -> PyResult<()> {
        if paths.len() != self.ranks {
            return Err(PyValueError::new_err("one segment path per rank is needed"));
        }
        let founders = founders.unwrap_or(self.ranks);
        if founders == 0 || founders > self.ranks || self.rank >= founders {
            return Err(PyValueError::new_err(format!(
                "founders must be in [rank + 1, {}], got {founders}",
                self.ranks
            )));
        }
        let endpoints = endpoints.unwrap_or_else(|| vec![String::new(); self.ranks]);
        if endpoints.len() != self.ranks {
            return Err(PyValueError::new_err(
                "one endpoint (or \"\") per rank is needed",
            ));
        }
        let mut peers = Vec::with_capacity(self.ranks);
        let mut remotes = Vec::new();
        let mut replicas = Vec::new();
        for (r, p) in paths.iter().enumerate() {
            if r == self.rank {
                peers.push(None);
                continue;
            }
            if r >= founders {
                peers.push(Some(Segment::tombstone(self.ranks, r).map_err(|e| {
                    PyRuntimeError::new_err(format!("Mooncake PG: placeholder segment: {e}"))
                })?));
                continue;
            }
            if !endpoints[r].is_empty() {
                let (mine, rx) = Segment::replica(self.ranks, r).map_err(|e| {
                    PyRuntimeError::new_err(format!("Mooncake PG: replica of rank {r}: {e}"))
                })?;
                peers.push(Some(mine));
                replicas.push((r, rx));
                remotes.push((r, endpoints[r].clone()));
                continue;
            }
            let seg = Segment::open(p, self.ranks, r).map_err(|e| {
                PyRuntimeError::new_err(format!("Mooncake PG: mapping rank {r}'s segment: {e}"))
            })?;
            peers.push(Some(seg));
        }
        // With a listener (mooncake.pg always makes one) the links are built even when every
        // founder is on this host: a process on another host may take a slot over later.
        let net = self.link(
            py,
            Net::establish,
            remotes,
            replicas,
            auth(group),
            "ranks",
            "linking to",
        )?;
        let own = self
            .own
            .lock()
            .take()
            .ok_or_else(|| PyRuntimeError::new_err("already connected"))?;
        let active = if founders == 64 {
            u64::MAX
        } else {
            (1u64 << founders) - 1
        };
        let comm = Comm::start_with(own, self.rank, peers, net, auto_deactivate, active, None)
            .map_err(|e| PyRuntimeError::new_err(format!("Mooncake PG workers: {e}")))?;
        *self.comm.lock() = Some(Arc::new(comm));
        Ok(())
    }

    /// Joins an existing group as a new process for this rank (`is_extension`): maps every
    /// live member's segment on this host (`paths[r]`, `None` for this rank or a member that
    /// is gone), links to the members on other hosts (`endpoints[r]` = `host:port` of their
    /// listener; needs `listen()` first), starts in the group's newest view with only this
    /// rank active (isolated until `join`), and announces itself to every member. `group`
    /// is the group's id, as in `connect`.
    #[pyo3(signature = (paths, auto_deactivate, endpoints=None, group=None))]
    fn connect_extension(
        &self,
        py: Python<'_>,
        paths: Vec<Option<String>>,
        auto_deactivate: bool,
        endpoints: Option<Vec<Option<String>>>,
        group: Option<&str>,
    ) -> PyResult<()> {
        if paths.len() != self.ranks {
            return Err(PyValueError::new_err("one segment path per rank is needed"));
        }
        let endpoints = endpoints.unwrap_or_else(|| vec![None; self.ranks]);
        if endpoints.len() != self.ranks {
            return Err(PyValueError::new_err(
                "one endpoint (or None) per rank is needed",
            ));
        }
        let mut peers = Vec::with_capacity(self.ranks);
        let mut remotes = Vec::new();
        let mut replicas = Vec::new();
        for (r, p) in paths.iter().enumerate() {
            if r == self.rank {
                peers.push(None);
                continue;
            }
            if let Some(ep) = endpoints[r].as_ref().filter(|e| !e.is_empty()) {
                let (mine, rx) = Segment::replica(self.ranks, r).map_err(|e| {
                    PyRuntimeError::new_err(format!("Mooncake PG: replica of rank {r}: {e}"))
                })?;
                peers.push(Some(mine));
                replicas.push((r, rx));
                remotes.push((r, ep.clone()));
                continue;
            }
            let seg = match p.as_deref().map(|p| Segment::open(p, self.ranks, r)) {
                Some(Ok(seg)) if seg.owner_alive() => seg,
                _ => Segment::tombstone(self.ranks, r).map_err(|e| {
                    PyRuntimeError::new_err(format!("Mooncake PG: placeholder segment: {e}"))
                })?,
            };
            peers.push(Some(seg));
        }
        let net = self.link(
            py,
            Net::join,
            remotes,
            replicas,
            auth(group),
            "members",
            "joining the members on",
        )?;
        // The replicas hold the members' snapshots now (Net::join waited for them).
        let view = {
            let live: Vec<&Segment> = peers.iter().flatten().collect();
            membership::newest_view(&live)
        };
        let all = if self.ranks == 64 {
            u64::MAX
        } else {
            (1u64 << self.ranks) - 1
        };
        let view = view.unwrap_or_else(|| membership::View::initial(all));
        let own = self
            .own
            .lock()
            .take()
            .ok_or_else(|| PyRuntimeError::new_err("already connected"))?;
        let comm = Comm::start_with(
            own,
            self.rank,
            peers,
            net,
            auto_deactivate,
            1u64 << self.rank,
            Some(view),
        )
        .map_err(|e| PyRuntimeError::new_err(format!("Mooncake PG workers: {e}")))?;
        membership::announce(comm.shared());
        *self.comm.lock() = Some(Arc::new(comm));
        Ok(())
    }

    /// `(pid, fd)` of this rank's segment: `/proc/<pid>/fd/<fd>` reopens it.
    fn proc_path(&self) -> PyResult<(u32, i32)> {
        let comm = self.comm()?;
        Ok((std::process::id(), comm.shared().own_fd()))
    }

    /// Proposes activating (`activate`) or deactivating the ranks in `mask`; returns
    /// `(status, view id, dropped mask, reason)`.
    fn propose(
        &self,
        py: Python<'_>,
        activate: bool,
        mask: u64,
        timeout_s: f64,
    ) -> PyResult<(u64, u64, u64, String)> {
        let comm = self.comm()?;
        let kind = if activate {
            membership::KIND_ACTIVATE
        } else {
            membership::KIND_DEACTIVATE
        };
        let t = Duration::from_secs_f64(timeout_s.clamp(0.0, 1.0e6));
        let a = py.detach(move || membership::propose(comm.shared(), kind, mask, t));
        Ok((a.status, a.vid, a.dropped, a.reason))
    }

    /// Blocks until a view activates this rank (`join_group`).
    fn join(&self, py: Python<'_>, timeout_s: f64) -> PyResult<()> {
        let comm = self.comm()?;
        let t = Duration::from_secs_f64(timeout_s.clamp(0.0, 1.0e6));
        py.detach(move || membership::join(comm.shared(), t))
            .map_err(PyRuntimeError::new_err)
    }

    /// Whether `rank` is alive and active in the newest view or waiting in `join_group`.
    fn peer_ready(&self, rank: usize) -> PyResult<bool> {
        self.check_rank("peer", rank)?;
        Ok(membership::peer_ready(self.comm()?.shared(), rank))
    }

    /// Id of the newest committed view seen here.
    fn view_id(&self) -> PyResult<u64> {
        Ok(self.comm()?.shared().member.latest_vid())
    }

    /// Mirrors the active set into `len` int32 elements at `addr` (the options' tensor,
    /// which pg.py keeps alive as long as this communicator).
    fn set_mirror(&self, addr: usize, len: usize) -> PyResult<()> {
        let comm = self.comm()?;
        // SAFETY: see the doc comment; pg.py holds the tensor for the communicator's life.
        unsafe { comm.set_mirror(addr, len) };
        Ok(())
    }

    /// The active set of ranks as a bit mask (bit `r` = rank `r`).
    fn active(&self) -> PyResult<u64> {
        Ok(self.comm()?.shared().active())
    }

    /// Replaces the active set (bit mask); the epoch goes up when it changes.
    fn set_active(&self, mask: u64) -> PyResult<()> {
        self.comm()?.shared().set_active(mask);
        Ok(())
    }

    /// The epoch: one more for every change of the active set.
    fn epoch(&self) -> PyResult<u64> {
        Ok(self.comm()?.shared().epoch())
    }

    /// Whether rank `rank`'s process is alive (always true for this rank).
    fn alive(&self, rank: usize) -> PyResult<bool> {
        self.check_rank("peer", rank)?;
        Ok(self.comm()?.shared().alive(rank))
    }

    /// Whether this rank can read every peer's memory directly.
    fn cma_probe(&self) -> PyResult<bool> {
        Ok(self.comm()?.shared().cma_probe())
    }

    /// Turns the direct-read path on (same value on every rank, before the first op).
    fn set_cma(&self, on: bool) -> PyResult<()> {
        self.comm()?.shared().set_cma(on);
        Ok(())
    }

    /// Releases the communicator (`destroy_process_group`): its workers end once the ops
    /// already issued have (the point-to-point thread also waits for its sends'
    /// acknowledgements, up to the timeout), then the segment is unmapped and its lock
    /// dropped; the listener closes now. Later calls raise "not connected". Idempotent.
    fn close(&self) {
        drop(self.comm.lock().take());
        drop(self.listener.lock().take());
        drop(self.own.lock().take());
    }

    /// Leaves the group gracefully (see `Shared::leave`).
    fn leave(&self) -> PyResult<()> {
        self.comm()?.shared().leave();
        Ok(())
    }

    /// The ranks that failed since the last call (bit mask), and clears them.
    fn take_failures(&self) -> PyResult<u64> {
        Ok(self.comm()?.shared().take_failures())
    }

    /// Queues an all-reduce of `bytes` bytes at `buf` in place (dtype `dt`, reduce op `op`);
    /// the `PgWork` to wait on.
    fn all_reduce(&self, buf: usize, bytes: usize, dt: u32, op: u32) -> PyResult<PyPgWork> {
        self.submit(CollOp::AllReduce {
            buf,
            bytes,
            dtype: dtype(dt)?,
            op: rop(op)?,
        })
    }

    /// Queues a broadcast of `bytes` bytes at `buf` from rank `root`; the `PgWork` to wait on.
    fn broadcast(&self, buf: usize, bytes: usize, dt: u32, root: usize) -> PyResult<PyPgWork> {
        self.check_rank("root", root)?;
        self.submit(CollOp::Broadcast {
            buf,
            bytes,
            dtype: dtype(dt)?,
            root,
        })
    }

    /// Queues an all-gather of `bytes` bytes at `input` into `outs` (one address per rank);
    /// the `PgWork` to wait on.
    fn all_gather(
        &self,
        input: usize,
        bytes: usize,
        dt: u32,
        outs: Vec<usize>,
    ) -> PyResult<PyPgWork> {
        self.check_list("the output list", &outs)?;
        self.submit(CollOp::AllGather {
            input,
            bytes,
            dtype: dtype(dt)?,
            outs,
        })
    }

    /// Queues an all-to-all of `bytes` bytes per rank from `ins` to `outs` (one address per
    /// rank each); the `PgWork` to wait on.
    fn all_to_all(
        &self,
        ins: Vec<usize>,
        outs: Vec<usize>,
        bytes: usize,
        dt: u32,
    ) -> PyResult<PyPgWork> {
        self.check_list("the input list", &ins)?;
        self.check_list("the output list", &outs)?;
        self.submit(CollOp::AllToAll {
            ins,
            outs,
            bytes,
            dtype: dtype(dt)?,
        })
    }

    /// Queues a reduce-scatter of `ins` (one address per rank) into `out` (op `op`); the
    /// `PgWork` to wait on.
    fn reduce_scatter(
        &self,
        ins: Vec<usize>,
        out: usize,
        bytes: usize,
        dt: u32,
        op: u32,
    ) -> PyResult<PyPgWork> {
        self.check_list("the input", &ins)?;
        self.submit(CollOp::ReduceScatter {
            ins,
            out,
            bytes,
            dtype: dtype(dt)?,
            op: rop(op)?,
        })
    }

    /// Queues a reduce of `bytes` bytes at `buf` onto rank `root` (op `op`); the `PgWork` to
    /// wait on.
    fn reduce(
        &self,
        buf: usize,
        bytes: usize,
        dt: u32,
        op: u32,
        root: usize,
    ) -> PyResult<PyPgWork> {
        self.check_rank("root", root)?;
        self.submit(CollOp::Reduce {
            buf,
            bytes,
            dtype: dtype(dt)?,
            op: rop(op)?,
            root,
        })
    }

    /// Queues a gather of `bytes` bytes at `input` into `outs` on rank `root`; the `PgWork`
    /// to wait on.
    fn gather(
        &self,
        input: usize,
        bytes: usize,
        dt: u32,
        outs: Vec<usize>,
        root: usize,
    ) -> PyResult<PyPgWork> {
        self.check_rank("root", root)?;
        if self.rank == root {
            self.check_list("the gather list", &outs)?;
        }
        self.submit(CollOp::Gather {
            input,
            bytes,
            dtype: dtype(dt)?,
            outs,
            root,
        })
    }

    /// Queues a scatter from `ins` on rank `root` into `out` on every rank; the `PgWork` to
    /// wait on.
    fn scatter(
        &self,
        ins: Vec<usize>,
        out: usize,
        bytes: usize,
        dt: u32,
        root: usize,
    ) -> PyResult<PyPgWork> {
        self.check_rank("root", root)?;
        if self.rank == root {
            self.check_list("the scatter list", &ins)?;
        }
        self.submit(CollOp::Scatter {
            ins,
            out,
            bytes,
            dtype: dtype(dt)?,
            root,
        })
    }

    /// Queues a barrier of the active ranks; the `PgWork` to wait on.
    fn barrier(&self) -> PyResult<PyPgWork> {
        self.submit(CollOp::Barrier)
    }

    /// Queues a send (`is_send`) or receive of `bytes` bytes at `addr` with `peer`.
    fn p2p(&self, is_send: bool, peer: usize, addr: usize, bytes: usize) -> PyResult<PyPgWork> {
        self.check_rank("peer", peer)?;
        if peer == self.rank {
            return Err(PyValueError::new_err(
                "a rank cannot send to or receive from itself",
            ));
        }
        let comm = self.comm()?;
        // SAFETY: as in `submit`.
        Ok(Self::work(unsafe { comm.p2p(is_send, peer, addr, bytes) }))
    }
}

/// Sets one of the process-wide timeouts (`which`: "collective", "p2p", "window").
#[pyfunction]
fn pg_set_timeout_us(which: &str, us: i64) -> PyResult<()> {
    if us < 0 {
        return Err(PyValueError::new_err(format!(
            "{which} timeout must be >= 0 microseconds, got {us}"
        )));
    }
    let cell = match which {
        "collective" => &COLLECTIVE_TIMEOUT_US,
        "p2p" => &P2P_TIMEOUT_US,
        "window" => &RECONCILIATION_WINDOW_US,
        _ => return Err(PyValueError::new_err(format!("unknown timeout {which}"))),
    };
    cell.store(us as u64, Ordering::Relaxed);
    Ok(())
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyPgComm>()?;
    m.add_class::<PyPgWork>()?;
    m.add_function(wrap_pyfunction!(pg_set_timeout_us, m)?)?;
    Ok(())
}
