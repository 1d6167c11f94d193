"""DataProto helpers: splitting a DataProto, envelope or flat dict into sections,
row counts, per-field schemas and row selection.

Part of `mooncake.structured_object_store` (the public face; see its docstring).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import numpy as np

try:
    import torch as _torch
except ImportError:  # pragma: no cover
    _torch = None

from mooncake._structured.common import (
    _is_tensor,
    _public,
)
from mooncake._structured.types import (
    BundleTransferPolicy,
    FieldSchema,
    StructuredMemberSlice,
)


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


def _schema_section(name: str, schema: FieldSchema) -> str | None:
    section = (schema.metadata or {}).get("section")
    if section is not None and section not in _DATAPROTO_SCHEMA_SECTIONS:
        raise ValueError(
            f"FieldSchema for {name!r} metadata['section'] must be one of "
            f"{sorted(_DATAPROTO_SCHEMA_SECTIONS)}")
    return section


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
        dtype = _public()._schema_ndarray_dtype(schema) if schema is not None else None
        if (schema is not None and schema.codec == "ndarray" and dtype is not None
                and (value.dtype != object or all(v is not None for v in value))):
            return np.asarray(value, dtype=dtype)
        return value
    if _is_non_string_sequence(value):
        if len(value) != rows:
            raise ValueError(f"flat dict non_tensor_batch field {name!r} has batch size "
                             f"{len(value)}, expected {rows}")
        return _public()._object_array_from_decoded_values(value)
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


def _schema_for_section(field_schemas: Optional[Mapping[str, FieldSchema]], name: str,
                        section: str) -> FieldSchema | None:
    """The schema of ``name`` when it applies to ``section`` (unpinned or pinned there)."""
    schema = (field_schemas or {}).get(name)
    if schema is None:
        return None
    declared = _schema_section(name, schema)
    return schema if declared is None or declared == section else None


def _is_row_aligned_dense_field(value: Any, row_count: int) -> bool:
    """A tensor or non-object array with one entry per row."""
    if row_count == 0:
        return False
    if _is_tensor(value):
        return tuple(value.shape[:1]) == (row_count,)
    return (isinstance(value, np.ndarray) and value.dtype != object
            and value.shape[:1] == (row_count,))


def _envelope_to_flat_dict(data: Mapping[str, Any]) -> dict[str, Any]:
    """An envelope as one flat dict (meta_info, batch, then non_tensor_batch as lists)."""
    meta = _mapping_to_dict(data.get("meta_info"))
    batch = _mapping_to_dict(data.get("batch"))
    non_tensor = _mapping_to_dict(data.get("non_tensor_batch"))
    overlap = (set(meta) & set(batch)) | (set(meta) & set(non_tensor)) \
        | (set(batch) & set(non_tensor))
    if overlap:
        raise ValueError(f"Duplicate keys found across DataProto sections: {sorted(overlap)}")
    flat = dict(meta)
    flat.update(batch)
    for name, value in non_tensor.items():
        flat[name] = value.tolist() if isinstance(value, np.ndarray) and value.dtype == object \
            else value
    return flat
