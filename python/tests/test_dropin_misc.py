"""Drop-in details checked against upstream's 0.3.13.post1 wheel (the expected values are what
it returned for the same calls): `get_into_ranges` failure shapes, the segment / task /
replica-clear / dummy-client methods, and the setup options this build refuses."""

import ctypes

import pytest

from conftest import MIB, lease_wait
from mooncake.store import ReplicateConfig

INVALID = -600


@pytest.fixture
def registered(store):
    n = 1 << 20
    buf = (ctypes.c_ubyte * n)()
    p = ctypes.addressof(buf)
    assert store.register_buffer(p, n) == 0
    yield buf, p
    assert store.unregister_buffer(p) == 0


def test_get_into_ranges_failures_take_the_shape_of_the_offsets(store, registered):
    _buf, p = registered
    assert store.put("gr_r1", bytes(range(100))) == 0
    assert store.put("gr_r2", bytes(range(50))) == 0
    g = store.get_into_ranges
    assert g([p], [["gr_r1", "gr_r2"]], [[[0, 10], [20]]], [[[0, 5], [1]]], [[[5, 5], [3]]]) \
        == [[[5, 5], [3]]]
    # One key's lists disagree: that key fails, as long as its destination offsets.
    assert g([p], [["gr_r1", "gr_r2"]], [[[0], [20]]], [[[0, 5], [1]]], [[[5, 5], [3]]]) \
        == [[[-600], [3]]]
    assert g([p], [["gr_r1", "gr_r2"]], [[[0, 10], [20]]], [[[0], [1]]], [[[5, 5], [3]]]) \
        == [[[-600, -600], [3]]]
    assert g([p], [["gr_r1"]], [[[0, 3]]], [[[0]]], [[[5, 1, 1]]]) == [[[-600, -600]]]
    # A buffer's key list disagrees: one list per key.
    assert g([p], [["gr_r1"]], [[[0, 10], [20]]], [[[0, 5], [1]]], [[[5, 5], [3]]]) \
        == [[[-600, -600]]]
    assert g([p], [["gr_r1", "gr_r2"]], [[[0]]], [[[0], [0]]], [[[5], [5]]]) \
        == [[[-600], [-600]]]
    # The whole call disagrees: one entry per buffer.
    assert g([p, p], [["gr_r1"]], [[[0]]], [[[0]]], [[[5]]]) == [[[-600]], [[-600]]]
    assert g([p, p], [["gr_r1", "gr_r2"]], [[[0, 1, 2], [20]]], [[[0, 5], [1]]],
             [[[5, 5], [3]]]) == [[[-600, -600, -600], [-600]], [[-600]]]
    assert g([p], [["gr_r1"]], [[[0]]], [[[0]]], []) == [[[-600]]]
    # Per fragment: a missing key, source and destination overflows, an empty fragment.
    assert g([p], [["gr_zz", "gr_r2"]], [[[0], [20]]], [[[0], [1]]], [[[5], [3]]]) \
        == [[[-704], [3]]]
    assert g([p], [["gr_r2"]], [[[0, 10]]], [[[45, 0]]], [[[10, 5]]]) == [[[-600, 5]]]
    assert g([p], [["gr_r2"]], [[[(1 << 20) - 2, 10]]], [[[0, 0]]], [[[5, 5]]]) \
        == [[[-600, 5]]]
    assert g([p], [["gr_r2"]], [[[0]]], [[[0]]], [[[0]]]) == [[[0]]]
    assert g([], [], [], [], []) == []
    lease_wait()


def test_segment_methods(store):
    assert store.mount_segment("/nonexistent", 1 << 20) == {"ret": -1, "segment_ids": []}
    r = store.allocate_and_mount_segment(16 << 20)
    assert r["ret"] == 0 and len(r["segment_ids"]) == 1 and r["allocated_size"] >= 16 << 20
    assert store.unmount_segment(["nope"]) == -1
    assert store.unmount_and_free_segment(r["segment_ids"]) == 0
    assert store.unmount_segment(r["segment_ids"]) == -1
    assert store.unmount_segment([]) == 0
    assert store.unmount_and_free_segment([]) == 0
    assert store.unmount_local_disk_segment() == 0


def test_task_methods(store):
    assert store.create_copy_task("tk_missing", ["x"]) == ((0, 0), -704)
    assert store.query_task((0, 0)) == (None, -1400)
    assert store.query_task((1, 2)) == (None, -1400)
    assert store.put("tk_b", b"x") == 0
    # The target is not mounted: -600, as upstream; a copy onto the segment that already
    # holds it is accepted, as upstream (test_replica_tasks.py runs tasks to completion).
    assert store.create_move_task("tk_b", store.get_hostname(), "nowhere") == ((0, 0), -600)
    task_id, rc = store.create_copy_task("tk_b", [store.get_hostname()])
    assert rc == 0 and task_id != (0, 0)


def test_replica_clear_and_dummy(store, new_store):
    assert store.batch_replica_clear([]) == []
    assert store.batch_replica_clear(["rc_a"], "nosuchseg") == []
    # Only the writer's keys, with no lease (a read or a probe), are cleared; missing keys
    # and keys named twice are left out of the answer.
    other = new_store(segment=64 * MIB, local_buffer=16 * MIB)
    for k in ("rc_a", "rc_read", "rc_probed"):
        assert store.put(k, b"x" * 4096) == 0
    assert other.put("rc_theirs", b"y" * 4096) == 0
    assert store.get("rc_read") == b"x" * 4096
    assert store.is_exist("rc_probed") == 1
    assert other.batch_replica_clear(["rc_a"]) == []
    assert store.batch_replica_clear(
        ["rc_a", "rc_a", "rc_theirs", "rc_read", "rc_probed", "rc_missing"]) == ["rc_a"]
    assert store.is_exist("rc_a") == 0
    lease_wait()
    assert store.batch_replica_clear(["rc_read", "rc_probed"]) == ["rc_read", "rc_probed"]
    assert other.batch_replica_clear(["rc_theirs"]) == ["rc_theirs"]
    # A named segment (a client's segment is named by its hostname) loses only its replica;
    # the last one takes the object.
    two = ReplicateConfig()
    two.replica_num = 2
    assert store.put("rc_pair", b"z" * 4096, two) == 0
    assert len(store.get_replica_desc("rc_pair")) == 2
    assert store.batch_replica_clear(["rc_pair"], other.get_hostname()) == []  # the lease
    lease_wait()
    assert store.batch_replica_clear(["rc_pair"], other.get_hostname()) == ["rc_pair"]
    assert len(other.get_replica_desc("rc_pair")) == 1
    assert other.get("rc_pair") == b"z" * 4096
    lease_wait()
    assert store.batch_replica_clear(["rc_pair"], other.get_hostname()) == []
    assert store.batch_replica_clear(["rc_pair"], store.get_hostname()) == ["rc_pair"]
    assert store.is_exist("rc_pair") == 0
    from mooncake.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    assert s.setup_dummy(64 * MIB, 16 * MIB, "127.0.0.1:50999") == -1
    assert s.health_check() == 1


def test_before_setup():
    from mooncake.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    assert s.allocate_and_mount_segment(1 << 20) == \
        {"ret": -1, "segment_ids": [], "allocated_size": 0}
    assert s.mount_segment("/tmp/x", 1 << 20) == {"ret": -1, "segment_ids": []}
    assert s.unmount_segment(["a"]) == -1
    assert s.batch_replica_clear(["k"]) == []
    assert s.save_tensor_to_safetensor("k") == INVALID


@pytest.mark.parametrize("kw", [
    {"enable_ssd_offload": True, "global_segment_size": 0},
    {"tenant_id": "bad\0tenant"},
    {"enable_client_http_server": True, "client_http_port": 70000},
])
def test_unsupported_setup_options_are_refused(master, kw):
    """An SSD tier with no segment to offload from would be a tier that never fills:
    refused with INVALID_PARAMS. A tenant name with NUL cannot name a key space (upstream's
    master would take it; ours refuses it at setup), nor a port past 65535 an endpoint."""
    from mooncake.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    kw = dict(kw)
    segment = kw.pop("global_segment_size", 16 * MIB)
    args = ("localhost", master.metadata, segment, 16 * MIB, "tcp", "", master.addr)
    assert s.setup(*args, **kw) == INVALID
    cfg = {"local_hostname": "localhost", "metadata_server": master.metadata,
           "master_server_addr": master.addr, "global_segment_size": str(segment),
           **{k: str(v) for k, v in kw.items()}}
    assert s.setup(cfg) == INVALID
    assert s.setup(*args, enable_ssd_offload=False, tenant_id="default",
                   enable_client_http_server=False) == 0
    s.close()


def _http_get(port, path):
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.headers.get("Content-Type"), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type"), e.read().decode()


def test_client_http_server_as_upstreams(master):
    """`enable_client_http_server`: `/health`, `/metrics`, `/metrics/summary` on the client's
    address (bodies and names as upstream's wheel answered for the same calls)."""
    import socket

    from conftest import free_port
    from mooncake.store import MooncakeDistributedStore

    port = free_port()
    s = MooncakeDistributedStore()
    args = ("127.0.0.1", master.metadata, 16 * MIB, 16 * MIB, "tcp", "", master.addr)
    assert s.setup(*args, enable_client_http_server=True, client_http_port=port) == 0
    try:
        # upstream: /health 200 application/json '{"status":"healthy","code":0}'
        assert _http_get(port, "/health") == (200, "application/json",
                                              '{"status":"healthy","code":0}')
        assert s.put("http/k", b"x" * 100) == 0 and s.get("http/k") == b"x" * 100
        status, ctype, text = _http_get(port, "/metrics")
        assert (status, ctype) == (200, "text/plain; version=0.0.4")
        # upstream: mooncake_transfer_read_bytes{client_mode="real"} 100 (and write)
        assert 'mooncake_transfer_read_bytes{client_mode="real"} 100\n' in text, text
        assert 'mooncake_transfer_write_bytes{client_mode="real"} 100\n' in text, text
        status, _, text = _http_get(port, "/metrics/summary")
        assert status == 200 and "Total Read: 100 B\nTotal Write: 100 B" in text, text
        assert _http_get(port, "/nope")[0] == 404
        # A second client cannot take the same port: its setup fails whole.
        t = MooncakeDistributedStore()
        assert t.setup(*args, enable_client_http_server=True, client_http_port=port) == -1
        assert t.get_hostname() == ""
    finally:
        s.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    # The dict form (MooncakeConfig's) too.
    cfg = {"local_hostname": "127.0.0.1", "metadata_server": master.metadata,
           "master_server_addr": master.addr, "enable_client_http_server": "true",
           "client_http_port": str(port)}
    assert s.setup(cfg) == 0
    assert _http_get(port, "/health")[0] == 200
    s.close()
    # The storage node serves it too (`mooncake_client --enable_http_server --http_port`).
    from conftest import Node

    node = Node(master, "16MB", extra=["--enable_http_server", f"--http_port={port}"])
    try:
        assert _http_get(port, "/health") == (200, "application/json",
                                              '{"status":"healthy","code":0}')
        status, _, text = _http_get(port, "/metrics")
        assert status == 200 and "mooncake_node_shards 1" in text, text
    finally:
        node.stop()


def test_task_types_exported_as_upstream():
    import mooncake.store as m

    assert [(k, int(v)) for k, v in m.TaskStatus.__members__.items()] == \
        [("PENDING", 0), ("PROCESSING", 1), ("SUCCESS", 3), ("FAILED", 2)]
    assert (int(m.TaskType.REPLICA_COPY), int(m.TaskType.REPLICA_MOVE)) == (0, 1)
    assert str(m.PENDING) == "TaskStatus.PENDING" and m.REPLICA_MOVE == 1
    r = m.QueryTaskResponse((1, 2), 1, 3, 5, 6, (3, 4))
    assert (r.type, r.status, r.message) == (m.TaskType.REPLICA_MOVE, m.TaskStatus.SUCCESS, "")
    with pytest.raises(AttributeError):
        r.message = "x"
