"""`mooncake.mooncake_store_service` and `mc_store_rest_server`: the REST answers upstream's
service gives (same paths, status codes and JSON bodies, recorded from its 0.3.13 wheel's
`mc_store_rest_server`), against a real master. The service is started as upstream's is: its
async methods awaited on an event loop (here one on a thread of its own)."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from conftest import MIB, free_port, wait_for_port

from mooncake.mooncake_store_service import MooncakeStoreService


def call(port, method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            status, raw, kind = r.status, r.read(), r.headers["Content-Type"]
    except urllib.error.HTTPError as e:
        status, raw, kind = e.code, e.read(), e.headers["Content-Type"]
    return status, (json.loads(raw) if kind.startswith("application/json") else raw)


class LoopThread:
    """An asyncio event loop running on its own thread, as `asyncio.run(main())` runs the
    service; `run` awaits a coroutine there."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout=60):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


@pytest.fixture
def service(master, tmp_path):
    cfg = tmp_path / "mc.json"
    cfg.write_text(json.dumps({
        "local_hostname": "localhost", "metadata_server": master.metadata,
        "master_server_address": master.addr, "global_segment_size": 64 * MIB,
        "local_buffer_size": 32 * MIB,
    }))
    loop = LoopThread()
    s = MooncakeStoreService(str(cfg))
    try:
        assert loop.run(s.start_store_service(max_wait_time=20))
        port = free_port()
        assert loop.run(s.start_http_service(port)) is True
        assert s.port == port
        yield port
    finally:
        loop.run(s.stop())
        loop.close()


def test_data_endpoints(service):
    p = service
    assert call(p, "PUT", "/api/put", {"key": "rest_k", "value": "hello"}) == \
        (200, {"status": "success"})
    assert call(p, "GET", "/api/get/rest_k") == (200, b"hello")
    assert call(p, "GET", "/api/exist/rest_k") == (200, {"exists": True})
    assert call(p, "GET", "/api/exist/rest_nope") == (200, {"exists": False})
    assert call(p, "GET", "/api/get/rest_nope") == (404, {"error": "Key not found"})
    assert call(p, "PUT", "/api/put", {"key": "rest_k2"}) == \
        (400, {"error": "Missing key or value"})
    assert call(p, "DELETE", "/api/remove/rest_nope") == \
        (500, {"error": "Remove operation failed"})
    status, body = call(p, "DELETE", "/api/remove_all")
    assert status == 200 and body["status"].startswith("success removed ")
    assert call(p, "GET", "/api/nothing") == (404, b"404: Not Found")


def test_segment_endpoints(service):
    p = service
    assert call(p, "POST", "/api/mount_shm", {"name": "../x", "size": 1}) == \
        (400, {"error": "Missing or invalid name or size"})
    name = f"mc-svc-test-{os.getpid()}"
    assert call(p, "POST", "/api/mount_shm", {"name": name, "size": 1 << 20}) == \
        (500, {"error": "Mount failed, ret=-1"})  # no such /dev/shm file
    with open(f"/dev/shm/{name}", "wb") as f:
        f.truncate(2 << 20)
    try:
        status, body = call(p, "POST", "/api/mount_shm", {"name": name, "size": 1 << 20})
        assert status == 200 and body["status"] == "success" and len(body["segment_ids"]) == 1
        assert call(p, "POST", "/api/unmount_shm", {"segment_ids": body["segment_ids"]}) == \
            (200, {"status": "success"})
    finally:
        os.unlink(f"/dev/shm/{name}")
    assert call(p, "POST", "/api/mount", {"size": "1"}) == \
        (400, {"error": "Invalid size, must be a positive integer"})
    status, body = call(p, "POST", "/api/mount", {"size": 1 << 24})
    assert status == 200 and body["status"] == "success" and len(body["segment_ids"]) == 1
    assert body["allocated_size"] >= 1 << 24
    assert call(p, "POST", "/api/unmount", {"segment_ids": body["segment_ids"]}) == \
        (200, {"status": "success"})
    assert call(p, "POST", "/api/unmount", {"segment_ids": body["segment_ids"]}) == \
        (500, {"error": "Unmount and free failed, ret=-1"})
    assert call(p, "POST", "/api/unmount", {}) == (400, {"error": "Missing segment_ids"})
    assert call(p, "POST", "/api/unmount_shm", {"segment_ids": "a-b"}) == \
        (500, {"error": "Unmount failed for one or more segments", "failed_segment_ids": ["a-b"]})
    assert call(p, "POST", "/api/unmount_local_disk", {}) == (200, {"status": "success"})
    assert call(p, "POST", "/api/unmount_local_disk", {"grace_period_seconds": 4000})[0] == 400
    assert call(p, "POST", "/api/reconfigure", {"mode": "prefill"}) == \
        (200, {"status": "success", "mode": "prefill"})
    # Decode mounts a /dev/shm file, a second decode replaces it (mount first, then unmount the
    # previous one), prefill unmounts; a failed mount with nothing mounted rolls back.
    assert call(p, "POST", "/api/reconfigure", {"mode": "decode", "name": name, "size": 1 << 20}) \
        == (500, {"error": "Mount failed, ret=-1; rolled back to prefill", "mode": "prefill"})
    with open(f"/dev/shm/{name}", "wb") as f:
        f.truncate(2 << 20)
    try:
        status, first = call(p, "POST", "/api/reconfigure",
                             {"mode": "decode", "path": f"/dev/shm/{name}", "size": 1 << 20})
        assert status == 200 and first["status"] == "success" and first["mode"] == "decode"
        assert len(first["segment_ids"]) == 1
        status, second = call(p, "POST", "/api/reconfigure",
                              {"mode": "decode", "name": name, "size": 1 << 20})
        assert status == 200 and second["mode"] == "decode"
        assert len(second["segment_ids"]) == 1 and second["segment_ids"] != first["segment_ids"]
        # The first one is gone: unmounting it again fails.
        assert call(p, "POST", "/api/unmount_shm", {"segment_ids": first["segment_ids"]})[0] \
            == 500
        assert call(p, "POST", "/api/reconfigure", {"mode": "prefill"}) == \
            (200, {"status": "success", "mode": "prefill"})
        assert call(p, "POST", "/api/unmount_shm", {"segment_ids": second["segment_ids"]})[0] \
            == 500
    finally:
        os.unlink(f"/dev/shm/{name}")
    assert call(p, "POST", "/api/reconfigure", {"mode": "decode"}) == \
        (400, {"error": "Missing path or size for decode mode"})
    assert call(p, "POST", "/api/reconfigure", {"mode": "other"}) == \
        (400, {"error": "Invalid mode. Use 'decode' or 'prefill'"})
    assert call(p, "POST", "/api/unmount_local_disk", {"grace_period_seconds": 4000}) == \
        (400, {"error": "Invalid grace_period_seconds, must be a non-negative integer no "
                        "greater than 3600"})


def test_console_script_serves_and_stops_on_sigterm(master):
    exe = Path(sys.executable).parent / "mc_store_rest_server"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "mooncake.mooncake_store_service"]
    port = free_port()
    env = dict(os.environ, MOONCAKE_MASTER=master.addr, MOONCAKE_TE_META_DATA_SERVER=master.metadata,
               MOONCAKE_GLOBAL_SEGMENT_SIZE="64mb", MOONCAKE_LOCAL_BUFFER_SIZE="32mb")
    env.pop("MOONCAKE_CONFIG_PATH", None)
    proc = subprocess.Popen(cmd + ["--port", str(port), "-Dlocal_hostname=localhost"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for_port(port, 30), proc.stderr.read() if proc.poll() is not None else ""
        assert call(port, "PUT", "/api/put", {"key": "cli_k", "value": "v"})[0] == 200
        assert call(port, "GET", "/api/get/cli_k") == (200, b"v")
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err[-2000:]
