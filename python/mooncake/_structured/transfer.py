"""`MooncakeBundleTransfer`, the public object: bundles, structured objects and
DataProto stages on a store.

Part of `mooncake.structured_object_store` (the public face; see its docstring).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import numpy as np

from mooncake._structured.common import (
    DEFAULT_BUNDLE_CHUNK_BYTES,
    _WRAPPED_KEY,
    _public,
    _storage_group,
)
from mooncake._structured.types import (
    BundleTransferPolicy,
    MooncakeDataProtoRef,
    RemoteBundleRef,
    StructuredFieldLocation,
    StructuredObjectPayload,
    StructuredObjectReadSpec,
    StructuredObjectResult,
)
from mooncake._structured.bundles import (
    _Bundles,
)
from mooncake._structured.members import (
    _check_destination,
    _fill_destination,
)
from mooncake._structured.materialize import (
    _member_rows_pickable,
    _member_sliceable,
    _read_ndarray_rows,
    _read_structured_member,
    _rows_as_slice,
)
from mooncake._structured.dataproto import (
    _check_pinned_sections,
    _rows_selection,
    _take_rows,
)


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
        self.key_prefix = _public()._normalize_key_prefix(key_prefix)
        self.default_chunk_bytes = _public()._validate_chunk_bytes(default_chunk_bytes)
        # Reads into fresh memory are staged in a BufferPool's registered leases (this one,
        # or one made for a store with a local buffer; `_structured.reads`); writes go
        # through store.put/put_batch.
        self.buffer_pool = buffer_pool
        self._bundles = _Bundles(store, self.key_prefix, self.default_chunk_bytes,
                                 buffer_pool)

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
        meta, encoded = _public()._encode_structured_fields(payload.metadata, payload.buffers)
        return self._bundles.put_bundle(
            _public()._encode_structured_metadata(meta), encoded, partition, chunk_bytes, config,
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
        shape; the store reads into them directly), ``raw_destination`` memory for ndarray or
        tensor members, and ``tensor_object_buffer`` memory for tensor members. Members are
        read one by one, each by the cheapest path the store has (`_structured.reads`); a
        slice moves only the rows it selects (`_structured.materialize`)."""
        if spec.member_names is not None and not spec.member_names:
            raise ValueError("structured read spec selected no members")
        manifest = self._bundles.resolve(spec.ref)
        metadata = _public()._decode_structured_metadata(self._bundles.read(manifest["meta"]))
        return self._materialize(manifest, metadata, spec, destinations or {})

    def _materialize(self, manifest: Mapping[str, Any], metadata: dict[str, Any],
                     spec: StructuredObjectReadSpec,
                     destinations: Mapping[str, Any]) -> StructuredObjectResult:
        """materialize_into() of a bundle whose manifest and metadata are read already."""
        field_specs = _public()._structured_field_specs(metadata)
        if not isinstance(field_specs, dict):
            raise ValueError("structured field specs must be a dict")
        buffers = manifest["buffers"]
        names = list(buffers) if spec.member_names is None else list(spec.member_names)
        unknown = [n for n in names if n not in buffers]
        if unknown:
            raise KeyError(f"unknown bundle buffers: {unknown}")
        slices = dict(spec.member_slices)
        # Staged reads (a BufferPool at hand) fetch the small whole members in one call.
        whole = [buffers[n] for n in names if n not in slices and destinations.get(n) is None]
        with self._bundles.reads.prefetched(whole) as reads:
            objects = {
                name: _read_structured_member(self._bundles, self.store, name, buffers[name],
                                              field_specs.get(name, {"encoding": "bytes"}),
                                              slices.get(name), destinations.get(name), reads)
                for name in names
            }
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
            sections = _public()._split_dataproto_like(data)
        elif type == "dict":
            sections = _public()._flat_dict_to_envelope(data, field_schemas)
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
        ref = _public()._resolve_dataproto_ref(ref)
        return self._put_stage(ref, _public()._split_dataproto_like(data), namespace=ref.namespace,
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
        return _build_dataproto_like_result(batch, non_tensor, meta, data_cls)

    def get_dataproto(self, ref: Any, *, fields=None, batch_fields=None,
                      non_tensor_fields=None, meta_info_keys=None, data_cls=None,
                      destinations=None, rows=None) -> Any:
        return self.get(ref, type="dataproto", fields=fields, batch_fields=batch_fields,
                        non_tensor_fields=non_tensor_fields, meta_info_keys=meta_info_keys,
                        data_cls=data_cls, destinations=destinations, rows=rows)

    def dataproto_manifest_view(self, ref: Any) -> dict[str, Any]:
        """What a DataProto ref holds, per field, as its stage manifests describe it."""
        ref = _public()._resolve_dataproto_ref(ref)
        metas = {}
        for stage, stage_ref in ref.stage_refs.items():
            manifest = self._bundles.resolve(stage_ref)
            metas[stage] = _public()._decode_structured_metadata(
                self._bundles.read(manifest["meta"]))
        by_section: dict[str, dict[str, Any]] = {"batch": {}, "non_tensor_batch": {}}
        for name, loc in ref.field_index.items():
            specs = _public()._structured_field_specs(metas[loc.stage])
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
        ref = _public()._resolve_dataproto_ref(ref)
        seen = set()
        for stage_ref in ref.stage_refs.values():
            if stage_ref.manifest_key not in seen:
                seen.add(stage_ref.manifest_key)
                self.remove_bundle(stage_ref)

    def cleanup_dataproto_append(self, previous: Any, appended: Any) -> None:
        """Delete what an append wrote (for an append that was never published), leaving
        every object the previous ref still uses."""
        previous = _public()._resolve_dataproto_ref(previous)
        appended = _public()._resolve_dataproto_ref(appended)
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
            _public()._cleanup_keys(self.store, doomed, strict=True)
            _public()._cleanup_keys(self.store, [stage_ref.manifest_key], strict=True)

    # -- internals -----------------------------------------------------------------------------

    def _put_stage(self, ref, sections, *, namespace, partition, stage, chunk_bytes, policy,
                   overwrite, config, schemas=None) -> MooncakeDataProtoRef:
        batch, non_tensor, meta_info = sections
        _check_pinned_sections(sections, schemas)
        rows = _public()._dataproto_batch_size(batch, non_tensor)
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
            if schema is not None and _public()._schema_section(name, schema) not in (
                    None, "non_tensor_batch"):
                schema = None
            encoded = None
            if schema is not None:
                try:
                    column = value
                    if not isinstance(value, np.ndarray):
                        if not _public()._is_non_string_sequence(value):
                            raise TypeError(f"non_tensor_batch field {name!r} with FieldSchema "
                                            "must be an ndarray or non-string sequence")
                        column = _public()._object_array_from_decoded_values(value)
                    if schema.codec == "auto":
                        if not schema.nullable and any(v is None for v in column):
                            raise ValueError(f"FieldSchema for {member!r} is not nullable")
                    else:
                        encoded = _public()._encode_with_schema(member, column, schema)
                except (TypeError, ValueError, RuntimeError, AttributeError) as error:
                    raise type(error)(
                        f"failed to encode non_tensor_batch field {name!r} with FieldSchema "
                        f"codec {schema.codec!r}: {error}") from error
            if encoded is None and isinstance(value, np.ndarray) and value.dtype == object:
                encoded = _public()._encode_structured_non_tensor_field(member, value)
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
        config = _public()._config_with_group_id(config, group)
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
            old_meta = _public()._decode_structured_metadata(bundles.read(old_m["meta"]))
            new_meta = _public()._decode_structured_metadata(bundles.read(new_m["meta"]))
            merged_meta = _public()._merge_structured_stage_metadata(old_meta, new_meta)
            clash = sorted(set(old_m["buffers"]) & set(new_m["buffers"]))
            if clash:
                raise ValueError(f"structured members already exist: {clash}")
            buffers = dict(old_m["buffers"])
            buffers.update(new_m["buffers"])
            cleanup = [
                *old_m.get("cleanup_keys", []),
                bundles.manifest_key(old_ref, old_m),
                *[c["key"] for c in old_m["meta"]["chunks"]],
                bundles.manifest_key(new_ref, new_m),
                *[c["key"] for c in new_m["meta"]["chunks"]],
            ]
            merged = bundles.put_manifest(_public()._encode_structured_metadata(merged_meta),
                                          buffers, partition, cleanup, config)
        except BaseException:
            self.remove_bundle(new_ref)
            raise
        obsolete = [bundles.manifest_key(new_ref, new_m),
                    *[c["key"] for c in new_m["meta"]["chunks"]]]
        _public()._cleanup_keys(self.store, obsolete, strict=False)
        return merged

    def _read_stage(self, ref, stage, names, members, indices):
        """The members of one stage, and which of them hold only the rows ``indices``
        selects (read as a slice when the rows step evenly, else an ndarray's rows one byte
        range each: only those rows moved); the others are read whole."""
        stage_ref = ref.stage_refs[stage]
        manifest = self._bundles.resolve(stage_ref)
        metadata = _public()._decode_structured_metadata(self._bundles.read(manifest["meta"]))
        specs = _public()._structured_field_specs(metadata)
        cut = _rows_as_slice(indices)
        sliced, picked = [], []
        for name in names if indices is not None and isinstance(specs, dict) else ():
            member = ref.field_index[name].member
            if name in ref.encoded_non_tensor:
                continue
            fspec, pspec = specs.get(member), manifest["buffers"].get(member)
            if cut is not None and _member_sliceable(fspec, pspec, cut):
                sliced.append(member)
            elif cut is None and _member_rows_pickable(fspec) and pspec is not None:
                picked.append(member)
        spec = self.read_spec(stage_ref).select_members(
            [m for m in members if m not in picked])
        for member in sliced:
            spec = spec.slice_member(member, 0, cut.start, cut.end, cut.step)
        result = self._materialize(manifest, metadata, spec, {}) if spec.member_names \
            else StructuredObjectResult(metadata=metadata, objects={})
        for member in picked:
            result.objects[member] = _read_ndarray_rows(
                self._bundles.reads, member, manifest["buffers"][member], specs[member], indices)
        return result, {*sliced, *picked}

    def _read_sections(self, ref, fields, batch_fields, non_tensor_fields, meta_keys, rows,
                       flat, destinations):
        ref = _public()._resolve_dataproto_ref(ref)
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
            result, sliced = self._read_stage(ref, stage, stage_names, wanted_members, indices)
            specs = _public()._structured_field_specs(result.metadata)
            objs = result.objects
            for name in stage_names:
                loc = index[name]
                enc = ref.encoded_non_tensor.get(name)
                if loc.section == "non_tensor_batch" and enc is not None:
                    parts = {p: objs[m] for p, m in enc["payload_members"].items()}
                    values = _public()._decode_structured_non_tensor_encoded(
                        enc, parts, int(enc.get("rows", ref.batch_size)))
                    if indices is not None:
                        values = [values[i] for i in indices]
                    non_tensor[name] = values if flat \
                        else _public()._object_array_from_decoded_values(values)
                else:
                    value = objs[loc.member]
                    if indices is not None and loc.member not in sliced:
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


def _build_dataproto_like_result(batch, non_tensor, meta, data_cls):
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


def _dataproto_manifest_view(transfer: MooncakeBundleTransfer, ref: Any) -> dict[str, Any]:
    """Upstream's module-level form of `MooncakeBundleTransfer.dataproto_manifest_view`."""
    return transfer.dataproto_manifest_view(ref)
