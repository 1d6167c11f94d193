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
other given the same reference (python/tests/test_structured_format_interop.py replays the
exact keys and bytes each side writes through the other). Everything is built on the public
methods of ``mooncake.store.MooncakeDistributedStore`` (``put``, ``get``, ``put_tensor``,
``remove``, ``is_exist``), and reads and removes take the store's fast paths when it has them,
as upstream's do: ``batch_get_into``, ``get_into`` and ``get_into_ranges`` into registered
memory (a slice moves only its rows), ``batch_remove`` (see ``_structured/reads.py``). See python/README.md for how it differs from upstream's.

This module is the public face; the code lives in ``mooncake._structured`` (one module per
job, listed in its docstring). Every module-level name of upstream's module that a test or
user reaches for is importable from here under upstream's name and signature (the list is
checked by python/tests/test_dropin_structured_names.py), and patching one here
(``monkeypatch.setattr(sos, "_choose_leaf_codec", ...)``) changes what the package does:
the parts call upstream-named helpers of other parts through this module at call time.
msgpack_ragged columns are packed by the ``msgpack`` library, as upstream's are.

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

# The modules upstream's module imports, reachable here as there (a test patching
# ``sos.uuid.uuid4`` patches the one uuid module every part uses).
import copy  # noqa: F401
import ctypes  # noqa: F401
import io  # noqa: F401
import json  # noqa: F401
import uuid  # noqa: F401

import msgpack as _msgpack  # noqa: F401
import numpy as np  # noqa: F401

from mooncake._structured.common import _torch  # noqa: F401

from mooncake._structured.common import (  # noqa: F401
    AUTO_PARALLEL_MIN_BYTES,
    AUTO_PARALLEL_MIN_CHUNKS,
    BundleNotFoundError,
    DATAPROTO_REF_HANDLE_TYPE,
    DATAPROTO_REF_HANDLE_VERSION,
    DEFAULT_BUNDLE_CHUNK_BYTES,
    MISSING_OBJECT_ERROR,
    STORAGE_GROUP_ID,
    STRUCTURED_FIELD_SPECS_KEY,
    _DirectCopyPayload,
    _INFER_MAX_DEPTH,
    _INFER_MAX_JSON_BYTES,
    _INFER_MAX_LIST_LEN,
    _INFER_MAX_SAMPLE_ROWS,
    _INFER_MAX_STRUCT_KEYS,
    _MultiBufferPayload,
    _PUBLIC,
    _RAGGED_TENSOR_DEFAULT_DTYPE,
    _TYPED_RAGGED_DEFAULT_DTYPE,
    _TensorPayload,
    _WRAPPED_KEY,
    _WRITE_CONFIG_COPY_FIELDS,
    _as_contiguous_array_preserve_ndim,
    _batch_put_from_with_optional_config,
    _batch_remove_leftovers,
    _buffer_group_nbytes,
    _buffer_nbytes,
    _buffer_ptr,
    _byte_view,
    _bytes_view,
    _call_write_with_optional_config,
    _check_status,
    _chunk_offsets,
    _cleanup_keys,
    _config_for_grouped_keys,
    _config_with_group_id,
    _copy_memoryviews,
    _copy_write_config,
    _decode_json_dict,
    _decode_manifest,
    _decode_structured_metadata,
    _encode_json_dict,
    _encode_manifest,
    _encode_structured_metadata,
    _is_duplicate_buffer_registration,
    _is_tensor,
    _merge_structured_stage_metadata,
    _multi_buffer_bytes_payload,
    _nonempty_str,
    _normalize_key_prefix,
    _parse_torch_dtype,
    _payload_range_fragments,
    _public,
    _put_from_with_optional_config,
    _put_with_optional_config,
    _regular_offsets_width,
    _single_group,
    _split_view,
    _storage_group,
    _structured_field_specs,
    _torch_dtype_to_numpy,
    _validate_chunk_bytes,
    _validate_key_segment,
    _write_raw,
)
from mooncake._structured.types import (  # noqa: F401
    BundleStore,
    BundleTransferPolicy,
    DataProtoRefLike,
    FieldSchema,
    MooncakeDataProtoRef,
    RemoteBundleRef,
    StructuredFieldLocation,
    StructuredMemberSlice,
    StructuredObjectPayload,
    StructuredObjectReadSpec,
    StructuredObjectResult,
    _RawDestinationBuffer,
    _TensorObjectBufferPayload,
    _import_global_indexes,
    _json_safe_value,
    _mapping_field,
    _require_mapping,
    _resolve_dataproto_ref,
    export_dataproto_ref,
    export_ref,
    import_dataproto_ref,
    import_ref,
    is_dataproto_ref_handle,
    raw_destination,
    tensor_object_buffer,
)
from mooncake._structured.inference import (  # noqa: F401
    MISSING,
    _CodecDecision,
    _EncodedStructuredLeaf,
    _InferredLeaf,
    _InferredNode,
    _Missing,
    _can_json,
    _can_media_list,
    _can_msgpack,
    _can_numeric_scalar,
    _can_numeric_sequence,
    _can_serialize,
    _can_tensor,
    _check_all,
    _choose_leaf_codec,
    _escape_key,
    _is_bytes_like,
    _is_media_list,
    _is_number,
    _is_pil_image,
    _lookup_structured_path,
    _non_null,
    _recursive_leaf_decision,
    _should_encode_recursive_leaf,
    _should_encode_recursive_structure,
    _structured_path_tokens,
    _try_expand_dict,
    _try_expand_list,
    infer_structure,
)
from mooncake._structured.codecs import (  # noqa: F401
    _ENCODING_FALLBACK_ERRORS,
    _RAGGED_TENSOR_PAYLOAD_NAMES,
    _as_array,
    _check_rows,
    _child_path,
    _coerce_schema_non_tensor_value,
    _decode_bytes_like_values,
    _decode_media_bytes,
    _decode_media_list_values,
    _decode_msgpack_ragged_values,
    _decode_numeric_scalar_values,
    _decode_ragged_tensor_dict_values,
    _decode_ragged_tensor_values,
    _decode_structured_leaf,
    _decode_structured_non_tensor_encoded,
    _decode_structured_recursive_field,
    _decode_typed_ragged_values,
    _encode_bytes_like_values,
    _encode_media_list_values,
    _encode_msgpack_ragged_values,
    _encode_numeric_scalar_values,
    _encode_ragged_tensor_dict_values,
    _encode_ragged_tensor_values,
    _encode_recursive_if_structured,
    _encode_recursive_structured_non_tensor_field,
    _encode_structured_leaf,
    _encode_structured_non_tensor_field,
    _encode_typed_ragged_values,
    _encode_with_fallback,
    _encode_with_schema,
    _media_meta,
    _normalize_ragged_tensor_dict_keys,
    _normalize_structured_scalar,
    _normalize_values_for_fallback_codec,
    _object_array_from_decoded_values,
    _path_depth,
    _plain_dtype,
    _ragged_tensor_dict_payload_items,
    _schema_ndarray_dtype,
    _validate_schema_nullable,
    _value_to_media_bytes,
)
from mooncake._structured.reads import (  # noqa: F401
    PREFETCH_MEMBER_MAX_BYTES,
    _PayloadReads,
    _Prefetched,
    _auto_pool,
    _close_quietly,
    _copy_out,
)
from mooncake._structured.bundles import (  # noqa: F401
    _Bundles,
)
from mooncake._structured.members import (  # noqa: F401
    _check_destination,
    _deserialize_nested_tensor_payload,
    _deserialize_tensor_payload,
    _deserialize_torch_save_payload,
    _encode_nested_tensor_field,
    _encode_structured_field,
    _encode_structured_fields,
    _encode_torch_tensor_field,
    _fill_destination,
    _has_tensor_codec_helpers,
    _nested_tensor_from_parts,
    _normalize_structured_metadata,
    _normalized_member_slice,
    _select_nested_tensor_rows,
    _slice_length,
    _tensor_bytes,
    _tensor_codec_helper,
    _tensor_metadata_size,
    _tensor_payload_bytes,
    _torch_save_payload_bytes,
    _write_caller,
)
from mooncake._structured.materialize import (  # noqa: F401
    _NdarrayReadPlan,
    _member_rows_pickable,
    _member_sliceable,
    _read_ndarray_rows,
    _rows_as_slice,
    _ndarray_layout,
    _read_ndarray_member,
    _read_ndarray_plan,
    _read_sliced_tensor,
    _read_sliced_torch_save,
    _read_structured_member,
    _read_tensor_member,
    _resolve_ndarray_destination,
    _resolve_ndarray_read_plan,
    _slice_tensor_metadata,
)
from mooncake._structured.dataproto import (  # noqa: F401
    _DATAPROTO_SCHEMA_SECTIONS,
    _as_column,
    _check_pinned_sections,
    _copy_transfer_policy,
    _dataproto_batch_size,
    _dense,
    _envelope_to_flat_dict,
    _field_len,
    _flat_dict_to_envelope,
    _is_dataproto_envelope_mapping,
    _is_mapping_like_or_none,
    _is_non_string_sequence,
    _is_recursive_encoded_non_tensor,
    _is_row_aligned_dense_field,
    _mapping_to_dict,
    _normalize_dataproto_row_index,
    _rows_of,
    _rows_selection,
    _schema_for_section,
    _schema_section,
    _select_mapping,
    _should_encode_non_tensor_field,
    _split_dataproto_like,
    _take_rows,
)
from mooncake._structured.transfer import (  # noqa: F401
    MooncakeBundleTransfer,
    _build_dataproto_like_result,
    _dataproto_manifest_view,
)

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
