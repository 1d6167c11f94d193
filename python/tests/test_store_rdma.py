"""`MooncakeDistributedStore.setup(..., protocol="rdma", ...)` through the package, against a
storage node started with `--protocol=rdma`, over the software verbs model (no RDMA hardware
here: `MOONCAKE_RDMA_SIM=<fabric dir>` selects it in the node and in this process; see
docs/rdma.md). The node's segments are published with RDMA descriptors, the store moves bytes
with one-sided RDMA WRITE/READ, and a TCP client reads the same bytes."""

import ctypes
import json
import os
import shutil
import tempfile
import urllib.error
import urllib.request

import pytest

from conftest import MIB, Node

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm")


@pytest.fixture
def fabric(monkeypatch):
    d = tempfile.mkdtemp(prefix="mc-rdma-py-", dir="/dev/shm")
    monkeypatch.setenv("MOONCAKE_RDMA_SIM", d)
    # Same-host shared segments would copy node replicas by memcpy instead.
    monkeypatch.setenv("MC_STORE_SHM", "0")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def rdma_store(master, protocol="rdma", metadata=None, segment=0):
    from mooncake.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", metadata or master.metadata, segment, 64 * MIB, protocol, "",
                 master.addr)
    return s, rc


def test_store_over_rdma_to_an_rdma_node(master, fabric):
    from mooncake.store import ReplicateConfig

    node = Node(master, 64 * MIB, extra=["--protocol=rdma"])
    try:
        seg = f"127.0.0.1:{node.port}"
        # The node published an RDMA descriptor (devices, rkeys) and its handshake port.
        with urllib.request.urlopen(f"{master.metadata}?key=mooncake/ram/{seg}") as r:
            desc = json.loads(r.read())
        assert desc["protocol"] == "rdma"
        assert len(desc["buffers"]) == 1 and len(desc["buffers"][0]["rkey"]) == len(desc["devices"])
        with urllib.request.urlopen(f"{master.metadata}?key=mooncake/rpc_meta/{seg}") as r:
            assert json.loads(r.read())["rpc_port"] > 0

        s, rc = rdma_store(master)
        assert rc == 0
        cfg = ReplicateConfig()
        cfg.preferred_segment = seg
        values = {f"py/{n}": bytes((i * 7 + n) % 256 for i in range(n)) for n in (1, 4096, 300_000)}
        values["py/big"] = os.urandom(5 * MIB + 3)
        for k, v in values.items():
            assert s.put(k, v, cfg) == 0, k
        for k, v in values.items():
            assert s.get(k) == v, k
        assert s.put_batch(["pb/0", "pb/1"], [b"a" * 1000, b"b" * 70_000], cfg) == 0
        assert s.get_batch(["pb/0", "pb/1"]) == [b"a" * 1000, b"b" * 70_000]

        # Registered memory (the NIC reads and writes it directly).
        size = 2 * MIB
        buf = (ctypes.c_ubyte * size)()
        ptr = ctypes.addressof(buf)
        assert s.register_buffer(ptr, size) == 0
        data = os.urandom(size)
        ctypes.memmove(buf, data, size)
        assert s.put_from("py/reg", ptr, size, cfg) == 0
        ctypes.memset(buf, 0, size)
        assert s.get_into("py/reg", ptr, size) == size
        assert bytes(buf) == data
        assert s.unregister_buffer(ptr) == 0

        # The node's own TCP server holds the same bytes.
        t, rc = rdma_store(master, protocol="tcp")
        assert rc == 0
        for k, v in values.items():
            assert t.get(k) == v, k
        assert t.get("py/reg") == data
        t.close()
        assert s.remove_all() >= 0
        s.close()
    finally:
        node.stop()


def test_rdma_setup_without_a_device(master, fabric, monkeypatch):
    monkeypatch.setenv("MOONCAKE_RDMA_SIM_DEVICES", "")
    # As upstream: TCP instead (warned), even with P2PHANDSHAKE.
    s, rc = rdma_store(master, segment=16 * MIB, metadata="P2PHANDSHAKE")
    assert rc == 0
    assert s.put("fallback/tcp", b"y") == 0 and s.get("fallback/tcp") == b"y"
    assert s.remove("fallback/tcp", True) == 0
    s.close()
    # MC_REQUIRE_RDMA: the error it was.
    monkeypatch.setenv("MC_REQUIRE_RDMA", "1")
    s, rc = rdma_store(master)
    assert rc == -1
    s, rc = rdma_store(master, metadata="P2PHANDSHAKE")
    assert rc == -1
    monkeypatch.delenv("MC_REQUIRE_RDMA")
    monkeypatch.setenv("MC_FORCE_TCP", "1")
    s, rc = rdma_store(master, segment=16 * MIB)
    assert rc == 0
    assert s.put("forced/tcp", b"x") == 0 and s.get("forced/tcp") == b"x"
    assert s.remove("forced/tcp", True) == 0
    s.close()


def test_p2p_handshake_store_over_rdma_to_an_rdma_node(master, fabric):
    """`P2PHANDSHAKE` with a device: the node serves its shards' descriptors from its
    handshake server (on `--port`), publishes nothing, and the store moves bytes by RDMA."""
    node = Node(master, 64 * MIB, shards=2,
                extra=["--protocol=rdma", "--metadata_server=P2PHANDSHAKE"])
    try:
        seg = f"127.0.0.1:{node.port}"
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"{master.metadata}?key=mooncake/ram/{seg}")
        s, rc = rdma_store(master, metadata="P2PHANDSHAKE")
        assert rc == 0
        values = {f"p2p/{n}": os.urandom(n) for n in (1, 4096, 300_000, 5 * MIB + 3)}
        for k, v in values.items():
            assert s.put(k, v) == 0, k
        for k, v in values.items():
            assert s.get(k) == v, k
        t, rc = rdma_store(master, protocol="tcp", metadata="P2PHANDSHAKE")
        assert rc == 0
        for k, v in values.items():
            assert t.get(k) == v, k
        t.close()
        assert s.remove_all() >= 0
        s.close()
    finally:
        node.stop()


def _rdma_bytes(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    for line in text.splitlines():
        if line.startswith('mooncake_client_path_bytes{path="rdma"} '):
            return int(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no RDMA path counter in /metrics:\n{text}")


def test_sglang_defaults_with_a_device_run_rdma(master, fabric):
    """SGLang HiCache's call (`protocol="rdma"`, `metadata_server="P2PHANDSHAKE"`) with a
    (simulated) device sets up over RDMA: two such stores write and read each other's
    segments, byte-exact, by RDMA (the path counter on the client HTTP server)."""
    from conftest import free_port
    from mooncake.store import MooncakeDistributedStore, ReplicateConfig

    stores, ports = [], []
    try:
        for _ in range(2):
            ports.append(free_port())
            s = MooncakeDistributedStore()
            assert s.setup("localhost", "P2PHANDSHAKE", 64 * MIB, 16 * MIB, "rdma", "",
                           master.addr, enable_client_http_server=True,
                           client_http_port=ports[-1]) == 0
            stores.append(s)
        value = os.urandom(3 * MIB + 5)
        for (writer, port), owner in zip(zip(stores, ports), reversed(stores)):
            cfg = ReplicateConfig()
            cfg.preferred_segment = owner.get_hostname()
            key = f"sglang/{owner.get_hostname()}"
            before = _rdma_bytes(port)
            assert writer.put(key, value, cfg) == 0
            assert writer.get(key) == value
            assert _rdma_bytes(port) - before == 2 * len(value)
            assert owner.get(key) == value
            assert writer.remove(key, True) == 0
    finally:
        for s in stores:
            s.close()
