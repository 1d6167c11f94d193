"""`mooncake.store.bind_to_numa_node(node)`: run the calling thread on one NUMA node's CPUs and
prefer that node's memory for its allocations, as upstream's binding (libnuma's
`numa_run_on_node` and `numa_set_preferred`) does.

Nodes and their CPUs come from `/sys/devices/system/node` (no node directory: the machine is
node 0 with every CPU). The affinity is `sched_setaffinity` of this thread to the node's CPUs
(as the kernel intersects them with the process's cpuset); the memory preference is
`set_mempolicy(MPOL_PREFERRED, {node})`, a system call through libc. A node that does not
exist, or a call the kernel refuses, is a logged warning and changes nothing, as upstream
(which returns None either way); a `node` that is not an int is a `TypeError`.
"""

import ctypes
import logging
import os
import platform

log = logging.getLogger("mooncake.store")

_NODE_DIR = "/sys/devices/system/node"
_MPOL_PREFERRED = 1
# set_mempolicy's number per architecture (asm-generic for the rest).
_SYS_SET_MEMPOLICY = {"x86_64": 238, "aarch64": 237, "riscv64": 237, "ppc64le": 261,
                      "s390x": 270}


def _parse_list(text):
    """`0-3,8,10-11` -> {0, 1, 2, 3, 8, 10, 11}."""
    out = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _nodes():
    text = _read(f"{_NODE_DIR}/online")
    return _parse_list(text) if text is not None else {0}


def _node_cpus(node):
    text = _read(f"{_NODE_DIR}/node{node}/cpulist")
    if text is not None:
        return _parse_list(text)
    return set(range(os.cpu_count() or 1)) if node == 0 else set()


def _set_preferred(node):
    number = _SYS_SET_MEMPOLICY.get(platform.machine())
    if number is None:
        return f"set_mempolicy: unknown on {platform.machine()}"
    libc = ctypes.CDLL(None, use_errno=True)
    bits = ctypes.sizeof(ctypes.c_ulong) * 8
    mask = (ctypes.c_ulong * (node // bits + 1))()
    mask[node // bits] = 1 << (node % bits)
    rc = libc.syscall(ctypes.c_long(number), ctypes.c_int(_MPOL_PREFERRED), mask,
                      ctypes.c_ulong(len(mask) * bits + 1))
    if rc != 0:
        return f"set_mempolicy: {os.strerror(ctypes.get_errno())}"
    return None


def bind_to_numa_node(node):
    """bind_to_numa_node(node: int) -> None

    Bind the current thread and memory allocation preference to the specified NUMA node"""
    if not isinstance(node, int):  # bool included, as pybind11 takes it
        raise TypeError(
            "bind_to_numa_node(): incompatible function arguments. The following argument "
            "types are supported:\n    1. (node: int) -> None\n\nInvoked with: " + repr(node))
    nodes = _nodes()
    if node not in nodes:
        log.warning("Invalid NUMA node: %d. Valid range: 0-%d", node, max(nodes))
        return None
    cpus = _node_cpus(node)
    try:
        os.sched_setaffinity(0, cpus)
    except OSError as e:
        log.warning("numa_run_on_node failed for node %d: %s", node, e.strerror)
        return None
    problem = _set_preferred(node)
    if problem is not None:
        log.warning("numa_set_preferred failed for node %d: %s", node, problem)
    return None
