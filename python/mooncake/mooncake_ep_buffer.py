"""Mooncake EP on CPU: expert-parallel ``dispatch`` / ``combine`` between the ranks of a group.

``Buffer(group, num_ep_buffer_bytes)`` gives each rank a shared-memory EP buffer that every
other rank of the group on the same host maps (ranks on other hosts write it through a TCP
link). ``dispatch`` sends each token's row to the rank of every expert
it is routed to, by writing it straight into that rank's buffer (one-sided writes; counters in
the buffer header say when a source has finished); ``combine`` writes the expert outputs back
into the tokens' source ranks and sums them there with the routing weights. The copying,
fp8 quantisation and the weighted sum run in Rust (``mooncake._native.EpBuffer``,
``collective::ep``); Python checks arguments and allocates outputs and never loops
over tokens. See ``docs/ep.md`` for the design and for what differs
from upstream (which runs the same API on GPUs over RDMA/NVLink).
"""

from __future__ import annotations

import os
import uuid
import warnings
from typing import Optional

import torch
import torch.distributed as dist

from mooncake import _native

__all__ = ["Buffer", "EventHandle", "EventOverlap", "EpArgumentError"]

_MAX_RANKS = 64
_PATH_BYTES = 512


class EpArgumentError(ValueError, AssertionError):
    """A bad argument to dispatch/combine. Upstream checks these with ``assert``, so this is
    also an ``AssertionError``; the message says what was expected and what arrived."""


def _need(cond, msg):
    if not cond:
        raise EpArgumentError(msg)


class EventHandle:
    """An event of a finished CPU operation: waiting on it returns at once."""

    def __init__(self, stream_ptr: int = 0):
        self.stream_ptr = stream_ptr

    def current_stream_wait(self, stream_ptr: int = 0) -> None:
        """The work is already done on CPU; nothing to order."""

    def synchronize(self) -> None:
        """The work is already done on CPU."""

    def is_complete(self) -> bool:
        """True: the work is already done on CPU."""
        return True


class EventOverlap:
    """Upstream's (DeepEP's) ``EventOverlap``: an optional event and the tensors to keep alive
    until it completes. On CPU the work has completed when this is returned."""

    def __init__(self, event: Optional[EventHandle] = None, extra_tensors=None):
        self.event = event
        self.extra_tensors = extra_tensors

    def current_stream_wait(self) -> None:
        """Orders the current stream after the event, if there is one (nothing to wait for on
        CPU)."""
        if self.event is not None:
            self.event.current_stream_wait()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.current_stream_wait()


def _host_id():
    """Ranks with equal host ids share memory; others are linked over TCP. ``MC_PG_HOST_ID``
    overrides it, as for ``mooncake.pg`` (tests run "other hosts" on one machine that way)."""
    forced = os.environ.get("MC_PG_HOST_ID")
    if forced:
        return forced
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    import socket

    return f"{socket.gethostname()}/{boot}"


def _host_ip():
    """The address this rank's EP listener binds and advertises: ``pg.set_host_ip``'s."""
    try:
        from mooncake import pg
    except ImportError:
        return "127.0.0.1"
    return pg._Settings.host_ip


def _is_mooncake_group(group):
    try:
        from mooncake import pg
    except ImportError:  # torch without the Mooncake PG: cannot be one
        return False
    try:
        pg._pg(group)
        return True
    except RuntimeError:
        return False


class Buffer:
    """A rank's EP buffer in ``group`` (any torch process group; the Mooncake Backend for
    ``active_ranks`` from the group)."""

    def __init__(self, group: dist.ProcessGroup, num_ep_buffer_bytes: int = 0,
                 disable_p2p: bool = False):
        if group is None or group is dist.GroupMember.WORLD:
            group = dist.distributed_c10d._get_default_group()
        if isinstance(num_ep_buffer_bytes, bool) or not isinstance(num_ep_buffer_bytes, int) \
                or num_ep_buffer_bytes < 0:
            raise EpArgumentError(
                f"num_ep_buffer_bytes must be an int >= 0, got {num_ep_buffer_bytes!r}")
        self.group = group
        self.backend = group
        self.rank = group.rank()
        self.group_size = group.size()
        if self.group_size > _MAX_RANKS:
            raise RuntimeError(
                f"Mooncake EP supports groups of at most {_MAX_RANKS} ranks, got {self.group_size}")
        self.num_ep_buffer_bytes = num_ep_buffer_bytes
        self.disable_p2p = disable_p2p
        self.runtime = None
        # Upstream's flag for its pure-torch path; this build always uses the native one.
        self._use_fallback = False
        self._next_combine_buffer = None
        self._warned_active = False
        self.connect()

    # -- bootstrap ---------------------------------------------------------------------------

    def connect(self, is_update: bool = False) -> None:
        """Creates a fresh EP buffer, exchanges its host id, name, TCP endpoint and size with
        every rank of the group (one ``all_gather`` and one ``barrier``, the same on every
        rank), maps the buffers of peers on this host and links to the others over TCP."""
        path = f"/dev/shm/mooncake-ep-{os.getpid()}-{uuid.uuid4().hex[:16]}"
        rt = _native.EpBuffer(path, self.rank, self.group_size, self.num_ep_buffer_bytes,
                              _host_ip())
        try:
            me = _host_id()
            info = f"{me}\n{rt.endpoint}\n{self.num_ep_buffer_bytes}\n{path}".encode()
            if len(info) > _PATH_BYTES:
                raise RuntimeError(f"EP buffer name too long: {info!r}")
            t = torch.zeros(_PATH_BYTES, dtype=torch.uint8)
            t[: len(info)] = torch.frombuffer(bytearray(info), dtype=torch.uint8)
            got = [torch.empty_like(t) for _ in range(self.group_size)]
            dist.all_gather(got, t, group=self.group)
            hosts, endpoints, sizes, paths = [], [], [], []
            for g in got:
                host, ep, size, p = bytes(g.tolist()).rstrip(b"\0").decode().split("\n", 3)
                hosts.append(host)
                endpoints.append(ep)
                sizes.append(int(size))
                paths.append(p)
            rt.connect(paths, hosts, endpoints, sizes)
            dist.barrier(group=self.group)
        finally:
            try:
                os.unlink(path)
            except OSError:
                pass
        self.runtime = rt

    def update_ep_member(self) -> None:
        """Reconnects after a membership change (a restarted rank creates a new ``Buffer``
        while the others call this): the same collective sequence as the constructor; every
        rank starts again with fresh buffers and call counters."""
        self.connect(True)

    # -- static -----------------------------------------------------------------------------

    @staticmethod
    def get_ep_buffer_size_hint(num_max_dispatch_tokens_per_rank: int, hidden: int,
                                num_ranks: int, num_experts: int) -> int:
        """Upstream's buffer size for this shape, ``16E + 4ET(32 + 2H)`` bytes (computed,
        not allocated)."""
        return _native.ep_size_hint(num_max_dispatch_tokens_per_rank, hidden, num_ranks,
                                    num_experts)

    # -- helpers ----------------------------------------------------------------------------

    def _group_active(self):
        if _is_mooncake_group(self.group):
            from mooncake import pg

            return pg.get_active_ranks(self.group)[: self.group_size].to(torch.int32).clone()
        if not self._warned_active:
            self._warned_active = True
            warnings.warn(
                "Mooncake EP active_ranks is only available with the mooncake process group; "
                "using all ranks as active", RuntimeWarning, stacklevel=3)
        return torch.ones(self.group_size, dtype=torch.int32)

    def _active(self, active_ranks):
        """The int32 tensor the call reads and marks, and its mask."""
        if active_ranks is None:
            t = self._group_active()
        else:
            _need(isinstance(active_ranks, torch.Tensor),
                  f"active_ranks must be a tensor or None, got {type(active_ranks).__name__}")
            _need(active_ranks.device.type == "cpu",
                  f"Mooncake EP runs on CPU here; active_ranks is on {active_ranks.device}")
            _need(active_ranks.dim() == 1 and active_ranks.is_contiguous()
                  and active_ranks.dtype == torch.int32,
                  f"active_ranks must be a 1-D contiguous int32 tensor, got "
                  f"{active_ranks.dtype} of shape {tuple(active_ranks.shape)}")
            # Upstream replaces a tensor of the wrong length by all-ones without a word, and
            # callers rely on it; so does this build (the caller's tensor is not updated).
            t = active_ranks if active_ranks.numel() == self.group_size else torch.ones(
                self.group_size, dtype=torch.int32)
        mask = 0
        for r, v in enumerate(t.tolist()):
            if v:
                mask |= 1 << r
        return t, mask

    def _mark(self, t, before, after):
        """Clears in ``t`` the ranks the call found unresponsive."""
        dropped = before & ~after
        for r in range(self.group_size):
            if dropped >> r & 1:
                t[r] = 0

    @staticmethod
    def _cpu(t, what):
        _need(isinstance(t, torch.Tensor), f"{what} must be a tensor, got {type(t).__name__}")
        _need(t.device.type == "cpu",
              f"{what} is on {t.device}: mooncake-rs's Mooncake EP runs on CPU tensors")

    @staticmethod
    def _timeout(timeout_us):
        _need(isinstance(timeout_us, int) and not isinstance(timeout_us, bool)
              and timeout_us >= -1,
              f"timeout_us must be -1 (no timeout) or >= 0 microseconds, got {timeout_us!r}")

    # -- dispatch ---------------------------------------------------------------------------

    def dispatch(self, x: torch.Tensor, topk_idx: torch.Tensor, active_ranks: torch.Tensor,
                 num_max_dispatch_tokens_per_rank: int, num_experts: int, timeout_us: int,
                 use_fp8: Optional[bool] = None, async_finish: bool = False,
                 return_recv_hook: bool = False):
        """Sends every token to the ranks of its experts.

        Returns ``(recv_x, recv_count, handle, event, hook)``: ``recv_x`` ``[L, N, H]`` bf16
        (or ``(fp8 data, float32 scales [L, N, H/128])``), ``recv_count`` int32 ``[L]``,
        ``handle = (src_info, layout_range, T, H, num_experts)``. With
        ``return_recv_hook=True`` the tokens are sent now and received when ``hook()`` is
        called (the outputs are filled then)."""
        self._cpu(x, "x")
        self._cpu(topk_idx, "topk_idx")
        _need(x.dim() == 2 and x.is_contiguous() and x.dtype == torch.bfloat16,
              f"x must be a 2-D contiguous bfloat16 tensor, got {x.dtype} of shape "
              f"{tuple(x.shape)}")
        _need(topk_idx.dim() == 2 and topk_idx.is_contiguous()
              and topk_idx.dtype == torch.int64,
              f"topk_idx must be a 2-D contiguous int64 tensor, got {topk_idx.dtype} of shape "
              f"{tuple(topk_idx.shape)}")
        tokens, hidden = x.shape
        t_max = num_max_dispatch_tokens_per_rank
        _need(topk_idx.size(0) == tokens,
              f"x has {tokens} tokens, topk_idx has {topk_idx.size(0)} rows")
        _need(isinstance(t_max, int) and t_max > 0,
              f"num_max_dispatch_tokens_per_rank must be a positive int, got {t_max!r}")
        _need(tokens <= t_max,
              f"{tokens} tokens, more than num_max_dispatch_tokens_per_rank = {t_max}")
        _need(hidden > 0 and hidden % 128 == 0,
              f"hidden must be a positive multiple of 128, got {hidden}")
        _need(isinstance(num_experts, int) and num_experts > 0
              and num_experts % self.group_size == 0,
              f"num_experts must be a positive multiple of the group size "
              f"({self.group_size}), got {num_experts!r}")
        _need(not (async_finish and return_recv_hook),
              "async_finish and return_recv_hook cannot both be set")
        self._timeout(timeout_us)
        fp8 = True if use_fp8 is None else bool(use_fp8)
        act, mask = self._active(active_ranks)
        rt = self._rt()
        self._check_size(t_max, hidden, num_experts)

        n_local = num_experts // self.group_size
        n = self.group_size * t_max
        if fp8:
            data = torch.empty((n_local, n, hidden), dtype=torch.float8_e4m3fn)
            scales = torch.empty((n_local, n, hidden // 128), dtype=torch.float32)
            recv_x = (data, scales)
        else:
            data = torch.empty((n_local, n, hidden), dtype=torch.bfloat16)
            scales = None
            recv_x = data
        count = torch.empty(n_local, dtype=torch.int32)
        src_info = torch.empty((n_local, n), dtype=torch.int32)
        layout = torch.empty((n_local, self.group_size), dtype=torch.int64)
        k = topk_idx.size(1)
        call, after = rt.dispatch_send(x.data_ptr(), tokens, topk_idx.data_ptr(), k, t_max,
                                       hidden, num_experts, fp8, mask, timeout_us)
        self._mark(act, mask, after)

        def receive():
            m = 0
            for r, v in enumerate(act.tolist()):
                if v:
                    m |= 1 << r
            got = rt.dispatch_recv(call, data.data_ptr(),
                                   0 if scales is None else scales.data_ptr(),
                                   count.data_ptr(), src_info.data_ptr(), layout.data_ptr(),
                                   t_max, hidden, num_experts, fp8, m, timeout_us)
            self._mark(act, m, got)

        handle = (src_info, layout, t_max, hidden, num_experts)
        hook = self._hook(receive, return_recv_hook)
        event = self._event(async_finish, (x, topk_idx, data, scales, count, src_info, layout))
        return recv_x, count, handle, event, hook

    # -- combine ----------------------------------------------------------------------------

    def get_next_combine_buffer(self, handle) -> torch.Tensor:
        """The persistent bf16 ``[L, N, H]`` tensor ``combine(..., zero_copy=True)`` reads the
        expert outputs from: write them here instead of passing them."""
        src_info, layout, t_max, hidden, num_experts = handle
        shape = (num_experts // self.group_size, self.group_size * t_max, hidden)
        b = self._next_combine_buffer
        if b is None or tuple(b.shape) != shape:
            b = torch.zeros(shape, dtype=torch.bfloat16)
            self._next_combine_buffer = b
        return b

    def combine(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor,
                active_ranks: torch.Tensor, timeout_us: int, handle: tuple,
                zero_copy: bool = False, async_finish: bool = False,
                return_recv_hook: bool = False, out: Optional[torch.Tensor] = None):
        """Sends the expert outputs back and sums them per token with ``topk_weights``.

        Returns ``(combined_x, event, hook)`` with ``combined_x`` bf16 ``[num_tokens, H]``
        (``out`` if given). Experts on inactive ranks are left out; the weights are not
        renormalised. With ``zero_copy=True`` the outputs are read from
        ``get_next_combine_buffer(handle)`` and ``x`` is ignored."""
        _need(isinstance(handle, tuple) and len(handle) == 5,
              "handle must be the 5-tuple dispatch returned")
        src_info, layout, t_max, hidden, num_experts = handle
        n_local = num_experts // self.group_size
        n = self.group_size * t_max
        if zero_copy:
            x = self.get_next_combine_buffer(handle)
        self._cpu(x, "x")
        self._cpu(topk_idx, "topk_idx")
        self._cpu(topk_weights, "topk_weights")
        _need(x.dim() == 3 and x.is_contiguous() and x.dtype == torch.bfloat16,
              f"x must be a 3-D contiguous bfloat16 tensor, got {x.dtype} of shape "
              f"{tuple(x.shape)}")
        _need(tuple(x.shape) == (n_local, n, hidden),
              f"x must have shape {(n_local, n, hidden)} (local experts, ranks * T, hidden), "
              f"got {tuple(x.shape)}")
        _need(topk_idx.dim() == 2 and topk_idx.is_contiguous()
              and topk_idx.dtype == torch.int64,
              f"topk_idx must be a 2-D contiguous int64 tensor, got {topk_idx.dtype} of shape "
              f"{tuple(topk_idx.shape)}")
        _need(topk_weights.dim() == 2 and topk_weights.is_contiguous()
              and topk_weights.dtype == torch.float32,
              f"topk_weights must be a 2-D contiguous float32 tensor, got "
              f"{topk_weights.dtype} of shape {tuple(topk_weights.shape)}")
        _need(topk_weights.shape == topk_idx.shape,
              f"topk_weights has shape {tuple(topk_weights.shape)}, topk_idx "
              f"{tuple(topk_idx.shape)}")
        tokens, k = topk_idx.shape
        _need(tokens <= t_max,
              f"{tokens} tokens, more than num_max_dispatch_tokens_per_rank = {t_max}")
        for t, what, dt, shape in ((src_info, "src_info", torch.int32, (n_local, n)),
                                   (layout, "layout_range", torch.int64,
                                    (n_local, self.group_size))):
            self._cpu(t, f"handle's {what}")
            _need(t.dtype == dt and tuple(t.shape) == shape and t.is_contiguous(),
                  f"handle's {what} must be contiguous {dt} of shape {shape}, got {t.dtype} "
                  f"of shape {tuple(t.shape)}")
        if out is not None:
            self._cpu(out, "out")
            _need(out.dim() == 2 and out.is_contiguous() and out.dtype == x.dtype
                  and tuple(out.shape) == (tokens, hidden),
                  f"out must be a contiguous bfloat16 tensor of shape {(tokens, hidden)}, got "
                  f"{out.dtype} of shape {tuple(out.shape)}")
        _need(not (async_finish and return_recv_hook),
              "async_finish and return_recv_hook cannot both be set")
        self._timeout(timeout_us)
        act, mask = self._active(active_ranks)
        rt = self._rt()
        self._check_size(t_max, hidden, num_experts)
        combined = out if out is not None else torch.empty((tokens, hidden),
                                                           dtype=torch.bfloat16)
        call, after = rt.combine_send(x.data_ptr(), src_info.data_ptr(), layout.data_ptr(),
                                      topk_idx.data_ptr(), tokens, k, t_max, hidden,
                                      num_experts, mask, timeout_us)
        self._mark(act, mask, after)

        def receive():
            m = 0
            for r, v in enumerate(act.tolist()):
                if v:
                    m |= 1 << r
            got = rt.combine_recv(call, topk_idx.data_ptr(), topk_weights.data_ptr(), tokens,
                                  k, combined.data_ptr(), t_max, hidden, num_experts, m,
                                  timeout_us)
            self._mark(act, m, got)

        hook = self._hook(receive, return_recv_hook)
        event = self._event(async_finish, (x, topk_idx, topk_weights, src_info, layout,
                                           combined))
        return combined, event, hook

    # -- shared -----------------------------------------------------------------------------

    def _rt(self):
        if self.runtime is None:
            raise RuntimeError("the Mooncake EP buffer is not connected")
        return self.runtime

    def _check_size(self, t_max, hidden, num_experts):
        need = _native.EpBuffer.need_bytes(self.group_size, t_max, hidden, num_experts)
        if need > self.num_ep_buffer_bytes:
            hint = self.get_ep_buffer_size_hint(t_max, hidden, self.group_size, num_experts)
            raise EpArgumentError(
                f"num_ep_buffer_bytes = {self.num_ep_buffer_bytes} is too small for T={t_max}, "
                f"hidden={hidden}, num_experts={num_experts}: needs {need} "
                f"(get_ep_buffer_size_hint gives {hint})")

    @staticmethod
    def _hook(receive, deferred):
        """Runs ``receive`` now, or returns it as the hook (once; later calls do nothing)."""
        if not deferred:
            receive()
            return lambda: None
        done = []

        def hook():
            if not done:
                done.append(True)
                receive()

        return hook

    @staticmethod
    def _event(async_finish, tensors):
        if async_finish:
            return EventOverlap(EventHandle(), tensors)
        return EventOverlap(None, None)
