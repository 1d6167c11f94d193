"""`mooncake.store`: the distributed object store's Python API (upstream-compatible).

`MooncakeDistributedStore` is the native store class (`mooncake._native`) with Python mixins:
the tensor methods (`_tensor`), unified parallel tensor IO (`_parallel`), safetensors export and
import (`_safetensors`) and the segment / task methods and `setup_dummy` (`_cluster_ops`). It can
be subclassed (e.g. by an asyncio wrapper that sets attributes on its instances).
"""

from mooncake import _native
from mooncake._native import (  # noqa: F401  (re-exports)
    BufferHandle,
    Descriptor,
    MemoryDescriptor,
    ObjectDataType,
    ReplicaDescriptor,
    ReplicaStatus,
    ReplicateConfig,
    SoftPinAction,
    _decode_tensor_header,
    _encode_tensor_header,
    _tensor_metadata_size,
)
from mooncake._cluster_ops import (  # noqa: F401
    ClusterOps,
    DummyOps,
    QueryTaskResponse,
    TaskStatus,
    TaskType,
)
from mooncake._parallel import (  # noqa: F401  (re-exports)
    ParallelAxis,
    ParallelMethods,
    ReadTarget,
    TensorParallelism,
)
from mooncake._safetensors import SafetensorMethods
from mooncake._tensor import TensorMethods, _deserialize_tensor, _serialize_tensor  # noqa: F401
from mooncake.error_codes import ErrorCode
from mooncake.buffer_pool import (  # noqa: F401  (upstream binds the pool in this module)
    BufferLease,
    BufferLeaseView,
    BufferPool,
    RegisteredBufferLease,
    RegisteredBufferLeaseView,
    RegisteredBufferPool,
)
from mooncake._numa import bind_to_numa_node  # noqa: F401  (upstream's, in this module)


class MooncakeDistributedStore(
    TensorMethods,
    ParallelMethods,
    SafetensorMethods,
    DummyOps,
    ClusterOps,
    _native.MooncakeDistributedStore,
):
    """Client of a Mooncake store: `setup(...)`, then put/get bytes, buffers and tensors."""

    __module__ = "mooncake.store"


# Enum values at module scope, as upstream exports them.
for _name in (
    "UNKNOWN", "KVCACHE", "TENSOR", "WEIGHT", "SAMPLE", "ACTIVATION", "GRADIENT",
    "OPTIMIZER_STATE", "METADATA", "GENERAL",
    "UNDEFINED", "INITIALIZED", "PROCESSING", "COMPLETE", "REMOVED", "FAILED",
):
    globals()[_name] = getattr(_native, _name)
del _name
# Task enum values at module scope, as upstream exports them. Upstream's module-level
# PROCESSING and FAILED end up TaskStatus's (exported last); ours stay ReplicaStatus's, as
# this package has always exported them.
PENDING, SUCCESS = TaskStatus.PENDING, TaskStatus.SUCCESS
REPLICA_COPY, REPLICA_MOVE = TaskType.REPLICA_COPY, TaskType.REPLICA_MOVE

__all__ = [
    "MooncakeDistributedStore",
    "ReplicateConfig",
    "ReplicaDescriptor",
    "MemoryDescriptor",
    "Descriptor",
    "BufferHandle",
    "ObjectDataType",
    "ReplicaStatus",
    "SoftPinAction",
    "ErrorCode",
    "BufferPool",
    "BufferLease",
    "RegisteredBufferPool",
    "RegisteredBufferLease",
    "BufferLeaseView",
    "RegisteredBufferLeaseView",
    "bind_to_numa_node",
    "ParallelAxis",
    "TensorParallelism",
    "ReadTarget",
    "QueryTaskResponse",
    "TaskStatus",
    "TaskType",
]
