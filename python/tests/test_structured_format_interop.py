"""The structured store's on-store format, proved both ways against upstream's wheel.

Upstream's client cannot talk to our master (nor ours to its), so the check is on what a put
leaves in the store: every key and its exact bytes.

- upstream -> ours: upstream's `MooncakeBundleTransfer` (0.3.13.post1, run by
  `tests/upstream.py` against its own `mooncake_master`) writes a structured object and a
  DataProto; the scenario dumps each stored key with `store.get` and reads both back itself.
  We `put` those keys, byte for byte, into our store and read them back with ours.
- ours -> upstream: the same values written through ours, dumped from our store with `get`,
  replayed into upstream's store with its `put`, and read back with upstream's module.

Both sides run one source (`_SHARED`): `build()` makes the values (several dtypes and
shapes, nested dicts and lists, ragged columns, nulls and missing keys, and every
non-tensor codec, both JSON-like ones included: msgpack_ragged, and json_ragged for
rows msgpack's strict types refuse), and `describe()` turns what a read returns into JSON
with types, dtypes, shapes and values, so the two sides compare exactly. The handle
(`export_dataproto_ref`) travels with the bytes; the codec each non-tensor column was
encoded with must be the same on both sides.

Skips, saying why, without the upstream venv (`MOONCAKE_UPSTREAM_PYTHON`, default
`/tmp/upstream-venv/bin/python`); the venv borrows our numpy and torch (`upstream._site_path`).
"""

import base64

import numpy as np
import pytest

import upstream

torch = pytest.importorskip("torch")

from mooncake.structured_object_store import MooncakeBundleTransfer  # noqa: E402

_SHARED = r'''
import numpy as np
import torch


def col(rows):
    out = np.empty(len(rows), dtype=object)
    out[:] = rows
    return out


# Small chunks, so most payloads span several `{key}/chunk/{i}` keys.
CHUNK = 40


def schemas():
    from mooncake.structured_object_store import FieldSchema
    return {"as_json": FieldSchema(codec="json_ragged")}


def build():
    """(structured object members, DataProto envelope)."""
    obj = {
        "f32": np.arange(12, dtype=np.float32).reshape(3, 4),
        "f64": np.linspace(-1.0, 1.0, 6).reshape(2, 3),
        "be_i32": np.arange(5, dtype=">i4"),
        "u8": np.arange(7, dtype=np.uint8),
        "f16": np.array([0.5, -2.0, 3.25], dtype=np.float16),
        "bool": np.array([[True, False], [False, True]]),
        "empty": np.zeros((0, 3), dtype=np.int16),
        "raw": b"\x00raw bytes\xff",
        "t_f32": torch.arange(6, dtype=torch.float32).reshape(2, 3),
        "t_bf16": torch.tensor([1.5, -2.0, 0.25], dtype=torch.bfloat16),
        "t_i64_t": torch.arange(6, dtype=torch.int64).reshape(2, 3).t(),
        "t_bool": torch.tensor([True, False, True]),
        "t_scalar": torch.tensor(2.5, dtype=torch.float64),
    }
    non_tensor = {
        "text": col(["hello", None, "w\u00f6rld \u4e09", ""]),
        "blob": col([b"a", None, bytearray(b"bc"), b""]),
        "score": col([1, None, 3, 4]),
        "dense": np.array([0.5, 1.5, -2.5, 4.0], dtype=np.float32),
        "ids": col([[1, 2, 3], [4], None, [5, 6]]),
        "arrays": col([np.arange(3, dtype=np.float32), None,
                       np.ones(2, dtype=np.float32), np.zeros(0, dtype=np.float32)]),
        "ragged_t": col([torch.arange(2, dtype=torch.float32), None,
                         torch.arange(3, dtype=torch.float32),
                         torch.arange(1, dtype=torch.float32)]),
        # Dicts and lists mixed, so not split: one msgpack_ragged column (bin, str8, float64,
        # uint64 forms included).
        "json": col([{"a": 1}, None, [2, "x" * 40, b"\x00\xff"],
                     {"c": None, "f": -2.5, "big": 2**40}]),
        # Kept as JSON text by a schema (upstream infers msgpack_ragged for such rows).
        "as_json": col([[1, "a"], None, {"k": [1, 2.5]}, "plain"]),
        "nested": col([
            {"tokens": torch.arange(2), "meta": {"rank": 0}, "tag": "a"},
            {"tokens": None, "meta": {}, "tag": "b"},
            None,
            {"meta": {"rank": 3}, "tag": "d"},
        ]),
        "lists": col([
            {"images": [{"px": torch.arange(2)}], "n": 1},
            {"images": [{"px": torch.arange(3)}, {"px": None}], "n": 2},
            {"images": [], "n": 0},
            {"images": [{"px": torch.arange(1)}], "n": 1},
        ]),
        "media": col([[b"a", b"bc"], [], None, [b"d"]]),
    }
    envelope = {
        "batch": {
            "input_ids": np.arange(12, dtype=np.int64).reshape(4, 3),
            "mask": torch.ones((4, 3), dtype=torch.int32),
            "logp": torch.linspace(-1.0, 1.0, 4, dtype=torch.float32),
            "grid": np.arange(4 * 2 * 3, dtype=np.float32).reshape(4, 2, 3),
        },
        "non_tensor_batch": non_tensor,
        "meta_info": {"step": 7, "tags": ["x", "y"]},
    }
    return obj, envelope


def describe(value):
    """JSON for a read-back value: type, dtype, shape and values, recursively."""
    if isinstance(value, torch.Tensor):
        shown = value.float() if value.dtype == torch.bfloat16 else value
        return ["tensor", str(value.dtype), list(value.shape), shown.flatten().tolist()]
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            return ["objects", list(value.shape), [describe(v) for v in value.ravel()]]
        return ["ndarray", value.dtype.str, list(value.shape), value.ravel().tolist()]
    if isinstance(value, np.generic):
        return ["scalar", value.dtype.str, value.item()]
    if isinstance(value, dict):
        return ["dict", {str(k): describe(v) for k, v in value.items()}]
    if isinstance(value, (list, tuple)):
        return [type(value).__name__, [describe(v) for v in value]]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return ["bytes", bytes(value).hex()]
    return [type(value).__name__, value]


def describe_object(objects):
    """`describe` of a structured object's members. A `bytes` member is read back as bytes or,
    by upstream's module when it has a buffer pool, as a uint8 array of the same bytes: shown
    as bytes either way."""
    shown = dict(objects)
    shown["raw"] = bytes(memoryview(np.ascontiguousarray(shown["raw"])).cast("B")) \
        if isinstance(shown["raw"], np.ndarray) else bytes(shown["raw"])
    return describe(shown)


def describe_dataproto(result):
    return {section: describe(dict(result[section]))
            for section in ("batch", "non_tensor_batch", "meta_info")}


def codecs(handle):
    return {name: enc["codec"] for name, enc in sorted(handle["encoded_non_tensor"].items())}
'''

_ns = {}
exec(compile(_SHARED, "<shared>", "exec"), _ns)
build, describe, describe_object, describe_dataproto, codecs, schemas, CHUNK = (
    _ns["build"], _ns["describe"], _ns["describe_object"], _ns["describe_dataproto"],
    _ns["codecs"], _ns["schemas"], _ns["CHUNK"])

# Upstream: write both, dump every key, read both back.
_UPSTREAM_WRITE = _SHARED + r'''
def scenario(store, BufferPool, MIB):
    import base64
    from mooncake.structured_object_store import (
        MooncakeBundleTransfer, StructuredObjectPayload, export_dataproto_ref)
    transfer = MooncakeBundleTransfer(store, key_prefix="interop-up")
    obj, envelope = build()
    obj_ref = transfer.put_structured_object(StructuredObjectPayload(buffers=obj),
                                             chunk_bytes=CHUNK)
    handle = export_dataproto_ref(transfer.put_dataproto(
        envelope, namespace="ns", partition="part", stage="rollout", chunk_bytes=CHUNK,
        field_schemas=schemas()))
    keys = []
    import json as _json
    for manifest_key in [obj_ref.manifest_key,
                         *[r["manifest_key"] for r in handle["stage_refs"].values()]]:
        manifest = _json.loads(bytes(store.get(manifest_key)))
        keys.append(manifest_key)
        for spec in [manifest["meta"], *manifest["buffers"].values()]:
            keys += [chunk["key"] for chunk in spec["chunks"]]
    kv = {key: base64.b64encode(bytes(store.get(key))).decode() for key in keys}
    back = transfer.materialize(
        transfer.read_spec({"manifest_key": obj_ref.manifest_key})).objects
    return {
        "kv": kv,
        "object_key": obj_ref.manifest_key,
        "handle": handle,
        "object": describe_object(back),
        "dataproto": describe_dataproto(transfer.get_dataproto(handle)),
        "rows": describe_dataproto(transfer.get_dataproto(handle, rows=[3, 0, 2])),
    }
'''

# Upstream: replay our keys byte for byte, read both back.
_UPSTREAM_READ = _SHARED + r'''
def scenario(store, BufferPool, MIB):
    import base64
    from mooncake.structured_object_store import MooncakeBundleTransfer
    data = DATA
    for key, value in data["kv"].items():
        assert store.put(key, base64.b64decode(value)) == 0, key
    transfer = MooncakeBundleTransfer(store, key_prefix="interop-ours")
    back = transfer.materialize(
        transfer.read_spec({"manifest_key": data["object_key"]})).objects
    return {
        "object": describe_object(back),
        "dataproto": describe_dataproto(transfer.get_dataproto(data["handle"])),
        "rows": describe_dataproto(transfer.get_dataproto(data["handle"], rows=[3, 0, 2])),
    }
'''

def expected():
    """What a read returns for `build()`'s values."""
    obj, envelope = build()
    rows = {
        "batch": {k: v[[3, 0, 2]] for k, v in envelope["batch"].items()},
        "non_tensor_batch": {k: v[[3, 0, 2]] for k, v in envelope["non_tensor_batch"].items()},
        "meta_info": envelope["meta_info"],
    }
    return describe_object(obj), describe_dataproto(envelope), describe_dataproto(rows)


def dump(store, keys):
    return {key: base64.b64encode(bytes(store.get(key))).decode() for key in keys}


def keys_of(store, manifest_keys):
    import json
    keys = []
    for manifest_key in manifest_keys:
        manifest = json.loads(bytes(store.get(manifest_key)))
        keys.append(manifest_key)
        for spec in [manifest["meta"], *manifest["buffers"].values()]:
            keys += [chunk["key"] for chunk in spec["chunks"]]
    return keys


def without_scalar(described):
    """An object's description without its 0-d tensor, and that member's description.

    Upstream's module reads a 0-d tensor member back with shape [1] (its store's get_tensor
    gives 1-d), whoever wrote it; ours gives the shape the field spec records, []. Same
    value, so the member is compared on its own."""
    members = dict(described[1])
    return ["dict", members], members.pop("t_scalar")


def assert_same(actual, wanted, what):
    if actual == wanted:
        return
    if isinstance(actual, dict) and isinstance(wanted, dict):
        assert set(actual) == set(wanted), what
        for k in wanted:
            assert_same(actual[k], wanted[k], f"{what}.{k}")
    if isinstance(actual, list) and isinstance(wanted, list) and len(actual) == len(wanted):
        for i, (a, w) in enumerate(zip(actual, wanted)):
            assert_same(a, w, f"{what}[{i}]")
    assert actual == wanted, what


@pytest.fixture(scope="module")
def upstream_written():
    upstream.python()
    return upstream.run_with_store(_UPSTREAM_WRITE, segment=64 << 20, local_buffer=16 << 20,
                                   timeout=300, with_site=True)


def test_upstream_reads_back_what_it_wrote(upstream_written):
    # The reference itself: the oracle round-trips the values (else the rest proves nothing).
    obj, dataproto, rows = expected()
    theirs, scalar = without_scalar(upstream_written["object"])
    obj, want_scalar = without_scalar(obj)
    assert_same(theirs, obj, "object")
    assert scalar == ["tensor", "torch.float64", [1], want_scalar[3]]
    assert_same(upstream_written["dataproto"], dataproto, "dataproto")
    assert_same(upstream_written["rows"], rows, "rows")


def test_upstream_bundles_read_back_through_ours(upstream_written, store):
    for key, value in upstream_written["kv"].items():
        assert store.put(key, base64.b64decode(value)) == 0, key
    transfer = MooncakeBundleTransfer(store, key_prefix="interop-up")
    handle = upstream_written["handle"]
    back = transfer.materialize(
        transfer.read_spec({"manifest_key": upstream_written["object_key"]})).objects
    # What upstream itself reads from these bytes, and so what ours must read.
    obj, dataproto, rows = (upstream_written[k] for k in ("object", "dataproto", "rows"))
    ours, scalar = without_scalar(describe_object(back))
    assert_same(ours, without_scalar(obj)[0], "object")
    assert scalar == without_scalar(expected()[0])[1]
    assert_same(describe_dataproto(transfer.get_dataproto(handle)), dataproto, "dataproto")
    assert_same(describe_dataproto(transfer.get_dataproto(handle, rows=[3, 0, 2])), rows,
                "rows")


def test_our_bundles_read_back_through_upstream(upstream_written, store):
    from mooncake.structured_object_store import StructuredObjectPayload, export_dataproto_ref

    transfer = MooncakeBundleTransfer(store, key_prefix="interop-ours")
    obj, envelope = build()
    obj_ref = transfer.put_structured_object(StructuredObjectPayload(buffers=obj),
                                             chunk_bytes=CHUNK)
    handle = export_dataproto_ref(transfer.put_dataproto(
        envelope, namespace="ns", partition="part", stage="rollout", chunk_bytes=CHUNK,
        field_schemas=schemas()))
    # Each column chose the codec upstream chose for the same rows.
    assert codecs(handle) == codecs(upstream_written["handle"])
    manifests = [obj_ref.manifest_key, *[r["manifest_key"] for r in handle["stage_refs"].values()]]
    data = {"kv": dump(store, keys_of(store, manifests)), "object_key": obj_ref.manifest_key,
            "handle": handle}
    source = _UPSTREAM_READ.replace("DATA", repr(data))
    got = upstream.run_with_store(source, segment=64 << 20, local_buffer=16 << 20,
                                  timeout=300, with_site=True)
    # Upstream reads our bytes as it reads its own.
    want_obj, want_dataproto, want_rows = (upstream_written[k]
                                           for k in ("object", "dataproto", "rows"))
    assert_same(got["object"], want_obj, "object")
    assert_same(got["dataproto"], want_dataproto, "dataproto")
    assert_same(got["rows"], want_rows, "rows")


def test_the_payloads_span_chunks(upstream_written):
    assert sum("/chunk/" in key for key in upstream_written["kv"]) > 20


def test_the_codecs_cover_both_json_like_leaf_codecs(upstream_written):
    # The scenario is only as good as its coverage: every non-tensor codec appears.
    chosen = set(codecs(upstream_written["handle"]).values())
    assert {"msgpack_ragged", "json_ragged", "utf8_ragged", "bytes_ragged", "ndarray",
            "typed_ragged", "ragged_tensor", "structured_recursive",
            "media_list_ragged"} <= chosen, chosen
