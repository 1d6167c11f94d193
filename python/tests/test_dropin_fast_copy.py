"""`mooncake._fast_copy.concat_arrays_into` against upstream's C extension: results, the bytes
written, and the errors (types and messages) for wrong argument types, counts, sizes and
arrays. Then what upstream does not check and we refuse: a destination that is not writable
memory, or that overlaps a source (upstream crashes or copies in no defined order)."""

import ctypes
import mmap

import pytest

import upstream

np = pytest.importorskip("numpy")

SCENARIO = r'''
def scenario():
    import ctypes
    import numpy as np
    from mooncake import _fast_copy as f

    out = [f.concat_arrays_into.__doc__,
           sorted(x for x in dir(f) if not x.startswith("_"))]
    buf = (ctypes.c_ubyte * 64)()
    p = ctypes.addressof(buf)

    def tr(*a, **k):
        ctypes.memset(p, 0xEE, 64)
        try:
            r = ["ok", f.concat_arrays_into(*a, **k)]
        except Exception as e:  # noqa: BLE001
            r = [type(e).__name__, str(e)]
        out.append(r + [bytes(buf).hex()])

    a = np.arange(4, dtype=np.int32)
    b = np.arange(3, dtype=np.float64)

    class L(list):
        pass

    tr([a, b], p, 64)
    tr([a, b], p, 40)
    tr([a, b], p, 39)
    tr((a, b), p, 64)
    tr([a, "x"], p, 64)
    tr([a, b[::2]], p, 64)
    tr([a, b], p, 64, 1, 1)
    tr([a, b], p, 64, 5)
    tr([a, b], p, 64, -3, 100, 0)
    tr([a, b], p, 64, 0, 0)
    tr([a, b], p, 64, 1, -7, -2)
    tr([a] * 4, p, 64, 0, -1, 3)
    tr([a, b, a], p, 64, 0, 3, 8)
    tr([a], p)
    tr()
    tr([a], p, 64, 0, 1, 1, 9)
    tr([a], p, 64, start=0)
    tr([a], 1.5, 64)
    tr([a], "x", 64)
    tr([a], p, 64, "x")
    tr([a], p, 64, 0, 1, 2 ** 40)
    tr([a], p, 64, 0, 1, 2.0)
    tr([a], np.int64(p), 64)
    tr([a], p, -1)
    tr([a], p, 2 ** 64)
    tr([a], 2 ** 64, 2)
    tr([a], p, 64, 2 ** 63)
    tr([np.zeros(0)], 0, 0)
    tr([], 0, 0)
    tr(L([a]), p, 64)
    tr([a[None]], p, 64)
    tr([np.ma.array([1, 2])], p, 64)
    tr([np.arange(6, dtype=np.uint8).reshape(2, 3), np.array([[1.5]], np.float32)], p, 64)
    tr([np.array(["ab", "c"]), np.array([True, False])], p, 64)
    tr([a, np.array([1, "x"], dtype=object)[:0]], p, 64)
    return out
'''


def ours():
    scope = {}
    exec(SCENARIO, scope)
    return scope["scenario"]()


def test_answers_as_upstream():
    mine = ours()
    theirs = upstream.run(SCENARIO, with_numpy=True)
    assert mine == theirs


def test_copies_and_checks_without_the_wheel():
    from mooncake._fast_copy import concat_arrays_into as cat

    a = np.arange(4, dtype=np.int32)
    b = np.arange(3, dtype=np.float64)
    dst = np.zeros(64, np.uint8)
    p = dst.ctypes.data
    assert cat([a, b], p, 64) == 40
    assert bytes(dst[:40]) == a.tobytes() + b.tobytes() and not dst[40:].any()
    assert cat([a, b, a, b], p, 64, 1, 2, 2) == 40
    assert bytes(dst[:40]) == b.tobytes() + a.tobytes()
    with pytest.raises(ValueError, match="too small: need 40 bytes, got 39"):
        cat([a, b], p, 39)
    with pytest.raises(TypeError, match="must be list, not tuple"):
        cat((a,), p, 64)
    with pytest.raises(TypeError, match=r"arrays\[1\] is not an ndarray"):
        cat([a, b"x"], p, 64)
    with pytest.raises(ValueError, match=r"arrays\[0\] is not C-contiguous"):
        cat([b[::2]], p, 64)
    with pytest.raises(TypeError, match="no keyword"):
        cat([a], p, 64, nthreads=2)


def test_unwritable_or_overlapping_destinations_are_refused():
    from mooncake._fast_copy import concat_arrays_into as cat

    a = np.arange(4, dtype=np.int32)
    with pytest.raises(ValueError, match="not writable"):
        cat([a], 0, 16)
    with pytest.raises(ValueError, match="not writable"):
        cat([a], 8, 16)
    # A read-only mapping, and a writable page followed by one that is not.
    ro = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ)
    ro_ptr = np.frombuffer(ro, np.uint8).ctypes.data
    with pytest.raises(ValueError, match="not writable"):
        cat([a], ro_ptr, 16)
    two = mmap.mmap(-1, 2 * mmap.PAGESIZE)
    base = np.frombuffer(two, np.uint8).ctypes.data
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    assert libc.mprotect(base + mmap.PAGESIZE, mmap.PAGESIZE, mmap.PROT_READ) == 0
    end = base + mmap.PAGESIZE - 8
    big = np.arange(4, dtype=np.int64)  # 32 bytes: 8 fit, 24 would land on the read-only page
    with pytest.raises(ValueError, match="not writable"):
        cat([big], end, 1 << 20)
    assert cat([big[:1]], end, 8) == 8  # the last 8 writable bytes are fine
    # The destination overlapping a source, wholly or in part.
    src = np.arange(16, dtype=np.uint8)
    with pytest.raises(ValueError, match=r"overlaps arrays\[1\]"):
        cat([a, src], src.ctypes.data + 4, 64)
    with pytest.raises(ValueError, match=r"overlaps arrays\[0\]"):
        cat([src], src.ctypes.data, 16)
    assert bytes(src) == bytes(range(16))  # nothing written
    # A source whose memory is not readable: an array over a PROT_NONE page.
    assert libc.mprotect(base + mmap.PAGESIZE, mmap.PAGESIZE, 0) == 0
    ghost = np.ctypeslib.as_array((ctypes.c_uint8 * 16).from_address(base + mmap.PAGESIZE))
    dst = np.zeros(16, np.uint8)
    with pytest.raises(ValueError, match=r"arrays\[0\] is not readable"):
        cat([ghost], dst.ctypes.data, 16)
    assert libc.mprotect(base + mmap.PAGESIZE, mmap.PAGESIZE,
                         mmap.PROT_READ | mmap.PROT_WRITE) == 0
    del ghost


def test_threads_split_the_arrays():
    from mooncake._fast_copy import concat_arrays_into as cat

    arrays = [np.full(1000 + i, i, np.uint8) for i in range(7)]
    want = b"".join(x.tobytes() for x in arrays)
    for n in (1, 2, 3, 7, 100):
        dst = np.zeros(len(want), np.uint8)
        assert cat(arrays, dst.ctypes.data, len(want), 0, -1, n) == len(want)
        assert dst.tobytes() == want
