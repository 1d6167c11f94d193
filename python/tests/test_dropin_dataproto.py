"""mooncake.dataproto_catalog: the catalog of logical rows and the transfer that stores DataProto
fragments on a real master + storage node and publishes them. Expected results are what
upstream's 0.3.13.post1 module returned for the same sequence of calls (recorded; the oracle is
not needed at run time)."""

import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from mooncake.dataproto_catalog import DataProtoCatalog, DataProtoCatalogTransfer  # noqa: E402
from mooncake.structured_object_store import (  # noqa: E402
    MooncakeBundleTransfer,
    export_dataproto_ref,
    import_dataproto_ref,
)

_prefixes = itertools.count()


class DataProto:
    def __init__(self, batch, non_tensor_batch=None, meta_info=None):
        self.batch = batch
        self.non_tensor_batch = non_tensor_batch or {}
        self.meta_info = meta_info or {}

    def __len__(self):
        return len(next(iter(self.batch.values())))


@pytest.fixture
def setup(store):
    transfer = MooncakeBundleTransfer(store, key_prefix=f"cat{next(_prefixes)}")
    catalog = DataProtoCatalog()
    calls = []

    def call(method, *args, **kwargs):
        calls.append(method)
        return getattr(catalog, method)(*args, **kwargs)

    return transfer, catalog, DataProtoCatalogTransfer(transfer, call), calls


def keys_of(transfer, handle):
    """Every store key a handle's stages hold, cleanup keys of merged manifests included."""
    keys = []
    for stage_ref in import_dataproto_ref(handle).stage_refs.values():
        manifest = transfer._bundles.resolve(stage_ref)
        keys.append(stage_ref.manifest_key)
        for spec in [manifest["meta"], *manifest["buffers"].values()]:
            keys += [c["key"] for c in spec["chunks"]]
        keys += manifest.get("cleanup_keys", [])
    return keys


def test_put_resolve_append_remove_and_retire(setup, store):
    transfer, catalog, ct, calls = setup
    d1 = DataProto({"x": torch.arange(4.0).reshape(2, 2)},
                   {"s": np.array(["a", "b"], dtype=object)}, {"m": 1})
    # oracle results, call by call
    assert ct.put(d1, partition="p", keys=["k1", "k2"], tags=[{"t": 1}, {"t": 2}]) == {
        "keys": ["k1", "k2"], "tags": [{"t": 1}, {"t": 2}], "fields": ["x", "s"],
        "retired_handles": []}
    assert calls == ["publish", "ack_publication"]
    assert ct.list() == {"p": {"k1": {"t": 1}, "k2": {"t": 2}}}
    assert ct.put(None, partition="p", keys=["k3"], tags=[{"z": 1}]) == {
        "keys": ["k3"], "tags": [{"z": 1}], "fields": [], "retired_handles": []}
    res = ct.resolve("p", ["k2", "k1"])
    (fid, handle), = res["handles"].items()
    assert fid == handle["stage_refs"]["default"]["manifest_key"]
    assert res["keys"] == ["k2", "k1"] and res["tags"] == [{"t": 2}, {"t": 1}]
    assert res["fields"] == ["x", "s"] and res["meta_info"] == {"m": 1}
    assert res["field_groups"] == [{"fields": ["x", "s"], "locations": [(fid, 1), (fid, 0)]}]
    assert res["read_token"] == 1
    with pytest.raises(ValueError, match="requested keys do not contain any fields"):
        ct.resolve("p", ["k3"])
    with pytest.raises(ValueError, match=r"keys were not found in partition 'p': \['zz'\]"):
        ct.resolve("p", ["zz"])
    first_keys = keys_of(transfer, handle)

    d2 = DataProto({"y": torch.ones(2)}, {"n": np.array([{"a": 1}, None], dtype=object)})
    assert ct.append(fid, handle, d2, partition="p", keys=["k1", "k2"], stage="default") == {
        "keys": ["k1", "k2"], "tags": [{"t": 1}, {"t": 2}], "fields": ["x", "s", "y", "n"],
        "retired_handles": []}
    with pytest.raises(ValueError, match="stale DataProto append handle"):
        ct.append(fid, handle, d2, partition="p", keys=["k1", "k2"], stage="s2")
    res2 = ct.resolve("p", ["k1", "k2"], ["x", "y", "n"])
    assert res2["field_groups"] == [
        {"fields": ["x", "y", "n"], "locations": [(fid, 0), (fid, 1)]}]
    handle2 = res2["handles"][fid]
    assert handle2["stage_refs"]["default"]["manifest_key"] != fid
    got = transfer.get(handle2, type="dict")
    assert list(got) == ["m", "x", "y", "s", "n"]
    assert torch.equal(got["x"], d1.batch["x"]) and torch.equal(got["y"], torch.ones(2))
    assert got["s"] == ["a", "b"] and got["n"] == [{"a": 1}, None]
    # The merged manifest lists, among its cleanup keys, the intermediate manifest the append
    # wrote and dropped at once (as upstream does): only what is on the store is checked.
    all_keys = [k for k in set(first_keys) | set(keys_of(transfer, handle2))
                if store.is_exist(k) == 1]
    assert fid in all_keys and handle2["stage_refs"]["default"]["manifest_key"] in all_keys
    assert len(all_keys) >= 11

    # Removing the keys while reads are pinned keeps every stored object.
    assert ct.remove("p", ["k1", "k2"]) is None
    assert [k for k in all_keys if store.is_exist(k) != 1] == []
    ct.release_read(res["read_token"])
    assert [k for k in all_keys if store.is_exist(k) != 1] == []
    # The last reader gone: the fragment retires, its objects are removed and acknowledged.
    ct.release_read(res2["read_token"])
    assert [k for k in all_keys if store.is_exist(k) != 0] == []
    assert calls[-2:] == ["release_read", "ack_retired"]
    assert catalog.release_read(res2["read_token"]) == {"retired_handles": []}
    assert ct.list("p") == {"p": {"k3": {"z": 1}}}
    assert ct.list("other") == {}
    ct.drain()
    with pytest.raises(RuntimeError, match="DataProto catalog is drained"):
        catalog.update("p", ["a"], tags=[{}])
    ct.close()


def test_overwritten_and_removed_fragments_are_deleted(setup, store):
    transfer, catalog, ct, _calls = setup
    ct.put(DataProto({"x": torch.zeros(2)}), partition="q", keys=["a", "b"])
    h1 = next(iter(ct.resolve("q", ["a"])["handles"].values()))
    catalog.release_read(2 - 1)
    k1 = keys_of(transfer, h1)
    # A second fragment taking both rows' only field retires the first one.
    ct.put(DataProto({"x": torch.ones(2)}), partition="q", keys=["a", "b"])
    assert [k for k in k1 if store.is_exist(k) != 0] == []
    res = ct.resolve("q", ["b", "a"])
    h2 = next(iter(res["handles"].values()))
    ct.release_read(res["read_token"])
    assert torch.equal(transfer.get(h2, type="dict")["x"], torch.ones(2))
    k2 = keys_of(transfer, h2)
    ct.remove("q", ["a"])
    assert all(store.is_exist(k) == 1 for k in k2)
    ct.remove("q", ["b"])
    assert [k for k in k2 if store.is_exist(k) != 0] == []
    assert ct.list() == {}


def test_drain_retires_every_managed_fragment(setup, store):
    transfer, catalog, ct, _calls = setup
    ct.put(DataProto({"x": torch.zeros(3)}), partition="r", keys=["a", "b", "c"])
    res = ct.resolve("r", ["a"])
    keys = keys_of(transfer, next(iter(res["handles"].values())))
    with pytest.raises(RuntimeError, match="with 1 active read"):
        ct.drain()
    ct.release_read(res["read_token"])
    ct.drain()
    assert [k for k in keys if store.is_exist(k) != 0] == []
    with pytest.raises(RuntimeError, match="drained"):
        ct.put(DataProto({"x": torch.zeros(1)}), partition="r", keys=["d"])


def test_transfer_checks_its_input(setup):
    transfer, catalog, ct, _calls = setup
    with pytest.raises(ValueError, match="DataProto batch size 2 does not match 3 logical keys"):
        ct.put(DataProto({"x": torch.zeros(2)}), partition="p", keys=["a", "b", "c"])
    with pytest.raises(ValueError, match="catalog update requires tags or DataProto data"):
        ct.put(None, partition="p", keys=["a"])
    with pytest.raises(ValueError, match="partition must be a non-empty string"):
        ct.put(None, partition="", keys=["a"], tags=[{}])
    with pytest.raises(ValueError, match="keys must be unique"):
        ct.put(None, partition="p", keys=["a", "a"], tags=[{}, {}])
    with pytest.raises(ValueError, match="keys must be a sequence of non-empty strings"):
        ct.put(None, partition="p", keys="a", tags=[{}])
    with pytest.raises(TypeError, match="tags must be mappings"):
        ct.put(None, partition="p", keys=["a"], tags=[3])
    ct.put(DataProto({"x": torch.zeros(1)}), partition="p", keys=["a"])
    res = ct.resolve("p", ["a"])
    (fid, handle), = res["handles"].items()
    with pytest.raises(ValueError, match="catalog append does not support overwrite"):
        ct.append(fid, handle, DataProto({"y": torch.zeros(1)}), partition="p", keys=["a"],
                  stage="s", overwrite=True)
    with pytest.raises(ValueError, match="partition does not match"):
        ct.append(fid, handle, DataProto({"y": torch.zeros(1)}), partition="other",
                  keys=["a"], stage="s")
    # An envelope dict counts its rows, not its sections.
    env = {"batch": {"y": torch.zeros(1)}, "non_tensor_batch": {}, "meta_info": {}}
    ct.append(fid, handle, env, partition="p", keys=["a"], stage="s")
    ct.release_read(res["read_token"])


def test_catalog_bookkeeping_without_a_store():
    cat = DataProtoCatalog()

    def handle(key, fields=("x",), rows=2, partition="p"):
        return {"type": "mooncake_dataproto_ref", "version": 1, "kind": "bundle_stages",
                "batch_size": rows, "namespace": "default", "partition": partition,
                "global_indexes": None, "stage_refs": {"default": {"manifest_key": key}},
                "field_index": {f: {"stage": "default", "member": f"batch.{f}",
                                    "section": "batch"} for f in fields},
                "meta_info": {}, "encoded_non_tensor": {}}

    h = handle("m1")
    first = cat.publish("op1", "p", ["a", "b"], handle=h)
    # Publishing the same operation again replays the first answer.
    assert cat.publish("op1", "p", ["zz"], tags=[{}]) == first
    cat.ack_publication("op1")
    with pytest.raises(ValueError, match="management mismatch"):
        cat.update("p", ["a", "b"], handle=h)
    with pytest.raises(ValueError, match="fragment id collision"):
        cat.publish("op2", "p", ["a", "b"], handle=handle("m1", fields=("x", "y")))
    with pytest.raises(ValueError, match="does not match 3 logical keys"):
        cat.update("p", ["a", "b", "c"], handle=handle("m2"))
    with pytest.raises(ValueError, match="exactly one DataProto stage"):
        bad = handle("m3")
        bad["stage_refs"]["other"] = {"manifest_key": "m4"}
        cat.update("p", ["a", "b"], handle=bad)
    with pytest.raises(ValueError, match="field names must be non-empty strings"):
        cat.update("p", ["a", "b"], handle=handle("m5", fields=()))
    # publish_append rejections are recorded per operation and replayed.
    grown = handle("m1b", fields=("x", "y"))
    grown["stage_refs"]["default"]["manifest_key"] = "m1b"
    r = cat.publish_append("opA", "m9", "p", ["a", "b"], previous_handle=h, handle=grown)
    assert r == {"append_rejected": "stale DataProto append handle: 'm9'"}
    assert cat.publish_append("opA", "m1", "p", ["a", "b"], previous_handle=h,
                              handle=grown) == r
    changed = handle("m1c", fields=("y",))
    assert cat.publish_append("opB", "m1", "p", ["a", "b"], previous_handle=h,
                              handle=changed) == {
        "append_rejected": "appended DataProto handle changed existing fields"}
    assert cat.publish_append("opC", "m1", "p", ["a", "b"], previous_handle=h,
                              handle=handle("m1d", rows=3)) == {
        "append_rejected": "appended DataProto handle changed fragment identity"}
    ok = cat.publish_append("opD", "m1", "p", ["a", "b"], previous_handle=h, handle=grown)
    assert ok["fields"] == ["x", "y"] and ok["retired_handles"] == []
    assert cat.resolve("p", ["b"])["field_groups"] == [
        {"fields": ["x", "y"], "locations": [("m1", 1)]}]
    # Unmanaged fragments are forgotten, never handed back for deletion.
    cat.update("p", ["c", "d"], handle=handle("u1"))
    cat.remove("p", ["c"])
    assert cat.remove("p", ["d"]) == {"retired_handles": []}
    retired = cat.remove("p", ["a", "b"])["retired_handles"]
    assert [x["stage_refs"]["default"]["manifest_key"] for x in retired] == ["m1b"]
    with pytest.raises(ValueError, match="retired DataProto fragment mismatch: 'm1'"):
        cat.ack_retired([h])
    assert cat.ack_retired(retired) == {"retired_handles": []}


def test_failed_publication_is_retried_on_the_next_call(setup):
    transfer, catalog, _ct, _calls = setup
    failures = {"publish": 2}

    def flaky(method, *args, **kwargs):
        if failures.get(method):
            failures[method] -= 1
            raise ConnectionError("catalog unreachable")
        return getattr(catalog, method)(*args, **kwargs)

    ct = DataProtoCatalogTransfer(transfer, flaky)
    with pytest.raises(ConnectionError):
        ct.put(DataProto({"x": torch.zeros(1)}), partition="p", keys=["a"])
    assert catalog.list() == {}
    # The next call publishes the pending fragment first.
    ct.put(None, partition="p", keys=["b"], tags=[{"t": 1}])
    assert catalog.list() == {"p": {"a": {}, "b": {"t": 1}}}
    res = ct.resolve("p", ["a"])
    assert torch.equal(transfer.get(next(iter(res["handles"].values())), type="dict")["x"],
                       torch.zeros(1))
    ct.release_read(res["read_token"])
    ct.close()


def test_handles_are_the_structured_store_format(setup):
    transfer, _catalog, ct, _calls = setup
    ct.put(DataProto({"x": torch.zeros(2)}), partition="p", keys=["a", "b"])
    res = ct.resolve("p", ["a", "b"])
    handle = next(iter(res["handles"].values()))
    assert export_dataproto_ref(import_dataproto_ref(handle)) == handle
    ct.release_read(res["read_token"])
