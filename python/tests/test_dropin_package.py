"""Small pieces of upstream's package surface, side by side with the wheel: `import mooncake`
makes `mooncake.store` usable, `mooncake.store.bind_to_numa_node`, the `BufferLeaseView`
names, and `mooncake.fabric_allocator_utils`."""

import ctypes
import os
import platform
import threading

import pytest

import upstream

SCENARIO = r'''
def scenario():
    import ctypes, ctypes.util, os, threading
    import mooncake

    out = [["store via package", hasattr(mooncake, "store")
            and hasattr(mooncake.store, "MooncakeDistributedStore")]]
    import mooncake.store as ms

    out.append(["view alias", ms.RegisteredBufferLeaseView is ms.BufferLeaseView])
    try:
        ms.BufferLeaseView()
    except TypeError as e:
        out.append(["view ctor", str(e)])

    def bound(node):
        got = {}

        def run():
            try:
                got["rc"] = ms.bind_to_numa_node(node)
                got["cpus"] = sorted(os.sched_getaffinity(0))
            except Exception as e:  # noqa: BLE001
                got["rc"] = [type(e).__name__, str(e).splitlines()[0]]

        t = threading.Thread(target=run)
        t.start()
        t.join()
        return got

    for node in (0, 5, -1, "x", 1.5, None, True):
        out.append(["bind", repr(node), bound(node)])

    from mooncake import fabric_allocator_utils as fau

    try:
        fau.get_mooncake_so_path("no_such_allocator.so", "build it with the allocator")
    except ImportError as e:
        out.append(["so path", str(e)])
    libc = ctypes.util.find_library("c")
    out.append(["probe abs", fau.probe_allocator_backend(libc, "abs", ctypes.c_int, -7)])
    out.append(["probe missing", fau.probe_allocator_backend(libc, "no_such_probe",
                                                             ctypes.c_int, -7)])
    out.append(["probe no lib", fau.probe_allocator_backend("/nonexistent/lib.so", "abs",
                                                            ctypes.c_int, "unsupported")])
    return out
'''


def ours():
    scope = {}
    exec(SCENARIO, scope)
    return scope["scenario"]()


def test_answers_as_upstream():
    assert ours() == upstream.run(SCENARIO)


def test_without_the_wheel():
    got = {r[0] + (r[1] if r[0] == "bind" else ""): r[-1] for r in ours()}
    assert got["store via package"] is True and got["view alias"] is True
    assert got["view ctor"] == "mooncake.store.BufferLeaseView: No constructor defined!"
    node0 = got["bind0"]
    assert node0["rc"] is None and node0["cpus"]
    assert got["bind5"]["rc"] is None and got["bind5"]["cpus"] == sorted(os.sched_getaffinity(0))
    assert got["bind'x'"]["rc"][0] == "TypeError" and got["bindNone"]["rc"][0] == "TypeError"
    assert got["so path"] == "build it with the allocator"
    assert got["probe abs"] == 0 and got["probe missing"] == -7
    assert got["probe no lib"] == "unsupported"


GET_MEMPOLICY = {"x86_64": 239, "aarch64": 236}


@pytest.mark.skipif(platform.machine() not in GET_MEMPOLICY, reason="get_mempolicy's number")
def test_bind_sets_the_preferred_node():
    """The thread's memory policy afterwards is MPOL_PREFERRED on node 0 (read back with
    get_mempolicy), its affinity node 0's CPUs; other threads keep theirs."""
    from mooncake.store import bind_to_numa_node

    libc = ctypes.CDLL(None, use_errno=True)
    seen = {}

    def policy():
        mode = ctypes.c_int(-1)
        mask = (ctypes.c_ulong * 16)()
        rc = libc.syscall(ctypes.c_long(GET_MEMPOLICY[platform.machine()]),
                          ctypes.byref(mode), mask, ctypes.c_ulong(16 * 64 + 1), None,
                          ctypes.c_ulong(0))
        assert rc == 0, os.strerror(ctypes.get_errno())
        return mode.value, mask[0]

    def run():
        seen["before"] = policy()
        bind_to_numa_node(0)
        seen["after"] = policy()

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert seen["before"][0] == 0  # MPOL_DEFAULT
    assert seen["after"] == (1, 1)  # MPOL_PREFERRED, node 0
    assert policy()[0] == 0  # this thread untouched
