"""Unified parallel tensor IO: `put/get_tensor_with_parallelism*` and writer partitions.

A writer says how its tensor relates to the global one with a `TensorParallelism` (a list of
`ParallelAxis`: kind `tp|dp|ep|pp`, rank, size, split dim, expert or stage id) or with a
`writer_partition` (any object with `rank`, `size` and `split_dim` attributes). What is stored,
as upstream 0.3.13 does it (observed on its wheel; `python/tests/test_dropin_parallel.py`):

- one TP axis: the tensor *is* the rank's shard; key `{base}_tp_{rank}` (the legacy TP key),
  global shape = shard shape with the split dim times `size` (but the `_from` forms take the
  buffer's tensor as the global one and store the rank's slice of it);
- any other axis list: the tensor is the global one and each TP axis cuts its rank's slice;
  key `{base}__{axis}__{axis}...` with axes in canonical order (dp, tp, ep, pp), each
  `{kind}_{rank}of{size}[_sd{split_dim}][_eid{expert}][_sid{stage}]`;
- a writer partition: the tensor is the global one, the rank's slice goes to
  `{base}__writer_{rank}of{size}_sd{split_dim}`.

Every shard carries the 304-byte header with `layout_kind = SHARD`, its global shape and its
axes (in the caller's order). A layout with a TP axis (and every writer partition) also writes a
96-byte manifest, `{base}__parallelism_manifest` or `{base}__writer_manifest`:

    offset  size  field
    0       4     magic 0x574d414e ("NAMW" in memory)
    4       2     version = 1
    6       2     header size = 96
    8       4     dtype code (the tensor header's)
    12      4     ndim
    16      4     split dim
    20      4     shard count
    24      4     reserved = 0
    28      4     padding = 0
    32      64    global shape: 8 x int64, unused dims -1

Reads take a `ReadTarget`: `as_stored` (no parallelism: the plain object under `key`), `shard`
(the exact shard when stored, else cut from the shards a manifest names) or `full` (the global
tensor reassembled from every shard a manifest names). A read that cannot be served logs why and
returns None.
"""

import logging
import struct
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, Union

from mooncake._tensor import _INVALID, _from_object, _prepare, _torch_mod
from mooncake._tensor import Axes, Header, Parts, Tensor

log = logging.getLogger("mooncake.store")

_KINDS = {"dp": 0, "tp": 1, "ep": 2, "pp": 3}
_MODES = ("as_stored", "shard", "full")
_MANIFEST = struct.Struct("<IHHiiiii4x8q")
_MANIFEST_MAGIC = 0x574D414E
_MAX_DIMS = 8
assert _MANIFEST.size == 96


class ParallelAxis:
    """One axis of a tensor's parallel layout (upstream `mooncake.store.ParallelAxis`)."""

    __module__ = "mooncake.store"

    def __init__(self) -> None:
        self.kind = ""
        self.rank = 0
        self.size = 1
        self.split_dim: Optional[int] = None
        self.expert_id: Optional[int] = None
        self.stage_id: Optional[int] = None

    def __repr__(self) -> str:
        return (
            f"ParallelAxis(kind={self.kind!r}, rank={self.rank}, size={self.size}, "
            f"split_dim={self.split_dim}, expert_id={self.expert_id}, stage_id={self.stage_id})"
        )


class TensorParallelism:
    """A tensor's parallel layout: `axes`, a list of `ParallelAxis`."""

    __module__ = "mooncake.store"

    def __init__(self) -> None:
        self.axes: list[ParallelAxis] = []

    def __repr__(self) -> str:
        return f"TensorParallelism(axes={self.axes!r})"


class ReadTarget:
    """What a parallel read returns: `mode` (`as_stored`, `shard`, `full`) and, for `shard`,
    the reader's `parallelism`."""

    __module__ = "mooncake.store"

    def __init__(self) -> None:
        self._mode = "as_stored"
        self.parallelism: Optional[TensorParallelism] = None

    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, value: object) -> None:
        if not isinstance(value, str) or value.lower() not in _MODES:
            log.error("Unsupported ReadTarget mode: %r", value)
            raise RuntimeError("Unsupported ReadTarget mode")
        self._mode = value.lower()

    def __repr__(self) -> str:
        return f"ReadTarget(mode={self._mode!r}, parallelism={self.parallelism!r})"


class _Axis:
    """A validated axis: kind code and name, rank, size, split dim (-1 none), ids."""

    __slots__ = ("code", "name", "rank", "size", "split_dim", "expert_id", "stage_id", "index")

    code: int
    name: str
    rank: int
    size: int
    split_dim: int
    expert_id: Optional[int]
    stage_id: Optional[int]
    index: int

    def token(self) -> str:
        t = f"{self.name}_{self.rank}of{self.size}"
        if self.split_dim >= 0:
            t += f"_sd{self.split_dim}"
        if self.expert_id is not None:
            t += f"_eid{self.expert_id}"
        if self.stage_id is not None:
            t += f"_sid{self.stage_id}"
        return t

    def header_tuple(self, extent: int) -> tuple[int, int, int, int, int, int, int]:
        extra = self.expert_id if self.code == 2 else self.stage_id if self.code == 3 else 0
        return (self.code, self.index, self.rank, self.size, self.split_dim, extra or 0, extent)


def _axes_of(parallelism: Any, ndim: int, what: str) -> list[_Axis]:
    """The validated axes of a `TensorParallelism`; ValueError (logged by callers) if invalid."""
    axes = getattr(parallelism, "axes", None)
    if not axes:
        raise ValueError(f"{what}: parallelism has no axes")
    if len(axes) > 4:
        raise ValueError(f"{what}: at most 4 axes, got {len(axes)}")
    out = []
    for i, a in enumerate(axes):
        name = str(getattr(a, "kind", "")).lower()
        if name not in _KINDS:
            raise ValueError(f"{what}: unknown axis kind {getattr(a, 'kind', None)!r}")
        x = _Axis()
        x.code, x.name, x.index = _KINDS[name], name, i
        x.rank, x.size = int(a.rank), int(a.size)
        sd = getattr(a, "split_dim", None)
        x.split_dim = -1 if sd is None else int(sd)
        x.expert_id = getattr(a, "expert_id", None)
        x.stage_id = getattr(a, "stage_id", None)
        if x.size <= 0 or not 0 <= x.rank < x.size:
            raise ValueError(f"{what}: axis rank {x.rank} not in [0, {x.size})")
        if name == "tp" and x.split_dim < 0:
            raise ValueError(f"{what}: TP axis requires split_dim")
        if name == "dp" and x.split_dim >= 0:
            raise ValueError(f"{what}: DP axis must not provide split_dim")
        if x.split_dim >= ndim:
            raise ValueError(f"{what}: split_dim {x.split_dim} out of range for {ndim} dims")
        out.append(x)
    return out


def _shard_key(base: str, axes: list[_Axis]) -> str:
    if len(axes) == 1 and axes[0].name == "tp":
        return f"{base}_tp_{axes[0].rank}"
    ordered = sorted(axes, key=lambda a: a.code)
    return base + "".join("__" + a.token() for a in ordered)


def _tp_axis(axes: list[_Axis]) -> Optional[_Axis]:
    return next((a for a in axes if a.name == "tp"), None)


def _writer(partition: Any, what: str) -> tuple[int, int, int]:
    try:
        rank, size, sd = int(partition.rank), int(partition.size), int(partition.split_dim)
    except (AttributeError, TypeError, ValueError):
        raise ValueError(f"{what}: writer_partition must provide rank, size, and split_dim")
    if size <= 0 or not 0 <= rank < size or sd < 0:
        raise ValueError(f"{what}: writer_partition rank {rank} of {size}, split_dim {sd}")
    return rank, size, sd


def _slice(t: Tensor, dim: int, rank: int, size: int, what: str) -> tuple[Tensor, int]:
    extent = t.shape[dim]
    if extent % size:
        raise ValueError(f"{what}: dim {dim} of size {extent} does not split into {size}")
    chunk = extent // size
    return t.narrow(dim, rank * chunk, chunk), chunk


def _manifest(
    code: int, ndim: int, split_dim: int, count: int, global_shape: Sequence[int]
) -> bytes:
    dims = list(global_shape) + [-1] * (_MAX_DIMS - len(global_shape))
    return _MANIFEST.pack(_MANIFEST_MAGIC, 1, 96, code, ndim, split_dim, count, 0, *dims)


def _parse_manifest(buf: Any) -> Optional[tuple[int, int, int, list[int]]]:
    if buf is None or len(buf) < _MANIFEST.size:
        return None
    magic, ver, hs, code, ndim, sd, count, _r, *dims = _MANIFEST.unpack_from(bytes(buf[:96]))
    if magic != _MANIFEST_MAGIC or ver != 1 or hs != 96 or not 0 <= ndim <= _MAX_DIMS:
        return None
    if count <= 0 or not 0 <= sd < max(ndim, 1):
        return None
    return code, sd, count, dims[:ndim]


def plan_put(
    base: str,
    tensor: Tensor,
    parallelism: Any,
    writer_partition: Any,
    what: str,
    whole: bool = False,
) -> list[tuple[str, Header, Optional[Tensor]]]:
    """[(key, header, contiguous tensor)] for one parallel put; ValueError when invalid.
    `whole`: the tensor is the global one even for a single TP axis (the `_from` forms)."""
    torch = _torch_mod()
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{what}: expected torch.Tensor, got {type(tensor).__name__}")
    if parallelism is not None and writer_partition is not None:
        raise ValueError(f"{what}: give parallelism or writer_partition, not both")
    if writer_partition is not None:
        rank, size, sd = _writer(writer_partition, what)
        if sd >= tensor.dim():
            raise ValueError(f"{what}: split_dim {sd} out of range for {tensor.dim()} dims")
        shard, chunk = _slice(tensor, sd, rank, size, what)
        writer_axes = [(1, 0, rank, size, sd, 0, chunk)]
        header, t = _prepare(shard, list(tensor.shape), writer_axes)
        code = _header_code(header)
        man = _manifest(code, tensor.dim(), sd, size, list(tensor.shape))
        return [
            (f"{base}__writer_{rank}of{size}_sd{sd}", header, t),
            (f"{base}__writer_manifest", man, None),
        ]
    axes = _axes_of(parallelism, tensor.dim(), what)
    tp = _tp_axis(axes)
    if len(axes) == 1 and tp is not None and not whole:
        shard = tensor
        global_shape = list(tensor.shape)
        global_shape[tp.split_dim] *= tp.size
    else:
        shard, global_shape = tensor, list(tensor.shape)
        for a in axes:
            if a.name == "tp":
                shard, _ = _slice(shard, a.split_dim, a.rank, a.size, what)
    extents = [shard.shape[a.split_dim] if a.split_dim >= 0 else 0 for a in axes]
    header_axes = [a.header_tuple(e) for a, e in zip(axes, extents)]
    header, t = _prepare(shard, global_shape, header_axes)
    out = [(_shard_key(base, axes), header, t)]
    if tp is not None:
        man = _manifest(_header_code(header), len(global_shape), tp.split_dim, tp.size,
                        global_shape)
        out.append((f"{base}__parallelism_manifest", man, None))
    return out


def _header_code(header: Header) -> int:
    code: int = struct.unpack_from("<i", header, 8)[0]
    return code


class ParallelMethods:
    """The `*_tensor_with_parallelism*` methods of `MooncakeDistributedStore`."""

    if TYPE_CHECKING:
        # What the store class this is mixed into provides (`mooncake.store`, `_tensor`).
        _put_parts_batch: Callable[[list[str], list[Parts], Any, bool], list[int]]
        _tensor_copy_at: Callable[[int, int], Optional[Tensor]]
        _tensor_in: Callable[[int, int], Optional[Tensor]]
        _write_caller: Callable[[int, bytes], int]
        is_exist: Callable[[str], int]
        get_buffer: Callable[[str], Any]
        get_tensor: Callable[[str], Optional[Tensor]]
        get_tensor_into: Callable[[str, int, int], Optional[Tensor]]

    # ---- puts ---------------------------------------------------------------------------

    def _put_parallel_many(
        self,
        keys: Sequence[str],
        tensors: Sequence[Tensor],
        parallelisms: Optional[Sequence[Any]],
        config: Any,
        partitions: Optional[Sequence[Any]],
        upsert: bool,
        what: str,
        whole: bool = False,
    ) -> list[int]:
        keys, tensors = list(keys), list(tensors)
        n = len(keys)
        pars = [None] * n if parallelisms is None else list(parallelisms)
        parts = [None] * n if partitions is None else list(partitions)
        if not len(tensors) == len(pars) == len(parts) == n:
            log.error("%s: keys, tensors and layouts differ in length", what)
            return [_INVALID] * n
        out = [0] * n
        owner, ks, objs = [], [], []
        for i in range(n):
            if pars[i] is None and parts[i] is None:
                try:
                    header, t = _prepare(tensors[i])
                except ValueError as e:
                    log.error("%s: %s", what, e)
                    out[i] = _INVALID
                    continue
                plan = [(keys[i], header, t)]
            else:
                try:
                    plan = plan_put(keys[i], tensors[i], pars[i], parts[i], what, whole)
                except ValueError as e:
                    log.error("%s", e)
                    out[i] = _INVALID
                    continue
            for key, header, t in plan:
                owner.append(i)
                ks.append(key)
                objs.append(_object_parts(header, t))
        if ks:
            for i, r in zip(owner, self._put_parts_batch(ks, objs, config, upsert)):
                if out[i] == 0 and r != 0:
                    out[i] = r
        return out

    def put_tensor_with_parallelism(
        self,
        key: str,
        tensor: Tensor,
        parallelism: Any = None,
        config: Any = None,
        writer_partition: Any = None,
    ) -> int:
        """Stores `tensor` as the shards its `parallelism` (a `TensorParallelism`) or
        `writer_partition` says, plus a manifest where one is needed (module doc). 0, or a negative
        error code."""
        return self._put_parallel_many(
            [key], [tensor], [parallelism], config, [writer_partition], False,
            "put_tensor_with_parallelism",
        )[0]

    def upsert_tensor_with_parallelism(
        self,
        key: str,
        tensor: Tensor,
        parallelism: Any = None,
        config: Any = None,
        writer_partition: Any = None,
    ) -> int:
        """Like `put_tensor_with_parallelism`, but overwrites existing keys. 0, or a negative
        error code."""
        return self._put_parallel_many(
            [key], [tensor], [parallelism], config, [writer_partition], True,
            "upsert_tensor_with_parallelism",
        )[0]

    def batch_put_tensor_with_parallelism(
        self,
        keys: Sequence[str],
        tensors_list: Sequence[Tensor],
        parallelisms: Optional[Sequence[Any]] = None,
        config: Any = None,
        writer_partitions: Optional[Sequence[Any]] = None,
    ) -> list[int]:
        """`put_tensor_with_parallelism` for each key and tensor; 0 or a negative code per key."""
        return self._put_parallel_many(
            keys, tensors_list, parallelisms, config, writer_partitions, False,
            "batch_put_tensor_with_parallelism",
        )

    def batch_upsert_tensor_with_parallelism(
        self,
        keys: Sequence[str],
        tensors_list: Sequence[Tensor],
        parallelisms: Optional[Sequence[Any]] = None,
        config: Any = None,
        writer_partitions: Optional[Sequence[Any]] = None,
    ) -> list[int]:
        """`upsert_tensor_with_parallelism` for each key and tensor; 0 or a negative code per
        key."""
        return self._put_parallel_many(
            keys, tensors_list, parallelisms, config, writer_partitions, True,
            "batch_upsert_tensor_with_parallelism",
        )

    def _put_parallel_from(
        self,
        keys: Sequence[str],
        ptrs: Sequence[int],
        sizes: Sequence[int],
        pars: Optional[Sequence[Any]],
        config: Any,
        parts: Optional[Sequence[Any]],
        upsert: bool,
        what: str,
    ) -> list[int]:
        keys, ptrs, sizes = list(keys), list(ptrs), list(sizes)
        if not len(keys) == len(ptrs) == len(sizes):
            log.error("%s: keys, buffer_ptrs and sizes differ in length", what)
            return [_INVALID] * len(keys)
        tensors = [self._tensor_copy_at(p, n) for p, n in zip(ptrs, sizes)]
        out = self._put_parallel_many(
            keys, [t if t is not None else object() for t in tensors], pars, config, parts,
            upsert, what, whole=True,
        )
        return [_INVALID if t is None else r for t, r in zip(tensors, out)]

    def put_tensor_with_parallelism_from(
        self,
        key: str,
        buffer_ptr: int,
        size: int,
        parallelism: Any = None,
        config: Any = None,
        writer_partition: Any = None,
    ) -> int:
        """`put_tensor_with_parallelism` of the whole tensor object (`[TensorMetadata][data]`)
        in caller memory at `buffer_ptr`. 0, or a negative error code."""
        return self._put_parallel_from(
            [key], [buffer_ptr], [size], [parallelism], config, [writer_partition], False,
            "put_tensor_with_parallelism_from",
        )[0]

    def upsert_tensor_with_parallelism_from(
        self,
        key: str,
        buffer_ptr: int,
        size: int,
        parallelism: Any = None,
        config: Any = None,
        writer_partition: Any = None,
    ) -> int:
        """Like `put_tensor_with_parallelism_from`, but overwrites existing keys. 0, or a
        negative error code."""
        return self._put_parallel_from(
            [key], [buffer_ptr], [size], [parallelism], config, [writer_partition], True,
            "upsert_tensor_with_parallelism_from",
        )[0]

    def batch_put_tensor_with_parallelism_from(
        self,
        keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
        parallelisms: Optional[Sequence[Any]] = None,
        config: Any = None,
        writer_partitions: Optional[Sequence[Any]] = None,
    ) -> list[int]:
        """`put_tensor_with_parallelism_from` for each key and buffer; 0 or a negative code per
        key."""
        return self._put_parallel_from(
            keys, buffer_ptrs, sizes, parallelisms, config, writer_partitions, False,
            "batch_put_tensor_with_parallelism_from",
        )

    def batch_upsert_tensor_with_parallelism_from(
        self,
        keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
        parallelisms: Optional[Sequence[Any]] = None,
        config: Any = None,
        writer_partitions: Optional[Sequence[Any]] = None,
    ) -> list[int]:
        """`upsert_tensor_with_parallelism_from` for each key and buffer; 0 or a negative code
        per key."""
        return self._put_parallel_from(
            keys, buffer_ptrs, sizes, parallelisms, config, writer_partitions, True,
            "batch_upsert_tensor_with_parallelism_from",
        )

    # ---- gets ---------------------------------------------------------------------------

    def _read_plan(
        self, key: str, target: Optional[ReadTarget], what: str
    ) -> Optional[tuple[str, Any]]:
        """("key", k) to read object k as is, ("tensor", t) for a reassembled tensor, or None.

        As upstream: `as_stored` is the plain object; `full` reassembles writer partitions
        (else it is the plain object too); `shard` first cuts the requested TP shard out of
        the shards a manifest names, then falls back to the exact shard key."""
        mode = "as_stored" if target is None else target.mode
        par = None if target is None else target.parallelism
        if mode == "as_stored":
            if par is not None:
                log.error("%s: unsupported ReadTarget mode (as_stored with a parallelism)", what)
                return None
            return ("key", key)
        if mode == "full":
            if par is not None:
                log.error("%s: a full read takes no parallelism", what)
                return None
            if self.is_exist(key + "__writer_manifest") == 1:
                t = self._reassemble(key, None, what)
                return None if t is None else ("tensor", t)
            return ("key", key)
        if par is None:
            log.error("%s: parallelism is required", what)
            return None
        try:
            axes = _axes_of(par, _MAX_DIMS, what)
        except ValueError as e:
            log.error("%s", e)
            return None
        tp = _tp_axis(axes)
        if tp is not None:
            t = self._reassemble(key, (tp.split_dim, tp.rank, tp.size), what)
            if t is not None:
                return ("tensor", t)
        direct = _shard_key(key, axes)
        if self.is_exist(direct) == 1:
            return ("key", direct)
        log.error("%s: no shard matched requested layout for key %s", what, key)
        return None

    def _reassemble(
        self, key: str, region: Optional[tuple[int, int, int]], what: str
    ) -> Optional[Tensor]:
        """The global tensor of `key` (or the `(dim, rank, size)` shard of it) cut from the
        shards its manifest names; None when there is no manifest, the request does not line
        up with the stored split (same dim, one shard count a multiple of the other) or a
        needed shard is missing."""
        torch = _torch_mod()
        for suffix in ("__writer_manifest", "__parallelism_manifest"):
            m = _parse_manifest(self.get_buffer(key + suffix))
            if m is not None:
                break
        else:
            return None
        _code, sd, count, gshape = m
        if gshape[sd] % count:
            log.error("%s: global dim %d of %s does not split into %d", what, sd, key, count)
            return None
        chunk = gshape[sd] // count
        lo, hi = 0, gshape[sd]
        if region is not None:
            r_dim, r_rank, r_size = region
            aligned = r_size % count == 0 or count % r_size == 0
            if r_dim != sd or not aligned or gshape[sd] % r_size:
                log.error("%s: requested TP shard %d of %d along dim %d does not line up "
                          "with %d shards along dim %d", what, r_rank, r_size, r_dim, count, sd)
                return None
            lo = r_rank * (gshape[sd] // r_size)
            hi = lo + gshape[sd] // r_size
        pieces = []
        for r in range(lo // chunk, max(lo // chunk, (hi - 1) // chunk) + 1):
            src = (f"{key}__writer_{r}of{count}_sd{sd}"
                   if suffix == "__writer_manifest" else f"{key}_tp_{r}")
            t = self.get_tensor(src)
            if t is None or t.dim() <= sd or t.shape[sd] != chunk:
                log.error("%s: missing reconstructed shard source for key %s", what, src)
                return None
            a, b = max(lo, r * chunk), min(hi, (r + 1) * chunk)
            pieces.append(t.narrow(sd, a - r * chunk, b - a))
        out = torch.cat(pieces, dim=sd) if len(pieces) > 1 else pieces[0]
        return out.contiguous()

    def get_tensor_with_parallelism(
        self, key: str, target: Optional[ReadTarget] = None
    ) -> Optional[Tensor]:
        """The tensor a `ReadTarget` asks for (`as_stored`, `shard` or `full`, module doc), or
        None with the reason logged."""
        plan = self._read_plan(key, target, "get_tensor_with_parallelism")
        if plan is None:
            return None
        return self.get_tensor(plan[1]) if plan[0] == "key" else plan[1]

    def batch_get_tensor_with_parallelism(
        self, keys: Sequence[str], targets: Optional[Sequence[Optional[ReadTarget]]] = None
    ) -> list[Optional[Tensor]]:
        """`get_tensor_with_parallelism` for each key and target: a tensor or None per key."""
        keys = list(keys)
        targets = [None] * len(keys) if targets is None else list(targets)
        if len(targets) != len(keys):
            log.error("batch_get_tensor_with_parallelism: keys and targets differ in length")
            return [None] * len(keys)
        return [self.get_tensor_with_parallelism(k, t) for k, t in zip(keys, targets)]

    def get_tensor_with_parallelism_into(
        self, key: str, buffer_ptr: int, size: int, target: Optional[ReadTarget] = None
    ) -> Optional[Tensor]:
        """`get_tensor_with_parallelism` written into caller memory at `buffer_ptr` as a tensor
        object; a tensor viewing it, or None."""
        what = "get_tensor_with_parallelism_into"
        plan = self._read_plan(key, target, what)
        if plan is None:
            return None
        if plan[0] == "key":
            return self.get_tensor_into(plan[1], buffer_ptr, size)
        header, t = _prepare(plan[1])
        payload = b"".join(bytes(p) for p in _object_parts(header, t))
        if len(payload) > size or self._write_caller(buffer_ptr, payload) < 0:
            log.error("%s: buffer of %d bytes cannot take %d", what, size, len(payload))
            return None
        return self._tensor_in(buffer_ptr, len(payload))

    def batch_get_tensor_with_parallelism_into(
        self,
        keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
        targets: Optional[Sequence[Optional[ReadTarget]]] = None,
    ) -> list[Optional[Tensor]]:
        """`get_tensor_with_parallelism_into` for each key, buffer and target; a tensor or None
        per key."""
        keys, buffer_ptrs, sizes = list(keys), list(buffer_ptrs), list(sizes)
        targets = [None] * len(keys) if targets is None else list(targets)
        if not len(keys) == len(buffer_ptrs) == len(sizes) == len(targets):
            log.error("batch_get_tensor_with_parallelism_into: argument lengths differ")
            return [None] * len(keys)
        return [
            self.get_tensor_with_parallelism_into(k, p, n, t)
            for k, p, n, t in zip(keys, buffer_ptrs, sizes, targets)
        ]


def _object_parts(header: Header, t: Optional[Tensor]) -> Parts:
    """The parts of one stored object: a header alone (manifests) or header and tensor bytes."""
    if t is None:
        return (header,)
    from mooncake._tensor import _parts

    return _parts(header, t)
