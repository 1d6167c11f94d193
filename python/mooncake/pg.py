"""Mooncake PG: a fault-tolerant ``torch.distributed`` backend on CPU tensors.

``from mooncake import pg`` registers the backends ``"mooncake-cpu"`` and ``"mooncake"`` with
torch. Both run here on CPU tensors; ``"mooncake"`` (upstream's CUDA variant) refuses CUDA
tensors with a clear error, since this build has no GPU data path.

The group is a Python subclass of ``torch.distributed.ProcessGroup``; every operation checks
its arguments here, then hands tensor addresses and sizes to the native data path
(``mooncake._native.PgComm``, Rust crate ``mooncake-collective``): same-host ranks exchange bytes
by memcpy through shared-memory segments, ranks on other hosts push them over TCP, and
reductions run in Rust. Python never loops over
elements. Work objects are returned at once; ``wait()`` blocks without the GIL.

Fault tolerance follows upstream: ``active_ranks`` is a live int32 tensor; a rank whose
process dies during a collective is excluded from it, the survivors' op completes,
``active_ranks[dead]`` becomes 0 (with ``auto_deactivate_on_failure``), and
``get_failed_ranks_hint(work)`` / ``get_local_success(work)`` say what happened.
``wait()`` does not raise for a failed peer. See ``docs/pg.md`` for what differs from upstream.
"""

from __future__ import annotations

import datetime
import enum
import os
import threading
import uuid
import warnings
from collections.abc import Iterable
from typing import Any, Union

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from mooncake import _native, _pg_membership
from mooncake._pg_codes import DTYPE_CODES as _DTYPE_CODES
from mooncake._pg_codes import OP_CODES as _OP_CODES
from mooncake._pg_common import (
    _GROUP_KEY,
    ProposalStatus,
    ProposeViewUpdateResponse,
    ViewUpdateStatus,
    _host_id,
)

__all__ = [
    "MooncakeBackendOptions",
    "ProposalStatus",
    "ProposeViewUpdateResponse",
    "SyncAfterFailureResponse",
    "SyncAfterFailureStatus",
    "ViewUpdateStatus",
    "activate_ranks",
    "createMooncakeBackend",
    "createMooncakeCpuBackend",
    "deactivate_ranks",
    "extend_group_size_to",
    "get_active_ranks",
    "get_current_epoch",
    "get_failed_ranks_hint",
    "get_local_success",
    "get_num_synced_ranks",
    "get_peer_state",
    "join_group",
    "recover_ranks",
    "set_collective_timeout_us",
    "set_device_filter",
    "set_fault_reconciliation_window_us",
    "set_host_ip",
    "set_p2p_timeout_us",
    "set_transfer_engine",
    "sync_after_failure",
]

# What the module functions take: a Mooncake group, or None / WORLD for the default group.
Backend = Union[dist.ProcessGroup, None]

MAX_RANKS = 64  # upstream's MOONCAKE_PG_MAX_RANKS


# --------------------------------------------------------------------------------------------
# process-wide settings

# Store key of the current incarnation's prefix (see _incarnation_store).
_INCARNATION_KEY = "mooncake_pg/incarnation"


def _incarnation_store(store, rank, size, is_extension):
    """The store under which this incarnation of the group keeps its keys.

    ``destroy_process_group()`` does not empty the rendezvous store: torch keeps rank 0's
    TCPStore server (the same ``host:port``) across a destroy and a new
    ``init_process_group``, and the group's torch prefix (``default_pg/0/``) repeats. Keys
    set by the previous incarnation (segment paths, endpoints, the group id, the direct-read
    votes) are therefore still there when the next one starts, and a rank that re-initialises
    before a slower peer has overwritten its keys read the peer's *old* entries: an unlinked
    segment path ("mapping rank r's segment: No such file"), after which it gave up, rank 0
    took the store down with it and the others hung or failed; about one run in three of
    four ranks cycling destroy/init (docs/pg.md, Destroy and re-init).

    So each incarnation works under its own prefix: the founders count themselves in with an
    atomic ``add`` and incarnation ``k`` is the ``k``-th batch of ``size`` arrivals. The
    batches cannot interleave: a rank arrives for incarnation ``k + 1`` only after its
    ``init`` of ``k`` returned, which needed every founder of ``k`` to have arrived. The
    counter is per group size, so a group re-created with another size keeps whole batches.
    Rank 0 records the current prefix, where a process extending the group looks.

    The store itself is kept alive past ``destroy_process_group()`` (upstream keeps its
    first store for the process lifetime, for the same reason): rank 0's TCPStore server
    lives only as long as a store object refers to it, and a new ``init_process_group`` on
    the same port reuses a live one. Without a reference here, whether it was still alive
    when rank 0 re-initialised depended on garbage collection: if it had gone, a faster rank
    that had already connected to it for its own re-init lost the connection mid-rendezvous
    ("Failed to recv, got 0 bytes"). With it, every incarnation talks to the same server,
    and the prefixes keep their keys apart."""
    _Settings.store = store
    if is_extension:
        cur = store.get(_INCARNATION_KEY).decode() if store.check([_INCARNATION_KEY]) else "0"
    else:
        k = (store.add(f"mooncake_pg/arrivals/{size}", 1) - 1) // size
        cur = f"{size}x{k}"
        if rank == 0:
            store.set(_INCARNATION_KEY, cur)
    return dist.PrefixStore(f"mooncake_pg/{cur}", store)



class _Settings:
    host_ip = "127.0.0.1"
    device_filter: list[str] = []
    transfer_engine: object = None
    initialized = False
    # The newest group's rendezvous store, kept past destroy_process_group (see
    # _incarnation_store).
    store = None


def set_host_ip(host: str, /) -> None:
    """Address this rank listens on and advertises to ranks on other hosts (default
    127.0.0.1). Must precede the first group."""
    if not isinstance(host, str):
        raise TypeError("set_host_ip(host: str)")
    if _Settings.initialized and host != _Settings.host_ip:
        raise RuntimeError("set_host_ip must be called before the first Mooncake PG is created")
    _Settings.host_ip = host


def set_device_filter(filters: Iterable[str], /) -> None:
    """NIC whitelist (sorted, deduplicated). Fixed after the first group; unused on one host."""
    new = sorted(set(str(f) for f in filters))
    if _Settings.initialized and new != _Settings.device_filter:
        raise RuntimeError(
            "set_device_filter must be called before the first Mooncake PG is created"
        )
    _Settings.device_filter = new


def set_transfer_engine(engine: object) -> None:
    """Accepted for upstream compatibility (before the first group); same-host groups do not
    use a transfer engine."""
    if _Settings.initialized:
        raise RuntimeError(
            "set_transfer_engine must be called before the first Mooncake PG is created"
        )
    _Settings.transfer_engine = engine


def _set_timeout(which: str, us: int) -> None:
    if isinstance(us, bool) or not isinstance(us, int):
        raise TypeError(f"timeout must be an int number of microseconds, got {us!r}")
    _native.pg_set_timeout_us(which, us)


def set_collective_timeout_us(us: int) -> None:
    """How long a collective waits on a live, silent peer before saying so in the log
    (default 10 s). A dead peer is detected within about a millisecond regardless."""
    _set_timeout("collective", us)


def set_p2p_timeout_us(us: int) -> None:
    """A send or receive that makes no progress this long fails (default 10 s)."""
    _set_timeout("p2p", us)


def set_fault_reconciliation_window_us(us: int) -> None:
    """Upstream's reconciliation window (default 30 s). Accepted and validated; failures are
    observed directly here, so no window has to pass (docs/pg.md)."""
    _set_timeout("window", us)


# --------------------------------------------------------------------------------------------
# options and response types


class MooncakeBackendOptions:
    """Options of a Mooncake PG (upstream's overloads, tensor forms first):

    ``MooncakeBackendOptions(active_ranks[, is_extension[, max_group_size]])`` and
    ``MooncakeBackendOptions(max_group_size[, is_extension[, auto_deactivate_on_failure,
    auto_sync_on_failure]])``.
    """

    def __init__(self, *args, **kwargs):
        names_t = ["active_ranks", "is_extension", "max_group_size"]
        names_i = [
            "max_group_size",
            "is_extension",
            "auto_deactivate_on_failure",
            "auto_sync_on_failure",
        ]
        first = args[0] if args else kwargs.get("active_ranks", kwargs.get("max_group_size"))
        tensor_form = isinstance(first, torch.Tensor)
        names = names_t if tensor_form else names_i
        if len(args) > len(names):
            raise TypeError(self._usage())
        vals = dict(zip(names, args))
        for k, v in kwargs.items():
            if k not in names or k in vals:
                raise TypeError(self._usage())
            vals[k] = v
        if not tensor_form and len(vals) == 3:
            raise TypeError(self._usage())  # upstream has no 3-argument int form
        self._active_ranks = vals.get("active_ranks")
        self._is_extension = vals.get("is_extension", False)
        mgs = vals.get("max_group_size", -1)
        self._auto_deactivate = vals.get("auto_deactivate_on_failure", True)
        self._auto_sync = vals.get("auto_sync_on_failure", True)
        for name, v in (
            ("is_extension", self._is_extension),
            ("auto_deactivate_on_failure", self._auto_deactivate),
            ("auto_sync_on_failure", self._auto_sync),
        ):
            if not isinstance(v, bool):
                raise TypeError(f"{name} must be a bool\n" + self._usage())
        if isinstance(mgs, bool) or not isinstance(mgs, int):
            raise TypeError("max_group_size must be an int\n" + self._usage())
        self._max_group_size = mgs if mgs > 0 else -1
        if "active_ranks" in names and "active_ranks" not in vals:
            raise TypeError(self._usage())
        if "max_group_size" not in vals and not tensor_form:
            raise TypeError(self._usage())
        t = self._active_ranks
        if t is not None:
            if t.dtype != torch.int32:
                raise RuntimeError(f"active_ranks must be an int32 tensor, got {t.dtype}")
            if not t.is_contiguous():
                raise RuntimeError("active_ranks must be contiguous")
            if t.device.type not in ("cpu", "cuda"):
                raise RuntimeError(f"active_ranks must be on CPU or CUDA, got {t.device}")
            if self._max_group_size > 0 and t.numel() < self._max_group_size:
                raise RuntimeError(
                    f"active_ranks has {t.numel()} elements, max_group_size is "
                    f"{self._max_group_size}"
                )
        if self._auto_sync and not self._auto_deactivate:
            raise RuntimeError("auto_sync_on_failure requires auto_deactivate_on_failure=true")

    @staticmethod
    def _usage():
        return (
            "MooncakeBackendOptions(): incompatible constructor arguments. Supported forms:\n"
            "  (active_ranks: Tensor)\n"
            "  (active_ranks: Tensor, is_extension: bool)\n"
            "  (active_ranks: Tensor, is_extension: bool, max_group_size: int)\n"
            "  (max_group_size: int)\n"
            "  (max_group_size: int, is_extension: bool)\n"
            "  (max_group_size: int, is_extension: bool, auto_deactivate_on_failure: bool, "
            "auto_sync_on_failure: bool)"
        )


class SyncAfterFailureStatus(enum.IntEnum):
    Reconciled = 0
    NoPending = 1
    Rejected = 2


class SyncAfterFailureResponse:
    """Answer of :func:`sync_after_failure`."""

    __slots__ = ("_status", "_reason")

    def __init__(self, status: SyncAfterFailureStatus, reject_reason: str = "") -> None:
        self._status, self._reason = status, reject_reason

    @property
    def status(self) -> SyncAfterFailureStatus:
        return self._status

    @property
    def reject_reason(self) -> str:
        return self._reason

    def __repr__(self) -> str:
        return f"SyncAfterFailureResponse(status={self._status!r})"



# --------------------------------------------------------------------------------------------
# work objects


class _MooncakeWork(dist._Work):
    """The handle of one op. ``wait()`` blocks (collectives ignore its timeout, as upstream;
    point-to-point ops honour it), runs the copy-backs once, and raises ``RuntimeError``
    only when the op failed as a whole (bad arguments, mismatched calls), never for a failed
    peer."""

    def __init__(self, pg, native, what, keep, copy_back=(), p2p=False):
        super().__init__()
        self._pg = pg
        self._native = native
        self._what = what
        self._keep = keep  # tensors the native op reads or writes: alive until it ends
        self._copy_back = list(copy_back)
        self._p2p = p2p
        self._finished = False
        self._lock = threading.Lock()
        self._future = None

    def _finish(self):
        with self._lock:
            if self._finished:
                return
            self._finished = True
            err = self._native.error()
            if err is None and not (self._p2p and self._native.failed()):
                for dst, src in self._copy_back:
                    dst.copy_(src)
            self._keep = None
            self._pg._after_op(self._native.failed())

    def _raise_if_failed(self):
        err = self._native.error()
        if err is not None:
            raise RuntimeError(f"Mooncake PG {self._what} failed: {err}")

    def wait(self, timeout=None):
        t = None
        if self._p2p and timeout is not None:
            secs = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else timeout
            t = secs if secs > 0 else None
        if not self._native.wait(t):
            return False
        self._finish()
        self._raise_if_failed()
        return True

    def is_completed(self):
        if not self._native.poll():
            return False
        self._finish()
        return True

    def is_success(self):
        return (
            self.is_completed() and self._native.error() is None and self._native.failed() == 0
        )

    def exception(self):
        err = self._native.error() if self._native.poll() else None
        return RuntimeError(err) if err else None

    def get_future(self):
        if self._future is None:
            fut = torch.futures.Future()
            self._future = fut

            def waiter():
                try:
                    self.wait()
                    fut.set_result(self._keep_result)
                except Exception as e:  # noqa: BLE001 - handed to the future
                    fut.set_exception(e)

            threading.Thread(target=waiter, daemon=True).start()
        return self._future

    @property
    def _keep_result(self):
        return [t for t, _ in self._copy_back] or None


def get_failed_ranks_hint(work: dist.Work) -> torch.Tensor | None:
    """int32 CPU tensor ``[max_group_size]``: 1 where this rank saw that peer fail in ``work``
    (``None`` for a work object that is not Mooncake's)."""
    if not isinstance(work, _MooncakeWork):
        return None
    mask = work._native.failed()
    n = work._pg._max_group_size
    return torch.tensor([(mask >> i) & 1 for i in range(n)], dtype=torch.int32)


def get_local_success(work: dist.Work) -> bool:
    """True iff every peer this rank exchanged with in ``work`` succeeded (and, for point-to-
    point ops, the op has completed)."""
    if not isinstance(work, _MooncakeWork):
        return False
    if work._p2p and not work._native.poll():
        return False
    return bool(work._native.failed() == 0)


# --------------------------------------------------------------------------------------------
# the process group


def _overlap(xs, ys):
    """Whether any tensor of ``xs`` shares bytes with one of ``ys``."""
    rx = [(t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in xs]
    for t in ys:
        a, b = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
        if any(a < hi and lo < b for lo, hi in rx):
            return True
    return False


class MooncakeProcessGroup(dist.ProcessGroup):
    """One group's Mooncake PG. Created by torch through the registered creators."""

    def __init__(self, dist_backend_opts, options, backend_name):
        rank, size = dist_backend_opts.group_rank, dist_backend_opts.group_size
        super().__init__(rank, size)
        if options is None:
            env = os.environ
            auto_deact = env.get("MOONCAKE_PG_AUTO_DEACTIVATE_ON_FAILURE", "1").lower() not in (
                "0", "false", "no", "off")
            auto_sync = env.get("MOONCAKE_PG_AUTO_SYNC_ON_FAILURE", "1").lower() not in (
                "0", "false", "no", "off")
            options = MooncakeBackendOptions(-1, False, auto_deact, auto_sync and auto_deact)
        if not isinstance(options, MooncakeBackendOptions):
            raise TypeError(f"pg_options must be MooncakeBackendOptions, got {type(options)}")
        mgs = options._max_group_size if options._max_group_size > 0 else size
        if not size <= mgs <= MAX_RANKS:
            raise RuntimeError(f"max_group_size must be in [group_size, {MAX_RANKS}]")
        active = options._active_ranks
        if active is None:
            active = torch.zeros(mgs, dtype=torch.int32)
        elif active.device.type != "cpu":
            raise RuntimeError(
                f"mooncake-rs's Mooncake PG runs on CPU; active_ranks is on {active.device}. "
                "Pass a CPU int32 tensor."
            )
        elif active.numel() < mgs:
            raise RuntimeError(
                f"active_ranks has {active.numel()} elements, max_group_size is {mgs}"
            )
        self._backend_name = backend_name
        # The runtime group has max_group_size slots (as upstream): slots from the torch
        # group's size on start empty and may be taken by processes that extend the group
        # (docs/pg.md, Membership). ``size()`` grows when such a slot becomes active.
        self._rank, self._group_size, self._max_group_size = rank, size, mgs
        self._global_ranks = list(getattr(dist_backend_opts, "global_ranks_in_group", None)
                                  or range(size))
        self._active_ranks = active
        self._auto_sync = options._auto_sync
        self._failures_pending = 0
        store = _incarnation_store(dist_backend_opts.store, rank, size, options._is_extension)
        if options._is_extension:  # a new process joining an existing group (or slot)
            self._comm = _pg_membership.connect_extension(
                store, rank, mgs, options._auto_deactivate, self._global_ranks,
                _Settings.host_ip)
        else:
            self._comm, endpoint = self._connect(
                store, rank, size, options._auto_deactivate, mgs)
            _pg_membership.publish(store, rank, self._comm, endpoint)
            if rank == 0:
                _pg_membership.publish_shape(store, mgs, self._global_ranks)
        self._comm.set_mirror(active.data_ptr(), mgs)
        # torch finds some ops' backend by device (batch_isend_irecv asks it whether it
        # coalesces): register a shim that forwards to this group, as upstream does.
        self._shim = _Shim(rank, size, self)
        for dev in ("cpu",):
            self._register_backend(
                torch.device(dev), dist.ProcessGroup.BackendType.CUSTOM, self._shim)
        self._set_default_backend(dist.ProcessGroup.BackendType.CUSTOM)
        _Settings.initialized = True

    def _connect(self, store, rank, size, auto_deactivate, slots):
        path = f"/dev/shm/mooncake-pg-{os.getpid()}-{uuid.uuid4().hex[:16]}"
        comm = _native.PgComm(path, rank, slots)
        try:
            me = _host_id()
            ip = _Settings.host_ip
            endpoint = f"[{ip}]:{comm.listen(ip)}" if ":" in ip else f"{ip}:{comm.listen(ip)}"
            if rank == 0:
                # The group's id, which every link proves with the cluster secret (if one is
                # set): set before rank 0's segment key, so a rank that saw that key reads it.
                store.set(_GROUP_KEY, uuid.uuid4().hex)
            store.set(f"mooncake_pg/seg/{rank}", f"{me}\n{endpoint}\n{path}")
            keys = [f"mooncake_pg/seg/{r}" for r in range(size)]
            store.wait(keys)
            group = store.get(_GROUP_KEY).decode()
            paths, endpoints = [], []
            for k in keys:
                host, ep, p = store.get(k).decode().split("\n", 2)
                # Same host: memcpy through the peer's segment; other host: TCP (docs/pg.md).
                paths.append(p if host == me else "")
                endpoints.append("" if host == me else ep)
            # Slots past the torch group's size are empty until a process extends the group.
            pad = [""] * (slots - size)
            comm.connect(paths + pad, auto_deactivate, endpoints + pad, size, group)
            # Single-copy reads of peers' tensors (process_vm_readv) only if every rank can
            # read every peer: the same decision everywhere.
            cma = os.environ.get("MC_PG_CMA", "1").lower() not in ("0", "false", "no", "off")
            store.set(f"mooncake_pg/ready/{rank}", "1" if cma and comm.cma_probe() else "0")
            ready = [f"mooncake_pg/ready/{r}" for r in range(size)]
            store.wait(ready)
            comm.set_cma(all(store.get(k) == b"1" for k in ready))
        finally:
            # Every rank has mapped it (or the group failed): the name is no longer needed.
            try:
                os.unlink(path)
            except OSError:
                pass
        return comm, endpoint

    # -- torch surface ---------------------------------------------------------------------

    def getBackendName(self):
        return "mooncake"

    def shutdown(self):
        """Called by ``destroy_process_group()``: stops this rank's workers and releases its
        segment and listener (ops already issued still complete). Without it every destroyed
        incarnation kept its threads and shared memory until the process exited. Later ops
        on this group raise "not connected"."""
        self._comm.close()

    def size(self):
        return self._size

    @property
    def _size(self):
        """The torch group's size, or more once a process that extended the group is
        active: highest active slot + 1. Never less than the torch group's size, so list
        arguments always have one entry per founding rank (docs/pg.md)."""
        g = self._group_size
        if self._max_group_size == g:
            return g
        return max(g, self._comm.active().bit_length())

    def _pad(self, addrs, b, keep):
        """``addrs`` (one per rank of ``size()``) extended to one per slot: the slots past
        it are inactive, their entries point at scratch memory kept alive with the op."""
        missing = self._max_group_size - len(addrs)
        if missing <= 0 or not addrs:
            return addrs
        scratch = torch.empty(max(b, 1) * missing, dtype=torch.uint8)
        keep.append(scratch)
        base = scratch.data_ptr()
        return list(addrs) + [base + i * max(b, 1) for i in range(missing)]

    def __repr__(self):
        return f"MooncakeProcessGroup(rank={self._rank}, size={self._size})"

    # -- helpers ---------------------------------------------------------------------------

    def _after_op(self, failed):
        if failed:
            self._failures_pending |= failed

    def _check(self, t, what="tensor"):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{what} must be a torch.Tensor, got {type(t).__name__}")
        if t.device.type != "cpu":
            raise RuntimeError(
                f"mooncake-rs's Mooncake PG runs on CPU tensors; {what} is on {t.device}. "
                "Move it to the CPU (this build has no GPU data path)."
            )
        code = _DTYPE_CODES.get(t.dtype)
        if code is None:
            raise RuntimeError(f"Unsupported Mooncake PG datatype: {t.dtype}")
        return code

    @staticmethod
    def _one(tensors, what="tensor list"):
        if len(tensors) != 1:
            raise RuntimeError(
                f"Expecting one tensor only but got {'multiple' if tensors else 'none'} "
                f"({what} of length {len(tensors)})."
            )
        return tensors[0]

    @staticmethod
    def _contig(t, copy_back, write=True):
        if t.is_contiguous():
            return t
        c = t.contiguous()
        if write:
            copy_back.append((t, c))
        return c

    @staticmethod
    def _op(opts):
        op = opts.reduceOp
        key = getattr(op, "op", op)
        code = _OP_CODES.get(key)
        if code is None:
            raise RuntimeError(f"Unsupported Mooncake PG op: {op}")
        return code

    def _same(self, ref, others, what):
        for t in others:
            self._check(t, what)
            if t.dtype != ref.dtype or t.numel() != ref.numel():
                raise RuntimeError(
                    f"{what}: every tensor must have the input's dtype and numel "
                    f"({ref.dtype}, {ref.numel()}), got ({t.dtype}, {t.numel()})"
                )

    def _list(self, ts, what):
        if len(ts) != self._size:
            raise RuntimeError(
                f"{what} has {len(ts)} tensors; it must have one per rank ({self._size})"
            )

    def _work(self, native, what, keep, copy_back=(), p2p=False):
        return _MooncakeWork(self, native, what, keep, copy_back, p2p)

    # -- collectives -----------------------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        opts = opts or dist.AllreduceOptions()
        t = self._one(tensors)
        code, op = self._check(t), self._op(opts)
        cb = []
        c = self._contig(t, cb)
        n = self._comm.all_reduce(c.data_ptr(), c.numel() * c.element_size(), code, op)
        return self._work(n, "all_reduce", [t, c], cb)

    def broadcast(self, tensors, opts=None):
        opts = opts or dist.BroadcastOptions()
        t = self._one(tensors)
        code = self._check(t)
        cb = []
        c = self._contig(t, cb)
        root = opts.rootRank + opts.rootTensor
        n = self._comm.broadcast(c.data_ptr(), c.numel() * c.element_size(), code, root)
        return self._work(n, "broadcast", [t, c], cb)

    def allgather(self, output_tensors, input_tensors, opts=None):
        t = self._one(input_tensors, "input list")
        outs = self._one(output_tensors, "output list")
        code = self._check(t)
        self._list(outs, "all_gather's output list")
        self._same(t, outs, "all_gather's output list")
        cb = []
        cin = self._contig(t, cb, write=False)
        couts = [self._contig(o, cb) for o in outs]
        b, keep = cin.numel() * cin.element_size(), [t, cin, outs, couts]
        n = self._comm.all_gather(
            cin.data_ptr(), b, code, self._pad([o.data_ptr() for o in couts], b, keep))
        return self._work(n, "all_gather", keep, cb)

    def all_gather_single(self, output, input, opts=None):
        code = self._check(input)
        self._check(output, "output")
        size = self._size
        if output.dtype != input.dtype or output.numel() != input.numel() * size:
            raise RuntimeError(
                f"all_gather_into_tensor: output must hold {size} x {input.numel()} "
                f"{input.dtype} elements, got {output.numel()} {output.dtype}"
            )
        cb = []
        cin = self._contig(input, cb, write=False)
        cout = self._contig(output, cb)
        b = cin.numel() * cin.element_size()
        base = cout.data_ptr()
        keep = [input, output, cin, cout]
        n = self._comm.all_gather(
            cin.data_ptr(), b, code, self._pad([base + r * b for r in range(size)], b, keep))
        return self._work(n, "all_gather_into_tensor", keep, cb)

    _allgather_base = all_gather_single

    def reduce_scatter_single(self, output, input, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        code, op = self._check(output, "output"), self._op(opts)
        self._check(input, "input")
        size = self._size
        if output.dtype != input.dtype or input.numel() != output.numel() * size:
            raise RuntimeError(
                f"reduce_scatter_tensor: input must hold {size} x {output.numel()} "
                f"{output.dtype} elements, got {input.numel()} {input.dtype}"
            )
        cb = []
        cin = self._contig(input, cb, write=False)
        cout = self._contig(output, cb)
        b = cout.numel() * cout.element_size()
        base = cin.data_ptr()
        keep = [input, output, cin, cout]
        n = self._comm.reduce_scatter(
            self._pad([base + r * b for r in range(size)], b, keep), cout.data_ptr(), b, code,
            op)
        return self._work(n, "reduce_scatter_tensor", keep, cb)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        out = self._one(output_tensors, "output list")
        ins = self._one(input_tensors, "input list")
        code, op = self._check(out, "output"), self._op(opts)
        self._list(ins, "reduce_scatter's input list")
        self._same(out, ins, "reduce_scatter's input list")
        cb = []
        cout = self._contig(out, cb)
        cins = [self._contig(i, cb, write=False) for i in ins]
        b, keep = cout.numel() * cout.element_size(), [out, ins, cout, cins]
        n = self._comm.reduce_scatter(
            self._pad([i.data_ptr() for i in cins], b, keep), cout.data_ptr(), b, code, op)
        return self._work(n, "reduce_scatter", keep, cb)

    def alltoall(self, output_tensors, input_tensors, opts=None):
        self._list(output_tensors, "all_to_all's output list")
        self._list(input_tensors, "all_to_all's input list")
        ref = input_tensors[0]
        code = self._check(ref, "input")
        self._same(ref, input_tensors, "all_to_all's input list")
        self._same(ref, output_tensors, "all_to_all's output list")
        cb = []
        cins = [self._contig(i, cb, write=False) for i in input_tensors]
        couts = [self._contig(o, cb) for o in output_tensors]
        if _overlap(cins, couts):
            cins = [i.clone() for i in cins]  # peers read inputs while outputs are written
        b, keep = ref.numel() * ref.element_size(), [input_tensors, output_tensors, cins, couts]
        n = self._comm.all_to_all(
            self._pad([i.data_ptr() for i in cins], b, keep),
            self._pad([o.data_ptr() for o in couts], b, keep), b, code)
        return self._work(n, "all_to_all", keep, cb)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        code = self._check(input, "input")
        self._check(output, "output")
        if output_split_sizes or input_split_sizes:
            sizes = set(output_split_sizes or []) | set(input_split_sizes or [])
            if len(sizes) > 1:
                raise RuntimeError(
                    "all_to_all_single: Mooncake PG supports equal splits only, got "
                    f"output {list(output_split_sizes)} input {list(input_split_sizes)}"
                )
        size = self._size
        if (output.dtype != input.dtype or output.numel() != input.numel()
                or input.numel() % size or input.dim() == 0):
            raise RuntimeError(
                "all_to_all_single: input and output must have the same dtype and numel, "
                f"divisible by the group size {size}"
            )
        cb = []
        cin = self._contig(input, cb, write=False)
        cout = self._contig(output, cb)
        if _overlap([cin], [cout]):
            cin = cin.clone()
        b = cin.numel() * cin.element_size() // size
        keep = [input, output, cin, cout]
        n = self._comm.all_to_all(
            self._pad([cin.data_ptr() + r * b for r in range(size)], b, keep),
            self._pad([cout.data_ptr() + r * b for r in range(size)], b, keep), b, code)
        return self._work(n, "all_to_all_single", keep, cb)

    alltoall_base = all_to_all_single

    def barrier(self, opts=None):
        return self._work(self._comm.barrier(), "barrier", [])

    def reduce(self, tensors, opts=None):
        opts = opts or dist.ReduceOptions()
        t = self._one(tensors)
        code, op = self._check(t), self._op(opts)
        cb = []
        c = self._contig(t, cb)
        root = opts.rootRank + opts.rootTensor
        # Only the root's tensor is written.
        n = self._comm.reduce(c.data_ptr(), c.numel() * c.element_size(), code, op, root)
        return self._work(n, "reduce", [t, c], cb if self._rank == root else [])

    def gather(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.GatherOptions()
        t = self._one(input_tensors, "input list")
        code = self._check(t)
        root = opts.rootRank
        outs = []
        if self._rank == root:
            outs = self._one(output_tensors, "output list")
            self._list(outs, "gather_list")
            self._same(t, outs, "gather_list")
        cb = []
        cin = self._contig(t, cb, write=False)
        couts = [self._contig(o, cb) for o in outs]
        b, keep = cin.numel() * cin.element_size(), [t, cin, outs, couts]
        n = self._comm.gather(
            cin.data_ptr(), b, code, self._pad([o.data_ptr() for o in couts], b, keep), root)
        return self._work(n, "gather", keep, cb)

    def scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.ScatterOptions()
        out = self._one(output_tensors, "output list")
        code = self._check(out)
        root = opts.rootRank
        ins = []
        if self._rank == root:
            ins = self._one(input_tensors, "input list")
            self._list(ins, "scatter_list")
            self._same(out, ins, "scatter_list")
        cb = []
        cout = self._contig(out, cb)
        cins = [self._contig(i, cb, write=False) for i in ins]
        b, keep = cout.numel() * cout.element_size(), [out, ins, cout, cins]
        n = self._comm.scatter(
            self._pad([i.data_ptr() for i in cins], b, keep), cout.data_ptr(), b, code, root)
        return self._work(n, "scatter", keep, cb)

    # -- point to point --------------------------------------------------------------------

    def _p2p(self, tensors, peer, is_send):
        t = self._one(tensors)
        self._check(t)
        if not 0 <= peer < self._max_group_size or peer == self._rank:
            raise RuntimeError(
                f"peer rank {peer} is not another rank of this group of {self._size}"
            )
        cb = []
        c = self._contig(t, cb, write=not is_send)
        n = self._comm.p2p(is_send, peer, c.data_ptr(), c.numel() * c.element_size())
        return self._work(n, "send" if is_send else "recv", [t, c], cb, p2p=True)

    def send(self, tensors, dstRank, tag=0):
        return self._p2p(tensors, dstRank, True)

    def recv(self, tensors, srcRank, tag=0):
        return self._p2p(tensors, srcRank, False)

    def recv_anysource(self, tensors, tag=0):
        raise RuntimeError("Mooncake PG does not support recv from any source")


_FORWARDED = (
    "allreduce", "broadcast", "allgather", "all_gather_single", "_allgather_base",
    "reduce_scatter", "reduce_scatter_single", "_reduce_scatter_base", "alltoall",
    "all_to_all_single", "alltoall_base", "barrier", "reduce", "gather", "scatter", "send",
    "recv", "recv_anysource",
)


class _Shim(torch._C._distributed_c10d.Backend):
    """The device backend of a :class:`MooncakeProcessGroup`: forwards every op to it."""

    def __init__(self, rank, size, owner):
        super().__init__(rank, size)
        self._owner = owner

    def getBackendName(self):
        return "mooncake"

    @property
    def supports_coalescing(self):
        return False


def _forward(name):
    def f(self, *args, **kwargs):
        return getattr(self._owner, name)(*args, **kwargs)

    f.__name__ = name
    return f


for _name in _FORWARDED:
    setattr(_Shim, _name, _forward(_name))


# --------------------------------------------------------------------------------------------
# creators and registration


def createMooncakeCpuBackend(
    dist_backend_opts: Any, backend_options: MooncakeBackendOptions | None
) -> MooncakeProcessGroup:
    """Creator of ``"mooncake-cpu"``."""
    return MooncakeProcessGroup(dist_backend_opts, backend_options, "mooncake-cpu")


def createMooncakeBackend(
    dist_backend_opts: Any, backend_options: MooncakeBackendOptions | None
) -> MooncakeProcessGroup:
    """Creator of ``"mooncake"``: CPU tensors here (this build has no GPU data path)."""
    return MooncakeProcessGroup(dist_backend_opts, backend_options, "mooncake")


def _register() -> None:
    have = set(dist.Backend.backend_list)
    if "mooncake-cpu" not in have:
        dist.Backend.register_backend(
            "mooncake-cpu", createMooncakeCpuBackend, extended_api=True, devices=["cpu"])
    if "mooncake" not in have:
        dist.Backend.register_backend(
            "mooncake", createMooncakeBackend, extended_api=True, devices=["cpu", "cuda"])


_register()


# --------------------------------------------------------------------------------------------
# module functions on a group


def _pg(backend: Backend) -> MooncakeProcessGroup:
    if isinstance(backend, MooncakeProcessGroup):
        return backend
    if backend is None or backend is dist.GroupMember.WORLD:
        backend = dist.distributed_c10d._get_default_group()
    if isinstance(backend, MooncakeProcessGroup):
        return backend
    raise RuntimeError(f"not a Mooncake PG: {backend!r}")


def get_active_ranks(backend: Backend) -> torch.Tensor:
    """The group's live ``active_ranks`` int32 tensor (length ``max_group_size``)."""
    active: torch.Tensor = _pg(backend)._active_ranks
    return active


def extend_group_size_to(backend: Backend, size: int) -> None:
    """Deprecated no-op (upstream warns too)."""
    warnings.warn("extend_group_size_to is deprecated and does nothing", stacklevel=2)


def get_current_epoch(backend: Backend) -> int:
    """Epoch of the group's view: 0 at start, +1 per change of the active set."""
    return int(_pg(backend)._comm.epoch())


def sync_after_failure(backend: Backend) -> SyncAfterFailureResponse:
    """Failures are applied to the local view when they are seen, so this answers at once:
    ``Reconciled`` if failures were seen since the last call, else ``NoPending``."""
    pg = _pg(backend)
    seen = pg._comm.take_failures() | pg._failures_pending
    pg._failures_pending = 0
    status = SyncAfterFailureStatus.Reconciled if seen else SyncAfterFailureStatus.NoPending
    return SyncAfterFailureResponse(status)


# Membership (``_pg_membership`` does the work on the resolved group).


def activate_ranks(backend: Backend, ranks: Iterable[int]) -> ProposeViewUpdateResponse:
    """Proposes activating ``ranks`` (in-group ranks); blocks until decided. ``Applied`` at
    once when they are all active already (so every survivor may call it); otherwise each
    target must be alive and waiting in :func:`join_group` (up to 20 s, then ``Rejected``).
    The change takes effect from the first collective no member had started when it was
    decided, on every member."""
    return _pg_membership.activate_ranks(_pg(backend), ranks)


recover_ranks = activate_ranks


def deactivate_ranks(backend: Backend, ranks: Iterable[int]) -> ProposeViewUpdateResponse:
    """Proposes deactivating ``ranks``; blocks until decided. ``[own rank]`` is a graceful
    leave: this rank's collectives fail from now on ("not active") and the others drop it
    from their next collective. Deactivating other ranks goes through the decider and takes
    effect at the same collective on every member."""
    return _pg_membership.deactivate_ranks(_pg(backend), ranks)


def join_group(backend: Backend) -> None:
    """Waits (up to 300 s) until a member activates this rank (``activate_ranks`` /
    ``recover_ranks``). For a replacement process (``is_extension=True``) and for a rank that
    was deactivated (in-place rejoin). Raises if this rank is already active, left the group,
    or no live member exists."""
    _pg_membership.join_group(_pg(backend))


def get_peer_state(backend: Backend, ranks: Iterable[int]) -> list[bool]:
    """Local readiness of each rank (no communication): alive and either active in the
    newest view or waiting in ``join_group``."""
    return _pg_membership.get_peer_state(_pg(backend), ranks)


def get_num_synced_ranks(backend: Backend) -> int:
    """Ranks that are ready in the sense of :func:`get_peer_state` (this one included)."""
    return _pg_membership.get_num_synced_ranks(_pg(backend))
