"""Bundles on the store: the manifest, the metadata payload and each named buffer,
split into chunks; writing (batched, parallel or zero-copy), reading and removing them.

Part of `mooncake.structured_object_store` (the public face; see its docstring).
"""

from __future__ import annotations

import io
import uuid
from typing import Any, Mapping, Sequence

try:
    import torch as _torch
except ImportError:  # pragma: no cover
    _torch = None

from mooncake import _native
from mooncake import _tensor as _tensor_codec
from mooncake._structured.common import (
    BundleNotFoundError,
    _TensorPayload,
    _byte_view,
    _public,
    _write_raw,
)
from mooncake._structured.types import (
    RemoteBundleRef,
    _TensorObjectBufferPayload,
)
from mooncake._structured.reads import (
    _PayloadReads,
)


class _Bundles:
    def __init__(self, store: Any, prefix: str, chunk_bytes: int,
                 buffer_pool: Any = None) -> None:
        self.store = store
        self.prefix = prefix
        self.chunk_bytes = chunk_bytes
        self.reads = _PayloadReads(store, buffer_pool)

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
            self._put_one(name, piece, config)
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
            sos = _public()
            sos._check_status(
                sos._call_write_with_optional_config(put_tensor, key, tensor, config=config),
                "put_tensor", key)
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
        _public()._check_status(self.store.put_from(*args), "put_from", key)
        written.append(key)
        return {"key": key, "bytes": value.size, "chunks": [{"key": key, "bytes": value.size}]}

    def put_bundle(self, meta, buffers, partition, chunk_bytes, config=None,
                   zero_copy=False) -> RemoteBundleRef:
        _public()._validate_key_segment(partition, "partition")
        meta_view = _byte_view(meta, "meta")
        chunk = _public()._validate_chunk_bytes(
            self.chunk_bytes if chunk_bytes is None else chunk_bytes)
        object_id = f"{partition}/{uuid.uuid4().hex}"
        base = f"{self.prefix}/{object_id}"
        written: list[str] = []
        pending: list[tuple[str, memoryview]] = []
        try:
            meta_spec = self._put_bytes(f"{base}/meta", meta_view, chunk, config, written,
                                        pending)
            specs: dict[str, Any] = {}
            for name, value in buffers.items():
                _public()._validate_key_segment(name, "buffer name")
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
            self._put_one(manifest_key, _public()._encode_manifest(manifest), config)
            written.append(manifest_key)
        except BaseException:
            _public()._cleanup_keys(self.store, written, strict=False)
            raise
        return RemoteBundleRef(manifest_key=manifest_key, manifest=manifest)

    def _put_one(self, key: str, value: Any, config: Any) -> None:
        sos = _public()
        sos._check_status(sos._put_with_optional_config(self.store, key, value, config), "put",
                          key)

    def _flush(self, pending: list, config: Any, written: list) -> None:
        """Write the queued chunks: one put_batch when the store has it, else one put each."""
        put_batch = getattr(self.store, "put_batch", None)
        if len(pending) > 1 and callable(put_batch):
            keys = [k for k, _ in pending]
            written.extend(keys)  # on failure some may exist: all are cleaned up
            batch_config = _public()._config_for_grouped_keys(config, len(keys))
            status = _write_raw(put_batch, keys, [v for _, v in pending], config=batch_config)
            _public()._check_status(status, "put_batch", keys[0])
            return
        for key, view in pending:
            self._put_one(key, view, config)
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
            self._put_one(manifest_key, _public()._encode_manifest(manifest), config)
            written.append(manifest_key)
        except BaseException:
            _public()._cleanup_keys(self.store, written, strict=False)
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
            _public()._validate_key_segment(name, "buffer name")
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
        """One payload's bytes (see `reads._PayloadReads.read_payload`)."""
        return self.reads.read_payload(spec)

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
        try:
            manifest = self.resolve(ref)
        except Exception:
            # Removed meanwhile (its manifest went first): nothing left to remove.
            if isinstance(key, str) and callable(is_exist) and is_exist(key) == 0:
                return
            raise
        keys = self.keys_of(manifest) + list(manifest.get("cleanup_keys", []))
        _public()._cleanup_keys(self.store, keys, strict=True)
        _public()._cleanup_keys(self.store, [self.manifest_key(ref, manifest)], strict=True)
