"""mooncake.structured_object_store against a real master and storage node: bundles, structured
objects and DataProto/flat-dict rows round-trip, every codec, references, bad input.

Expected values marked "oracle" are what upstream's 0.3.13.post1 module produced for the same
calls (its store swapped for an in-memory one with the same put/get/put_tensor/pub_tensor
behaviour, since it cannot talk to our master): key names, per-key SHA-256 prefixes of the
stored bytes, the chosen codecs, the exported handle, error types and messages. The oracle is
not needed at run time.
"""

import hashlib
import itertools
import json
import random
import uuid

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import mooncake.structured_object_store as S  # noqa: E402
from mooncake.structured_object_store import (  # noqa: E402
    BundleTransferPolicy,
    FieldSchema,
    MooncakeBundleTransfer,
    MooncakeDataProtoRef,
    RemoteBundleRef,
    StructuredObjectPayload,
    export_dataproto_ref,
    import_dataproto_ref,
    is_dataproto_ref_handle,
)

_prefixes = itertools.count()


@pytest.fixture
def transfer(store):
    return MooncakeBundleTransfer(store, key_prefix=f"sos{next(_prefixes)}")


def stored_keys(store, manifest_key, manifest):
    keys = [manifest_key]
    for spec in [manifest["meta"], *manifest["buffers"].values()]:
        keys += [c["key"] for c in spec["chunks"]]
    return keys


def same(a, b):
    """Deep equality over tensors, arrays, lists, dicts and plain values (dtype included)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape \
            and bool(torch.equal(a, b))
    if isinstance(a, np.ndarray):
        if a.dtype == object:
            return isinstance(b, np.ndarray) and b.dtype == object and len(a) == len(b) \
                and all(same(x, y) for x, y in zip(a, b))
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape \
            and np.array_equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and set(a) == set(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, list) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


# -- structured objects ----------------------------------------------------------------------


def test_put_object_round_trips_tensors_arrays_and_bytes(transfer, store):
    members = {
        "f32": torch.arange(12, dtype=torch.float32).reshape(3, 4),
        "bf16": torch.tensor([1.5, -2.0], dtype=torch.bfloat16),
        "i64_t": torch.arange(6).reshape(2, 3).t(),  # not contiguous
        "bool_t": torch.tensor([True, False]),
        "empty_t": torch.zeros(0, 3),
        "u8": np.arange(7, dtype=np.uint8),
        "f64_2d": np.linspace(0, 1, 6).reshape(2, 3),
        "be_i32": np.arange(3, dtype=">i4"),
        "fortran": np.asfortranarray(np.arange(6, dtype=np.int16).reshape(2, 3)),
        "empty_a": np.zeros((2, 0), dtype=np.float32),
        "raw": b"hello",
        "raw_ba": bytearray(b"\x00\x01"),
        "raw_empty": b"",
    }
    ref = transfer.put_object(members)
    assert isinstance(ref, RemoteBundleRef)
    assert ref.manifest_key.startswith(f"{transfer.key_prefix}/default/")
    assert ref.manifest_key.endswith("/manifest")
    for got in (transfer.get_object(ref), transfer.get_object({"manifest_key": ref.manifest_key}),
                transfer.get_object(RemoteBundleRef(ref.manifest_key, {}))):
        assert list(got) == list(members)
        for name, value in members.items():
            if isinstance(value, torch.Tensor):
                assert same(value.contiguous(), got[name]), name
            elif isinstance(value, np.ndarray):
                assert got[name].dtype == value.dtype and np.array_equal(got[name], value), name
                assert got[name].flags.writeable
            else:
                assert got[name] == bytes(value), name
    # Every key the manifest names is on the store, the empty payload has none.
    assert ref.manifest["buffers"]["raw_empty"] == {
        "key": f"{ref.manifest_key[:-len('/manifest')]}/buffer/raw_empty", "bytes": 0,
        "chunks": []}
    for key in stored_keys(store, ref.manifest_key, ref.manifest):
        assert store.is_exist(key) == 1, key


def test_single_values_are_wrapped(transfer):
    for value in (np.arange(5, dtype=np.float32), torch.ones(2, 2, dtype=torch.int8),
                  torch.tensor(3.5), b"\xff" * 10):
        got = transfer.get_object(transfer.put_object(value))
        if isinstance(value, bytes):
            assert got == value
        else:
            assert same(value, got)


def test_jagged_nested_tensors_round_trip(transfer, store):
    # torch builds its first jagged tensor slowly (10+ s): one test covers them.
    n = torch.nested.nested_tensor([torch.arange(3.0), torch.arange(5.0), torch.zeros(0)],
                                   layout=torch.jagged)
    ref = transfer.put_object({"n": n, "k": torch.ones(2)})
    spec = transfer.materialize(transfer.read_spec(ref)).metadata[S.STRUCTURED_FIELD_SPECS_KEY]
    assert spec["n"]["format"] == "tensor_parts" and spec["n"]["has_lengths"] is False
    digest = {name: hashlib.sha256(store.get(key)).hexdigest()[:16] for name, key in (
        ("n", ref.manifest["buffers"]["n"]["key"]), ("meta", ref.manifest["meta"]["key"]))}
    # oracle: the same put on upstream's module wrote these bytes
    assert digest == {"n": "04fc7b6f3018c860", "meta": "9b2d4ac633752c14"}
    got = transfer.get_object(ref)["n"]
    assert got.is_nested and [x.tolist() for x in got.unbind()] == [
        [0.0, 1.0, 2.0], [0.0, 1.0, 2.0, 3.0, 4.0], []]
    narrow = torch.nested.narrow(torch.arange(12.0).reshape(3, 4), 1, torch.tensor([0, 1, 0]),
                                 torch.tensor([2, 3, 1]), layout=torch.jagged)
    got = transfer.get_object(transfer.put_object(narrow))
    assert [x.tolist() for x in got.unbind()] == [[0.0, 1.0], [5.0, 6.0, 7.0], [8.0]]
    assert got.lengths() is not None
    with pytest.raises(ValueError, match="nested tensor payload is truncated"):
        S._deserialize_nested_tensor_payload(b"\x00" * 10, {"format": "tensor_parts", "part_bytes": [20, 4]})


def test_read_spec_selects_and_slices_members(transfer):
    ref = transfer.put_object({"t": torch.arange(20).reshape(10, 2),
                               "a": np.arange(30, dtype=np.int32).reshape(5, 6), "b": b"abcdef"})
    spec = transfer.read_spec(ref).select_members(["a", "t", "b"])
    spec = spec.slice_member("t", axis=0, start=2, end=8)
    spec = spec.slice_member("a", axis=0, start=1, end=5, step=2)
    assert spec.member_slice("t") == S.StructuredMemberSlice(0, 2, 8, 1)
    result = transfer.materialize(spec)
    assert list(result.objects) == ["a", "t", "b"]
    assert same(result.objects["t"], torch.arange(20).reshape(10, 2)[2:8])
    assert np.array_equal(result.objects["a"], np.arange(30, dtype=np.int32).reshape(5, 6)[1:5:2])
    assert result.objects["b"] == b"abcdef"
    assert result.metadata["layout"] == "structured"
    assert transfer.materialize(transfer.read_spec(ref).select_members(["b"])).objects == {
        "b": b"abcdef"}
    with pytest.raises(KeyError, match="unknown bundle buffers"):
        transfer.materialize(transfer.read_spec(ref).select_members(["nope"]))
    with pytest.raises(ValueError, match="selected no members"):
        transfer.materialize(transfer.read_spec(ref).select_members([]))
    # What upstream's module refuses (oracle): slices off axis 0, a stepped tensor slice,
    # slicing bytes.
    for name, cut, message in [("a", (1, 1, 3, 1), "ndarray slicing currently supports axis=0"),
                               ("t", (0, 2, 8, 3), "tensor slicing currently requires step=1"),
                               ("t", (1, 0, 1, 1), "tensor slicing currently supports axis=0"),
                               ("b", (0, 1, 4, 1), "bytes member b does not support slicing")]:
        with pytest.raises(ValueError, match=message):
            transfer.materialize(transfer.read_spec(ref).slice_member(name, *cut))


def test_materialize_into_numpy_destinations(transfer):
    ref = transfer.put_object({"a": np.arange(12, dtype=np.int32).reshape(3, 4),
                               "t": torch.ones(2), "b": b"xy"})
    dest = np.zeros((3, 4), dtype=np.int32)
    out = transfer.materialize_into(transfer.read_spec(ref), {"a": dest})
    assert out.objects["a"] is dest and np.array_equal(dest, np.arange(12).reshape(3, 4))
    part = np.zeros((1, 4), dtype=np.int32)
    spec = transfer.read_spec(ref).select_members(["a"]).slice_member("a", 0, 1, 2)
    assert transfer.materialize_into(spec, {"a": part}).objects["a"] is part
    assert part.tolist() == [[4, 5, 6, 7]]
    # oracle: the checks and messages upstream applies
    bad = [
        ({"a": np.zeros((3, 4), np.int64)}, ValueError, "destination dtype mismatch: "
         "expected <i4, got <i8"),
        ({"a": np.zeros((4, 3), np.int32)}, ValueError, "destination shape mismatch"),
        ({"a": np.zeros((4, 3), np.int32).T}, ValueError, "must be C-contiguous"),
        ({"a": [0] * 12}, TypeError, "destination must be a numpy.ndarray"),
        ({"b": np.zeros(2, np.uint8)}, ValueError,
         "structured bytes member b does not support materialize_into"),
        ({"t": torch.empty(2)}, ValueError,
         "only supports tensor_object_buffer or raw_destination destinations"),
    ]
    for destinations, exc, message in bad:
        with pytest.raises(exc, match=message):
            transfer.materialize_into(transfer.read_spec(ref), destinations)
    frozen = np.zeros((3, 4), np.int32)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="must be writeable"):
        transfer.materialize_into(transfer.read_spec(ref), {"a": frozen})
    rows = transfer.put({"m": np.arange(6.0).reshape(3, 2), "s": ["p", "q", "r"]}, type="dict")
    target = np.empty((2, 2))
    got = transfer.get(rows, type="dict", destinations={"m": target}, rows=[2, 0])
    assert got["m"] is target and target.tolist() == [[4.0, 5.0], [0.0, 1.0]]


def test_structured_payload_metadata_is_kept(transfer):
    payload = StructuredObjectPayload(metadata={"layout": "mine", "step": 3},
                                      buffers={"w": np.ones(2)})
    result = transfer.materialize(transfer.read_spec(transfer.put_structured_object(payload)))
    assert result.metadata["layout"] == "mine" and result.metadata["step"] == 3
    assert result.metadata[S.STRUCTURED_FIELD_SPECS_KEY] == {
        "w": {"encoding": "ndarray", "dtype": "<f8", "shape": [2]}}


def test_payloads_past_chunk_bytes_are_split_and_reassembled(transfer, store):
    blob = bytes(range(256)) * 40
    ref = transfer.put_object({"big": blob, "arr": np.arange(1000, dtype=np.int64)},
                              chunk_bytes=1000)
    spec = ref.manifest["buffers"]["big"]
    assert [c["bytes"] for c in spec["chunks"]] == [1000] * 10 + [240]
    assert [c["key"] for c in spec["chunks"]] == [f"{spec['key']}/chunk/{i}" for i in range(11)]
    assert all(store.is_exist(c["key"]) == 1 for c in spec["chunks"])
    got = transfer.get_object(ref)
    assert got["big"] == blob and np.array_equal(got["arr"], np.arange(1000))


def test_raw_bundles_and_removal(transfer, store):
    ref = transfer.put_bundle(b"meta", {"a": b"xyz", "e": b""}, partition="p1")
    assert ref.manifest["object_id"].startswith("p1/")
    keys = stored_keys(store, ref.manifest_key, ref.manifest)
    assert all(store.is_exist(k) == 1 for k in keys)
    transfer.remove_bundle(ref)
    assert all(store.is_exist(k) == 0 for k in keys)
    # Removing again, by key only, is not an error (oracle: returns None).
    assert transfer.remove_bundle({"manifest_key": ref.manifest_key}) is None


# -- stored layout, compared with upstream -----------------------------------------------------

# oracle: key -> sha256(value)[:16] for the three puts of test_stored_layout_matches_upstream
EXPECTED_DIGESTS = {
    "layout/default/00000000000000000000000000000000/buffer/a": "e528f4309e1413e6",
    "layout/default/00000000000000000000000000000000/buffer/b": "3608bca1e44ea6c4",
    "layout/default/00000000000000000000000000000000/buffer/t": "e1e5bd9cb64c2322",
    "layout/default/00000000000000000000000000000000/manifest": "60cdabdcb7099853",
    "layout/default/00000000000000000000000000000000/meta": "3a5daf18b4d04a71",
    "layout/default/00000000000000000000000000000001/buffer/value/chunk/0": "7728ae2f2c36e2aa",
    "layout/default/00000000000000000000000000000001/buffer/value/chunk/1": "f63e3f2f2c7580c5",
    "layout/default/00000000000000000000000000000001/buffer/value/chunk/2": "d312a43a6721875e",
    "layout/default/00000000000000000000000000000001/buffer/value/chunk/3": "114176ef50fa1e45",
    "layout/default/00000000000000000000000000000001/manifest": "86c412f6941d6e26",
    "layout/default/00000000000000000000000000000001/meta": "1df1e359a8dd7726",
    "layout/rows/00000000000000000000000000000003/buffer/batch.ids": "ab25350e3e65efeb",
    "layout/rows/00000000000000000000000000000003/buffer/batch.x": "13376031807b4cb4",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.flag.data": "fb50dc0717ff266c",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.flag.nulls": "cf7605ed1bc735f6",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.grid.data": "f46913286d895f62",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.grid.ndims": "455f21fac995e128",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.grid.nulls": "faee935763044f12",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.grid.offsets": "505414050cf94a88",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.grid.shapes": "8ae07a03ef7bc546",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.js.data": "d84ed78884074f37",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.js.nulls": "faee935763044f12",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.js.offsets": "38e9b1501f609ca9",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.lst.data": "6bab56d2f81d4b5a",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.lst.ndims": "cd0bae01d0980381",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.lst.nulls": "709e80c88487a241",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.lst.offsets": "69f05b9853fb5040",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.lst.shapes": "d7de87153cabf7d7",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.media.byte_offsets": "20a63514f83dec26",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.media.data": "ba7816bf8f01cfea",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.media.nulls": "cf7605ed1bc735f6",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.media.row_offsets": "6dca6c68c8e5ddd4",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.name.data": "715edf8ba8729420",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.name.nulls": "cf7605ed1bc735f6",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.name.offsets": "4a8a414b55524384",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.nested.data": "4a27f46bc5a73545",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.nested.nulls": "709e80c88487a241",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.nested.offsets": "d8144ee210753070",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.raw.data": "ba7816bf8f01cfea",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.raw.nulls": "cf7605ed1bc735f6",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.raw.offsets": "68cda05c81e57db9",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.rec.leaf.0.data": "ca978112ca1bbdca",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.rec.leaf.0.missing": "faee935763044f12",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.rec.leaf.0.nulls": "fbb59ed10e9cd4ff",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.rec.leaf.0.offsets": "97e2b8b640d13af1",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.rec.leaf.1.data": "5f2fa7795ceb5867",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.rec.leaf.1.missing": "709e80c88487a241",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.rec.leaf.1.ndims": "86a2e77f630bfd5d",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.rec.leaf.1.nulls": "cf7605ed1bc735f6",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.rec.leaf.1.offsets": "68cda05c81e57db9",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.rec.leaf.1.shapes": "b3db6650e4598ca5",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.rec.node.0.missing": "709e80c88487a241",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.rec.node.0.row_mask": "9f44ac6acb8a37b0",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.rec2.leaf.0.data": "3866a60f3d661fde",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.rec2.leaf.0.missing": "709e80c88487a241",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.rec2.leaf.0.nulls": "cf7605ed1bc735f6",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.rec2.leaf.0.offsets": "4a8a414b55524384",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.rec2.leaf.1.data": "87d82d155685fda4",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.rec2.leaf.1.missing": "fb50dc0717ff266c",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.rec2.leaf.1.nulls": "85f90dfea1d8027e",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.rec2.leaf.2.missing": "fbb59ed10e9cd4ff",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.rec2.leaf.2.nulls": "75c8fd04ad916aec",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.rec2.leaf.2.offsets": "66687aadf862bd77",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.rec2.node.0.lengths": "b3db6650e4598ca5",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.rec2.node.0.missing": "709e80c88487a241",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.rec2.node.0.row_mask": "75c8fd04ad916aec",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.rec2.node.1.missing": "cf7605ed1bc735f6",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.rec2.node.1.row_mask": "9f44ac6acb8a37b0",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.score.data": "d242a736c77580da",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.score.nulls": "cf7605ed1bc735f6",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.toks.data": "92ae4f5e6e2ed0cf",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.toks.ndims": "cd0bae01d0980381",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.toks.nulls": "709e80c88487a241",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.toks.offsets": "62752d423b7304f4",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.toks.shapes": "27f66328ad6517d7",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.tt.data": "58d5a31b598d316a",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.tt.ndims": "86a2e77f630bfd5d",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.tt.nulls": "cf7605ed1bc735f6",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.tt.offsets": "79f851a7910a29ed",
    "layout/rows/00000000000000000000000000000003/buffer/non_tensor_batch.tt.shapes": "9fb008351b785610",
    "layout/rows/00000000000000000000000000000003/manifest": "ae19fc76321bc45d",
    "layout/rows/00000000000000000000000000000003/meta": "0e5871c08b5c8338"
}

# oracle: the codec inferred for each non_tensor_batch column
EXPECTED_CODECS = {
    "name": "utf8_ragged",
    "score": "ndarray",
    "flag": "ndarray",
    "raw": "bytes_ragged",
    "js": "msgpack_ragged",
    "nested": "msgpack_ragged",
    "toks": "typed_ragged",
    "grid": "typed_ragged",
    "lst": "typed_ragged",
    "tt": "ragged_tensor",
    "media": "media_list_ragged",
    "rec": "structured_recursive",
    "rec2": "structured_recursive"
}
# oracle: sha256(json.dumps(export_dataproto_ref(ref), sort_keys=True))[:16]
EXPECTED_HANDLE_SHA = 'cd493aa9a501ef46'


def columns():
    return {
        "x": torch.arange(6, dtype=torch.float32).reshape(3, 2),
        "ids": np.arange(3, dtype=np.int64),
        "name": ["a", "bb", None],
        "score": [1.5, 2, None],
        "flag": [True, False, None],
        "raw": [b"ab", b"c", None],
        "js": [{"a": "x", "b": [1, -5, 300, -40000, 2**40, 1.25, None, True]}, None,
               {"a": "z" * 40}],
        "nested": [{"k": 1, "v": [1.0, 2.0]}, {"k": 2, "v": [3.0]}, {"k": 3, "v": []}],
        "toks": [np.arange(2), np.arange(3), np.arange(1)],
        "grid": [np.ones((2, 2), dtype=np.float32), None, np.ones((1, 2), dtype=np.float32)],
        "lst": [[1, 2, 3], [4], []],
        "tt": [torch.ones(2), torch.arange(3.0), None],
        "media": [[b"a", b"bc"], [], None],
        "rec": [{"t": torch.ones(2), "s": "a"}, {"t": torch.zeros(1)}, None],
        "rec2": [[{"b": b"x"}, None], [{"b": b"yy", "n": 1}], []],
    }


def test_stored_layout_matches_upstream(store, monkeypatch):
    counter = itertools.count()
    monkeypatch.setattr(S.uuid, "uuid4", lambda: uuid.UUID(int=next(counter)))
    t = MooncakeBundleTransfer(store, key_prefix="layout")
    refs = [
        t.put_object({"t": torch.arange(6, dtype=torch.float32).reshape(2, 3),
                      "a": np.arange(5, dtype=np.int32), "b": b"xyz"}),
        t.put_object(bytes(range(256)) * 4, chunk_bytes=300),
    ]
    dp = t.put(columns(), type="dict", partition="rows")
    monkeypatch.undo()
    handle = export_dataproto_ref(dp)
    manifests = [(r.manifest_key, r.manifest) for r in refs]
    manifests += [(r.manifest_key, r.manifest) for r in dp.stage_refs.values()]
    digests = {}
    for manifest_key, manifest in manifests:
        for key in stored_keys(store, manifest_key, manifest):
            digests[key] = hashlib.sha256(store.get(key)).hexdigest()[:16]
    assert dict(sorted(digests.items())) == EXPECTED_DIGESTS
    assert {k: v["codec"] for k, v in handle["encoded_non_tensor"].items()} == EXPECTED_CODECS
    assert hashlib.sha256(json.dumps(handle, sort_keys=True).encode()).hexdigest()[:16] == \
        EXPECTED_HANDLE_SHA
    assert handle[S.STORAGE_GROUP_ID] == "structured-00000000000000000000000000000002"
    for ref in refs:
        t.remove_bundle(ref)
    t.cleanup_dataproto(dp)
    assert all(store.is_exist(k) == 0 for k in digests)


# oracle: the keys and sha256(value)[:16] upstream's module wrote for the PIL rows below (its
# store swapped for an in-memory one), the handle's sha256 and the column metadata
PIL_DIGESTS = {
    "buffer/non_tensor_batch.img.data": "62deee254def8f3d",
    "buffer/non_tensor_batch.img.nulls": "cf7605ed1bc735f6",
    "buffer/non_tensor_batch.img.offsets": "393ff5b64eebc064",
    "buffer/non_tensor_batch.ml.byte_offsets": "ada8db56cf4d577c",
    "buffer/non_tensor_batch.ml.data": "957317bc84e1a8ca",
    "buffer/non_tensor_batch.ml.nulls": "cf7605ed1bc735f6",
    "buffer/non_tensor_batch.ml.row_offsets": "6dca6c68c8e5ddd4",
    "buffer/non_tensor_batch.n.data": "e2e2033ae7e19d68",
    "buffer/non_tensor_batch.n.nulls": "709e80c88487a241",
    "manifest": "ae0fbb7c4a786c44",
    "meta": "8313ebe5fecd6a91",
}


def test_pil_image_rows_match_upstream(store, monkeypatch):
    from PIL import Image

    counter = itertools.count()
    monkeypatch.setattr(S.uuid, "uuid4", lambda: uuid.UUID(int=next(counter)))
    t = MooncakeBundleTransfer(store, key_prefix="pil")
    rgb = Image.frombytes("RGB", (2, 2), bytes(range(12)))
    gray = Image.frombytes("L", (3, 1), b"\x01\x02\x03")
    gray.format = "PNG"
    ref = t.put({"img": [rgb, gray, None], "ml": [[rgb, b"ab"], [], None], "n": [1, 2, 3]},
                type="dict")
    monkeypatch.undo()
    handle = export_dataproto_ref(ref)
    base = "pil/default/00000000000000000000000000000001/"
    assert {k: hashlib.sha256(store.get(base + k)).hexdigest()[:16] for k in PIL_DIGESTS} \
        == PIL_DIGESTS
    assert hashlib.sha256(json.dumps(handle, sort_keys=True).encode()).hexdigest()[:16] == \
        "19635a73a43c4e0d"
    img = handle["encoded_non_tensor"]["img"]
    assert img["codec"] == "media_bytes"
    assert img["metadata"]["media_encodings"] == [
        {"format": None, "kind": "pil_raw", "mode": "RGB", "size": [2, 2]},
        {"format": "PNG", "kind": "pil_raw", "mode": "L", "size": [3, 1]}, {"kind": "null"}]
    assert img["metadata"]["media_types"] == ["image/raw"]

    got = t.get(ref, type="dict")
    a, b, none = got["img"]
    assert none is None
    assert (a.mode, a.size, a.format, a.tobytes()) == ("RGB", (2, 2), None, bytes(range(12)))
    assert (b.mode, b.size, b.format, b.tobytes()) == ("L", (3, 1), "PNG", b"\x01\x02\x03")
    (img0, raw), empty, missing = got["ml"]
    assert (img0.tobytes(), raw, empty, missing) == (bytes(range(12)), b"ab", [], None)
    t.cleanup_dataproto(ref)


def test_manifest_view_matches_upstream(store, monkeypatch):
    counter = itertools.count()
    monkeypatch.setattr(S.uuid, "uuid4", lambda: uuid.UUID(int=next(counter)))
    t = MooncakeBundleTransfer(store, key_prefix="view")
    ref = t.put({"x": torch.zeros(2, 3), "s": ["a", "b"], "a": np.ones(2), "m": 3}, type="dict")
    ref = t.append_dataproto_fields(ref, {
        "batch": {"y": torch.ones(2)},
        "non_tensor_batch": {"r": np.array([{"t": torch.ones(1)}, None], dtype=object)}},
        stage="s2")
    monkeypatch.undo()
    view = t.dataproto_manifest_view(export_dataproto_ref(ref))
    assert list(view["batch_fields"]) == ["x", "a", "y"]
    assert view["non_tensor_fields"]["r"]["spec"]["codec"] == "structured_recursive"
    assert view["stages"]["s2"]["dataproto"]["stage"] == "s2"
    text = json.dumps(view, sort_keys=True).replace('"view/', '"bundle/')
    # oracle: sha256 of the same view (its key prefix "bundle") for the same calls
    assert hashlib.sha256(text.encode()).hexdigest()[:16] == "ddf3420f5050849e"
    t.cleanup_dataproto(ref)


# -- rows: flat dicts and DataProtos -----------------------------------------------------------


def test_flat_dict_round_trips_every_codec(transfer):
    data = columns()
    ref = transfer.put(data, type="dict")
    assert isinstance(ref, MooncakeDataProtoRef) and ref.batch_size == 3
    assert {n: loc.section for n, loc in ref.field_index.items()} == {
        n: "batch" if n in ("x", "ids") else "non_tensor_batch" for n in data}
    got = transfer.get(ref, type="dict")
    assert list(got) == list(data)
    # oracle: numbers of a column share one dtype, so ints next to floats come back as floats
    data["score"] = [1.5, 2.0, None]
    data["lst"] = [[1.0, 2.0, 3.0], [4.0], []]
    for name, value in data.items():
        assert same(value, got[name]), (name, got[name])


@pytest.mark.parametrize("rows, expect_codec", [
    ([1, 2**40, -3], "ndarray"),
    ([np.float32(1.5), np.float32(2.5), None], "ndarray"),
    (["héllo", "", "\u2603"], "utf8_ragged"),
    ([bytearray(b"x"), memoryview(b"yz"), b""], "bytes_ragged"),
    ([{"deep": {"er": [1, "two", None, {"x": b"\x00"}]}}, [], {"a": -1.0}], "msgpack_ragged"),
    ([[1, 2], [3.5], None], "typed_ragged"),
    ([np.arange(4, dtype=np.uint16).reshape(2, 2), np.zeros((0, 2), np.uint16), None],
     "typed_ragged"),
    ([np.array(3), np.array(-4), None], "typed_ragged"),
    ([torch.arange(4, dtype=torch.int16).reshape(2, 2), None, torch.zeros(1, 2, dtype=torch.int16)],
     "ragged_tensor"),
    ([[b"img0"], [b"a", b"b", b"c"], None], "media_list_ragged"),
    ([{"mask": np.array([1, 0]), "meta": {"id": 1}}, {"mask": None}, {}], "structured_recursive"),
    ([[{"t": torch.ones(1)}, None], [], None], "structured_recursive"),
    ([{"a": {"b": [{"c": b"q"}]}}, {"a": None}, {"a": {"b": []}}], "structured_recursive"),
])
def test_each_codec_round_trips(transfer, rows, expect_codec):
    ref = transfer.put({"x": torch.zeros(3), "col": rows}, type="dict")
    assert ref.encoded_non_tensor["col"]["codec"] == expect_codec
    got = transfer.get(ref, type="dict")["col"]
    expect = [bytes(v) if isinstance(v, (bytearray, memoryview)) else v for v in rows]
    if expect_codec == "typed_ragged" and isinstance(rows[0], list):
        expect = [None if v is None else [float(i) for i in v] for v in rows]
    if expect_codec == "ndarray":
        expect = [None if v is None else v.item() if isinstance(v, np.generic) else v
                  for v in rows]
    assert same(expect, got), got


def test_dataproto_sections_selection_and_rows(transfer):
    class DataProto:
        def __init__(self, batch, non_tensor_batch, meta_info):
            self.batch, self.non_tensor_batch, self.meta_info = batch, non_tensor_batch, meta_info

        @classmethod
        def from_dict(cls, batch, non_tensor_batch, meta_info=None):
            return cls(batch, non_tensor_batch, meta_info)

    batch = {"obs": torch.arange(8.0).reshape(4, 2), "mask": np.array([1, 0, 1, 1], np.int8)}
    nt = {"uid": np.array(["a", "b", "c", "d"], dtype=object),
          "plain": np.array([10, 20, 30, 40])}
    ref = transfer.put_dataproto(DataProto(batch, nt, {"temp": 0.7, "tags": ["x"]}),
                                 namespace="ns", partition="p2", stage="rollout")
    assert (ref.namespace, ref.partition, ref.batch_size) == ("ns", "p2", 4)
    assert set(ref.stage_refs) == {"rollout"} and set(ref.encoded_non_tensor) == {"uid"}
    out = transfer.get_dataproto(ref)
    assert set(out) == {"batch", "non_tensor_batch", "meta_info"}
    assert same(batch["obs"], out["batch"]["obs"]) and same(batch["mask"], out["batch"]["mask"])
    assert same(nt["uid"], out["non_tensor_batch"]["uid"])
    assert same(nt["plain"], out["non_tensor_batch"]["plain"])
    assert out["meta_info"] == {"temp": 0.7, "tags": ["x"]}
    obj = transfer.get(ref, data_cls=DataProto, fields=["uid"], meta_info_keys=["temp"])
    assert isinstance(obj, DataProto) and obj.batch == {} and obj.meta_info == {"temp": 0.7}
    assert list(obj.non_tensor_batch["uid"]) == ["a", "b", "c", "d"]
    sel = transfer.get(ref, batch_fields=["obs"], non_tensor_fields=["uid"], rows=slice(1, 4, 2))
    assert same(batch["obs"][1:4:2], sel["batch"]["obs"])
    assert list(sel["non_tensor_batch"]["uid"]) == ["b", "d"]
    picked = transfer.get(ref, type="dict", rows=[3, 0])
    assert same(batch["obs"][[3, 0]], picked["obs"]) and picked["uid"] == ["d", "a"]
    assert list(picked["plain"]) == [40, 10] and picked["temp"] == 0.7
    assert transfer.get(ref, fields=[], type="dict") == {"temp": 0.7, "tags": ["x"]}
    with pytest.raises(IndexError):
        transfer.get(ref, rows=[4])


def test_flat_dict_sections_follow_upstream(transfer):
    data = {"t": torch.zeros(2, 3), "a": np.zeros(2), "obj": ["p", "q"], "n": 5,
            "lst_other": [1, 2], "s": "text", "cfg": {"lr": 0.1}}
    ref = transfer.put(data, type="dict")
    # oracle: 2 rows; t and a to batch, 2-long sequences to non_tensor_batch, the rest meta_info
    assert {n: loc.section for n, loc in ref.field_index.items()} == {
        "t": "batch", "a": "batch", "obj": "non_tensor_batch", "lst_other": "non_tensor_batch"}
    assert ref.meta_info == {"n": 5, "s": "text", "cfg": {"lr": 0.1}}
    got = transfer.get(ref, type="dict")
    assert list(got) == ["n", "s", "cfg", "t", "a", "obj", "lst_other"]
    meta_only = transfer.put({"a": 1, "b": "s"}, type="dict")
    assert meta_only.stage_refs == {} and transfer.get(meta_only, type="dict") == {"a": 1, "b": "s"}


def test_handles_cross_process_boundaries(transfer, store, new_store):
    ref = transfer.put(columns(), type="dict")
    handle = export_dataproto_ref(ref)
    assert is_dataproto_ref_handle(handle) and not is_dataproto_ref_handle({"type": "x"})
    wire = json.loads(json.dumps(handle))
    assert import_dataproto_ref(wire).field_index == ref.field_index
    # Another client, another transfer object: reads by handle alone.
    other = MooncakeBundleTransfer(new_store(), key_prefix=transfer.key_prefix)
    got = other.get(wire, type="dict")
    mine = transfer.get(ref, type="dict")
    for name in columns():
        assert same(mine[name], got[name]), name
    assert S.export_ref is export_dataproto_ref and S.import_ref is import_dataproto_ref


def test_append_merge_overwrite_and_cleanup(transfer, store):
    base = {"batch": {"x": torch.arange(3.0)},
            "non_tensor_batch": {"s": np.array(["a", "b", "c"], dtype=object)},
            "meta_info": {"m": 1}}
    ref = transfer.put(base)
    new_stage = transfer.append_dataproto_fields(
        export_dataproto_ref(ref), {"batch": {"y": torch.ones(3)}, "meta_info": {"k": 2}},
        stage="reward")
    assert set(new_stage.stage_refs) == {"default", "reward"}
    assert new_stage.meta_info == {"m": 1, "k": 2}
    merged = transfer.append_dataproto_fields(
        new_stage, {"non_tensor_batch": {"z": np.array([[1], [2, 3], []], dtype=object)}},
        stage="default")
    old_key = new_stage.stage_refs["default"].manifest_key
    new_key = merged.stage_refs["default"].manifest_key
    assert new_key != old_key and store.is_exist(new_key) == 1
    assert merged.stage_refs["default"].manifest["cleanup_keys"][0] == old_key
    out = transfer.get(merged, type="dict")
    assert same(torch.arange(3.0), out["x"]) and same(torch.ones(3), out["y"])
    assert out["s"] == ["a", "b", "c"] and out["z"] == [[1], [2, 3], []]
    with pytest.raises(ValueError, match="already exist"):
        transfer.append_dataproto_fields(merged, {"batch": {"y": torch.ones(3)}}, stage="reward")
    with pytest.raises(ValueError, match="batch size 2 does not match ref batch size 3"):
        transfer.append_dataproto_fields(merged, {"batch": {"w": torch.ones(2)}}, stage="w")
    with pytest.raises(ValueError, match="must include existing fields"):
        transfer.append_dataproto_fields(merged, {"batch": {"q": torch.ones(3)}},
                                         stage="reward", overwrite=True)
    over = transfer.append_dataproto_fields(merged, {"batch": {"y": torch.full((3,), 7.0)}},
                                            stage="reward", overwrite=True)
    assert same(torch.full((3,), 7.0), transfer.get(over, type="dict", fields=["y"])["y"])
    assert store.is_exist(merged.stage_refs["reward"].manifest_key) == 0
    every = []
    for stage_ref in over.stage_refs.values():
        manifest = transfer._bundles.resolve(stage_ref)
        every += stored_keys(store, stage_ref.manifest_key, manifest)
        every += manifest.get("cleanup_keys", [])
    transfer.cleanup_dataproto(over)
    assert [k for k in every if store.is_exist(k) != 0] == []


def test_unpublished_append_cleanup_keeps_the_previous_ref(transfer, store):
    ref = transfer.put({"batch": {"x": torch.arange(2.0)}})
    appended = transfer.append_dataproto_fields(ref, {"batch": {"y": torch.ones(2)}},
                                                stage="default")
    other = transfer.append_dataproto_fields(ref, {"batch": {"z": torch.ones(2)}}, stage="s2")
    transfer.cleanup_dataproto_append(ref, appended)
    transfer.cleanup_dataproto_append(ref, other)
    assert store.is_exist(appended.stage_refs["default"].manifest_key) == 0
    assert store.is_exist(other.stage_refs["s2"].manifest_key) == 0
    y_key = appended.stage_refs["default"].manifest["buffers"]["batch.y"]["key"]
    assert store.is_exist(y_key) == 0
    assert same(torch.arange(2.0), transfer.get(ref, type="dict")["x"])


# -- explicit codecs (FieldSchema) -------------------------------------------------------------

Z = torch.zeros(3)


@pytest.mark.parametrize("rows, schema, expect_meta, expect_rows", [
    # oracle: the encoded metadata and the values read back
    ([1, 2, None], FieldSchema("ndarray", metadata={"dtype": "float32"}),
     {"dtype": "float32", "shape": [3]}, [1.0, 2.0, None]),
    ([[1, 2], None, [3]], FieldSchema("typed_ragged", metadata={"dtype": "int32"}),
     {"dtype": "int32", "max_ndim": 1, "ndarray_rows": None, "row_format": "list",
      "shape_policy": "ragged"}, [[1, 2], None, [3]]),
    ([torch.ones(2), None, torch.zeros(1)], FieldSchema("ragged_tensor"), None,
     [torch.ones(2), None, torch.zeros(1)]),
    (["a", None, "c"], FieldSchema("utf8_ragged"), {}, ["a", None, "c"]),
    ([b"a", None, b"c"], FieldSchema("bytes_ragged"), {}, [b"a", None, b"c"]),
    ([{"a": 1}, None, [1]], FieldSchema("msgpack_ragged"), {}, [{"a": 1}, None, [1]]),
    ([{"a": 1}, None, "s"], FieldSchema("json_ragged"), {}, [{"a": 1}, None, "s"]),
    ([[b"a"], None, []], FieldSchema("media_list_ragged"), None, [[b"a"], None, []]),
    (["a", None, "c"], FieldSchema("auto"), None, ["a", None, "c"]),
])
def test_field_schemas_pick_the_codec(transfer, rows, schema, expect_meta, expect_rows):
    ref = transfer.put({"x": Z, "c": rows}, type="dict", field_schemas={"c": schema})
    enc = ref.encoded_non_tensor["c"]
    assert enc["codec"] == ("utf8_ragged" if schema.codec == "auto" else schema.codec)
    if expect_meta is not None:
        assert enc["metadata"] == expect_meta
    assert same(expect_rows, transfer.get(ref, type="dict")["c"])


@pytest.mark.parametrize("rows, codec, digest", [
    # oracle: the codec upstream's fallback search settled on for FieldSchema("ndarray") with
    # no dtype, and sha256(json.dumps(encoded_non_tensor[field], sort_keys=True))[:12]
    ([1, 2, 3], "ndarray", "2ed6ffe428c1"),
    ([1.5, None, 3], "ndarray", "8d3e54ae1805"),
    (["a", "b", None], "utf8_ragged", "5e470910c1f4"),
    ([{"a": np.int64(1)}, {"a": 2}, None], "msgpack_ragged", "9f2370e351cb"),
    ([{"t": torch.ones(2), "s": "x"}, {"t": torch.ones(1)}, None], "structured_recursive",
     "7f570f966511"),
    ([{"m": np.arange(2)}, {"m": np.arange(3)}, {}], "structured_recursive", "5b267d22968d"),
    ([[1, 2], [3, 4], [5, 6]], "typed_ragged", "4236807ced17"),
    ([[1, 2], [3], None], "typed_ragged", "e5c99b644afb"),
    ([(1, "a"), (2, "b"), None], "msgpack_ragged", "9f2370e351cb"),
    ([np.arange(2), np.arange(3), None], "typed_ragged", "4236807ced17"),
    ([1, "a", None], "msgpack_ragged", "9f2370e351cb"),
    ([{"k": b"x"}, {"k": None}, {}], "structured_recursive", "4f7648e21d04"),
    ([object(), object(), None], None, "unable to infer a safe codec"),
])
def test_dtype_less_ndarray_schema_searches_a_codec(transfer, rows, codec, digest):
    def put():
        return transfer.put({"x": Z, "c": rows}, type="dict",
                            field_schemas={"c": FieldSchema("ndarray")})

    if codec is None:
        with pytest.raises(ValueError, match=digest):
            put()
        return
    ref = put()
    enc = ref.encoded_non_tensor["c"]
    assert enc["codec"] == codec
    assert hashlib.sha256(json.dumps(enc, sort_keys=True).encode()).hexdigest()[:12] == digest
    got = transfer.get(ref, type="dict")["c"]
    assert len(got) == 3 and (got[2] is None) == (rows[2] is None)


def test_field_schema_sections(transfer):
    # oracle: a pinned meta_info list stays out of the rows; a pinned column sets the rows.
    ref = transfer.put({"x": Z, "lst": [1, 2, 3, 4], "c": ["a", "b", "c"]}, type="dict",
                       field_schemas={"lst": FieldSchema("auto", metadata={"section": "meta_info"})})
    assert list(ref.field_index) == ["x", "c"] and ref.meta_info == {"lst": [1, 2, 3, 4]}
    ref = transfer.put({"c": [1, 2], "d": [1, 2, 3]}, type="dict", field_schemas={
        "c": FieldSchema("auto", metadata={"section": "non_tensor_batch"})})
    assert ref.batch_size == 2 and ref.meta_info == {"d": [1, 2, 3]}
    ref = transfer.put({"x": Z, "c": np.array([1, 2, 3])}, type="dict", field_schemas={
        "c": FieldSchema("ndarray", metadata={"dtype": "int16", "section": "non_tensor_batch"})})
    assert ref.encoded_non_tensor["c"]["metadata"] == {"dtype": "int16", "shape": [3]}


def test_ragged_tensor_dict_schema(transfer):
    rows = [{"a": torch.ones(2), "b": torch.zeros(1, 2, dtype=torch.int64)}, None,
            {"a": torch.arange(3.0)}]
    ref = transfer.put({"x": Z, "c": rows}, type="dict",
                       field_schemas={"c": FieldSchema("ragged_tensor_dict")})
    enc = ref.encoded_non_tensor["c"]
    assert enc["codec"] == "ragged_tensor_dict" and enc["metadata"]["keys"] == ["a", "b"]
    assert sorted(enc["payload_members"]) == sorted(
        ["null_mask"] + [f"{k}.{p}" for k in "ab"
                         for p in ("data", "offsets", "shapes", "ndims", "nulls")])
    assert same(rows, transfer.get(ref, type="dict")["c"])
    declared = transfer.put({"x": Z[:2], "c": [{"a": torch.ones(2)}, None]}, type="dict",
                            field_schemas={"c": FieldSchema("ragged_tensor_dict",
                                                            metadata={"keys": ["b", "a"]})})
    assert declared.encoded_non_tensor["c"]["metadata"]["keys"] == ["b", "a"]
    assert same([{"a": torch.ones(2)}, None], transfer.get(declared, type="dict")["c"])
    # oracle: the errors upstream raised for the same rows
    bad = [
        ([{"a": torch.ones(2), "z": torch.ones(1)}, None], {"keys": ["a"]}, ValueError,
         r"row 0 has keys not declared: \['z'\]"),
        ([{"a": None}, None], {}, TypeError, r"row 0 has explicit None for \['a'\]"),
        ([3, None], {}, TypeError, "rows must be mappings or None; row 0 is int"),
        ([{"a.b": torch.ones(1)}, None], {}, ValueError, "keys must not contain"),
        ([{"a": torch.ones(1)}, {"a": torch.ones(1, dtype=torch.int64)}], {}, ValueError,
         "failed to encode ragged_tensor_dict key 'a'"),
    ]
    for rows, meta, exc, message in bad:
        with pytest.raises(exc, match=message):
            transfer.put({"x": Z[:2], "c": rows}, type="dict", field_schemas={
                "c": FieldSchema("ragged_tensor_dict", metadata=meta)})


@pytest.mark.parametrize("data, schemas, kind, exc, message", [
    # oracle: exception type and message
    ({"x": Z, "c": ["a", None, "c"]}, {"c": FieldSchema("utf8_ragged", nullable=False)}, "dict",
     ValueError, "with FieldSchema codec 'utf8_ragged': FieldSchema for 'non_tensor_batch.c' "
     "is not nullable"),
    ({"x": Z, "c": ["a", None, "c"]}, {"c": FieldSchema("auto", nullable=False)}, "dict",
     ValueError, "codec 'auto': FieldSchema for 'non_tensor_batch.c' is not nullable"),
    ({"x": Z, "c": ["a", "b", "c"]}, {"c": FieldSchema("weird")}, "dict", ValueError,
     "unsupported schema codec: 'weird'"),
    ({"x": Z, "c": [1, 2, 3]}, {"c": FieldSchema("auto", metadata={"section": "nope"})}, "dict",
     ValueError, r"metadata\['section'\] must be one of \['batch', 'meta_info', "
     r"'non_tensor_batch'\]"),
    ({"x": Z, "c": [1, 2, 3]}, {"c": FieldSchema("ndarray", metadata={"dtype": "U3"})}, "dict",
     ValueError, r"FieldSchema metadata\['dtype'\] must be numeric or bool, got <U3"),
    ({"x": Z, "c": [(1,), None, [1]]}, {"c": FieldSchema("msgpack_ragged")}, "dict", ValueError,
     "msgpack codec cannot encode value"),
    ({"x": Z, "b": [1, 2, 3]}, {"b": FieldSchema("auto", metadata={"section": "batch"})},
     "dict", TypeError, "batch.b must be bytes-like, got list"),
    ({"batch": {"a": torch.zeros(2)}, "non_tensor_batch": {}},
     {"a": FieldSchema("auto", metadata={"section": "non_tensor_batch"})}, "dataproto",
     ValueError, "FieldSchema for 'a' declares section 'non_tensor_batch', but data contains it "
     "in 'batch'"),
    ({"batch": {"a": torch.zeros(2)},
      "non_tensor_batch": {"s": np.array(["p", "q"], dtype=object)}},
     {"s": FieldSchema("bytes_ragged")}, "dataproto", TypeError,
     "codec 'bytes_ragged': string argument without an encoding"),
])
def test_field_schema_errors(transfer, data, schemas, kind, exc, message):
    with pytest.raises(exc, match=message):
        transfer.put(data, type=kind, field_schemas=schemas)


# -- bad input ---------------------------------------------------------------------------------

X = torch.zeros(2)
# oracle: the exception type and message upstream raised for each call
BAD_CALLS = [
    (lambda t: t.put({"x": X, "m": [1, "a"]}, type="dict"), ValueError,
     "unsupported structured non-tensor field: no codec matched"),
    (lambda t: t.put({"x": X, "m": [(1, "a"), (2, "b")]}, type="dict"), TypeError,
     "can not serialize 'tuple' object"),
    (lambda t: t.put({"x": X, "m": [{"a": np.int64(1)}, {"a": 2}]}, type="dict"), TypeError,
     "can not serialize 'numpy.int64' object"),
    (lambda t: t.put({"x": X, "m": [None, None]}, type="dict"), ValueError,
     "unsupported structured non-tensor field: all rows are null"),
    (lambda t: t.put({"x": X, "m": [torch.ones(1), torch.ones(1, dtype=torch.int64)]},
                     type="dict"), ValueError,
     r"mixed tensor dtype: \['torch.float32', 'torch.int64'\]"),
    (lambda t: t.put({"x": X, "m": [object(), object()]}, type="dict"), ValueError,
     "no codec matched"),
    (lambda t: t.put({"x": X, "m": [{"a": 2**64}, {"a": 1}]}, type="dict"), OverflowError,
     "Integer value out of range"),
    (lambda t: t.put({"x": X, "m": [[torch.ones(1), None], []]}, type="dict"), TypeError,
     "can not serialize 'Tensor' object"),
    (lambda t: t.put({"x": X, "m": [np.ones(()), np.ones(()) * 2]}, type="dict"),
     ValueError, "no codec matched"),
    (lambda t: t.put({"a": [1, 2], "b": [1, 2, 3]}, type="dict"), ValueError,
     r"flat dict fields have ambiguous batch sizes: \[2, 3\]"),
    (lambda t: t.put({"a": torch.zeros(2), "b": np.zeros(3)}, type="dict"), ValueError,
     r"flat dict dense fields have ambiguous batch sizes: \[2, 3\]"),
    (lambda t: t.put({"a": 1}, type="nope"), ValueError, "unsupported Mooncake payload type"),
    (lambda t: t.put({"batch": {"a": torch.zeros(2)},
                      "non_tensor_batch": {"b": np.array([1, 2, 3], dtype=object)}}),
     ValueError, r"DataProto fields have inconsistent batch sizes: \[2, 3\]"),
    (lambda t: t.put({"batch": {"a": torch.zeros(2)},
                      "non_tensor_batch": {"a": np.array([1, 2], dtype=object)}}),
     ValueError, r"DataProto batch and non_tensor_batch fields overlap: \['a'\]"),
    (lambda t: t.put_object({"a": b"x"}, partition="a/b"), ValueError,
     "invalid bundle partition: 'a/b'"),
    (lambda t: t.put_object({"a": b"x"}, partition=""), ValueError,
     "invalid bundle partition: ''"),
    (lambda t: t.put_object({"a/b": b"x"}), ValueError, "invalid bundle buffer name: 'a/b'"),
    (lambda t: t.put_object({"a": b"x"}, chunk_bytes=0), ValueError,
     "chunk_bytes must be positive"),
    (lambda t: t.put_object({"a": "text"}), TypeError, "a must be bytes-like, got str"),
    (lambda t: t.put_object({"a": {"nested": 1}}), TypeError, "a must be bytes-like, got dict"),
    (lambda t: t.put_object(5), TypeError, "value must be bytes-like, got int"),
    (lambda t: t.put_structured_object(StructuredObjectPayload(
        {S.STRUCTURED_FIELD_SPECS_KEY: 1}, {"a": b"x"})), ValueError, "is reserved"),
    (lambda t: StructuredObjectPayload({}), TypeError, "StructuredObjectPayload requires buffers"),
    (lambda t: S.import_dataproto_ref({"type": "mooncake_dataproto_ref", "version": 9}),
     ValueError, "unsupported DataProto ref handle version: 9"),
    (lambda t: S.import_dataproto_ref({"x": 1}), ValueError, "not a Mooncake DataProto ref handle"),
    (lambda t: t.get(t.put({"x": X}, type="dict"), fields=["nope"]), KeyError,
     r"unknown DataProto fields: \['nope'\]"),
    (lambda t: MooncakeBundleTransfer(t.store, key_prefix="//"), ValueError,
     "key_prefix must be a non-empty key prefix"),
    (lambda t: t.put_object({"a": b"x"}, policy=BundleTransferPolicy(max_inflight_put=0)),
     ValueError, "max_inflight_put must be positive"),
    (lambda t: t.get({"not": "a handle"}), TypeError, "expected MooncakeDataProtoRef"),
]


@pytest.mark.parametrize("call, exc, message", BAD_CALLS)
def test_bad_input_raises_like_upstream(transfer, call, exc, message):
    with pytest.raises(exc, match=message):
        call(transfer)


def test_missing_or_corrupt_objects_raise(transfer, store):
    # oracle: a ValueError (JSON decoding of the empty value); ours says what is missing.
    with pytest.raises(ValueError, match="not found"):
        transfer.get_object({"manifest_key": f"{transfer.key_prefix}/default/abc/manifest"})
    ref = transfer.put_object({"a": np.arange(4)})
    bad = json.loads(json.dumps(ref.manifest))
    bad["buffers"]["a"]["key"] = "elsewhere/a"
    with pytest.raises(ValueError, match="outside the bundle namespace"):
        transfer.get_object({"manifest_key": ref.manifest_key, "manifest": bad})
    bad = json.loads(json.dumps(ref.manifest))
    bad["buffers"]["a"]["bytes"] = 99
    with pytest.raises(ValueError, match="chunks total 32 bytes, expected 99"):
        transfer.get_object({"manifest_key": ref.manifest_key, "manifest": bad})
    handle = export_dataproto_ref(transfer.put({"x": X, "s": ["a", "b"]}, type="dict"))
    handle["encoded_non_tensor"]["s"]["rows"] = 5
    with pytest.raises(ValueError, match="offsets length 3 does not match rows 5"):
        transfer.get(handle, type="dict")
    handle = export_dataproto_ref(transfer.put({"x": X}, type="dict"))
    handle["field_index"]["x"]["stage"] = "ghost"
    with pytest.raises(ValueError, match="unknown stage 'ghost'"):
        import_dataproto_ref(handle)


class CallerBuffer:
    """A buffer of this process registered with the store (as a BufferPool's would be)."""

    def __init__(self, store, size):
        import ctypes

        self.store = store
        self.buf = (ctypes.c_char * size)()
        self.ptr = ctypes.addressof(self.buf)
        self.size = size
        assert store.register_buffer(self.ptr, size) == 0

    def write(self, data, at=0):
        import ctypes

        ctypes.memmove(self.ptr + at, data, len(data))

    def read(self, n, at=0):
        import ctypes

        return ctypes.string_at(self.ptr + at, n)

    def close(self):
        self.store.unregister_buffer(self.ptr)


def test_tensor_object_buffers_raw_destinations_and_zero_copy(store, transfer):
    from mooncake import _tensor

    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    header = _tensor._serialize_tensor(t)[0]
    blob = bytes(header) + t.numpy().tobytes()
    src, dst = CallerBuffer(store, 4096), CallerBuffer(store, 4096)
    try:
        src.write(blob)
        obj = S.tensor_object_buffer(src.ptr, len(blob), owner=src, batch_size=3)
        assert len(obj) == 3
        with pytest.raises(TypeError, match="requires batch_size"):
            len(S.tensor_object_buffer(src.ptr, len(blob)))
        # Stored as is (put_from); upstream's field spec for it names only the encoding.
        ref = transfer.put_object({"w": obj, "a": np.arange(10, dtype=np.float32)})
        assert ref.manifest["buffers"]["w"] == {
            "key": ref.manifest["buffers"]["w"]["key"], "bytes": len(blob),
            "chunks": [{"key": ref.manifest["buffers"]["w"]["key"], "bytes": len(blob)}]}
        got = transfer.get_object(ref)
        assert same(got["w"], t) and same(got["a"], np.arange(10, dtype=np.float32))

        # Reads into caller memory: a tensor member as its tensor object, an ndarray member
        # as its C-order bytes (returned as an array over that memory).
        spec = transfer.read_spec(ref)
        out = transfer.materialize_into(spec, {
            "w": S.tensor_object_buffer(dst.ptr, 2048),
            "a": S.raw_destination(dst.ptr + 2048, 40)})
        assert out.objects["w"].ptr == dst.ptr
        assert same(_tensor._deserialize_tensor(dst.read(len(blob))), t)
        assert same(out.objects["a"], np.arange(10, dtype=np.float32))
        assert dst.read(40, 2048) == np.arange(10, dtype=np.float32).tobytes()
        # A tensor_object_buffer member records no shape, so it cannot be sliced (oracle);
        # a tensor member can, its rows read into caller memory.
        sliced = spec.select_members(["w"]).slice_member("w", 0, 1, 3)
        with pytest.raises(ValueError, match="tensor field w is missing slice metadata"):
            transfer.materialize_into(sliced, {"w": S.raw_destination(dst.ptr, 2048)})
        plain = transfer.read_spec(transfer.put_object({"w": t})).slice_member("w", 0, 1, 3)
        transfer.materialize_into(plain, {"w": S.raw_destination(dst.ptr, 2048)})
        assert same(_tensor._deserialize_tensor(dst.read(_tensor._HEADER_BYTES + 32)), t[1:3])

        # Bad memory and sizes are errors, never a write to an unchecked address.
        with pytest.raises(ValueError, match="raw destination has 8 bytes, expected at least 40"):
            transfer.materialize_into(spec, {"a": S.raw_destination(dst.ptr, 8)})
        with pytest.raises(ValueError, match="tensor destination has 16 bytes"):
            transfer.materialize_into(spec, {"w": S.raw_destination(dst.ptr, 16)})
        with pytest.raises(ValueError, match="not writable memory of this process"):
            transfer.materialize_into(spec, {"a": S.raw_destination(8, 40)})
        with pytest.raises(ValueError, match="not registered or mapped memory"):
            transfer.put_object({"w": S.tensor_object_buffer(8, len(blob))})
        with pytest.raises(ValueError, match="invalid tensor object"):
            transfer.put_object({"w": S.tensor_object_buffer(src.ptr, len(blob) + 8)})

        # copy_mode="zero_copy": tensor members must be tensor-object buffers (upstream's
        # errors); other members cannot go zero-copy.
        zc = BundleTransferPolicy(copy_mode="zero_copy")
        ref = transfer.put_object({"w": obj}, policy=zc)
        assert same(transfer.get_object(ref)["w"], t)
        with pytest.raises(ValueError, match="require a BufferPool tensor-object buffer"):
            transfer.put_object({"t": t}, policy=zc)
        with pytest.raises(RuntimeError, match="zero-copy put requires tensor-object buffers"):
            transfer.put_object({"a": b"x"}, policy=zc)
    finally:
        src.close()
        dst.close()


def test_unsupported_calls_fail_loudly(transfer):
    # oracle: a strided nested tensor is refused outright.
    with pytest.warns(UserWarning):
        strided = torch.nested.nested_tensor([torch.ones(1), torch.ones(2)])
    with pytest.raises(ValueError, match="require torch.jagged layout"):
        transfer.put_object({"n": strided})


# -- the msgpack_ragged codec ------------------------------------------------------------------

# oracle: msgpack.packb(value, use_bin_type=True, strict_types=True), hex or sha256 prefix
MSGPACK_GOLDEN = [
    ("None", "c0"), ("True", "c3"), ("False", "c2"), ("0", "00"), ("127", "7f"),
    ("128", "cc80"), ("255", "ccff"), ("256", "cd0100"), ("65535", "cdffff"),
    ("65536", "ce00010000"), ("2**32", "cf0000000100000000"),
    ("2**64-1", "cfffffffffffffffff"), ("-1", "ff"), ("-32", "e0"), ("-33", "d0df"),
    ("-128", "d080"), ("-129", "d1ff7f"), ("-32768", "d18000"), ("-32769", "d2ffff7fff"),
    ("-2**31-1", "d3ffffffff7fffffff"), ("-2**63", "d38000000000000000"),
    ("1.5", "cb3ff8000000000000"), ("-0.0", "cb8000000000000000"), ("''", "a0"),
    ("'a'*31", "bf" + "61" * 31), ("'a'*32", "d920" + "61" * 32),
    ("'é'*200", "sha:6a4e2bb75ec4b862"), ("'x'*70000", "sha:12bdcd2e71cb7a46"),
    ("b''", "c400"), ("b'x'*256", "sha:421ae269cef68324"), ("bytearray(b'ab')", "c4026162"),
    ("[1, [2, {}]]", "9201920280"), ("list(range(16))", "dc0010000102030405060708090a0b0c0d0e0f"),
    ("{'k%d' % i: i for i in range(16)}", "sha:899f8c4a62219340"),
    ("{'a': None, 'b': [True, 1.25, b'z', 'é']}",
     "82a161c0a16294c3cb3ff4000000000000c4017aa2c3a9"),
    ("[[]] * 70000", "sha:e49ac4fa7cd306e1"),
]


def msgpack_row(value):
    """One row through the msgpack_ragged codec: its packed bytes (a None row stores none)."""
    payload, meta = S._encode_msgpack_ragged_values("c", [value])
    assert meta == {}
    assert list(payload["offsets"]) == [0, len(payload["data"])]
    return bytes(payload["data"]) if not payload["nulls"][0] else None


@pytest.mark.parametrize("expr, expect", MSGPACK_GOLDEN)
def test_msgpack_bytes_match_upstream(expr, expect):
    value = eval(expr)
    packed = msgpack_row([value])[1:] if value is None else msgpack_row(value)
    got = packed.hex() if not expect.startswith("sha:") else \
        "sha:" + hashlib.sha256(packed).hexdigest()[:16]
    assert got == expect
    if value is None:
        return
    payload, _ = S._encode_msgpack_ragged_values("c", [value, None])
    back = S._decode_msgpack_ragged_values(payload, 2)
    assert back == [bytes(value) if isinstance(value, bytearray) else value, None]


def test_msgpack_codec_refuses_what_upstream_refuses():
    # strict_types, as upstream: a tuple is not a list.
    with pytest.raises(ValueError, match="msgpack codec cannot encode value"):
        S._encode_msgpack_ragged_values("c", [(1, 2)])


def test_msgpack_decoder_rejects_damaged_input():
    rng = random.Random(14)
    samples = [msgpack_row(eval(e)) for e, _ in MSGPACK_GOLDEN if e != "None"]
    samples = [b for b in samples if len(b) < 4096]

    def decode(blob, rows=1):
        offsets = np.asarray([0] * rows + [len(blob)], dtype=np.int64)
        payload = {"data": bytes(blob), "offsets": offsets, "nulls": np.zeros(rows, np.bool_)}
        return S._decode_msgpack_ragged_values(payload, rows)

    for _ in range(3000):
        blob = bytearray(rng.choice(samples))
        op = rng.randrange(3)
        if op == 0 and blob:
            del blob[rng.randrange(len(blob)):]
        elif op == 1 and blob:
            blob[rng.randrange(len(blob))] = rng.randrange(256)
        else:
            blob += bytes(rng.randrange(256) for _ in range(rng.randrange(1, 8)))
        try:
            decode(blob)
        except ValueError:
            pass
    # A reserved type byte, a forged array count, an int map key, bad UTF-8, deep nesting.
    for bad in [b"\xc1", b"\xdd\xff\xff\xff\xff", b"\x81\x01\x02", b"\xa2\xff\xfe",
                b"\x91" * 2000 + b"\xc0"]:
        with pytest.raises(ValueError, match="msgpack_ragged payload is corrupt"):
            decode(bad)
    with pytest.raises(ValueError, match="decoded 2 rows, expected 1"):
        decode(b"\xc0\xc0")


# -- damaged payloads --------------------------------------------------------------------------


def test_column_decoders_reject_damaged_payloads():
    """Every codec's decoder, fed its own payload with one member damaged, either decodes or
    raises ValueError: never another exception, a crash or a hang."""
    rng = random.Random(1414)
    samples = [v for k, v in columns().items() if k not in ("x", "ids")]
    samples.append([{"a": [{"v": np.arange(3)}, None]}, None, {"a": []}])
    encoded = []
    for rows in samples:
        enc = S._encode_structured_non_tensor_field("non_tensor_batch.c",
                                                     S._object_array_from_decoded_values(rows))
        payload = {}
        for name, value in enc.payload.items():
            if isinstance(value, np.ndarray):
                payload[name] = value
            else:
                payload[name] = bytes(value)
        meta = json.loads(json.dumps(enc.metadata))
        encoded.append(({"codec": enc.codec, "metadata": meta}, payload, enc.rows))
    tried = 0
    for _ in range(4000):
        enc, payload, rows = rng.choice(encoded)
        damaged = dict(payload)
        name = rng.choice(sorted(damaged))
        value = damaged[name]
        op = rng.randrange(4)
        if isinstance(value, bytes):
            blob = bytearray(value)
            if op == 0 and blob:
                del blob[rng.randrange(len(blob)):]
            elif blob:
                blob[rng.randrange(len(blob))] = rng.randrange(256)
            else:
                blob += b"\xc1"
            damaged[name] = bytes(blob)
        elif op == 0:
            damaged[name] = value[: rng.randrange(len(value) + 1)]
        elif op == 1 and value.size:
            flat = value.copy().reshape(-1)
            if flat.dtype == np.bool_:
                pick = not flat[0]
            elif flat.dtype.kind in "iu":
                info = np.iinfo(flat.dtype)
                pick = rng.choice([max(info.min, -1), 0, 1, 7, info.max])
            else:
                pick = rng.choice([-1.0, 0.5, 1e30, float("nan")])
            flat[rng.randrange(flat.size)] = pick
            damaged[name] = flat.reshape(value.shape)
        elif op == 2:
            damaged[name] = np.zeros(rng.randrange(6), dtype=value.dtype)
        else:
            rows = rng.randrange(6)
        try:
            S._decode_structured_non_tensor_encoded(enc, damaged, rows)
        except ValueError:
            pass
        tried += 1
    assert tried == 4000


def test_write_config_and_storage_group(transfer):
    from mooncake.store import ReplicateConfig

    config = ReplicateConfig()
    config.replica_num = 1
    ref = transfer.put_object({"a": torch.ones(2), "b": b"x"}, config=config)
    assert same(torch.ones(2), transfer.get_object(ref)["a"])
    config.group_ids = ["g-1"]
    dp = transfer.put({"x": torch.ones(2), "s": ["p", "q"]}, type="dict", config=config)
    assert export_dataproto_ref(dp)[S.STORAGE_GROUP_ID] == "g-1"
    assert config.group_ids == ["g-1"]  # the caller's config is not modified
    more = transfer.append_dataproto_fields(dp, {"batch": {"y": torch.zeros(2)}}, stage="s")
    assert more._storage_group_id == "g-1"
    assert transfer.get(more, type="dict")["s"] == ["p", "q"]
    config.group_ids = ["g-1", "g-2"]
    with pytest.raises(ValueError, match="exactly one logical group id"):
        transfer.put({"x": torch.ones(2)}, type="dict", config=config)
    config.group_ids = ["other"]
    with pytest.raises(ValueError, match="conflicts with the DataProto storage group"):
        transfer.append_dataproto_fields(more, {"batch": {"z": torch.zeros(2)}}, stage="s",
                                         config=config)
    transfer.cleanup_dataproto(more)
