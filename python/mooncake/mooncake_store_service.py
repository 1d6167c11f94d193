"""`mooncake.mooncake_store_service`: a store client behind a small REST API
(`mc_store_rest_server`), served with aiohttp as upstream's is.

The service sets up one `MooncakeDistributedStore` from a `MooncakeConfig` (`--config FILE`,
else the `MOONCAKE_*` environment, then `-Dfield=value` overrides), retrying for up to
`--max-wait-time` seconds while the master is not reachable, then serves on `--host`
(default 127.0.0.1) and `--port` (default 8080):

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
| POST   | /api/reconfigure         | {"mode": "decode", "name" or "path", "size", "offset"?, ...} or {"mode": "prefill"} | {"status", "mode", "segment_ids"?} |

Errors are {"error": message} with 400 (bad request), 401 (no or wrong bearer), 404
(missing key), 408 (body not sent within a minute), 413 (body over 100 MiB) or 500 (the
store call failed), and an unknown path
is aiohttp's plain-text 404, as upstream's service answers. `/api/mount` and `/api/unmount`
allocate, mount and unmount extra segments; `/api/mount_shm` and decode-mode
`/api/reconfigure` map a `/dev/shm` file and mount it with `mount_segment` (500 with the
store's return code when that fails). Decode mode mounts the new segment before it unmounts
the previous ones and keeps them when the new mount fails; prefill mode unmounts them.

**Shape.** As upstream's: `MooncakeStoreService(config_path, cli_config)`, then
`await start_store_service(max_wait_time, shutdown_event)`, `await start_http_service(port,
host=...)` (an `aiohttp.web.AppRunner` on the running loop; True once listening, the bound
port in `.port`) and `await stop()`; every route is an async method `handle_<route>(request)`
that answers an `aiohttp.web.Response` (so it can be called with any object whose `json()`
is awaitable). `main()` is async and `sync_main()` runs it. Store calls run on a bounded
thread pool, never on the event loop. Where we differ from upstream on purpose: a malformed
or non-object JSON body is 400 (upstream: 500 with the parser's message), and the rules
below.

**Security** (`docs/security.md`, "mc_store_rest_server"):

- Binds 127.0.0.1 unless `--host` (or `host=`) says otherwise; bound elsewhere with no
  cluster secret, it logs a WARNING at start that anyone who can reach the port can change
  state.
- With a cluster secret (`MC_AUTH_TOKEN` or `MC_AUTH_TOKEN_FILE`, read once per process by the
  rules of `protocol/src/auth.rs`: both set, empty, unreadable or over 4096 bytes is an error,
  exit status 2), every route needs `Authorization: Bearer <hex>`, hex = HMAC-SHA256(secret,
  "mooncake-rs auth v1 http") as the metadata server takes it; without it the answer is 401
  with `WWW-Authenticate: Bearer` and the handler never runs. A token file readable by group
  or others is warned about.
- `mount_shm` and decode mode take only a plain `/dev/shm` name (`name`; or, for decode mode
  when no `name` is given, a `path` that is exactly `/dev/shm/<name>`), and an existing entry
  must be a regular file, not a symlink; anything else is 400 and nothing is mapped. (The
  store's own open checks again on the descriptor it maps, refusing links, other owners and
  anything outside `/dev/shm` or `MC_MOUNT_FILE_DIRS`, so a link swapped in after this check
  is refused too.) `size` (also `/api/mount`'s)
  must be an int in 1..=the mount cap (1 TiB, or `MC_STORE_SERVICE_MAX_MOUNT_BYTES`), `offset`
  a non-negative int; else 400.
- Limits: the constants below. A connection whose first request head has not arrived within
  `_HEAD_TIMEOUT_SECONDS` is closed by our own clock (`_Listener`: aiohttp has no request-head
  timeout, and starts its keep-alive clock at connect only in recent versions); later heads
  are bounded by aiohttp's `keepalive_timeout`.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import hashlib
import hmac
import ipaddress
import json
import logging
import os
import re
import signal
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Awaitable, Callable, Dict, List, Optional, Tuple

from aiohttp import web

from mooncake.mooncake_config import MooncakeConfig
from mooncake.store import MooncakeDistributedStore

log = logging.getLogger("mooncake.store_service")

# ---- limits --------------------------------------------------------------------------------

_DEFAULT_HOST = "127.0.0.1"
# Largest request body (upstream's client_max_size): a put carries its value in the JSON.
_BODY_MAX_BYTES = 100 << 20
# Time to receive a whole body once the head is in.
_BODY_TIMEOUT_SECONDS = 60.0
# Time from connect to a complete first request head (our clock, `_Listener`).
_HEAD_TIMEOUT_SECONDS = 5.0
# Idle time between answers before aiohttp closes a connection; also bounds later heads.
_KEEPALIVE_SECONDS = 15.0
# Open connections at once; more are closed on accept (they would take the store's fds).
_CONNECTIONS_MAX = 256
# Requests being handled at once; more wait for a turn on their connection.
_REQUESTS_MAX = 64
# Threads that make store calls (all of them blocking).
_STORE_THREADS_MAX = 16
# Shortest time between two warnings about refused connections or requests.
_WARNING_EVERY_SECONDS = 10.0
# Time `stop()` gives requests in flight before closing their connections.
_SHUTDOWN_GRACE_SECONDS = 5.0
# Largest segment `mount`, `mount_shm` and `reconfigure` map, unless the environment says.
_MOUNT_MAX_BYTES = 1 << 40
_MOUNT_MAX_BYTES_ENV = "MC_STORE_SERVICE_MAX_MOUNT_BYTES"
_LOCAL_DISK_GRACE_MAX_SECONDS = 3600
# protocol/src/auth.rs: TOKEN_MAX_BYTES, ENV_TOKEN, ENV_TOKEN_FILE, HTTP_LABEL.
_TOKEN_MAX_BYTES = 4096
_ENV_TOKEN = "MC_AUTH_TOKEN"
_ENV_TOKEN_FILE = "MC_AUTH_TOKEN_FILE"
_HTTP_LABEL = b"mooncake-rs auth v1 http"

assert _STORE_THREADS_MAX <= _REQUESTS_MAX <= _CONNECTIONS_MAX
assert _HEAD_TIMEOUT_SECONDS <= _KEEPALIVE_SECONDS < _BODY_TIMEOUT_SECONDS

# Rust's `u8::is_ascii_whitespace` (`trim_ascii`): no vertical tab, unlike bytes.strip().
_ASCII_WHITESPACE = " \t\n\r\x0c"
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")
_SHM_DIR = "/dev/shm/"


# ---- the cluster secret --------------------------------------------------------------------


class SecretError(ValueError):
    """The cluster secret is configured wrongly (the message says how)."""


def _secret_from(raw: bytes, source: str) -> bytes:
    secret = raw.strip(_ASCII_WHITESPACE.encode())
    if not secret:
        raise SecretError(f"{source}: the token is empty")
    if len(secret) > _TOKEN_MAX_BYTES:
        raise SecretError(f"{source}: the token is {len(secret)} bytes, more than the "
                          f"{_TOKEN_MAX_BYTES} allowed")
    return secret


def _secret_from_env() -> Optional[bytes]:
    """The environment's secret by `Token::from_env`'s rules, or None when none is set."""
    direct = os.environb.get(_ENV_TOKEN.encode())
    path = os.environb.get(_ENV_TOKEN_FILE.encode())
    if direct is not None and path is not None:
        raise SecretError(f"both {_ENV_TOKEN} and {_ENV_TOKEN_FILE} are set; set one")
    if direct is not None:
        return _secret_from(direct, _ENV_TOKEN)
    if path is None:
        return None
    shown = os.fsdecode(path)
    try:
        with open(path, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            raw = f.read()
    except OSError as e:
        raise SecretError(f"cannot read token file {shown}: {e.strerror or e}") from None
    if mode & 0o077:
        log.warning("token file %s is open to group or others (mode %03o): chmod 600 it",
                    shown, stat.S_IMODE(mode))
    return _secret_from(raw, f"token file {shown}")


_secret_lock = threading.Lock()
_secret_result: Optional[Tuple[Optional[bytes], Optional[SecretError]]] = None


def _process_secret() -> Optional[bytes]:
    """This process's cluster secret, read once (as the Rust side reads it once per process);
    raises `SecretError` (every time) when it is configured wrongly."""
    global _secret_result
    with _secret_lock:
        if _secret_result is None:
            try:
                _secret_result = (_secret_from_env(), None)
            except SecretError as e:
                _secret_result = (None, e)
        secret, error = _secret_result
    if error is not None:
        raise error
    return secret


def _bearer_digest(secret: bytes) -> bytes:
    return hmac.new(secret, _HTTP_LABEL, hashlib.sha256).digest()


def http_bearer(secret: bytes) -> str:
    """The bearer credential for `secret` (what a client puts after `Bearer `): hex of
    HMAC-SHA256(secret, "mooncake-rs auth v1 http"), 64 lowercase digits
    (`Token::http_bearer`)."""
    return _bearer_digest(secret).hex()


def _bearer_matches(header: Optional[str], expected: bytes) -> bool:
    """Whether an Authorization value is `Bearer <hex of expected>` (`check_authorization`:
    either case, surrounding ASCII whitespace ignored, compared in constant time)."""
    if header is None or not header.startswith("Bearer "):
        return False
    digits = header[len("Bearer "):].strip(_ASCII_WHITESPACE)
    if not _HEX64.fullmatch(digits):
        return False
    return hmac.compare_digest(bytes.fromhex(digits), expected)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # "" (every address) or a name we do not resolve here


# ---- request checks ------------------------------------------------------------------------


class _Reply(Exception):
    """An answer decided part-way through a handler."""

    def __init__(self, status: int, body: Dict[str, Any]):
        super().__init__(status)
        self.status, self.body = status, body


def _json_response(status: int, body: Any) -> web.Response:
    return web.Response(status=status, text=json.dumps(body), content_type="application/json")


def _shm_path(name: Any) -> Optional[str]:
    """`/dev/shm/<name>` for a plain shm name (a leading "/" allowed), else None."""
    if not isinstance(name, str):
        return None
    n = name[1:] if name.startswith("/") else name
    if not n or "/" in n or "\0" in n or n in (".", ".."):
        return None
    return _SHM_DIR + n


# Upstream's name for it.
_shm_name_to_path = _shm_path


def _decode_path(path: Any) -> Optional[str]:
    """`path` when it is exactly `/dev/shm/<plain name>`, else None."""
    if not isinstance(path, str) or not path.startswith(_SHM_DIR):
        return None
    rest = path[len(_SHM_DIR):]
    return _shm_path(rest) if not rest.startswith("/") else None


def _refuse_links(path: str) -> None:
    """400 unless `path` is missing (the store then fails the mount) or a regular file: a
    symlink planted in /dev/shm must not lead the mapping to another file."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise _Reply(400, {"error": f"Cannot inspect {path}: {e.strerror or e}"}) from None
    if not stat.S_ISREG(st.st_mode):
        raise _Reply(400, {"error": f"Invalid name, {path} is not a regular file"})


def _mount_max_bytes() -> int:
    """The mount cap: `MC_STORE_SERVICE_MAX_MOUNT_BYTES` when set, else 1 TiB."""
    raw = os.environ.get(_MOUNT_MAX_BYTES_ENV)
    if raw is None:
        return _MOUNT_MAX_BYTES
    try:
        cap = int(raw.strip())
    except ValueError:
        cap = 0
    if cap <= 0:
        raise ValueError(f"{_MOUNT_MAX_BYTES_ENV}={raw!r}: want a positive number of bytes")
    return cap


def _checked_size(size: Any) -> int:
    if type(size) is not int or size <= 0:
        raise _Reply(400, {"error": "Invalid size, must be a positive integer"})
    cap = _mount_max_bytes()
    if size > cap:
        raise _Reply(400, {"error": f"Invalid size, must be no greater than {cap} bytes"})
    return size


def _checked_offset(offset: Any) -> int:
    if type(offset) is not int or offset < 0:
        raise _Reply(400, {"error": "Invalid offset, must be a non-negative integer"})
    return offset


def _segment_ids(data: Dict[str, Any]) -> List[Any]:
    ids = data.get("segment_ids", [])
    ids = [ids] if isinstance(ids, str) else list(ids or [])
    if not ids:
        raise _Reply(400, {"error": "Missing segment_ids"})
    return ids


async def _json_body(request: Any) -> Dict[str, Any]:
    """The request's JSON object, read within `_BODY_TIMEOUT_SECONDS`; 413 over the body cap
    (told by Content-Length before a byte is read), 400 when not a JSON object."""
    length = getattr(request, "content_length", None)
    if length is not None and length > _BODY_MAX_BYTES:
        raise _Reply(413, {"error": "Request body too large"})
    try:
        data = await asyncio.wait_for(request.json(), _BODY_TIMEOUT_SECONDS)
    except asyncio.TimeoutError:
        raise _Reply(408, {"error": "Request body not received in time"}) from None
    except web.HTTPRequestEntityTooLarge:
        raise _Reply(413, {"error": "Request body too large"}) from None
    except ValueError:  # json.JSONDecodeError, UnicodeDecodeError
        raise _Reply(400, {"error": "Malformed JSON body"}) from None
    if not isinstance(data, dict):
        raise _Reply(400, {"error": "Request body must be a JSON object"})
    return data


_pool_lock = threading.Lock()
_pool: Optional[ThreadPoolExecutor] = None


async def _call(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` (a blocking store call) on the bounded store pool."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(_STORE_THREADS_MAX, thread_name_prefix="mc-rest-store")
        pool = _pool
    return await asyncio.get_running_loop().run_in_executor(pool, functools.partial(fn, *args))


Handler = Callable[["MooncakeStoreService", Any], Awaitable[web.Response]]


def _route(name: str) -> Callable[[Handler], Handler]:
    """Turns a handler's `_Reply` into its answer and any other exception into 500 (as
    upstream's handlers do), and logs the time it took."""

    def wrap(handler: Handler) -> Handler:
        @functools.wraps(handler)
        async def run(self: "MooncakeStoreService", request: Any) -> web.Response:
            started = time.perf_counter()
            try:
                return await handler(self, request)
            except _Reply as r:
                return _json_response(r.status, r.body)
            except Exception as e:
                log.error("%s error: %s", name, e)
                return _json_response(500, {"error": str(e)})
            finally:
                log.info("%s operation completed in %.2f ms", name,
                         (time.perf_counter() - started) * 1000)

        return run

    return wrap


# ---- connections ---------------------------------------------------------------------------


class _Throttled:
    """A warning logged at most once per `_WARNING_EVERY_SECONDS`, saying how many like it
    were held back since: a stranger's flood must not flood the log too."""

    def __init__(self) -> None:
        self.next_at = 0.0
        self.held = 0

    def warning(self, message: str, *args: Any) -> None:
        now = time.monotonic()
        if now < self.next_at:
            self.held += 1
            return
        if self.held:
            message, args = message + " (and %d more since the last such warning)", \
                (*args, self.held)
        log.warning(message, *args)
        self.next_at, self.held = now + _WARNING_EVERY_SECONDS, 0


class _Listener:
    """Hands accepted connections to aiohttp's protocol (`web.Server`), at most
    `_CONNECTIONS_MAX` at once, and closes one whose first request head has not arrived
    within `_HEAD_TIMEOUT_SECONDS`. The guard middleware reports each head (`head_arrived`)."""

    def __init__(self, make_protocol: Callable[[], asyncio.Protocol]):
        self.make_protocol = make_protocol
        self.open: Dict[asyncio.BaseTransport, _Connection] = {}
        self.refusals = _Throttled()

    def protocol(self) -> "_Connection":
        return _Connection(self)

    def head_arrived(self, transport: Optional[asyncio.BaseTransport]) -> None:
        conn = self.open.get(transport) if transport is not None else None
        if conn is not None:
            conn.stop_clock()


class _Connection(asyncio.Protocol):
    """One accepted connection: forwards every event to aiohttp's protocol, and owns the
    head clock. Invariant: `inner` is set exactly when the connection was admitted."""

    def __init__(self, listener: _Listener):
        self.listener = listener
        self.inner: Optional[asyncio.Protocol] = None
        self.transport: Optional[asyncio.BaseTransport] = None
        self.clock: Optional[asyncio.TimerHandle] = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if len(self.listener.open) >= _CONNECTIONS_MAX:
            self.listener.refusals.warning("refused a connection from %s: %d are open",
                                           transport.get_extra_info("peername"),
                                           _CONNECTIONS_MAX)
            transport.abort()  # type: ignore[attr-defined]
            return
        self.transport = transport
        self.listener.open[transport] = self
        self.clock = asyncio.get_running_loop().call_later(_HEAD_TIMEOUT_SECONDS,
                                                           self._head_late)
        self.inner = self.listener.make_protocol()
        self.inner.connection_made(transport)

    def _head_late(self) -> None:
        self.clock = None
        if self.transport is not None:
            log.info("closing the connection from %s: no request head within %.0f s",
                     self.transport.get_extra_info("peername"), _HEAD_TIMEOUT_SECONDS)
            self.transport.close()

    def stop_clock(self) -> None:
        if self.clock is not None:
            self.clock.cancel()
            self.clock = None

    def data_received(self, data: bytes) -> None:
        if self.inner is not None:
            self.inner.data_received(data)

    def eof_received(self) -> Optional[bool]:
        return self.inner.eof_received() if self.inner is not None else None

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.stop_clock()
        if self.transport is not None:
            self.listener.open.pop(self.transport, None)
        if self.inner is not None:
            self.inner.connection_lost(exc)


# ---- the service ---------------------------------------------------------------------------


class MooncakeStoreService:
    """One store client and the REST handlers over it (upstream's class, same methods)."""

    def __init__(self, config_path: Optional[str] = None,
                 cli_config: Optional[Dict[str, Any]] = None):
        self.store: Any = None
        self.config = (MooncakeConfig.from_file(config_path) if config_path
                       else MooncakeConfig.load_from_env())
        for key, value in (cli_config or {}).items():
            if hasattr(self.config, key):
                setattr(self.config, key, value)
        # /api/reconfigure's state, as upstream keeps it.
        self.current_mode = "prefill"
        self.mounted_segment_ids: List[Any] = []
        self.last_mount_info: Dict[str, Any] = {}
        self._state_lock = asyncio.Lock()
        self.port: Optional[int] = None
        self._runner: Optional[web.AppRunner] = None
        self._listening: Optional[asyncio.AbstractServer] = None
        self._listener: Optional[_Listener] = None

    # ---- lifecycle -------------------------------------------------------------------------

    async def start_store_service(self, max_wait_time: float = 60,
                                  shutdown_event: Optional[asyncio.Event] = None) -> bool:
        """Sets the store up, retrying once a second; False when `max_wait_time` seconds ran
        out or `shutdown_event` was set first."""
        start, attempt = time.monotonic(), 0
        await asyncio.sleep(0)  # let a signal that came just before start-up be seen
        while True:
            if shutdown_event is not None and shutdown_event.is_set():
                log.info("store startup cancelled by shutdown request")
                return False
            if time.monotonic() - start >= max_wait_time:
                log.error("store startup failed: no success in %ss (%d attempts)",
                          max_wait_time, attempt)
                return False
            attempt += 1
            c = self.config
            try:
                store = MooncakeDistributedStore()
                ret = await _call(store.setup, {
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
                if ret != 0:
                    raise RuntimeError(f"store setup returned {ret}")
            except Exception as e:
                remaining = max_wait_time - (time.monotonic() - start)
                log.warning("store startup failed (attempt %d): %s; %.1fs left",
                            attempt, e, max(remaining, 0))
                pause = min(1.0, max(remaining, 0))
                if shutdown_event is None:
                    await asyncio.sleep(pause)
                else:
                    try:
                        await asyncio.wait_for(shutdown_event.wait(), pause)
                    except asyncio.TimeoutError:
                        pass  # the checks at the top decide what comes next
                continue
            self.store = store
            if shutdown_event is not None:
                await asyncio.sleep(0)
                if shutdown_event.is_set():
                    log.info("store startup cancelled by shutdown request")
                    await self.stop()
                    return False
            log.info("store service started on %s", c.local_hostname)
            return True

    async def start_http_service(self, port: int = 8080, host: str = _DEFAULT_HOST) -> bool:
        """Serves the REST API on `host:port` (port 0: any free one, see `.port`) from the
        running event loop; True once listening. Raises `SecretError` when the cluster secret
        is configured wrongly and `OSError` when the address cannot be bound."""
        secret = _process_secret()
        app = web.Application(client_max_size=_BODY_MAX_BYTES,
                              middlewares=[self._guard(secret)])
        app.add_routes([
            web.post("/api/reconfigure", self.handle_reconfigure),
            web.post("/api/mount_shm", self.handle_mount_shm),
            web.post("/api/unmount_shm", self.handle_unmount_shm),
            web.post("/api/mount", self.handle_mount),
            web.post("/api/unmount", self.handle_unmount),
            web.post("/api/unmount_local_disk", self.handle_unmount_local_disk),
            web.put("/api/put", self.handle_put),
            web.get("/api/get/{key}", self.handle_get),
            web.get("/api/exist/{key}", self.handle_exist),
            web.delete("/api/remove/{key}", self.handle_remove),
            web.delete("/api/remove_all", self.handle_remove_all),
        ])
        runner = web.AppRunner(app, access_log=None, keepalive_timeout=_KEEPALIVE_SECONDS,
                               shutdown_timeout=_SHUTDOWN_GRACE_SECONDS)
        await runner.setup()
        assert runner.server is not None  # set by setup()
        self._listener = _Listener(runner.server)
        try:
            listening = await asyncio.get_running_loop().create_server(
                self._listener.protocol, host, port, backlog=128, reuse_address=True)
        except BaseException:
            await runner.cleanup()
            raise
        self._runner, self._listening = runner, listening
        self.port = listening.sockets[0].getsockname()[1]
        if secret is None and not _is_loopback(host):
            log.warning("REST API on %s:%d with NO cluster secret: anyone who can reach this "
                        "port can read, write and remove objects and mount and unmount "
                        "segments. Set %s or %s, or bind to 127.0.0.1",
                        host or "*", self.port, _ENV_TOKEN_FILE, _ENV_TOKEN)
        log.info("REST API started on %s:%d (%s)", host or "*", self.port,
                 "bearer required" if secret is not None else "no cluster secret")
        return True

    def _guard(self, secret: Optional[bytes]) -> Any:
        """The middleware every request passes first: reports the head to `_Listener`,
        answers 401 without the bearer (when a secret is set), then waits for one of
        `_REQUESTS_MAX` turns."""
        expected = _bearer_digest(secret) if secret is not None else None
        turns = asyncio.Semaphore(_REQUESTS_MAX)
        refusals = _Throttled()

        @web.middleware
        async def guard(request: web.Request,
                        handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                        ) -> web.StreamResponse:
            listener = getattr(self, "_listener", None)
            if listener is not None:
                listener.head_arrived(request.transport)
            if expected is not None and not _bearer_matches(
                    request.headers.get("Authorization"), expected):
                refusals.warning("refused %s %s from %s: no or wrong bearer",
                                 request.method, request.path, request.remote)
                response = _json_response(401, {"error": "Unauthorized: this service needs "
                                                         "Authorization: Bearer <derived "
                                                         "from the cluster secret>"})
                response.headers["WWW-Authenticate"] = "Bearer"
                return response
            async with turns:
                return await handler(request)

        return guard

    async def stop(self) -> None:
        """Stops serving (requests in flight get `_SHUTDOWN_GRACE_SECONDS`), then closes the
        store. Safe to call twice."""
        listening = getattr(self, "_listening", None)
        runner = getattr(self, "_runner", None)
        self._listening = self._runner = None
        if listening is not None:
            listening.close()
        if runner is not None:
            await runner.cleanup()
        store, self.store = self.store, None
        if store is not None:
            ret = await _call(store.close)
            if ret != 0:
                log.warning("Mooncake service close returned %s", ret)
            else:
                log.info("Mooncake service stopped")

    # ---- handlers --------------------------------------------------------------------------

    @_route("PUT")
    async def handle_put(self, request: Any) -> web.Response:
        """PUT /api/put {"key", "value"}: stores the value's UTF-8 bytes."""
        data = await _json_body(request)
        key, value = data.get("key"), data.get("value")
        if not key or value is None:
            return _json_response(400, {"error": "Missing key or value"})
        if await _call(self.store.put, key, str(value).encode()) != 0:
            return _json_response(500, {"error": "PUT operation failed"})
        return _json_response(200, {"status": "success"})

    async def _exists_or_reply(self, key: str) -> None:
        exists = await _call(self.store.is_exist, key)
        if exists == 0:
            raise _Reply(404, {"error": "Key not found"})
        if exists < 0:
            raise _Reply(500, {"error": "Exist check failed"})

    @_route("GET")
    async def handle_get(self, request: Any) -> web.Response:
        """GET /api/get/{key}: the value's bytes."""
        key = request.match_info["key"]
        await self._exists_or_reply(key)
        value = await _call(self.store.get, key)
        if value is None:
            return _json_response(500, {"error": "GET operation failed"})
        if value == b"":
            await self._exists_or_reply(key)  # removed in between, or an empty value: which
        return web.Response(status=200, body=value, content_type="application/octet-stream")

    @_route("EXIST")
    async def handle_exist(self, request: Any) -> web.Response:
        """GET /api/exist/{key}: {"exists": bool}."""
        exists = await _call(self.store.is_exist, request.match_info["key"])
        if exists < 0:
            return _json_response(500, {"error": "Exist check failed"})
        return _json_response(200, {"exists": exists > 0})

    @_route("REMOVE")
    async def handle_remove(self, request: Any) -> web.Response:
        """DELETE /api/remove/{key}."""
        if await _call(self.store.remove, request.match_info["key"]) != 0:
            return _json_response(500, {"error": "Remove operation failed"})
        return _json_response(200, {"status": "success"})

    @_route("REMOVE_ALL")
    async def handle_remove_all(self, request: Any) -> web.Response:
        """DELETE /api/remove_all: {"status": "success removed N keys"}."""
        n = await _call(self.store.remove_all)
        if n < 0:
            return _json_response(500, {"error": "RemoveAll operation failed"})
        return _json_response(200, {"status": f"success removed {n} keys"})

    @_route("MOUNT_SHM")
    async def handle_mount_shm(self, request: Any) -> web.Response:
        """POST /api/mount_shm {"name", "size", "offset"?, "protocol"?, "location"?}: maps
        `/dev/shm/<name>` and mounts it as a segment."""
        data = await _json_body(request)
        path, size = _shm_path(data.get("name")), data.get("size")
        if not path or size is None:
            return _json_response(400, {"error": "Missing or invalid name or size"})
        size, offset = _checked_size(size), _checked_offset(data.get("offset", 0))
        _refuse_links(path)
        result = await _call(self.store.mount_segment, path, size, offset,
                             data.get("protocol", self.config.protocol),
                             data.get("location", ""))
        if result["ret"] != 0:
            return _json_response(500, {"error": f"Mount failed, ret={result['ret']}"})
        return _json_response(200, {"status": "success",
                                    "segment_ids": list(result["segment_ids"])})

    @_route("UNMOUNT_SHM")
    async def handle_unmount_shm(self, request: Any) -> web.Response:
        """POST /api/unmount_shm {"segment_ids", "grace_period_seconds"?}: one unmount per id,
        failed ones listed."""
        data = await _json_body(request)
        ids, grace = _segment_ids(data), data.get("grace_period_seconds", 0)
        failed = []
        async with self._state_lock:
            for sid in ids:
                if await _call(self.store.unmount_segment, [sid], grace) != 0:
                    failed.append(sid)
                elif sid in self.mounted_segment_ids:
                    self.mounted_segment_ids.remove(sid)
            if not self.mounted_segment_ids:
                self.current_mode = "prefill"
        if failed:
            return _json_response(500, {"error": "Unmount failed for one or more segments",
                                        "failed_segment_ids": failed})
        return _json_response(200, {"status": "success"})

    @_route("MOUNT")
    async def handle_mount(self, request: Any) -> web.Response:
        """POST /api/mount {"size", "protocol"?, "location"?}: allocates and mounts."""
        data = await _json_body(request)
        size = _checked_size(data.get("size"))
        result = await _call(self.store.allocate_and_mount_segment, size,
                             data.get("protocol", self.config.protocol),
                             data.get("location", ""))
        if result["ret"] != 0:
            return _json_response(500, {"error": "Allocate and mount failed, "
                                                 f"ret={result['ret']}"})
        return _json_response(200, {"status": "success",
                                    "segment_ids": list(result["segment_ids"]),
                                    "allocated_size": result["allocated_size"]})

    @_route("UNMOUNT")
    async def handle_unmount(self, request: Any) -> web.Response:
        """POST /api/unmount {"segment_ids", "grace_period_seconds"?}: unmounts and frees."""
        data = await _json_body(request)
        ids = _segment_ids(data)
        ret = await _call(self.store.unmount_and_free_segment, ids,
                          data.get("grace_period_seconds", 0))
        if ret != 0:
            return _json_response(500, {"error": f"Unmount and free failed, ret={ret}"})
        return _json_response(200, {"status": "success"})

    @_route("UNMOUNT_LOCAL_DISK")
    async def handle_unmount_local_disk(self, request: Any) -> web.Response:
        """POST /api/unmount_local_disk {"grace_period_seconds"?}: deregisters the SSD
        offload tier (a preStop hook), holding for the grace period."""
        data = await _json_body(request)
        grace = data.get("grace_period_seconds", 0)
        if type(grace) is not int or not 0 <= grace <= _LOCAL_DISK_GRACE_MAX_SECONDS:
            return _json_response(400, {"error": "Invalid grace_period_seconds, must be a "
                                                 "non-negative integer no greater than "
                                                 f"{_LOCAL_DISK_GRACE_MAX_SECONDS}"})
        ret = await _call(self.store.unmount_local_disk_segment, grace)
        if ret != 0:
            return _json_response(500, {"error": f"Unmount local disk failed, ret={ret}"})
        return _json_response(200, {"status": "success"})

    @_route("RECONFIGURE")
    async def handle_reconfigure(self, request: Any) -> web.Response:
        """POST /api/reconfigure: {"mode": "decode", "name" or "path", "size", "offset"?,
        "protocol"?, "location"?} mounts the shm file (before unmounting the segments a
        previous decode mounted); {"mode": "prefill"} unmounts them."""
        data = await _json_body(request)
        mode = str(data.get("mode", "")).lower()
        if mode == "decode":
            return await self._decode(data)
        if mode == "prefill":
            async with self._state_lock:
                if self.mounted_segment_ids:
                    ret = await _call(self.store.unmount_segment, self.mounted_segment_ids)
                    if ret != 0:
                        return _json_response(500, {"error": f"Unmount failed, ret={ret}"})
                    self.mounted_segment_ids.clear()
                self.current_mode = "prefill"
                self.last_mount_info.clear()
            return _json_response(200, {"status": "success", "mode": "prefill"})
        return _json_response(400, {"error": "Invalid mode. Use 'decode' or 'prefill'"})

    async def _decode(self, data: Dict[str, Any]) -> web.Response:
        name, given, size = data.get("name"), data.get("path"), data.get("size")
        if (not name and not given) or size is None:
            return _json_response(400, {"error": "Missing path or size for decode mode"})
        path = _shm_path(name) if name else _decode_path(given)
        if path is None:
            return _json_response(400, {"error": "Invalid path, decode mode mounts only a "
                                                 "/dev/shm/<name> file"})
        size, offset = _checked_size(size), _checked_offset(data.get("offset", 0))
        _refuse_links(path)
        protocol = data.get("protocol", self.config.protocol)
        location = data.get("location", "")
        async with self._state_lock:
            previous = list(self.mounted_segment_ids)
            result = await _call(self.store.mount_segment, path, size, offset, protocol,
                                 location)
            if result["ret"] != 0:
                if previous:
                    log.warning("reconfigure decode: mount of %s failed (ret=%s); keeping "
                                "the previous decode segments", path, result["ret"])
                    return _json_response(500, {
                        "error": f"Mount failed, ret={result['ret']}; keeping previous "
                                 "decode segments",
                        "mode": self.current_mode})
                self.current_mode = "prefill"
                self.mounted_segment_ids.clear()
                self.last_mount_info.clear()
                return _json_response(500, {
                    "error": f"Mount failed, ret={result['ret']}; rolled back to prefill",
                    "mode": self.current_mode})
            # The new segment serves; retire the previous ones one by one so that only the
            # ones that could not be unmounted stay tracked (for a later prefill to retry).
            stuck = [sid for sid in previous
                     if await _call(self.store.unmount_segment, [sid]) != 0]
            if stuck:
                log.warning("reconfigure decode: could not unmount the previous segments %s; "
                            "keeping them tracked", stuck)
            self.mounted_segment_ids = list(result["segment_ids"]) + stuck
            self.current_mode = "decode"
            self.last_mount_info = {"path": path, "offset": offset, "size": size,
                                    "protocol": protocol, "location": location}
            return _json_response(200, {"status": "success", "mode": "decode",
                                        "segment_ids": self.mounted_segment_ids})


# ---- the program ---------------------------------------------------------------------------


def _unblock_shutdown_signals() -> None:
    """Unblocks SIGINT and SIGTERM in this thread (a launcher may have blocked them)."""
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    except AttributeError:
        pass


def _install_shutdown_signal_handlers(loop: asyncio.AbstractEventLoop,
                                      shutdown_event: asyncio.Event) -> None:
    """SIGINT and SIGTERM set `shutdown_event` (through the loop)."""

    def on_signal(signum: int) -> None:
        log.info("received signal %s, shutting down", signum)
        shutdown_event.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, on_signal, sig)
        except (NotImplementedError, RuntimeError):
            signal.signal(sig, lambda signum, _frame: loop.call_soon_threadsafe(on_signal,
                                                                                signum))


def parse_arguments(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """The command line of `mc_store_rest_server`."""
    p = argparse.ArgumentParser(description="Mooncake Store Service with REST API")
    p.add_argument("--config", type=str, help="Path to Mooncake config file")
    p.add_argument("-D", "--define", action="append", default=[],
                   help="Override a config field, e.g. -Dlocal_hostname=example.com")
    p.add_argument("--host", type=str, default=_DEFAULT_HOST,
                   help="Address to listen on (default: 127.0.0.1; another one needs a "
                        "cluster secret, MC_AUTH_TOKEN_FILE, to be safe)")
    p.add_argument("--port", type=int, default=8080, help="HTTP API port (default: 8080)")
    p.add_argument("--max-wait-time", type=float, default=60,
                   help="Maximum total wait for the store to start, seconds (default: 60)")
    return p.parse_args(argv)


async def main(argv: Optional[List[str]] = None) -> int:
    """Runs until SIGINT or SIGTERM: 0 on a clean stop, 1 when the store never started or
    the port cannot be bound, 2 when the cluster secret or the mount cap is misconfigured."""
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s - %(name)s - %(levelname)s - %(message)s")
    args = parse_arguments(argv)
    try:
        _process_secret()
        _mount_max_bytes()
    except ValueError as e:  # SecretError too
        log.error("%s", e)
        return 2
    overrides = {}
    for item in args.define:
        if "=" in item:
            k, v = item.split("=", 1)
            overrides[k] = v
        else:
            log.warning("ignoring invalid -D option: %s", item)
    service = MooncakeStoreService(args.config, overrides)
    shutdown = asyncio.Event()
    _install_shutdown_signal_handlers(asyncio.get_running_loop(), shutdown)
    _unblock_shutdown_signals()
    try:
        if not await service.start_store_service(max_wait_time=args.max_wait_time,
                                                  shutdown_event=shutdown):
            return 0 if shutdown.is_set() else 1
        await asyncio.sleep(0)
        if shutdown.is_set():
            return 0
        try:
            await service.start_http_service(args.port, host=getattr(args, "host",
                                                                     _DEFAULT_HOST))
        except OSError as e:
            log.error("cannot serve on port %s: %s", args.port, e)
            return 1
        log.info("Mooncake Store Service is running")
        await shutdown.wait()
        return 0
    finally:
        await service.stop()


def sync_main() -> int:
    """Entry point of the `mc_store_rest_server` console script."""
    return asyncio.run(main())


if __name__ == "__main__":
    raise SystemExit(sync_main())
