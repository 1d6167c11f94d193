"""`mooncake.store.ErrorCode` names upstream's store error codes with upstream's numbers, and
is the same table as the native module's (`protocol::ErrorCode`, the source)."""

import enum

import mooncake.store as ms
from mooncake import _native
from mooncake.error_codes import ErrorCode


def test_enum_equals_the_native_table():
    native = _native._error_codes()
    assert native, "the native table is empty"
    # Same names, numbers and order; no number twice (an IntEnum alias would hide one).
    assert [(c.name, c.value) for c in ErrorCode] == native
    assert len({code for _, code in native}) == len(native)


def test_reexported_from_store_as_an_int_enum():
    assert ms.ErrorCode is ErrorCode
    assert "ErrorCode" in ms.__all__
    assert issubclass(ErrorCode, enum.IntEnum)


def test_upstream_numbers():
    assert ErrorCode.OK == 0
    assert ErrorCode.INVALID_PARAMS == -600
    assert ErrorCode.OBJECT_NOT_FOUND == -704
    assert ErrorCode.FILE_NOT_FOUND == -1100
    assert ErrorCode(-706) is ErrorCode.OBJECT_HAS_LEASE


def test_return_codes_stay_plain_ints_that_the_enum_names():
    s = ms.MooncakeDistributedStore()
    # Native (not set up) and pure Python (`_tensor`'s constant) return paths: plain ints, as
    # upstream returns them, never enum members.
    for rc in (s.put_from("k", 0, 1), s.get_tensor_into_cuda("k", None)):
        assert type(rc) is int
        assert ErrorCode(rc) is ErrorCode.INVALID_PARAMS
