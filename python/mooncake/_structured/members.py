"""Structured-object members: how a torch tensor, numpy array or bytes member is
recorded in the metadata and stored, and the decoders, row pickers and destination writers
that reading one back (`materialize`) uses.

Part of `mooncake.structured_object_store` (the public face; see its docstring).
"""

from __future__ import annotations

import io
from typing import Any, Mapping, Sequence

import numpy as np

try:
    import torch as _torch
except ImportError:  # pragma: no cover
    _torch = None

from mooncake import _tensor as _tensor_codec
from mooncake._structured.common import (
    STRUCTURED_FIELD_SPECS_KEY,
    _DirectCopyPayload,
    _MultiBufferPayload,
    _TensorPayload,
    _is_tensor,
    _public,
)
from mooncake._structured.types import (
    StructuredMemberSlice,
    _RawDestinationBuffer,
    _TensorObjectBufferPayload,
)


def _encode_structured_field(value: Any) -> tuple[dict[str, Any], Any]:
    """One member's decode record and what to store for it."""
    if isinstance(value, _TensorObjectBufferPayload):
        return {"encoding": "torch_tensor"}, value
    if isinstance(value, _TensorPayload):
        return _encode_torch_tensor_field(value.tensor)
    if isinstance(value, (_MultiBufferPayload, _DirectCopyPayload)):
        # Ours stores the parts joined (one copy); upstream copies them into pool memory.
        parts = value.buffers if isinstance(value, _MultiBufferPayload) else value.arrays
        data = b"".join(bytes(_public()._bytes_view(p, "payload part")) for p in parts)
        if value.dtype is not None and value.shape is not None:
            return {"encoding": "ndarray", "dtype": value.dtype, "shape": list(value.shape)}, data
        return {"encoding": "bytes"}, data
    if _is_tensor(value):
        return _encode_torch_tensor_field(value)
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise TypeError("object ndarray members are not bytes-like; use put(type='dict')")
        array = np.ascontiguousarray(value)
        return {
            "encoding": "ndarray",
            "dtype": array.dtype.str,
            "shape": list(array.shape),
        }, array.reshape(-1).view(np.uint8)
    return {"encoding": "bytes"}, value


def _encode_torch_tensor_field(value: Any) -> tuple[dict[str, Any], Any]:
    if value.is_nested:
        if value.layout != _torch.jagged:
            raise ValueError("structured nested tensor fields require torch.jagged layout")
        return _encode_nested_tensor_field(value)
    tensor = value.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    return {
        "encoding": "torch_tensor",
        "dtype": str(tensor.dtype),
        "shape": list(tensor.shape),
        "element_size": int(tensor.element_size()),
    }, _TensorPayload(tensor.contiguous())


def _torch_save_payload_bytes(value: Any) -> bytes:
    buffer = io.BytesIO()
    _torch.save(value, buffer)
    return buffer.getvalue()


def _deserialize_torch_save_payload(payload: bytes) -> Any:
    return _torch.load(io.BytesIO(payload), weights_only=True)


def _tensor_codec_helper(name: str) -> Any:
    """``mooncake.store``'s tensor (de)serializer ``name`` (``_serialize_tensor``, ...)."""
    from mooncake import store as _store

    helper = getattr(_store, name, None)
    if not callable(helper):
        raise RuntimeError("mooncake.store tensor serialization helpers are required for "
                           "structured tensor fields")
    return helper


def _has_tensor_codec_helpers() -> bool:
    from mooncake import store as _store

    return all(callable(getattr(_store, n, None))
               for n in ("_serialize_tensor", "_deserialize_tensor"))


def _tensor_metadata_size() -> int:
    """Bytes of the tensor header in front of a stored tensor's data."""
    from mooncake import store as _store

    helper = getattr(_store, "_tensor_metadata_size", None)
    return int(helper()) if callable(helper) else 0


def _tensor_payload_bytes(value: _TensorPayload) -> tuple[bytes, int]:
    """(header + data as stored by put_tensor, header size) of a tensor member."""
    blob = _tensor_bytes(value.tensor)
    return blob, len(blob) - int(value.tensor.numel() * value.tensor.element_size())


def _deserialize_tensor_payload(payload: bytes) -> Any:
    return _tensor_codec_helper("_deserialize_tensor")(payload)


def _tensor_bytes(tensor: Any) -> bytes:
    import ctypes

    header, ptr, nbytes, _owner = _tensor_codec._serialize_tensor(tensor)
    return bytes(header) + (ctypes.string_at(ptr, nbytes) if nbytes else b"")


def _encode_nested_tensor_field(value: Any) -> tuple[dict[str, Any], bytes]:
    """A jagged nested tensor as its values, offsets and (if any) lengths tensors, each in the
    304-byte tensor format, one after the other ("tensor_parts", as upstream writes them)."""
    parts_of = [value.values(), value.offsets()]
    lengths = value.lengths()
    if lengths is not None:
        parts_of.append(lengths)
    spec: dict[str, Any] = {"encoding": "torch_tensor", "dtype": str(value.dtype),
                            "nested": True, "format": "torch_save"}
    if all(t.device.type == "cpu" for t in parts_of):
        parts = [_tensor_bytes(t.contiguous()) for t in parts_of]
        spec.update(format="tensor_parts", part_bytes=[len(p) for p in parts],
                    has_lengths=lengths is not None,
                    ragged_idx=int(getattr(value, "_ragged_idx", 1)))
        return spec, b"".join(parts)
    buf = io.BytesIO()
    _torch.save(value, buf)
    return spec, buf.getvalue()


def _deserialize_nested_tensor_payload(blob: bytes, fspec: Mapping[str, Any]) -> Any:
    fmt = fspec.get("format", "torch_save")
    if fmt == "torch_save":
        saved = _torch.load(io.BytesIO(blob), weights_only=True)
        return _nested_tensor_from_parts(saved.values(), saved.offsets(), saved.lengths(),
                            int(getattr(saved, "_ragged_idx", 1)))
    if fmt != "tensor_parts":
        raise ValueError(f"unsupported nested tensor payload format: {fmt}")
    sizes = fspec.get("part_bytes")
    count = 3 if fspec.get("has_lengths") else 2
    if not isinstance(sizes, list) or len(sizes) != count:
        raise ValueError("nested tensor payload has invalid part metadata")
    tensors, at = [], 0
    for size in sizes:
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise ValueError("nested tensor payload has invalid part size")
        if at + size > len(blob):
            raise ValueError("nested tensor payload is truncated")
        tensors.append(_tensor_codec._deserialize_tensor(blob[at : at + size]))
        at += size
    if at != len(blob):
        raise ValueError("nested tensor payload has trailing bytes")
    return _nested_tensor_from_parts(tensors[0], tensors[1], tensors[2] if count == 3 else None,
                        int(fspec.get("ragged_idx", 1)))


def _nested_tensor_from_parts(values: Any, offsets: Any, lengths: Any, ragged_idx: int) -> Any:
    seq = lengths if lengths is not None else offsets.diff()
    low = int(seq.min().item()) if seq.numel() else 0
    high = int(seq.max().item()) if seq.numel() else 0
    return _torch.nested.nested_tensor_from_jagged(
        values, offsets=offsets, lengths=lengths, jagged_dim=ragged_idx,
        min_seqlen=low, max_seqlen=high)


def _check_destination(name: str, fspec: Mapping[str, Any], target: Any) -> None:
    encoding = fspec.get("encoding", "bytes")
    if encoding == "bytes":
        raise ValueError(f"structured bytes member {name} does not support materialize_into")
    if encoding == "torch_tensor":
        if fspec.get("nested"):
            raise ValueError(f"structured nested tensor member {name} does not support "
                             "destinations")
        if not isinstance(target, (_TensorObjectBufferPayload, _RawDestinationBuffer)):
            raise ValueError(f"structured tensor member {name} only supports "
                             "tensor_object_buffer or raw_destination destinations")
        return
    if not isinstance(target, (np.ndarray, _RawDestinationBuffer)):
        raise TypeError(f"structured ndarray field {name} destination must be a numpy.ndarray "
                        "or raw_destination")


def _write_caller(store: Any, target: Any, data: bytes, what: str) -> None:
    """Copies ``data`` to caller memory ``target.ptr`` through the store, which checks that the
    range is this process's writable memory first."""
    if target.size < len(data):
        raise ValueError(f"{what} has {target.size} bytes, expected at least {len(data)}")
    if not data:
        return
    write = getattr(store, "_write_caller", None)
    if not callable(write):
        raise RuntimeError("this store cannot write into caller memory")
    if write(target.ptr, data) != len(data):
        raise ValueError(f"{what} at {target.ptr:#x} ({target.size} bytes) is not writable "
                         "memory of this process")


def _fill_destination(store: Any, name: str, target: Any, value: Any) -> Any:
    if isinstance(target, (_TensorObjectBufferPayload, _RawDestinationBuffer)) \
            and _is_tensor(value):
        _write_caller(store, target, _tensor_bytes(value.contiguous()), "tensor destination")
        return target
    if isinstance(target, _RawDestinationBuffer):
        array = np.ascontiguousarray(value)
        _write_caller(store, target, array.tobytes(), "raw destination")
        if array.nbytes == 0:
            return np.empty(array.shape, dtype=array.dtype)
        import ctypes

        raw = (ctypes.c_uint8 * array.nbytes).from_address(target.ptr)
        return np.ctypeslib.as_array(raw).view(array.dtype).reshape(array.shape)
    if target.dtype != value.dtype:
        raise ValueError(f"structured ndarray field {name} destination dtype mismatch: "
                         f"expected {value.dtype.str}, got {target.dtype.str}")
    if tuple(target.shape) != tuple(value.shape):
        raise ValueError(f"structured ndarray field {name} destination shape mismatch: "
                         f"expected {tuple(value.shape)}, got {tuple(target.shape)}")
    if not target.flags["C_CONTIGUOUS"]:
        raise ValueError(f"structured ndarray field {name} destination must be C-contiguous")
    if not target.flags["WRITEABLE"]:
        raise ValueError(f"structured ndarray field {name} destination must be writeable")
    np.copyto(target, value)
    return target


def _normalize_structured_metadata(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The caller's metadata with ``layout`` defaulted; the field-spec key is reserved."""
    if not isinstance(metadata, Mapping):
        raise TypeError("structured metadata must be a mapping")
    meta = dict(metadata)
    if STRUCTURED_FIELD_SPECS_KEY in meta:
        raise ValueError(f"structured metadata key {STRUCTURED_FIELD_SPECS_KEY!r} is reserved")
    if not isinstance(meta.get("layout", "structured"), str):
        raise ValueError("structured metadata layout must be a string")
    meta.setdefault("layout", "structured")
    return meta


def _encode_structured_fields(metadata: Mapping[str, Any], members: Mapping[str, Any]):
    """(metadata with each member's decode record, each member's bytes to store)."""
    meta = _normalize_structured_metadata(metadata)
    specs, encoded = {}, {}
    for name, value in members.items():
        _public()._validate_key_segment(name, "buffer name")
        specs[name], encoded[name] = _encode_structured_field(value)
    if specs:
        meta[STRUCTURED_FIELD_SPECS_KEY] = specs
    return meta, encoded


def _normalized_member_slice(member_slice: StructuredMemberSlice,
                             total_rows: int) -> tuple[int, int, int]:
    """(start, stop, step) of a member slice over ``total_rows`` rows."""
    if member_slice.step <= 0:
        raise ValueError("structured ndarray slicing step must be positive")
    return slice(member_slice.start, member_slice.end, member_slice.step).indices(total_rows)


def _slice_length(member_slice: StructuredMemberSlice, total_rows: int) -> int:
    return len(range(*_normalized_member_slice(member_slice, total_rows)))


def _select_nested_tensor_rows(value: Any, indices: Sequence[int]) -> Any:
    """The given rows of a jagged nested tensor, as a nested tensor."""
    rows = value.unbind()
    picked = [rows[int(i)] for i in indices]
    if picked:
        result = _torch.nested.as_nested_tensor(picked, layout=value.layout)
    else:
        offsets = _torch.zeros(1, dtype=value.offsets().dtype, device=value.offsets().device)
        result = _torch.nested.nested_tensor_from_jagged(value.values()[:0], offsets=offsets)
    if hasattr(value, "_ragged_idx"):
        result._ragged_idx = value._ragged_idx
    return result
