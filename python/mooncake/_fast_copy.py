"""`mooncake._fast_copy`: copy a list of ndarrays back to back into caller memory.

Upstream ships this as a C extension; the structured store's ragged columns use it to pack
rows into one buffer. `concat_arrays_into(arrays, dest_ptr, dest_size[, start[, count[,
nthreads]]])` copies the bytes of `arrays[start:start+count]` (each a C-contiguous ndarray)
to `dest_ptr`, one after the other, and returns the number of bytes copied. The arguments
are parsed as upstream's `PyArg_ParseTuple(args, "O!KK|nni", &PyList_Type, ...)` parses
them (positional only; `dest_ptr` / `dest_size` Python ints taken modulo 2**64; `start`
clamped to the list, `count < 0` or past the end meaning "to the end", `nthreads < 1` one
thread), with upstream's errors and messages.

Unlike upstream, which trusts the address, the copy never writes outside checked memory:
the bytes to be written, `[dest_ptr, dest_ptr + total)`, must lie in writable mappings of
this process and every source in readable ones (`/proc/self/maps`), and the destination
must not overlap a source; otherwise `ValueError` and nothing is written (upstream crashes,
or copies overlapping bytes in no defined order). The copies are `memmove`s through ctypes,
which release the GIL; `nthreads > 1` splits the arrays between that many threads, as
upstream's.
"""

import ctypes as _ctypes
import threading as _threading

import numpy as _np

__all__ = ["concat_arrays_into"]

_U64 = 1 << 64
_SSIZE_MAX = (1 << 63) - 1
_INT_MAX = (1 << 31) - 1


def _unsigned_long_long(value, position):
    # "K": an int (or subclass) only, masked to 64 bits.
    if not isinstance(value, int):
        raise TypeError(f"argument {position} must be int, not {_type_name(value)}")
    return value % _U64


def _ssize_t(value):
    # "n": anything with __index__, in range.
    value = _index(value)
    if not -_SSIZE_MAX - 1 <= value <= _SSIZE_MAX:
        raise OverflowError("Python int too large to convert to C ssize_t")
    return value


def _c_int(value):
    # "i": anything with __index__, in range.
    value = _index(value)
    if value > _INT_MAX:
        raise OverflowError("signed integer is greater than maximum")
    if value < -_INT_MAX - 1:
        raise OverflowError("signed integer is less than minimum")
    return value


def _index(value):
    try:
        return value.__index__() if not isinstance(value, int) else int(value)
    except AttributeError:
        raise TypeError(
            f"'{type(value).__name__}' object cannot be interpreted as an integer") from None


def _type_name(value):
    t = type(value)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _mappings():
    """`[(start, end, readable, writable)]` of this process, sorted by address."""
    out = []
    with open("/proc/self/maps", "rb") as f:
        for line in f:
            fields = line.split(None, 2)
            lo, hi = fields[0].split(b"-")
            perms = fields[1]
            out.append((int(lo, 16), int(hi, 16), perms[0:1] == b"r", perms[1:2] == b"w"))
    return out


def _covered(maps, start, length, writable):
    """True when `[start, start + length)` lies in mappings that are readable (or writable)."""
    end = start + length
    at = start
    for lo, hi, r, w in maps:
        if hi <= at:
            continue
        if lo > at or not (w if writable else r):
            return False
        at = hi
        if at >= end:
            return True
    return False


def concat_arrays_into(*args, **kwargs):
    """Scatter-copy arrays[start:start+count] into dest_ptr (GIL released)."""
    if kwargs:
        raise TypeError("concat_arrays_into() takes no keyword arguments")
    if len(args) < 3:
        raise TypeError(f"function takes at least 3 arguments ({len(args)} given)")
    if len(args) > 6:
        raise TypeError(f"function takes at most 6 arguments ({len(args)} given)")
    arrays = args[0]
    if not isinstance(arrays, list):
        raise TypeError(f"argument 1 must be list, not {_type_name(arrays)}")
    dest = _unsigned_long_long(args[1], 2)
    dest_size = _unsigned_long_long(args[2], 3)
    start = _ssize_t(args[3]) if len(args) > 3 else 0
    count = _ssize_t(args[4]) if len(args) > 4 else -1
    nthreads = _c_int(args[5]) if len(args) > 5 else 1

    n_list = len(arrays)
    start = min(max(start, 0), n_list)
    if count < 0 or start + count > n_list:
        count = n_list - start
    if count == 0:
        return 0
    nthreads = min(max(nthreads, 1), count)

    # Hold the arrays for the whole call (the list may change under us).
    items = arrays[start:start + count]
    srcs = []
    total = 0
    for i, item in enumerate(items):
        if not isinstance(item, _np.ndarray):
            raise TypeError(f"arrays[{start + i}] is not an ndarray")
        if not item.flags.c_contiguous:
            raise ValueError(f"arrays[{start + i}] is not C-contiguous")
        srcs.append((item.ctypes.data, item.nbytes))
        total += item.nbytes
    if total > dest_size:
        raise ValueError(f"destination buffer too small: need {total} bytes, got {dest_size}")
    if total == 0:
        return 0
    if dest + total > _U64:
        raise ValueError(f"destination range {dest:#x} + {total} wraps around")

    maps = _mappings()
    if not _covered(maps, dest, total, writable=True):
        raise ValueError(f"destination {dest:#x} + {total} bytes is not writable memory of "
                         "this process")
    for i, (ptr, nbytes) in enumerate(srcs):
        if nbytes == 0:
            continue
        if not _covered(maps, ptr, nbytes, writable=False):
            raise ValueError(f"arrays[{start + i}] is not readable memory of this process")
        if ptr < dest + total and dest < ptr + nbytes:
            raise ValueError(f"destination overlaps arrays[{start + i}]")

    # Upstream's split: ceil(count / nthreads) arrays per thread, in order.
    per = (count + nthreads - 1) // nthreads
    jobs = []
    offset = 0
    for t in range(0, count, per):
        chunk = srcs[t:t + per]
        jobs.append((dest + offset, chunk))
        offset += sum(nbytes for _, nbytes in chunk)

    def run(at, chunk):
        for ptr, nbytes in chunk:
            if nbytes:
                _ctypes.memmove(at, ptr, nbytes)
                at += nbytes

    threads = [_threading.Thread(target=run, args=job) for job in jobs[1:]]
    for th in threads:
        th.start()
    run(*jobs[0])
    for th in threads:
        th.join()
    return total
