"""Membership of a Mooncake PG: joining by extension, activation, deactivation, peer state.

The agreement itself runs in Rust (``collective::membership``): the lowest live
active rank decides proposals through the shared segments and every member switches views
at the same collective op. This module is the torch-facing half: it finds the members'
segments through the torch store for a process that joins an existing group
(``MooncakeBackendOptions(..., is_extension=True)``) and turns the module functions of
``mooncake.pg`` into proposals. See ``docs/pg.md`` (Membership).
"""

from __future__ import annotations

import os
import uuid
import warnings
from collections.abc import Iterable
from typing import Any

from mooncake import _native
from mooncake._pg_common import (
    _GROUP_KEY,
    ProposalStatus,
    ProposeViewUpdateResponse,
    _host_id,
)

# How long a proposal waits for the decider's answer (admission of a joiner takes up to 20 s).
PROPOSAL_TIMEOUT_S = 60.0
# How long join_group waits to be activated (upstream: 300 s).
JOIN_TIMEOUT_S = 300.0


def _proc_key(rank):
    return f"mooncake_pg/proc/{rank}"


def publish(store, rank, comm, endpoint):
    """Publishes where a process replacing another rank later finds this one: on this host
    its segment (``/proc/<pid>/fd/<fd>``), on another host its listener (``endpoint``,
    ``host:port``)."""
    pid, fd = comm.proc_path()
    store.set(_proc_key(rank), f"{_host_id()}\n{pid}\n{fd}\n{endpoint}")


_SHAPE_KEY = "mooncake_pg/shape"


def publish_shape(store, slots, global_ranks):
    """Publishes the group's shape (max_group_size and the founders' global ranks in group
    order), which a process extending the group checks it matches."""
    store.set(_SHAPE_KEY, f"{slots}\n{','.join(str(r) for r in global_ranks)}")


def resolve(store, rank, slots, global_ranks):
    """How many founding ranks the existing group this extension attaches to has, or
    ``(None, why)``. As upstream's AttachOrExtend: a group in the same torch group (store
    prefix) with the same max_group_size whose founders' global ranks are the request's
    (a replacement process) or a proper prefix of them with the caller in the appended part
    (``new_group([0])`` extended by ``new_group([0, 2])``)."""
    if not store.check([_SHAPE_KEY]):
        return None, "no group was created under this torch group"
    mgs, order = store.get(_SHAPE_KEY).decode().split("\n", 1)
    order = [int(x) for x in order.split(",") if x]
    if int(mgs) != slots:
        return None, f"the group's max_group_size is {mgs}, this one asks for {slots}"
    if list(global_ranks[:len(order)]) != order or len(order) > len(global_ranks):
        return None, (f"the group's ranks {order} are not a prefix of this group's "
                      f"{list(global_ranks)}")
    if len(order) < len(global_ranks) and rank < len(order):
        return None, f"rank {rank} is a founding rank of the group, not an appended one"
    return len(order), ""


def connect_extension(store, rank, slots, auto_deactivate, global_ranks, host_ip):
    """Creates this process's segment and attaches it to the existing group as slot ``rank``
    (not active until :func:`join_group` is answered by an activation): members on this
    host are mapped, members on other hosts are linked over TCP (``net.rs``). If no matching
    group exists (:func:`resolve`), the communicator runs alone and ``join_group`` raises
    "extension target not found", as upstream's local-only communicator."""
    path = f"/dev/shm/mooncake-pg-{os.getpid()}-{uuid.uuid4().hex[:16]}"
    comm = _native.PgComm(path, rank, slots)
    try:
        me = _host_id()
        port = comm.listen(host_ip)
        endpoint = f"[{host_ip}]:{port}" if ":" in host_ip else f"{host_ip}:{port}"
        founders, why = resolve(store, rank, slots, global_ranks)
        if founders is None:
            warnings.warn(f"mooncake.pg: extension target not found: {why}", stacklevel=3)
        # The founders agreed on direct reads; this process must follow their decision.
        ready = [f"mooncake_pg/ready/{r}" for r in range(founders or 0)]
        group_cma = bool(ready) and all(store.check([k]) and store.get(k) == b"1"
                                        for k in ready)
        paths, endpoints = [], []
        for r in range(slots):
            key = _proc_key(r)
            if founders is None or r == rank or not store.check([key]):
                paths.append(None)
                endpoints.append(None)
                continue
            host, pid, fd, *rest = store.get(key).decode().split("\n")
            if host == me:
                paths.append(f"/proc/{pid}/fd/{fd}")
                endpoints.append(None)
                continue
            if group_cma:
                raise RuntimeError(
                    f"rank {r} runs on another host ({host.split('/')[0]}) and the group reads "
                    "its peers' memory directly (process_vm_readv), which a process on "
                    "another host cannot serve: run the group with MC_PG_CMA=0 to let a "
                    "process join it from another host (docs/pg.md, Membership)"
                )
            paths.append(None)
            endpoints.append(rest[0] if rest else None)
        group = (store.get(_GROUP_KEY).decode()
                 if founders is not None and store.check([_GROUP_KEY]) else "")
        comm.connect_extension(paths, auto_deactivate, endpoints, group)
        if group_cma and not comm.cma_probe():
            raise RuntimeError(
                "the group reads peers' memory directly (process_vm_readv) but this process "
                "cannot; start it under the same user without ptrace restrictions, or run the "
                "whole group with MC_PG_CMA=0"
            )
        comm.set_cma(group_cma)
        publish(store, rank, comm, endpoint)
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    return comm


def _targets(pg, ranks):
    """Bit mask of ``ranks``, or the reason they are not in-group ranks."""
    mask = 0
    for r in ranks:
        if isinstance(r, bool) or not isinstance(r, int):
            return None, f"rank {r!r} is not an int"
        if not 0 <= r < pg._max_group_size:
            return None, (f"rank {r} is out of range: this group has ranks "
                          f"0..{pg._max_group_size - 1}")
        mask |= 1 << r
    return mask, ""


def _propose(pg: Any, ranks: Iterable[int], activate: bool) -> ProposeViewUpdateResponse:
    mask, why = _targets(pg, list(ranks))
    if mask is None:
        return ProposeViewUpdateResponse(ProposalStatus.Rejected, pg._comm.epoch(), (), why)
    if mask == 0:
        return ProposeViewUpdateResponse(ProposalStatus.Applied, pg._comm.epoch())
    status, _vid, dropped, reason = pg._comm.propose(activate, mask, PROPOSAL_TIMEOUT_S)
    dropped_ranks = [r for r in range(pg._max_group_size) if dropped >> r & 1]
    return ProposeViewUpdateResponse(
        ProposalStatus(status), pg._comm.epoch(), dropped_ranks, reason)


def activate_ranks(pg: Any, ranks: Iterable[int]) -> ProposeViewUpdateResponse:
    """``mooncake.pg.activate_ranks`` on a resolved group."""
    return _propose(pg, ranks, True)


def deactivate_ranks(pg: Any, ranks: Iterable[int]) -> ProposeViewUpdateResponse:
    """``mooncake.pg.deactivate_ranks`` on a resolved group."""
    ranks = list(ranks)
    if ranks and all(r == pg._rank for r in ranks) and pg._comm.active() >> pg._rank & 1:
        pg._comm.leave()
        return ProposeViewUpdateResponse(ProposalStatus.Applied, pg._comm.epoch())
    return _propose(pg, ranks, False)


def join_group(pg: Any) -> None:
    """``mooncake.pg.join_group`` on a resolved group."""
    pg._comm.join(JOIN_TIMEOUT_S)


def get_peer_state(pg: Any, ranks: Iterable[int]) -> list[bool]:
    """``mooncake.pg.get_peer_state`` on a resolved group."""
    out: list[bool] = []
    for r in ranks:
        if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < pg._max_group_size:
            raise RuntimeError(f"rank {r!r} out of [0, {pg._max_group_size})")
        out.append(bool(pg._comm.peer_ready(r)))
    return out


def get_num_synced_ranks(pg: Any) -> int:
    """``mooncake.pg.get_num_synced_ranks`` on a resolved group."""
    return sum(1 for r in range(pg._max_group_size) if pg._comm.peer_ready(r))
