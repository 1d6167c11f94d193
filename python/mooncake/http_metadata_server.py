"""`mooncake.http_metadata_server`: the transfer engine's HTTP metadata store.

Two faces, as upstream's module has:

* `main()` (the `mooncake_http_metadata_server` console script, also
  `python -m mooncake.http_metadata_server`) takes upstream's arguments, `--port` (default
  8080), `--host` (default 0.0.0.0) and `--log-level` (DEBUG, INFO, WARNING, ERROR, CRITICAL;
  when not given, `RUST_LOG` / `MC_LOG_LEVEL` set it, else INFO, as for every program here),
  parsed by the same argparse parser (`parse_args()`), and runs this package's
  native metadata server (`controlplane::http`, the one `mooncake_master
  --enable_http_metadata_server` embeds) until SIGINT or SIGTERM; it returns 0 then, or 1
  when the port cannot be bound. It answers as upstream's master-embedded C++ server does
  (`GET /health`, and "Missing key parameter" for a request without a key), and requires the
  cluster's bearer when `MC_AUTH_TOKEN` / `MC_AUTH_TOKEN_FILE` is set (`docs/security.md`).
* `KVBootstrapServer(port, host="0.0.0.0")` is the embeddable server (aiohttp, in a daemon
  thread): `run()` starts it and returns the thread, `close()` stops it, `poll()` answers a
  `KVPoll` (`Success` while it serves, `Failed` before `run()` or after it stopped). Routes
  and answers are upstream's: `GET|PUT|DELETE /metadata?key=K` (key stripped; empty is 400
  "metadata key is required"; unknown 404 "metadata not found"; a second PUT of a key that
  contains `rpc_meta` is 400 "Duplicate rpc_meta key not allowed"; other methods 405).
  Ours in addition: with a cluster secret set, every request needs its bearer (401 without),
  as the native server; `port=0` binds any free port, and `port` then tells which.
"""

import argparse
import asyncio
import logging
import sys
import threading
from enum import Enum
from typing import Optional

from aiohttp import web

__all__ = ["KVPoll", "KVBootstrapServer", "parse_args", "main"]

log = logging.getLogger(__name__)


class KVPoll(Enum):
    """Status of the KV server."""

    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4


class KVBootstrapServer:
    """HTTP server for storing and retrieving metadata; see the module docs."""

    def __init__(self, port: int, host: str = "0.0.0.0"):
        if isinstance(port, bool) or not isinstance(port, int):
            raise TypeError(f"port must be an int, not {type(port).__name__}")
        if not 0 <= port <= 65535:
            raise ValueError(f"port must be in 0..65535, not {port}")
        if not isinstance(host, str):
            raise TypeError(f"host must be a str, not {type(host).__name__}")
        from mooncake.mooncake_store_service import _bearer_digest, _process_secret

        secret = _process_secret()  # a misconfigured secret is an error now, not per request
        self._expected = _bearer_digest(secret) if secret is not None else None
        self.port = port
        self.host = host
        self.app = web.Application(middlewares=[self._guard])
        self.store = dict()
        self.lock = asyncio.Lock()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._runner: Optional[web.AppRunner] = None
        self._started = threading.Event()
        self._failed = False
        self.thread: Optional[threading.Thread] = None
        self._setup_routes()

    def run(self):
        """Start the server in a background thread; returns the thread once it listens (or
        has failed to: `poll()` then says `Failed`)."""
        self.thread = threading.Thread(target=self._run_server, daemon=True)
        self.thread.start()
        self._started.wait()
        log.info("HTTP Metadata Server started on %s:%s", self.host, self.port)
        return self.thread

    def _setup_routes(self):
        self.app.router.add_route("*", "/metadata", self._handle_metadata)

    @web.middleware
    async def _guard(self, request, handler):
        if self._expected is not None:
            from mooncake.mooncake_store_service import _bearer_matches

            if not _bearer_matches(request.headers.get("Authorization"), self._expected):
                return web.Response(text="Unauthorized", status=401,
                                    headers={"WWW-Authenticate": "Bearer"})
        return await handler(request)

    async def _handle_metadata(self, request: web.Request):
        key = request.query.get("key", "").strip()
        if not key:
            return web.Response(text="metadata key is required", status=400,
                                content_type="application/json")
        if request.method == "GET":
            return await self._handle_get(key)
        if request.method == "PUT":
            return await self._handle_put(key, request)
        if request.method == "DELETE":
            return await self._handle_delete(key)
        return web.Response(text="Method not allowed", status=405,
                            content_type="application/json")

    async def _handle_get(self, key):
        async with self.lock:
            value = self.store.get(key)
        if value is None:
            return web.Response(text="metadata not found", status=404,
                                content_type="application/json")
        return web.Response(body=value, status=200, content_type="application/json")

    async def _handle_put(self, key, request):
        data = await request.read()
        async with self.lock:
            if key.find("rpc_meta") != -1 and key in self.store:
                return web.Response(text="Duplicate rpc_meta key not allowed", status=400,
                                    content_type="application/json")
            self.store[key] = data
        return web.Response(text="metadata updated", status=200,
                            content_type="application/json")

    async def _handle_delete(self, key):
        async with self.lock:
            if key not in self.store:
                return web.Response(text="metadata not found", status=404,
                                    content_type="application/json")
            del self.store[key]
        return web.Response(text="metadata deleted", status=200,
                            content_type="application/json")

    def _run_server(self):
        try:
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
            self.lock = asyncio.Lock()
            self._runner = web.AppRunner(self.app)
            self._loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, host=self.host, port=self.port)
            self._loop.run_until_complete(site.start())
            if self.port == 0:
                self.port = self._runner.addresses[0][1]
            self._started.set()
            self._loop.run_forever()
        except Exception as e:  # noqa: BLE001  (reported, and poll() says Failed)
            self._failed = True
            log.error("Server error: %s", e)
        finally:
            self._started.set()
            if self._runner is not None and self._loop is not None:
                self._loop.run_until_complete(self._runner.cleanup())
            if self._loop is not None:
                self._loop.close()

    def close(self):
        """Shutdown the server."""
        if self._loop is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self.thread is not None and self.thread.is_alive():
            self.thread.join(timeout=2)

    def poll(self) -> KVPoll:
        """Poll the server status."""
        if self.thread is None or not self.thread.is_alive() or self._failed:
            return KVPoll.Failed
        return KVPoll.Success


def parse_args(argv=None):
    """Parse command line arguments (upstream's parser)."""
    return _parser().parse_args(argv)


def _parser():
    parser = argparse.ArgumentParser(
        description="HTTP Metadata Server for Mooncake",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--port", type=int, default=8080, help="Port to listen on")
    parser.add_argument("--host", type=str, default="0.0.0.0", help="Host to bind to")
    parser.add_argument("--log-level", type=str,
                        choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
                        default="INFO", help="Logging level")
    return parser


def main():
    """Main entry point for the mooncake_http_metadata_server command: upstream's arguments,
    this package's native server."""
    # log_level stays None unless given (argparse fills in only missing attributes), so that
    # without --log-level the native server's level follows RUST_LOG / MC_LOG_LEVEL.
    args = _parser().parse_args(namespace=argparse.Namespace(log_level=None))
    logging.basicConfig(level=getattr(logging, args.log_level or "INFO"),
                        format="%(asctime)s - %(name)s - %(levelname)s - %(message)s")
    from mooncake import _native

    native_args = ["--port", str(args.port), "--host", args.host]
    if args.log_level is not None:
        native_args += ["--log-level", args.log_level]
    # The native server stops on SIGINT / SIGTERM itself (the GIL released meanwhile).
    try:
        return _native.run_http_metadata_server(native_args)
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
