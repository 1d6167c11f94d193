"""`BufferPool` / `RegisteredBufferPool`: reusable buffers registered with a store.

Upstream binds this pool natively (`mooncake.store.BufferPool`, with the aliases
`RegisteredBufferPool`, `RegisteredBufferLease`, ...) and `mooncake.BufferPool is
mooncake.RegisteredBufferPool`. Here it is plain Python on top of the store's
`register_buffer` / `unregister_buffer`; the keyword names, defaults, size classes and
error messages follow upstream's:

* `BufferPool(store, max_bytes=0, min_size_class=65536, max_size_class=None,
  alignment=8 MiB, block_on_exhaustion=True, default_timeout=None, max_regions=None,
  prewarm_size=None, prewarm_count=0)`. `max_bytes=0` means "the store's
  `local_buffer_size`" (upstream then carves leases out of that buffer); a pool with neither
  raises `RuntimeError("max_bytes must be positive")`.
* A request of `size` bytes gets a region of its size class: `min_size_class` up to that size,
  the next power of two up to `alignment`, else `size` rounded up to `alignment`. Requests
  larger than `max_size_class` get a one-off region that is unregistered on release.
* `acquire(size, block=None, timeout=None)` (alias `buffer`) returns a `BufferLease`: `.ptr`
  (registered address), `.size` (the requested size), `.buffer` (a writable `memoryview` of
  `size` bytes), `release()`, and use as a context manager. When the pool has no room for
  the request, it hands out an overflow lease instead, as upstream: a one-off region of
  exactly `size` bytes outside `max_bytes`, unregistered on release. The bytes leased in all
  (pool and overflow leases, as requested) may reach the store's `local_buffer_size` (twice
  that for `max_bytes=0`); past that it waits (the GIL released) for a release, up to
  `timeout` seconds (`"timed out waiting for buffer"`), or raises at once with `block=False`
  (`"buffer pool is exhausted"`). A request no pool region and no overflow lease could ever
  hold is `"requested buffer size exceeds pool capacity"`. Overflow leases count against
  `max_regions`.
* `prewarm(size, count)` registers up to `count` regions of `size`'s class ahead of time
  (best effort, as upstream: it stops where the pool is full, and skips oversize classes and
  closed pools); `close()` unregisters everything (it raises while leases are active).
* Arguments are checked as upstream's binding checks them: a wrong type, or a negative size
  or count, is pybind11's `TypeError` ("incompatible ... arguments") or its `RuntimeError`
  ("Unable to cast ...") for the `object` parameters.

Regions are anonymous memory mappings (page aligned; over-allocated and offset when
`alignment` asks for more), so memory is touched only when used. `release()` refuses
(`RuntimeError`, as upstream) while a view it handed out is still referenced; objects
derived from a view (slices, `np.frombuffer(lease.buffer)`) are not tracked. A lease that is
garbage-collected is released without that check. Memory safety does not depend on callers
behaving: a mapping is never unmapped explicitly, only when the last view of it (slices
included) is gone, so a stale view reads stale bytes at worst, never unmapped memory.
"""

import sys

import ctypes
import mmap
import threading
import time
from typing import Any, Literal, NoReturn, Optional

__all__ = [
    "BufferPool",
    "BufferLease",
    "BufferLeaseView",
    "RegisteredBufferPool",
    "RegisteredBufferLease",
    "RegisteredBufferLeaseView",
]

_PAGE = mmap.PAGESIZE


class _Region:
    """One registered mapping: `size` usable bytes at `ptr`."""

    __slots__ = ("mm", "view", "ptr", "size", "overflow")

    def __init__(self, size: int, alignment: int, overflow: bool = False) -> None:
        self.overflow = overflow
        pad = alignment if alignment > _PAGE else 0
        self.mm: Optional[mmap.mmap] = mmap.mmap(-1, size + pad)
        probe = ctypes.c_char.from_buffer(self.mm)
        base = ctypes.addressof(probe)
        del probe  # drop the export: only `view` below keeps one
        skip = (-base) % alignment if pad else 0
        self.ptr = base + skip
        self.size = size
        self.view: Optional[memoryview] = memoryview(self.mm)[skip:skip + size]

    def free(self) -> None:
        """Drops the pool's references; the mapping goes when its last view does."""
        self.view = None
        self.mm = None


class BufferLease:
    """One acquired buffer; see the module docs."""

    __slots__ = ("_pool", "_region", "_size", "_views", "__weakref__")

    def __init__(self, pool: "BufferPool", region: _Region, size: int) -> None:
        self._pool: Optional[BufferPool] = pool
        self._region: Optional[_Region] = region
        self._size = size
        self._views: list[memoryview] = []

    @property
    def ptr(self) -> int:
        if self._region is None:
            raise RuntimeError("buffer lease is closed")
        return self._region.ptr

    @property
    def size(self) -> int:
        return self._size

    @property
    def buffer(self) -> memoryview:
        if self._region is None:
            # Upstream's view export fails this way on a released lease.
            raise BufferError("Error getting buffer")
        view = self._region.view
        assert view is not None, "a leased region is not freed"
        v = view[: self._size]
        self._views.append(v)
        return v

    def release(self) -> None:
        """Returns the buffer to the pool; a no-op when already released."""
        self._release(check_views=True)

    def _release(self, check_views: bool) -> None:
        if self._region is None:
            return
        # A view is still in use when anything but our list, the loop variable and
        # getrefcount's argument refers to it.
        if check_views:
            for v in self._views:
                if sys.getrefcount(v) > 3:
                    raise RuntimeError(
                        "cannot release buffer while exported views exist")
        self._views = []
        region, self._region = self._region, None
        assert self._pool is not None, "a lease holding a region holds its pool"
        self._pool._release(region, self._size)
        self._pool = None

    def __enter__(self) -> "BufferLease":
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        self.release()
        return False

    def __del__(self) -> None:
        try:
            self._release(check_views=False)
        except Exception:  # noqa: BLE001  (never raise from a finaliser)
            pass

    def __repr__(self) -> str:
        state = "released" if self._region is None else f"ptr={self._region.ptr:#x}"
        return f"<BufferLease size={self._size} {state}>"


class BufferPool:
    """A pool of registered buffers for the zero-copy calls; see the module docs."""

    # The arguments are checked at run time as upstream's binding checks them (module doc),
    # so the annotations say what is accepted, not only what is meant.
    def __init__(self, store: Any, max_bytes: int = 0, min_size_class: int = 64 * 1024,
                 max_size_class: Optional[int] = None, alignment: int = 8 * 1024 * 1024,
                 block_on_exhaustion: object = True, default_timeout: Optional[float] = None,
                 max_regions: Optional[int] = None, prewarm_size: Optional[int] = None,
                 prewarm_count: int = 0) -> None:
        for value in (max_bytes, min_size_class, alignment, prewarm_count):
            if not isinstance(value, int) or value < 0:
                raise TypeError(_signature_error("__init__", "constructor"))
        if not (block_on_exhaustion is None or hasattr(type(block_on_exhaustion), "__bool__")):
            raise TypeError(_signature_error("__init__", "constructor"))
        block_on_exhaustion = bool(block_on_exhaustion)
        if default_timeout is not None:
            default_timeout = _cast_double(default_timeout)
        max_size_class, max_regions, prewarm_size = (
            None if v is None else _cast_unsigned_long(v)
            for v in (max_size_class, max_regions, prewarm_size))
        if store is not None and not (hasattr(store, "register_buffer")
                                      and hasattr(store, "get_hostname")):
            raise RuntimeError("BufferPool store parameter must be a PyClient or store wrapper "
                               "that implements _get_pyclient_capsule()")
        if store is None or not _is_set_up(store):
            raise RuntimeError("MooncakeDistributedStore is not initialized")
        if min_size_class <= 0 or alignment <= 0:
            raise RuntimeError("min_size_class and alignment must be positive")
        if alignment < ctypes.sizeof(ctypes.c_void_p) or alignment & (alignment - 1):
            raise RuntimeError("alignment must be a power of two and at least sizeof(void*)")
        local = _local_buffer_capacity(store)
        if max_bytes == 0:
            max_bytes = local
            if max_bytes == 0:
                raise RuntimeError("max_bytes must be positive")
            overflow_limit = 2 * local
        else:
            overflow_limit = local
        self._store = store
        self._max_bytes = int(max_bytes)
        self._min_class = int(min_size_class)
        self._max_class = min(self._max_bytes if max_size_class is None else int(max_size_class),
                              self._max_bytes)
        self._alignment = int(alignment)
        self._block = bool(block_on_exhaustion)
        self._default_timeout = default_timeout
        self._max_regions = max_regions
        self._cond = threading.Condition()
        self._free: dict[int, list[_Region]] = {}  # size class -> [Region]
        self._regions = 0
        self._total_bytes = 0
        self._reserved_bytes = 0
        self._in_use: set[int] = set()  # ids of leased regions
        # Overflow leases (upstream's `allocate_overflow`): one-off regions of the requested
        # size, outside `max_bytes`, handed out when the pool has no room. The bytes leased
        # (overflow and pool leases, as requested) stay within the store's local buffer size
        # (twice that when `max_bytes=0`): the rule that reproduces every answer of upstream's
        # in tests/test_dropin_buffer_pool.py.
        self._overflow_limit = overflow_limit
        self._overflow_bytes = 0
        self._leased_bytes = 0  # requested bytes of the leases of pool regions
        self._closed = False
        if prewarm_size is not None and prewarm_count > 0:
            self.prewarm(prewarm_size, prewarm_count)

    # ---- sizing -------------------------------------------------------------------------

    def _align(self, size: int) -> int:
        a = self._alignment
        return (size + a - 1) // a * a

    def _class_of(self, size: int) -> tuple[int, bool]:
        """`(size_class, oversize)` for a request of `size` bytes."""
        size = max(int(size), 1)
        if size > self._max_class:
            return self._align(size), True
        if size <= self._min_class:
            return self._min_class, False
        if size <= self._alignment:
            p = 1
            while p < size:
                p <<= 1
            return p, False
        return self._align(size), False

    def _has_capacity(self, size_class: int) -> bool:
        used = self._total_bytes + self._reserved_bytes
        if size_class > self._max_bytes or used + size_class > self._max_bytes:
            return False
        return self._max_regions is None or self._regions < self._max_regions

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("buffer pool is closed")

    # ---- regions ------------------------------------------------------------------------

    def _has_overflow_room(self, size: int) -> bool:
        used = self._overflow_bytes + self._leased_bytes
        if used + size > self._overflow_limit:
            return False
        return self._max_regions is None or self._regions < self._max_regions

    def _new_overflow(self, size: int) -> _Region:
        """An overflow region of `size` bytes (lock held, room checked)."""
        self._overflow_bytes += size
        self._regions += 1
        ok = False
        try:
            region = _Region(size, self._alignment, overflow=True)
            if self._store.register_buffer(region.ptr, size) != 0:
                region.free()
                raise RuntimeError("overflow buffer registration failed")
            ok = True
            return region
        finally:
            if not ok:
                self._overflow_bytes -= size
                self._regions -= 1

    def _new_region(self, size_class: int) -> _Region:
        """Maps and registers a region; called with the lock held, the capacity reserved."""
        self._reserved_bytes += size_class
        self._regions += 1
        ok = False
        try:
            region = _Region(size_class, self._alignment)
            if self._store.register_buffer(region.ptr, size_class) != 0:
                region.free()
                raise RuntimeError("register_buffer failed")
            ok = True
            return region
        finally:
            self._reserved_bytes -= size_class
            if ok:
                self._total_bytes += size_class
            else:
                self._regions -= 1

    def _drop_region(self, region: _Region) -> None:
        self._store.unregister_buffer(region.ptr)
        region.free()
        self._regions -= 1
        if region.overflow:
            self._overflow_bytes -= region.size
        else:
            self._total_bytes -= region.size

    def _release(self, region: _Region, size: int) -> None:
        with self._cond:
            self._in_use.discard(id(region))
            if not region.overflow:
                self._leased_bytes -= size
            if self._closed or region.overflow or region.size > self._max_class:
                self._drop_region(region)
            else:
                self._free.setdefault(region.size, []).append(region)
            self._cond.notify_all()

    def _evict_one_free(self, size_class: int) -> bool:
        """Frees an idle region of another class to make room; True if one was freed."""
        for cls, regions in self._free.items():
            if cls != size_class and regions:
                self._drop_region(regions.pop())
                return True
        return False

    # ---- API ----------------------------------------------------------------------------

    def acquire(self, size: int, block: object = None, timeout: Optional[float] = None
                ) -> BufferLease:
        """A `BufferLease` of at least `size` bytes: a free buffer of its size class, else a
        new one (evicting free buffers of other classes to make room). Waits when the pool is
        exhausted and `block` (else raises `RuntimeError`), at most `timeout` seconds."""
        if not isinstance(size, int) or size < 0:  # bool included, as pybind11 takes it
            raise TypeError(_signature_error("acquire", "function"))
        block = self._block if block is None else _cast_bool(block)
        timeout = self._default_timeout if timeout is None else _cast_double(timeout)
        if timeout is not None and timeout < 0:
            raise RuntimeError("timeout must be non-negative")
        size_class, oversize = self._class_of(size)
        if size_class > self._max_bytes and max(size, 1) > self._overflow_limit:
            raise RuntimeError("requested buffer size exceeds pool capacity")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                self._check_open()
                region = None
                if not oversize and self._free.get(size_class):
                    region = self._free[size_class].pop()
                else:
                    while not self._has_capacity(size_class) and self._evict_one_free(size_class):
                        pass
                    if self._has_capacity(size_class):
                        region = self._new_region(size_class)
                    elif self._has_overflow_room(max(int(size), 1)):
                        region = self._new_overflow(max(int(size), 1))
                if region is not None:
                    self._in_use.add(id(region))
                    if not region.overflow:
                        self._leased_bytes += int(size)
                    return BufferLease(self, region, int(size))
                if not block:
                    raise RuntimeError("buffer pool is exhausted")
                if deadline is None:
                    self._cond.wait()
                else:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise RuntimeError("timed out waiting for buffer")
                    self._cond.wait(left)

    def buffer(self, size: int, block: object = None, timeout: Optional[float] = None
               ) -> BufferLease:
        """Same as `acquire` (upstream's alias)."""
        return self.acquire(size, block=block, timeout=timeout)

    def prewarm(self, size: int, count: int) -> None:
        """Allocates up to `count` free buffers of `size`'s class now, so later `acquire`s find
        them. Best effort, as upstream's: it stops where the pool is full, and does nothing for
        an oversize class or a closed pool."""
        for value in (size, count):
            if not isinstance(value, int) or value < 0:
                raise TypeError(_signature_error("prewarm", "function"))
        size_class, oversize = self._class_of(size)
        if oversize:
            return
        with self._cond:
            for _ in range(count):
                if self._closed or not self._has_capacity(size_class):
                    return
                self._free.setdefault(size_class, []).append(self._new_region(size_class))
                self._cond.notify_all()

    def close(self) -> None:
        """Frees every buffer of the pool; raises `RuntimeError` while a lease is still held.
        Idempotent."""
        with self._cond:
            if self._closed:
                return
            if self._in_use:
                raise RuntimeError("cannot close buffer pool with active leases")
            self._closed = True
            for regions in self._free.values():
                while regions:
                    self._drop_region(regions.pop())
            self._free.clear()
            self._cond.notify_all()

    def __enter__(self) -> "BufferPool":
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        self.close()
        return False

    def __repr__(self) -> str:
        return (f"<BufferPool max_bytes={self._max_bytes} regions={self._regions} "
                f"in_use={len(self._in_use)}{' closed' if self._closed else ''}>")


_SIGNATURES = {
    "__init__": "(self: mooncake.store.BufferPool, store: object, max_bytes: int = 0, "
                "min_size_class: int = 65536, max_size_class: object = None, alignment: int = "
                "8388608, block_on_exhaustion: bool = True, default_timeout: object = None, "
                "max_regions: object = None, prewarm_size: object = None, prewarm_count: int = "
                "0) -> None",
    "acquire": "(self: mooncake.store.BufferPool, size: int, block: object = None, timeout: "
               "object = None) -> mooncake.store.BufferLease",
    "prewarm": "(self: mooncake.store.BufferPool, size: int, count: int) -> None",
}


def _signature_error(name: str, kind: str) -> str:
    """pybind11's message for arguments that do not fit `name`'s signature."""
    return (f"{name}(): incompatible {kind} arguments. The following argument types are "
            f"supported:\n    1. {_SIGNATURES[name]}\n")


def _cast_unsigned_long(value: Any) -> int:
    """pybind11's conversion of an `object` argument to `size_t`."""
    if isinstance(value, int) and 0 <= value < 1 << 64:
        return value
    raise RuntimeError(f"Unable to cast Python instance of type {type(value)} to C++ type "
                       "'unsigned long'")


def _cast_bool(value: Any) -> bool:
    """pybind11's conversion of an `object` argument to `bool`."""
    if value is None or isinstance(value, (bool, int)) or hasattr(type(value), "__bool__"):
        return bool(value)
    raise RuntimeError(f"Unable to cast Python instance of type {type(value)} to C++ type 'bool'")


def _cast_double(value: Any) -> float:
    """pybind11's conversion of an `object` argument to `double`."""
    if isinstance(value, (int, float)) or hasattr(type(value), "__float__"):
        return float(value)
    raise RuntimeError(
        f"Unable to cast Python instance of type {type(value)} to C++ type 'double'")


def _is_set_up(store: Any) -> bool:
    try:
        return bool(store.get_hostname())
    except Exception:  # noqa: BLE001
        return False


def _local_buffer_capacity(store: Any) -> int:
    f = getattr(store, "_local_buffer_capacity", None)
    try:
        return int(f()) if f is not None else 0
    except Exception:  # noqa: BLE001
        return 0


class BufferLeaseView:
    """The name of the object behind a lease's `buffer` in upstream's binding (there a
    `memoryview` over a `BufferLeaseView`; here over the pool's mapping). It cannot be made
    from Python, as upstream's cannot."""

    __slots__ = ()

    def __new__(cls, *args: object, **kwargs: object) -> NoReturn:
        raise TypeError("mooncake.store.BufferLeaseView: No constructor defined!")


RegisteredBufferPool = BufferPool
RegisteredBufferLease = BufferLease
RegisteredBufferLeaseView = BufferLeaseView
