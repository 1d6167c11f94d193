"""Store methods whose upstream work our master and client do not offer, answered the way
upstream answers when it cannot do them, with the reason logged (never a silent success):

- extra segments: `allocate_and_mount_segment` mounts new memory as one more segment of this
  client (`client::store::extra`); `unmount_segment` / `unmount_and_free_segment` unmount
  them (the master drops the replicas held there; the memory is freed after the grace
  period). `mount_segment(path, size, offset)` mounts the bytes of a file of ours (in
  /dev/shm, or under a directory of `MC_MOUNT_FILE_DIRS`) the same way.
- replica tasks are real: `create_copy_task(key, targets)` / `create_move_task(key, source,
  target)` answer `((hi, lo), 0)` with the task's id, or `((0, 0), code)` (`-704` no key, `-101`
  a segment that is not mounted, `-708` the object already has a task, `-1401` too many
  pending; `docs/master.md`, "Replica tasks"). A store client that contributes a segment
  carries tasks out (`client::store::tasks`). `query_task(id)` answers `(QueryTaskResponse,
  0)` or `(None, -1400)`. Tasks are soft state of the master: after a master restart or an
  HA failover the old ids are unknown (`-1400`).
- `batch_replica_clear` is real (the master's owner-checked `BatchReplicaClear`); it lives
  here with the other cluster methods.
- `setup_dummy`: connects to a standalone `mooncake_client` on this host (`client::dummy`,
  `docs/dummy-client.md`) and routes this instance's byte, buffer and metadata methods to it
  (instance attributes shadow the native methods until `close`); -1 when none serves
  `server_address`, as upstream.
"""

import enum
import logging

from mooncake import _native
from mooncake.error_codes import ErrorCode

log = logging.getLogger("mooncake.store")


class TaskType(enum.IntEnum):
    """Kind of a replica task (upstream's values)."""

    REPLICA_COPY = 0
    REPLICA_MOVE = 1

    __str__ = enum.Enum.__str__


class TaskStatus(enum.IntEnum):
    """State of a replica task (upstream's values)."""

    PENDING = 0
    PROCESSING = 1
    SUCCESS = 3
    FAILED = 2

    __str__ = enum.Enum.__str__


class QueryTaskResponse:
    """What `query_task` returns for a known task (upstream's read-only fields)."""

    __slots__ = ("_fields",)

    def __init__(self, id, type, status, created_at_ms_epoch, last_updated_at_ms_epoch,
                 assigned_client, message=""):
        object.__setattr__(self, "_fields", dict(
            id=id, type=TaskType(type), status=TaskStatus(status),
            created_at_ms_epoch=created_at_ms_epoch,
            last_updated_at_ms_epoch=last_updated_at_ms_epoch,
            assigned_client=assigned_client, message=message))

    def __getattr__(self, name):
        try:
            return self._fields[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name, value):
        raise AttributeError(f"QueryTaskResponse.{name} is read-only")

    def __repr__(self):
        f = self._fields
        return (f"QueryTaskResponse(id={f['id'][0]}-{f['id'][1]}, type={int(f['type'])}, "
                f"status={int(f['status'])}, created_at={f['created_at_ms_epoch']}, "
                f"last_updated_at={f['last_updated_at_ms_epoch']}, "
                f"assigned_client={f['assigned_client'][0]}-{f['assigned_client'][1]}, "
                f"message=\"{f['message']}\")")

# Plain ints, as upstream returns them.
_INVALID = int(ErrorCode.INVALID_PARAMS)
_TASK_NOT_FOUND = int(ErrorCode.TASK_NOT_FOUND)
_NO_TASK = (0, 0)


class ClusterOps:
    """Segment, task and replica-clear methods of `MooncakeDistributedStore`."""

    def _ready(self, what):
        if self.get_hostname():
            return True
        log.error("%s: client is not initialized", what)
        return False

    # ---- segments -------------------------------------------------------------------------

    def mount_segment(self, path, size, offset=0, protocol="tcp", location=""):
        """Maps `size` bytes of the file at `path` from `offset` (a multiple of the page
        size) and mounts them as one more segment of this client, served and re-mounted as
        `allocate_and_mount_segment`'s. The file must be a regular file of this process's
        user in /dev/shm or under a directory of `MC_MOUNT_FILE_DIRS`, and the range must
        lie inside it; the file stays when the segment is unmounted."""
        failed = {"ret": -1, "segment_ids": []}
        if not self._ready("mount_segment") or not _tcp_only("mount_segment", protocol):
            return failed
        ret, seg_id, _size = self._mount_segment(str(path), int(size), int(offset))
        if ret != 0:
            log.error("mount_segment(%s, %d, %d) failed: %d", path, size, offset, ret)
            return failed
        return {"ret": 0, "segment_ids": [seg_id]}

    def allocate_and_mount_segment(self, size, protocol="tcp", location=""):
        """Maps `size` bytes and mounts them at the master as one more segment of this client
        (served, and re-mounted after a master failover, as the first one)."""
        if (not self._ready("allocate_and_mount_segment")
                or not _tcp_only("allocate_and_mount_segment", protocol)):
            return {"ret": -1, "segment_ids": [], "allocated_size": 0}
        ret, seg_id, allocated = self._allocate_and_mount_segment(int(size))
        if ret != 0:
            log.error("allocate_and_mount_segment(%d) failed: %d", size, ret)
            return {"ret": -1, "segment_ids": [], "allocated_size": 0}
        return {"ret": 0, "segment_ids": [seg_id], "allocated_size": allocated}

    def _unmount(self, what, segment_ids, grace_period_seconds):
        if not self._ready(what):
            return -1
        ids = [str(i) for i in segment_ids]
        if not ids:
            return 0
        ret = self._unmount_segments(ids, float(grace_period_seconds))
        if ret != 0:
            log.error("%s(%s) failed: %d", what, ids, ret)
            return -1
        return 0

    def unmount_segment(self, segment_ids, grace_period_seconds=0):
        """Unmounts the extra segments `segment_ids` (after `grace_period_seconds` for reads in
        flight). 0, or -1 with the reason logged."""
        return self._unmount("unmount_segment", segment_ids, grace_period_seconds)

    def unmount_and_free_segment(self, segment_ids, grace_period_seconds=0):
        """`unmount_segment`, then frees their memory (an allocated segment's memory always
        goes with it here). 0, or -1 with the reason logged."""
        return self._unmount("unmount_and_free_segment", segment_ids, grace_period_seconds)

    def unmount_local_disk_segment(self, grace_period_seconds=0):
        """0: there is no local disk segment to unmount (no SSD tier here)."""
        return 0 if self._ready("unmount_local_disk_segment") else -1

    # ---- replica tasks ----------------------------------------------------------------------

    def _task(self, what, key, targets, source=None):
        if not self._ready(what):
            return (_NO_TASK, _INVALID)
        task_id, ret = self._create_task(str(key), targets, source)
        if ret != 0:
            log.error("%s failed for key: %s, error: %d", what, key, ret)
            return (_NO_TASK, ret)
        return (task_id, 0)

    def create_copy_task(self, key, targets):
        """Copies `key` onto every segment named in `targets`: `(task_id, 0)` or
        `((0, 0), code)`."""
        return self._task("create_copy_task", key, [str(t) for t in targets])

    def create_move_task(self, key, source, target):
        """Moves `key`'s replica from segment `source` to segment `target`: `(task_id, 0)` or
        `((0, 0), code)`."""
        return self._task("create_move_task", key, [str(target)], str(source))

    def query_task(self, task_id):
        """`(QueryTaskResponse, 0)`, or `(None, code)` (`-1400` for an unknown task)."""
        first, second = task_id
        first, second = int(first), int(second)
        if not self._ready("query_task"):
            return (None, _INVALID)
        # An id outside uint64 names no task (upstream's pair<uint64, uint64>).
        ret, fields = (self._query_task(first, second)
                       if 0 <= first < 1 << 64 and 0 <= second < 1 << 64
                       else (_TASK_NOT_FOUND, None))
        if ret != 0:
            log.error("QueryTask failed for task_id: %d-%d, error: %d", first, second, ret)
            return (None, ret)
        return (QueryTaskResponse(*fields), 0)

    # ---- replica clear -------------------------------------------------------------------

    def batch_replica_clear(self, keys, segment_name=""):
        """Clears the keys this client wrote whose lease has expired: whole objects (every
        replica COMPLETE) when `segment_name` is empty, else only their replica on that
        segment. Returns the keys cleared (`[]` before setup or when the call fails)."""
        keys = [str(k) for k in keys]
        if not self._ready("batch_replica_clear") or not keys:
            return []
        ret, cleared = self._batch_replica_clear(keys, str(segment_name))
        if ret != 0:
            log.error("batch_replica_clear of %d key(s) failed: %d", len(keys), ret)
        return cleared

    # ---- dummy clients ---------------------------------------------------------------------


# Methods a dummy client serves itself (`_native._DummyClient`), same names and signatures.
# The tensor methods (`_tensor.py`, `_parallel.py`) are written over these, so they work on a
# dummy too; the internal ones (`_put_parts_batch`, `_read_registered`, `_write_caller`) are
# what those layers call besides the public byte methods.
_DUMMY_METHODS = (
    "get_hostname", "health_check", "put", "upsert", "put_parts", "upsert_parts", "put_batch",
    "upsert_batch", "get", "get_batch", "get_buffer", "batch_get_buffer", "get_size",
    "is_exist", "batch_is_exist", "remove", "batch_remove", "remove_by_regex", "remove_all",
    "alloc_from_mem_pool", "register_buffer", "unregister_buffer", "put_from", "upsert_from",
    "batch_put_from", "batch_upsert_from", "get_into", "batch_get_into", "put_tensor_from",
    "upsert_tensor_from", "batch_put_tensor_from", "batch_upsert_tensor_from",
    "batch_put_from_multi_buffers", "batch_get_into_multi_buffers", "get_into_ranges",
    "_put_parts_batch", "_read_registered", "_write_caller", "_create_task", "_query_task",
)
# Session methods: upstream's dummy answers INVALID_PARAMS for each key (observed on its
# 0.3.13.post1 wheel), and `batch_get_session_end` INVALID_PARAMS; the first argument is the
# key list.
_DUMMY_SESSIONS = (
    "batch_put_session_start", "batch_put_from_multi_buffer_ranges", "batch_put_session_end",
    "batch_put_session_revoke", "batch_get_session_start", "batch_get_into_multi_buffer_ranges",
    "batch_get_session_end",
)
# Lifecycle methods a dummy client answers itself.
_DUMMY_OWN = ("setup", "init_all", "setup_dummy", "close")


def _tcp_only(what, protocol):
    """Whether `protocol` is one this build serves segments over (logged when not)."""
    if str(protocol).lower() in ("tcp", "rdma", ""):
        return True
    log.error("%s: protocol %r: this build serves tcp only", what, protocol)
    return False


def _not_on_dummy(name, native):
    """A native method a dummy client does not offer: logs why, then answers as the native
    method does for a client that is not set up (upstream's failure value)."""

    def call(*args, **kwargs):
        log.error("%s: not available on a dummy client (setup_dummy); use a client set up "
                  "with setup()", name)
        return native(*args, **kwargs)

    call.__name__ = name
    return call


def _session_on_dummy(name):
    """A session method on a dummy client: logs why, then answers as upstream's dummy does."""

    def call(keys, *args, **kwargs):
        log.error("%s: sessions are not available on a dummy client (setup_dummy)", name)
        if name == "batch_get_session_end":
            return _INVALID
        return [_INVALID] * len(keys)

    call.__name__ = name
    return call


class DummyOps:
    """`setup_dummy` and the switch between a real and a dummy client."""

    def setup_dummy(self, mem_pool_size, local_buffer_size, server_address):
        """Attach to the standalone `mooncake_client` serving `server_address` (`host:port`,
        its `--port`) on this host: 0, or -1 when it cannot be reached (reason logged)."""
        if ("_dummy" in self.__dict__
                or _native.MooncakeDistributedStore.get_hostname(self)):
            log.error("setup_dummy: client is already initialized")
            return -1
        dummy, code = _native._DummyClient.connect(int(mem_pool_size), int(local_buffer_size),
                                                  str(server_address))
        if dummy is None:
            return -1
        installed = {name: getattr(dummy, name) for name in _DUMMY_METHODS}
        for name in _DUMMY_SESSIONS:
            installed[name] = _session_on_dummy(name)
        for name in dir(_native.MooncakeDistributedStore):
            if name.startswith("_") or name in installed or name in _DUMMY_OWN:
                continue
            native = getattr(_native.MooncakeDistributedStore, name)
            if callable(native):
                installed[name] = _not_on_dummy(name, native.__get__(self))
        installed["setup"] = installed["init_all"] = self._refuse_setup
        installed["close"] = self._close_dummy
        self.__dict__.update(installed)
        self.__dict__["_dummy"] = (dummy, list(installed))
        return 0

    def _refuse_setup(self, *args, **kwargs):
        log.error("setup: this client is a dummy client (setup_dummy); close() it first")
        return -1

    def _close_dummy(self):
        """Detaches from the standalone client (the shared region goes with the last
        reference); 0, and idempotent."""
        _, names = self.__dict__.pop("_dummy", (None, []))
        for name in names:
            self.__dict__.pop(name, None)
        return 0
