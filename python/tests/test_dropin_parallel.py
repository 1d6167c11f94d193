"""Unified parallel tensor IO (`*_tensor_with_parallelism*`), `put_tensor_with_tp_from` and
the safetensors export/import. Every expected key, size, header field and tensor is what
upstream's 0.3.13.post1 wheel produced for the same calls against its own master (this file
passes unchanged on that wheel, with `safetensors` installed there)."""

import ctypes
import struct

import pytest

from conftest import lease_wait

torch = pytest.importorskip("torch")

from mooncake.store import ParallelAxis, ReadTarget, TensorParallelism  # noqa: E402

INVALID = -600
T = torch.arange(24, dtype=torch.float32).reshape(4, 6)


def ax(kind, rank, size, sd=None, eid=None, sid=None):
    a = ParallelAxis()
    a.kind, a.rank, a.size = kind, rank, size
    a.split_dim, a.expert_id, a.stage_id = sd, eid, sid
    return a


def par(*axes):
    p = TensorParallelism()
    p.axes = list(axes)
    return p


def target(mode, p=None):
    t = ReadTarget()
    t.mode = mode
    t.parallelism = p
    return t


def header(store, key):
    """(layout kind, global shape, local shape, axes) of a stored tensor object."""
    b = store.get(key)
    _m, _v, _hs, _dt, nd, lk = struct.unpack_from("<IHHiiI", b, 0)
    g = struct.unpack_from("<8q", b, 40)[:nd]
    local = struct.unpack_from("<8q", b, 104)[:nd]
    (count,) = struct.unpack_from("<I", b, 168)
    axes = [struct.unpack_from("<6iq", b, 176 + 32 * i) for i in range(count)]
    return lk, g, local, axes


def manifest(store, key):
    """(dtype, ndim, split_dim, shard count, global shape) of a 96-byte manifest."""
    b = store.get(key)
    assert len(b) == 96
    magic, ver, hs, dt, nd, sd, count, _r = struct.unpack_from("<IHHiiiii", b, 0)
    assert (magic, ver, hs) == (0x574D414E, 1, 96)
    dims = struct.unpack_from("<8q", b, 32)
    assert all(d == -1 for d in dims[nd:])
    return dt, nd, sd, count, dims[:nd]


def test_classes():
    a = ParallelAxis()
    assert (a.kind, a.rank, a.size, a.split_dim, a.expert_id, a.stage_id) == \
        ("", 0, 1, None, None, None)
    r = ReadTarget()
    assert (r.mode, r.parallelism) == ("as_stored", None)
    with pytest.raises(RuntimeError, match="Unsupported ReadTarget mode"):
        r.mode = "bad"
    assert TensorParallelism().axes == []


def test_plain_put_without_layout(store):
    assert store.put_tensor_with_parallelism("pl_none", T) == 0
    assert torch.equal(store.get_tensor_with_parallelism("pl_none"), T)


def test_single_tp_axis_stores_the_callers_shard(store):
    assert store.put_tensor_with_parallelism("pl_tp", T, par(ax("tp", 1, 2, 1))) == 0
    assert [store.is_exist(k) for k in ("pl_tp", "pl_tp_tp_0", "pl_tp_tp_1")] == [0, 0, 1]
    assert store.get_size("pl_tp_tp_1") == 400
    assert header(store, "pl_tp_tp_1") == (1, (4, 12), (4, 6), [(1, 0, 1, 2, 1, 0, 6)])
    assert manifest(store, "pl_tp__parallelism_manifest") == (0, 2, 1, 2, (4, 12))
    assert torch.equal(store.get_tensor("pl_tp_tp_1"), T)
    # Reads: as stored (no plain object), the stored shard, a missing shard, the full tensor.
    assert store.get_tensor_with_parallelism("pl_tp") is None
    assert torch.equal(
        store.get_tensor_with_parallelism("pl_tp", target("shard", par(ax("tp", 1, 2, 1)))), T)
    assert store.get_tensor_with_parallelism(
        "pl_tp", target("shard", par(ax("tp", 0, 2, 1)))) is None
    assert store.get_tensor_with_parallelism("pl_tp", target("full")) is None
    assert store.get_tensor_with_parallelism(
        "pl_tp", target("as_stored", par(ax("tp", 1, 2, 1)))) is None
    # Upper-case kinds are accepted; the split along dim 0 doubles dim 0.
    assert store.put_tensor_with_parallelism("pl_tp7", T, par(ax("TP", 1, 2, 0))) == 0
    assert header(store, "pl_tp7_tp_1") == (1, (8, 6), (4, 6), [(1, 0, 1, 2, 0, 0, 4)])
    assert manifest(store, "pl_tp7__parallelism_manifest") == (0, 2, 0, 2, (8, 6))


def test_axis_checks(store):
    assert store.put_tensor_with_parallelism("pl_bad1", T, par(ax("tp", 1, 2))) == INVALID
    assert store.put_tensor_with_parallelism("pl_bad2", T, par(ax("dp", 1, 2, 0))) == INVALID
    assert store.put_tensor_with_parallelism("pl_dp", T, par(ax("dp", 1, 2))) == 0
    assert store.is_exist("pl_dp__dp_1of2") == 1
    assert store.is_exist("pl_dp__parallelism_manifest") == 0
    assert header(store, "pl_dp__dp_1of2") == (1, (4, 6), (4, 6), [(0, 0, 1, 2, -1, 0, 0)])


def test_multi_axis_cuts_the_global_tensor(store):
    p = par(ax("tp", 1, 3, 1), ax("dp", 0, 2))
    assert store.put_tensor_with_parallelism("pl_m", T, p) == 0
    assert store.is_exist("pl_m__dp_0of2__tp_1of3_sd1") == 1
    assert store.get_size("pl_m__dp_0of2__tp_1of3_sd1") == 336
    assert store.is_exist("pl_m__tp_1of3_sd1__dp_0of2") == 0
    got = store.get_tensor_with_parallelism("pl_m", target("shard", p))
    assert torch.equal(got, T[:, 2:4])
    assert store.get_tensor_with_parallelism("pl_m", target("full")) is None
    p5 = par(ax("pp", 0, 2, None, None, 3), ax("ep", 1, 2, None, 5), ax("tp", 0, 2, 1),
             ax("dp", 0, 1))
    assert store.put_tensor_with_parallelism("pl_c5", T, p5) == 0
    key = "pl_c5__dp_0of1__tp_0of2_sd1__ep_1of2_eid5__pp_0of2_sid3"
    assert header(store, key) == (1, (4, 6), (4, 3), [
        (3, 0, 0, 2, -1, 3, 0), (2, 1, 1, 2, -1, 5, 0), (1, 2, 0, 2, 1, 0, 3),
        (0, 3, 0, 1, -1, 0, 0)])
    assert manifest(store, "pl_c5__parallelism_manifest") == (0, 2, 1, 2, (4, 6))


class Writer:
    def __init__(self, rank, size, split_dim):
        self.rank, self.size, self.split_dim = rank, size, split_dim


def test_writer_partition(store):
    assert store.put_tensor_with_parallelism("pl_wq", T[:2], writer_partition=Writer(0, 2, 0)) == 0
    assert store.put_tensor_with_parallelism(
        "pl_w2", T, writer_partition={"rank": 1, "size": 2, "split_dim": 0}) == INVALID
    assert store.is_exist("pl_wq__writer_0of2_sd0") == 1
    assert store.is_exist("pl_wq__writer_1of2_sd0") == 0
    assert header(store, "pl_wq__writer_0of2_sd0") == (1, (2, 6), (1, 6), [(1, 0, 0, 2, 0, 0, 1)])
    assert manifest(store, "pl_wq__writer_manifest") == (0, 2, 0, 2, (2, 6))
    assert store.get_tensor_with_parallelism("pl_wq") is None
    assert store.get_tensor_with_parallelism("pl_wq", target("full")) is None
    assert store.get_tensor_with_parallelism(
        "pl_wq", target("shard", par(ax("tp", 1, 4, 1)))) is None
    got = store.get_tensor_with_parallelism("pl_wq", target("shard", par(ax("tp", 0, 2, 0))))
    assert torch.equal(got, T[:1])
    # Once the second writer lands, the full tensor reassembles.
    assert store.put_tensor_with_parallelism("pl_wq", T[:2], writer_partition=Writer(1, 2, 0)) == 0
    assert torch.equal(store.get_tensor_with_parallelism("pl_wq", target("full")), T[:2])
    assert store.get_tensor_with_parallelism("pl_wq", target("full", par(ax("tp", 1, 2, 0)))) \
        is None
    # Along dim 1: a request that straddles two writers is not served.
    assert store.put_tensor_with_parallelism("pl_w1", T, writer_partition=Writer(0, 2, 1)) == 0
    assert store.put_tensor_with_parallelism("pl_w1", T, writer_partition=Writer(1, 2, 1)) == 0
    assert torch.equal(store.get_tensor_with_parallelism("pl_w1", target("full")), T)
    assert store.get_tensor_with_parallelism(
        "pl_w1", target("shard", par(ax("tp", 1, 3, 1)))) is None
    assert store.get_tensor_with_parallelism(
        "pl_w1", target("shard", par(ax("tp", 1, 2, 0)))) is None
    assert store.put_tensor_with_parallelism("pl_wu", T, writer_partition=Writer(0, 4, 1)) \
        == INVALID
    assert store.put_tensor_with_parallelism(
        "pl_wb", T, par(ax("tp", 0, 2, 1)), writer_partition=Writer(0, 2, 1)) == INVALID
    # A plain object: `full` reads it, `shard` finds no shard.
    assert store.put_tensor("pl_plain", T) == 0
    assert torch.equal(store.get_tensor_with_parallelism("pl_plain", target("full")), T)
    assert store.get_tensor_with_parallelism(
        "pl_plain", target("shard", par(ax("tp", 1, 2, 0)))) is None


def test_batch_and_into_forms(store):
    keys = ["pl_b1", "pl_b2"]
    assert store.batch_put_tensor_with_parallelism(
        keys, [T, T], [par(ax("tp", 0, 2, 1)), par(ax("tp", 1, 2, 1))]) == [0, 0]
    assert store.batch_put_tensor_with_parallelism(keys, [T], None) == [INVALID, INVALID]
    assert store.batch_get_tensor_with_parallelism(["pl_b1", "b"], [target("full")]) \
        == [None, None]
    assert store.batch_upsert_tensor_with_parallelism(
        ["pl_b1"], [T + 1], [par(ax("tp", 1, 2, 1))]) == [0]
    # `full` reassembles writer partitions only; TP shards come back through `shard`.
    assert store.get_tensor_with_parallelism("pl_b1", target("full")) is None
    both = store.get_tensor_with_parallelism("pl_b1", target("shard", par(ax("tp", 0, 1, 1))))
    assert torch.equal(both, torch.cat([T, T + 1], dim=1))
    quarter = store.get_tensor_with_parallelism("pl_b1", target("shard", par(ax("tp", 1, 4, 1))))
    assert torch.equal(quarter, T[:, 3:])
    # A split along another dim falls back to the exact shard key.
    other = store.get_tensor_with_parallelism("pl_b1", target("shard", par(ax("tp", 0, 2, 0))))
    assert torch.equal(other, T)
    assert store.get_tensor_with_parallelism("pl_b1", target("shard")) is None
    assert store.get_tensor_with_parallelism("pl_b1", target("shard", par(ax("dp", 0, 2)))) \
        is None
    n = 1 << 16
    buf = (ctypes.c_ubyte * n)()
    p = ctypes.addressof(buf)
    assert store.register_buffer(p, n) == 0
    assert store.get_tensor_with_parallelism_into("pl_b1", p, n, target("full")) is None
    got = store.get_tensor_with_parallelism_into(
        "pl_b1", p, n, target("shard", par(ax("tp", 1, 4, 1))))
    assert torch.equal(got, T[:, 3:])
    got = store.batch_get_tensor_with_parallelism_into(
        ["pl_b1"], [p], [n], [target("shard", par(ax("tp", 1, 2, 1)))])
    assert torch.equal(got[0], T + 1)
    assert store.get_tensor_with_parallelism_into("pl_b1", p, n) is None
    # `_from`: the buffer holds a tensor object.
    assert store.put_tensor("pl_src", T) == 0
    size = store.get_into("pl_src", p, n)
    assert store.put_tensor_with_parallelism_from("pl_f", p, size, par(ax("tp", 1, 2, 1))) == 0
    # Unlike the tensor form, `_from` takes the buffer as the global tensor and cuts rank 1.
    assert torch.equal(store.get_tensor("pl_f_tp_1"), T[:, 3:])
    assert store.get_size("pl_f_tp_1") == 352
    assert store.put_tensor_with_parallelism_from("pl_f2", p, 10) == INVALID
    lease_wait()
    assert store.unregister_buffer(p) == 0


def test_put_tensor_with_tp_from(store):
    n = 1 << 16
    buf = (ctypes.c_ubyte * n)()
    p = ctypes.addressof(buf)
    assert store.register_buffer(p, n) == 0
    assert store.put_tensor("tf_src", T) == 0
    size = store.get_into("tf_src", p, n)
    assert store.put_tensor_with_tp_from("tf", p, size, tp_rank=0, tp_size=2, split_dim=1) == 0
    assert torch.equal(store.get_tensor("tf_tp_1"), T[:, 3:])
    assert store.is_exist("tf") == 0
    assert store.put_tensor_with_tp_from("tf1", p, size) == 0
    assert store.is_exist("tf1") == 1
    assert store.put_tensor_with_tp_from("tf2", p, size, tp_size=5, split_dim=1) == INVALID
    assert store.put_tensor_with_tp_from("tf3", p, 10, tp_size=2) == INVALID
    assert store.batch_put_tensor_with_tp_from(["tb1", "tb2"], [p, p], [size, size],
                                               tp_size=2) == [0, 0]
    assert store.batch_put_tensor_with_tp_from([], [], []) == []
    assert store.batch_put_tensor_with_tp_from(["x"], [p, p], [size]) == [INVALID]
    lease_wait()
    assert store.unregister_buffer(p) == 0


def test_safetensors(store, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert store.save_tensor_to_safetensor("st_missing") == -1100
    assert store.put("st_bytes", b"abc") == 0
    assert store.save_tensor_to_safetensor("st_bytes") == -1100
    t = torch.arange(6, dtype=torch.int16).reshape(2, 3)
    assert store.put_tensor("st1", t) == 0
    assert store.save_tensor_to_safetensor("st1") == 0
    assert (tmp_path / "st1").exists()
    path = str(tmp_path / "st1.safetensors")
    assert store.save_tensor_to_safetensor("st1", path) == 0
    # Byte for byte the file upstream (safetensors.torch.save_file) wrote.
    assert open(path, "rb").read() == (
        b'@\x00\x00\x00\x00\x00\x00\x00{"st1":{"dtype":"I16","shape":[2,3],'
        b'"data_offsets":[0,12]}}     \x00\x00\x01\x00\x02\x00\x03\x00\x04\x00\x05\x00')
    assert torch.equal(store.load_tensor_from_safetensor(file_name=path), t)
    assert store.is_exist(path) == 1
    assert torch.equal(store.load_tensor_from_safetensor("st_other", path), t)
    assert torch.equal(store.get_tensor("st_other"), t)
    assert store.load_tensor_from_safetensor("x", str(tmp_path / "nope")) is None
    with pytest.raises(TypeError):
        store.load_tensor_from_safetensor("x")
    for dtype in (torch.bfloat16, torch.bool, torch.float64, torch.uint8):
        v = torch.ones(3, 2).to(dtype)
        assert store.put_tensor(f"st_{dtype}", v) == 0
        p = str(tmp_path / f"{dtype}.st")
        assert store.save_tensor_to_safetensor(f"st_{dtype}", p) == 0
        assert torch.equal(store.load_tensor_from_safetensor(f"st_{dtype}_back", p), v)


def test_cuda_entry_points_refuse(store):
    assert store.get_tensor_into_cuda("st1", torch.zeros(4)) == INVALID
    assert store.batch_get_tensor_into_cuda(["a", "b"], [torch.zeros(4)] * 2) == [INVALID] * 2
