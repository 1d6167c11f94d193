"""`MooncakeDistributedStoreAsync`: asyncio access to every store method (upstream's
`mooncake/async_store.py`).

The class subclasses `MooncakeDistributedStore`; `await store.async_<name>(...)` runs
`store.<name>(...)` in the event loop's default executor (the native call releases the GIL,
so other coroutines and threads keep running). The wrapper is made on first use and cached
as an instance attribute.
"""

import asyncio
import functools

from mooncake.store import MooncakeDistributedStore

__all__ = ["MooncakeDistributedStoreAsync"]


class MooncakeDistributedStoreAsync(MooncakeDistributedStore):
    def __getattr__(self, name: str):
        if not name.startswith("async_"):
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")
        sync_name = name[len("async_"):]
        try:
            sync_method = getattr(self, sync_name)
        except AttributeError:
            raise AttributeError(
                f"'{type(self).__name__}' object has no attribute '{name}' (nor '{sync_name}')"
            ) from None
        if not callable(sync_method):
            raise AttributeError(f"'{sync_name}' is not callable")
        wrapper = self._make_async_wrapper(sync_method)
        setattr(self, name, wrapper)
        return wrapper

    def _make_async_wrapper(self, sync_method):
        @functools.wraps(sync_method)
        async def wrapper(*args, **kwargs):
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(None, functools.partial(sync_method, *args, **kwargs))

        return wrapper
