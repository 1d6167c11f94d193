"""`mooncake.mooncake_store_service`: a store client behind a small REST API
(`mc_store_rest_server`).

The service sets up one `MooncakeDistributedStore` from a `MooncakeConfig` (`--config FILE`,
else the `MOONCAKE_*` environment, then `-Dfield=value` overrides), retrying for up to
`--max-wait-time` seconds while the master is not reachable, then serves on `--port`
(default 8080):

| method | path                     | body (JSON)                               | 200 answer                  |
|--------|--------------------------|-------------------------------------------|-----------------------------|
| PUT    | /api/put                 | {"key", "value": str}                     | {"status": "success"}       |
| GET    | /api/get/{key}           |                                           | the bytes (octet-stream)    |
| GET    | /api/exist/{key}         |                                           | {"exists": bool}            |
| DELETE | /api/remove/{key}        |                                           | {"status": "success"}       |
| DELETE | /api/remove_all          |                                           | {"status": "success removed N keys"} |
| POST   | /api/mount_shm           | {"name", "size", "offset"?, "protocol"?, "location"?} | {"status", "segment_ids"} |
| POST   | /api/unmount_shm         | {"segment_ids", "grace_period_seconds"?}  | {"status": "success"}       |
| POST   | /api/mount               | {"size", "protocol"?, "location"?}        | {"status", "segment_ids", "allocated_size"} |
| POST   | /api/unmount             | {"segment_ids", "grace_period_seconds"?}  | {"status": "success"}       |
| POST   | /api/unmount_local_disk  | {"grace_period_seconds"?: 0..3600}        | {"status": "success"}       |
| POST   | /api/reconfigure         | {"mode": "decode", "path", "size", ...} or {"mode": "prefill"} | {"status", "mode", ...} |

Errors are {"error": message} with 400 (bad request), 404 (missing key) or 500 (the store
call failed), and an unknown path is a plain-text 404, as upstream's service answers. The segment endpoints call the store's segment
methods: `/api/mount` and `/api/unmount` allocate, mount and unmount extra segments;
`/api/mount_shm` maps `/dev/shm/<name>` (which must exist and hold the range) and mounts it
with `mount_segment`, answering 500 with the store's return code when that fails. Upstream
serves with aiohttp; this one uses the standard library's threaded HTTP
server, so the package needs no extra dependency.
"""

import argparse
import json
import logging
import re
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from mooncake.mooncake_config import MooncakeConfig
from mooncake.store import MooncakeDistributedStore

log = logging.getLogger("mooncake.store_service")

_MAX_BODY_BYTES = 100 << 20
_MAX_LOCAL_DISK_GRACE_SECONDS = 3600


class _Reply(Exception):
    """An answer decided part-way through a handler."""

    def __init__(self, status, body):
        super().__init__(status)
        self.status, self.body = status, body


def _shm_path(name):
    """`/dev/shm/<name>` for a plain shm name (a leading "/" allowed), else None."""
    if not isinstance(name, str):
        return None
    n = name[1:] if name.startswith("/") else name
    if not n or "/" in n or n in (".", ".."):
        return None
    return f"/dev/shm/{n}"


def _segment_ids(data):
    ids = data.get("segment_ids", [])
    ids = [ids] if isinstance(ids, str) else list(ids or [])
    if not ids:
        raise _Reply(400, {"error": "Missing segment_ids"})
    return ids


class MooncakeStoreService:
    """One store client and the REST handlers over it."""

    def __init__(self, config_path=None, cli_config=None):
        self.store = None
        self.config = (MooncakeConfig.from_file(config_path) if config_path
                       else MooncakeConfig.load_from_env())
        for key, value in (cli_config or {}).items():
            if hasattr(self.config, key):
                setattr(self.config, key, value)
        self.current_mode = "prefill"
        self.mounted_segment_ids = []
        self._lock = threading.Lock()
        self._server = None

    # ---- lifecycle -------------------------------------------------------------------------

    def start_store_service(self, max_wait_time=60.0, shutdown_event=None):
        """Sets the store up, retrying once a second; False when time ran out or shut down."""
        start, attempt = time.monotonic(), 0
        while True:
            if shutdown_event is not None and shutdown_event.is_set():
                return False
            if time.monotonic() - start >= max_wait_time:
                log.error("store startup failed: no success in %ss (%d attempts)",
                          max_wait_time, attempt)
                return False
            attempt += 1
            c = self.config
            store = MooncakeDistributedStore()
            ret = store.setup({
                "local_hostname": c.local_hostname,
                "metadata_server": c.metadata_server,
                "global_segment_size": c.global_segment_size,
                "local_buffer_size": c.local_buffer_size,
                "protocol": c.protocol,
                "rdma_devices": c.device_name or "",
                "master_server_addr": c.master_server_address,
                "enable_ssd_offload": c.enable_ssd_offload,
                "ssd_offload_path": c.ssd_offload_path,
                "tenant_id": c.tenant_id,
                "enable_client_http_server": c.enable_client_http_server,
                "client_http_port": c.client_http_port,
            })
            if ret == 0:
                self.store = store
                log.info("store service started on %s", c.local_hostname)
                return True
            remaining = max_wait_time - (time.monotonic() - start)
            log.warning("store setup failed (attempt %d, code %d); %.1fs left",
                        attempt, ret, max(remaining, 0))
            pause = min(1.0, max(remaining, 0))
            if shutdown_event is not None:
                if shutdown_event.wait(pause):
                    return False
            else:
                time.sleep(pause)

    def start_http_service(self, port=8080, host="0.0.0.0"):
        """Starts serving in a background thread; returns the bound port."""
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                service._dispatch(self, "GET")

            def do_PUT(self):
                service._dispatch(self, "PUT")

            def do_POST(self):
                service._dispatch(self, "POST")

            def do_DELETE(self):
                service._dispatch(self, "DELETE")

            def log_message(self, fmt, *args):
                log.debug(fmt, *args)

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        log.info("REST API on port %d", self._server.server_address[1])
        return self._server.server_address[1]

    def stop(self):
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self.store is not None:
            ret = self.store.close()
            self.store = None
            if ret != 0:
                log.warning("store close returned %s", ret)

    # ---- routing ---------------------------------------------------------------------------

    _ROUTES = [
        ("PUT", re.compile(r"^/api/put$"), "put"),
        ("GET", re.compile(r"^/api/get/(?P<key>.+)$"), "get"),
        ("GET", re.compile(r"^/api/exist/(?P<key>.+)$"), "exist"),
        ("DELETE", re.compile(r"^/api/remove_all$"), "remove_all"),
        ("DELETE", re.compile(r"^/api/remove/(?P<key>.+)$"), "remove"),
        ("POST", re.compile(r"^/api/mount_shm$"), "mount_shm"),
        ("POST", re.compile(r"^/api/unmount_shm$"), "unmount_shm"),
        ("POST", re.compile(r"^/api/mount$"), "mount"),
        ("POST", re.compile(r"^/api/unmount$"), "unmount"),
        ("POST", re.compile(r"^/api/unmount_local_disk$"), "unmount_local_disk"),
        ("POST", re.compile(r"^/api/reconfigure$"), "reconfigure"),
    ]

    def _dispatch(self, req, method):
        from urllib.parse import unquote

        path = req.path.split("?", 1)[0]
        for m, pattern, name in self._ROUTES:
            found = pattern.match(path)
            if m == method and found:
                break
        else:
            return self._send(req, 404, b"404: Not Found", "text/plain; charset=utf-8")
        started = time.perf_counter()
        try:
            args = {k: unquote(v) for k, v in found.groupdict().items()}
            if method in ("PUT", "POST"):
                args["data"] = self._json(req)
            status, body = getattr(self, "handle_" + name)(**args)
        except _Reply as r:
            status, body = r.status, r.body
        except Exception as e:  # a handler bug answers 500, as upstream's handlers do
            log.error("%s error: %s", name.upper(), e)
            status, body = 500, {"error": str(e)}
        finally:
            log.info("%s operation completed in %.2f ms", name.upper(),
                     (time.perf_counter() - started) * 1000)
        self._send(req, status, body)

    @staticmethod
    def _json(req):
        n = int(req.headers.get("Content-Length") or 0)
        if n > _MAX_BODY_BYTES:
            raise _Reply(413, {"error": "Request body too large"})
        try:
            data = json.loads(req.rfile.read(n) or b"null")
        except ValueError:
            raise _Reply(400, {"error": "Malformed JSON body"})
        if not isinstance(data, dict):
            raise _Reply(400, {"error": "Request body must be a JSON object"})
        return data

    @staticmethod
    def _send(req, status, body, kind=None):
        if isinstance(body, (bytes, bytearray)):
            raw, kind = bytes(body), kind or "application/octet-stream"
        else:
            raw, kind = json.dumps(body).encode(), "application/json; charset=utf-8"
        req.send_response(status)
        req.send_header("Content-Type", kind)
        req.send_header("Content-Length", str(len(raw)))
        req.end_headers()
        req.wfile.write(raw)

    # ---- handlers: (status, body) ----------------------------------------------------------

    def handle_put(self, data):
        key, value = data.get("key"), data.get("value")
        if not key or value is None:
            return 400, {"error": "Missing key or value"}
        if self.store.put(key, str(value).encode()) != 0:
            return 500, {"error": "PUT operation failed"}
        return 200, {"status": "success"}

    def _exists_or_reply(self, key):
        exists = self.store.is_exist(key)
        if exists == 0:
            raise _Reply(404, {"error": "Key not found"})
        if exists < 0:
            raise _Reply(500, {"error": "Exist check failed"})

    def handle_get(self, key):
        self._exists_or_reply(key)
        value = self.store.get(key)
        if value == b"":
            # Removed in between, or an empty read: say which.
            self._exists_or_reply(key)
        return 200, value

    def handle_exist(self, key):
        exists = self.store.is_exist(key)
        if exists < 0:
            return 500, {"error": "Exist check failed"}
        return 200, {"exists": exists > 0}

    def handle_remove(self, key):
        if self.store.remove(key) != 0:
            return 500, {"error": "Remove operation failed"}
        return 200, {"status": "success"}

    def handle_remove_all(self):
        n = self.store.remove_all()
        if n < 0:
            return 500, {"error": "RemoveAll operation failed"}
        return 200, {"status": f"success removed {n} keys"}

    def _mount(self, path, size, offset, protocol, location):
        result = self.store.mount_segment(path, size, offset, protocol, location)
        if result["ret"] != 0:
            raise _Reply(500, {"error": f"Mount failed, ret={result['ret']}"})
        return list(result["segment_ids"])

    def handle_mount_shm(self, data):
        path, size = _shm_path(data.get("name")), data.get("size")
        if not path or size is None:
            return 400, {"error": "Missing or invalid name or size"}
        ids = self._mount(path, size, data.get("offset", 0),
                          data.get("protocol", self.config.protocol), data.get("location", ""))
        return 200, {"status": "success", "segment_ids": ids}

    def handle_unmount_shm(self, data):
        ids, grace = _segment_ids(data), data.get("grace_period_seconds", 0)
        with self._lock:
            failed = [sid for sid in ids if self.store.unmount_segment([sid], grace) != 0]
            self.mounted_segment_ids = [s for s in self.mounted_segment_ids
                                        if s not in ids or s in failed]
            if not self.mounted_segment_ids:
                self.current_mode = "prefill"
        if failed:
            return 500, {"error": "Unmount failed for one or more segments",
                         "failed_segment_ids": failed}
        return 200, {"status": "success"}

    def handle_mount(self, data):
        size = data.get("size")
        if type(size) is not int or size <= 0:
            return 400, {"error": "Invalid size, must be a positive integer"}
        result = self.store.allocate_and_mount_segment(
            size, data.get("protocol", self.config.protocol), data.get("location", ""))
        if result["ret"] != 0:
            return 500, {"error": f"Allocate and mount failed, ret={result['ret']}"}
        return 200, {"status": "success", "segment_ids": list(result["segment_ids"]),
                     "allocated_size": result["allocated_size"]}

    def handle_unmount(self, data):
        ids = _segment_ids(data)
        ret = self.store.unmount_and_free_segment(ids, data.get("grace_period_seconds", 0))
        if ret != 0:
            return 500, {"error": f"Unmount and free failed, ret={ret}"}
        return 200, {"status": "success"}

    def handle_unmount_local_disk(self, data):
        grace = data.get("grace_period_seconds", 0)
        if type(grace) is not int or not 0 <= grace <= _MAX_LOCAL_DISK_GRACE_SECONDS:
            return 400, {"error": "Invalid grace_period_seconds, must be a non-negative "
                                  f"integer no greater than {_MAX_LOCAL_DISK_GRACE_SECONDS}"}
        ret = self.store.unmount_local_disk_segment(grace)
        if ret != 0:
            return 500, {"error": f"Unmount local disk failed, ret={ret}"}
        return 200, {"status": "success"}

    def handle_reconfigure(self, data):
        mode = str(data.get("mode", "")).lower()
        with self._lock:
            if mode == "decode":
                path, size = data.get("path"), data.get("size")
                if not path or size is None:
                    return 400, {"error": "Missing path or size for decode mode"}
                ids = self._mount(path, size, data.get("offset", 0),
                                  data.get("protocol", self.config.protocol),
                                  data.get("location", ""))
                self.mounted_segment_ids, self.current_mode = ids, "decode"
                return 200, {"status": "success", "mode": "decode", "segment_ids": ids}
            if mode == "prefill":
                failed = [s for s in self.mounted_segment_ids
                          if self.store.unmount_segment([s], 0) != 0]
                if failed:
                    self.mounted_segment_ids = failed
                    return 500, {"error": "Unmount failed for one or more segments",
                                 "failed_segment_ids": failed}
                self.mounted_segment_ids, self.current_mode = [], "prefill"
                return 200, {"status": "success", "mode": "prefill"}
        return 400, {"error": "Invalid mode. Use 'decode' or 'prefill'"}


def parse_arguments(argv=None):
    p = argparse.ArgumentParser(description="Mooncake Store Service with REST API")
    p.add_argument("--config", type=str, help="Path to Mooncake config file")
    p.add_argument("-D", "--define", action="append", default=[],
                   help="Override a config field, e.g. -Dlocal_hostname=example.com")
    p.add_argument("--port", type=int, default=8080, help="HTTP API port (default: 8080)")
    p.add_argument("--max-wait-time", type=float, default=60,
                   help="Maximum total wait for the store to start, seconds (default: 60)")
    return p.parse_args(argv)


def main(argv=None):
    """Runs until SIGINT or SIGTERM; 0 on a clean stop, 1 when the store never started."""
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s - %(name)s - %(levelname)s - %(message)s")
    args = parse_arguments(argv)
    overrides = {}
    for item in args.define:
        if "=" in item:
            k, v = item.split("=", 1)
            overrides[k] = v
        else:
            log.warning("ignoring invalid -D option: %s", item)
    service = MooncakeStoreService(args.config, overrides)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        if not service.start_store_service(args.max_wait_time, stop):
            return 0 if stop.is_set() else 1
        service.start_http_service(args.port)
        log.info("Mooncake Store Service is running")
        stop.wait()
        return 0
    finally:
        service.stop()


def sync_main():
    """Entry point of the `mc_store_rest_server` console script."""
    raise SystemExit(main())


if __name__ == "__main__":
    sync_main()
