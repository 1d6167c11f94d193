"""`mooncake.engine` with its metadata in a real etcd: the seed's "Pattern 4: Transfer Engine
Direct Transfer" with the seed's bare `"host:port"` etcd address, between this process and an
`engine_target.py` subprocess.

The `etcd` fixture starts Debian's `etcd-server` (`/usr/bin/etcd`) on free loopback ports and
kills it at the end. A missing binary is a failure, not a skip: scripts/setup.sh installs it.
Keys are read back through etcd's JSON gateway (`/v3/kv/range`), as any etcd client would.
"""

import base64
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

ETCD_BIN = "/usr/bin/etcd"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Etcd:
    """A throwaway single-member etcd on 127.0.0.1."""

    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="mooncake-etcd-py-"))
        self.port, peer = _free_port(), _free_port()
        client_url = f"http://127.0.0.1:{self.port}"
        peer_url = f"http://127.0.0.1:{peer}"
        self.log = open(self.dir / "etcd.log", "wb")
        self.proc = subprocess.Popen(
            [ETCD_BIN, "--data-dir", str(self.dir / "data"), "--name", "default",
             "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
             "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
             "--initial-cluster", f"default={peer_url}"],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
        )

    @property
    def addr(self):
        return f"127.0.0.1:{self.port}"

    def healthy(self, timeout=30.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"http://{self.addr}/health", timeout=1) as r:
                    if b"true" in r.read():
                        return True
            except OSError:
                pass
            time.sleep(0.05)
        return False

    def _post(self, path, body):
        req = urllib.request.Request(f"http://{self.addr}/v3/kv/{path}",
                                     data=json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.loads(r.read())

    def keys(self, prefix):
        """Every key under `prefix`, sorted."""
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        b64 = lambda s: base64.b64encode(s.encode()).decode()  # noqa: E731
        out = self._post("range", {"key": b64(prefix), "range_end": b64(end), "keys_only": True})
        return sorted(base64.b64decode(kv["key"]).decode() for kv in out.get("kvs", []))

    def get(self, key):
        out = self._post("range", {"key": base64.b64encode(key.encode()).decode()})
        kvs = out.get("kvs", [])
        return json.loads(base64.b64decode(kvs[0].get("value", ""))) if kvs else None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def etcd():
    if not os.path.exists(ETCD_BIN):
        pytest.fail(f"{ETCD_BIN} is missing: run scripts/setup.sh as root (it installs "
                    "Debian's etcd-server); these tests need a real etcd")
    for _ in range(3):  # a free port may be taken before etcd binds it
        e = Etcd()
        if e.healthy():
            break
        log = (e.dir / "etcd.log").read_text(errors="replace")
        e.stop()
    else:
        pytest.fail(f"etcd did not become healthy; its log:\n{log}")
    yield e
    e.stop()


def _pattern_4(etcd, target_name="127.0.0.1:12346"):
    """The seed's Pattern 4 with `"127.0.0.1:<etcd port>"` as the metadata server and the
    target process (engine_target.py --buffer numpy, the other "node") as
    "target_host:port". Returns (target, remote_addr, result, data, engine_was_published)."""
    np = pytest.importorskip("numpy")
    from test_engine_transfer import Target

    target = Target("--metadata", etcd.addr, "--hostname", target_name,
                    "--buffer", "numpy", "--size", str(1024 * 1024))
    try:
        # ---- Pattern 4, as written (etcd address and target name aside) ----
        from mooncake.engine import TransferEngine

        # Setup engines on both nodes
        engine = TransferEngine()
        engine.initialize("127.0.0.1:12345", etcd.addr, "tcp", "")

        # Allocate and register buffer
        buffer = np.ones(1024*1024, dtype=np.uint8)
        buffer_ptr = buffer.ctypes.data
        engine.register_memory(buffer_ptr, buffer.nbytes)

        # Get remote buffer address (from peer via metadata exchange)
        remote_addr = engine.get_first_buffer_address(target.segment)

        # Transfer data
        data = b"Hello from Transfer Engine!"
        engine.write_bytes_to_buffer(buffer_ptr, data, len(data))
        result = engine.transfer_sync_write(target.segment, buffer_ptr, remote_addr, len(data))

        # Cleanup
        engine.unregister_memory(buffer_ptr)
        # ---- end of Pattern 4 ----
        published = etcd.keys("mooncake/")
        del engine
        return target, remote_addr, result, data, published
    except BaseException:
        target.kill()
        raise


def test_seed_pattern_4_through_etcd(etcd):
    target, remote_addr, result, data, published = _pattern_4(etcd)
    try:
        assert remote_addr == target.buffer
        assert result == 0
        assert target.peek(remote_addr, len(data) + 1) == data + b"\x01"
        # Both engines published upstream's keys while running.
        for name in ("127.0.0.1:12345", "127.0.0.1:12346"):
            assert f"mooncake/ram/{name}" in published
            assert f"mooncake/rpc_meta/{name}" in published
        d = etcd.get("mooncake/ram/127.0.0.1:12346")
        assert d["name"] == "127.0.0.1:12346" and d["protocol"] == "tcp"
        assert d["buffers"][0]["addr"] == target.buffer
        # The initiator shut down with `del engine`: its keys are gone, the target's stay.
        keys = etcd.keys("mooncake/")
        assert "mooncake/ram/127.0.0.1:12345" not in keys
        assert "mooncake/rpc_meta/127.0.0.1:12345" not in keys
        assert "mooncake/ram/127.0.0.1:12346" in keys
    finally:
        target.kill()


def test_cluster_id_namespaces_keys(etcd, monkeypatch):
    # Both processes read MC_METADATA_CLUSTER_ID (the target inherits it).
    monkeypatch.setenv("MC_METADATA_CLUSTER_ID", "pycluster")
    target, remote_addr, result, data, published = _pattern_4(etcd, "127.0.0.1:12347")
    try:
        assert result == 0 and remote_addr == target.buffer
        assert target.peek(remote_addr, len(data)) == data
        assert "mooncake/pycluster/ram/127.0.0.1:12347" in published
        assert "mooncake/pycluster/rpc_meta/127.0.0.1:12345" in published
        assert not any(k.startswith("mooncake/ram/127.0.0.1:12347") for k in published)
    finally:
        target.kill()
    # Without the cluster id, the other cluster's segment is unknown.
    monkeypatch.delenv("MC_METADATA_CLUSTER_ID")
    from mooncake.engine import TransferEngine

    e = TransferEngine()
    assert e.initialize("127.0.0.1:12348", f"etcd://{etcd.addr}", "tcp", "") == 0
    assert e.get_first_buffer_address("127.0.0.1:12347") == 0
