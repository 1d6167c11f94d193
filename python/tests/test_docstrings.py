"""Every public callable of the package's public classes has a docstring: `help()` and IDEs
show it, and for a native method it is the `///` comment on its `#[pymethods]` fn.

The walk covers each class exported by a public module (its `__all__`) and every class of
the native module (`mooncake._native`, some of which only come back from calls), with what
they inherit from the package's own classes and mixins; what they inherit from Python itself
(`int`, `bytearray`, `Enum`) has Python's docs already.
"""

import importlib
import inspect

import pytest

MODULES = [
    "mooncake",
    "mooncake.store",
    "mooncake.engine",
    "mooncake.async_store",
    "mooncake.buffer_pool",
    "mooncake.error_codes",
    "mooncake.shared_segment",
    "mooncake.dataproto_catalog",
    "mooncake.pg",
    "mooncake.ep",
]


def public_classes():
    seen = {}
    for name in MODULES:
        module = importlib.import_module(name)
        for attr in getattr(module, "__all__", ()):
            obj = getattr(module, attr)
            if inspect.isclass(obj) and obj.__module__.startswith("mooncake"):
                seen[f"{obj.__module__}.{obj.__qualname__}"] = obj
    native = importlib.import_module("mooncake._native")
    for attr in dir(native):
        obj = getattr(native, attr)
        if inspect.isclass(obj):
            seen[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return seen


def undocumented(cls):
    missing = []
    for name in dir(cls):
        if name.startswith("_"):
            continue
        # The class that defines it: Python's own builtins are documented by Python.
        owner = next((k for k in cls.__mro__ if name in vars(k)), None)
        if owner is None or not owner.__module__.startswith("mooncake"):
            continue
        raw = vars(owner)[name]
        if isinstance(raw, (staticmethod, classmethod)):
            raw = raw.__func__
        if inspect.isclass(raw) or not callable(raw):
            continue
        if not (getattr(raw, "__doc__", None) or "").strip():
            missing.append(f"{owner.__module__}.{owner.__qualname__}.{name}")
    return missing


def test_the_walk_sees_the_main_classes():
    names = public_classes()
    for want in (
        "MooncakeDistributedStore",
        "TransferEngine",
        "ReplicateConfig",
        "BufferPool",
        "PgComm",
        "_DummyClient",
    ):
        assert any(n.endswith("." + want) for n in names), (want, sorted(names))


@pytest.mark.parametrize("qualname", sorted(public_classes()))
def test_every_public_callable_has_a_docstring(qualname):
    missing = undocumented(public_classes()[qualname])
    assert not missing, "no docstring: " + ", ".join(sorted(set(missing)))
