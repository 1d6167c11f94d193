"""Which codec a column of per-row Python values takes: the single-codec probes,
`_choose_leaf_codec`, and `infer_structure`, which splits nested dicts and short lists into
nodes and leaf columns (`MISSING` marks a key absent from a row).

Part of `mooncake.structured_object_store` (the public face; see its docstring).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Sequence

import msgpack as _msgpack
import numpy as np

try:
    import torch as _torch
except ImportError:  # pragma: no cover
    _torch = None

from mooncake._structured.common import (
    _INFER_MAX_DEPTH,
    _INFER_MAX_JSON_BYTES,
    _INFER_MAX_LIST_LEN,
    _INFER_MAX_SAMPLE_ROWS,
    _INFER_MAX_STRUCT_KEYS,
    _is_tensor,
    _public,
)


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
            return _CodecDecision(False, "ragged_tensor", f"mixed tensor dtype: {names}",
                                  "torch.Tensor")
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
