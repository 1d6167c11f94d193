"""Replica copy and move tasks end to end, as upstream's scripts/test_copy_move_api.py
checks them: three store clients, each contributing a segment and executing the tasks the
master assigns it; replica endpoints read through get_replica_desc. Storage nodes execute
tasks too (the last test)."""

from contextlib import contextmanager

import pytest

from conftest import MIB, Master, Node, lease_wait, make_store
from mooncake.store import QueryTaskResponse, ReplicateConfig, TaskStatus, TaskType
from polling import wait_until


@pytest.fixture(scope="module")
def trio(master):
    stores = [make_store(master, segment=64 * MIB, local_buffer=32 * MIB) for _ in range(3)]
    yield stores
    for s in stores:
        s.close()


def on(store):
    """A config that places the one replica in `store`'s segment."""
    cfg = ReplicateConfig()
    cfg.preferred_segment = store.get_hostname()
    return cfg


def port(name):
    return name.rsplit(":", 1)[1]


def holders(store, key):
    """The data ports of the segments holding `key`'s replicas (a segment's name and its
    transport endpoint share the port)."""
    return sorted(port(r.get_memory_descriptor().buffer_descriptor.transport_endpoint)
                  for r in store.get_replica_desc(key))


def finished(store, task_id):
    """Waits for the task to leave PENDING/PROCESSING; its last QueryTaskResponse."""
    last = []

    def done():
        resp, rc = store.query_task(task_id)
        assert rc == 0, rc
        last[:] = [resp]
        return resp.status in (TaskStatus.SUCCESS, TaskStatus.FAILED)

    wait_until(done, 30, f"task {task_id} to finish")
    return last[0]


def test_copy_adds_a_replica_on_the_target(trio):
    a, b, c = trio
    value = bytes(range(256)) * 4096
    assert a.put("tk_copy", value, on(a)) == 0
    assert holders(c, "tk_copy") == [port(a.get_hostname())]
    task_id, rc = c.create_copy_task("tk_copy", [b.get_hostname()])
    assert rc == 0
    assert isinstance(task_id, tuple) and task_id != (0, 0)
    resp = finished(c, task_id)
    assert isinstance(resp, QueryTaskResponse)
    assert (resp.id, resp.type, resp.status, resp.message) == \
        (task_id, TaskType.REPLICA_COPY, TaskStatus.SUCCESS, "Task completed successfully")
    assert resp.last_updated_at_ms_epoch >= resp.created_at_ms_epoch > 1_600_000_000_000
    assert isinstance(resp.assigned_client, tuple) and resp.assigned_client != (0, 0)
    assert holders(c, "tk_copy") == sorted([port(a.get_hostname()), port(b.get_hostname())])
    # The copy holds the bytes: drop the original (its writer may, once the lease of the
    # lookups above has run out) and read from the copy.
    lease_wait()
    assert a.batch_replica_clear(["tk_copy"], a.get_hostname()) == ["tk_copy"]
    assert holders(c, "tk_copy") == [port(b.get_hostname())]
    assert c.get("tk_copy") == value


def test_move_leaves_only_the_target(trio):
    a, b, c = trio
    value = b"moved" * 10000
    assert b.put("tk_move", value, on(b)) == 0
    task_id, rc = a.create_move_task("tk_move", b.get_hostname(), c.get_hostname())
    assert rc == 0
    resp = finished(a, task_id)
    assert (resp.type, resp.status) == (TaskType.REPLICA_MOVE, TaskStatus.SUCCESS)
    assert holders(a, "tk_move") == [port(c.get_hostname())]
    assert a.get("tk_move") == value
    # The object is free again: it can be removed.
    assert a.remove("tk_move", force=True) == 0


def test_copy_to_two_targets(trio):
    a, b, c = trio
    assert c.put("tk_two", b"x" * 5000, on(c)) == 0
    task_id, rc = b.create_copy_task("tk_two", [a.get_hostname(), b.get_hostname()])
    assert rc == 0
    assert finished(b, task_id).status == TaskStatus.SUCCESS
    assert len(holders(a, "tk_two")) == 3
    assert a.get("tk_two") == b"x" * 5000


def test_bad_inputs_give_upstreams_codes(trio):
    a, b, c = trio
    assert a.create_copy_task("tk_missing", [b.get_hostname()]) == ((0, 0), -704)
    assert a.put("tk_bad", b"v", on(a)) == 0
    # Codes observed on upstream's wheel (0.3.13.post1) for the same calls.
    assert a.create_copy_task("tk_bad", ["nowhere:1"]) == ((0, 0), -600)
    assert a.create_copy_task("tk_bad", []) == ((0, 0), -600)
    assert a.create_move_task("tk_bad", b.get_hostname(), c.get_hostname()) == ((0, 0), -600)
    assert a.create_move_task("tk_bad", "nowhere:1", b.get_hostname()) == ((0, 0), -600)
    assert a.create_move_task("tk_bad", a.get_hostname(), "nowhere:1") == ((0, 0), -600)
    assert a.create_move_task("tk_bad", a.get_hostname(), a.get_hostname()) == ((0, 0), -600)
    # A copy onto the segment that holds it: accepted, and done with nothing copied.
    task_id, rc = a.create_copy_task("tk_bad", [a.get_hostname()])
    assert rc == 0
    resp = finished(a, task_id)
    assert (resp.status, resp.message) == (TaskStatus.SUCCESS, "Task completed successfully")
    assert a.query_task((1, 2)) == (None, -1400)
    assert a.query_task((0, 0)) == (None, -1400)
    assert a.query_task((-1, 1 << 70)) == (None, -1400)
    assert holders(a, "tk_bad") == [port(a.get_hostname())]


@contextmanager
def node_cluster(node_kwargs, master_extra=()):
    """A master of its own, one 32 MiB storage node per `node_kwargs` entry and a store client
    without a segment (so no store executes tasks); all stopped at the end."""
    m = Master(extra=list(master_extra))
    nodes, s = [], None
    try:
        nodes = [Node(m, 32 * MIB, **kw) for kw in node_kwargs]
        s = make_store(m, segment=0, local_buffer=16 * MIB)
        yield nodes, s
    finally:
        if s is not None:
            s.close()
        for n in nodes:
            n.stop()
        m.stop()


def test_a_pending_task_blocks_remove_and_the_pending_limit_holds():
    """Two storage nodes told not to execute tasks (`--replica_tasks=false`) and a client
    without a segment (no executor either): a task stays PENDING, so what it blocks can be
    checked without a race."""
    # No drain on SIGTERM either: its moves would wait for executors that are off.
    off = {"extra": ["--replica_tasks=false", "--drain_timeout_sec=0"]}
    with node_cluster([off, off], ["--max_total_pending_tasks=1"]) as (nodes, s):
        seg1, seg2 = (f"127.0.0.1:{n.port}" for n in nodes)
        cfg = ReplicateConfig()
        cfg.preferred_segment = seg1
        assert s.put("tk_wait", b"w" * 100, cfg) == 0
        assert s.put("tk_other", b"o" * 100, cfg) == 0
        task_id, rc = s.create_copy_task("tk_wait", [seg2])
        assert rc == 0
        resp, rc = s.query_task(task_id)
        assert (rc, resp.status, resp.type) == (0, TaskStatus.PENDING, TaskType.REPLICA_COPY)
        assert s.create_move_task("tk_wait", seg1, seg2) == ((0, 0), -708)
        assert s.remove("tk_wait") == -708
        assert s.remove_all() == 1  # tk_other only
        assert s.is_exist("tk_wait") == 1
        assert s.create_copy_task("tk_other", [seg2]) == ((0, 0), -704)
        assert s.put("tk_other", b"o" * 100, cfg) == 0
        assert s.create_copy_task("tk_other", [seg2]) == ((0, 0), -1401)
        # A forced remove skips the task check, as upstream's.
        assert s.remove("tk_wait", force=True) == 0


def test_storage_nodes_carry_out_tasks():
    """Only storage nodes hold segments (the usual deployment): the node owning a task's
    target fetches and runs it, so copies and moves complete without any store client
    contributing memory."""
    with node_cluster([{"shards": 2}, {}]) as (nodes, s):
        a0, a1, b = f"127.0.0.1:{nodes[0].port}", f"127.0.0.1:{nodes[0].port}#1", \
            f"127.0.0.1:{nodes[1].port}"
        value = bytes(range(256)) * 5000
        cfg = ReplicateConfig()
        cfg.preferred_segment = a0
        assert s.put("tn_copy", value, cfg) == 0
        # Onto the other node, and onto the same node's other shard.
        task_id, rc = s.create_copy_task("tn_copy", [b, a1])
        assert rc == 0
        resp = finished(s, task_id)
        assert resp.status == TaskStatus.SUCCESS, resp.message
        assert len(s.get_replica_desc("tn_copy")) == 3
        lease_wait()
        assert s.batch_replica_clear(["tn_copy"], a0) == ["tn_copy"]
        assert s.batch_replica_clear(["tn_copy"], b) == ["tn_copy"]
        assert s.get("tn_copy") == value  # from shard 1's copy
        # A move between nodes.
        assert s.put("tn_move", value[:100_000], cfg) == 0
        before = holders(s, "tn_move")
        task_id, rc = s.create_move_task("tn_move", a0, b)
        assert rc == 0
        resp = finished(s, task_id)
        assert resp.status == TaskStatus.SUCCESS, resp.message
        after = holders(s, "tn_move")
        assert len(after) == 1 and after != before
        assert s.get("tn_move") == value[:100_000]
