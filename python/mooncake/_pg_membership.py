"""Membership of a Mooncake PG: joining by extension, activation, deactivation, peer state.

The agreement itself runs in Rust (``dataplane::collective::membership``): the lowest live
active rank decides proposals through the shared segments and every member switches views
at the same collective op. This module is the torch-facing half: it finds the members'
segments through the torch store for a process that joins an existing group
(``MooncakeBackendOptions(..., is_extension=True)``) and turns the module functions of
``mooncake.pg`` into proposals. See ``docs/pg.md`` (Membership).
"""

from __future__ import annotations

import os
import uuid

from mooncake import _native
from mooncake.pg import (
    ProposalStatus,
    ProposeViewUpdateResponse,
    _host_id,
    _pg,
)

# How long a proposal waits for the decider's answer (admission of a joiner takes up to 20 s).
PROPOSAL_TIMEOUT_S = 60.0
# How long join_group waits to be activated (upstream: 300 s).
JOIN_TIMEOUT_S = 300.0


def _proc_key(rank):
    return f"mooncake_pg/proc/{rank}"


def publish(store, rank, comm):
    """Publishes where this rank's segment can be reopened (``/proc/<pid>/fd/<fd>``), so a
    process replacing another rank later can map it."""
    pid, fd = comm.proc_path()
    store.set(_proc_key(rank), f"{_host_id()}\n{pid}\n{fd}")


def connect_extension(store, rank, size, auto_deactivate):
    """Creates this process's segment and attaches it to the existing group as rank ``rank``
    (not active until :func:`join_group` is answered by an activation)."""
    path = f"/dev/shm/mooncake-pg-{os.getpid()}-{uuid.uuid4().hex[:16]}"
    comm = _native.PgComm(path, rank, size)
    try:
        me = _host_id()
        paths = []
        for r in range(size):
            key = _proc_key(r)
            if r == rank or not store.check([key]):
                paths.append(None)
                continue
            host, pid, fd = store.get(key).decode().split("\n")
            if host != me:
                raise RuntimeError(
                    f"rank {r} runs on another host ({host.split('/')[0]}): mooncake-rs's "
                    "Mooncake PG connects ranks of one host only (docs/pg.md)"
                )
            paths.append(f"/proc/{pid}/fd/{fd}")
        comm.connect_extension(paths, auto_deactivate)
        ready = [f"mooncake_pg/ready/{r}" for r in range(size)]
        group_cma = all(store.check([k]) and store.get(k) == b"1" for k in ready)
        if group_cma and not comm.cma_probe():
            raise RuntimeError(
                "the group reads peers' memory directly (process_vm_readv) but this process "
                "cannot; start it under the same user without ptrace restrictions, or run the "
                "whole group with MC_PG_CMA=0"
            )
        comm.set_cma(group_cma)
        publish(store, rank, comm)
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
        if not 0 <= r < pg._size:
            return None, f"rank {r} is out of range: this group has ranks 0..{pg._size - 1}"
        mask |= 1 << r
    return mask, ""


def _propose(backend, ranks, activate):
    pg = _pg(backend)
    mask, why = _targets(pg, list(ranks))
    if mask is None:
        return ProposeViewUpdateResponse(ProposalStatus.Rejected, pg._comm.epoch(), (), why)
    if mask == 0:
        return ProposeViewUpdateResponse(ProposalStatus.Applied, pg._comm.epoch())
    if getattr(pg, "_cross_host", False):
        active = pg._comm.active()
        if (active & mask == mask) if activate else (active & mask == 0):
            return ProposeViewUpdateResponse(ProposalStatus.Applied, pg._comm.epoch())
        return ProposeViewUpdateResponse(
            ProposalStatus.Rejected, pg._comm.epoch(), (),
            "membership changes across hosts are not supported: this group has ranks on "
            "another host (docs/pg.md)")
    status, _vid, dropped, reason = pg._comm.propose(activate, mask, PROPOSAL_TIMEOUT_S)
    dropped_ranks = [r for r in range(pg._size) if dropped >> r & 1]
    return ProposeViewUpdateResponse(
        ProposalStatus(status), pg._comm.epoch(), dropped_ranks, reason)


def activate_ranks(backend, ranks):
    """Proposes activating ``ranks`` (in-group ranks); blocks until decided. ``Applied`` at
    once when they are all active already (so every survivor may call it); otherwise each
    target must be alive and waiting in :func:`join_group` (up to 20 s, then ``Rejected``).
    The change takes effect from the first collective no member had started when it was
    decided, on every member."""
    return _propose(backend, ranks, True)


recover_ranks = activate_ranks


def deactivate_ranks(backend, ranks):
    """Proposes deactivating ``ranks``; blocks until decided. ``[own rank]`` is a graceful
    leave: this rank's collectives fail from now on ("not active") and the others drop it
    from their next collective. Deactivating other ranks goes through the decider and takes
    effect at the same collective on every member."""
    pg = _pg(backend)
    ranks = list(ranks)
    if ranks and all(r == pg._rank for r in ranks) and pg._comm.active() >> pg._rank & 1:
        pg._comm.leave()
        return ProposeViewUpdateResponse(ProposalStatus.Applied, pg._comm.epoch())
    return _propose(backend, ranks, False)


def join_group(backend):
    """Waits (up to 300 s) until a member activates this rank (``activate_ranks`` /
    ``recover_ranks``). For a replacement process (``is_extension=True``) and for a rank that
    was deactivated (in-place rejoin). Raises if this rank is already active, left the group,
    or no live member exists."""
    pg = _pg(backend)
    pg._comm.join(JOIN_TIMEOUT_S)


def get_peer_state(backend, ranks):
    """Local readiness of each rank (no communication): alive and either active in the
    newest view or waiting in ``join_group``."""
    pg = _pg(backend)
    out = []
    for r in ranks:
        if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < pg._max_group_size:
            raise RuntimeError(f"rank {r!r} out of [0, {pg._max_group_size})")
        out.append(r < pg._size and pg._comm.peer_ready(r))
    return out


def get_num_synced_ranks(backend):
    """Ranks that are ready in the sense of :func:`get_peer_state` (this one included)."""
    pg = _pg(backend)
    return sum(1 for r in range(pg._size) if pg._comm.peer_ready(r))
