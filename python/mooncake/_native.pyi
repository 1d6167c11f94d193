"""Type stubs of `mooncake._native`, the PyO3 module built from `python/src/*.rs`.

Most classes here are re-exported (and documented) by `mooncake.store`, `mooncake.engine`,
`mooncake.pg` and `mooncake.mooncake_ep_buffer`; their `__module__` says which. Return codes are
upstream Mooncake's: 0 or a positive count for success, a negative `mooncake.store.ErrorCode`
for a failure. `tests/test_stubs.py` checks this file against the built module with
`mypy.stubtest`; change both together.
"""

from collections.abc import Iterable, Sequence
from typing import Any, ClassVar, TypeAlias, final

from typing_extensions import Buffer, Self, disjoint_base

from mooncake._buffer_handle import BufferHandle as BufferHandle

__all__ = [
    "MooncakeDistributedStore",
    "_DummyClient",
    "ReplicateConfig",
    "ReplicaDescriptor",
    "MemoryDescriptor",
    "Descriptor",
    "ObjectDataType",
    "ReplicaStatus",
    "SoftPinAction",
    "BufferHandle",
    "UNKNOWN",
    "KVCACHE",
    "TENSOR",
    "WEIGHT",
    "SAMPLE",
    "ACTIVATION",
    "GRADIENT",
    "OPTIMIZER_STATE",
    "METADATA",
    "GENERAL",
    "UNDEFINED",
    "INITIALIZED",
    "PROCESSING",
    "COMPLETE",
    "REMOVED",
    "FAILED",
    "run_master",
    "run_http_metadata_server",
    "run_client",
    "run_transfer_engine_bench",
    "_error_codes",
    "_bytearray_address",
    "_tensor_metadata_size",
    "_tensor_dtypes",
    "_encode_tensor_header",
    "_decode_tensor_header",
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
    "PgComm",
    "PgWork",
    "pg_set_timeout_us",
    "EpBuffer",
    "ep_size_hint",
    "__version__",
]

__version__: str

# One axis of a sharded tensor's layout, as `protocol::tensor` encodes it.
_Axis = tuple[int, int, int, int, int, int, int]

@final
class ObjectDataType:
    """What an object holds (upstream `ObjectDataType`); compares equal to its int."""

    UNKNOWN: ClassVar[ObjectDataType]
    KVCACHE: ClassVar[ObjectDataType]
    TENSOR: ClassVar[ObjectDataType]
    WEIGHT: ClassVar[ObjectDataType]
    SAMPLE: ClassVar[ObjectDataType]
    ACTIVATION: ClassVar[ObjectDataType]
    GRADIENT: ClassVar[ObjectDataType]
    OPTIMIZER_STATE: ClassVar[ObjectDataType]
    METADATA: ClassVar[ObjectDataType]
    GENERAL: ClassVar[ObjectDataType]
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...
    def __index__(self) -> int: ...
    def __int__(self) -> int: ...

@final
class SoftPinAction:
    """What a put does to the object's soft pin (`ReplicateConfig.soft_pin_action`)."""

    PRESERVE: ClassVar[SoftPinAction]
    ENABLE: ClassVar[SoftPinAction]
    DISABLE: ClassVar[SoftPinAction]
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...
    def __index__(self) -> int: ...
    def __int__(self) -> int: ...

@final
class ReplicaStatus:
    """A replica's state (upstream `ReplicaStatus`); compares equal to its int."""

    UNDEFINED: ClassVar[ReplicaStatus]
    INITIALIZED: ClassVar[ReplicaStatus]
    PROCESSING: ClassVar[ReplicaStatus]
    COMPLETE: ClassVar[ReplicaStatus]
    REMOVED: ClassVar[ReplicaStatus]
    FAILED: ClassVar[ReplicaStatus]
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...
    def __index__(self) -> int: ...
    def __int__(self) -> int: ...

@final
class TransferOpcode:
    """`TransferOpcode.Read` (0) or `TransferOpcode.Write` (1)."""

    Read: ClassVar[TransferOpcode]
    Write: ClassVar[TransferOpcode]
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...
    def __index__(self) -> int: ...
    def __int__(self) -> int: ...

UNKNOWN: ObjectDataType
KVCACHE: ObjectDataType
TENSOR: ObjectDataType
WEIGHT: ObjectDataType
SAMPLE: ObjectDataType
ACTIVATION: ObjectDataType
GRADIENT: ObjectDataType
OPTIMIZER_STATE: ObjectDataType
METADATA: ObjectDataType
GENERAL: ObjectDataType
UNDEFINED: ReplicaStatus
INITIALIZED: ReplicaStatus
PROCESSING: ReplicaStatus
COMPLETE: ReplicaStatus
REMOVED: ReplicaStatus
FAILED: ReplicaStatus
Read: TransferOpcode
Write: TransferOpcode

# `TransferEngine.TransferOpcode` is the class itself; inside that class the name is taken.
_TransferOpcode: TypeAlias = TransferOpcode
SUPPORT_EFA: bool
SUPPORT_HIP: bool
SUPPORT_MNNVL: bool
SUPPORT_MUSA: bool
SUPPORT_INTRA_NVLINK: bool
SUPPORT_CUDA: bool

@final
class ReplicateConfig:
    """How a put replicates its object (upstream `replica.h`); `ReplicateConfig()` is one
    memory replica, soft pin preserved."""

    replica_num: int
    nof_replica_num: int
    dfs_replica_num: int
    soft_pin_action: SoftPinAction
    with_hard_pin: bool
    preferred_segments: list[str]
    preferred_nof_segments: list[str]
    preferred_segment: str
    prefer_alloc_in_same_node: bool
    data_type: ObjectDataType
    group_ids: list[str] | None
    def __new__(cls) -> Self: ...
    @property
    def soft_pin_ttl_ms(self) -> int | None:
        """`None` or a non-negative int below 2**64; anything else is a `TypeError`
        (pybind's `optional<uint64_t>` conversion).
        """
    @soft_pin_ttl_ms.setter
    def soft_pin_ttl_ms(self, value: int | None) -> None: ...
    @property
    def with_soft_pin(self) -> bool:
        """The seed's older boolean form: `True` soft-pins (ENABLE), `False` leaves it
        (PRESERVE).
        """
    @with_soft_pin.setter
    def with_soft_pin(self, value: bool) -> None: ...
    def __str__(self) -> str: ...
    def __repr__(self) -> str: ...

@final
class Descriptor:
    """Where one replica's bytes are (upstream `AllocatedBuffer::Descriptor`)."""

    size: int
    buffer_address: int
    transport_endpoint: str
    def __repr__(self) -> str: ...

@final
class MemoryDescriptor:
    """A memory replica's buffer."""

    @property
    def buffer_descriptor(self) -> Descriptor: ...

@final
class ReplicaDescriptor:
    """One replica of an object, as the master reports it."""

    @property
    def status(self) -> ReplicaStatus: ...
    def is_memory_replica(self) -> bool: ...
    def is_disk_replica(self) -> bool: ...
    def is_local_disk_replica(self) -> bool: ...
    def get_memory_descriptor(self) -> MemoryDescriptor: ...
    def __repr__(self) -> str: ...

@disjoint_base
class MooncakeDistributedStore:
    """The native store client; `mooncake.store.MooncakeDistributedStore` adds the
    tensor, parallel-IO, safetensors and cluster methods. Calls return upstream's codes."""

    def __new__(cls, *_args: Any, **_kwargs: Any) -> Self: ...
    def setup(self, *args: Any, **kwargs: Any) -> int:
        """`setup(local_hostname, metadata_server, global_segment_size, local_buffer_size,
        protocol, rdma_devices, master_server_addr, engine=None, ...)` or `setup(dict)`.
        """
    def init_all(self, protocol: str, device_name: str, mount_segment_size: int, /) -> int:
        """`init_all(protocol, device_name, mount_segment_size)`: upstream's fixed-address
        setup.
        """
    def close(self, /) -> int:
        """Unmounts this client's segment and drops the connection; 0, and idempotent."""
    def health_check(self, /) -> int:
        """0 healthy, 1 not set up or closed, 2 master unreachable."""
    def get_hostname(self, /) -> str: ...
    def put(self, key: str, value: Buffer, config: ReplicateConfig | None = None) -> int: ...
    def upsert(self, key: str, value: Buffer, config: ReplicateConfig | None = None) -> int: ...
    def put_parts(
        self,
        key: str,
        *parts: Buffer,
        config: ReplicateConfig | None = None,
    ) -> int: ...
    def upsert_parts(
        self,
        key: str,
        *parts: Buffer,
        config: ReplicateConfig | None = None,
    ) -> int: ...
    def put_batch(
        self,
        keys: Sequence[str],
        values: Iterable[Buffer],
        config: ReplicateConfig | None = None,
    ) -> int:
        """One return code for the whole batch (0, or the first failure)."""
    def upsert_batch(
        self,
        keys: Sequence[str],
        values: Iterable[Buffer],
        config: ReplicateConfig | None = None,
    ) -> int: ...
    def _put_parts_batch(
        self,
        keys: Sequence[str],
        parts_list: Iterable[Iterable[Buffer]],
        config: ReplicateConfig | None = None,
        upsert: bool = False,
    ) -> list[int]:
        """Internal (tensor layer): batch put where each object is the concatenation of a
        list of 1-D byte buffers; one return code per key.
        """
    def get(self, key: str, /) -> bytes:
        """The object's bytes; `b""` on a miss or any error."""
    def get_batch(self, keys: Sequence[str], /) -> list[bytes]:
        """`list[bytes]` with `b""` for misses; `[b""]` when not set up or for no keys
        (upstream).
        """
    def get_buffer(self, key: str, /) -> BufferHandle | None:
        """A `BufferHandle` (buffer protocol, `ptr()`, `size()`) or `None`."""
    def batch_get_buffer(self, keys: Sequence[str], /) -> list[BufferHandle | None]: ...
    def get_size(self, key: str, /) -> int: ...
    def is_exist(self, key: str, /) -> int:
        """1 exists, 0 not, negative error code."""
    def batch_is_exist(self, keys: Sequence[str]) -> list[int]: ...
    def remove(self, key: str, force: bool = False) -> int: ...
    def remove_by_regex(self, regex_pattern: str, force: bool = False) -> int:
        """Number of objects removed, or a negative code (`-600` for an invalid regex)."""
    def remove_all(self, force: bool = False) -> int: ...
    def batch_remove(self, keys: Sequence[str], force: bool = False) -> list[int]: ...
    def get_replica_desc(self, key: str) -> list[ReplicaDescriptor]: ...
    def batch_get_replica_desc(self, keys: Sequence[str]) -> dict[str, list[ReplicaDescriptor]]:
        """`{key: [ReplicaDescriptor, ...]}` for the keys that were found."""
    def alloc_from_mem_pool(self, size: int, /) -> int:
        """Memory from this client's pool (bounded by `local_buffer_size`, freed by
        `close`); 0 on failure.
        """
    def _allocate_and_mount_segment(self, size: int, /) -> tuple[int, str, int]:
        """Internal (`_cluster_ops.allocate_and_mount_segment`): `(ret, segment_id, size)`;
        see `client::store::extra`.
        """
    def _mount_segment(self, path: str, size: int, offset: int, /) -> tuple[int, str, int]:
        """Internal (`_cluster_ops.mount_segment`): `(ret, segment_id, size)` for `size` bytes of
        the file at `path` from `offset`; see `client::store::extra`.
        """
    def _batch_replica_clear(
        self, keys: Sequence[str], segment_name: str, /
    ) -> tuple[int, list[str]]:
        """Internal (`_cluster_ops.batch_replica_clear`): `(0, keys cleared)`, or `(code,
        [])` when the call failed; see `Store::batch_replica_clear`.
        """
    def _create_task(
        self, key: str, targets: Sequence[str], source: str | None, /
    ) -> tuple[tuple[int, int], int]:
        """Internal (`_cluster_ops.create_copy_task` / `create_move_task`): `((hi, lo), 0)` or
        `((0, 0), code)`; a move when `source` is given. See `client::store::tasks`.
        """
    def _query_task(
        self, hi: int, lo: int, /
    ) -> tuple[
        int, tuple[tuple[int, int], int, int, int, int, tuple[int, int], str] | None
    ]:
        """Internal (`_cluster_ops.query_task`): `(0, (id, type, status, created_at_ms_epoch,
        last_updated_at_ms_epoch, assigned_client, message))`, or `(code, None)`.
        """
    def _unmount_segments(self, segment_ids: Sequence[str], grace_period_seconds: float, /) -> int:
        """Internal (`_cluster_ops.unmount_segment`): 0 or a code; see `client::store::extra`."""
    def _extra_segment_ids(self) -> list[str]:
        """Internal: ids of the segments mounted after setup."""
    def _local_buffer_capacity(self) -> int:
        """Internal (`mooncake.buffer_pool`): this client's `local_buffer_size`, 0 when not
        set up.
        """
    def _cluster_id(self) -> str | None:
        """Internal: the cluster id this client was set up with (`MC_STORE_CLUSTER_ID`), or
        `None` when not set up.
        """
    def get_offload_rpc_read_count(self) -> int: ...
    def register_buffer(self, buffer_ptr: int, size: int) -> int:
        """0, or `-600` when not set up or when `[buffer_ptr, buffer_ptr + size)` is not
        mapped readable and writable here: a registered range is later read and written
        through raw pointers, so an unmapped one would turn a bad argument into a segfault.
        """
    def unregister_buffer(self, buffer_ptr: int) -> int: ...
    def put_from(
        self,
        key: str,
        buffer_ptr: int,
        size: int,
        config: ReplicateConfig | None = None,
    ) -> int: ...
    def upsert_from(
        self,
        key: str,
        buffer_ptr: int,
        size: int,
        config: ReplicateConfig | None = None,
    ) -> int: ...
    def put_from_with_metadata(
        self,
        key: str,
        buffer_ptr: int,
        metadata_buffer_ptr: int,
        size: int,
        metadata_size: int,
        config: ReplicateConfig | None = None,
    ) -> int:
        """Stores metadata bytes followed by data bytes. Upstream's quirks: 0 without
        storing for `size == 0`; -1 when not set up or with `prefer_alloc_in_same_node`;
        and the *negated* (positive) error code when the put fails.
        """
    def batch_put_from(
        self,
        keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
        config: ReplicateConfig | None = None,
    ) -> list[int]: ...
    def batch_upsert_from(
        self,
        keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
        config: ReplicateConfig | None = None,
    ) -> list[int]: ...
    def batch_put_from_multi_buffers(
        self,
        keys: Sequence[str],
        all_buffer_ptrs: Sequence[Sequence[int]],
        all_sizes: Sequence[Sequence[int]],
        config: ReplicateConfig | None = None,
    ) -> list[int]:
        """Each object is the concatenation of its buffers."""
    def get_into(self, key: str, buffer_ptr: int, size: int) -> int:
        """Bytes read, or a negative code (`-704` miss, `-600` too small / unregistered)."""
    def batch_get_into(
        self,
        keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
    ) -> list[int]: ...
    def batch_get_into_multi_buffers(
        self,
        keys: Sequence[str],
        all_buffer_ptrs: Sequence[Sequence[int]],
        all_sizes: Sequence[Sequence[int]],
        prefer_alloc_in_same_node: bool = False,
    ) -> list[int]:
        """Scatters each object into its buffers in order; bytes read per key or a negative
        code.
        """
    def get_into_ranges(
        self,
        buffer_ptrs: Sequence[int],
        all_keys: Sequence[Sequence[str]],
        all_dst_offsets: Sequence[Sequence[Sequence[int]]],
        all_src_offsets: Sequence[Sequence[Sequence[int]]],
        all_sizes: Sequence[Sequence[Sequence[int]]],
    ) -> list[list[list[int]]]:
        """Ranged reads: `result[b][k][f]` is the bytes read for fragment `f` of key `k`
        into buffer `b`, or a negative code. A key's fragments fail together when its
        offset and size lists disagree in length; a missing key fails only its own
        fragments.
        """
    def batch_put_session_start(
        self,
        keys: Sequence[str],
        sizes: Sequence[int],
        config: ReplicateConfig | None = None,
    ) -> list[int]:
        """Reserves the objects without moving bytes; 0 or a negative code per key."""
    def batch_put_from_multi_buffer_ranges(
        self,
        keys: Sequence[str],
        all_buffer_ptrs: Sequence[Sequence[int]],
        all_sizes: Sequence[Sequence[int]],
        all_dst_offsets: Sequence[Sequence[int]],
    ) -> list[int]:
        """Fills byte ranges of objects in a put session; bytes copied per key or a
        negative code.
        """
    def batch_put_session_end(self, keys: Sequence[str]) -> list[int]:
        """Writes and commits the objects of a put session; 0 or a negative code per key."""
    def batch_put_session_revoke(self, keys: Sequence[str]) -> list[int]: ...
    def batch_get_session_start(self, keys: Sequence[str]) -> list[int]:
        """Caches the replica lists of `keys`; 0 or a negative code (`-704` miss) per key."""
    def batch_get_into_multi_buffer_ranges(
        self,
        keys: Sequence[str],
        all_buffer_ptrs: Sequence[Sequence[int]],
        all_sizes: Sequence[Sequence[int]],
        all_src_offsets: Sequence[Sequence[int]],
    ) -> list[int]:
        """Ranged reads of objects in a get session; bytes read per key or a negative code."""
    def batch_get_session_end(self, keys: Sequence[str]) -> int:
        """Drops the cached replica lists; 0 (-1 when not set up, as upstream)."""
    def put_tensor_from(self, key: str, buffer_ptr: int, size: int) -> int:
        """Stores registered memory that already holds `[TensorMetadata][data]` (validated)."""
    def upsert_tensor_from(self, key: str, buffer_ptr: int, size: int) -> int: ...
    def batch_put_tensor_from(
        self,
        keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
    ) -> list[int]: ...
    def batch_upsert_tensor_from(
        self,
        keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
    ) -> list[int]: ...
    def _write_caller(self, buffer_ptr: int, data: bytes) -> int:
        """Internal (parallel reads): copies `data` to caller memory at `buffer_ptr`
        (registered, or mapped writable); its length, or -600 for a range that is neither.
        """
    def _read_registered(self, buffer_ptr: int, size: int) -> bytes | None:
        """Internal (tensor layer): a copy of `size` bytes of caller memory at
        `buffer_ptr`, or `None` when the range is neither registered nor mapped.
        """

@final
class _DummyClient:
    """A dummy client attached to a standalone `mooncake_client` on this host (`setup_dummy`)."""

    @staticmethod
    def connect(
        mem_pool_size: int, local_buffer_size: int, server_address: str
    ) -> tuple[_DummyClient | None, int]:
        """`(client, 0)` connected to the standalone client at `server_address`, or `(None,
        code)` with the reason logged.
        """
    def get_hostname(self) -> str: ...
    def health_check(self) -> int: ...
    def put(self, key: str, value: Buffer, config: ReplicateConfig | None = None) -> int: ...
    def upsert(self, key: str, value: Buffer, config: ReplicateConfig | None = None) -> int: ...
    def put_parts(
        self,
        key: str,
        *parts: Buffer,
        config: ReplicateConfig | None = None,
    ) -> int: ...
    def upsert_parts(
        self,
        key: str,
        *parts: Buffer,
        config: ReplicateConfig | None = None,
    ) -> int: ...
    def _put_parts_batch(
        self,
        keys: Sequence[str],
        parts_list: Sequence[Sequence[Buffer]],
        config: ReplicateConfig | None = None,
        upsert: bool = False,
    ) -> list[int]:
        """Internal (tensor layer), as the store's: batch put where each object is the
        concatenation of a list of 1-D byte buffers; one code per key.
        """
    def put_batch(
        self,
        keys: Sequence[str],
        values: Sequence[Buffer],
        config: ReplicateConfig | None = None,
    ) -> int:
        """One code for the whole batch (0, or the first failure), as the store's `put_batch`."""
    def upsert_batch(
        self,
        keys: Sequence[str],
        values: Sequence[Buffer],
        config: ReplicateConfig | None = None,
    ) -> int: ...
    def get(self, key: str, /) -> bytes:
        """The object's bytes; `b""` on a miss or any error."""
    def get_batch(self, keys: Sequence[str], /) -> list[bytes]:
        """`list[bytes]` with `b""` for misses; `[b""]` for no keys (as the store)."""
    def get_buffer(self, key: str, /) -> BufferHandle | None:
        """A `BufferHandle` holding the object's bytes, or `None` (as the store's)."""
    def batch_get_buffer(self, keys: Sequence[str], /) -> list[BufferHandle | None]:
        """A `BufferHandle` or `None` per key; `[]` for no keys (as the store's)."""
    def get_size(self, key: str, /) -> int: ...
    def is_exist(self, key: str, /) -> int: ...
    def batch_is_exist(self, keys: Sequence[str]) -> list[int]: ...
    def remove(self, key: str, force: bool = False) -> int: ...
    def batch_remove(self, keys: Sequence[str], force: bool = False) -> list[int]: ...
    def remove_by_regex(self, regex_pattern: str, force: bool = False) -> int: ...
    def remove_all(self, force: bool = False) -> int: ...
    def alloc_from_mem_pool(self, size: int, /) -> int:
        """Memory in the region shared with the standalone client (zero-copy puts and
        gets); 0 when it is full.
        """
    def register_buffer(self, buffer_ptr: int, size: int) -> int:
        """0 for mapped read-write memory (buffers outside the shared region are staged
        through it), -600 otherwise.
        """
    def unregister_buffer(self, buffer_ptr: int) -> int: ...
    def put_from(
        self,
        key: str,
        buffer_ptr: int,
        size: int,
        config: ReplicateConfig | None = None,
    ) -> int: ...
    def upsert_from(
        self,
        key: str,
        buffer_ptr: int,
        size: int,
        config: ReplicateConfig | None = None,
    ) -> int: ...
    def batch_put_from(
        self,
        keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
        config: ReplicateConfig | None = None,
    ) -> list[int]: ...
    def batch_upsert_from(
        self,
        keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
        config: ReplicateConfig | None = None,
    ) -> list[int]: ...
    def get_into(self, key: str, buffer_ptr: int, size: int) -> int:
        """Bytes read, or a negative code (`-704` miss, `-600` too small / unmapped)."""
    def batch_get_into(
        self,
        keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
    ) -> list[int]: ...
    def put_tensor_from(self, key: str, buffer_ptr: int, size: int) -> int:
        """Stores caller memory (the shared pool, or mapped) that already holds a tensor
        object `[TensorMetadata][data]` (validated), as the store's.
        """
    def upsert_tensor_from(self, key: str, buffer_ptr: int, size: int) -> int: ...
    def batch_put_tensor_from(
        self,
        keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
    ) -> list[int]: ...
    def batch_upsert_tensor_from(
        self,
        keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
    ) -> list[int]: ...
    def batch_put_from_multi_buffers(
        self,
        keys: Sequence[str],
        all_buffer_ptrs: Sequence[Sequence[int]],
        all_sizes: Sequence[Sequence[int]],
        config: ReplicateConfig | None = None,
    ) -> list[int]:
        """Each object is the concatenation of its buffers (the shared pool, or mapped memory
        staged through it); 0 or a negative code per key.
        """
    def batch_get_into_multi_buffers(
        self,
        keys: Sequence[str],
        all_buffer_ptrs: Sequence[Sequence[int]],
        all_sizes: Sequence[Sequence[int]],
        prefer_alloc_in_same_node: bool = False,
    ) -> list[int]:
        """Scatters each object into its buffers in order (zero copy where they lie in the
        shared pool); bytes read per key, or a negative code (`-600` when the buffers are too
        small).
        """
    def get_into_ranges(
        self,
        buffer_ptrs: Sequence[int],
        all_keys: Sequence[Sequence[str]],
        all_dst_offsets: Sequence[Sequence[Sequence[int]]],
        all_src_offsets: Sequence[Sequence[Sequence[int]]],
        all_sizes: Sequence[Sequence[Sequence[int]]],
    ) -> list[list[list[int]]]:
        """Ranged reads into registered buffers (the shared pool, or `register_buffer`
        ranges), as the store's: `result[b][k][f]` is the bytes read or a negative code.
        """
    def _create_task(
        self, key: str, targets: Sequence[str], source: str | None, /
    ) -> tuple[tuple[int, int], int]:
        """Internal (`_cluster_ops`): a copy task (`source` `None`) or a move task, made by the
        standalone client: `((hi, lo), 0)` or `((0, 0), code)`.
        """
    def _query_task(
        self, hi: int, lo: int, /
    ) -> tuple[
        int, tuple[tuple[int, int], int, int, int, int, tuple[int, int], str] | None
    ]:
        """Internal (`_cluster_ops.query_task`): as the store's."""
    def _read_registered(self, buffer_ptr: int, size: int) -> bytes | None:
        """Internal (tensor layer), as the store's: a copy of `size` bytes of caller memory
        (the shared pool, or mapped readable), or `None` for a range that is neither.
        """
    def _write_caller(self, buffer_ptr: int, data: bytes) -> int:
        """Internal (parallel reads), as the store's: copies `data` to caller memory at
        `buffer_ptr` (the shared pool, or mapped writable); its length, or -600.
        """

@final
class TransferNotify:
    """`TransferNotify(name, msg)`: a message delivered to the peer's inbox after a transfer."""

    name: str
    msg: str
    def __new__(cls, name: str = ..., msg: str = ...) -> Self: ...
    def __repr__(self) -> str: ...

@final
class InnerTransferEngine:
    """The shared engine behind a `TransferEngine` (`get_engine()`), which
    `MooncakeDistributedStore.setup(..., engine=...)` accepts."""

    def __repr__(self) -> str: ...

@disjoint_base
class TransferEngine:
    """Upstream's transfer engine API: register memory, move bytes to and from peers' segments."""

    def __new__(cls) -> Self: ...
    TransferOpcode: ClassVar[type[_TransferOpcode]]
    def initialize(
        self,
        local_hostname: str,
        metadata_server: str,
        protocol: str,
        device_name: str,
        /,
    ) -> int:
        """`initialize(local_hostname, metadata_server, protocol, device_name)`: 0 / -1.
        `metadata_server`: `P2PHANDSHAKE`, `http://host:port/metadata`, or etcd as
        `etcd://host:port[,host:port]` or a bare `host:port` (the seed's
        `"127.0.0.1:2379"`).
        """
    def initialize_ext(
        self,
        local_hostname: str,
        metadata_server: str,
        protocol: str,
        device_name: str,
        metadata_type: str,
        /,
    ) -> int:
        """`initialize_ext(local_hostname, metadata_server, protocol, device_name,
        metadata_type)`: 0 / -1.
        """
    def get_rpc_port(self, /) -> int:
        """The handshake (rpc) port; in P2PHANDSHAKE mode the segment name is `host:<this>`."""
    def allocate_managed_buffer(self, length: int, /) -> int:
        """Allocates and registers `length` bytes; the address or 0."""
    def free_managed_buffer(self, buffer_addr: int, length: int, /) -> int:
        """Frees a managed buffer: 0 (a negative code for an address that is not one)."""
    def write_bytes_to_buffer(self, dest_address: int, src: Buffer | str, length: int, /) -> int:
        """Copies the first `length` bytes of `src` (bytes-like, or str as UTF-8) to
        `dest_address`, which must lie in memory registered with this engine: 0 / -1.
        """
    def read_bytes_from_buffer(self, source_address: int, length: int, /) -> bytes | int:
        """`length` bytes at `source_address` (registered with this engine) as `bytes`;
        `-1` when the range is not registered.
        """
    def register_memory(self, buffer_addr: int, capacity: int, location: str = "*") -> int:
        """Registers `[buffer_addr, buffer_addr + capacity)` for transfers: 0, `-7` when it
        overlaps a registered buffer, `-1` otherwise.
        """
    def unregister_memory(self, buffer_addr: int, /) -> int:
        """Unregisters the buffer starting at `buffer_addr`: 0, `-3` when none does."""
    def batch_register_memory(
        self,
        buffer_addresses: Sequence[int],
        capacities: Sequence[int],
        location: str = "*",
    ) -> int:
        """Registers each buffer; 0, or the first failure's code (`-1` for mismatched lists)."""
    def batch_unregister_memory(self, buffer_addresses: Sequence[int], /) -> int:
        """Unregisters each buffer; 0, or the first failure's code."""
    def transfer_sync_write(
        self,
        target_hostname: str,
        buffer: int,
        peer_buffer_address: int,
        length: int,
        transport_hint: str = "",
    ) -> int: ...
    def transfer_sync_read(
        self,
        target_hostname: str,
        buffer: int,
        peer_buffer_address: int,
        length: int,
        transport_hint: str = "",
    ) -> int: ...
    def transfer_sync(
        self,
        target_hostname: str,
        buffer: int,
        peer_buffer_address: int,
        length: int,
        opcode: _TransferOpcode,
        notify: TransferNotify | None = None,
        transport_hint: str = "",
    ) -> int:
        """One transfer with `opcode`; with `notify`, the peer then receives it
        (`get_notifies`).
        """
    def batch_transfer_sync_write(
        self,
        target_hostname: str,
        buffers: Sequence[int],
        peer_buffer_addresses: Sequence[int],
        lengths: Sequence[int],
        transport_hint: str = "",
    ) -> int: ...
    def batch_transfer_sync_read(
        self,
        target_hostname: str,
        buffers: Sequence[int],
        peer_buffer_addresses: Sequence[int],
        lengths: Sequence[int],
        transport_hint: str = "",
    ) -> int: ...
    def batch_transfer_sync(
        self,
        target_hostname: str,
        buffers: Sequence[int],
        peer_buffer_addresses: Sequence[int],
        lengths: Sequence[int],
        opcode: _TransferOpcode,
        notify: TransferNotify | None = None,
        transport_hint: str = "",
    ) -> int:
        """All transfers of the lists to one target, waited for: 0 / -1 (`-1` for
        mismatched lists); with `notify`, the peer then receives it.
        """
    def batch_transfer_async_write(
        self,
        target_hostname: str,
        buffers: Sequence[int],
        peer_buffer_addresses: Sequence[int],
        lengths: Sequence[int],
        transport_hint: str = "",
    ) -> int: ...
    def batch_transfer_async_read(
        self,
        target_hostname: str,
        buffers: Sequence[int],
        peer_buffer_addresses: Sequence[int],
        lengths: Sequence[int],
        transport_hint: str = "",
    ) -> int: ...
    def batch_transfer_async(
        self,
        target_hostname: str,
        buffers: Sequence[int],
        peer_buffer_addresses: Sequence[int],
        lengths: Sequence[int],
        opcode: _TransferOpcode,
        transport_hint: str = "",
    ) -> int:
        """Submits the transfers and returns at once: the batch id, or 0 when the
        submission failed (unknown peer, mismatched or empty lists).
        """
    def transfer_submit_write(
        self,
        target_hostname: str,
        buffer: int,
        peer_buffer_address: int,
        length: int,
        transport_hint: str = "",
    ) -> int:
        """One asynchronous write: the batch id or 0; poll it with `transfer_check_status`."""
    def transfer_check_status(self, batch_id: int, /) -> int:
        """`1` completed (batch freed), `0` still running, `-1` failed or unknown (batch
        freed), `-2` past its deadline (`MC_TRANSFER_TIMEOUT` + 1 s per GiB) and still
        running.
        """
    def get_batch_transfer_status(self, batch_ids: Sequence[int], /) -> int:
        """Waits for every batch: 0 when all completed, -1 when any failed, timed out or is
        unknown. The batches are freed.
        """
    def get_first_buffer_address(self, segment_name: str, /) -> int:
        """The address of the first buffer of segment `segment_name` (this engine's own
        name included), or 0.
        """
    def get_notifies(self, /) -> list[TransferNotify]:
        """The notifies received so far, oldest first, as `TransferNotify` objects."""
    def send_probe(self, peer_server_name: str) -> int:
        """0 when `peer_server_name` answers a probe; a negative code otherwise (`-200` for
        an unknown peer).
        """
    def warmup_efa_segment(self, segment_name: str) -> int:
        """0: this build has no EFA transport."""
    def get_local_topology(self, device_name: str | None = None) -> str:
        """The local topology as JSON: one entry per NUMA node, `"cpu:<n>": [[preferred
        NICs], [other NICs]]`; both lists are empty, as this build has no RDMA NICs.
        """
    def get_engine(self, /) -> InnerTransferEngine:
        """The shared engine (`InnerTransferEngine`)."""
    def get_engine_ptr(self, /) -> int:
        """The engine's address, as an int (an opaque handle)."""
    def __repr__(self) -> str: ...

@final
class PgWork:
    """The outcome of one collective or point-to-point op of a `PgComm`."""

    def wait(self, timeout_s: float | None = None) -> bool:
        """Waits for the op (`timeout_s` `None` = forever); True once it has ended."""
    def poll(self) -> bool:
        """Whether the op has ended."""
    def failed(self) -> int:
        """Failed ranks seen by the op (bit mask), 0 while running."""
    def error(self) -> str | None:
        """Why the op failed as a whole, if it did."""

@final
class PgComm:
    """One rank's communicator for `mooncake.pg`: its segment, then links to every peer."""

    def __new__(cls, path: str, rank: int, ranks: int) -> Self:
        """Creates this rank's segment at `path`."""
    def listen(self, host: str) -> int:
        """Listens for the ranks on other hosts on `host` (an ephemeral port); returns the port."""
    def connect(
        self,
        paths: Sequence[str],
        auto_deactivate: bool,
        endpoints: Sequence[str] | None = None,
        founders: int | None = None,
        group: str | None = None,
    ) -> None:
        """Maps every same-host peer's segment (`paths[r]` for rank `r`), links to the
        ranks on other hosts (`endpoints[r]` = `host:port` non-empty; `paths[r]` unused)
        and starts the workers. Releases the GIL while it connects. `founders` (default:
        every slot) is how many slots the group starts with: slots from `founders` on are
        empty, inactive places a process may later join by extension (`max_group_size` >
        group size; their `paths` entries are unused). `group` is the group's id, the same
        on every rank: with a cluster secret, only peers that prove the secret and this id
        link (docs/pg.md).
        """
    def connect_extension(
        self,
        paths: Sequence[str | None],
        auto_deactivate: bool,
        endpoints: Sequence[str | None] | None = None,
        group: str | None = None,
    ) -> None:
        """Joins an existing group as a new process for this rank (`is_extension`): maps
        every live member's segment on this host (`paths[r]`, `None` for this rank or a
        member that is gone), links to the members on other hosts (`endpoints[r]` =
        `host:port` of their listener; needs `listen()` first), starts in the group's newest
        view with only this rank active (isolated until `join`), and announces itself to
        every member. `group` is the group's id, as in `connect`.
        """
    def proc_path(self) -> tuple[int, int]:
        """`(pid, fd)` of this rank's segment: `/proc/<pid>/fd/<fd>` reopens it."""
    def propose(self, activate: bool, mask: int, timeout_s: float) -> tuple[int, int, int, str]:
        """Proposes activating (`activate`) or deactivating the ranks in `mask`; returns
        `(status, view id, dropped mask, reason)`.
        """
    def join(self, timeout_s: float) -> None:
        """Blocks until a view activates this rank (`join_group`)."""
    def peer_ready(self, rank: int) -> bool:
        """Whether `rank` is alive and active in the newest view or waiting in `join_group`."""
    def view_id(self) -> int:
        """Id of the newest committed view seen here."""
    def set_mirror(self, addr: int, len: int) -> None:
        """Mirrors the active set into `len` int32 elements at `addr` (the options' tensor,
        which pg.py keeps alive as long as this communicator).
        """
    def active(self) -> int: ...
    def set_active(self, mask: int) -> None: ...
    def epoch(self) -> int: ...
    def alive(self, rank: int) -> bool: ...
    def cma_probe(self) -> bool:
        """Whether this rank can read every peer's memory directly."""
    def set_cma(self, on: bool) -> None:
        """Turns the direct-read path on (same value on every rank, before the first op)."""
    def close(self) -> None:
        """Releases the communicator (`destroy_process_group`); later calls raise."""
    def leave(self) -> None:
        """Leaves the group gracefully (see `Shared::leave`)."""
    def take_failures(self) -> int: ...
    def all_reduce(self, buf: int, bytes: int, dt: int, op: int) -> PgWork: ...
    def broadcast(self, buf: int, bytes: int, dt: int, root: int) -> PgWork: ...
    def all_gather(self, input: int, bytes: int, dt: int, outs: Sequence[int]) -> PgWork: ...
    def all_to_all(
        self,
        ins: Sequence[int],
        outs: Sequence[int],
        bytes: int,
        dt: int,
    ) -> PgWork: ...
    def reduce_scatter(
        self,
        ins: Sequence[int],
        out: int,
        bytes: int,
        dt: int,
        op: int,
    ) -> PgWork: ...
    def reduce(self, buf: int, bytes: int, dt: int, op: int, root: int) -> PgWork: ...
    def gather(
        self,
        input: int,
        bytes: int,
        dt: int,
        outs: Sequence[int],
        root: int,
    ) -> PgWork: ...
    def scatter(self, ins: Sequence[int], out: int, bytes: int, dt: int, root: int) -> PgWork: ...
    def barrier(self) -> PgWork: ...
    def p2p(self, is_send: bool, peer: int, addr: int, bytes: int) -> PgWork:
        """Queues a send (`is_send`) or receive of `bytes` bytes at `addr` with `peer`."""

@final
class EpBuffer:
    """One rank's EP buffer for `mooncake.mooncake_ep_buffer`: a segment and a TCP listener."""

    def __new__(
        cls,
        path: str,
        rank: int,
        ranks: int,
        data_bytes: int,
        host_ip: str = "127.0.0.1",
    ) -> Self:
        """Creates this rank's buffer at `path` with `data_bytes` bytes of data area, and a
        TCP listener on `host_ip` (an ephemeral port) for peers on other hosts.
        """
    @property
    def endpoint(self) -> str:
        """`ip:port` peers on other hosts connect to."""
    @property
    def remote_ranks(self) -> list[int]:
        """The ranks this buffer reaches over TCP (another host id), ascending."""
    def connect(
        self,
        paths: Sequence[str],
        hosts: Sequence[str],
        endpoints: Sequence[str],
        sizes: Sequence[int],
    ) -> None:
        """Connects to every peer: `hosts[r]` equal to this rank's maps `paths[r]`, another
        host is linked over TCP to `endpoints[r]` (whose data area has `sizes[r]` bytes).
        Every rank passes the same lists, so they name the group: with a cluster secret,
        only peers that prove the secret and these lists link (docs/ep.md).
        """
    @staticmethod
    def need_bytes(ranks: int, tokens_max: int, hidden: int, experts: int) -> int:
        """Bytes a call of this shape needs in every rank's buffer."""
    def dispatch_send(
        self,
        x: int,
        tokens: int,
        topk: int,
        k: int,
        tokens_max: int,
        hidden: int,
        experts: int,
        fp8: bool,
        mask: int,
        timeout_us: int,
    ) -> tuple[int, int]:
        """Sends this rank's tokens; returns `(call, mask)`."""
    def dispatch_recv(
        self,
        call: int,
        recv_x: int,
        scales: int,
        count: int,
        src_info: int,
        layout: int,
        tokens_max: int,
        hidden: int,
        experts: int,
        fp8: bool,
        mask: int,
        timeout_us: int,
    ) -> int:
        """Receives dispatch call `call` into the given tensors; returns the mask."""
    def combine_send(
        self,
        x: int,
        src_info: int,
        layout: int,
        topk: int,
        tokens: int,
        k: int,
        tokens_max: int,
        hidden: int,
        experts: int,
        mask: int,
        timeout_us: int,
    ) -> tuple[int, int]:
        """Sends expert outputs back; returns `(call, mask)`."""
    def combine_recv(
        self,
        call: int,
        topk: int,
        weights: int,
        tokens: int,
        k: int,
        out: int,
        tokens_max: int,
        hidden: int,
        experts: int,
        mask: int,
        timeout_us: int,
    ) -> int:
        """Receives combine call `call` and reduces into `out`; returns the mask."""

def ep_size_hint(
    num_max_dispatch_tokens_per_rank: int,
    hidden: int,
    _num_ranks: int,
    num_experts: int,
) -> int:
    """Upstream's `get_ep_buffer_size_hint` (the group size is unused, as upstream)."""
def run_master(args: Sequence[str]) -> int:
    """`mooncake_master`: runs the master with `args` (without the program name); returns its
    exit code. The GIL is released for the whole run.
    """
def run_http_metadata_server(args: Sequence[str]) -> int:
    """`mooncake_http_metadata_server`: the standalone HTTP metadata server."""
def run_client(args: Sequence[str]) -> int:
    """`mooncake_client`: a storage node contributing memory to the store (`client::cli`)."""
def run_transfer_engine_bench(args: Sequence[str]) -> int:
    """`transfer_engine_bench`: the transfer-engine benchmark (`mooncake_bench::engine`)."""
def pg_set_timeout_us(which: str, us: int) -> None:
    """Sets one of the process-wide timeouts (`which`: "collective", "p2p", "window")."""
def _tensor_metadata_size() -> int:
    """`sizeof(TensorMetadata)` = 304."""
def _tensor_dtypes() -> list[tuple[int, str, int]]:
    """`[(code, torch_name, element_bytes), ...]` for every supported dtype."""
def _encode_tensor_header(
    dtype: int,
    local_shape: Sequence[int],
    global_shape: Sequence[int] | None = None,
    axes: Sequence[_Axis] | None = None,
) -> bytes:
    """The 304 header bytes for a tensor of `dtype` (code) whose bytes have `local_shape`; a
    shard also gives `global_shape` and its layout `axes`.
    """
def _decode_tensor_header(
    data: Buffer,
    total_len: int | None = None,
) -> tuple[int, int, list[int], list[int], list[_Axis], int, int]:
    """Parses the header at the start of `data` (any bytes-like object) for an object of
    `total_len` bytes (default `len(data)`): `(dtype, layout_kind, global_shape, local_shape,
    axes, data_offset, data_bytes)`. Raises `ValueError` for an invalid header.
    """
def _error_codes() -> list[tuple[str, int]]:
    """`[(name, code), ...]`: every store error code in declaration order
    (`protocol::ErrorCode`), the table `mooncake.error_codes.ErrorCode` is checked against.
    """
def _bytearray_address(obj: bytearray) -> int:
    """Address of a bytearray's first byte (`BufferHandle.ptr()`)."""
