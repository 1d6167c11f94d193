"""Tensor APIs on the upstream 304-byte header, ported from upstream's test_put_get_tensor.py
and extended to every dtype of the format, zero-element tensors and TP shards."""

import ctypes
import os
import struct

import pytest

from conftest import MIB, lease_wait

torch = pytest.importorskip("torch")

from mooncake.store import (  # noqa: E402
    ReplicateConfig,
    _deserialize_tensor,
    _serialize_tensor,
    _tensor_metadata_size,
)

DTYPES = [
    torch.float32, torch.float64, torch.int8, torch.uint8, torch.int16, torch.int32,
    torch.int64, torch.bool, torch.float16, torch.bfloat16,
]
for _name in ("uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2"):
    if hasattr(torch, _name):
        DTYPES.append(getattr(torch, _name))


def sample(dtype, shape=(3, 5)):
    """A tensor of `dtype` with distinct, exactly representable values."""
    t = torch.arange(1, 1 + int(torch.tensor(shape).prod())).reshape(shape) % 7
    if dtype == torch.bool:
        return t % 2 == 0
    return t.to(torch.float32).to(dtype)


def same(a, b):
    assert a is not None
    assert a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape)
    # Compare bytes: works for every dtype, including the float8 ones.
    assert a.contiguous().view(torch.uint8).flatten().tolist() == \
        b.contiguous().view(torch.uint8).flatten().tolist() if a.numel() else True


def test_put_get_tensor_basics(store):
    cases = {
        "test_tensor_float": torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float32),
        "test_tensor_int": torch.tensor([1, 2, 3, 4], dtype=torch.int32),
        "test_tensor_bool": torch.tensor([True, False, False, True]),
        "test_tensor_rand": torch.rand(1000, dtype=torch.float32),
        "test_tensor_2d": torch.tensor([[1.0, 2.0], [3.0, 4.0]]),
        "test_tensor_3d": torch.tensor([[[1, 2], [3, 4]], [[5, 6], [7, 8]]], dtype=torch.int64),
    }
    for key, t in cases.items():
        assert store.put_tensor(key, t) == 0
        got = store.get_tensor(key)
        assert got.dtype == t.dtype and got.shape == t.shape
        assert torch.equal(got, t)
        assert store.get_size(key) == _tensor_metadata_size() + t.numel() * t.element_size()
    assert store.get_tensor("no_such_tensor") is None
    lease_wait()
    for key in cases:
        assert store.remove(key) == 0


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype_round_trips(store, dtype):
    key = f"dtype_{str(dtype).replace('.', '_')}"
    t = sample(dtype)
    assert store.put_tensor(key, t) == 0
    same(store.get_tensor(key), t)
    zero = torch.empty((2, 0, 3), dtype=dtype)
    assert store.put_tensor(key + "_zero", zero) == 0
    same(store.get_tensor(key + "_zero"), zero)


def test_put_get_zero_tensor(store):
    tensors = [
        torch.empty((0,), dtype=torch.float32),
        torch.empty((0, 4096), dtype=torch.float16),
        torch.empty((2, 0, 3), dtype=torch.bfloat16),
        torch.empty((1, 0), dtype=torch.int64),
    ]
    keys = [f"test_zero_tensor_{os.getpid()}_{i}" for i in range(len(tensors))]
    for key, t in zip(keys, tensors):
        assert store.put_tensor(key, t) == 0
        got = store.get_tensor(key)
        assert tuple(got.shape) == tuple(t.shape) and got.dtype == t.dtype and got.numel() == 0
        assert store.get_size(key) == 304
    for t, got in zip(tensors, store.batch_get_tensor(keys)):
        assert tuple(got.shape) == tuple(t.shape) and got.dtype == t.dtype


def test_scalar_and_non_contiguous(store):
    s = torch.tensor(3.5)
    assert store.put_tensor("scalar_t", s) == 0
    got = store.get_tensor("scalar_t")
    assert got.shape == () and got.item() == 3.5
    nc = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()
    assert not nc.is_contiguous()
    assert store.put_tensor("noncontig_t", nc) == 0
    assert torch.equal(store.get_tensor("noncontig_t"), nc)


def test_unsupported_tensors_are_rejected(store):
    assert store.put_tensor("bad_nd", torch.zeros([1] * 9)) == -600
    assert store.put_tensor("bad_type", b"not a tensor") == -600
    assert store.put_tensor("bad_cplx", torch.zeros(2, dtype=torch.complex64)) == -600
    assert store.is_exist("bad_nd") == 0


def test_batch_put_get_upsert(store):
    keys = [f"bt_{i}" for i in range(3)]
    ts = [torch.randn(10, 10) for _ in range(3)]
    assert store.batch_put_tensor(keys, ts) == [0, 0, 0]
    for a, b in zip(store.batch_get_tensor(keys + ["bt_missing"]), ts + [None]):
        assert (a is None and b is None) or torch.equal(a, b)
    assert store.batch_put_tensor([], []) == []
    assert store.batch_put_tensor(keys, ts[:2]) == [-600] * 3
    new = [t + 1 for t in ts]
    assert store.batch_upsert_tensor(keys, new) == [0, 0, 0]
    for a, b in zip(store.batch_get_tensor(keys), new):
        assert torch.equal(a, b)
    assert store.upsert_tensor(keys[0], ts[0]) == 0
    assert torch.equal(store.get_tensor(keys[0]), ts[0])
    cfg = ReplicateConfig()
    cfg.with_hard_pin = True
    assert store.pub_tensor("pub_t", ts[1], cfg) == 0
    assert store.batch_pub_tensor(["pub_b"], [ts[2]], config=cfg) == [0]
    assert store.upsert_pub_tensor("pub_t", ts[2], cfg) == 0
    assert store.batch_upsert_pub_tensor(["pub_b"], [ts[0]], cfg) == [0]
    assert torch.equal(store.get_tensor("pub_t"), ts[2])
    assert torch.equal(store.get_tensor("pub_b"), ts[0])


def test_get_tensor_into_and_put_tensor_from(store):
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert store.put_tensor("into_t", t) == 0
    size = store.get_size("into_t")
    buf = (ctypes.c_ubyte * 4096)()
    ptr = ctypes.addressof(buf)
    assert store.register_buffer(ptr, 4096) == 0
    got = store.get_tensor_into("into_t", ptr, 4096)
    assert torch.equal(got, t)
    buf[304] = 0xFF  # the tensor views the caller's buffer
    assert got.view(torch.uint8).flatten()[0].item() == 0xFF
    assert store.get_tensor_into("into_missing", ptr, 4096) is None
    assert store.get_tensor_into("into_t", ptr, 100) is None  # too small
    buf[304] = 0
    assert store.put_tensor_from("from_t", ptr, size) == 0
    assert torch.equal(store.get_tensor("from_t"), t)
    assert store.upsert_tensor_from("from_t", ptr, size) == 0
    assert store.batch_put_tensor_from(["from_b1"], [ptr], [size]) == [0]
    assert store.batch_upsert_tensor_from(["from_b1"], [ptr], [size]) == [0]
    assert torch.equal(store.get_tensor("from_b1"), t)
    # Not a tensor object: validated before storing.
    assert store.put_tensor_from("from_bad", ptr, size - 1) == -600
    assert store.put_tensor_from("from_bad", ptr + 1, 304) == -600
    assert store.is_exist("from_bad") == 0
    mismatch = store.batch_get_tensor_into(["into_t", "into_x"], [ptr], [4096])
    assert mismatch == [-600, -600]
    two = store.batch_get_tensor_into(["into_t", "into_missing"], [ptr, ptr + 2048],
                                      [2048, 2048])
    assert torch.equal(two[0], t) and two[1] is None
    assert store.unregister_buffer(ptr) == 0


def test_zero_tensor_into_and_from(store):
    t = torch.empty((2, 0, 3), dtype=torch.float32)
    key, key_from = f"zt_into_{os.getpid()}", f"zt_from_{os.getpid()}"
    assert store.put_tensor(key, t) == 0
    buf = (ctypes.c_ubyte * 4096)()
    ptr = ctypes.addressof(buf)
    assert store.register_buffer(ptr, 4096) == 0
    total = store.get_size(key)
    assert 0 < total < 4096
    got = store.get_tensor_into(key, ptr, 4096)
    assert tuple(got.shape) == (2, 0, 3) and got.dtype == torch.float32
    assert store.put_tensor_from(key_from, ptr, total) == 0
    assert tuple(store.get_tensor(key_from).shape) == (2, 0, 3)
    assert store.unregister_buffer(ptr) == 0


def test_tensor_parallel_shards(store):
    t = torch.arange(24, dtype=torch.bfloat16).reshape(4, 6)
    assert store.put_tensor_with_tp("tp_w", t, tp_rank=0, tp_size=2, split_dim=1) == 0
    for rank, expected in enumerate(torch.chunk(t, 2, dim=1)):
        got = store.get_tensor_with_tp("tp_w", tp_rank=rank, tp_size=2)
        assert torch.equal(got, expected.contiguous())
        assert store.is_exist(f"tp_w_tp_{rank}") == 1
    # The shard objects carry a SHARD layout with one TP axis.
    raw = store.get_buffer("tp_w_tp_1")
    kind, layout_count = struct.unpack_from("<I", raw, 16)[0], struct.unpack_from("<I", raw, 168)[0]
    assert (kind, layout_count) == (1, 1)
    assert struct.unpack_from("<8q", raw, 40)[:2] == (4, 6)  # global shape
    assert struct.unpack_from("<8q", raw, 104)[:2] == (4, 3)  # local shape
    assert struct.unpack_from("<6iq", raw, 176) == (1, 0, 1, 2, 1, 0, 3)
    assert store.put_tensor_with_tp("tp_bad", t, tp_size=4, split_dim=1) == -600
    assert store.put_tensor_with_tp("tp_one", t, tp_size=1) == 0
    assert torch.equal(store.get_tensor_with_tp("tp_one"), t)
    assert store.batch_put_tensor_with_tp(["tp_b1", "tp_b2"], [t, t + 1], tp_size=2,
                                          split_dim=0) == [0, 0]
    got = store.batch_get_tensor_with_tp(["tp_b1", "tp_b2"], tp_rank=1, tp_size=2)
    assert torch.equal(got[0], t[2:]) and torch.equal(got[1], (t + 1)[2:])
    assert store.pub_tensor_with_tp("tp_pub", t, ReplicateConfig(), tp_size=3, split_dim=1) == 0
    assert store.batch_pub_tensor_with_tp(["tp_pubb"], [t], config=ReplicateConfig(),
                                          tp_size=2) == [0]
    assert torch.equal(store.get_tensor_with_tp("tp_pub", tp_rank=2, tp_size=3), t[:, 4:])


def test_zero_tensor_with_tp(store):
    t = torch.empty((2, 0, 3), dtype=torch.float32)
    key = f"zt_tp_{os.getpid()}"
    assert store.put_tensor_with_tp(key, t, tp_size=2, split_dim=0) == 0
    for rank in range(2):
        got = store.get_tensor_with_tp(key, tp_rank=rank, tp_size=2)
        assert tuple(got.shape) == (1, 0, 3)
    for rank in range(2):
        assert store.remove(f"{key}_tp_{rank}", force=True) == 0


def test_serialize_helpers_and_header_cross_check():
    t = torch.arange(6, dtype=torch.int16).reshape(2, 3)
    meta, ptr, nbytes, owner = _serialize_tensor(t)
    assert nbytes == 12 and ptr == owner.data_ptr()
    hand = struct.pack("<IHHiiIIQQ", 0x4D4F4F4E, 1, 304, 4, 2, 0, 0, 304, 12)
    hand += struct.pack("<8q", 2, 3, -1, -1, -1, -1, -1, -1) * 2
    hand += struct.pack("<II", 0, 0) + bytes(128)
    assert meta == hand
    back = _deserialize_tensor(meta + ctypes.string_at(ptr, nbytes))
    assert torch.equal(back, t)
    with pytest.raises(ValueError):
        _deserialize_tensor(meta)
    with pytest.raises(ValueError):
        _serialize_tensor(torch.zeros(2, dtype=torch.complex64))


def test_large_tensor_round_trip(store):
    t = torch.randn(1024, 1024)
    assert store.put_tensor("big_t", t) == 0
    assert torch.equal(store.get_tensor("big_t"), t)
    assert store.get_size("big_t") == 304 + 4 * MIB
