"""A catalog of logical rows over immutable DataProto fragments, and a client that stores
fragments through ``MooncakeBundleTransfer`` and publishes them to a catalog.

``DataProtoCatalog`` is pure metadata, held by one host (calls to one instance must be
serialized by that host): each logical key of a partition carries a tag dict and, per field,
the (fragment id, row) that holds it. A fragment is one exported DataProto handle with exactly
one stage; its id is that stage's manifest key. Fragments published through
``DataProtoCatalogTransfer`` are *managed*: once no key and no pinned reader uses one, its
handle is handed back as ``retired_handles`` so the client can delete its store objects and
``ack_retired`` them.

``DataProtoCatalogTransfer`` takes the transfer object and a ``catalog_call(method, *args,
**kwargs)`` callable (a direct call, an RPC, an actor call: the host decides).
"""

from __future__ import annotations

import copy
import logging
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

logger = logging.getLogger(__name__)


def _text(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string")
    return value


def _unique_names(values: Any, label: str) -> tuple[str, ...]:
    if isinstance(values, str):
        raise ValueError(f"{label} must be a sequence of non-empty strings")
    names = tuple(values)
    if not names or any(not isinstance(v, str) or not v for v in names):
        raise ValueError(f"{label} must be non-empty strings")
    if len(set(names)) != len(names):
        raise ValueError(f"{label} must be unique")
    return names


def _copy_tags(tags: Any, count: int) -> list[dict[str, Any]] | None:
    if tags is None:
        return None
    if len(tags) != count:
        raise ValueError("tags must have the same length as keys")
    if not all(isinstance(t, Mapping) for t in tags):
        raise TypeError("tags must be mappings")
    return [copy.deepcopy(dict(t)) for t in tags]


def _canonical(handle: Mapping[str, Any]):
    from mooncake.structured_object_store import export_dataproto_ref, import_dataproto_ref

    ref = import_dataproto_ref(handle)
    return ref, export_dataproto_ref(ref)


def _fragment_of(handle: Mapping[str, Any], rows: int):
    ref, canonical = _canonical(handle)
    if len(ref.stage_refs) != 1:
        raise ValueError("catalog fragments must contain exactly one DataProto stage")
    fragment_id = _text(next(iter(ref.stage_refs.values())).manifest_key, "manifest_key")
    if ref.batch_size != rows:
        raise ValueError(
            f"DataProto batch size {ref.batch_size!r} does not match {rows} logical keys")
    return fragment_id, canonical, _unique_names(ref.field_index, "field names")


class DataProtoCatalog:
    """Logical (partition, key) rows mapped to fields held in immutable DataProto fragments."""

    def __init__(self) -> None:
        self._rows: dict[str, dict[str, dict[str, Any]]] = {}
        self._handles: dict[str, dict[str, Any]] = {}
        self._uses: dict[str, int] = {}
        self._managed: set[str] = set()
        self._readers: dict[str, int] = {}
        self._pins: dict[int, tuple[str, ...]] = {}
        self._last_token = 0
        self._retired: dict[str, dict[str, Any]] = {}
        self._done_ops: dict[str, dict[str, Any]] = {}
        self._drained = False

    # -- writes ---------------------------------------------------------------------------------

    def update(self, partition: str, keys: Sequence[str], *, tags=None, handle=None):
        """Merge tags into keys and/or point their fields at an unmanaged fragment."""
        return self._apply(partition, keys, tags, handle, managed=False)

    def publish(self, operation_id: str, partition: str, keys: Sequence[str], *, tags=None,
                handle=None):
        """update() for a transfer-managed fragment, idempotent per operation id."""
        operation_id = _text(operation_id, "operation_id")
        if operation_id in self._done_ops:
            return copy.deepcopy(self._done_ops[operation_id])
        result = self._apply(partition, keys, tags, handle, managed=handle is not None)
        self._done_ops[operation_id] = copy.deepcopy(result)
        return result

    def ack_publication(self, operation_id: str) -> None:
        """Forgets the remembered answer of publication `operation_id` (its writer has seen it)."""
        self._done_ops.pop(_text(operation_id, "operation_id"), None)

    def publish_append(self, operation_id: str, fragment_id: str, partition: str,
                       keys: Sequence[str], *, previous_handle, handle):
        """Swap a managed fragment for its appended successor (same rows, more fields)."""
        operation_id = _text(operation_id, "operation_id")
        if operation_id in self._done_ops:
            return copy.deepcopy(self._done_ops[operation_id])
        if self._drained:
            return self._reject(operation_id, "DataProto catalog is drained")
        fragment_id = _text(fragment_id, "fragment_id")
        partition = _text(partition, "partition")
        keys = _unique_names(keys, "keys")
        old_ref, old_canonical = _canonical(previous_handle)
        new_ref, new_canonical = _canonical(handle)
        if (self._handles.get(fragment_id) is None or fragment_id not in self._managed
                or self._handles[fragment_id] != old_canonical):
            return self._reject(operation_id, f"stale DataProto append handle: {fragment_id!r}")
        if (new_ref.batch_size != old_ref.batch_size or new_ref.batch_size != len(keys)
                or new_ref.partition != old_ref.partition or new_ref.partition != partition
                or new_ref._storage_group_id != old_ref._storage_group_id):
            return self._reject(operation_id,
                                "appended DataProto handle changed fragment identity")
        if any(new_ref.field_index.get(n) != loc for n, loc in old_ref.field_index.items()):
            return self._reject(operation_id, "appended DataProto handle changed existing fields")
        added = [n for n in new_ref.field_index if n not in old_ref.field_index]
        entries = self._rows.get(partition, {})
        absent = [k for k in keys if k not in entries]
        if absent:
            return self._reject(operation_id,
                                f"keys not found in partition {partition!r}: {absent}")
        for row, key in enumerate(keys):
            for name in added:
                old = entries[key]["fields"].get(name)
                if old is not None:
                    self._unuse(old[0])
                entries[key]["fields"][name] = (fragment_id, row)
                self._uses[fragment_id] += 1
        self._handles[fragment_id] = new_canonical
        result = {
            "keys": list(keys),
            "tags": [copy.deepcopy(entries[k]["tag"]) for k in keys],
            "fields": self._fields_of(entries, keys),
            **self._retired_view(),
        }
        self._done_ops[operation_id] = copy.deepcopy(result)
        return result

    def remove(self, partition: str, keys: Sequence[str]):
        """Forget logical keys; fragments nobody uses any more become retired handles."""
        partition = _text(partition, "partition")
        keys = _unique_names(keys, "keys")
        entries = self._rows.get(partition)
        if entries is None:
            return self._retired_view()
        for key in keys:
            entry = entries.pop(key, None)
            for fragment_id, _row in (entry or {"fields": {}})["fields"].values():
                self._unuse(fragment_id)
        if not entries:
            del self._rows[partition]
        return self._retired_view()

    def drain(self):
        """Retire everything (no pinned reads may be open) and refuse further writes."""
        if self._pins:
            raise RuntimeError(
                f"cannot drain DataProto catalog with {len(self._pins)} active read(s)")
        for fragment_id in self._managed:
            self._retired[fragment_id] = self._handles[fragment_id]
        for table in (self._rows, self._handles, self._uses, self._readers, self._done_ops):
            table.clear()
        self._managed.clear()
        self._drained = True
        return self._retired_view()

    def ack_retired(self, handles: Sequence[Mapping[str, Any]]):
        """Forget retired handles whose store objects the caller has removed."""
        for handle in handles:
            ref, canonical = _canonical(handle)
            match = next((fid for fid, h in self._retired.items() if h == canonical), None)
            if match is not None:
                del self._retired[match]
            elif len(ref.stage_refs) == 1:
                fid = next(iter(ref.stage_refs.values())).manifest_key
                if fid in self._retired:
                    raise ValueError(f"retired DataProto fragment mismatch: {fid!r}")
        return self._retired_view()

    # -- reads ----------------------------------------------------------------------------------

    def resolve(self, partition: str, keys: Sequence[str], fields=None, *, pin: bool = False):
        """Where the requested fields of these keys live, grouped by identical locations."""
        partition = _text(partition, "partition")
        keys = _unique_names(keys, "keys")
        entries = self._rows.get(partition, {})
        absent = [k for k in keys if k not in entries]
        if absent:
            raise ValueError(f"keys were not found in partition {partition!r}: {absent}")
        wanted = (list(_unique_names(fields, "field names")) if fields is not None
                  else self._fields_of(entries, keys))
        if not wanted:
            raise ValueError("requested keys do not contain any fields")
        for key in keys:
            missing = [f for f in wanted if f not in entries[key]["fields"]]
            if missing:
                raise ValueError(f"fields are not ready for key {key!r}: {missing}")
        groups: dict[tuple, list[str]] = {}
        used: set[str] = set()
        for name in wanted:
            where = tuple(entries[k]["fields"][name] for k in keys)
            groups.setdefault(where, []).append(name)
            used.update(loc[0] for loc in where)
        handles = {fid: copy.deepcopy(self._handles[fid]) for fid in used}
        meta_info: dict[str, Any] = {}
        for handle in handles.values():
            for name, value in handle.get("meta_info", {}).items():
                if name in meta_info and meta_info[name] != value:
                    raise ValueError(f"conflicting DataProto meta_info value for {name!r}")
                meta_info[name] = copy.deepcopy(value)
        result = {
            "keys": list(keys),
            "tags": [copy.deepcopy(entries[k]["tag"]) for k in keys],
            "fields": wanted,
            "field_groups": [{"fields": names, "locations": list(where)}
                             for where, names in groups.items()],
            "handles": handles,
            "meta_info": meta_info,
        }
        if pin:
            self._last_token += 1
            self._pins[self._last_token] = tuple(used)
            for fid in used:
                self._readers[fid] = self._readers.get(fid, 0) + 1
            result["read_token"] = self._last_token
        return result

    def release_read(self, token: int):
        """End a pinned resolve (idempotent); returns handles that became retired."""
        pinned = self._pins.pop(token, None)
        for fid in pinned or ():
            left = self._readers[fid] - 1
            if left:
                self._readers[fid] = left
                continue
            del self._readers[fid]
            if fid not in self._uses:
                self._retire(fid)
        return self._retired_view()

    def list(self, partition: str | None = None):
        """{partition: {key: tag}} for one partition, or all."""
        if partition is not None:
            partition = _text(partition, "partition")
            names = [partition] if partition in self._rows else []
        else:
            names = list(self._rows)
        return {p: {k: copy.deepcopy(e["tag"]) for k, e in self._rows[p].items()} for p in names}

    # -- internals ------------------------------------------------------------------------------

    def _reject(self, operation_id: str, message: str):
        result = {"append_rejected": message}
        self._done_ops[operation_id] = copy.deepcopy(result)
        return result

    @staticmethod
    def _fields_of(entries, keys) -> list[str]:
        return list(dict.fromkeys(f for k in keys for f in entries[k]["fields"]))

    def _apply(self, partition, keys, tags, handle, managed: bool):
        if self._drained:
            raise RuntimeError("DataProto catalog is drained")
        partition = _text(partition, "partition")
        keys = _unique_names(keys, "keys")
        new_tags = _copy_tags(tags, len(keys))
        fragment = _fragment_of(handle, len(keys)) if handle is not None else None
        if new_tags is None and fragment is None:
            raise ValueError("catalog update requires tags or a DataProto handle")
        if fragment is not None:
            fid, canonical, names = fragment
            known = self._handles.get(fid)
            if known is not None and known != canonical:
                raise ValueError(f"DataProto fragment id collision: {fid!r}")
            if known is not None and (fid in self._managed) != managed:
                raise ValueError(f"DataProto fragment management mismatch: {fid!r}")
            if fid in self._retired:
                raise ValueError(f"DataProto fragment id is pending retirement: {fid!r}")
        existing = self._rows.get(partition, {})
        merged = []
        for row, key in enumerate(keys):
            tag = copy.deepcopy(existing[key]["tag"]) if key in existing else {}
            if new_tags is not None:
                tag.update(new_tags[row])
            merged.append(tag)
        entries = self._rows.setdefault(partition, {})
        if fragment is not None:
            self._handles.setdefault(fid, canonical)
            self._uses.setdefault(fid, 0)
            if managed:
                self._managed.add(fid)
        for row, key in enumerate(keys):
            entry = entries.setdefault(key, {"tag": {}, "fields": {}})
            entry["tag"] = copy.deepcopy(merged[row])
            if fragment is None:
                continue
            for name in names:
                old = entry["fields"].get(name)
                if old == (fid, row):
                    continue
                entry["fields"][name] = (fid, row)
                if old is not None and old[0] == fid:
                    continue
                if old is not None:
                    self._unuse(old[0])
                self._uses[fid] += 1
        return {
            "keys": list(keys),
            "tags": merged,
            "fields": self._fields_of(entries, keys),
            **self._retired_view(),
        }

    def _unuse(self, fid: str) -> None:
        left = self._uses[fid] - 1
        if left:
            self._uses[fid] = left
            return
        del self._uses[fid]
        if not self._readers.get(fid, 0):
            self._retire(fid)

    def _retire(self, fid: str) -> None:
        handle = self._handles.pop(fid)
        if fid in self._managed:
            self._managed.discard(fid)
            self._retired[fid] = handle

    def _retired_view(self):
        return {"retired_handles": [copy.deepcopy(h) for h in self._retired.values()]}


def _rows_in(data: Any) -> int:
    """Rows of a DataProto-like object: len() of a DataProto, the field length of an envelope."""
    if isinstance(data, Mapping):
        from mooncake.structured_object_store import (
            _dataproto_batch_size,
            _split_dataproto_like,
        )

        batch, non_tensor, _meta = _split_dataproto_like(data)
        return _dataproto_batch_size(batch, non_tensor)
    return len(data)


class DataProtoCatalogTransfer:
    """Puts fragments through a MooncakeBundleTransfer and publishes them to a catalog."""

    _RESULTS_ATTR = "_mooncake_catalog_results"

    def __init__(self, transfer: Any, catalog_call: Callable[..., Any]) -> None:
        self.transfer = transfer
        self._catalog_call = catalog_call
        self._pending_publications: list[dict[str, Any]] = []
        self._pending_publication_acks: list[str] = []
        self._pending_results: list[Any] = []
        self._lock = threading.RLock()

    def put(self, data: Any, *, partition: str, keys: Sequence[str], tags=None,
            **put_kwargs: Any) -> dict[str, Any]:
        """Store one fragment (if data is given) and publish it (and/or tags) for keys."""
        self._flush(strict=True)
        partition = _text(partition, "partition")
        keys = _unique_names(keys, "keys")
        tags = _copy_tags(tags, len(keys))
        if data is None and tags is None:
            raise ValueError("catalog update requires tags or DataProto data")
        handle = None
        if data is not None:
            rows = _rows_in(data)
            if rows != len(keys):
                raise ValueError(
                    f"DataProto batch size {rows} does not match {len(keys)} logical keys")
            from mooncake.structured_object_store import export_dataproto_ref

            ref = self.transfer.put(data, type="dataproto", partition=partition, **put_kwargs)
            handle = export_dataproto_ref(ref)
        publication = {
            "operation_id": uuid.uuid4().hex,
            "method": "publish",
            "args": (partition, keys),
            "kwargs": {"tags": tags, "handle": handle},
        }
        return self._publish_twice(publication)

    def append(self, fragment_id: str, handle: Mapping[str, Any], data: Any, *,
               partition: str, keys: Sequence[str], stage: str,
               **append_kwargs: Any) -> dict[str, Any]:
        """Add fields to a published fragment; the appended handle replaces it in the catalog."""
        self._flush(strict=True)
        fragment_id = _text(fragment_id, "fragment_id")
        partition = _text(partition, "partition")
        keys = _unique_names(keys, "keys")
        if append_kwargs.get("overwrite"):
            raise ValueError("catalog append does not support overwrite")
        rows = _rows_in(data)
        if rows != len(keys):
            raise ValueError(f"DataProto batch size {rows} does not match {len(keys)} logical keys")
        old_ref, old_handle = _canonical(handle)
        if old_ref.partition != partition:
            raise ValueError("DataProto handle partition does not match Catalog partition")
        plan = self._catalog_call("resolve", partition, keys, list(old_ref.field_index))
        if plan["handles"].get(fragment_id) != old_handle:
            raise ValueError(f"stale DataProto append handle: {fragment_id!r}")
        from mooncake.structured_object_store import export_dataproto_ref

        new_handle = export_dataproto_ref(
            self.transfer.append_dataproto_fields(old_handle, data, stage=stage,
                                                  **append_kwargs))
        publication = {
            "operation_id": uuid.uuid4().hex,
            "method": "publish_append",
            "args": (fragment_id, partition, keys),
            "kwargs": {"previous_handle": old_handle, "handle": new_handle},
        }
        result = self._publish_twice(publication)
        if result.get("append_rejected") is not None:
            raise ValueError(result["append_rejected"])
        return result

    def resolve(self, partition: str, keys: Sequence[str], fields=None) -> dict[str, Any]:
        """A pinned resolve: call release_read(result['read_token']) when done reading."""
        return self._catalog_call("resolve", partition, keys, fields, pin=True)

    def release_read(self, token: int) -> None:
        """Ends the pinned read `token` and frees the fragments that retired with it."""
        self._cleanup(self._catalog_call("release_read", token))

    def attach_results(self, output: Any, results: Sequence[Any]) -> None:
        """Remembers the read buffers `results` on `output`, for `release_result`."""
        setattr(output, self._RESULTS_ATTR, list(results))

    def release_result(self, output: Any) -> None:
        """Releases the read buffers attached to `output` by `attach_results`."""
        results = getattr(output, self._RESULTS_ATTR, ()) or ()
        setattr(output, self._RESULTS_ATTR, [])
        self.discard_results(results)

    def discard_results(self, results: Sequence[Any], *, strict: bool = False) -> None:
        """Releases read buffers `results` (and any left from an earlier failure); with
        `strict`, raises when one cannot be released."""
        self._retry("_pending_results", results, self.transfer.release_result,
                    "release DataProto read buffer", attempts=2, strict=strict)

    def list(self, partition: str | None = None) -> dict[str, dict[str, Any]]:
        """`{partition: {key: tag}}` for one partition, or for all."""
        return self._catalog_call("list", partition)

    def remove(self, partition: str, keys: Sequence[str]) -> None:
        """Forgets logical `keys` of `partition` and frees the fragments nobody uses any more."""
        self._cleanup(self._catalog_call("remove", partition, keys))

    def drain(self) -> None:
        """Publishes what is pending, then retires everything and refuses further writes."""
        for attempt in range(2):
            try:
                self._retry("_pending_publications", (), self._publish,
                            "publish pending DataProto fragment", strict=True)
                self._cleanup(self._catalog_call("drain"), strict=True)
                return
            except Exception:
                if attempt:
                    raise
                logger.exception("Retrying DataProto Catalog drain")

    def close(self) -> None:
        """Releases pending read buffers and acknowledges pending publications; raises when one
        cannot be done."""
        self.discard_results((), strict=True)
        self._flush(strict=True, acks_strict=True)

    # -- internals ------------------------------------------------------------------------------

    def _flush(self, *, strict: bool, acks_strict: bool = False) -> None:
        self._retry("_pending_publication_acks", (),
                    lambda op: self._catalog_call("ack_publication", op),
                    "acknowledge DataProto Catalog publication", strict=acks_strict)
        self._retry("_pending_publications", (), self._publish,
                    "publish pending DataProto fragment", strict=strict)

    def _publish_twice(self, publication: dict[str, Any]) -> dict[str, Any]:
        try:
            return self._publish(publication)
        except Exception:
            logger.exception("Retrying DataProto Catalog publication")
        try:
            return self._publish(publication)
        except Exception:
            with self._lock:
                self._pending_publications.append(publication)
            raise

    def _publish(self, publication: Mapping[str, Any]) -> dict[str, Any]:
        op = publication["operation_id"]
        result = self._catalog_call(publication["method"], op, *publication["args"],
                                    **publication["kwargs"])
        if publication["method"] == "publish_append" and result.get("append_rejected"):
            self.transfer.cleanup_dataproto_append(publication["kwargs"]["previous_handle"],
                                                   publication["kwargs"]["handle"])
        self._cleanup(result)
        try:
            self._catalog_call("ack_publication", op)
        except Exception:
            logger.exception("Failed to acknowledge DataProto Catalog publication")
            with self._lock:
                if op not in self._pending_publication_acks:
                    self._pending_publication_acks.append(op)
        return result

    def _cleanup(self, result: Mapping[str, Any], *, strict: bool = False) -> None:
        removed, failures = [], 0
        for handle in result.get("retired_handles", ()):
            try:
                self.transfer.cleanup_dataproto(handle)
            except Exception:
                failures += 1
                logger.exception("Failed to clean up retired DataProto fragment")
            else:
                removed.append(handle)
        if removed:
            try:
                self._catalog_call("ack_retired", removed)
            except Exception:
                logger.exception("Failed to acknowledge retired DataProto fragments")
                if strict:
                    raise
        if strict and failures:
            raise RuntimeError(f"failed to clean up {failures} retired DataProto fragment(s)")

    def _retry(self, attr: str, items: Sequence[Any], action: Callable[[Any], Any], label: str,
               *, attempts: int = 1, strict: bool = False) -> None:
        with self._lock:
            pending = [*getattr(self, attr), *items]
            setattr(self, attr, [])
        for _ in range(attempts):
            failed = []
            for item in pending:
                try:
                    action(item)
                except Exception:
                    logger.exception("Failed to %s", label)
                    failed.append(item)
            pending = failed
        with self._lock:
            getattr(self, attr).extend(pending)
            count = len(getattr(self, attr))
        if strict and count:
            raise RuntimeError(f"failed to {label} for {count} item(s)")


__all__ = ["DataProtoCatalog", "DataProtoCatalogTransfer"]
