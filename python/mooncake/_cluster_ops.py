"""Store methods whose upstream work our master and client do not offer, answered the way
upstream answers when it cannot do them, with the reason logged (never a silent success):

- extra segments (`mount_segment`, `allocate_and_mount_segment`): a client here serves one
  segment, the one `setup` mounts; mounting more is refused (`ret = -1`, upstream's failure).
  Unmounting answers truthfully: no extra segment exists, so `[]` is 0 and any id is -1.
- replica tasks (`create_copy_task`, `create_move_task`): the master has no task queue; a
  missing key is `-704` as upstream, any other key `NOT_SUPPORTED` (-1012). `query_task`
  finds no task, which is true: `(None, -1400)`.
- `batch_replica_clear`: the master has no owner-checked replica clear; nothing is cleared
  (`[]`, upstream's answer when no key qualifies).
- `setup_dummy`: there is no standalone client serving dummy clients over shared memory
  here; the call fails with -1, upstream's code for a real client it cannot reach.
"""

import enum
import logging

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
    """What `query_task` returns for a known task (upstream's read-only fields). Never built
    here, since no task is ever created; kept so code that imports or isinstance-checks it
    works."""

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

_INVALID = -600
_NOT_FOUND = -704
_NOT_SUPPORTED = -1012
_TASK_NOT_FOUND = -1400
_NO_TASK = (0, 0)


class ClusterOps:
    """Segment, task, replica-clear and dummy-client methods of `MooncakeDistributedStore`."""

    def _ready(self, what):
        if self.get_hostname():
            return True
        log.error("%s: client is not initialized", what)
        return False

    # ---- segments -------------------------------------------------------------------------

    def mount_segment(self, path, size, offset=0, protocol="tcp", location=""):
        if self._ready("mount_segment"):
            log.error("mount_segment(%s): this client serves only the segment setup mounted; "
                      "extra segments are not supported", path)
        return {"ret": -1, "segment_ids": []}

    def allocate_and_mount_segment(self, size, protocol="tcp", location=""):
        if self._ready("allocate_and_mount_segment"):
            log.error("allocate_and_mount_segment(%d): this client serves only the segment "
                      "setup mounted; extra segments are not supported", size)
        return {"ret": -1, "segment_ids": [], "allocated_size": 0}

    def _unmount(self, what, segment_ids):
        if not self._ready(what):
            return -1
        ids = list(segment_ids)
        if ids:
            log.error("%s: invalid segment_id %s (no extra segment is mounted)", what, ids[0])
            return -1
        return 0

    def unmount_segment(self, segment_ids, grace_period_seconds=0):
        return self._unmount("unmount_segment", segment_ids)

    def unmount_and_free_segment(self, segment_ids, grace_period_seconds=0):
        return self._unmount("unmount_and_free_segment", segment_ids)

    def unmount_local_disk_segment(self, grace_period_seconds=0):
        """0: there is no local disk segment to unmount (no SSD tier here)."""
        return 0 if self._ready("unmount_local_disk_segment") else -1

    # ---- replica tasks ----------------------------------------------------------------------

    def _task(self, what, key):
        if not self._ready(what):
            return (_NO_TASK, _INVALID)
        if self.is_exist(key) != 1:
            log.error("%s failed for key: %s, error: %d", what, key, _NOT_FOUND)
            return (_NO_TASK, _NOT_FOUND)
        log.error("%s failed for key: %s: the master has no replica task queue", what, key)
        return (_NO_TASK, _NOT_SUPPORTED)

    def create_copy_task(self, key, targets):
        list(targets)
        return self._task("create_copy_task", key)

    def create_move_task(self, key, source, target):
        return self._task("create_move_task", key)

    def query_task(self, task_id):
        first, second = task_id
        int(first), int(second)
        log.error("QueryTask failed for task_id: %d-%d, error: %d", first, second, _TASK_NOT_FOUND)
        return (None, _TASK_NOT_FOUND)

    # ---- replica clear -------------------------------------------------------------------

    def batch_replica_clear(self, keys, segment_name=""):
        keys = list(keys)
        if self._ready("batch_replica_clear") and keys:
            log.error("batch_replica_clear: the master offers no owner-checked replica clear; "
                      "%d key(s) left as they are", len(keys))
        return []

    # ---- dummy clients ---------------------------------------------------------------------

    def setup_dummy(self, mem_pool_size, local_buffer_size, server_address):
        log.error("setup_dummy(%s): no standalone client serves dummy clients here; use "
                  "setup() with a master address instead", server_address)
        return -1
