"""Structured objects on a Mooncake store: nested values kept as bundles of named buffers.

A *bundle* is one JSON manifest key that lists a metadata payload and any number of named
buffer payloads, each stored under its own key (split into chunks past ``chunk_bytes``). On
top of it, a *structured object* is a bundle whose metadata records how each buffer decodes
(torch tensor, numpy array or raw bytes), and a *DataProto* (or flat dict of rows) is stored as
one structured object per stage, with the per-row Python values of ``non_tensor_batch``
columns packed by an inferred codec (numeric scalars, UTF-8 strings, bytes, msgpack, typed
ragged arrays, ragged tensors, or a recursive split of nested dicts/lists).

The key names, manifest, metadata JSON and buffer layouts follow upstream Mooncake's module
of the same name (release 0.3.13.post1), so a bundle written by either can be read by the
other given the same reference. Everything is built on the public methods of
``mooncake.store.MooncakeDistributedStore`` (``put``, ``get``, ``put_tensor``, ``remove``,
``is_exist``). See python/README.md for how it differs from upstream's.

Stored layout (all integers little-endian; JSON is compact, ``separators=(",", ":")``)::

    {prefix}/{partition}/{32 hex}/manifest    JSON {"version": 1, "layout": "bundle",
                                               "object_id": "{partition}/{32 hex}",
                                               "meta": SPEC, "buffers": {name: SPEC},
                                               ["buffer_object_ids": [...],
                                                "cleanup_keys": [...]]}   (merged stages)
    {prefix}/{object_id}/meta                 structured metadata JSON (below)
    {prefix}/{object_id}/buffer/{name}        one member's bytes, or past chunk_bytes
    {prefix}/{object_id}/buffer/{name}/chunk/{i}    its consecutive pieces
    SPEC = {"key", "bytes", "chunks": [{"key", "bytes"}], ["metadata_bytes",
            "kind": "tensor", "dtype", "shape" (written by put_tensor/pub_tensor),
            "format": "torch_save" (0-d tensors on stores without put_tensor)]}

    metadata = {..caller's.., "layout": "structured" | "dataproto_stage",
                ["dataproto": {"version", "namespace", "partition", "stage", "batch_size"}],
                "__mooncake_structured_fields__": {member: FIELD}}
    FIELD = {"encoding": "torch_tensor", "dtype", "shape", "element_size"}  304-byte
            tensor header + data | {"encoding": "ndarray", "dtype": "<f4", "shape"} raw
            C-order data | {"encoding": "bytes"}

A DataProto stage keeps ``batch.{field}`` members as above and one member per payload part of
each ``non_tensor_batch.{field}`` column; which parts, and how they decode, is recorded in the
ref's ``encoded_non_tensor`` (in the handle, not on the store). Parts per codec (n rows):
``ndarray``: data[n] + nulls bool[n]; ``utf8/bytes/msgpack/json_ragged``: data bytes +
offsets i64[n+1] + nulls; ``typed_ragged`` / ``ragged_tensor``: flat data + offsets i64[n+1] +
shapes i64[n, max(max_ndim, 1)] + ndims i16[n] + nulls; ``media_list_ragged``: data +
row_offsets i64[n+1] + byte_offsets i64[items+1] + nulls; ``structured_recursive``:
``node.{i}.missing/row_mask`` bool[n] (+ ``lengths`` i64[n] for lists) and each leaf column's
parts as ``leaf.{j}.{part}`` plus ``leaf.{j}.missing``.
"""

from __future__ import annotations

import copy
import importlib
import io
import json
import math
import sys
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Optional, Protocol, Sequence

import msgpack as _msgpack
import numpy as np

try:
    import torch as _torch
except ImportError:  # pragma: no cover
    _torch = None

from mooncake import _native
from mooncake import _tensor as _tensor_codec
from mooncake.error_codes import ErrorCode

def _public() -> Any:
    """The public module, looked up at call time: a helper patched on it (as upstream's tests
    do, ``monkeypatch.setattr(sos, "_choose_leaf_codec", ...)``) is the one called."""
    return sys.modules.get(_PUBLIC) or importlib.import_module(_PUBLIC)


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
# Public data types
# ---------------------------------------------------------------------------------------------


class BundleStore(Protocol):
    def put(self, key: str, value: Any, config: Any = None) -> int: ...

    def get(self, key: str) -> bytes: ...

    def remove(self, key: str, force: bool = False) -> int: ...

    def is_exist(self, key: str) -> int: ...


@dataclass(frozen=True)
class BundleTransferPolicy:
    """How bundle payloads are written. Accepted and validated; writes here are sequential."""

    max_inflight_put: int = 1
    put_mode: Literal["auto", "batch", "parallel"] = "auto"
    copy_mode: Literal["auto", "zero_copy", "copy"] = "auto"


@dataclass(frozen=True)
class FieldSchema:
    """An explicit codec for one DataProto field; ``metadata['section']`` pins its section."""

    codec: str
    nullable: bool = True
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class RemoteBundleRef:
    """Where a bundle lives: its manifest key and (when known) the manifest itself."""

    manifest_key: str
    manifest: dict[str, Any]


@dataclass(frozen=True, init=False)
class StructuredObjectPayload:
    """What put_structured_object stores: JSON-able metadata plus named members."""

    metadata: Mapping[str, Any]
    buffers: Mapping[str, Any]

    def __init__(
        self,
        metadata: Optional[Mapping[str, Any]] = None,
        buffers: Optional[Mapping[str, Any]] = None,
    ) -> None:
        if buffers is None:
            raise TypeError("StructuredObjectPayload requires buffers")
        object.__setattr__(self, "metadata", {} if metadata is None else metadata)
        object.__setattr__(self, "buffers", buffers)


@dataclass
class StructuredObjectResult:
    """A materialized structured object: its metadata and decoded members."""

    metadata: dict[str, Any]
    objects: dict[str, Any]


@dataclass(frozen=True)
class StructuredFieldLocation:
    """Which stage and member hold one DataProto field."""

    stage: str
    member: str
    section: Literal["batch", "non_tensor_batch"]


@dataclass
class MooncakeDataProtoRef:
    """Handle to a DataProto stored as one structured object per stage."""

    batch_size: int
    stage_refs: dict[str, RemoteBundleRef]
    field_index: dict[str, StructuredFieldLocation]
    meta_info: dict[str, Any]
    namespace: str = "default"
    partition: str = "default"
    global_indexes: list[int] | None = None
    encoded_non_tensor: dict[str, Any] = field(default_factory=dict)
    _storage_group_id: str | None = field(default=None, repr=False)


DataProtoRefLike = Any  # MooncakeDataProtoRef or its exported handle (a mapping)


@dataclass(frozen=True)
class StructuredMemberSlice:
    """A ``[start:end:step]`` slice along ``axis`` of one member."""

    axis: int
    start: int
    end: int
    step: int = 1


@dataclass(frozen=True)
class StructuredObjectReadSpec:
    """A lazy read: which members of a structured object to materialize, and slices."""

    ref: Any
    member_names: tuple[str, ...] | None = None
    member_slices: tuple[tuple[str, StructuredMemberSlice], ...] = ()

    def select_members(self, names: Optional[Sequence[str]]) -> "StructuredObjectReadSpec":
        return StructuredObjectReadSpec(
            ref=self.ref,
            member_names=None if names is None else tuple(names),
            member_slices=self.member_slices,
        )

    def slice_member(
        self, name: str, axis: int, start: int, end: int, step: int = 1
    ) -> "StructuredObjectReadSpec":
        slices = dict(self.member_slices)
        slices[name] = StructuredMemberSlice(axis=axis, start=start, end=end, step=step)
        return StructuredObjectReadSpec(
            ref=self.ref, member_names=self.member_names, member_slices=tuple(slices.items())
        )

    def member_slice(self, name: str) -> StructuredMemberSlice | None:
        return dict(self.member_slices).get(name)


@dataclass(frozen=True)
class _TensorObjectBufferPayload:
    """Memory of this process at ``ptr`` holding one tensor object (``[TensorMetadata][data]``,
    as ``put_tensor`` stores it, e.g. a BufferPool buffer): a member to store as is, or a
    destination a tensor member is read into. ``owner`` keeps the memory alive."""

    ptr: int
    size: int
    owner: Any = None
    batch_size: int | None = None

    def __len__(self) -> int:
        if self.batch_size is None:
            raise TypeError("tensor object buffer requires batch_size for DataProto use")
        return self.batch_size


@dataclass(frozen=True)
class _RawDestinationBuffer:
    """Memory of this process at ``ptr`` that a member is read into."""

    ptr: int
    size: int
    owner: Any = None
    pre_registered: bool = False


def tensor_object_buffer(ptr: int, size: int, owner: Any = None,
                         batch_size: int | None = None) -> _TensorObjectBufferPayload:
    """A tensor object in caller memory (registered with the store, or mapped): stored with
    ``put_from``, or filled by a read. The address is checked by the store, never trusted."""
    return _TensorObjectBufferPayload(int(ptr), int(size), owner, batch_size)


def raw_destination(ptr: int, size: int, owner: Any = None, *,
                    pre_registered: bool = False) -> _RawDestinationBuffer:
    """Caller memory a member is read into (an ndarray member's C-order bytes, or a tensor
    member's tensor object). The address is checked by the store before any byte is written.
    (Upstream 0.3.13.post1's ``raw_destination`` raises ``TypeError``: its class takes no
    arguments.)"""
    return _RawDestinationBuffer(int(ptr), int(size), owner, bool(pre_registered))


# ---------------------------------------------------------------------------------------------
# DataProto ref handles (JSON-safe, exchanged between processes)
# ---------------------------------------------------------------------------------------------


def is_dataproto_ref_handle(value: Any) -> bool:
    return isinstance(value, Mapping) and value.get("type") == DATAPROTO_REF_HANDLE_TYPE


def _json_safe_value(value: Any) -> Any:
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return _json_safe_value(value.tolist())
    if isinstance(value, Mapping):
        return {str(k): _json_safe_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe_value(v) for v in value]
    raise TypeError(
        f"DataProto ref handles support only JSON-safe values, got {type(value).__name__}"
    )


def export_dataproto_ref(ref: MooncakeDataProtoRef) -> dict[str, Any]:
    """The ref as a JSON-safe dict another process can import_dataproto_ref()."""
    if not isinstance(ref, MooncakeDataProtoRef):
        raise TypeError(f"expected MooncakeDataProtoRef, got {type(ref).__name__}")
    handle: dict[str, Any] = {
        "type": DATAPROTO_REF_HANDLE_TYPE,
        "version": DATAPROTO_REF_HANDLE_VERSION,
        "kind": "bundle_stages",
        "batch_size": int(ref.batch_size),
        "namespace": ref.namespace,
        "partition": ref.partition,
        "global_indexes": _json_safe_value(ref.global_indexes),
        "stage_refs": {s: {"manifest_key": r.manifest_key} for s, r in ref.stage_refs.items()},
        "field_index": {
            name: {"stage": loc.stage, "member": loc.member, "section": loc.section}
            for name, loc in ref.field_index.items()
        },
        "meta_info": _json_safe_value(ref.meta_info),
        "encoded_non_tensor": _json_safe_value(ref.encoded_non_tensor),
    }
    if ref._storage_group_id is not None:
        handle[STORAGE_GROUP_ID] = ref._storage_group_id
    json.dumps(handle, ensure_ascii=False)
    return handle


def _mapping_field(handle: Mapping[str, Any], name: str, default: Any = None) -> Mapping:
    value = handle.get(name, default)
    if not isinstance(value, Mapping):
        raise ValueError(f"DataProto ref handle {name} must be a mapping")
    return value


def _nonempty_str(value: Any) -> bool:
    return isinstance(value, str) and bool(value)


def import_dataproto_ref(handle: Mapping[str, Any]) -> MooncakeDataProtoRef:
    """Rebuild a MooncakeDataProtoRef from export_dataproto_ref()'s dict (manifests load lazily)."""
    if not is_dataproto_ref_handle(handle):
        raise ValueError("not a Mooncake DataProto ref handle")
    try:
        version = int(handle.get("version", -1))
    except (TypeError, ValueError):
        version = -1
    if version not in (1, 2):
        raise ValueError(f"unsupported DataProto ref handle version: {handle.get('version')!r}")
    if handle.get("kind") != "bundle_stages":
        raise ValueError(f"unsupported DataProto ref handle kind: {handle.get('kind')!r}")
    stage_refs: dict[str, RemoteBundleRef] = {}
    for stage, raw in _mapping_field(handle, "stage_refs").items():
        if not isinstance(raw, Mapping):
            raise ValueError(f"DataProto ref handle stage_refs[{stage!r}] must be a mapping")
        key = raw.get("manifest_key")
        if not _nonempty_str(stage) or not _nonempty_str(key):
            raise ValueError(
                "DataProto ref handle stage refs need non-empty stage names and manifest keys"
            )
        stage_refs[stage] = RemoteBundleRef(manifest_key=key, manifest={})
    field_index: dict[str, StructuredFieldLocation] = {}
    for name, raw in _mapping_field(handle, "field_index").items():
        if not isinstance(raw, Mapping):
            raise ValueError(f"DataProto ref handle field_index[{name!r}] must be a mapping")
        section = raw.get("section")
        if section not in ("batch", "non_tensor_batch"):
            raise ValueError(f"invalid DataProto field section: {section!r}")
        stage, member = raw.get("stage"), raw.get("member")
        if not (_nonempty_str(name) and _nonempty_str(stage) and _nonempty_str(member)):
            raise ValueError("DataProto ref handle field locations must be non-empty strings")
        if stage not in stage_refs:
            raise ValueError(
                f"DataProto ref handle field {name!r} references unknown stage {stage!r}"
            )
        field_index[name] = StructuredFieldLocation(stage=stage, member=member, section=section)
    group = handle.get(STORAGE_GROUP_ID)
    if (version == 2 and group is None) or (group is not None and not _nonempty_str(group)):
        raise ValueError("DataProto ref handle has invalid storage_group_id")
    indexes = _import_global_indexes(handle.get("global_indexes"))
    try:
        batch_size = int(handle["batch_size"])
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError("DataProto ref handle needs an integer batch_size") from error
    return MooncakeDataProtoRef(
        batch_size=batch_size,
        stage_refs=stage_refs,
        field_index=field_index,
        meta_info=dict(_mapping_field(handle, "meta_info", {})),
        namespace=str(handle.get("namespace", "default")),
        partition=str(handle.get("partition", "default")),
        global_indexes=indexes,
        encoded_non_tensor=dict(_mapping_field(handle, "encoded_non_tensor", {})),
        _storage_group_id=group,
    )


export_ref = export_dataproto_ref
import_ref = import_dataproto_ref


def _require_mapping(value: Any, name: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"DataProto ref handle {name} must be a mapping")
    return value


def _import_global_indexes(value: Any) -> list[int] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise ValueError("DataProto ref handle global_indexes must be a list or null")
    if any(isinstance(i, bool) or not isinstance(i, int) for i in value):
        raise ValueError("DataProto ref handle global_indexes must contain integers")
    return list(value)


def _resolve_dataproto_ref(ref: Any) -> MooncakeDataProtoRef:
    if isinstance(ref, MooncakeDataProtoRef):
        return ref
    if is_dataproto_ref_handle(ref):
        return import_dataproto_ref(ref)
    raise TypeError(
        f"expected MooncakeDataProtoRef or DataProto handle, got {type(ref).__name__}"
    )


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
    failures = []
    for key in dict.fromkeys(keys):
        try:
            status = store.remove(key, True)
        except Exception:
            if strict:
                raise
            continue
        if status not in (None, 0, MISSING_OBJECT_ERROR):
            failures.append((key, status))
    if failures and strict:
        raise RuntimeError(f"failed to remove {len(failures)} Mooncake keys: {failures[:3]}")


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


# ---------------------------------------------------------------------------------------------
# Bundles: manifest + meta payload + named buffer payloads
# ---------------------------------------------------------------------------------------------


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


class _Bundles:
    def __init__(self, store: Any, prefix: str, chunk_bytes: int) -> None:
        self.store = store
        self.prefix = prefix
        self.chunk_bytes = chunk_bytes

    # -- writing --------------------------------------------------------------------------------

    def _put_bytes(self, key: str, view: memoryview, chunk: int, config: Any, written: list,
                   pending: list | None = None):
        """Write (or, given ``pending``, queue for one batched write) a payload's chunks."""
        if len(view) == 0:
            return {"key": key, "bytes": 0, "chunks": []}
        pieces = [view[i : i + chunk] for i in range(0, len(view), chunk)]
        names = [key] if len(pieces) == 1 else [f"{key}/chunk/{i}" for i in range(len(pieces))]
        for name, piece in zip(names, pieces):
            if pending is not None:
                pending.append((name, piece))
                continue
            _check_status(_call_write_with_optional_config(self.store.put, name, piece, config=config), "put", name)
            written.append(name)
        return {
            "key": key,
            "bytes": len(view),
            "chunks": [{"key": n, "bytes": len(p)} for n, p in zip(names, pieces)],
        }

    def _put_tensor(self, key: str, tensor: Any, config: Any, written: list) -> dict[str, Any]:
        put_tensor = getattr(self.store, "put_tensor" if config is None else "pub_tensor", None)
        if callable(put_tensor):
            header = _tensor_codec._HEADER_BYTES
            _check_status(_call_write_with_optional_config(put_tensor, key, tensor, config=config), "put_tensor", key)
            written.append(key)
            total = header + int(tensor.nbytes)
            return {
                "key": key,
                "kind": "tensor",
                "bytes": total,
                "dtype": str(tensor.dtype),
                "shape": list(tensor.shape),
                "chunks": [{"key": key, "bytes": total}],
                "metadata_bytes": header,
            }
        if tensor.dim() == 0:
            buf = io.BytesIO()
            _torch.save(tensor, buf)
            blob = buf.getvalue()
            spec = self._put_bytes(key, memoryview(blob), len(blob), config, written)
            spec["format"] = "torch_save"
            return spec
        header, ptr, nbytes, _owner = _tensor_codec._serialize_tensor(tensor)
        import ctypes

        blob = bytes(header) + (ctypes.string_at(ptr, nbytes) if nbytes else b"")
        spec = self._put_bytes(key, memoryview(blob), len(blob) or 1, config, written)
        spec["metadata_bytes"] = len(header)
        return spec

    def _put_tensor_object(self, key: str, value: _TensorObjectBufferPayload, config: Any,
                           written: list) -> dict[str, Any]:
        """A ``tensor_object_buffer`` member, stored as is with ``put_from`` (upstream's way),
        after the store checked the memory and its header was checked against ``size``."""
        header_len = min(value.size, _tensor_codec._HEADER_BYTES)
        read = getattr(self.store, "_read_registered", None)
        header = read(value.ptr, header_len) if callable(read) else None
        if header is None:
            raise ValueError(f"tensor_object_buffer at {value.ptr:#x} ({value.size} bytes) is "
                             "not registered or mapped memory of this process")
        try:
            _native._decode_tensor_header(header, value.size)
        except ValueError as error:
            raise ValueError(f"tensor_object_buffer at {value.ptr:#x}: {error}") from None
        args = (key, value.ptr, value.size) + (() if config is None else (config,))
        _check_status(self.store.put_from(*args), "put_from", key)
        written.append(key)
        return {"key": key, "bytes": value.size, "chunks": [{"key": key, "bytes": value.size}]}

    def put_bundle(self, meta, buffers, partition, chunk_bytes, config=None,
                   zero_copy=False) -> RemoteBundleRef:
        _validate_key_segment(partition, "partition")
        meta_view = _byte_view(meta, "meta")
        chunk = _validate_chunk_bytes(self.chunk_bytes if chunk_bytes is None else chunk_bytes)
        object_id = f"{partition}/{uuid.uuid4().hex}"
        base = f"{self.prefix}/{object_id}"
        written: list[str] = []
        pending: list[tuple[str, memoryview]] = []
        try:
            meta_spec = self._put_bytes(f"{base}/meta", meta_view, chunk, config, written,
                                        pending)
            specs: dict[str, Any] = {}
            for name, value in buffers.items():
                _validate_key_segment(name, "buffer name")
                key = f"{base}/buffer/{name}"
                if isinstance(value, _TensorObjectBufferPayload):
                    specs[name] = self._put_tensor_object(key, value, config, written)
                elif zero_copy and isinstance(value, _TensorPayload):
                    raise ValueError("zero-copy structured tensor fields require a BufferPool "
                                     "tensor-object buffer")
                elif zero_copy:
                    raise RuntimeError("zero-copy put requires tensor-object buffers")
                elif isinstance(value, _TensorPayload):
                    specs[name] = self._put_tensor(key, value.tensor, config, written)
                else:
                    specs[name] = self._put_bytes(
                        key, _byte_view(value, name), chunk, config, written, pending
                    )
            self._flush(pending, config, written)
            manifest = {
                "version": 1,
                "layout": "bundle",
                "object_id": object_id,
                "meta": meta_spec,
                "buffers": specs,
            }
            manifest_key = f"{base}/manifest"
            status = _call_write_with_optional_config(self.store.put, manifest_key, _public()._encode_manifest(manifest),
                            config=config)
            _check_status(status, "put", manifest_key)
            written.append(manifest_key)
        except BaseException:
            _cleanup_keys(self.store, written, strict=False)
            raise
        return RemoteBundleRef(manifest_key=manifest_key, manifest=manifest)

    def _flush(self, pending: list, config: Any, written: list) -> None:
        """Write the queued chunks: one put_batch when the store has it, else one put each."""
        put_batch = getattr(self.store, "put_batch", None)
        if len(pending) > 1 and callable(put_batch):
            keys = [k for k, _ in pending]
            written.extend(keys)  # on failure some may exist: all are cleaned up
            batch_config = _config_for_grouped_keys(config, len(keys))
            status = _write_raw(put_batch, keys, [v for _, v in pending], config=batch_config)
            _check_status(status, "put_batch", keys[0])
            return
        for key, view in pending:
            _check_status(_call_write_with_optional_config(self.store.put, key, view, config=config), "put", key)
            written.append(key)

    def put_manifest(self, meta: bytes, buffers: Mapping[str, Any], partition: str,
                     cleanup_keys: Sequence[str], config: Any = None) -> RemoteBundleRef:
        """A new manifest pointing at buffers already written under other bundles."""
        object_id = f"{partition}/{uuid.uuid4().hex}"
        base = f"{self.prefix}/{object_id}"
        written: list[str] = []
        try:
            meta_spec = self._put_bytes(
                f"{base}/meta", memoryview(meta), self.chunk_bytes, config, written
            )
            cleanup = list(dict.fromkeys(cleanup_keys))
            owners = {self.object_id_of(str(spec["key"])) for spec in buffers.values()}
            owners.update(self.object_id_of(k) for k in cleanup)
            manifest = {
                "version": 1,
                "layout": "bundle",
                "object_id": object_id,
                "meta": meta_spec,
                "buffers": dict(buffers),
                "buffer_object_ids": sorted(o for o in owners if o),
            }
            if cleanup:
                manifest["cleanup_keys"] = cleanup
            self.validate(manifest)
            manifest_key = f"{base}/manifest"
            status = _call_write_with_optional_config(self.store.put, manifest_key, _public()._encode_manifest(manifest),
                            config=config)
            _check_status(status, "put", manifest_key)
            written.append(manifest_key)
        except BaseException:
            _cleanup_keys(self.store, written, strict=False)
            raise
        return RemoteBundleRef(manifest_key=manifest_key, manifest=manifest)

    # -- reading --------------------------------------------------------------------------------

    def object_id_of(self, key: str) -> str | None:
        head = f"{self.prefix}/"
        if not key.startswith(head):
            return None
        rest = key[len(head):]
        for tail in ("/manifest", "/meta"):
            if rest.endswith(tail):
                return rest[: -len(tail)]
        for marker in ("/meta/", "/buffer/"):
            at = rest.find(marker)
            if at > 0:
                return rest[:at]
        return None

    def _check_payload(self, spec: Any, bases: Sequence[str]) -> None:
        if not isinstance(spec, dict):
            raise ValueError("bundle payload spec must be a dict")
        key = spec.get("key")
        if not isinstance(key, str) or not any(key.startswith(f"{b}/") for b in bases):
            raise ValueError("bundle payload key is outside the bundle namespace")
        try:
            expected = int(spec.get("bytes", -1))
        except (TypeError, ValueError):
            expected = -1
        if expected < 0:
            raise ValueError("bundle payload bytes must be non-negative")
        chunks = spec.get("chunks")
        if not isinstance(chunks, list) or (expected and not chunks):
            raise ValueError("bundle payload chunks are invalid")
        seen, total = set(), 0
        for chunk in chunks:
            if not isinstance(chunk, dict):
                raise ValueError("bundle chunk must be a dict")
            ckey = chunk.get("key")
            try:
                size = int(chunk.get("bytes", -1))
            except (TypeError, ValueError):
                size = -1
            if not isinstance(ckey, str) or (ckey != key and not ckey.startswith(f"{key}/")):
                raise ValueError("bundle chunk key is outside the payload namespace")
            if ckey in seen:
                raise ValueError("bundle chunk keys must be unique")
            if size < 0:
                raise ValueError("bundle chunk bytes must be non-negative")
            seen.add(ckey)
            total += size
        if total != expected:
            raise ValueError(f"bundle payload chunks total {total} bytes, expected {expected}")

    def validate(self, manifest: Any) -> None:
        if not isinstance(manifest, dict):
            raise ValueError("invalid bundle manifest")
        if manifest.get("version") != 1 or manifest.get("layout") != "bundle":
            raise ValueError("invalid bundle manifest")
        object_id = manifest.get("object_id")
        if not isinstance(object_id, str):
            raise ValueError("bundle manifest object_id must be a string")
        owners = manifest.get("buffer_object_ids", [object_id])
        if not isinstance(owners, list) or not all(isinstance(o, str) for o in owners):
            raise ValueError("bundle manifest buffer_object_ids must be a list of strings")
        bases = [f"{self.prefix}/{o}" for o in owners]
        self._check_payload(manifest.get("meta"), [f"{self.prefix}/{object_id}"])
        cleanup = manifest.get("cleanup_keys", [])
        if not isinstance(cleanup, list) or not all(
            isinstance(k, str) and any(k == f"{b}/manifest" or k.startswith(f"{b}/")
                                       for b in bases)
            for k in cleanup
        ):
            raise ValueError("bundle manifest cleanup_keys are outside the bundle namespace")
        buffers = manifest.get("buffers")
        if not isinstance(buffers, dict):
            raise ValueError("bundle manifest buffers must be a dict")
        for name, spec in buffers.items():
            _validate_key_segment(name, "buffer name")
            self._check_payload(spec, bases)

    def resolve(self, ref: Any) -> dict[str, Any]:
        if isinstance(ref, RemoteBundleRef):
            manifest = ref.manifest or self._load_manifest(ref.manifest_key)
        elif isinstance(ref, Mapping):
            manifest = ref.get("manifest")
            if manifest is None:
                key = ref.get("manifest_key")
                if not isinstance(key, str):
                    raise ValueError("bundle ref must include manifest_key")
                manifest = self._load_manifest(key)
        else:
            raise TypeError(f"expected RemoteBundleRef or mapping, got {type(ref).__name__}")
        self.validate(manifest)
        return manifest

    def _load_manifest(self, key: str) -> dict[str, Any]:
        blob = self.store.get(key)
        if not blob:
            raise BundleNotFoundError(f"bundle manifest {key!r} not found")
        return _public()._decode_manifest(blob)

    def manifest_key(self, ref: Any, manifest: Mapping[str, Any]) -> str:
        expected = f"{self.prefix}/{manifest['object_id']}/manifest"
        key = ref.manifest_key if isinstance(ref, RemoteBundleRef) else ref.get("manifest_key")
        if key is None:
            return expected
        if key != expected:
            raise ValueError("bundle manifest_key does not match manifest object_id")
        return key

    def read(self, spec: Mapping[str, Any]) -> bytes:
        return self.read_many([spec])[0]

    def read_many(self, specs: Sequence[Mapping[str, Any]]) -> list[bytes]:
        """Every payload's bytes, fetched with one get_batch when the store has it."""
        chunks = [c for spec in specs for c in spec["chunks"]]
        get_batch = getattr(self.store, "get_batch", None)
        if len(chunks) > 1 and callable(get_batch):
            blobs = get_batch([c["key"] for c in chunks])
            if len(blobs) != len(chunks):
                raise RuntimeError(f"get_batch returned {len(blobs)} values for "
                                   f"{len(chunks)} keys")
        else:
            blobs = [self.store.get(c["key"]) for c in chunks]
        for chunk, blob in zip(chunks, blobs):
            if len(blob) != int(chunk["bytes"]):
                raise RuntimeError(
                    f"bundle chunk {chunk['key']!r} read {len(blob)} bytes, "
                    f"expected {chunk['bytes']}"
                )
        out, at = [], 0
        for spec in specs:
            n = len(spec["chunks"])
            parts = blobs[at : at + n]
            at += n
            out.append(b"" if not parts else parts[0] if n == 1 else b"".join(parts))
        return out

    def decode_tensor(self, spec: Mapping[str, Any], blob: bytes) -> Any:
        if spec.get("format") == "torch_save":
            return _torch.load(io.BytesIO(blob), weights_only=True)
        return _tensor_codec._deserialize_tensor(blob)


    @staticmethod
    def keys_of(manifest: Mapping[str, Any]) -> list[str]:
        return [
            c["key"]
            for spec in [manifest["meta"], *manifest["buffers"].values()]
            for c in spec["chunks"]
        ]

    def remove(self, ref: Any) -> None:
        key = ref.manifest_key if isinstance(ref, RemoteBundleRef) else ref.get("manifest_key")
        embedded = ref.manifest if isinstance(ref, RemoteBundleRef) else ref.get("manifest")
        is_exist = getattr(self.store, "is_exist", None)
        if not embedded and isinstance(key, str) and callable(is_exist):
            status = is_exist(key)
            if status == 0:
                return
            if status != 1:
                raise RuntimeError(f"is_exist failed for {key}: {status}")
        manifest = self.resolve(ref)
        keys = self.keys_of(manifest) + list(manifest.get("cleanup_keys", []))
        _cleanup_keys(self.store, keys, strict=True)
        _cleanup_keys(self.store, [self.manifest_key(ref, manifest)], strict=True)


# ---------------------------------------------------------------------------------------------
# Structured object members: torch tensors, numpy arrays, bytes
# ---------------------------------------------------------------------------------------------


def _encode_structured_field(value: Any) -> tuple[dict[str, Any], Any]:
    """One member's decode record and what to store for it."""
    if isinstance(value, _TensorObjectBufferPayload):
        return {"encoding": "torch_tensor"}, value
    if isinstance(value, _TensorPayload):
        return _encode_torch_tensor_field(value.tensor)
    if isinstance(value, (_MultiBufferPayload, _DirectCopyPayload)):
        # Ours stores the parts joined (one copy); upstream copies them into pool memory.
        parts = value.buffers if isinstance(value, _MultiBufferPayload) else value.arrays
        data = b"".join(bytes(_bytes_view(p, "payload part")) for p in parts)
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
        return _encode_jagged(value)
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


def _encode_jagged(value: Any) -> tuple[dict[str, Any], bytes]:
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


def _decode_jagged(blob: bytes, fspec: Mapping[str, Any]) -> Any:
    fmt = fspec.get("format", "torch_save")
    if fmt == "torch_save":
        saved = _torch.load(io.BytesIO(blob), weights_only=True)
        return _jagged_from(saved.values(), saved.offsets(), saved.lengths(),
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
    return _jagged_from(tensors[0], tensors[1], tensors[2] if count == 3 else None,
                        int(fspec.get("ragged_idx", 1)))


def _jagged_from(values: Any, offsets: Any, lengths: Any, ragged_idx: int) -> Any:
    seq = lengths if lengths is not None else offsets.diff()
    low = int(seq.min().item()) if seq.numel() else 0
    high = int(seq.max().item()) if seq.numel() else 0
    return _torch.nested.nested_tensor_from_jagged(
        values, offsets=offsets, lengths=lengths, jagged_dim=ragged_idx,
        min_seqlen=low, max_seqlen=high)


def _decode_member(name: str, bundles: _Bundles, spec: Mapping[str, Any], fspec: Mapping,
                   blob: bytes) -> Any:
    encoding = fspec.get("encoding", "bytes")
    if encoding == "bytes":
        return bytes(blob)
    if encoding == "torch_tensor":
        if _torch is None:
            raise RuntimeError("torch is required to read torch_tensor members")
        if fspec.get("nested"):
            return _decode_jagged(blob, fspec)
        return bundles.decode_tensor(spec, blob)
    if encoding == "ndarray":
        dtype = _plain_dtype(fspec.get("dtype"))
        try:
            shape = tuple(int(d) for d in fspec["shape"])
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"structured member {name!r} has no valid shape") from error
        if any(d < 0 for d in shape):
            raise ValueError(f"structured member {name!r} has a negative dimension")
        expected = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
        if len(blob) != expected:
            raise ValueError(
                f"structured member {name!r} holds {len(blob)} bytes, "
                f"{dtype} {list(shape)} needs {expected}"
            )
        return np.frombuffer(bytearray(blob), dtype=dtype).reshape(shape)
    raise ValueError(f"unsupported structured field encoding: {encoding}")


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
    if isinstance(target, (_TensorObjectBufferPayload, _RawDestinationBuffer)) and _is_tensor(value):
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


def _slice_member(value: Any, sl: StructuredMemberSlice) -> Any:
    if isinstance(value, (bytes, bytearray)):
        if sl.axis != 0:
            raise ValueError("bytes members can be sliced on axis 0 only")
        return bytes(value[sl.start : sl.end : sl.step])
    index = [slice(None)] * value.ndim
    if not 0 <= sl.axis < value.ndim:
        raise ValueError(f"slice axis {sl.axis} out of range for a {value.ndim}-d member")
    index[sl.axis] = slice(sl.start, sl.end, sl.step)
    out = value[tuple(index)]
    return out.clone() if _is_tensor(out) else np.array(out)


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
        _validate_key_segment(name, "buffer name")
        specs[name], encoded[name] = _encode_structured_field(value)
    if specs:
        meta[STRUCTURED_FIELD_SPECS_KEY] = specs
    return meta, encoded


# ---------------------------------------------------------------------------------------------
# Codec inference for per-row Python values (non_tensor_batch columns)
# ---------------------------------------------------------------------------------------------


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<MISSING>"


MISSING = _Missing()


@dataclass
class _CodecDecision:
    """Which codec a column of row values takes, and why (``metadata`` lands in the column's
    encoding record, e.g. the common ``dtype``)."""

    accepted: bool
    codec: str
    reason: str
    normalized_type: str
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class _EncodedStructuredLeaf:
    codec: str
    rows: int
    payload: dict[str, Any]
    metadata: dict[str, Any]


@dataclass
class _InferredLeaf:
    path: str
    values: list[Any]
    decision: _CodecDecision


@dataclass
class _InferredNode:
    path: str
    node_type: str  # "dict" or "list"
    children: list[Any]
    lengths: list[int] | None = None
    row_mask: list[bool] | None = None


def _non_null(values: Sequence[Any]) -> list[Any]:
    return [v for v in values if v is not None and not isinstance(v, _Missing)]


def _is_bytes_like(value: Any) -> bool:
    return isinstance(value, (bytes, bytearray, memoryview))


def _is_pil_image(value: Any) -> bool:
    module = getattr(type(value), "__module__", "") or ""
    return module.startswith("PIL.") and hasattr(value, "save")


def _is_media_list(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and all(
        _is_pil_image(i) or _is_bytes_like(i) for i in value)


def _is_number(value: Any) -> bool:
    return isinstance(value, (bool, int, float, np.number))


# The single-codec probes: each says whether every non-null row fits one codec. Inference
# itself goes through `_choose_leaf_codec`; these answer for one codec at a time.


def _check_all(values: Sequence[Any], predicate: Any, codec: str,
               normalized_type: str) -> _CodecDecision:
    rows = _non_null(values)
    if not rows:
        return _CodecDecision(False, codec, "all rows are null", normalized_type)
    if not all(predicate(v) for v in rows):
        return _CodecDecision(False, codec, f"not all rows are {normalized_type}",
                              normalized_type)
    return _CodecDecision(True, codec, f"all non-null rows are {normalized_type}",
                          normalized_type)


def _can_media_list(values: Sequence[Any]) -> _CodecDecision:
    decision = _check_all(values, _is_media_list, "media_list_ragged", "media list")
    if decision.accepted and not any(len(v) for v in _non_null(values)):
        return _CodecDecision(False, "media_list_ragged", "all media lists are empty",
                              "media list")
    return decision


def _can_tensor(values: Sequence[Any]) -> _CodecDecision:
    if _torch is None:
        return _CodecDecision(False, "ragged_tensor", "torch is not available", "torch.Tensor")
    decision = _check_all(values, _is_tensor, "ragged_tensor", "Tensor")
    decision.normalized_type = "torch.Tensor"
    if not decision.accepted:
        return decision
    rows = _non_null(values)
    dtypes = sorted({str(v.dtype) for v in rows})
    if len(dtypes) != 1:
        return _CodecDecision(False, "ragged_tensor", f"mixed dtypes: {dtypes}", "torch.Tensor")
    ndims = {v.ndim for v in rows}
    if len(ndims) != 1:
        return _CodecDecision(False, "ragged_tensor", f"mixed dimensions: {ndims}",
                              "torch.Tensor")
    return _CodecDecision(True, "ragged_tensor", "all non-null rows are Tensor", "torch.Tensor",
                          {"dtype": dtypes[0]})


def _can_numeric_sequence(values: Sequence[Any]) -> _CodecDecision:
    kind = "numeric sequence"
    rows = _non_null(values)
    if not rows:
        return _CodecDecision(False, "typed_ragged", "all rows are null", kind)
    dtypes = []
    for v in rows:
        if not isinstance(v, (np.ndarray, list, tuple)):
            return _CodecDecision(False, "typed_ragged", "row is not array-like", kind)
        try:
            array = np.asarray(v)
        except (ValueError, TypeError):
            return _CodecDecision(False, "typed_ragged", "row cannot be converted to ndarray",
                                  kind)
        if array.dtype == object or not np.issubdtype(array.dtype, np.number):
            return _CodecDecision(False, "typed_ragged", f"non-numeric dtype: {array.dtype}",
                                  kind)
        dtypes.append(array.dtype)
    try:
        dtype = np.result_type(*dtypes)
    except (TypeError, ValueError, OverflowError):
        return _CodecDecision(False, "typed_ragged", "cannot determine common dtype", kind)
    return _CodecDecision(True, "typed_ragged", "all rows promote to common numeric dtype",
                          kind, {"dtype": str(dtype)})


def _can_numeric_scalar(values: Sequence[Any]) -> _CodecDecision:
    decision = _check_all(values, _is_number, "ndarray", "numeric scalar")
    if not decision.accepted:
        return decision
    try:
        dtype = np.result_type(*_non_null(values))
    except (TypeError, ValueError, OverflowError):
        return _CodecDecision(False, "ndarray", "cannot determine common dtype", "numeric scalar")
    return _CodecDecision(True, "ndarray", "all rows are numeric scalar", "numeric scalar",
                          {"dtype": str(dtype)})


def _can_serialize(values: Sequence[Any], codec: str, kind: str, encode: Any,
                   structured_only: bool) -> _CodecDecision:
    rows = _non_null(values)
    if not rows:
        return _CodecDecision(False, codec, "all rows are null", kind)
    if structured_only and not all(isinstance(v, (dict, list, tuple)) for v in rows):
        return _CodecDecision(False, codec, "not all rows are structured objects", kind)
    sampled = 0
    for i, v in enumerate(rows):
        try:
            size = len(encode(v))
        except (TypeError, ValueError, OverflowError, RecursionError):
            return _CodecDecision(False, codec, "serialization failed", kind)
        if i < _INFER_MAX_SAMPLE_ROWS:
            sampled += size
    if sampled > _INFER_MAX_JSON_BYTES:
        return _CodecDecision(False, codec, "sampled payload too large", kind)
    return _CodecDecision(True, codec, f"all rows pass {kind.upper() if kind == 'json' else kind}"
                          " serialization", kind)


def _can_msgpack(values: Sequence[Any]) -> _CodecDecision:
    return _can_serialize(
        values, "msgpack_ragged", "msgpack",
        lambda v: _msgpack.packb(v, use_bin_type=True, strict_types=True), True)


def _can_json(values: Sequence[Any]) -> _CodecDecision:
    return _can_serialize(
        values, "json_ragged", "json",
        lambda v: json.dumps(v, ensure_ascii=False, separators=(",", ":")).encode("utf-8"),
        False)


def _choose_leaf_codec(values: Sequence[Any]) -> _CodecDecision:
    rows = _non_null(values)
    if not rows:
        return _CodecDecision(False, "msgpack_ragged", "all rows are null", "msgpack")
    if all(_is_tensor(v) for v in rows):
        dtypes = {v.dtype for v in rows}
        if len(dtypes) != 1:
            names = sorted(str(d) for d in dtypes)
            return _CodecDecision(False, "ragged_tensor", f"mixed tensor dtype: {names}", "torch.Tensor")
        return _CodecDecision(True, "ragged_tensor", "all non-null rows are Tensor", "torch.Tensor",
                       {"dtype": str(rows[0].dtype)})
    if all(_is_media_list(v) for v in rows):
        return _CodecDecision(True, "media_list_ragged", "all rows are media lists", "media list")
    if all(isinstance(v, np.ndarray) for v in rows):
        if all(np.issubdtype(v.dtype, np.number) for v in rows):
            return _CodecDecision(True, "typed_ragged", "all rows are numeric ndarray",
                           "numeric sequence", {"recursive_source": "ndarray"})
        return _CodecDecision(False, "msgpack_ragged", "object ndarray rows", "python object")
    if all(isinstance(v, (list, tuple)) for v in rows):
        try:
            common = np.result_type(*[np.asarray(v).dtype for v in rows])
        except (TypeError, ValueError, OverflowError):
            common = None
        if common is not None and np.issubdtype(common, np.number):
            return _CodecDecision(True, "typed_ragged", "all rows are numeric sequences",
                           "numeric sequence", {"dtype": str(common)})
    if all(_is_number(v) for v in rows):
        return _CodecDecision(True, "ndarray", "all rows are numeric scalar", "numeric scalar",
                       {"dtype": str(np.result_type(*rows))})
    if all(_is_bytes_like(v) for v in rows):
        return _CodecDecision(True, "bytes_ragged", "all rows are bytes-like", "bytes-like")
    if all(_is_pil_image(v) for v in rows):
        return _CodecDecision(True, "media_bytes", "all rows are media", "media")
    if all(isinstance(v, str) for v in rows):
        return _CodecDecision(True, "utf8_ragged", "all rows are str", "str")
    if all(isinstance(v, (dict, list, tuple)) for v in rows):
        return _CodecDecision(True, "msgpack_ragged", "all rows are msgpack-like", "msgpack")
    return _CodecDecision(False, "msgpack_ragged", "no codec matched", "python object")


def _try_expand_dict(values: Sequence[Any]) -> list[str] | None:
    """The sorted keys when every non-null row is a dict of at most
    ``_INFER_MAX_STRUCT_KEYS`` string keys, else None."""
    rows = _non_null(values)
    if not rows or not all(isinstance(v, dict) for v in rows):
        return None
    keys = {k for v in rows for k in v}
    if not all(isinstance(k, str) for k in keys) or len(keys) > _INFER_MAX_STRUCT_KEYS:
        return None
    return sorted(keys)


def _try_expand_list(values: Sequence[Any]) -> tuple[int, list[int]] | None:
    """(longest, per-row lengths) when every non-null row is a list of at most
    ``_INFER_MAX_LIST_LEN`` containers or Nones, else None."""
    rows = _non_null(values)
    if not rows or not all(isinstance(v, (list, tuple)) for v in rows):
        return None
    longest = max(len(v) for v in rows)
    if longest > _INFER_MAX_LIST_LEN:
        return None
    if not all(i is None or isinstance(i, (dict, list, tuple)) for v in rows for i in v):
        return None
    return longest, [len(v) if isinstance(v, (list, tuple)) else 0 for v in values]


def _escape_key(key: str) -> str:
    return key.replace("\\", "\\\\").replace(".", "\\.").replace("[", "\\[")


def infer_structure(path: str, values: list[Any], leaves: list[_InferredLeaf],
                    nodes: list[_InferredNode], *, _depth: int = 0) -> None:
    """Walk a column of row values into ``nodes`` (dicts and short lists of containers) and
    ``leaves`` (every other column, with the codec `_choose_leaf_codec` picks). A dict key
    absent from a row is ``MISSING`` in its child column, a None parent is None; each node's
    ``row_mask`` says which rows had a real container."""
    if _depth > _INFER_MAX_DEPTH:
        raise ValueError(f"infer_structure exceeded max depth {_INFER_MAX_DEPTH} at {path!r}")
    sos = _public()
    keys = sos._try_expand_dict(values)
    if keys is not None:
        nodes.append(_InferredNode(path, "dict", keys,
                                   row_mask=[isinstance(v, dict) for v in values]))
        for key in keys:
            column = [v.get(key, MISSING) if isinstance(v, dict) else None for v in values]
            infer_structure(f"{path}.{sos._escape_key(key)}", column, leaves, nodes,
                            _depth=_depth + 1)
        return
    expanded = sos._try_expand_list(values)
    if expanded is not None:
        longest, lengths = expanded
        nodes.append(_InferredNode(path, "list", list(range(longest)), lengths,
                                   row_mask=[isinstance(v, (list, tuple)) for v in values]))
        for i in range(longest):
            column = [
                (v[i] if i < len(v) else MISSING) if isinstance(v, (list, tuple)) else None
                for v in values
            ]
            infer_structure(f"{path}[{i}]", column, leaves, nodes, _depth=_depth + 1)
        return
    leaves.append(_InferredLeaf(path, values, sos._choose_leaf_codec(values)))


def _should_encode_recursive_structure(leaves: Sequence[_InferredLeaf]) -> bool:
    return any(_public()._should_encode_recursive_leaf(leaf) for leaf in leaves)


def _should_encode_recursive_leaf(leaf: _InferredLeaf) -> bool:
    """A nested column is split when a leaf holds what a JSON-like codec would bloat:
    tensors, bytes, media, or ndarray rows."""
    codec = leaf.decision.codec
    if codec in ("ragged_tensor", "bytes_ragged", "media_bytes", "media_list_ragged"):
        return True
    if codec == "typed_ragged":
        return any(isinstance(v, np.ndarray) for v in _non_null(leaf.values))
    return False


def _recursive_leaf_decision(values: Sequence[Any], decision: _CodecDecision) -> _CodecDecision:
    """A leaf with no value at all (every row null or missing) is kept as json_ragged."""
    if decision.accepted:
        return decision
    if all(v is None or isinstance(v, _Missing) for v in values):
        return _CodecDecision(True, "json_ragged", "all rows are null or missing", "json")
    return decision


def _structured_path_tokens(path: str) -> list[Any]:
    """A leaf/node path (``root.key[2].a\\.b``) as its dict keys and list indices."""
    tokens: list[Any] = []
    current: list[str] = []
    i = 0
    while i < len(path):
        char = path[i]
        if char == "\\" and i + 1 < len(path):
            current.append(path[i + 1])
            i += 2
            continue
        if char in ".[" and current:
            tokens.append("".join(current))
            current = []
        if char == ".":
            i += 1
        elif char == "[":
            end = path.index("]", i)
            tokens.append(int(path[i + 1:end]))
            i = end + 1
        else:
            current.append(char)
            i += 1
    if current:
        tokens.append("".join(current))
    return tokens


def _lookup_structured_path(value: Any, root_path: str, target_path: str) -> Any:
    """The value at ``target_path`` inside one row of the column rooted at ``root_path``,
    or ``MISSING`` where a key or list item is absent on the way."""
    suffix = target_path[len(root_path):].removeprefix(".")
    current = value
    for token in _structured_path_tokens(suffix) if suffix else ():
        if isinstance(token, str):
            if not isinstance(current, dict) or token not in current:
                return MISSING
        elif not isinstance(current, (list, tuple)) or token >= len(current):
            return MISSING
        current = current[token]
    return current


def _encode_typed_ragged_values(values: Sequence[Any], dtype: Any = None):
    """The typed_ragged layout: flat data, int64 offsets, int64 shapes, int16 ndims, nulls."""
    if dtype is None:
        present = [np.asarray(v) for v in values if v is not None]
        dtype = np.result_type(*present) if present else np.dtype(_TYPED_RAGGED_DEFAULT_DTYPE)
    dtype = np.dtype(dtype)
    if dtype.hasobject:
        raise ValueError("typed_ragged codec requires non-object dtype")
    all_arrays = all(v is None or isinstance(v, np.ndarray) for v in values)
    n = len(values)
    nulls = np.asarray([v is None for v in values], dtype=np.bool_)
    # np.asarray(order="C") keeps 0-d rows 0-d (np.ascontiguousarray would make them 1-d).
    if all_arrays and n:
        arrays = [None if v is None else np.asarray(v, dtype=dtype, order="C") for v in values]
    else:
        arrays = [np.asarray([], dtype=dtype) if v is None
                  else np.asarray(v, dtype=dtype, order="C") for v in values]
    real = [a for a in arrays if a is not None]
    max_ndim = max((a.ndim for a in real), default=0)
    offsets = np.zeros(n + 1, dtype=np.int64)
    ndims = np.zeros(n, dtype=np.int16)
    shapes = np.zeros((n, max(max_ndim, 1)), dtype=np.int64)
    for row, array in enumerate(arrays):
        size = 0 if array is None else array.size
        offsets[row + 1] = offsets[row] + size
        if array is not None:
            ndims[row] = array.ndim
            if array.ndim:
                shapes[row, : array.ndim] = array.shape
    if all_arrays and n and real and any(nulls):
        # Null rows of equally shaped ndarray rows carry the shared trailing shape.
        tails = {a.shape[1:] for a in real}
        if len(tails) == 1 and all(a.ndim == real[0].ndim >= 2 for a in real):
            tail = tails.pop()
            if 0 not in tail:
                shapes[nulls, 1:] = tail
    data = (np.concatenate([a.reshape(-1) for a in real]) if real
            else np.empty(0, dtype=dtype)).astype(dtype, copy=False)
    meta: dict[str, Any] = {
        "dtype": str(dtype),
        "max_ndim": int(max_ndim),
        "shape_policy": "ragged",
    }
    flags = [v is not None and isinstance(v, np.ndarray) for v in values]
    if all_arrays and n:
        meta.update(row_format="ndarray", ndarray_rows=None, physical_layout="contiguous_flat")
    elif any(flags):
        meta.update(row_format="mixed", ndarray_rows=flags)
    else:
        meta.update(row_format="list", ndarray_rows=None)
    payload = {"data": data, "offsets": offsets, "shapes": shapes, "ndims": ndims,
               "nulls": nulls}
    return payload, meta


def _decode_typed_ragged_values(payload: Mapping[str, Any], rows: int, meta: Mapping) -> list:
    dtype = _plain_dtype(meta.get("dtype", _TYPED_RAGGED_DEFAULT_DTYPE))
    data = _as_array(payload["data"], dtype)
    offsets, shapes = payload["offsets"], np.asarray(payload["shapes"])
    ndims, nulls = payload["ndims"], payload["nulls"]
    _check_rows("typed_ragged", rows, offsets=offsets, nulls=nulls, ndims=ndims)
    if shapes.ndim != 2 or len(shapes) != rows:
        raise ValueError(f"typed_ragged shapes is {list(shapes.shape)}, expected {rows} rows")
    fmt = meta.get("row_format")
    flags = meta.get("ndarray_rows") or []
    out: list[Any] = []
    width = shapes.shape[1]
    offsets, ndims = np.asarray(offsets).tolist(), np.asarray(ndims).tolist()
    nulls, shapes = np.asarray(nulls).tolist(), shapes.tolist()
    for row in range(rows):
        if nulls[row]:
            out.append(None)
            continue
        begin, end = int(offsets[row]), int(offsets[row + 1])
        if not 0 <= begin <= end <= data.size:
            raise ValueError(f"typed_ragged offsets out of range at row {row}")
        ndim = int(ndims[row])
        if not 0 <= ndim <= width:
            raise ValueError(f"typed_ragged ndim {ndim} out of range at row {row}")
        shape = tuple(int(d) for d in shapes[row][:ndim])
        if any(d < 0 for d in shape) or math.prod(shape) != end - begin:
            raise ValueError(f"typed_ragged shape {list(shape)} does not hold {end - begin} "
                             f"elements at row {row}")
        array = data[begin:end].reshape(shape)
        if fmt == "ndarray" or (fmt == "mixed" and row < len(flags) and flags[row]):
            out.append(array)
        else:
            out.append(array.tolist())
    return out


def _plain_dtype(name: Any) -> np.dtype:
    try:
        dtype = np.dtype(name)
    except (TypeError, ValueError) as error:
        raise ValueError(f"invalid dtype in structured metadata: {name!r}") from error
    if dtype.hasobject:
        raise ValueError(f"object dtype in structured metadata: {name!r}")
    return dtype


def _as_array(raw: Any, dtype: np.dtype) -> np.ndarray:
    if isinstance(raw, np.ndarray):
        if raw.dtype == dtype:
            return raw
        return np.frombuffer(raw.tobytes(), dtype=dtype)
    return np.frombuffer(bytes(raw), dtype=dtype)


def _check_rows(codec: str, rows: int, offsets=None, nulls=None, ndims=None) -> None:
    if offsets is not None and len(offsets) != rows + 1:
        raise ValueError(f"{codec} offsets length {len(offsets)} does not match rows {rows}")
    if nulls is not None and len(nulls) != rows:
        raise ValueError(f"{codec} nulls length {len(nulls)} does not match rows {rows}")
    if ndims is not None and len(ndims) != rows:
        raise ValueError(f"{codec} ndims length {len(ndims)} does not match rows {rows}")


def _value_to_media_bytes(value: Any) -> tuple[bytes, str | None, dict[str, Any]]:
    """A row or list item as bytes, its media type and its encoding record: a PIL image as its
    raw pixels (``pil_raw``, mode, size, format), anything else as its bytes."""
    if value is None:
        return b"", None, {"kind": "null"}
    if _is_pil_image(value):
        image = value.convert(value.mode) if getattr(value, "readonly", False) else value
        return image.tobytes(), "image/raw", {
            "kind": "pil_raw",
            "mode": image.mode,
            "size": list(image.size),
            "format": getattr(value, "format", None),
        }
    return bytes(value), None, {"kind": "bytes"}


def _decode_media_bytes(data: bytes, encoding: Mapping[str, Any] | None) -> Any:
    """A ``pil_raw`` item back as a PIL image (its bytes when Pillow is not installed, as
    upstream), anything else as bytes."""
    if not encoding or encoding.get("kind") != "pil_raw":
        return bytes(data)
    try:
        from PIL import Image
    except ImportError:
        return bytes(data)
    mode = encoding["mode"]
    image = Image.frombuffer(mode, tuple(encoding["size"]), bytes(data), "raw", mode, 0, 1)
    image.format = encoding.get("format")
    return image


def _media_meta(kinds: list[dict[str, Any]], types: list[str | None]) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    if any(k.get("kind") == "pil_raw" for k in kinds):
        meta["media_encodings"] = kinds
    media_types = sorted({t for t in types if t})
    if media_types:
        meta["media_types"] = media_types
        meta["encode_source"] = "raw_pixels_from_object"
    return meta


def _encode_bytes_like_values(values: Sequence[Any]):
    parts, kinds, types = [], [], []
    for v in values:
        data, media_type, kind = _value_to_media_bytes(v)
        parts.append(data)
        kinds.append(kind)
        types.append(media_type)
    offsets = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in parts], out=offsets[1:])
    return {
        "data": b"".join(parts),
        "offsets": offsets,
        "nulls": np.asarray([v is None for v in values], dtype=np.bool_),
    }, _media_meta(kinds, types)


def _decode_bytes_like_values(payload: Mapping[str, Any], rows: int, meta: Mapping | None = None):
    encodings = (meta or {}).get("media_encodings") or []
    data = bytes(payload["data"])
    offsets, nulls = payload["offsets"], payload["nulls"]
    _check_rows("bytes", rows, offsets=offsets, nulls=nulls)
    out = []
    for row in range(rows):
        if bool(nulls[row]):
            out.append(None)
            continue
        begin, end = int(offsets[row]), int(offsets[row + 1])
        if not 0 <= begin <= end <= len(data):
            raise ValueError(f"bytes offsets out of range at row {row}")
        out.append(_decode_media_bytes(data[begin:end],
                                 encodings[row] if row < len(encodings) else None))
    return out


def _encode_media_list_values(values: Sequence[Any]):
    row_offsets, byte_offsets, parts, encodings, types = [0], [0], [], [], []
    for value in values:
        items = [] if value is None else list(value)
        for item in items:
            data, media_type, kind = _value_to_media_bytes(item)
            parts.append(data)
            encodings.append(kind)
            types.append(media_type)
            byte_offsets.append(byte_offsets[-1] + len(data))
        row_offsets.append(row_offsets[-1] + len(items))
    meta: dict[str, Any] = {"encode_source": "raw_pixels_from_object",
                            "media_encodings": encodings}
    media_types = sorted({t for t in types if t})
    if media_types:
        meta["media_types"] = media_types
    return {
        "data": b"".join(parts),
        "row_offsets": np.asarray(row_offsets, dtype=np.int64),
        "byte_offsets": np.asarray(byte_offsets, dtype=np.int64),
        "nulls": np.asarray([v is None for v in values], dtype=np.bool_),
    }, meta


def _decode_media_list_values(payload: Mapping[str, Any], rows: int, meta: Mapping | None):
    encodings = (meta or {}).get("media_encodings", [])
    data = bytes(payload["data"])
    row_offsets, byte_offsets = payload["row_offsets"], payload["byte_offsets"]
    nulls = payload["nulls"]
    _check_rows("media_list_ragged", rows, offsets=row_offsets, nulls=nulls)
    out = []
    for row in range(rows):
        if bool(nulls[row]):
            out.append(None)
            continue
        items = []
        first, last = int(row_offsets[row]), int(row_offsets[row + 1])
        if not 0 <= first <= last < len(byte_offsets):
            raise ValueError(f"media_list_ragged row offsets out of range at row {row}")
        for i in range(first, last):
            begin, end = int(byte_offsets[i]), int(byte_offsets[i + 1])
            if not 0 <= begin <= end <= len(data):
                raise ValueError(f"media_list_ragged offsets out of range at row {row}")
            items.append(_decode_media_bytes(data[begin:end],
                                       encodings[i] if i < len(encodings) else None))
        out.append(items)
    return out


def _encode_msgpack_ragged_values(path: str, values: Sequence[Any]):
    """The msgpack_ragged layout: each non-null row packed (bin type for bytes, exact types
    only, so a tuple is refused as upstream refuses it), offsets int64[n+1], nulls bool[n]."""
    packer = _msgpack.Packer(use_bin_type=True, strict_types=True)
    try:
        rows = [None if v is None else packer.pack(v) for v in values]
    except (TypeError, ValueError, OverflowError) as error:
        raise ValueError(f"unsupported structured non-tensor field {path}: "
                         "msgpack codec cannot encode value") from error
    payload, _meta = _encode_bytes_like_values(rows)
    payload["data"] = bytearray(payload["data"])
    return payload, {}


def _decode_msgpack_ragged_values(payload: Mapping[str, Any], rows: int) -> list:
    offsets, nulls = payload["offsets"], payload["nulls"]
    _check_rows("msgpack_ragged", rows, offsets=offsets, nulls=nulls)
    unpacker = _msgpack.Unpacker(raw=False)
    unpacker.feed(bytes(payload["data"]))
    try:
        decoded = list(unpacker)
    except (ValueError, _msgpack.UnpackException, RecursionError) as error:
        raise ValueError(f"msgpack_ragged payload is corrupt: {error}") from error
    wanted = int(rows - int(np.count_nonzero(nulls)))
    if len(decoded) != wanted:
        raise ValueError(f"msgpack_ragged decoded {len(decoded)} rows, expected {wanted}")
    it = iter(decoded)
    return [None if bool(null) else next(it) for null in nulls]


def _encode_ragged_tensor_values(values: Sequence[Any]):
    if _torch is None:
        raise RuntimeError("torch is required to encode ragged tensor fields")
    dtype, arrays = None, []
    for v in values:
        if v is None:
            arrays.append(None)
            continue
        if isinstance(v, np.ndarray):
            if v.dtype.hasobject:
                raise ValueError("ragged tensor codec requires numeric ndarray values")
            t = _torch.as_tensor(v.copy())
        else:
            t = v.detach()
        t = t.cpu().contiguous()
        if t.dtype == _torch.bfloat16:
            raise ValueError("ragged tensor codec does not support torch.bfloat16")
        dtype = t.dtype if dtype is None else dtype
        if t.dtype != dtype:
            raise ValueError(f"mixed tensor dtype: {dtype} vs {t.dtype}")
        arrays.append(t.numpy())
    dtype = dtype or _parse_torch_dtype(_RAGGED_TENSOR_DEFAULT_DTYPE)
    payload, meta = _encode_typed_ragged_values(arrays, _torch_dtype_to_numpy(str(dtype)))
    meta["dtype"] = str(dtype)
    return payload, meta


def _decode_ragged_tensor_values(payload: Mapping[str, Any], rows: int, meta: Mapping | None) -> list:
    if _torch is None:
        raise RuntimeError("torch is required to decode ragged tensor fields")
    name = (meta or {}).get("dtype", _RAGGED_TENSOR_DEFAULT_DTYPE)
    np_meta = dict(meta or {})
    np_meta["dtype"] = str(_torch_dtype_to_numpy(name))
    dtype = _parse_torch_dtype(name)
    out = []
    for v in _decode_typed_ragged_values(payload, rows, np_meta):
        if v is None:
            out.append(None)
        elif isinstance(v, np.ndarray):
            out.append(_torch.from_numpy(np.array(v)).to(dtype))
        else:
            out.append(_torch.as_tensor(v, dtype=dtype))
    return out


def _normalize_ragged_tensor_dict_keys(keys: Any) -> list[str]:
    out: list[str] = []
    for key in (keys.keys() if isinstance(keys, Mapping) else keys):
        if not isinstance(key, str):
            raise TypeError("ragged_tensor_dict keys must be strings")
        if not key:
            raise ValueError("ragged_tensor_dict keys must not be empty")
        if "." in key or "/" in key or "\\" in key:
            raise ValueError("ragged_tensor_dict keys must not contain '.', '/', or '\\'")
        if key in out:
            raise ValueError(f"ragged_tensor_dict keys contain duplicate key {key!r}")
        out.append(key)
    return out


def _encode_ragged_tensor_dict_values(values: Sequence[Any], schema: FieldSchema) -> _EncodedStructuredLeaf:
    """Rows of {name: tensor} (or None): one ragged_tensor column per name, ``{name}.{part}``,
    plus ``null_mask``. Names come from ``metadata['keys']`` or, sorted, from the rows."""
    declared = (schema.metadata or {}).get("keys")
    keys = None if declared is None else _normalize_ragged_tensor_dict_keys(declared)
    seen: set[str] = set()
    for row, item in enumerate(values):
        if item is None:
            continue
        if not isinstance(item, Mapping):
            raise TypeError("ragged_tensor_dict rows must be mappings or None; "
                            f"row {row} is {type(item).__name__}")
        nones = sorted(k for k, v in item.items() if v is None)
        if nones:
            raise TypeError("ragged_tensor_dict rows cannot contain explicit None tensor "
                            f"values; row {row} has explicit None for {nones}")
        names = _normalize_ragged_tensor_dict_keys(item.keys())
        if keys is None:
            seen.update(names)
        elif set(names) - set(keys):
            raise ValueError(
                "ragged_tensor_dict rows contain keys not declared in FieldSchema "
                f"metadata['keys']; row {row} has keys not declared: "
                f"{sorted(set(names) - set(keys))}")
    if keys is None:
        keys = _normalize_ragged_tensor_dict_keys(sorted(seen))
    if keys and _torch is None:
        raise RuntimeError("torch is required to encode ragged_tensor_dict fields")
    payload: dict[str, Any] = {"null_mask": np.asarray([v is None for v in values], np.bool_)}
    per_key = {}
    for key in keys:
        try:
            part, meta = _encode_ragged_tensor_values([None if v is None else v.get(key) for v in values])
        except (TypeError, ValueError, OverflowError, RuntimeError, RecursionError) as error:
            raise ValueError(f"failed to encode ragged_tensor_dict key {key!r}") from error
        for name, value in part.items():
            payload[f"{key}.{name}"] = value
        per_key[key] = meta
    return _EncodedStructuredLeaf("ragged_tensor_dict", len(values), payload,
                    {"keys": keys, "key_codecs": per_key})


def _decode_ragged_tensor_dict_values(payload: Mapping[str, Any], rows: int, meta: Mapping) -> list:
    mask = payload["null_mask"]
    if isinstance(mask, (bytes, bytearray)):
        mask = np.frombuffer(mask, dtype=np.bool_)
    _check_rows("ragged_tensor_dict", rows, nulls=mask)
    keys = meta.get("keys", [])
    columns = {}
    for key in keys:
        part = {n[len(key) + 1:]: v for n, v in payload.items() if n.startswith(f"{key}.")}
        columns[key] = _decode_ragged_tensor_values(part, rows, meta.get("key_codecs", {}).get(key))
    out: list[Any] = []
    for row in range(rows):
        if bool(mask[row]):
            out.append(None)
            continue
        out.append({k: columns[k][row] for k in keys if columns[k][row] is not None})
    return out


def _encode_numeric_scalar_values(values: Sequence[Any], decision: _CodecDecision):
    """The ndarray layout: one numeric array (nulls filled with 0/False) plus nulls bool[n]."""
    dtype = np.dtype(decision.metadata["dtype"])
    fill = False if dtype == np.bool_ else 0
    data = np.asarray([fill if v is None else v for v in values], dtype=dtype)
    nulls = np.asarray([v is None for v in values], dtype=np.bool_)
    return {"data": data, "nulls": nulls}, {"dtype": str(data.dtype), "shape": list(data.shape)}


def _decode_numeric_scalar_values(payload: Mapping[str, Any], rows: int | None = None) -> list:
    data, nulls = payload["data"], payload["nulls"]
    rows = len(data) if rows is None else rows
    if len(data) != rows or len(nulls) != rows:
        raise ValueError(f"ndarray codec holds {len(data)} rows, expected {rows}")
    if not bool(np.any(nulls)):
        return data.tolist()
    boxed = data.astype(object)
    boxed[np.asarray(nulls, dtype=bool)] = None
    return boxed.tolist()


def _encode_structured_leaf(values: Sequence[Any], decision: _CodecDecision,
                            path: str = "") -> _EncodedStructuredLeaf:
    """Encode one column of rows with the codec ``decision`` names (refused when it was not
    accepted); the decision's reason, type and metadata go into the encoding record."""
    choice = decision
    if not choice.accepted:
        raise ValueError(f"unsupported structured non-tensor field: {choice.reason}")
    codec = choice.codec
    if codec == "ragged_tensor":
        payload, meta = _encode_ragged_tensor_values(values)
    elif codec == "typed_ragged":
        payload, meta = _encode_typed_ragged_values(values)
    elif codec == "media_list_ragged":
        payload, meta = _encode_media_list_values(values)
    elif codec == "ndarray":
        payload, meta = _public()._encode_numeric_scalar_values(values, choice)
    elif codec in ("bytes_ragged", "media_bytes"):
        payload, meta = _encode_bytes_like_values(values)
    elif codec == "utf8_ragged":
        payload, meta = _encode_bytes_like_values([None if v is None else v.encode("utf-8") for v in values])
    elif codec == "msgpack_ragged":
        # Packed here, not by _encode_msgpack_ragged_values: an inferred column that msgpack
        # refuses raises msgpack's own TypeError, which the fallback search reports.
        payload, meta = _encode_bytes_like_values(
            [None if v is None else _msgpack.packb(v, use_bin_type=True, strict_types=True)
             for v in values])
    elif codec == "json_ragged":
        payload, meta = _encode_bytes_like_values(
            [None if v is None else json.dumps(v, ensure_ascii=False, separators=(",", ":"))
             .encode("utf-8") for v in values]
        )
    else:
        raise ValueError(f"unsupported structured non-tensor codec: {codec}")
    meta.update(
        schema_source="inferred_from_runtime_values",
        decision_reason=choice.reason,
        normalized_type=choice.normalized_type,
        **choice.metadata,
    )
    return _EncodedStructuredLeaf(codec, len(values), payload, meta)


def _decode_structured_leaf(codec: str, payload: Mapping[str, Any], rows: int, meta: Mapping | None):
    if codec == "ragged_tensor":
        return _decode_ragged_tensor_values(payload, rows, meta)
    if codec == "typed_ragged":
        return _decode_typed_ragged_values(payload, rows, meta or {})
    if codec == "media_list_ragged":
        return _decode_media_list_values(payload, rows, meta)
    if codec == "ndarray":
        return _decode_numeric_scalar_values(payload, rows)
    if codec in ("bytes_ragged", "media_bytes"):
        return _decode_bytes_like_values(payload, rows, meta)
    if codec == "utf8_ragged":
        return [None if v is None else v.decode("utf-8") for v in _decode_bytes_like_values(payload, rows)]
    if codec == "msgpack_ragged":
        return _decode_msgpack_ragged_values(payload, rows)
    if codec == "json_ragged":
        return [None if v is None else json.loads(v) for v in _decode_bytes_like_values(payload, rows)]
    if codec == "ragged_tensor_dict":
        return _decode_ragged_tensor_dict_values(payload, rows, meta or {})
    raise ValueError(f"unknown structured non-tensor codec: {codec}")


def _encode_structured_non_tensor_field(path: str, column: np.ndarray) -> _EncodedStructuredLeaf:
    values = list(column)
    leaves: list[_InferredLeaf] = []
    nodes: list[_InferredNode] = []
    sos = _public()
    sos.infer_structure(path, values, leaves, nodes)
    if nodes and sos._should_encode_recursive_structure(leaves):
        return sos._encode_recursive_structured_non_tensor_field(path, values, leaves, nodes)
    return sos._encode_structured_leaf(values, sos._choose_leaf_codec(values), path)


def _encode_recursive_structured_non_tensor_field(path, values, leaves, nodes, explicit: bool = False) -> _EncodedStructuredLeaf:
    """One column per leaf path plus node masks. ``explicit`` encodes each leaf as an explicit
    FieldSchema of its inferred codec (upstream's fallback search does so), which records no
    inference metadata and lets a rejected codec try anyway."""
    payload: dict[str, Any] = {}
    node_specs = []
    for i, node in enumerate(nodes):
        spec: dict[str, Any] = {"id": i, "path": node.path, "node_type": node.node_type,
                                "children": list(node.children)}
        payload[f"node.{i}.missing"] = np.asarray(
            [_lookup_structured_path(v, path, node.path) is MISSING for v in values],
            dtype=np.bool_)
        spec["missing_payload"] = f"node.{i}.missing"
        payload[f"node.{i}.row_mask"] = np.asarray(node.row_mask, dtype=np.bool_)
        spec["row_mask_payload"] = f"node.{i}.row_mask"
        if node.lengths is not None:
            payload[f"node.{i}.lengths"] = np.asarray(node.lengths, dtype=np.int64)
            spec["lengths_payload"] = f"node.{i}.lengths"
        node_specs.append(spec)
    leaf_specs = []
    for i, leaf in enumerate(leaves):
        missing = np.asarray([isinstance(v, _Missing) for v in leaf.values], dtype=np.bool_)
        plain = [None if m else v for m, v in zip(missing, leaf.values)]
        choice = _recursive_leaf_decision(leaf.values, leaf.decision)
        if explicit:
            column = np.asarray(_normalize_values_for_fallback_codec(plain, choice.codec), dtype=object)
            encoded = _encode_with_schema(leaf.path, column,
                                          FieldSchema(choice.codec, metadata=choice.metadata))
        else:
            encoded = _public()._encode_structured_leaf(plain, choice, leaf.path)
        members = {}
        for name, value in encoded.payload.items():
            payload[f"leaf.{i}.{name}"] = value
            members[name] = f"leaf.{i}.{name}"
        payload[f"leaf.{i}.missing"] = missing
        members["missing"] = f"leaf.{i}.missing"
        leaf_specs.append({"id": i, "path": leaf.path, "codec": encoded.codec,
                           "rows": encoded.rows, "metadata": encoded.metadata,
                           "payload_members": members})
    return _EncodedStructuredLeaf("structured_recursive", len(values), payload, {
        "schema_source": "inferred_from_runtime_values",
        "structure_version": 1,
        "root_path": path,
        "nodes": node_specs,
        "leaves": leaf_specs,
    })


def _child_path(node: Mapping[str, Any], child: Any) -> str:
    if node["node_type"] == "dict":
        return f"{node['path']}.{_escape_key(str(child))}"
    return f"{node['path']}[{int(child)}]"


def _path_depth(path: str) -> int:
    # Escaped '.' and '[' inside keys count too; only the order among a node's own
    # descendants matters, and a child path is always strictly longer in both counts.
    return path.count(".") + path.count("[")


def _decode_structured_recursive_field(encoded: Mapping[str, Any], payload: Mapping[str, Any],
                                       rows: int) -> list:
    meta = encoded.get("metadata") or {}
    columns: dict[str, list[Any]] = {}
    for leaf in meta.get("leaves", []):
        members = leaf["payload_members"]
        sub = {n: payload[g] for n, g in members.items() if n != "missing"}
        decoded = _decode_structured_leaf(leaf["codec"], sub, rows, leaf.get("metadata"))
        missing = payload[members["missing"]]
        _check_rows("structured_recursive leaf", rows, nulls=missing)
        columns[leaf["path"]] = [MISSING if bool(missing[r]) else decoded[r] for r in range(rows)]
    nodes = sorted(meta.get("nodes", []), key=lambda n: _path_depth(n["path"]), reverse=True)
    for node in nodes:
        missing = payload.get(node.get("missing_payload"))
        mask = payload.get(node.get("row_mask_payload"))
        lengths = payload.get(node.get("lengths_payload"))
        for part in (missing, mask, lengths):
            if part is not None and len(part) != rows:
                raise ValueError(f"structured_recursive node {node.get('path')!r} holds "
                                 f"{len(part)} rows, expected {rows}")
        if node.get("node_type") not in ("dict", "list"):
            raise ValueError(f"unknown structured_recursive node type {node.get('node_type')!r}")
        out = []
        for r in range(rows):
            if missing is not None and bool(missing[r]):
                out.append(MISSING)
            elif mask is not None and not bool(mask[r]):
                out.append(None)
            elif node["node_type"] == "dict":
                item = {}
                for child in node["children"]:
                    value = columns[_child_path(node, child)][r]
                    if not isinstance(value, _Missing):
                        item[child] = value
                out.append(item)
            else:
                n = int(lengths[r]) if lengths is not None else len(node["children"])
                if not 0 <= n <= len(node["children"]):
                    raise ValueError(f"structured_recursive list length {n} out of range")
                item = [None] * n
                for child in node["children"]:
                    if int(child) < n:
                        value = columns[_child_path(node, child)][r]
                        if not isinstance(value, _Missing):
                            item[int(child)] = value
                out.append(item)
        columns[node["path"]] = out
    root = meta.get("root_path")
    if root not in columns:
        raise ValueError("structured_recursive metadata has no root node")
    return columns[root]


def _decode_structured_non_tensor_encoded(encoded: Mapping[str, Any], payload: Mapping[str, Any], rows: int) -> list:
    codec = encoded.get("codec")
    try:
        if codec == "structured_recursive":
            return _decode_structured_recursive_field(encoded, payload, rows)
        return _decode_structured_leaf(codec, payload, rows, encoded.get("metadata"))
    except (IndexError, KeyError, TypeError, OverflowError, AttributeError,
            UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{codec} column payload is corrupt: {error!r}") from error


def _object_array_from_decoded_values(values: Sequence[Any]) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    array[:] = list(values)
    return array


# ---------------------------------------------------------------------------------------------
# DataProto helpers
# ---------------------------------------------------------------------------------------------


def _mapping_to_dict(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return dict(value)
    items = getattr(value, "items", None)
    if callable(items):
        return dict(items())
    raise TypeError(f"expected mapping-like value, got {type(value).__name__}")


def _split_dataproto_like(data: Any) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(batch, non_tensor_batch, meta_info) of a DataProto, an envelope mapping, or a plain
    mapping of batch fields."""
    if isinstance(data, Mapping):
        if _is_dataproto_envelope_mapping(data):
            return (_mapping_to_dict(data.get("batch")),
                    _mapping_to_dict(data.get("non_tensor_batch")),
                    _mapping_to_dict(data.get("meta_info")))
        return dict(data), {}, {}
    return (_mapping_to_dict(getattr(data, "batch", None)),
            _mapping_to_dict(getattr(data, "non_tensor_batch", None)),
            _mapping_to_dict(getattr(data, "meta_info", None)))


def _is_dataproto_envelope_mapping(data: Mapping[str, Any]) -> bool:
    """A mapping of only ``batch``/``non_tensor_batch``/``meta_info``, each mapping-like."""
    return bool(data) and set(data) <= {"batch", "non_tensor_batch", "meta_info"} and all(
        _is_mapping_like_or_none(v) for v in data.values())


def _is_mapping_like_or_none(value: Any) -> bool:
    return value is None or isinstance(value, Mapping) or callable(getattr(value, "items", None))


def _is_non_string_sequence(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes, bytearray))


def _field_len(name: str, value: Any) -> int:
    try:
        return len(value)
    except TypeError as error:
        raise ValueError(f"flat dict row-aligned field {name!r} must be sized") from error


def _select_mapping(value: Mapping[str, Any], keys: Optional[Sequence[str]]) -> dict[str, Any]:
    if keys is None:
        return dict(value)
    return {key: value[key] for key in keys if key in value}


def _validate_schema_nullable(path: str, value: Any, schema: FieldSchema) -> None:
    if not schema.nullable and any(item is None for item in value):
        raise ValueError(f"FieldSchema for {path!r} is not nullable")


def _should_encode_non_tensor_field(value: Any) -> bool:
    """A non_tensor_batch column needs a row codec when it is an object array."""
    return isinstance(value, np.ndarray) and value.dtype == object


def _is_recursive_encoded_non_tensor(encoded: Mapping[str, Any]) -> bool:
    return encoded.get("codec") == "structured_recursive"


def _normalize_dataproto_row_index(index: Any, total_rows: int) -> int:
    if not isinstance(index, (int, np.integer)) or isinstance(index, bool):
        raise TypeError("DataProto row indices must be integers")
    normalized = int(index) + (total_rows if int(index) < 0 else 0)
    if not 0 <= normalized < total_rows:
        raise IndexError(f"DataProto row index {index} out of range for {total_rows} rows")
    return normalized


def _copy_transfer_policy(policy: BundleTransferPolicy) -> BundleTransferPolicy:
    """The same policy with copy_mode="copy"."""
    if policy.copy_mode == "copy":
        return policy
    return BundleTransferPolicy(max_inflight_put=policy.max_inflight_put,
                                put_mode=policy.put_mode, copy_mode="copy")


def _dense(value: Any) -> bool:
    return (_is_tensor(value) and value.ndim > 0) or (
        isinstance(value, np.ndarray) and value.dtype != object and value.ndim > 0)


_DATAPROTO_SCHEMA_SECTIONS = ("batch", "non_tensor_batch", "meta_info")
_RAGGED_TENSOR_PAYLOAD_NAMES = frozenset({"data", "offsets", "shapes", "ndims", "nulls"})


def _schema_section(name: str, schema: FieldSchema) -> str | None:
    section = (schema.metadata or {}).get("section")
    if section is not None and section not in _DATAPROTO_SCHEMA_SECTIONS:
        raise ValueError(
            f"FieldSchema for {name!r} metadata['section'] must be one of {sorted(_DATAPROTO_SCHEMA_SECTIONS)}")
    return section


def _schema_ndarray_dtype(schema: FieldSchema, *, required: bool = False) -> np.dtype | None:
    name = (schema.metadata or {}).get("dtype")
    if name is None:
        if required:
            raise ValueError("FieldSchema metadata['dtype'] is required")
        return None
    try:
        dtype = np.dtype(name)
    except (TypeError, ValueError) as error:
        raise ValueError(f"invalid FieldSchema metadata['dtype']: {name!r}") from error
    if dtype.kind not in "biufc":
        raise ValueError(f"FieldSchema metadata['dtype'] must be numeric or bool, got {dtype}")
    return dtype


def _rows_of(name: str, value: Any) -> int:
    try:
        return len(value)
    except TypeError as error:
        raise ValueError(f"flat dict row-aligned field {name!r} must be sized") from error


def _as_column(name: str, value: Any, rows: int, schema: FieldSchema | None) -> Any:
    if isinstance(value, np.ndarray):
        if len(value) != rows:
            raise ValueError(f"flat dict non_tensor_batch field {name!r} has batch size "
                             f"{len(value)}, expected {rows}")
        dtype = _schema_ndarray_dtype(schema) if schema is not None else None
        if (schema is not None and schema.codec == "ndarray" and dtype is not None
                and (value.dtype != object or all(v is not None for v in value))):
            return np.asarray(value, dtype=dtype)
        return value
    if _is_non_string_sequence(value):
        if len(value) != rows:
            raise ValueError(f"flat dict non_tensor_batch field {name!r} has batch size "
                             f"{len(value)}, expected {rows}")
        return _object_array_from_decoded_values(value)
    raise TypeError(f"flat dict non_tensor_batch field {name!r} must be an ndarray or "
                    "non-string sequence")


def _flat_dict_to_envelope(data: Any, schemas: Mapping[str, FieldSchema] | None = None):
    if not isinstance(data, Mapping):
        raise TypeError("flat dict payload must be a mapping")
    schemas = schemas or {}
    pinned = {n: _schema_section(n, sc) for n, sc in schemas.items()}
    declared_rows = {_rows_of(n, data[n]) for n, sec in pinned.items()
                     if n in data and sec in ("batch", "non_tensor_batch")}
    if len(declared_rows) > 1:
        raise ValueError(
            f"flat dict fields have inconsistent batch sizes: {sorted(declared_rows)}")
    schema_rows = declared_rows.pop() if declared_rows else 0
    rows = schema_rows
    if not rows:
        skip = {n for n, sec in pinned.items() if n in data and sec == "meta_info"}
        considered = {k: v for k, v in data.items() if k not in skip}
        dense_sizes = {len(v) for v in considered.values() if _dense(v)}
        if len(dense_sizes) > 1:
            raise ValueError(
                f"flat dict dense fields have ambiguous batch sizes: {sorted(dense_sizes)}")
        if dense_sizes:
            rows = dense_sizes.pop()
        else:
            sizes = {len(v) for v in considered.values()
                     if (isinstance(v, np.ndarray) and v.ndim > 0) or _is_non_string_sequence(v)}
            if len(sizes) > 1:
                raise ValueError(
                    f"flat dict fields have ambiguous batch sizes: {sorted(sizes)}; "
                    "pass FieldSchema metadata['section'] for list-valued metadata fields")
            rows = sizes.pop() if sizes else 0
    batch, non_tensor, meta = {}, {}, {}
    for key, value in data.items():
        section = pinned.get(key)
        if section is None:
            if rows and ((_is_tensor(value) and value.shape[:1] == (rows,)) or (
                    isinstance(value, np.ndarray) and value.dtype != object
                    and value.shape[:1] == (rows,))):
                batch[key] = value
            elif not schema_rows and _is_non_string_sequence(value) and len(value) == rows:
                non_tensor[key] = _as_column(key, value, rows, schemas.get(key))
            else:
                meta[key] = value
        elif section == "batch":
            batch[key] = value
        elif section == "non_tensor_batch":
            non_tensor[key] = _as_column(key, value, rows, schemas[key])
        else:
            meta[key] = value
    return batch, non_tensor, meta


def _check_pinned_sections(sections, schemas) -> None:
    where: dict[str, set[str]] = {}
    for section, fields in zip(_DATAPROTO_SCHEMA_SECTIONS, sections):
        for name in fields:
            where.setdefault(name, set()).add(section)
    for name, schema in (schemas or {}).items():
        declared = _schema_section(name, schema)
        actual = where.get(name)
        if declared is None or not actual or declared in actual:
            continue
        found = ", ".join(repr(x) for x in sorted(actual))
        raise ValueError(
            f"FieldSchema for {name!r} declares section {declared!r}, but data contains it "
            f"in {found}")


_ENCODING_FALLBACK_ERRORS = (TypeError, ValueError, OverflowError, RuntimeError, RecursionError)


def _normalize_structured_scalar(value: Any) -> Any:
    """numpy values as Python ones, recursively (for the msgpack/json fallbacks)."""
    if isinstance(value, np.ndarray):
        return _normalize_structured_scalar(value.tolist()) if value.dtype == object else value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return {k: _normalize_structured_scalar(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_normalize_structured_scalar(v) for v in value]
    return value


def _normalize_values_for_fallback_codec(values: Sequence[Any], codec: str) -> list[Any]:
    if codec in ("msgpack_ragged", "json_ragged"):
        return [_normalize_structured_scalar(v) for v in values]
    return list(values)


def _encode_with_fallback(path: str, column: np.ndarray) -> _EncodedStructuredLeaf:
    """Upstream's search for a codec that works: a recursive split when a leaf needs it, then
    the inferred codec, then msgpack, then JSON (numpy values made plain for the last two)."""
    values = list(column)
    errors: list[str] = []
    try:
        leaves: list[_InferredLeaf] = []
        nodes: list[_InferredNode] = []
        _public().infer_structure(path, values, leaves, nodes)
        if nodes and any(
            (leaf.decision.codec == "typed_ragged"
             and leaf.decision.metadata.get("recursive_source") == "ndarray")
            or leaf.decision.codec in ("ragged_tensor", "bytes_ragged", "media_bytes",
                                       "media_list_ragged")
            for leaf in leaves
        ):
            return _encode_recursive_structured_non_tensor_field(path, values, leaves, nodes, explicit=True)
    except _ENCODING_FALLBACK_ERRORS as error:
        errors.append(f"structured_recursive: {error}")
    choice = _public()._choose_leaf_codec(values)
    codecs = [choice.codec] + [c for c in ("msgpack_ragged", "json_ragged") if c != choice.codec]
    for codec in codecs:
        meta = dict(choice.metadata) if codec == choice.codec else {}
        candidate = np.asarray(_normalize_values_for_fallback_codec(values, codec), dtype=object)
        try:
            return _encode_with_schema(path, candidate, FieldSchema(codec, metadata=meta))
        except _ENCODING_FALLBACK_ERRORS as error:
            errors.append(f"{codec}: {error}")
    raise ValueError(f"unable to infer a safe codec for structured non-tensor field {path!r}; "
                     f"tried {errors}")


def _encode_with_schema(path: str, column: np.ndarray, schema: FieldSchema) -> _EncodedStructuredLeaf:
    values = list(column)
    _validate_schema_nullable(path, values, schema)
    codec = schema.codec
    if codec == "auto":
        return _encode_with_fallback(path, column)
    if codec == "ragged_tensor_dict":
        return _encode_ragged_tensor_dict_values(values, schema)
    if codec == "ragged_tensor":
        payload, meta = _encode_ragged_tensor_values(values)
    elif codec == "typed_ragged":
        payload, meta = _encode_typed_ragged_values(values, _schema_ndarray_dtype(schema))
    elif codec == "ndarray":
        dtype = _schema_ndarray_dtype(schema)
        if dtype is None:
            return _encode_with_fallback(path, column)
        payload, meta = _encode_numeric_scalar_values(
            values, _CodecDecision(True, "ndarray", "schema", "numeric scalar",
                                   {"dtype": str(dtype)}))
    elif codec in ("bytes_ragged", "media_bytes"):
        payload, meta = _encode_bytes_like_values(values)
    elif codec == "media_list_ragged":
        payload, meta = _encode_media_list_values(values)
    elif codec == "utf8_ragged":
        payload, meta = _encode_bytes_like_values([None if v is None else v.encode("utf-8") for v in values])
    elif codec == "msgpack_ragged":
        payload, meta = _public()._encode_msgpack_ragged_values(path, values)
    elif codec == "json_ragged":
        payload, meta = _encode_bytes_like_values(
            [None if v is None else json.dumps(v, ensure_ascii=False, separators=(",", ":"))
             .encode("utf-8") for v in values])
    else:
        raise ValueError(f"unsupported schema codec: {codec!r}")
    return _EncodedStructuredLeaf(codec, len(values), payload, meta)


def _dataproto_batch_size(batch: Mapping[str, Any], non_tensor: Mapping[str, Any]) -> int:
    sizes = set()
    for section in (batch, non_tensor):
        for name, value in section.items():
            try:
                sizes.add(len(value))
            except TypeError as error:
                raise TypeError(f"DataProto field {name!r} has no length") from error
    if len(sizes) > 1:
        raise ValueError(f"DataProto fields have inconsistent batch sizes: {sorted(sizes)}")
    return sizes.pop() if sizes else 0


def _rows_selection(rows: Any, total: int) -> list[int] | None:
    if rows is None:
        return None
    if isinstance(rows, StructuredMemberSlice):
        if rows.axis != 0:
            raise ValueError("DataProto row selection supports axis=0 only")
        rows = slice(rows.start, rows.end, rows.step)
    if isinstance(rows, slice):
        return list(range(*rows.indices(total)))
    if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence):
        raise TypeError("rows must be a slice, StructuredMemberSlice or sequence of ints")
    out = []
    for index in rows:
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise TypeError("row indices must be integers")
        index = int(index)
        if index < -total or index >= total:
            raise IndexError(f"row index {index} out of range for {total} rows")
        out.append(index % total)
    return out


def _take_rows(value: Any, indices: list[int]) -> Any:
    if _is_tensor(value):
        return value[_torch.as_tensor(indices, dtype=_torch.long)]
    if isinstance(value, np.ndarray):
        return value[np.asarray(indices, dtype=np.int64)] if value.ndim else value
    if isinstance(value, list):
        return [value[i] for i in indices]
    raise TypeError(f"cannot select rows of {type(value).__name__}")


# ---------------------------------------------------------------------------------------------
# The public transfer object
# ---------------------------------------------------------------------------------------------


class MooncakeBundleTransfer:
    """Stores structured objects, DataProtos and flat dicts of rows on a Mooncake store."""

    def __init__(
        self,
        store: Any,
        key_prefix: str = "bundle",
        default_chunk_bytes: int = DEFAULT_BUNDLE_CHUNK_BYTES,
        buffer_pool: Any = None,
    ) -> None:
        self.store = store
        self.key_prefix = _normalize_key_prefix(key_prefix)
        self.default_chunk_bytes = _validate_chunk_bytes(default_chunk_bytes)
        # Reads and writes go through store.get/put; a BufferPool only changes where bytes
        # are staged, so it is accepted and kept for callers that read it back.
        self.buffer_pool = buffer_pool
        self._bundles = _Bundles(store, self.key_prefix, self.default_chunk_bytes)

    # -- bundles ------------------------------------------------------------------------------

    @staticmethod
    def _check_policy(policy: Optional[BundleTransferPolicy], max_inflight: Optional[int]):
        result = policy or BundleTransferPolicy()
        if max_inflight is not None:
            result = BundleTransferPolicy(max_inflight, result.put_mode, result.copy_mode)
        if result.max_inflight_put < 1:
            raise ValueError("max_inflight_put must be positive")
        if result.put_mode not in ("auto", "batch", "parallel"):
            raise ValueError(f"unsupported put_mode: {result.put_mode}")
        if result.copy_mode not in ("auto", "zero_copy", "copy"):
            raise ValueError(f"unsupported copy_mode: {result.copy_mode}")
        return result

    def put_bundle(self, meta, buffers, partition="default", chunk_bytes=None, policy=None,
                   max_inflight_put=None, config=None) -> RemoteBundleRef:
        """Store raw metadata bytes plus named bytes-like buffers."""
        zero_copy = self._check_policy(policy, max_inflight_put).copy_mode == "zero_copy"
        return self._bundles.put_bundle(meta, buffers, partition, chunk_bytes, config,
                                        zero_copy)

    def remove_bundle(self, ref: Any) -> None:
        """Remove every key of a bundle (a missing bundle is not an error)."""
        self._bundles.remove(ref)

    # -- structured objects --------------------------------------------------------------------

    def put_structured_object(self, payload: StructuredObjectPayload, partition="default",
                              chunk_bytes=None, policy=None, max_inflight_put=None,
                              config=None) -> RemoteBundleRef:
        if not isinstance(payload, StructuredObjectPayload):
            raise TypeError("put_structured_object needs a StructuredObjectPayload")
        zero_copy = self._check_policy(policy, max_inflight_put).copy_mode == "zero_copy"
        meta, encoded = _encode_structured_fields(payload.metadata, payload.buffers)
        return self._bundles.put_bundle(
            _encode_structured_metadata(meta), encoded, partition, chunk_bytes, config,
            zero_copy)

    def put_object(self, obj: Any, partition="default", chunk_bytes=None, policy=None,
                   max_inflight_put=None, config=None) -> RemoteBundleRef:
        """Store a mapping of tensors/arrays/bytes, or one such value."""
        if isinstance(obj, Mapping):
            payload = StructuredObjectPayload(metadata={}, buffers=obj)
        else:
            payload = StructuredObjectPayload(metadata={_WRAPPED_KEY: True},
                                              buffers={"value": obj})
        return self.put_structured_object(payload, partition, chunk_bytes, policy,
                                          max_inflight_put, config)

    def get_object(self, ref: Any) -> Any:
        result = self.materialize(self.read_spec(ref))
        if result.metadata.get(_WRAPPED_KEY):
            return result.objects["value"]
        return result.objects

    def read_spec(self, ref: Any) -> StructuredObjectReadSpec:
        return StructuredObjectReadSpec(ref=ref)

    def materialize(self, spec: StructuredObjectReadSpec) -> StructuredObjectResult:
        return self.materialize_into(spec, None)

    def materialize_into(self, spec: StructuredObjectReadSpec,
                         destinations: Optional[Mapping[str, Any]]) -> StructuredObjectResult:
        """materialize(), filling the caller's destinations given by member name: numpy
        arrays for ndarray members (C-contiguous, writeable, of the member's dtype and read
        shape), ``raw_destination`` memory for ndarray or tensor members, and
        ``tensor_object_buffer`` memory for tensor members."""
        destinations = destinations or {}
        if spec.member_names is not None and not spec.member_names:
            raise ValueError("structured read spec selected no members")
        manifest = self._bundles.resolve(spec.ref)
        metadata = _decode_structured_metadata(self._bundles.read(manifest["meta"]))
        field_specs = _structured_field_specs(metadata)
        if not isinstance(field_specs, dict):
            raise ValueError("structured field specs must be a dict")
        buffers = manifest["buffers"]
        names = list(buffers) if spec.member_names is None else list(spec.member_names)
        unknown = [n for n in names if n not in buffers]
        if unknown:
            raise KeyError(f"unknown bundle buffers: {unknown}")
        slices = dict(spec.member_slices)
        blobs = self._bundles.read_many([buffers[n] for n in names])
        objects = {}
        for name, blob in zip(names, blobs):
            fspec = field_specs.get(name, {"encoding": "bytes"})
            target = destinations.get(name)
            if target is not None:
                _check_destination(name, fspec, target)
            value = _decode_member(name, self._bundles, buffers[name], fspec, blob)
            if name in slices:
                value = _slice_member(value, slices[name])
            if target is not None:
                value = _fill_destination(self.store, name, target, value)
            objects[name] = value
        return StructuredObjectResult(metadata=metadata, objects=objects)

    @staticmethod
    def release_result(result: Any) -> None:
        """Results here own plain heap memory, so there is nothing to hand back."""
        return None

    # -- DataProto / flat dict -----------------------------------------------------------------

    def put(self, data: Any, *, type: str = "dataproto", namespace: str = "default",
            partition: str = "default", stage: str = "default", chunk_bytes=None,
            policy=None, config=None, field_schemas=None) -> MooncakeDataProtoRef:
        """Store a DataProto-like object (type='dataproto') or a flat dict of rows ('dict')."""
        if type == "dataproto":
            sections = _split_dataproto_like(data)
        elif type == "dict":
            sections = _flat_dict_to_envelope(data, field_schemas)
        else:
            raise ValueError(f"unsupported Mooncake payload type: {type!r}")
        return self._put_stage(None, sections, namespace=namespace, partition=partition,
                               stage=stage, chunk_bytes=chunk_bytes, policy=policy,
                               overwrite=False, config=config, schemas=field_schemas)

    def put_dataproto(self, data: Any, *, namespace="default", partition="default",
                      stage="default", chunk_bytes=None, policy=None, field_schemas=None,
                      config=None) -> MooncakeDataProtoRef:
        return self.put(data, type="dataproto", namespace=namespace, partition=partition,
                        stage=stage, chunk_bytes=chunk_bytes, policy=policy,
                        field_schemas=field_schemas, config=config)

    def append_dataproto_fields(self, ref: Any, data: Any, *, stage: str, overwrite=False,
                                chunk_bytes=None, policy=None, field_schemas=None,
                                config=None) -> MooncakeDataProtoRef:
        """Add fields (as a new stage, or merged into an existing one) and return a new ref."""
        ref = _resolve_dataproto_ref(ref)
        return self._put_stage(ref, _split_dataproto_like(data), namespace=ref.namespace,
                               partition=ref.partition, stage=stage, chunk_bytes=chunk_bytes,
                               policy=policy, overwrite=overwrite, config=config,
                               schemas=field_schemas)

    def get(self, ref: Any, *, type: str = "dataproto", fields=None, batch_fields=None,
            non_tensor_fields=None, meta_info_keys=None, data_cls=None, destinations=None,
            rows=None) -> Any:
        if type not in ("dataproto", "dict"):
            raise ValueError(f"unsupported Mooncake payload type: {type!r}")
        flat = type == "dict"
        batch, non_tensor, meta = self._read_sections(
            ref, fields, batch_fields, non_tensor_fields, meta_info_keys, rows, flat,
            destinations or {})
        if flat:
            overlap = (set(meta) & set(batch)) | (set(meta) & set(non_tensor)) | (
                set(batch) & set(non_tensor))
            if overlap:
                raise ValueError(
                    f"Duplicate keys found across DataProto sections: {sorted(overlap)}")
            out = dict(meta)
            out.update(batch)
            out.update(non_tensor)
            return out
        return _build_result(batch, non_tensor, meta, data_cls)

    def get_dataproto(self, ref: Any, *, fields=None, batch_fields=None,
                      non_tensor_fields=None, meta_info_keys=None, data_cls=None,
                      destinations=None, rows=None) -> Any:
        return self.get(ref, type="dataproto", fields=fields, batch_fields=batch_fields,
                        non_tensor_fields=non_tensor_fields, meta_info_keys=meta_info_keys,
                        data_cls=data_cls, destinations=destinations, rows=rows)

    def dataproto_manifest_view(self, ref: Any) -> dict[str, Any]:
        """What a DataProto ref holds, per field, as its stage manifests describe it."""
        ref = _resolve_dataproto_ref(ref)
        metas = {}
        for stage, stage_ref in ref.stage_refs.items():
            manifest = self._bundles.resolve(stage_ref)
            metas[stage] = _decode_structured_metadata(self._bundles.read(manifest["meta"]))
        by_section: dict[str, dict[str, Any]] = {"batch": {}, "non_tensor_batch": {}}
        for name, loc in ref.field_index.items():
            specs = _structured_field_specs(metas[loc.stage])
            enc = ref.encoded_non_tensor.get(name)
            if enc is None:
                spec = dict(specs.get(loc.member, {"encoding": "bytes"}))
            else:
                spec = {
                    "encoding": "structured_non_tensor",
                    "codec": enc["codec"],
                    "metadata": enc.get("metadata"),
                    "payload_members": dict(enc["payload_members"]),
                    "payload_specs": {
                        part: dict(specs.get(member, {"encoding": "bytes"}))
                        for part, member in enc["payload_members"].items()
                    },
                }
            by_section[loc.section][name] = {"section": loc.section, "stage": loc.stage,
                                             "member": loc.member, "spec": spec}
        return {
            "namespace": ref.namespace,
            "partition": ref.partition,
            "batch_size": ref.batch_size,
            "batch_fields": by_section["batch"],
            "non_tensor_fields": by_section["non_tensor_batch"],
            "meta_info_keys": list(ref.meta_info),
            "stages": {stage: {"manifest_key": r.manifest_key,
                               "dataproto": metas[stage].get("dataproto", {})}
                       for stage, r in ref.stage_refs.items()},
        }

    def cleanup_dataproto(self, ref: Any) -> None:
        """Remove every stage a DataProto ref points at."""
        ref = _resolve_dataproto_ref(ref)
        seen = set()
        for stage_ref in ref.stage_refs.values():
            if stage_ref.manifest_key not in seen:
                seen.add(stage_ref.manifest_key)
                self.remove_bundle(stage_ref)

    def cleanup_dataproto_append(self, previous: Any, appended: Any) -> None:
        """Delete what an append wrote (for an append that was never published), leaving
        every object the previous ref still uses."""
        previous = _resolve_dataproto_ref(previous)
        appended = _resolve_dataproto_ref(appended)
        bundles = self._bundles
        for stage, stage_ref in appended.stage_refs.items():
            before = previous.stage_refs.get(stage)
            if before is None:
                self.remove_bundle(stage_ref)
                continue
            if stage_ref.manifest_key == before.manifest_key:
                continue
            is_exist = getattr(self.store, "is_exist", None)
            if callable(is_exist) and is_exist(stage_ref.manifest_key) == 0:
                continue
            manifest = bundles.resolve(stage_ref)
            kept = {loc.member for loc in previous.field_index.values() if loc.stage == stage}
            for name, enc in previous.encoded_non_tensor.items():
                if previous.field_index[name].stage == stage:
                    kept.update(enc["payload_members"].values())
            fresh = [spec for name, spec in manifest["buffers"].items() if name not in kept]
            owners = {bundles.object_id_of(spec["key"]) for spec in fresh}
            doomed = [c["key"] for c in manifest["meta"]["chunks"]]
            doomed += [c["key"] for spec in fresh for c in spec["chunks"]]
            doomed += [k for k in manifest.get("cleanup_keys", [])
                       if bundles.object_id_of(k) in owners]
            _cleanup_keys(self.store, doomed, strict=True)
            _cleanup_keys(self.store, [stage_ref.manifest_key], strict=True)

    # -- internals -----------------------------------------------------------------------------

    def _put_stage(self, ref, sections, *, namespace, partition, stage, chunk_bytes, policy,
                   overwrite, config, schemas=None) -> MooncakeDataProtoRef:
        batch, non_tensor, meta_info = sections
        _check_pinned_sections(sections, schemas)
        rows = _dataproto_batch_size(batch, non_tensor)
        if ref is not None and rows != ref.batch_size:
            raise ValueError(
                f"DataProto append batch size {rows} does not match ref batch size "
                f"{ref.batch_size}")
        both = sorted(set(batch) & set(non_tensor))
        if both:
            raise ValueError(f"DataProto batch and non_tensor_batch fields overlap: {both}")
        members: dict[str, Any] = {}
        locations: dict[str, StructuredFieldLocation] = {}
        encodings: dict[str, Any] = {}
        for name, value in batch.items():
            members[f"batch.{name}"] = value
            locations[name] = StructuredFieldLocation(stage, f"batch.{name}", "batch")
        for name, value in non_tensor.items():
            member = f"non_tensor_batch.{name}"
            locations[name] = StructuredFieldLocation(stage, member, "non_tensor_batch")
            schema = (schemas or {}).get(name)
            if schema is not None and _schema_section(name, schema) not in (
                    None, "non_tensor_batch"):
                schema = None
            encoded = None
            if schema is not None:
                try:
                    column = value
                    if not isinstance(value, np.ndarray):
                        if not _is_non_string_sequence(value):
                            raise TypeError(f"non_tensor_batch field {name!r} with FieldSchema "
                                            "must be an ndarray or non-string sequence")
                        column = _object_array_from_decoded_values(value)
                    if schema.codec == "auto":
                        if not schema.nullable and any(v is None for v in column):
                            raise ValueError(f"FieldSchema for {member!r} is not nullable")
                    else:
                        encoded = _encode_with_schema(member, column, schema)
                except (TypeError, ValueError, RuntimeError, AttributeError) as error:
                    raise type(error)(
                        f"failed to encode non_tensor_batch field {name!r} with FieldSchema "
                        f"codec {schema.codec!r}: {error}") from error
            if encoded is None and isinstance(value, np.ndarray) and value.dtype == object:
                encoded = _encode_structured_non_tensor_field(member, value)
            if encoded is not None:
                names = {}
                for part, part_value in encoded.payload.items():
                    members[f"{member}.{part}"] = part_value
                    names[part] = f"{member}.{part}"
                encodings[name] = {"codec": encoded.codec, "rows": encoded.rows,
                                   "metadata": encoded.metadata, "payload_members": names}
            else:
                members[member] = value
        if not members:
            if ref is not None:
                merged = dict(ref.meta_info)
                merged.update(meta_info)
                return MooncakeDataProtoRef(
                    ref.batch_size, dict(ref.stage_refs), dict(ref.field_index), merged,
                    ref.namespace, ref.partition, ref.global_indexes,
                    dict(ref.encoded_non_tensor), ref._storage_group_id)
            return MooncakeDataProtoRef(rows, {}, {}, dict(meta_info), namespace, partition,
                                        None, {}, _storage_group(config))
        if ref is not None:
            clash = sorted(set(ref.field_index) & set(locations))
            if clash and not overwrite:
                raise ValueError(f"DataProto fields already exist: {clash}")
            if overwrite:
                dangling = sorted(n for n, loc in ref.field_index.items()
                                  if loc.stage == stage and n not in locations)
                if dangling:
                    raise ValueError(
                        f"DataProto overwrite for stage {stage!r} must include existing "
                        f"fields: {dangling}")
        group = ref._storage_group_id if ref is not None else _storage_group(config)
        config = _config_with_group_id(config, group)
        payload = StructuredObjectPayload(
            metadata={"layout": "dataproto_stage",
                      "dataproto": {"version": 1, "namespace": namespace,
                                    "partition": partition, "stage": stage,
                                    "batch_size": rows}},
            buffers=members)
        existing = ref.stage_refs.get(stage) if ref is not None else None
        if existing is not None and not overwrite:
            stage_ref = self._merge_stage(existing, payload, partition, chunk_bytes, policy,
                                          config)
        else:
            stage_ref = self.put_structured_object(payload, partition, chunk_bytes, policy,
                                                   None, config)
            if existing is not None and existing.manifest_key != stage_ref.manifest_key:
                self.remove_bundle(existing)
        if ref is None:
            return MooncakeDataProtoRef(rows, {stage: stage_ref}, locations, dict(meta_info),
                                        namespace, partition, None, encodings, group)
        stage_refs = dict(ref.stage_refs)
        stage_refs[stage] = stage_ref
        field_index = dict(ref.field_index)
        field_index.update(locations)
        merged_meta = dict(ref.meta_info)
        merged_meta.update(meta_info)
        merged_enc = {k: v for k, v in ref.encoded_non_tensor.items() if k not in locations}
        merged_enc.update(encodings)
        return MooncakeDataProtoRef(rows, stage_refs, field_index, merged_meta, namespace,
                                    partition, ref.global_indexes, merged_enc, group)

    def _merge_stage(self, old_ref, payload, partition, chunk_bytes, policy, config):
        new_ref = self.put_structured_object(payload, partition, chunk_bytes, policy, None,
                                             config)
        bundles = self._bundles
        try:
            old_m = bundles.resolve(old_ref)
            new_m = bundles.resolve(new_ref)
            old_meta = _decode_structured_metadata(bundles.read(old_m["meta"]))
            new_meta = _decode_structured_metadata(bundles.read(new_m["meta"]))
            if old_meta.get("dataproto") != new_meta.get("dataproto"):
                raise ValueError("DataProto stage metadata mismatch during manifest merge")
            specs = dict(_structured_field_specs(old_meta))
            added = _structured_field_specs(new_meta)
            clash = sorted(set(specs) & set(added)) or sorted(
                set(old_m["buffers"]) & set(new_m["buffers"]))
            if clash:
                raise ValueError(f"structured members already exist: {clash}")
            specs.update(added)
            merged_meta = dict(old_meta)
            if specs:
                merged_meta[STRUCTURED_FIELD_SPECS_KEY] = specs
            buffers = dict(old_m["buffers"])
            buffers.update(new_m["buffers"])
            cleanup = [
                *old_m.get("cleanup_keys", []),
                bundles.manifest_key(old_ref, old_m),
                *[c["key"] for c in old_m["meta"]["chunks"]],
                bundles.manifest_key(new_ref, new_m),
                *[c["key"] for c in new_m["meta"]["chunks"]],
            ]
            merged = bundles.put_manifest(_encode_structured_metadata(merged_meta), buffers,
                                          partition, cleanup, config)
        except BaseException:
            self.remove_bundle(new_ref)
            raise
        obsolete = [bundles.manifest_key(new_ref, new_m),
                    *[c["key"] for c in new_m["meta"]["chunks"]]]
        _cleanup_keys(self.store, obsolete, strict=False)
        return merged

    def _read_sections(self, ref, fields, batch_fields, non_tensor_fields, meta_keys, rows,
                       flat, destinations):
        ref = _resolve_dataproto_ref(ref)
        indices = _rows_selection(rows, ref.batch_size)
        index = ref.field_index
        if fields is not None and (batch_fields is not None or non_tensor_fields is not None):
            raise ValueError("pass either fields or batch_fields/non_tensor_fields, not both")
        if fields is not None:
            names = [fields] if isinstance(fields, str) else list(fields)
        elif batch_fields is None and non_tensor_fields is None:
            names = list(index)
        else:
            names = []
            for wanted, section in ((batch_fields, "batch"),
                                    (non_tensor_fields, "non_tensor_batch")):
                for name in [] if wanted is None else list(wanted):
                    if name in index and index[name].section != section:
                        raise ValueError(f"DataProto field {name!r} is not in {section}")
                    names.append(name)
        unknown = sorted(n for n in names if n not in index)
        if unknown:
            raise KeyError(f"unknown DataProto fields: {unknown}")
        by_stage: dict[str, list[str]] = {}
        for name in names:
            by_stage.setdefault(index[name].stage, []).append(name)
        batch, non_tensor = {}, {}
        plain_first = [n for n in names if n not in ref.encoded_non_tensor]
        for name in plain_first:
            (batch if index[name].section == "batch" else non_tensor)[name] = None
        for stage, stage_names in by_stage.items():
            wanted_members = []
            for name in stage_names:
                enc = ref.encoded_non_tensor.get(name)
                if index[name].section == "non_tensor_batch" and enc is not None:
                    wanted_members.extend(enc["payload_members"].values())
                else:
                    wanted_members.append(index[name].member)
            result = self.materialize(
                self.read_spec(ref.stage_refs[stage]).select_members(wanted_members))
            specs = _structured_field_specs(result.metadata)
            objs = result.objects
            for name in stage_names:
                loc = index[name]
                enc = ref.encoded_non_tensor.get(name)
                if loc.section == "non_tensor_batch" and enc is not None:
                    parts = {p: objs[m] for p, m in enc["payload_members"].items()}
                    values = _decode_structured_non_tensor_encoded(enc, parts, int(enc.get("rows", ref.batch_size)))
                    if indices is not None:
                        values = [values[i] for i in indices]
                    non_tensor[name] = values if flat else _object_array_from_decoded_values(values)
                else:
                    value = objs[loc.member]
                    if indices is not None:
                        value = _take_rows(value, indices)
                    target = destinations.get(name)
                    if target is not None:
                        fspec = specs.get(loc.member, {"encoding": "bytes"})
                        _check_destination(loc.member, fspec, target)
                        value = _fill_destination(self.store, loc.member, target, value)
                    (batch if loc.section == "batch" else non_tensor)[name] = value
        meta = dict(ref.meta_info)
        if meta_keys is not None:
            missing = [k for k in meta_keys if k not in meta]
            if missing:
                raise KeyError(f"unknown DataProto meta_info keys: {missing}")
            meta = {k: meta[k] for k in meta_keys}
        return batch, non_tensor, meta


def _build_result(batch, non_tensor, meta, data_cls):
    if data_cls is None or data_cls is dict:
        return {"batch": batch, "non_tensor_batch": non_tensor, "meta_info": meta}
    try:
        from_dict = getattr(data_cls, "from_dict", None)
        if callable(from_dict):
            return from_dict(batch, non_tensor, meta_info=meta)
        return data_cls(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)
    except TypeError as error:
        raise TypeError(
            f"{getattr(data_cls, '__name__', data_cls)!r} cannot be constructed from batch, "
            "non_tensor_batch, and meta_info") from error


__all__ = [
    "BundleNotFoundError",
    "BundleStore",
    "BundleTransferPolicy",
    "DATAPROTO_REF_HANDLE_TYPE",
    "DATAPROTO_REF_HANDLE_VERSION",
    "DEFAULT_BUNDLE_CHUNK_BYTES",
    "FieldSchema",
    "MISSING",
    "MooncakeBundleTransfer",
    "MooncakeDataProtoRef",
    "RemoteBundleRef",
    "STRUCTURED_FIELD_SPECS_KEY",
    "StructuredFieldLocation",
    "StructuredMemberSlice",
    "StructuredObjectPayload",
    "StructuredObjectReadSpec",
    "StructuredObjectResult",
    "export_dataproto_ref",
    "export_ref",
    "import_dataproto_ref",
    "import_ref",
    "is_dataproto_ref_handle",
    "raw_destination",
    "tensor_object_buffer",
]
