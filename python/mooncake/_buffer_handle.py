"""`BufferHandle`, the bytes of one object that `get_buffer` returns (`mooncake.store`).

A `bytearray` subclass rather than a native class: under the abi3 ABI a native class can export
the buffer protocol only from Python 3.11 on, and the package supports 3.10. The native module
creates each handle from this class and fills its bytes in place without the GIL
(`python/src/lib.rs`, `new_buffer_handle`).
"""


class BufferHandle(bytearray):
    """Bytes of one object returned by get_buffer: buffer protocol, ptr(), size(), len()."""

    __slots__ = ()
    __module__ = "mooncake.store"

    def ptr(self) -> int:
        """Address of the first byte."""
        # Imported here: the native module imports this file while it initialises.
        from mooncake._native import _bytearray_address

        return _bytearray_address(self)

    def size(self) -> int:
        """Size in bytes."""
        return len(self)

    def __repr__(self) -> str:
        return f"<BufferHandle size={len(self)}>"
