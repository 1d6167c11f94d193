"""The public data types (policies, schemas, refs, read specs) and the JSON-safe
DataProto ref handle: `export_dataproto_ref` / `import_dataproto_ref`.

Part of `mooncake.structured_object_store` (the public face; see its docstring).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Optional, Protocol, Sequence

import numpy as np

from mooncake._structured.common import (
    DATAPROTO_REF_HANDLE_TYPE,
    DATAPROTO_REF_HANDLE_VERSION,
    STORAGE_GROUP_ID,
    _nonempty_str,
)


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
