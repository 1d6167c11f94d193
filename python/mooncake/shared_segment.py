"""`mooncake.shared_segment`: process-shared host memory, one writer and many readers.

When every rank of a group holds the same data (MLA's KV cache in every TP rank), offloading it
per rank multiplies host memory by the group size. A shared segment allocates the pages once,
in `owner_rank`, and maps them into every rank; each rank gets tensors viewing them.

Layout: the declared blocks, sorted by name, each rounded up to 4 KiB, form one *stride*;
entry `i` of block `b` lives at `offset[b] + i * stride`; the segment is `stride * max(count)`
bytes. Every rank computes the layout itself and checks that all ranks declared the same one.

Backing here: a POSIX shared-memory file (`/dev/shm/mooncake_seg_*`) that the owner creates
and every other rank maps (`mmap=True`). The rank-to-rank handshake is one all-gather of
fixed-size blobs over the torch.distributed group (a gloo or CPU group): each blob carries the
layout fingerprint and, from the owner, the file name. The owner removes the file name once all
ranks have mapped it, so the memory goes away with the last mapping. Not offered by this build
(SharedSegmentError): the device VMM path (`mmap=False`) and `host_register=True` (both need an
accelerator runtime).
"""

from __future__ import annotations

import ctypes
import hashlib
import mmap as _mmap
import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "SharedSegment",
    "SharedSegmentError",
    "create_shared_segment",
    "shared_segment_supported",
]

_ALIGN = 4096
_BLOB_BYTES = 256
_SHM_DIR = "/dev/shm"


class SharedSegmentError(RuntimeError):
    """A shared segment cannot be created or addressed."""


@dataclass(frozen=True)
class _BlockSpec:
    count: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    nbytes: int


def shared_segment_supported(mmap: bool = True, host_register: bool = False) -> bool:
    """Only the POSIX shared-memory backing, without device registration."""
    return bool(mmap) and not host_register and os.path.isdir(_SHM_DIR)


def _parse_block(name: str, spec: Mapping[str, Any]) -> _BlockSpec:
    try:
        count = int(spec["count"])
        shape = tuple(int(d) for d in spec["shape"])
        dtype = spec["dtype"]
    except (KeyError, TypeError) as exc:
        raise SharedSegmentError(f"Block {name!r} needs count, shape and dtype") from exc
    if count <= 0:
        raise SharedSegmentError(f"Block {name!r} needs a positive count")
    if not shape or any(d <= 0 for d in shape):
        raise SharedSegmentError(f"Block {name!r} needs a positive shape")
    nbytes = torch.empty(0, dtype=dtype).element_size()
    for d in shape:
        nbytes *= d
    return _BlockSpec(count, shape, dtype, nbytes)


def _align_up(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _build_layout(specs: dict, names: Sequence[str]):
    """(offset of each block in a stride, stride, total bytes)."""
    offsets, stride = {}, 0
    for n in names:
        offsets[n] = stride
        stride += _align_up(specs[n].nbytes)
    if stride == 0:
        raise SharedSegmentError("Shared segment needs at least one block")
    return offsets, stride, stride * max(s.count for s in specs.values())


def _fingerprint(name: str, specs: dict, names: Sequence[str]) -> bytes:
    tag = ";".join(
        f"{n}:{specs[n].count}:{'x'.join(map(str, specs[n].shape))}:{specs[n].dtype}:"
        f"{specs[n].nbytes}" for n in names
    )
    return hashlib.sha256(f"{name}|{tag}".encode()).digest()[:16]


def _group(comm_group: Any, tp_group: Any) -> Any:
    if tp_group is None:
        return comm_group
    if comm_group is None or comm_group is tp_group:
        return tp_group
    raise SharedSegmentError("pass only comm_group; tp_group is a deprecated alias of comm_group")


def _cpu_group(comm_group: Any) -> Any:
    """A vLLM GroupCoordinator exposes its gloo group as `cpu_group`."""
    return getattr(comm_group, "cpu_group", None) or comm_group


def _agree(error: str, world_size: int, rank_id: int, comm_group: Any, phase: str) -> None:
    """Every rank leaves a failed phase with the same error."""
    if world_size == 1:
        if error:
            raise SharedSegmentError(error)
        return
    if comm_group is None:
        raise SharedSegmentError("comm_group is required when world_size > 1")
    failures: list = [None] * world_size
    dist.all_gather_object(failures, (rank_id, error) if error else None,
                           group=_cpu_group(comm_group))
    failed = [f for f in failures if f is not None]
    if failed:
        detail = "; ".join(f"rank {r}: {m}" for r, m in failed)
        raise SharedSegmentError(f"Shared segment {phase} failed: {detail}")


def _all_gather(blob: bytes, world_size: int, comm_group: Any) -> list[bytes]:
    local = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
    out = [torch.empty_like(local) for _ in range(world_size)]
    dist.all_gather(out, local, group=_cpu_group(comm_group))
    return [bytes(t.numpy()) for t in out]


class _Mapping:
    """One rank's mapping of the segment file (the owner also created it)."""

    def __init__(self, path: str, size: int, create: bool):
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, size)
            elif os.fstat(fd).st_size != size:
                raise SharedSegmentError(
                    f"{path} holds {os.fstat(fd).st_size} bytes, the layout needs {size}")
            self.map = _mmap.mmap(fd, size, _mmap.MAP_SHARED, _mmap.PROT_READ | _mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.path, self.size, self.owner = path, size, create
        self.base = ctypes.addressof(ctypes.c_char.from_buffer(self.map))

    def unlink(self):
        if self.owner and self.path:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            self.path = ""


def create_shared_segment(
    name: str,
    blocks: Mapping[str, Mapping[str, Any]],
    world_size: int,
    rank_id: int,
    owner_rank: int = 0,
    device_id: int | None = None,
    comm_group: Any = None,
    mmap: bool = True,
    host_register: bool = False,
    *,
    tp_group: Any = None,
) -> "SharedSegment":
    """Creates the segment in `owner_rank`, maps it everywhere and returns it. Every rank of
    the group calls this with the same declaration; a disagreement raises on every rank."""
    comm_group = _group(comm_group, tp_group)
    if host_register and not mmap:
        raise SharedSegmentError("host_register requires mmap=True")
    if not mmap:
        raise SharedSegmentError("This mooncake build has no VMM backend for shared segments")
    if host_register:
        raise SharedSegmentError("This mooncake build cannot HostRegister shared-segment pages")
    if not 0 <= rank_id < world_size or not 0 <= owner_rank < world_size:
        raise SharedSegmentError(f"rank {rank_id} / owner {owner_rank} not in [0, {world_size})")
    if world_size > 1 and comm_group is None:
        # Before anything is created: the owner would otherwise leave its file behind.
        raise SharedSegmentError("comm_group is required when world_size > 1")
    names = sorted(blocks)
    specs = {n: _parse_block(n, blocks[n]) for n in names}
    offsets, stride, total = _build_layout(specs, names)
    fp = _fingerprint(name, specs, names)
    mapping, error, path = None, "", ""
    if rank_id == owner_rank:
        path = os.path.join(_SHM_DIR, f"mooncake_seg_{os.getpid()}_{secrets.token_hex(8)}")
        try:
            mapping = _Mapping(path, total, create=True)
        except OSError as exc:
            error = f"cannot create {path}: {exc}"
    try:
        _agree(error, world_size, rank_id, comm_group, "create")
    except BaseException:
        if mapping is not None:
            mapping.unlink()
        raise
    raw = fp + path.encode()
    if len(raw) > _BLOB_BYTES:
        raise SharedSegmentError("shared memory path too long")
    blob = raw + b"\0" * (_BLOB_BYTES - len(raw))
    blobs = [blob] if world_size == 1 else _all_gather(blob, world_size, comm_group)
    error = ""
    if any(b[:16] != fp for b in blobs):
        error = "ranks declared different layouts for shared segment " + repr(name)
    elif mapping is None:
        owner_path = blobs[owner_rank][16:].rstrip(b"\0").decode()
        try:
            mapping = _Mapping(owner_path, total, create=False)
        except (OSError, SharedSegmentError) as exc:
            error = f"cannot map {owner_path}: {exc}"
    try:
        _agree(error, world_size, rank_id, comm_group, "complete")
    finally:
        # Everyone has mapped it (or given up): the name is no longer needed.
        if mapping is not None:
            mapping.unlink()
    device = 0 if device_id is None else device_id
    return SharedSegment(mapping, specs, offsets, stride, device)


class SharedSegment:
    """One shared segment; alive while any of its tensors is."""

    def __init__(self, segment: Any, specs: dict, offsets: dict, stride: int, device_id: int):
        self._segment = segment
        self._specs = specs
        self._offsets = offsets
        self._stride = stride
        self._device_id = device_id

    def tensors(self, block: str) -> list[torch.Tensor]:
        """Views of every entry of `block`, in index order (CPU tensors on the shared pages)."""
        spec = self._specs.get(block)
        if spec is None:
            raise SharedSegmentError(f"Unknown shared segment block {block!r}")
        views = []
        for i in range(spec.count):
            addr = self._segment.base + self._offsets[block] + i * self._stride
            mem = (ctypes.c_int8 * spec.nbytes).from_address(addr)
            view = torch.frombuffer(mem, dtype=spec.dtype).view(spec.shape)
            view._mooncake_segment = self
            views.append(view)
        return views

    def base_addr(self) -> int:
        """The segment's start address in this process."""
        return self._segment.base

    def total_size(self) -> int:
        """The segment's size in bytes."""
        return self._segment.size
