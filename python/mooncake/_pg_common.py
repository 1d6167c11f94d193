"""What ``mooncake.pg`` and its membership half (``_pg_membership``) share: the group's store
key, the answer of a view proposal and this host's id. Neither of the two imports the other:
``pg`` imports ``_pg_membership`` and hands it resolved groups; both import this module.
"""

from __future__ import annotations

import enum
import os
import socket
from collections.abc import Iterable

# Store key of the group's id (random, chosen by rank 0): with a cluster secret every TCP link
# of the group proves it knows both (docs/pg.md, Security).
_GROUP_KEY = "mooncake_pg/group"


class ProposalStatus(enum.IntEnum):
    Rejected = 0
    Applied = 1
    AppliedWithDroppedRanks = 2


ViewUpdateStatus = ProposalStatus


class ProposeViewUpdateResponse:
    """Answer of :func:`activate_ranks` / :func:`deactivate_ranks`."""

    __slots__ = ("_status", "_epoch", "_dropped", "_reason")

    def __init__(
        self,
        status: ProposalStatus,
        new_epoch: int,
        dropped_ranks: Iterable[int] = (),
        reject_reason: str = "",
    ) -> None:
        self._status, self._epoch = status, new_epoch
        self._dropped, self._reason = list(dropped_ranks), reject_reason

    @property
    def status(self) -> ProposalStatus:
        return self._status

    @property
    def new_epoch(self) -> int:
        return self._epoch

    @property
    def dropped_ranks(self) -> list[int]:
        return list(self._dropped)

    @property
    def reject_reason(self) -> str:
        return self._reason

    def __repr__(self) -> str:
        return f"ProposeViewUpdateResponse(status={self._status!r}, new_epoch={self._epoch})"


def _host_id() -> str:
    """Ranks with equal host ids share memory; others are linked over TCP. ``MC_PG_HOST_ID``
    overrides it (tests run "other hosts" on one machine that way)."""
    forced = os.environ.get("MC_PG_HOST_ID")
    if forced:
        return forced
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"
