"""Two clients with `replica_num=2`, ported from upstream's
test_replicated_distributed_object_store.py, plus the writer dying by SIGKILL."""

import ctypes
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from conftest import MIB, Master, make_store
from mooncake.store import ReplicateConfig


@pytest.fixture(scope="module")
def pair(master):
    a = make_store(master, segment=1600 * MIB, local_buffer=128 * MIB)
    b = make_store(master, segment=1600 * MIB, local_buffer=128 * MIB)
    yield a, b
    a.close()
    b.close()


def two():
    cfg = ReplicateConfig()
    cfg.replica_num = 2
    return cfg


def endpoints(store, key):
    return {r.get_memory_descriptor().buffer_descriptor.transport_endpoint
            for r in store.get_replica_desc(key)}


def test_put_replicates_to_distinct_segments(pair):
    a, b = pair
    assert a.put(key="rep_put", value=b"replicated", config=two()) == 0
    assert len(endpoints(b, "rep_put")) == 2
    assert b.get("rep_put") == b"replicated"


def test_put_batch_and_zero_copy_with_replicas(pair):
    a, b = pair
    keys = [f"rep_batch_{i}" for i in range(4)]
    values = [os.urandom(1000 * (i + 1)) for i in range(4)]
    assert a.put_batch(keys=keys, values=values, config=two()) == 0
    assert b.get_batch(keys) == values
    buf = ctypes.create_string_buffer(b"zero-copy replicated", 20)
    ptr = ctypes.addressof(buf)
    assert a.register_buffer(buffer_ptr=ptr, size=20) == 0
    assert a.put_from(key="rep_from", buffer_ptr=ptr, size=20, config=two()) == 0
    assert a.batch_put_from(keys=["rep_bf"], buffer_ptrs=[ptr], sizes=[20], config=two()) == [0]
    for k in ("rep_from", "rep_bf"):
        assert b.get(k) == b"zero-copy replicated"
        assert len(endpoints(b, k)) == 2
    assert a.unregister_buffer(buffer_ptr=ptr) == 0


def test_wrong_keyword_names_raise_type_error(pair):
    a, _ = pair
    with pytest.raises(TypeError):
        a.put(k="x", value=b"v")
    with pytest.raises(TypeError):
        a.put(key="x", val=b"v")
    with pytest.raises(TypeError):
        a.put(key="x", value=b"v", cfg=two())
    with pytest.raises(TypeError):
        a.put_from(key="x", buffer=1, size=1)
    with pytest.raises(TypeError):
        a.batch_put_from(key=["x"], buffer_ptrs=[1], sizes=[1])
    with pytest.raises(TypeError):
        a.get(key="x")  # positional-only upstream
    with pytest.raises(TypeError):
        a.is_exist(key="x")
    with pytest.raises(TypeError):
        a.put_batch(keys="notalist", values=[b"x"])


def test_data_survives_closing_the_writer(master):
    reader = make_store(master, segment=64 * MIB, local_buffer=16 * MIB)
    writer = make_store(master, segment=64 * MIB, local_buffer=16 * MIB)
    try:
        solo = ReplicateConfig()
        solo.preferred_segment = writer.get_hostname()
        assert writer.put("close_solo", b"only on the writer", solo) == 0
        assert writer.put("close_duo", b"on both", two()) == 0
        assert writer.close() == 0
        assert reader.get("close_duo") == b"on both"
        assert reader.get("close_solo") == b""
        assert reader.is_exist("close_solo") == 0
    finally:
        reader.close()


WRITER = textwrap.dedent(
    """
    import os, sys, time
    from mooncake.store import MooncakeDistributedStore, ReplicateConfig
    s = MooncakeDistributedStore()
    assert s.setup("localhost", sys.argv[1], 256 << 20, 64 << 20, "tcp", "", sys.argv[2]) == 0
    cfg = ReplicateConfig()
    cfg.replica_num = 2
    for i in range(50):
        assert s.put(f"killed_{i}", bytes([i]) * (4096 + i), cfg) == 0
    print("ready", flush=True)
    time.sleep(600)  # holds the replicas until the test SIGKILLs it
    """
)


def test_reader_gets_every_key_after_the_writer_is_sigkilled():
    # A private master: the killed writer's segment stays mounted until its liveness TTL
    # expires, which would make puts of later tests fail on the session master.
    master = Master()
    reader = make_store(master, segment=256 * MIB, local_buffer=64 * MIB)
    try:
        p = subprocess.Popen([sys.executable, "-c", WRITER, master.metadata, master.addr],
                             stdout=subprocess.PIPE, text=True)
        try:
            assert p.stdout.readline().strip() == "ready"
        finally:
            p.send_signal(signal.SIGKILL)
            p.wait()
        for i in range(50):
            assert reader.get(f"killed_{i}") == bytes([i]) * (4096 + i), i
    finally:
        reader.close()
        assert master.stop() == 0
