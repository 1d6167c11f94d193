"""How a payload's bytes come off the store: the store's fast paths when it has them, plain
``get`` when it does not, in the order upstream's module tries them.

Part of `mooncake.structured_object_store` (the public face; see its docstring).

A payload is read into memory this process owns (a fresh ``bytearray``, a fresh array, or the
caller's ``numpy`` destination), never into an address taken on trust:

- a whole payload: ``batch_get_into`` of every chunk into one registered buffer, else one
  ``get`` per chunk;
- a byte range of a payload (a whole ndarray member, or the rows a slice asks for):
  ``get_into`` when the range is exactly the one chunk, else ``get_into_ranges`` of just the
  pieces of the chunks the range covers, else ``get`` of each chunk it covers, copying the
  piece.

The fast paths write into registered memory, so they are used only when the store has both
``register_buffer`` and ``unregister_buffer``. The destination is registered for the call and
unregistered after it, also when the read fails (then an unregister error is dropped and the
read's error raised). A registration the store refuses as a duplicate (``-600``, the buffer
was registered before) is the caller's: it is used and left in place. Any other failed
registration raises ``RuntimeError`` naming ``register_buffer``, unwinding what was
registered. A method set to ``None`` (or missing) on the store is a path the store lacks.

Staging: registering costs our store a look at ``/proc/self/maps`` (it refuses unmapped
memory), a large part of a small read. So, as upstream's module does on a real store, a read
into fresh memory goes through a ``BufferPool`` lease when a pool is at hand (given to the
transfer, or made for a store that has a local buffer to carve it from: ours, set up), whose
memory stays registered: ``batch_get_into`` (a whole payload) or ``get_into_ranges`` (a
range) into the lease, then one copy out, and the lease goes back. A caller's destination is
never staged: it is registered and read into directly. Duck-typed stores without
``_local_buffer_capacity`` get no pool, so they see upstream's calls exactly. With a pool,
the small whole members of one materialize are fetched together (`prefetched`): one
``batch_get_into`` for all their chunks instead of a round trip each.
"""

from __future__ import annotations

import threading
import weakref
from contextlib import contextmanager
from typing import Any, Iterator, Mapping, Sequence

from mooncake._structured.common import _public


# Whole members up to this size are fetched together, in one call, when a read is staged
# (`_PayloadReads.prefetched`): for them the round trip, not the bytes, is the cost.
PREFETCH_MEMBER_MAX_BYTES = 4 << 20


class _PayloadReads:
    """The read paths of one store (looked up at each call, so a patched store is honoured)."""

    def __init__(self, store: Any, buffer_pool: Any = None) -> None:
        self.store = store
        self.pool = buffer_pool
        self._pool_known = buffer_pool is not None
        self._pool_lock = threading.Lock()  # a transfer may be shared by threads

    def staging_pool(self) -> Any:
        """The BufferPool reads into fresh memory are staged in, or None (made on first use
        for a store with a local buffer, as upstream makes one for its store)."""
        with self._pool_lock:
            if not self._pool_known:
                self._pool_known = True
                self.pool = _auto_pool(self.store)
                if self.pool is not None:
                    # Ours: its regions are unregistered (and unmapped) when we go, so the
                    # store never keeps a registration of memory that is gone.
                    weakref.finalize(self, _close_quietly, self.pool)
        return self.pool

    @contextmanager
    def staged(self, nbytes: int) -> Iterator[Any]:
        """A lease of ``nbytes`` registered bytes for the block, or None without a pool (or
        when the pool cannot serve it)."""
        pool = self.staging_pool() if nbytes > 0 else None
        lease = None
        if pool is not None:
            try:
                # Never wait: this thread may hold the lease another would wait for (a read
                # inside `prefetched`); a busy pool means the unstaged path.
                lease = pool.acquire(nbytes, block=False)
            except (RuntimeError, ValueError, MemoryError):
                lease = None
        try:
            yield lease
        finally:
            if lease is not None:
                lease.release()

    def _fn(self, name: str) -> Any:
        fn = getattr(self.store, name, None)
        return fn if callable(fn) else None

    def can_register(self) -> bool:
        return self._fn("register_buffer") is not None \
            and self._fn("unregister_buffer") is not None

    @contextmanager
    def registered(self, buffer: Any, label: str) -> Iterator[int]:
        """The address of ``buffer``, registered with the store for the block."""
        sos = _public()
        ptr, size = sos._buffer_ptr(buffer), sos._buffer_nbytes(buffer)
        owned = False
        if size:
            status = self._fn("register_buffer")(ptr, size)
            owned = status == 0
            if not owned and not sos._is_duplicate_buffer_registration(status):
                sos._check_status(status, "register_buffer", label)
        if not owned:
            yield ptr
            return
        done = False
        try:
            yield ptr
            done = True
        finally:
            try:
                sos._check_status(self._fn("unregister_buffer")(ptr), "unregister_buffer", label)
            except Exception:
                if done:
                    raise

    @contextmanager
    def prefetched(self, specs: Sequence[Mapping[str, Any]]) -> Iterator[Any]:
        """For the block, small whole payloads read ahead with one ``batch_get_into`` into
        one staged lease and answered from it (`_Prefetched`); None without a pool, or when
        fewer than two qualify or the pool cannot serve them."""
        wanted = {s["key"]: s for s in specs
                  if 0 < int(s["bytes"]) <= PREFETCH_MEMBER_MAX_BYTES}
        total = sum(int(s["bytes"]) for s in wanted.values())
        if len(wanted) < 2 or self.staging_pool() is None:
            total = 0
        with self.staged(total) as lease:
            chunks = [c for s in wanted.values() for c in s["chunks"]]
            if lease is None or not self._whole_into(chunks, lease.ptr):
                yield None
                return
            view = lease.buffer
            blobs, at, blob = {}, 0, None
            for key, spec in wanted.items():
                blobs[key] = view[at:at + int(spec["bytes"])]
                at += int(spec["bytes"])
            try:
                yield _Prefetched(self, blobs)
            finally:
                # The lease goes back to the pool: no view of it may outlive the block.
                for blob in blobs.values():
                    blob.release()
                view.release()
                del blobs, view, blob  # the lease counts who still holds its view

    # -- whole payloads ---------------------------------------------------------------------------

    def read_payload(self, spec: Mapping[str, Any]) -> bytes:
        size = int(spec["bytes"])
        if size == 0:
            return b""
        data = bytearray(size)
        with self.staged(size) as lease:
            if lease is not None and self._whole_into(spec["chunks"], lease.ptr):
                _copy_out(lease, data)
                return bytes(data)
        self.read_payload_into(spec, data)
        return bytes(data)

    def read_payload_into(self, spec: Mapping[str, Any], destination: Any) -> None:
        chunks = spec["chunks"]
        offsets = _public()._chunk_offsets(chunks)
        if self._fn("batch_get_into") is not None and self.can_register():
            with self.registered(destination, "bundle payload") as base:
                self._whole_into(chunks, base)
            return
        view = memoryview(destination).cast("B")
        for offset, chunk in zip(offsets, chunks):
            size = int(chunk["bytes"])
            if size:
                view[offset:offset + size] = self._get_chunk(chunk["key"], size)

    def _whole_into(self, chunks: Sequence[Mapping[str, Any]], base: int) -> bool:
        """Every chunk into registered memory at ``base`` with one ``batch_get_into``; False
        when the store has none."""
        batch_get_into = self._fn("batch_get_into")
        if batch_get_into is None:
            return False
        offsets = _public()._chunk_offsets(chunks)
        keys = [c["key"] for c in chunks]
        sizes = [int(c["bytes"]) for c in chunks]
        got = batch_get_into(keys, [base + o for o in offsets], sizes)
        if len(got) != len(keys):
            raise RuntimeError(f"batch_get_into returned {len(got)} results for "
                               f"{len(keys)} chunks")
        for key, want, n in zip(keys, sizes, got):
            if n != want:
                raise RuntimeError(f"batch_get_into failed for {key}: expected "
                                   f"{want}, got {n}")
        return True

    # -- byte ranges ------------------------------------------------------------------------------

    def read_range(self, spec: Mapping[str, Any], offset: int, length: int) -> bytes:
        if length <= 0:
            return b""
        data = bytearray(length)
        self.read_range_into(spec, data, offset, fresh=True)
        return bytes(data)

    def read_range_into(self, spec: Mapping[str, Any], destination: Any, offset: int,
                        fresh: bool = False) -> None:
        """Bytes ``[offset, offset + len(destination))`` of a payload into ``destination``
        (a bytearray, or a C-contiguous uint8 array). ``fresh``: memory of ours, not the
        caller's, so it may be staged through the pool."""
        length = _public()._buffer_nbytes(destination)
        if fresh and length:
            with self.staged(length) as lease:
                if lease is not None and self._ranges_into(
                        spec["chunks"], lease.ptr, [(offset, 0, length)], allow_get_into=False):
                    _copy_out(lease, destination)
                    return
        self.read_ranges_into(spec, destination, [(offset, 0, length)])

    def read_ranges_into(self, spec: Mapping[str, Any], destination: Any,
                         ranges: Sequence[tuple[int, int, int]],
                         label: str = "structured ndarray payload") -> None:
        """Each ``(payload offset, destination offset, length)`` of ``ranges``."""
        ranges = [r for r in ranges if r[2] > 0]
        if not ranges:
            return
        chunks = spec["chunks"]
        if self.can_register():
            with self.registered(destination, label) as base:
                if self._ranges_into(chunks, base, ranges, allow_get_into=len(ranges) == 1):
                    return
        view = memoryview(destination).cast("B")
        for src, dst, length in ranges:
            for key, chunk_size, at, within, size in _public()._payload_range_fragments(
                    chunks, src, length, dst):
                view[at:at + size] = memoryview(self._get_chunk(key, chunk_size))[
                    within:within + size]

    def read_rows_into(self, spec: Mapping[str, Any], destination: Any,
                       ranges: Sequence[tuple[int, int, int]]) -> None:
        """Scattered ``ranges`` (rows picked by index) into fresh ``destination``: one
        ``get_into_ranges`` of them all, staged when a pool is at hand."""
        size = _public()._buffer_nbytes(destination)
        with self.staged(size) as lease:
            if lease is not None and self._ranges_into(spec["chunks"], lease.ptr, ranges,
                                                       allow_get_into=False):
                _copy_out(lease, destination)
                return
        self.read_ranges_into(spec, destination, ranges, "structured ranged payload")

    def _ranges_into(self, chunks: Sequence[Mapping[str, Any]], base: int,
                     ranges: Sequence[tuple[int, int, int]], allow_get_into: bool = True) -> bool:
        """The ranges through ``get_into`` (one whole chunk) or ``get_into_ranges``; False
        when the store has neither."""
        get_into = self._fn("get_into") if allow_get_into else None
        if get_into is not None and len(ranges) == 1 and len(chunks) == 1:
            src, dst, length = ranges[0]
            key = chunks[0]["key"]
            if src == 0 and int(chunks[0]["bytes"]) == length:
                n = get_into(key, base + dst, length)
                if n != length:
                    raise RuntimeError(f"get_into failed for {key}: expected {length}, got {n}")
                return True
        get_into_ranges = self._fn("get_into_ranges")
        if get_into_ranges is None:
            return False
        frags = [f for src, dst, length in ranges
                 for f in _public()._payload_range_fragments(chunks, src, length, dst)]
        if not frags:
            return True
        keys = [f[0] for f in frags]
        sizes = [[f[4]] for f in frags]
        got = get_into_ranges([base], [keys], [[[f[2]] for f in frags]],
                              [[[f[3]] for f in frags]], [sizes])
        if len(got) != 1 or len(got[0]) != len(keys):
            raise RuntimeError("get_into_ranges returned invalid ranged result shape for "
                               f"{len(keys)} chunks")
        for key, want, n in zip(keys, sizes, got[0]):
            if list(n) != want:
                raise RuntimeError(f"get_into_ranges failed for {key}: expected {want[0]}, "
                                   f"got {list(n)}")
        return True

    def _get_chunk(self, key: str, size: int) -> Any:
        data = self.store.get(key)
        if data is None or len(data) != size:
            got = None if data is None else len(data)
            raise RuntimeError(f"get failed for {key}: expected {size} bytes, got {got}")
        return data


class _Prefetched:
    """The reads of one materialize: payloads fetched ahead are answered from memory, any
    other read passes on to the store's paths."""

    def __init__(self, reads: _PayloadReads, blobs: Mapping[str, memoryview]) -> None:
        self.reads = reads
        self.blobs = blobs

    def read_payload(self, spec: Mapping[str, Any]) -> bytes:
        blob = self.blobs.get(spec["key"])
        return self.reads.read_payload(spec) if blob is None else bytes(blob)

    def read_range(self, spec: Mapping[str, Any], offset: int, length: int) -> bytes:
        blob = self.blobs.get(spec["key"])
        if blob is None:
            return self.reads.read_range(spec, offset, length)
        return bytes(blob[offset:offset + max(0, length)])

    def read_range_into(self, spec: Mapping[str, Any], destination: Any, offset: int,
                        fresh: bool = False) -> None:
        blob = self.blobs.get(spec["key"])
        if blob is None:
            self.reads.read_range_into(spec, destination, offset, fresh)
            return
        out = memoryview(destination).cast("B")
        out[:] = blob[offset:offset + len(out)]


def _auto_pool(store: Any) -> Any:
    """A BufferPool for a store that has a local buffer to carve one from, else None."""
    capacity = getattr(store, "_local_buffer_capacity", None)
    try:
        if not callable(capacity) or int(capacity()) <= 0:
            return None
        from mooncake.buffer_pool import BufferPool

        return BufferPool(store)
    except (ImportError, AttributeError, RuntimeError, TypeError, ValueError):
        return None


def _close_quietly(pool: Any) -> None:
    try:
        pool.close()
    except Exception:  # noqa: BLE001  (a finaliser never raises; a held lease keeps it open)
        pass


def _copy_out(lease: Any, destination: Any) -> None:
    """The first ``len(destination)`` bytes of a lease into ``destination``."""
    out = memoryview(destination).cast("B")
    view = lease.buffer
    try:
        out[:] = view[:len(out)]
    finally:
        view.release()
