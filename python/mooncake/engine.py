"""`mooncake.engine`: the transfer engine's Python API (upstream-compatible).

One-sided READ/WRITE between memory registered by processes, addressed by segment name and
absolute remote address. `TransferEngine` is the native class (`mooncake._native`); see its
method docs for the return conventions (0 / negative codes, batch id 0 on a failed
submission, `transfer_check_status` 1/0/-1/-2).

Protocol "tcp", or "rdma" (libibverbs loaded at run time; without a usable device
`initialize` returns -1 unless `MC_FORCE_TCP` is set, which runs TCP: docs/rdma.md); every
`SUPPORT_*` flag is False. Metadata: `http://host:port/metadata`, `P2PHANDSHAKE`, or etcd (`etcd://h:p`,
several endpoints separated by `,` or `;`, or a bare `h:p`); keys are prefixed with
`mooncake/<MC_METADATA_CLUSTER_ID>/` when that is set.

`get_engine()` returns an `InnerTransferEngine`; `MooncakeDistributedStore.setup(...,
engine=inner)` accepts it and ignores it (the store runs its own data plane).
"""

from mooncake._native import (  # noqa: F401  (re-exports)
    SUPPORT_CUDA,
    SUPPORT_EFA,
    SUPPORT_HIP,
    SUPPORT_INTRA_NVLINK,
    SUPPORT_MNNVL,
    SUPPORT_MUSA,
    InnerTransferEngine,
    Read,
    TransferEngine,
    TransferNotify,
    TransferOpcode,
    Write,
)

__all__ = [
    "TransferEngine",
    "TransferOpcode",
    "TransferNotify",
    "InnerTransferEngine",
    "Read",
    "Write",
    "SUPPORT_EFA",
    "SUPPORT_HIP",
    "SUPPORT_MNNVL",
    "SUPPORT_MUSA",
    "SUPPORT_INTRA_NVLINK",
    "SUPPORT_CUDA",
]
