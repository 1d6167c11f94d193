"""Reading one structured-object member back: what to read for it (all of it, or the rows a
slice asks for), where to put it (fresh memory or the caller's destination), and the errors
upstream's module gives for a slice or a destination it cannot serve.

Part of `mooncake.structured_object_store` (the public face; see its docstring).

Per encoding (a member's bytes come off the store through `reads._PayloadReads`):

- ``bytes``: the whole payload; no slice, no destination.
- ``ndarray``: the byte range of the rows wanted (all of them without a slice; for a slice
  ``start:end:step`` on axis 0, rows ``start`` up to the last selected one, so only those move;
  a step > 1 reads that covering range into scratch memory and keeps every step-th row). The
  bytes land in the caller's numpy destination directly when one is given (checked first:
  dtype, shape, C order, writeable), else in a fresh array.
- ``torch_tensor``: the whole payload, decoded; a slice (axis 0, step 1) reads the 304-byte
  header and the rows' bytes only, and patches the header's shape. Nested (jagged) tensors
  and ``torch_save`` payloads are read whole and sliced after.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

try:
    import torch as _torch
except ImportError:  # pragma: no cover
    _torch = None

from mooncake import _tensor as _tensor_codec
from mooncake._structured.types import (
    StructuredMemberSlice,
    _RawDestinationBuffer,
    _TensorObjectBufferPayload,
)
from mooncake._structured.codecs import (
    _plain_dtype,
)
from mooncake._structured.bundles import (
    _Bundles,
)
from mooncake._structured.members import (
    _deserialize_nested_tensor_payload,
    _fill_destination,
    _normalized_member_slice,
    _select_nested_tensor_rows,
)


@dataclass(frozen=True)
class _NdarrayReadPlan:
    """The bytes of an ndarray member a read moves: ``byte_length`` bytes from
    ``byte_offset`` (``cover_row_count`` rows), kept every ``step``-th row."""

    dtype: np.dtype
    full_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    byte_offset: int
    byte_length: int
    step: int
    cover_row_count: int


def _resolve_ndarray_read_plan(shape: tuple[int, ...], dtype: np.dtype,
                               member_slice: StructuredMemberSlice | None) -> _NdarrayReadPlan:
    if member_slice is None:
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return _NdarrayReadPlan(dtype, shape, shape, 0, nbytes, 1, shape[0] if shape else 1)
    if member_slice.axis != 0:
        raise ValueError("structured ndarray slicing currently supports axis=0 only")
    if not shape:
        raise ValueError("structured ndarray slicing requires at least one dimension")
    start, end, step = _normalized_member_slice(member_slice, shape[0])
    row_bytes = dtype.itemsize * int(np.prod(shape[1:], dtype=np.int64))
    count = len(range(start, end, step))
    if count == 0:
        return _NdarrayReadPlan(dtype, shape, (0, *shape[1:]), start * row_bytes, 0, step, 0)
    cover = (count - 1) * step + 1
    return _NdarrayReadPlan(dtype, shape, (count, *shape[1:]), start * row_bytes,
                            cover * row_bytes, step, cover)


def _resolve_ndarray_destination(name: str, destination: Any, dtype: np.dtype,
                                 shape: tuple[int, ...]) -> np.ndarray:
    """The array a read of ``shape`` rows fills: fresh, or the caller's after checking it."""
    if destination is None:
        return np.empty(shape, dtype=dtype)
    if not isinstance(destination, np.ndarray):
        raise TypeError(f"structured ndarray field {name} destination must be a numpy.ndarray "
                        "or raw_destination")
    if destination.dtype != dtype:
        raise ValueError(f"structured ndarray field {name} destination dtype mismatch: "
                         f"expected {dtype.str}, got {destination.dtype.str}")
    if tuple(destination.shape) != tuple(shape):
        raise ValueError(f"structured ndarray field {name} destination shape mismatch: "
                         f"expected {tuple(shape)}, got {tuple(destination.shape)}")
    if not destination.flags["C_CONTIGUOUS"]:
        raise ValueError(f"structured ndarray field {name} destination must be C-contiguous")
    if not destination.flags["WRITEABLE"]:
        raise ValueError(f"structured ndarray field {name} destination must be writeable")
    return destination


def _slice_tensor_metadata(metadata: bytes, shape: Any, data_bytes: int) -> bytes:
    """A 304-byte tensor header (docs/protocol.md) with its data size and its global and
    local shapes set to ``shape`` (the rows of a slice)."""
    patched = bytearray(metadata)
    struct.pack_into("<Q", patched, 32, int(data_bytes))
    for i, dim in enumerate(shape):
        struct.pack_into("<q", patched, 40 + 8 * i, int(dim))
        struct.pack_into("<q", patched, 104 + 8 * i, int(dim))
    return bytes(patched)


def _read_structured_member(bundles: _Bundles, store: Any, name: str,
                            spec: Mapping[str, Any], fspec: Mapping[str, Any],
                            member_slice: StructuredMemberSlice | None,
                            destination: Any, reads: Any = None) -> Any:
    """One member of a structured object, read as ``fspec`` (its field spec) says, through
    ``reads`` (default: the bundles' store paths; or what a materialize fetched ahead)."""
    reads = bundles.reads if reads is None else reads
    encoding = fspec.get("encoding", "bytes")
    if encoding == "bytes":
        if member_slice is not None:
            raise ValueError(f"structured bytes member {name} does not support slicing")
        if destination is not None:
            raise ValueError(f"structured bytes member {name} does not support "
                             "materialize_into")
        return reads.read_payload(spec)
    if encoding == "torch_tensor":
        if _torch is None:
            raise RuntimeError("torch is required to read torch_tensor members")
        return _read_tensor_member(bundles, reads, store, name, spec, fspec, member_slice,
                                   destination)
    if encoding != "ndarray":
        raise ValueError(f"unsupported structured field encoding: {encoding}")
    return _read_ndarray_member(reads, store, name, spec, fspec, member_slice, destination)


def _ndarray_layout(name: str, spec: Mapping[str, Any],
                    fspec: Mapping[str, Any]) -> tuple[np.dtype, tuple[int, ...]]:
    """(dtype, shape) of an ndarray member, checked against its payload's size."""
    dtype = _plain_dtype(fspec.get("dtype"))
    try:
        shape = tuple(int(d) for d in fspec["shape"])
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"structured member {name!r} has no valid shape") from error
    if any(d < 0 for d in shape):
        raise ValueError(f"structured member {name!r} has a negative dimension")
    expected = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
    if int(spec["bytes"]) != expected:
        raise ValueError(f"structured member {name!r} holds {spec['bytes']} bytes, "
                         f"{dtype} {list(shape)} needs {expected}")
    return dtype, shape


def _read_ndarray_member(reads: Any, store: Any, name: str, spec: Mapping[str, Any],
                         fspec: Mapping[str, Any], member_slice: StructuredMemberSlice | None,
                         destination: Any) -> np.ndarray:
    dtype, shape = _ndarray_layout(name, spec, fspec)
    plan = _resolve_ndarray_read_plan(shape, dtype, member_slice)
    if isinstance(destination, _RawDestinationBuffer):
        # Raw memory is written through the store, which checks the address first.
        value = _read_ndarray_plan(reads, spec, plan, np.empty(plan.output_shape, dtype), True)
        return _fill_destination(store, name, destination, value)
    target = _resolve_ndarray_destination(name, destination, dtype, plan.output_shape)
    return _read_ndarray_plan(reads, spec, plan, target, destination is None)


def _read_ndarray_plan(reads: Any, spec: Mapping[str, Any], plan: _NdarrayReadPlan,
                       target: np.ndarray, fresh: bool) -> np.ndarray:
    """The plan's rows into ``target`` (``fresh``: ours, not the caller's)."""
    if plan.byte_length == 0:
        return target
    if plan.step == 1:
        reads.read_range_into(spec, target.reshape(-1).view(np.uint8), plan.byte_offset,
                              fresh)
        return target
    cover = np.empty((plan.cover_row_count, *plan.full_shape[1:]), dtype=plan.dtype)
    reads.read_range_into(spec, cover.reshape(-1).view(np.uint8), plan.byte_offset, True)
    target[...] = cover[::plan.step]
    return target


def _read_tensor_member(bundles: _Bundles, reads: Any, store: Any, name: str,
                        spec: Mapping[str, Any], fspec: Mapping[str, Any],
                        member_slice: StructuredMemberSlice | None, destination: Any) -> Any:
    if fspec.get("nested"):
        if destination is not None:
            raise ValueError(f"structured nested tensor member {name} does not support "
                             "destinations")
        value = _deserialize_nested_tensor_payload(reads.read_payload(spec), fspec)
        if member_slice is None:
            return value
        if member_slice.axis != 0:
            raise ValueError("structured nested tensor slicing currently supports axis=0 only")
        return _select_nested_tensor_rows(
            value, range(*_normalized_member_slice(member_slice, len(value))))
    if destination is not None and not isinstance(
            destination, (_TensorObjectBufferPayload, _RawDestinationBuffer)):
        raise ValueError(f"structured tensor member {name} only supports tensor_object_buffer "
                         "or raw_destination destinations")
    if member_slice is None:
        value = bundles.decode_tensor(spec, reads.read_payload(spec))
    elif spec.get("format") == "torch_save":
        value = _read_sliced_torch_save(reads, name, spec, member_slice, destination)
    else:
        value = _read_sliced_tensor(reads, name, spec, fspec, member_slice)
    if destination is None:
        return value
    return _fill_destination(store, name, destination, value)


def _read_sliced_torch_save(reads: Any, name: str, spec: Mapping[str, Any],
                            member_slice: StructuredMemberSlice, destination: Any) -> Any:
    if destination is not None:
        raise ValueError(f"structured torch_save tensor member {name} does not support "
                         "destinations")
    if member_slice.axis != 0:
        raise ValueError("structured tensor slicing currently supports axis=0 only")
    value = _torch.load(io.BytesIO(reads.read_payload(spec)), weights_only=True)
    start, end, step = _normalized_member_slice(member_slice, len(value))
    return value[start:end:step].clone()


def _read_sliced_tensor(reads: Any, name: str, spec: Mapping[str, Any],
                        fspec: Mapping[str, Any], member_slice: StructuredMemberSlice) -> Any:
    """Rows of a tensor member: its header and the rows' bytes, nothing else."""
    header_bytes = int(spec.get("metadata_bytes", -1))
    shape = fspec.get("shape")
    element_size = int(fspec.get("element_size", 0))
    if header_bytes < 0 or not isinstance(shape, list) or element_size <= 0:
        raise ValueError(f"structured tensor field {name} is missing slice metadata")
    if member_slice.axis != 0:
        raise ValueError("structured tensor slicing currently supports axis=0 only")
    if not shape:
        raise ValueError("structured tensor slicing requires at least one dimension")
    start, end, step = _normalized_member_slice(member_slice, int(shape[0]))
    if step != 1:
        raise ValueError("structured tensor slicing currently requires step=1")
    rows = max(0, end - start)
    row_bytes = element_size * int(np.prod(shape[1:], dtype=np.int64))
    header = _slice_tensor_metadata(reads.read_range(spec, 0, header_bytes),
                                    (rows, *shape[1:]), rows * row_bytes)
    data = reads.read_range(spec, header_bytes + start * row_bytes, rows * row_bytes)
    return _tensor_codec._deserialize_tensor(header + data)


def _rows_as_slice(indices: Any) -> StructuredMemberSlice | None:
    """Row indices as an axis-0 slice when they step evenly upwards (a DataProto's
    ``rows=slice(...)`` always does), else None."""
    if not indices:
        return None
    step = indices[1] - indices[0] if len(indices) > 1 else 1
    if step <= 0 or any(b - a != step for a, b in zip(indices, indices[1:])):
        return None
    return StructuredMemberSlice(0, indices[0], indices[-1] + 1, step)


def _member_sliceable(fspec: Any, spec: Any, cut: StructuredMemberSlice) -> bool:
    """Whether a member reads ``cut`` of its rows by itself (see `_read_structured_member`),
    rather than failing where a whole read and a pick of the rows would not."""
    if not isinstance(fspec, Mapping) or not isinstance(spec, Mapping):
        return False
    shape = fspec.get("shape")
    if not isinstance(shape, list) or not shape:
        return False
    encoding = fspec.get("encoding")
    if encoding == "ndarray":
        return True
    if encoding != "torch_tensor" or fspec.get("nested"):
        return False
    if spec.get("format") == "torch_save":
        return True
    return cut.step == 1 and int(spec.get("metadata_bytes", -1)) >= 0 \
        and int(fspec.get("element_size", 0)) > 0


def _member_rows_pickable(fspec: Any) -> bool:
    """Whether a member's rows can be read by index, each its own byte range (an ndarray)."""
    return isinstance(fspec, Mapping) and fspec.get("encoding") == "ndarray" \
        and isinstance(fspec.get("shape"), list) and bool(fspec["shape"])


def _read_ndarray_rows(reads: Any, name: str, spec: Mapping[str, Any],
                       fspec: Mapping[str, Any], indices: Any) -> np.ndarray:
    """Rows ``indices`` (axis 0, in that order, repeats allowed) of an ndarray member: only
    their bytes move."""
    dtype, shape = _ndarray_layout(name, spec, fspec)
    row_bytes = dtype.itemsize * int(np.prod(shape[1:], dtype=np.int64))
    target = np.empty((len(indices), *shape[1:]), dtype=dtype)
    if target.nbytes:
        reads.read_rows_into(spec, target.reshape(-1).view(np.uint8),
                             [(int(i) * row_bytes, k * row_bytes, row_bytes)
                              for k, i in enumerate(indices)])
    return target

