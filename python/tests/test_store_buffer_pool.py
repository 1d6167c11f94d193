"""`mooncake.BufferPool` / `RegisteredBufferPool` (upstream's test_buffer_pool_native.py
surface): acquire/release, reuse, size classes, oversize requests, blocking and timeouts, prewarm,
views and their lifetime, close, and the leased memory working with put_from/get_into."""

import ctypes
import threading

import pytest

from conftest import MIB, make_store
from polling import wait_until


@pytest.fixture(scope="module")
def pstore(master):
    s = make_store(master, segment=64 * MIB, local_buffer=4 * MIB)
    yield s
    s.close()


def test_import_surface():
    import mooncake
    import mooncake.store
    from mooncake import BufferPool, RegisteredBufferPool

    assert BufferPool is RegisteredBufferPool
    assert mooncake.store.BufferPool is BufferPool
    assert mooncake.store.RegisteredBufferLease is mooncake.store.BufferLease


def test_acquire_release_reuse_and_zero_copy_calls(pstore):
    from mooncake import BufferPool

    pool = BufferPool(pstore, max_bytes=8 * MIB)
    lease = pool.acquire(1000)
    assert lease.size == 1000 and lease.ptr != 0
    assert len(lease.buffer) == 1000
    lease.buffer[:5] = b"hello"
    assert pstore.put_from("bp_k", lease.ptr, 5) == 0
    first = lease.ptr
    lease.release()
    lease.release()  # idempotent
    with pytest.raises(RuntimeError):
        lease.ptr
    with pool.acquire(2000) as again:  # same 64 KiB class: the region is reused
        assert again.ptr == first
        assert pstore.get_into("bp_k", again.ptr, again.size) == 5
        assert bytes(again.buffer[:5]) == b"hello"
    pool.close()


def test_size_classes_alignment_and_capacity(pstore):
    from mooncake import BufferPool

    pool = BufferPool(pstore, max_bytes=4 * MIB, min_size_class=4096, alignment=1 * MIB)
    a = pool.acquire(5000)  # next power of two: 8 KiB
    b = pool.acquire(3 * MIB // 2)  # above the alignment: rounded up to 2 MiB
    assert b.ptr % MIB == 0
    with pytest.raises(RuntimeError, match="exceeds pool capacity"):
        pool.acquire(5 * MIB)
    with pytest.raises(RuntimeError, match="exhausted"):
        pool.acquire(3 * MIB, block=False)
    with pytest.raises(RuntimeError, match="timed out"):
        pool.acquire(3 * MIB, timeout=0.05)
    with pytest.raises(RuntimeError, match="active leases"):
        pool.close()
    a.release()
    b.release()
    pool.close()
    with pytest.raises(RuntimeError, match="closed"):
        pool.acquire(10)


def test_blocking_acquire_waits_for_a_release(pstore):
    from mooncake import BufferPool

    # The pool is the store's whole local buffer (4 MiB), so there is no room for an overflow
    # lease either (test_dropin_buffer_pool.py): the second acquire has to wait.
    pool = BufferPool(pstore, max_bytes=4 * MIB, min_size_class=4 * MIB, alignment=1 * MIB)
    held = pool.acquire(4 * MIB)
    got = []

    def waiter():
        with pool.acquire(4 * MIB, timeout=10) as l2:
            got.append(l2.ptr)

    t = threading.Thread(target=waiter)
    t.start()
    # the waiter is inside the pool's Condition.wait (CPython keeps one lock per waiter)
    wait_until(lambda: len(pool._cond._waiters) == 1, 10, "the waiter to block")
    assert got == []  # still waiting, and not holding the GIL (we run)
    ptr = held.ptr
    held.release()
    t.join(10)
    assert got == [ptr]
    pool.close()


def test_views_block_release_until_dropped(pstore):
    from mooncake import BufferPool

    pool = BufferPool(pstore, max_bytes=2 * MIB)
    lease = pool.acquire(4096)
    view = lease.buffer
    with pytest.raises(RuntimeError, match="exported views"):
        lease.release()
    del view
    lease.release()
    # Objects derived from a view (slices, ctypes/numpy arrays over it) are not tracked, but
    # they keep the memory mapped: after release and close they still read mapped bytes.
    lease = pool.acquire(4096)
    piece = lease.buffer[:8]
    arr = (ctypes.c_char * 16).from_buffer(lease.buffer)
    lease.release()
    pool.close()
    arr[0] = b"x"
    assert len(bytes(piece)) == 8 and arr[0] == b"x"


def test_prewarm_and_default_capacity(pstore):
    from mooncake import BufferPool

    # max_bytes=0 means the store's local buffer (4 MiB here), like upstream.
    # Prewarming is best effort, as upstream's: past the pool's 4 MiB, or for an oversize
    # class, it adds nothing and does not raise.
    pool = BufferPool(pstore, min_size_class=MIB, alignment=MIB, prewarm_size=MIB, prewarm_count=2)
    pool.prewarm(MIB, 3)
    pool.prewarm(8 * MIB, 1)
    assert pool._regions == 4
    leases = [pool.acquire(MIB) for _ in range(4)]
    assert len({x.ptr for x in leases}) == 4 and pool._regions == 4  # all prewarmed
    for x in leases:
        x.release()
    pool.close()


def test_unset_store_and_bad_arguments(pstore):
    from mooncake import BufferPool
    from mooncake.store import MooncakeDistributedStore

    with pytest.raises(RuntimeError, match="not initialized"):
        BufferPool(MooncakeDistributedStore(), max_bytes=MIB)
    with pytest.raises(RuntimeError, match="power of two"):
        BufferPool(pstore, max_bytes=MIB, alignment=3000)
    pool = BufferPool(pstore, max_bytes=MIB)
    with pytest.raises(RuntimeError, match="non-negative"):
        pool.acquire(10, timeout=-1)
    pool.close()


def test_released_regions_are_unregistered_on_close(pstore):
    from mooncake import BufferPool

    pool = BufferPool(pstore, max_bytes=MIB)
    lease = pool.acquire(100)
    ptr = lease.ptr
    lease.release()
    pool.close()
    # No longer registered: the zero-copy call refuses the address.
    assert pstore.put_from("bp_after_close", ptr, 10) < 0
