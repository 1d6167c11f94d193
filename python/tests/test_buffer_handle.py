"""`mooncake.store.BufferHandle`: what `get_buffer` returns, checked without a cluster.

A `bytearray` subclass (so it has the buffer protocol under abi3 on every supported Python)
with upstream's `ptr()` and `size()`, shown and pickled as `mooncake.store.BufferHandle`."""

import ctypes
import pickle

import pytest

import mooncake.store as ms
from mooncake import _native


def test_is_the_same_class_everywhere():
    assert ms.BufferHandle is _native.BufferHandle
    assert issubclass(ms.BufferHandle, bytearray)
    assert ms.BufferHandle.__module__ == "mooncake.store"
    assert ms.BufferHandle.__qualname__ == "BufferHandle"
    assert ms.BufferHandle.__doc__


def test_ptr_size_repr_and_buffer():
    h = ms.BufferHandle(b"hello")
    assert h.size() == len(h) == 5
    assert repr(h) == "<BufferHandle size=5>"
    assert h.ptr() == ctypes.addressof((ctypes.c_char * 5).from_buffer(h))
    assert ctypes.string_at(h.ptr(), 5) == b"hello"
    with memoryview(h) as m:
        assert m.tobytes() == b"hello" and not m.readonly
    assert ms.BufferHandle().size() == 0


def test_no_instance_dict():
    with pytest.raises(AttributeError):
        ms.BufferHandle(b"x").tag = 1


def test_pickles_by_its_public_name():
    h = ms.BufferHandle(b"abc")
    back = pickle.loads(pickle.dumps(h))
    assert type(back) is ms.BufferHandle and back == h


def test_get_buffer_returns_one(store):
    assert store.put("buffer-handle-type", b"payload") == 0
    h = store.get_buffer("buffer-handle-type")
    assert type(h) is ms.BufferHandle
    assert bytes(h) == b"payload" and h.size() == 7
    assert ctypes.string_at(h.ptr(), h.size()) == b"payload"
    (b,) = store.batch_get_buffer(["buffer-handle-type"])
    assert type(b) is ms.BufferHandle and b == h
