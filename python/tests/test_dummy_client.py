"""`setup_dummy`: light clients that put and get through a standalone `mooncake_client` on
this host (a unix socket and a shared memory region, `docs/dummy-client.md`), against a real
master and the real `mooncake_client`, as upstream's test_dummy_client and
test_multi_dummy_clients run theirs."""

import ctypes
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import MIB, Master, Node, free_port, make_store
from test_replica_tasks import finished

from mooncake.store import MooncakeDistributedStore, ReplicateConfig, TaskStatus, TaskType


class Standalone(Node):
    """The installed `mooncake_client` on 127.0.0.1, serving dummy clients on its port."""

    def __init__(self, master, segment="64MB"):
        # No drain on SIGTERM: the module's last test kills another node, whose segment the
        # master still counts until its TTL, so a drain would book moves onto it and wait.
        super().__init__(master, segment, extra=["--drain_timeout_sec=0"])
        self.address = f"127.0.0.1:{self.port}"


@pytest.fixture(scope="module")
def own_master():
    m = Master()
    yield m
    m.stop()


@pytest.fixture(scope="module")
def standalone(own_master):
    s = Standalone(own_master)
    yield s
    s.stop()


@pytest.fixture
def dummy(standalone):
    d = MooncakeDistributedStore()
    assert d.setup_dummy(64 * MIB, 16 * MIB, standalone.address) == 0
    yield d
    d.close()


def test_standalone_client_announces_the_dummy_service(standalone):
    assert f"dummy clients @mooncake-rs-dummy/{standalone.port}" in standalone.lines


def test_bytes_round_trip_through_the_standalone_client(dummy, standalone):
    assert dummy.get_hostname().startswith("127.0.0.1")
    assert dummy.health_check() == 0
    assert dummy.put("d/one", b"hello dummy") == 0
    assert dummy.is_exist("d/one") == 1
    assert dummy.get_size("d/one") == 11
    assert dummy.get("d/one") == b"hello dummy"
    assert dummy.is_exist("d/none") == 0
    assert dummy.get("d/none") == b""
    assert dummy.get_size("d/none") == -704
    big = os.urandom(3 * MIB + 17)
    assert dummy.put("d/big", big) == 0
    assert dummy.get("d/big") == big
    assert dummy.upsert("d/one", b"changed") == 0
    assert dummy.get("d/one") == b"changed"
    assert dummy.put_parts("d/parts", b"ab", memoryview(b"cd"), bytearray(b"ef")) == 0
    assert dummy.get("d/parts") == b"abcdef"
    assert dummy.put_batch(["d/b1", "d/b2"], [b"x" * 10, b"y" * 20]) == 0
    assert dummy.get_batch(["d/b1", "d/b2", "d/none"]) == [b"x" * 10, b"y" * 20, b""]
    assert dummy.batch_is_exist(["d/b1", "d/none"]) == [1, 0]
    assert dummy.batch_remove(["d/b1", "d/b2"], force=True) == [0, 0]
    assert dummy.remove("d/parts", force=True) == 0
    assert dummy.is_exist("d/parts") == 0
    assert dummy.remove_by_regex("^d/(one|big)$", True) == 2


def test_zero_copy_from_the_shared_pool_and_staged_caller_buffers(dummy):
    n = 1 * MIB
    src = dummy.alloc_from_mem_pool(n)
    dst = dummy.alloc_from_mem_pool(n)
    assert src and dst and src != dst
    data = os.urandom(n)
    ctypes.memmove(src, data, n)
    assert dummy.register_buffer(src, n) == 0
    assert dummy.put_from("d/zc", src, n) == 0
    assert dummy.get_into("d/zc", dst, n) == n
    assert ctypes.string_at(dst, n) == data
    # A caller buffer outside the pool: staged through the region.
    out = bytearray(n)
    addr = ctypes.addressof((ctypes.c_char * n).from_buffer(out))
    assert dummy.get_into("d/zc", addr, n) == n and bytes(out) == data
    assert dummy.get_into("d/zc", addr, n - 1) == -600
    keys = ["d/zc1", "d/zc2"]
    bufs = [bytearray(os.urandom(1000)), bytearray(os.urandom(2000))]
    ptrs = [ctypes.addressof((ctypes.c_char * len(b)).from_buffer(b)) for b in bufs]
    assert dummy.batch_put_from(keys, ptrs, [1000, 2000]) == [0, 0]
    outs = [bytearray(1000), bytearray(2000)]
    optrs = [ctypes.addressof((ctypes.c_char * len(b)).from_buffer(b)) for b in outs]
    assert dummy.batch_get_into(keys + ["d/none"], optrs + [dst], [1000, 2000, n]) \
        == [1000, 2000, -704]
    assert outs == bufs
    assert dummy.batch_remove(keys + ["d/zc"], force=True) == [0, 0, 0]
    # An unmapped address is refused before anything moves.
    assert dummy.put_from("d/bad", 8, 100) == -600


def caller_buffer(n):
    """A buffer of ours outside the dummy's shared region, and its address."""
    b = bytearray(n)
    return b, ctypes.addressof((ctypes.c_char * n).from_buffer(b))


def test_multi_buffer_and_ranged_reads_and_writes(dummy):
    """The multi-buffer forms and `get_into_ranges` on a dummy, with the values upstream's
    dummy gives for the same calls (0.3.13.post1; where it differs, said below)."""
    assert dummy.put("dm/a", b"hello world") == 0
    pool = dummy.alloc_from_mem_pool(MIB)
    assert pool and dummy.register_buffer(pool, MIB) == 0
    # Scattered into two pieces of the shared pool (zero copy); a miss fails alone.
    assert dummy.batch_get_into_multi_buffers(
        ["dm/a", "dm/none"], [[pool + 4096, pool + 8192], [pool]], [[5, 6], [10]]) == [11, -704]
    assert ctypes.string_at(pool + 4096, 5) + ctypes.string_at(pool + 8192, 6) == b"hello world"
    # Pieces too small in total, or lists that do not line up: -600.
    assert dummy.batch_get_into_multi_buffers(["dm/a"], [[pool]], [[5]]) == [-600]
    assert dummy.batch_get_into_multi_buffers(["dm/a"], [[pool]], [[5, 6]]) == [-600]
    assert dummy.batch_get_into_multi_buffers(["dm/a", "dm/b"], [[pool]], [[5]]) == [-600, -600]
    # Pieces outside the pool are staged; more room than the object is fine (upstream's
    # dummy answers -800 there, its store 11).
    (b1, p1), (b2, p2) = caller_buffer(3), caller_buffer(64)
    assert dummy.batch_get_into_multi_buffers(["dm/a"], [[p1, p2]], [[3, 64]]) == [11]
    assert bytes(b1) + bytes(b2[:8]) == b"hello world"
    assert dummy.batch_get_into_multi_buffers(["dm/a"], [[8]], [[64]]) == [-600]  # unmapped

    # Each object the concatenation of its pieces, from the pool or staged.
    ctypes.memmove(pool + 1000, b"abcdefgh", 8)
    (b3, p3) = caller_buffer(4)
    b3[:] = b"WXYZ"
    assert dummy.batch_put_from_multi_buffers(
        ["dm/b", "dm/c", "dm/bad"], [[pool + 1000, pool + 1004], [p3, pool + 1000], [pool]],
        [[4, 4], [4, 2], [5, 5]]) == [0, 0, -600]
    assert dummy.get("dm/b") == b"abcdefgh" and dummy.get("dm/c") == b"WXYZab"
    assert dummy.is_exist("dm/bad") == 0
    assert dummy.batch_put_from_multi_buffers(["dm/d"], [[8]], [[4]]) == [-600]  # unmapped

    # Ranged reads into registered buffers: the pool, or a buffer given to register_buffer.
    assert dummy.get_into_ranges([pool], [["dm/a", "dm/none"]], [[[2000, 2010], [0]]],
                                 [[[0, 6], [0]]], [[[5, 5], [1]]]) == [[[5, 5], [-704]]]
    assert ctypes.string_at(pool + 2000, 5) + ctypes.string_at(pool + 2010, 5) == b"helloworld"
    assert dummy.get_into_ranges([pool], [["dm/a"]], [[[3000]]], [[[8]]], [[[5]]]) == [[[-600]]]
    # Overlapping destinations are filled in address order, as a store fills them.
    assert dummy.get_into_ranges([pool], [["dm/a"]], [[[5000, 5002]]], [[[0, 6]]],
                                 [[[5, 5]]]) == [[[5, 5]]]
    assert ctypes.string_at(pool + 5000, 7) == b"heworld"
    (b4, p4) = caller_buffer(32)
    assert dummy.get_into_ranges([p4], [["dm/a"]], [[[0]]], [[[6]]], [[[5]]]) == [[[-600]]]
    assert dummy.register_buffer(p4, 32) == 0
    assert dummy.get_into_ranges([p4], [["dm/a"]], [[[10]]], [[[6]]], [[[5]]]) == [[[5]]]
    assert bytes(b4[10:15]) == b"world"
    assert dummy.get_into_ranges([p4], [["dm/a"]], [[[30]]], [[[0]]], [[[5]]]) == [[[-600]]]
    assert dummy.unregister_buffer(p4) == 0
    assert dummy.get_into_ranges([p4], [["dm/a"]], [[[0]]], [[[0]]], [[[5]]]) == [[[-600]]]
    assert dummy.batch_remove(["dm/a", "dm/b", "dm/c"], force=True) == [0, 0, 0]


def test_sessions_on_a_dummy_answer_as_upstreams_dummy(dummy, caplog):
    assert dummy.put("ds/a", b"v" * 10) == 0
    pool = dummy.alloc_from_mem_pool(4096)
    with caplog.at_level("ERROR", logger="mooncake.store"):
        assert dummy.batch_put_session_start(["ds/s", "ds/t"], [10, 10]) == [-600, -600]
        assert dummy.batch_put_from_multi_buffer_ranges(["ds/s"], [[pool]], [[5]], [[0]]) \
            == [-600]
        assert dummy.batch_put_session_end(["ds/s"]) == [-600]
        assert dummy.batch_put_session_revoke(["ds/s"]) == [-600]
        assert dummy.batch_get_session_start(["ds/a"]) == [-600]
        assert dummy.batch_get_into_multi_buffer_ranges(["ds/a"], [[pool]], [[5]], [[0]]) \
            == [-600]
        assert dummy.batch_get_session_end(["ds/a"]) == -600
    assert "sessions are not available on a dummy client" in caplog.text
    assert dummy.remove("ds/a", force=True) == 0


def test_replica_tasks_through_the_standalone_client(own_master, standalone, dummy):
    """Copy and move tasks made and followed from a dummy; the standalone client forwards
    them to the master and the storage nodes carry them out."""
    other = Node(own_master, "32MB")
    reader = make_store(own_master, segment=0, local_buffer=16 * MIB)
    try:
        home, away = standalone.address, f"127.0.0.1:{other.port}"
        value = os.urandom(300_000)
        cfg = ReplicateConfig()
        cfg.preferred_segment = home
        assert dummy.put("dt/copy", value, cfg) == 0

        task_id, rc = dummy.create_copy_task("dt/copy", [away])
        assert rc == 0
        resp = finished(dummy, task_id)
        assert (resp.status, resp.type, resp.message) == \
            (TaskStatus.SUCCESS, TaskType.REPLICA_COPY, "Task completed successfully")
        assert len(reader.get_replica_desc("dt/copy")) == 2
        assert dummy.put("dt/move", value, cfg) == 0

        def ends():
            return [r.get_memory_descriptor().buffer_descriptor.transport_endpoint
                    for r in reader.get_replica_desc("dt/move")]

        before = ends()
        task_id, rc = dummy.create_move_task("dt/move", home, away)
        assert rc == 0
        assert finished(dummy, task_id).status == TaskStatus.SUCCESS
        after = ends()
        assert len(before) == len(after) == 1 and after != before
        assert dummy.get("dt/move") == value
        # Refusals come back with the master's codes.
        assert dummy.create_copy_task("dt/none", [away]) == ((0, 0), -704)
        assert dummy.create_move_task("dt/copy", "127.0.0.1:1", away) == ((0, 0), -600)
        assert dummy.query_task((0, 0)) == (None, -1400)
        assert dummy.batch_remove(["dt/copy", "dt/move"], force=True) == [0, 0]
    finally:
        reader.close()
        other.stop()


def test_tensor_methods_through_the_standalone_client(dummy):
    """The tensor and parallel-tensor methods on a dummy, as upstream's test_dummy_client runs
    them: puts and gets of whole, batched, TP-sharded and parallel tensors, reads into the
    shared pool and puts from it, each checked against the tensor that was put."""
    torch = pytest.importorskip("torch")
    from mooncake.store import ParallelAxis, ReadTarget, TensorParallelism

    t = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    b = torch.linspace(-1, 1, 7).to(torch.bfloat16)
    assert dummy.put_tensor("dt/a", t) == 0
    assert torch.equal(dummy.get_tensor("dt/a"), t)
    assert dummy.batch_put_tensor(["dt/b", "dt/c"], [b, t * 3]) == [0, 0]
    got = dummy.batch_get_tensor(["dt/b", "dt/c", "dt/none"])
    assert torch.equal(got[0], b) and torch.equal(got[1], t * 3) and got[2] is None
    assert dummy.upsert_tensor("dt/a", t * 2) == 0
    assert torch.equal(dummy.get_tensor("dt/a"), t * 2)
    assert dummy.batch_upsert_tensor(["dt/b"], [b * 2]) == [0]
    assert torch.equal(dummy.get_tensor("dt/b"), b * 2)
    assert dummy.put_tensor("dt/bad", "not a tensor") == -600

    # Tensor parallelism: shards along dim 1, each readable by its rank.
    assert dummy.put_tensor_with_tp("dt/tp", t, tp_size=2, split_dim=1) == 0
    assert torch.equal(dummy.get_tensor_with_tp("dt/tp", tp_rank=1, tp_size=2), t[:, 3:])
    assert torch.equal(dummy.batch_get_tensor_with_tp(["dt/tp"], 0, 2)[0], t[:, :3])

    # Into the shared pool, then the object stored from there.
    size = dummy.get_size("dt/a")
    ptr = dummy.alloc_from_mem_pool(4096)
    assert ptr and size > t.numel() * 4
    assert torch.equal(dummy.get_tensor_into("dt/a", ptr, 4096), t * 2)
    assert torch.equal(dummy.batch_get_tensor_into(["dt/a"], [ptr], [4096])[0], t * 2)
    assert dummy.put_tensor_from("dt/from", ptr, size) == 0
    assert torch.equal(dummy.get_tensor("dt/from"), t * 2)
    assert dummy.batch_put_tensor_from(["dt/f2", "dt/short"], [ptr, ptr], [size, 10]) \
        == [0, -600]
    assert dummy.put_tensor_from("dt/unmapped", 8, size) == -600
    assert dummy.put_tensor_with_tp_from("dt/tpf", ptr, size, tp_size=2, split_dim=0) == 0
    assert torch.equal(dummy.get_tensor_with_tp("dt/tpf", tp_rank=1, tp_size=2), t[2:] * 2)

    # get_buffer: the object's bytes, as on a store.
    buf = dummy.get_buffer("dt/a")
    assert buf is not None and buf.size() == size and bytes(buf) == dummy.get("dt/a")
    assert dummy.get_buffer("dt/none") is None
    assert dummy.batch_get_buffer([]) == []

    # The parallel family: both TP shards put by their ranks, each read back.
    def tp(rank):
        axis = ParallelAxis()
        axis.kind, axis.rank, axis.size, axis.split_dim = "tp", rank, 2, 1
        p = TensorParallelism()
        p.axes = [axis]
        return p

    def target(mode, p=None):
        r = ReadTarget()
        r.mode, r.parallelism = mode, p
        return r

    for rank in (0, 1):
        shard = t[:, 3 * rank:3 * rank + 3]
        assert dummy.put_tensor_with_parallelism("dt/par", shard, tp(rank)) == 0
    for rank in (0, 1):
        got = dummy.get_tensor_with_parallelism("dt/par", target("shard", tp(rank)))
        assert torch.equal(got, t[:, 3 * rank:3 * rank + 3])
    assert dummy.get_tensor_with_parallelism("dt/par") is None  # no plain object, as upstream
    out = bytearray(4096)
    addr = ctypes.addressof((ctypes.c_char * len(out)).from_buffer(out))
    got = dummy.get_tensor_with_parallelism_into("dt/par", addr, len(out), target("shard", tp(1)))
    assert torch.equal(got, t[:, 3:])

    assert dummy.remove_by_regex("^dt/", True) >= 8


def test_too_large_for_the_region_is_buffer_overflow(standalone):
    d = MooncakeDistributedStore()
    assert d.setup_dummy(0, 1 * MIB, standalone.address) == 0
    try:
        assert d.put("d/huge", b"z" * (2 * MIB)) == -10
        assert d.put("d/fits", b"z" * (MIB // 2)) == 0
        assert d.get("d/fits") == b"z" * (MIB // 2)
        assert d.remove("d/fits", force=True) == 0
    finally:
        d.close()


def test_lifecycle_and_methods_a_dummy_does_not_offer(standalone, caplog):
    d = MooncakeDistributedStore()
    assert d.get_hostname() == ""
    assert d.setup_dummy(MIB, MIB, standalone.address) == 0
    assert d.setup_dummy(MIB, MIB, standalone.address) == -1  # already a client
    assert d.setup("localhost", "P2PHANDSHAKE", MIB, MIB, "tcp", "", "127.0.0.1:1") == -1
    with caplog.at_level("ERROR", logger="mooncake.store"):
        assert d.get_replica_desc("k") == []
    assert "not available on a dummy client" in caplog.text
    assert d.close() == 0
    assert d.close() == 0
    assert d.get_hostname() == "" and d.put("k", b"v") == -600
    assert d.setup_dummy(MIB, MIB, standalone.address) == 0
    assert d.put("d/again", b"v") == 0 and d.remove("d/again", force=True) == 0
    d.close()


def test_no_standalone_client_is_minus_one():
    d = MooncakeDistributedStore()
    t = time.monotonic()
    assert d.setup_dummy(MIB, MIB, f"127.0.0.1:{free_port()}") == -1
    assert d.setup_dummy(MIB, MIB, "no-port") == -1
    assert d.setup_dummy(0, 0, "127.0.0.1:50052") == -1
    assert time.monotonic() - t < 5
    assert d.get_hostname() == "" and d.get("k") == b""


CHILD = textwrap.dedent("""
    import sys, time
    from mooncake.store import MooncakeDistributedStore
    me, other, address = sys.argv[1:4]
    s = MooncakeDistributedStore()
    assert s.setup_dummy(32 << 20, 8 << 20, address) == 0, "setup_dummy"
    for i in range(20):
        assert s.put(f"{me}/{i}", f"{me} value {i}".encode() * 100) == 0, "put"
    deadline = time.monotonic() + 30
    while s.is_exist(f"{other}/19") != 1:
        assert time.monotonic() < deadline, "the other dummy never wrote"
        time.sleep(0.05)
    for i in range(20):
        got = s.get(f"{other}/{i}")
        assert got == f"{other} value {i}".encode() * 100, (i, got[:40])
    print("ok", flush=True)
    # Keep our keys until the other side read them too: the test answers "go" once both
    # printed "ok".
    assert sys.stdin.readline().strip() == "go", "no go from the test"
    s.close()
""")


def test_two_dummy_processes_read_each_others_keys(standalone):
    procs = [
        subprocess.Popen([sys.executable, "-c", CHILD, me, other, standalone.address],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
        for me, other in (("client1", "client2"), ("client2", "client1"))
    ]
    # Both have read the other's keys (or one failed: EOF) before either closes.
    firsts = [p.stdout.readline().strip() for p in procs]
    for p in procs:
        if p.poll() is None:
            p.stdin.write("go\n")
            p.stdin.flush()
    for p, first in zip(procs, firsts):
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0 and first == "ok" and out.strip() == "", err[-2000:]


def test_dummy_fails_fast_and_clearly_when_the_standalone_client_dies(own_master, caplog):
    node = Standalone(own_master, segment="16MB")
    d = MooncakeDistributedStore()
    assert d.setup_dummy(MIB, MIB, node.address) == 0
    assert d.put("d/dies", b"v") == 0
    node.proc.send_signal(signal.SIGKILL)
    node.proc.wait(timeout=10)
    t = time.monotonic()
    with caplog.at_level("ERROR"):
        assert d.put("d/after", b"v") == -900
        assert d.get("d/dies") == b""
        assert d.is_exist("d/dies") == -900
        assert d.get_size("d/dies") == -900
        assert d.batch_is_exist(["a", "b"]) == [-900, -900]
        assert d.health_check() == 2
    assert time.monotonic() - t < 5
    assert d.close() == 0
    # Nothing serves that port any more.
    assert d.setup_dummy(MIB, MIB, node.address) == -1
