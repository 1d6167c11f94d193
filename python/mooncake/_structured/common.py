"""Constants, the public-module lookup, key and chunk checks, JSON and manifest
encoding, write-config helpers and the member payload types every other part shares.

Part of `mooncake.structured_object_store` (the public face; see its docstring).
"""

from __future__ import annotations

import copy
import importlib
import json
import uuid
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

try:
    import torch as _torch
except ImportError:  # pragma: no cover
    _torch = None

from mooncake.error_codes import ErrorCode


def _public() -> Any:
    """The public module, looked up at call time: a helper patched on it (as upstream's tests
    do, ``monkeypatch.setattr(sos, "_choose_leaf_codec", ...)``) is the one called. The
    module object is kept once found; its attributes are read at each call."""
    global _public_module
    if _public_module is None:
        _public_module = importlib.import_module(_PUBLIC)
    return _public_module


_public_module: Any = None


_PUBLIC = "mooncake.structured_object_store"
DEFAULT_BUNDLE_CHUNK_BYTES = 64 * 1024**2
AUTO_PARALLEL_MIN_BYTES = DEFAULT_BUNDLE_CHUNK_BYTES
AUTO_PARALLEL_MIN_CHUNKS = 8
MISSING_OBJECT_ERROR = int(ErrorCode.OBJECT_NOT_FOUND)
STRUCTURED_FIELD_SPECS_KEY = "__mooncake_structured_fields__"
DATAPROTO_REF_HANDLE_TYPE = "mooncake_dataproto_ref"
DATAPROTO_REF_HANDLE_VERSION = 1
STORAGE_GROUP_ID = "storage_group_id"

_WRAPPED_KEY = "__mooncake_wrapped_object__"
_TYPED_RAGGED_DEFAULT_DTYPE = "int64"
_RAGGED_TENSOR_DEFAULT_DTYPE = "torch.float32"
# Inference limits (the same thresholds as upstream, so both pick the same codec).
_INFER_MAX_STRUCT_KEYS = 64
_INFER_MAX_LIST_LEN = 8
_INFER_MAX_SAMPLE_ROWS = 128
_INFER_MAX_JSON_BYTES = 1 << 20
_INFER_MAX_DEPTH = 32


# ---------------------------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------------------------


def _validate_key_segment(value: Any, what: str) -> None:
    if not _nonempty_str(value) or "/" in value or any(ord(c) < 32 for c in value):
        raise ValueError(f"invalid bundle {what}: {value!r}")


def _normalize_key_prefix(prefix: str) -> str:
    if not isinstance(prefix, str):
        raise ValueError("key_prefix must be a non-empty key prefix")
    stripped = prefix.strip("/")
    if not stripped or any(ord(c) < 32 for c in stripped):
        raise ValueError("key_prefix must be a non-empty key prefix")
    return stripped


def _validate_chunk_bytes(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError("chunk_bytes must be positive")
    return value


def _byte_view(value: Any, name: str) -> memoryview:
    if isinstance(value, np.ndarray):
        value = np.ascontiguousarray(value)
    try:
        view = memoryview(value)
    except TypeError as error:
        raise TypeError(f"{name} must be bytes-like, got {type(value).__name__}") from error
    if isinstance(value, str):  # pragma: no cover - memoryview refuses str anyway
        raise TypeError(f"{name} must be bytes-like, got str")
    return view.cast("B") if view.ndim != 1 or view.format != "B" else view


def _encode_json_dict(value: Mapping[str, Any], what: str) -> bytes:
    try:
        return json.dumps(value, separators=(",", ":")).encode("utf-8")
    except (TypeError, ValueError) as error:
        raise TypeError(f"{what} must be JSON-serializable") from error


def _decode_json_dict(payload: bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(bytes(payload).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise ValueError(f"{what} is not valid JSON: {error}") from error
    if not isinstance(value, dict):
        raise ValueError(f"{what} must decode to a dict")
    return value


def _encode_manifest(manifest: Mapping[str, Any]) -> bytes:
    """A bundle manifest as stored: compact JSON."""
    return _encode_json_dict(manifest, "bundle manifest")


def _decode_manifest(payload: bytes) -> dict[str, Any]:
    return _decode_json_dict(payload, "bundle manifest")


def _encode_structured_metadata(metadata: Mapping[str, Any]) -> bytes:
    return _encode_json_dict(metadata, "structured metadata")


def _decode_structured_metadata(payload: bytes) -> dict[str, Any]:
    return _decode_json_dict(payload, "structured metadata")


def _structured_field_specs(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The per-member decode records of structured metadata (empty when it has none)."""
    specs = metadata.get(STRUCTURED_FIELD_SPECS_KEY, {})
    if not isinstance(specs, dict):
        raise ValueError("structured field specs must be a dict")
    return specs


def _merge_structured_stage_metadata(old_metadata: Mapping[str, Any],
                                     new_metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The metadata of two parts of one DataProto stage merged: the same ``dataproto``
    record, the union of their member specs (a member in both is refused)."""
    if old_metadata.get("dataproto") != new_metadata.get("dataproto"):
        raise ValueError("DataProto stage metadata mismatch during manifest merge")
    merged = dict(old_metadata)
    specs = dict(_structured_field_specs(old_metadata))
    added = _structured_field_specs(new_metadata)
    clash = sorted(set(specs) & set(added))
    if clash:
        raise ValueError(f"structured members already exist: {clash}")
    specs.update(added)
    if specs:
        merged[STRUCTURED_FIELD_SPECS_KEY] = specs
    return merged


def _chunk_offsets(chunks: Sequence[Mapping[str, Any]]) -> list[int]:
    """Where each chunk of a payload starts within it."""
    offsets = [0]
    for chunk in chunks[:-1]:
        offsets.append(offsets[-1] + int(chunk["bytes"]))
    return offsets


def _payload_range_fragments(chunks: Sequence[Mapping[str, Any]], byte_offset: int,
                             byte_length: int, destination_offset: int = 0):
    """The pieces of chunks a byte range of a payload covers: (key, chunk size, destination
    offset, offset in the chunk, length) each."""
    fragments = []
    end = byte_offset + byte_length
    start_of_chunk = 0
    for chunk in chunks:
        size = int(chunk["bytes"])
        lo, hi = max(byte_offset, start_of_chunk), min(end, start_of_chunk + size)
        if lo < hi:
            fragments.append((chunk["key"], size, destination_offset + lo - byte_offset,
                              lo - start_of_chunk, hi - lo))
        start_of_chunk += size
    return fragments


def _is_duplicate_buffer_registration(status: Any) -> bool:
    # Mooncake returns -600 when a caller-owned buffer is already registered.
    return status == -600


def _put_with_optional_config(store: Any, key: str, value: Any, config: Any = None) -> int:
    return _call_write_with_optional_config(store.put, key, value, config=config)


def _put_from_with_optional_config(store: Any, key: str, ptr: int, size: int,
                                   config: Any = None) -> int:
    config = _config_for_grouped_keys(config, 1)
    put_tensor_from = getattr(store, "put_tensor_from", None)
    if config is None and callable(put_tensor_from):
        return put_tensor_from(key, ptr, size)
    put_from = getattr(store, "put_from", None)
    if callable(put_from):
        return _call_write_with_optional_config(put_from, key, ptr, size, config=config)
    raise RuntimeError("put_from is unavailable")


def _batch_put_from_with_optional_config(batch_put_from: Any, keys: Sequence[str],
                                         ptrs: Sequence[int], sizes: Sequence[int],
                                         config: Any = None) -> Sequence[int]:
    return _call_write_with_optional_config(batch_put_from, list(keys), list(ptrs),
                                            list(sizes),
                                            config=_config_for_grouped_keys(config, len(keys)))


def _check_status(status: Any, op: str, key: str) -> None:
    if status not in (None, 0):
        raise RuntimeError(f"{op} failed for {key}: {status}")


def _call_write_with_optional_config(fn: Any, *args: Any, config: Any = None) -> Any:
    config = _single_group(config)
    return fn(*args) if config is None else fn(*args, config=config)


def _write_raw(fn: Any, *args: Any, config: Any = None) -> Any:
    return fn(*args) if config is None else fn(*args, config=config)


def _config_for_grouped_keys(config: Any, count: int) -> Any:
    """A batch write's config: the one logical group id repeated for every key."""
    single = _single_group(config)
    groups = getattr(single, "group_ids", None)
    if not groups:
        return single
    clone = _copy_write_config(single)
    clone.group_ids = [groups[0]] * count
    return clone


_WRITE_CONFIG_COPY_FIELDS = (
    "data_type", "group_ids", "nof_replica_num", "prefer_alloc_in_same_node",
    "preferred_nof_segments", "preferred_segment", "preferred_segments", "replica_num",
    "with_hard_pin", "with_soft_pin",
)


def _copy_write_config(config: Any) -> Any:
    try:
        return copy.copy(config)
    except TypeError:
        pass
    try:
        clone = type(config)()
    except Exception as error:
        raise TypeError(
            "structured object store config must be copyable or default-constructible"
        ) from error
    for name in _WRITE_CONFIG_COPY_FIELDS:
        if not hasattr(config, name):
            continue
        try:
            value = getattr(config, name)
        except Exception:
            continue
        try:
            setattr(clone, name, list(value) if isinstance(value, list) else value)
        except Exception as error:
            raise TypeError(
                f"structured object store config field {name!r} is not writable"
            ) from error
    return clone


def _single_group(config: Any) -> Any:
    """The config to write one key with: one logical group id at most."""
    if config is None:
        return None
    groups = getattr(config, "group_ids", None)
    if groups is None:
        return config
    as_str = isinstance(groups, str)
    groups = [groups] if as_str else list(groups)
    if not groups:
        clone = _copy_write_config(config)
        clone.group_ids = None
        return clone
    if len(groups) != 1:
        raise ValueError(
            "structured object store config.group_ids must contain exactly one logical "
            "group id; it is expanded across internal Mooncake keys")
    if not as_str:
        return config
    clone = _copy_write_config(config)
    clone.group_ids = groups
    return clone


def _storage_group(config: Any) -> str | None:
    """The storage group a new DataProto's keys are written under."""
    raw = getattr(config, "group_ids", None)
    if raw is None:
        group = None
    elif isinstance(raw, str):
        group = raw
    else:
        try:
            groups = list(raw)
        except TypeError as error:
            raise ValueError(
                "structured object store config.group_ids must contain strings") from error
        if len(groups) > 1:
            raise ValueError(
                "structured object store config.group_ids must contain exactly one logical "
                "group id; it is expanded across internal Mooncake keys")
        group = groups[0] if groups else None
    if group is None:
        return f"structured-{uuid.uuid4().hex}"
    if not isinstance(group, str):
        raise ValueError("structured object store config.group_ids must contain strings")
    return group or None


def _config_with_group_id(config: Any, group: str | None) -> Any:
    if group is None:
        return config
    current = getattr(_single_group(config), "group_ids", None)
    if current and current[0] and current[0] != group:
        raise ValueError("config.group_ids conflicts with the DataProto storage group")
    if config is None:
        from mooncake.store import ReplicateConfig

        clone = ReplicateConfig()
    else:
        clone = _copy_write_config(config)
    clone.group_ids = [group]
    return clone


def _cleanup_keys(store: Any, keys: Sequence[str], strict: bool) -> None:
    """Remove ``keys`` (forced; a missing key is not an error): one ``batch_remove`` when the
    store has it, then ``remove`` one by one for the keys it did not remove (or for all of
    them without it). ``strict``: raise on a failure, else carry on."""
    pending = list(dict.fromkeys(keys))
    batch_remove = getattr(store, "batch_remove", None)
    if callable(batch_remove) and pending:
        try:
            pending = _batch_remove_leftovers(batch_remove, pending)
        except Exception:
            if strict:
                raise
        if not pending:
            return
    failures = []
    for key in pending:
        try:
            status = store.remove(key, True)
        except KeyError:
            continue
        except Exception:
            if strict:
                raise
            continue
        if status not in (None, 0, MISSING_OBJECT_ERROR):
            failures.append((key, status))
    if failures and strict:
        raise RuntimeError(f"failed to remove {len(failures)} Mooncake keys: {failures[:3]}")


def _batch_remove_leftovers(batch_remove: Any, keys: list[str]) -> list[str]:
    """The keys one forced ``batch_remove`` did not remove."""
    try:
        results = batch_remove(keys, True)
    except TypeError:  # a batch_remove without the force argument
        results = batch_remove(keys)
    if len(results) != len(keys):
        raise RuntimeError(f"batch_remove returned {len(results)} results for {len(keys)} keys")
    return [k for k, status in zip(keys, results)
            if status not in (None, 0, MISSING_OBJECT_ERROR)]


def _parse_torch_dtype(name: str) -> Any:
    dtype = getattr(_torch, str(name).removeprefix("torch."), None)
    if not isinstance(dtype, _torch.dtype):
        raise ValueError(f"unknown torch dtype: {name}")
    return dtype


def _torch_dtype_to_numpy(name: str) -> np.dtype:
    dtype = _parse_torch_dtype(name)
    if dtype == _torch.bfloat16:
        raise ValueError("torch.bfloat16 has no value-preserving numpy dtype")
    return _torch.empty(0, dtype=dtype).numpy().dtype


def _is_tensor(value: Any) -> bool:
    return _torch is not None and isinstance(value, _torch.Tensor)


class BundleNotFoundError(KeyError, ValueError):
    """A manifest key holds nothing (upstream fails with a JSON ValueError there)."""


@dataclass(frozen=True)
class _TensorPayload:
    tensor: Any


@dataclass(frozen=True)
class _MultiBufferPayload:
    """A member given as several byte buffers stored back to back (with ``dtype`` and
    ``shape``, decoded as that ndarray; else as bytes)."""

    buffers: tuple[memoryview, ...]
    owners: tuple[Any, ...] = ()
    dtype: str | None = None
    shape: tuple[int, ...] | None = None

    @property
    def nbytes(self) -> int:
        return _buffer_group_nbytes(self.buffers)


@dataclass(frozen=True)
class _DirectCopyPayload:
    """A member given as flat ndarrays stored back to back (upstream copies them straight
    into pool memory at put time)."""

    arrays: list[np.ndarray]
    total_bytes: int
    dtype: str | None = None
    shape: tuple[int, ...] | None = None

    @property
    def nbytes(self) -> int:
        return self.total_bytes

    @staticmethod
    def from_flat_arrays(flat_arrays: list[np.ndarray], dtype: Any,
                         total_elems: int) -> "_DirectCopyPayload":
        return _DirectCopyPayload(arrays=flat_arrays,
                                  total_bytes=sum(a.nbytes for a in flat_arrays),
                                  dtype=np.dtype(dtype).str, shape=(total_elems,))


def _bytes_view(value: Any, name: str) -> memoryview:
    """A flat byte view of a bytes-like value (copied when not contiguous)."""
    try:
        view = memoryview(value)
    except TypeError as error:
        raise TypeError(f"{name} must be bytes-like, got {type(value).__name__}") from error
    if not view.contiguous:
        view = memoryview(bytes(view))
    return view.cast("B")


def _buffer_group_nbytes(buffers: Sequence[memoryview]) -> int:
    return sum(len(buffer) for buffer in buffers)


def _multi_buffer_bytes_payload(parts: Sequence[Any]) -> _MultiBufferPayload:
    return _MultiBufferPayload(tuple(_bytes_view(p, "payload part") for p in parts if p),
                               tuple(parts))


def _nonempty_str(value: Any) -> bool:
    return isinstance(value, str) and bool(value)


def _buffer_ptr(value: Any) -> int:
    """The address of a writable buffer (bytearray, ndarray)."""
    import ctypes

    return ctypes.addressof(ctypes.c_char.from_buffer(value))


def _buffer_nbytes(value: Any) -> int:
    return int(value.nbytes) if isinstance(value, np.ndarray) else len(value)


def _split_view(view: memoryview, chunk_bytes: int) -> list[memoryview]:
    """A payload's chunks as views (one empty view for an empty payload)."""
    if len(view) == 0:
        return [view]
    return [view[i:i + chunk_bytes] for i in range(0, len(view), chunk_bytes)]


def _copy_memoryviews(buffers: Sequence[memoryview], destination: memoryview) -> None:
    """Copy the buffers back to back into ``destination``."""
    out = destination.cast("B")
    offset = 0
    for buffer in buffers:
        part = buffer.cast("B")
        out[offset:offset + len(part)] = part
        offset += len(part)


def _as_contiguous_array_preserve_ndim(value: Any, dtype: Any) -> np.ndarray:
    """``value`` as a C-contiguous array of ``dtype``, a 0-d value staying 0-d."""
    if isinstance(value, np.ndarray) and value.dtype == dtype and value.flags.c_contiguous:
        return value
    array = np.asarray(value, dtype=dtype)
    return array if array.flags.c_contiguous else np.array(array, dtype=dtype, order="C")


def _regular_offsets_width(offsets: np.ndarray, rows: int) -> int | None:
    """The common row width when ragged offsets are in fact regular, else None."""
    if rows <= 0 or int(offsets[0]) != 0:
        return None
    total = int(offsets[-1])
    if total < 0 or total % rows:
        return None
    width = total // rows
    return width if bool(np.all(np.diff(offsets) == width)) else None
