"""Put and get sessions and the ranged multi-buffer calls. Every expected value is what
upstream's 0.3.13.post1 wheel returned for the same calls against its own master (this file
passes on that wheel, save the one unmapped-address row marked below)."""

import ctypes

from conftest import lease_wait

INVALID, NOT_FOUND, EXISTS = -600, -704, -705


def buffer(store, n=1 << 20, register=True):
    b = (ctypes.c_ubyte * n)()
    p = ctypes.addressof(b)
    if register:
        assert store.register_buffer(p, n) == 0
    return b, p


def test_put_session_fills_ranges_then_commits(store):
    b, p = buffer(store)
    for i in range(300):
        b[i] = i % 251
    keys = ["ps_a", "ps_b"]
    assert store.batch_put_session_start(keys, [100, 200]) == [0, 0]
    # Not readable before the end of the session.
    assert store.is_exist("ps_a") == 0
    # Bytes copied per key.
    assert store.batch_put_from_multi_buffer_ranges(
        keys, [[p, p + 50], [p]], [[50, 50], [200]], [[0, 50], [0]]) == [100, 200]
    assert store.batch_put_session_end(keys) == [0, 0]
    assert store.get("ps_a") == bytes(i % 251 for i in range(100))
    assert len(store.get("ps_b")) == 200
    # A second end, a revoke without a session, and a start on an existing key.
    assert store.batch_put_session_end(["ps_a"]) == [INVALID]
    assert store.batch_put_session_revoke(["ps_none"]) == [INVALID]
    assert store.batch_put_session_start(["ps_a"], [100]) == [EXISTS]
    assert store.batch_put_session_start([], []) == []
    assert store.batch_put_session_start(["ps_x"], [1, 2]) == [INVALID]
    assert store.batch_put_from_multi_buffer_ranges(["ps_nos"], [[p]], [[10]], [[0]]) == [INVALID]
    store.unregister_buffer(p)


def test_put_session_revoke_and_overflow(store):
    b, p = buffer(store, 4096)
    assert store.batch_put_session_start(["ps_r1"], [10]) == [0]
    assert store.batch_put_session_revoke(["ps_r1"]) == [0]
    assert store.is_exist("ps_r1") == 0
    assert store.batch_put_session_start(["ps_o1"], [10]) == [0]
    assert store.batch_put_from_multi_buffer_ranges(["ps_o1"], [[p]], [[20]], [[0]]) == [INVALID]
    assert store.batch_put_session_revoke(["ps_o1"]) == [0]
    store.unregister_buffer(p)


def test_get_session_ranges(store):
    b, p = buffer(store)
    assert store.put("gs_a", bytes(range(100))) == 0
    assert store.put("gs_b", bytes(range(200))) == 0
    assert store.put("gs_c", b"x" * 64) == 0
    assert store.batch_get_session_start(["gs_a", "gs_b", "gs_missing"]) == [0, 0, NOT_FOUND]
    dst = p + (4 << 10)
    # Bytes read per key (the sum of its ranges).
    assert store.batch_get_into_multi_buffer_ranges(
        ["gs_a", "gs_b"], [[dst, dst + 10], [dst + 100]], [[10, 20], [30]], [[5, 40], [1]]
    ) == [30, 30]
    base = 4 << 10
    assert bytes(b[base:base + 12]) == bytes([5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 40, 41])
    assert bytes(b[base + 100:base + 130]) == bytes(range(1, 31))
    assert store.batch_get_into_multi_buffer_ranges(["gs_missing"], [[dst]], [[10]], [[0]]) \
        == [INVALID]
    # Outside a session, even for a key that exists.
    assert store.batch_get_into_multi_buffer_ranges(["gs_c"], [[dst]], [[10]], [[0]]) == [INVALID]
    assert store.batch_get_into_multi_buffer_ranges(["gs_a"], [[dst]], [[10]], [[95]]) == [INVALID]
    assert store.batch_get_session_end(["gs_a", "gs_b", "gs_missing"]) == 0
    assert store.batch_get_session_end([]) == 0
    assert store.batch_get_into_multi_buffer_ranges(["gs_a"], [[dst]], [[10]], [[0]]) == [INVALID]
    lease_wait()
    store.unregister_buffer(p)


def test_sessions_before_setup():
    from mooncake.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    assert s.batch_put_session_start(["k"], [1]) == []
    assert s.batch_get_session_start(["k"]) == []
    assert s.batch_get_session_end(["k"]) == -1
    assert s.batch_put_session_end(["k"]) == []
    assert s.batch_put_from_multi_buffer_ranges(["k"], [[1]], [[1]], [[0]]) == []
    assert s.batch_get_into_multi_buffer_ranges(["k"], [[1]], [[1]], [[0]]) == []


def test_sessions_take_mapped_unregistered_memory_and_check_shapes(store):
    assert store.put("gs_u", bytes(range(200))) == 0
    ub = (ctypes.c_ubyte * 4096)()
    up = ctypes.addressof(ub)
    assert store.batch_get_session_start(["gs_u"]) == [0]
    assert store.batch_get_into_multi_buffer_ranges(["gs_u"], [[up]], [[30]], [[1]]) == [30]
    assert bytes(ub[:3]) == b"\x01\x02\x03"
    assert store.batch_get_into_multi_buffer_ranges(["gs_u", "x"], [[up]], [[30]], [[1]]) \
        == [INVALID, INVALID]
    assert store.batch_get_into_multi_buffer_ranges(["gs_u"], [[up, up]], [[30]], [[1]]) \
        == [INVALID]
    assert store.batch_get_into_multi_buffer_ranges(["gs_u"], [[up]], [[0]], [[1]]) == [0]
    # An unmapped address is refused before any byte moves (differs on purpose: upstream
    # tries the transfer and answers -800 after the socket read fails with EFAULT).
    assert store.batch_get_into_multi_buffer_ranges(["gs_u"], [[8]], [[30]], [[1]]) == [INVALID]
    assert store.batch_get_session_end(["gs_u"]) == 0
    for i in range(10):
        ub[i] = i + 1
    assert store.batch_put_session_start(["ps_u1"], [10]) == [0]
    assert store.batch_put_from_multi_buffer_ranges(["ps_u1", "x"], [[up]], [[10]], [[0]]) \
        == [INVALID, INVALID]
    assert store.batch_put_from_multi_buffer_ranges(["ps_u1"], [[up]], [[10]], [[0]]) == [10]
    assert store.batch_put_session_end(["ps_u1"]) == [0]
    assert store.get("ps_u1") == bytes(range(1, 11))
    lease_wait()
