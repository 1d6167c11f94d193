"""`mooncake.async_store.MooncakeDistributedStoreAsync`: `await s.async_<name>(...)`."""

import asyncio

import pytest

from conftest import MIB, make_store


def test_async_wrappers_run_every_method(master):
    from mooncake.async_store import MooncakeDistributedStoreAsync
    from mooncake.store import MooncakeDistributedStore

    s = make_store(master, segment=32 * MIB, local_buffer=16 * MIB,
                   cls=MooncakeDistributedStoreAsync)
    try:
        assert isinstance(s, MooncakeDistributedStore)

        async def main():
            assert await s.async_put("as_k", b"v" * 100) == 0
            assert await s.async_get("as_k") == b"v" * 100
            assert await s.async_is_exist("as_k") == 1
            # Many calls at once, all in the default executor.
            keys = [f"as_{i}" for i in range(32)]
            rcs = await asyncio.gather(*(s.async_put(k, k.encode()) for k in keys))
            assert rcs == [0] * 32
            got = await asyncio.gather(*(s.async_get(k) for k in keys))
            assert got == [k.encode() for k in keys]
            assert await s.async_batch_is_exist(keys + ["as_missing"]) == [1] * 32 + [0]
            return True

        assert asyncio.run(main())
        assert "async_put" in s.__dict__  # cached on the instance
        with pytest.raises(AttributeError):
            s.async_no_such_method
        with pytest.raises(AttributeError):
            s.not_async_at_all
    finally:
        s.close()
