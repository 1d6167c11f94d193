"""`mooncake.fabric_allocator_utils`: find a shared library shipped in the `mooncake` package
and ask it which allocator backend it supports (upstream's helpers for its device-memory
allocator modules).

* `get_mooncake_so_path(so_name, import_error_message)`: the path of `so_name` in the
  package's directory (through `importlib.resources` first, then next to
  `mooncake/__init__.py`); `ImportError(import_error_message)` when it is not there. This
  build ships no such library (no CUDA, NVLink or fabric allocators), so callers get their
  `ImportError`, the answer upstream's non-CUDA wheel gives too.
* `probe_allocator_backend(so_path, probe_symbol, restype, unsupported_value)`: loads the
  library, calls `probe_symbol(0)` with the given ctypes `restype` and returns its result;
  a missing symbol, or a library that cannot be loaded or called, is a logged warning and
  `unsupported_value`.
"""

import ctypes
import logging
import os
from importlib import resources
from typing import Any, TypeVar

__all__ = ["get_mooncake_so_path", "probe_allocator_backend"]

logger = logging.getLogger(__name__)

ProbeValue = TypeVar("ProbeValue")


def get_mooncake_so_path(so_name: str, import_error_message: str) -> str:
    if not isinstance(so_name, str) or not so_name:
        raise TypeError("so_name must be a non-empty str")
    try:
        candidate = resources.files("mooncake").joinpath(so_name)
        if candidate.is_file():
            return str(candidate)
    except (ImportError, FileNotFoundError, TypeError, AttributeError):
        pass
    try:
        import mooncake

        here = os.path.join(os.path.dirname(os.path.abspath(mooncake.__file__)), so_name)
        if os.path.exists(here):
            return here
    except (ImportError, TypeError):
        pass
    raise ImportError(import_error_message)


def probe_allocator_backend(so_path: str, probe_symbol: str, restype: Any,
                            unsupported_value: ProbeValue) -> ProbeValue:
    name = os.path.basename(str(so_path))
    try:
        probe = getattr(ctypes.CDLL(so_path), probe_symbol)
    except AttributeError:
        logger.warning("Symbol '%s' not found in %s. Assuming allocator probing is "
                       "unsupported.", probe_symbol, name)
        return unsupported_value
    except Exception as exc:  # noqa: BLE001  (any load failure means "unsupported")
        logger.warning("Failed to probe allocator backend from %s: %s", name, exc)
        return unsupported_value
    try:
        probe.argtypes = [ctypes.c_int]
        probe.restype = restype
        return probe(0)
    except Exception as exc:  # noqa: BLE001
        logger.warning("Failed to probe allocator backend from %s: %s", name, exc)
        return unsupported_value
