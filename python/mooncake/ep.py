"""``mooncake.ep``: upstream's native EP module name. Re-exports ``mooncake.pg``'s public names
(as upstream does) and the EP helpers; the user-facing class is
``mooncake.mooncake_ep_buffer.Buffer``."""

from mooncake import _native
from mooncake.pg import *  # noqa: F401,F403
from mooncake.pg import __all__ as _pg_all
from mooncake.mooncake_ep_buffer import Buffer, EventHandle, EventOverlap  # noqa: F401

MAX_QP_COUNT = 256  # upstream's constant; no queue pairs on one host


def get_ep_buffer_size_hint(num_max_dispatch_tokens_per_rank, hidden, num_ranks, num_experts):
    """Upstream's EP buffer size for this shape: ``16E + 4ET(32 + 2H)`` bytes."""
    return _native.ep_size_hint(num_max_dispatch_tokens_per_rank, hidden, num_ranks, num_experts)


__all__ = list(_pg_all) + ["Buffer", "EventHandle", "EventOverlap", "MAX_QP_COUNT",
                           "get_ep_buffer_size_hint"]
