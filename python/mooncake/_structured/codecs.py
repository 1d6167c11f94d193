"""The per-row codecs of ``non_tensor_batch`` columns: each turns a column into named
payload parts (data, offsets, shapes, ndims, nulls, ...) and back, plus the recursive split
of nested values, explicit `FieldSchema` encodings and the fallback search.

Part of `mooncake.structured_object_store` (the public face; see its docstring).
"""

from __future__ import annotations

import json
import math
from typing import Any, Mapping, Sequence

import msgpack as _msgpack
import numpy as np

try:
    import torch as _torch
except ImportError:  # pragma: no cover
    _torch = None

from mooncake._structured.common import (
    _RAGGED_TENSOR_DEFAULT_DTYPE,
    _TYPED_RAGGED_DEFAULT_DTYPE,
    _public,
)
from mooncake._structured.types import (
    FieldSchema,
)
from mooncake._structured.inference import (
    MISSING,
    _CodecDecision,
    _EncodedStructuredLeaf,
    _InferredLeaf,
    _InferredNode,
    _Missing,
)

# The parts of one ragged_tensor (and typed_ragged) column.
_RAGGED_TENSOR_PAYLOAD_NAMES = frozenset({"data", "offsets", "shapes", "ndims", "nulls"})


def _encode_typed_ragged_values(values: Sequence[Any], dtype_hint: Any = None):
    """The typed_ragged layout: flat data, int64 offsets, int64 shapes, int16 ndims, nulls."""
    dtype = dtype_hint
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


def _decode_typed_ragged_values(payload: Mapping[str, Any], rows: int,
                                metadata: Mapping | None = None) -> list:
    meta = metadata or {}
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
    if type(value) is bytes:  # the common row, and never an image
        return value, None, {"kind": "bytes"}
    if _public()._is_pil_image(value):
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


def _decode_bytes_like_values(payload: Mapping[str, Any], rows: int,
                              metadata: Mapping | None = None):
    encodings = (metadata or {}).get("media_encodings") or []
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


def _decode_media_list_values(payload: Mapping[str, Any], rows: int,
                              metadata: Mapping | None = None):
    encodings = (metadata or {}).get("media_encodings", [])
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
    dtype = dtype or _public()._parse_torch_dtype(_RAGGED_TENSOR_DEFAULT_DTYPE)
    payload, meta = _encode_typed_ragged_values(arrays, _public()._torch_dtype_to_numpy(str(dtype)))
    meta["dtype"] = str(dtype)
    return payload, meta


def _decode_ragged_tensor_values(payload: Mapping[str, Any], rows: int,
                                 metadata: Mapping | None = None) -> list:
    meta = metadata
    if _torch is None:
        raise RuntimeError("torch is required to decode ragged tensor fields")
    name = (meta or {}).get("dtype", _RAGGED_TENSOR_DEFAULT_DTYPE)
    np_meta = dict(meta or {})
    np_meta["dtype"] = str(_public()._torch_dtype_to_numpy(name))
    dtype = _public()._parse_torch_dtype(name)
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


def _encode_ragged_tensor_dict_values(values: Sequence[Any],
                                      schema: FieldSchema) -> _EncodedStructuredLeaf:
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
            part, meta = _encode_ragged_tensor_values(
                [None if v is None else v.get(key) for v in values])
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
        payload, meta = _encode_bytes_like_values(
            [None if v is None else v.encode("utf-8") for v in values])
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


def _decode_structured_leaf(codec: str, payload: Mapping[str, Any], rows: int,
                            metadata: Mapping | None = None):
    meta = metadata
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
        return [None if v is None else v.decode("utf-8")
                for v in _decode_bytes_like_values(payload, rows)]
    if codec == "msgpack_ragged":
        return _decode_msgpack_ragged_values(payload, rows)
    if codec == "json_ragged":
        return [None if v is None else json.loads(v)
                for v in _decode_bytes_like_values(payload, rows)]
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


def _encode_recursive_structured_non_tensor_field(path, values, leaves, nodes,
                                                  explicit: bool = False) -> _EncodedStructuredLeaf:
    """One column per leaf path plus node masks. ``explicit`` encodes each leaf as an explicit
    FieldSchema of its inferred codec (upstream's fallback search does so), which records no
    inference metadata and lets a rejected codec try anyway."""
    payload: dict[str, Any] = {}
    node_specs = []
    for i, node in enumerate(nodes):
        spec: dict[str, Any] = {"id": i, "path": node.path, "node_type": node.node_type,
                                "children": list(node.children)}
        payload[f"node.{i}.missing"] = np.asarray(
            [_public()._lookup_structured_path(v, path, node.path) is MISSING for v in values],
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
        choice = _public()._recursive_leaf_decision(leaf.values, leaf.decision)
        if explicit:
            column = np.asarray(_normalize_values_for_fallback_codec(plain, choice.codec),
                                dtype=object)
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
        return f"{node['path']}.{_public()._escape_key(str(child))}"
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
        # Each child's column, found once per node rather than once per row.
        child_columns = {child: columns[_child_path(node, child)] for child in node["children"]}
        out = []
        for r in range(rows):
            if missing is not None and bool(missing[r]):
                out.append(MISSING)
            elif mask is not None and not bool(mask[r]):
                out.append(None)
            elif node["node_type"] == "dict":
                item = {}
                for child in node["children"]:
                    value = child_columns[child][r]
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
                        value = child_columns[child][r]
                        if not isinstance(value, _Missing):
                            item[int(child)] = value
                out.append(item)
        columns[node["path"]] = out
    root = meta.get("root_path")
    if root not in columns:
        raise ValueError("structured_recursive metadata has no root node")
    return columns[root]


def _decode_structured_non_tensor_encoded(encoded: Mapping[str, Any], payload: Mapping[str, Any],
                                          rows: int, metadata: Mapping | None = None) -> list:
    """A column's rows from its payload parts (``metadata`` overrides the encoding's own)."""
    codec = encoded.get("codec")
    if metadata is None:
        metadata = encoded.get("metadata")
    try:
        if codec == "structured_recursive":
            return _decode_structured_recursive_field({**encoded, "metadata": metadata},
                                                      payload, rows)
        return _decode_structured_leaf(codec, payload, rows, metadata)
    except (IndexError, KeyError, TypeError, OverflowError, AttributeError,
            UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{codec} column payload is corrupt: {error!r}") from error


def _object_array_from_decoded_values(values: Sequence[Any]) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    array[:] = list(values)
    return array


def _validate_schema_nullable(path: str, value: Any, schema: FieldSchema) -> None:
    if not schema.nullable and any(item is None for item in value):
        raise ValueError(f"FieldSchema for {path!r} is not nullable")


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


_ENCODING_FALLBACK_ERRORS = (TypeError, ValueError, OverflowError, RuntimeError, RecursionError)


def _normalize_structured_scalar(value: Any) -> Any:
    """numpy values as Python ones, recursively (for the msgpack/json fallbacks)."""
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            return _normalize_structured_scalar(value.tolist())
        return value.tolist()
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
            return _encode_recursive_structured_non_tensor_field(path, values, leaves, nodes,
                                                                 explicit=True)
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


def _encode_with_schema(path: str, column: np.ndarray,
                        schema: FieldSchema) -> _EncodedStructuredLeaf:
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
        payload, meta = _encode_bytes_like_values(
            [None if v is None else v.encode("utf-8") for v in values])
    elif codec == "msgpack_ragged":
        payload, meta = _public()._encode_msgpack_ragged_values(path, values)
    elif codec == "json_ragged":
        payload, meta = _encode_bytes_like_values(
            [None if v is None else json.dumps(v, ensure_ascii=False, separators=(",", ":"))
             .encode("utf-8") for v in values])
    else:
        raise ValueError(f"unsupported schema codec: {codec!r}")
    return _EncodedStructuredLeaf(codec, len(values), payload, meta)


def _encode_recursive_if_structured(path: str, values: list[Any]):
    """The structured_recursive encoding of a column when its nested values hold a leaf
    that needs it (tensors, bytes, media, ndarray rows), else None."""
    leaves: list[_InferredLeaf] = []
    nodes: list[_InferredNode] = []
    sos = _public()
    sos.infer_structure(path, values, leaves, nodes)
    if not nodes or not any(
        (leaf.decision.codec == "typed_ragged"
         and leaf.decision.metadata.get("recursive_source") == "ndarray")
        or leaf.decision.codec in ("ragged_tensor", "bytes_ragged", "media_bytes",
                                   "media_list_ragged")
        for leaf in leaves
    ):
        return None
    return sos._encode_recursive_structured_non_tensor_field(path, values, leaves, nodes,
                                                             explicit=True)


def _ragged_tensor_dict_payload_items(payload: Mapping[str, Any], key: str, *,
                                      kind: str) -> dict[str, Any]:
    """One key's ragged_tensor payload parts inside a ragged_tensor_dict payload."""
    prefix = f"{key}."
    items = {n[len(prefix):]: v for n, v in payload.items() if n.startswith(prefix)}
    missing = sorted(_RAGGED_TENSOR_PAYLOAD_NAMES - set(items))
    if missing:
        raise ValueError(
            f"ragged_tensor_dict {kind} for key {key!r} is missing payloads: {missing}")
    return items


def _coerce_schema_non_tensor_value(name: str, value: Any) -> np.ndarray:
    """A non_tensor_batch field with a FieldSchema as an ndarray (a sequence boxed)."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes, bytearray)):
        boxed = np.empty(len(value), dtype=object)
        boxed[:] = list(value)
        return boxed
    raise TypeError(f"non_tensor_batch field {name!r} with FieldSchema must be an ndarray or "
                    "non-string sequence")
