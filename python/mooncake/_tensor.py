"""Tensor methods of `MooncakeDistributedStore`, over the byte APIs and the native header codec.

A tensor object is upstream's format: the 304-byte `TensorMetadata` header, then the tensor's
C-contiguous element bytes (`protocol/src/tensor.rs` has the byte diagram). Puts send the header
and the tensor's own memory as two parts of one object (no copy of a contiguous CPU tensor);
gets read the object straight into a `BufferHandle` and return a tensor viewing it.

`torch` is imported on first use, so `mooncake.store` imports without it.
"""

import ctypes
import logging
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from mooncake import _native
from mooncake.error_codes import ErrorCode

_log = logging.getLogger("mooncake.store")

# torch is optional and imported on first use, so tensors are typed `Any` (a `torch.Tensor`
# at run time); `Header` is a tensor object's 304-byte header, `Axes` its parallel axes as
# `(kind, index, rank, size, split_dim, extra, extent)`.
Tensor = Any
Header = bytes
Axes = Sequence[tuple[int, int, int, int, int, int, int]]
Parts = tuple[Any, ...]

_HEADER_BYTES = _native._tensor_metadata_size()
_INVALID = int(ErrorCode.INVALID_PARAMS)  # -600, returned as a plain int
_AXIS_TP = 1
_MAX_DIMS = 8

_torch: Optional[ModuleType] = None
_code_of: dict[Any, int] = {}  # torch.dtype -> header dtype code
_dtype_of: dict[int, Any] = {}  # header dtype code -> torch.dtype


def _torch_mod() -> Any:
    global _torch
    if _torch is None:
        import torch

        for code, name, _size in _native._tensor_dtypes():
            dt = getattr(torch, name, None)
            if dt is not None:
                _code_of[dt] = code
                _dtype_of[code] = dt
        _torch = torch
    return _torch


def _contiguous_cpu(tensor: Tensor) -> Tensor:
    """The tensor as a C-contiguous CPU tensor (no copy when it already is one)."""
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    return t.contiguous()


def _memory_of(t: Tensor) -> Optional[ctypes.Array[ctypes.c_ubyte]]:
    """A buffer-protocol view of a contiguous CPU tensor's bytes, or None when empty."""
    nbytes: int = t.numel() * t.element_size()
    if nbytes == 0:
        return None
    return (ctypes.c_ubyte * nbytes).from_address(t.data_ptr())


def _prepare(
    tensor: Tensor, global_shape: Optional[list[int]] = None, axes: Optional[Axes] = None
) -> tuple[Header, Tensor]:
    """(header bytes, contiguous CPU tensor); ValueError for what the format cannot hold."""
    torch = _torch_mod()
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"unsupported tensor: expected torch.Tensor, got {type(tensor).__name__}")
    code = _code_of.get(tensor.dtype)
    if code is None:
        raise ValueError(f"unsupported tensor dtype {tensor.dtype}")
    if tensor.dim() > _MAX_DIMS:
        raise ValueError(f"unsupported tensor: {tensor.dim()} dims (at most {_MAX_DIMS})")
    t = _contiguous_cpu(tensor)
    header = _native._encode_tensor_header(code, list(t.shape), global_shape, axes)
    return header, t


def _parts(header: Header, t: Tensor) -> Parts:
    mem = _memory_of(t)
    return (header,) if mem is None else (header, mem)


def _from_object(buf: Any, total: Optional[int] = None) -> Optional[Tensor]:
    """A tensor viewing `buf` (a writable buffer holding a tensor object), or None."""
    torch = _torch_mod()
    try:
        code, _kind, _g, shape, _axes, offset, nbytes = _native._decode_tensor_header(buf, total)
    except (ValueError, TypeError):
        return None
    dtype = _dtype_of.get(code)
    if dtype is None:
        return None
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    flat = torch.frombuffer(buf, dtype=torch.uint8, count=nbytes, offset=offset)
    return flat.view(dtype).reshape(shape)


def _serialize_tensor(tensor: Tensor) -> tuple[Header, int, int, Tensor]:
    """Upstream helper: `(metadata: bytes[304], data_ptr, nbytes, owner)` for a tensor; the
    owner keeps the bytes at `data_ptr` alive. ValueError for an unsupported tensor."""
    header, t = _prepare(tensor)
    return header, t.data_ptr(), t.numel() * t.element_size(), t


def _deserialize_tensor(payload: Any) -> Tensor:
    """Upstream helper: the tensor in a tensor object's bytes. ValueError when invalid."""
    torch = _torch_mod()
    view = memoryview(payload)
    if view.readonly:
        view = memoryview(bytearray(view))
    t = _from_object(view)
    if t is None:
        raise ValueError("invalid tensor payload")
    return t


def _first_error(codes: Sequence[int]) -> int:
    return next((c for c in codes if c != 0), 0)


def _tp_shards(
    key: str, tensor: Tensor, tp_size: int, split_dim: int
) -> list[tuple[str, Header, Tensor]]:
    """[(shard key, header, shard tensor)] for put_tensor_with_tp; ValueError if unsplittable."""
    _torch_mod()
    if not hasattr(tensor, "dim"):
        raise ValueError("unsupported tensor")
    ndim = tensor.dim()
    if ndim == 0 or not -ndim <= split_dim < ndim:
        raise ValueError(f"split_dim {split_dim} out of range for {ndim} dims")
    split_dim %= ndim
    extent = tensor.shape[split_dim]
    if extent % tp_size != 0:
        raise ValueError(f"dim {split_dim} of size {extent} does not split into {tp_size}")
    chunk = extent // tp_size
    global_shape = list(tensor.shape)
    out = []
    for rank in range(tp_size):
        shard = tensor.narrow(split_dim, rank * chunk, chunk)
        axes = [(_AXIS_TP, 0, rank, tp_size, split_dim, 0, chunk)]
        header, t = _prepare(shard, global_shape, axes)
        out.append((f"{key}_tp_{rank}", header, t))
    return out


class TensorMethods:
    """The tensor half of `MooncakeDistributedStore` (upstream §1.5 "Tensor API")."""

    if TYPE_CHECKING:
        # What the store class this is mixed into provides (`mooncake.store`).
        put_parts: Callable[..., int]
        upsert_parts: Callable[..., int]
        _put_parts_batch: Callable[[list[str], list[Parts], Any, bool], list[int]]
        get_buffer: Callable[[str], Any]
        batch_get_buffer: Callable[[list[str]], list[Any]]
        get_into: Callable[[str, int, int], int]
        batch_get_into: Callable[[list[str], list[int], list[int]], list[int]]
        _read_registered: Callable[[int, int], Optional[bytes]]
        get_hostname: Callable[[], str]
        batch_put_tensor_from: Callable[[list[str], list[int], list[int]], list[int]]

    # ---- puts -------------------------------------------------------------------------

    def _put_tensor(self, key: str, tensor: Tensor, config: Any, upsert: bool) -> int:
        try:
            header, t = _prepare(tensor)
        except ValueError:
            return _INVALID
        put = self.upsert_parts if upsert else self.put_parts
        if config is None:
            return put(key, *_parts(header, t))
        return put(key, *_parts(header, t), config=config)

    def _batch_put_tensor(
        self, keys: Sequence[str], tensors_list: Sequence[Tensor], config: Any, upsert: bool
    ) -> list[int]:
        keys = list(keys)
        tensors_list = list(tensors_list)
        if not keys:
            return []
        if len(keys) != len(tensors_list):
            return [_INVALID] * len(keys)
        out = [0] * len(keys)
        idx, ks, parts = [], [], []
        for i, (k, tensor) in enumerate(zip(keys, tensors_list)):
            try:
                header, t = _prepare(tensor)
            except ValueError:
                out[i] = _INVALID
                continue
            idx.append(i)
            ks.append(k)
            parts.append(_parts(header, t))
        if ks:
            for i, r in zip(idx, self._put_parts_batch(ks, parts, config, upsert)):
                out[i] = r
        return out

    def put_tensor(self, key: str, tensor: Tensor, config: Any = None) -> int:
        """Upstream's `put_tensor(key, tensor)`; the optional `config` accepts the seed's
        `put_tensor(key, tensor, config)` form (same as `pub_tensor`)."""
        return self._put_tensor(key, tensor, config, False)

    def pub_tensor(self, key: str, tensor: Tensor, config: Any = None) -> int:
        """Stores `tensor` under `key` as a tensor object (`[TensorMetadata][data]`), with an
        optional `ReplicateConfig`. 0, or a negative error code."""
        return self._put_tensor(key, tensor, config, False)

    def upsert_tensor(self, key: str, tensor: Tensor) -> int:
        """Like `put_tensor`, but overwrites an existing key. 0, or a negative error code."""
        return self._put_tensor(key, tensor, None, True)

    def upsert_pub_tensor(self, key: str, tensor: Tensor, config: Any = None) -> int:
        """Like `pub_tensor`, but overwrites an existing key. 0, or a negative error code."""
        return self._put_tensor(key, tensor, config, True)

    def batch_put_tensor(self, keys: Sequence[str], tensors_list: Sequence[Tensor]) -> list[int]:
        """`put_tensor` for each key and tensor, as one batch; 0 or a negative code per key."""
        return self._batch_put_tensor(keys, tensors_list, None, False)

    def batch_pub_tensor(
        self, keys: Sequence[str], tensors_list: Sequence[Tensor], config: Any = None
    ) -> list[int]:
        """`pub_tensor` for each key and tensor, as one batch; 0 or a negative code per key."""
        return self._batch_put_tensor(keys, tensors_list, config, False)

    def batch_upsert_tensor(
        self, keys: Sequence[str], tensors_list: Sequence[Tensor]
    ) -> list[int]:
        """`upsert_tensor` for each key and tensor, as one batch; 0 or a negative code per key."""
        return self._batch_put_tensor(keys, tensors_list, None, True)

    def batch_upsert_pub_tensor(
        self, keys: Sequence[str], tensors_list: Sequence[Tensor], config: Any = None
    ) -> list[int]:
        """`upsert_pub_tensor` for each key and tensor, as one batch; 0 or a negative code
        per key."""
        return self._batch_put_tensor(keys, tensors_list, config, True)

    # ---- gets -------------------------------------------------------------------------

    def get_tensor(self, key: str) -> Optional[Tensor]:
        """The tensor stored under `key` (a copy), or None on a miss or any error."""
        buf = self.get_buffer(key)
        return None if buf is None else _from_object(buf)

    def batch_get_tensor(self, keys: Sequence[str]) -> list[Optional[Tensor]]:
        """`get_tensor` for each key: a tensor or None per key."""
        keys = list(keys)
        if not keys:
            return []
        return [None if b is None else _from_object(b) for b in self.batch_get_buffer(keys)]

    def _tensor_in(self, buffer_ptr: int, nread: int) -> Optional[Tensor]:
        """The tensor object just read into registered memory, as a tensor viewing it."""
        if nread < _HEADER_BYTES:
            return None
        header = self._read_registered(buffer_ptr, _HEADER_BYTES)
        if header is None:
            return None
        torch = _torch_mod()
        try:
            code, _k, _g, shape, _a, offset, nbytes = _native._decode_tensor_header(header, nread)
        except ValueError:
            return None
        dtype = _dtype_of.get(code)
        if dtype is None:
            return None
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype)
        mem = (ctypes.c_ubyte * nbytes).from_address(buffer_ptr + offset)
        return torch.frombuffer(mem, dtype=torch.uint8).view(dtype).reshape(shape)

    def _tensor_copy_at(self, buffer_ptr: int, size: int) -> Optional[Tensor]:
        """A tensor copied from the tensor object in caller memory (registered or mapped) at
        `buffer_ptr`; None when the range is neither or holds no valid tensor object."""
        raw = self._read_registered(buffer_ptr, size) if size >= _HEADER_BYTES else None
        if raw is None:
            return None
        try:
            return _deserialize_tensor(raw)
        except ValueError:
            return None

    def get_tensor_into(self, key: str, buffer_ptr: int, size: int) -> Optional[Tensor]:
        """The tensor read into registered memory at `buffer_ptr` (the buffer receives
        `[TensorMetadata][data]`), as a tensor viewing that memory; None on failure."""
        _torch_mod()
        n = self.get_into(key, buffer_ptr, size)
        return self._tensor_in(buffer_ptr, n) if n > 0 else None

    def batch_get_tensor_into(
        self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int]
    ) -> list[Any]:
        """`get_tensor_into` for each key with its buffer: a tensor viewing the buffer, or None,
        per key."""
        keys, buffer_ptrs, sizes = list(keys), list(buffer_ptrs), list(sizes)
        if not self.get_hostname() or not len(keys) == len(buffer_ptrs) == len(sizes):
            return [_INVALID] * len(keys)
        _torch_mod()
        reads = self.batch_get_into(keys, buffer_ptrs, sizes)
        return [self._tensor_in(p, n) if n > 0 else None for p, n in zip(buffer_ptrs, reads)]

    # ---- tensor parallelism -------------------------------------------------------------

    def _put_tensor_with_tp(
        self, key: str, tensor: Tensor, config: Any, tp_size: int, split_dim: int
    ) -> int:
        if tp_size <= 1:
            return self._put_tensor(key, tensor, config, False)
        r = self._batch_put_tensor_with_tp([key], [tensor], config, tp_size, split_dim)
        return r[0]

    def _batch_put_tensor_with_tp(
        self,
        base_keys: Sequence[str],
        tensors_list: Sequence[Tensor],
        config: Any,
        tp_size: int,
        split_dim: int,
    ) -> list[int]:
        base_keys, tensors_list = list(base_keys), list(tensors_list)
        if not base_keys:
            return []
        if len(base_keys) != len(tensors_list):
            return [_INVALID] * len(base_keys)
        if tp_size <= 1:
            return self._batch_put_tensor(base_keys, tensors_list, config, False)
        out = [0] * len(base_keys)
        owner, ks, parts = [], [], []
        for i, (k, tensor) in enumerate(zip(base_keys, tensors_list)):
            try:
                shards = _tp_shards(k, tensor, tp_size, split_dim)
            except ValueError:
                out[i] = _INVALID
                continue
            for shard_key, header, t in shards:
                owner.append(i)
                ks.append(shard_key)
                parts.append(_parts(header, t))
        if ks:
            for i, r in zip(owner, self._put_parts_batch(ks, parts, config, False)):
                if out[i] == 0 and r != 0:
                    out[i] = r
        return out

    def put_tensor_with_tp(
        self, key: str, tensor: Tensor, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0
    ) -> int:
        """Splits `tensor` into `tp_size` shards along `split_dim` and stores every one as
        `f"{key}_tp_{rank}"` (`tp_rank` is ignored, as upstream)."""
        return self._put_tensor_with_tp(key, tensor, None, tp_size, split_dim)

    def pub_tensor_with_tp(
        self,
        key: str,
        tensor: Tensor,
        config: Any = None,
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> int:
        """`put_tensor_with_tp` with an optional `ReplicateConfig`. 0, or a negative error code."""
        return self._put_tensor_with_tp(key, tensor, config, tp_size, split_dim)

    def batch_put_tensor_with_tp(
        self,
        base_keys: Sequence[str],
        tensors_list: Sequence[Tensor],
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> list[int]:
        """`put_tensor_with_tp` for each base key and tensor; 0 or a negative code per key."""
        return self._batch_put_tensor_with_tp(base_keys, tensors_list, None, tp_size, split_dim)

    def batch_pub_tensor_with_tp(
        self,
        base_keys: Sequence[str],
        tensors_list: Sequence[Tensor],
        config: Any = None,
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> list[int]:
        """`pub_tensor_with_tp` for each base key and tensor; 0 or a negative code per key."""
        return self._batch_put_tensor_with_tp(base_keys, tensors_list, config, tp_size, split_dim)

    @staticmethod
    def _tp_key(key: str, tp_rank: int, tp_size: int) -> str:
        return key if tp_size <= 1 else f"{key}_tp_{tp_rank}"

    def get_tensor_with_tp(
        self, key: str, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0
    ) -> Optional[Tensor]:
        """Rank `tp_rank`'s shard of `key` (`f"{key}_tp_{tp_rank}"` when `tp_size > 1`), or None."""
        return self.get_tensor(self._tp_key(key, tp_rank, tp_size))

    def batch_get_tensor_with_tp(
        self, base_keys: Sequence[str], tp_rank: int = 0, tp_size: int = 1
    ) -> list[Optional[Tensor]]:
        """`get_tensor_with_tp` for each base key: a tensor or None per key."""
        return self.batch_get_tensor([self._tp_key(k, tp_rank, tp_size) for k in base_keys])

    def get_tensor_with_tp_into(
        self,
        key: str,
        buffer_ptr: int,
        size: int,
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> Optional[Tensor]:
        """`get_tensor_into` of rank `tp_rank`'s shard of `key`: a tensor viewing the buffer, or
        None."""
        return self.get_tensor_into(self._tp_key(key, tp_rank, tp_size), buffer_ptr, size)

    def batch_get_tensor_with_tp_into(
        self,
        base_keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
        tp_rank: int = 0,
        tp_size: int = 1,
    ) -> list[Any]:
        """`get_tensor_with_tp_into` for each base key with its buffer; a tensor or None per key."""
        keys = [self._tp_key(k, tp_rank, tp_size) for k in base_keys]
        return self.batch_get_tensor_into(keys, buffer_ptrs, sizes)

    def batch_put_tensor_with_tp_from(
        self,
        base_keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> list[int]:
        """Each buffer holds a whole tensor object (`[TensorMetadata][data]`); stores its
        `tp_size` shards as `f"{key}_tp_{rank}"` (`tp_rank` ignored, as upstream)."""
        base_keys, buffer_ptrs, sizes = list(base_keys), list(buffer_ptrs), list(sizes)
        if not len(base_keys) == len(buffer_ptrs) == len(sizes):
            _log.error("batch_put_tensor_with_tp_from: keys, buffer_ptrs and sizes differ")
            return [_INVALID] * len(base_keys)
        if not base_keys:
            return []
        if tp_size <= 1:
            return self.batch_put_tensor_from(base_keys, buffer_ptrs, sizes)
        tensors = [self._tensor_copy_at(p, n) for p, n in zip(buffer_ptrs, sizes)]
        out = self._batch_put_tensor_with_tp(
            base_keys, [object() if t is None else t for t in tensors], None, tp_size, split_dim
        )
        return [_INVALID if t is None else r for t, r in zip(tensors, out)]

    def put_tensor_with_tp_from(
        self,
        key: str,
        buffer_ptr: int,
        size: int,
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> int:
        """`batch_put_tensor_with_tp_from` for one key. 0, or a negative error code."""
        return self.batch_put_tensor_with_tp_from(
            [key], [buffer_ptr], [size], tp_rank, tp_size, split_dim
        )[0]

    # ---- CUDA ---------------------------------------------------------------------------

    def get_tensor_into_cuda(self, key: str, tensor: Tensor) -> int:
        """-600: this build has no CUDA (upstream serves this only to CUDA dummy clients)."""
        _log.error("get_tensor_into_cuda(%s): no CUDA in this build", key)
        return _INVALID

    def batch_get_tensor_into_cuda(
        self, keys: Sequence[str], tensors_list: Sequence[Tensor]
    ) -> list[int]:
        """-600 per key: this build has no CUDA (upstream serves this only to CUDA dummy
        clients)."""
        keys = list(keys)
        _log.error("batch_get_tensor_into_cuda: no CUDA in this build")
        return [_INVALID] * len(keys)
