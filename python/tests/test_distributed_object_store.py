"""Single-client behaviour of `MooncakeDistributedStore`, ported from upstream's
mooncake-wheel/tests/test_distributed_object_store.py, plus the error paths our brief adds
(calls before setup / after close, unregistered memory, wrong argument types)."""

import ctypes
import os
import threading

import pytest

from conftest import MIB, lease_wait, make_store
from mooncake.store import MooncakeDistributedStore, ReplicateConfig, SoftPinAction


def config_dict(master, global_segment_size, local_buffer_size):
    return {
        "local_hostname": "localhost",
        "metadata_server": master.metadata,
        "global_segment_size": global_segment_size,
        "local_buffer_size": local_buffer_size,
        "protocol": "tcp",
        "rdma_devices": "",
        "master_server_addr": master.addr,
    }


# ---- setup / lifecycle ---------------------------------------------------------------------


def test_dict_setup_with_human_readable_sizes(master):
    store = MooncakeDistributedStore()
    try:
        assert store.setup(config_dict(master, "16MB", "16 MB")) == 0
        key = f"dict_setup_{os.getpid()}"
        assert store.put(key, b"test_config_dict_human_readable_value") == 0
        assert store.get(key) == b"test_config_dict_human_readable_value"
    finally:
        assert store.close() == 0


@pytest.mark.parametrize(
    "seg,buf",
    [("50%", "16MB"), ("512", "16MB"), ("16MB", "512"), ("16MB", str(2 << 40)), ("x", "1")],
)
def test_dict_setup_rejects_bad_sizes(master, seg, buf):
    store = MooncakeDistributedStore()
    assert store.setup(config_dict(master, seg, buf)) == -600
    assert store.close() == 0


def test_dict_setup_needs_hostname_and_metadata(master):
    store = MooncakeDistributedStore()
    assert store.setup({"metadata_server": master.metadata}) == -600


def test_setup_argument_checking(master):
    store = MooncakeDistributedStore()
    with pytest.raises(TypeError):
        store.setup("localhost", master.metadata, 16 * MIB)  # 7 required
    with pytest.raises(TypeError):
        store.setup("localhost", master.metadata, 16 * MIB, 16 * MIB, "tcp", "", master.addr,
                    bogus=1)
    with pytest.raises(TypeError):
        store.setup("localhost", master.metadata, "16MB", 16 * MIB, "tcp", "", master.addr)
    # Keyword form with upstream's names.
    assert store.setup(local_hostname="localhost", metadata_server=master.metadata,
                       global_segment_size=16 * MIB, local_buffer_size=16 * MIB,
                       protocol="tcp", rdma_devices="", master_server_addr=master.addr,
                       engine=None, tenant_id="default") == 0
    # A second setup on a live store is refused.
    assert store.setup("localhost", master.metadata, 0, 0, "tcp", "", master.addr) == -600
    assert store.close() == 0


def test_zero_local_buffer_size(master):
    store = make_store(master, segment=64 * MIB, local_buffer=0)
    try:
        assert store.put("test_zero_buffer_key", b"test_zero_buffer_value") != 0
        assert store.is_exist("test_zero_buffer_key") == 0
        assert store.get("test_zero_buffer_key") == b""
    finally:
        store.close()


def test_calls_before_setup_and_after_close(master):
    store = MooncakeDistributedStore()
    for _ in range(2):
        assert store.put("k", b"v") == -600
        assert store.upsert("k", b"v") == -600
        assert store.put_parts("k", b"a", b"b") == -600
        assert store.put_batch(["k"], [b"v"]) == -600
        assert store.get("k") == b""
        assert store.get_batch(["k"]) == [b""]
        assert store.get_buffer("k") is None
        assert store.batch_get_buffer(["k"]) == [None]
        assert store.is_exist("k") == -600
        assert store.batch_is_exist(["k"]) == [-600]
        assert store.get_size("k") == -600
        assert store.remove("k") == -600
        assert store.remove_by_regex("k") == -600
        assert store.remove_all() == -600
        assert store.batch_remove(["k"]) == [-600]
        assert store.register_buffer(1, 1) == -600
        assert store.put_from("k", 1, 1) == -600
        assert store.get_into("k", 1, 1) == -600
        assert store.batch_put_from(["k"], [1], [1]) == [-600]
        assert store.batch_get_into(["k"], [1], [1]) == [-600]
        assert store.put_from_with_metadata("k", 1, 2, 1, 1) == -1
        assert store.batch_put_from_multi_buffers(["k"], [[1]], [[1]]) == []
        assert store.get_into_ranges([1], [["k"]], [[[0]]], [[[0]]], [[[1]]]) == [[[-600]]]
        assert store.get_replica_desc("k") == []
        assert store.batch_get_replica_desc(["k"]) == {}
        assert store.alloc_from_mem_pool(64) == 0
        assert store.health_check() == 1
        assert store.get_hostname() == ""
        assert store.close() == 0
        # Set up, close, and run the same checks on the closed store.
        assert store.setup("localhost", master.metadata, 16 * MIB, 16 * MIB, "tcp", "",
                           master.addr) == 0
        assert store.health_check() == 0
        assert store.close() == 0


def test_client_tear_down(master):
    store = make_store(master, segment=64 * MIB, local_buffer=16 * MIB)
    key = f"test_teardown_key_{os.getpid()}"
    assert store.put(key, b"Hello, World!") == 0
    assert store.close() == 0
    assert store.close() == 0  # idempotent
    assert store.setup("localhost", master.metadata, 64 * MIB, 16 * MIB, "tcp", "",
                       master.addr) == 0
    try:
        assert store.get(key) == b""
        assert store.put(key, b"Hello, World!") == 0
        assert store.get(key) == b"Hello, World!"
    finally:
        store.close()


def test_basic_get_hostname(store):
    hostname = store.get_hostname()
    assert hostname.startswith("localhost:")
    assert 12300 <= int(hostname.split(":")[1]) <= 14300
    assert store.health_check() == 0


# ---- bytes ---------------------------------------------------------------------------------


def test_basic_put_get_exist_remove(store):
    data = b"Hello, World!"
    key = "test_basic_key"
    assert store.put(key, data) == 0
    assert store.get_size(key) == len(data)
    assert store.get(key) == data
    assert store.is_exist(key) == 1
    # First writer wins: a second put succeeds and leaves the value alone.
    assert store.put(key, b"something else") == 0
    assert store.get(key) == data
    # The reads above hold a lease.
    assert store.remove(key) == -706
    lease_wait()
    assert store.remove(key) == 0
    assert store.is_exist(key) == 0
    assert store.get(key) == b""
    assert store.get_size(key) == -704
    assert store.remove(key) == -704


def test_force_remove_ignores_the_lease(store):
    assert store.put("force_rm", b"x") == 0
    assert store.get("force_rm") == b"x"
    assert store.remove("force_rm") == -706
    assert store.remove("force_rm", force=True) == 0


def test_values_of_any_buffer_type(store):
    assert store.put("buf_bytearray", bytearray(b"abc")) == 0
    assert store.put("buf_memoryview", memoryview(b"xyzw")[1:3]) == 0
    assert store.get("buf_bytearray") == b"abc"
    assert store.get("buf_memoryview") == b"yz"
    with pytest.raises(TypeError):
        store.put("buf_str", "not bytes")
    with pytest.raises(TypeError):
        store.put(1, b"x")


def test_upsert_overwrites(store):
    assert store.upsert("ups", b"one") == 0
    assert store.get("ups") == b"one"
    assert store.upsert("ups", b"second value") == 0
    assert store.get("ups") == b"second value"
    assert store.upsert_parts("ups", b"a", memoryview(b"bc")) == 0
    assert store.get("ups") == b"abc"
    assert store.upsert_batch(["ups", "ups2"], [b"1", b"22"]) == 0
    assert store.get_batch(["ups", "ups2"]) == [b"1", b"22"]


def test_put_parts(store):
    assert store.put_parts("parts", b"hello ", bytearray(b"wor"), memoryview(b"ld")) == 0
    assert store.get("parts") == b"hello world"
    with pytest.raises(RuntimeError):
        store.put_parts("parts2", memoryview(b"abcd").cast("B", (2, 2)))
    assert store.is_exist("parts2") == 0


def test_put_batch_and_get_batch(store):
    keys = [f"pb_{i}" for i in range(10)]
    values = [os.urandom(100 + i) for i in range(10)]
    assert store.put_batch(keys, values) == 0
    assert store.get_batch(keys + ["pb_missing"]) == values + [b""]
    assert store.get_batch([]) == [b""]  # upstream's quirk
    assert store.put_batch(keys[:2], values[:1]) == -600


def test_local_buffer_bounds_copying_calls(master):
    store = make_store(master, segment=64 * MIB, local_buffer=1 * MIB)
    try:
        assert store.put("too_big", b"x" * (2 * MIB)) == -600
        assert store.is_exist("too_big") == 0
        assert store.put("fits", b"y" * 1000) == 0
    finally:
        store.close()


def test_soft_pin_forwarding(store):
    cfg = ReplicateConfig()
    cfg.soft_pin_ttl_ms = 1000
    for action in (SoftPinAction.PRESERVE, SoftPinAction.DISABLE):
        cfg.soft_pin_action = action
        assert store.put(f"sp_{action.name}", b"v", cfg) == -600
        assert store.upsert(f"sp_{action.name}", b"v", config=cfg) == -600
    cfg.soft_pin_action = SoftPinAction.ENABLE
    assert store.put("sp_enable", b"v", cfg) == 0
    old = ReplicateConfig()
    old.with_soft_pin = True
    assert store.put("sp_old_form", b"v", old) == 0
    assert store.get("sp_old_form") == b"v"


def test_config_validation(store):
    cfg = ReplicateConfig()
    cfg.prefer_alloc_in_same_node = True
    assert store.put("same_node", b"v", cfg) == -600
    cfg = ReplicateConfig()
    cfg.nof_replica_num = 1
    assert store.put("nof", b"v", cfg) == -600
    cfg = ReplicateConfig()
    cfg.group_ids = ["g1"]
    assert store.batch_put_from(["a", "b"], [1, 2], [1, 1], cfg) == [-600, -600]


def test_batch_is_exist(store):
    keys = [f"test_batch_exist_key_{i}" for i in range(20)]
    for key in keys[:10]:
        assert store.put(key, b"Hello, Batch World!") == 0
    assert store.batch_is_exist(keys) == [1] * 10 + [0] * 10
    assert store.batch_is_exist([]) == []
    assert store.batch_is_exist([keys[0]]) == [1]
    assert store.batch_is_exist(["non_existent_key"]) == [0]
    lease_wait()
    assert store.batch_remove(keys[:10] + ["nope"]) == [0] * 10 + [-704]


def test_remove_by_regex_and_remove_all(new_store):
    s = new_store(segment=64 * MIB, local_buffer=16 * MIB)
    for i in range(5):
        assert s.put(f"rx_a_{i}", b"v") == 0
        assert s.put(f"rx_b_{i}", b"v") == 0
    assert s.remove_by_regex("^rx_a_", force=True) == 5
    assert s.remove_by_regex("rx_b_[0-1]") == 2  # substring search, no lease taken by put
    assert s.remove_by_regex("(") == -600
    assert s.is_exist("rx_b_2") == 1


def test_buffer_handles(store):
    data = [b"Batch Buffer Data 1! " * 100, b"Batch Buffer Data 2! " * 200]
    keys = ["test_batch_get_buffer_key1", "test_batch_get_buffer_key2"]
    for k, d in zip(keys, data):
        assert store.put(k, d) == 0
    h = store.get_buffer(keys[0])
    assert h is not None and h.size() == len(data[0]) and len(h) == len(data[0])
    assert bytes(h) == data[0]
    assert bytes(memoryview(h)) == data[0]
    assert ctypes.string_at(h.ptr(), h.size()) == data[0]
    assert store.get_buffer("nope") is None
    results = store.batch_get_buffer(keys)
    assert [bytes(b) for b in results] == data
    assert [b.size() for b in results] == [len(d) for d in data]
    mixed = store.batch_get_buffer([keys[0], "non_existent_key"])
    assert bytes(mixed[0]) == data[0] and mixed[1] is None
    assert store.batch_get_buffer([]) == []
    assert store.batch_get_buffer(["definitely_non_existent_key"]) == [None]


def test_replica_descriptors(store):
    assert store.put("desc", b"12345") == 0
    (r,) = store.get_replica_desc("desc")
    assert r.is_memory_replica() and not r.is_disk_replica()
    assert int(r.status) == 3  # COMPLETE
    d = r.get_memory_descriptor().buffer_descriptor
    assert d.size == 5 and d.buffer_address > 0 and d.transport_endpoint
    assert "Descriptor size=5" in repr(d)
    got = store.batch_get_replica_desc(["desc", "missing"])
    assert list(got) == ["desc"] and len(got["desc"]) == 1


# ---- zero copy -----------------------------------------------------------------------------


def test_zero_copy_operations(store):
    data = b"Hello, Zero-Copy World! " * 1000
    key = "test_zero_copy_key"
    size = len(data) + 1024
    buf = (ctypes.c_ubyte * size)()
    ptr = ctypes.addressof(buf)
    assert store.register_buffer(ptr, size) == 0
    ctypes.memmove(buf, data, len(data))
    assert store.put_from(key, ptr, len(data)) == 0
    assert store.get(key) == data
    ctypes.memset(buf, 0, size)
    assert store.get_into(key, ptr, size) == len(data)
    assert bytes(buf[: len(data)]) == data
    small = (ctypes.c_ubyte * (len(data) // 2))()
    sptr = ctypes.addressof(small)
    assert store.register_buffer(sptr, len(data) // 2) == 0
    assert store.get_into(key, sptr, len(data) // 2) < 0
    assert store.get_into("missing", ptr, size) == -704
    lease_wait()
    assert store.unregister_buffer(ptr) == 0
    assert store.unregister_buffer(sptr) == 0
    assert store.unregister_buffer(sptr) < 0
    assert store.remove(key) == 0


def test_unmapped_memory_is_refused_mapped_memory_is_used(store):
    buf = (ctypes.c_ubyte * 4096)()
    ptr = ctypes.addressof(buf)
    assert store.put("unreg_src", b"z" * 4096) == 0
    # Never registered but mapped: used, as upstream over TCP does (LMCache relies on it).
    assert store.get_into("unreg_src", ptr, 4096) == 4096
    assert bytes(buf) == b"z" * 4096
    assert store.put_from("unreg", ptr, 4096) == 0
    assert store.get("unreg") == b"z" * 4096
    assert store.batch_get_into(["unreg_src"], [ptr], [4096]) == [4096]
    # Unmapped (wild) addresses: refused before any byte moves, no crash.
    assert store.put_from("unreg_w", 8, 4096) == -600
    assert store.get_into("unreg_src", 8, 4096) == -600
    assert store.batch_put_from(["u1"], [16], [10]) == [-600]
    assert store.batch_get_into(["unreg_src"], [16], [4096]) == [-600]
    assert store.put_tensor_from("unreg_t", 8, 400) == -600
    # Registered, but the range runs past the end: the registration stated the bounds.
    assert store.register_buffer(ptr, 4096) == 0
    assert store.put_from("unreg2", ptr + 100, 4096) == -600
    assert store.put_from("zero", ptr, 0) == 0  # size 0 stores nothing
    assert store.is_exist("zero") == 0
    assert store.unregister_buffer(ptr) == 0
    lease_wait()


def test_get_into_ranges(store):
    key1, key2 = "test_get_into_ranges_key_1", "test_get_into_ranges_key_2"
    data1 = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    data2 = b"abcdefghijklmnopqrstuvwxyz0123456789"
    n = 32
    assert store.put(key1, data1) == 0
    assert store.put(key2, data2) == 0
    b0, b1 = (ctypes.c_ubyte * n)(), (ctypes.c_ubyte * n)()
    p0, p1 = ctypes.addressof(b0), ctypes.addressof(b1)
    assert store.register_buffer(p0, n) == 0
    assert store.register_buffer(p1, n) == 0
    ctypes.memset(b0, ord("_"), n)
    ctypes.memset(b1, ord("_"), n)
    results = store.get_into_ranges(
        [p0, p1],
        [[key1, key2], [key2, key1]],
        [[[0, 20], [8]], [[4], [16]]],
        [[[1, 30], [2]], [[0], [10]]],
        [[[4, 3], [5]], [[6], [4]]],
    )
    assert results == [[[4, 3], [5]], [[6], [4]]]
    assert bytes(b0[0:4]) == data1[1:5]
    assert bytes(b0[8:13]) == data2[2:7]
    assert bytes(b0[20:23]) == data1[30:33]
    assert bytes(b1[4:10]) == data2[0:6]
    assert bytes(b1[16:20]) == data1[10:14]
    assert bytes(b0[4:8]) == b"____"

    mismatch = store.get_into_ranges([p0], [[key1, key2]], [[[0], []]], [[[0, 1], []]],
                                     [[[4, 4], []]])
    assert len(mismatch) == 1 and len(mismatch[0]) == 2
    assert mismatch[0][0][0] < 0 and mismatch[0][1] == []
    src_over = store.get_into_ranges([p0], [[key1]], [[[0]]], [[[len(data1) - 1]]], [[[4]]])
    assert len(src_over) == 1 and src_over[0][0][0] < 0
    dst_over = store.get_into_ranges([p0], [[key1]], [[[n - 1]]], [[[0]]], [[[4]]])
    assert len(dst_over) == 1 and dst_over[0][0][0] < 0
    missing = store.get_into_ranges([p0], [["missing-key", key1]], [[[0], [8]]], [[[0], [0]]],
                                    [[[4], [4]]])
    assert missing[0][0][0] < 0 and missing[0][1][0] == 4
    unregistered = (ctypes.c_ubyte * 8)()
    assert store.get_into_ranges([ctypes.addressof(unregistered)], [[key1]], [[[0]]], [[[0]]],
                                 [[[4]]]) == [[[-600]]]
    lease_wait()
    assert store.unregister_buffer(p0) == 0
    assert store.unregister_buffer(p1) == 0
    assert store.remove(key1) == 0
    assert store.remove(key2) == 0


def test_batch_get_into(store):
    data = [b"Hello, Batch World 1! " * 100, b"Hello, Batch World 2! " * 200,
            b"Hello, Batch World 3! " * 150]
    keys = [f"test_batch_get_into_key_{i}" for i in range(3)]
    for k, d in zip(keys, data):
        assert store.put(k, d) == 0
    spacing = MIB
    big = (ctypes.c_ubyte * (spacing * 3))()
    base = ctypes.addressof(big)
    assert store.register_buffer(base, spacing * 3) == 0
    ptrs = [base + i * spacing for i in range(3)]
    results = store.batch_get_into(keys, ptrs, [spacing] * 3)
    assert results == [len(d) for d in data]
    for i, d in enumerate(data):
        assert bytes(big[i * spacing : i * spacing + len(d)]) == d
    mismatched = store.batch_get_into(keys[:2], ptrs[:3], [spacing] * 3)
    assert len(mismatched) == 2 and all(r < 0 for r in mismatched)
    assert store.batch_get_into([], [], []) == []
    lease_wait()
    assert store.unregister_buffer(base) == 0
    for k in keys:
        assert store.remove(k) == 0


def test_batch_put_from(store):
    data = [b"Batch Put Data 1! " * 100, b"Batch Put Data 2! " * 200, b"Batch Put Data 3! " * 150]
    keys = [f"test_batch_put_from_key_{i}" for i in range(3)]
    spacing = MIB
    big = (ctypes.c_ubyte * (spacing * 3))()
    base = ctypes.addressof(big)
    assert store.register_buffer(base, spacing * 3) == 0
    ptrs = []
    for i, d in enumerate(data):
        ctypes.memmove(base + i * spacing, d, len(d))
        ptrs.append(base + i * spacing)
    assert store.batch_put_from(keys, ptrs, [len(d) for d in data]) == [0, 0, 0]
    for k, d in zip(keys, data):
        assert store.get(k) == d
    mismatched = store.batch_put_from(keys[:2], ptrs[:3], [len(d) for d in data])
    assert len(mismatched) == 2 and all(r < 0 for r in mismatched)
    assert store.batch_put_from([], [], []) == []
    # upsert_from / batch_upsert_from overwrite.
    assert store.upsert_from(keys[0], ptrs[1], len(data[1])) == 0
    assert store.get(keys[0]) == data[1]
    assert store.batch_upsert_from(keys[:1], ptrs[2:], [len(data[2])]) == [0]
    assert store.get(keys[0]) == data[2]
    lease_wait()
    assert store.unregister_buffer(base) == 0
    for k in keys:
        assert store.remove(k) == 0


def test_multi_buffers_and_metadata(store):
    a, b, c = (ctypes.create_string_buffer(x, len(x)) for x in (b"head-", b"body", b"META"))
    for buf in (a, b, c):
        assert store.register_buffer(ctypes.addressof(buf), ctypes.sizeof(buf)) == 0
    pa, pb, pc = (ctypes.addressof(x) for x in (a, b, c))
    assert store.batch_put_from_multi_buffers(["mb1", "mb2"], [[pa, pb], [pb]],
                                              [[5, 4], [4]]) == [0, 0]
    assert store.get("mb1") == b"head-body"
    assert store.batch_put_from_multi_buffers(["mb3"], [[pa, pb]], [[5]]) == [-600]
    out1, out2 = ctypes.create_string_buffer(3), ctypes.create_string_buffer(8)
    for buf in (out1, out2):
        assert store.register_buffer(ctypes.addressof(buf), ctypes.sizeof(buf)) == 0
    res = store.batch_get_into_multi_buffers(
        ["mb1", "nope"], [[ctypes.addressof(out1), ctypes.addressof(out2)], []], [[3, 8], []])
    assert res[0] == 9 and res[1] == -704
    assert out1.raw == b"hea" and out2.raw[:6] == b"d-body"
    assert store.put_from_with_metadata("pfm", pb, pc, 4, 4) == 0
    assert store.get("pfm") == b"METAbody"
    assert store.put_from_with_metadata("pfm0", pb, pc, 0, 4) == 0
    assert store.is_exist("pfm0") == 0
    assert store.put_from_with_metadata("pfm_bad", 8, pc, 4, 4) == 600  # upstream: -code
    for buf in (a, b, c, out1, out2):
        assert store.unregister_buffer(ctypes.addressof(buf)) == 0


def test_alloc_from_mem_pool(store):
    ptr = store.alloc_from_mem_pool(MIB)
    assert ptr != 0 and ptr % 64 == 0
    assert store.register_buffer(ptr, MIB) == 0
    ctypes.memmove(ptr, b"pooled", 6)
    assert store.put_from("pooled", ptr, 6) == 0
    assert store.get("pooled") == b"pooled"
    assert store.alloc_from_mem_pool(1 << 40) == 0
    assert store.unregister_buffer(ptr) == 0


def test_concurrent_stress_with_barrier(store):
    threads_n, value_size, ops = 8, MIB, 100
    start, put_done = threading.Barrier(threads_n), threading.Barrier(threads_n)
    errors = []

    def worker(tid):
        try:
            data = os.urandom(value_size)
            keys = [f"key_{tid}_{i}" for i in range(ops)]
            start.wait()
            for k in keys:
                assert store.put(k, data) == 0, k
            put_done.wait()
            for k in keys:
                assert store.get(k) == data, k
            lease_wait()
            for k in keys:
                assert store.remove(k) == 0, k
        except Exception as e:  # noqa: BLE001
            errors.append(f"thread {tid}: {e!r}")

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(threads_n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert errors == []


def test_mixed_operations_from_many_threads(store):
    """Eight threads doing different calls at once on one store."""
    errors = []

    def run(tid):
        try:
            buf = (ctypes.c_ubyte * 65536)()
            ptr = ctypes.addressof(buf)
            assert store.register_buffer(ptr, 65536) == 0
            for i in range(50):
                k = f"mixed_{tid}_{i}"
                v = bytes([tid]) * (1000 + i)
                op = (tid + i) % 4
                if op == 0:
                    assert store.put(k, v) == 0
                    assert store.get(k) == v
                elif op == 1:
                    ctypes.memmove(ptr, v, len(v))
                    assert store.put_from(k, ptr, len(v)) == 0
                    assert store.get_into(k, ptr, 65536) == len(v)
                elif op == 2:
                    assert store.put_batch([k, k + "b"], [v, v]) == 0
                    assert store.batch_is_exist([k, k + "b", k + "c"]) == [1, 1, 0]
                else:
                    assert store.upsert(k, v) == 0
                    assert bytes(store.get_buffer(k)) == v
            assert store.unregister_buffer(ptr) == 0
        except Exception as e:  # noqa: BLE001
            errors.append(f"thread {tid}: {e!r}")

    ts = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert errors == []


def test_subclass_with_instance_attributes(master):
    class AsyncLike(MooncakeDistributedStore):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def __getattr__(self, name):
            if name.startswith("async_"):
                inner = getattr(self, name[len("async_"):])

                def wrapper(*a, **kw):
                    self.calls += 1
                    return inner(*a, **kw)

                setattr(self, name, wrapper)
                return wrapper
            raise AttributeError(name)

    s = make_store(master, segment=16 * MIB, local_buffer=16 * MIB, cls=AsyncLike)
    try:
        assert s.async_put("sub_k", b"v") == 0
        assert s.async_get("sub_k") == b"v"
        assert s.calls == 2 and "async_put" in s.__dict__
        s.extra = [1, 2]
        assert s.extra == [1, 2]
    finally:
        s.close()


def test_calls_release_the_gil(store):
    """A thread blocked in a store call must not stop other Python threads."""
    import time

    value = os.urandom(32 * MIB)
    assert store.put("gil_big", value) == 0
    stop = threading.Event()
    ticks = []

    def spin():
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.001)  # the tick being measured, not a wait

    t = threading.Thread(target=spin)
    t.start()
    try:
        t0 = time.monotonic()
        for _ in range(10):
            assert len(store.get("gil_big")) == len(value)
        elapsed = time.monotonic() - t0
    finally:
        stop.set()
        t.join()
    # The spinner kept running during the gets: no gap much longer than the gets' own slices.
    during = [x for x in ticks if t0 <= x <= t0 + elapsed]
    assert len(during) >= max(3, int(elapsed / 0.01))
