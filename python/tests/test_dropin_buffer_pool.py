"""`BufferPool` side by side with upstream's wheel through every pool state: empty, partly used,
full (the next lease is an overflow lease outside the pool's memory, as upstream's
`allocate_overflow`), overflow leases outstanding, overflow budget spent, released, closed;
plus the argument checks. Both stores have a 4 MiB local buffer, which bounds the overflow
bytes (local buffer minus `max_bytes`; the whole local buffer when `max_bytes=0`)."""

import pytest

import upstream
from conftest import MIB, make_store

SCENARIO = r'''
def scenario(s, BufferPool, MIB):
    out = []

    def step(name, f):
        try:
            out.append([name, "ok", f()])
        except Exception as e:  # noqa: BLE001
            out.append([name, type(e).__name__, str(e)])

    def works(lease, key):
        """Shape of a lease and a put_from/get_into round trip through its memory."""
        n = lease.size
        lease.buffer[:4] = key[:4].encode()
        rc = s.put_from(key, lease.ptr, min(n, 4))
        back = s.get_into(key, lease.ptr, n)
        return [n, len(lease.buffer), rc, back]

    leases = {}

    def take(name, size, **kw):
        def f():
            lease = pool.acquire(size, **kw)
            leases[name] = lease
            return works(lease, "bp_" + name)
        step(name, f)

    pool = BufferPool(s, max_bytes=2 * MIB, min_size_class=MIB, alignment=MIB)
    take("empty", MIB, block=False)
    take("partly_used", 1000, block=False)
    # Full: the pool's 2 MiB are leased; 2 MiB of overflow remain (4 MiB local buffer).
    take("full_nonblocking", MIB, block=False)
    take("full_blocking", 1000)
    take("full_timeout", 1000, timeout=0.01)
    step("distinct", lambda: len({l.ptr for l in leases.values()}))
    take("overflow_spent", MIB - 2000, block=False)
    take("overflow_spent_timeout", MIB, timeout=0.01)
    take("overflow_spent_small", 1000, block=False)
    step("close_with_leases", pool.close)
    # Released: an overflow lease's bytes come back; a pool lease's region is reused.
    leases["full_nonblocking"].release()
    take("after_overflow_release", MIB, block=False)
    ptr = leases["empty"].ptr
    leases["empty"].release()
    step("released_ptr", lambda: leases["empty"].ptr)
    step("released_buffer", lambda: leases["empty"].buffer and None)
    step("release_twice", lambda: leases["empty"].release())
    take("after_pool_release", MIB, block=False)
    step("reused", lambda: leases["after_pool_release"].ptr == ptr)
    step("too_big", lambda: pool.acquire(3 * MIB, block=False) and None)
    step("negative_timeout", lambda: pool.acquire(10, timeout=-1) and None)
    for lease in list(leases.values()):
        lease.release()
    step("close", pool.close)
    step("close_again", pool.close)
    step("after_close", lambda: pool.acquire(10, block=False) and None)

    # max_bytes=0: the local buffer's size, and as much again of overflow.
    pool = BufferPool(s, min_size_class=MIB, alignment=MIB)
    held = []
    for i in range(10):
        try:
            held.append(pool.acquire(MIB, block=False))
        except RuntimeError as e:
            out.append(["default_capacity", len(held), str(e)])
            break
    for lease in held:
        lease.release()
    # max_bytes equal to the local buffer: no overflow at all.
    pool2 = BufferPool(s, max_bytes=4 * MIB, min_size_class=4 * MIB, alignment=MIB)
    lease = pool2.acquire(4 * MIB)
    step("no_overflow_budget", lambda: pool2.acquire(10, block=False) and None)
    lease.release()
    pool2.close()
    pool.close()

    # Sizes past the pool: overflow leases up to the local buffer's size; beyond, refused.
    pool = BufferPool(s, max_bytes=2 * MIB, min_size_class=MIB, alignment=MIB)
    for size in (3 * MIB, 4 * MIB, 5 * MIB, 0):
        step(f"size_{size}", lambda: pool.acquire(size, block=False).size)
    step("size_5m_timeout", lambda: pool.acquire(5 * MIB, timeout=0.01).size)
    for bad in (-1, "x", 1.5, None):
        # pybind11's message names the call's arguments; its first line is the contract.
        step(f"bad_size_{bad!r}", lambda: pool.acquire(bad, block=False))
        out[-1][2] = out[-1][2].splitlines()[0]
    step("bad_block", lambda: pool.acquire(10, block="yes"))
    step("bad_timeout", lambda: pool.acquire(10, timeout="1"))
    step("int_block", lambda: pool.acquire(10, block=1, timeout=2).size)
    pool.close()
    pool = BufferPool(s, min_size_class=MIB, alignment=MIB)
    step("default_pool_5m", lambda: pool.acquire(5 * MIB, block=False).size)
    pool.close()
    pool = BufferPool(s, max_bytes=2 * MIB, max_size_class=MIB, min_size_class=MIB, alignment=MIB)
    step("oversize", lambda: pool.acquire(3 * MIB // 2, block=False).size)
    pool.close()

    # prewarm: best effort, never an error for capacity, oversize classes or a closed pool.
    pool = BufferPool(s, min_size_class=MIB, alignment=MIB, prewarm_size=MIB, prewarm_count=2)
    step("prewarm_past_capacity", lambda: pool.prewarm(MIB, 3))
    step("prewarm_oversize", lambda: pool.prewarm(8 * MIB, 1))
    step("prewarm_zero", lambda: pool.prewarm(MIB, 0))
    for bad in ((MIB, -1), ("x", 1), (1.5, 1)):
        step(f"prewarm_bad_{bad!r}", lambda: pool.prewarm(*bad))
        out[-1][2] = out[-1][2].splitlines()[0]
    held = []
    for i in range(10):
        try:
            held.append(pool.acquire(MIB, block=False))
        except RuntimeError:
            break
    out.append(["prewarmed_then_acquired", len(held)])
    for lease in held:
        lease.release()
    pool.close()
    step("prewarm_closed", lambda: pool.prewarm(MIB, 1))

    # Constructor arguments: pybind11's checks.
    for kw in (dict(max_bytes="x"), dict(max_bytes=-1), dict(max_bytes=1.5),
               dict(min_size_class=0), dict(min_size_class="x"), dict(alignment=3),
               dict(alignment=0), dict(block_on_exhaustion="x"),
               dict(block_on_exhaustion=None), dict(block_on_exhaustion=1),
               dict(default_timeout="x"), dict(default_timeout=-1), dict(max_regions="x"),
               dict(max_regions=-1), dict(max_regions=0), dict(max_size_class="x"),
               dict(max_size_class=-5), dict(prewarm_size="x", prewarm_count=1),
               dict(prewarm_size=1000, prewarm_count=-1),
               dict(max_bytes=MIB, prewarm_size=MIB, prewarm_count=2)):
        step(f"init_{sorted(kw.items())!r}", lambda: BufferPool(s, **kw).close())
        out[-1][2] = out[-1][2].splitlines()[0] if isinstance(out[-1][2], str) else out[-1][2]
    # max_regions bounds pool regions and overflow leases together.
    for limit in (0, 1, 2):
        pool = BufferPool(s, max_bytes=2 * MIB, min_size_class=MIB, alignment=MIB,
                          max_regions=limit)
        held = []
        for i in range(8):
            try:
                held.append(pool.acquire(MIB, block=False))
            except RuntimeError as e:
                out.append([f"max_regions_{limit}", len(held), str(e)])
                break
        for lease in held:
            lease.release()
        pool.close()
    step("init_store_none", lambda: BufferPool(None))
    step("init_store_str", lambda: BufferPool("x"))
    return out
'''


@pytest.fixture(scope="module")
def pstore(master):
    s = make_store(master, segment=16 * MIB, local_buffer=4 * MIB)
    yield s
    s.close()


def ours(pstore):
    from mooncake import BufferPool

    scope = {}
    exec(SCENARIO, scope)
    return scope["scenario"](pstore, BufferPool, MIB)


def test_every_pool_state_answers_as_upstream(pstore):
    mine = ours(pstore)
    theirs = upstream.run_with_store(SCENARIO, local_buffer=4 * MIB)
    assert [tuple(map(str, r)) for r in mine] == [tuple(map(str, r)) for r in theirs]


def test_overflow_states_without_the_wheel(pstore):
    """The same walk, its expectations written out, so it runs (and can fail) without the wheel."""
    got = {r[0]: r[1:] for r in ours(pstore)}
    assert got["empty"] == ["ok", [MIB, MIB, 0, 4]]
    assert got["full_nonblocking"][0] == "ok"  # an overflow lease, not "exhausted"
    assert got["full_blocking"][0] == "ok" and got["full_timeout"][0] == "ok"
    assert got["distinct"] == ["ok", 5]
    # 4 MiB of leases in all: MIB + 1000 from the pool, MIB + 2000 + (MIB - 2000) overflow.
    assert got["overflow_spent"] == ["ok", [MIB - 2000, MIB - 2000, 0, 4]]
    assert got["overflow_spent_timeout"] == ["RuntimeError", "timed out waiting for buffer"]
    assert got["overflow_spent_small"][0] == "ok"
    assert got["close_with_leases"] == ["RuntimeError",
                                        "cannot close buffer pool with active leases"]
    assert got["after_overflow_release"][0] == "ok"
    assert got["released_ptr"] == ["RuntimeError", "buffer lease is closed"]
    assert got["released_buffer"] == ["BufferError", "Error getting buffer"]
    assert got["reused"] == ["ok", True]
    assert got["close"] == ["ok", None] and got["after_close"][0] == "RuntimeError"
    assert got["default_capacity"][0] == 8
    assert got["no_overflow_budget"] == ["RuntimeError", "buffer pool is exhausted"]
    assert got["size_4194304"] == ["ok", 4 * MIB] and got["size_0"] == ["ok", 0]
    assert got["size_5242880"] == ["RuntimeError", "requested buffer size exceeds pool capacity"]
    assert got["default_pool_5m"] == ["ok", 5 * MIB] and got["oversize"] == ["ok", 3 * MIB // 2]
    assert got["bad_size_-1"][0] == got["bad_size_None"][0] == "TypeError"
    assert got["bad_block"][0] == got["bad_timeout"][0] == "RuntimeError"
    assert got["prewarm_past_capacity"] == ["ok", None] and got["prewarmed_then_acquired"] == [8]
    assert got["prewarm_bad_('x', 1)"][0] == "TypeError"
    assert got["init_store_str"][0] == "RuntimeError"
    assert [got[f"max_regions_{n}"][0] for n in (0, 1, 2)] == [0, 1, 2]
